/*
 * test_verbs_pair.c - two processes over the verbs backend, on soft-RoCE in
 * the test VM (tests/rdma/guest.sh runs it; outside the VM there is no RDMA
 * device and it skips).
 *
 * A forked target registers two regions, sends its address and rkey blobs
 * through a pipe and only runs kvr_xfer_progress(); each notification it gets
 * names a round, and it checks every byte of that round in its region at
 * once, in the callback, before answering on a second pipe: so a
 * notification that overtook its writes fails the test.
 *
 *   --case pair      64 KiB and 4 KiB descriptors (permuted: no coalescing; the
 *                    4 KiB list is 8x the send queue: back-pressure), verified
 *                    writes + notifications, then READs verified locally
 *   --case death     kill -9 of the target during transfers: a typed error
 *                    within 5 s, then a restarted target is reached
 *   --case badkey    a write with the rkey of a deregistered region: a clear
 *                    error (KVR_ERR_NOT_FOUND), then reconnection works;
 *                    a damaged rkey blob is refused
 *   --case mismatch  IPv4-mapped vs IPv6 GIDs: KVR_ERR_MISMATCH at connect;
 *                    unknown device and GID index refused at create
 *   --case failover  two rails (--dev-a/--dev-b name two devices each): rail 1's
 *                    QP is put in error in the middle of a striped 8 MiB write
 *                    (KVR_VERBS_FAIL_RAIL, a real QP error and real flushed
 *                    completions): the write completes, every byte verified at
 *                    the notification, the failover counted; the next writes
 *                    run on rail 0 alone, verified; after the cool-down a
 *                    probe brings rail 1 back (a new QP, one-rail handshake,
 *                    a zero-length WRITE) and a write over both is verified;
 *                    a reconnection has both rails too; then a new initiator
 *                    whose two rails both fail: KVR_ERR_PEER_FAILURE within 5 s
 *   --case linkdown  two rails on two veth pairs (--link0/--link1 name the
 *                    initiator's netdev of each): rail 1's link taken down
 *                    (SIOCSIFFLAGS, as `ip link set down`) under a striped
 *                    --mib MiB write notified at once: it completes, every
 *                    byte verified at the notification, the failover counted,
 *                    detection time and throughput in the second after
 *                    printed; link up: the probe brings the rail back and the
 *                    next write is striped over both (per-rail bytes); rail
 *                    0's link - the notifications' rail - down under a write:
 *                    its notification arrives on rail 1 after the data; both
 *                    links down: KVR_ERR_PEER_FAILURE within 5 s; both up: a
 *                    new connection stripes over both (later writes: --mib-next)
 *   --case bench     write bandwidth of one size and batch (by hand)
 *   --case nodev     (on the host) no RDMA device: engine create fails cleanly
 *                    with KVR_ERR_NO_RDMA
 *
 * --rounds N: write rounds of --case pair (default 4, alternating 64 KiB / 4 KiB).
 * --dev-a DEVS / --dev-b DEVS: devices of the initiator / target; --gid-a N /
 * --gid-b N their GID index (default: auto).
 */
#include "kvr_test.h"
#include "kvr_xfer.h"
#include "kvr_clock.h"
#include "kvr_status.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIDE (8u << 20) /* the target's READ source and the initiator's READ sink */
/* the target's write region and the initiator's source: 8 MiB, or --mib */
static uint64_t region = 8u << 20;
#define REGION region
/* the bytes the lists of the current round cover (a prefix of the region):
 * perm_list(), fill_round(), write_round(); the target checks what the
 * notification names */
static uint64_t span = 8u << 20;

static const char *dev_a = "rxe_lo", *dev_b = "rxe_lo";
static int gid_a = -1, gid_b = -1;
static unsigned rounds = 4;

/* the expected content: one 64-bit word per 8 bytes of the region (fast
 * enough under TCG), different in every round and at every offset */
static uint64_t pat(uint32_t round, uint64_t off)
{
    uint64_t x = (off / 8 + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)round << 48);
    return x ^ (x >> 29);
}

static uint64_t *word(void *p, uint64_t off)
{
    return (uint64_t *)((char *)p + off);
}

static void put_blob(int fd, const void *b, size_t len)
{
    uint32_t l = (uint32_t)len;
    KVR_CHECK(write(fd, &l, 4) == 4);
    KVR_CHECK(write(fd, b, len) == (ssize_t)len);
}

static void *get_blob(int fd, size_t *len_p)
{
    uint32_t l;
    size_t have = 0;
    while (have < 4) {
        ssize_t n = read(fd, (char *)&l + have, 4 - have);
        KVR_CHECK(n > 0);
        have += (size_t)n;
    }
    char *b = malloc(l);
    KVR_CHECK(b);
    have = 0;
    while (have < l) {
        ssize_t n = read(fd, b + have, l - have);
        KVR_CHECK(n > 0);
        have += (size_t)n;
    }
    *len_p = l;
    return b;
}

static kvr_status_t make_engine(const char *devs, int gid, kvr_xfer_notif_cb_t cb, void *arg,
                                kvr_xfer_engine_t **e_p)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = "verbs";
    cfg.devices = devs;
    cfg.gid_index = gid;
    cfg.require_rdma = 1;
    cfg.notif_cb = cb;
    cfg.notif_arg = arg;
    return kvr_xfer_engine_create(&cfg, e_p);
}

/* ------------------------------------------------------------------------ */
/* target process                                                            */

struct target {
    uint8_t *rbuf;
    int res_fd;
    int quit;
};

static void target_cb(void *arg, const void *msg, size_t len, const uint8_t *token)
{
    (void)token;
    struct target *t = arg;
    char m[64] = {0};
    memcpy(m, msg, len < sizeof(m) - 1 ? len : sizeof(m) - 1);
    unsigned round;
    char ans[64];
    if (strcmp(m, "quit") == 0) {
        t->quit = 1;
        return;
    }
    unsigned long long upto = REGION;
    if (sscanf(m, "round %u %llu", &round, &upto) < 1 || upto > REGION) {
        snprintf(ans, sizeof(ans), "bad message");
    } else {
        uint64_t bad = UINT64_MAX;
        for (uint64_t o = 0; o < upto; o += 8)
            if (*word(t->rbuf, o) != pat(round, o)) {
                bad = o;
                break;
            }
        if (bad == UINT64_MAX)
            snprintf(ans, sizeof(ans), "ok %u", round);
        else
            snprintf(ans, sizeof(ans), "bad %u at %llu", round, (unsigned long long)bad);
    }
    char line[64] = {0};
    snprintf(line, sizeof(line), "%s", ans);
    if (write(t->res_fd, line, sizeof(line)) != (ssize_t)sizeof(line))
        _exit(3);
}

