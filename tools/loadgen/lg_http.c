/*
 * lg_http.c - kvrail-loadgen's OpenAI mode (see lg_http.h).
 *
 * A connection reads into one buffer; the response head is parsed once
 * (status, Content-Length or chunked), then the body is de-chunked into a
 * second buffer that is cut into SSE events at each blank line.  A 200
 * stream's events are parsed as JSON (kvr_json): choices[0].logprobs.
 * token_logprobs counts the tokens an event carries, usage gives the
 * totals, "data: [DONE]" ends it; any other status is an error whose JSON
 * message is handed on.  When the body has ended (the zero-length chunk, or
 * Content-Length bytes), the connection goes back to the idle pool unless
 * the server said Connection: close.
 */
#include "lg_http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvr_clock.h"
#include "kvr_json.h"
#include "kvr_status.h"

#define LG_LINE_MAX (1u << 20) /* one response head or SSE event at most */

struct conn {
    int fd;
    struct req *r; /* NULL: idle */
    bool head_done, chunked, close_after, need_crlf, body_done, done_seen, failed;
    int status;
    long content_left; /* not chunked: body bytes still to come */
    size_t chunk_left;
    char *in; /* raw bytes */
    size_t in_len, in_cap;
    char *body; /* de-chunked body */
    size_t body_len, body_cap;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
};

struct lg_http {
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char host[280]; /* HOST:PORT */
    char model[256];
    struct lg_http_sink sink;
    struct conn *c;
    int n_conns, max_conns;
};

static int put(char **p, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap : 4096);
        while (nc < *len + n + 1)
            nc *= 2;
        if (nc > 4 * LG_LINE_MAX)
            return -1;
        char *q = realloc(*p, nc);
        if (!q)
            return -1;
        *p = q;
        *cap = nc;
    }
    memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = 0;
    return 0;
}

static void consume(char *p, size_t *len, size_t n)
{
    memmove(p, p + n, *len - n);
    *len -= n;
    p[*len] = 0;
}

