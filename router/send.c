/*
 * send.c - messages out of the router.  To a node: by its name, the routing
 * id of its DEALER on the node socket; a send that finds the connection gone
 * (ZMQ_ROUTER_MANDATORY) marks the node, and the registry's next deadline
 * declares it dead.  To a client: the Generate stream frames, by the route
 * the request came in on; a client found gone has its route cleared.  A
 * Reserve sent starts the wait for the decode node's answer
 * (rsv_wait_since; registry.c).
 */
#include <inttypes.h>
#include <string.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

kvr_status_t rt_send_node(rt_t *r, struct rt_node *n, unsigned method, const ProtobufCMessage *msg)
{
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, (uint16_t)method, 0};
    kvr_status_t st = kvr_proto_send(r->node_sock, n->name, strlen(n->name), &h, msg);
    if (st == KVR_OK && method == KVRAIL__METHOD__RESERVE && !n->rsv_wait_since) {
        /* a live decode node answers a Reserve within milliseconds: one
         * not answered within the heartbeat timeout makes it unresponsive
         * (registry.c), heartbeats or not */
        n->rsv_wait_since = kvr_now_ns();
        rt_timer_arm(r, n->rsv_wait_since +
                            (uint64_t)r->cl->timeouts.heartbeat_timeout_ms * 1000000ull + 1);
    }
    if (st == KVR_ERR_NOT_FOUND && n->alive && !n->conn_lost) {
        /* its connection is gone: the registry declares it dead right away */
        n->conn_lost = true;
        rt_timer_arm(r, 0);
    }
    if (st != KVR_OK)
        KVR_LOG_WARN("router", "cannot send %s to node %s: %s", kvr_proto_method_name(method),
                     n->name, kvr_status_str(st));
    return st;
}

void rt_send_node_cancel(rt_t *r, int idx, uint64_t id, kvr_status_t code, const char *why)
{
    if (idx < 0)
        return;
    Kvrail__NodeCancel c = KVRAIL__NODE_CANCEL__INIT;
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    s.code = code;
    s.message = (char *)why;
    c.request_id = id;
    c.reason = &s;
    rt_send_node(r, &r->nodes[idx], KVRAIL__METHOD__NODE_CANCEL, &c.base);
}

kvr_status_t rt_send_client(rt_t *r, struct rt_req *q, unsigned flags, const ProtobufCMessage *m)
{
    if (!q->route_len)
        return KVR_ERR_NOT_FOUND;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, (uint8_t)flags, KVRAIL__METHOD__GENERATE, q->call_id};
    kvr_status_t st = kvr_proto_send(r->client_sock, q->route, q->route_len, &h, m);
    if (st == KVR_ERR_NOT_FOUND) {
        /* the client's connection is gone (ZMQ_ROUTER_MANDATORY: unroutable) */
        q->route_len = 0;
    } else if (st != KVR_OK) {
        KVR_LOG_WARN("router", "request %" PRIu64 ": cannot send to client: %s", q->id,
                     kvr_status_str(st));
    }
    return st;
}
