/*
 * registry.c - the router's node registry.  Every prefill/decode node of the
 * cluster file has a slot (rt_node).  A node registers (RegisterRequest:
 * layout, fingerprint, transport address, rkeys) and heartbeats with its
 * load.  A heartbeat missing for heartbeat_timeout_ms, or a send that found
 * its connection gone, marks the node dead; a second registration replaces
 * the node's earlier incarnation.  Either is reported as an event on
 * r->events (the loop hands it to failover.c): the registry does not touch
 * the requests a node held.  Its timer is the earliest heartbeat deadline.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_log.h"
#include "router.h"

static uint64_t heartbeat_timeout_ns(const rt_t *r)
{
    return (uint64_t)r->cl->timeouts.heartbeat_timeout_ms * 1000000ull;
}

kvr_status_t rt_registry_init(rt_t *r)
{
    r->n_nodes = 0;
    for (size_t i = 0; i < r->cl->n_nodes; i++) {
        const kvr_cluster_node_t *c = &r->cl->nodes[i];
        if (c->role == KVR_NODE_ROLE_ROUTER)
            continue;
        if (r->n_nodes >= RT_MAX_NODES) {
            KVR_LOG_ERROR("router", "%s: more than %d prefill/decode nodes", r->cl->path,
                          RT_MAX_NODES);
            return KVR_ERR_UNSUPPORTED;
        }
        struct rt_node *n = &r->nodes[r->n_nodes];
        memset(n, 0, sizeof(*n));
        n->idx = r->n_nodes++;
        n->conf = c;
        n->role = c->role;
        snprintf(n->name, sizeof(n->name), "%s", c->name);
    }
    if (!rt_dir_init(&r->dir, RT_DIR_ENTRIES))
        return KVR_ERR_NO_MEMORY;
    return KVR_OK;
}

static void free_blobs(struct rt_node *n)
{
    free(n->addr);
    n->addr = NULL;
    n->addr_len = 0;
    for (size_t i = 0; i < n->n_rkeys; i++)
        free(n->rkeys[i]);
    free(n->rkeys);
    free(n->rkey_lens);
    free(n->layer_base);
    n->rkeys = NULL;
    n->rkey_lens = NULL;
    n->layer_base = NULL;
    n->n_rkeys = n->n_layer_base = 0;
}

void rt_registry_fini(rt_t *r)
{
    for (int i = 0; i < r->n_nodes; i++) {
        free_blobs(&r->nodes[i]);
        rt_dirsync_fini(&r->nodes[i]);
    }
    rt_dir_fini(&r->dir);
}

struct rt_node *rt_node_by_route(rt_t *r, const uint8_t *route, size_t len)
{
    for (int i = 0; i < r->n_nodes; i++)
        if (strlen(r->nodes[i].name) == len && !memcmp(r->nodes[i].name, route, len))
            return &r->nodes[i];
    return NULL;
}

uint64_t rt_registry_live_decode(const rt_t *r)
{
    uint64_t m = 0;
    for (int i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].role == KVR_NODE_ROLE_DECODE && r->nodes[i].alive)
            m |= 1ull << i;
    return m;
}

/* The event the loop hands to failover.c.  At most one per node per
 * message or timer run, and the loop runs them after each: never full. */
static void report_lost(rt_t *r, struct rt_node *n, const char *why)
{
    if (r->n_events >= RT_MAX_EVENTS) {
        KVR_LOG_ERROR("router", "node %s %s: event list full (a bug)", n->name, why);
        return;
    }
    struct rt_event *e = &r->events[r->n_events++];
    e->node = n->idx;
    snprintf(e->why, sizeof(e->why), "%s", why);
}

