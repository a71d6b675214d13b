/*
 * prefill.c - kvrail-prefill, the prefill node.
 *
 * The router sends Prefill{request, prompt} (and, once the decode node has
 * reserved blocks, PrefillTarget{decode node, rkeys, block ids, cached
 * tokens}).  Requests wait in a FIFO prefill queue.  Several short prompts
 * at its head (each <= KVR_PREFILL_BATCH_TOKENS, together within the
 * engine's chunk) are computed in one batched engine call, whose layer
 * callback posts every member's layer; a longer prompt is computed alone
 * (the engine splits it into chunks of its max_tokens).
 *
 * KV is computed into this node's own staging pool (one slab per layer,
 * registered once).  The staging blocks of finished prompts stay in a local
 * prefix cache (the decode node's block table module), so a prompt that
 * shares a prefix with an earlier one recomputes only the rest.  As soon as
 * the engine reports layer l done, its slices of every block the decode node
 * does not already hold are posted as one prepared descriptor list (runs of
 * blocks adjacent on both sides coalesced into one write).  After the last
 * layer the first token is sampled; PrefillDone goes to the router (load
 * accounting, no token) and a KV_READY notification {request, attempt,
 * first token} on the same transport peer, so it arrives after the data:
 * the decode node streams that token, the one path it takes to the client.
 * Every message about a request carries the Prefill's attempt number, so
 * that after a retry of the prefill on another node (same reservation on
 * the decode node) the old attempt's late messages are told apart.  The
 * staging blocks are reused once the writes have completed.
 *
 * The model runs on the node's engine worker thread (node/worker.h); this
 * thread, the loop, hands it one prefill job at a time and receives its
 * layer-done and done events as messages, so heartbeats, targets and
 * cancels are answered while the prompt is computed.  The loop posts each
 * layer's writes when its layer event arrives (it owns the transfer
 * engine), or as soon as the target arrives if that is later.  Cancel stops
 * the computation at the next layer (the job's cancel flag) and sends
 * KV_ABORT after whatever was posted, so the decode node can reuse the
 * blocks.  A transport failure fails only the request(s) on that peer; the
 * next target reconnects.
 *
 * The write lease (write_lease_lost): the decode node holds a request's
 * blocks for this writer only while it hears from it (KV_PROGRESS every
 * third of the lease renews it, counted from its arrival there); if it
 * hears nothing for a lease it may hand them to another request.  So this
 * node never posts a write for a request whose last sign of life went out
 * more than half a lease ago (it was stopped, or starved): it gives the
 * request up (KV_ABORT, an error to the router) instead.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocktab.h"
#include "kvr_blockhash.h"
#include "kvr_clock.h"
#include "kvr_log.h"
#include "node.h"
#include "node_metrics.h"
#include "pool.h"

#define COMP "prefill"

#define KVR_PREFILL_BATCH_MAX    16  /* most prompts in one batched prefill */
#define KVR_PREFILL_BATCH_TOKENS 256 /* default: prompts up to this long are batched */

/* PQ_RETIRING: failed or canceled, but writes it posted are still in flight:
 * its lists and local blocks (which the transport may still read) are kept
 * until they complete, the peer fails, or the write lease runs out (half a
 * lease after its last sign of life went to the decode node, as in
 * write_lease_lost: past that the decode node may fence this writer out and
 * reuse the blocks, so the peer is aborted and its writes end), so that the
 * loop never waits for a stalled decode node (check_active). */
enum preq_state { PQ_QUEUED, PQ_COMPUTING, PQ_AWAIT_TARGET, PQ_DRAINING, PQ_RETIRING };

struct dpeer {
    struct dpeer *next;
    char name[KVR_CLUSTER_NAME_MAX];
    uint64_t incarnation;
    kvr_xfer_peer_t *peer;
    kvr_xfer_rmem_t **rmem; /* [n_layers] */
    int32_t n_rmem;
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* presented at connect (all zero: none) */
    bool failed;
    int users; /* requests holding it */
};

/* What the router sent once about a decode node incarnation: its address
 * and one rkey per layer (PrefillTarget carries them only the first time). */
struct dinfo {
    struct dinfo *next;
    char name[KVR_CLUSTER_NAME_MAX];
    uint64_t incarnation;
    uint8_t *addr;
    size_t addr_len;
    uint8_t **rkeys; /* [n_rkeys] */
    size_t *rkey_lens;
    size_t n_rkeys;
    uint64_t block_bytes;
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* the pair's transfer token (all zero: none sent) */
};

struct preq {
    struct preq *next; /* queue or active list */
    uint64_t id;
    uint32_t attempt; /* Prefill.attempt: echoed in PrefillDone and the notifications */
    enum preq_state state;
    int32_t *tokens;
    int32_t n_tokens;
    struct kvr_sample_params sp;
    uint32_t lease_ms;
    uint64_t t_recv, t_start, t_computed, t_first_post, t_done, deadline;
    uint64_t t_progress; /* last KV_PROGRESS to the decode node */
    /* target */
    bool have_target;
    uint32_t *dblocks;
    uint32_t n_dblocks;
    uint32_t cached_d; /* blocks already on the decode node */
    struct dpeer *peer;
    /* staging */
    uint32_t *lblocks;
    uint32_t n_lblocks;
    uint32_t cached_p;     /* blocks taken from the local prefix cache */
    kvr_xfer_dlist_t **dl; /* [n_layers] */
    int32_t layers_done, layers_posted;
    bool prepared, notified, canceled, done_sent;
    kvr_status_t err;
    bool d_fault; /* the failure is the decode node's (PrefillDone.decode_fault) */
    char errmsg[320];
    int32_t first_token;
    float logprob;
    uint32_t generated; /* the last tokens were generated (a migration) */
    uint32_t top_n;     /* sampling.top_logprobs: the first token's alternatives, to D */
    int32_t n_top;
    int32_t top_ids[KVR_SAMPLE_MAX_TOP_LOGPROBS];
    float top_lps[KVR_SAMPLE_MAX_TOP_LOGPROBS];
    uint64_t bytes;
    uint32_t ndesc_raw, ndesc_posted;
};

/* One prefill computation on the engine worker: one prompt, or several
 * short ones batched.  The loop fills it, the worker runs it. */
struct pjob {
    struct kvr_worker_job base;
    const struct kvr_kv_pool *pool;
    struct kvr_prefill_seq seqs[KVR_PREFILL_BATCH_MAX];
    size_t n;
    bool layerwise;
    float *logits; /* [n][vocab] */
};

struct prefill {
    kvr_node_t node;
    struct kvr_node_pool npool;
    kvr_blocktab_t *bt;
    int32_t vocab, chunk; /* the worker context's max tokens per call */
    struct preq *queue, *queue_tail;
    struct preq *active; /* computing, awaiting target or draining */
    struct pjob job;
    bool busy;                                 /* the job is on the worker */
    struct preq *batch[KVR_PREFILL_BATCH_MAX]; /* the job's members */
    size_t n_batch;
    float *batch_logits;  /* [KVR_PREFILL_BATCH_MAX][vocab] */
    int32_t batch_tokens; /* prompts up to this long are batched; 0: none */
    struct dpeer *peers;
    struct dinfo *dinfos;
    size_t n_dinfos;
    void *addr;
    size_t addr_len;
    uint64_t *hash_scratch;
    uint32_t max_blocks_per_req;
    bool layerwise; /* push each layer as it is done (KVR_PREFILL_LAYERWISE=0: all at the end) */
    /* counters */
    uint64_t n_ok, n_failed, n_canceled, bytes_pushed, transfer_ns, ndesc_raw, ndesc_posted;
    uint64_t computed_tokens, local_cached_tokens, queued_tokens;
    uint64_t n_batched, batched_reqs;     /* batched engine calls, requests in them */
    uint64_t targets_addr, targets_short; /* PrefillTargets with / without D's address */
    uint64_t progress_sent;               /* KV_PROGRESS notifications */
    uint64_t self_fenced;                 /* pushes given up: silent for half a lease */
};

static void job_recheck(struct prefill *p);

static struct preq *find_req(struct prefill *p, uint64_t id)
{
    for (struct preq *r = p->queue; r; r = r->next)
        if (r->id == id && !r->canceled)
            return r;
    for (struct preq *r = p->active; r; r = r->next)
        if (r->id == id && !r->canceled)
            return r;
    return NULL;
}

