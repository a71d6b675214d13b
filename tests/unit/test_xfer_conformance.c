/*
 * test_xfer_conformance.c - the one contract every transfer backend is held to.
 *
 *   test_xfer_conformance BACKEND      (loop, ucx, verbs, ...)
 *
 * Two engines of the named backend in this process (initiator and target),
 * driven from one thread: verified WRITE and READ over scattered and
 * adjacent descriptors, coalescing and telemetry, a notification checked
 * against the data the moment it arrives, bad input of every kind, bounded
 * waits, and a target that disappears mid-transfer followed by a transfer
 * to a new target.  Exits 77 when the backend is not built or has no device.
 * The environment picks the backend's transports (UCX_TLS=..., ...).
 *
 * Then, for ucx, the same host between two processes (a forked target whose
 * pool comes from kvr_xfer_mem_alloc): where the peer is watched by pidfd
 * the puts take the same-host path (process_vm_writev or a mapped memcpy,
 * "+cma" / "+mapped" in the transports) and the test asserts it; every byte
 * of WRITEs of 4 KiB to 4 MiB blocks checked by the target the moment the
 * notification that follows them arrives, a READ back, and the target killed:
 * the next posts fail with KVR_ERR_PEER_FAILURE (not a timeout), within 5 s.
 */
#include "kvr_xfer.h"
#include "kvr_clock.h"
#include "kvr_test.h"
#include "xfer_blob.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

#define REGION (8u << 20)

static const char *backend;
static int notifs_seen, notifs_bad;
static uint8_t *t_dst; /* target region, checked by the notification callback */
static uint8_t expect_seed;
static size_t expect_len;

static uint8_t pattern(size_t i, uint8_t seed)
{
    return (uint8_t)((i * 131u + seed * 7u + (i >> 12)) ^ seed);
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(i, seed);
}

static uint8_t notif_token[KVR_XFER_TOKEN_LEN]; /* the last notification's (zeros: none) */

static void notif_cb(void *arg, const void *msg, size_t len, const uint8_t *token)
{
    uint8_t seed;
    notifs_seen++;
    if (token)
        memcpy(notif_token, token, KVR_XFER_TOKEN_LEN);
    else
        memset(notif_token, 0, sizeof notif_token);
    if (len != 1 + 8) {
        notifs_bad++;
        return;
    }
    memcpy(&seed, msg, 1);
    /* the data the notification follows must be visible now */
    for (size_t i = 0; i < expect_len; i += 509)
        if (t_dst[i] != pattern(i, seed)) {
            notifs_bad++;
            return;
        }
    if (t_dst[expect_len - 1] != pattern(expect_len - 1, seed))
        notifs_bad++;
}

struct side {
    kvr_xfer_engine_t *eng;
    uint8_t *buf;
    kvr_xfer_mem_t *mem;
};

static kvr_status_t make_engine(const char *name, int with_cb, kvr_xfer_engine_t **e_p)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = name;
    if (with_cb)
        cfg.notif_cb = notif_cb;
    return kvr_xfer_engine_create(&cfg, e_p);
}

/* with_alloc: the region comes from kvr_xfer_mem_alloc (freed with the engine) */
static void side_init2(struct side *s, const char *name, int with_cb, int with_alloc)
{
    kvr_status_t st = make_engine(name, with_cb, &s->eng);
    if (st == KVR_ERR_NO_RDMA || st == KVR_ERR_NOT_FOUND)
        KVR_SKIP("backend %s: no usable device here (%s)", backend, kvr_status_str(st));
    KVR_CHECK_STATUS(st, KVR_OK);
    KVR_CHECK(strcmp(kvr_xfer_engine_backend(s->eng), backend) == 0);
    if (with_alloc) {
        KVR_CHECK_STATUS(kvr_xfer_mem_alloc(s->eng, REGION, KVR_MEM_HOST, 0, &s->mem), KVR_OK);
        s->buf = kvr_xfer_mem_addr(s->mem);
        KVR_CHECK(s->buf);
        memset(s->buf, 0, REGION);
        kvr_xfer_mem_t *m = NULL;
        KVR_CHECK_STATUS(kvr_xfer_mem_alloc(s->eng, 0, KVR_MEM_HOST, 0, &m), KVR_ERR_INVALID);
        return;
    }
    s->buf = aligned_alloc(4096, REGION);
    KVR_CHECK(s->buf);
    memset(s->buf, 0, REGION);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(s->eng, s->buf, REGION, KVR_MEM_HOST, 0, &s->mem), KVR_OK);
    KVR_CHECK(kvr_xfer_mem_addr(s->mem) == s->buf);
}

static void side_init(struct side *s, const char *name, int with_cb)
{
    side_init2(s, name, with_cb, 0);
}

static void side_fini(struct side *s, int with_alloc)
{
    kvr_xfer_engine_destroy(s->eng);
    if (!with_alloc)
        free(s->buf);
}

