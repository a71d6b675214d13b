/*
 * client.c - libkvrail-client (kvr_client.h).
 *
 * One DEALER socket per client.  Each call gets a fresh call id; frames that
 * arrive are routed by call id to the stream (or unary call) waiting for
 * them, so several streams can be open at once: frames of a stream not being
 * waited on are queued on that stream.  Every wait is zmq_poll with the time
 * left to its deadline.  A client made by kvr_client_connect_direct has no
 * DEALER: its router link is zmtp.c's (ZMTP spoken on its own TCP socket in
 * the caller's thread, CURVE when the environment gives keys, as for
 * kvr_client_connect), reached through link_send and pump_direct, and its
 * waits are poll(2) on the link's one descriptor.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_client.h"
#include "kvr_proto.h"
#include "zmtp.h"

struct qframe {
    struct qframe *next;
    kvr_proto_frame_t f;
};

struct kvr_gen_stream {
    kvr_client_t *c;
    uint64_t call_id;
    bool ended;
    bool cancel_sent;
    /* the router's last frame of the stream (END or ERROR) is queued, or the
     * queue overflowed: nothing after it is queued */
    bool end_queued;
    bool overflowed;     /* frames were dropped: the stream ends with an error */
    size_t queued_bytes; /* what the queue holds (frames, payloads) */
    struct qframe *head, *tail;
    struct kvr_gen_result res;
    Kvrail__GenerateChunk *cur;   /* the chunk the last token points into */
    kvr_gen_stream_t *next;       /* client's list of open streams */
    kvr_gen_stream_t *ready_next; /* client's ready list (kvr_client_next_ready) */
    bool in_ready;
    void *user; /* kvr_gen_stream_set_user */
};

struct kvr_client {
    void *zctx;
    bool own_ctx; /* zctx is this client's (kvr_client_connect) */
    void *sock;
    void *mon;       /* PAIR: the socket monitor (connected / disconnected) */
    kvr_zmtp_t *zl;  /* the direct link (kvr_client_connect_direct), instead of sock */
    bool connected;  /* a connection to the router is up */
    uint64_t lost;   /* connections to the router lost so far */
    bool reply_lost; /* the pending unary call's connection was lost */
    uint64_t next_call;
    kvr_gen_stream_t *streams;
    /* streams with frames queued (or ended) since kvr_client_next_ready last
     * returned them, oldest first */
    kvr_gen_stream_t *ready_head, *ready_tail;
    uint64_t last_rx_ns; /* when the last frame from the router arrived */
    bool sent;           /* a send since the last receive that found nothing */
    /* a pending unary reply */
    uint64_t want_call;
    bool have_reply;
    kvr_proto_frame_t reply;
    char err[512];
    /* the last status's nodes (kvr_cluster_status.nodes), the caller's
     * element size apart */
    void *nodes;
    size_t nodes_cap; /* bytes */
};

