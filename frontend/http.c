/*
 * http.c - kvrail-frontend's HTTP server and its event loop (libmicrohttpd
 * in external epoll mode, keep-alive as HTTP/1.1 has it).
 *
 * One thread (fe_http_serve) waits on one epoll set holding libmicrohttpd's
 * epoll descriptor, the loop's router client's descriptors (one DEALER
 * socket carrying every request's streams, and its connection monitor:
 * ZeroMQ's ZMQ_FD, kvr_client_fds; with --router-link direct, the default,
 * the library's own ZMTP link and its one descriptor, so a router frame
 * wakes this thread with no ZeroMQ I/O thread between) and the HTTP
 * connections' sockets.  A generation request, once
 * parsed, starts its streams and suspends its connection; the router's frames are handed to their
 * runs (generate.c), which resume the connection as soon as there is something to answer (the first
 * event of every choice, tokens to stream, the end), and libmicrohttpd runs in the same turn of the
 * loop, so a token crosses no thread of ours.  A streamed answer's reader suspends the connection
 * when it has nothing to send.  While a connection is suspended
 * libmicrohttpd does not watch it, so every connection's socket is in the
 * loop's epoll set for EPOLLRDHUP (edge-triggered, added once for the
 * connection's life, not per request): a client that leaves cancels every
 * stream of its running request at once (the router cancels both halves).
 * libmicrohttpd runs only on a turn that has something for it (its
 * descriptor, a resumed connection, a timeout), not on one that only took
 * the router's frames, and again at once while it has work that needs no
 * waiting (a streamed answer's first event after its headers, the closing
 * chunk after its last event).  --busy-poll-us (off by default) keeps the
 * loop looking for a while after a busy turn instead of sleeping.
 * Deadlines are looked at ten
 * times a second, off the token path.  /ready's STATUS call runs on a
 * short-lived thread (at most READY_THREADS at once) that resumes its
 * connection when done.
 *
 * Connections are counted as they open and close; one that opens past
 * --max-connections is still accepted, but every request on it is answered
 * 503 with Retry-After and the connection is closed (libmicrohttpd's own
 * limit, a quarter higher, refuses anything beyond at accept).  A
 * connection whose request (head and body) is not all in by
 * --header-timeout-s (slowloris) is shut down by the tick: libmicrohttpd's own timeout counts
 * only inactivity, which a byte a second resets.  A request's
 * body is gathered up to --max-body (413 past it, checked on Content-Length
 * before anything is read), must be application/json and parse as JSON
 * (common/kvr_json.h); every error is OpenAI's error object with the HTTP
 * status and a message naming what was wrong.  libmicrohttpd can queue an
 * answer only before the body or after all of it, so a chunked body that
 * passes the limit is read and dropped (up to 8 times the limit, then the
 * connection is closed) before its 413.  Routing:
 *   POST /v1/completions       generate.c (JSON, or SSE when stream is true)
 *   POST /v1/chat/completions  the same, the prompt from chat.c (501 when chat is off)
 *   GET  /v1/models            the served model and its context length
 *   GET  /health               the process answers
 *   GET  /ready                the router answers and reports a live decode node
 *   GET  /metrics              metrics.c
 */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "frontend.h"

#define TICK_MS       100 /* deadlines are looked at this often (off the token path) */
#define READY_THREADS 16  /* /ready probes answered at once */

static struct MHD_Daemon *daemon_;
static atomic_int n_conns;
static long long started_at;
static kvr_client_t *router_; /* the loop's router client: every request's streams */
static int epfd_ = -1;        /* libmicrohttpd's epoll fd + suspended connections' sockets */
static bool stopping;
static atomic_int ready_threads;
static uint64_t last_ping_ns;
static char zmq_tag[2]; /* epoll data of the router client's socket and monitor */

/* An open connection (its socket context): whether it opened past
 * --max-connections, and the deadline of its next request.  libmicrohttpd's
 * own timeout counts inactivity, so a client that sends its request a byte
 * at a time (slowloris) would keep its slot forever; the loop's tick shuts
 * down a connection whose request is not all in by its deadline: --header-timeout-s after it
 * opened, or --idle-timeout-s +
 * --header-timeout-s after its previous answer (keep-alive may wait idle).
 * The deadline holds until the body is in too: a body sent a byte at a time
 * is the same attack. */
struct hconn {
    struct MHD_Connection *conn;
    int fd;
    bool over;        /* opened past --max-connections: every request gets 503 */
    bool in_request;  /* its request (head and body) is in: no deadline */
    bool cut;         /* shut down for missing its deadline */
    bool watched;     /* its socket is in the loop's epoll set (peer hang-ups) */
    bool gone;        /* the peer hung up or half-closed */
    struct hreq *run; /* its request whose run is in flight (cancel when it goes) */
    uint64_t deadline;
    struct hconn *prev, *next;
};

