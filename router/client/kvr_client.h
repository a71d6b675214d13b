/*
 * kvr_client.h - libkvrail-client: the C client of the kvrail router's
 * client endpoint (ZeroMQ DEALER, protobuf frames, see docs/protocol.md).
 *
 *   kvr_client_t *c;
 *   kvr_client_connect("tcp://127.0.0.1:7700", &c);
 *   struct kvr_gen_params p;
 *   kvr_gen_params_default(&p);
 *   p.prompt = "Hello";
 *   p.max_tokens = 32;
 *   struct kvr_gen_result res;
 *   kvr_client_generate(c, &p, on_token, NULL, 60000, &res);   // callback per token
 *   ...or kvr_client_generate_start() + kvr_gen_stream_next() (iterator)
 *   kvr_client_close(c);
 *
 * Several streams may be open on one client at once (their frames are told
 * apart by call id); a client is used from one thread.
 *
 * ABI: the soname is libkvrail-client.so.2.  The structs the caller
 * allocates and the library fills or reads (kvr_gen_params, kvr_gen_token,
 * kvr_gen_result, kvr_cluster_status, kvr_node_info) begin with `size`, the
 * caller's sizeof, and only ever grow at the end: the library reads or
 * writes no byte past the caller's size (fields a caller built against an
 * older header lacks take their defaults).  kvr_gen_params_default(),
 * kvr_gen_stream_next(), kvr_gen_stream_take(), kvr_client_generate() and
 * kvr_client_status() are macros passing that sizeof, so a program built
 * against this header keeps working with a later .so.2.  No struct holds
 * another one in a fixed array: the status's nodes are an array the client
 * owns, laid out with the caller's element size.  Every wait takes a
 * timeout in milliseconds; nothing blocks forever.  Error texts from the
 * router (what was wrong with a request) are in kvr_gen_result.message or
 * kvr_client_error().
 */
#ifndef KVR_CLIENT_H
#define KVR_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvr_client kvr_client_t;
typedef struct kvr_gen_stream kvr_gen_stream_t;

/** Finish reasons (kvrail.FinishReason). */
enum kvr_finish {
    KVR_FINISH_NONE = 0,
    KVR_FINISH_LENGTH = 1,
    KVR_FINISH_STOP = 2,
    KVR_FINISH_CANCELED = 3,
    KVR_FINISH_ERROR = 4,
};

struct kvr_gen_params {
    size_t size;               /* the caller's sizeof (kvr_gen_params_default sets it) */
    const char *prompt;        /* text (tokenized by the router), or */
    const uint32_t *token_ids; /* token ids (used when n_token_ids > 0) */
    size_t n_token_ids;
    uint32_t max_tokens;      /* default 16 */
    float temperature;        /* default 0 (greedy) */
    float top_p;              /* default 1 */
    uint32_t top_k;           /* default 0 (off) */
    float repetition_penalty; /* default 1 */
    uint64_t seed;
    bool has_seed;           /* false: the router picks one */
    const char *const *stop; /* stop strings */
    size_t n_stop;
    const uint32_t *stop_token_ids;
    size_t n_stop_token_ids;
    bool ignore_eos;
    bool return_prompt_tokens;                   /* the first token carries the prompt's ids */
    bool no_text;                                /* token ids only, no detokenized text */
    float min_p;                                 /* default 0 (off) */
    float presence_penalty;                      /* default 0 (off), [-2, 2] */
    float frequency_penalty;                     /* default 0 (off), [-2, 2] */
    const struct kvr_gen_logit_bias *logit_bias; /* added to the logits; ids distinct */
    size_t n_logit_bias;                         /* at most 300 */
    uint32_t top_logprobs; /* alternatives per token (0 = none, at most KVR_GEN_MAX_TOP) */
    /* new fields go here, at the end */
};

#define KVR_GEN_MAX_TOP 20

struct kvr_gen_logit_bias {
    uint32_t token_id;
    float bias; /* [-100, 100] */
};

struct kvr_gen_token {
    size_t size; /* the bytes the library filled (the caller's sizeof at most) */
    uint64_t request_id;
    uint32_t index; /* 0 = first generated token */
    uint32_t token_id;
    float logprob;
    const char *text; /* NUL-terminated, valid until the next call */
    size_t text_len;
    enum kvr_finish finish;           /* != NONE on the last token */
    const uint32_t *prompt_token_ids; /* first token only, if asked */
    size_t n_prompt_token_ids;
    /* top_logprobs: the most likely tokens at this position, best first */
    size_t n_top;
    uint32_t top_ids[KVR_GEN_MAX_TOP];
    float top_logprobs[KVR_GEN_MAX_TOP];
    /* new fields go here, at the end */
};

