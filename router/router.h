/*
 * router.h - private state of kvrail-router, shared by its files:
 *   main.c      sockets, the event loop, timers, signal handling
 *   nodes.c     node registry (register, heartbeats, death), block directory
 *               (BlockStored/BlockRemoved with per-node sequence numbers,
 *               resync on a gap), load accounting
 *   requests.c  client service: Generate validation, tokenization, the
 *               (prefill, decode) choice, dispatch, the token stream,
 *               cancel, queueing, failure handling, Status
 * Everything runs on one thread; no locks.
 */
#ifndef KVR_ROUTER_H
#define KVR_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_cluster.h"
#include "kvr_proto.h"
#include "kvr_status.h"
#include "u64map.h"

#ifndef KVR_ROUTER_HAVE_TOKENIZER
#define KVR_ROUTER_HAVE_TOKENIZER 0
#endif
#ifndef KVR_ROUTER_HAVE_SAMPLE
#define KVR_ROUTER_HAVE_SAMPLE 0
#endif

#if KVR_ROUTER_HAVE_TOKENIZER
#include "kvr_tokenizer.h"
#else
typedef struct kvr_tokenizer kvr_tokenizer_t;
typedef struct kvr_detok kvr_detok_t;
#endif

#define RT_MAX_NODES   64 /* directory masks are 64-bit */
#define RT_MAX_STOPS   16
#define RT_MAX_STOPLEN 256
#define RT_SAMPLES     8192 /* ring of timing samples for percentiles */

struct rt_samples {
    uint64_t v[RT_SAMPLES];
    size_t n; /* total recorded */
};

void rt_samples_add(struct rt_samples *s, uint64_t ns);
/** Percentile q in [0,1] of the last RT_SAMPLES samples, 0 when none. */
uint64_t rt_samples_pct(const struct rt_samples *s, double q);

struct rt_node {
    int idx;
    char name[KVR_CLUSTER_NAME_MAX];
    const kvr_cluster_node_t *conf;
    enum kvr_node_role role;
    bool registered;
    bool alive;
    bool conn_lost; /* a send found its connection gone (ZMQ_ROUTER_MANDATORY) */
    uint64_t incarnation;
    uint64_t last_hb_ns;
    uint64_t registered_ns;
    char fingerprint[128];
    char transport[16];
    char host[128];
    uint32_t layers, kv_heads, head_dim, block_size, max_context, vocab_size;
    char dtype[16];
    uint8_t *addr;
    size_t addr_len;
    size_t n_rkeys;
    uint8_t **rkeys;
    size_t *rkey_lens;
    uint64_t *layer_base;
    size_t n_layer_base;
    uint64_t layer_stride, block_bytes;
    /* load, from heartbeats */
    uint32_t total_blocks, free_blocks, cached_blocks, batch_size, reserved_blocks;
    uint64_t inflight_prefill_hb, queued_prefill_hb;
    uint64_t kv_bytes, kv_ns;
    uint64_t pd_bytes, pd_ns; /* the same, summed from PrefillDone (prefill and decode side) */
    /* load, router's estimate between heartbeats */
    int64_t free_est;
    uint64_t inflight_tokens; /* prefill tokens dispatched and not done */
    uint32_t active;          /* requests assigned */
    uint64_t requests;
    /* block directory */
    uint64_t ev_seq;
    uint64_t dir_blocks;
    bool resync_wait;
    uint64_t resync_sent_ns;
    uint64_t resyncs;
    uint64_t hb_lag_seq; /* seq a heartbeat announced beyond what was applied */
    uint8_t **ev_buf;    /* BlockEvents payloads held while a resync is pending */
    size_t *ev_buf_len;
    size_t n_ev_buf;
};

enum rt_req_state {
    RQ_QUEUED,
    RQ_RESERVING,  /* Reserve (and Prefill) sent, waiting for Reserved */
    RQ_PREFILLING, /* Reserved; waiting for the first token */
    RQ_DECODING,   /* first token out */
};

struct rt_req {
    uint64_t id;  /* the client-facing request id */
    uint64_t did; /* id of the current dispatch on the node protocol (0: none) */
    uint8_t route[KVR_PROTO_MAX_ROUTE];
    size_t route_len;
    int client_fd;
    uint32_t client_epoch; /* rt.fd_epoch[client_fd] when the request came in */
    uint64_t call_id;
    enum rt_req_state state;
    uint32_t *prompt; /* the client's prompt */
    size_t n_prompt;
    uint32_t *ctx; /* what is dispatched: prompt + tokens already streamed (migration) */
    size_t n_ctx;
    uint64_t *hashes; /* sequence hashes of ctx's full blocks */
    size_t n_hashes;
    uint32_t max_tokens;
    Kvrail__SamplingParams sp; /* seed set */
    uint32_t stop_ids[64];
    size_t n_stop_ids;
    bool ignore_eos;
    char *stops[RT_MAX_STOPS];
    size_t n_stops;
    size_t max_stop_len;
    bool no_text, return_prompt;
    int p, d;  /* node indices, -1 */
    int bad_p; /* prefill node that failed this request last, -1 */
    bool local;
    uint32_t retries;
    uint32_t need_blocks;
    uint32_t cached_tokens;
    uint32_t *block_ids;
    size_t n_block_ids;
    bool prefill_done;
    uint32_t *out; /* tokens streamed to the client */
    uint32_t n_out;
    uint32_t index_base; /* tokens streamed before the current dispatch */
    uint32_t next_local; /* next index expected from the current decode node */
    kvr_detok_t *detok;
    char *tail; /* last max_stop_len bytes of text, for stop strings */
    size_t tail_len;
    uint64_t t_recv, t_dispatch, t_first;
    uint64_t queue_deadline, prefill_deadline, deadline;
    uint64_t overhead_ns;     /* wall time of the router's handling of it */
    uint64_t overhead_cpu_ns; /* the same in thread CPU time (without preemption) */
    uint64_t kv_bytes;
    bool local_any; /* some dispatch of it prefilled locally */
    struct rt_req *qnext, *qprev;
    bool queued;
    struct rt_req *anext, *aprev;
};