static int dial(const struct lg_http *h, char *err, size_t err_len)
{
    int fd = socket(h->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s (raise the fd limit: ulimit -n)", strerror(errno));
        return -1;
    }
    if (connect(fd, (const struct sockaddr *)&h->addr, h->addr_len) != 0) {
        snprintf(err, err_len, "cannot connect to %s: %s", h->host, strerror(errno));
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            if (poll(&pf, 1, 5000) <= 0)
                return -1;
            continue;
        }
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void conn_reset(struct conn *c)
{
    c->r = NULL;
    c->head_done = c->chunked = c->close_after = c->need_crlf = false;
    c->body_done = c->done_seen = c->failed = false;
    c->status = 0;
    c->content_left = -1;
    c->chunk_left = 0;
    c->in_len = c->body_len = 0;
    c->prompt_tokens = c->completion_tokens = c->cached_tokens = 0;
}

static void conn_close(struct conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    conn_reset(c);
}

/* The response head in c->in: status and framing.  0 done, 1 need more,
 * -1 malformed (msg set). */
static int parse_head(struct conn *c, char *msg, size_t msg_len)
{
    char *end = strstr(c->in, "\r\n\r\n");
    if (!end) {
        if (c->in_len > 65536) {
            snprintf(msg, msg_len, "response head over 64 KiB");
            return -1;
        }
        return 1;
    }
    *end = 0;
    if (strncmp(c->in, "HTTP/1.", 7) != 0 || sscanf(c->in + 8, " %d", &c->status) != 1) {
        snprintf(msg, msg_len, "not an HTTP response: %.60s", c->in);
        return -1;
    }
    for (char *l = strstr(c->in, "\r\n"); l; l = strstr(l, "\r\n")) {
        l += 2;
        if (!strncasecmp(l, "transfer-encoding:", 18) && strstr(l, "chunked"))
            c->chunked = true;
        else if (!strncasecmp(l, "content-length:", 15))
            c->content_left = atol(l + 15);
        else if (!strncasecmp(l, "connection:", 11) && strcasestr(l, "close"))
            c->close_after = true;
    }
    if (!c->chunked && c->content_left < 0)
        c->close_after = true; /* the body runs to the end of the connection */
    c->head_done = true;
    consume(c->in, &c->in_len, (size_t)(end + 4 - c->in));
    return 0;
}

/* De-chunks what c->in holds into c->body.  -1 malformed. */
static int dechunk(struct conn *c, char *msg, size_t msg_len)
{
    while (c->in_len && !c->body_done) {
        if (!c->chunked) {
            size_t n = c->in_len;
            if (c->content_left >= 0 && (long)n > c->content_left)
                n = (size_t)c->content_left;
            if (put(&c->body, &c->body_len, &c->body_cap, c->in, n) != 0)
                goto big;
            consume(c->in, &c->in_len, n);
            if (c->content_left >= 0) {
                c->content_left -= (long)n;
                if (c->content_left == 0)
                    c->body_done = true;
            }
            continue;
        }
        if (c->chunk_left) {
            size_t n = c->in_len < c->chunk_left ? c->in_len : c->chunk_left;
            if (put(&c->body, &c->body_len, &c->body_cap, c->in, n) != 0)
                goto big;
            consume(c->in, &c->in_len, n);
            c->chunk_left -= n;
            if (!c->chunk_left)
                c->need_crlf = true;
            continue;
        }
        char *eol = strstr(c->in, "\r\n");
        if (!eol)
            return c->in_len > 64 ? (snprintf(msg, msg_len, "bad chunk framing"), -1) : 0;
        if (c->need_crlf) {
            if (eol != c->in) {
                snprintf(msg, msg_len, "bad chunk framing (no CRLF after a chunk)");
                return -1;
            }
            consume(c->in, &c->in_len, 2);
            c->need_crlf = false;
            continue;
        }
        char *e;
        unsigned long sz = strtoul(c->in, &e, 16);
        if (e == c->in) {
            snprintf(msg, msg_len, "bad chunk size line: %.20s", c->in);
            return -1;
        }
        consume(c->in, &c->in_len, (size_t)(eol + 2 - c->in));
        if (sz == 0) {
            c->body_done = true; /* (trailers: none from the frontend; the final CRLF) */
            if (c->in_len >= 2 && c->in[0] == '\r' && c->in[1] == '\n')
                consume(c->in, &c->in_len, 2);
        } else {
            c->chunk_left = sz;
        }
    }
    return 0;
big:
    snprintf(msg, msg_len, "response larger than %u bytes", 4 * LG_LINE_MAX);
    return -1;
}

static int http_status_code(int st)
{
    if (st == 429 || st == 503)
        return KVR_ERR_OVERLOAD;
    if (st >= 400 && st < 500)
        return KVR_ERR_INVALID;
    return KVR_ERR_INTERNAL;
}

static void fail(struct lg_http *h, struct conn *c, int status, const char *msg)
{
    struct req *r = c->r;
    conn_close(c); /* a failed stream's connection is not reused */
    if (r)
        h->sink.end(r, status, msg, 0, 0, 0);
}

/* The SSE events complete in c->body. */
static void events(struct lg_http *h, struct conn *c, uint64_t now)
{
    char *ev;
    while (c->r && c->body && (ev = strstr(c->body, "\n\n"))) {
        size_t n = (size_t)(ev - c->body);
        c->body[n] = 0;
        if (!strncmp(c->body, "data: ", 6)) {
            const char *d = c->body + 6;
            if (!strcmp(d, "[DONE]")) {
                c->done_seen = true;
            } else {
                kvr_json_doc_t *doc = NULL;
                char err[200];
                if (kvr_json_parse(d, strlen(d), &doc, err, sizeof err) != KVR_OK) {
                    char m[300];
                    snprintf(m, sizeof m, "an SSE event is not JSON: %s", err);
                    fail(h, c, KVR_ERR_CORRUPT, m);
                    return;
                }
                const kvr_json_t *root = kvr_json_root(doc);
                const kvr_json_t *e = kvr_json_get(root, "error");
                const kvr_json_t *ch = kvr_json_get(root, "choices");
                const kvr_json_t *u = kvr_json_get(root, "usage");
                if (e) {
                    char m[300];
                    snprintf(m, sizeof m, "%s", kvr_json_get_str(e, "message", "error", NULL));
                    kvr_json_free(doc);
                    fail(h, c, KVR_ERR_INTERNAL, m);
                    return;
                }
                if (ch && ch->type == KVR_JSON_ARRAY && ch->n) {
                    const kvr_json_t *lp = kvr_json_get(ch->items[0], "logprobs");
                    const kvr_json_t *tl = lp ? kvr_json_get(lp, "token_logprobs") : NULL;
                    uint32_t k = tl && tl->type == KVR_JSON_ARRAY ? (uint32_t)tl->n : 0;
                    if (k)
                        h->sink.tokens(c->r, k, now);
                }
                if (u && u->type == KVR_JSON_OBJECT) {
                    c->prompt_tokens = (uint32_t)kvr_json_get_int(u, "prompt_tokens", 0, NULL);
                    c->completion_tokens =
                        (uint32_t)kvr_json_get_int(u, "completion_tokens", 0, NULL);
                    const kvr_json_t *pd = kvr_json_get(u, "prompt_tokens_details");
                    c->cached_tokens =
                        pd ? (uint32_t)kvr_json_get_int(pd, "cached_tokens", 0, NULL) : 0;
                }
                kvr_json_free(doc);
            }
        }
        consume(c->body, &c->body_len, n + 2);
    }
    if (c->r && c->body_len > LG_LINE_MAX)
        fail(h, c, KVR_ERR_CORRUPT, "an SSE event over 1 MiB");
}

static void on_readable(struct lg_http *h, struct conn *c)
{
    char buf[65536];
    uint64_t now = kvr_now_ns();
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            if (!c->r) {
                conn_close(c); /* an idle keep-alive connection the server closed */
                return;
            }
            if (c->head_done && !c->chunked && c->content_left < 0)
                c->body_done = true; /* the body ran to the end of the connection */
            else {
                char m[200];
                snprintf(m, sizeof m, "the server closed the connection mid-answer (%s)",
                         n < 0 ? strerror(errno) : "EOF");
                fail(h, c, KVR_ERR_IO, m);
                return;
            }
            c->close_after = true;
            break;
        }
        if (put(&c->in, &c->in_len, &c->in_cap, buf, (size_t)n) != 0) {
            fail(h, c, KVR_ERR_NO_MEMORY, "response too large");
            return;
        }
    }
    char msg[300];
    if (!c->head_done) {
        int s = parse_head(c, msg, sizeof msg);
        if (s < 0) {
            fail(h, c, KVR_ERR_CORRUPT, msg);
            return;
        }
        if (s > 0)
            return;
    }
    if (dechunk(c, msg, sizeof msg) != 0) {
        fail(h, c, KVR_ERR_CORRUPT, msg);
        return;
    }
    if (c->status == 200)
        events(h, c, now);
    if (!c->r || !c->body_done)
        return;
    struct req *r = c->r;
    if (c->status != 200) {
        kvr_json_doc_t *doc = NULL;
        char err[100], m[400];
        const char *em = NULL;
        if (kvr_json_parse(c->body, c->body_len, &doc, err, sizeof err) == KVR_OK)
            em = kvr_json_get_str(kvr_json_get(kvr_json_root(doc), "error"), "message", NULL, NULL);
        snprintf(m, sizeof m, "HTTP %d: %s", c->status, em ? em : "(no OpenAI error body)");
        kvr_json_free(doc);
        int st = http_status_code(c->status);
        bool keep = !c->close_after;
        c->r = NULL;
        if (!keep)
            conn_close(c);
        else
            conn_reset(c);
        h->sink.end(r, st, m, 0, 0, 0);
        return;
    }
    uint32_t pt = c->prompt_tokens, ct = c->completion_tokens, kt = c->cached_tokens;
    bool done = c->done_seen;
    if (c->close_after)
        conn_close(c);
    else
        conn_reset(c); /* idle, reusable */
    h->sink.end(r, done ? 0 : KVR_ERR_CORRUPT, done ? NULL : "the stream ended without [DONE]", pt,
                ct, kt);
}

