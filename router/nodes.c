/*
 * nodes.c - the router's node registry and block directory.
 *
 * Every prefill/decode node of the cluster file has a slot (rt_node).  A node
 * registers (RegisterRequest: layout, fingerprint, transport address, rkeys),
 * heartbeats with its load, and - decode nodes - publishes BlockEvents with a
 * per-node sequence number.  A heartbeat missing for heartbeat_timeout_ms
 * marks the node dead and hands its requests to rt_node_lost().
 *
 * The block directory maps a chained sequence hash to a 64-bit mask of the
 * decode nodes holding that block.  An event whose seq is not last + 1 (or a
 * heartbeat announcing a later seq than applied) starts a resync: the router
 * asks for a full dump (RESYNC), holds the events arriving meanwhile, then
 * rebuilds that node's bits from the dump and replays the held events newer
 * than the dump.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

#define RT_RESYNC_RETRY_NS (2000ull * 1000000ull)
#define RT_MAX_HELD_EVENTS 4096

kvr_status_t rt_nodes_init(rt_t *r)
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
    if (!rt_u64map_init(&r->dir, 4096))
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

static void drop_held(struct rt_node *n)
{
    for (size_t i = 0; i < n->n_ev_buf; i++)
        free(n->ev_buf[i]);
    free(n->ev_buf);
    free(n->ev_buf_len);
    n->ev_buf = NULL;
    n->ev_buf_len = NULL;
    n->n_ev_buf = 0;
}

void rt_nodes_fini(rt_t *r)
{
    for (int i = 0; i < r->n_nodes; i++) {
        free_blobs(&r->nodes[i]);
        drop_held(&r->nodes[i]);
    }
    rt_u64map_free(&r->dir);
}

struct rt_node *rt_node_by_route(rt_t *r, const uint8_t *route, size_t len)
{
    for (int i = 0; i < r->n_nodes; i++)
        if (strlen(r->nodes[i].name) == len && !memcmp(r->nodes[i].name, route, len))
            return &r->nodes[i];
    return NULL;
}

/* ---- block directory ---- */

static void dir_add(rt_t *r, struct rt_node *n, uint64_t h)
{
    uint64_t bit = 1ull << n->idx, m = 0;
    rt_u64map_get(&r->dir, h, &m);
    if (!(m & bit)) {
        n->dir_blocks++;
        if (!rt_u64map_put(&r->dir, h, m | bit))
            KVR_LOG_ERROR("router", "block directory: out of memory");
    }
}

static void dir_remove(rt_t *r, struct rt_node *n, uint64_t h)
{
    uint64_t bit = 1ull << n->idx, m = 0;
    if (!rt_u64map_get(&r->dir, h, &m) || !(m & bit))
        return;
    n->dir_blocks--;
    if (m == bit)
        rt_u64map_del(&r->dir, h);
    else
        rt_u64map_put(&r->dir, h, m & ~bit);
}

static void dir_clear_node(rt_t *r, struct rt_node *n)
{
    uint64_t bit = 1ull << n->idx;
    rt_u64map_t *m = &r->dir;
    for (size_t i = 0; i < m->cap;) {
        if (m->keys[i] && (m->vals[i] & bit)) {
            if (m->vals[i] == bit) {
                rt_u64map_del_slot(m, i); /* slot i now holds a shifted entry: re-check */
                continue;
            }
            m->vals[i] &= ~bit;
        }
        i++;
    }
    n->dir_blocks = 0;
}

void rt_dir_overlap(rt_t *r, const uint64_t *hashes, size_t n, uint32_t *overlap_p)
{
    uint64_t live = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        overlap_p[i] = 0;
        if (r->nodes[i].role == KVR_NODE_ROLE_DECODE && r->nodes[i].alive)
            live |= 1ull << i;
    }
    size_t k;
    for (k = 0; k < n && live; k++) {
        uint64_t m = 0;
        rt_u64map_get(&r->dir, hashes[k], &m);
        uint64_t lost = live & ~m;
        for (int i = 0; lost && i < r->n_nodes; i++)
            if (lost & (1ull << i)) {
                overlap_p[i] = (uint32_t)k;
                lost &= ~(1ull << i);
            }
        live &= m;
    }
    for (int i = 0; live && i < r->n_nodes; i++)
        if (live & (1ull << i))
            overlap_p[i] = (uint32_t)k;
}

