/*
 * frontend.h - kvrail-frontend's private header: the OpenAI-compatible HTTP
 * server in front of the router's protobuf client API.
 *
 * The process is one event loop (http.c): libmicrohttpd in external epoll
 * mode and one router client (libkvrail-client, one DEALER socket that
 * carries every request's streams), polled together.  A request's
 * connection is suspended while it waits for the router and resumed as
 * soon as its tokens arrive.  Connections are bounded (past the bound a
 * connection is answered 503 and closed).  /ready's STATUS call runs on a
 * short-lived thread with a pooled client of its own.  Files:
 *   main.c      options, cluster file, model facts, start/stop
 *   http.c      libmicrohttpd glue: connection bound, bodies, routing,
 *               health/ready/models/metrics, error responses
 *   request.c   an OpenAI request body -> struct fe_req, every field checked
 *   chat.c      chat messages -> prompt token ids (the model's chat template)
 *   generate.c  runs a request on the router (n choices, stop text cut,
 *               logprobs) and writes the JSON / SSE answer
 *   metrics.c   the frontend's own Prometheus counters and histograms
 *   buf.c       a growable byte buffer with JSON helpers
 */
#ifndef KVR_FRONTEND_H
#define KVR_FRONTEND_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_client.h"
#include "kvr_json.h"
#include "kvr_status.h"

#define FE_COMP "frontend"

/* ---- configuration and shared state (main.c) ---- */
struct fe_config {
    char listen_host[256];
    int port;
    char router[256];     /* router client endpoint */
    bool router_zmq;      /* libzmq's DEALER, not the direct link (--router-link, below) */
    char model_name[256]; /* the id /v1/models and requests use */
    uint32_t context_len; /* 0 = unknown */
    uint32_t max_connections;
    size_t max_body;
    uint32_t max_n;       /* largest n (choices per prompt) */
    uint32_t max_prompts; /* prompts in one request */
    int request_timeout_ms;
    int idle_timeout_s;        /* HTTP connection idle timeout */
    int header_timeout_s;      /* a request's headers must be in within it (slowloris) */
    unsigned busy_poll_us;     /* the loop looks without sleeping this long after a busy turn */
    uint32_t max_tokens_limit; /* the router's largest max_tokens (cluster file) */
    /* sampling defaults for fields a request leaves out: OpenAI's, or the
     * model's generation_config.json (as vLLM does) */
    float def_temperature, def_top_p, def_repetition_penalty, def_min_p;
    uint32_t def_top_k;
    bool have_chat; /* the model's chat template is loaded (chat.c) */
};

extern struct fe_config fe_cfg;

/* ---- growable buffer (buf.c) ---- */
struct fe_buf {
    char *p;
    size_t len, cap;
    bool oom; /* an append failed: the content is incomplete */
};

