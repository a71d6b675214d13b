/*
 * decode.c - kvrail-decode, the decode node.
 *
 * The KV pool is one slab per layer (DESIGN.md layout), allocated and
 * registered with the transfer engine once at start; its address and one
 * rkey per layer go to the router in Register, which relays them to prefill
 * nodes.  The block table (blocktab.h) tracks free, reserved and cached
 * blocks.
 *
 * Reserve{request, prompt, max_tokens} reserves every block the request can
 * ever need (prompt + max_tokens, capped at the context), reusing the
 * longest cached prefix of the prompt (never its last token, which the
 * prefill must compute to sample from); the reservation has a lease.  The
 * answer is Reserved{block ids, cached tokens} or Rejected{NO_RESOURCE when
 * the pool is full now, OVERLOAD when the request can never fit}.  The
 * prefill node writes the uncached blocks one-sidedly and then notifies
 * KV_READY{request, attempt, first token} on the same peer, so the data is
 * there when the notification arrives; this node streams that token as
 * token 0 (the only path by which it reaches the client).  With
 * local_prefill the node prefills itself.  A Reserve with attempt > 0 is
 * the router retrying the prefill on another prefill node: the same
 * reservation (same id, same cached prefix) gets a renewed lease, a new
 * writer and fresh blocks for what the writer writes, while the old
 * writer's blocks stay quarantined until it is fenced (retry_fence);
 * notifications of an earlier attempt never reach the request again.
 *
 * Continuous batching: at every step the sequences whose KV has arrived join
 * the running batch (up to max_batch), one token each is computed for all of
 * them (kvr_engine_decode), sampled with each request's own sampler and
 * streamed to the router as Token; a sequence leaves on EOS, a stop token,
 * max_tokens or the context limit.  A finished request's full prompt blocks
 * enter the prefix cache (BlockStored events with per-node sequence
 * numbers); the rest go back to the pool.  Allocation evicts the least
 * recently used cached blocks (BlockRemoved).
 *
 * Cancel frees a request's blocks at once, except while a prefill node may
 * still be writing into them: then they stay quarantined until that writer
 * is fenced (fence_start): its own KV_READY or KV_ABORT for the request
 * (ordered after its writes), a new incarnation of it registered with the
 * router (fence_restarted: the writing process is gone), or a lease without a sign of life from it
 * - the prefill node gives up writing after half a lease without having sent one (prefill.c,
 * write_lease_lost), so after a whole lease it has stopped; the writer's transfer token is revoked
 * then.  An expired lease reports the request failed and fences its blocks the same way.
 *
 * The model runs on the engine worker thread (node/worker.h).  Each job is
 * one step: at most one chunk (the cluster's prefill_chunk_tokens) of the
 * oldest local prefill, then one decode step of the running batch.  So a
 * long local prefill is spread over many steps and the running sequences
 * get a token every step meanwhile; the loop answers the router during
 * every step.  A request that a job refers to is not freed until the job
 * is over (a cancel during a step ends it when the step's DONE arrives).
 */
#include <inttypes.h>
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

#define COMP              "decode"
#define MAX_PREFILL_PEERS 64

enum dreq_state {
    DR_RESERVED,      /* waiting for the prefill node's KV */
    DR_LOCAL_PREFILL, /* this node prefills it */
    DR_READY,         /* KV here, waiting for a batch slot */
    DR_RUNNING,
    DR_QUARANTINE, /* canceled while a prefill node may still write */
    DR_PREEMPTED,  /* its blocks were taken back; waits to be recomputed */
};

struct dreq {
    struct dreq *next;
    uint64_t id;
    enum dreq_state state;
    int32_t *tokens; /* prompt, then generated */
    uint32_t n_prompt, n_tokens, cap, max_tokens, ngen;
    uint32_t *blocks;    /* [max_blocks]: room for the whole request */
    uint32_t n_blocks;   /* held now (paged: grows while decoding) */
    uint32_t max_blocks; /* ceil(cap / block_size) */
    uint32_t n_prompt_blocks, n_cached_blocks;
    uint64_t kv_bytes; /* KV_READY's count, sent on the first Token, then 0 */
    uint32_t kv_len;   /* decoding: positions whose K/V is in the blocks */
    uint64_t *hashes;  /* sequence hashes of the prompt's full blocks */
    uint32_t n_hashes;
    kvr_sampler_t *smp;
    uint32_t *stop_ids;
    size_t n_stop;
    bool ignore_eos, aborted;
    char prefill_node[KVR_CLUSTER_NAME_MAX];
    uint64_t t_reserve, t_ready, deadline;
    uint64_t lease_ns; /* KV_PROGRESS from the prefill node renews this much */
    uint32_t attempt;  /* the prefill attempt whose KV is taken (Reserve.attempt) */
    /* quarantine: the writer's incarnation (0: unknown), and the latest its
     * signs of life may keep the blocks */
    uint64_t writer_inc, fence_cap;
    /* the writer's incarnation as the router registered it (Reserve) */
    uint64_t vouched_inc;
    /* the transfer token the router gave with the Reserve for this writer
     * (its pair's, of that incarnation): its notifications must come under
     * it (on_notif); has_wtoken false when the Reserve carried none */
    uint8_t wtoken[KVR_XFER_TOKEN_LEN];
    bool has_wtoken;
    /* local prefill: prompt tokens whose K/V is in the blocks */
    uint32_t n_computed;
    uint64_t prefill_ns; /* the worker's time on its chunks */
    /* the current job refers to it: ending waits for the job's DONE */
    bool in_job, end_pending, end_keep;
    uint64_t last_step_tok_ns; /* when the last decode step's token went out */
    /* sampling.top_logprobs: alternatives sent with each token (top_n asked;
     * n_top of the token about to be sent) */
    uint32_t top_n;
    int32_t n_top;
    int32_t top_ids[KVR_SAMPLE_MAX_TOP_LOGPROBS];
    float top_lps[KVR_SAMPLE_MAX_TOP_LOGPROBS];
};

struct ppeer { /* what a prefill node said in its HELLO, per (name, incarnation, token) */
    char name[KVR_CLUSTER_NAME_MAX];
    uint64_t incarnation;
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* it came under (zeros: none) */
    uint64_t seen_ns;                  /* when its HELLO came: the least recent entry is reused */
    bool ok;
    char why[200];
};

/* The transfer token the router made for a prefill node and this node (one
 * per prefill node name: a new one revokes the old one) */
struct ptoken {
    char name[KVR_CLUSTER_NAME_MAX];
    uint8_t token[KVR_XFER_TOKEN_LEN];
};

struct evbuf {
    uint64_t *hashes;
    int *kinds;
    size_t n, cap;
};

/* One step on the engine worker: a chunk of a local prefill and/or one
 * decode step of the batch.  The loop fills it, the worker runs it. */
struct djob {
    struct kvr_worker_job base;
    const struct kvr_kv_pool *pool;
    struct dreq *chunk_req; /* NULL: no chunk */
    struct kvr_prefill_req pr;
    float *chunk_logits; /* [vocab] */
    kvr_status_t chunk_status;
    uint64_t chunk_ns;
    int n;                       /* sequences in the decode step (0: none) */
    struct kvr_decode_seq *seqs; /* [max_batch] */
    struct dreq **members;       /* [max_batch] */
    float *logits;               /* [max_batch][vocab] */
    kvr_status_t decode_status;
    uint64_t decode_ns;
};

struct decode {
    kvr_node_t node;
    struct kvr_node_pool npool;
    kvr_blocktab_t *bt;
    int32_t vocab, maxpos, max_batch, chunk;
    struct djob job;
    bool busy; /* the job is on the worker */
    struct dreq **batch;
    int n_batch;
    struct dreq *reqs; /* every request */
    const int32_t *eos;
    size_t n_eos;
    struct ppeer peers[MAX_PREFILL_PEERS];
    int n_peers;
    struct ptoken ptokens[MAX_PREFILL_PEERS]; /* oldest first */
    int n_ptokens;
    struct evbuf ev;
    uint64_t ev_seq;
    void *addr;
    size_t addr_len;
    uint64_t *hash_scratch;
    /* counters */
    uint64_t n_done, n_failed, n_canceled, n_expired, n_rejected, n_local, n_remote;
    uint64_t kv_bytes, tokens_out, steps, cached_tokens, bad_notifs;
    /* the worker's own timings (ns) and the gaps between a running
     * sequence's tokens as sent */
    uint64_t chunks, mixed_steps, chunk_ns_max, decode_ns_max, step_ns_last, itl_ns_max;
    /* paged reservations */
    bool paged;
    uint32_t headroom;
    uint64_t preemptions, grown_blocks, lease_renewals;
    uint64_t reservations;     /* new reservations made */
    uint64_t reserve_renewals; /* prefill retries on a reservation (Reserve.attempt > 0) */
    uint64_t stale_notifs;     /* notifications of an earlier attempt, ignored */
    /* notifications about a reservation that did not come under the token
     * the router gave for its writer (another peer's, or none): dropped */
    uint64_t forged_notifs, forged_logged;
    uint64_t forged_log_ns;
    /* the retry fence: blocks an old prefill attempt may still write */
    uint64_t retry_quarantines, retry_quarantined_blocks;
    uint64_t quarantines_fenced;  /* ended by the writer's KV_READY/KV_ABORT or restart */
    uint64_t quarantines_expired; /* ended by their bound, without a word from the writer */
    /* the same fence for a canceled reservation and for one whose lease
     * expired while its writer may still write */
    uint64_t cancel_quarantines, cancel_quarantined_blocks;
    uint64_t lease_quarantines, lease_quarantined_blocks;
    uint64_t tokens_revoked; /* writers' transfer tokens revoked when a fence expired */
    int batch_max;
    /* the pool's background pre-fault: the horizon reached when the router
     * first accepted the registration (UINT32_MAX: not yet registered) */
    uint32_t faulted_at_register;
};

/* ---- block events ---- */

static void on_block_event(void *arg, enum kvr_block_event ev, uint64_t hash, uint32_t block)
{
    struct decode *d = arg;
    (void)block;
    struct evbuf *b = &d->ev;
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 1024;
        uint64_t *h = realloc(b->hashes, cap * sizeof *h);
        if (h)
            b->hashes = h;
        int *k = realloc(b->kinds, cap * sizeof *k);
        if (k)
            b->kinds = k;
        if (!h || !k)
            return; /* the router will find the gap and resync */
        b->cap = cap;
    }
    b->hashes[b->n] = hash;
    b->kinds[b->n] = ev == KVR_BLOCK_STORED ? KVRAIL__BLOCK_EVENT__KIND__STORED
                                            : KVRAIL__BLOCK_EVENT__KIND__REMOVED;
    b->n++;
    kvr_node_stats_dirty(&d->node);
}