/* Splits http://HOST:PORT[/v1] into host and port. */
static int parse_url(const char *url, char *host, size_t hcap, char *port, size_t pcap)
{
    if (strncmp(url, "http://", 7) != 0)
        return -1;
    const char *p = url + 7, *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    const char *colon = memchr(p, ':', n);
    if (!colon || colon == p || (size_t)(colon - p) >= hcap || n - (size_t)(colon - p) - 1 >= pcap)
        return -1;
    memcpy(host, p, (size_t)(colon - p));
    host[colon - p] = 0;
    memcpy(port, colon + 1, n - (size_t)(colon - p) - 1);
    port[n - (size_t)(colon - p) - 1] = 0;
    if (slash && strcmp(slash, "/") && strcmp(slash, "/v1") && strcmp(slash, "/v1/"))
        return -1;
    return 0;
}

/* GET /v1/models, synchronously (5 s): the first model's id. */
static int get_model(struct lg_http *h, char *err, size_t err_len)
{
    int fd = dial(h, err, err_len);
    if (fd < 0)
        return -1;
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET /v1/models HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", h->host);
    struct conn c = {.fd = fd};
    conn_reset(&c);
    int rc = -1;
    if (send_all(fd, req, (size_t)n) != 0) {
        snprintf(err, err_len, "cannot send to %s: %s", h->host, strerror(errno));
        goto out;
    }
    uint64_t deadline = kvr_now_ns() + 5000000000ull;
    char buf[8192], msg[300];
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)((deadline - kvr_now_ns()) / 1000000);
        if (kvr_now_ns() >= deadline || poll(&pf, 1, left) <= 0) {
            snprintf(err, err_len, "%s: no answer to GET /v1/models within 5 s", h->host);
            goto out;
        }
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r > 0 && put(&c.in, &c.in_len, &c.in_cap, buf, (size_t)r) != 0)
            goto out;
        if (!c.head_done && c.in_len) {
            int s = parse_head(&c, msg, sizeof msg);
            if (s < 0) {
                snprintf(err, err_len, "%s does not speak HTTP: %s", h->host, msg);
                goto out;
            }
        }
        if (c.head_done && dechunk(&c, msg, sizeof msg) != 0) {
            snprintf(err, err_len, "%s: %s", h->host, msg);
            goto out;
        }
        if (r <= 0 || c.body_done)
            break;
    }
    if (!c.head_done) {
        snprintf(err, err_len, "%s closed the connection without an HTTP answer", h->host);
        goto out;
    }
    if (c.status != 200) {
        snprintf(err, err_len,
                 "GET /v1/models on %s answered HTTP %d: not an OpenAI-compatible server (or "
                 "the wrong port)",
                 h->host, c.status);
        goto out;
    }
    kvr_json_doc_t *doc = NULL;
    if (!c.body || kvr_json_parse(c.body, c.body_len, &doc, msg, sizeof msg) != KVR_OK) {
        snprintf(err, err_len, "GET /v1/models on %s: the body is not JSON", h->host);
        goto out;
    }
    const kvr_json_t *data = kvr_json_get(kvr_json_root(doc), "data");
    const char *id = data && data->type == KVR_JSON_ARRAY && data->n
                         ? kvr_json_get_str(data->items[0], "id", NULL, NULL)
                         : NULL;
    if (id && !h->model[0])
        snprintf(h->model, sizeof h->model, "%s", id);
    kvr_json_free(doc);
    if (!h->model[0]) {
        snprintf(err, err_len, "GET /v1/models on %s lists no model (give --model-name)", h->host);
        goto out;
    }
    rc = 0;
