/*
 * xfer_peer.c - one side of the two-process transfer tests (driven by
 * xfer_two_proc.py and tests/netns/xfer_netns.py).
 *
 *   xfer_peer target    DIR [options]   serves a region, checks every notification
 *   xfer_peer initiator DIR [options]   writes the region, verified by the target
 *   xfer_peer stream    DIR [options]   writes until the target dies, then
 *                                       reconnects to the restarted target
 *   xfer_peer badinput  DIR [options]   damaged blobs, bad descriptors, at a live target
 *
 * options: --backend NAME (ucx) --tls LIST --devices LIST --mib N (256)
 *          --desc SIZE[,SIZE...] (4096,16384,1048576) --timeout S (120)
 *          --malloc 1 (target region malloc'd + registered, not kvr_xfer_mem_alloc)
 *
 * The target writes DIR/target.blob (its pid, address blob, rkey blob; made
 * atomically by rename) and then only progresses.  The initiator fills its
 * region with a pattern (seeded per round), and for every batch of
 * descriptors posts the list and at once - without waiting - sends a
 * notification naming the batch.  The target checks every byte the
 * notification names the moment it arrives: a notification that overtook
 * its data is a failure.  At the end of a round the target checks the whole
 * region and writes DIR/result.SEED ("ok N" or "fail ...").  Descriptors of a
 * batch are posted in reverse order so they cannot be coalesced: the test
 * really moves DESC-sized pieces.
 */
#include "kvr_xfer.h"
#include "kvr_clock.h"
#include "kvr_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <signal.h>
#include <unistd.h>

#define MSG_BATCH 'B'
#define MSG_DONE  'D'
#define MSG_QUIT  'Q'

struct msg {
    uint8_t type, seed;
    uint16_t pad;
    uint32_t seq;
    uint64_t off, len;
};

static const char *dir, *backend = "ucx", *tls, *devices;
static size_t region_len = 256u << 20;
static size_t descs[8] = {4096, 16384, 1048576};
static size_t ndescs = 3;
static int timeout_s = 120;
static int use_malloc; /* target: malloc'd + registered instead of kvr_xfer_mem_alloc */

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "xfer_peer: " __VA_ARGS__);                                                \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

static uint64_t pat(uint64_t word, uint8_t seed)
{
    uint64_t x = word * 0x9E3779B97F4A7C15ull ^ (seed * 0xD1B54A32D192ED03ull + 1);
    return x ^ (x >> 29);
}

static void fill(uint8_t *buf, size_t len, uint8_t seed)
{
    uint64_t *w = (uint64_t *)buf;
    for (size_t i = 0; i < len / 8; i++)
        w[i] = pat(i, seed);
}

/* first offset in [off, off+len) that does not hold the pattern, or -1 */
static long long check(const uint8_t *buf, size_t off, size_t len, uint8_t seed)
{
    const uint64_t *w = (const uint64_t *)buf;
    for (size_t i = off / 8; i < (off + len) / 8; i++)
        if (w[i] != pat(i, seed))
            return (long long)(i * 8);
    return -1;
}

static kvr_xfer_engine_t *make_engine(const char *name, kvr_xfer_notif_cb_t cb, void *arg)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_engine_t *e;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = name;
    cfg.tls = tls;
    cfg.devices = devices;
    cfg.notif_cb = cb;
    cfg.notif_arg = arg;
    kvr_status_t s = kvr_xfer_engine_create(&cfg, &e);
    if (s != KVR_OK)
        DIE("engine create (%s): %s", backend, kvr_status_str(s));
    return e;
}

static void *alloc_region(void)
{
    void *p = aligned_alloc(1 << 21, region_len);
    if (!p)
        DIE("no memory for %zu bytes", region_len);
    memset(p, 0, region_len);
    return p;
}

static void write_file(const char *name, const void *data, size_t len)
{
    char path[512], tmp[520];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        DIE("cannot write %s: %s", tmp, strerror(errno));
    if (rename(tmp, path) != 0)
        DIE("rename %s: %s", path, strerror(errno));
}

