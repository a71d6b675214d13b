/*
 * router.h - private state of kvrail-router and the calls between its
 * modules.  Everything runs on one thread; no locks.  Modules, each calling
 * only the ones listed after it (no circle):
 *   main.c      process start-up, sockets, the poll loop, timers by next
 *               deadline; runs the registry's events and the queue pump
 *   client_ep.c client endpoint: Generate admission (validation once,
 *               tokenize, block hashes), Cancel, Ping, disconnects
 *   node_ep.c   node endpoint: a method table from method to handler
 *   status.c    the Status reply (router figures + the node table)
 *   registry.c  nodes: register, heartbeats, liveness; reports a dead or
 *               re-registered node as an event, never calls into requests
 *   dirsync.c   BlockEvents / resync dumps into the directory
 *   streams.c   PrefillDone / Token -> the client stream, detokenize, stop
 *               strings
 *   failover.c  prefill retries, decode-node migration, request deadlines
 *   dispatch.c  the queue pump: scheduler pick -> Reserve + Prefill;
 *               Reserved -> PrefillTarget; Rejected
 *   requests.c  the request table and queue; finish (the final frame)
 *   scheduler.c pair choice, pure (scheduler.h)
 *   directory.c block directory, leaf (directory.h)
 *   send.c      messages out: to a node, to a client
 *   util.c      rng, timing samples, CPU clock, log rate limit, timers
 * Calls: main -> client_ep, node_ep, registry, failover, dispatch, requests;
 * client_ep -> status, dispatch, requests; node_ep -> registry, dirsync,
 * dispatch, streams; streams -> failover, requests; failover -> registry,
 * requests, dispatch; dispatch -> scheduler, directory, registry, requests;
 * registry -> dirsync, directory; dirsync -> directory; status ->
 * directory; all -> send, util.  (Checked from the objects' symbols.)
 */
#ifndef KVR_ROUTER_H
#define KVR_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "directory.h"
#include "kvr_cluster.h"
#include "kvr_proto.h"
#include "kvr_sample.h"
#include "kvr_status.h"
#include "kvr_tokenizer.h"
#include "scheduler.h"
#include "u64map.h"

#define RT_MAX_NODES       RT_DIR_MAX_NODES /* directory masks are 64-bit */
#define RT_TOKEN_LEN       16         /* KVR_XFER_TOKEN_LEN: a transfer engine's per-pair token */
#define RT_DIR_ENTRIES     (1u << 20) /* most distinct blocks the directory tracks */
#define RT_MAX_STOPS       16
#define RT_MAX_STOPLEN     256
#define RT_SAMPLES         8192                   /* ring of timing samples for percentiles */
#define RT_RESYNC_RETRY_NS (2000ull * 1000000ull) /* a resync dump not back: ask again */
/* A text prompt longer than this many bytes per token of the model's context
 * cannot fit it whatever it tokenizes to in practice: refused before it is
 * tokenized on the loop (the tokenizer runs at ~20-60 MB/s, so the largest
 * accepted prompt of a 128K-context model costs well under a heartbeat) */