/* Sends the buffered events: one BlockEvent per run of the same kind. */
static void flush_events(struct decode *d)
{
    struct evbuf *b = &d->ev;
    if (b->n == 0)
        return;
    size_t nruns = 0;
    for (size_t i = 0; i < b->n; i++)
        if (i == 0 || b->kinds[i] != b->kinds[i - 1])
            nruns++;
    Kvrail__BlockEvent *evs = calloc(nruns, sizeof *evs);
    Kvrail__BlockEvent **pevs = calloc(nruns, sizeof *pevs);
    if (!evs || !pevs) {
        free(evs);
        free(pevs);
        return;
    }
    size_t r = 0;
    for (size_t i = 0; i < b->n;) {
        size_t j = i;
        while (j < b->n && b->kinds[j] == b->kinds[i])
            j++;
        kvrail__block_event__init(&evs[r]);
        evs[r].seq = ++d->ev_seq;
        evs[r].kind = (Kvrail__BlockEvent__Kind)b->kinds[i];
        evs[r].block_hashes = b->hashes + i;
        evs[r].n_block_hashes = j - i;
        pevs[r] = &evs[r];
        r++;
        i = j;
    }
    Kvrail__BlockEvents m = KVRAIL__BLOCK_EVENTS__INIT;
    m.node_name = d->node.name;
    m.events = pevs;
    m.n_events = nruns;
    kvr_node_send(&d->node, KVRAIL__METHOD__BLOCK_EVENTS, &m.base);
    free(evs);
    free(pevs);
    b->n = 0;
}

struct dump_ctx {
    uint64_t *h;
    size_t n;
};

static void dump_one(void *arg, uint64_t hash, uint32_t block)
{
    struct dump_ctx *c = arg;
    (void)block;
    c->h[c->n++] = hash;
}

static void send_resync(struct decode *d)
{
    flush_events(d);
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(d->bt, &c);
    struct dump_ctx dc = {calloc(c.cached + 1, sizeof(uint64_t)), 0};
    if (!dc.h)
        return;
    kvr_blocktab_foreach_cached(d->bt, dump_one, &dc);
    Kvrail__ResyncDump m = KVRAIL__RESYNC_DUMP__INIT;
    m.node_name = d->node.name;
    m.seq = d->ev_seq;
    m.block_hashes = dc.h;
    m.n_block_hashes = dc.n;
    kvr_node_send(&d->node, KVRAIL__METHOD__RESYNC, &m.base);
    KVR_LOG_INFO(COMP, "sent a full dump of %zu cached blocks (seq %" PRIu64 ")", dc.n, d->ev_seq);
    free(dc.h);
}

/* ---- requests ---- */

/* The live request with this id (a quarantined one is the remains of a
 * canceled dispatch: a new Reserve with its id is a new request). */
static struct dreq *find_req(struct decode *d, uint64_t id)
{
    for (struct dreq *r = d->reqs; r; r = r->next)
        if (r->id == id && r->state != DR_QUARANTINE && !r->end_pending)
            return r;
    return NULL;
}

/* The request a notification is about: same id and the same first
 * uncached block (two dispatches of one request never share it); *stale_p
 * is set when that is an earlier prefill attempt's (a retry on the same
 * reservation counts the attempt up: the dead or slow writer is ignored). */
static struct dreq *find_req_notif(struct decode *d, uint64_t id, uint32_t first_block,
                                   uint32_t attempt, bool *stale_p)
{
    *stale_p = false;
    for (struct dreq *r = d->reqs; r; r = r->next)
        if (r->id == id && r->n_cached_blocks < r->n_blocks &&
            r->blocks[r->n_cached_blocks] == first_block) {
            if (r->attempt == attempt)
                return r;
            *stale_p = true;
        }
    return NULL;
}

static void batch_remove(struct decode *d, struct dreq *r)
{
    for (int i = 0; i < d->n_batch; i++)
        if (d->batch[i] == r) {
            d->batch[i] = d->batch[--d->n_batch];
            return;
        }
}

/* Unlinks and frees a request; its blocks go back (full prompt blocks into
 * the prefix cache when keep_cache). */