/* initiator a connects to target b and unpacks b's region */
static void connect_to(struct side *a, struct side *b, kvr_xfer_peer_t **p_p, kvr_xfer_rmem_t **r_p)
{
    void *blob;
    size_t len;
    KVR_CHECK_STATUS(kvr_xfer_address(b->eng, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, blob, len, p_p), KVR_OK);
    free(blob);
    KVR_CHECK(kvr_xfer_peer_status(*p_p) == KVR_OK);
    KVR_CHECK(strlen(kvr_xfer_peer_transports(*p_p)) > 0);
    KVR_CHECK_STATUS(kvr_xfer_mem_pack(b->mem, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(*p_p, blob, len, r_p), KVR_OK);
    free(blob);
    KVR_CHECK_EQ(kvr_xfer_rmem_len(*r_p), REGION);
}

/* progresses both engines until the list completes; bounded */
static kvr_status_t finish(kvr_xfer_dlist_t *dl, kvr_xfer_engine_t *target, int timeout_ms)
{
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    for (;;) {
        if (target)
            kvr_xfer_progress(target);
        kvr_status_t s = kvr_xfer_wait(dl, 1);
        if (s != KVR_ERR_TIMEOUT)
            return s;
        if (kvr_now_ns() > deadline)
            return KVR_ERR_TIMEOUT;
    }
}

/* a completed WRITE list means its source may be reused (local completion);
 * kvr_xfer_flush makes the writes visible at the target.  Bounded. */
static void visible(kvr_xfer_peer_t *p, kvr_xfer_engine_t *target)
{
    uint64_t deadline = kvr_deadline_ns(10000);
    kvr_status_t s;
    while ((s = kvr_xfer_flush(p, 1)) == KVR_ERR_TIMEOUT && kvr_now_ns() < deadline)
        kvr_xfer_progress(target);
    KVR_CHECK_STATUS(s, KVR_OK);
}

static void pump_until(kvr_xfer_engine_t *a, kvr_xfer_engine_t *b, int *counter, int want,
                       int timeout_ms)
{
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    while (*counter < want && kvr_now_ns() < deadline) {
        kvr_xfer_progress(a);
        kvr_xfer_progress(b);
    }
}

static void test_write_read(struct side *a, struct side *b, kvr_xfer_peer_t *p, kvr_xfer_rmem_t *r)
{
    /* 64 scattered 16 KiB descriptors: local i*32K -> remote (63-i)*64K + 4K */
    struct kvr_xfer_desc d[64];
    fill(a->buf, REGION, 3);
    memset(b->buf, 0, REGION);
    for (int i = 0; i < 64; i++)
        d[i] = (struct kvr_xfer_desc){a->mem, (uint64_t)i * 32768, r,
                                      (uint64_t)(63 - i) * 65536 + 4096, 16384};
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, 64, &dl), KVR_OK);
    size_t co;
    KVR_CHECK_EQ(kvr_xfer_dlist_count(dl, &co), 64);
    KVR_CHECK_EQ(co, 64);               /* nothing adjacent */
    uint64_t t_rep = 0, t_done = 0;     /* around the last post: its telemetry lies within */
    for (int rep = 0; rep < 3; rep++) { /* posted many times */
        t_rep = kvr_now_ns();
        kvr_status_t s = kvr_xfer_post(dl);
        KVR_CHECK(s == KVR_OK || s == KVR_INPROGRESS);
        if (s == KVR_INPROGRESS)
            KVR_CHECK_STATUS(kvr_xfer_post(dl), KVR_ERR_BUSY);
        KVR_CHECK_STATUS(finish(dl, b->eng, 10000), KVR_OK);
        KVR_CHECK_STATUS(kvr_xfer_test(dl), KVR_OK);
        t_done = kvr_now_ns();
    }
    visible(p, b->eng);
    for (int i = 0; i < 64; i++) {
        size_t ro = (size_t)(63 - i) * 65536 + 4096;
        KVR_CHECK(memcmp(b->buf + ro, a->buf + (size_t)i * 32768, 16384) == 0);
        for (size_t k = ro - 4096; k < ro; k++) /* the gaps stay untouched */
            KVR_CHECK_EQ(b->buf[k], 0);
    }
    struct kvr_xfer_stats st;
    kvr_xfer_dlist_stats(dl, &st);
    KVR_CHECK_EQ(st.ndesc, 64);
    KVR_CHECK_EQ(st.ndesc_coalesced, 64);
    KVR_CHECK_EQ(st.bytes, 64 * 16384);
    /* both are durations from the post's start: neither can exceed the
     * time the test itself saw around that post (a completion stamped
     * inside an inline post may be shorter than the post, so their order
     * is not fixed) */
    KVR_CHECK(st.complete_ns > 0 && st.complete_ns <= t_done - t_rep);
    KVR_CHECK(st.post_ns > 0 && st.post_ns <= t_done - t_rep);
    kvr_xfer_dlist_release(dl);

    /* READ: target fills, initiator reads 3 MiB in 1000 adjacent pieces (coalesced to 1) */
    fill(b->buf, REGION, 9);
    memset(a->buf, 0, REGION);
    static struct kvr_xfer_desc rd[1000];
    size_t piece = 3145728 / 1000 / 8 * 8;
    for (int i = 0; i < 1000; i++)
        rd[i] = (struct kvr_xfer_desc){a->mem, 4096 + i * piece, r, 8192 + i * piece, piece};
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_READ, rd, 1000, &dl), KVR_OK);
    KVR_CHECK_EQ(kvr_xfer_dlist_count(dl, &co), 1000);
    KVR_CHECK_EQ(co, 1);
    kvr_status_t s = kvr_xfer_post(dl);
    KVR_CHECK(s == KVR_OK || s == KVR_INPROGRESS);
    KVR_CHECK_STATUS(finish(dl, b->eng, 10000), KVR_OK);
    KVR_CHECK(memcmp(a->buf + 4096, b->buf + 8192, 1000 * piece) == 0);
    KVR_CHECK_EQ(a->buf[4095], 0);
    KVR_CHECK_EQ(a->buf[4096 + 1000 * piece], 0);
    kvr_xfer_dlist_stats(dl, &st);
    KVR_CHECK_EQ(st.ndesc, 1000);
    KVR_CHECK_EQ(st.ndesc_coalesced, 1);
    kvr_xfer_dlist_release(dl);
}

/* each notification, sent right after posting (not waiting), must find its data */
static void test_notify_after_data(struct side *a, struct side *b, kvr_xfer_peer_t *p,
                                   kvr_xfer_rmem_t *r)
{
    expect_len = 4u << 20;
    t_dst = b->buf;
    struct kvr_xfer_desc d[256];
    for (int i = 0; i < 256; i++) /* 16 KiB pieces, every other one adjacent */
        d[i] = (struct kvr_xfer_desc){a->mem, (uint64_t)i * 16384, r, (uint64_t)i * 16384, 16384};
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, 256, &dl), KVR_OK);
    notifs_seen = notifs_bad = 0;
    for (int it = 0; it < 12; it++) {
        uint8_t seed = (uint8_t)(40 + it);
        fill(a->buf, expect_len, seed);
        expect_seed = seed;
        kvr_status_t s = kvr_xfer_post(dl);
        KVR_CHECK(s == KVR_OK || s == KVR_INPROGRESS);
        uint8_t msg[9] = {seed};
        memcpy(msg + 1, &it, sizeof(it));
        KVR_CHECK_STATUS(kvr_xfer_notify(p, msg, sizeof(msg)), KVR_OK);
        pump_until(a->eng, b->eng, &notifs_seen, it + 1, 10000);
        KVR_CHECK_EQ(notifs_seen, it + 1);
        KVR_CHECK_EQ(notifs_bad, 0);
        KVR_CHECK_STATUS(finish(dl, b->eng, 10000), KVR_OK);
    }
    /* an empty and a maximal notification are legal */
    static uint8_t big[KVR_XFER_NOTIF_MAX];
    KVR_CHECK_STATUS(kvr_xfer_notify(p, big, 0), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_notify(p, big, sizeof(big)), KVR_OK);
    int before = notifs_seen;
    pump_until(a->eng, b->eng, &notifs_seen, before + 2, 10000);
    KVR_CHECK_EQ(notifs_seen, before + 2);
    notifs_bad = 0; /* those two do not follow the seed protocol */
    uint64_t deadline = kvr_deadline_ns(5000);
    kvr_status_t fs;
    while ((fs = kvr_xfer_flush(p, 1)) == KVR_ERR_TIMEOUT && kvr_now_ns() < deadline)
        kvr_xfer_progress(b->eng);
    KVR_CHECK_STATUS(fs, KVR_OK);
    kvr_xfer_dlist_release(dl);

    struct kvr_xfer_engine_stats es;
    kvr_xfer_engine_stats(a->eng, &es);
    KVR_CHECK(es.notifs_sent >= 14);
    KVR_CHECK(es.posts >= 12);
    KVR_CHECK(es.bytes_written >= 12 * expect_len);
    kvr_xfer_engine_stats(b->eng, &es);
    KVR_CHECK(es.notifs_received >= 14);
}