static void reply_register(rt_t *r, struct rt_node *n, const kvr_proto_frame_t *f,
                           kvr_status_t code, const char *msg)
{
    Kvrail__RegisterReply rep = KVRAIL__REGISTER_REPLY__INIT;
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    s.code = code;
    s.message = (char *)msg;
    rep.status = &s;
    rep.heartbeat_interval_ms = r->cl->timeouts.heartbeat_ms;
    rep.heartbeat_timeout_ms = r->cl->timeouts.heartbeat_timeout_ms;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END | (code ? KVR_PROTO_F_ERROR : 0),
                         KVRAIL__METHOD__REGISTER, f->hdr.call_id};
    if (code) {
        kvr_proto_send(r->node_sock, f->route, f->route_len, &h, &s.base);
        return;
    }
    (void)n;
    kvr_proto_send(r->node_sock, f->route, f->route_len, &h, &rep.base);
}

static kvr_status_t check_layout(rt_t *r, const struct rt_node *self,
                                 const Kvrail__RegisterRequest *q, char *err, size_t err_len)
{
    const Kvrail__KvLayout *l = q->layout;
    if (!l || !l->layers || !l->kv_heads || !l->head_dim || !l->block_size) {
        snprintf(err, err_len, "register: layout missing or has a zero field");
        return KVR_ERR_INVALID;
    }
    if (l->block_size != r->cl->block_size) {
        snprintf(err, err_len, "register: block size %u, the cluster file says %u", l->block_size,
                 r->cl->block_size);
        return KVR_ERR_MISMATCH;
    }
    if (strcmp(l->dtype ? l->dtype : "", r->cl->kv_dtype)) {
        snprintf(err, err_len,
                 "register: KV dtype '%s', the cluster file says kv_dtype %s (every node must run "
                 "with the router's cluster file)",
                 l->dtype ? l->dtype : "", r->cl->kv_dtype);
        return KVR_ERR_MISMATCH;
    }
    const size_t kcap = sizeof(((struct rt_node *)0)->kernels);
    if (l->kernels && strnlen(l->kernels, kcap) >= kcap) {
        snprintf(err, err_len, "register: KV layout field kernels is longer than %zu bytes",
                 kcap - 1);
        return KVR_ERR_INVALID;
    }
    /* the engine's numerics: another mode computes other logits ("" from a
     * node that predates the field: f32) */
    const char *num = l->numerics && l->numerics[0] ? l->numerics : "f32";
    if (strcmp(num, r->cl->numerics)) {
        snprintf(err, err_len,
                 "register: KV layout field numerics is '%s', the cluster file says numerics %s "
                 "(every node must compute with the router's cluster file's numerics)",
                 num, r->cl->numerics);
        return KVR_ERR_MISMATCH;
    }
    if (q->transport_address.len > RT_MAX_ADDR_BYTES || q->n_layer_rkeys > RT_MAX_RKEYS ||
        q->n_layer_base > RT_MAX_RKEYS) {
        snprintf(err, err_len,
                 "register: transport address of %zu bytes, %zu rkeys, %zu layer bases (at most "
                 "%u bytes, %u and %u)",
                 q->transport_address.len, q->n_layer_rkeys, q->n_layer_base, RT_MAX_ADDR_BYTES,
                 RT_MAX_RKEYS, RT_MAX_RKEYS);
        return KVR_ERR_INVALID;
    }
    for (size_t i = 0; i < q->n_layer_rkeys; i++)
        if (q->layer_rkeys[i].len > RT_MAX_ADDR_BYTES) {
            snprintf(err, err_len, "register: rkey %zu is %zu bytes (at most %u)", i,
                     q->layer_rkeys[i].len, RT_MAX_ADDR_BYTES);
            return KVR_ERR_INVALID;
        }
    /* Compared with the live nodes only: a node that registered with a wrong
     * model and died (or a bogus first registration) must not lock out the
     * real nodes until the router restarts.  The KV layout field by field
     * first (a prefill node's blocks must be byte for byte a decode node's),
     * then the model fingerprint. */
    for (int i = 0; i < r->n_nodes; i++) {
        const struct rt_node *o = &r->nodes[i];
        if (o == self || !o->registered || !o->alive)
            continue;
        const struct {
            const char *what;
            uint32_t mine, theirs;
        } f[] = {
            {"block_size (tokens per block)", l->block_size, o->block_size},
            {"layers", l->layers, o->layers},
            {"kv_heads", l->kv_heads, o->kv_heads},
            {"head_dim", l->head_dim, o->head_dim},
            {"max_context", l->max_context, o->max_context},
            {"vocab_size", l->vocab_size, o->vocab_size},
        };
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
            if (f[k].mine != f[k].theirs && (k < 4 || (f[k].mine && f[k].theirs))) {
                /* the model's sizes: when both gave them */
                snprintf(err, err_len,
                         "register: KV layout field %s is %u, but live node %s has %u (every node "
                         "must run the same model with the same cluster file)",
                         f[k].what, f[k].mine, o->name, f[k].theirs);
                return KVR_ERR_MISMATCH;
            }
        if (strcmp(o->dtype, l->dtype ? l->dtype : "")) {
            snprintf(err, err_len,
                     "register: KV layout field dtype is '%s', but live node %s has '%s' (every "
                     "node must run with the same kv_dtype)",
                     l->dtype ? l->dtype : "", o->name, o->dtype);
            return KVR_ERR_MISMATCH;
        }
        /* the engine kernels' bit class: cpu-base (no FMA) rounds otherwise
         * than cpu-fma16, and a request's KV and logits would depend on
         * which nodes served it ("" from a node that predates the field) */
        const char *kern = l->kernels ? l->kernels : "";
        if (kern[0] && o->kernels[0] && strcmp(kern, o->kernels)) {
            snprintf(err, err_len,
                     "register: KV layout field kernels is '%s', but live node %s has '%s' (their "
                     "logits differ in the last bits; run every node with the same kernels: "
                     "x86-64-v3+ CPUs (AVX2+FMA) and an optimized gcc build give cpu-fma16.R, "
                     "and one kvrail build one R, docs/engine.md)",
                     kern, o->name, o->kernels);
            return KVR_ERR_MISMATCH;
        }
        if (strcmp(o->fingerprint, q->model_fingerprint ? q->model_fingerprint : "")) {
            snprintf(err, err_len, "register: model fingerprint '%s' differs from node %s's '%s'",
                     q->model_fingerprint, o->name, o->fingerprint);
            return KVR_ERR_MISMATCH;
        }
    }
    return KVR_OK;
}