static void req_end(struct decode *d, struct dreq *r, bool keep_cache)
{
    if (r->in_job) { /* the worker may be using its blocks: after the step */
        r->end_pending = true;
        r->end_keep = keep_cache;
        return;
    }
    for (struct dreq **pp = &d->reqs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    batch_remove(d, r);
    if (keep_cache)
        for (uint32_t i = 0; i < r->n_hashes && i < r->n_blocks; i++)
            (void)kvr_blocktab_store(d->bt, r->blocks[i], r->hashes[i]);
    if (r->n_blocks)
        kvr_blocktab_release(d->bt, r->blocks, r->n_blocks);
    kvr_sampler_destroy(r->smp);
    free(r->tokens);
    free(r->blocks);
    free(r->hashes);
    free(r->stop_ids);
    free(r);
    kvr_node_stats_dirty(&d->node);
}

static void send_token(struct decode *d, struct dreq *r, int32_t tok, float logprob,
                       Kvrail__FinishReason fin, kvr_status_t code, const char *msg, bool no_token)
{
    Kvrail__Token t = KVRAIL__TOKEN__INIT;
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    t.request_id = r->id;
    t.index = no_token ? r->ngen : r->ngen - 1;
    t.token_id = no_token ? 0 : (uint32_t)tok;
    t.logprob = logprob;
    t.finish = fin;
    t.cached_tokens = r->n_cached_blocks * (uint32_t)d->node.layout.block_size;
    t.kv_bytes = r->kv_bytes;
    r->kv_bytes = 0;
    t.no_token = no_token;
    Kvrail__TopLogprob top[KVR_SAMPLE_MAX_TOP_LOGPROBS], *topp[KVR_SAMPLE_MAX_TOP_LOGPROBS];
    if (!no_token && r->n_top > 0) {
        for (int32_t i = 0; i < r->n_top; i++) {
            kvrail__top_logprob__init(&top[i]);
            top[i].token_id = (uint32_t)r->top_ids[i];
            top[i].logprob = r->top_lps[i];
            topp[i] = &top[i];
        }
        t.n_top_logprobs = (size_t)r->n_top;
        t.top_logprobs = topp;
    }
    r->n_top = 0;
    if (code != KVR_OK || msg) {
        st.code = code;
        st.message = (char *)(msg ? msg : "");
        t.status = &st;
    }
    kvr_node_send(&d->node, KVRAIL__METHOD__TOKEN, &t.base);
}

static void req_fail(struct decode *d, struct dreq *r, kvr_status_t code, const char *msg)
{
    KVR_LOG_WARN(COMP, "request %" PRIu64 ": %s (%s)", r->id, msg, kvr_status_str(code));
    send_token(d, r, 0, 0, KVRAIL__FINISH_REASON__FINISH_ERROR, code, msg, true);
    d->n_failed++;
    req_end(d, r, false);
}

static void send_rejected(struct decode *d, uint64_t id, kvr_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void send_rejected(struct decode *d, uint64_t id, kvr_status_t code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Kvrail__Rejected m = KVRAIL__REJECTED__INIT;
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    st.code = code;
    st.message = msg;
    m.request_id = id;
    m.reason = &st;
    m.node_name = d->node.name;
    kvr_node_send(&d->node, KVRAIL__METHOD__REJECTED, &m.base);
    d->n_rejected++;
    if (code != KVR_ERR_NO_RESOURCE)
        KVR_LOG_WARN(COMP, "request %" PRIu64 " rejected: %s", id, msg);
}

static void send_reserved(struct decode *d, struct dreq *r)
{
    Kvrail__Reserved m = KVRAIL__RESERVED__INIT;
    m.request_id = r->id;
    m.block_ids = r->blocks;
    m.n_block_ids = r->n_prompt_blocks;
    m.cached_tokens = r->n_cached_blocks * (uint32_t)d->node.layout.block_size;
    m.lease_ms = (uint32_t)((r->deadline - r->t_reserve) / 1000000ull);
    m.node_name = d->node.name;
    kvr_node_send(&d->node, KVRAIL__METHOD__RESERVED, &m.base);
}

/* true when the token ends the sequence; *fin_p says why */
static bool finished(struct decode *d, struct dreq *r, int32_t tok, Kvrail__FinishReason *fin_p)
{
    if (!r->ignore_eos)
        for (size_t i = 0; i < d->n_eos; i++)
            if (tok == d->eos[i]) {
                *fin_p = KVRAIL__FINISH_REASON__FINISH_STOP;
                return true;
            }
    for (size_t i = 0; i < r->n_stop; i++)
        if ((uint32_t)tok == r->stop_ids[i]) {
            *fin_p = KVRAIL__FINISH_REASON__FINISH_STOP;
            return true;
        }
    if (r->ngen >= r->max_tokens || r->n_tokens >= r->cap) {
        *fin_p = KVRAIL__FINISH_REASON__FINISH_LENGTH;
        return true;
    }
    return false;
}

/* The first token (sampled by the prefill, or by this node after a local
 * prefill) is here: stream it as token 0 - the one path by which it
 * reaches the client - then run. */
static void start_decoding(struct decode *d, struct dreq *r, int32_t tok, float logprob)
{
    r->tokens[r->n_tokens++] = tok;
    r->ngen = 1;
    r->kv_len = r->n_prompt;
    r->t_ready = kvr_now_ns();
    r->last_step_tok_ns = r->t_ready; /* the next token's gap counts from this one */
    d->tokens_out++;
    Kvrail__FinishReason fin = KVRAIL__FINISH_REASON__FINISH_NONE;
    bool done = finished(d, r, tok, &fin);
    send_token(d, r, tok, logprob, fin, KVR_OK, NULL, false);
    if (done) {
        d->n_done++;
        req_end(d, r, true);
        return;
    }
    r->state = DR_READY;
}

/* A prefill retry on a reservation (Reserve with a newer attempt) while
 * the old attempt's writer may still be alive: the router retries on a
 * timeout as well as on a death, and a stopped or slow prefill node goes
 * on writing where it was when it resumes.  So the prompt blocks the old
 * writer was given (the uncached ones: all it writes) leave the request
 * for a quarantine record of their own (DR_QUARANTINE, under the old
 * attempt and writer, found by find_req_notif through their first block),
 * and the request takes fresh blocks for the new writer.  The quarantine
 * ends when the old writer is fenced: its KV_READY or KV_ABORT for that
 * attempt (ordered after every write of it), its restart (a Reserve naming
 * another incarnation of it: the writing process is gone), or a lease without a
 * sign of life from it (KV_PROGRESS renews it, never past
 * RETRY_FENCE_LEASES leases).  Nothing is quarantined when the old writer
 * already said it stopped (KV_ABORT).  *n_p: the blocks quarantined.
 * false when the pool has no fresh blocks (the request is left as it
 * was; the caller quarantines it whole). */
#define RETRY_FENCE_LEASES 3
static struct ppeer *peer_find(struct decode *d, const char *name);
static bool retry_fence(struct decode *d, struct dreq *r, uint64_t lease_ns, uint32_t *n_p)
{
    uint32_t nc = r->n_cached_blocks, n = r->n_prompt_blocks - r->n_cached_blocks;
    *n_p = 0;
    if (r->aborted || n == 0)
        return true;
    struct dreq *q = calloc(1, sizeof *q);
    uint32_t *old = malloc(n * sizeof *old);
    if (!q || !old) {
        free(q);
        free(old);
        return false;
    }
    memcpy(old, r->blocks + nc, n * sizeof *old);
    if (kvr_blocktab_alloc(d->bt, n, r->blocks + nc) != KVR_OK) {
        memcpy(r->blocks + nc, old, n * sizeof *old);
        free(q);
        free(old);
        return false;
    }
    uint64_t now = kvr_now_ns();
    const struct ppeer *w = peer_find(d, r->prefill_node);
    q->id = r->id;
    q->state = DR_QUARANTINE;
    q->blocks = old;
    q->n_blocks = q->max_blocks = n;
    q->attempt = r->attempt;
    snprintf(q->prefill_node, sizeof q->prefill_node, "%s", r->prefill_node);
    memcpy(q->wtoken, r->wtoken, sizeof q->wtoken); /* the old writer's notifications' */
    q->has_wtoken = r->has_wtoken;
    q->writer_inc = r->vouched_inc ? r->vouched_inc : w ? w->incarnation : 0;
    q->t_reserve = now;
    q->lease_ns = lease_ns;
    q->deadline = now + lease_ns;
    q->fence_cap = now + RETRY_FENCE_LEASES * lease_ns;
    q->next = d->reqs;
    d->reqs = q;
    d->retry_quarantines++;
    d->retry_quarantined_blocks += n;
    *n_p = n;
    return true;
}

/* Quarantines r whole (DR_QUARANTINE): its writer, prefill node
 * r->prefill_node at attempt r->attempt, may still be writing into its
 * blocks.  The bound is a lease from now (the writer has given up writing
 * half a lease after its last sign of life, which came before now),
 * renewed by the writer's KV_PROGRESS up to RETRY_FENCE_LEASES leases; the
 * writer's own KV_READY/KV_ABORT, or its restart, end it before (on_notif,
 * fence_restarted). */
static void fence_start(struct decode *d, struct dreq *r, uint64_t lease_ns)
{
    uint64_t now = kvr_now_ns();
    const struct ppeer *w = peer_find(d, r->prefill_node);
    batch_remove(d, r);
    r->state = DR_QUARANTINE;
    r->writer_inc = r->vouched_inc ? r->vouched_inc : w ? w->incarnation : 0;
    r->lease_ns = lease_ns;
    r->deadline = now + lease_ns;
    r->fence_cap = now + RETRY_FENCE_LEASES * lease_ns;
    kvr_node_stats_dirty(&d->node);
}

/* A fence that ran out without a word from the writer: the writer has
 * given up writing by now (it stops after half a lease without sending a
 * sign of life), and its transfer token is revoked, so a writer that still
 * comes back (stopped between its check and its write) has its
 * notifications refused, and with verbs its connection (docs/security.md
 * says what cannot be fenced).  The next Reserve that names that node
 * carries the router's token again. */
static void fence_expired(struct decode *d, struct dreq *r)
{
    KVR_LOG_WARN(COMP,
                 "request %" PRIu64 ": no word from prefill node '%s' (attempt %u) within its "
                 "lease: its %u quarantined blocks are reused and its transfer token revoked",
                 r->id, r->prefill_node, r->attempt, r->n_blocks);
    for (int i = 0; i < d->n_ptokens; i++)
        if (strcmp(d->ptokens[i].name, r->prefill_node) == 0) {
            kvr_xfer_token_revoke(d->node.xfer, d->ptokens[i].token);
            memmove(&d->ptokens[i], &d->ptokens[i + 1],
                    (size_t)(d->n_ptokens - i - 1) * sizeof d->ptokens[0]);
            d->n_ptokens--;
            d->tokens_revoked++;
            break;
        }
    d->quarantines_expired++;
    req_end(d, r, false);
}

/* The token the router gave with the Reserve for the reservation's writer:
 * the one its notifications must come under (on_notif). */
static void writer_token(struct dreq *r, const Kvrail__Reserve *m)
{
    r->has_wtoken = !m->local_prefill && m->transport_token.len == KVR_XFER_TOKEN_LEN;
    if (r->has_wtoken)
        memcpy(r->wtoken, m->transport_token.data, KVR_XFER_TOKEN_LEN);
    else
        memset(r->wtoken, 0, sizeof r->wtoken);
}

/* A Reserve names the prefill node that will write and carries the token
 * the router made for that pair: the transfer engine accepts that node's
 * side channel / notifications with it (and, created with require_token,
 * nobody else's).  The node's previous token is revoked; the table is
 * bounded (the oldest node's token goes when it is full). */
static void token_allow(struct decode *d, const Kvrail__Reserve *m)
{
    if (m->transport_token.len == 0 || m->local_prefill)
        return;
    const char *pn = m->prefill_node ? m->prefill_node : "";
    if (m->transport_token.len != KVR_XFER_TOKEN_LEN || !pn[0]) {
        KVR_LOG_WARN(COMP,
                     "request %" PRIu64 ": Reserve with a transfer token of %zu bytes for prefill "
                     "node '%s' (want %d bytes and a node name): ignored, that node's transfers "
                     "are refused unless it has a valid one",
                     m->request_id, m->transport_token.len, pn, KVR_XFER_TOKEN_LEN);
        return;
    }
    const uint8_t *tok = m->transport_token.data;
    int i = 0;
    while (i < d->n_ptokens && strcmp(d->ptokens[i].name, pn) != 0)
        i++;
    if (i < d->n_ptokens) {
        if (memcmp(d->ptokens[i].token, tok, KVR_XFER_TOKEN_LEN) == 0)
            return; /* the pair's token, as before */
        kvr_xfer_token_revoke(d->node.xfer, d->ptokens[i].token);
    } else {
        if (d->n_ptokens == MAX_PREFILL_PEERS) {
            kvr_xfer_token_revoke(d->node.xfer, d->ptokens[0].token);
            KVR_LOG_WARN(COMP,
                         "transfer tokens of %d prefill nodes held: '%s''s revoked for '%s''s",
                         MAX_PREFILL_PEERS, d->ptokens[0].name, pn);
            memmove(&d->ptokens[0], &d->ptokens[1],
                    (size_t)(MAX_PREFILL_PEERS - 1) * sizeof d->ptokens[0]);
            d->n_ptokens--;
        }
        i = d->n_ptokens++;
        snprintf(d->ptokens[i].name, sizeof d->ptokens[i].name, "%s", pn);
    }
    memcpy(d->ptokens[i].token, tok, KVR_XFER_TOKEN_LEN);
    kvr_status_t s = kvr_xfer_token_allow_for(d->node.xfer, tok, pn);
    if (s != KVR_OK)
        KVR_LOG_ERROR(COMP,
                      "transfer token of prefill node '%s' not taken (%s): its transfers are "
                      "refused",
                      pn, kvr_status_str(s));
    else
        KVR_LOG_DEBUG(COMP, "transfer token of prefill node '%s' allowed", pn);
}

/* The router says prefill node `name` is now incarnation `inc` (a Reserve
 * naming it): the process of any other incarnation is gone, and the
 * quarantines of its writes end.  Taken from the router, which registered
 * it, and never from a HELLO, which any peer that reaches the transfer
 * engine could send under any name. */
static void fence_restarted(struct decode *d, const char *name, uint64_t inc)
{
    if (!name || !name[0] || !inc)
        return;
    struct dreq *next;
    for (struct dreq *r = d->reqs; r; r = next) {
        next = r->next;
        if (r->state == DR_QUARANTINE && r->writer_inc && r->writer_inc != inc &&
            strcmp(r->prefill_node, name) == 0) {
            KVR_LOG_INFO(COMP,
                         "request %" PRIu64 ": prefill node '%s' restarted (the router registered "
                         "incarnation %" PRIx64 "): the %u blocks its attempt %u was writing leave "
                         "quarantine",
                         r->id, name, inc, r->n_blocks, r->attempt);
            d->quarantines_fenced++;
            req_end(d, r, false);
        }
    }
}

static bool sync_horizon(struct decode *d);

static void on_reserve(struct decode *d, const Kvrail__Reserve *m)
{
    /* the blocks the pool's pre-fault thread made resident since the last
     * turn: a Reserve in the same burst of frames would otherwise be
     * refused blocks that are there */
    (void)sync_horizon(d);
    token_allow(d, m);
    if (!m->local_prefill)
        fence_restarted(d, m->prefill_node, m->prefill_incarnation);
    const struct kvr_kv_layout *L = &d->node.layout;
    uint32_t bs = (uint32_t)L->block_size;
    uint32_t lease = m->lease_ms ? m->lease_ms : d->node.cluster->timeouts.lease_ms;
    struct dreq *r = find_req(d, m->request_id);
    if (m->attempt > 0 || r) {
        /* the router retries the prefill on another prefill node: the same
         * reservation, a renewed lease, a new writer (its attempt number
         * tells its notifications from the old one's, whose partial writes
         * it overwrites) */
        if (!r) {
            send_rejected(d, m->request_id, KVR_ERR_NOT_FOUND,
                          "no reservation %" PRIu64 " to renew for prefill attempt %u (its lease "
                          "expired or it was canceled)",
                          m->request_id, m->attempt);
            return;
        }
        if (r->state != DR_RESERVED || m->attempt <= r->attempt) {
            /* the KV is here already (the old writer finished), or an old
             * renewal: the router learns it from the stream */
            KVR_LOG_INFO(COMP,
                         "request %" PRIu64 ": renewal for prefill attempt %u ignored (attempt "
                         "%u, %s)",
                         r->id, m->attempt, r->attempt,
                         r->state == DR_RESERVED ? "not newer" : "KV already here");
            return;
        }
        uint32_t quarantined = 0;
        if (!retry_fence(d, r, (uint64_t)lease * 1000000ull, &quarantined)) {
            /* no fresh blocks: the whole reservation stays with the old
             * writer until it is fenced, and the router dispatches anew */
            fence_start(d, r, (uint64_t)lease * 1000000ull);
            d->retry_quarantines++;
            d->retry_quarantined_blocks += r->n_blocks;
            send_rejected(d, m->request_id, KVR_ERR_NO_RESOURCE,
                          "KV pool full: no free blocks for prefill attempt %u apart from the %u "
                          "that attempt %u may still be writing (quarantined until it stops)",
                          m->attempt, r->n_prompt_blocks - r->n_cached_blocks, r->attempt);
            kvr_node_stats_dirty(&d->node);
            return;
        }
        r->lease_ns = (uint64_t)lease * 1000000ull;
        r->deadline = kvr_now_ns() + r->lease_ns;
        snprintf(r->prefill_node, sizeof r->prefill_node, "%s",
                 m->prefill_node ? m->prefill_node : "");
        r->attempt = m->attempt;
        r->vouched_inc = m->prefill_incarnation;
        writer_token(r, m);
        r->aborted = false;
        d->reserve_renewals++;
        KVR_LOG_INFO(COMP,
                     "request %" PRIu64 ": prefill attempt %u from '%s' on the same reservation "
                     "(%u blocks, %u of them fresh: the old writer's are quarantined); lease "
                     "renewed for %u ms",
                     r->id, r->attempt, r->prefill_node, r->n_blocks, quarantined, lease);
        send_reserved(d, r);
        kvr_node_stats_dirty(&d->node);
        return;
    }
    size_t np = m->n_token_ids;
    if (np == 0 || np >= (size_t)d->maxpos) {
        send_rejected(d, m->request_id, KVR_ERR_INVALID,
                      "prompt of %zu tokens: must be 1 .. %d (the model's context)", np,
                      d->maxpos - 1);
        return;
    }
    if (m->max_tokens == 0) {
        send_rejected(d, m->request_id, KVR_ERR_INVALID, "max_tokens is 0");
        return;
    }
    for (size_t i = 0; i < np; i++)
        if (m->token_ids[i] >= (uint32_t)d->vocab) {
            send_rejected(d, m->request_id, KVR_ERR_INVALID,
                          "token %zu of the prompt is %u, outside the vocabulary (%d)", i,
                          m->token_ids[i], d->vocab);
            return;
        }
    uint64_t want = (uint64_t)np + m->max_tokens;
    uint32_t cap = want > (uint64_t)d->maxpos ? (uint32_t)d->maxpos : (uint32_t)want;
    uint32_t nblocks = (cap + bs - 1) / bs;
    uint32_t nprompt_blocks = (uint32_t)((np + bs - 1) / bs);
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(d->bt, &c);
    if (nblocks > c.total) {
        send_rejected(d, m->request_id, KVR_ERR_OVERLOAD,
                      "request needs %u KV blocks (%zu prompt + %u max_tokens), the pool holds "
                      "%u",
                      nblocks, np, m->max_tokens, c.total);
        return;
    }
    if (d->paged)
        for (struct dreq *q = d->reqs; q; q = q->next)
            if (q->state == DR_PREEMPTED) {
                /* the preempted go first: the router queues this one */
                send_rejected(d, m->request_id, KVR_ERR_NO_RESOURCE,
                              "KV pool full: preempted requests wait for blocks");
                return;
            }
    struct kvr_sample_params sp;
    if (kvr_node_sampling(m->sampling, m->sampling ? m->sampling->seed : 0, &sp) != KVR_OK)
        goto nomem;
    char err[200];
    r = calloc(1, sizeof *r);
    if (!r) {
        kvr_node_sampling_free(&sp);
        goto nomem;
    }
    kvr_status_t sst = kvr_sampler_create(&sp, d->vocab, &r->smp, err, sizeof err);
    kvr_node_sampling_free(&sp);
    if (sst != KVR_OK) {
        free(r);
        send_rejected(d, m->request_id, KVR_ERR_INVALID, "sampling: %s", err);
        return;
    }
    if (m->sampling)
        r->top_n = m->sampling->top_logprobs < KVR_SAMPLE_MAX_TOP_LOGPROBS
                       ? m->sampling->top_logprobs
                       : KVR_SAMPLE_MAX_TOP_LOGPROBS;
    r->id = m->request_id;
    r->n_prompt = r->n_tokens = (uint32_t)np;
    r->cap = cap;
    r->max_tokens = m->max_tokens;
    r->tokens = malloc(((size_t)cap + 1) * sizeof *r->tokens);
    r->blocks = malloc(nblocks * sizeof *r->blocks);
    r->max_blocks = nblocks;
    if (d->paged) {
        /* the prompt's blocks and a little headroom; the rest is grown */
        uint32_t first = nprompt_blocks + d->headroom;
        nblocks = first < nblocks ? first : nblocks;
    }
    r->hashes = malloc((np / bs + 1) * sizeof *r->hashes);
    r->stop_ids = malloc((m->n_stop_token_ids + 1) * sizeof *r->stop_ids);
    if (!r->tokens || !r->blocks || !r->hashes || !r->stop_ids)
        goto nomem_r;
    for (size_t i = 0; i < np; i++)
        r->tokens[i] = (int32_t)m->token_ids[i];
    if (m->n_stop_token_ids) /* none: the array is NULL, and memcpy's source may not be */
        memcpy(r->stop_ids, m->stop_token_ids, m->n_stop_token_ids * sizeof *r->stop_ids);
    r->n_stop = m->n_stop_token_ids;
    r->ignore_eos = m->ignore_eos;
    /* after a migration the last m->generated tokens are output: penalties
     * count them and the random stream continues after them */
    size_t ng = m->generated < np ? m->generated : 0;
    kvr_sampler_add_prompt(r->smp, r->tokens, np - ng);
    kvr_sampler_add_generated(r->smp, r->tokens + np - ng, ng);
    size_t nh = 0;
    (void)kvr_blockhash_seq((const uint32_t *)r->tokens, np, bs, r->hashes, np / bs + 1, &nh);
    r->n_hashes = (uint32_t)nh;
    uint32_t maxm = (uint32_t)((np - 1) / bs);
    r->n_cached_blocks = kvr_blocktab_match(d->bt, r->hashes, r->n_hashes, maxm, r->blocks);
    if (kvr_blocktab_alloc(d->bt, nblocks - r->n_cached_blocks, r->blocks + r->n_cached_blocks) !=
        KVR_OK) {
        kvr_blocktab_release(d->bt, r->blocks, r->n_cached_blocks);
        uint32_t avail = kvr_blocktab_available(d->bt);
        kvr_sampler_destroy(r->smp);
        free(r->tokens);
        free(r->blocks);
        free(r->hashes);
        free(r->stop_ids);
        free(r);
        send_rejected(d, m->request_id, KVR_ERR_NO_RESOURCE,
                      "KV pool full: request needs %u blocks, %u available now", nblocks, avail);
        return;
    }
    r->n_blocks = nblocks;
    r->n_prompt_blocks = nprompt_blocks;
    r->t_reserve = kvr_now_ns();
    r->lease_ns = (uint64_t)lease * 1000000ull;
    r->deadline = r->t_reserve + r->lease_ns;
    snprintf(r->prefill_node, sizeof r->prefill_node, "%s", m->prefill_node ? m->prefill_node : "");
    r->vouched_inc = m->local_prefill ? 0 : m->prefill_incarnation;
    writer_token(r, m);
    r->state = m->local_prefill ? DR_LOCAL_PREFILL : DR_RESERVED;
    r->n_computed = r->n_cached_blocks * bs;
    r->next = d->reqs;
    d->reqs = r;
    d->reservations++;
    d->cached_tokens += (uint64_t)r->n_cached_blocks * bs;
    send_reserved(d, r);
    kvr_node_stats_dirty(&d->node);
    return;
nomem_r:
    kvr_sampler_destroy(r->smp);
    free(r->tokens);
    free(r->blocks);
    free(r->hashes);
    free(r->stop_ids);
    free(r);
nomem:
    send_rejected(d, m->request_id, KVR_ERR_NO_MEMORY, "out of memory");
}

static void on_cancel(struct decode *d, const Kvrail__NodeCancel *c)
{
    struct dreq *r = find_req(d, c->request_id);
    if (!r)
        return;
    d->n_canceled++;
    if (r->state == DR_RESERVED && !r->aborted) {
        /* the prefill node may be writing into the blocks: they stay
         * quarantined until it is fenced (its KV_READY / KV_ABORT, ordered
         * after its writes; its restart; a lease without a sign of life) */
        fence_start(d, r, r->lease_ns);
        d->cancel_quarantines++;
        d->cancel_quarantined_blocks += r->n_blocks;
        KVR_LOG_INFO(COMP,
                     "request %" PRIu64 ": canceled while prefill node '%s' may be writing: its %u "
                     "blocks are quarantined until it is fenced",
                     r->id, r->prefill_node, r->n_blocks);
        return;
    }
    if (r->state == DR_QUARANTINE)
        return;
    send_token(d, r, 0, 0, KVRAIL__FINISH_REASON__FINISH_CANCELED, KVR_ERR_CANCELED, "canceled",
               true);
    req_end(d, r, false);
}

static void on_msg(void *arg, unsigned method, ProtobufCMessage *m)
{
    struct decode *d = arg;
    switch (method) {
    case KVRAIL__METHOD__RESERVE:
        on_reserve(d, (Kvrail__Reserve *)m);
        break;
    case KVRAIL__METHOD__NODE_CANCEL:
        on_cancel(d, (Kvrail__NodeCancel *)m);
        break;
    case KVRAIL__METHOD__RESYNC:
        send_resync(d);
        break;
    default:
        KVR_LOG_DEBUG(COMP, "ignored %s", kvr_proto_method_name(method));
    }
}

/* ---- notifications from prefill nodes (called inside kvr_xfer_progress) ---- */

/* The latest HELLO under this name. */
static struct ppeer *peer_find(struct decode *d, const char *name)
{
    struct ppeer *p = NULL;
    for (int i = 0; i < d->n_peers; i++)
        if (strcmp(d->peers[i].name, name) == 0 && (!p || d->peers[i].seen_ns > p->seen_ns))
            p = &d->peers[i];
    return p;
}

/* The HELLO of this incarnation of that node, sent under this transfer
 * token (zeros: none): records are kept per incarnation and token, so
 * that a HELLO sent under a node's name by another peer (with a token of
 * its own, or none) does not replace the real node's layout descriptor. */
static struct ppeer *peer_find_inc(struct decode *d, const char *name, uint64_t inc,
                                   const uint8_t *token)
{
    static const uint8_t none[KVR_XFER_TOKEN_LEN];
    for (int i = 0; i < d->n_peers; i++)
        if (d->peers[i].incarnation == inc && strcmp(d->peers[i].name, name) == 0 &&
            memcmp(d->peers[i].token, token ? token : none, KVR_XFER_TOKEN_LEN) == 0)
            return &d->peers[i];
    return NULL;
}

/* The prefill node whose Reserve carried this transfer token (NULL: none
 * held does). */
static const char *token_owner(const struct decode *d, const uint8_t *token)
{
    for (int i = 0; token && i < d->n_ptokens; i++)
        if (memcmp(d->ptokens[i].token, token, KVR_XFER_TOKEN_LEN) == 0)
            return d->ptokens[i].name;
    return NULL;
}

/* A notification that names a reservation (or a prefill node) it did not
 * come under the token of: a registered peer with a token of its own
 * speaking for another, or a peer with none.  Dropped; counted (the stats
 * file's forged_notifications, and bad_notifications in the heartbeat and
 * kvrail_bad_notifications_total); logged at most once a second. */
static void forged(struct decode *d, const struct kvr_notif *n, const char *expected,
                   const uint8_t *token)
{
    static const char *const kinds[] = {"HELLO", "KV_READY", "KV_ABORT", "KV_PROGRESS"};
    d->forged_notifs++;
    d->bad_notifs++;
    uint64_t now = kvr_now_ns();
    if (d->forged_log_ns && now - d->forged_log_ns < 1000000000ull)
        return;
    const char *owner = token_owner(d, token);
    char from[KVR_CLUSTER_NAME_MAX + 64];
    if (owner)
        snprintf(from, sizeof from, "under prefill node '%s''s transfer token", owner);
    else
        snprintf(from, sizeof from, "%s",
                 token ? "under a transfer token no Reserve carried" : "under no transfer token");
    KVR_LOG_WARN(COMP,
                 "dropped a %s naming prefill node '%s' (request %" PRIu64 ", attempt %u) that "
                 "came %s; only %s's token may speak for it (%" PRIu64 " such dropped, %" PRIu64
                 " since the last line)",
                 n->kind >= 1 && n->kind <= 4 ? kinds[n->kind - 1] : "notification", n->node,
                 n->request_id, n->attempt, from, expected, d->forged_notifs,
                 d->forged_notifs - d->forged_logged);
    d->forged_log_ns = now;
    d->forged_logged = d->forged_notifs;
}

static void on_hello(struct decode *d, const struct kvr_notif *n, const uint8_t *token)
{
    /* under a token the router gave another prefill node: that node
     * speaking under this one's name */
    const char *owner = token_owner(d, token);
    if (owner && strcmp(owner, n->node) != 0) {
        forged(d, n, n->node, token);
        return;
    }
    struct ppeer *p = peer_find_inc(d, n->node, n->incarnation, token);
    if (!p && d->n_peers < MAX_PREFILL_PEERS)
        p = &d->peers[d->n_peers++];
    for (int i = 0; !p && i < d->n_peers; i++) /* full: the least recently seen */
        if (i == 0 || d->peers[i].seen_ns < p->seen_ns)
            p = &d->peers[i];
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", n->node);
    p->incarnation = n->incarnation;
    if (token)
        memcpy(p->token, token, KVR_XFER_TOKEN_LEN);
    p->seen_ns = kvr_now_ns();
    const struct kvr_kv_layout *L = &d->node.layout;
    if (n->proto_version != KVR_PROTO_VERSION)
        snprintf(p->why, sizeof p->why, "protocol version %u, ours %u", n->proto_version,
                 KVR_PROTO_VERSION);
    else if (n->fingerprint != d->node.fingerprint)
        snprintf(p->why, sizeof p->why, "model fingerprint %016llx, ours %016llx",
                 (unsigned long long)n->fingerprint, (unsigned long long)d->node.fingerprint);
    else if (n->n_layers != L->n_layers || n->n_kv_heads != L->n_kv_heads ||
             n->head_dim != L->head_dim || n->block_size != L->block_size || n->dtype != L->dtype)
        snprintf(p->why, sizeof p->why,
                 "KV layout %d layers x %d kv heads x %d head dim, block %d, dtype %d; ours %d x "
                 "%d x %d, block %d, dtype %d",
                 n->n_layers, n->n_kv_heads, n->head_dim, n->block_size, n->dtype, L->n_layers,
                 L->n_kv_heads, L->head_dim, L->block_size, L->dtype);
    p->ok = p->why[0] == 0;
    /* no quarantine ends on a HELLO: any peer that reaches the transfer
     * engine could send one under this name (fence_restarted takes a
     * restart from the router instead) */
    if (p->ok)
        KVR_LOG_INFO(COMP, "prefill node '%s' connected: layout and model fingerprint match",
                     p->name);
    else
        KVR_LOG_ERROR(COMP, "prefill node '%s' refused: %s; its KV will not be used", p->name,
                      p->why);
}

/* A notification from a prefill node (the transfer engine's callback);
 * token: the transfer token it came under (NULL: none).  One about a
 * reservation is taken only when it came under the token the router gave
 * with that reservation's Reserve for its writer (the pair's token of
 * that prefill node's incarnation): a registered prefill node holding a
 * token of its own cannot end, renew or fill another's reservation or
 * quarantine.  A Reserve without a token (none made) binds nothing. */
static void on_notif(void *arg, const void *msg, size_t len, const uint8_t *token)
{
    struct decode *d = arg;
    struct kvr_notif n;
    char why[200];
    if (kvr_notif_decode(msg, len, &n, why, sizeof why) != KVR_OK) {
        d->bad_notifs++;
        KVR_LOG_WARN(COMP, "dropped a notification of %zu bytes from a prefill node: %s", len, why);
        return;
    }
    if (n.kind == KVR_NOTIF_HELLO) {
        on_hello(d, &n, token);
        return;
    }
    bool stale = false;
    struct dreq *r = find_req_notif(d, n.request_id, n.first_block, n.attempt, &stale);
    if (!r) {
        if (stale) {
            d->stale_notifs++;
            KVR_LOG_INFO(COMP,
                         "request %" PRIu64 ": notification of kind %u from '%s' for prefill "
                         "attempt %u, which was retried elsewhere: ignored",
                         n.request_id, n.kind, n.node, n.attempt);
        } else {
            KVR_LOG_DEBUG(COMP, "notification for unknown request %" PRIu64, n.request_id);
        }
        return;
    }
    if (r->has_wtoken && (!token || memcmp(token, r->wtoken, KVR_XFER_TOKEN_LEN) != 0)) {
        forged(d, &n, r->prefill_node[0] ? r->prefill_node : "its writer", token);
        return;
    }
    if (n.kind == KVR_NOTIF_KV_PROGRESS) {
        /* the prefill node still holds it (queued or computing): renew the
         * lease, so a prefill longer than the lease is not given up on */
        if (r->state == DR_RESERVED &&
            (!r->prefill_node[0] || strcmp(r->prefill_node, n.node) == 0)) {
            r->deadline = kvr_now_ns() + r->lease_ns;
            d->lease_renewals++;
        } else if (r->state == DR_QUARANTINE && r->fence_cap) {
            /* the old writer is alive and still at it: its KV_ABORT or
             * KV_READY will end the quarantine; bounded all the same */
            uint64_t t = kvr_now_ns() + r->lease_ns;
            r->deadline = t < r->fence_cap ? t : r->fence_cap;
        }
        return;
    }
    if (n.kind == KVR_NOTIF_KV_READY)
        d->kv_bytes += n.bytes; /* received, whether still wanted or not */
    if (r->state == DR_QUARANTINE) {
        d->quarantines_fenced++;
        req_end(d, r, false); /* the writes are over: the blocks are free to reuse */
        return;
    }
    if (r->state != DR_RESERVED)
        return;
    if (r->prefill_node[0] && strcmp(r->prefill_node, n.node) != 0) {
        KVR_LOG_WARN(COMP, "request %" PRIu64 ": KV from '%s', expected from '%s': ignored", r->id,
                     n.node, r->prefill_node);
        return;
    }
    if (n.kind == KVR_NOTIF_KV_ABORT) {
        r->aborted = true;
        return;
    }
    if (n.kind != KVR_NOTIF_KV_READY)
        return;
    if (r->vouched_inc && n.incarnation != r->vouched_inc) {
        /* not the process the router dispatched to (a restarted writer's
         * leftover, or a peer using its name): not this request's KV */
        d->bad_notifs++;
        KVR_LOG_WARN(COMP,
                     "request %" PRIu64 ": KV_READY from '%s' incarnation %" PRIx64
                     ", the router dispatched to incarnation %" PRIx64 ": ignored",
                     r->id, n.node, n.incarnation, r->vouched_inc);
        return;
    }
    struct ppeer *p = peer_find_inc(d, n.node, n.incarnation, token);
    if (!p || !p->ok || p->incarnation != n.incarnation) {
        char msg2[300];
        snprintf(msg2, sizeof msg2, "prefill node '%s' %s", n.node,
                 !p       ? "never sent its layout descriptor"
                 : !p->ok ? p->why
                          : "restarted without a new layout descriptor");
        req_fail(d, r, KVR_ERR_MISMATCH, msg2);
        return;
    }
    if (n.first_token < 0 || n.first_token >= d->vocab) {
        req_fail(d, r, KVR_ERR_INVALID, "prefill node sent a first token outside the vocabulary");
        return;
    }
    d->n_remote++;
    r->kv_bytes = n.bytes;
    r->n_top = n.n_top < (int32_t)r->top_n ? n.n_top : (int32_t)r->top_n;
    memcpy(r->top_ids, n.top_ids, (size_t)r->n_top * sizeof r->top_ids[0]);
    memcpy(r->top_lps, n.top_lps, (size_t)r->n_top * sizeof r->top_lps[0]);
    kvr_sampler_add_generated(r->smp, &n.first_token, 1);
    start_decoding(d, r, n.first_token, n.logprob);
}

/* ---- compute: one step at a time on the engine worker ---- */

/* Runs on the engine worker: the chunk, then the decode step. */
static kvr_status_t djob_run(struct kvr_worker_job *base, kvr_ctx_t *ctx)
{
    struct djob *j = (struct djob *)base;
    if (j->chunk_req) {
        uint64_t t0 = kvr_now_ns();
        j->chunk_status = kvr_engine_prefill(ctx, j->pool, &j->pr, j->chunk_logits);
        j->chunk_ns = kvr_now_ns() - t0;
    }
    if (j->n > 0) {
        uint64_t t0 = kvr_now_ns();
        j->decode_status = kvr_engine_decode(ctx, j->pool, j->seqs, j->n, j->logits);
        j->decode_ns = kvr_now_ns() - t0;
    }
    return KVR_OK;
}

/* The oldest request prefilling here, or NULL. */
static struct dreq *next_local_prefill(struct decode *d)
{
    struct dreq *lp = NULL;
    for (struct dreq *r = d->reqs; r; r = r->next)
        if (r->state == DR_LOCAL_PREFILL && !r->end_pending)
            lp = r; /* reqs is newest first */
    return lp;
}

static void on_worker(void *arg, const struct kvr_worker_event *ev);

/* Takes every block back from r (not in a job) and queues it to be
 * recomputed: its prompt prefilled here again, then its generated tokens
 * replayed through decode steps (their logits dropped), so that it goes on
 * exactly where it was; the sampler keeps its state. */
static void preempt(struct decode *d, struct dreq *r)
{
    batch_remove(d, r);
    if (r->n_blocks)
        kvr_blocktab_release(d->bt, r->blocks, r->n_blocks);
    r->n_blocks = 0;
    r->n_computed = 0;
    r->kv_len = 0;
    r->last_step_tok_ns = 0;
    r->state = DR_PREEMPTED;
    d->preemptions++;
    KVR_LOG_INFO(COMP,
                 "request %" PRIu64 ": preempted after %u tokens (KV pool full); it will "
                 "be recomputed",
                 r->id, r->ngen);
    kvr_node_stats_dirty(&d->node);
}

/* The youngest request holding blocks that may give them back. */
static struct dreq *youngest_victim(struct decode *d)
{
    struct dreq *v = NULL;
    for (struct dreq *r = d->reqs; r; r = r->next)
        if ((r->state == DR_RUNNING || r->state == DR_READY || r->state == DR_LOCAL_PREFILL) &&
            r->n_blocks > 0 && !r->end_pending && (!v || r->t_reserve > v->t_reserve))
            v = r;
    return v;
}

/* Paged: every running sequence gets the block its next position needs,
 * oldest first; when the pool is out of blocks the youngest request is
 * preempted (possibly the one growing), so the oldest always progresses. */
static void grow_batch(struct decode *d)
{
    uint32_t bs = (uint32_t)d->node.layout.block_size;
    for (;;) {
        struct dreq *need = NULL;
        for (int i = 0; i < d->n_batch; i++) {
            struct dreq *r = d->batch[i];
            if (r->kv_len / bs >= r->n_blocks && (!need || r->t_reserve < need->t_reserve))
                need = r;
        }
        if (!need)
            return;
        if (need->n_blocks >= need->max_blocks) { /* cannot happen: cap bounds kv_len */
            req_fail(d, need, KVR_ERR_INTERNAL, "sequence outgrew its block table");
            continue;
        }
        if (kvr_blocktab_alloc(d->bt, 1, &need->blocks[need->n_blocks]) == KVR_OK) {
            need->n_blocks++;
            d->grown_blocks++;
            continue;
        }
        struct dreq *v = youngest_victim(d);
        preempt(d, v ? v : need);
    }
}

/* Paged: the oldest preempted request gets blocks for everything it had
 * when there are enough, and is recomputed. */
static void readmit(struct decode *d)
{
    uint32_t bs = (uint32_t)d->node.layout.block_size;
    struct dreq *o = NULL;
    for (struct dreq *r = d->reqs; r; r = r->next)
        if (r->state == DR_PREEMPTED && !r->end_pending && (!o || r->t_reserve < o->t_reserve))
            o = r;
    if (!o)
        return;
    uint32_t need = (o->n_tokens + bs - 1) / bs;
    if (need > o->max_blocks)
        need = o->max_blocks;
    if (kvr_blocktab_available(d->bt) < need ||
        kvr_blocktab_alloc(d->bt, need, o->blocks) != KVR_OK)
        return;
    o->n_blocks = need;
    o->n_computed = 0;
    o->state = DR_LOCAL_PREFILL;
    KVR_LOG_DEBUG(COMP, "request %" PRIu64 ": readmitted, recomputing %u tokens", o->id,
                  o->n_tokens);
}

/* Builds and submits the next step, if there is work. */
static void start_step(struct decode *d)
{
    if (d->paged)
        readmit(d);
    /* join: ready sequences take free batch slots, oldest first */
    if (d->n_batch < d->max_batch) {
        struct dreq *cand[256];
        int nc = 0;
        for (struct dreq *r = d->reqs; r && nc < 256; r = r->next)
            if (r->state == DR_READY)
                cand[nc++] = r;
        /* reqs is newest first: take from the end */
        for (int i = nc - 1; i >= 0 && d->n_batch < d->max_batch; i--) {
            cand[i]->state = DR_RUNNING;
            d->batch[d->n_batch++] = cand[i];
        }
    }
    if (d->paged)
        grow_batch(d);
    if (d->n_batch > d->batch_max)
        d->batch_max = d->n_batch;
    struct djob *j = &d->job;
    j->chunk_req = next_local_prefill(d);
    if (j->chunk_req) {
        struct dreq *r = j->chunk_req;
        uint32_t end = r->n_computed + (uint32_t)d->chunk;
        if (end > r->n_prompt)
            end = r->n_prompt;
        j->pr = (struct kvr_prefill_req){
            .tokens = r->tokens,
            .n_tokens = (int32_t)end,
            .n_cached = (int32_t)r->n_computed,
            .block_table = (const int32_t *)r->blocks,
            .n_blocks = (int32_t)r->n_blocks,
        };
        r->in_job = true;
        j->chunk_status = KVR_INPROGRESS;
        j->chunk_ns = 0;
    }
    j->n = d->n_batch;
    for (int i = 0; i < j->n; i++) {
        struct dreq *r = d->batch[i];
        j->members[i] = r;
        j->seqs[i].token = r->tokens[r->kv_len];
        j->seqs[i].pos = (int32_t)r->kv_len;
        j->seqs[i].block_table = (const int32_t *)r->blocks;
        j->seqs[i].n_blocks = (int32_t)r->n_blocks;
        r->in_job = true;
    }
    j->decode_ns = 0;
    if (!j->chunk_req && j->n == 0)
        return;
    j->base.run = djob_run;
    j->pool = &d->npool.kv;
    d->busy = true;
    if (kvr_worker_submit(d->node.worker, &j->base) != KVR_OK) {
        /* cannot happen short of a broken inproc socket: fail what it held */
        d->busy = false;
        j->base.status = KVR_ERR_IO;
        j->chunk_status = KVR_ERR_IO;
        j->decode_status = KVR_ERR_IO;
        struct kvr_worker_event ev = {KVR_WORKER_DONE, -1, &j->base};
        d->busy = true;
        on_worker(d, &ev);
    }
}

/* A request the finished job referred to: false when it ended meanwhile
 * (and is now gone). */
static bool job_release(struct decode *d, struct dreq *r)
{
    r->in_job = false;
    if (!r->end_pending)
        return true;
    req_end(d, r, r->end_keep);
    return false;
}

/* The chunk is computed: the next one follows, or after the last the
 * first token is sampled and the sequence starts decoding. */
static void chunk_done(struct decode *d, struct djob *j)
{
    struct dreq *r = j->chunk_req;
    uint32_t bs = (uint32_t)d->node.layout.block_size;
    kvr_status_t s = j->chunk_status;
    d->chunks++;
    if (j->chunk_ns > d->chunk_ns_max)
        d->chunk_ns_max = j->chunk_ns;
    r->prefill_ns += j->chunk_ns;
    if (s == KVR_OK) {
        r->n_computed = (uint32_t)j->pr.n_tokens;
        if (r->n_computed < r->n_prompt)
            return;
        if (r->ngen > 0) { /* recomputed after a preemption: replay what it generated */
            r->kv_len = r->n_prompt;
            r->state = DR_READY;
            return;
        }
    }
    int32_t tok = 0;
    float lp = 0;
    if (s == KVR_OK)
        s = kvr_sampler_sample(r->smp, j->chunk_logits, &tok, &lp);
    if (s == KVR_OK && r->top_n)
        r->n_top = kvr_sample_top_logprobs(j->chunk_logits, d->vocab, (int32_t)r->top_n, r->top_ids,
                                           r->top_lps);
    uint32_t n_cached = r->n_cached_blocks * bs;
    Kvrail__PrefillDone m = KVRAIL__PREFILL_DONE__INIT;
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    st.code = s;
    st.message = s == KVR_OK ? "" : "local prefill failed";
    m.request_id = r->id;
    m.status = &st;
    m.compute_us = r->prefill_ns / 1000;
    m.total_us = (kvr_now_ns() - r->t_reserve) / 1000;
    m.computed_tokens = r->n_prompt - n_cached;
    m.node_name = d->node.name;
    m.local = 1;
    KVR_LOG_DEBUG(COMP,
                  "request %" PRIu64 ": local prefill of %u tokens (%u cached) in %" PRIu64
                  " us of compute",
                  r->id, r->n_prompt, n_cached, m.compute_us);
    kvr_node_send(&d->node, KVRAIL__METHOD__PREFILL_DONE, &m.base);
    if (s != KVR_OK) {
        req_fail(d, r, s, "local prefill failed");
        return;
    }
    d->n_local++;
    start_decoding(d, r, tok, lp);
}

/* The decode step is computed: sample, stream, end the finished. */
static void step_done(struct decode *d, struct djob *j)
{
    d->steps++;
    if (j->decode_ns > d->decode_ns_max)
        d->decode_ns_max = j->decode_ns;
    uint64_t now = kvr_now_ns();
    struct dreq *ending[256];
    int ne = 0;
    for (int i = 0; i < j->n; i++) {
        struct dreq *r = j->members[i];
        if (!job_release(d, r))
            continue;
        if (j->decode_status != KVR_OK) {
            req_fail(d, r, j->decode_status, "decode step failed");
            continue;
        }
        if (++r->kv_len < r->n_tokens)
            continue; /* replaying after a preemption: the token is known */
        int32_t tok = 0;
        float lp = 0;
        kvr_status_t s =
            kvr_sampler_sample(r->smp, j->logits + (size_t)i * (size_t)d->vocab, &tok, &lp);
        if (s != KVR_OK) {
            send_token(d, r, 0, 0, KVRAIL__FINISH_REASON__FINISH_ERROR, s, "sampling failed", true);
            ending[ne++] = r;
            continue;
        }
        if (r->top_n)
            r->n_top = kvr_sample_top_logprobs(j->logits + (size_t)i * (size_t)d->vocab, d->vocab,
                                               (int32_t)r->top_n, r->top_ids, r->top_lps);
        r->tokens[r->n_tokens++] = tok;
        r->ngen++;
        d->tokens_out++;
        if (r->last_step_tok_ns && now - r->last_step_tok_ns > d->itl_ns_max)
            d->itl_ns_max = now - r->last_step_tok_ns;
        if (r->last_step_tok_ns)
            kvr_node_metrics_itl(now - r->last_step_tok_ns);
        r->last_step_tok_ns = now;
        Kvrail__FinishReason fin = KVRAIL__FINISH_REASON__FINISH_NONE;
        bool done = finished(d, r, tok, &fin);
        send_token(d, r, tok, lp, fin, KVR_OK, NULL, false);
        if (done)
            ending[ne++] = r;
    }
    for (int i = 0; i < ne; i++) {
        d->n_done++;
        req_end(d, ending[i], true);
    }
}

static void on_worker(void *arg, const struct kvr_worker_event *ev)
{
    struct decode *d = arg;
    struct djob *j = &d->job;
    if (ev->kind != KVR_WORKER_DONE || ev->job != &j->base || !d->busy)
        return;
    d->busy = false;
    d->step_ns_last = j->chunk_ns + j->decode_ns;
    if (j->chunk_req && j->n > 0)
        d->mixed_steps++; /* a chunk and running sequences in one step */
    if (j->chunk_req && job_release(d, j->chunk_req))
        chunk_done(d, j);
    if (j->n > 0)
        step_done(d, j);
    flush_events(d);
    kvr_node_stats_dirty(&d->node);
}

static void check_leases(struct decode *d)
{
    uint64_t now = kvr_now_ns();
    struct dreq *next;
    for (struct dreq *r = d->reqs; r; r = next) {
        next = r->next;
        if (r->state == DR_QUARANTINE && now > r->deadline) {
            fence_expired(d, r);
        } else if (r->state == DR_RESERVED && now > r->deadline) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "reservation lease expired: no KV from prefill node '%s' "
                     "within %" PRIu64 " ms",
                     r->prefill_node, (uint64_t)((r->deadline - r->t_reserve) / 1000000u));
            d->n_expired++;
            if (r->aborted || !r->prefill_node[0]) {
                req_fail(d, r, KVR_ERR_TIMEOUT, msg);
                continue;
            }
            /* the writer fell silent (stopped, or the router that would
             * have canceled it is gone): it may still write, so the
             * request fails but its blocks are fenced like a cancel's */
            KVR_LOG_WARN(COMP, "request %" PRIu64 ": %s (%s)", r->id, msg,
                         kvr_status_str(KVR_ERR_TIMEOUT));
            send_token(d, r, 0, 0, KVRAIL__FINISH_REASON__FINISH_ERROR, KVR_ERR_TIMEOUT, msg, true);
            d->n_failed++;
            fence_start(d, r, r->lease_ns);
            d->lease_quarantines++;
            d->lease_quarantined_blocks += r->n_blocks;
        }
    }
}