static void unlink_req(struct preq **head, struct preq *r)
{
    for (struct preq **pp = head; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            r->next = NULL;
            return;
        }
}

/* ---- peers ---- */

static void peer_drop(struct prefill *p, struct dpeer *d)
{
    for (struct dpeer **pp = &p->peers; *pp; pp = &(*pp)->next)
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    for (int32_t l = 0; l < d->n_rmem; l++)
        if (d->rmem[l])
            kvr_xfer_rmem_release(d->rmem[l]);
    if (d->peer)
        kvr_xfer_disconnect(d->peer);
    free(d->rmem);
    free(d);
}

static void peer_put(struct prefill *p, struct dpeer *d)
{
    if (d && --d->users == 0 && d->failed)
        peer_drop(p, d);
}

static bool token_set(const uint8_t *t)
{
    uint8_t acc = 0;
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        acc |= t[i];
    return acc != 0;
}

static void dinfo_free(struct dinfo *di)
{
    for (size_t i = 0; i < di->n_rkeys; i++)
        free(di->rkeys[i]);
    free(di->rkeys);
    free(di->rkey_lens);
    free(di->addr);
    free(di);
}

static struct dinfo **dinfo_slot(struct prefill *p, const char *name)
{
    struct dinfo **pp = &p->dinfos;
    for (; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->name, name) == 0)
            break;
    return pp;
}

/* The address and rkeys of the target's decode node: taken from the target
 * when it carries them (the first target for that incarnation; they replace
 * what an earlier incarnation had), else from what this node kept. */
static kvr_status_t dinfo_get(struct prefill *p, const Kvrail__PrefillTarget *t,
                              struct dinfo **di_p, char *err, size_t err_len)
{
    struct dinfo **slot = dinfo_slot(p, t->decode_node), *di = *slot;
    if (t->decode_address.len == 0) {
        if (di && di->incarnation == t->decode_incarnation) {
            *di_p = di;
            return KVR_OK;
        }
        snprintf(err, err_len,
                 "decode node '%s' (incarnation %016" PRIx64 "): the target has no address and "
                 "this node has none kept for that incarnation (the router sends it once; it "
                 "sends it again with the retry)",
                 t->decode_node, t->decode_incarnation);
        return KVR_ERR_NOT_FOUND;
    }
    if (t->transport_token.len != 0 && t->transport_token.len != KVR_XFER_TOKEN_LEN) {
        snprintf(err, err_len,
                 "decode node '%s': the target's transfer token has %zu bytes (want %d): the "
                 "router and this node are of different versions",
                 t->decode_node, t->transport_token.len, KVR_XFER_TOKEN_LEN);
        return KVR_ERR_INVALID;
    }
    if (p->n_dinfos >= 4096 && !di) {
        snprintf(err, err_len, "more than 4096 decode nodes known: refusing '%s'", t->decode_node);
        return KVR_ERR_NO_RESOURCE;
    }
    struct dinfo *n = calloc(1, sizeof *n);
    if (!n)
        return KVR_ERR_NO_MEMORY;
    snprintf(n->name, sizeof n->name, "%s", t->decode_node);
    n->incarnation = t->decode_incarnation;
    n->block_bytes = t->block_bytes;
    if (t->transport_token.len)
        memcpy(n->token, t->transport_token.data, KVR_XFER_TOKEN_LEN);
    n->addr = malloc(t->decode_address.len);
    n->rkeys = calloc(t->n_layer_rkeys + 1, sizeof *n->rkeys);
    n->rkey_lens = calloc(t->n_layer_rkeys + 1, sizeof *n->rkey_lens);
    if (!n->addr || !n->rkeys || !n->rkey_lens) {
        dinfo_free(n);
        return KVR_ERR_NO_MEMORY;
    }
    memcpy(n->addr, t->decode_address.data, t->decode_address.len);
    n->addr_len = t->decode_address.len;
    for (size_t i = 0; i < t->n_layer_rkeys; i++) {
        n->rkeys[i] = malloc(t->layer_rkeys[i].len + 1);
        if (!n->rkeys[i]) {
            dinfo_free(n);
            return KVR_ERR_NO_MEMORY;
        }
        memcpy(n->rkeys[i], t->layer_rkeys[i].data, t->layer_rkeys[i].len);
        n->rkey_lens[i] = t->layer_rkeys[i].len;
        n->n_rkeys = i + 1;
    }
    if (di) { /* replaced: a new incarnation, or the router resent it */
        n->next = di->next;
        dinfo_free(di);
    } else {
        n->next = NULL;
        p->n_dinfos++;
    }
    *slot = n;
    *di_p = n;
    return KVR_OK;
}

/* What a refused connection to a decode node means, for the error the
 * client gets (the transport logs its own detail here). */
static const char *connect_why(kvr_status_t s)
{
    switch (s) {
    case KVR_ERR_CORRUPT:
        return "the transport address it registered was refused: damaged, or not one this "
               "node's transport can use (a broken or foreign decode node)";
    case KVR_ERR_VERSION:
    case KVR_ERR_MISMATCH:
    case KVR_ERR_UNSUPPORTED:
        return "its transport address is of another transport backend or version";
    case KVR_ERR_TIMEOUT:
        return "its transport side channel did not answer";
    default:
        return "its transport address could not be reached";
    }
}

static kvr_status_t peer_get(struct prefill *p, const Kvrail__PrefillTarget *t, struct dpeer **d_p,
                             char *err, size_t err_len)
{
    const struct kvr_kv_layout *L = &p->node.layout;
    for (struct dpeer *d = p->peers; d; d = d->next) {
        if (strcmp(d->name, t->decode_node) != 0)
            continue;
        /* a target with an address and another token: the router made a
         * new one for the pair (it restarted) and D revoked the old one */
        bool token_kept = t->decode_address.len == 0 ||
                          (t->transport_token.len == KVR_XFER_TOKEN_LEN
                               ? memcmp(d->token, t->transport_token.data, KVR_XFER_TOKEN_LEN) == 0
                               : !token_set(d->token));
        if (!d->failed && d->incarnation == t->decode_incarnation && token_kept &&
            kvr_xfer_peer_status(d->peer) == KVR_OK) {
            d->users++;
            *d_p = d;
            return KVR_OK;
        }
        d->failed = true; /* restarted or failed: reconnect */
        if (d->users == 0)
            peer_drop(p, d);
        break;
    }
    struct dinfo *di;
    kvr_status_t s = dinfo_get(p, t, &di, err, err_len);
    if (s != KVR_OK)
        return s;
    if (di->block_bytes && di->block_bytes != kvr_kv_block_bytes(L)) {
        snprintf(err, err_len,
                 "KV layout mismatch with decode node '%s': its blocks are %" PRIu64
                 " bytes, ours %zu (layers/kv heads/head dim/block size differ)",
                 t->decode_node, di->block_bytes, kvr_kv_block_bytes(L));
        return KVR_ERR_MISMATCH;
    }
    if (di->n_rkeys != (size_t)L->n_layers) {
        snprintf(err, err_len,
                 "KV layout mismatch with decode node '%s': %zu layer rkeys, model has %d layers",
                 t->decode_node, di->n_rkeys, L->n_layers);
        return KVR_ERR_MISMATCH;
    }
    struct dpeer *d = calloc(1, sizeof *d);
    if (!d)
        return KVR_ERR_NO_MEMORY;
    d->rmem = calloc((size_t)L->n_layers, sizeof *d->rmem);
    if (!d->rmem) {
        free(d);
        return KVR_ERR_NO_MEMORY;
    }
    snprintf(d->name, sizeof d->name, "%s", t->decode_node);
    d->incarnation = t->decode_incarnation;
    d->n_rmem = L->n_layers;
    uint64_t t0 = kvr_now_ns();
    memcpy(d->token, di->token, KVR_XFER_TOKEN_LEN);
    s = token_set(di->token)
            ? kvr_xfer_connect_token(p->node.xfer, di->addr, di->addr_len, di->token, &d->peer)
            : kvr_xfer_connect(p->node.xfer, di->addr, di->addr_len, &d->peer);
    if (s != KVR_OK) {
        snprintf(err, err_len, "cannot connect to decode node '%s' (%s): %s", t->decode_node,
                 kvr_status_str(s), connect_why(s));
        free(d->rmem);
        free(d);
        return s;
    }
    for (int32_t l = 0; l < L->n_layers; l++) {
        s = kvr_xfer_rmem_unpack(d->peer, di->rkeys[l], di->rkey_lens[l], &d->rmem[l]);
        if (s != KVR_OK) {
            snprintf(err, err_len, "decode node '%s': rkey of layer %d: %s", t->decode_node, l,
                     kvr_status_str(s));
            goto err_release;
        }
        if (kvr_xfer_rmem_len(d->rmem[l]) < kvr_kv_block_bytes(L)) {
            snprintf(err, err_len, "decode node '%s': layer %d region is only %" PRIu64 " bytes",
                     t->decode_node, l, kvr_xfer_rmem_len(d->rmem[l]));
            s = KVR_ERR_MISMATCH;
            goto err_release;
        }
    }
    /* the layout descriptor: the decode node checks it and refuses KV from a
     * node whose model or layout differs */
    struct kvr_notif h = {0};
    h.kind = KVR_NOTIF_HELLO;
    h.incarnation = p->node.incarnation;
    snprintf(h.node, sizeof h.node, "%s", p->node.name);
    h.fingerprint = p->node.fingerprint;
    h.n_layers = L->n_layers;
    h.n_kv_heads = L->n_kv_heads;
    h.head_dim = L->head_dim;
    h.block_size = L->block_size;
    h.dtype = L->dtype;
    h.proto_version = KVR_PROTO_VERSION;
    uint8_t wire[KVR_NOTIF_WIRE_MAX];
    size_t wl = kvr_notif_encode(&h, wire, sizeof wire);
    (void)kvr_xfer_notify(d->peer, wire, wl);
    KVR_LOG_INFO(COMP, "connected to decode node '%s' over %s in %.2f ms", d->name,
                 kvr_xfer_peer_transports(d->peer), (double)(kvr_now_ns() - t0) / 1e6);
    d->users = 1;
    d->next = p->peers;
    p->peers = d;
    *d_p = d;
    return KVR_OK;
err_release:
    for (int32_t k = 0; k < L->n_layers; k++)
        if (d->rmem[k])
            kvr_xfer_rmem_release(d->rmem[k]);
    kvr_xfer_disconnect(d->peer);
    free(d->rmem);
    free(d);
    return s;
}