/* blobs out on blob_fd: address, rkey(R), rkey(S), rkey(X, deregistered) */
static void target_main(int blob_fd, int res_fd)
{
    struct target t = {.res_fd = res_fd};
    kvr_xfer_engine_t *e;
    KVR_CHECK_STATUS(make_engine(dev_b, gid_b, target_cb, &t, &e), KVR_OK);
    t.rbuf = aligned_alloc(4096, REGION);
    uint8_t *sbuf = aligned_alloc(4096, SIDE), *xbuf = aligned_alloc(4096, 1 << 20);
    KVR_CHECK(t.rbuf && sbuf && xbuf);
    memset(t.rbuf, 0, REGION);
    for (uint64_t o = 0; o < SIDE; o += 8)
        *word(sbuf, o) = pat(1000, o);
    kvr_xfer_mem_t *mr, *ms, *mx;
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(e, t.rbuf, REGION, KVR_MEM_HOST, 0, &mr), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(e, sbuf, SIDE, KVR_MEM_HOST, 0, &ms), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(e, xbuf, 1 << 20, KVR_MEM_HOST, 0, &mx), KVR_OK);
    void *b;
    size_t l;
    KVR_CHECK_STATUS(kvr_xfer_address(e, &b, &l), KVR_OK);
    put_blob(blob_fd, b, l);
    free(b);
    kvr_xfer_mem_t *ms_all[3] = {mr, ms, mx};
    for (int i = 0; i < 3; i++) {
        KVR_CHECK_STATUS(kvr_xfer_mem_pack(ms_all[i], &b, &l), KVR_OK);
        put_blob(blob_fd, b, l);
        free(b);
    }
    kvr_xfer_mem_dereg(mx); /* its rkey is now stale */
    uint64_t deadline = kvr_deadline_ns(300000);
    while (!t.quit && kvr_now_ns() < deadline)
        if (kvr_xfer_progress(e) == 0)
            usleep(50);
    kvr_xfer_engine_destroy(e);
    _exit(0);
}

struct target_proc {
    pid_t pid;
    int res_fd;
    void *addr, *rk[3];
    size_t addr_len, rk_len[3];
};

static void target_start(struct target_proc *tp)
{
    int bp[2], rp[2];
    KVR_CHECK(pipe(bp) == 0 && pipe(rp) == 0);
    tp->pid = fork();
    KVR_CHECK(tp->pid >= 0);
    if (tp->pid == 0) {
        close(bp[0]);
        close(rp[0]);
        target_main(bp[1], rp[1]);
    }
    close(bp[1]);
    close(rp[1]);
    tp->res_fd = rp[0];
    tp->addr = get_blob(bp[0], &tp->addr_len);
    for (int i = 0; i < 3; i++)
        tp->rk[i] = get_blob(bp[0], &tp->rk_len[i]);
    close(bp[0]);
}

/* exit status of the target, or -1 when it had to be killed */
static int target_reap(struct target_proc *tp)
{
    int st = 0, rc = -1;
    for (int i = 0; i < 100; i++) {
        if (waitpid(tp->pid, &st, WNOHANG) == tp->pid)
            goto done;
        usleep(50000);
    }
    kill(tp->pid, SIGKILL);
    waitpid(tp->pid, &st, 0);
    st = -1;
done:
    if (st != -1 && WIFEXITED(st))
        rc = WEXITSTATUS(st);
    close(tp->res_fd);
    free(tp->addr);
    for (int i = 0; i < 3; i++)
        free(tp->rk[i]);
    return rc;
}

/* waits (bounded, progressing e) for the target's verdict line */
static void expect_verdict(kvr_xfer_engine_t *e, struct target_proc *tp, unsigned round)
{
    char line[64];
    size_t have = 0;
    uint64_t deadline = kvr_deadline_ns(60000);
    while (have < sizeof(line)) {
        kvr_xfer_progress(e);
        ssize_t n = read(tp->res_fd, line + have, sizeof(line) - have);
        if (n > 0)
            have += (size_t)n;
        KVR_CHECK(n != 0);
        KVR_CHECK(kvr_now_ns() < deadline);
        if (n < 0)
            usleep(200);
    }
    char want[64];
    snprintf(want, sizeof(want), "ok %u", round);
    if (strcmp(line, want) != 0) {
        fprintf(stderr, "target says '%s', want '%s'\n", line, want);
        exit(1);
    }
}

/* ------------------------------------------------------------------------ */
/* initiator side                                                            */

struct init {
    kvr_xfer_engine_t *e;
    kvr_xfer_peer_t *p;
    kvr_xfer_mem_t *lm, *lm2;
    kvr_xfer_rmem_t *rr, *rs, *rx;
    uint8_t *lbuf, *lbuf2;
};

static void init_connect(struct init *in, struct target_proc *tp)
{
    KVR_CHECK_STATUS(kvr_xfer_connect(in->e, tp->addr, tp->addr_len, &in->p), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(in->p, tp->rk[0], tp->rk_len[0], &in->rr), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(in->p, tp->rk[1], tp->rk_len[1], &in->rs), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(in->p, tp->rk[2], tp->rk_len[2], &in->rx), KVR_OK);
}

static void init_setup(struct init *in)
{
    KVR_CHECK_STATUS(make_engine(dev_a, gid_a, NULL, NULL, &in->e), KVR_OK);
    in->lbuf = aligned_alloc(4096, REGION);
    in->lbuf2 = aligned_alloc(4096, SIDE);
    KVR_CHECK(in->lbuf && in->lbuf2);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(in->e, in->lbuf, REGION, KVR_MEM_HOST, 0, &in->lm), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(in->e, in->lbuf2, SIDE, KVR_MEM_HOST, 0, &in->lm2), KVR_OK);
}

