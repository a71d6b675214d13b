/*
 * run.c - one row of kvrail-bench: a block size and a batch, measured.
 *
 * The row cuts the pool into slots (bench.h), prepares one descriptor list
 * per slot (once, before the clock starts), then keeps `depth` posts in
 * flight, rotating through the slots.  Each post is timed around
 * kvr_xfer_post (the post overhead) and its completion latency is taken
 * from the list's telemetry.  The clock runs from the first timed post to
 * the end of a final flush, so that every byte counted has completed.
 *
 * --check: every post carries a fresh sequence number.  WRITE fills the
 * source bytes with the pattern of (target offset, sequence) before posting
 * and sends a notification right after the post (not after its completion:
 * the engine must deliver it only once the bytes are visible); the target
 * verifies every byte of the slot when the notification arrives and
 * acknowledges.  At most `depth` posts are unacknowledged, so a slot is
 * rewritten only after its last post was verified.  READ clears the
 * destination before posting and verifies it, as each post completes,
 * against the pattern the target filled its pool with.
 */
#include "bench.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <sys/resource.h>
#include <time.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SAMPLES (1u << 22)

/* ---- byte patterns ---- */

static inline uint64_t pattern_word(uint64_t word, uint64_t seq)
{
    uint64_t z = word * 0x9e3779b97f4a7c15ull ^ (seq + 1) * 0xd1b54a32d192ed03ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint8_t pattern_byte(uint64_t off, uint64_t seq)
{
    return (uint8_t)(pattern_word(off >> 3, seq) >> ((off & 7u) * 8u));
}

void bench_pattern_fill(uint8_t *buf, uint64_t off, uint64_t len, uint64_t seq)
{
    uint64_t i = 0;
    while (i < len && ((off + i) & 7u) != 0) {
        buf[i] = pattern_byte(off + i, seq);
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pattern_word((off + i) >> 3, seq);
        memcpy(buf + i, &w, 8); /* little-endian hosts: same bytes as pattern_byte */
    }
    for (; i < len; i++)
        buf[i] = pattern_byte(off + i, seq);
}

bool bench_pattern_verify(const uint8_t *buf, uint64_t off, uint64_t len, uint64_t seq,
                          uint64_t *bad_p)
{
    uint64_t i = 0;
    while (i < len && ((off + i) & 7u) != 0) {
        if (buf[i] != pattern_byte(off + i, seq))
            goto bad;
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pattern_word((off + i) >> 3, seq), got;
        memcpy(&got, buf + i, 8);
        if (got != w) {
            while (buf[i] == pattern_byte(off + i, seq))
                i++;
            goto bad;
        }
    }
    for (; i < len; i++)
        if (buf[i] != pattern_byte(off + i, seq))
            goto bad;
    return true;
bad:
    *bad_p = off + i;
    return false;
}

/* ---- layout ---- */

kvr_status_t bench_layout_make(const struct bench_row_cfg *cfg, uint64_t pool_len,
                               struct bench_layout *l_p, char *why, size_t why_len)
{
    if (cfg->bsize == 0 || cfg->batch == 0) {
        snprintf(why, why_len, "block size and batch must be > 0");
        return KVR_ERR_INVALID;
    }
    if (cfg->bsize > pool_len || (!cfg->one_buffer && cfg->batch > pool_len / cfg->bsize)) {
        snprintf(why, why_len, "a post of %" PRIu64 " B x %u does not fit the pool (%" PRIu64 " B)",
                 cfg->bsize, cfg->batch, pool_len);
        return KVR_ERR_INVALID;
    }
    uint64_t per_post = cfg->bsize * cfg->batch;
    uint64_t n = pool_len / per_post, stride;
    if (n > BENCH_MAX_LISTS)
        n = BENCH_MAX_LISTS;
    if (cfg->one_buffer) {
        /* ucx_perftest's footprint: one buffer of one block at each end, written
         * over and over by every descriptor of `depth` lists (a list has one
         * post in flight): one put of the same bytes per message */
        if (cfg->check) {
            snprintf(why, why_len, "--one-buffer cannot be combined with --check");
            return KVR_ERR_INVALID;
        }
        n = cfg->depth ? cfg->depth : 1;
        stride = 0;
    } else if (cfg->footprint && cfg->footprint < pool_len) {
        /* a small, hot working set (as ucx_perftest's one buffer): slots packed */
        uint64_t want = cfg->footprint / per_post;
        uint64_t min_lists = cfg->depth ? cfg->depth : 1;
        if (want < min_lists)
            want = min_lists;
        if (want < n)
            n = want;
        stride = (per_post + 4095u) & ~4095ull;
        if (stride * n > pool_len)
            stride = per_post;
    } else {
        stride = pool_len / n;
        if ((stride & ~4095ull) >= per_post)
            stride &= ~4095ull;
    }
    struct bench_layout l = {
        .bsize = cfg->bsize,
        .batch = cfg->batch,
        .nlists = (uint32_t)n,
        .stride = stride,
        .coalesce = cfg->coalesce,
        .op = (uint32_t)cfg->op,
        .one_buffer = cfg->one_buffer,
    };
    *l_p = l;
    return KVR_OK;
}

void bench_layout_desc(const struct bench_layout *l, uint32_t k, uint32_t i, uint64_t *loff_p,
                       uint64_t *roff_p)
{
    if (l->one_buffer) {
        *loff_p = *roff_p = 0;
        return;
    }
    uint64_t base = (uint64_t)k * l->stride;
    *loff_p = base + (uint64_t)i * l->bsize;
    *roff_p = base + (uint64_t)(l->coalesce ? i : l->batch - 1 - i) * l->bsize;
}

/* ---- target side of --check ---- */

struct bench_ack bench_target_on_notif(struct bench_target *t, const void *msg, size_t len)
{
    struct bench_ack ack = {.ok = 0, .bad_off = UINT64_MAX};
    struct bench_notif n;
    if (len != sizeof(n)) {
        KVR_LOG_ERROR("bench", "target: notification of %zu bytes, want %zu", len, sizeof(n));
        t->failures++;
        return ack;
    }
    memcpy(&n, msg, sizeof(n));
    ack.seq = n.seq;
    const struct bench_layout *l = &n.layout;
    if (n.magic != BENCH_NOTIF_MAGIC || l->bsize == 0 || l->batch == 0 || n.k >= l->nlists ||
        l->bsize > t->pool_len || l->batch > t->pool_len / l->bsize ||
        (uint64_t)n.k * l->stride > t->pool_len - l->bsize * l->batch) {
        KVR_LOG_ERROR("bench", "target: malformed notification (slot %u of %u, %" PRIu64 " B x %u)",
                      n.k, l->nlists, l->bsize, l->batch);
        t->failures++;
        return ack;
    }
    t->notifs++;
    if (t->inject_corruption && l->op == KVR_XFER_WRITE) {
        uint64_t loff, roff;
        bench_layout_desc(l, n.k, l->batch - 1, &loff, &roff);
        t->pool[roff + l->bsize - 1] ^= 0x5a; /* last byte of the last descriptor */
        t->inject_corruption = false;
    }
    if (l->op == KVR_XFER_WRITE) {
        for (uint32_t i = 0; i < l->batch; i++) {
            uint64_t loff, roff, bad;
            bench_layout_desc(l, n.k, i, &loff, &roff);
            if (!bench_pattern_verify(t->pool + roff, roff, l->bsize, n.seq, &bad)) {
                KVR_LOG_ERROR("bench",
                              "target: byte at pool offset %" PRIu64 " wrong after post %" PRIu64
                              " (slot %u, descriptor %u)",
                              bad, n.seq, n.k, i);
                t->failures++;
                ack.bad_off = bad;
                return ack;
            }
            t->verified_bytes += l->bsize;
        }
    }
    ack.ok = 1;
    ack.bad_off = 0;
    return ack;
}

void bench_target_on_ack(struct bench_target *t, const struct bench_ack *a)
{
    if (!a->ok && !t->ack_failed) {
        t->ack_failed = true;
        t->bad_off = a->bad_off;
        t->bad_seq = a->seq;
    }
    if (a->seq > t->acked_seq)
        t->acked_seq = a->seq;
}

/* ---- the posting loop ---- */

struct row_ctx {
    kvr_xfer_engine_t *eng;
    kvr_xfer_peer_t *peer;
    struct bench_target *t;
    const struct bench_row_cfg *cfg;
    struct bench_layout l;
    uint8_t *lpool;
    kvr_xfer_dlist_t **dls;
    uint32_t *fifo; /* slots in flight, oldest first */
    uint32_t depth, head, count, next;
    uint32_t mc_next;           /* memcpy_rotation's next slot */
    uint64_t *post_ns, *lat_ns; /* samples */
    uint64_t *cpu_ns;           /* cpu_time: thread CPU time of each recorded post */
    size_t ncpu;
    uint64_t *mc_post_ns; /* cpu_time: memcpy_rotation's time per post */
    size_t nmc, mc_cap;
    size_t nsamples, ncompleted;
    size_t npost; /* post_ns samples: posts whose post_ns was measured (post_timed) */
    uint64_t verified;
    uint64_t last_seq, nchecked; /* check, WRITE: last post notified, posts notified */
    struct bench_row *row;
};

static uint64_t bench_seq = 1; /* post sequence numbers, unique over the run */

static int pump(struct row_ctx *c)
{
    int n = kvr_xfer_progress(c->eng);
    if (c->t->engine)
        n += kvr_xfer_progress(c->t->engine);
    return n;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double percentile(uint64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return (double)v[i];
}

static kvr_status_t fail(struct row_ctx *c, kvr_status_t st, const char *what)
{
    snprintf(c->row->error, sizeof(c->row->error), "%s: %s", what, kvr_status_str(st));
    KVR_LOG_ERROR("bench", "row %" PRIu64 " B x %u: %s", c->cfg->bsize, c->cfg->batch,
                  c->row->error);
    return st;
}

/* Check mode, WRITE: tells the target that post seq (slot k) is on its way.
 * The notification is sent right after the post, before it completes: the
 * engine must deliver it only once the post's bytes are visible. */
static kvr_status_t notify_post(struct row_ctx *c, uint32_t k, uint64_t seq)
{
    struct bench_notif n = {.magic = BENCH_NOTIF_MAGIC, .k = k, .seq = seq, .layout = c->l};
    kvr_status_t st = kvr_xfer_notify(c->peer, &n, sizeof(n));
    return st == KVR_OK ? KVR_OK : fail(c, st, "kvr_xfer_notify");
}

/* Check mode, WRITE: waits until the target has verified every post up to
 * seq (acks arrive in order), or failed one. */
static kvr_status_t await_acks(struct row_ctx *c, uint64_t seq)
{
    uint64_t deadline = kvr_deadline_ns(c->cfg->timeout_ms);
    kvr_status_t st;
    while (c->t->acked_seq < seq && !c->t->ack_failed) {
        if (!pump(c))
            sched_yield(); /* the target needs the CPU to verify */
        if (c->t->fd >= 0) {
            uint32_t type, len;
            void *buf = NULL;
            st = bench_chan_recv(c->t->fd, 0, &type, &buf, &len);
            if (st == KVR_OK && type == BENCH_MSG_ACK && len == sizeof(struct bench_ack)) {
                struct bench_ack a;
                memcpy(&a, buf, sizeof(a));
                bench_target_on_ack(c->t, &a);
            } else if (st == KVR_OK && type == BENCH_MSG_ERROR) {
                snprintf(c->row->error, sizeof(c->row->error), "target: %s", (char *)buf);
                free(buf);
                return KVR_ERR_IO;
            } else if (st != KVR_OK && st != KVR_ERR_TIMEOUT) {
                free(buf);
                return fail(c, st, "side channel to the target");
            }
            free(buf);
        }
        if (kvr_now_ns() > deadline)
            return fail(c, KVR_ERR_TIMEOUT, "waiting for the target to verify a post");
    }
    if (c->t->ack_failed) {
        snprintf(c->row->error, sizeof(c->row->error),
                 "check failed: target byte at offset %" PRIu64 " wrong after post %" PRIu64,
                 c->t->bad_off, c->t->bad_seq);
        return KVR_ERR_CORRUPT;
    }
    return KVR_OK;
}

static void prepare_source(struct row_ctx *c, uint32_t k, uint64_t seq)
{
    for (uint32_t i = 0; i < c->l.batch; i++) {
        uint64_t loff, roff;
        bench_layout_desc(&c->l, k, i, &loff, &roff);
        if (c->cfg->op == KVR_XFER_WRITE)
            bench_pattern_fill(c->lpool + loff, roff, c->l.bsize, seq);
        else
            memset(c->lpool + loff, 0, c->l.bsize);
    }
}

static kvr_status_t verify_read(struct row_ctx *c, uint32_t k)
{
    for (uint32_t i = 0; i < c->l.batch; i++) {
        uint64_t loff, roff, bad;
        bench_layout_desc(&c->l, k, i, &loff, &roff);
        if (!bench_pattern_verify(c->lpool + loff, roff, c->l.bsize, 0, &bad)) {
            snprintf(c->row->error, sizeof(c->row->error),
                     "check failed: byte read from target offset %" PRIu64 " wrong", bad);
            return KVR_ERR_CORRUPT;
        }
    }
    c->verified += c->l.bsize * c->l.batch;
    return KVR_OK;
}

/* Completes the oldest post in flight. */
static kvr_status_t complete_one(struct row_ctx *c, bool record)
{
    uint32_t k = c->fifo[c->head];
    uint64_t deadline = 0;
    kvr_status_t st;
    /* the clock is read sparingly: clock_gettime costs ~60 ns on some VMs */
    for (unsigned spin = 0; (st = kvr_xfer_test(c->dls[k])) == KVR_INPROGRESS; spin++) {
        pump(c);
        if ((spin & 63u) != 0)
            continue;
        if (deadline == 0)
            deadline = kvr_deadline_ns(c->cfg->timeout_ms);
        else if (kvr_now_ns() > deadline)
            return fail(c, KVR_ERR_TIMEOUT, "waiting for a post to complete");
    }
    if (st != KVR_OK)
        return fail(c, st, "transfer");
    c->head = (c->head + 1) % c->depth;
    c->count--;
    if (c->cfg->check && c->cfg->op == KVR_XFER_READ && (st = verify_read(c, k)) != KVR_OK)
        return st; /* READ: verified as each post completes */
    if (record && c->ncompleted < c->nsamples) {
        /* the engine's telemetry: time inside kvr_xfer_post, post -> completion */
        struct kvr_xfer_stats s;
        kvr_xfer_dlist_stats(c->dls[k], &s);
        if (s.post_timed) /* the engine times one post in KVR_XFER_POST_SAMPLE */
            c->post_ns[c->npost++] = s.post_ns;
        c->lat_ns[c->ncompleted] = s.complete_ns;
        c->ncompleted++;
    }
    return KVR_OK;
}

/* Posts until `n` posts are done (n > 0) or `duration` seconds pass. */
static kvr_status_t run_posts(struct row_ctx *c, uint64_t n, double duration, bool record,
                              bool progress_line)
{
    const struct bench_row_cfg *cfg = c->cfg;
    uint64_t t_start = kvr_now_ns(), t_line = t_start, posted = 0;
    uint64_t t_end = t_start + (uint64_t)(duration * 1e9);
    bool check_write = cfg->check && cfg->op == KVR_XFER_WRITE;
    bool time_up = false;
    kvr_status_t st;
    /* small posts: the clock every 64 turns (it costs ~60 ns on some VMs);
     * large ones (each turn may wait for one): every turn */
    unsigned clock_mask = cfg->bsize * cfg->batch >= (256u << 10) ? 0u : 63u;
    for (uint64_t iter = 0;; iter++) {
        if (!n && (iter & clock_mask) == 0)
            time_up = kvr_now_ns() >= t_end;
        bool more = n ? posted < n : !time_up;
        if (record && c->nsamples >= MAX_SAMPLES)
            more = false;
        if (!more && c->count == 0)
            break;
        if (more && c->count < c->depth) {
            uint32_t k = c->next;
            uint64_t seq = bench_seq;
            /* check: at most `depth` posts unverified, so that a slot is
             * rewritten only after the target verified its last post */
            if (check_write && seq > c->depth && (st = await_acks(c, seq - c->depth)) != KVR_OK)
                return st;
            bench_seq++;
            c->next = (c->next + 1) % c->l.nlists;
            if (cfg->check)
                prepare_source(c, k, seq);
            struct timespec c0, c1;
            if (cfg->cpu_time && record)
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
            st = kvr_xfer_post(c->dls[k]);
            if (cfg->cpu_time && record && c->ncpu < MAX_SAMPLES) {
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
                c->cpu_ns[c->ncpu++] =
                    (uint64_t)((c1.tv_sec - c0.tv_sec) * 1000000000ll + (c1.tv_nsec - c0.tv_nsec));
            }
            if (st != KVR_INPROGRESS && st != KVR_OK)
                return fail(c, st, "kvr_xfer_post");
            c->fifo[(c->head + c->count) % c->depth] = k;
            c->count++;
            posted++;
            if (record)
                c->nsamples++;
            if (check_write) {
                if ((st = notify_post(c, k, seq)) != KVR_OK)
                    return st;
                c->last_seq = seq;
                c->nchecked++;
            }
            continue;
        }
        if ((st = complete_one(c, record)) != KVR_OK)
            return st;
        if (progress_line && record && (iter & 1023u) == 0) {
            uint64_t now = kvr_now_ns();
            if (now - t_line > 200000000ull) {
                double secs = (double)(now - t_start) / 1e9;
                fprintf(stderr, "\r  %s %" PRIu64 " B x %u: %" PRIu64 " posts, %.3f GB/s   \033[K",
                        cfg->op == KVR_XFER_WRITE ? "write" : "read", cfg->bsize, cfg->batch,
                        posted, (double)(posted * cfg->bsize * cfg->batch) / secs / 1e9);
                t_line = now;
            }
        }
    }
    return KVR_OK;
}

/* The row's descriptors copied by memcpy instead of the engine: `reps`
 * posts' worth, source slots in turn, into one destination buffer of a post
 * (laid out as the remote side); p50 per descriptor. */
static double memcpy_baseline(struct row_ctx *c, uint64_t *samples, size_t reps)
{
    uint64_t per_post = c->l.bsize * c->l.batch;
    uint8_t *dst = aligned_alloc(4096, (per_post + 4095u) & ~4095ull);
    if (!dst)
        return 0;
    memset(dst, 0, per_post);
    for (size_t r = 0; r < reps; r++) {
        uint32_t k = (uint32_t)(r % c->l.nlists);
        uint64_t base = (uint64_t)k * c->l.stride;
        uint64_t t0 = kvr_now_ns();
        for (uint32_t i = 0; i < c->l.batch; i++) {
            uint64_t loff, roff;
            bench_layout_desc(&c->l, k, i, &loff, &roff);
            memcpy(dst + (roff - base), c->lpool + loff, c->l.bsize);
        }
        samples[r] = kvr_now_ns() - t0;
    }
    free(dst);
    qsort(samples, reps, sizeof(uint64_t), cmp_u64);
    return percentile(samples, reps, 0.50) / (double)c->l.batch;
}

/* memcpy over the row's footprint, for `seconds`: the descriptors of slot k
 * copied, as laid out, from slot k to slot k + nlists/2 of the local pool
 * (source and destination both in the rotation, as the engine's are at
 * each end).  Adds to *bytes_p and *ns_p; nothing with fewer than 2 slots. */
static void memcpy_rotation(struct row_ctx *c, double seconds, uint64_t *bytes_p, uint64_t *ns_p)
{
    uint32_t n = c->l.nlists;
    if (n < 2 || c->l.stride == 0)
        return;
    uint64_t t0 = kvr_now_ns(), now = t0, end = t0 + (uint64_t)(seconds * 1e9), bytes = 0;
    uint64_t per_post = c->l.bsize * c->l.batch;
    unsigned mask = per_post >= (256u << 10) || c->mc_post_ns ? 0u : 63u;
    uint64_t prev = t0;
    for (uint32_t r = 0;; r++) {
        uint32_t k = c->mc_next, k2 = (k + n / 2) % n;
        c->mc_next = (k + 1) % n;
        for (uint32_t i = 0; i < c->l.batch; i++) {
            uint64_t loff, roff, loff2, roff2;
            bench_layout_desc(&c->l, k, i, &loff, &roff);
            bench_layout_desc(&c->l, k2, i, &loff2, &roff2);
            memcpy(c->lpool + roff2, c->lpool + loff, c->l.bsize);
        }
        bytes += per_post;
        if ((r & mask) == 0) {
            now = kvr_now_ns();
            if (c->mc_post_ns && c->nmc < c->mc_cap)
                c->mc_post_ns[c->nmc++] = now - prev;
            prev = now;
            if (now >= end)
                break;
        }
    }
    *bytes_p += bytes;
    *ns_p += now - t0;
}

/* Waits until every post and notification on the peer has completed. */
static kvr_status_t flush_all(struct row_ctx *c)
{
    uint64_t deadline = kvr_deadline_ns(c->cfg->timeout_ms);
    for (;;) {
        kvr_status_t st = kvr_xfer_flush(c->peer, 0);
        if (st == KVR_OK)
            return KVR_OK;
        if (st != KVR_ERR_TIMEOUT && st != KVR_INPROGRESS)
            return fail(c, st, "kvr_xfer_flush");
        pump(c);
        if (kvr_now_ns() > deadline)
            return fail(c, KVR_ERR_TIMEOUT, "kvr_xfer_flush");
    }
}

kvr_status_t bench_row_run(kvr_xfer_engine_t *eng, kvr_xfer_peer_t *peer, kvr_xfer_mem_t *lmem,
                           uint8_t *lpool, kvr_xfer_rmem_t *rmem, uint64_t pool_len,
                           struct bench_target *t, const struct bench_row_cfg *cfg,
                           bool progress_line, struct bench_row *row_p)
{
    struct row_ctx c = {.eng = eng, .peer = peer, .t = t, .cfg = cfg, .lpool = lpool, .row = row_p};
    struct kvr_xfer_desc *descs = NULL;
    kvr_status_t st;

    memset(row_p, 0, sizeof(*row_p));
    row_p->cfg = *cfg;
    st = bench_layout_make(cfg, pool_len, &c.l, row_p->error, sizeof(row_p->error));
    if (st != KVR_OK)
        return st;
    row_p->nlists = c.l.nlists;
    c.depth = cfg->depth;
    if (c.depth > c.l.nlists)
        c.depth = c.l.nlists;
    if (c.depth == 0)
        c.depth = 1;
    row_p->cfg.depth = c.depth;

    uint64_t iters = cfg->iters;
    if (iters == 0 && cfg->check)
        iters = c.l.nlists; /* one lap: every slot written and verified once */
    size_t cap = iters ? (iters < MAX_SAMPLES ? iters : MAX_SAMPLES) : MAX_SAMPLES;

    c.dls = calloc(c.l.nlists, sizeof(*c.dls));
    c.fifo = calloc(c.depth, sizeof(*c.fifo));
    c.post_ns = malloc(cap * sizeof(*c.post_ns));
    c.mc_cap = cap;
    if (cfg->cpu_time && (!(c.cpu_ns = malloc(cap * sizeof(*c.cpu_ns))) ||
                          !(c.mc_post_ns = malloc(cap * sizeof(*c.mc_post_ns))))) {
        st = fail(&c, KVR_ERR_NO_MEMORY, "allocating the row");
        goto out_free;
    }
    c.lat_ns = malloc(cap * sizeof(*c.lat_ns));
    descs = malloc(c.l.batch * sizeof(*descs));
    if (!c.dls || !c.fifo || !c.post_ns || !c.lat_ns || !descs) {
        st = fail(&c, KVR_ERR_NO_MEMORY, "allocating the row");
        goto out_free;
    }

    /* prepare every list once, before the clock starts */
    for (uint32_t k = 0; k < c.l.nlists; k++) {
        for (uint32_t i = 0; i < c.l.batch; i++) {
            descs[i].lmem = lmem;
            descs[i].rmem = rmem;
            descs[i].len = c.l.bsize;
            bench_layout_desc(&c.l, k, i, &descs[i].loff, &descs[i].roff);
        }
        st = kvr_xfer_dlist_prepare(peer, cfg->op, descs, c.l.batch, &c.dls[k]);
        if (st != KVR_OK) {
            fail(&c, st, "kvr_xfer_dlist_prepare");
            goto out_release;
        }
    }
    row_p->ndesc = kvr_xfer_dlist_count(c.dls[0], &row_p->nseg);

    if (!cfg->check && cfg->warmup > 0) {
        st = run_posts(&c, cfg->warmup, 0, false, false);
        if (st != KVR_OK)
            goto out_release;
        if ((st = flush_all(&c)) != KVR_OK)
            goto out_release;
    }

    /* memcpy over the same footprint, half before and half after the row:
     * the machine's copy speed at the same minutes */
    uint64_t mc_bytes = 0, mc_ns = 0;
    double mc_secs = cfg->duration > 0 ? cfg->duration / 2 : 0.25;
    if (!cfg->one_buffer)
        memcpy_rotation(&c, mc_secs, &mc_bytes, &mc_ns);

    struct rusage ru0, ru1;
    getrusage(RUSAGE_THREAD, &ru0);
    uint64_t t0 = kvr_now_ns();
    st = run_posts(&c, iters, cfg->duration, true, progress_line);
    getrusage(RUSAGE_THREAD, &ru1);
    if (st == KVR_OK)
        st = flush_all(&c);
    if (st == KVR_OK && c.nchecked) {
        st = await_acks(&c, c.last_seq);
        if (st == KVR_OK)
            c.verified += c.nchecked * c.l.bsize * c.l.batch;
    }
    uint64_t t1 = kvr_now_ns();
    if (progress_line)
        fprintf(stderr, "\r\033[K");
    if (st != KVR_OK)
        goto out_release;

    row_p->posts = c.nsamples;
    row_p->bytes = c.nsamples * c.l.bsize * c.l.batch;
    row_p->seconds = (double)(t1 - t0) / 1e9;
    row_p->gbps = (double)row_p->bytes / row_p->seconds / 1e9;
    row_p->posts_per_s = (double)row_p->posts / row_p->seconds;
    row_p->verified_bytes = c.verified;
    row_p->check_ok = cfg->check && c.verified == row_p->bytes;

    qsort(c.post_ns, c.npost, sizeof(uint64_t), cmp_u64);
    row_p->post_ns_p50 = percentile(c.post_ns, c.npost, 0.50);
    row_p->post_ns_p99 = percentile(c.post_ns, c.npost, 0.99);
    row_p->post_ns_per_desc_p50 = row_p->post_ns_p50 / (double)c.l.batch;
    if (cfg->cpu_time) {
        qsort(c.cpu_ns, c.ncpu, sizeof(uint64_t), cmp_u64);
        row_p->post_cpu_ns_p50 = percentile(c.cpu_ns, c.ncpu, 0.50);
        row_p->post_cpu_ns_p99 = percentile(c.cpu_ns, c.ncpu, 0.99);
        row_p->nivcsw = (uint64_t)(ru1.ru_nivcsw - ru0.ru_nivcsw);
        row_p->nminflt = (uint64_t)(ru1.ru_minflt - ru0.ru_minflt);
    }
    qsort(c.lat_ns, c.ncompleted, sizeof(uint64_t), cmp_u64);
    row_p->lat_us_p50 = percentile(c.lat_ns, c.ncompleted, 0.50) / 1e3;
    row_p->lat_us_p99 = percentile(c.lat_ns, c.ncompleted, 0.99) / 1e3;
    if (!cfg->one_buffer)
        memcpy_rotation(&c, mc_secs, &mc_bytes, &mc_ns);
    if (c.nmc) {
        qsort(c.mc_post_ns, c.nmc, sizeof(uint64_t), cmp_u64);
        row_p->memcpy_post_ns_p50 = percentile(c.mc_post_ns, c.nmc, 0.50);
        row_p->memcpy_post_ns_p99 = percentile(c.mc_post_ns, c.nmc, 0.99);
    }
    if (mc_ns) {
        row_p->memcpy_gbps = (double)mc_bytes / ((double)mc_ns / 1e9) / 1e9;
        row_p->memcpy_ratio = row_p->gbps / row_p->memcpy_gbps;
    }
    if (cap >= 16) /* reuses the latency samples' array */
        row_p->memcpy_ns_per_desc_p50 = memcpy_baseline(&c, c.lat_ns, cap < 256 ? cap : 256);

out_release:
    if (st != KVR_OK)
        (void)flush_all(&c); /* leave nothing in flight on lists about to be released */
    for (uint32_t k = 0; k < c.l.nlists; k++)
        if (c.dls && c.dls[k])
            kvr_xfer_dlist_release(c.dls[k]);
out_free:
    free(descs);
    free(c.lat_ns);
    free(c.post_ns);
    free(c.cpu_ns);
    free(c.mc_post_ns);
    free(c.fifo);
    free(c.dls);
    return st;
}