out:
    close(fd);
    free(c.in);
    free(c.body);
    return rc;
}

struct lg_http *lg_http_open(const char *url, const char *model_in, int max_conns,
                             const struct lg_http_sink *sink, char *err, size_t err_len)
{
    char host[256], port[16];
    if (parse_url(url, host, sizeof host, port, sizeof port) != 0) {
        snprintf(err, err_len, "--openai '%s': want http://HOST:PORT (optionally /v1)", url);
        return NULL;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g != 0 || !ai) {
        snprintf(err, err_len, "--openai: cannot resolve %s:%s: %s", host, port, gai_strerror(g));
        return NULL;
    }
    struct lg_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    memcpy(&h->addr, ai->ai_addr, ai->ai_addrlen);
    h->addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    snprintf(h->host, sizeof h->host, "%s:%s", host, port);
    if (model_in)
        snprintf(h->model, sizeof h->model, "%s", model_in);
    h->sink = *sink;
    h->max_conns = max_conns > 0 ? max_conns : 1;
    h->c = calloc((size_t)h->max_conns, sizeof *h->c);
    if (!h->c) {
        free(h);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    for (int i = 0; i < h->max_conns; i++) {
        h->c[i].fd = -1;
        conn_reset(&h->c[i]);
    }
    if (get_model(h, err, err_len) != 0) {
        lg_http_close(h);
        return NULL;
    }
    return h;
}

void lg_http_close(struct lg_http *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->max_conns; i++) {
        conn_close(&h->c[i]);
        free(h->c[i].in);
        free(h->c[i].body);
    }
    free(h->c);
    free(h);
}