static void *read_file(const char *name, size_t *len_p)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    uint8_t *b = malloc(cap);
    size_t n;
    while (b && (n = fread(b + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap)
            b = realloc(b, cap *= 2);
    }
    fclose(f);
    *len_p = len;
    return b;
}

/* ------------------------------------------------------------------------ */
/* target                                                                    */

struct target {
    uint8_t *buf;
    uint32_t batches;
    int quit;
    char fail[256];
};

static void target_notif(void *arg, const void *data, size_t len, const uint8_t *token)
{
    (void)token;
    struct target *t = arg;
    struct msg m;
    if (len != sizeof(m)) {
        snprintf(t->fail, sizeof(t->fail), "notification of %zu bytes", len);
        return;
    }
    memcpy(&m, data, sizeof(m));
    if (m.type == MSG_QUIT) {
        t->quit = 1;
        return;
    }
    if (m.off > region_len || m.len > region_len - m.off) {
        snprintf(t->fail, sizeof(t->fail), "notification names bytes outside the region");
        return;
    }
    if (m.type == MSG_BATCH) {
        long long bad = check(t->buf, m.off, m.len, m.seed);
        if (bad >= 0 && !t->fail[0])
            snprintf(t->fail, sizeof(t->fail),
                     "notification %u (seed %u) arrived before its data: byte %lld not written",
                     m.seq, m.seed, bad);
        t->batches++;
        return;
    }
    if (m.type == MSG_DONE) {
        long long bad = check(t->buf, 0, region_len, m.seed);
        char res[320], name[64];
        if (!t->fail[0] && bad >= 0)
            snprintf(t->fail, sizeof(t->fail), "region differs at byte %lld after the round", bad);
        if (!t->fail[0] && t->batches != m.seq)
            snprintf(t->fail, sizeof(t->fail), "%u batch notifications, initiator sent %u",
                     t->batches, m.seq);
        int n = t->fail[0] ? snprintf(res, sizeof(res), "fail %s\n", t->fail)
                           : snprintf(res, sizeof(res), "ok %u\n", t->batches);
        snprintf(name, sizeof(name), "result.%u", m.seed);
        write_file(name, res, (size_t)n);
        fprintf(stderr, "target: round seed %u: %s", m.seed, res);
        t->batches = 0;
        t->fail[0] = '\0';
    }
}

static int run_target(void)
{
    struct target t = {0};
    kvr_xfer_engine_t *e = make_engine("target", target_notif, &t);
    kvr_xfer_mem_t *m;
    uint64_t t0, t1;
    kvr_status_t s;
    if (use_malloc) {
        t.buf = alloc_region();
        t0 = kvr_now_ns();
        s = kvr_xfer_mem_reg(e, t.buf, region_len, KVR_MEM_HOST, 0, &m);
        t1 = kvr_now_ns();
    } else { /* the engine's own memory: one-sided on shared memory */
        t0 = kvr_now_ns();
        s = kvr_xfer_mem_alloc(e, region_len, KVR_MEM_HOST, 0, &m);
        t1 = kvr_now_ns();
        if (s == KVR_OK) {
            t.buf = kvr_xfer_mem_addr(m);
            memset(t.buf, 0, region_len);
        }
    }
    if (s != KVR_OK)
        DIE("mem_reg/alloc: %s", kvr_status_str(s));
    fprintf(stderr, "target: %s %zu MiB in %.3f ms\n", use_malloc ? "registered" : "allocated",
            region_len >> 20, (double)(t1 - t0) / 1e6);
    void *ab, *rb;
    size_t al, rl;
    if (kvr_xfer_address(e, &ab, &al) != KVR_OK || kvr_xfer_mem_pack(m, &rb, &rl) != KVR_OK)
        DIE("address/pack failed");
    size_t len = 8 + 8 + al + 8 + rl;
    uint8_t *f = malloc(len);
    uint64_t pid = (uint64_t)getpid(), a64 = al, r64 = rl;
    memcpy(f, &pid, 8);
    memcpy(f + 8, &a64, 8);
    memcpy(f + 16, ab, al);
    memcpy(f + 16 + al, &r64, 8);
    memcpy(f + 24 + al, rb, rl);
    write_file("target.blob", f, len);
    free(f);
    free(ab);
    free(rb);
    fprintf(stderr, "target: pid %d ready\n", (int)getpid());
    uint64_t deadline = kvr_deadline_ns(timeout_s * 1000);
    while (!t.quit && kvr_now_ns() < deadline)
        kvr_xfer_progress(e);
    kvr_xfer_engine_destroy(e);
    if (use_malloc)
        free(t.buf);
    return t.quit ? 0 : 3;
}