/* ---- registration, heartbeat, stats ---- */

static void send_register(void *arg)
{
    struct decode *d = arg;
    const struct kvr_kv_layout *L = &d->node.layout;
    Kvrail__RegisterRequest r = KVRAIL__REGISTER_REQUEST__INIT;
    Kvrail__KvLayout l;
    kvr_node_fill_register(&d->node, &r, &l, d->addr, d->addr_len);
    ProtobufCBinaryData rk[256];
    uint64_t base[256];
    size_t nl = (size_t)L->n_layers < 256 ? (size_t)L->n_layers : 256;
    for (size_t i = 0; i < nl; i++) {
        rk[i].data = d->npool.rkeys[i];
        rk[i].len = d->npool.rkey_lens[i];
        base[i] = (uint64_t)(uintptr_t)d->npool.kv.layer_base[i];
    }
    r.layer_rkeys = rk;
    r.n_layer_rkeys = nl;
    r.layer_base = base;
    r.n_layer_base = nl;
    r.total_blocks = (uint32_t)d->npool.kv.n_blocks;
    r.layer_stride = kvr_kv_layer_bytes(L, d->npool.kv.n_blocks);
    r.block_bytes = kvr_kv_block_bytes(L);
    kvr_node_send(&d->node, KVRAIL__METHOD__REGISTER, &r.base);
}