struct kvr_gen_result {
    size_t size;         /* the bytes the library filled */
    kvr_status_t status; /* KVR_OK, KVR_ERR_CANCELED, or the router's error */
    char message[512];
    uint64_t request_id;
    enum kvr_finish finish;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    bool local_prefill;
    char prefill_node[64], decode_node[64];
    uint64_t kv_bytes_moved;
    uint64_t ttft_us, total_us; /* measured by the router */
    uint64_t router_overhead_ns;
    uint64_t router_overhead_cpu_ns;
    /* new fields go here, at the end */
};

/** Called for each token; return non-zero to cancel the request. */
typedef int (*kvr_gen_cb)(void *arg, const struct kvr_gen_token *tok);

/** Sets every field of p (size bytes, the caller's sizeof) to its default
 *  and p->size to size.  Use kvr_gen_params_default(p). */
void kvr_gen_params_init(struct kvr_gen_params *p, size_t size);
#define kvr_gen_params_default(p) kvr_gen_params_init((p), sizeof(*(p)))

/** Creates a client connected (asynchronously, as ZeroMQ does) to endpoint.
 *  @return KVR_OK; KVR_ERR_INVALID (bad endpoint); KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_client_connect(const char *endpoint, kvr_client_t **client_p);
/** The same on a ZeroMQ context the caller owns, which many clients may
 *  share (one I/O thread for all of them, as kvrail-frontend does); the
 *  context must outlive the client.
 *  @return KVR_OK; KVR_ERR_INVALID (bad endpoint, NULL context);
 *          KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_client_connect_ctx(void *zmq_ctx, const char *endpoint, kvr_client_t **client_p);
/** The same with the library's own router link instead of a ZeroMQ socket
 *  (zmtp.c): ZMTP 3.1 spoken as a DEALER on one non-blocking TCP socket,
 *  driven by the caller's thread, with no ZeroMQ context or I/O thread, so
 *  a frame from the router wakes the caller directly.  The router sees an
 *  ordinary DEALER.  tcp://HOST:PORT endpoints.  With CURVE keys in the
 *  environment (KVRAIL_ROUTER_KEY / KVRAIL_CLIENT_KEY, as for
 *  kvr_client_connect) the link speaks CURVE (CurveZMQ, libsodium), else
 *  ZMTP's NULL mechanism; a router using the other mechanism is refused
 *  with the reason, never met in the clear.  Reconnects as a DEALER does
 *  (100 ms, doubling to 2 s).  kvr_client_fds gives one descriptor (no
 *  monitor), level-triggered: a send takes no wake-up.  Added in .so.2.
 *  @return KVR_OK; KVR_ERR_INVALID (endpoint, or keys set and unusable:
 *          the reason on stderr); KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_client_connect_direct(const char *endpoint, kvr_client_t **client_p);
void kvr_client_close(kvr_client_t *c);
/** The last error message of this client ("" when none). */
const char *kvr_client_error(const kvr_client_t *c);

/** Round trip to the router.  @return KVR_OK; KVR_ERR_TIMEOUT. */
kvr_status_t kvr_client_ping(kvr_client_t *c, int timeout_ms);

/** Generates, calling cb for every token, until the stream ends or
 *  timeout_ms passes (then the request is canceled).  *res_p (res_size
 *  bytes, NULL allowed) is filled in every case.  Use kvr_client_generate().
 *  @return res_p->status; KVR_ERR_TIMEOUT. */
kvr_status_t kvr_client_generate_sized(kvr_client_t *c, const struct kvr_gen_params *p,
                                       kvr_gen_cb cb, void *arg, int timeout_ms,
                                       struct kvr_gen_result *res_p, size_t res_size);
#define kvr_client_generate(c, p, cb, arg, timeout_ms, res_p)                                      \
    kvr_client_generate_sized((c), (p), (cb), (arg), (timeout_ms), (res_p), sizeof(*(res_p)))

/** Starts a stream (sends the request, does not wait).
 *  @return KVR_OK; KVR_ERR_INVALID (NULL params, or params whose size is 0:
 *          not set up by kvr_gen_params_default); KVR_ERR_NO_RESOURCE
 *          (send queue full); KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_client_generate_start(kvr_client_t *c, const struct kvr_gen_params *p,
                                       kvr_gen_stream_t **stream_p);
/** Next token of a stream, into *tok_p (tok_size bytes at most).  Use
 *  kvr_gen_stream_next().
 *  @return KVR_OK (tok_p filled, valid until the next call on this client);
 *          KVR_ERR_CLOSED (the stream ended: kvr_gen_stream_result());
 *          KVR_ERR_TIMEOUT (nothing within timeout_ms; call again or cancel). */