static struct hconn *conns_;                     /* every open connection */
static struct hconn conn_nomem = {.over = true}; /* out of memory: answered 503 */

/* conn's state (&conn_nomem when it could not be allocated; NULL only if
 * libmicrohttpd has none) */
static struct hconn *conn_state(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* a generation request: its JSON, parsed request, run and SSE buffer */
struct gen {
    kvr_json_doc_t *doc;
    struct fe_req req;
    struct fe_run *run;
    struct fe_buf buf;
    size_t off;
    bool end;
};

struct hreq {
    enum fe_endpoint ep;
    uint64_t t0;
    struct fe_buf body;
    bool responded;
    bool too_big; /* the body passed --max-body: it is discarded, then 413 */
    uint64_t discarded;
    unsigned status;
    struct MHD_Connection *conn;
    struct hconn *hc; /* its connection's state (set while its run is in flight) */
    bool suspended;
    struct gen *gen;          /* a generation (freed with the request) */
    struct hreq *prev, *next; /* the requests with a run (deadlines) */
    atomic_bool ready_done;   /* /ready: the probe thread finished */
    bool ready_started;
    unsigned ready_status;
    struct fe_buf ready_body;
};

static struct hreq *active_;      /* requests with a run */
static bool resumed_;             /* a connection was resumed: libmicrohttpd has work */
static atomic_bool ready_resumed; /* a /ready probe thread resumed its connection */

static void active_add(struct hreq *h)
{
    h->prev = NULL;
    h->next = active_;
    if (active_)
        active_->prev = h;
    active_ = h;
}

static void active_del(struct hreq *h)
{
    if (h->prev)
        h->prev->next = h->next;
    else if (active_ == h)
        active_ = h->next;
    if (h->next)
        h->next->prev = h->prev;
    h->prev = h->next = NULL;
}

static void suspend(struct hreq *h)
{
    if (h->suspended || stopping)
        return;
    MHD_suspend_connection(h->conn);
    h->suspended = true;
}

/* Resumes h's connection (a run has something for it). */
static void wake(void *arg)
{
    struct hreq *h = arg;
    if (!h->suspended)
        return;
    h->suspended = false;
    resumed_ = true;
    MHD_resume_connection(h->conn);
}

static void gen_free(struct gen *g)
{
    if (!g)
        return;
    fe_run_free(g->run);
    fe_req_free(&g->req);
    kvr_json_free(g->doc);
    fe_buf_free(&g->buf);
    free(g);
}

unsigned fe_http_status(kvr_status_t st)
{
    switch (st) {
    case KVR_OK:
        return 200;
    case KVR_ERR_INVALID:
    case KVR_ERR_OUT_OF_RANGE:
    case KVR_ERR_UNSUPPORTED:
        return 400;
    case KVR_ERR_NOT_FOUND:
        return 404;
    case KVR_ERR_OVERLOAD:
    case KVR_ERR_NO_RESOURCE:
    case KVR_ERR_BUSY:
    case KVR_ERR_PEER_FAILURE:
        return 503;
    case KVR_ERR_TIMEOUT:
        return 504;
    case KVR_ERR_CANCELED:
        return 499;
    default:
        return 500;
    }
}

static const char *error_type(unsigned status)
{
    switch (status) {
    case 400:
    case 404:
    case 405:
    case 413:
    case 415:
        return "invalid_request_error";
    case 429:
        return "rate_limit_error";
    case 501:
        return "not_implemented_error";
    case 503:
        return "overloaded_error";
    case 504:
        return "timeout_error";
    default:
        return "server_error";
    }
}

void fe_error_json(struct fe_buf *b, unsigned status, const char *param, const char *msg)
{
    fe_buf_puts(b, "{\"error\":{\"message\":");
    fe_buf_json_str(b, msg, strlen(msg));
    fe_buf_printf(b, ",\"type\":\"%s\",\"param\":", error_type(status));
    if (param && param[0])
        fe_buf_json_str(b, param, strlen(param));
    else
        fe_buf_puts(b, "null");
    fe_buf_printf(b, ",\"code\":%s}}", status == 404 ? "\"model_not_found\"" : "null");
}

static enum MHD_Result send_buf(struct MHD_Connection *conn, struct hreq *h, unsigned status,
                                const char *ctype, struct fe_buf *b, bool close_conn)
{
    if (b->oom) {
        fe_buf_free(b);
        fe_error_json(b, 500, "", "out of memory building the response");
        status = 500;
        ctype = "application/json";
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(b->len, b->p ? b->p : (char *)"", MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 503 || status == 429)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
                                h->ep == FE_EP_COMPLETIONS || h->ep == FE_EP_CHAT ? "POST" : "GET");
    if (close_conn)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    h->responded = true;
    h->status = status;
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *conn, struct hreq *h, unsigned status,
                                  const char *param, const char *msg)
{
    struct fe_buf b = {0};
    fe_error_json(&b, status, param, msg);
    bool close_conn = status == 413 || status == 503;
    if (status == 400 || status == 413 || status == 415)
        fe_metrics_bad_http();
    enum MHD_Result r = send_buf(conn, h, status, "application/json", &b, close_conn);
    fe_buf_free(&b);
    return r;
}

static enum fe_endpoint classify(const char *url)
{
    if (!strcmp(url, "/v1/completions"))
        return FE_EP_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions"))
        return FE_EP_CHAT;
    if (!strcmp(url, "/v1/models"))
        return FE_EP_MODELS;
    if (!strcmp(url, "/health"))
        return FE_EP_HEALTH;
    if (!strcmp(url, "/ready"))
        return FE_EP_READY;
    if (!strcmp(url, "/metrics"))
        return FE_EP_METRICS;
    return FE_EP_OTHER;
}

static int conn_fd(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static enum MHD_Result serve_models(struct MHD_Connection *conn, struct hreq *h)
{
    struct fe_buf b = {0};
    fe_buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    fe_buf_json_str(&b, fe_cfg.model_name, strlen(fe_cfg.model_name));
    fe_buf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"kvrail\"", started_at);
    if (fe_cfg.context_len)
        fe_buf_printf(&b, ",\"max_model_len\":%u,\"context_length\":%u", fe_cfg.context_len,
                      fe_cfg.context_len);
    fe_buf_puts(&b, "}]}");
    enum MHD_Result r = send_buf(conn, h, 200, "application/json", &b, false);
    fe_buf_free(&b);
    return r;
}

/* /ready's probe, on its own thread: a STATUS call on a pooled client. */
static void ready_probe(struct hreq *h)
{
    struct fe_buf *b = &h->ready_body;
    char m[600] = "out of memory";
    kvr_client_t *c = fe_client_get(m, sizeof(m));
    struct kvr_cluster_status *st = calloc(1, sizeof(*st));
    kvr_status_t s = c && st ? kvr_client_status(c, 2000, st) : KVR_ERR_IO;
    unsigned status = 503;
    if (s != KVR_OK) {
        fe_buf_puts(b, "{\"ready\":false,\"reason\":");
        if (c)
            snprintf(m, sizeof(m), "the router at %s does not answer STATUS: %s", fe_cfg.router,
                     kvr_client_error(c));
        fe_buf_json_str(b, m, strlen(m));
        fe_buf_puts(b, "}");
    } else {
        unsigned np = 0, nd = 0;
        for (size_t i = 0; i < st->n_nodes; i++) {
            np += st->nodes[i].alive && !strcmp(st->nodes[i].role, "prefill");
            nd += st->nodes[i].alive && !strcmp(st->nodes[i].role, "decode");
        }
        /* a live decode node is a decode path and, prefilling locally, a prefill path */
        bool ready = nd > 0;
        status = ready ? 200 : 503;
        fe_buf_printf(b, "{\"ready\":%s,\"prefill_nodes_alive\":%u,\"decode_nodes_alive\":%u",
                      ready ? "true" : "false", np, nd);
        if (!ready)
            fe_buf_puts(b, ",\"reason\":\"the router reports no live decode node\"");
        fe_buf_puts(b, "}");
    }
    free(st);
    fe_client_put(c, s == KVR_OK);
    h->ready_status = status;
}

static void *ready_thread(void *arg)
{
    struct hreq *h = arg;
    ready_probe(h);
    atomic_store(&h->ready_done, true);
    /* thread-safe; the loop runs libmicrohttpd on its next turn (at most a tick away: in
     * external epoll mode libmicrohttpd has no channel to wake it) */
    MHD_resume_connection(h->conn);
    atomic_store(&ready_resumed, true);
    atomic_fetch_sub(&ready_threads, 1);
    return NULL;
}

static enum MHD_Result serve_ready(struct MHD_Connection *conn, struct hreq *h)
{
    if (h->ready_started) {
        if (!atomic_load(&h->ready_done)) {
            MHD_suspend_connection(conn); /* resumed by the probe thread */
            return MHD_YES;
        }
        return send_buf(conn, h, h->ready_status, "application/json", &h->ready_body, false);
    }
    if (atomic_fetch_add(&ready_threads, 1) >= READY_THREADS || stopping) {
        atomic_fetch_sub(&ready_threads, 1);
        return send_error(conn, h, 503, "", "too many /ready probes at once; retry");
    }
    h->ready_started = true;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 256 * 1024);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay with the loop */
    MHD_suspend_connection(conn);
    pthread_t t;
    int e = pthread_create(&t, &a, ready_thread, h);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    if (e != 0) {
        atomic_fetch_sub(&ready_threads, 1);
        h->ready_status = 503;
        fe_error_json(&h->ready_body, 503, "", "cannot start the /ready probe thread");
        atomic_store(&h->ready_done, true);
        MHD_resume_connection(conn);
    }
    return MHD_YES;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct hreq *h = cls;
    struct gen *g = h->gen;
    (void)pos;
    while (g->off == g->buf.len) {
        if (g->end)
            return MHD_CONTENT_READER_END_OF_STREAM;
        g->buf.len = 0;
        g->off = 0;
        kvr_status_t st = fe_run_next_sse(g->run, &g->buf);
        if (st == KVR_ERR_CANCELED || g->buf.oom || (st == KVR_INPROGRESS && stopping))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st == KVR_ERR_CLOSED)
            g->end = true;
        if (st == KVR_INPROGRESS) {
            suspend(h); /* resumed when the run has more */
            return 0;
        }
    }
    size_t n = g->buf.len - g->off;
    if (n > max)
        n = max;
    memcpy(out, g->buf.p + g->off, n);
    g->off += n;
    return (ssize_t)n;
}