/* a permuted list of n blocks of bs bytes over the whole region */
static kvr_xfer_dlist_t *perm_list(struct init *in, enum kvr_xfer_op op, kvr_xfer_mem_t *lm,
                                   kvr_xfer_rmem_t *rm, uint32_t bs, uint32_t *map)
{
    uint32_t n = span / bs;
    struct kvr_xfer_desc *d = calloc(n, sizeof(*d));
    KVR_CHECK(d);
    for (uint32_t i = 0; i < n; i++) {
        map[i] = (uint32_t)(((uint64_t)i * 2654435761u + 12345u) % n); /* roff block of loff i */
        d[i] = (struct kvr_xfer_desc){.lmem = lm,
                                      .loff = (uint64_t)i * bs,
                                      .rmem = rm,
                                      .roff = (uint64_t)map[i] * bs,
                                      .len = bs};
    }
    /* the map must be a permutation: n is a power of two and the factor odd */
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(in->p, op, d, n, &dl), KVR_OK);
    size_t co;
    KVR_CHECK_EQ(kvr_xfer_dlist_count(dl, &co), n);
    KVR_CHECK(co > n / 2); /* permuted: (almost) nothing coalesces */
    free(d);
    return dl;
}

static void fill_round(struct init *in, unsigned round, uint32_t bs, const uint32_t *map)
{
    uint32_t n = span / bs;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t ro = (uint64_t)map[i] * bs;
        for (uint32_t k = 0; k < bs; k += 8)
            *word(in->lbuf, (uint64_t)i * bs + k) = pat(round, ro + k);
    }
}

/* one round: fill, post, notify at once (not after completion), verdict */
static void write_round(struct init *in, struct target_proc *tp, kvr_xfer_dlist_t *dl,
                        unsigned round, uint32_t bs, const uint32_t *map)
{
    fill_round(in, round, bs, map);
    kvr_status_t s = kvr_xfer_post(dl);
    KVR_CHECK(s == KVR_INPROGRESS || s == KVR_OK);
    char msg[48];
    snprintf(msg, sizeof(msg), "round %u %llu", round, (unsigned long long)span);
    KVR_CHECK_STATUS(kvr_xfer_notify(in->p, msg, strlen(msg) + 1), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_wait(dl, 120000), KVR_OK);
    expect_verdict(in->e, tp, round);
    struct kvr_xfer_stats st;
    kvr_xfer_dlist_stats(dl, &st);
    KVR_CHECK(st.bytes == span && st.complete_ns > 0);
    printf("round %u: %u x %u B verified at the target after the notification; %.1f MB/s, "
           "post %.1f us\n",
           round, st.ndesc_coalesced, bs, span / (st.complete_ns / 1e3), st.post_ns / 1e3);
}

static void quit_target(struct init *in, struct target_proc *tp)
{
    KVR_CHECK_STATUS(kvr_xfer_notify(in->p, "quit", 5), KVR_OK);
    /* the target may exit (and close its side channel) before our SEND
     * completion is seen: its clean exit is the proof that it got "quit" */
    kvr_status_t s = kvr_xfer_flush(in->p, 5000);
    KVR_CHECK(s == KVR_OK || s == KVR_ERR_PEER_FAILURE);
    KVR_CHECK_EQ(target_reap(tp), 0);
}

static int case_failover(void)
{
    KVR_CHECK(strchr(dev_a, ',') && strchr(dev_b, ','));
    struct init in = {0};
    struct target_proc tp;
    target_start(&tp); /* before the variable: the target's rails stay whole */
    /* rail 1 fails once a third of the 4 KiB list's WRs were posted on it */
    setenv("KVR_VERBS_FAIL_RAIL", "1:300", 1);
    setenv("KVR_VERBS_RAIL_COOLDOWN_MS", "4000", 1);
    init_setup(&in);
    unsetenv("KVR_VERBS_FAIL_RAIL");
    unsetenv("KVR_VERBS_RAIL_COOLDOWN_MS");
    init_connect(&in, &tp);
    uint32_t *map4 = calloc(REGION / 4096, 4);
    KVR_CHECK(map4);
    kvr_xfer_dlist_t *w4 = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, 4096, map4);
    struct kvr_xfer_engine_stats es;
    kvr_xfer_engine_stats(in.e, &es);
    KVR_CHECK_EQ(es.failovers, 0);
    uint64_t t0 = kvr_now_ns();
    write_round(&in, &tp, w4, 1, 4096, map4); /* rail 1 fails under it */
    printf("failover round: %.1f ms\n", (double)(kvr_now_ns() - t0) / 1e6);
    kvr_xfer_engine_stats(in.e, &es);
    KVR_CHECK_EQ(es.failovers, 1);
    KVR_CHECK_EQ(es.errors, 0); /* no post failed */
    KVR_CHECK_STATUS(kvr_xfer_peer_status(in.p), KVR_OK);
    printf("transports after the failover: %s\n", kvr_xfer_peer_transports(in.p));
    /* rail 1 stays down for its 4 s cool-down from the failover, which came
     * inside the round: a round shorter than that must still see it down
     * (a slower one, in a starved VM, may already see it probed back) */
    if (kvr_now_ns() - t0 < 4000ull * 1000000ull)
        KVR_CHECK(strstr(kvr_xfer_peer_transports(in.p), "(down)") != NULL);
    for (unsigned r = 2; r <= 3; r++) /* rail 0 alone (until the probe brings rail 1 back) */
        write_round(&in, &tp, w4, r, 4096, map4);
    /* after the cool-down (4 s here) a probe brings rail 1 back on its own */
    uint64_t deadline = kvr_deadline_ns(30000);
    while (strstr(kvr_xfer_peer_transports(in.p), "(down)") && kvr_now_ns() < deadline) {
        kvr_xfer_progress(in.e);
        usleep(1000);
    }
    printf("transports after the probe: %s\n", kvr_xfer_peer_transports(in.p));
    KVR_CHECK(strstr(kvr_xfer_peer_transports(in.p), "(down)") == NULL);
    write_round(&in, &tp, w4, 5, 4096, map4); /* both rails again, verified */
    kvr_xfer_engine_stats(in.e, &es);
    KVR_CHECK_EQ(es.failovers, 1);
    KVR_CHECK_EQ(es.errors, 0);
    /* a new connection has both rails again */
    kvr_xfer_disconnect(in.p); /* (releases w4 and the remote regions) */
    init_connect(&in, &tp);
    w4 = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, 4096, map4);
    write_round(&in, &tp, w4, 4, 4096, map4);
    printf("transports after reconnecting: %s\n", kvr_xfer_peer_transports(in.p));
    KVR_CHECK(strchr(kvr_xfer_peer_transports(in.p), ',') != NULL);
    kvr_xfer_engine_stats(in.e, &es);
    KVR_CHECK_EQ(es.failovers, 1);
    kvr_xfer_engine_destroy(in.e); /* (the target serves the next initiator) */

    /* both rails fail: the post fails, typed, within 5 s */
    struct init in2 = {0};
    setenv("KVR_VERBS_FAIL_RAIL", "1:100,0:200", 1);
    init_setup(&in2);
    unsetenv("KVR_VERBS_FAIL_RAIL");
    init_connect(&in2, &tp);
    kvr_xfer_dlist_t *w = perm_list(&in2, KVR_XFER_WRITE, in2.lm, in2.rr, 4096, map4);
    uint64_t t1 = kvr_now_ns();
    kvr_status_t s = kvr_xfer_post(w);
    KVR_CHECK(s == KVR_INPROGRESS || s == KVR_ERR_PEER_FAILURE);
    if (s == KVR_INPROGRESS)
        s = kvr_xfer_wait(w, 5000);
    printf("both rails failed: %s after %.1f ms\n", kvr_status_name(s),
           (double)(kvr_now_ns() - t1) / 1e6);
    KVR_CHECK_STATUS(s, KVR_ERR_PEER_FAILURE);
    KVR_CHECK(kvr_now_ns() - t1 < 5000000000ull);
    KVR_CHECK_STATUS(kvr_xfer_peer_status(in2.p), KVR_ERR_PEER_FAILURE);
    kvr_xfer_engine_destroy(in2.e);
    /* the target lives on: a third initiator says goodbye to it */
    struct init in3 = {0};
    init_setup(&in3);
    init_connect(&in3, &tp);
    quit_target(&in3, &tp);
    kvr_xfer_engine_destroy(in3.e);
    free(map4);
    printf("failover %s -> %s: OK\n", dev_a, dev_b);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* links taken down under a transfer (two veth pairs, one rxe device per end) */