/* Lets the block table hand out the blocks the pool's pre-fault thread has
 * made resident since the last call (pool.h); true while it goes on. */
static bool sync_horizon(struct decode *d)
{
    uint32_t f = kvr_node_pool_faulted(&d->npool), h = kvr_blocktab_horizon(d->bt);
    if (f > h && kvr_blocktab_set_horizon(d->bt, f) == KVR_OK)
        kvr_node_stats_dirty(&d->node);
    if (d->faulted_at_register == UINT32_MAX && kvr_node_registered(&d->node))
        d->faulted_at_register = kvr_blocktab_horizon(d->bt);
    return f < (uint32_t)d->npool.kv.n_blocks && kvr_node_pool_fault_status(&d->npool) == KVR_OK;
}

/* Blocks held in quarantine now (their writer not fenced yet). */
static uint32_t quarantined_blocks(const struct decode *d)
{
    uint32_t n = 0;
    for (const struct dreq *r = d->reqs; r; r = r->next)
        if (r->state == DR_QUARANTINE)
            n += r->n_blocks;
    return n;
}

static void send_heartbeat(void *arg)
{
    struct decode *d = arg;
    (void)sync_horizon(d);
    Kvrail__Heartbeat h = KVRAIL__HEARTBEAT__INIT;
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(d->bt, &c);
    h.node_name = d->node.name;
    h.free_blocks = c.free + c.evictable;
    h.total_blocks = c.total;
    h.cached_blocks = c.cached;
    h.batch_size = (uint32_t)d->n_batch;
    h.reserved_blocks = c.referenced;
    h.kv_bytes_moved = d->kv_bytes;
    h.block_event_seq = d->ev_seq;
    h.incarnation = d->node.incarnation;
    h.bad_frames = d->node.bad_frames;
    h.bad_notifications = d->bad_notifs;
    h.quarantined_blocks = quarantined_blocks(d);
    h.quarantines_fenced = d->quarantines_fenced;
    h.quarantines_expired = d->quarantines_expired;
    kvr_node_send(&d->node, KVRAIL__METHOD__HEARTBEAT, &h.base);
}