/* ------------------------------------------------------------------------ */
/* initiator                                                                 */

struct conn {
    kvr_xfer_engine_t *e;
    kvr_xfer_peer_t *p;
    kvr_xfer_rmem_t *r;
    kvr_xfer_mem_t *m;
    uint8_t *buf;
    uint64_t target_pid;
};

/* reads DIR/target.blob; waits up to wait_ms for one from a pid other than not_pid */
static uint8_t *load_target(uint64_t not_pid, int wait_ms, size_t *len_p)
{
    uint64_t deadline = kvr_deadline_ns(wait_ms);
    for (;;) {
        size_t len;
        uint8_t *b = read_file("target.blob", &len);
        uint64_t pid = 0;
        if (b && len >= 8)
            memcpy(&pid, b, 8);
        if (b && len > 24 && pid != not_pid) {
            *len_p = len;
            return b;
        }
        free(b);
        if (kvr_now_ns() > deadline)
            DIE("no target.blob from a new target within %d ms", wait_ms);
        usleep(20000);
    }
}

static kvr_status_t conn_open(struct conn *c, uint64_t not_pid)
{
    size_t len;
    uint8_t *b = load_target(not_pid, 20000, &len);
    uint64_t al, rl;
    memcpy(&c->target_pid, b, 8);
    memcpy(&al, b + 8, 8);
    if (16 + al + 8 > len)
        DIE("target.blob malformed");
    memcpy(&rl, b + 16 + al, 8);
    if (24 + al + rl != len)
        DIE("target.blob malformed");
    kvr_status_t s = kvr_xfer_connect(c->e, b + 16, al, &c->p);
    if (s == KVR_OK) {
        s = kvr_xfer_rmem_unpack(c->p, b + 24 + al, rl, &c->r);
        if (s == KVR_OK && kvr_xfer_rmem_len(c->r) != region_len)
            DIE("target region of %llu bytes, want %zu",
                (unsigned long long)kvr_xfer_rmem_len(c->r), region_len);
    }
    free(b);
    if (s == KVR_OK)
        fprintf(stderr, "initiator: connected to target pid %llu over %s\n",
                (unsigned long long)c->target_pid, kvr_xfer_peer_transports(c->p));
    return s;
}

static void notify(struct conn *c, uint8_t type, uint8_t seed, uint32_t seq, uint64_t off,
                   uint64_t len)
{
    struct msg m = {type, seed, 0, seq, off, len};
    kvr_status_t s = kvr_xfer_notify(c->p, &m, sizeof(m));
    if (s != KVR_OK)
        DIE("notify: %s", kvr_status_str(s));
}

static int wait_result(struct conn *c, uint8_t seed)
{
    char name[64];
    snprintf(name, sizeof(name), "result.%u", seed);
    uint64_t deadline = kvr_deadline_ns(60000);
    while (kvr_now_ns() < deadline) {
        size_t len;
        char *r = read_file(name, &len);
        if (r) {
            int ok = len >= 2 && strncmp(r, "ok", 2) == 0;
            fprintf(stderr, "initiator: target says %.*s", (int)len, r);
            free(r);
            return ok ? 0 : 1;
        }
        kvr_xfer_progress(c->e);
        usleep(2000);
    }
    fprintf(stderr, "initiator: no result from the target\n");
    return 1;
}