/* Parses the body and starts the run; the connection waits suspended. */
static enum MHD_Result start_completions(struct MHD_Connection *conn, struct hreq *h)
{
    char err[512], param[64] = "", msg[700];
    kvr_json_doc_t *doc = NULL;
    uint64_t t_body = kvr_now_ns();
    if (h->body.oom)
        return send_error(conn, h, 500, "", "out of memory reading the request body");
    if (kvr_json_parse(h->body.p ? h->body.p : "", h->body.len, &doc, err, sizeof(err)) != KVR_OK) {
        snprintf(msg, sizeof(msg), "the request body is not valid JSON: %s", err);
        return send_error(conn, h, 400, "", msg);
    }
    struct gen *g = calloc(1, sizeof(*g));
    if (!g) {
        kvr_json_free(doc);
        return send_error(conn, h, 500, "", "out of memory");
    }
    g->doc = doc;
    h->gen = g;
    fe_buf_free(&h->body);
    unsigned status = 400;
    kvr_status_t st = fe_req_parse(kvr_json_root(doc), h->ep == FE_EP_CHAT, &g->req, &status, param,
                                   sizeof(param), msg, sizeof(msg));
    if (st != KVR_OK)
        return send_error(conn, h, status, param, msg);
    if (stopping)
        return send_error(conn, h, 503, "", "the frontend is stopping");
    /* the router quiet for a while: a PING goes out with the request, so a
     * router that answers is told from one that does not within FE_PING_MS */
    uint64_t now = kvr_now_ns();
    if (now - kvr_client_last_rx_ns(router_) > 1000000000u && now - last_ping_ns > 500000000u) {
        kvr_client_ping_send(router_);
        last_ping_ns = now;
    }
    st = fe_run_start(&g->req, router_, h->t0, wake, h, &g->run, &status, msg, sizeof(msg));
    if (st != KVR_OK)
        return send_error(conn, h, status, "", msg);
    fe_metrics_to_router(kvr_now_ns() - t_body);
    active_add(h);
    h->hc = conn_state(conn);
    if (h->hc && h->hc != &conn_nomem)
        h->hc->run = h;
    suspend(h);
    if (h->hc && h->hc->gone) { /* it hung up or half-closed before the run started */
        fe_run_cancel(g->run);
        wake(h);
    }
    return MHD_YES;
}