/* ---- requests ---- */

static void req_free(struct prefill *p, struct preq *r)
{
    if (r->dl) {
        for (int32_t l = 0; l < p->node.layout.n_layers; l++)
            if (r->dl[l])
                kvr_xfer_dlist_release(r->dl[l]);
        free(r->dl);
    }
    if (r->n_lblocks)
        kvr_blocktab_release(p->bt, r->lblocks, r->n_lblocks);
    peer_put(p, r->peer);
    free(r->lblocks);
    free(r->dblocks);
    free(r->tokens);
    kvr_node_sampling_free(&r->sp);
    free(r);
}

static void send_done(struct prefill *p, struct preq *r, kvr_status_t code, const char *msg)
{
    Kvrail__PrefillDone d = KVRAIL__PREFILL_DONE__INIT;
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    st.code = code;
    st.message = (char *)(msg ? msg : "");
    d.request_id = r->id;
    d.attempt = r->attempt;
    d.status = &st;
    d.decode_fault = code != KVR_OK && r->d_fault;
    d.bytes_moved = r->bytes;
    d.descriptors_posted = r->ndesc_posted;
    d.descriptors_raw = r->ndesc_raw;
    uint64_t now = kvr_now_ns();
    d.queue_us = r->t_start ? (r->t_start - r->t_recv) / 1000 : (now - r->t_recv) / 1000;
    d.compute_us = r->t_computed ? (r->t_computed - r->t_start) / 1000 : 0;
    d.transfer_us = r->t_first_post && r->t_done ? (r->t_done - r->t_first_post) / 1000 : 0;
    d.total_us = (now - r->t_recv) / 1000;
    d.computed_tokens =
        (uint32_t)(r->n_tokens - (int32_t)(r->cached_p * p->node.layout.block_size));
    d.node_name = p->node.name;
    KVR_LOG_DEBUG(COMP,
                  "request %" PRIu64 ": %d tokens (%u cached here, %u on the decode node), queue "
                  "%" PRIu64 " us, compute %" PRIu64 " us, posting %" PRIu64 " us, %" PRIu64
                  " bytes in %u/%u descriptors",
                  r->id, r->n_tokens, r->cached_p * (uint32_t)p->node.layout.block_size,
                  r->cached_d * (uint32_t)p->node.layout.block_size, d.queue_us, d.compute_us,
                  d.transfer_us, r->bytes, r->ndesc_posted, r->ndesc_raw);
    kvr_node_send(&p->node, KVRAIL__METHOD__PREFILL_DONE, &d.base);
    kvr_node_stats_dirty(&p->node);
}

static void notify_abort(struct prefill *p, struct preq *r, kvr_status_t why)
{
    if (!r->peer || r->peer->failed || r->notified)
        return;
    struct kvr_notif n = {0};
    n.kind = KVR_NOTIF_KV_ABORT;
    n.request_id = r->id;
    n.attempt = r->attempt;
    n.incarnation = p->node.incarnation;
    snprintf(n.node, sizeof n.node, "%s", p->node.name);
    n.status = why;
    n.first_block = r->dblocks ? r->dblocks[r->cached_d] : UINT32_MAX;
    uint8_t wire[KVR_NOTIF_WIRE_MAX];
    size_t wl = kvr_notif_encode(&n, wire, sizeof wire);
    (void)kvr_xfer_notify(r->peer->peer, wire, wl);
    r->notified = true;
}

/* Whether writes the request posted are still in flight. */
static bool writes_inflight(const struct prefill *p, const struct preq *r)
{
    for (int32_t l = 0; r->dl && l < r->layers_posted; l++)
        if (r->dl[l] && kvr_xfer_test(r->dl[l]) == KVR_INPROGRESS)
            return true;
    return false;
}

/* Ends a request that failed or was canceled: told to the decode node and the
 * router at once; while writes it posted are in flight, its lists and staging
 * blocks are kept (PQ_RETIRING) and check_active frees them later, so the
 * staging blocks are not reused under a write and the loop never waits. */
static void req_fail(struct prefill *p, struct preq *r, kvr_status_t code, const char *msg)
{
    if (code == KVR_ERR_CANCELED)
        KVR_LOG_INFO(COMP, "request %" PRIu64 ": %s", r->id, msg);
    else
        KVR_LOG_WARN(COMP, "request %" PRIu64 ": %s (%s)", r->id, msg, kvr_status_str(code));
    notify_abort(p, r, code);
    if (r->peer && kvr_xfer_peer_status(r->peer->peer) != KVR_OK)
        r->peer->failed = true;
    /* a cancel came from the router: it knows; a failure after PrefillDone
     * is told by a second one (the router retries at once) */
    if (!r->canceled && (!r->done_sent || code != KVR_ERR_CANCELED))
        send_done(p, r, code, msg);
    if (code == KVR_ERR_CANCELED)
        p->n_canceled++;
    else
        p->n_failed++;
    if (writes_inflight(p, r)) { /* check_active frees it: the loop does not wait */
        r->state = PQ_RETIRING;
        r->canceled = true; /* no longer found by its id */
        r->deadline = r->t_progress + (uint64_t)r->lease_ms * 1000000ull / 2;
        r->next = p->active;
        p->active = r;
        return;
    }
    req_free(p, r);
}

static kvr_status_t prepare_lists(struct prefill *p, struct preq *r)
{
    const struct kvr_kv_layout *L = &p->node.layout;
    size_t bb = kvr_kv_block_bytes(L);
    uint32_t first = r->cached_d, n = r->n_lblocks - first;
    if (n == 0)
        return KVR_OK; /* nothing to move (cannot happen: the last block is never cached) */
    struct kvr_xfer_desc *descs = calloc(n, sizeof *descs);
    r->dl = calloc((size_t)L->n_layers, sizeof *r->dl);
    if (!descs || !r->dl) {
        free(descs);
        return KVR_ERR_NO_MEMORY;
    }
    kvr_status_t s = KVR_OK;
    for (int32_t l = 0; l < L->n_layers && s == KVR_OK; l++) {
        for (uint32_t i = 0; i < n; i++) {
            descs[i].lmem = p->npool.mem[l];
            descs[i].loff = (uint64_t)r->lblocks[first + i] * bb;
            descs[i].rmem = r->peer->rmem[l];
            descs[i].roff = (uint64_t)r->dblocks[first + i] * bb;
            descs[i].len = bb;
        }
        s = kvr_xfer_dlist_prepare(r->peer->peer, KVR_XFER_WRITE, descs, n, &r->dl[l]);
        if (s == KVR_OK) {
            size_t co = 0;
            kvr_xfer_dlist_count(r->dl[l], &co);
            r->ndesc_raw += n;
            r->ndesc_posted += (uint32_t)co;
            r->bytes += (uint64_t)n * bb;
        }
    }
    free(descs);
    if (s == KVR_OK)
        r->prepared = true;
    return s;
}