#define RT_PROMPT_BYTES_PER_TOKEN 16u
#define RT_PROMPT_BYTES_NO_CTX    (1u << 20)  /* context unknown */
#define RT_MAX_ADDR_BYTES         (64u << 10) /* a registered transport address or rkey */
#define RT_MAX_RKEYS              256u        /* rkeys / layer bases in a registration */
#define RT_HELD_EVENT_BYTES       (16u << 20) /* BlockEvents payloads held per node in a resync */
#define RT_BLAME_STREAK           2u /* decode faults in a row that start a cool-down of a lease */

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
    char kernels[16]; /* the engine kernels' bit class ("" : not told) */
    uint8_t *addr;
    size_t addr_len;
    size_t n_rkeys;
    uint8_t **rkeys;
    size_t *rkey_lens;
    uint64_t *layer_base;
    size_t n_layer_base;
    uint64_t layer_stride, block_bytes;
    /* prefill: the incarnation of each decode node whose address and rkeys
     * this node was sent (0: none); PrefillTarget carries them only once */
    uint64_t sent_d_inc[RT_MAX_NODES];
    /* prefill: the transfer token of the pair (this node, decode node i),
     * made when this incarnation is first introduced to incarnation
     * token_d_inc[i] of node i (0: none yet); it goes to D in the Reserve
     * and to this node with D's address in the PrefillTarget */
    uint8_t pair_token[RT_MAX_NODES][RT_TOKEN_LEN];
    uint64_t token_d_inc[RT_MAX_NODES];
    /* load, from heartbeats */
    uint32_t total_blocks, free_blocks, cached_blocks, batch_size, reserved_blocks;
    uint64_t inflight_prefill_hb, queued_prefill_hb;
    uint64_t kv_bytes, kv_ns;
    uint64_t bad_frames_hb, bad_notifs_hb; /* the node's own drops, from its heartbeats */
    /* its fences, from its heartbeats (decode: quarantines; prefill: pushes
     * it gave up after half a lease of silence) */
    uint32_t quarantined_hb;
    uint64_t fenced_hb, fence_expired_hb, self_fenced_hb;
    uint64_t pd_bytes, pd_ns; /* the same, summed from PrefillDone (prefill and decode side) */
    /* load, router's estimate between heartbeats */
    int64_t free_est;
    uint64_t reserving_blocks; /* blocks of Reserves sent and not answered */
    uint64_t inflight_tokens;  /* prefill tokens dispatched and not done */
    uint32_t active;           /* requests assigned */
    uint64_t requests;
    /* block directory sync (the blocks themselves are in rt.dir) */
    uint64_t ev_seq;
    bool resync_wait;
    uint64_t resync_sent_ns;
    uint64_t resyncs;
    uint64_t hb_lag_seq;     /* seq a heartbeat announced beyond what was applied */
    uint8_t pubkey[32];      /* auth: curve: the node's public key (KEYS/NAME.pub) */
    uint64_t rsv_wait_since; /* oldest unanswered Reserve's send time (0: none) */
    uint64_t unresponsive;   /* times it left a Reserve unanswered past the timeout */
    /* blame (failover.c): prefill failures that were this node's own (a
     * prefill node's PrefillDone error, its death or timeout mid-prefill; a
     * decode node's refused address or rkeys, unusable reservation, failed
     * transfer); blame_streak such decode failures since its last good
     * transfer; RT_BLAME_STREAK of them in a row start a cool-down (until
     * cool_until) in which the scheduler takes it only when no other decode
     * node can */
    uint64_t blamed;
    uint32_t blame_streak;
    uint64_t cool_until;
    uint64_t cooldowns;
    uint8_t **ev_buf; /* BlockEvents payloads held while a resync is pending */
    size_t *ev_buf_len;
    size_t n_ev_buf;
    size_t ev_buf_bytes; /* their sum, at most RT_HELD_EVENT_BYTES */
    uint64_t ev_drops;
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
    int p, d;            /* node indices, -1 */
    uint64_t d_inc;      /* D's incarnation when dispatched (its pool's blocks) */
    int bad_p;           /* prefill node that failed this request last, -1 */
    uint64_t bad_d_mask; /* decode nodes that failed its transfer (their fault) */
    bool local;
    uint32_t retries;
    char first_why[256]; /* the first failure's cause: the final error names it too */
    uint32_t need_blocks;
    uint32_t cached_tokens;
    uint32_t *block_ids;
    size_t n_block_ids;
    bool prefill_done;
    bool kv_counted;  /* this dispatch's KV bytes are in kv_bytes (from PrefillDone or D's
                         first Token, whichever came first) */
    uint32_t attempt; /* prefill attempt on the current reservation (0 first) */
    bool d_held;      /* D answered Reserved and still holds it: a retry reuses it */
    uint32_t *out;    /* tokens streamed to the client */
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
    uint64_t held_event_drops; /* BlockEvents not held during a resync (bound reached) */
    uint64_t refused_registrations;
    uint64_t auth_refused;  /* connections (ZAP) and messages refused by authentication */
    uint64_t decode_faults; /* prefills failed by the decode node (PrefillDone.decode_fault) */
    struct rt_samples overhead, overhead_cpu, token, tokenize;
};

#define RT_MAX_CLIENT_FD   65536
#define RT_MAX_CLIENT_KEYS 256

struct rt_client_key {
    char name[64];
    uint8_t pub[32];
};
#define RT_MAX_EVENTS (2 * RT_MAX_NODES)

/* What the registry reports; main.c hands it to failover.c. */
struct rt_event {
    int node; /* index of a node that died or re-registered */
    char why[48];
};