static void stats_hash(void *arg, uint64_t hash, uint32_t block)
{
    struct kvr_sbuf *b = arg;
    (void)block;
    kvr_sbuf_printf(b, "%s\"%016" PRIx64 "\"", b->p[b->n - 1] == '[' ? "" : ", ", hash);
}

static void role_stats(void *arg, struct kvr_sbuf *b)
{
    struct decode *d = arg;
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(d->bt, &c);
    int nres = 0, nq = 0, nready = 0, nlocal = 0, npre = 0;
    for (struct dreq *r = d->reqs; r; r = r->next) {
        nres++;
        nq += r->state == DR_QUARANTINE;
        nready += r->state == DR_READY;
        nlocal += r->state == DR_LOCAL_PREFILL;
        npre += r->state == DR_PREEMPTED;
    }
    struct kvr_xfer_engine_stats xs;
    kvr_xfer_engine_stats(d->node.xfer, &xs);
    /* the transfer address it announces (not a secret: with auth, a peer
     * gets in only with a token the router made; auth_test.py connects) */
    kvr_sbuf_printf(b, ", \"transfer_address\": \"");
    for (size_t i = 0; d->addr && i < d->addr_len; i++)
        kvr_sbuf_printf(b, "%02x", ((const uint8_t *)d->addr)[i]);
    kvr_sbuf_printf(b, "\"");
    kvr_sbuf_printf(
        b,
        ", \"total_blocks\": %u, \"free_blocks\": %u, \"evictable_blocks\": %u, "
        "\"cached_blocks\": %u, \"reserved_blocks\": %u, \"requests\": %d, \"quarantined\": %d, "
        "\"ready\": %d, \"local_prefilling\": %d, \"batch\": %d, \"done\": %" PRIu64
        ", \"failed\": %" PRIu64 ", \"canceled\": %" PRIu64 ", \"expired\": %" PRIu64
        ", \"rejected\": %" PRIu64 ", \"local_prefills\": %" PRIu64
        ", \"remote_prefills\": %" PRIu64 ", \"kv_bytes_received\": %" PRIu64
        ", \"tokens_out\": %" PRIu64 ", \"steps\": %" PRIu64 ", \"cached_tokens_reused\": %" PRIu64
        ", \"block_event_seq\": %" PRIu64
        ", \"block_bytes\": %zu, \"layers\": %d, \"bad_notifications\": %" PRIu64
        ", \"prefill_chunk_tokens\": %d, \"chunks\": %" PRIu64 ", \"mixed_steps\": %" PRIu64
        ", \"chunk_ns_max\": %" PRIu64 ", \"decode_step_ns_max\": %" PRIu64
        ", \"step_ns_last\": %" PRIu64 ", \"itl_ns_max\": %" PRIu64 ", \"pool_setup_ns\": %" PRIu64
        ", \"pool_huge_pages\": %s, \"pool_faulted_blocks\": %u, \"pool_fault_ns\": %" PRIu64
        ", \"pool_faulted_at_register\": %lld, \"pool_fault_status\": \"%s\""
        ", \"reservation\": \"%s\", \"preemptions\": %" PRIu64 ", \"preempted\": %d"
        ", \"grown_blocks\": %" PRIu64 ", \"batch_max\": %d, \"lease_renewals\": %" PRIu64
        ", \"reservations\": %" PRIu64 ", \"reserve_renewals\": %" PRIu64
        ", \"stale_notifications\": %" PRIu64 ", \"retry_quarantines\": %" PRIu64
        ", \"retry_quarantined_blocks\": %" PRIu64 ", \"quarantines_fenced\": %" PRIu64
        ", \"quarantines_expired\": %" PRIu64 ", \"transfer_refused\": %" PRIu64
        ", \"transfer_tokens\": %d, \"cancel_quarantines\": %" PRIu64
        ", \"cancel_quarantined_blocks\": %" PRIu64 ", \"lease_quarantines\": %" PRIu64
        ", \"lease_quarantined_blocks\": %" PRIu64 ", \"quarantined_blocks\": %u"
        ", \"tokens_revoked\": %" PRIu64 ", \"forged_notifications\": %" PRIu64
        ", \"cached_hashes\": [",
        c.total, c.free, c.evictable, c.cached, c.referenced, nres, nq, nready, nlocal, d->n_batch,
        d->n_done, d->n_failed, d->n_canceled, d->n_expired, d->n_rejected, d->n_local, d->n_remote,
        d->kv_bytes, d->tokens_out, d->steps, d->cached_tokens, d->ev_seq,
        kvr_kv_block_bytes(&d->node.layout), d->node.layout.n_layers, d->bad_notifs, d->chunk,
        d->chunks, d->mixed_steps, d->chunk_ns_max, d->decode_ns_max, d->step_ns_last,
        d->itl_ns_max, d->npool.setup_ns, d->npool.huge ? "true" : "false",
        kvr_blocktab_horizon(d->bt), kvr_node_pool_fault_ns(&d->npool),
        d->faulted_at_register == UINT32_MAX ? -1ll : (long long)d->faulted_at_register,
        kvr_status_name(kvr_node_pool_fault_status(&d->npool)), d->paged ? "paged" : "whole",
        d->preemptions, npre, d->grown_blocks, d->batch_max, d->lease_renewals, d->reservations,
        d->reserve_renewals, d->stale_notifs, d->retry_quarantines, d->retry_quarantined_blocks,
        d->quarantines_fenced, d->quarantines_expired, xs.refused, d->n_ptokens,
        d->cancel_quarantines, d->cancel_quarantined_blocks, d->lease_quarantines,
        d->lease_quarantined_blocks, quarantined_blocks(d), d->tokens_revoked, d->forged_notifs);
    if (b->p)
        kvr_blocktab_foreach_cached(d->bt, stats_hash, b);
    kvr_sbuf_printf(b, "]");
}