/* true when r's last sign of life to its decode node went out more than
 * half a lease ago: the decode node may have fenced this writer out and
 * reused the blocks (it waits a whole lease from the sign's arrival), so
 * nothing more may be written for r; sets r's error (once) and counts it. */
static bool write_lease_lost(struct prefill *p, struct preq *r, uint64_t now)
{
    uint64_t half = (uint64_t)r->lease_ms * 1000000ull / 2;
    if (!r->have_target || r->notified || now - r->t_progress <= half)
        return false;
    if (r->err == KVR_OK) {
        snprintf(r->errmsg, sizeof r->errmsg,
                 "no sign of life sent to decode node '%s' for %" PRIu64
                 " ms (over half the %u ms lease: this node was stopped or starved); it may "
                 "have reused the blocks, so none are written",
                 r->peer ? r->peer->name : "?", (now - r->t_progress) / 1000000u, r->lease_ms);
        KVR_LOG_WARN(COMP, "request %" PRIu64 ": %s", r->id, r->errmsg);
        r->err = KVR_ERR_TIMEOUT;
        p->self_fenced++;
    }
    return true;
}

/* Posts every finished layer not posted yet (none once the write lease is
 * lost). */
static kvr_status_t post_ready_layers(struct prefill *p, struct preq *r)
{
    if (!r->prepared)
        return KVR_OK;
    if (r->layers_posted < r->layers_done && write_lease_lost(p, r, kvr_now_ns()))
        return KVR_ERR_TIMEOUT;
    while (r->layers_posted < r->layers_done) {
        kvr_xfer_dlist_t *dl = r->dl ? r->dl[r->layers_posted] : NULL;
        if (dl) {
            if (!r->t_first_post)
                r->t_first_post = kvr_now_ns();
            kvr_status_t s = kvr_xfer_post(dl);
            if (s != KVR_INPROGRESS && s != KVR_OK) {
                snprintf(r->errmsg, sizeof r->errmsg, "posting layer %d to '%s': %s",
                         r->layers_posted, r->peer->name, kvr_status_str(s));
                r->d_fault = true;
                return s;
            }
        }
        r->layers_posted++;
    }
    return KVR_OK;
}

static kvr_status_t send_ready(struct prefill *p, struct preq *r)
{
    struct kvr_notif n = {0};
    n.kind = KVR_NOTIF_KV_READY;
    n.request_id = r->id;
    n.attempt = r->attempt;
    n.incarnation = p->node.incarnation;
    snprintf(n.node, sizeof n.node, "%s", p->node.name);
    n.first_token = r->first_token;
    n.logprob = r->logprob;
    n.n_top = (uint8_t)(r->n_top < KVR_NOTIF_MAX_TOP ? r->n_top : KVR_NOTIF_MAX_TOP);
    memcpy(n.top_ids, r->top_ids, n.n_top * sizeof n.top_ids[0]);
    memcpy(n.top_lps, r->top_lps, n.n_top * sizeof n.top_lps[0]);
    n.n_tokens = (uint32_t)r->n_tokens;
    n.cached_tokens = r->cached_d * (uint32_t)p->node.layout.block_size;
    n.bytes = r->bytes;
    n.first_block = r->dblocks[r->cached_d];
    uint8_t wire[KVR_NOTIF_WIRE_MAX];
    size_t wl = kvr_notif_encode(&n, wire, sizeof wire);
    kvr_status_t s = wl ? kvr_xfer_notify(r->peer->peer, wire, wl) : KVR_ERR_INVALID;
    if (s == KVR_OK) {
        r->notified = true;
    } else {
        snprintf(r->errmsg, sizeof r->errmsg, "notifying '%s': %s", r->peer->name,
                 kvr_status_str(s));
        r->d_fault = true;
    }
    return s;
}

static kvr_status_t apply_target(struct prefill *p, struct preq *r, const Kvrail__PrefillTarget *t)
{
    const struct kvr_kv_layout *L = &p->node.layout;
    uint32_t nb = (uint32_t)((r->n_tokens + L->block_size - 1) / L->block_size);
    char err[300];
    const char *dn = t->decode_node ? t->decode_node : "?";
    if (t->n_block_ids < nb) {
        snprintf(r->errmsg, sizeof r->errmsg,
                 "decode node '%s' reserved %zu blocks, the prompt needs %u (a broken or "
                 "foreign decode node)",
                 dn, t->n_block_ids, nb);
        r->d_fault = true;
        return KVR_ERR_INVALID;
    }
    if (t->cached_tokens % (uint32_t)L->block_size != 0 ||
        t->cached_tokens >= (uint32_t)r->n_tokens) {
        snprintf(r->errmsg, sizeof r->errmsg,
                 "decode node '%s' reserved with cached_tokens %u, not a whole number of "
                 "blocks below the prompt length %d",
                 dn, t->cached_tokens, r->n_tokens);
        r->d_fault = true;
        return KVR_ERR_INVALID;
    }
    kvr_status_t s = peer_get(p, t, &r->peer, err, sizeof err);
    if (s != KVR_OK) {
        snprintf(r->errmsg, sizeof r->errmsg, "%s", err);
        if (s == KVR_ERR_MISMATCH)
            KVR_LOG_ERROR(COMP, "%s", err);
        /* its address, rkeys or layout were refused: the decode node's */
        r->d_fault = s != KVR_ERR_NO_MEMORY;
        return s;
    }
    r->dblocks = malloc(nb * sizeof *r->dblocks);
    if (!r->dblocks)
        return KVR_ERR_NO_MEMORY;
    memcpy(r->dblocks, t->block_ids, nb * sizeof *r->dblocks);
    r->n_dblocks = nb;
    r->cached_d = t->cached_tokens / (uint32_t)L->block_size;
    r->have_target = true;
    r->t_progress = kvr_now_ns();
    if (r->state != PQ_QUEUED) {
        s = prepare_lists(p, r);
        if (s != KVR_OK) {
            snprintf(r->errmsg, sizeof r->errmsg, "preparing descriptor lists: %s",
                     kvr_status_str(s));
            return s;
        }
    }
    return KVR_OK;
}

/* ---- control messages (also called from inside the layer callback: never
 * starts a computation) ---- */

static void queue_remove(struct prefill *p, struct preq *r)
{
    struct preq *prev = NULL;
    for (struct preq *q = p->queue; q; prev = q, q = q->next)
        if (q == r) {
            if (prev)
                prev->next = r->next;
            else
                p->queue = r->next;
            if (p->queue_tail == r)
                p->queue_tail = prev;
            r->next = NULL;
            p->queued_tokens -= (uint64_t)r->n_tokens;
            return;
        }
}

