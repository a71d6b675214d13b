/*
 * status.c - the client endpoint's Status reply: the router's counters and
 * latency percentiles (router overhead per request, per token, tokenizing)
 * and one row per node (liveness, heartbeat age, load, KV moved, directory
 * blocks and sync state).  Reads the router's state, changes nothing.
 */
#include "router.h"

#define MS (1000000ull)

void rt_status_reply(rt_t *r, const kvr_proto_frame_t *f, uint64_t now)
{
    Kvrail__StatusReply rep = KVRAIL__STATUS_REPLY__INIT;
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    Kvrail__RouterStats rs = KVRAIL__ROUTER_STATS__INIT;
    Kvrail__NodeStatus ns[RT_MAX_NODES];
    Kvrail__NodeStatus *nsp[RT_MAX_NODES];
    s.message = (char *)"ok";
    rep.status = &s;
    rep.router = &rs;
    rep.model = r->cl->model_dir;
    rep.block_size = r->cl->block_size;
    rs.uptime_ms = (now - r->start_ns) / MS;
    rs.requests = r->st.requests;
    rs.queued = r->n_queued;
    for (struct rt_req *q = r->all; q; q = q->anext)
        rs.active++;
    rs.completed = r->st.completed;
    rs.failed = r->st.failed;
    rs.canceled = r->st.canceled;
    rs.overloaded = r->st.overloaded;
    rs.bad_frames = r->st.bad_frames;
    rs.bad_requests = r->st.bad_requests;
    rs.local_prefills = r->st.local_prefills;
    rs.disagg_prefills = r->st.disagg_prefills;
    rs.retries = r->st.retries;
    rs.overhead_p50_ns = rt_samples_pct(&r->st.overhead, 0.50);
    rs.overhead_p99_ns = rt_samples_pct(&r->st.overhead, 0.99);
    rs.overhead_max_ns = rt_samples_pct(&r->st.overhead, 1.0);
    rs.overhead_samples = r->st.overhead.n;
    rs.overhead_cpu_p50_ns = rt_samples_pct(&r->st.overhead_cpu, 0.50);
    rs.overhead_cpu_p99_ns = rt_samples_pct(&r->st.overhead_cpu, 0.99);
    rs.token_overhead_p50_ns = rt_samples_pct(&r->st.token, 0.50);
    rs.token_overhead_p99_ns = rt_samples_pct(&r->st.token, 0.99);
    rs.tokenize_p50_ns = rt_samples_pct(&r->st.tokenize, 0.50);
    rs.tokenize_p99_ns = rt_samples_pct(&r->st.tokenize, 0.99);
    rs.client_disconnects = r->st.client_disconnects;
    rs.resyncs = r->st.resyncs;
    rs.dead_nodes = r->st.dead_nodes;
    rs.auth_refused = r->st.auth_refused;
    rs.refused_registrations = r->st.refused_registrations;
    rs.held_event_drops = r->st.held_event_drops;
    for (int i = 0; i < r->n_nodes; i++)
        rs.unresponsive_nodes += r->nodes[i].unresponsive;
    rs.directory_blocks = rt_dir_entries(&r->dir);
    rs.cached_tokens = r->st.cached_tokens;
    rs.prompt_tokens = r->st.prompt_tokens;
    uint64_t kb = 0, kns = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        struct rt_node *n = &r->nodes[i];
        kvrail__node_status__init(&ns[i]);
        nsp[i] = &ns[i];
        ns[i].name = n->name;
        ns[i].role = n->role == KVR_NODE_ROLE_PREFILL ? KVRAIL__ROLE__ROLE_PREFILL
                                                      : KVRAIL__ROLE__ROLE_DECODE;
        ns[i].alive = n->alive;
        ns[i].host = n->host[0] ? n->host : (char *)n->conf->host;
        ns[i].transport = n->transport[0] ? n->transport : (char *)n->conf->transport;
        ns[i].last_heartbeat_ms_ago = n->registered ? (now - n->last_hb_ns) / MS : 0;
        ns[i].total_blocks = n->total_blocks;
        ns[i].free_blocks = n->free_blocks;
        ns[i].cached_blocks = (uint32_t)rt_dir_node_blocks(&r->dir, n->idx);
        ns[i].batch_size = n->batch_size;
        ns[i].inflight_prefill_tokens = n->inflight_prefill_hb > n->inflight_tokens
                                            ? n->inflight_prefill_hb
                                            : n->inflight_tokens;
        ns[i].queued_prefill_tokens = n->queued_prefill_hb;
        ns[i].requests = n->requests;
        /* the node's own cumulative figures, or what its PrefillDones said */
        uint64_t nb = n->kv_bytes, nt = n->kv_ns;
        if (n->pd_bytes > nb) {
            nb = n->pd_bytes;
            nt = n->pd_ns;
        }
        ns[i].kv_bytes_moved = nb;
        ns[i].kv_transfer_ns = nt;
        ns[i].kv_gbps = nt ? (double)nb / (double)nt : 0.0;
        ns[i].block_event_seq = n->ev_seq;
        ns[i].resyncs = n->resyncs;
        ns[i].model_fingerprint = n->fingerprint;
        ns[i].bad_frames = n->bad_frames_hb;
        ns[i].bad_notifications = n->bad_notifs_hb;
        ns[i].quarantined_blocks = n->quarantined_hb;
        ns[i].quarantines_fenced = n->fenced_hb;
        ns[i].quarantines_expired = n->fence_expired_hb;
        ns[i].failures_blamed = n->blamed;
        ns[i].cooldowns = n->cooldowns;
        ns[i].cooling = n->cool_until > now;
        ns[i].kv_dtype = n->dtype;
        ns[i].kernels = n->kernels;
        ns[i].self_fenced = n->self_fenced_hb;
        if (n->role == KVR_NODE_ROLE_PREFILL) {
            kb += nb;
            kns += nt;
        }
    }
    rs.kv_bytes_moved = kb;
    rs.kv_transfer_ns = kns;
    rs.kv_gbps = kns ? (double)kb / (double)kns : 0.0;
    rep.n_nodes = (size_t)r->n_nodes;
    rep.nodes = nsp;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END, KVRAIL__METHOD__STATUS,
                         f->hdr.call_id};
    kvr_proto_send(r->client_sock, f->route, f->route_len, &h, &rep.base);
}