struct rt_stats {
    uint64_t requests, completed, failed, canceled, overloaded, bad_frames, bad_requests;
    uint64_t local_prefills, disagg_prefills, retries, client_disconnects, resyncs, dead_nodes;
    uint64_t cached_tokens, prompt_tokens;
    struct rt_samples overhead, overhead_cpu, token, tokenize;
};

#define RT_MAX_CLIENT_FD 65536

typedef struct rt {
    kvr_cluster_t *cl;
    const kvr_cluster_node_t *self;
    void *zctx;
    void *client_sock; /* ROUTER */
    void *node_sock;   /* ROUTER */
    void *mon_sock;    /* PAIR: client socket monitor (accepts, disconnects) */
    /* Connection epoch per client fd, bumped on every accept: a fd reused by a
     * new client must not inherit the disconnect of the one before it. */
    uint32_t fd_epoch[RT_MAX_CLIENT_FD];
    uint64_t start_ns;
    uint64_t rng;
    kvr_tokenizer_t *tok;
    uint32_t context;     /* model context length, 0 = unknown */
    uint32_t vocab;       /* 0 = unknown */
    uint32_t eos_ids[16]; /* the model's eos ids (generation_config.json / config.json) */
    size_t n_eos;
    char model_fingerprint[128];
    struct rt_node nodes[RT_MAX_NODES];
    int n_nodes;
    rt_u64map_t dir;  /* seq hash -> node mask */
    rt_u64map_t reqs; /* dispatch id -> struct rt_req * */
    struct rt_req *all;
    struct rt_req *qhead, *qtail;
    size_t n_queued;
    uint64_t next_id;
    struct rt_stats st;
    uint64_t bad_log_window_ns, bad_log_count, bad_log_suppressed; /* rate limit */
} rt_t;

/* main.c */
uint64_t rt_rand(rt_t *r);
/** Handles every pending client-socket monitor event (accepts, disconnects). */
void rt_drain_monitor(rt_t *r);
/** Epoch of a client connection fd (0 for fds out of the table). */
uint32_t rt_fd_epoch(const rt_t *r, int fd);
/** Rate limit of log lines about bad input: true for the first 20 a second. */
bool rt_bad_log_ok(rt_t *r);
/** This thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID). */
uint64_t rt_cpu_ns(void);
kvr_status_t rt_send_node(rt_t *r, struct rt_node *n, unsigned method, const ProtobufCMessage *msg);

/* nodes.c */
kvr_status_t rt_nodes_init(rt_t *r);
void rt_nodes_fini(rt_t *r);
void rt_node_msg(rt_t *r, kvr_proto_frame_t *f, uint64_t now);
void rt_nodes_tick(rt_t *r, uint64_t now);
struct rt_node *rt_node_by_route(rt_t *r, const uint8_t *route, size_t len);
/** Decode nodes: for each, how many leading hashes it holds (overlap_p[idx]). */
void rt_dir_overlap(rt_t *r, const uint64_t *hashes, size_t n, uint32_t *overlap_p);

/* requests.c */
void rt_client_msg(rt_t *r, kvr_proto_frame_t *f, uint64_t now);
void rt_client_gone(rt_t *r, int fd);
void rt_requests_tick(rt_t *r, uint64_t now);
void rt_requests_fini(rt_t *r);
void rt_queue_pump(rt_t *r, uint64_t now);
/** A node died or re-registered: retry, migrate or fail what it held. */
void rt_node_lost(rt_t *r, struct rt_node *n, uint64_t now, const char *why);
void rt_on_reserved(rt_t *r, struct rt_node *n, const Kvrail__Reserved *m, uint64_t now);
void rt_on_rejected(rt_t *r, struct rt_node *n, const Kvrail__Rejected *m, uint64_t now);
void rt_on_prefill_done(rt_t *r, struct rt_node *n, const Kvrail__PrefillDone *m, uint64_t now);
void rt_on_token(rt_t *r, struct rt_node *n, const Kvrail__Token *m, uint64_t now);

#endif
