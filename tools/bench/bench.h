/*
 * bench.h - private header of kvrail-bench (tools/bench/).
 *
 * kvrail-bench measures the transfer engine (transport/kvr_xfer.h) the way
 * ucx_perftest and ib_write_bw measure their layers: one initiator posts
 * prepared descriptor lists into a target's registered pool and reports
 * bandwidth, posts/s, the time spent inside kvr_xfer_post and completion
 * latency.  The pieces:
 *
 *   bench.c   options, set-up of the engines, the sweep, table/JSON output;
 *   run.c     one row: layout of the descriptor lists over the pool, the
 *             posting loop, byte patterns and their verification;
 *   chan.c    the TCP side channel between target and initiator processes
 *             (address and rkey blobs, check acknowledgements).
 *
 * Layout of a row (block size B, batch D descriptors per post): the pool is
 * cut into N slots of `stride` bytes (N = pool / (B*D), at most
 * BENCH_MAX_LISTS), one prepared list per slot, and posts rotate through the
 * slots so that the data touched is far larger than the caches.  Inside a
 * slot, descriptor i reads local offset i*B and writes remote offset
 * (D-1-i)*B, so that no two descriptors are adjacent on both sides and the
 * engine cannot coalesce them (--coalesce lays them out adjacent instead).
 */
#ifndef KVR_BENCH_H
#define KVR_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"
#include "kvr_xfer.h"

#define BENCH_MAX_LISTS   32768u
#define BENCH_PROTO       1u          /* side-channel protocol version */
#define BENCH_NOTIF_MAGIC 0x4b564242u /* "BBVK" */

/* ---- side channel (chan.c) ---- */

enum bench_msg_type {
    BENCH_MSG_HELLO = 1, /* initiator -> target: struct bench_hello */
    BENCH_MSG_SETUP = 2, /* target -> initiator: struct bench_setup + addr + rkey */
    BENCH_MSG_ACK = 3,   /* target -> initiator: struct bench_ack (check mode) */
    BENCH_MSG_DONE = 4,  /* initiator -> target: no payload */
    BENCH_MSG_BYE = 5,   /* target -> initiator: struct bench_bye */
    BENCH_MSG_ERROR = 6, /* either way: NUL-terminated text */
};

struct bench_hello {
    uint32_t proto;
    uint32_t op;
    uint32_t check;
    uint32_t pad;
    char backend[32];
};

struct bench_setup {
    uint32_t proto;
    uint32_t addr_len;
    uint32_t rkey_len;
    uint32_t pad;
    uint64_t reg_ns;
    uint64_t pool_len;
    /* followed by addr_len bytes of address blob, rkey_len of rkey blob */
};

struct bench_ack {
    uint64_t seq;
    int32_t ok;
    uint32_t pad;
    uint64_t bad_off;
};

struct bench_bye {
    uint64_t notifs;
    uint64_t verified_bytes;
    uint64_t failures;
};

/** Listens on "[HOST:]PORT" (HOST default 0.0.0.0). */
kvr_status_t bench_chan_listen(const char *spec, int *fd_p);
/** Accepts one connection within timeout_ms. */
kvr_status_t bench_chan_accept(int lfd, int timeout_ms, int *fd_p);
/** Connects to "HOST:PORT", retrying until timeout_ms (the target may still
 *  be starting). */
kvr_status_t bench_chan_connect(const char *spec, int timeout_ms, int *fd_p);
/** Sends one framed message (blocking, bounded by a 10 s socket timeout). */
kvr_status_t bench_chan_send(int fd, uint32_t type, const void *buf, uint32_t len);
/** Receives one framed message within timeout_ms (0: only if one is already
 *  readable, else KVR_ERR_TIMEOUT).  *buf_p is malloc'd (NULL for none);
 *  KVR_ERR_CLOSED when the peer closed the connection. */
kvr_status_t bench_chan_recv(int fd, int timeout_ms, uint32_t *type_p, void **buf_p,
                             uint32_t *len_p);

/* ---- rows (run.c) ---- */

struct bench_layout {
    uint64_t bsize;  /* bytes per descriptor */
    uint32_t batch;  /* descriptors per post */
    uint32_t nlists; /* slots = prepared lists */
    uint64_t stride; /* bytes between slots */
    uint32_t coalesce;
    uint32_t op;
    uint32_t one_buffer; /* depth lists, every descriptor on bytes [0, bsize) */
    uint32_t pad;
};

/* Contents of a check-mode notification. */
struct bench_notif {
    uint32_t magic;
    uint32_t k; /* slot */
    uint64_t seq;
    struct bench_layout layout;
};

/* The target side of a run, seen from the initiator: in one process it is
 * the second engine; in two processes the side channel. */