static void request_resync(rt_t *r, struct rt_node *n, uint64_t now, const char *why)
{
    Kvrail__ResyncRequest q = KVRAIL__RESYNC_REQUEST__INIT;
    q.reason = (char *)why;
    if (!n->resync_wait) {
        n->resyncs++;
        r->st.resyncs++;
        KVR_LOG_WARN("router", "node %s: block directory resync (%s)", n->name, why);
    }
    n->resync_wait = true;
    n->resync_sent_ns = now;
    rt_send_node(r, n, KVRAIL__METHOD__RESYNC, &q.base);
}

static void apply_events(rt_t *r, struct rt_node *n, const Kvrail__BlockEvents *be, uint64_t now)
{
    for (size_t i = 0; i < be->n_events; i++) {
        const Kvrail__BlockEvent *e = be->events[i];
        if (e->seq <= n->ev_seq)
            continue; /* already applied (replay after a dump) */
        if (e->seq != n->ev_seq + 1) {
            char why[128];
            snprintf(why, sizeof(why), "event seq %" PRIu64 " after %" PRIu64, e->seq, n->ev_seq);
            request_resync(r, n, now, why);
            return;
        }
        switch (e->kind) {
        case KVRAIL__BLOCK_EVENT__KIND__STORED:
            for (size_t j = 0; j < e->n_block_hashes; j++)
                dir_add(r, n, e->block_hashes[j]);
            break;
        case KVRAIL__BLOCK_EVENT__KIND__REMOVED:
            for (size_t j = 0; j < e->n_block_hashes; j++)
                dir_remove(r, n, e->block_hashes[j]);
            break;
        case KVRAIL__BLOCK_EVENT__KIND__CLEARED:
            dir_clear_node(r, n);
            break;
        default:
            KVR_LOG_WARN("router", "node %s: unknown block event kind %d (seq %" PRIu64 ")",
                         n->name, (int)e->kind, e->seq);
            break;
        }
        n->ev_seq = e->seq;
    }
}

static void hold_events(struct rt_node *n, const kvr_proto_frame_t *f)
{
    if (n->n_ev_buf >= RT_MAX_HELD_EVENTS)
        return; /* the dump after the next resync covers it */
    uint8_t **b = realloc(n->ev_buf, (n->n_ev_buf + 1) * sizeof(*b));
    if (!b)
        return;
    n->ev_buf = b;
    size_t *l = realloc(n->ev_buf_len, (n->n_ev_buf + 1) * sizeof(*l));
    if (!l)
        return;
    n->ev_buf_len = l;
    uint8_t *copy = malloc(f->payload_len ? f->payload_len : 1);
    if (!copy)
        return;
    if (f->payload_len)
        memcpy(copy, f->payload, f->payload_len);
    n->ev_buf[n->n_ev_buf] = copy;
    n->ev_buf_len[n->n_ev_buf] = f->payload_len;
    n->n_ev_buf++;
}

static void on_resync_dump(rt_t *r, struct rt_node *n, const Kvrail__ResyncDump *d, uint64_t now)
{
    dir_clear_node(r, n);
    for (size_t i = 0; i < d->n_block_hashes; i++)
        dir_add(r, n, d->block_hashes[i]);
    n->ev_seq = d->seq;
    n->resync_wait = false;
    KVR_LOG_INFO("router", "node %s: directory resynced: %zu blocks at seq %" PRIu64, n->name,
                 d->n_block_hashes, d->seq);
    size_t held = n->n_ev_buf;
    uint8_t **buf = n->ev_buf;
    size_t *len = n->ev_buf_len;
    n->ev_buf = NULL;
    n->ev_buf_len = NULL;
    n->n_ev_buf = 0;
    for (size_t i = 0; i < held; i++) {
        Kvrail__BlockEvents *be = kvrail__block_events__unpack(NULL, len[i], buf[i]);
        if (be && !n->resync_wait)
            apply_events(r, n, be, now);
        if (be)
            kvrail__block_events__free_unpacked(be, NULL);
        free(buf[i]);
    }
    free(buf);
    free(len);
}