void rt_registry_on_register(rt_t *r, const kvr_proto_frame_t *f, const Kvrail__RegisterRequest *q,
                             uint64_t now)
{
    char err[512];
    struct rt_node *n = rt_node_by_route(r, f->route, f->route_len);
    const char *qname = q->node_name ? q->node_name : "";
    if (!n) {
        snprintf(err, sizeof(err),
                 "register: node '%.*s' is not a prefill/decode node of cluster file %.200s "
                 "(the DEALER routing id must be the node name)",
                 (int)f->route_len, (const char *)f->route, r->cl->path);
        KVR_LOG_WARN("router", "%s", err);
        r->st.refused_registrations++;
        reply_register(r, NULL, f, KVR_ERR_NOT_FOUND, err);
        return;
    }
    if (strcmp(qname, n->name)) {
        snprintf(err, sizeof(err), "register: node_name '%s' differs from routing id '%s'", qname,
                 n->name);
        r->st.refused_registrations++;
        reply_register(r, n, f, KVR_ERR_INVALID, err);
        return;
    }
    enum kvr_node_role role = q->role == KVRAIL__ROLE__ROLE_PREFILL  ? KVR_NODE_ROLE_PREFILL
                              : q->role == KVRAIL__ROLE__ROLE_DECODE ? KVR_NODE_ROLE_DECODE
                                                                     : 0;
    if (role != n->role) {
        snprintf(err, sizeof(err),
                 "register: node %s registers as role %d, the cluster file says %s", n->name,
                 (int)q->role, kvr_node_role_name(n->role));
        r->st.refused_registrations++;
        reply_register(r, n, f, KVR_ERR_MISMATCH, err);
        return;
    }
    if (role == KVR_NODE_ROLE_DECODE && !q->total_blocks) {
        r->st.refused_registrations++;
        snprintf(err, sizeof(err),
                 "register: decode node %s has no KV blocks (total_blocks 0): its block "
                 "directory entries are bounded by its pool",
                 n->name);
        reply_register(r, n, f, KVR_ERR_INVALID, err);
        return;
    }
    if (q->protocol_version && q->protocol_version != KVR_PROTO_VERSION) {
        snprintf(err, sizeof(err), "register: protocol version %u, the router speaks %d",
                 q->protocol_version, KVR_PROTO_VERSION);
        r->st.refused_registrations++;
        reply_register(r, n, f, KVR_ERR_VERSION, err);
        return;
    }
    kvr_status_t st = check_layout(r, n, q, err, sizeof(err));
    if (st != KVR_OK) {
        r->st.refused_registrations++;
        KVR_LOG_WARN("router", "node %s: %s", n->name, err);
        reply_register(r, n, f, st, err);
        return;
    }
    if (n->registered) {
        KVR_LOG_WARN("router", "node %s registers again (incarnation %" PRIx64 " -> %" PRIx64 ")",
                     n->name, n->incarnation, q->incarnation);
        report_lost(r, n, "re-registered");
    }
    free_blobs(n);
    rt_dirsync_reset(r, n);
    rt_dir_set_limit(&r->dir, n->idx, q->total_blocks);
    n->registered = true;
    n->alive = true;
    n->conn_lost = false;
    n->rsv_wait_since = 0;
    n->incarnation = q->incarnation;
    memset(n->sent_d_inc, 0, sizeof(n->sent_d_inc));   /* a new process knows no decode node */
    memset(n->token_d_inc, 0, sizeof(n->token_d_inc)); /* nor tokens: new ones for it */
    n->last_hb_ns = now;
    n->registered_ns = now;
    snprintf(n->fingerprint, sizeof(n->fingerprint), "%s", q->model_fingerprint);
    snprintf(n->transport, sizeof(n->transport), "%s", q->transport);
    snprintf(n->host, sizeof(n->host), "%s", q->host);
    n->layers = q->layout->layers;
    n->kv_heads = q->layout->kv_heads;
    n->head_dim = q->layout->head_dim;
    n->block_size = q->layout->block_size;
    n->max_context = q->layout->max_context;
    n->vocab_size = q->layout->vocab_size;
    snprintf(n->dtype, sizeof(n->dtype), "%s", q->layout->dtype);
    snprintf(n->kernels, sizeof(n->kernels), "%s", q->layout->kernels ? q->layout->kernels : "");
    if (q->transport_address.len && q->transport_address.data) {
        n->addr = malloc(q->transport_address.len);
        if (n->addr) {
            memcpy(n->addr, q->transport_address.data, q->transport_address.len);
            n->addr_len = q->transport_address.len;
        }
    }
    if (q->n_layer_rkeys) {
        n->rkeys = calloc(q->n_layer_rkeys, sizeof(*n->rkeys));
        n->rkey_lens = calloc(q->n_layer_rkeys, sizeof(*n->rkey_lens));
        if (n->rkeys && n->rkey_lens) {
            n->n_rkeys = q->n_layer_rkeys;
            for (size_t i = 0; i < q->n_layer_rkeys; i++) {
                n->rkeys[i] = malloc(q->layer_rkeys[i].len ? q->layer_rkeys[i].len : 1);
                if (n->rkeys[i]) {
                    if (q->layer_rkeys[i].len) /* an empty rkey's data is NULL */
                        memcpy(n->rkeys[i], q->layer_rkeys[i].data, q->layer_rkeys[i].len);
                    n->rkey_lens[i] = q->layer_rkeys[i].len;
                }
            }
        }
    }
    if (q->n_layer_base) {
        n->layer_base = calloc(q->n_layer_base, sizeof(uint64_t));
        if (n->layer_base) {
            memcpy(n->layer_base, q->layer_base, q->n_layer_base * sizeof(uint64_t));
            n->n_layer_base = q->n_layer_base;
        }
    }
    n->layer_stride = q->layer_stride;
    n->block_bytes = q->block_bytes;
    n->total_blocks = q->total_blocks;
    n->free_blocks = q->total_blocks;
    n->free_est = q->total_blocks;
    n->reserved_blocks = n->batch_size = n->cached_blocks = 0;
    n->inflight_tokens = 0;
    n->reserving_blocks = 0;
    if (!r->context && n->max_context)
        r->context = n->max_context;
    if (!r->vocab && n->vocab_size)
        r->vocab = n->vocab_size;
    if (!r->model_fingerprint[0])
        snprintf(r->model_fingerprint, sizeof(r->model_fingerprint), "%s", n->fingerprint);
    KVR_LOG_INFO("router",
                 "node %s registered: %s, %s transport, layout %ux%ux%u %s bs %u, %u blocks, "
                 "model %s kernels %s",
                 n->name, kvr_node_role_name(n->role), n->transport, n->layers, n->kv_heads,
                 n->head_dim, n->dtype, n->block_size, n->total_blocks, n->fingerprint,
                 n->kernels[0] ? n->kernels : "-");
    reply_register(r, n, f, KVR_OK, "ok");
    rt_timer_arm(r, now + heartbeat_timeout_ns(r) + 1);
    r->pump_wanted = true;
}