kvr_status_t kvr_gen_stream_next_sized(kvr_gen_stream_t *s, int timeout_ms,
                                       struct kvr_gen_token *tok_p, size_t tok_size);
#define kvr_gen_stream_next(s, timeout_ms, tok_p)                                                  \
    kvr_gen_stream_next_sized((s), (timeout_ms), (tok_p), sizeof(*(tok_p)))
/** kvr_gen_stream_next without touching the socket: only frames already
 *  filed with the stream (by a wait), for a loop that has just waited
 *  (kvr_client_wait_fd, kvr_client_next_ready).  Use kvr_gen_stream_take().
 *  @return KVR_OK; KVR_ERR_CLOSED; KVR_ERR_TIMEOUT (nothing filed). */
kvr_status_t kvr_gen_stream_take_sized(kvr_gen_stream_t *s, struct kvr_gen_token *tok_p,
                                       size_t tok_size);
#define kvr_gen_stream_take(s, tok_p) kvr_gen_stream_take_sized((s), (tok_p), sizeof(*(tok_p)))
/** The final status and usage, once next returned KVR_ERR_CLOSED (the
 *  library's struct: res->size tells which fields it has). */
const struct kvr_gen_result *kvr_gen_stream_result(const kvr_gen_stream_t *s);
/** Waits up to timeout_ms until a frame for any open stream (or call) of
 *  this client arrives, and files it with its stream; for a caller that
 *  serves several streams at once (then kvr_gen_stream_next(s, 0) on each).
 *  @return KVR_OK (something arrived); KVR_ERR_TIMEOUT. */
kvr_status_t kvr_client_wait(kvr_client_t *c, int timeout_ms);
/** kvr_client_wait that also returns when fd (>= 0) is readable, for a
 *  caller whose one loop serves the router and other descriptors (an epoll
 *  set of them): *fd_ready_p tells which.  A signal ends the wait early
 *  (KVR_ERR_TIMEOUT) so the caller can look at its flags.
 *  @return KVR_OK (a frame arrived, or fd is readable); KVR_ERR_TIMEOUT. */
kvr_status_t kvr_client_wait_fd(kvr_client_t *c, int fd, int timeout_ms, bool *fd_ready_p);
/** The descriptors that become readable when something may have arrived,
 *  for a caller's own epoll set (level-triggered), waited on instead of
 *  kvr_client_wait_fd: fds[0] is the socket's (ZeroMQ's ZMQ_FD), fds[1]
 *  the connection monitor's.  ZeroMQ's rule: before such a wait the last
 *  call on the client must be kvr_client_poll() (a send - generate_start,
 *  cancel, ping - may have taken the wake-up of a frame that arrived).
 *  @return how many were written to fds (at most max). */
size_t kvr_client_fds(const kvr_client_t *c, int *fds, size_t max);
#define KVR_CLIENT_POLL_SOCKET  1u /* fds[0] was readable: receive */
#define KVR_CLIENT_POLL_MONITOR 2u /* fds[1] was readable: a connection event */
/** Files what has arrived, without waiting: reads the socket when `what`
 *  says so or something was sent since it last found nothing, and the
 *  monitor when `what` says so (a lost connection ends the open streams).
 *  @return KVR_OK (something came); KVR_ERR_TIMEOUT. */
kvr_status_t kvr_client_poll(kvr_client_t *c, unsigned what);
/** The next stream that has something to take (frames queued, or it ended)
 *  since it was last returned, oldest first; NULL when none.  With it a
 *  caller serving many streams visits only those (kvr_gen_stream_next(s, 0)
 *  until KVR_ERR_TIMEOUT or KVR_ERR_CLOSED). */
kvr_gen_stream_t *kvr_client_next_ready(kvr_client_t *c);
/** A pointer of the caller's kept with the stream. */
void kvr_gen_stream_set_user(kvr_gen_stream_t *s, void *user);
void *kvr_gen_stream_user(const kvr_gen_stream_t *s);
/** Sends a PING without waiting for its answer (which, like any frame from
 *  the router, moves kvr_client_last_rx_ns).  @return KVR_OK; the send's error. */
kvr_status_t kvr_client_ping_send(kvr_client_t *c);
/** When the last frame from the router arrived on this client
 *  (CLOCK_MONOTONIC, ns; kvr_now_ns()), 0 if none yet. */