/* ---- registration and heartbeats ---- */

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
    for (int i = 0; i < r->n_nodes; i++) {
        const struct rt_node *o = &r->nodes[i];
        if (o == self || !o->registered)
            continue;
        if (strcmp(o->fingerprint, q->model_fingerprint ? q->model_fingerprint : "")) {
            snprintf(err, err_len, "register: model fingerprint '%s' differs from node %s's '%s'",
                     q->model_fingerprint, o->name, o->fingerprint);
            return KVR_ERR_MISMATCH;
        }
        if (o->layers != l->layers || o->kv_heads != l->kv_heads || o->head_dim != l->head_dim ||
            strcmp(o->dtype, l->dtype ? l->dtype : "")) {
            snprintf(err, err_len,
                     "register: KV layout %ux%ux%u %s differs from node %s's %ux%ux%u %s",
                     l->layers, l->kv_heads, l->head_dim, l->dtype, o->name, o->layers, o->kv_heads,
                     o->head_dim, o->dtype);
            return KVR_ERR_MISMATCH;
        }
    }
    return KVR_OK;
}

static void on_register(rt_t *r, const kvr_proto_frame_t *f, const Kvrail__RegisterRequest *q,
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
        reply_register(r, NULL, f, KVR_ERR_NOT_FOUND, err);
        return;
    }
    if (strcmp(qname, n->name)) {
        snprintf(err, sizeof(err), "register: node_name '%s' differs from routing id '%s'", qname,
                 n->name);
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
        reply_register(r, n, f, KVR_ERR_MISMATCH, err);
        return;
    }
    if (q->protocol_version && q->protocol_version != KVR_PROTO_VERSION) {
        snprintf(err, sizeof(err), "register: protocol version %u, the router speaks %d",
                 q->protocol_version, KVR_PROTO_VERSION);
        reply_register(r, n, f, KVR_ERR_VERSION, err);
        return;
    }
    kvr_status_t st = check_layout(r, n, q, err, sizeof(err));
    if (st != KVR_OK) {
        KVR_LOG_WARN("router", "node %s: %s", n->name, err);
        reply_register(r, n, f, st, err);
        return;
    }
    if (n->registered) {
        KVR_LOG_WARN("router", "node %s registers again (incarnation %" PRIx64 " -> %" PRIx64 ")",
                     n->name, n->incarnation, q->incarnation);
        rt_node_lost(r, n, now, "re-registered");
        dir_clear_node(r, n);
    }
    free_blobs(n);
    drop_held(n);
    n->registered = true;
    n->alive = true;
    n->conn_lost = false;
    n->incarnation = q->incarnation;
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
    if (q->transport_address.len) {
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
    n->ev_seq = 0;
    n->resync_wait = false;
    if (!r->context && n->max_context)
        r->context = n->max_context;
    if (!r->vocab && n->vocab_size)
        r->vocab = n->vocab_size;
    if (!r->model_fingerprint[0])
        snprintf(r->model_fingerprint, sizeof(r->model_fingerprint), "%s", n->fingerprint);
    KVR_LOG_INFO("router",
                 "node %s registered: %s, %s transport, layout %ux%ux%u %s bs %u, %u blocks, "
                 "model %s",
                 n->name, kvr_node_role_name(n->role), n->transport, n->layers, n->kv_heads,
                 n->head_dim, n->dtype, n->block_size, n->total_blocks, n->fingerprint);
    reply_register(r, n, f, KVR_OK, "ok");
    rt_queue_pump(r, now);
}

static void on_heartbeat(rt_t *r, const kvr_proto_frame_t *f, struct rt_node *n,
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
        if (n->role == KVR_NODE_ROLE_DECODE)
            request_resync(r, n, now, "node came back");
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
    /* free estimate: what the node says minus what is on its way to it */
    int64_t pending = 0;
    for (struct rt_req *q = r->all; q; q = q->anext)
        if (q->d == n->idx && q->state == RQ_RESERVING)
            pending += q->need_blocks;
    n->free_est = (int64_t)hb->free_blocks - pending;
    if (hb->block_event_seq <= n->ev_seq)
        n->hb_lag_seq = 0;
    if (n->role == KVR_NODE_ROLE_DECODE && hb->block_event_seq > n->ev_seq && !n->resync_wait) {
        char why[128];
        snprintf(why, sizeof(why), "heartbeat announces seq %" PRIu64 ", applied %" PRIu64,
                 hb->block_event_seq, n->ev_seq);
        /* events may still be in flight behind the heartbeat: only a lag that
         * survives two heartbeats counts */
        if (n->hb_lag_seq && n->hb_lag_seq > n->ev_seq) {
            request_resync(r, n, now, why);
            n->hb_lag_seq = 0;
        } else {
            n->hb_lag_seq = hb->block_event_seq;
        }
    }
    rt_queue_pump(r, now);
}