static void test_bad_input(struct side *a, struct side *b, kvr_xfer_peer_t *p, kvr_xfer_rmem_t *r)
{
    kvr_xfer_dlist_t *dl = NULL;
    struct kvr_xfer_desc d = {a->mem, 0, r, 0, 4096};
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 0, &dl), KVR_ERR_INVALID);
    d.len = 0;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_ERR_INVALID);
    d.len = 4096;
    d.roff = REGION - 4095;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_ERR_OUT_OF_RANGE);
    d.roff = 0;
    d.loff = REGION;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_READ, &d, 1, &dl), KVR_ERR_OUT_OF_RANGE);
    d.loff = UINT64_MAX - 100; /* overflow must not wrap into range */
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_ERR_OUT_OF_RANGE);
    d.loff = 0;
    d.lmem = b->mem; /* a region of the other engine */
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_ERR_INVALID);
    d.lmem = NULL;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_ERR_INVALID);
    d.lmem = a->mem;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, (enum kvr_xfer_op)7, &d, 1, &dl), KVR_ERR_INVALID);
    KVR_CHECK(dl == NULL); /* outputs set only on success */

    static uint8_t big[KVR_XFER_NOTIF_MAX + 1];
    KVR_CHECK_STATUS(kvr_xfer_notify(p, big, sizeof(big)), KVR_ERR_INVALID);
    kvr_xfer_mem_t *m = NULL;
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(a->eng, NULL, 4096, KVR_MEM_HOST, 0, &m), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(a->eng, a->buf, 0, KVR_MEM_HOST, 0, &m), KVR_ERR_INVALID);
    KVR_CHECK(m == NULL);

    /* damaged blobs: address and rkey */
    void *blob;
    size_t len;
    kvr_xfer_peer_t *q = NULL;
    kvr_xfer_rmem_t *rr = NULL;
    KVR_CHECK_STATUS(kvr_xfer_address(b->eng, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, blob, len - 1, &q), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, blob, 3, &q), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, NULL, 0, &q), KVR_ERR_INVALID);
    ((uint8_t *)blob)[len - 1] ^= 0x10;
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, blob, len, &q), KVR_ERR_CORRUPT);
    ((uint8_t *)blob)[len - 1] ^= 0x10;
    ((uint8_t *)blob)[4] = KVR_XFER_BLOB_VERSION + 1;
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, blob, len, &q), KVR_ERR_VERSION);
    ((uint8_t *)blob)[4] = KVR_XFER_BLOB_VERSION;
    /* an address blob is not an rkey */
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, blob, len, &rr), KVR_ERR_INVALID);
    free(blob);
    KVR_CHECK_STATUS(kvr_xfer_mem_pack(b->mem, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, blob, len / 2, &rr), KVR_ERR_INVALID);
    ((uint8_t *)blob)[30] ^= 1;
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, blob, len, &rr), KVR_ERR_CORRUPT);
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, blob, len, &q), KVR_ERR_CORRUPT);
    ((uint8_t *)blob)[30] ^= 1;
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, blob, len, &q),
                     KVR_ERR_INVALID); /* rkey != address */
    free(blob);
    KVR_CHECK(q == NULL && rr == NULL);
    KVR_CHECK(kvr_xfer_peer_status(p) == KVR_OK); /* none of it hurt the good peer */
}

static void test_timeouts(struct side *a, struct side *b, kvr_xfer_peer_t *p, kvr_xfer_rmem_t *r)
{
    struct kvr_xfer_desc d = {a->mem, 0, r, 0, REGION};
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_wait(dl, 0), KVR_OK); /* never posted: nothing to wait for */
    KVR_CHECK_STATUS(kvr_xfer_wait(dl, -1), KVR_ERR_INVALID); /* no infinite waits */
    KVR_CHECK_STATUS(kvr_xfer_flush(p, -1), KVR_ERR_INVALID);
    fill(a->buf, REGION, 77);
    uint64_t t0 = kvr_now_ns();
    kvr_status_t s = kvr_xfer_post(dl);
    KVR_CHECK(s == KVR_OK || s == KVR_INPROGRESS);
    s = kvr_xfer_wait(dl, 0); /* the target is not progressed here */
    KVR_CHECK(s == KVR_OK || s == KVR_ERR_TIMEOUT);
    s = kvr_xfer_wait(dl, 20);
    KVR_CHECK(s == KVR_OK || s == KVR_ERR_TIMEOUT);
    KVR_CHECK(kvr_now_ns() - t0 < 2000000000ull); /* bounded, not hung */
    KVR_CHECK_STATUS(finish(dl, b->eng, 10000), KVR_OK);
    visible(p, b->eng);
    KVR_CHECK(memcmp(a->buf, b->buf, REGION) == 0);
    kvr_xfer_dlist_release(dl);
}

static void test_event_fd(struct side *a, struct side *b, kvr_xfer_peer_t *p)
{
    int fd;
    kvr_status_t s = kvr_xfer_event_fd(b->eng, &fd);
    if (s == KVR_ERR_UNSUPPORTED)
        return;
    KVR_CHECK_STATUS(s, KVR_OK);
    while (kvr_xfer_progress(b->eng) > 0) /* drain and arm */
        ;
    int before = notifs_seen;
    KVR_CHECK_STATUS(kvr_xfer_notify(p, "x", 1), KVR_OK);
    int readable = 0;
    uint64_t deadline = kvr_deadline_ns(5000);
    while (!readable && kvr_now_ns() < deadline) {
        kvr_xfer_progress(a->eng);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        readable = poll(&pf, 1, 5) > 0;
    }
    KVR_CHECK(readable);
    pump_until(a->eng, b->eng, &notifs_seen, before + 1, 5000);
    KVR_CHECK_EQ(notifs_seen, before + 1);
    notifs_bad = 0;
}

/* Checksummed but damaged address and rkey blobs, as a registered but
 * hostile or broken peer would send them, framed again with a correct
 * checksum.  Addresses: payload bits flipped and bytes set anywhere past
 * kvrail's header; rkeys (UCX): the backend key cut short with its length
 * field kept consistent, or an MD key length set past the end - damage
 * that ucp_ep_rkey_unpack would read past the buffer for.  Each connect /
 * unpack returns - refused or, where the damage is harmless, accepted -
 * and this process lives on (UCX 1.13 aborted on about one address in 25
 * before ucx_check.c); the intact blobs still work afterwards. */
static void test_damaged_blobs(struct side *a, struct side *b, kvr_xfer_peer_t *p)
{
    void *ab, *rb;
    size_t al, rl;
    KVR_CHECK_STATUS(kvr_xfer_address(b->eng, &ab, &al), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_pack(b->mem, &rb, &rl), KVR_OK);
    uint16_t id;
    memcpy(&id, (uint8_t *)ab + 6, 2); /* the backend id (xfer_blob.h) */
    bool ucx = strcmp(backend, "ucx") == 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int refused = 0, accepted = 0;
    /* (an rkey of one MD at least: over TCP UCX's key may have none) */
    bool rkeys = ucx && rl > KVR_XFER_BLOB_HDR_LEN + 64 + 10;
    /* over TCP an accepted connection takes ~1 s to close, and a verbs
     * address that survives the damage may name a side channel that never
     * answers (3 s): fewer there */
    int rounds = strcmp(backend, "verbs") == 0                ? 12
                 : strstr(kvr_xfer_peer_transports(p), "tcp") ? 30
                                                              : 300;
    for (int i = 0; i < rounds; i++) {
        bool rkey = rkeys && i % 3 == 2;
        const void *pl;
        size_t n;
        KVR_CHECK_STATUS(kvr_xfer_blob_parse(id, rkey ? KVR_XFER_BLOB_RKEY : KVR_XFER_BLOB_ADDRESS,
                                             rkey ? rb : ab, rkey ? rl : al, &pl, &n, NULL),
                         KVR_OK);
        uint8_t *m = malloc(n);
        KVR_CHECK(m);
        memcpy(m, pl, n);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (rkey) {
            /* region header 24, kvrail's UCX header 40 (rkey_len at +12),
             * then UCX's key: md_map 8, memory type 1, the first MD's length */
            if (x & 1) {
                size_t cut = 1 + (size_t)(x >> 8) % (n - 64 - 1);
                n -= cut;
                uint32_t kl = (uint32_t)(n - 64);
                memcpy(m + 24 + 12, &kl, 4);
            } else {
                m[64 + 9] = (uint8_t)(0x80 | (x >> 8));
            }
        } else {
            size_t skip = ucx && n > 40 ? 40 : 0; /* past kvrail's UCX header */
            for (int k = 0; k < 1 + i % 4; k++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                size_t at = skip + (size_t)(x % (n - skip));
                if (x & 0x10000)
                    m[at] ^= (uint8_t)(1u << ((x >> 20) % 8));
                else
                    m[at] = (uint8_t)(x >> 24);
            }
        }
        void *blob;
        size_t len;
        KVR_CHECK_STATUS(kvr_xfer_blob_frame(id, rkey ? KVR_XFER_BLOB_RKEY : KVR_XFER_BLOB_ADDRESS,
                                             m, n, &blob, &len),
                         KVR_OK);
        kvr_status_t s;
        if (rkey) {
            kvr_xfer_rmem_t *r;
            s = kvr_xfer_rmem_unpack(p, blob, len, &r);
            KVR_CHECK(s != KVR_OK); /* structural damage: always refused */
        } else {
            kvr_xfer_peer_t *q;
            s = kvr_xfer_connect(a->eng, blob, len, &q);
            if (s == KVR_OK)
                kvr_xfer_disconnect(q);
        }
        refused += s != KVR_OK;
        accepted += s == KVR_OK;
        free(blob);
        free(m);
    }
    fprintf(stderr, "damaged blobs: %d refused, %d accepted, none fatal\n", refused, accepted);
    /* (verbs connects asynchronously: a damaged address is refused, if at
     * all, by the handshake after kvr_xfer_connect returned) */
    KVR_CHECK(refused > 0 || strcmp(backend, "verbs") == 0);
    kvr_xfer_peer_t *q;
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, ab, al, &q), KVR_OK);
    kvr_xfer_rmem_t *r;
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(q, rb, rl, &r), KVR_OK);
    kvr_xfer_disconnect(q);
    free(ab);
    free(rb);
}