static const char *link0, *link1; /* the initiator-side netdev of rail 0 / rail 1 */

/* what `ip link set dev IF up|down` does (SIOCSIFFLAGS: the kernel's
 * dev_change_flags), without exec'ing ip from the 9p root under TCG, which
 * took seconds: the link's state changes at a known instant */
static void set_link(const char *ifname, int up)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    KVR_CHECK(fd >= 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
    KVR_CHECK(ioctl(fd, SIOCGIFFLAGS, &ifr) == 0);
    if (up)
        ifr.ifr_flags |= IFF_UP;
    else
        ifr.ifr_flags &= ~IFF_UP;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) != 0) {
        fprintf(stderr, "link %s %s: %s\n", ifname, up ? "up" : "down", strerror(errno));
        exit(1);
    }
    close(fd);
}

/* the connection's rails into rs[]; returns the bytes completed on all */
static uint64_t rails_now(kvr_xfer_peer_t *p, struct kvr_xfer_rail_stats rs[4])
{
    size_t n = kvr_xfer_peer_rails(p, rs, 4);
    KVR_CHECK(n >= 2 && n <= 4);
    uint64_t b = 0;
    for (size_t i = 0; i < n; i++)
        b += rs[i].bytes_done;
    return b;
}

/* the rxe device of each end of link li up again, with its GID back (the
 * link-local address returns after the link comes up) */
static void wait_link_back(kvr_xfer_engine_t *e, const char *devs_a, const char *devs_b, int li)
{
    const char *lists[2] = {devs_a, devs_b};
    for (int k = 0; k < 2; k++) {
        char dev[64] = {0};
        const char *c = lists[k];
        for (int i = 0; i < li && c; i++)
            c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL;
        KVR_CHECK(c);
        size_t n = strcspn(c, ":,");
        KVR_CHECK(n > 0 && n < sizeof(dev));
        memcpy(dev, c, n);
        char path[160];
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/gids/0", dev);
        uint64_t deadline = kvr_deadline_ns(30000);
        for (;;) {
            char g[64] = {0}, st[64] = {0};
            FILE *f = fopen(path, "r");
            if (f) {
                (void)!fgets(g, sizeof(g), f);
                fclose(f);
            }
            snprintf(path + strlen(path) - strlen("gids/0"), 16, "state");
            f = fopen(path, "r");
            if (f) {
                (void)!fgets(st, sizeof(st), f);
                fclose(f);
            }
            snprintf(path + strlen(path) - strlen("state"), 16, "gids/0");
            if (strncmp(g, "fe80", 4) == 0 && strstr(st, "ACTIVE"))
                break;
            KVR_CHECK(kvr_now_ns() < deadline);
            if (e)
                kvr_xfer_progress(e);
            usleep(10000);
        }
    }
}

/* progresses until bytes have completed on the rails (or w completed); returns them */
static uint64_t progress_until(struct init *in, kvr_xfer_dlist_t *w, uint64_t bytes,
                               struct kvr_xfer_rail_stats rs[4])
{
    uint64_t deadline = kvr_deadline_ns(300000), b;
    while ((b = rails_now(in->p, rs)) < bytes && kvr_xfer_test(w) == KVR_INPROGRESS) {
        kvr_xfer_progress(in->e);
        KVR_CHECK(kvr_now_ns() < deadline);
    }
    return b;
}

/* the netdevs of the links in the mask (bit 0: link0, bit 1: link1) up or down */
static void set_links(unsigned links, int up)
{
    for (int li = 0; li < 2; li++)
        if (links & (1u << li))
            set_link(li ? link1 : link0, up);
}

/* the links in the mask go down once an eighth of a write of the round
 * completed: the write ends with want within 5 s (a failure) or 120 s.
 * When want is KVR_OK its notification is queued right after the post and
 * the target checks every byte when it arrives. */