typedef struct rt {
    kvr_cluster_t *cl;
    const kvr_cluster_node_t *self;
    void *zctx;
    void *client_sock; /* ROUTER */
    void *node_sock;   /* ROUTER */
    void *mon_sock;    /* PAIR: client socket monitor (accepts, disconnects) */
    void *zap_sock;    /* REP: the ZAP handler (auth: curve), else NULL */
    struct rt_client_key client_keys[RT_MAX_CLIENT_KEYS];
    size_t n_client_keys;
    /* Connection epoch per client fd, bumped on every accept: a fd reused by a
     * new client must not inherit the disconnect of the one before it. */
    uint32_t fd_epoch[RT_MAX_CLIENT_FD];
    uint64_t start_ns;
    uint64_t rng;
    kvr_tokenizer_t *tok;
    uint32_t context; /* model context length, 0 = unknown */
    uint32_t vocab;   /* 0 = unknown */
    char model_fingerprint[128];
    struct rt_node nodes[RT_MAX_NODES];
    int n_nodes;
    rt_dir_t dir;     /* seq hash -> node mask */
    rt_u64map_t reqs; /* dispatch id -> struct rt_req * */
    struct rt_req *all;
    struct rt_req *qhead, *qtail;
    size_t n_queued;
    uint64_t next_id;
    struct rt_stats st;
    uint64_t bad_log_window_ns, bad_log_count, bad_log_suppressed; /* rate limit */
    uint64_t next_deadline;                /* earliest timer; UINT64_MAX: none (the loop sleeps) */
    struct rt_event events[RT_MAX_EVENTS]; /* registry -> failover, run by the loop */
    size_t n_events;
    bool pump_wanted; /* room may have appeared: the loop runs the queue pump */
} rt_t;

/* util.c */
uint64_t rt_rand(rt_t *r);
/** Largest text prompt tokenized, in bytes (RT_PROMPT_BYTES_PER_TOKEN). */
size_t rt_prompt_bytes_max(const rt_t *r);
/** Rate limit of log lines about bad input: true for the first 20 a second. */
bool rt_bad_log_ok(rt_t *r);
/** This thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID). */
uint64_t rt_cpu_ns(void);
/** Something is due at t (ns): the loop wakes no later than that. */
void rt_timer_arm(rt_t *r, uint64_t t);
/** Logs how many bad-input lines were suppressed once their window closed. */
void rt_bad_log_tick(rt_t *r, uint64_t now);

/* send.c */
kvr_status_t rt_send_node(rt_t *r, struct rt_node *n, unsigned method, const ProtobufCMessage *msg);
/** NodeCancel of dispatch id to node idx (no-op for idx < 0). */
void rt_send_node_cancel(rt_t *r, int idx, uint64_t id, kvr_status_t code, const char *why);
/** A Generate frame to the client of q; a gone client clears q's route. */
kvr_status_t rt_send_client(rt_t *r, struct rt_req *q, unsigned flags, const ProtobufCMessage *m);

/* registry.c */
kvr_status_t rt_registry_init(rt_t *r);
void rt_registry_fini(rt_t *r);
struct rt_node *rt_node_by_route(rt_t *r, const uint8_t *route, size_t len);
void rt_registry_on_register(rt_t *r, const kvr_proto_frame_t *f, const Kvrail__RegisterRequest *q,
                             uint64_t now);
/** n is NULL or unregistered for a heartbeat from an unknown peer. */
void rt_registry_on_heartbeat(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                              const Kvrail__Heartbeat *hb, uint64_t now);
/** Heartbeat deadlines and lost connections; arms the next deadline. */
void rt_registry_tick(rt_t *r, uint64_t now);
/** Mask of the live decode nodes. */
uint64_t rt_registry_live_decode(const rt_t *r);
/** A Reserved or Rejected came from n: its wait for an answer restarts. */
void rt_registry_reserve_answered(rt_t *r, struct rt_node *n, uint64_t now);

/* dirsync.c */
void rt_dirsync_on_events(rt_t *r, struct rt_node *n, const kvr_proto_frame_t *f,
                          const Kvrail__BlockEvents *be, uint64_t now);
void rt_dirsync_on_dump(rt_t *r, struct rt_node *n, const Kvrail__ResyncDump *d, uint64_t now);
void rt_dirsync_request(rt_t *r, struct rt_node *n, uint64_t now, const char *why);
/** The node's directory entries and sync state are gone (death, restart). */
void rt_dirsync_reset(rt_t *r, struct rt_node *n);
void rt_dirsync_fini(struct rt_node *n);

/* requests.c */
bool rt_requests_init(rt_t *r);
void rt_requests_fini(rt_t *r);
struct rt_req *rt_req_find(rt_t *r, uint64_t did);
void rt_req_add(rt_t *r, struct rt_req *q);
/** Frees a request not yet added, or one added and finished. */
void rt_req_free(rt_t *r, struct rt_req *q);
void rt_queue_remove(rt_t *r, struct rt_req *q);
void rt_queue_push(rt_t *r, struct rt_req *q, bool front);
/** Moves q to state st, keeping D's reserving_blocks in step. */
void rt_req_set_state(rt_t *r, struct rt_req *q, enum rt_req_state st);
/** Undoes the load estimates of the current dispatch. */
void rt_req_release(rt_t *r, struct rt_req *q);
/** Back to the queue's front for another dispatch (retry, reject, migration). */
void rt_req_requeue(rt_t *r, struct rt_req *q, uint64_t now);
/** Ends a request: the client gets StreamEnd (ok, canceled) or an error
 * frame; the nodes still holding it get NodeCancel when cancel_nodes. */