/* The run has news (or not yet): answer, or wait on. */
static enum MHD_Result continue_completions(struct MHD_Connection *conn, struct hreq *h)
{
    struct gen *g = h->gen;
    char msg[700];
    unsigned status = 500;
    kvr_status_t st = fe_run_first(g->run, &status, msg, sizeof(msg));
    if (st == KVR_INPROGRESS && !stopping) {
        suspend(h);
        return MHD_YES;
    }
    if (st == KVR_INPROGRESS)
        return send_error(conn, h, 503, "", "the frontend is stopping");
    if (st != KVR_OK)
        return send_error(conn, h, status, "", msg);
    if (!g->req.stream) {
        struct fe_buf b = {0};
        st = fe_run_finish_json(g->run, &b, &status, msg, sizeof(msg));
        if (st == KVR_INPROGRESS && !stopping) {
            suspend(h);
            return MHD_YES;
        }
        enum MHD_Result ret = st == KVR_OK ? send_buf(conn, h, 200, "application/json", &b, false)
                              : st == KVR_INPROGRESS
                                  ? send_error(conn, h, 503, "", "the frontend is stopping")
                                  : send_error(conn, h, status, "", msg);
        fe_buf_free(&b);
        return ret;
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, h, NULL);
    if (!r)
        return send_error(conn, h, 500, "", "cannot create the streamed response");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    fe_run_set_streaming(g->run);
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    h->responded = true;
    h->status = 200;
    return ret;
}