static int turn(void *arg)
{
    struct decode *d = arg;
    /* while the pool is pre-faulted, look at its horizon every 20 ms */
    int cap = sync_horizon(d) ? 20 : 1000;
    check_leases(d);
    if (!d->busy)
        start_step(d);
    flush_events(d);
    if (d->busy)
        return cap; /* the step's DONE wakes the loop */
    for (struct dreq *r = d->reqs; r; r = r->next)
        if (r->state == DR_RESERVED || r->state == DR_QUARANTINE)
            return 5; /* the event fd wakes it; leases are checked often */
    return cap;       /* idle: the next timer (heartbeat, stats) or an event wakes it */
}

/* The figures of the metrics mirror (node_metrics.h), from the fields. */
static void role_counters(void *arg, void (*put)(void *ctx, int id, double v), void *ctx)
{
    struct decode *d = arg;
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(d->bt, &c);
    put(ctx, KVR_NC_TOTAL_BLOCKS, c.total);
    put(ctx, KVR_NC_FREE_BLOCKS, c.free);
    put(ctx, KVR_NC_EVICTABLE_BLOCKS, c.evictable);
    put(ctx, KVR_NC_CACHED_BLOCKS, c.cached);
    put(ctx, KVR_NC_RESERVED_BLOCKS, c.referenced);
    put(ctx, KVR_NC_BATCH, d->n_batch);
    put(ctx, KVR_NC_DONE, (double)d->n_done);
    put(ctx, KVR_NC_FAILED, (double)d->n_failed);
    put(ctx, KVR_NC_CANCELED, (double)d->n_canceled);
    put(ctx, KVR_NC_EXPIRED, (double)d->n_expired);
    put(ctx, KVR_NC_REJECTED, (double)d->n_rejected);
    put(ctx, KVR_NC_LOCAL_PREFILLS, (double)d->n_local);
    put(ctx, KVR_NC_REMOTE_PREFILLS, (double)d->n_remote);
    put(ctx, KVR_NC_KV_BYTES_RECEIVED, (double)d->kv_bytes);
    put(ctx, KVR_NC_TOKENS_OUT, (double)d->tokens_out);
    put(ctx, KVR_NC_STEPS, (double)d->steps);
    put(ctx, KVR_NC_CACHED_TOKENS_REUSED, (double)d->cached_tokens);
    put(ctx, KVR_NC_PREEMPTIONS, (double)d->preemptions);
    put(ctx, KVR_NC_BAD_NOTIFICATIONS, (double)d->bad_notifs);
    put(ctx, KVR_NC_CHUNKS, (double)d->chunks);
    put(ctx, KVR_NC_STEP_NS_LAST, (double)d->step_ns_last);
    put(ctx, KVR_NC_ITL_NS_MAX, (double)d->itl_ns_max);
    put(ctx, KVR_NC_LEASE_RENEWALS, (double)d->lease_renewals);
}