/* require_token: a target accepts only peers that present a token it was
 * given (per-pair tokens, xfer_token.c).  Without a token, or with one it
 * was not given or that was revoked, the peer's notification is never
 * delivered (verbs: the handshake is refused) and the refusal is counted;
 * with the allowed token it is delivered. */
/* an rkey altered and framed again; its unpack must be refused, and the
 * process live on */
static void shm_rkey_try(kvr_xfer_peer_t *p, uint16_t id, const uint8_t *pl, size_t n, size_t at,
                         const void *bytes, size_t nb, const char *what)
{
    uint8_t *m = malloc(n);
    KVR_CHECK(m);
    memcpy(m, pl, n);
    memcpy(m + at, bytes, nb);
    void *blob;
    size_t bl;
    KVR_CHECK_STATUS(kvr_xfer_blob_frame(id, KVR_XFER_BLOB_RKEY, m, n, &blob, &bl), KVR_OK);
    kvr_xfer_rmem_t *r;
    kvr_status_t s = kvr_xfer_rmem_unpack(p, blob, bl, &r);
    fprintf(stderr, "shm rkey naming %s: %s\n", what, kvr_status_name(s));
    KVR_CHECK(s == KVR_ERR_NOT_FOUND || s == KVR_ERR_CORRUPT);
    free(blob);
    free(m);
}

/* UCX rkeys that name a shared-memory segment which is not the peer's to
 * give.  UCX 1.13 maps the segment an rkey names while unpacking it, and
 * when that failed it crashed inside its own error handling (a System V
 * segment id that does not exist: SIGSEGV).  A region from
 * kvr_xfer_mem_alloc in UCX shared memory (KVR_UCX_POOL=shm) has such a
 * key, found here by its content: sysv - shmid (4), owner address (8) -
 * or posix - segment id (flags in bits 60-63; in procfs mode pid in bits
 * 0-29, fd in 30-59), address, length.  Altered to name a segment that
 * does not exist, one of another process, one smaller than the region, the
 * unpack is refused (the log names what was wrong) and the process lives;
 * the intact rkey still unpacks.  Other configurations carry no such key. */
static void test_shm_rkeys(struct side *a)
{
    if (strcmp(backend, "ucx") != 0)
        return;
    struct side t;
    side_init2(&t, "shm-target", 0, 1);
    void *ab, *rb;
    size_t al, rl;
    KVR_CHECK_STATUS(kvr_xfer_address(t.eng, &ab, &al), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_pack(t.mem, &rb, &rl), KVR_OK);
    kvr_xfer_peer_t *p;
    KVR_CHECK_STATUS(kvr_xfer_connect(a->eng, ab, al, &p), KVR_OK);
    uint16_t id;
    memcpy(&id, (uint8_t *)rb + 6, 2);
    const void *plv;
    size_t n;
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(id, KVR_XFER_BLOB_RKEY, rb, rl, &plv, &n, NULL), KVR_OK);
    const uint8_t *pl = plv;
    /* region header 24 (length at 8), kvrail's UCX header 40, UCX's: md_map 8,
     * memory type 1, per MD a length byte and the key */
    size_t off = 64 + 9, posix = 0, sysv = 0;
    uint64_t md_map = 0;
    if (n > 64 + 9)
        memcpy(&md_map, pl + 64, 8);
    for (; md_map && off < n; md_map &= md_map - 1) {
        const uint8_t *key = pl + off + 1;
        uint64_t seg = 0;
        int shmid;
        struct shmid_ds ds;
        if (pl[off] >= 24 && off + 1 + 24 <= n)
            memcpy(&seg, key, 8);
        if ((seg >> 63) && (pid_t)(seg & 0x3fffffff) == getpid())
            posix = off + 1;
        if (pl[off] == 12 && (memcpy(&shmid, key, 4), shmctl(shmid, IPC_STAT, &ds) == 0) &&
            ds.shm_cpid == getpid())
            sysv = off + 1;
        off += 1u + pl[off];
    }
    if (sysv) {
        int gone = 0x7ffffff0; /* no such segment */
        shm_rkey_try(p, id, pl, n, sysv, &gone, 4, "a System V segment that does not exist");
        /* one of another process: made by a child that has exited */
        int pp[2];
        KVR_CHECK(pipe(pp) == 0);
        pid_t c = fork();
        KVR_CHECK(c >= 0);
        if (c == 0) {
            int other = shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0600);
            _exit(write(pp[1], &other, 4) == 4 ? 0 : 1);
        }
        int other = -1;
        KVR_CHECK(read(pp[0], &other, 4) == 4 && other >= 0);
        waitpid(c, NULL, 0);
        close(pp[0]);
        close(pp[1]);
        shm_rkey_try(p, id, pl, n, sysv, &other, 4, "another process's System V segment");
        shmctl(other, IPC_RMID, NULL);
        uint64_t len;
        memcpy(&len, pl + 8, 8);
        len += 1ull << 30;
        shm_rkey_try(p, id, pl, n, 8, &len, 8, "a System V segment smaller than the region");
    }
    if (posix) {
        uint64_t seg, alt;
        memcpy(&seg, pl + posix, 8);
        alt = (seg & ~(0x3fffffffull << 30)) | (1000000ull << 30);
        shm_rkey_try(p, id, pl, n, posix, &alt, 8, "an fd the peer does not have");
        alt = (seg & ~0x3fffffffull) | 1;
        shm_rkey_try(p, id, pl, n, posix, &alt, 8, "an fd of another process (init)");
        alt = (1ull << 62) | 0xdeadbeefull;
        shm_rkey_try(p, id, pl, n, posix, &alt, 8, "a shm_open name that does not exist");
        uint64_t len;
        memcpy(&len, pl + posix + 16, 8);
        len += 1ull << 30;
        shm_rkey_try(p, id, pl, n, posix + 16, &len, 8, "a length past the posix segment");
    }
    if (!sysv && !posix)
        fprintf(stderr, "shm rkeys: no shared-memory key in this configuration\n");
    kvr_xfer_rmem_t *r;
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, rb, rl, &r), KVR_OK);
    kvr_xfer_disconnect(p);
    free(ab);
    free(rb);
    side_fini(&t, 1);
}

/* Connects to t presenting token (NULL: none; with hello 0 the UCX peer
 * skips its HELLO, KVR_UCX_HELLO=0, as a hostile peer may) and sends one
 * notification.  KVR_OK when it was delivered - with the token presented,
 * which the callback must get; KVR_ERR_MISMATCH when it was refused: with
 * ucx the endpoint closed at connect (refused_connections, one), nothing
 * delivered on it. */
