/*
 * node_ep.c - the router's node endpoint: one table from method to handler.
 * A frame is decoded (the generic decoder picks the message by method), an
 * error frame from a node is logged, REGISTER and HEARTBEAT are taken from
 * anyone (a heartbeat from an unknown peer is told to register), every other
 * method only from a registered node.  A method not in the table is refused
 * with KVR_ERR_UNSUPPORTED.
 */
#include <stdio.h>

#include "kvr_log.h"
#include "router.h"

typedef void (*rt_node_handler)(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                                const ProtobufCMessage *m, uint64_t now);

enum { FROM_ANY_ROLE = 0, FROM_DECODE = 1 };

struct rt_node_method {
    const ProtobufCMessageDescriptor *desc; /* optional: default, by method */
    bool anyone;                            /* accepted from an unregistered peer */
    int from;                               /* FROM_DECODE: only a decode node sends it */
    rt_node_handler fn;
};

static void h_register(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                       const ProtobufCMessage *m, uint64_t now)
{
    (void)n;
    rt_registry_on_register(r, f, (const Kvrail__RegisterRequest *)m, now);
}

static void h_heartbeat(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                        const ProtobufCMessage *m, uint64_t now)
{
    rt_registry_on_heartbeat(r, f, n, (const Kvrail__Heartbeat *)m, now);
}

static void h_block_events(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                           const ProtobufCMessage *m, uint64_t now)
{
    rt_dirsync_on_events(r, n, f, (const Kvrail__BlockEvents *)m, now);
}

static void h_resync_dump(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                          const ProtobufCMessage *m, uint64_t now)
{
    (void)f;
    rt_dirsync_on_dump(r, n, (const Kvrail__ResyncDump *)m, now);
}

static void h_reserved(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                       const ProtobufCMessage *m, uint64_t now)
{
    (void)f;
    rt_on_reserved(r, n, (const Kvrail__Reserved *)m, now);
    rt_registry_reserve_answered(r, n, now);
}

static void h_rejected(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                       const ProtobufCMessage *m, uint64_t now)
{
    (void)f;
    rt_on_rejected(r, n, (const Kvrail__Rejected *)m, now);
    rt_registry_reserve_answered(r, n, now);
}

static void h_prefill_done(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                           const ProtobufCMessage *m, uint64_t now)
{
    (void)f;
    rt_on_prefill_done(r, n, (const Kvrail__PrefillDone *)m, now);
}

static void h_token(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                    const ProtobufCMessage *m, uint64_t now)
{
    (void)f;
    rt_on_token(r, n, (const Kvrail__Token *)m, now);
}

static const struct rt_node_method *method_of(unsigned method)
{
    static const struct rt_node_method t[] = {
        [KVRAIL__METHOD__REGISTER] = {NULL, true, FROM_ANY_ROLE, h_register},
        [KVRAIL__METHOD__HEARTBEAT] = {NULL, true, FROM_ANY_ROLE, h_heartbeat},
        [KVRAIL__METHOD__BLOCK_EVENTS] = {NULL, false, FROM_DECODE, h_block_events},
        /* a node's RESYNC message is the dump */
        [KVRAIL__METHOD__RESYNC] = {&kvrail__resync_dump__descriptor, false, FROM_DECODE,
                                    h_resync_dump},
        [KVRAIL__METHOD__RESERVED] = {NULL, false, FROM_DECODE, h_reserved},
        [KVRAIL__METHOD__REJECTED] = {NULL, false, FROM_DECODE, h_rejected},
        /* a decode node sends it for a local prefill */
        [KVRAIL__METHOD__PREFILL_DONE] = {NULL, false, FROM_ANY_ROLE, h_prefill_done},
        [KVRAIL__METHOD__TOKEN] = {NULL, false, FROM_DECODE, h_token},
    };
    if (method >= sizeof(t) / sizeof(t[0]) || !t[method].fn)
        return NULL;
    return &t[method];
}

void rt_node_msg(rt_t *r, kvr_proto_frame_t *f, uint64_t now)
{
    char err[512] = "";
    ProtobufCMessage *m = NULL;
    struct rt_node *n = rt_node_by_route(r, f->route, f->route_len);
    unsigned method = f->hdr.method;
    if (!rt_auth_node_ok(r, f, n)) {
        kvr_proto_send_error(
            r->node_sock, f->route, f->route_len, method, f->hdr.call_id, KVR_ERR_INVALID,
            "this connection's key is not node %s's key: refused (auth: curve)", n->name);
        return;
    }
    const struct rt_node_method *h = method_of(method);
    bool is_error = f->hdr.flags & KVR_PROTO_F_ERROR;
    /* an error frame is decoded as kvrail.Status and only logged; anything
     * else as the method's own type (never Status cast to it) */
    kvr_status_t st = is_error
                          ? kvr_proto_decode(f, NULL, &m, err, sizeof(err))
                          : kvr_proto_decode_request(f, h ? h->desc : NULL, &m, err, sizeof(err));
    if (st != KVR_OK) {
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "node endpoint: bad %s from '%.*s': %s",
                         kvr_proto_method_label(method), (int)f->route_len, (const char *)f->route,
                         err);
        kvr_proto_send_error(r->node_sock, f->route, f->route_len, method, f->hdr.call_id, st, "%s",
                             err);
        return;
    }
    if (is_error) {
        Kvrail__Status *s = (Kvrail__Status *)m;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "node %.*s reports an error for %s: %s (%d)", (int)f->route_len,
                         (const char *)f->route, kvr_proto_method_label(method), s->message,
                         s->code);
    } else if (h && n && n->registered && h->from == FROM_DECODE &&
               n->role != KVR_NODE_ROLE_DECODE) {
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "node %s (%s) sent %s, which only decode nodes send", n->name,
                         kvr_node_role_name(n->role), kvr_proto_method_label(method));
        kvr_proto_send_error(r->node_sock, f->route, f->route_len, method, f->hdr.call_id,
                             KVR_ERR_INVALID, "%s is sent by decode nodes only; node %s is %s",
                             kvr_proto_method_label(method), n->name, kvr_node_role_name(n->role));
    } else if (h && (h->anyone || (n && n->registered))) {
        h->fn(r, f, n, m, now);
    } else if (!n || !n->registered) {
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "node endpoint: %s from unregistered peer '%.*s'",
                         kvr_proto_method_label(method), (int)f->route_len, (const char *)f->route);
        kvr_proto_send_error(r->node_sock, f->route, f->route_len, method, f->hdr.call_id,
                             KVR_ERR_NOT_FOUND,
                             "node '%.*s' is not registered: send REGISTER first",
                             (int)f->route_len, (const char *)f->route);
    } else {
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "node %s sent %s, which nodes do not send", n->name,
                         kvr_proto_method_label(method));
        kvr_proto_send_error(r->node_sock, f->route, f->route_len, method, f->hdr.call_id,
                             KVR_ERR_UNSUPPORTED, "method %s is not accepted at the node endpoint",
                             kvr_proto_method_label(method));
    }
    protobuf_c_message_free_unpacked(m, NULL);
}