/* one verified round: the whole region in DESC-sized pieces */
static int round_write(struct conn *c, size_t desc, uint8_t seed)
{
    size_t n = region_len / desc;
    size_t per = desc >= (1u << 20) ? 16 : 1024; /* descriptors per list */
    if (per > n)
        per = n;
    size_t nlists = n / per;
    kvr_xfer_dlist_t **dl = calloc(nlists, sizeof(*dl));
    struct kvr_xfer_desc *d = malloc(per * sizeof(*d));
    for (size_t k = 0; k < nlists; k++) {
        size_t base = k * per * desc;
        for (size_t i = 0; i < per; i++) { /* reversed: nothing coalesces */
            uint64_t off = base + (per - 1 - i) * desc;
            d[i] = (struct kvr_xfer_desc){c->m, off, c->r, off, desc};
        }
        kvr_status_t s = kvr_xfer_dlist_prepare(c->p, KVR_XFER_WRITE, d, per, &dl[k]);
        if (s != KVR_OK)
            DIE("dlist_prepare: %s", kvr_status_str(s));
        size_t co;
        kvr_xfer_dlist_count(dl[k], &co);
        if (co != per)
            DIE("reversed descriptors were coalesced (%zu -> %zu)", per, co);
    }
    fill(c->buf, region_len, seed);
    const size_t window = 4;
    uint64_t t0 = kvr_now_ns(), post_ns = 0;
    for (size_t k = 0; k < nlists; k++) {
        if (k >= window) {
            kvr_status_t s = kvr_xfer_wait(dl[k - window], 10000);
            if (s != KVR_OK)
                DIE("wait: %s", kvr_status_str(s));
        }
        kvr_status_t s = kvr_xfer_post(dl[k]);
        if (s != KVR_OK && s != KVR_INPROGRESS)
            DIE("post: %s", kvr_status_str(s));
        struct kvr_xfer_stats st;
        kvr_xfer_dlist_stats(dl[k], &st);
        post_ns += st.post_ns;
        /* at once, without waiting: the target must see the data first */
        notify(c, MSG_BATCH, seed, (uint32_t)k, k * per * desc, per * desc);
    }
    for (size_t k = nlists > window ? nlists - window : 0; k < nlists; k++) {
        kvr_status_t s = kvr_xfer_wait(dl[k], 10000);
        if (s != KVR_OK)
            DIE("wait: %s", kvr_status_str(s));
    }
    double secs = (double)(kvr_now_ns() - t0) / 1e9;
    notify(c, MSG_DONE, seed, (uint32_t)nlists, 0, 0);
    kvr_status_t s = kvr_xfer_flush(c->p, 10000);
    if (s != KVR_OK)
        DIE("flush: %s", kvr_status_str(s));
    fprintf(stderr,
            "initiator: %zu MiB in %zu-byte descriptors (%zu lists of %zu): %.2f GB/s, "
            "post %.0f ns/descriptor\n",
            region_len >> 20, desc, nlists, per, (double)region_len / secs / 1e9,
            (double)post_ns / (double)n);
    for (size_t k = 0; k < nlists; k++)
        kvr_xfer_dlist_release(dl[k]);
    free(dl);
    free(d);
    return wait_result(c, seed);
}

static void conn_init(struct conn *c)
{
    memset(c, 0, sizeof(*c));
    c->e = make_engine("initiator", NULL, NULL);
    c->buf = alloc_region();
    uint64_t t0 = kvr_now_ns();
    kvr_status_t s = kvr_xfer_mem_reg(c->e, c->buf, region_len, KVR_MEM_HOST, 0, &c->m);
    if (s != KVR_OK)
        DIE("mem_reg: %s", kvr_status_str(s));
    fprintf(stderr, "initiator: registered %zu MiB in %.3f ms\n", region_len >> 20,
            (double)(kvr_now_ns() - t0) / 1e6);
}