uint64_t kvr_client_last_rx_ns(const kvr_client_t *c);
/** Asks the router to cancel; the stream then ends with KVR_ERR_CANCELED. */
kvr_status_t kvr_gen_stream_cancel(kvr_gen_stream_t *s);
/** Frees a stream (canceling it first if it has not ended). */
void kvr_gen_stream_destroy(kvr_gen_stream_t *s);

struct kvr_node_info {
    size_t size; /* the bytes the library filled (the caller's sizeof at most) */
    char name[64];
    char role[16]; /* "prefill" | "decode" */
    bool alive;
    char host[128];
    char transport[16];
    uint64_t last_heartbeat_ms_ago;
    uint32_t total_blocks, free_blocks, cached_blocks, batch_size;
    uint64_t inflight_prefill_tokens, queued_prefill_tokens, requests;
    uint64_t kv_bytes_moved, kv_transfer_ns;
    double kv_gbps;
    uint64_t block_event_seq, resyncs;
    /* the node's own counts (from its heartbeats): frames from the router
     * and (decode) P->D notifications it dropped as malformed */
    uint64_t bad_frames, bad_notifications;
    /* the write fence (docs/nodes.md): on a decode node, blocks held until
     * their writer is fenced and how quarantines ended (the writer's own word,
     * a lease without a sign of life); on a prefill node, pushes it gave up
     * after half a lease of silence */
    uint32_t quarantined_blocks;
    uint64_t quarantines_fenced, quarantines_expired, self_fenced;
    /* request failures the router blamed on this node; a decode node taken
     * last for a lease after repeated faults (docs/security.md) */
    uint64_t failures_blamed, cooldowns;
    bool cooling;
    /* as the node registered: its KV pool's dtype ("f32" | "bf16" | "f16")
     * and its engine kernels' bit class ("cpu-fma16.R" | "cpu-base.R" |
     * "cuda", R the arithmetic revision; "" when not told), what a
     * registration is refused over (docs/nodes.md) */
    char kv_dtype[16];
    char kernels[16];
    /* new fields go here, at the end */
};

struct kvr_cluster_status {
    size_t size; /* the bytes the library filled (the caller's sizeof at most) */
    char model[512];
    uint32_t block_size;
    uint64_t uptime_ms, requests, active, queued, completed, failed, canceled, overloaded;
    uint64_t bad_frames, bad_requests, local_prefills, disagg_prefills, retries;
    uint64_t overhead_p50_ns, overhead_p99_ns, overhead_max_ns, overhead_samples;
    uint64_t overhead_cpu_p50_ns, overhead_cpu_p99_ns; /* the same in router CPU time */
    uint64_t token_overhead_p50_ns, token_overhead_p99_ns, tokenize_p50_ns, tokenize_p99_ns;
    uint64_t kv_bytes_moved, kv_transfer_ns;
    double kv_gbps;
    uint64_t directory_blocks, cached_tokens, prompt_tokens;
    uint64_t client_disconnects, resyncs, dead_nodes;
    /* refused by auth: curve; REGISTERs refused; BlockEvents dropped during
     * a resync; decode nodes declared unresponsive (a Reserve unanswered) */
    uint64_t auth_refused, refused_registrations, held_event_drops, unresponsive_nodes;
    /* every node the router reported, in an array the client owns (valid
     * until the next kvr_client_status on this client or its close), each
     * element the caller's sizeof(struct kvr_node_info): nodes[i] indexes
     * as usual, and nodes[i].size says how many bytes of it were filled */
    size_t n_nodes;
    const struct kvr_node_info *nodes;
    /* new fields go here, at the end */
};

#define KVR_CLIENT_MAX_NODE_INFO 65536 /* the largest sizeof(kvr_node_info) accepted */
#define KVR_CLIENT_MAX_NODES     4096  /* a status reporting more is refused (KVR_ERR_CORRUPT) */

/** Fetches the router's status into *st_p (st_size bytes, the caller's
 *  sizeof) and its nodes (node_size bytes each, the caller's sizeof; see
 *  kvr_cluster_status.nodes).  Use kvr_client_status().
 *  @return KVR_OK; KVR_ERR_INVALID (a size too small or too large);
 *          KVR_ERR_NO_MEMORY; KVR_ERR_TIMEOUT; an error status from the
 *          router (message in kvr_client_error()). */
kvr_status_t kvr_client_status_sized(kvr_client_t *c, int timeout_ms,
                                     struct kvr_cluster_status *st_p, size_t st_size,
                                     size_t node_size);
#define kvr_client_status(c, timeout_ms, st_p)                                                     \
    kvr_client_status_sized((c), (timeout_ms), (st_p), sizeof(*(st_p)), sizeof(*(st_p)->nodes))

#ifdef __cplusplus
}
#endif
#endif