static enum MHD_Result serve_completions(struct MHD_Connection *conn, struct hreq *h)
{
    return h->gen ? continue_completions(conn, h) : start_completions(conn, h);
}

static bool is_json(const char *ct)
{
    if (!ct)
        return false;
    while (*ct == ' ')
        ct++;
    size_t n = strlen("application/json");
    return !strncasecmp(ct, "application/json", n) && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    struct hreq *h = *req_cls;
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    if (!h) {
        h = calloc(1, sizeof(*h));
        if (!h)
            return MHD_NO;
        h->t0 = kvr_now_ns();
        h->ep = classify(url);
        h->conn = conn;
        *req_cls = h;
        fe_metrics_inflight(1);
        struct hconn *hc = conn_state(conn);
        if (!hc || hc->over) {
            char m[200];
            snprintf(m, sizeof(m),
                     "the frontend is at its bound of %u connections (--max-connections); retry "
                     "later or on another frontend",
                     fe_cfg.max_connections);
            fe_metrics_connection(0, true);
            return send_error(conn, h, 503, "", m);
        }
        if (!hc->watched) /* logged when it opened */
            return send_error(conn, h, 503, "",
                              "the frontend cannot watch this connection for hang-ups "
                              "(epoll_ctl failed: see its log); retry");
        bool gen = h->ep == FE_EP_COMPLETIONS || h->ep == FE_EP_CHAT;
        if (h->ep == FE_EP_OTHER) {
            char m[400];
            snprintf(m, sizeof(m),
                     "no such endpoint: %.200s (POST /v1/completions, POST /v1/chat/completions, "
                     "GET /v1/models, /health, /ready, /metrics)",
                     url);
            return send_error(conn, h, 404, "", m);
        }
        if (gen != post || (!post && strcmp(method, MHD_HTTP_METHOD_GET) &&
                            strcmp(method, MHD_HTTP_METHOD_HEAD))) {
            char m[200];
            snprintf(m, sizeof(m), "%.20s is not allowed on %s; use %s", method, url,
                     gen ? "POST" : "GET");
            return send_error(conn, h, 405, "", m);
        }
        if (post) {
            const char *ct =
                MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
            if (!is_json(ct)) {
                char m[300];
                snprintf(m, sizeof(m), "Content-Type must be application/json, not %.100s",
                         ct ? ct : "(none)");
                return send_error(conn, h, 415, "", m);
            }
            const char *cl =
                MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > fe_cfg.max_body) {
                char m[200];
                snprintf(m, sizeof(m),
                         "the body is %.30s bytes; this server takes at most %zu "
                         "(--max-body)",
                         cl, fe_cfg.max_body);
                return send_error(conn, h, 413, "", m);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (h->responded)
            return MHD_YES; /* the answer is out; the rest of the body is discarded */
        if (h->too_big || h->body.len + n > fe_cfg.max_body) {
            /* an answer can only be queued once the body is in: discard the rest,
             * up to 8 times the limit; a body larger still loses its connection */
            h->too_big = true;
            h->discarded += n;
            fe_buf_free(&h->body);
            if (h->discarded > 8 * (uint64_t)fe_cfg.max_body) {
                KVR_LOG_WARN(FE_COMP, "a chunked body over 8 x --max-body (%zu): connection closed",
                             fe_cfg.max_body);
                fe_metrics_bad_http();
                return MHD_NO;
            }
            return MHD_YES;
        }
        fe_buf_put(&h->body, upload_data, n);
        return MHD_YES;
    }
    /* the request is all in (head and body): its deadline is met */
    struct hconn *hc = conn_state(conn);
    if (hc && hc != &conn_nomem)
        hc->in_request = true;
    if (h->responded)
        return MHD_YES;
    if (h->too_big) {
        char m[200];
        snprintf(m, sizeof(m), "the body is over %zu bytes (--max-body)", fe_cfg.max_body);
        return send_error(conn, h, 413, "", m);
    }
    switch (h->ep) {
    case FE_EP_HEALTH: {
        struct fe_buf b = {0};
        fe_buf_puts(&b, "{\"status\":\"ok\"}");
        enum MHD_Result r = send_buf(conn, h, 200, "application/json", &b, false);
        fe_buf_free(&b);
        return r;
    }
    case FE_EP_READY:
        return serve_ready(conn, h);
    case FE_EP_MODELS:
        return serve_models(conn, h);
    case FE_EP_METRICS: {
        struct fe_buf b = {0};
        fe_metrics_render(&b);
        enum MHD_Result r =
            send_buf(conn, h, 200, "text/plain; version=0.0.4; charset=utf-8", &b, false);
        fe_buf_free(&b);
        return r;
    }
    case FE_EP_CHAT:
        if (!fe_cfg.have_chat)
            return send_error(conn, h, 501, "messages", fe_chat_unavailable());
        /* fall through */
    case FE_EP_COMPLETIONS:
        return serve_completions(conn, h);
    default:
        return send_error(conn, h, 404, "", "no such endpoint");
    }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct hreq *h = *req_cls;
    if (!h)
        return;
    struct hconn *hc = conn_state(conn);
    if (hc && hc != &conn_nomem) { /* its next request: a new deadline */
        hc->in_request = false;
        hc->deadline = kvr_now_ns() +
                       (uint64_t)(fe_cfg.idle_timeout_s + fe_cfg.header_timeout_s) * 1000000000u;
    }
    unsigned status = h->responded ? h->status : 499;
    if (h->responded && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && status == 200)
        status = 499; /* the client left mid-answer */
    fe_metrics_request_done(h->ep, status, kvr_now_ns() - h->t0);
    fe_metrics_inflight(-1);
    if (h->hc && h->hc != &conn_nomem && h->hc->run == h)
        h->hc->run = NULL;
    if (h->gen && h->gen->run)
        active_del(h);
    gen_free(h->gen);
    fe_buf_free(&h->body);
    fe_buf_free(&h->ready_body);
    free(h);
    *req_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        int n = atomic_fetch_add(&n_conns, 1) + 1;
        struct hconn *hc = calloc(1, sizeof(*hc));
        if (hc) {
            hc->conn = conn;
            hc->fd = conn_fd(conn);
            hc->over = n > (int)fe_cfg.max_connections;
            hc->deadline = kvr_now_ns() + (uint64_t)fe_cfg.header_timeout_s * 1000000000u;
            /* its socket in the loop's set for the peer leaving, once for the connection's
             * life (edge-triggered: one event per hang-up; the kernel drops it at close):
             * libmicrohttpd does not watch a suspended connection, and a request waits
             * suspended */
            struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLET, .data.ptr = hc};
            hc->watched = hc->fd >= 0 && epoll_ctl(epfd_, EPOLL_CTL_ADD, hc->fd, &ev) == 0;
            if (!hc->watched)
                KVR_LOG_WARN(FE_COMP,
                             "cannot watch a new connection for hang-ups (epoll_ctl: %s): its "
                             "requests are answered 503",
                             strerror(errno));
            hc->next = conns_;
            if (conns_)
                conns_->prev = hc;
            conns_ = hc;
        }
        *socket_context = hc ? hc : &conn_nomem;
        fe_metrics_connection(1, false);
    } else {
        struct hconn *hc = *socket_context;
        if (hc && hc != &conn_nomem) {
            if (hc->watched) /* its socket is still open here: no event for a freed hc */
                epoll_ctl(epfd_, EPOLL_CTL_DEL, hc->fd, NULL);
            if (hc->prev)
                hc->prev->next = hc->next;
            else
                conns_ = hc->next;
            if (hc->next)
                hc->next->prev = hc->prev;
            free(hc);
        }
        *socket_context = NULL;
        atomic_fetch_sub(&n_conns, 1);
        fe_metrics_connection(-1, false);
    }
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char m[512];
    vsnprintf(m, sizeof(m), fmt, ap);
    size_t n = strlen(m);
    while (n && (m[n - 1] == '\n' || m[n - 1] == '\r'))
        m[--n] = 0;
    KVR_LOG_DEBUG(FE_COMP, "libmicrohttpd: %s", m);
}