static void set_err(kvr_client_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_err(kvr_client_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* Whether a field lies within the caller's size bytes of a struct. */
#define HAS_FIELD(size, type, field) ((size) >= offsetof(type, field) + sizeof(((type *)0)->field))

void kvr_gen_params_init(struct kvr_gen_params *p, size_t size)
{
    struct kvr_gen_params d;
    memset(&d, 0, sizeof(d));
    d.max_tokens = 16;
    d.top_p = 1.0f;
    d.repetition_penalty = 1.0f;
    if (size > sizeof(d)) { /* a caller built against a later header: its extra fields zeroed */
        memset((char *)p + sizeof(d), 0, size - sizeof(d));
        size = sizeof(d);
    }
    memcpy(p, &d, size);
    if (HAS_FIELD(size, struct kvr_gen_params, size))
        p->size = size;
}

/* The caller's params (p->size bytes) over the defaults: fields an older
 * caller's struct lacks keep their default. */
static bool params_of(const struct kvr_gen_params *p, struct kvr_gen_params *q)
{
    kvr_gen_params_init(q, sizeof(*q));
    if (p->size < offsetof(struct kvr_gen_params, prompt))
        return false;
    memcpy(q, p, p->size < sizeof(*q) ? p->size : sizeof(*q));
    q->size = sizeof(*q);
    return true;
}

/* Copies the library's struct into the caller's (its size bytes). */
static void copy_out(void *dst, size_t dst_size, const void *src, size_t src_size)
{
    memcpy(dst, src, dst_size < src_size ? dst_size : src_size);
    if (dst_size >= sizeof(size_t)) { /* the leading size field: what was filled */
        size_t n = dst_size < src_size ? dst_size : src_size;
        memcpy(dst, &n, sizeof(n));
    }
}

static kvr_status_t connect_on(void *zctx, bool own_ctx, const char *endpoint,
                               kvr_client_t **client_p)
{
    kvr_client_t *c = calloc(1, sizeof(*c));
    if (!c) {
        if (own_ctx)
            zmq_ctx_term(zctx);
        return KVR_ERR_NO_MEMORY;
    }
    c->zctx = zctx;
    c->own_ctx = own_ctx;
    c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (!c->sock)
        goto err;
    int zero = 0, hwm = 100000;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(c->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    /* one client may carry many streams (kvrail-frontend: every request) */
    zmq_setsockopt(c->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    /* the monitor tells a lost connection (router killed or restarted):
     * every open stream then ends with KVR_ERR_PEER_FAILURE at once */
    char mon_ep[64];
    snprintf(mon_ep, sizeof(mon_ep), "inproc://kvr-client-mon-%p", (void *)c);
    if (zmq_socket_monitor(c->sock, mon_ep, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) == 0) {
        c->mon = zmq_socket(c->zctx, ZMQ_PAIR);
        if (c->mon && zmq_connect(c->mon, mon_ep) != 0) {
            zmq_close(c->mon);
            c->mon = NULL;
        }
    }
    char kerr[512];
    if (kvr_proto_curve_client_env(c->sock, kerr, sizeof(kerr)) != KVR_OK) {
        /* keys asked for and unusable: never a silent plain connection */
        fprintf(stderr, "libkvrail-client: %s\n", kerr);
        if (c->mon)
            zmq_close(c->mon);
        zmq_close(c->sock);
        if (own_ctx)
            zmq_ctx_term(c->zctx);
        free(c);
        return KVR_ERR_INVALID;
    }
    if (zmq_connect(c->sock, endpoint) != 0) {
        int e = zmq_errno();
        if (c->mon)
            zmq_close(c->mon);
        zmq_close(c->sock);
        if (own_ctx)
            zmq_ctx_term(c->zctx);
        free(c);
        return e == EINVAL || e == EPROTONOSUPPORT ? KVR_ERR_INVALID : KVR_ERR_IO;
    }
    c->next_call = ((uint64_t)kvr_now_ns() & 0xffffff) << 24;
    *client_p = c;
    return KVR_OK;
err:
    if (own_ctx)
        zmq_ctx_term(c->zctx);
    free(c);
    return KVR_ERR_IO;
}

kvr_status_t kvr_client_connect(const char *endpoint, kvr_client_t **client_p)
{
    if (!endpoint || !client_p)
        return KVR_ERR_INVALID;
    void *zctx = zmq_ctx_new();
    if (!zctx)
        return KVR_ERR_IO;
    return connect_on(zctx, true, endpoint, client_p);
}

kvr_status_t kvr_client_connect_ctx(void *zmq_ctx, const char *endpoint, kvr_client_t **client_p)
{
    if (!zmq_ctx || !endpoint || !client_p)
        return KVR_ERR_INVALID;
    return connect_on(zmq_ctx, false, endpoint, client_p);
}

kvr_status_t kvr_client_connect_direct(const char *endpoint, kvr_client_t **client_p)
{
    if (!endpoint || !client_p)
        return KVR_ERR_INVALID;
    /* the keys as kvr_client_connect takes them; set and unusable: never a
     * silent plain connection */
    struct kvr_curve_env_keys ek;
    bool curve = false;
    char err[512];
    kvr_status_t st = kvr_proto_curve_env_keys(&ek, &curve, err, sizeof(err));
    if (st != KVR_OK) {
        fprintf(stderr, "libkvrail-client: %s\n", err);
        return KVR_ERR_INVALID;
    }
    struct kvr_zmtp_curve_keys keys;
    if (curve) {
        memcpy(keys.server, ek.server_bin, sizeof(keys.server));
        memcpy(keys.pub, ek.pub_bin, sizeof(keys.pub));
        memcpy(keys.sec, ek.sec_bin, sizeof(keys.sec));
        explicit_bzero(&ek, sizeof(ek));
    }
    kvr_client_t *c = calloc(1, sizeof(*c));
    if (!c) {
        explicit_bzero(&keys, sizeof(keys));
        return KVR_ERR_NO_MEMORY;
    }
    err[0] = 0;
    st = kvr_zmtp_open(endpoint, KVR_PROTO_MAX_PAYLOAD + KVR_PROTO_HDR_LEN, curve ? &keys : NULL,
                       &c->zl, err, sizeof(err));
    explicit_bzero(&keys, sizeof(keys));
    if (st != KVR_OK) {
        fprintf(stderr, "libkvrail-client: %s\n", err[0] ? err : kvr_status_str(st));
        free(c);
        return st;
    }
    c->next_call = ((uint64_t)kvr_now_ns() & 0xffffff) << 24;
    *client_p = c;
    return KVR_OK;
}

void kvr_client_close(kvr_client_t *c)
{
    if (!c)
        return;
    while (c->streams)
        kvr_gen_stream_destroy(c->streams);
    if (c->have_reply)
        kvr_proto_frame_clear(&c->reply);
    if (c->zl) {
        kvr_zmtp_close(c->zl);
        free(c->nodes);
        free(c);
        return;
    }
    if (c->mon) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->mon);
    }
    zmq_close(c->sock);
    if (c->own_ctx)
        zmq_ctx_term(c->zctx);
    free(c->nodes);
    free(c);
}

const char *kvr_client_error(const kvr_client_t *c)
{
    return c ? c->err : "";
}

/* Puts s on the client's ready list (once). */
static void mark_ready(kvr_client_t *c, kvr_gen_stream_t *s)
{
    if (s->in_ready)
        return;
    s->in_ready = true;
    s->ready_next = NULL;
    if (c->ready_tail)
        c->ready_tail->ready_next = s;
    else
        c->ready_head = s;
    c->ready_tail = s;
}

/* The connection to the router went down: the router that held the open
 * streams is gone (killed, restarted, unreachable), and a restarted one
 * knows nothing of them, so each ends now with KVR_ERR_PEER_FAILURE (frames
 * already received are still delivered first). */
static void connection_lost(kvr_client_t *c, const char *why)
{
    c->lost++;
    for (kvr_gen_stream_t *s = c->streams; s; s = s->next) {
        if (s->ended)
            continue;
        s->ended = true;
        mark_ready(c, s);
        s->res.status = KVR_ERR_PEER_FAILURE;
        s->res.finish = KVR_FINISH_ERROR;
        snprintf(s->res.message, sizeof(s->res.message),
                 "the connection to the router was lost (%s): the stream ended without its answer",
                 why ? why : "router killed, restarted or unreachable");
    }
    if (c->want_call)
        c->reply_lost = true;
    set_err(c, "the connection to the router was lost");
}

/* Handles the monitor's events; true when a connection was lost. */
static bool monitor(kvr_client_t *c)
{
    bool lost = false;
    while (c->mon) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            break;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&ev) >= 2)
            memcpy(&event, zmq_msg_data(&ev), 2);
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        while (more) { /* the endpoint part */
            zmq_msg_t p;
            zmq_msg_init(&p);
            if (zmq_msg_recv(&p, c->mon, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&p);
                break;
            }
            more = zmq_msg_more(&p);
            zmq_msg_close(&p);
        }
        if (event == ZMQ_EVENT_CONNECTED) {
            c->connected = true;
        } else if (event == ZMQ_EVENT_DISCONNECTED && c->connected) {
            c->connected = false;
            lost = true;
        }
    }
    if (lost)
        connection_lost(c, NULL);
    return lost;
}