void rt_node_msg(rt_t *r, kvr_proto_frame_t *f, uint64_t now)
{
    char err[512] = "";
    ProtobufCMessage *m = NULL;
    struct rt_node *n = rt_node_by_route(r, f->route, f->route_len);
    unsigned method = f->hdr.method;
    kvr_status_t st = kvr_proto_decode(f, NULL, &m, err, sizeof(err));
    if (st != KVR_OK) {
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "node endpoint: bad %s from '%.*s': %s",
                         kvr_proto_method_name(method), (int)f->route_len, (const char *)f->route,
                         err);
        kvr_proto_send_error(r->node_sock, f->route, f->route_len, method, f->hdr.call_id, st, "%s",
                             err);
        return;
    }
    if (f->hdr.flags & KVR_PROTO_F_ERROR) {
        Kvrail__Status *s = (Kvrail__Status *)m;
        KVR_LOG_WARN("router", "node %.*s reports an error for %s: %s (%d)", (int)f->route_len,
                     (const char *)f->route, kvr_proto_method_name(method), s->message, s->code);
        goto out;
    }
    if (method == KVRAIL__METHOD__REGISTER) {
        on_register(r, f, (Kvrail__RegisterRequest *)m, now);
        goto out;
    }
    if (!n || !n->registered) {
        if (method == KVRAIL__METHOD__HEARTBEAT) {
            on_heartbeat(r, f, n, (Kvrail__Heartbeat *)m, now);
            goto out;
        }
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "node endpoint: %s from unregistered peer '%.*s'",
                         kvr_proto_method_name(method), (int)f->route_len, (const char *)f->route);
        kvr_proto_send_error(r->node_sock, f->route, f->route_len, method, f->hdr.call_id,
                             KVR_ERR_NOT_FOUND,
                             "node '%.*s' is not registered: send REGISTER first",
                             (int)f->route_len, (const char *)f->route);
        goto out;
    }
    switch (method) {
    case KVRAIL__METHOD__HEARTBEAT:
        on_heartbeat(r, f, n, (Kvrail__Heartbeat *)m, now);
        break;
    case KVRAIL__METHOD__BLOCK_EVENTS:
        if (n->resync_wait)
            hold_events(n, f);
        else
            apply_events(r, n, (Kvrail__BlockEvents *)m, now);
        break;
    case KVRAIL__METHOD__RESYNC: {
        /* a node's RESYNC message is the dump */
        ProtobufCMessage *d = NULL;
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
        st = kvr_proto_decode(f, &kvrail__resync_dump__descriptor, &d, err, sizeof(err));
        if (st != KVR_OK) {
            r->st.bad_frames++;
            KVR_LOG_WARN("router", "node %s: bad resync dump: %s", n->name, err);
            break;
        }
        on_resync_dump(r, n, (Kvrail__ResyncDump *)d, now);
        protobuf_c_message_free_unpacked(d, NULL);
        break;
    }
    case KVRAIL__METHOD__RESERVED:
        rt_on_reserved(r, n, (Kvrail__Reserved *)m, now);
        break;
    case KVRAIL__METHOD__REJECTED:
        rt_on_rejected(r, n, (Kvrail__Rejected *)m, now);
        break;
    case KVRAIL__METHOD__PREFILL_DONE:
        rt_on_prefill_done(r, n, (Kvrail__PrefillDone *)m, now);
        break;
    case KVRAIL__METHOD__TOKEN:
        rt_on_token(r, n, (Kvrail__Token *)m, now);
        break;
    default:
        r->st.bad_frames++;
        KVR_LOG_WARN("router", "node %s sent %s, which nodes do not send", n->name,
                     kvr_proto_method_name(method));
        kvr_proto_send_error(r->node_sock, f->route, f->route_len, method, f->hdr.call_id,
                             KVR_ERR_UNSUPPORTED, "method %s is not accepted at the node endpoint",
                             kvr_proto_method_name(method));
        break;
    }
out:
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
}

void rt_nodes_tick(rt_t *r, uint64_t now)
{
    uint64_t timeout = (uint64_t)r->cl->timeouts.heartbeat_timeout_ms * 1000000ull;
    for (int i = 0; i < r->n_nodes; i++) {
        struct rt_node *n = &r->nodes[i];
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
            dir_clear_node(r, n);
            n->ev_seq = 0;
            rt_node_lost(r, n, now, lost ? "lost its connection" : "missed heartbeats");
        }
        if (n->alive && n->resync_wait && now - n->resync_sent_ns > RT_RESYNC_RETRY_NS)
            request_resync(r, n, now, "no dump yet");
    }
}