void rt_registry_on_heartbeat(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
                              const Kvrail__Heartbeat *hb, uint64_t now)
{
    if (!n || !n->registered || (hb->incarnation && hb->incarnation != n->incarnation)) {
        Kvrail__HeartbeatReply rep = KVRAIL__HEARTBEAT_REPLY__INIT;
        rep.reregister = true;
        kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END, KVRAIL__METHOD__HEARTBEAT,
                             f->hdr.call_id};
        kvr_proto_send(r->node_sock, f->route, f->route_len, &h, &rep.base);
        return;
    }
    if (!n->alive) {
        KVR_LOG_WARN("router", "node %s is back (heartbeat after %" PRIu64 " ms)", n->name,
                     (now - n->last_hb_ns) / 1000000u);
        n->alive = true;
        rt_timer_arm(r, now + heartbeat_timeout_ns(r) + 1);
        if (n->role == KVR_NODE_ROLE_DECODE)
            rt_dirsync_request(r, n, now, "node came back");
    }
    n->last_hb_ns = now;
    n->total_blocks = hb->total_blocks ? hb->total_blocks : n->total_blocks;
    n->free_blocks = hb->free_blocks;
    n->cached_blocks = hb->cached_blocks;
    n->batch_size = hb->batch_size;
    n->reserved_blocks = hb->reserved_blocks;
    n->inflight_prefill_hb = hb->inflight_prefill_tokens;
    n->queued_prefill_hb = hb->queued_prefill_tokens;
    n->kv_bytes = hb->kv_bytes_moved;
    n->kv_ns = hb->kv_transfer_ns;
    n->bad_frames_hb = hb->bad_frames;
    n->bad_notifs_hb = hb->bad_notifications;
    n->quarantined_hb = hb->quarantined_blocks;
    n->fenced_hb = hb->quarantines_fenced;
    n->fence_expired_hb = hb->quarantines_expired;
    n->self_fenced_hb = hb->self_fenced;
    /* free estimate: what the node says minus what is on its way to it */
    n->free_est = (int64_t)hb->free_blocks - (int64_t)n->reserving_blocks;
    if (hb->block_event_seq <= n->ev_seq)
        n->hb_lag_seq = 0;
    if (n->role == KVR_NODE_ROLE_DECODE && hb->block_event_seq > n->ev_seq && !n->resync_wait) {
        char why[128];
        snprintf(why, sizeof(why), "heartbeat announces seq %" PRIu64 ", applied %" PRIu64,
                 hb->block_event_seq, n->ev_seq);
        /* events may still be in flight behind the heartbeat: only a lag that
         * survives two heartbeats counts */
        if (n->hb_lag_seq && n->hb_lag_seq > n->ev_seq) {
            rt_dirsync_request(r, n, now, why);
            n->hb_lag_seq = 0;
        } else {
            n->hb_lag_seq = hb->block_event_seq;
        }
    }
    r->pump_wanted = true;
}

