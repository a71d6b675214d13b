/*
 * pool.c - the KV pool of a node (pool.h).
 *
 * Each layer's slab comes from kvr_xfer_mem_alloc_flags with
 * KVR_XFER_MEM_DEFER_PREFAULT (UCX-allocated memory that a peer on this
 * host reaches without UCX's copies, huge pages advised, nothing faulted
 * yet); the pool itself advises MADV_HUGEPAGE once more to learn whether
 * the kernel takes it, then faults the pages in with kvr_xfer_mem_populate
 * (MADV_POPULATE_WRITE):
 *
 *  - kvr_node_pool_create: every slab, before it returns;
 *  - kvr_node_pool_create_async: on a thread, chunk after chunk of
 *    CHUNK_BYTES (rounded to whole blocks) of every layer, storing the
 *    number of leading blocks resident in all layers (release) after each
 *    chunk; the loop reads it (acquire) and lets the block table hand out
 *    only blocks below it.
 *
 * The thread touches only the slabs' pages (madvise on ranges no request
 * can hold yet) and its own atomics; it never uses the transfer engine,
 * which stays the loop's.  Destroy stops it between two chunks and joins
 * it before the slabs are deregistered.
 */
#include "pool.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "pool_device.h"

#define COMP         "pool"
#define CHUNK_BYTES  (2u << 20) /* of one layer: one transparent huge page */
#define GATE_POLL_MS 10
#define GATE_MAX_MS  120000

struct kvr_node_pool_fault {
    pthread_t thread;
    bool started;         /* thread to join */
    kvr_xfer_mem_t **mem; /* the pool's; valid until destroy joins */
    size_t n_layers, block_bytes;
    uint32_t n_blocks, chunk_blocks;
    char *gate; /* KVR_NODE_PREFAULT_GATE, or NULL */
    uint64_t t0;
    _Atomic uint32_t faulted;
    _Atomic uint64_t ns;
    _Atomic int status;
    atomic_bool stop;
};

/* Asks for huge pages on the 2 MiB-aligned interior; whether accepted. */
static bool advise_huge(void *p, size_t len)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t hp = 2u << 20;
    uintptr_t a = ((uintptr_t)p + hp - 1) & ~(hp - 1), e = ((uintptr_t)p + len) & ~(hp - 1);
    return e > a && madvise((void *)a, e - a, MADV_HUGEPAGE) == 0;
#else
    (void)p;
    (void)len;
    return false;
#endif
}

/* Test hook: holds the thread until the gate file exists (or stop, or
 * GATE_MAX_MS, then it goes on with a warning). */