static void on_prefill(struct prefill *p, const Kvrail__Prefill *m)
{
    const int32_t vocab = p->vocab, maxpos = kvr_model_max_pos(p->node.model);
    struct preq tmp = {.id = m->request_id, .attempt = m->attempt, .t_recv = kvr_now_ns()};
    char msg[200];
    struct preq *old = find_req(p, m->request_id);
    if (old) {
        /* the router dispatches a request again (after a failure elsewhere):
         * the earlier dispatch is abandoned, silently */
        KVR_LOG_INFO(COMP, "request %" PRIu64 ": dispatched again; the earlier dispatch stops",
                     m->request_id);
        old->canceled = true;
        if (old->state == PQ_QUEUED) {
            queue_remove(p, old);
            req_fail(p, old, KVR_ERR_CANCELED, "dispatched again");
        } else if (old->state == PQ_AWAIT_TARGET) {
            unlink_req(&p->active, old);
            req_fail(p, old, KVR_ERR_CANCELED, "dispatched again");
        }
        job_recheck(p);
    }
    if (m->n_token_ids == 0 || m->n_token_ids >= (size_t)maxpos) {
        snprintf(msg, sizeof msg, "prompt of %zu tokens: must be 1 .. %d", m->n_token_ids,
                 maxpos - 1);
        send_done(p, &tmp, KVR_ERR_INVALID, msg);
        return;
    }
    for (size_t i = 0; i < m->n_token_ids; i++)
        if (m->token_ids[i] >= (uint32_t)vocab) {
            snprintf(msg, sizeof msg, "token %zu of the prompt is %u, outside the vocabulary (%d)",
                     i, m->token_ids[i], vocab);
            send_done(p, &tmp, KVR_ERR_INVALID, msg);
            return;
        }
    uint32_t nb = (uint32_t)((m->n_token_ids + (size_t)p->node.layout.block_size - 1) /
                             (size_t)p->node.layout.block_size);
    if (nb > p->max_blocks_per_req) {
        snprintf(msg, sizeof msg, "prompt needs %u staging blocks, this node has %u", nb,
                 p->max_blocks_per_req);
        send_done(p, &tmp, KVR_ERR_OVERLOAD, msg);
        return;
    }
    struct preq *r = calloc(1, sizeof *r);
    if (!r || !(r->tokens = malloc(m->n_token_ids * sizeof *r->tokens))) {
        free(r);
        send_done(p, &tmp, KVR_ERR_NO_MEMORY, "out of memory");
        return;
    }
    r->id = m->request_id;
    r->attempt = m->attempt;
    r->t_recv = tmp.t_recv;
    r->generated = m->generated < m->n_token_ids ? m->generated : 0;
    r->n_tokens = (int32_t)m->n_token_ids;
    for (size_t i = 0; i < m->n_token_ids; i++)
        r->tokens[i] = (int32_t)m->token_ids[i];
    if (kvr_node_sampling(m->sampling, m->seed ? m->seed : (m->sampling ? m->sampling->seed : 0),
                          &r->sp) != KVR_OK) {
        free(r->tokens);
        free(r);
        send_done(p, &tmp, KVR_ERR_NO_MEMORY, "out of memory");
        return;
    }
    if (m->sampling)
        r->top_n = m->sampling->top_logprobs < KVR_SAMPLE_MAX_TOP_LOGPROBS
                       ? m->sampling->top_logprobs
                       : KVR_SAMPLE_MAX_TOP_LOGPROBS;
    r->lease_ms = m->lease_ms ? m->lease_ms : p->node.cluster->timeouts.lease_ms;
    r->deadline = r->t_recv + (uint64_t)(p->node.cluster->timeouts.prefill_ms
                                             ? p->node.cluster->timeouts.prefill_ms
                                             : 60000) *
                                  1000000ull;
    r->state = PQ_QUEUED;
    if (p->queue_tail)
        p->queue_tail->next = r;
    else
        p->queue = r;
    p->queue_tail = r;
    p->queued_tokens += (uint64_t)r->n_tokens;
}

static void on_target(struct prefill *p, const Kvrail__PrefillTarget *t)
{
    struct preq *r = find_req(p, t->request_id);
    if (!r || r->have_target || r->canceled || r->attempt != t->attempt) {
        KVR_LOG_DEBUG(COMP,
                      "request %" PRIu64 ": PrefillTarget (attempt %u) for no waiting request",
                      t->request_id, t->attempt);
        return;
    }
    if (t->decode_address.len)
        p->targets_addr++;
    else
        p->targets_short++;
    kvr_status_t s = apply_target(p, r, t);
    if (s == KVR_OK && r->state == PQ_COMPUTING) {
        s = post_ready_layers(p, r); /* the layers the worker finished already */
        kvr_xfer_progress(p->node.xfer);
    }
    if (s != KVR_OK) {
        r->err = s;
        if (r->state == PQ_QUEUED) {
            queue_remove(p, r);
            req_fail(p, r, s, r->errmsg);
        } else if (r->state == PQ_AWAIT_TARGET) {
            unlink_req(&p->active, r);
            req_fail(p, r, s, r->errmsg);
        } /* computing: failed at the job's end */
        job_recheck(p);
    }
}

static void on_cancel(struct prefill *p, const Kvrail__NodeCancel *c)
{
    struct preq *r = find_req(p, c->request_id);
    if (!r)
        return;
    r->canceled = true;
    if (r->state == PQ_QUEUED) {
        queue_remove(p, r);
        req_fail(p, r, KVR_ERR_CANCELED, "canceled while queued");
    } else if (r->state == PQ_AWAIT_TARGET) {
        unlink_req(&p->active, r);
        req_fail(p, r, KVR_ERR_CANCELED, "canceled");
    }
    /* computing: stops at the next layer; draining: the data is out already
     * (marked canceled, so that a new dispatch of the same id is a new request) */
    job_recheck(p);
}

static void on_msg(void *arg, unsigned method, ProtobufCMessage *m)
{
    struct prefill *p = arg;
    switch (method) {
    case KVRAIL__METHOD__PREFILL:
        on_prefill(p, (Kvrail__Prefill *)m);
        break;
    case KVRAIL__METHOD__PREFILL_TARGET:
        on_target(p, (Kvrail__PrefillTarget *)m);
        break;
    case KVRAIL__METHOD__NODE_CANCEL:
        on_cancel(p, (Kvrail__NodeCancel *)m);
        break;
    default:
        KVR_LOG_DEBUG(COMP, "ignored %s", kvr_proto_method_name(method));
    }
}

/* ---- computation ---- */

/* Stops the job on the worker at its next layer when none of its members
 * is still wanted (a batch goes on for the ones that are). */
static void job_recheck(struct prefill *p)
{
    if (!p->busy)
        return;
    for (size_t i = 0; i < p->n_batch; i++)
        if (!p->batch[i]->canceled && !p->batch[i]->err)
            return;
    atomic_store(&p->job.base.cancel, true);
}

static void finish_computed(struct prefill *p, struct preq *r)
{
    /* PrefillDone (load accounting only, no token) first; the first token
     * goes to the decode node in KV_READY, after the last layer's writes
     * that follow, and the decode node streams it as token 0.  A transfer
     * that then fails leaves the decode node's lease to fail the request */
    if (kvr_xfer_peer_status(r->peer->peer) == KVR_OK) {
        r->t_done = kvr_now_ns();
        send_done(p, r, KVR_OK, "");
        r->done_sent = true;
    }
    kvr_status_t s = post_ready_layers(p, r);
    if (s == KVR_OK)
        s = send_ready(p, r);
    if (s != KVR_OK) {
        unlink_req(&p->active, r);
        req_fail(p, r, s, r->errmsg);
        return;
    }
    r->state = PQ_DRAINING;
}

/* Takes r (the queue's head) out of the queue into the active list with its
 * staging blocks (the local prefix cache's, then fresh ones) and, if its
 * target is known, its descriptor lists.  false: r failed (and is gone). */
static bool begin_req(struct prefill *p, struct preq *r)
{
    const struct kvr_kv_layout *L = &p->node.layout;
    uint32_t bs = (uint32_t)L->block_size;
    uint32_t nb = ((uint32_t)r->n_tokens + bs - 1) / bs;
    queue_remove(p, r);
    r->lblocks = malloc(nb * sizeof *r->lblocks);
    if (!r->lblocks) {
        req_fail(p, r, KVR_ERR_NO_MEMORY, "out of memory");
        return false;
    }
    size_t nh = 0;
    (void)kvr_blockhash_seq((const uint32_t *)r->tokens, (size_t)r->n_tokens, bs, p->hash_scratch,
                            nb, &nh);
    uint32_t maxm = ((uint32_t)r->n_tokens - 1) / bs;
    r->cached_p = kvr_blocktab_match(p->bt, p->hash_scratch, (uint32_t)nh, maxm, r->lblocks);
    if (kvr_blocktab_alloc(p->bt, nb - r->cached_p, r->lblocks + r->cached_p) != KVR_OK) {
        kvr_blocktab_release(p->bt, r->lblocks, r->cached_p);
        req_fail(p, r, KVR_ERR_INTERNAL, "staging allocation failed");
        return false;
    }
    r->n_lblocks = nb;
    r->state = PQ_COMPUTING;
    r->t_start = kvr_now_ns();
    r->next = p->active;
    p->active = r;
    if (r->have_target && !r->prepared) {
        kvr_status_t s = prepare_lists(p, r);
        if (s != KVR_OK) {
            unlink_req(&p->active, r);
            req_fail(p, r, s, "preparing descriptor lists failed");
            return false;
        }
    }
    return true;
}