void rt_registry_reserve_answered(rt_t *r, struct rt_node *n, uint64_t now)
{
    /* the wait starts again for the Reserves still unanswered */
    n->rsv_wait_since = n->reserving_blocks ? now : 0;
    if (n->rsv_wait_since)
        rt_timer_arm(r, now + heartbeat_timeout_ns(r) + 1);
}

/* A decode node that heartbeats but leaves a Reserve unanswered for the
 * heartbeat timeout (a black hole, a wedged loop) is out until it registers
 * again: its requests go elsewhere, the blame is its own. */
static void check_unresponsive(rt_t *r, struct rt_node *n, uint64_t now, uint64_t timeout)
{
    if (!n->alive || !n->rsv_wait_since)
        return;
    if (!n->reserving_blocks) {
        n->rsv_wait_since = 0;
        return;
    }
    if (now - n->rsv_wait_since <= timeout) {
        rt_timer_arm(r, n->rsv_wait_since + timeout + 1);
        return;
    }
    KVR_LOG_WARN("router",
                 "node %s (%s) is unresponsive: a Reserve unanswered for %" PRIu64
                 " ms while it heartbeats; its requests go elsewhere, it must register again",
                 n->name, kvr_node_role_name(n->role), (now - n->rsv_wait_since) / 1000000u);
    n->alive = false;
    n->registered = false; /* its heartbeats are answered: register again */
    n->rsv_wait_since = 0;
    n->unresponsive++;
    r->st.dead_nodes++;
    rt_dirsync_reset(r, n);
    report_lost(r, n, "left a Reserve unanswered");
}