/* The most a stream's queue holds (frames and payloads): the router paces
 * tokens, not the caller, so a stream nobody takes from (the caller waits on
 * another) or a hostile router's flood would grow the client without bound.
 * Far above what a legitimate stream holds (tokens of ~50 bytes, a first
 * token with the prompt's ids).  A variable so that a fuzz target can
 * reach it. */
static size_t stream_queue_cap = 64u << 20;

/* A status code from the router as the caller gets it: an error is
 * negative; 0 or a positive code (not an error: KVR_INPROGRESS) in an error
 * is the router's bug, reported as such. */
static kvr_status_t err_code(int32_t code)
{
    return code < 0 ? (kvr_status_t)code : KVR_ERR_INTERNAL;
}

/* A finish reason from the router as the caller's enum: a value the library
 * does not know (a hostile or newer router) reads as an error, never as an
 * out-of-range enum the caller indexes or switches on. */
static enum kvr_finish finish_of(int v)
{
    return v >= KVR_FINISH_NONE && v <= KVR_FINISH_ERROR ? (enum kvr_finish)v : KVR_FINISH_ERROR;
}

/* Files a frame from the router with its stream (or the pending unary
 * call); true (something arrived) in every case. */
static bool file_frame(kvr_client_t *c, kvr_proto_frame_t *f)
{
    c->last_rx_ns = kvr_now_ns();
    if (c->want_call && f->hdr.call_id == c->want_call && !c->have_reply) {
        c->reply = *f;
        c->have_reply = true;
        return true;
    }
    kvr_gen_stream_t *s;
    for (s = c->streams; s; s = s->next)
        if (s->call_id == f->hdr.call_id && !s->ended)
            break;
    if (!s) {
        if (f->hdr.call_id == 0 && (f->hdr.flags & KVR_PROTO_F_ERROR)) {
            ProtobufCMessage *m = NULL;
            if (kvr_proto_decode(f, NULL, &m, NULL, 0) == KVR_OK) {
                set_err(c, "router: %s", ((Kvrail__Status *)m)->message);
                protobuf_c_message_free_unpacked(m, NULL);
            }
        }
        kvr_proto_frame_clear(f);
        return true;
    }
    /* after the stream's last frame (a done after an error, tokens after
     * the done) nothing is the stream's any more */
    size_t sz = sizeof(struct qframe) + f->payload_len;
    if (s->end_queued || s->queued_bytes + sz > stream_queue_cap) {
        if (!s->end_queued) {
            s->end_queued = true;
            s->overflowed = true;
            mark_ready(c, s); /* the taker meets the end */
        }
        kvr_proto_frame_clear(f);
        return true;
    }
    struct qframe *q = malloc(sizeof(*q));
    if (!q) {
        kvr_proto_frame_clear(f);
        return true;
    }
    if (f->hdr.flags & (KVR_PROTO_F_END | KVR_PROTO_F_ERROR))
        s->end_queued = true;
    s->queued_bytes += sz;
    q->f = *f;
    q->next = NULL;
    if (s->tail)
        s->tail->next = q;
    else
        s->head = q;
    s->tail = q;
    mark_ready(c, s);
    return true;
}

/* A message from the direct link as kvr_proto_recv would give it: the
 * same checks (kvr_proto_frame_parts). */
static kvr_status_t frame_of(const struct kvr_zmtp_msg *m, kvr_proto_frame_t *f, char *err,
                             size_t err_len)
{
    memset(f, 0, sizeof(*f));
    f->src_fd = -1;
    return kvr_proto_frame_parts(f, m->nparts, m->nparts >= 1 ? m->part[0] : NULL,
                                 m->nparts >= 1 ? m->len[0] : 0, m->nparts >= 2 ? m->part[1] : NULL,
                                 m->nparts >= 2 ? m->len[1] : 0, err, err_len);
}

/* The direct link's share of a pump: reads, writes and reconnects what it
 * can without waiting, files every whole message, and tells the client of
 * a connection made or lost.  True when something arrived (or was lost). */
static bool direct_drain(kvr_client_t *c)
{
    unsigned ev = kvr_zmtp_io(c->zl);
    bool got = false;
    for (;;) {
        struct kvr_zmtp_msg m;
        kvr_status_t st = kvr_zmtp_recv(c->zl, &m);
        if (st == KVR_ERR_NO_RESOURCE)
            break;
        if (st == KVR_ERR_CLOSED) { /* a protocol error: the link dropped the connection */
            set_err(c, "%s", kvr_zmtp_error(c->zl));
            ev |= kvr_zmtp_io(c->zl);
            continue;
        }
        kvr_proto_frame_t f;
        char err[256];
        if (frame_of(&m, &f, err, sizeof(err)) != KVR_OK) {
            set_err(c, "bad frame from the router: %s", err);
            kvr_proto_frame_clear(&f);
            continue;
        }
        got |= file_frame(c, &f);
    }
    if (ev & KVR_ZMTP_EV_CONNECTED)
        c->connected = true;
    if ((ev & KVR_ZMTP_EV_LOST) && c->connected) {
        c->connected = false;
        connection_lost(c, kvr_zmtp_error(c->zl));
        set_err(c, "the connection to the router was lost: %s", kvr_zmtp_error(c->zl));
        got = true;
    } else if (!c->connected && kvr_zmtp_error(c->zl)[0]) {
        /* why it is not up (a refused connect, a peer that is no router) */
        set_err(c, "router link: %s", kvr_zmtp_error(c->zl));
    }
    return got;
}

/* pump_fd for the direct link: poll(2) on its descriptor (and fd). */
static kvr_status_t pump_direct(kvr_client_t *c, uint64_t deadline, int fd, bool *fd_ready)
{
    for (;;) {
        if (direct_drain(c) || (fd_ready && *fd_ready))
            return KVR_OK;
        uint64_t now = kvr_now_ns();
        if (now >= deadline)
            return KVR_ERR_TIMEOUT;
        struct pollfd p[2] = {{kvr_zmtp_fd(c->zl), POLLIN, 0}, {fd, POLLIN, 0}};
        int rc = poll(p, fd >= 0 ? 2 : 1, (int)((deadline - now + 999999) / 1000000u));
        if (rc > 0 && fd >= 0 && (p[1].revents & POLLIN))
            *fd_ready = true;
        else if (rc < 0 && fd >= 0 && errno == EINTR)
            return KVR_ERR_TIMEOUT; /* a signal: the caller looks at its flags */
    }
}

