/*
 * loop.c - the steps of the router's loop, apart from the poll itself (in
 * main.c) so that a test driver (tests/fuzz/) runs the very same steps on
 * frames of its own: drain a socket (receive, refuse what does not parse,
 * hand the rest to the client or node endpoint), settle what a message left
 * (the registry's events to failover, then the queue pump), and run the
 * timers that are due.
 */
#include <stdio.h>
#include <string.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

/* What a message or a timer run left for the loop: the registry's events
 * (to failover), then the queue pump (which may leave more of either). */
void rt_loop_settle(rt_t *r, uint64_t now)
{
    while (r->n_events || r->pump_wanted) {
        if (r->n_events) {
            struct rt_event e = r->events[0];
            memmove(r->events, r->events + 1, --r->n_events * sizeof(e));
            rt_failover_node_lost(r, &r->nodes[e.node], now, e.why);
            continue;
        }
        r->pump_wanted = false;
        rt_dispatch_pump(r, now);
    }
}

/* The timers that are due; each module re-arms its next one. */
void rt_loop_timers(rt_t *r, uint64_t now)
{
    r->next_deadline = UINT64_MAX;
    rt_bad_log_tick(r, now);
    rt_registry_tick(r, now);
    rt_loop_settle(r, now);
    rt_failover_tick(r, now);
    rt_loop_settle(r, now);
}

void rt_loop_frame(rt_t *r, void *sock, bool client, kvr_proto_frame_t *f, kvr_status_t st,
                   const char *err, uint64_t now)
{
    if (st != KVR_OK) {
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "%s endpoint: bad message from '%.*s': %s (%s)",
                         client ? "client" : "node", (int)f->route_len, (const char *)f->route, err,
                         kvr_status_name(st));
        if (f->route_len)
            kvr_proto_send_error(sock, f->route, f->route_len,
                                 f->have_hdr && st != KVR_ERR_UNSUPPORTED ? f->hdr.method : 0u,
                                 f->have_hdr ? f->hdr.call_id : 0u, st, "%s", err);
    } else if (client) {
        rt_client_msg(r, f, now);
    } else {
        rt_node_msg(r, f, now);
    }
    rt_loop_settle(r, now);
}

void rt_loop_drain(rt_t *r, void *sock, bool client)
{
    for (int i = 0; i < 1024; i++) {
        kvr_proto_frame_t f;
        char err[512] = "";
        kvr_status_t st = kvr_proto_recv(sock, true, &f, err, sizeof(err));
        if (st == KVR_ERR_NO_RESOURCE)
            return;
        rt_loop_frame(r, sock, client, &f, st, err, kvr_now_ns());
        kvr_proto_frame_clear(&f);
    }
}