kvr_status_t fe_http_start(void)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", fe_cfg.port);
    int e = getaddrinfo(fe_cfg.listen_host[0] ? fe_cfg.listen_host : NULL, port, &hints, &ai);
    if (e != 0) {
        KVR_LOG_ERROR(FE_COMP, "cannot resolve the listen address %s: %s", fe_cfg.listen_host,
                      gai_strerror(e));
        return KVR_ERR_INVALID;
    }
    started_at = (long long)time(NULL);
    /* the request loop's link (--router-link): the direct one (auto) wakes
     * this thread itself, no ZeroMQ I/O thread between; both links take
     * CURVE keys from the environment */
    bool curve = getenv("KVRAIL_ROUTER_KEY") || getenv("KVRAIL_CLIENT_KEY");
    kvr_status_t cst = fe_cfg.router_zmq ? kvr_client_connect(fe_cfg.router, &router_)
                                         : kvr_client_connect_direct(fe_cfg.router, &router_);
    if (cst != KVR_OK) {
        KVR_LOG_ERROR(FE_COMP, "cannot create a client of the router at %s: %s", fe_cfg.router,
                      kvr_status_str(cst));
        freeaddrinfo(ai);
        return cst;
    }
    KVR_LOG_INFO(FE_COMP, "router link: %s%s",
                 !fe_cfg.router_zmq ? "direct (ZMTP 3.1 on the loop's own socket)"
                                    : "zmq (libzmq DEALER, --router-link zmq)",
                 curve ? ", CURVE" : ", NULL (no CURVE keys)");
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) {
        KVR_LOG_ERROR(FE_COMP, "epoll_create1: %s", strerror(errno));
        freeaddrinfo(ai);
        return KVR_ERR_IO;
    }
    /* external epoll mode: fe_http_serve's loop runs libmicrohttpd */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TURBO;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    unsigned hard_limit = fe_cfg.max_connections + fe_cfg.max_connections / 4 + 8;
    daemon_ = MHD_start_daemon(
        flags, (uint16_t)fe_cfg.port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR,
        ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, hard_limit, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)fe_cfg.idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)65536, MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
        NULL, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!daemon_) {
        KVR_LOG_ERROR(FE_COMP, "cannot listen on %s:%d (address in use or not local?)",
                      fe_cfg.listen_host, fe_cfg.port);
        return KVR_ERR_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_EPOLL_FD);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (!di || epoll_ctl(epfd_, EPOLL_CTL_ADD, di->epoll_fd, &ev) != 0) {
        KVR_LOG_ERROR(FE_COMP, "cannot watch libmicrohttpd's epoll descriptor: %s",
                      strerror(errno));
        return KVR_ERR_IO;
    }
    int zfds[2];
    size_t nz = kvr_client_fds(router_, zfds, 2);
    for (size_t i = 0; i < nz; i++) {
        struct epoll_event zev = {.events = EPOLLIN, .data.ptr = &zmq_tag[i]};
        if (epoll_ctl(epfd_, EPOLL_CTL_ADD, zfds[i], &zev) != 0) {
            KVR_LOG_ERROR(FE_COMP, "cannot watch the router client's descriptor: %s",
                          strerror(errno));
            return KVR_ERR_IO;
        }
    }
    if (nz == 0) {
        KVR_LOG_ERROR(FE_COMP, "the router client has no descriptor to wait on");
        return KVR_ERR_IO;
    }
    if (fe_cfg.busy_poll_us)
        KVR_LOG_INFO(FE_COMP,
                     "--busy-poll-us %u: the loop looks for work without sleeping for up to "
                     "%u us after a busy turn",
                     fe_cfg.busy_poll_us, fe_cfg.busy_poll_us);
    KVR_LOG_INFO(FE_COMP,
                 "listening on http://%s:%d (router %s, model '%s', context %u, at most "
                 "%u connections)",
                 fe_cfg.listen_host, fe_cfg.port, fe_cfg.router, fe_cfg.model_name,
                 fe_cfg.context_len, fe_cfg.max_connections);
    return KVR_OK;
}