static void links_down_round(struct init *in, struct target_proc *tp, kvr_xfer_dlist_t *w,
                             unsigned round, const uint32_t *map, unsigned links, kvr_status_t want)
{
    struct kvr_xfer_rail_stats rs[4];
    fill_round(in, round, 65536, map);
    uint64_t base = rails_now(in->p, rs);
    KVR_CHECK_STATUS(kvr_xfer_post(w), KVR_INPROGRESS);
    char msg[48];
    snprintf(msg, sizeof(msg), "round %u %llu", round, (unsigned long long)span);
    if (want == KVR_OK)
        KVR_CHECK_STATUS(kvr_xfer_notify(in->p, msg, strlen(msg) + 1), KVR_OK);
    progress_until(in, w, base + span / 8, rs);
    KVR_CHECK_STATUS(kvr_xfer_test(w), KVR_INPROGRESS); /* still mid-transfer */
    set_links(links, 0);
    uint64_t t = kvr_now_ns();
    kvr_status_t s = kvr_xfer_wait(w, want == KVR_OK ? 120000 : 5000);
    printf("link(s) %s%s%s down under a write: %s %.0f ms after\n", links & 1 ? link0 : "",
           links == 3 ? " and " : "", links & 2 ? link1 : "", kvr_status_name(s),
           (double)(kvr_now_ns() - t) / 1e6);
    KVR_CHECK_STATUS(s, want);
    if (want == KVR_OK)
        expect_verdict(in->e, tp, round); /* the notification came after every byte */
}

/* the links in the mask come up: the probes bring their rails back, and a
 * write of the round is striped over both rails again (equal links: half
 * each), notified on rail 0 - the preferred rail, where notifications move
 * back once it returned - after every byte */
static void links_up_round(struct init *in, struct target_proc *tp, kvr_xfer_dlist_t *w,
                           unsigned round, const uint32_t *map, unsigned links)
{
    struct kvr_xfer_rail_stats rs[4];
    uint64_t t_up = kvr_now_ns(), deadline = kvr_deadline_ns(60000);
    set_links(links, 1);
    while (rails_now(in->p, rs) && (rs[0].down || rs[1].down)) {
        kvr_xfer_progress(in->e);
        KVR_CHECK(kvr_now_ns() < deadline);
        usleep(1000);
    }
    printf("link(s) up: rails back after %.0f ms\n", (double)(kvr_now_ns() - t_up) / 1e6);
    uint64_t before[2] = {rs[0].bytes_done, rs[1].bytes_done};
    write_round(in, tp, w, round, 65536, map);
    rails_now(in->p, rs);
    printf("  next write per rail: %s %.1f MiB, %s %.1f MiB; notifications on rail %d\n",
           rs[0].local, (double)(rs[0].bytes_done - before[0]) / 1048576.0, rs[1].local,
           (double)(rs[1].bytes_done - before[1]) / 1048576.0, rs[0].notif ? 0 : 1);
    KVR_CHECK(rs[0].bytes_done - before[0] >= span / 4);
    KVR_CHECK(rs[1].bytes_done - before[1] >= span / 4);
    KVR_CHECK(rs[0].notif && !rs[1].notif);
}

/* the issue-9 scenario on real links: rail 1's link taken down in the
 * middle of a striped write (--mib MiB in 64 KiB permuted descriptors, the
 * notification sent right after the post); then back up; then both links
 * down; then both up (the later writes cover --mib-next MiB) */
static uint64_t span_next = 32u << 20;

static int case_linkdown(void)
{
    KVR_CHECK(strchr(dev_a, ',') && strchr(dev_b, ',') && link0 && link1);
    KVR_CHECK(span_next <= REGION && REGION % 65536 == 0 && span_next % 65536 == 0);
    const uint32_t bs = 65536;
    struct init in = {0};
    struct target_proc tp;
    target_start(&tp);
    init_setup(&in);
    init_connect(&in, &tp);
    uint32_t *map = calloc(REGION / bs, 4), *map2 = calloc(span_next / bs, 4);
    KVR_CHECK(map && map2);
    span = span_next; /* the later rounds' list; also connects the rails before round 1 */
    kvr_xfer_dlist_t *w2 = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, bs, map2);
    write_round(&in, &tp, w2, 9, bs, map2);
    span = REGION;
    kvr_xfer_dlist_t *w = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, bs, map);
    struct kvr_xfer_rail_stats rs[4];
    struct kvr_xfer_engine_stats es;

    /* 1: rail 1's link goes down once a quarter of the write completed */
    fill_round(&in, 1, bs, map);
    uint64_t base = rails_now(in.p, rs);
    KVR_CHECK_STATUS(kvr_xfer_post(w), KVR_INPROGRESS);
    char msg[48];
    snprintf(msg, sizeof(msg), "round 1 %llu", (unsigned long long)span);
    KVR_CHECK_STATUS(kvr_xfer_notify(in.p, msg, strlen(msg) + 1), KVR_OK);
    uint64_t b_8 = progress_until(&in, w, base + REGION / 8, rs), t_8 = kvr_now_ns();
    uint64_t b_down = progress_until(&in, w, base + REGION / 4, rs), t_down = kvr_now_ns();
    KVR_CHECK_STATUS(kvr_xfer_test(w), KVR_INPROGRESS); /* still mid-transfer */
    set_link(link1, 0);
    uint64_t t_ip = kvr_now_ns(), t_detect = 0, t_1s = 0, b_1s = 0;
    uint64_t deadline = kvr_deadline_ns(300000);
    kvr_status_t s;
    while ((s = kvr_xfer_test(w)) == KVR_INPROGRESS || !t_1s) {
        kvr_xfer_progress(in.e);
        uint64_t now = kvr_now_ns();
        kvr_xfer_engine_stats(in.e, &es);
        if (!t_detect && es.failovers)
            t_detect = now;
        if (!t_1s && (now - t_ip >= 1000000000ull || s != KVR_INPROGRESS)) {
            t_1s = now;
            b_1s = rails_now(in.p, rs);
        }
        KVR_CHECK(now < deadline);
    }
    KVR_CHECK_STATUS(s, KVR_OK);
    expect_verdict(in.e, &tp, 1); /* every byte, checked when the notification came */
    kvr_xfer_engine_stats(in.e, &es);
    rails_now(in.p, rs);
    KVR_CHECK_EQ(es.failovers, 1);
    KVR_CHECK_EQ(es.errors, 0);
    KVR_CHECK(rs[1].down && rs[1].failovers == 1 && !rs[0].down);
    KVR_CHECK(t_detect > 0);
    struct kvr_xfer_stats st;
    kvr_xfer_dlist_stats(w, &st);
    printf("link %s down under a %llu MiB striped write: completed %s, every byte verified; "
           "rail 1 failed over %.0f ms after the link went down\n",
           link1, (unsigned long long)(REGION >> 20), kvr_status_name(s),
           (double)(t_detect - t_ip) / 1e6);
    printf("  throughput: %.1f MB/s before the link went down, %.1f MB/s in the second after, "
           "%.1f MB/s over the whole write (%.2f s)\n",
           (double)(b_down - b_8) / ((double)(t_down - t_8) / 1e3),
           (double)(b_1s - b_down) / ((double)(t_1s - t_ip) / 1e3),
           (double)REGION / ((double)st.complete_ns / 1e3), (double)st.complete_ns / 1e9);
    printf("  per rail (all rounds so far): %s %.1f MiB, %s %.1f MiB (down)\n", rs[0].local,
           (double)rs[0].bytes_done / 1048576.0, rs[1].local, (double)rs[1].bytes_done / 1048576.0);
    printf("  transports: %s\n", kvr_xfer_peer_transports(in.p));

    /* 2: the link comes back: the probe brings rail 1 back, and a new
     * write is striped over both rails again */
    span = span_next;
    links_up_round(&in, &tp, w2, 2, map2, 2);

    /* 2b: rail 0's link - the notifications' rail - goes down under a write
     * whose notification is already queued: the write completes, the
     * notification arrives on rail 1 after every byte (checked by the target
     * when it arrives), and so do later ones while rail 0 is down */
    rails_now(in.p, rs);
    KVR_CHECK(rs[0].notif && !rs[1].notif);
    links_down_round(&in, &tp, w2, 5, map2, 1, KVR_OK);
    kvr_xfer_engine_stats(in.e, &es);
    rails_now(in.p, rs);
    KVR_CHECK_EQ(es.failovers, 2);
    KVR_CHECK_EQ(es.errors, 0);
    KVR_CHECK(rs[0].down && !rs[1].down && rs[1].notif && !rs[0].notif);
    write_round(&in, &tp, w2, 6, bs, map2); /* rail 1 alone, notified there */
    /* rail 0 back: striped over both, and notified on rail 0 again */
    links_up_round(&in, &tp, w2, 7, map2, 1);

    /* 3: both links down under a write: the post fails, typed, within 5 s */
    links_down_round(&in, &tp, w2, 3, map2, 3, KVR_ERR_PEER_FAILURE);
    KVR_CHECK_STATUS(kvr_xfer_peer_status(in.p), KVR_ERR_PEER_FAILURE);
    KVR_CHECK(kvr_xfer_post(w2) == KVR_ERR_PEER_FAILURE);

    /* 4: both links up: a new connection stripes over both again */
    set_links(3, 1);
    wait_link_back(in.e, dev_a, dev_b, 0);
    wait_link_back(in.e, dev_a, dev_b, 1);
    kvr_xfer_disconnect(in.p);
    init_connect(&in, &tp);
    w2 = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, bs, map2);
    write_round(&in, &tp, w2, 4, bs, map2);
    rails_now(in.p, rs);
    printf("links up, reconnected: per rail %s %.1f MiB, %s %.1f MiB; transports %s\n", rs[0].local,
           (double)rs[0].bytes_done / 1048576.0, rs[1].local, (double)rs[1].bytes_done / 1048576.0,
           kvr_xfer_peer_transports(in.p));
    KVR_CHECK(rs[0].bytes_done >= span / 4 && rs[1].bytes_done >= span / 4);
    quit_target(&in, &tp);
    kvr_xfer_engine_destroy(in.e);
    free(map);
    free(map2);
    printf("linkdown %s -> %s: OK\n", dev_a, dev_b);
    return 0;
}