/* Sends a request on whichever link the client has. */
static kvr_status_t link_send(kvr_client_t *c, const kvr_proto_hdr_t *h,
                              const ProtobufCMessage *msg)
{
    if (!c->zl)
        return kvr_proto_send(c->sock, NULL, 0, h, msg);
    uint8_t env[KVR_PROTO_HDR_LEN];
    uint8_t *buf = NULL;
    size_t len = 0;
    kvr_status_t st = kvr_proto_pack_parts(h, msg, env, &buf, &len);
    if (st != KVR_OK)
        return st;
    struct iovec v[2] = {{env, sizeof(env)}, {buf, len}};
    st = kvr_zmtp_send(c->zl, v, 2);
    free(buf);
    return st;
}

/* Receives whatever is waiting and files it; waits up to deadline for at
 * least one frame, or for fd (when >= 0) to be readable (*fd_ready set).
 * Returns KVR_OK if something arrived (or the connection was lost: the
 * streams ended, or fd is readable), KVR_ERR_TIMEOUT. */
static kvr_status_t pump_fd(kvr_client_t *c, uint64_t deadline, int fd, bool *fd_ready,
                            bool mon_first)
{
    if (c->zl)
        return pump_direct(c, deadline, fd, fd_ready);
    bool got = false;
    /* the monitor is read when its socket is readable (or the call will not
     * poll): one ZeroMQ call less per wake-up */
    bool mon_check = mon_first && kvr_now_ns() >= deadline;
    for (;;) {
        kvr_proto_frame_t f;
        char err[256];
        kvr_status_t st = kvr_proto_recv(c->sock, false, &f, err, sizeof(err));
        if (st == KVR_ERR_NO_RESOURCE) {
            c->sent = false;
            if (mon_check && monitor(c))
                got = true;
            mon_check = false;
            if (got || (fd_ready && *fd_ready))
                return KVR_OK;
            uint64_t now = kvr_now_ns();
            if (now >= deadline)
                return KVR_ERR_TIMEOUT;
            zmq_pollitem_t it[3] = {{c->sock, 0, ZMQ_POLLIN, 0}, {NULL, fd, ZMQ_POLLIN, 0}};
            int n = 2;
            if (fd < 0)
                it[1] = (zmq_pollitem_t){c->mon, 0, ZMQ_POLLIN, 0};
            else if (c->mon)
                it[n++] = (zmq_pollitem_t){c->mon, 0, ZMQ_POLLIN, 0};
            if (fd < 0 && !c->mon)
                n = 1;
            long ms = (long)((deadline - now + 999999) / 1000000u);
            int rc = zmq_poll(it, n, ms);
            mon_check = rc > 0 && c->mon && (it[n - 1].revents & ZMQ_POLLIN);
            if (rc > 0 && fd >= 0 && (it[1].revents & ZMQ_POLLIN))
                *fd_ready = true;
            else if (rc < 0 && fd >= 0 && zmq_errno() == EINTR)
                return KVR_ERR_TIMEOUT; /* a signal: the caller looks at its flags */
            continue;
        }
        if (st != KVR_OK) {
            set_err(c, "bad frame from the router: %s", err);
            kvr_proto_frame_clear(&f);
            continue;
        }
        got |= file_frame(c, &f);
    }
}

static kvr_status_t pump(kvr_client_t *c, uint64_t deadline)
{
    return pump_fd(c, deadline, -1, NULL, true);
}

/* The pending unary call's reply (c->reply, taken): the reply message into
 * *reply_p, or the router's error as the status (c->err says why). */
static kvr_status_t unary_reply(kvr_client_t *c, unsigned method,
                                const ProtobufCMessageDescriptor *reply_desc,
                                ProtobufCMessage **reply_p)
{
    c->want_call = 0;
    c->have_reply = false;
    ProtobufCMessage *m = NULL;
    char err[256];
    bool is_err = c->reply.hdr.flags & KVR_PROTO_F_ERROR;
    kvr_status_t st = kvr_proto_decode(&c->reply, is_err ? &kvrail__status__descriptor : reply_desc,
                                       &m, err, sizeof(err));
    kvr_proto_frame_clear(&c->reply);
    if (st != KVR_OK) {
        set_err(c, "bad %s reply: %s", kvr_proto_method_name(method), err);
        return st;
    }
    if (is_err) {
        Kvrail__Status *s = (Kvrail__Status *)m;
        set_err(c, "%s", s->message);
        st = err_code(s->code);
        protobuf_c_message_free_unpacked(m, NULL);
        return st;
    }
    *reply_p = m;
    return KVR_OK;
}

static kvr_status_t unary(kvr_client_t *c, unsigned method, const ProtobufCMessage *req,
                          const ProtobufCMessageDescriptor *reply_desc, int timeout_ms,
                          ProtobufCMessage **reply_p)
{
    uint64_t call = ++c->next_call;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, (uint16_t)method, call};
    c->sent = true;
    kvr_status_t st = link_send(c, &h, req);
    if (st != KVR_OK) {
        set_err(c, "cannot send %s: %s", kvr_proto_method_name(method), kvr_status_str(st));
        return st;
    }
    c->want_call = call;
    c->reply_lost = false;
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    while (!c->have_reply) {
        kvr_status_t ps = pump(c, deadline);
        if (c->have_reply)
            break;
        if (c->reply_lost) {
            c->want_call = 0;
            set_err(c, "the connection to the router was lost before the %s reply",
                    kvr_proto_method_label(method));
            return KVR_ERR_PEER_FAILURE;
        }
        if (ps == KVR_ERR_TIMEOUT) {
            c->want_call = 0;
            set_err(c, "no %s reply from the router within %d ms", kvr_proto_method_name(method),
                    timeout_ms);
            return KVR_ERR_TIMEOUT;
        }
    }
    return unary_reply(c, method, reply_desc, reply_p);
}