/* Deadlines of every running request (a tenth of a second apart). */
static void tick(uint64_t now)
{
    for (struct hreq *h = active_, *nx; h; h = nx) {
        nx = h->next;
        if (fe_run_tick(h->gen->run, now))
            wake(h);
    }
    /* connections whose request (head and body) is late: shut down, so libmicrohttpd
     * reads the end and closes them (a timeout of 1 s as well, should it not) */
    unsigned cut = 0;
    for (struct hconn *hc = conns_; hc; hc = hc->next) {
        if (hc->in_request || hc->cut || now < hc->deadline)
            continue;
        hc->cut = true;
        cut++;
        if (hc->fd >= 0)
            shutdown(hc->fd, SHUT_RDWR);
        MHD_set_connection_option(hc->conn, MHD_CONNECTION_OPTION_TIMEOUT, 1u);
        fe_metrics_bad_http();
    }
    if (cut)
        KVR_LOG_WARN(FE_COMP,
                     "%u connection(s) closed: request (head and body) not complete within "
                     "%d s (--header-timeout-s)",
                     cut, fe_cfg.header_timeout_s);
}

/* Runs libmicrohttpd, and again at once (up to twice more) while it has work
 * left that needs no waiting: a streamed answer's first event is read only
 * after its headers are written, and the closing chunk only after the last
 * event, each one run later. */