static int case_pair(void)
{
    struct init in = {0};
    struct target_proc tp;
    init_setup(&in);
    target_start(&tp);
    init_connect(&in, &tp);
    uint32_t *map64 = calloc(REGION / 65536, 4), *map4 = calloc(REGION / 4096, 4);
    KVR_CHECK(map64 && map4);
    kvr_xfer_dlist_t *w64 = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, 65536, map64);
    kvr_xfer_dlist_t *w4 = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, 4096, map4);
    for (unsigned r = 1; r <= rounds; r++) {
        if (r % 2)
            write_round(&in, &tp, w64, r, 65536, map64);
        else
            write_round(&in, &tp, w4, r, 4096, map4);
    }
    printf("transports: %s\n", kvr_xfer_peer_transports(in.p));
    if (strchr(dev_a, ','))
        KVR_CHECK(strchr(kvr_xfer_peer_transports(in.p), ',') != NULL); /* striped */
    /* READ: the target's S region into lbuf2, 64 KiB permuted, verified here */
    kvr_xfer_dlist_t *rd = perm_list(&in, KVR_XFER_READ, in.lm2, in.rs, 65536, map64);
    memset(in.lbuf2, 0, REGION);
    kvr_status_t s = kvr_xfer_post(rd);
    KVR_CHECK(s == KVR_INPROGRESS || s == KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_wait(rd, 20000), KVR_OK);
    for (uint32_t i = 0; i < REGION / 65536; i++)
        for (uint32_t k = 0; k < 65536; k += 8)
            if (*word(in.lbuf2, (uint64_t)i * 65536 + k) !=
                pat(1000, (uint64_t)map64[i] * 65536 + k)) {
                fprintf(stderr, "READ: byte %u of block %u wrong\n", k, i);
                return 1;
            }
    struct kvr_xfer_stats st;
    kvr_xfer_dlist_stats(rd, &st);
    printf("READ: %u x 64 KiB verified; %.1f MB/s\n", st.ndesc_coalesced,
           REGION / (st.complete_ns / 1e3));
    /* an adjacent list coalesces into one descriptor */
    struct kvr_xfer_desc d[64];
    for (int i = 0; i < 64; i++)
        d[i] = (struct kvr_xfer_desc){in.lm, (uint64_t)i * 4096, in.rr, (uint64_t)i * 4096, 4096};
    kvr_xfer_dlist_t *co;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(in.p, KVR_XFER_WRITE, d, 64, &co), KVR_OK);
    size_t nco;
    KVR_CHECK_EQ(kvr_xfer_dlist_count(co, &nco), 64);
    KVR_CHECK_EQ(nco, 1);
    quit_target(&in, &tp);
    kvr_xfer_engine_destroy(in.e);
    printf("pair %s -> %s: OK\n", dev_a, dev_b);
    return 0;
}