static void wait_gate(struct kvr_node_pool_fault *F)
{
    KVR_LOG_WARN(COMP, "pre-fault held at %u of %u blocks until %s exists (KVR_NODE_PREFAULT_GATE)",
                 atomic_load(&F->faulted), F->n_blocks, F->gate);
    for (int waited = 0; !atomic_load(&F->stop); waited += GATE_POLL_MS) {
        if (access(F->gate, F_OK) == 0)
            return;
        if (waited >= GATE_MAX_MS) {
            KVR_LOG_WARN(COMP, "%s did not appear within %d ms: pre-faulting on", F->gate,
                         GATE_MAX_MS);
            return;
        }
        struct timespec ts = {0, GATE_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void *fault_main(void *arg)
{
    struct kvr_node_pool_fault *F = arg;
    uint32_t b = 0;
    while (b < F->n_blocks && !atomic_load_explicit(&F->stop, memory_order_relaxed)) {
        uint32_t e = F->n_blocks - b > F->chunk_blocks ? b + F->chunk_blocks : F->n_blocks;
        for (size_t l = 0; l < F->n_layers; l++) {
            kvr_status_t s = kvr_xfer_mem_populate(F->mem[l], (size_t)b * F->block_bytes,
                                                   (size_t)(e - b) * F->block_bytes);
            if (s != KVR_OK) {
                KVR_LOG_ERROR(COMP,
                              "pre-faulting blocks %u..%u of layer %zu: %s; the pool stays at "
                              "the %u blocks already resident (%u configured)",
                              b, e, l, kvr_status_str(s), b, F->n_blocks);
                atomic_store(&F->status, (int)s);
                return NULL;
            }
        }
        atomic_store_explicit(&F->faulted, e, memory_order_release);
        if (b == 0 && F->gate)
            wait_gate(F);
        b = e;
    }
    if (b == F->n_blocks) {
        uint64_t ns = kvr_now_ns() - F->t0;
        atomic_store(&F->ns, ns ? ns : 1);
        KVR_LOG_INFO(COMP,
                     "KV pool: all %u blocks resident %.1f ms after the slabs were "
                     "registered (faulted on a thread, %u blocks a chunk)",
                     F->n_blocks, (double)ns / 1e6, F->chunk_blocks);
    }
    return NULL;
}

static kvr_status_t create(kvr_xfer_engine_t *xfer, const struct kvr_kv_layout *L,
                           uint64_t n_blocks, bool pack_rkeys, bool async,
                           struct kvr_node_pool *pool_p, char *err, size_t err_len)
{
    struct kvr_node_pool P;
    memset(&P, 0, sizeof P);
    const int dev = kvr_node_pool_device(); /* >= 0: slabs in that GPU's HBM, resident at once */
    async = async && dev < 0;
    size_t bb = kvr_kv_block_bytes(L);
    if (n_blocks == 0 || n_blocks * bb > (4ull << 30) || n_blocks > (1u << 30)) {
        snprintf(err, err_len,
                 "a pool of %" PRIu64 " blocks of %zu bytes makes layer slabs of 0 "
                 "or over 4 GiB",
                 n_blocks, bb);
        return KVR_ERR_INVALID;
    }
    size_t nl = (size_t)L->n_layers;
    P.kv.layout = *L;
    P.kv.n_blocks = (int32_t)n_blocks;
    P.kv.layer_base = calloc(nl, sizeof *P.kv.layer_base);
    P.mem = calloc(nl, sizeof *P.mem);
    if (pack_rkeys) {
        P.rkeys = calloc(nl, sizeof *P.rkeys);
        P.rkey_lens = calloc(nl, sizeof *P.rkey_lens);
    }
    if (async)
        P.fault = calloc(1, sizeof *P.fault);
    if (!P.kv.layer_base || !P.mem || (pack_rkeys && (!P.rkeys || !P.rkey_lens)) ||
        (async && !P.fault)) {
        kvr_node_pool_destroy(&P);
        snprintf(err, err_len, "out of memory");
        return KVR_ERR_NO_MEMORY;
    }
    size_t slab = kvr_kv_layer_bytes(L, (int32_t)n_blocks);
    uint64_t t0 = kvr_now_ns(), t_alloc = 0, t_fault = 0;
    bool huge = true;
    for (size_t l = 0; l < nl; l++) {
        uint64_t a = kvr_now_ns();
        kvr_status_t s = dev >= 0
                             ? kvr_xfer_mem_alloc_flags(xfer, slab, KVR_MEM_CUDA, dev, 0, &P.mem[l])
                             : kvr_xfer_mem_alloc_flags(xfer, slab, KVR_MEM_HOST, 0,
                                                        KVR_XFER_MEM_DEFER_PREFAULT, &P.mem[l]);
        uint64_t b = kvr_now_ns();
        t_alloc += b - a;
        const char *what = "allocating and registering";
        if (s == KVR_OK) {
            P.kv.layer_base[l] = kvr_xfer_mem_addr(P.mem[l]);
            huge &= dev < 0 && advise_huge(P.kv.layer_base[l], slab);
            if (!async && dev < 0) {
                what = "pre-faulting";
                s = kvr_xfer_mem_populate(P.mem[l], 0, slab);
                t_fault += kvr_now_ns() - b;
            }
            if (s == KVR_OK && pack_rkeys) {
                what = "packing the rkey of";
                s = kvr_xfer_mem_pack(P.mem[l], &P.rkeys[l], &P.rkey_lens[l]);
            }
        }
        if (s != KVR_OK) {
            snprintf(err, err_len, "%s the %zu-byte slab of layer %zu: %s", what, slab, l,
                     kvr_status_str(s));
            kvr_node_pool_destroy(&P);
            return s;
        }
    }
    P.setup_ns = kvr_now_ns() - t0;
    P.huge = huge;
    char fault[64] = "pre-fault on a thread from now";
    if (!async)
        snprintf(fault, sizeof fault, "pre-fault %.1f ms", (double)t_fault / 1e6);
    KVR_LOG_INFO(COMP,
                 "KV pool: %" PRIu64 " blocks of %d tokens x %zu layers = %.1f MiB in %.1f ms "
                 "(allocate + register %.1f ms, %s, huge pages %s)",
                 n_blocks, L->block_size, nl, (double)slab * (double)nl / 1048576.0,
                 (double)P.setup_ns / 1e6, (double)t_alloc / 1e6, fault,
                 huge ? "advised" : "not available");
    if (async) {
        struct kvr_node_pool_fault *F = P.fault;
        F->mem = P.mem;
        F->n_layers = nl;
        F->block_bytes = bb;
        F->n_blocks = (uint32_t)n_blocks;
        F->chunk_blocks = bb >= CHUNK_BYTES ? 1u : (uint32_t)((CHUNK_BYTES + bb - 1) / bb);
        const char *gate = getenv("KVR_NODE_PREFAULT_GATE");
        if (gate && gate[0] && !(F->gate = strdup(gate))) {
            kvr_node_pool_destroy(&P);
            snprintf(err, err_len, "out of memory");
            return KVR_ERR_NO_MEMORY;
        }
        F->t0 = kvr_now_ns();
        int rc = pthread_create(&F->thread, NULL, fault_main, F);
        if (rc != 0) {
            kvr_node_pool_destroy(&P);
            snprintf(err, err_len, "starting the pre-fault thread: %s", strerror(rc));
            return KVR_ERR_IO;
        }
        F->started = true;
        pthread_setname_np(F->thread, "kvr-prefault"); /* for top -H; best effort */
    }
    *pool_p = P;
    return KVR_OK;
}

kvr_status_t kvr_node_pool_create(kvr_xfer_engine_t *xfer, const struct kvr_kv_layout *L,
                                  uint64_t n_blocks, bool pack_rkeys, struct kvr_node_pool *pool_p,
                                  char *err, size_t err_len)
{
    return create(xfer, L, n_blocks, pack_rkeys, false, pool_p, err, err_len);
}

kvr_status_t kvr_node_pool_create_async(kvr_xfer_engine_t *xfer, const struct kvr_kv_layout *L,
                                        uint64_t n_blocks, bool pack_rkeys,
                                        struct kvr_node_pool *pool_p, char *err, size_t err_len)
{
    return create(xfer, L, n_blocks, pack_rkeys, true, pool_p, err, err_len);
}

uint32_t kvr_node_pool_faulted(const struct kvr_node_pool *P)
{
    if (!P->fault)
        return (uint32_t)P->kv.n_blocks;
    return atomic_load_explicit(&P->fault->faulted, memory_order_acquire);
}

uint64_t kvr_node_pool_fault_ns(const struct kvr_node_pool *P)
{
    return P->fault ? atomic_load(&P->fault->ns) : 0;
}

kvr_status_t kvr_node_pool_fault_status(const struct kvr_node_pool *P)
{
    return P->fault ? (kvr_status_t)atomic_load(&P->fault->status) : KVR_OK;
}

void kvr_node_pool_destroy(struct kvr_node_pool *P)
{
    if (P->fault) {
        if (P->fault->started) {
            atomic_store(&P->fault->stop, true);
            pthread_join(P->fault->thread, NULL);
        }
        free(P->fault->gate);
        free(P->fault);
    }
    size_t nl = (size_t)P->kv.layout.n_layers;
    for (size_t l = 0; P->rkeys && l < nl; l++)
        free(P->rkeys[l]);
    for (size_t l = 0; P->mem && l < nl; l++)
        if (P->mem[l])
            kvr_xfer_mem_dereg(P->mem[l]);
    free(P->kv.layer_base);
    free(P->mem);
    free(P->rkeys);
    free(P->rkey_lens);
    memset(P, 0, sizeof *P);
}