static kvr_status_t token_try(struct side *a, kvr_xfer_engine_t *t, const uint8_t *token, int hello)
{
    bool ucx = strcmp(backend, "ucx") == 0;
    void *blob;
    size_t len;
    KVR_CHECK_STATUS(kvr_xfer_address(t, &blob, &len), KVR_OK);
    kvr_xfer_peer_t *p;
    if (!hello)
        setenv("KVR_UCX_HELLO", "0", 1);
    struct kvr_xfer_engine_stats st0, st;
    kvr_xfer_engine_stats(t, &st0);
    kvr_status_t s = token ? kvr_xfer_connect_token(a->eng, blob, len, token, &p)
                           : kvr_xfer_connect(a->eng, blob, len, &p);
    unsetenv("KVR_UCX_HELLO");
    free(blob);
    if (s != KVR_OK)
        return s;
    int before = notifs_seen;
    memset(notif_token, 0, sizeof notif_token);
    s = kvr_xfer_notify(p, "tok", 3);
    uint64_t deadline = kvr_deadline_ns(20000); /* a bound against a hang, not a measure */
    for (;;) {
        kvr_xfer_progress(a->eng);
        kvr_xfer_progress(t);
        kvr_xfer_engine_stats(t, &st);
        if (notifs_seen > before) {
            s = KVR_OK;
            break;
        }
        /* ucx: refused when the endpoint is closed (not at a dropped
         * notification: one still in flight from the last endpoint refused
         * may land on this one, UCX reusing its address) */
        if (ucx ? st.refused_connections > st0.refused_connections : st.refused > st0.refused) {
            s = KVR_ERR_MISMATCH;
            break;
        }
        if (kvr_now_ns() > deadline) {
            s = KVR_ERR_TIMEOUT;
            break;
        }
    }
    if (s == KVR_OK) {
        KVR_CHECK(token && memcmp(notif_token, token, KVR_XFER_TOKEN_LEN) == 0);
        KVR_CHECK(st.refused_connections == st0.refused_connections);
    } else if (s == KVR_ERR_MISMATCH) {
        /* what the peer sent has left it; the target drains it: nothing of
         * it is delivered, one endpoint closed */
        (void)kvr_xfer_flush(p, 2000);
        for (int idle = 0; idle < 100;)
            idle = kvr_xfer_progress(t) + kvr_xfer_progress(a->eng) ? 0 : idle + 1;
        kvr_xfer_engine_stats(t, &st);
        KVR_CHECK(notifs_seen == before);
        KVR_CHECK(!ucx || st.refused_connections == st0.refused_connections + 1);
    }
    kvr_xfer_disconnect(p);
    return s;
}

static void test_tokens(struct side *a)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = "guarded";
    cfg.notif_cb = notif_cb;
    cfg.require_token = 1;
    kvr_xfer_engine_t *t;
    KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &t), KVR_OK);
    uint8_t t1[KVR_XFER_TOKEN_LEN], t2[KVR_XFER_TOKEN_LEN], z[KVR_XFER_TOKEN_LEN] = {0};
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++) {
        t1[i] = (uint8_t)(0x40 + i);
        t2[i] = (uint8_t)(0x40 + i);
    }
    t2[7] ^= 1; /* one bit off */
    KVR_CHECK_STATUS(kvr_xfer_token_allow(t, z), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_xfer_token_allow(t, t1), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_token_allow(t, t1), KVR_OK); /* once held, once counted */
    KVR_CHECK_STATUS(token_try(a, t, NULL, 1), KVR_ERR_MISMATCH);
    KVR_CHECK_STATUS(token_try(a, t, t2, 1), KVR_ERR_MISMATCH);
    KVR_CHECK_STATUS(token_try(a, t, t1, 1), KVR_OK);
    KVR_CHECK_STATUS(token_try(a, t, t1, 1), KVR_OK); /* again, after the refusals */
    /* the revoked token, and (ucx) the right token without a HELLO, each
     * on an engine of its own: UCX may give a new endpoint the address of
     * one closed moments ago, whose messages are then dropped but which is
     * not closed again for UCX_CLOSED_KEEP_MS (it may be the old one's) */
    for (int no_hello = 0; no_hello < 2; no_hello++) {
        if (no_hello && strcmp(backend, "ucx") != 0)
            break;
        kvr_xfer_engine_t *fresh;
        KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &fresh), KVR_OK);
        KVR_CHECK_STATUS(kvr_xfer_token_allow(fresh, t1), KVR_OK);
        if (no_hello) {
            KVR_CHECK_STATUS(token_try(a, fresh, t1, 0), KVR_ERR_MISMATCH);
        } else {
            KVR_CHECK_STATUS(token_try(a, fresh, t1, 1), KVR_OK);
            kvr_xfer_token_revoke(fresh, t1);
            KVR_CHECK_STATUS(token_try(a, fresh, t1, 1), KVR_ERR_MISMATCH);
        }
        kvr_xfer_engine_destroy(fresh);
    }
    struct kvr_xfer_engine_stats st;
    kvr_xfer_engine_stats(t, &st);
    KVR_CHECK(st.refused >= 2);
    fprintf(stderr,
            "tokens: none, wrong, revoked and (ucx) no HELLO refused (on the first engine: %llu "
            "refused, %llu connections closed at connect), the allowed one accepted\n",
            (unsigned long long)st.refused, (unsigned long long)st.refused_connections);
    kvr_xfer_engine_destroy(t);
}

/* Sends one notification on p (from engine ie) and runs both engines until
 * the target t delivers it - with the token want, which the callback must
 * get - or drops it (t's stats.refused up), or p fails.  KVR_OK, or
 * KVR_ERR_MISMATCH (dropped), or p's failure. */
static kvr_status_t send_one(kvr_xfer_engine_t *ie, kvr_xfer_peer_t *p, kvr_xfer_engine_t *t,
                             const uint8_t *want)
{
    struct kvr_xfer_engine_stats st0, st;
    kvr_xfer_engine_stats(t, &st0);
    int before = notifs_seen;
    memset(notif_token, 0, sizeof notif_token);
    kvr_status_t s = kvr_xfer_notify(p, "tok", 3);
    if (s != KVR_OK)
        return s;
    uint64_t deadline = kvr_deadline_ns(20000); /* a bound against a hang, not a measure */
    for (;;) {
        kvr_xfer_progress(ie);
        kvr_xfer_progress(t);
        kvr_xfer_engine_stats(t, &st);
        if (notifs_seen > before) {
            KVR_CHECK(memcmp(notif_token, want, KVR_XFER_TOKEN_LEN) == 0);
            return KVR_OK;
        }
        if (st.refused > st0.refused)
            return KVR_ERR_MISMATCH;
        if (kvr_xfer_peer_status(p) != KVR_OK)
            return kvr_xfer_peer_status(p);
        if (kvr_now_ns() > deadline)
            return KVR_ERR_TIMEOUT;
    }
}

static kvr_xfer_engine_t *guarded_engine(const char *name)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = name;
    cfg.notif_cb = notif_cb;
    cfg.require_token = 1;
    kvr_xfer_engine_t *t;
    KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &t), KVR_OK);
    return t;
}

