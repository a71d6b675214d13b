/*
 * dirsync.c - keeps the block directory in step with each decode node's
 * prefix cache.  Nodes publish BlockEvents (stored / removed / cleared) with
 * a per-node sequence number.  An event whose seq is not last + 1 (or a
 * heartbeat announcing a later seq than applied, twice: see registry.c)
 * starts a resync: the router asks for a full dump (RESYNC), holds the
 * events arriving meanwhile (bounded), then rebuilds that node's entries
 * from the dump and replays the held events newer than it.  A dump that does
 * not come is asked for again every RT_RESYNC_RETRY_NS.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_log.h"
#include "router.h"

#define RT_MAX_HELD_EVENTS 4096

static void drop_held(struct rt_node *n)
{
    for (size_t i = 0; i < n->n_ev_buf; i++)
        free(n->ev_buf[i]);
    free(n->ev_buf);
    free(n->ev_buf_len);
    n->ev_buf = NULL;
    n->ev_buf_len = NULL;
    n->n_ev_buf = 0;
    n->ev_buf_bytes = 0;
}

void rt_dirsync_fini(struct rt_node *n)
{
    drop_held(n);
}

void rt_dirsync_reset(rt_t *r, struct rt_node *n)
{
    rt_dir_clear_node(&r->dir, n->idx);
    drop_held(n);
    n->ev_seq = 0;
    n->resync_wait = false;
    n->hb_lag_seq = 0;
}

void rt_dirsync_request(rt_t *r, struct rt_node *n, uint64_t now, const char *why)
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
    rt_timer_arm(r, now + RT_RESYNC_RETRY_NS + 1);
    rt_send_node(r, n, KVRAIL__METHOD__RESYNC, &q.base);
}

static void add_block(rt_t *r, struct rt_node *n, uint64_t h)
{
    if (!rt_dir_add(&r->dir, n->idx, h) && rt_bad_log_ok(r))
        KVR_LOG_WARN("router",
                     "node %s: block directory full (%zu blocks, node holds %" PRIu64
                     "): block not tracked, its prefix gets no cache credit",
                     n->name, rt_dir_entries(&r->dir), rt_dir_node_blocks(&r->dir, n->idx));
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
            rt_dirsync_request(r, n, now, why);
            return;
        }
        switch (e->kind) {
        case KVRAIL__BLOCK_EVENT__KIND__STORED:
            for (size_t j = 0; j < e->n_block_hashes; j++)
                add_block(r, n, e->block_hashes[j]);
            break;
        case KVRAIL__BLOCK_EVENT__KIND__REMOVED:
            for (size_t j = 0; j < e->n_block_hashes; j++)
                rt_dir_remove(&r->dir, n->idx, e->block_hashes[j]);
            break;
        case KVRAIL__BLOCK_EVENT__KIND__CLEARED:
            rt_dir_clear_node(&r->dir, n->idx);
            break;
        default:
            KVR_LOG_WARN("router", "node %s: unknown block event kind %d (seq %" PRIu64 ")",
                         n->name, (int)e->kind, e->seq);
            break;
        }
        n->ev_seq = e->seq;
    }
}

/* Holds a BlockEvents payload until the dump is in.  Bounded in count and
 * bytes: one past the bound is dropped, counted and logged (the replay
 * after the dump then finds a seq gap and asks for another dump). */
static void hold_events(rt_t *r, struct rt_node *n, const kvr_proto_frame_t *f)
{
    if (n->n_ev_buf >= RT_MAX_HELD_EVENTS ||
        n->ev_buf_bytes + f->payload_len > RT_HELD_EVENT_BYTES) {
        n->ev_drops++;
        r->st.held_event_drops++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router",
                         "node %s: %zu BlockEvents (%zu bytes) held during its resync, the most "
                         "kept (%d, %u bytes): dropped (%" PRIu64 " so far); the next dump covers "
                         "them",
                         n->name, n->n_ev_buf, n->ev_buf_bytes, RT_MAX_HELD_EVENTS,
                         RT_HELD_EVENT_BYTES, n->ev_drops);
        return;
    }
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
    n->ev_buf_bytes += f->payload_len;
}

void rt_dirsync_on_events(rt_t *r, struct rt_node *n, const kvr_proto_frame_t *f,
                          const Kvrail__BlockEvents *be, uint64_t now)
{
    if (n->resync_wait)
        hold_events(r, n, f);
    else
        apply_events(r, n, be, now);
}

void rt_dirsync_on_dump(rt_t *r, struct rt_node *n, const Kvrail__ResyncDump *d, uint64_t now)
{
    rt_dir_clear_node(&r->dir, n->idx);
    for (size_t i = 0; i < d->n_block_hashes; i++)
        add_block(r, n, d->block_hashes[i]);
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
    n->ev_buf_bytes = 0;
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