/* After the engine: s is the computation's status for r, logits its last
 * position's; samples the first token and sends what follows (or fails r). */
static void end_req(struct prefill *p, struct preq *r, kvr_status_t s, const float *logits)
{
    uint32_t bs = (uint32_t)p->node.layout.block_size;
    int32_t n_cached = (int32_t)(r->cached_p * bs);
    r->t_computed = kvr_now_ns();
    if (r->canceled)
        s = KVR_ERR_CANCELED;
    else if (r->err)
        s = r->err; /* set by a failed target or post (a batch goes on without it) */
    if (!p->layerwise && s == KVR_OK)
        r->layers_done = p->node.layout.n_layers;
    if (s != KVR_OK) {
        unlink_req(&p->active, r);
        if (r->canceled)
            req_fail(p, r, KVR_ERR_CANCELED, "canceled during the prefill");
        else
            req_fail(p, r, s, r->errmsg[0] ? r->errmsg : "the engine's prefill failed");
        return;
    }
    p->computed_tokens += (uint64_t)(r->n_tokens - n_cached);
    p->local_cached_tokens += (uint64_t)n_cached;
    kvr_sampler_t *smp = NULL;
    char err[200];
    s = kvr_sampler_create(&r->sp, p->vocab, &smp, err, sizeof err);
    if (s == KVR_OK) {
        kvr_sampler_add_prompt(smp, r->tokens, (size_t)r->n_tokens - r->generated);
        kvr_sampler_add_generated(smp, r->tokens + r->n_tokens - r->generated, r->generated);
        s = kvr_sampler_sample(smp, logits, &r->first_token, &r->logprob);
        kvr_sampler_destroy(smp);
        if (r->top_n)
            r->n_top = kvr_sample_top_logprobs(logits, p->vocab, (int32_t)r->top_n, r->top_ids,
                                               r->top_lps);
    }
    if (s != KVR_OK) {
        unlink_req(&p->active, r);
        req_fail(p, r, s, "sampling the first token failed");
        return;
    }
    if (r->have_target)
        finish_computed(p, r);
    else
        r->state = PQ_AWAIT_TARGET;
}

static uint32_t req_blocks(const struct prefill *p, const struct preq *r)
{
    uint32_t bs = (uint32_t)p->node.layout.block_size;
    return ((uint32_t)r->n_tokens + bs - 1) / bs;
}

/* Runs on the engine worker: the job's prefill, layer events to the loop. */
static kvr_status_t pjob_run(struct kvr_worker_job *base, kvr_ctx_t *ctx)
{
    struct pjob *j = (struct pjob *)base;
    kvr_layer_done_fn cb = j->layerwise ? kvr_worker_layer_done : NULL;
    if (j->n == 1) {
        struct kvr_prefill_req pr = {
            .tokens = j->seqs[0].tokens,
            .n_tokens = j->seqs[0].n_tokens,
            .n_cached = j->seqs[0].n_cached,
            .block_table = j->seqs[0].block_table,
            .n_blocks = j->seqs[0].n_blocks,
            .layer_done = cb,
            .layer_done_arg = base,
        };
        return kvr_engine_prefill(ctx, j->pool, &pr, j->logits);
    }
    return kvr_engine_prefill_batch(ctx, j->pool, j->seqs, j->n, cb, base, j->logits);
}

/* A layer of the job is in the staging pool: post it for every member
 * whose target is known (the others post it when the target arrives). */
static void on_layer(struct prefill *p, int32_t layer)
{
    for (size_t i = 0; i < p->n_batch; i++) {
        struct preq *r = p->batch[i];
        if (layer + 1 > r->layers_done)
            r->layers_done = layer + 1;
        if (r->canceled || r->err)
            continue;
        kvr_status_t s = post_ready_layers(p, r);
        if (s != KVR_OK)
            r->err = s;
    }
    kvr_xfer_progress(p->node.xfer);
    job_recheck(p);
}

/* The job is over: every member gets its result. */
static void on_job_done(struct prefill *p, kvr_status_t s)
{
    size_t n = p->n_batch;
    p->busy = false;
    p->n_batch = 0;
    if (n > 1) {
        p->n_batched++;
        p->batched_reqs += n;
    }
    for (size_t i = 0; i < n; i++)
        end_req(p, p->batch[i], s, p->batch_logits + i * (size_t)p->vocab);
}

static void on_worker(void *arg, const struct kvr_worker_event *ev)
{
    struct prefill *p = arg;
    if (ev->job != &p->job.base || !p->busy)
        return;
    if (ev->kind == KVR_WORKER_LAYER)
        on_layer(p, ev->layer);
    else if (ev->kind == KVR_WORKER_DONE)
        on_job_done(p, ev->job->status);
}

static void submit_job(struct prefill *p)
{
    struct pjob *j = &p->job;
    j->base.run = pjob_run;
    j->pool = &p->npool.kv;
    j->n = p->n_batch;
    j->layerwise = p->layerwise;
    j->logits = p->batch_logits;
    for (size_t i = 0; i < p->n_batch; i++) {
        struct preq *r = p->batch[i];
        j->seqs[i] = (struct kvr_prefill_seq){
            .tokens = r->tokens,
            .n_tokens = r->n_tokens,
            .n_cached = (int32_t)(r->cached_p * (uint32_t)p->node.layout.block_size),
            .block_table = (const int32_t *)r->lblocks,
            .n_blocks = (int32_t)r->n_lblocks,
        };
    }
    p->busy = true;
    kvr_status_t s = kvr_worker_submit(p->node.worker, &j->base);
    if (s != KVR_OK) {
        p->busy = false;
        size_t n = p->n_batch;
        p->n_batch = 0;
        for (size_t i = 0; i < n; i++)
            end_req(p, p->batch[i], s, p->batch_logits);
    }
}

/* Several short prompts at the queue's head, each of <= batch_tokens tokens
 * and together within the engine's chunk, are prefilled in one engine call.
 * true: a job started (or the queue's head needs to wait); false: not a
 * batch. */
static bool start_batch(struct prefill *p)
{
    uint32_t need = 0;
    int64_t total = 0;
    size_t k = 0;
    for (struct preq *r = p->queue; r && k < KVR_PREFILL_BATCH_MAX; r = r->next) {
        if (r->n_tokens > p->batch_tokens || total + r->n_tokens > p->chunk)
            break;
        total += r->n_tokens;
        need += req_blocks(p, r);
        k++;
    }
    if (k < 2)
        return false;
    if (kvr_blocktab_available(p->bt) < need)
        return true; /* staging held by draining requests: retry on the next turn */
    p->n_batch = 0;
    for (size_t i = 0; i < k; i++) {
        struct preq *r = p->queue;
        if (begin_req(p, r))
            p->batch[p->n_batch++] = r;
    }
    if (p->n_batch > 0)
        submit_job(p);
    return true;
}

static void start_next(struct prefill *p)
{
    if (p->batch_tokens > 0 && start_batch(p))
        return;
    struct preq *r = p->queue;
    if (kvr_blocktab_available(p->bt) < req_blocks(p, r))
        return; /* staging held by draining requests: retry on the next turn */
    if (!begin_req(p, r))
        return;
    p->batch[0] = r;
    p->n_batch = 1;
    submit_job(p);
}