static kvr_xfer_peer_t *connect_tok(kvr_xfer_engine_t *from, kvr_xfer_engine_t *t,
                                    const uint8_t *token)
{
    void *blob;
    size_t len;
    kvr_xfer_peer_t *p;
    KVR_CHECK_STATUS(kvr_xfer_address(t, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_connect_token(from, blob, len, token, &p), KVR_OK);
    free(blob);
    return p;
}

static void make_token(uint8_t *t, uint8_t seed)
{
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        t[i] = (uint8_t)(seed + 3 * i);
}

/* Revocation closes what was admitted under the token: two initiators,
 * each admitted under its own token, one notification each delivered;
 * then t1 revoked.  ucx: the first's next notification is dropped, its
 * endpoint closed (revoked_connections one up) and its connection fails at
 * the initiator (the target's BYE, or UCX's error over TCP); verbs: its
 * side channel and QPs, the initiator told by 'V'; loop keeps no
 * connection: its next notification is refused.  Nothing more of the first
 * is delivered, and the second still delivers under t2, its endpoint not
 * closed.  Against the transport that left the endpoint open, the first
 * connection never fails. */
static void test_revoke(struct side *a)
{
    /* ucx and verbs close the connection; loop and cuda_ipc keep none */
    bool ucx = strcmp(backend, "ucx") == 0 || strcmp(backend, "verbs") == 0;
    kvr_xfer_engine_t *t = guarded_engine("revoker"), *other;
    KVR_CHECK_STATUS(make_engine("bystander", 0, &other), KVR_OK);
    uint8_t t1[KVR_XFER_TOKEN_LEN], t2[KVR_XFER_TOKEN_LEN];
    make_token(t1, 0x11);
    make_token(t2, 0x71);
    KVR_CHECK_STATUS(kvr_xfer_token_allow_for(t, t1, "prefill-a"), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_token_allow_for(t, t2, "prefill-b"), KVR_OK);
    kvr_xfer_peer_t *p1 = connect_tok(a->eng, t, t1), *p2 = connect_tok(other, t, t2);
    KVR_CHECK_STATUS(send_one(a->eng, p1, t, t1), KVR_OK);
    KVR_CHECK_STATUS(send_one(other, p2, t, t2), KVR_OK);
    struct kvr_xfer_engine_stats st0, st;
    kvr_xfer_engine_stats(t, &st0);

    kvr_xfer_token_revoke(t, t1);
    /* its next notification is not delivered (ucx closes the endpoint at
     * it: UCX may have freed an endpoint whose peer left, and one that
     * speaks is known alive; verbs has closed it already) */
    int before = notifs_seen;
    kvr_status_t s = send_one(a->eng, p1, t, t1);
    KVR_CHECK(s == KVR_ERR_MISMATCH || s == KVR_ERR_PEER_FAILURE);
    uint64_t deadline = kvr_deadline_ns(20000); /* a bound against a hang, not a measure */
    for (;;) { /* ucx, verbs: until the connection is closed and the initiator knows */
        kvr_xfer_engine_stats(t, &st);
        if (!ucx || kvr_now_ns() > deadline ||
            (kvr_xfer_peer_status(p1) != KVR_OK &&
             st.revoked_connections > st0.revoked_connections))
            break;
        kvr_xfer_progress(t);
        kvr_xfer_progress(a->eng);
        kvr_xfer_progress(other);
    }
    fprintf(stderr, "revoke: first connection %s, revoked_connections %llu\n",
            kvr_status_name(kvr_xfer_peer_status(p1)),
            (unsigned long long)(st.revoked_connections - st0.revoked_connections));
    if (ucx) {
        KVR_CHECK_EQ(st.revoked_connections, st0.revoked_connections + 1);
        KVR_CHECK_STATUS(kvr_xfer_peer_status(p1), KVR_ERR_PEER_FAILURE);
    } else {
        KVR_CHECK_EQ(st.revoked_connections, st0.revoked_connections); /* none to close */
    }
    /* nothing more of the first is delivered */
    s = send_one(a->eng, p1, t, t1);
    KVR_CHECK(s == KVR_ERR_MISMATCH || s == KVR_ERR_PEER_FAILURE);
    for (int idle = 0; idle < 100;)
        idle = kvr_xfer_progress(t) + kvr_xfer_progress(a->eng) ? 0 : idle + 1;
    KVR_CHECK_EQ(notifs_seen, before);
    /* the other is untouched */
    KVR_CHECK_STATUS(send_one(other, p2, t, t2), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_peer_status(p2), KVR_OK);
    kvr_xfer_engine_stats(t, &st);
    KVR_CHECK_EQ(st.revoked_connections, st0.revoked_connections + (ucx ? 1 : 0));
    kvr_xfer_disconnect(p1);
    kvr_xfer_disconnect(p2);
    kvr_xfer_engine_destroy(other);
    kvr_xfer_engine_destroy(t);
}

/* ucx: a flood of endpoints that never say HELLO (each sends a
 * notification first) on a target whose inbound table holds 4
 * (KVR_UCX_INBOUND_MAX): the endpoint admitted before keeps delivering,
 * and a new peer with an allowed token is still admitted, while the
 * flood's messages are dropped and counted.  The old table gave the least
 * recently seen entry - the admitted one - to the flood. */
static void test_inbound_flood(struct side *a)
{
    enum { FLOOD = 6 };
    setenv("KVR_UCX_INBOUND_MAX", "4", 1); /* read at the table's first use */
    kvr_xfer_engine_t *t = guarded_engine("flooded"), *f, *late;
    KVR_CHECK_STATUS(make_engine("flood", 0, &f), KVR_OK);
    KVR_CHECK_STATUS(make_engine("late", 0, &late), KVR_OK);
    uint8_t t1[KVR_XFER_TOKEN_LEN];
    make_token(t1, 0x23);
    KVR_CHECK_STATUS(kvr_xfer_token_allow_for(t, t1, "prefill-a"), KVR_OK);
    kvr_xfer_peer_t *p = connect_tok(a->eng, t, t1), *q[FLOOD];
    KVR_CHECK_STATUS(send_one(a->eng, p, t, t1), KVR_OK);
    setenv("KVR_UCX_HELLO", "0", 1);
    for (int i = 0; i < FLOOD; i++)
        q[i] = connect_tok(f, t, t1);
    unsetenv("KVR_UCX_HELLO");
    for (int i = 0; i < FLOOD; i++) {
        kvr_status_t s = send_one(f, q[i], t, t1);
        KVR_CHECK(s == KVR_ERR_MISMATCH || s == KVR_ERR_PEER_FAILURE);
    }
    KVR_CHECK_STATUS(send_one(a->eng, p, t, t1), KVR_OK);
    kvr_xfer_peer_t *pl = connect_tok(late, t, t1);
    KVR_CHECK_STATUS(send_one(late, pl, t, t1), KVR_OK);
    KVR_CHECK_STATUS(send_one(a->eng, p, t, t1), KVR_OK);
    struct kvr_xfer_engine_stats st;
    kvr_xfer_engine_stats(t, &st);
    KVR_CHECK(st.refused >= FLOOD);
    fprintf(stderr,
            "flood: %d endpoints without a HELLO on a table of 4: %llu refused, the "
            "admitted endpoint and a late one deliver\n",
            FLOOD, (unsigned long long)st.refused);
    for (int i = 0; i < FLOOD; i++)
        kvr_xfer_disconnect(q[i]);
    kvr_xfer_disconnect(p);
    kvr_xfer_disconnect(pl);
    for (int idle = 0; idle < 100;) /* what the closes sent, received */
        idle = kvr_xfer_progress(t) + kvr_xfer_progress(f) + kvr_xfer_progress(late) +
                       kvr_xfer_progress(a->eng)
                   ? 0
                   : idle + 1;
    kvr_xfer_engine_destroy(f);
    kvr_xfer_engine_destroy(late);
    kvr_xfer_engine_destroy(t);
    unsetenv("KVR_UCX_INBOUND_MAX");
}

/* the target disappears with a transfer in flight; then a new target */
static void test_peer_gone(struct side *a, struct side *b, kvr_xfer_peer_t *p, kvr_xfer_rmem_t *r)
{
    struct kvr_xfer_desc d = {a->mem, 0, r, 0, REGION};
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &d, 1, &dl), KVR_OK);
    kvr_status_t s = kvr_xfer_post(dl);
    kvr_xfer_engine_destroy(b->eng); /* the target's memory stays allocated */
    b->eng = NULL;
    uint64_t t0 = kvr_now_ns();
    if (s == KVR_INPROGRESS || s == KVR_OK) {
        s = kvr_xfer_wait(dl, 3000);
        KVR_CHECK(s == KVR_OK || s == KVR_ERR_PEER_FAILURE || s == KVR_ERR_TIMEOUT);
        s = kvr_xfer_post(dl); /* a new post on the dead peer */
        if (s == KVR_INPROGRESS)
            s = kvr_xfer_wait(dl, 3000);
        else if (s == KVR_ERR_BUSY)
            s = KVR_ERR_TIMEOUT;
    }
    KVR_CHECK(s == KVR_ERR_PEER_FAILURE || s == KVR_ERR_TIMEOUT);
    KVR_CHECK(kvr_now_ns() - t0 < 7000000000ull);
    fprintf(stderr, "peer gone: %s after %.0f ms\n", kvr_status_name(s),
            (double)(kvr_now_ns() - t0) / 1e6);
    uint64_t t1 = kvr_now_ns();
    kvr_xfer_disconnect(p); /* bounded, also releases dl and r */
    KVR_CHECK(kvr_now_ns() - t1 < 4000000000ull);

    /* a fresh target, its region allocated by the engine */
    struct side c;
    side_init2(&c, "target2", 1, 1);
    kvr_xfer_peer_t *p2;
    kvr_xfer_rmem_t *r2;
    connect_to(a, &c, &p2, &r2);
    fill(a->buf, REGION, 123);
    d = (struct kvr_xfer_desc){a->mem, 0, r2, 0, REGION};
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p2, KVR_XFER_WRITE, &d, 1, &dl), KVR_OK);
    s = kvr_xfer_post(dl);
    KVR_CHECK(s == KVR_OK || s == KVR_INPROGRESS);
    KVR_CHECK_STATUS(finish(dl, c.eng, 10000), KVR_OK);
    visible(p2, c.eng);
    KVR_CHECK(memcmp(a->buf, c.buf, REGION) == 0);
    kvr_xfer_disconnect(p2);
    side_fini(&c, 1);
}

