/*
 * frame.c - the control-plane framing of kvr_proto.h: packing and checking
 * the 16-byte envelope, the method table (name and payload type of every
 * method), non-blocking multipart send/receive over ZeroMQ, and payload
 * decoding with a clear error for garbage, truncation, a wrong version or an
 * unknown method.  A received message is always drained completely, so one
 * bad message never desynchronises the next.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvr_proto.h"
#include "proto_err.h"

struct method_info {
    const char *name;
    const ProtobufCMessageDescriptor *req;
    const ProtobufCMessageDescriptor *reply;
};

static const struct method_info *method_lookup(unsigned method)
{
    static const struct method_info table[] = {
        [KVRAIL__METHOD__GENERATE] = {"GENERATE", &kvrail__generate_request__descriptor,
                                      &kvrail__generate_chunk__descriptor},
        [KVRAIL__METHOD__CANCEL] = {"CANCEL", &kvrail__cancel_request__descriptor,
                                    &kvrail__cancel_reply__descriptor},
        [KVRAIL__METHOD__STATUS] = {"STATUS", &kvrail__status_request__descriptor,
                                    &kvrail__status_reply__descriptor},
        [KVRAIL__METHOD__PING] = {"PING", &kvrail__ping__descriptor, &kvrail__ping__descriptor},
        [KVRAIL__METHOD__REGISTER] = {"REGISTER", &kvrail__register_request__descriptor,
                                      &kvrail__register_reply__descriptor},
        [KVRAIL__METHOD__HEARTBEAT] = {"HEARTBEAT", &kvrail__heartbeat__descriptor,
                                       &kvrail__heartbeat_reply__descriptor},
        [KVRAIL__METHOD__RESERVE] = {"RESERVE", &kvrail__reserve__descriptor, NULL},
        [KVRAIL__METHOD__RESERVED] = {"RESERVED", &kvrail__reserved__descriptor, NULL},
        [KVRAIL__METHOD__REJECTED] = {"REJECTED", &kvrail__rejected__descriptor, NULL},
        [KVRAIL__METHOD__PREFILL] = {"PREFILL", &kvrail__prefill__descriptor, NULL},
        [KVRAIL__METHOD__PREFILL_TARGET] = {"PREFILL_TARGET", &kvrail__prefill_target__descriptor,
                                            NULL},
        [KVRAIL__METHOD__PREFILL_DONE] = {"PREFILL_DONE", &kvrail__prefill_done__descriptor, NULL},
        [KVRAIL__METHOD__TOKEN] = {"TOKEN", &kvrail__token__descriptor, NULL},
        [KVRAIL__METHOD__BLOCK_EVENTS] = {"BLOCK_EVENTS", &kvrail__block_events__descriptor, NULL},
        [KVRAIL__METHOD__RESYNC] = {"RESYNC", &kvrail__resync_request__descriptor,
                                    &kvrail__resync_dump__descriptor},
        [KVRAIL__METHOD__NODE_CANCEL] = {"NODE_CANCEL", &kvrail__node_cancel__descriptor, NULL},
    };
    if (method >= sizeof(table) / sizeof(table[0]) || !table[method].name)
        return NULL;
    return &table[method];
}

const char *kvr_proto_method_name(unsigned method)
{
    const struct method_info *m = method_lookup(method);
    return m ? m->name : NULL;
}

const char *kvr_proto_method_label(unsigned method)
{
    const char *n = kvr_proto_method_name(method);
    return n ? n : "UNKNOWN";
}

const ProtobufCMessageDescriptor *kvr_proto_method_desc(unsigned method)
{
    const struct method_info *m = method_lookup(method);
    return m ? m->req : NULL;
}

const ProtobufCMessageDescriptor *kvr_proto_method_reply_desc(unsigned method)
{
    const struct method_info *m = method_lookup(method);
    return m ? m->reply : NULL;
}

static void put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void kvr_proto_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || !err_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

void kvr_proto_hdr_pack(const kvr_proto_hdr_t *hdr, uint8_t out[KVR_PROTO_HDR_LEN])
{
    out[0] = KVR_PROTO_MAGIC0;
    out[1] = KVR_PROTO_MAGIC1;
    out[2] = hdr->version;
    out[3] = hdr->flags;
    put_le16(out + 4, hdr->method);
    out[6] = 0;
    out[7] = 0;
    put_le64(out + 8, hdr->call_id);
}

kvr_status_t kvr_proto_hdr_unpack(const void *buf, size_t len, kvr_proto_hdr_t *hdr_p, char *err,
                                  size_t err_len)
{
    const uint8_t *p = buf;
    if (len != KVR_PROTO_HDR_LEN) {
        kvr_proto_set_err(err, err_len, "envelope is %zu bytes, want %d", len, KVR_PROTO_HDR_LEN);
        return KVR_ERR_CORRUPT;
    }
    if (p[0] != KVR_PROTO_MAGIC0 || p[1] != KVR_PROTO_MAGIC1) {
        kvr_proto_set_err(err, err_len, "envelope has bad magic 0x%02x%02x (want 'KR')", p[0],
                          p[1]);
        return KVR_ERR_CORRUPT;
    }
    kvr_proto_hdr_t h = {
        .version = p[2],
        .flags = p[3],
        .method = (uint16_t)(p[4] | (p[5] << 8)),
        .call_id = get_le64(p + 8),
    };
    *hdr_p = h;
    if (h.version != KVR_PROTO_VERSION) {
        kvr_proto_set_err(err, err_len, "protocol version %u not supported (this side speaks %d)",
                          h.version, KVR_PROTO_VERSION);
        return KVR_ERR_VERSION;
    }
    /* method 0 is used only by error replies to a message whose envelope
     * could not be read */
    if (!method_lookup(h.method) && !(h.method == 0 && (h.flags & KVR_PROTO_F_ERROR))) {
        kvr_proto_set_err(err, err_len, "unknown method %u", h.method);
        return KVR_ERR_UNSUPPORTED;
    }
    return KVR_OK;
}