struct bench_target {
    kvr_xfer_engine_t *engine; /* local mode: progressed alongside; else NULL */
    int fd;                    /* two processes: side channel; else -1 */
    /* filled by the target's notification handler (local mode) or by ACKs */
    uint64_t acked_seq; /* highest post acknowledged (acks arrive in order) */
    bool ack_failed;    /* sticky: the first failed verification */
    uint64_t bad_off, bad_seq;
    /* target-side verification state (owned by whoever verifies) */
    uint8_t *pool;
    uint64_t pool_len;
    uint64_t notifs, verified_bytes, failures;
    bool inject_corruption; /* self-test of --check: damage one byte of the first post */
};

struct bench_row_cfg {
    enum kvr_xfer_op op;
    uint64_t bsize;
    uint32_t batch;
    uint32_t depth;
    uint64_t iters;     /* 0: by duration */
    double duration;    /* seconds, when iters == 0 */
    uint64_t warmup;    /* posts before timing */
    uint64_t footprint; /* bytes the rotation may touch; 0: the whole pool */
    bool coalesce;
    bool check;
    bool one_buffer; /* every descriptor of every list on one block-sized buffer at
                        each end: ucx_perftest's footprint and work per message */
    bool cpu_time;   /* each post also timed in the thread's CPU time (preemption
                        excluded) and the row's involuntary context switches counted */
    int timeout_ms;
};

struct bench_row {
    struct bench_row_cfg cfg;
    uint32_t nlists;
    size_t ndesc, nseg; /* per post, as given and after coalescing */
    uint64_t posts, bytes;
    double seconds;
    double gbps, posts_per_s;
    double post_ns_p50, post_ns_p99, post_ns_per_desc_p50;
    /* the same descriptors copied with memcpy (source: the row's slots in
     * turn; destination: one buffer of a post), p50 per descriptor: on a
     * backend whose put is a memcpy (UCX shared memory) post time minus this
     * is the engine's own overhead */
    double memcpy_ns_per_desc_p50;
    /* memcpy over the row's footprint (slot k -> slot k + N/2 of the local
     * pool), half before and half after the row: GB/s and gbps / it */
    double memcpy_gbps, memcpy_ratio;
    double lat_us_p50, lat_us_p99;
    /* cpu_time: time inside kvr_xfer_post in the thread's CPU time (the
     * time it ran, not the time it waited for a core), and the involuntary
     * context switches of the thread during the row */
    double post_cpu_ns_p50, post_cpu_ns_p99;
    uint64_t nivcsw, nminflt; /* and its page faults (minor: no I/O) */
    /* cpu_time: one post's worth of memcpy in the footprint rotation (the
     * memcpy column's copies), timed per post: the machine's own tail */
    double memcpy_post_ns_p50, memcpy_post_ns_p99;
    uint64_t verified_bytes; /* check mode */
    bool check_ok;
    char error[256]; /* empty when the row ran */
};

/** Pattern byte source: fills buf (which lands at pool offset off) with the
 *  pattern of post sequence number seq. */
void bench_pattern_fill(uint8_t *buf, uint64_t off, uint64_t len, uint64_t seq);
/** Returns true if buf matches; else sets *bad_p to the pool offset of the
 *  first wrong byte. */
bool bench_pattern_verify(const uint8_t *buf, uint64_t off, uint64_t len, uint64_t seq,
                          uint64_t *bad_p);

/** Computes the layout of a row over a pool of pool_len bytes; KVR_ERR_INVALID
 *  (with why) when a post does not fit. */
kvr_status_t bench_layout_make(const struct bench_row_cfg *cfg, uint64_t pool_len,
                               struct bench_layout *l_p, char *why, size_t why_len);
/** Offsets of descriptor i of slot k. */
void bench_layout_desc(const struct bench_layout *l, uint32_t k, uint32_t i, uint64_t *loff_p,
                       uint64_t *roff_p);

/** Target side: handles a check notification (verifies the slot it names
 *  in t->pool); returns the ack to send. */
struct bench_ack bench_target_on_notif(struct bench_target *t, const void *msg, size_t len);
/** Initiator side: records an ack. */
void bench_target_on_ack(struct bench_target *t, const struct bench_ack *a);

/** Runs one row.  KVR_OK with row_p->error empty on success; on failure an
 *  error status and row_p->error says what failed. */
kvr_status_t bench_row_run(kvr_xfer_engine_t *eng, kvr_xfer_peer_t *peer, kvr_xfer_mem_t *lmem,
                           uint8_t *lpool, kvr_xfer_rmem_t *rmem, uint64_t pool_len,
                           struct bench_target *t, const struct bench_row_cfg *cfg,
                           bool progress_line, struct bench_row *row_p);

#endif