void rt_registry_tick(rt_t *r, uint64_t now)
{
    uint64_t timeout = heartbeat_timeout_ns(r);
    for (int i = 0; i < r->n_nodes; i++) {
        struct rt_node *n = &r->nodes[i];
        if (!n->registered)
            continue;
        check_unresponsive(r, n, now, timeout);
        if (!n->registered)
            continue;
        bool lost = n->conn_lost;
        n->conn_lost = false;
        if (n->alive && (lost || now - n->last_hb_ns > timeout)) {
            n->alive = false;
            r->st.dead_nodes++;
            if (lost)
                KVR_LOG_WARN("router", "node %s (%s) is dead: its connection is gone", n->name,
                             kvr_node_role_name(n->role));
            else
                KVR_LOG_WARN("router", "node %s (%s) is dead: no heartbeat for %" PRIu64 " ms",
                             n->name, kvr_node_role_name(n->role),
                             (now - n->last_hb_ns) / 1000000u);
            rt_dirsync_reset(r, n);
            report_lost(r, n, lost ? "lost its connection" : "missed heartbeats");
        }
        if (n->alive && n->resync_wait) {
            if (now - n->resync_sent_ns > RT_RESYNC_RETRY_NS)
                rt_dirsync_request(r, n, now, "no dump yet");
            rt_timer_arm(r, n->resync_sent_ns + RT_RESYNC_RETRY_NS + 1);
        }
        if (n->alive)
            rt_timer_arm(r, n->last_hb_ns + timeout + 1);
    }
}