/* Completes draining requests, times out those waiting for their target. */
static void check_active(struct prefill *p)
{
    uint64_t now = kvr_now_ns();
    struct preq *next;
    for (struct preq *r = p->active; r; r = next) {
        next = r->next;
        if (r->state == PQ_AWAIT_TARGET) {
            if (r->have_target) {
                if (!r->prepared && prepare_lists(p, r) != KVR_OK) {
                    unlink_req(&p->active, r);
                    req_fail(p, r, KVR_ERR_NO_MEMORY, "preparing descriptor lists failed");
                    continue;
                }
                finish_computed(p, r);
            } else if (now > r->deadline ||
                       now - r->t_computed > (uint64_t)r->lease_ms * 1000000ull) {
                unlink_req(&p->active, r);
                /* the router relays the decode node's Reserved as the
                 * target at once: none means the decode node never
                 * answered its Reserve, a fault that is not this node's */
                r->d_fault = true;
                req_fail(p, r, KVR_ERR_TIMEOUT, "no PrefillTarget before the lease expired");
            }
            continue;
        }
        if (r->state == PQ_RETIRING) {
            if (writes_inflight(p, r) && kvr_xfer_peer_status(r->peer->peer) == KVR_OK) {
                if (now <= r->deadline)
                    continue;
                /* a live peer that completes nothing: its lists end with it */
                kvr_xfer_peer_abort(r->peer->peer, "writes of a failed request still in flight "
                                                   "when its write lease ran out");
                r->peer->failed = true;
            }
            unlink_req(&p->active, r);
            req_free(p, r); /* releases the lists, then the local blocks */
            continue;
        }
        if (r->state != PQ_DRAINING)
            continue;
        kvr_status_t st = KVR_OK;
        for (int32_t l = 0; r->dl && l < p->node.layout.n_layers; l++) {
            kvr_status_t t = kvr_xfer_test(r->dl[l]);
            if (t == KVR_INPROGRESS) {
                st = KVR_INPROGRESS;
                break;
            }
            if (t != KVR_OK && st == KVR_OK)
                st = t;
        }
        if (st == KVR_INPROGRESS && kvr_xfer_peer_status(r->peer->peer) != KVR_OK)
            st = KVR_ERR_PEER_FAILURE;
        if (st == KVR_INPROGRESS && now > r->deadline) {
            st = KVR_ERR_TIMEOUT; /* releasing the lists must not wait on it either */
            kvr_xfer_peer_abort(r->peer->peer, "KV writes still in flight at the request's "
                                               "deadline");
        }
        if (st == KVR_INPROGRESS)
            continue;
        unlink_req(&p->active, r);
        if (st != KVR_OK) {
            /* the decode node never gets a usable KV_READY: a second
             * PrefillDone tells the router the cause now (it retries the
             * prefill), rather than the decode node's lease running out */
            char why[200];
            snprintf(why, sizeof why,
                     "KV transfer to decode node '%s' failed after the prompt was computed: %s",
                     r->peer->name, kvr_status_str(st));
            KVR_LOG_WARN(COMP, "request %" PRIu64 ": %s", r->id, why);
            r->d_fault = true;
            send_done(p, r, st, why);
            kvr_node_metrics_transfer_failed(st);
            r->peer->failed = true;
            p->n_failed++;
            req_free(p, r);
            continue;
        }
        KVR_LOG_DEBUG(COMP, "request %" PRIu64 ": writes complete %" PRIu64 " us after KV_READY",
                      r->id, (kvr_now_ns() - r->t_done) / 1000);
        p->n_ok++;
        p->bytes_pushed += r->bytes;
        p->ndesc_raw += r->ndesc_raw;
        p->ndesc_posted += r->ndesc_posted;
        /* time on the wire: each layer's post to its completion as observed
         * by the next progress call (at the latest one layer of compute
         * later), so an upper bound of the wire time; the time between the
         * posts is not counted */
        uint64_t wire_ns = 0;
        for (int32_t l = 0; r->dl && l < p->node.layout.n_layers; l++) {
            struct kvr_xfer_stats xs;
            kvr_xfer_dlist_stats(r->dl[l], &xs);
            wire_ns += xs.complete_ns;
        }
        p->transfer_ns += wire_ns;
        kvr_node_metrics_kv_transfer(r->bytes, wire_ns);
        kvr_node_stats_dirty(&p->node);
        /* keep the prompt's full blocks in the local prefix cache */
        uint32_t bs = (uint32_t)p->node.layout.block_size;
        size_t nh = 0;
        (void)kvr_blockhash_seq((const uint32_t *)r->tokens, (size_t)r->n_tokens, bs,
                                p->hash_scratch, r->n_lblocks, &nh);
        for (size_t i = 0; i < nh; i++)
            (void)kvr_blocktab_store(p->bt, r->lblocks[i], p->hash_scratch[i]);
        req_free(p, r);
    }
}

static void send_register(void *arg)
{
    struct prefill *p = arg;
    Kvrail__RegisterRequest r = KVRAIL__REGISTER_REQUEST__INIT;
    Kvrail__KvLayout l;
    kvr_node_fill_register(&p->node, &r, &l, p->addr, p->addr_len);
    r.total_blocks = (uint32_t)p->npool.kv.n_blocks;
    kvr_node_send(&p->node, KVRAIL__METHOD__REGISTER, &r.base);
}

static void send_heartbeat(void *arg)
{
    struct prefill *p = arg;
    Kvrail__Heartbeat h = KVRAIL__HEARTBEAT__INIT;
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(p->bt, &c);
    h.node_name = p->node.name;
    h.free_blocks = c.free + c.evictable;
    h.total_blocks = c.total;
    h.cached_blocks = c.cached;
    h.reserved_blocks = c.referenced;
    uint64_t inflight = 0;
    for (struct preq *r = p->active; r; r = r->next)
        if (r->state != PQ_RETIRING)
            inflight += (uint64_t)r->n_tokens;
    h.inflight_prefill_tokens = inflight;
    h.queued_prefill_tokens = p->queued_tokens;
    h.kv_bytes_moved = p->bytes_pushed;
    h.kv_transfer_ns = p->transfer_ns;
    h.incarnation = p->node.incarnation;
    h.bad_frames = p->node.bad_frames;
    h.self_fenced = p->self_fenced;
    kvr_node_send(&p->node, KVRAIL__METHOD__HEARTBEAT, &h.base);
}

/* How many prefills wait in the queue and how many are running. */
static void queue_lengths(const struct prefill *p, int *queued, int *active)
{
    *queued = *active = 0;
    for (const struct preq *r = p->queue; r; r = r->next)
        (*queued)++;
    for (const struct preq *r = p->active; r; r = r->next)
        (*active)++;
}

static void role_stats(void *arg, struct kvr_sbuf *b)
{
    struct prefill *p = arg;
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(p->bt, &c);
    int nq, na;
    queue_lengths(p, &nq, &na);
    kvr_sbuf_printf(
        b,
        ", \"prefills_ok\": %" PRIu64 ", \"prefills_failed\": %" PRIu64
        ", \"prefills_canceled\": %" PRIu64 ", \"bytes_pushed\": %" PRIu64
        ", \"transfer_ns\": %" PRIu64 ", \"descriptors_raw\": %" PRIu64
        ", \"descriptors_posted\": %" PRIu64 ", \"computed_tokens\": %" PRIu64
        ", \"local_cached_tokens\": %" PRIu64 ", \"batched_prefills\": %" PRIu64
        ", \"batched_requests\": %" PRIu64 ", \"queued\": %d, \"active\": %d, "
        "\"computing\": %s, \"staging_total\": %u, \"staging_free\": %u, "
        "\"staging_cached\": %u, \"staging_referenced\": %u, \"block_bytes\": %zu, "
        "\"layers\": %d, \"pool_setup_ns\": %" PRIu64 ", \"targets_with_address\": %" PRIu64
        ", \"targets_without_address\": %" PRIu64
        ", \"decode_nodes_known\": %zu, \"progress_sent\": %" PRIu64 ", \"self_fenced\": %" PRIu64,
        p->n_ok, p->n_failed, p->n_canceled, p->bytes_pushed, p->transfer_ns, p->ndesc_raw,
        p->ndesc_posted, p->computed_tokens, p->local_cached_tokens, p->n_batched, p->batched_reqs,
        nq, na, p->busy ? "true" : "false", c.total, c.free, c.cached, c.referenced,
        kvr_kv_block_bytes(&p->node.layout), p->node.layout.n_layers, p->npool.setup_ns,
        p->targets_addr, p->targets_short, p->n_dinfos, p->progress_sent, p->self_fenced);
}

/* Tells the decode node that r is still queued or computing here, so that
 * its reservation's lease is renewed (every third of the lease). */