static int run_initiator(void)
{
    struct conn c;
    conn_init(&c);
    kvr_status_t s = conn_open(&c, 0);
    if (s != KVR_OK)
        DIE("connect: %s", kvr_status_str(s));
    int rc = 0;
    for (size_t i = 0; i < ndescs && rc == 0; i++)
        rc = round_write(&c, descs[i], (uint8_t)(11 + i));
    notify(&c, MSG_QUIT, 0, 0, 0, 0);
    kvr_xfer_flush(c.p, 5000);
    kvr_xfer_engine_destroy(c.e);
    free(c.buf);
    return rc;
}

/* writes until the target dies; prints when and how it was seen; reconnects */
static int run_stream(void)
{
    struct conn c;
    conn_init(&c);
    if (conn_open(&c, 0) != KVR_OK)
        DIE("connect failed");
    struct kvr_xfer_desc d[16];
    for (int i = 0; i < 16; i++) {
        uint64_t off = (uint64_t)(15 - i) << 20;
        d[i] = (struct kvr_xfer_desc){c.m, off, c.r, off, 1u << 20};
    }
    kvr_xfer_dlist_t *dl;
    if (kvr_xfer_dlist_prepare(c.p, KVR_XFER_WRITE, d, 16, &dl) != KVR_OK)
        DIE("prepare failed");
    kvr_status_t s = KVR_OK;
    uint64_t posts = 0;
    uint64_t deadline = kvr_deadline_ns(timeout_s * 1000);
    while (kvr_now_ns() < deadline) {
        s = kvr_xfer_post(dl);
        if (s == KVR_INPROGRESS || s == KVR_OK)
            s = kvr_xfer_wait(dl, 5000);
        if (s != KVR_OK)
            break;
        if (++posts == 20) {
            printf("STREAMING\n");
            fflush(stdout);
        }
    }
    uint64_t seen = kvr_now_ns();
    printf("FAILED %s %llu after %llu posts\n", kvr_status_name(s), (unsigned long long)seen,
           (unsigned long long)posts);
    fflush(stdout);
    if (s != KVR_ERR_PEER_FAILURE && s != KVR_ERR_TIMEOUT)
        DIE("unexpected status %s", kvr_status_name(s));
    /* a post on the failed peer fails at once, and nothing hangs */
    s = kvr_xfer_post(dl);
    if (s == KVR_INPROGRESS)
        s = kvr_xfer_wait(dl, 1000);
    fprintf(stderr, "initiator: post after failure: %s\n", kvr_status_name(s));
    uint64_t t0 = kvr_now_ns();
    kvr_xfer_disconnect(c.p);
    fprintf(stderr, "initiator: disconnect took %.1f ms\n", (double)(kvr_now_ns() - t0) / 1e6);
    /* the restarted target */
    if ((s = conn_open(&c, c.target_pid)) != KVR_OK)
        DIE("reconnect: %s", kvr_status_str(s));
    int rc = round_write(&c, 1u << 20, 99);
    printf("RECONNECTED %s\n", rc == 0 ? "ok" : "fail");
    fflush(stdout);
    notify(&c, MSG_QUIT, 0, 0, 0, 0);
    kvr_xfer_flush(c.p, 5000);
    kvr_xfer_engine_destroy(c.e);
    free(c.buf);
    return rc;
}