void fe_buf_free(struct fe_buf *b);
void fe_buf_put(struct fe_buf *b, const char *s, size_t n);
void fe_buf_puts(struct fe_buf *b, const char *s);
void fe_buf_printf(struct fe_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Appends s[0..n) as a JSON string literal. */
void fe_buf_json_str(struct fe_buf *b, const char *s, size_t n);
/** Appends a float as JSON (finite; -inf/nan become -9999.0 / null). */
void fe_buf_json_num(struct fe_buf *b, double v);

/* ---- metrics (metrics.c) ---- */
enum fe_endpoint {
    FE_EP_COMPLETIONS,
    FE_EP_CHAT,
    FE_EP_MODELS,
    FE_EP_HEALTH,
    FE_EP_READY,
    FE_EP_METRICS,
    FE_EP_OTHER,
    FE_EP_COUNT
};

const char *fe_endpoint_name(enum fe_endpoint ep);
void fe_metrics_request_done(enum fe_endpoint ep, unsigned status, uint64_t latency_ns);
void fe_metrics_ttft(uint64_t ns);
/** The frontend's own share of a TTFT: its TTFT minus the router's
 *  (router receive -> first token sent), i.e. HTTP and JSON parsing, the
 *  hops to and from the router, and the first event's formatting. */
void fe_metrics_added_ttft(uint64_t ns);
/** A generation request's time in the frontend before the router has it
 *  (body complete -> parsed, checked and sent). */
void fe_metrics_to_router(uint64_t ns);
/** A token's time in the frontend's loop (frame taken from the router
 *  client -> its SSE event handed to the socket). */
void fe_metrics_to_client(uint64_t ns);
void fe_metrics_tokens(uint64_t prompt, uint64_t completion);
void fe_metrics_inflight(int delta);
void fe_metrics_connection(int delta, bool rejected);
void fe_metrics_bad_http(void);
/** Appends the Prometheus text exposition of every metric. */
void fe_metrics_render(struct fe_buf *b);

/* ---- an OpenAI request (request.c) ---- */
struct fe_prompt {
    const char *text; /* points into the JSON document, or */
    uint32_t *ids;    /* token ids (owned) */
    size_t n_ids;
};

#define FE_MAX_STOPS        16
#define FE_MAX_LOGIT_BIAS   300 /* OpenAI's bound, the sampler's */
#define FE_MAX_TOP_LOGPROBS 20  /* KVR_GEN_MAX_TOP, the sampler's bound */

struct fe_req {
    bool chat;
    struct fe_prompt *prompts; /* owned array */
    size_t n_prompts;
    uint32_t max_tokens;
    float temperature, top_p, repetition_penalty, min_p;
    float presence_penalty, frequency_penalty;
    struct kvr_gen_logit_bias logit_bias[FE_MAX_LOGIT_BIAS];
    size_t n_logit_bias;
    uint32_t top_k;
    uint64_t seed;
    bool has_seed;
    const char *stop[FE_MAX_STOPS];
    size_t n_stop;
    uint32_t stop_token_ids[32];
    size_t n_stop_token_ids;
    bool ignore_eos;
    uint32_t n;
    int logprobs; /* -1 = none, 0 = the sampled tokens' logprobs, N > 0 = and the N
                     most likely alternatives of each (top_logprobs) */
    bool stream, include_usage;
    const kvr_json_t *messages; /* chat: the messages list (in the JSON document) */
};

/** Parses and checks a request body.  On an error, status_p gets the HTTP
 *  status, param (may be "") the offending field and msg what was wrong.
 *  @return KVR_OK; KVR_ERR_INVALID; KVR_ERR_UNSUPPORTED (a field this
 *          server cannot honour); KVR_ERR_NOT_FOUND (unknown model);
 *          KVR_ERR_NO_MEMORY. */
kvr_status_t fe_req_parse(const kvr_json_t *root, bool chat, struct fe_req *req, unsigned *status_p,
                          char *param, size_t param_len, char *msg, size_t msg_len);
void fe_req_free(struct fe_req *req);

/* ---- chat (chat.c) ---- */
/** Loads the model's chat template and tokenizer; sets fe_cfg.have_chat. */
void fe_chat_init(const char *model_dir);
/** Why chat is off (for the 501 answer). */
const char *fe_chat_unavailable(void);
/** Renders messages with the template (kwargs: chat_template_kwargs, may be
 *  NULL) and tokenizes the text into p->ids.
 *  @return KVR_OK; KVR_ERR_INVALID (msg says why); KVR_ERR_UNSUPPORTED
 *          (chat is off); KVR_ERR_NO_MEMORY. */
kvr_status_t fe_chat_prompt(const kvr_json_t *messages, const kvr_json_t *kwargs,
                            struct fe_prompt *p, char *msg, size_t msg_len);
/** Whether the model's tokenizer is loaded (top-N logprobs need it). */
bool fe_have_tokenizer(void);
/** The text of one token alone (special tokens included; malloc'd, free()
 *  it), as the top-N logprobs show an alternative.
 *  @return KVR_OK; KVR_ERR_UNSUPPORTED (no tokenizer); the decoder's error. */
kvr_status_t fe_token_text(uint32_t id, char **text_p, size_t *len_p);

/* ---- generation (generate.c) ---- */
#define FE_PING_MS 2000
/* A new router client skips its ping when a client had an answer from the
 * router this recently (a burst of new connections would otherwise ping a
 * busy router all at once, and time out on a loaded host). */
#define FE_ROUTER_FRESH_MS 10000
/* Idle router clients kept for reuse; a burst beyond it closes the extra
 * ones when they come back (each holds ZeroMQ sockets and buffers). */
#define FE_POOL_IDLE_MAX 128
/** Borrows a router client from the pool (connecting a new one when none
 *  is idle, and pinging the router on it, FE_PING_MS); NULL when that
 *  fails, with the reason in err. */
kvr_client_t *fe_client_get(char *err, size_t err_len);
void fe_client_put(kvr_client_t *c, bool healthy);
void fe_client_pool_close(void);

struct fe_run; /* a request running on the router */

/** Called when a run has something for its connection. */
typedef void (*fe_wake_fn)(void *arg);

/** Starts every stream of req on client (the event loop's; t_arrival: when
 *  the HTTP request arrived, kvr_now_ns()) without waiting.  Its streams'
 *  frames reach it through fe_run_on_stream(); it calls wake(wake_arg) when
 *  every choice has its first event, when a choice ends, and (after
 *  fe_run_set_streaming) on every token.
 *  @return KVR_OK (run_p set) or the error (http status + message). */
kvr_status_t fe_run_start(struct fe_req *req, kvr_client_t *client, uint64_t t_arrival,
                          fe_wake_fn wake, void *wake_arg, struct fe_run **run_p,
                          unsigned *http_status_p, char *msg, size_t msg_len);
/** Takes the frames of a stream from the client's ready list (the stream's
 *  user pointer names its run). */
void fe_run_on_stream(kvr_gen_stream_t *s);
/** The answer is streamed: wake on every token. */
void fe_run_set_streaming(struct fe_run *run);
/** The HTTP peer left: cancels every stream at once (both halves). */
void fe_run_cancel(struct fe_run *run);
/** Deadlines (the request's; a router that sent nothing since the request
 *  went out, FE_PING_MS).  @return true when the run failed now (wake it). */
bool fe_run_tick(struct fe_run *run, uint64_t now);
/** Whether every choice has its first event.
 *  @return KVR_INPROGRESS (not yet); KVR_OK; an error (http status + message:
 *          the router refused, or the run failed). */
kvr_status_t fe_run_first(struct fe_run *run, unsigned *http_status_p, char *msg, size_t msg_len);
/** Non-streaming: once every choice ended, writes the whole JSON answer.
 *  @return KVR_OK; KVR_INPROGRESS (not ended yet); an error (http status +
 *          message set; nothing written). */
kvr_status_t fe_run_finish_json(struct fe_run *run, struct fe_buf *out, unsigned *http_status_p,
                                char *msg, size_t msg_len);
/** Streaming: appends the SSE events there are now to out.
 *  @return KVR_OK (more follow); KVR_INPROGRESS (nothing yet); KVR_ERR_CLOSED
 *          (out holds the last events, "data: [DONE]"); KVR_ERR_CANCELED
 *          (the peer left). */
kvr_status_t fe_run_next_sse(struct fe_run *run, struct fe_buf *out);
void fe_run_free(struct fe_run *run);

/* ---- errors (http.c) ---- */
/** HTTP status for a router status. */
unsigned fe_http_status(kvr_status_t st);
/** Appends OpenAI's error object {"error": {...}}. */
void fe_error_json(struct fe_buf *b, unsigned status, const char *param, const char *msg);

/* ---- the server (http.c) ---- */
kvr_status_t fe_http_start(void);
/** Runs the event loop (this thread) until *stop is set (by a signal). */
void fe_http_serve(volatile sig_atomic_t *stop);
void fe_http_stop(void);

#endif