kvr_status_t kvr_client_ping(kvr_client_t *c, int timeout_ms)
{
    Kvrail__Ping p = KVRAIL__PING__INIT;
    p.nonce = kvr_now_ns();
    ProtobufCMessage *m = NULL;
    kvr_status_t st =
        unary(c, KVRAIL__METHOD__PING, &p.base, &kvrail__ping__descriptor, timeout_ms, &m);
    if (st == KVR_OK)
        protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

kvr_status_t kvr_client_generate_start(kvr_client_t *c, const struct kvr_gen_params *params,
                                       kvr_gen_stream_t **stream_p)
{
    if (!c || !params || !stream_p)
        return KVR_ERR_INVALID;
    struct kvr_gen_params pv;
    const struct kvr_gen_params *p = &pv;
    if (!params_of(params, &pv)) {
        set_err(c, "kvr_gen_params.size is %zu: set the params up with kvr_gen_params_default()",
                params->size);
        return KVR_ERR_INVALID;
    }
    kvr_gen_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return KVR_ERR_NO_MEMORY;
    Kvrail__GenerateRequest g = KVRAIL__GENERATE_REQUEST__INIT;
    Kvrail__SamplingParams sp = KVRAIL__SAMPLING_PARAMS__INIT;
    g.prompt = (char *)(p->prompt ? p->prompt : "");
    g.token_ids = (uint32_t *)p->token_ids;
    g.n_token_ids = p->n_token_ids;
    g.max_tokens = p->max_tokens;
    sp.temperature = p->temperature;
    sp.top_p = p->top_p;
    sp.top_k = p->top_k;
    sp.repetition_penalty = p->repetition_penalty;
    sp.seed = p->seed;
    sp.has_seed = p->has_seed;
    sp.min_p = p->min_p;
    sp.presence_penalty = p->presence_penalty;
    sp.frequency_penalty = p->frequency_penalty;
    sp.top_logprobs = p->top_logprobs;
    Kvrail__LogitBias **lbp = NULL;
    if (p->n_logit_bias) {
        lbp = malloc(p->n_logit_bias * (sizeof(*lbp) + sizeof(Kvrail__LogitBias)));
        if (!lbp) {
            free(s);
            return KVR_ERR_NO_MEMORY;
        }
        Kvrail__LogitBias *lb = (Kvrail__LogitBias *)(lbp + p->n_logit_bias);
        for (size_t i = 0; i < p->n_logit_bias; i++) {
            kvrail__logit_bias__init(&lb[i]);
            lb[i].token_id = p->logit_bias[i].token_id;
            lb[i].bias = p->logit_bias[i].bias;
            lbp[i] = &lb[i];
        }
        sp.logit_bias = lbp;
        sp.n_logit_bias = p->n_logit_bias;
    }
    g.sampling = &sp;
    g.stop = (char **)p->stop;
    g.n_stop = p->n_stop;
    g.stop_token_ids = (uint32_t *)p->stop_token_ids;
    g.n_stop_token_ids = p->n_stop_token_ids;
    g.ignore_eos = p->ignore_eos;
    g.return_prompt_tokens = p->return_prompt_tokens;
    g.no_text = p->no_text;
    s->c = c;
    s->res.size = sizeof(s->res);
    s->call_id = ++c->next_call;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__GENERATE, s->call_id};
    c->sent = true;
    kvr_status_t st = link_send(c, &h, &g.base);
    free(lbp);
    if (st != KVR_OK) {
        set_err(c, "cannot send GENERATE: %s", kvr_status_str(st));
        free(s);
        return st;
    }
    s->next = c->streams;
    c->streams = s;
    *stream_p = s;
    return KVR_OK;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

/* Handles one queued frame; returns KVR_OK when it was a token (tok_p set),
 * KVR_ERR_CLOSED when the stream ended, KVR_INPROGRESS otherwise. */
static kvr_status_t take(kvr_gen_stream_t *s, struct kvr_gen_token *tok_p)
{
    struct qframe *q = s->head;
    s->head = q->next;
    if (!s->head)
        s->tail = NULL;
    kvr_proto_frame_t *f = &q->f;
    s->queued_bytes -= sizeof(*q) + f->payload_len;
    kvr_status_t ret = KVR_INPROGRESS;
    ProtobufCMessage *m = NULL;
    char err[256];
    if (f->hdr.flags & KVR_PROTO_F_ERROR) {
        s->ended = true;
        ret = KVR_ERR_CLOSED;
        if (kvr_proto_decode(f, &kvrail__status__descriptor, &m, err, sizeof(err)) == KVR_OK) {
            Kvrail__Status *st = (Kvrail__Status *)m;
            s->res.status = err_code(st->code);
            copy_str(s->res.message, sizeof(s->res.message), st->message);
        } else {
            s->res.status = KVR_ERR_CORRUPT;
            copy_str(s->res.message, sizeof(s->res.message), err);
        }
        s->res.finish = KVR_FINISH_ERROR;
    } else if (f->hdr.flags & KVR_PROTO_F_END) {
        s->ended = true;
        ret = KVR_ERR_CLOSED;
        if (kvr_proto_decode(f, &kvrail__stream_end__descriptor, &m, err, sizeof(err)) == KVR_OK) {
            Kvrail__StreamEnd *e = (Kvrail__StreamEnd *)m;
            s->res.status = e->status && e->status->code ? err_code(e->status->code) : KVR_OK;
            copy_str(s->res.message, sizeof(s->res.message), e->status ? e->status->message : "");
            if (e->usage) {
                Kvrail__GenerateUsage *u = e->usage;
                s->res.request_id = u->request_id;
                s->res.finish = finish_of(u->finish);
                s->res.prompt_tokens = u->prompt_tokens;
                s->res.completion_tokens = u->completion_tokens;
                s->res.cached_tokens = u->cached_tokens;
                s->res.local_prefill = u->local_prefill;
                copy_str(s->res.prefill_node, sizeof(s->res.prefill_node), u->prefill_node);
                copy_str(s->res.decode_node, sizeof(s->res.decode_node), u->decode_node);
                s->res.kv_bytes_moved = u->kv_bytes_moved;
                s->res.ttft_us = u->ttft_us;
                s->res.total_us = u->total_us;
                s->res.router_overhead_ns = u->router_overhead_ns;
                s->res.router_overhead_cpu_ns = u->router_overhead_cpu_ns;
            }
        } else {
            s->res.status = KVR_ERR_CORRUPT;
            copy_str(s->res.message, sizeof(s->res.message), err);
        }
    } else if (kvr_proto_decode(f, &kvrail__generate_chunk__descriptor, &m, err, sizeof(err)) ==
               KVR_OK) {
        if (s->cur)
            protobuf_c_message_free_unpacked(&s->cur->base, NULL);
        Kvrail__GenerateChunk *ch = (Kvrail__GenerateChunk *)m;
        s->cur = ch;
        m = NULL;
        s->res.request_id = ch->request_id;
        tok_p->request_id = ch->request_id;
        tok_p->index = ch->index;
        tok_p->token_id = ch->token_id;
        tok_p->logprob = ch->logprob;
        tok_p->text = ch->text ? ch->text : "";
        tok_p->text_len = strlen(tok_p->text);
        tok_p->finish = finish_of(ch->finish);
        tok_p->prompt_token_ids = ch->prompt_token_ids;
        tok_p->n_prompt_token_ids = ch->n_prompt_token_ids;
        tok_p->n_top = ch->n_top_logprobs < KVR_GEN_MAX_TOP ? ch->n_top_logprobs : KVR_GEN_MAX_TOP;
        for (size_t i = 0; i < tok_p->n_top; i++) {
            tok_p->top_ids[i] = ch->top_logprobs[i]->token_id;
            tok_p->top_logprobs[i] = ch->top_logprobs[i]->logprob;
        }
        ret = KVR_OK;
    }
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(f);
    free(q);
    return ret;
}

kvr_status_t kvr_gen_stream_take_sized(kvr_gen_stream_t *s, struct kvr_gen_token *tok_p,
                                       size_t tok_size)
{
    if (!s || !tok_p || tok_size < sizeof(size_t))
        return KVR_ERR_INVALID;
    while (s->head) {
        struct kvr_gen_token t;
        kvr_status_t st = take(s, &t);
        if (st == KVR_OK) {
            t.size = sizeof(t);
            copy_out(tok_p, tok_size, &t, sizeof(t));
        }
        if (st == KVR_OK || st == KVR_ERR_CLOSED)
            return st;
    }
    if (s->overflowed && !s->ended) {
        /* what was queued is taken; the rest was dropped: the router is
         * told to stop, and the caller that the answer is incomplete */
        kvr_gen_stream_cancel(s);
        s->ended = true;
        s->res.status = KVR_ERR_OVERLOAD;
        s->res.finish = KVR_FINISH_ERROR;
        snprintf(s->res.message, sizeof(s->res.message),
                 "the router sent more than the %zu bytes a stream queues: the stream ended "
                 "without its answer",
                 stream_queue_cap);
        return KVR_ERR_CLOSED;
    }
    return s->ended ? KVR_ERR_CLOSED : KVR_ERR_TIMEOUT;
}

kvr_status_t kvr_gen_stream_next_sized(kvr_gen_stream_t *s, int timeout_ms,
                                       struct kvr_gen_token *tok_p, size_t tok_size)
{
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    for (;;) {
        kvr_status_t st = kvr_gen_stream_take_sized(s, tok_p, tok_size);
        if (st != KVR_ERR_TIMEOUT)
            return st; /* a token, the end, or bad arguments */
        if (pump(s->c, deadline) == KVR_ERR_TIMEOUT && !s->head)
            return KVR_ERR_TIMEOUT;
    }
}

kvr_status_t kvr_client_wait(kvr_client_t *c, int timeout_ms)
{
    if (!c)
        return KVR_ERR_INVALID;
    return pump(c, kvr_deadline_ns(timeout_ms));
}

kvr_status_t kvr_client_wait_fd(kvr_client_t *c, int fd, int timeout_ms, bool *fd_ready_p)
{
    if (!c || !fd_ready_p)
        return KVR_ERR_INVALID;
    *fd_ready_p = false;
    return pump_fd(c, kvr_deadline_ns(timeout_ms), fd, fd_ready_p, true);
}

size_t kvr_client_fds(const kvr_client_t *c, int *fds, size_t max)
{
    size_t n = 0;
    if (c && c->zl) {
        if (max > 0)
            fds[n++] = kvr_zmtp_fd(c->zl);
        return n;
    }
    void *socks[2] = {c ? c->sock : NULL, c ? c->mon : NULL};
    for (size_t i = 0; i < 2 && n < max; i++) {
        int fd = -1;
        size_t len = sizeof(fd);
        if (socks[i] && zmq_getsockopt(socks[i], ZMQ_FD, &fd, &len) == 0 && fd >= 0)
            fds[n++] = fd;
    }
    return n;
}

kvr_status_t kvr_client_poll(kvr_client_t *c, unsigned what)
{
    if (!c)
        return KVR_ERR_INVALID;
    if (c->zl) /* its descriptor is level-triggered: a send takes no wake-up */
        return (what & KVR_CLIENT_POLL_SOCKET) && direct_drain(c) ? KVR_OK : KVR_ERR_TIMEOUT;
    bool got = false;
    if ((what & KVR_CLIENT_POLL_MONITOR) && monitor(c))
        got = true;
    /* the socket: when asked, or when a send may have taken a frame's wake-up */
    if (((what & KVR_CLIENT_POLL_SOCKET) || c->sent) && pump_fd(c, 0, -1, NULL, false) == KVR_OK)
        got = true;
    return got ? KVR_OK : KVR_ERR_TIMEOUT;
}

kvr_gen_stream_t *kvr_client_next_ready(kvr_client_t *c)
{
    kvr_gen_stream_t *s = c ? c->ready_head : NULL;
    if (!s)
        return NULL;
    c->ready_head = s->ready_next;
    if (!c->ready_head)
        c->ready_tail = NULL;
    s->in_ready = false;
    s->ready_next = NULL;
    return s;
}

void kvr_gen_stream_set_user(kvr_gen_stream_t *s, void *user)
{
    if (s)
        s->user = user;
}

void *kvr_gen_stream_user(const kvr_gen_stream_t *s)
{
    return s ? s->user : NULL;
}

kvr_status_t kvr_client_ping_send(kvr_client_t *c)
{
    if (!c)
        return KVR_ERR_INVALID;
    Kvrail__Ping p = KVRAIL__PING__INIT;
    p.nonce = kvr_now_ns();
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__PING, ++c->next_call};
    c->sent = true;
    kvr_status_t st = link_send(c, &h, &p.base);
    if (st != KVR_OK)
        set_err(c, "cannot send PING: %s", kvr_status_str(st));
    return st;
}