static void send_progress(struct prefill *p, struct preq *r, uint64_t now)
{
    if (!r->have_target || !r->peer || r->peer->failed || r->notified || r->canceled ||
        now - r->t_progress < (uint64_t)r->lease_ms * 1000000ull / 3)
        return;
    if (write_lease_lost(p, r, now)) {
        job_recheck(p); /* no more writes for it: a sign of life now would lie */
        return;
    }
    struct kvr_notif n = {0};
    n.kind = KVR_NOTIF_KV_PROGRESS;
    n.request_id = r->id;
    n.attempt = r->attempt;
    n.incarnation = p->node.incarnation;
    snprintf(n.node, sizeof n.node, "%s", p->node.name);
    n.n_tokens = (uint32_t)r->n_tokens;
    n.first_block = r->dblocks[r->cached_d];
    uint8_t wire[KVR_NOTIF_WIRE_MAX];
    size_t wl = kvr_notif_encode(&n, wire, sizeof wire);
    if (wl && kvr_xfer_notify(r->peer->peer, wire, wl) == KVR_OK)
        p->progress_sent++;
    r->t_progress = now;
}

static int turn(void *arg)
{
    struct prefill *p = arg;
    uint64_t now = kvr_now_ns();
    for (struct preq *r = p->queue; r; r = r->next)
        send_progress(p, r, now);
    for (struct preq *r = p->active; r; r = r->next)
        if (r->state == PQ_COMPUTING)
            send_progress(p, r, now);
    if (p->queue && !p->busy)
        start_next(p);
    check_active(p);
    bool waiting = false;
    for (struct preq *r = p->active; r; r = r->next)
        waiting |= r->state != PQ_COMPUTING;
    /* a computing job wakes the loop with its events; draining requests
     * are checked often */
    /* idle or computing: the loop sleeps until the next timer (heartbeat,
     * stats) or an event */
    return p->queue && !p->busy ? 0 : waiting ? 1 : 1000;
}

/* The figures of the metrics mirror (node_metrics.h), from the fields. */
static void role_counters(void *arg, void (*put)(void *ctx, int id, double v), void *ctx)
{
    struct prefill *p = arg;
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(p->bt, &c);
    int nq, na;
    queue_lengths(p, &nq, &na);
    put(ctx, KVR_NC_PREFILLS_OK, (double)p->n_ok);
    put(ctx, KVR_NC_PREFILLS_FAILED, (double)p->n_failed);
    put(ctx, KVR_NC_PREFILLS_CANCELED, (double)p->n_canceled);
    put(ctx, KVR_NC_BYTES_PUSHED, (double)p->bytes_pushed);
    put(ctx, KVR_NC_TRANSFER_NS, (double)p->transfer_ns);
    put(ctx, KVR_NC_DESCRIPTORS_RAW, (double)p->ndesc_raw);
    put(ctx, KVR_NC_DESCRIPTORS_POSTED, (double)p->ndesc_posted);
    put(ctx, KVR_NC_COMPUTED_TOKENS, (double)p->computed_tokens);
    put(ctx, KVR_NC_LOCAL_CACHED_TOKENS, (double)p->local_cached_tokens);
    put(ctx, KVR_NC_QUEUED, nq);
    put(ctx, KVR_NC_ACTIVE, na);
    put(ctx, KVR_NC_BATCHED_PREFILLS, (double)p->n_batched);
    put(ctx, KVR_NC_STAGING_TOTAL, c.total);
    put(ctx, KVR_NC_STAGING_FREE, c.free);
    put(ctx, KVR_NC_STAGING_CACHED, c.cached);
}

static const struct kvr_node_ops prefill_ops = {
    .send_register = send_register,
    .send_heartbeat = send_heartbeat,
    .on_msg = on_msg,
    .on_worker = on_worker,
    .turn = turn,
    .stats = role_stats,
    .counters = role_counters,
};

int main(int argc, char **argv)
{
    static struct prefill P;
    struct prefill *p = &P;
    char err[512];
    int rc = 1;
    kvr_status_t s =
        kvr_node_init(&p->node, argc, argv, KVR_NODE_ROLE_PREFILL, NULL, NULL, err, sizeof err);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-prefill: %s\n", err);
        kvr_node_fini(&p->node);
        return s == KVR_ERR_INVALID ? 2 : 1;
    }
    const char *lw = getenv("KVR_PREFILL_LAYERWISE");
    p->layerwise = !(lw && strcmp(lw, "0") == 0);
    if (!p->layerwise)
        KVR_LOG_INFO(COMP, "KVR_PREFILL_LAYERWISE=0: every layer is pushed after the last");
    const struct kvr_kv_layout *L = &p->node.layout;
    int32_t maxpos = kvr_model_max_pos(p->node.model);
    p->vocab = kvr_model_vocab(p->node.model);
    p->max_blocks_per_req = (uint32_t)((maxpos + L->block_size - 1) / L->block_size);
    uint64_t nblocks = p->node.self->pool_blocks;
    if (!nblocks && p->node.self->pool_bytes)
        nblocks =
            p->node.self->pool_bytes / ((uint64_t)kvr_kv_block_bytes(L) * (uint64_t)L->n_layers);
    if (!nblocks)
        nblocks = 4ull * p->max_blocks_per_req; /* staging for a few full-context prompts */
    if (nblocks < p->max_blocks_per_req)
        nblocks = p->max_blocks_per_req;
    p->hash_scratch = calloc(p->max_blocks_per_req + 1, sizeof *p->hash_scratch);
    p->batch_logits = malloc(KVR_PREFILL_BATCH_MAX * (size_t)p->vocab * sizeof *p->batch_logits);
    p->batch_tokens = KVR_PREFILL_BATCH_TOKENS;
    const char *bt_env = getenv("KVR_PREFILL_BATCH_TOKENS");
    if (bt_env) {
        char *end;
        long v = strtol(bt_env, &end, 10);
        if (end == bt_env || *end || v < 0 || v > 1 << 20) {
            rc = 2;
            fprintf(stderr, "kvrail-prefill: KVR_PREFILL_BATCH_TOKENS=%s: not a count 0..%d\n",
                    bt_env, 1 << 20);
            goto out;
        }
        p->batch_tokens = (int32_t)v;
        KVR_LOG_INFO(COMP, "KVR_PREFILL_BATCH_TOKENS=%d: prompts up to %d tokens are batched%s",
                     p->batch_tokens, p->batch_tokens, v ? "" : " (none)");
    }
    if (!p->hash_scratch || !p->batch_logits) {
        fprintf(stderr, "kvrail-prefill: out of memory\n");
        goto out;
    }
    s = kvr_node_pool_create(p->node.xfer, L, nblocks, false, &p->npool, err, sizeof err);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-prefill: staging pool: %s\n", err);
        goto out;
    }
    if (kvr_blocktab_create((uint32_t)nblocks, NULL, NULL, &p->bt) != KVR_OK) {
        fprintf(stderr, "kvrail-prefill: out of memory\n");
        goto out;
    }
    struct kvr_ctx_opts co = {0};
    co.n_threads = p->node.self->threads > 0 ? p->node.self->threads : 1;
    co.max_batch = 1;
    s = kvr_node_start_worker(&p->node, &co, err, sizeof err);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-prefill: engine worker: %s\n", err);
        goto out;
    }
    p->chunk = kvr_worker_max_tokens(p->node.worker);
    s = kvr_xfer_address(p->node.xfer, &p->addr, &p->addr_len);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-prefill: transport address: %s\n", kvr_status_str(s));
        goto out;
    }
    KVR_LOG_INFO(COMP, "staging pool: %" PRIu64 " blocks x %d layers, %d compute threads", nblocks,
                 L->n_layers, co.n_threads);

    kvr_node_run(&p->node, &prefill_ops, p);
    KVR_LOG_INFO(COMP, "stopping: %" PRIu64 " prefills, %" PRIu64 " bytes pushed", p->n_ok,
                 p->bytes_pushed);
    rc = 0;
out:
    /* the worker may be computing into the staging pool: stop it first */
    kvr_worker_destroy(p->node.worker);
    p->node.worker = NULL;
    while (p->queue) {
        struct preq *r = p->queue;
        p->queue = r->next;
        req_free(p, r);
    }
    while (p->active) {
        struct preq *r = p->active;
        p->active = r->next;
        req_free(p, r);
    }
    while (p->peers)
        peer_drop(p, p->peers);
    while (p->dinfos) {
        struct dinfo *di = p->dinfos;
        p->dinfos = di->next;
        dinfo_free(di);
    }
    free(p->addr);
    kvr_blocktab_destroy(p->bt);
    kvr_node_pool_destroy(&p->npool);
    free(p->hash_scratch);
    free(p->batch_logits);
    kvr_node_fini(&p->node);
    return rc;
}