/* ---- the same host, two processes ---- */

static pid_t sh_child = -1;

static void sh_reap(void)
{
    if (sh_child > 0) {
        kill(sh_child, SIGKILL);
        waitpid(sh_child, NULL, 0);
        sh_child = -1;
    }
}

static int sh_res_fd = -1; /* child: verdicts to the parent */
static uint8_t *sh_pool;

/* child: the notification names a seed; the whole region must hold it now */
static void sh_notif_cb(void *arg, const void *msg, size_t len, const uint8_t *token)
{
    (void)token;
    uint8_t seed = 0, ok = len == 1;
    if (ok)
        memcpy(&seed, msg, 1);
    for (size_t i = 0; ok && i < REGION; i++)
        ok = sh_pool[i] == pattern(i, seed);
    if (write(sh_res_fd, &ok, 1) != 1)
        _exit(3);
}

static int sh_write_all(int fd, const void *b, size_t n)
{
    const uint8_t *p = b;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int sh_read_all(int fd, void *b, size_t n, int timeout_ms)
{
    uint8_t *p = b;
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    while (n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (kvr_now_ns() > deadline || poll(&pf, 1, 100) < 0)
            return -1;
        if (!(pf.revents & (POLLIN | POLLHUP)))
            continue;
        ssize_t r = read(fd, p, n);
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void sh_send_blob(int fd, void *blob, size_t len)
{
    uint32_t l = (uint32_t)len;
    if (sh_write_all(fd, &l, 4) || sh_write_all(fd, blob, len))
        _exit(4);
    free(blob);
}

/* the forked target: engine, pool, address + rkey to the parent, then
 * progress until the parent closes the command pipe (or kills it) */
static void sh_target(int cmd_fd, int blob_fd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(5);
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = "sh-target";
    cfg.notif_cb = sh_notif_cb;
    kvr_xfer_engine_t *e;
    kvr_xfer_mem_t *m;
    void *blob;
    size_t len;
    if (kvr_xfer_engine_create(&cfg, &e) != KVR_OK ||
        kvr_xfer_mem_alloc(e, REGION, KVR_MEM_HOST, 0, &m) != KVR_OK)
        _exit(6);
    sh_pool = kvr_xfer_mem_addr(m);
    memset(sh_pool, 0, REGION);
    if (kvr_xfer_address(e, &blob, &len) != KVR_OK)
        _exit(7);
    sh_send_blob(blob_fd, blob, len);
    if (kvr_xfer_mem_pack(m, &blob, &len) != KVR_OK)
        _exit(8);
    sh_send_blob(blob_fd, blob, len);
    for (;;) {
        kvr_xfer_progress(e);
        struct pollfd pf = {.fd = cmd_fd, .events = POLLIN};
        if (poll(&pf, 1, 0) > 0) {
            kvr_xfer_engine_destroy(e);
            _exit(0);
        }
    }
}

static void *sh_recv_blob(int fd, size_t *len_p)
{
    uint32_t l = 0;
    KVR_CHECK(sh_read_all(fd, &l, 4, 20000) == 0);
    KVR_CHECK(l > 0 && l < (1u << 20));
    void *b = malloc(l);
    KVR_CHECK(b);
    KVR_CHECK(sh_read_all(fd, b, l, 5000) == 0);
    *len_p = l;
    return b;
}

static void test_same_host(void)
{
    int cmd[2], blobs[2], res[2];
    KVR_CHECK(pipe(cmd) == 0 && pipe(blobs) == 0 && pipe(res) == 0);
    fflush(NULL);
    sh_child = fork();
    KVR_CHECK(sh_child >= 0);
    if (sh_child == 0) {
        close(cmd[1]);
        close(blobs[0]);
        close(res[0]);
        sh_res_fd = res[1];
        sh_target(cmd[0], blobs[1]);
    }
    atexit(sh_reap); /* a failed check still kills and reaps the target */
    close(cmd[0]);
    close(blobs[1]);
    close(res[1]);

    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = "sh-initiator";
    kvr_xfer_engine_t *e;
    kvr_xfer_mem_t *m;
    KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &e), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_alloc(e, REGION, KVR_MEM_HOST, 0, &m), KVR_OK);
    uint8_t *src = kvr_xfer_mem_addr(m);
    size_t len;
    void *blob = sh_recv_blob(blobs[0], &len);
    kvr_xfer_peer_t *p;
    KVR_CHECK_STATUS(kvr_xfer_connect(e, blob, len, &p), KVR_OK);
    free(blob);
    blob = sh_recv_blob(blobs[0], &len);
    kvr_xfer_rmem_t *r;
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, blob, len, &r), KVR_OK);
    free(blob);
    const char *tr = kvr_xfer_peer_transports(p);
    const char *mode = getenv("KVR_UCX_ERR_MODE");
    bool direct = strstr(tr, "+cma") || strstr(tr, "+mapped");
    fprintf(stderr, "same host: transports %s\n", tr);
    const char *pool = getenv("KVR_UCX_POOL");
    if (!(mode && strcmp(mode, "peer") == 0)) /* pidfd-watched peer: the direct path */
        KVR_CHECK(direct);
    if (pool && (strcmp(pool, "shm") == 0 || strcmp(pool, "file") == 0) && direct)
        KVR_CHECK(strstr(tr, "+mapped(memcpy)") != NULL); /* shared memory: mapped here */
    if (pool && strcmp(pool, "anon") == 0 && direct)      /* private memory: process_vm_writev */
        KVR_CHECK(strstr(tr, "+cma(process_vm_writev)") != NULL);

    /* WRITE, blocks in reverse order (nothing coalesces), checked at the
     * notification; then READ back */
    static const uint64_t sizes[] = {4096, 65536, 1u << 20, 4u << 20};
    struct kvr_xfer_desc *d = calloc(REGION / 4096, sizeof(*d));
    KVR_CHECK(d);
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint64_t bs = sizes[k];
        size_t n = REGION / bs;
        uint8_t seed = (uint8_t)(40 + k);
        for (size_t i = 0; i < n; i++) {
            d[i] = (struct kvr_xfer_desc){m, i * bs, r, (n - 1 - i) * bs, bs};
            for (uint64_t j = 0; j < bs; j++)
                src[i * bs + j] = pattern((n - 1 - i) * bs + j, seed);
        }
        kvr_xfer_dlist_t *dl;
        KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, n, &dl), KVR_OK);
        size_t nseg;
        KVR_CHECK_EQ(kvr_xfer_dlist_count(dl, &nseg), n);
        KVR_CHECK_EQ(nseg, n);
        kvr_status_t s = kvr_xfer_post(dl);
        KVR_CHECK(s == KVR_OK || s == KVR_INPROGRESS);
        if (direct)
            KVR_CHECK_STATUS(s, KVR_OK); /* synchronous: complete at return */
        KVR_CHECK_STATUS(finish(dl, NULL, 10000), KVR_OK);
        KVR_CHECK_STATUS(kvr_xfer_notify(p, &seed, 1), KVR_OK);
        uint8_t ok = 0;
        uint64_t deadline = kvr_deadline_ns(10000);
        for (;;) { /* the notification may need this engine's progress */
            kvr_xfer_progress(e);
            struct pollfd pf = {.fd = res[0], .events = POLLIN};
            if (poll(&pf, 1, 1) > 0)
                break;
            KVR_CHECK(kvr_now_ns() < deadline);
        }
        KVR_CHECK(read(res[0], &ok, 1) == 1);
        KVR_CHECK(ok == 1); /* every byte there when the notification arrived */
        kvr_xfer_dlist_release(dl);

        memset(src, 0, REGION);
        struct kvr_xfer_desc rd = {m, 0, r, 0, REGION};
        KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_READ, &rd, 1, &dl), KVR_OK);
        s = kvr_xfer_post(dl);
        KVR_CHECK(s == KVR_OK || s == KVR_INPROGRESS);
        KVR_CHECK_STATUS(finish(dl, NULL, 10000), KVR_OK);
        for (size_t i = 0; i < REGION; i += 4093)
            KVR_CHECK_EQ(src[i], pattern(i, seed));
        KVR_CHECK_EQ(src[REGION - 1], pattern(REGION - 1, seed));
        kvr_xfer_dlist_release(dl);
    }

    /* the target dies: posts fail, typed */
    struct kvr_xfer_desc wd = {m, 0, r, 0, 1u << 20};
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &wd, 1, &dl), KVR_OK);
    KVR_CHECK(kill(sh_child, SIGKILL) == 0);
    KVR_CHECK(waitpid(sh_child, NULL, 0) == sh_child);
    sh_child = -1;
    uint64_t t0 = kvr_now_ns();
    kvr_status_t s = KVR_OK;
    while (kvr_now_ns() - t0 < 5000000000ull) {
        s = kvr_xfer_post(dl);
        if (s == KVR_INPROGRESS)
            s = finish(dl, NULL, 1000);
        if (s != KVR_OK && s != KVR_ERR_TIMEOUT)
            break;
        kvr_xfer_progress(e);
    }
    fprintf(stderr, "same host: target killed: %s after %.1f ms\n", kvr_status_name(s),
            (double)(kvr_now_ns() - t0) / 1e6);
    KVR_CHECK_STATUS(s, KVR_ERR_PEER_FAILURE);
    KVR_CHECK_STATUS(kvr_xfer_peer_status(p), KVR_ERR_PEER_FAILURE);
    KVR_CHECK_STATUS(kvr_xfer_post(dl), KVR_ERR_PEER_FAILURE);
    free(d);
    kvr_xfer_disconnect(p);
    kvr_xfer_engine_destroy(e);
    close(cmd[1]);
    close(blobs[0]);
    close(res[0]);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s BACKEND\n", argv[0]);
        return 2;
    }
    backend = argv[1];
    int built = 0;
    for (const char *const *n = kvr_xfer_backends(); *n; n++)
        built |= strcmp(*n, backend) == 0;
    if (!built)
        KVR_SKIP("backend %s is not built into this binary", backend);

    /* an unknown backend, and require_rdma: a clear start-up error or RDMA */
    struct kvr_xfer_config cfg;
    kvr_xfer_engine_t *e = NULL;
    kvr_xfer_config_init(&cfg);
    cfg.backend = "no-such-backend";
    KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &e), KVR_ERR_NOT_FOUND);
    KVR_CHECK(e == NULL);
    cfg.backend = backend;
    cfg.require_rdma = 1;
    kvr_status_t rs = kvr_xfer_engine_create(&cfg, &e);
    KVR_CHECK(rs == KVR_OK || rs == KVR_ERR_NO_RDMA);
    fprintf(stderr, "%s: require_rdma at create: %s\n", backend, kvr_status_name(rs));
    if (rs == KVR_OK) { /* RDMA here: a connection must then use it, or refuse */
        kvr_xfer_engine_t *t;
        cfg.require_rdma = 0;
        KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &t), KVR_OK);
        void *blob;
        size_t len;
        kvr_xfer_peer_t *q;
        KVR_CHECK_STATUS(kvr_xfer_address(t, &blob, &len), KVR_OK);
        rs = kvr_xfer_connect(e, blob, len, &q);
        KVR_CHECK(rs == KVR_OK || rs == KVR_ERR_NO_RDMA);
        fprintf(stderr, "%s: require_rdma at connect: %s\n", backend, kvr_status_name(rs));
        free(blob);
        kvr_xfer_engine_destroy(t);
        kvr_xfer_engine_destroy(e);
    }

    struct side a, b;
    side_init(&a, "initiator", 0);
    side_init(&b, "target", 1);
    kvr_xfer_peer_t *p;
    kvr_xfer_rmem_t *r;
    connect_to(&a, &b, &p, &r);
    fprintf(stderr, "%s: transports %s\n", backend, kvr_xfer_peer_transports(p));

    test_write_read(&a, &b, p, r);
    test_notify_after_data(&a, &b, p, r);
    test_bad_input(&a, &b, p, r);
    test_timeouts(&a, &b, p, r);
    test_event_fd(&a, &b, p);
    test_shm_rkeys(&a);
    test_damaged_blobs(&a, &b, p);
    test_tokens(&a);
    test_peer_gone(&a, &b, p, r);
    /* after test_peer_gone: UCX 1.13 (shared memory) asserted on a wireup
     * message pending in the target's worker when that target was destroyed
     * mid-transfer after these ran (not understood; see docs/transport.md) */
    test_revoke(&a);
    if (strcmp(backend, "ucx") == 0)
        test_inbound_flood(&a);

    free(b.buf);
    side_fini(&a, 0);
    if (strcmp(backend, "ucx") == 0)
        test_same_host(); /* after every engine above is gone: fork is safe */
    fprintf(stderr, "conformance %s: all checks passed\n", backend);
    return 0;
}