static const struct kvr_node_ops decode_ops = {
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
    static struct decode D;
    struct decode *d = &D;
    char err[512];
    int rc = 1;
    kvr_status_t s =
        kvr_node_init(&d->node, argc, argv, KVR_NODE_ROLE_DECODE, on_notif, d, err, sizeof err);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-decode: %s\n", err);
        kvr_node_fini(&d->node);
        return s == KVR_ERR_INVALID ? 2 : 1;
    }
    const struct kvr_kv_layout *L = &d->node.layout;
    d->vocab = kvr_model_vocab(d->node.model);
    d->maxpos = kvr_model_max_pos(d->node.model);
    d->max_batch = d->node.self->max_batch > 0 ? d->node.self->max_batch : 32;
    if (d->max_batch > 256)
        d->max_batch = 256;
    d->n_eos = kvr_model_eos_ids(d->node.model, &d->eos);
    uint64_t nblocks = d->node.self->pool_blocks;
    size_t bb = kvr_kv_block_bytes(L);
    if (!nblocks && d->node.self->pool_bytes)
        nblocks = d->node.self->pool_bytes / ((uint64_t)bb * (uint64_t)L->n_layers);
    if (!nblocks)
        nblocks = 2048;
    d->job.logits = malloc((size_t)d->max_batch * (size_t)d->vocab * sizeof *d->job.logits);
    d->job.chunk_logits = malloc((size_t)d->vocab * sizeof *d->job.chunk_logits);
    d->job.seqs = calloc((size_t)d->max_batch, sizeof *d->job.seqs);
    d->job.members = calloc((size_t)d->max_batch, sizeof *d->job.members);
    d->batch = calloc((size_t)d->max_batch, sizeof *d->batch);
    if (!d->job.logits || !d->job.chunk_logits || !d->job.seqs || !d->job.members || !d->batch) {
        fprintf(stderr, "kvrail-decode: out of memory\n");
        goto out;
    }
    /* memory the transport reaches fastest (with UCX on one host: shared
     * memory the prefill node maps, so its puts are one-sided copies),
     * pre-faulted on a thread: the node registers at once and hands out
     * only blocks below the faulted horizon (sync_horizon) */
    d->faulted_at_register = UINT32_MAX;
    s = kvr_node_pool_create_async(d->node.xfer, L, nblocks, true, &d->npool, err, sizeof err);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-decode: KV pool: %s\n", err);
        goto out;
    }
    if (kvr_blocktab_create((uint32_t)nblocks, on_block_event, d, &d->bt) != KVR_OK ||
        kvr_blocktab_set_horizon(d->bt, 0) != KVR_OK) {
        fprintf(stderr, "kvrail-decode: out of memory\n");
        goto out;
    }
    (void)sync_horizon(d);
    struct kvr_ctx_opts co = {0};
    co.n_threads = d->node.self->threads > 0 ? d->node.self->threads : 1;
    co.max_batch = d->max_batch;
    s = kvr_node_start_worker(&d->node, &co, err, sizeof err);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-decode: engine worker: %s\n", err);
        goto out;
    }
    d->chunk = d->node.cluster->prefill_chunk_tokens
                   ? (int32_t)d->node.cluster->prefill_chunk_tokens
                   : kvr_worker_max_tokens(d->node.worker);
    d->paged = d->node.cluster->reservation == KVR_RESERVE_PAGED;
    d->headroom = d->node.cluster->reservation_headroom_blocks;
    s = kvr_xfer_address(d->node.xfer, &d->addr, &d->addr_len);
    if (s != KVR_OK) {
        fprintf(stderr, "kvrail-decode: transport address: %s\n", kvr_status_str(s));
        goto out;
    }
    KVR_LOG_INFO(COMP, "max batch %d, local prefill in chunks of %d tokens, %s reservations",
                 d->max_batch, d->chunk,
                 d->paged ? "paged (prompt + headroom, grown while decoding)" : "whole-request");

    kvr_node_run(&d->node, &decode_ops, d);
    KVR_LOG_INFO(COMP, "stopping: %" PRIu64 " requests done, %" PRIu64 " tokens", d->n_done,
                 d->tokens_out);
    rc = 0;
out:
    /* the worker may be computing into the pool: stop it first */
    kvr_worker_destroy(d->node.worker);
    d->node.worker = NULL;
    d->busy = false;
    for (struct dreq *r = d->reqs; r; r = r->next)
        r->in_job = false;
    while (d->reqs)
        req_end(d, d->reqs, false);
    free(d->addr);
    kvr_blocktab_destroy(d->bt);
    kvr_node_pool_destroy(&d->npool);
    free(d->job.logits);
    free(d->job.chunk_logits);
    free(d->job.seqs);
    free(d->job.members);
    free(d->batch);
    free(d->ev.hashes);
    free(d->ev.kinds);
    kvr_node_fini(&d->node);
    return rc;
}