static int case_death(void)
{
    struct init in = {0};
    struct target_proc tp;
    init_setup(&in);
    target_start(&tp);
    init_connect(&in, &tp);
    uint32_t *map = calloc(REGION / 65536, 4);
    KVR_CHECK(map);
    kvr_xfer_dlist_t *w = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, 65536, map);
    write_round(&in, &tp, w, 1, 65536, map);
    /* kill the target with a post in flight */
    kvr_status_t s = kvr_xfer_post(w);
    KVR_CHECK(s == KVR_INPROGRESS || s == KVR_OK);
    kill(tp.pid, SIGKILL);
    uint64_t t0 = kvr_now_ns();
    s = kvr_xfer_wait(w, 5000);
    /* the post may have finished before the kill landed: then the next one fails */
    for (int i = 0; s == KVR_OK && i < 100; i++) {
        s = kvr_xfer_post(w);
        if (s == KVR_INPROGRESS)
            s = kvr_xfer_wait(w, 5000);
    }
    double dt = (kvr_now_ns() - t0) / 1e9;
    printf("after kill -9: %s in %.2f s\n", kvr_status_name(s), dt);
    KVR_CHECK(s == KVR_ERR_PEER_FAILURE || s == KVR_ERR_TIMEOUT);
    KVR_CHECK(dt < 5.5);
    KVR_CHECK_STATUS(kvr_xfer_peer_status(in.p), KVR_ERR_PEER_FAILURE);
    KVR_CHECK_STATUS(kvr_xfer_post(w), KVR_ERR_PEER_FAILURE);
    KVR_CHECK_STATUS(kvr_xfer_notify(in.p, "x", 1), KVR_ERR_PEER_FAILURE);
    kvr_xfer_disconnect(in.p);
    KVR_CHECK(target_reap(&tp) != 0); /* it was killed */
    /* a restarted target */
    target_start(&tp);
    init_connect(&in, &tp);
    w = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, 65536, map);
    write_round(&in, &tp, w, 2, 65536, map);
    quit_target(&in, &tp);
    kvr_xfer_engine_destroy(in.e);
    printf("death + reconnect: OK\n");
    return 0;
}

static int case_badkey(void)
{
    struct init in = {0};
    struct target_proc tp;
    init_setup(&in);
    target_start(&tp);
    init_connect(&in, &tp);
    /* a damaged rkey blob is refused before anything is posted */
    uint8_t *bad = malloc(tp.rk_len[0]);
    memcpy(bad, tp.rk[0], tp.rk_len[0]);
    bad[tp.rk_len[0] - 1] ^= 0x5a;
    kvr_xfer_rmem_t *junk;
    kvr_status_t s = kvr_xfer_rmem_unpack(in.p, bad, tp.rk_len[0], &junk);
    KVR_CHECK(s == KVR_ERR_CORRUPT || s == KVR_ERR_INVALID);
    free(bad);
    /* good writes, one post each, posted back to back: the backend signals
     * only some of their WRs; every one must still complete, with no more
     * traffic behind them (the unsignaled tail is flushed) */
    enum { NGOOD = 5 };
    kvr_xfer_dlist_t *good[NGOOD + 1];
    for (int i = 0; i <= NGOOD; i++) {
        struct kvr_xfer_desc g = {in.lm, (uint64_t)i * 65536, in.rr, (uint64_t)i * 65536, 65536};
        KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(in.p, KVR_XFER_WRITE, &g, 1, &good[i]), KVR_OK);
    }
    for (int i = 0; i < NGOOD; i++)
        KVR_CHECK_STATUS(kvr_xfer_post(good[i]), KVR_INPROGRESS);
    for (int i = 0; i < NGOOD; i++)
        KVR_CHECK_STATUS(kvr_xfer_wait(good[i], 10000), KVR_OK);
    /* the stale rkey: the write is refused by the target's NIC.  Posted
     * behind unsignaled good writes and ahead of one more: those before it
     * succeeded (RC completes in order), it gets its own status, the one
     * after it peer failure */
    struct kvr_xfer_desc d = {in.lm, 0, in.rx, 0, 65536};
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(in.p, KVR_XFER_WRITE, &d, 1, &dl), KVR_OK);
    for (int i = 0; i < NGOOD; i++)
        KVR_CHECK_STATUS(kvr_xfer_post(good[i]), KVR_INPROGRESS);
    s = kvr_xfer_post(dl);
    KVR_CHECK(s == KVR_INPROGRESS || s == KVR_ERR_NOT_FOUND);
    kvr_status_t after = kvr_xfer_post(good[NGOOD]);
    KVR_CHECK(after == KVR_INPROGRESS || after == KVR_ERR_PEER_FAILURE);
    s = kvr_xfer_wait(dl, 10000);
    printf("write with a stale rkey: %s (%s)\n", kvr_status_name(s), kvr_status_str(s));
    KVR_CHECK_STATUS(s, KVR_ERR_NOT_FOUND);
    for (int i = 0; i < NGOOD; i++)
        KVR_CHECK_STATUS(kvr_xfer_wait(good[i], 10000), KVR_OK);
    if (after == KVR_INPROGRESS)
        KVR_CHECK_STATUS(kvr_xfer_wait(good[NGOOD], 10000), KVR_ERR_PEER_FAILURE);
    printf("%d unsignaled good writes before it: OK; the one after it: %s\n", NGOOD,
           kvr_status_name(KVR_ERR_PEER_FAILURE));
    KVR_CHECK_STATUS(kvr_xfer_peer_status(in.p), KVR_ERR_PEER_FAILURE);
    kvr_xfer_disconnect(in.p);
    /* the same target, reconnected, takes a verified round */
    init_connect(&in, &tp);
    uint32_t *map = calloc(REGION / 65536, 4);
    kvr_xfer_dlist_t *w = perm_list(&in, KVR_XFER_WRITE, in.lm, in.rr, 65536, map);
    write_round(&in, &tp, w, 7, 65536, map);
    quit_target(&in, &tp);
    kvr_xfer_engine_destroy(in.e);
    printf("bad rkey + reconnect: OK\n");
    return 0;
}

