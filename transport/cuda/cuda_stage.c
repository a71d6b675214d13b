/*
 * cuda_stage.c - the pinned-host staging ring (kvr_cuda_stage.h) and its
 * two memory tables: CUDA's, and plain host memory standing in for tests.
 *
 * Slots are handed out round-robin from a free mask; a slot is busy from
 * out()/take() to release().  The counters are plain (one thread owns a
 * stage, as one thread owns a transfer engine).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "kvr_cuda.h"
#include "kvr_cuda_stage.h"
#include "kvr_log.h"

#define COMP "cuda_stage"

struct kvr_cuda_stage {
    struct kvr_cuda_stage_config cfg;
    char name[96], why[160];
    const struct kvr_cuda_stage_mem *mem;
    void *ctx;
    unsigned char *pinned; /* n_slots * slot_bytes */
    bool *busy;
    size_t next, in_use;
    bool logged;
    struct kvr_cuda_stage_stats st;
};

static atomic_int g_logged; /* "logged once" is per process: one line, not one per peer */

kvr_status_t kvr_cuda_stage_create(const struct kvr_cuda_stage_config *cfg,
                                   kvr_cuda_stage_t **stage_p, char *err, size_t err_len)
{
    if (!cfg || !stage_p || !cfg->mem || !cfg->slot_bytes || !cfg->n_slots) {
        snprintf(err, err_len, "staging: slot_bytes and n_slots must be > 0");
        return KVR_ERR_INVALID;
    }
    const char *name = cfg->name ? cfg->name : "?", *why = cfg->why ? cfg->why : "no direct path";
    if (cfg->require_gpudirect) {
        snprintf(err, err_len,
                 "%s: require_gpudirect is set, but this path would stage KV through pinned host "
                 "memory (%s); give the nodes a GPUDirect-capable transport or unset "
                 "require_gpudirect",
                 name, why);
        return KVR_ERR_UNSUPPORTED;
    }
    kvr_cuda_stage_t *s = calloc(1, sizeof *s);
    if (!s)
        return KVR_ERR_NO_MEMORY;
    s->cfg = *cfg;
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->why, sizeof s->why, "%s", why);
    s->mem = cfg->mem;
    s->busy = calloc(cfg->n_slots, sizeof *s->busy);
    kvr_status_t st = s->busy ? s->mem->init(&s->ctx, cfg->n_slots) : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK) {
        s->pinned = s->mem->alloc_pinned(s->ctx, cfg->n_slots * cfg->slot_bytes);
        if (!s->pinned)
            st = KVR_ERR_NO_MEMORY;
    }
    if (st != KVR_OK) {
        snprintf(err, err_len, "%s: staging buffers (%zu x %zu bytes, %s): %s", name, cfg->n_slots,
                 cfg->slot_bytes, s->mem->name, kvr_status_str(st));
        kvr_cuda_stage_destroy(s);
        return st;
    }
    *stage_p = s;
    return KVR_OK;
}

void kvr_cuda_stage_destroy(kvr_cuda_stage_t *s)
{
    if (!s)
        return;
    if (s->pinned)
        s->mem->free_pinned(s->ctx, s->pinned);
    if (s->ctx)
        s->mem->fini(s->ctx);
    free(s->busy);
    free(s);
}

static kvr_status_t grab(kvr_cuda_stage_t *s, size_t len, size_t *slot_p)
{
    if (!len || len > s->cfg.slot_bytes) {
        KVR_LOG_ERROR(COMP, "%s: a %zu-byte block does not fit a %zu-byte slot", s->name, len,
                      s->cfg.slot_bytes);
        return KVR_ERR_INVALID;
    }
    if (!s->logged) {
        s->logged = true;
        if (atomic_exchange(&g_logged, 1) == 0)
            KVR_LOG_WARN(COMP,
                         "%s: KV moves through pinned host memory (%s): two extra copies a "
                         "block; counted in the staging stats",
                         s->name, s->why);
    }
    for (size_t i = 0; i < s->cfg.n_slots; i++) {
        size_t k = (s->next + i) % s->cfg.n_slots;
        if (!s->busy[k]) {
            s->busy[k] = true;
            s->next = (k + 1) % s->cfg.n_slots;
            if (++s->in_use > s->st.max_in_use)
                s->st.max_in_use = s->in_use;
            *slot_p = k;
            return KVR_OK;
        }
    }
    s->st.no_slot++;
    return KVR_ERR_NO_RESOURCE;
}

static void *slot_mem(kvr_cuda_stage_t *s, size_t k)
{
    return s->pinned + k * s->cfg.slot_bytes;
}

kvr_status_t kvr_cuda_stage_out(kvr_cuda_stage_t *s, const void *src, size_t len, size_t *slot_p,
                                void **host_p)
{
    size_t k;
    kvr_status_t st = grab(s, len, &k);
    if (st != KVR_OK)
        return st;
    st = s->mem->copy(s->ctx, k, slot_mem(s, k), src, len, 0);
    if (st != KVR_OK) {
        kvr_cuda_stage_release(s, k);
        return st;
    }
    s->st.out_ops++;
    s->st.out_bytes += len;
    *slot_p = k;
    *host_p = slot_mem(s, k);
    return KVR_OK;
}