static kvr_status_t map_errno(int e)
{
    switch (e) {
    case EAGAIN:
        return KVR_ERR_NO_RESOURCE;
    case EHOSTUNREACH:
        return KVR_ERR_NOT_FOUND;
    case ETERM:
    case ENOTSOCK:
        return KVR_ERR_CLOSED;
    default:
        return KVR_ERR_IO;
    }
}

kvr_status_t kvr_proto_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p)
{
    size_t len = msg ? protobuf_c_message_get_packed_size(msg) : 0;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return KVR_ERR_NO_MEMORY;
    if (len)
        protobuf_c_message_pack(msg, buf);
    *buf_p = buf;
    *len_p = len;
    return KVR_OK;
}

static void free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

kvr_status_t kvr_proto_pack_parts(const kvr_proto_hdr_t *hdr, const ProtobufCMessage *msg,
                                  uint8_t env[KVR_PROTO_HDR_LEN], uint8_t **buf_p, size_t *len_p)
{
    kvr_proto_hdr_pack(hdr, env);
    return kvr_proto_pack(msg, buf_p, len_p);
}

kvr_status_t kvr_proto_send(void *sock, const void *route, size_t route_len,
                            const kvr_proto_hdr_t *hdr, const ProtobufCMessage *msg)
{
    uint8_t env[KVR_PROTO_HDR_LEN];
    uint8_t *buf = NULL;
    size_t len = 0;
    kvr_status_t st = kvr_proto_pack_parts(hdr, msg, env, &buf, &len);
    if (st != KVR_OK)
        return st;

    if (route && zmq_send(sock, route, route_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        goto err_errno;
    /* The envelope rides with the payload: once the first part is queued the
     * rest of a multipart message is accepted atomically by libzmq. */
    if (zmq_send(sock, env, sizeof(env), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        goto err_errno;
    zmq_msg_t m;
    if (zmq_msg_init_data(&m, buf, len, free_buf, NULL) != 0)
        goto err_errno;
    buf = NULL; /* owned by m now */
    if (zmq_msg_send(&m, sock, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&m);
        return map_errno(e);
    }
    return KVR_OK;

err_errno : {
    int e = zmq_errno();
    free(buf);
    return map_errno(e);
}
}

kvr_status_t kvr_proto_send_error(void *sock, const void *route, size_t route_len, unsigned method,
                                  uint64_t call_id, kvr_status_t code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    s.code = code;
    s.message = text;
    kvr_proto_hdr_t h = {
        .version = KVR_PROTO_VERSION,
        .flags = KVR_PROTO_F_END | KVR_PROTO_F_ERROR,
        .method = (uint16_t)method,
        .call_id = call_id,
    };
    return kvr_proto_send(sock, route, route_len, &h, &s.base);
}

void kvr_proto_frame_clear(kvr_proto_frame_t *frame)
{
    free(frame->payload);
    memset(frame, 0, sizeof(*frame));
}

kvr_status_t kvr_proto_frame_parts(kvr_proto_frame_t *frame, size_t nparts, const void *env,
                                   size_t env_len, const void *payload, size_t payload_len,
                                   char *err, size_t err_len)
{
    frame->nparts = nparts;
    frame->have_hdr = false;
    frame->payload = NULL;
    frame->payload_len = 0;
    kvr_status_t st = KVR_OK;
    if (nparts >= 1) {
        st = kvr_proto_hdr_unpack(env, env_len, &frame->hdr, err, err_len);
        frame->have_hdr = st == KVR_OK || st == KVR_ERR_VERSION || st == KVR_ERR_UNSUPPORTED;
    }
    if (st == KVR_OK && nparts >= 2) {
        if (payload_len > KVR_PROTO_MAX_PAYLOAD) {
            kvr_proto_set_err(err, err_len, "payload of %zu bytes exceeds the %u-byte limit",
                              payload_len, KVR_PROTO_MAX_PAYLOAD);
            st = KVR_ERR_CORRUPT;
        }
    }
    if (st == KVR_OK && nparts != 2) {
        kvr_proto_set_err(err, err_len,
                          "message has %zu frames after the routing id, want 2 (envelope, payload)",
                          nparts);
        st = KVR_ERR_CORRUPT;
    }
    if (st == KVR_OK && payload_len) {
        frame->payload = malloc(payload_len);
        if (!frame->payload)
            return KVR_ERR_NO_MEMORY;
        memcpy(frame->payload, payload, payload_len);
        frame->payload_len = payload_len;
    }
    return st;
}

kvr_status_t kvr_proto_recv(void *sock, bool routed, kvr_proto_frame_t *frame_p, char *err,
                            size_t err_len)
{
    memset(frame_p, 0, sizeof(*frame_p));
    frame_p->src_fd = -1;
    size_t part = 0, nparts = 0;
    int more = 1;
    /* the envelope and the payload are kept open until the whole message
     * is drained, then checked by kvr_proto_frame_parts; other parts are
     * counted and closed */
    zmq_msg_t kept[2];
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        /* Parts after the first are already here (multipart is atomic), so
         * DONTWAIT never splits a message. */
        if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            for (size_t k = 0; k < nparts && k < 2; k++)
                zmq_msg_close(&kept[k]);
            if (part == 0)
                return map_errno(e);
            kvr_proto_set_err(err, err_len, "message cut short after %zu parts", part);
            return KVR_ERR_IO;
        }
        more = zmq_msg_more(&m);
        if (routed && frame_p->src_fd < 0)
            frame_p->src_fd = zmq_msg_get(&m, ZMQ_SRCFD); /* set on the parts from the wire */
        if (!frame_p->user_id[0]) {
            /* on the parts from the wire (not a ROUTER's routing-id part);
             * NULL without ZAP */
            const char *uid = zmq_msg_gets(&m, "User-Id");
            if (uid)
                snprintf(frame_p->user_id, sizeof(frame_p->user_id), "%s", uid);
        }
        if (routed && part == 0) {
            size_t len = zmq_msg_size(&m);
            size_t n = len < KVR_PROTO_MAX_ROUTE ? len : KVR_PROTO_MAX_ROUTE;
            memcpy(frame_p->route, zmq_msg_data(&m), n);
            frame_p->route_len = n;
            zmq_msg_close(&m);
        } else if (nparts < 2) {
            zmq_msg_init(&kept[nparts]);
            zmq_msg_move(&kept[nparts++], &m);
            zmq_msg_close(&m);
        } else {
            nparts++;
            zmq_msg_close(&m);
        }
        part++;
    }
    kvr_status_t st = kvr_proto_frame_parts(
        frame_p, nparts, nparts >= 1 ? zmq_msg_data(&kept[0]) : NULL,
        nparts >= 1 ? zmq_msg_size(&kept[0]) : 0, nparts >= 2 ? zmq_msg_data(&kept[1]) : NULL,
        nparts >= 2 ? zmq_msg_size(&kept[1]) : 0, err, err_len);
    for (size_t k = 0; k < nparts && k < 2; k++)
        zmq_msg_close(&kept[k]);
    return st;
}

kvr_status_t kvr_proto_decode(const kvr_proto_frame_t *frame,
                              const ProtobufCMessageDescriptor *desc, ProtobufCMessage **msg_p,
                              char *err, size_t err_len)
{
    if (!desc) {
        if (frame->hdr.flags & KVR_PROTO_F_ERROR)
            desc = &kvrail__status__descriptor;
        else
            desc = kvr_proto_method_desc(frame->hdr.method);
    }
    if (!desc) {
        kvr_proto_set_err(err, err_len, "no payload type for method %u", frame->hdr.method);
        return KVR_ERR_UNSUPPORTED;
    }
    static const uint8_t empty[1];
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, frame->payload_len,
                                                      frame->payload ? frame->payload : empty);
    if (!msg) {
        kvr_proto_set_err(err, err_len,
                          "payload (%zu bytes) is not a valid %s message (garbage or truncated)",
                          frame->payload_len, desc->name);
        return KVR_ERR_INVALID;
    }
    *msg_p = msg;
    return KVR_OK;
}

kvr_status_t kvr_proto_decode_request(const kvr_proto_frame_t *frame,
                                      const ProtobufCMessageDescriptor *desc,
                                      ProtobufCMessage **msg_p, char *err, size_t err_len)
{
    if (frame->hdr.flags & KVR_PROTO_F_ERROR) {
        kvr_proto_set_err(err, err_len,
                          "%s frame has the ERROR flag: only replies carry errors, a request or "
                          "notification never does",
                          kvr_proto_method_label(frame->hdr.method));
        return KVR_ERR_INVALID;
    }
    if (!desc)
        desc = kvr_proto_method_desc(frame->hdr.method);
    if (!desc) {
        kvr_proto_set_err(err, err_len, "no payload type for method %u", frame->hdr.method);
        return KVR_ERR_UNSUPPORTED;
    }
    return kvr_proto_decode(frame, desc, msg_p, err, err_len);
}