uint64_t kvr_client_last_rx_ns(const kvr_client_t *c)
{
    return c ? c->last_rx_ns : 0;
}

const struct kvr_gen_result *kvr_gen_stream_result(const kvr_gen_stream_t *s)
{
    return &s->res;
}

kvr_status_t kvr_gen_stream_cancel(kvr_gen_stream_t *s)
{
    if (!s || s->ended)
        return KVR_OK;
    Kvrail__CancelRequest cr = KVRAIL__CANCEL_REQUEST__INIT;
    cr.call_id = s->call_id;
    cr.request_id = s->res.request_id;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__CANCEL, ++s->c->next_call};
    s->cancel_sent = true;
    s->c->sent = true;
    return link_send(s->c, &h, &cr.base);
}

void kvr_gen_stream_destroy(kvr_gen_stream_t *s)
{
    if (!s)
        return;
    if (!s->ended && !s->cancel_sent)
        kvr_gen_stream_cancel(s);
    kvr_client_t *c = s->c;
    for (kvr_gen_stream_t **pp = &c->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    if (s->in_ready) {
        kvr_gen_stream_t *prev = NULL;
        for (kvr_gen_stream_t *r = c->ready_head; r; prev = r, r = r->ready_next)
            if (r == s) {
                if (prev)
                    prev->ready_next = s->ready_next;
                else
                    c->ready_head = s->ready_next;
                if (c->ready_tail == s)
                    c->ready_tail = prev;
                break;
            }
    }
    while (s->head) {
        struct qframe *q = s->head;
        s->head = q->next;
        kvr_proto_frame_clear(&q->f);
        free(q);
    }
    if (s->cur)
        protobuf_c_message_free_unpacked(&s->cur->base, NULL);
    free(s);
}

static kvr_status_t generate(kvr_client_t *c, const struct kvr_gen_params *p, kvr_gen_cb cb,
                             void *arg, int timeout_ms, struct kvr_gen_result *res_p);

kvr_status_t kvr_client_generate_sized(kvr_client_t *c, const struct kvr_gen_params *p,
                                       kvr_gen_cb cb, void *arg, int timeout_ms,
                                       struct kvr_gen_result *res_p, size_t res_size)
{
    struct kvr_gen_result res;
    kvr_status_t st = generate(c, p, cb, arg, timeout_ms, &res);
    res.size = sizeof(res);
    if (res_p && res_size >= sizeof(size_t))
        copy_out(res_p, res_size, &res, sizeof(res));
    return st;
}

static kvr_status_t generate(kvr_client_t *c, const struct kvr_gen_params *p, kvr_gen_cb cb,
                             void *arg, int timeout_ms, struct kvr_gen_result *res_p)
{
    memset(res_p, 0, sizeof(*res_p));
    kvr_gen_stream_t *s = NULL;
    kvr_status_t st = kvr_client_generate_start(c, p, &s);
    if (st != KVR_OK) {
        res_p->status = st;
        copy_str(res_p->message, sizeof(res_p->message), c ? c->err : "invalid arguments");
        return st;
    }
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    bool canceled = false;
    for (;;) {
        uint64_t now = kvr_now_ns();
        int left = now >= deadline ? 0 : (int)((deadline - now) / 1000000u);
        struct kvr_gen_token t;
        st = kvr_gen_stream_next_sized(s, left, &t, sizeof(t));
        if (st == KVR_OK) {
            if (cb && cb(arg, &t) && !canceled) {
                kvr_gen_stream_cancel(s);
                canceled = true;
            }
            continue;
        }
        if (st == KVR_ERR_CLOSED) {
            *res_p = s->res;
            st = s->res.status;
            break;
        }
        /* timeout: cancel, and give the router a moment to confirm */
        if (!canceled) {
            kvr_gen_stream_cancel(s);
            canceled = true;
            deadline = kvr_deadline_ns(1000);
            continue;
        }
        *res_p = s->res;
        res_p->status = KVR_ERR_TIMEOUT;
        snprintf(res_p->message, sizeof(res_p->message),
                 "no end of stream within %d ms (request canceled)", timeout_ms);
        st = KVR_ERR_TIMEOUT;
        break;
    }
    if (canceled && st == KVR_ERR_CANCELED && timeout_ms >= 0 && kvr_now_ns() > deadline) {
        st = KVR_ERR_TIMEOUT;
        res_p->status = st;
    }
    kvr_gen_stream_destroy(s);
    return st;
}

static kvr_status_t status_of(kvr_client_t *c, ProtobufCMessage *m, struct kvr_cluster_status *o,
                              size_t node_size);

/* The router's status into the library's struct *o; its nodes into c->nodes,
 * node_size bytes apart. */
static kvr_status_t status(kvr_client_t *c, int timeout_ms, struct kvr_cluster_status *o,
                           size_t node_size)
{
    Kvrail__StatusRequest q = KVRAIL__STATUS_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    kvr_status_t st = unary(c, KVRAIL__METHOD__STATUS, &q.base, &kvrail__status_reply__descriptor,
                            timeout_ms, &m);
    if (st != KVR_OK)
        return st;
    return status_of(c, m, o, node_size);
}

/* A StatusReply m (freed here) into *o and c->nodes. */
static kvr_status_t status_of(kvr_client_t *c, ProtobufCMessage *m, struct kvr_cluster_status *o,
                              size_t node_size)
{
    Kvrail__StatusReply *r = (Kvrail__StatusReply *)m;
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
    if (r->status && r->status->code) {
        /* the router says it has no status to give: never zeros as one */
        set_err(c, "router: %s", r->status->message);
        kvr_status_t st = err_code(r->status->code);
        protobuf_c_message_free_unpacked(m, NULL);
        return st;
    }
    if (r->n_nodes > KVR_CLIENT_MAX_NODES) {
        set_err(c, "the router reported %zu nodes, more than the %d a status holds", r->n_nodes,
                KVR_CLIENT_MAX_NODES);
        protobuf_c_message_free_unpacked(m, NULL);
        return KVR_ERR_CORRUPT;
    }
    size_t need = r->n_nodes * node_size;
    if (need > c->nodes_cap) {
        void *nb = realloc(c->nodes, need);
        if (!nb) {
            set_err(c, "no memory for the status of %zu nodes", r->n_nodes);
            protobuf_c_message_free_unpacked(m, NULL);
            return KVR_ERR_NO_MEMORY;
        }
        c->nodes = nb;
        c->nodes_cap = need;
    }
    if (need)
        memset(c->nodes, 0, need); /* a later caller's fields the library lacks read 0 */
    copy_str(o->model, sizeof(o->model), r->model);
    o->block_size = r->block_size;
    if (r->router) {
        Kvrail__RouterStats *s = r->router;
        o->uptime_ms = s->uptime_ms;
        o->requests = s->requests;
        o->active = s->active;
        o->queued = s->queued;
        o->completed = s->completed;
        o->failed = s->failed;
        o->canceled = s->canceled;
        o->overloaded = s->overloaded;
        o->bad_frames = s->bad_frames;
        o->bad_requests = s->bad_requests;
        o->local_prefills = s->local_prefills;
        o->disagg_prefills = s->disagg_prefills;
        o->retries = s->retries;
        o->overhead_p50_ns = s->overhead_p50_ns;
        o->overhead_p99_ns = s->overhead_p99_ns;
        o->overhead_max_ns = s->overhead_max_ns;
        o->overhead_samples = s->overhead_samples;
        o->overhead_cpu_p50_ns = s->overhead_cpu_p50_ns;
        o->overhead_cpu_p99_ns = s->overhead_cpu_p99_ns;
        o->token_overhead_p50_ns = s->token_overhead_p50_ns;
        o->token_overhead_p99_ns = s->token_overhead_p99_ns;
        o->tokenize_p50_ns = s->tokenize_p50_ns;
        o->tokenize_p99_ns = s->tokenize_p99_ns;
        o->kv_bytes_moved = s->kv_bytes_moved;
        o->kv_transfer_ns = s->kv_transfer_ns;
        o->kv_gbps = s->kv_gbps;
        o->directory_blocks = s->directory_blocks;
        o->cached_tokens = s->cached_tokens;
        o->prompt_tokens = s->prompt_tokens;
        o->client_disconnects = s->client_disconnects;
        o->resyncs = s->resyncs;
        o->dead_nodes = s->dead_nodes;
        o->auth_refused = s->auth_refused;
        o->refused_registrations = s->refused_registrations;
        o->held_event_drops = s->held_event_drops;
        o->unresponsive_nodes = s->unresponsive_nodes;
    }
    for (size_t i = 0; i < r->n_nodes; i++) {
        Kvrail__NodeStatus *n = r->nodes[i];
        struct kvr_node_info node, *d = &node;
        memset(d, 0, sizeof(*d));
        d->size = sizeof(*d);
        copy_str(d->name, sizeof(d->name), n->name);
        copy_str(d->role, sizeof(d->role),
                 n->role == KVRAIL__ROLE__ROLE_PREFILL  ? "prefill"
                 : n->role == KVRAIL__ROLE__ROLE_DECODE ? "decode"
                                                        : "?");
        d->alive = n->alive;
        copy_str(d->host, sizeof(d->host), n->host);
        copy_str(d->transport, sizeof(d->transport), n->transport);
        d->last_heartbeat_ms_ago = n->last_heartbeat_ms_ago;
        d->total_blocks = n->total_blocks;
        d->free_blocks = n->free_blocks;
        d->cached_blocks = n->cached_blocks;
        d->batch_size = n->batch_size;
        d->inflight_prefill_tokens = n->inflight_prefill_tokens;
        d->queued_prefill_tokens = n->queued_prefill_tokens;
        d->requests = n->requests;
        d->kv_bytes_moved = n->kv_bytes_moved;
        d->kv_transfer_ns = n->kv_transfer_ns;
        d->kv_gbps = n->kv_gbps;
        d->block_event_seq = n->block_event_seq;
        d->resyncs = n->resyncs;
        d->bad_frames = n->bad_frames;
        d->bad_notifications = n->bad_notifications;
        d->quarantined_blocks = n->quarantined_blocks;
        d->quarantines_fenced = n->quarantines_fenced;
        d->quarantines_expired = n->quarantines_expired;
        d->self_fenced = n->self_fenced;
        d->failures_blamed = n->failures_blamed;
        d->cooldowns = n->cooldowns;
        d->cooling = n->cooling;
        copy_str(d->kv_dtype, sizeof(d->kv_dtype), n->kv_dtype);
        copy_str(d->kernels, sizeof(d->kernels), n->kernels);
        copy_out((char *)c->nodes + i * node_size, node_size, d, sizeof(*d));
    }
    o->n_nodes = r->n_nodes;
    o->nodes = r->n_nodes ? c->nodes : NULL;
    protobuf_c_message_free_unpacked(m, NULL);
    return KVR_OK;
}

kvr_status_t kvr_client_status_sized(kvr_client_t *c, int timeout_ms,
                                     struct kvr_cluster_status *st_p, size_t st_size,
                                     size_t node_size)
{
    if (!c || !st_p)
        return KVR_ERR_INVALID;
    if (st_size < sizeof(size_t) || node_size < sizeof(size_t) ||
        node_size > KVR_CLIENT_MAX_NODE_INFO) {
        set_err(c,
                "kvr_client_status_sized: sizes %zu and %zu: use kvr_client_status(), which "
                "passes the caller's sizeof of kvr_cluster_status and kvr_node_info",
                st_size, node_size);
        return KVR_ERR_INVALID;
    }
    struct kvr_cluster_status o;
    kvr_status_t st = status(c, timeout_ms, &o, node_size);
    if (st == KVR_OK)
        copy_out(st_p, st_size, &o, sizeof(o));
    return st;
}