void rt_req_finish(rt_t *r, struct rt_req *q, kvr_status_t code, Kvrail__FinishReason fin,
                   bool cancel_nodes, uint64_t now, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* dispatch.c */
enum rt_dispatch_result {
    RT_DISPATCH_OK,
    RT_DISPATCH_NO_DECODE,
    RT_DISPATCH_POOL_FULL,
    RT_DISPATCH_SEND_FAILED,
    RT_DISPATCH_TOO_BIG,
};
enum rt_dispatch_result rt_dispatch(rt_t *r, struct rt_req *q, uint64_t now);
/** Dispatches what the queue holds, in order, while decode nodes take it. */
void rt_dispatch_pump(rt_t *r, uint64_t now);
void rt_on_reserved(rt_t *r, struct rt_node *n, const Kvrail__Reserved *m, uint64_t now);
void rt_on_rejected(rt_t *r, struct rt_node *n, const Kvrail__Rejected *m, uint64_t now);
/** Retries q's prefill on another prefill node on the same reservation of
 *  D (Reserve with attempt + 1 renews its lease; Prefill to the new P).
 *  false when that cannot be done (local prefill, no reservation held, no
 *  live prefill node, a send failed): the caller dispatches afresh. */
bool rt_dispatch_retry_prefill(rt_t *r, struct rt_req *q, uint64_t now);

/* failover.c */
/** A node died or re-registered: retry, migrate or fail what it held. */
void rt_failover_node_lost(rt_t *r, struct rt_node *n, uint64_t now, const char *why);
/** A prefill failed: retry elsewhere (limits.prefill_retries) or fail. */
void rt_failover_prefill_failed(rt_t *r, struct rt_req *q, uint64_t now, kvr_status_t code,
                                const char *why);
/** A prefill failed by the decode node's fault (PrefillDone.decode_fault):
 *  D is blamed (and cooled down after RT_BLAME_STREAK in a row), its
 *  reservation released, and the request dispatched to another live decode
 *  node; failed, naming the cause, when none is left or retries are spent. */
void rt_failover_decode_failed(rt_t *r, struct rt_req *q, uint64_t now, kvr_status_t code,
                               const char *why);
/** Request, queue and prefill deadlines; arms the next one. */
void rt_failover_tick(rt_t *r, uint64_t now);

/* streams.c */
void rt_on_prefill_done(rt_t *r, struct rt_node *n, const Kvrail__PrefillDone *m, uint64_t now);
void rt_on_token(rt_t *r, struct rt_node *n, const Kvrail__Token *m, uint64_t now);

/* status.c */
void rt_status_reply(rt_t *r, const kvr_proto_frame_t *f, uint64_t now);

/* auth.c */
/** auth: curve: loads the keys and binds the ZAP handler; auth: none: warns.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND / KVR_ERR_INVALID (a key file);
 *          KVR_ERR_UNSUPPORTED (no CURVE); KVR_ERR_IO. */
kvr_status_t rt_auth_init(rt_t *r);
void rt_auth_fini(rt_t *r);
/** Answers the pending ZAP requests. */
void rt_auth_zap(rt_t *r);
/** auth: curve: the frame's connection authenticated as node n (else counted
 *  and logged); always true with auth: none or no such node. */
bool rt_auth_node_ok(rt_t *r, const kvr_proto_frame_t *f, const struct rt_node *n);

/* node_ep.c */
void rt_node_msg(rt_t *r, kvr_proto_frame_t *f, uint64_t now);

/* loop.c (called by main.c and the fuzz driver) */
/** Hands the registry's events to failover and runs the queue pump until
 *  neither is left. */
void rt_loop_settle(rt_t *r, uint64_t now);
/** The timers (registry, failover), then settle. */
void rt_loop_timers(rt_t *r, uint64_t now);
/** Receives and handles up to 1024 messages of the client or node socket. */
void rt_loop_drain(rt_t *r, void *sock, bool client);
/** Handles one received frame (st: kvr_proto_recv's status, err its text). */
void rt_loop_frame(rt_t *r, void *sock, bool client, kvr_proto_frame_t *f, kvr_status_t st,
                   const char *err, uint64_t now);

/* client_ep.c */
void rt_client_msg(rt_t *r, kvr_proto_frame_t *f, uint64_t now);
/** Handles every pending client-socket monitor event (accepts, disconnects). */
void rt_client_monitor(rt_t *r);

#endif