#define EXPECT(expr, want)                                                                         \
    do {                                                                                           \
        kvr_status_t _s = (expr);                                                                  \
        if (_s != (want))                                                                          \
            DIE("%s: %s, want %s", #expr, kvr_status_name(_s), kvr_status_name(want));             \
        fprintf(stderr, "badinput: %-60.60s -> %s\n", #expr, kvr_status_name(_s));                 \
    } while (0)

/* bad input against a live target: each a typed error, then a good transfer */
static int run_badinput(void)
{
    struct conn c;
    conn_init(&c);
    size_t len;
    uint8_t *b = load_target(0, 20000, &len);
    uint64_t al, rl;
    memcpy(&al, b + 8, 8);
    memcpy(&rl, b + 16 + al, 8);
    uint8_t *ab = b + 16, *rb = b + 24 + al;
    kvr_xfer_peer_t *p = NULL;
    EXPECT(kvr_xfer_connect(c.e, ab, al / 2, &p), KVR_ERR_INVALID);
    EXPECT(kvr_xfer_connect(c.e, ab, 5, &p), KVR_ERR_INVALID);
    ab[al - 3] ^= 0x40;
    EXPECT(kvr_xfer_connect(c.e, ab, al, &p), KVR_ERR_CORRUPT);
    ab[al - 3] ^= 0x40;
    ab[4]++;
    EXPECT(kvr_xfer_connect(c.e, ab, al, &p), KVR_ERR_VERSION);
    ab[4]--;
    EXPECT(kvr_xfer_connect(c.e, rb, rl, &p), KVR_ERR_INVALID);
    EXPECT(kvr_xfer_connect(c.e, ab, al, &p), KVR_OK);
    kvr_xfer_rmem_t *r = NULL;
    EXPECT(kvr_xfer_rmem_unpack(p, rb, rl - 1, &r), KVR_ERR_INVALID);
    rb[rl / 2] ^= 1;
    EXPECT(kvr_xfer_rmem_unpack(p, rb, rl, &r), KVR_ERR_CORRUPT);
    rb[rl / 2] ^= 1;
    EXPECT(kvr_xfer_rmem_unpack(p, rb, rl, &r), KVR_OK);
    kvr_xfer_dlist_t *dl = NULL;
    struct kvr_xfer_desc d = {c.m, 0, r, region_len - 4096, 8192};
    EXPECT(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_ERR_OUT_OF_RANGE);
    d = (struct kvr_xfer_desc){c.m, region_len, r, 0, 1};
    EXPECT(kvr_xfer_dlist_prepare(p, KVR_XFER_READ, &d, 1, &dl), KVR_ERR_OUT_OF_RANGE);
    d = (struct kvr_xfer_desc){c.m, 0, r, 0, 0};
    EXPECT(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_ERR_INVALID);
    EXPECT(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 0, &dl), KVR_ERR_INVALID);
    static uint8_t big[KVR_XFER_NOTIF_MAX + 1];
    EXPECT(kvr_xfer_notify(p, big, sizeof(big)), KVR_ERR_INVALID);
    /* after all that the connection still works: a verified 1 MiB round */
    c.p = p;
    c.r = r;
    int rc = round_write(&c, 1u << 20, 55);
    notify(&c, MSG_QUIT, 0, 0, 0, 0);
    kvr_xfer_flush(c.p, 5000);
    free(b);
    kvr_xfer_engine_destroy(c.e);
    free(c.buf);
    fprintf(stderr, "badinput: %s\n",
            rc == 0 ? "all typed errors, then a verified transfer" : "FAILED");
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s target|initiator|stream|badinput DIR [options]\n", argv[0]);
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the driver */
    const char *mode = argv[1];
    dir = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--backend"))
            backend = v;
        else if (!strcmp(k, "--tls"))
            tls = v;
        else if (!strcmp(k, "--devices"))
            devices = v;
        else if (!strcmp(k, "--mib"))
            region_len = (size_t)atol(v) << 20;
        else if (!strcmp(k, "--malloc"))
            use_malloc = atoi(v);
        else if (!strcmp(k, "--timeout"))
            timeout_s = atoi(v);
        else if (!strcmp(k, "--desc")) {
            ndescs = 0;
            char *list = strdup(v);
            for (char *s = strtok(list, ","); s && ndescs < 8; s = strtok(NULL, ","))
                descs[ndescs++] = (size_t)atol(s);
            free(list);
        } else {
            fprintf(stderr, "unknown option %s\n", k);
            return 2;
        }
    }
    if (region_len < (16u << 20))
        DIE("--mib must be at least 16");
    kvr_log_set_process(mode);
    if (!strcmp(mode, "target"))
        return run_target();
    if (!strcmp(mode, "initiator"))
        return run_initiator();
    if (!strcmp(mode, "stream"))
        return run_stream();
    if (!strcmp(mode, "badinput"))
        return run_badinput();
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