static int case_mismatch(void)
{
    kvr_xfer_engine_t *a, *b;
    KVR_CHECK_STATUS(make_engine("no_such_dev0", -1, NULL, NULL, &a), KVR_ERR_NOT_FOUND);
    KVR_CHECK_STATUS(make_engine(dev_a, 200, NULL, NULL, &a), KVR_ERR_NOT_FOUND);
    KVR_CHECK_STATUS(make_engine(dev_a, 1, NULL, NULL, &a), KVR_OK); /* ::ffff:10.77.0.1 */
    KVR_CHECK_STATUS(make_engine(dev_b, 0, NULL, NULL, &b), KVR_OK); /* fe80::... */
    void *blob;
    size_t len;
    KVR_CHECK_STATUS(kvr_xfer_address(b, &blob, &len), KVR_OK);
    kvr_xfer_peer_t *p;
    KVR_CHECK_STATUS(kvr_xfer_connect(a, blob, len, &p), KVR_ERR_MISMATCH);
    /* a damaged address blob */
    ((uint8_t *)blob)[len / 2] ^= 1;
    kvr_status_t s = kvr_xfer_connect(a, blob, len, &p);
    KVR_CHECK(s == KVR_ERR_CORRUPT || s == KVR_ERR_INVALID);
    free(blob);
    kvr_xfer_engine_destroy(a);
    kvr_xfer_engine_destroy(b);
    printf("mismatch: OK\n");
    return 0;
}

/* write bandwidth: --bench SIZE ITERS (one engine pair, two processes) */
static int case_bench(uint32_t size, uint32_t iters, uint32_t batch)
{
    struct init in = {0};
    struct target_proc tp;
    init_setup(&in);
    target_start(&tp);
    init_connect(&in, &tp);
    uint32_t n = batch;
    if ((uint64_t)n * size > REGION)
        n = REGION / size;
    struct kvr_xfer_desc *d = calloc(n, sizeof(*d));
    for (uint32_t i = 0; i < n; i++) /* every other block: no coalescing */
        d[i] = (struct kvr_xfer_desc){in.lm, (uint64_t)(i * 2 % (REGION / size)) * size, in.rr,
                                      (uint64_t)(i * 2 % (REGION / size)) * size, size};
    if (n > 1 && 2ull * n * size > REGION)
        for (uint32_t i = 0; i < n; i++)
            d[i].loff = d[i].roff = (uint64_t)(n - 1 - i) * size;
    kvr_xfer_dlist_t *dl;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(in.p, KVR_XFER_WRITE, d, n, &dl), KVR_OK);
    kvr_status_t s = kvr_xfer_post(dl); /* warm-up, also completes the handshake */
    KVR_CHECK_STATUS(kvr_xfer_wait(dl, 20000), KVR_OK);
    (void)s;
    uint64_t post_ns = 0, t0 = kvr_now_ns();
    for (uint32_t it = 0; it < iters; it++) {
        uint64_t p0 = kvr_now_ns();
        s = kvr_xfer_post(dl);
        post_ns += kvr_now_ns() - p0;
        KVR_CHECK(s == KVR_INPROGRESS || s == KVR_OK);
        KVR_CHECK_STATUS(kvr_xfer_wait(dl, 20000), KVR_OK);
    }
    double sec = (kvr_now_ns() - t0) / 1e9;
    printf("bench size %u batch %u iters %u: %.2f MB/s  post %.3f us/desc\n", size, n, iters,
           (double)size * n * iters / sec / 1e6, post_ns / 1e3 / ((double)iters * n));
    quit_target(&in, &tp);
    kvr_xfer_engine_destroy(in.e);
    return 0;
}

/* on a machine without any RDMA device (the build machines): engine create
 * fails with KVR_ERR_NO_RDMA, cleanly; 77 where a device exists */
static int case_nodev(void)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (l)
        ibv_free_device_list(l);
    if (n > 0)
        KVR_SKIP("this machine has %d RDMA device(s): the no-device case cannot be shown", n);
    kvr_xfer_engine_t *e = NULL;
    KVR_CHECK_STATUS(make_engine(NULL, -1, NULL, NULL, &e), KVR_ERR_NO_RDMA);
    KVR_CHECK(e == NULL);
    KVR_CHECK_STATUS(make_engine("rxe0", -1, NULL, NULL, &e), KVR_ERR_NO_RDMA);
    int found = 0;
    for (const char *const *b = kvr_xfer_backends(); *b; b++)
        found |= strcmp(*b, "verbs") == 0;
    KVR_CHECK(found);
    printf("no RDMA device: KVR_ERR_NO_RDMA, as it should\n");
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* a test killed by its timeout still shows its lines */
    const char *cs = "pair";
    uint32_t size = 65536, iters = 100, batch = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--case"))
            cs = argv[i + 1];
        else if (!strcmp(argv[i], "--dev-a"))
            dev_a = argv[i + 1];
        else if (!strcmp(argv[i], "--dev-b"))
            dev_b = argv[i + 1];
        else if (!strcmp(argv[i], "--gid-a"))
            gid_a = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gid-b"))
            gid_b = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--link0"))
            link0 = argv[i + 1];
        else if (!strcmp(argv[i], "--link1"))
            link1 = argv[i + 1];
        else if (!strcmp(argv[i], "--mib"))
            region = span = strtoull(argv[i + 1], NULL, 0) << 20;
        else if (!strcmp(argv[i], "--mib-next"))
            span_next = strtoull(argv[i + 1], NULL, 0) << 20;
        else if (!strcmp(argv[i], "--rounds"))
            rounds = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--size"))
            size = (uint32_t)strtoul(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--iters"))
            iters = (uint32_t)strtoul(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--batch"))
            batch = (uint32_t)strtoul(argv[i + 1], NULL, 0);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(cs, "nodev"))
        return case_nodev();
    kvr_xfer_engine_t *probe;
    kvr_status_t s = make_engine(dev_a, -1, NULL, NULL, &probe);
    if (s == KVR_ERR_NO_RDMA || s == KVR_ERR_NOT_FOUND)
        KVR_SKIP("no RDMA device %s here (%s): run inside the test VM (tests/rdma/vm.py)", dev_a,
                 kvr_status_name(s));
    KVR_CHECK_STATUS(s, KVR_OK);
    kvr_xfer_engine_destroy(probe);
    if (!strcmp(cs, "pair"))
        return case_pair();
    if (!strcmp(cs, "death"))
        return case_death();
    if (!strcmp(cs, "failover"))
        return case_failover();
    if (!strcmp(cs, "linkdown"))
        return case_linkdown();
    if (!strcmp(cs, "badkey"))
        return case_badkey();
    if (!strcmp(cs, "mismatch"))
        return case_mismatch();
    if (!strcmp(cs, "bench"))
        return case_bench(size, iters, batch);
    fprintf(stderr, "unknown --case %s\n", cs);
    return 2;
}