static void run_mhd(void)
{
    for (int i = 0; i < 3; i++) {
        resumed_ = false;
        MHD_run(daemon_);
        MHD_UNSIGNED_LONG_LONG mt;
        if (!resumed_ && (MHD_get_timeout(daemon_, &mt) != MHD_YES || mt > 0))
            break;
    }
}

void fe_http_serve(volatile sig_atomic_t *stop)
{
    uint64_t next_tick = 0, mhd_at = 0;
    unsigned again = KVR_CLIENT_POLL_SOCKET | KVR_CLIENT_POLL_MONITOR; /* look before sleeping */
    bool worked = false; /* the last turn handled something (--busy-poll-us) */
    const uint64_t busy_ns = (uint64_t)fe_cfg.busy_poll_us * 1000u;
    while (!*stop) {
        int timeout = 1000;
        MHD_UNSIGNED_LONG_LONG mt;
        uint64_t now = kvr_now_ns();
        if (MHD_get_timeout(daemon_, &mt) == MHD_YES && mt < (MHD_UNSIGNED_LONG_LONG)timeout)
            timeout = (int)mt;
        mhd_at = now + (uint64_t)timeout * 1000000u; /* libmicrohttpd's next timeout, if any */
        if (resumed_) /* resumed by the tick: run libmicrohttpd without waiting */
            timeout = 0;
        if (active_ || conns_) {
            int to_tick = now >= next_tick ? 0 : (int)((next_tick - now) / 1000000u);
            if (to_tick < timeout)
                timeout = to_tick;
        }
        struct epoll_event ev[64];
        int n;
        if (!again && busy_ns && worked && active_) {
            /* --busy-poll-us: look without sleeping for a while after a busy turn while
             * requests run (their next frame then finds this thread running, not a CPU
             * to wake), yielding to whatever else is runnable on this CPU between looks;
             * with no request running the loop sleeps at once */
            uint64_t end = now + busy_ns;
            while ((n = epoll_wait(epfd_, ev, 64, 0)) == 0 && kvr_now_ns() < end)
                sched_yield();
            if (n == 0)
                n = epoll_wait(epfd_, ev, 64, timeout);
        } else {
            n = epoll_wait(epfd_, ev, 64, again ? 0 : timeout);
        }
        unsigned what = again;
        bool mhd_due = false;
        for (int i = 0; i < n; i++) {
            void *p = ev[i].data.ptr;
            if (!p) {
                mhd_due = true; /* libmicrohttpd's descriptor */
                continue;
            }
            if (p == (void *)&zmq_tag[0]) {
                what |= KVR_CLIENT_POLL_SOCKET;
                continue;
            }
            if (p == (void *)&zmq_tag[1]) {
                what |= KVR_CLIENT_POLL_MONITOR;
                continue;
            }
            /* a connection's peer left (or half-closed): its running request is canceled */
            struct hconn *hc = p;
            hc->gone = true;
            if (hc->run) {
                fe_run_cancel(hc->run->gen->run);
                wake(hc->run);
            }
        }
        kvr_client_poll(router_, what);
        for (kvr_gen_stream_t *s; (s = kvr_client_next_ready(router_));)
            fe_run_on_stream(s);
        now = kvr_now_ns();
        bool tick_due = now >= next_tick;
        /* libmicrohttpd runs when it has something to do: its descriptor, a resumed
         * connection, its timeout, a tick (not on a turn that only took frames) */
        if (mhd_due || resumed_ || now >= mhd_at || tick_due ||
            atomic_exchange(&ready_resumed, false))
            run_mhd();
        if (tick_due) {
            now = kvr_now_ns(); /* after the requests run_mhd started (their t_sent) */
            tick(now);
            next_tick = now + (uint64_t)TICK_MS * 1000000u;
        }
        worked = n > 0 || what;
        /* ZeroMQ's rule for waiting on its descriptors: receive last (a send
         * above - a request, a cancel - may have taken a frame's wake-up) */
        again = kvr_client_poll(router_, 0) == KVR_OK ? KVR_CLIENT_POLL_SOCKET : 0;
    }
}

void fe_http_stop(void)
{
    if (!daemon_)
        return;
    /* every suspended connection is resumed and answered (or dropped)
     * before libmicrohttpd stops; /ready probes are waited for (2 s each) */
    stopping = true;
    for (struct hreq *h = active_; h; h = h->next)
        wake(h);
    for (int i = 0; i < 300 && atomic_load(&ready_threads) > 0; i++) {
        MHD_run(daemon_);
        usleep(10000);
    }
    MHD_run(daemon_);
    MHD_stop_daemon(daemon_);
    daemon_ = NULL;
    kvr_client_close(router_);
    router_ = NULL;
    if (epfd_ >= 0)
        close(epfd_);
    epfd_ = -1;
}