const char *lg_http_model(const struct lg_http *h)
{
    return h->model;
}

int lg_http_send(struct lg_http *h, struct req *r, int idx, const uint32_t *ids, uint32_t n_ids,
                 uint32_t max_tokens, const struct lg_sampling *sp, uint64_t seed, bool ignore_eos)
{
    (void)idx;
    struct conn *c = NULL;
    for (int i = 0; i < h->max_conns && !c; i++) /* an idle open one first */
        if (!h->c[i].r && h->c[i].fd >= 0)
            c = &h->c[i];
    for (int i = 0; i < h->max_conns && !c; i++)
        if (!h->c[i].r)
            c = &h->c[i];
    if (!c) {
        h->sink.end(r, KVR_ERR_NO_RESOURCE, "more requests in flight than connections", 0, 0, 0);
        return -1;
    }
    char err[300];
    char *body = NULL;
    size_t blen = 0, bcap = 0;
    char tmp[512];
    int n = snprintf(tmp, sizeof tmp, "{\"model\":\"%s\",\"prompt\":[", h->model);
    int rc = put(&body, &blen, &bcap, tmp, (size_t)n);
    for (uint32_t i = 0; i < n_ids && rc == 0; i++) {
        n = snprintf(tmp, sizeof tmp, "%s%u", i ? "," : "", ids[i]);
        rc = put(&body, &blen, &bcap, tmp, (size_t)n);
    }
    n = snprintf(tmp, sizeof tmp,
                 "],\"max_tokens\":%u,\"temperature\":%.9g,\"top_p\":%.9g,\"top_k\":%u,"
                 "\"min_p\":%.9g,\"repetition_penalty\":%.9g,\"presence_penalty\":%.9g,"
                 "\"frequency_penalty\":%.9g,\"seed\":%llu,\"ignore_eos\":%s,"
                 "\"logprobs\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                 max_tokens, sp->temperature, sp->top_p, sp->top_k, sp->min_p,
                 sp->repetition_penalty, sp->presence_penalty, sp->frequency_penalty,
                 (unsigned long long)seed, ignore_eos ? "true" : "false");
    if (rc == 0)
        rc = put(&body, &blen, &bcap, tmp, (size_t)n);
    char head[512];
    int hl =
        snprintf(head, sizeof head,
                 "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                 "application/json\r\nAccept: text/event-stream\r\nContent-Length: %zu\r\n\r\n",
                 h->host, blen);
    for (int attempt = 0; rc == 0 && attempt < 2; attempt++) {
        bool reused = c->fd >= 0;
        if (c->fd < 0 && (c->fd = dial(h, err, sizeof err)) < 0) {
            free(body);
            conn_reset(c);
            h->sink.end(r, KVR_ERR_IO, err, 0, 0, 0);
            return -1;
        }
        if (send_all(c->fd, head, (size_t)hl) == 0 && send_all(c->fd, body, blen) == 0) {
            free(body);
            conn_reset(c);
            c->r = r;
            return 0;
        }
        conn_close(c); /* a kept-alive connection the server had closed: once more, fresh */
        if (!reused)
            break;
    }
    free(body);
    h->sink.end(r, KVR_ERR_IO, rc ? "out of memory" : "cannot send the request", 0, 0, 0);
    return -1;
}

void lg_http_poll(struct lg_http *h, int timeout_ms)
{
    struct pollfd *pf = malloc((size_t)h->max_conns * sizeof *pf);
    int *at = malloc((size_t)h->max_conns * sizeof *at);
    if (!pf || !at) {
        free(pf);
        free(at);
        return;
    }
    int n = 0;
    for (int i = 0; i < h->max_conns; i++)
        if (h->c[i].fd >= 0) {
            pf[n].fd = h->c[i].fd;
            pf[n].events = POLLIN;
            at[n++] = i;
        }
    if (n && poll(pf, (nfds_t)n, timeout_ms) > 0) {
        for (int k = 0; k < n; k++)
            if (pf[k].revents)
                on_readable(h, &h->c[at[k]]);
    } else if (!n && timeout_ms > 0) {
        poll(NULL, 0, timeout_ms);
    }
    free(pf);
    free(at);
}

void lg_http_drop(struct lg_http *h, struct req *r)
{
    for (int i = 0; i < h->max_conns; i++)
        if (h->c[i].r == r)
            conn_close(&h->c[i]);
}