kvr_status_t kvr_cuda_stage_take(kvr_cuda_stage_t *s, size_t len, size_t *slot_p, void **host_p)
{
    size_t k;
    kvr_status_t st = grab(s, len, &k);
    if (st == KVR_OK) {
        *slot_p = k;
        *host_p = slot_mem(s, k);
    }
    return st;
}

kvr_status_t kvr_cuda_stage_in(kvr_cuda_stage_t *s, size_t k, void *dst, size_t len)
{
    if (k >= s->cfg.n_slots || !s->busy[k] || !len || len > s->cfg.slot_bytes)
        return KVR_ERR_INVALID;
    kvr_status_t st = s->mem->copy(s->ctx, k, dst, slot_mem(s, k), len, 1);
    if (st == KVR_OK) {
        s->st.in_ops++;
        s->st.in_bytes += len;
    }
    return st;
}

kvr_status_t kvr_cuda_stage_poll(kvr_cuda_stage_t *s, size_t k)
{
    if (k >= s->cfg.n_slots || !s->busy[k])
        return KVR_ERR_INVALID;
    return s->mem->query(s->ctx, k);
}

void kvr_cuda_stage_release(kvr_cuda_stage_t *s, size_t k)
{
    if (k < s->cfg.n_slots && s->busy[k]) {
        s->busy[k] = false;
        s->in_use--;
    }
}

void kvr_cuda_stage_stats(const kvr_cuda_stage_t *s, struct kvr_cuda_stage_stats *st)
{
    *st = s->st;
}

/* ------------------------------------------------------------ CUDA */

struct cuda_ctx {
    cudaStream_t stream;
    cudaEvent_t *ev; /* one a slot */
    size_t n;
};

static kvr_status_t cu_init(void **ctx_p, size_t n)
{
    struct cuda_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return KVR_ERR_NO_MEMORY;
    *ctx_p = c;
    c->ev = calloc(n, sizeof *c->ev);
    if (!c->ev)
        return KVR_ERR_NO_MEMORY;
    kvr_status_t s = kvr_cuda_bind();
    if (s != KVR_OK)
        return s;
    KVR_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    for (size_t i = 0; i < n; i++) {
        KVR_CUDA_CHECK(cudaEventCreateWithFlags(&c->ev[i], cudaEventDisableTiming));
        c->n = i + 1;
    }
    return KVR_OK;
}

static void cu_fini(void *ctx)
{
    struct cuda_ctx *c = ctx;
    for (size_t i = 0; i < c->n; i++)
        cudaEventDestroy(c->ev[i]);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c->ev);
    free(c);
}

static void *cu_alloc(void *ctx, size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_free(void *ctx, void *p)
{
    cudaFreeHost(p);
}

static kvr_status_t cu_copy(void *ctx, size_t slot, void *dst, const void *src, size_t len, int dir)
{
    struct cuda_ctx *c = ctx;
    KVR_CUDA_CHECK(cudaMemcpyAsync(
        dst, src, len, dir ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, c->stream));
    KVR_CUDA_CHECK(cudaEventRecord(c->ev[slot], c->stream));
    return KVR_OK;
}

static kvr_status_t cu_query(void *ctx, size_t slot)
{
    struct cuda_ctx *c = ctx;
    cudaError_t e = cudaEventQuery(c->ev[slot]);
    if (e == cudaErrorNotReady)
        return KVR_INPROGRESS;
    return e == cudaSuccess ? KVR_OK : kvr_cuda_fail(e, "staging copy", __FILE__, __LINE__);
}

const struct kvr_cuda_stage_mem kvr_cuda_stage_cuda_mem = {
    "cuda", cu_init, cu_fini, cu_alloc, cu_free, cu_copy, cu_query,
};

/* ------------------------------------------------------------ host stand-in */

static kvr_status_t host_init(void **ctx_p, size_t n)
{
    *ctx_p = (void *)1; /* no state */
    return KVR_OK;
}

static void host_fini(void *ctx) {}

static void *host_alloc(void *ctx, size_t bytes)
{
    return calloc(1, bytes);
}

static void host_free(void *ctx, void *p)
{
    free(p);
}

static kvr_status_t host_copy(void *ctx, size_t slot, void *dst, const void *src, size_t len,
                              int dir)
{
    memcpy(dst, src, len);
    return KVR_OK;
}

static kvr_status_t host_query(void *ctx, size_t slot)
{
    return KVR_OK;
}

const struct kvr_cuda_stage_mem kvr_cuda_stage_host_mem = {
    "host (test stand-in)", host_init, host_fini, host_alloc, host_free, host_copy, host_query,
};
