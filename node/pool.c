/*
 * pool.c - the KV pool of a node (pool.h).
 *
 * Each layer's slab comes from kvr_xfer_mem_alloc (UCX-allocated memory
 * that a peer on the same host maps, so its puts are copies).  Before the
 * first touch the slab is advised MADV_HUGEPAGE (2 MiB pages where
 * transparent huge pages are enabled in "madvise" or "always" mode), then
 * every page is written once: the pool is resident before the node
 * registers, and the data path never faults.
 */
#include "pool.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kvr_clock.h"
#include "kvr_log.h"

#define COMP "pool"

/* Touches every page of [p, p+len) after asking for huge pages on the
 * 2 MiB-aligned part; returns whether the kernel accepted the advice. */
static bool prefault(void *p, size_t len)
{
    bool huge = false;
#ifdef MADV_HUGEPAGE
    const uintptr_t hp = 2u << 20;
    uintptr_t a = ((uintptr_t)p + hp - 1) & ~(hp - 1), e = ((uintptr_t)p + len) & ~(hp - 1);
    if (e > a)
        huge = madvise((void *)a, e - a, MADV_HUGEPAGE) == 0;
#endif
    memset(p, 0, len);
    return huge;
}

kvr_status_t kvr_node_pool_create(kvr_xfer_engine_t *xfer, const struct kvr_kv_layout *L,
                                  uint64_t n_blocks, bool pack_rkeys, struct kvr_node_pool *pool_p,
                                  char *err, size_t err_len)
{
    struct kvr_node_pool P;
    memset(&P, 0, sizeof P);
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
    if (!P.kv.layer_base || !P.mem || (pack_rkeys && (!P.rkeys || !P.rkey_lens))) {
        kvr_node_pool_destroy(&P);
        snprintf(err, err_len, "out of memory");
        return KVR_ERR_NO_MEMORY;
    }
    size_t slab = kvr_kv_layer_bytes(L, (int32_t)n_blocks);
    uint64_t t0 = kvr_now_ns(), t_alloc = 0, t_fault = 0;
    bool huge = true;
    for (size_t l = 0; l < nl; l++) {
        uint64_t a = kvr_now_ns();
        kvr_status_t s = kvr_xfer_mem_alloc(xfer, slab, KVR_MEM_HOST, 0, &P.mem[l]);
        uint64_t b = kvr_now_ns();
        t_alloc += b - a;
        if (s == KVR_OK) {
            P.kv.layer_base[l] = kvr_xfer_mem_addr(P.mem[l]);
            huge &= prefault(P.kv.layer_base[l], slab);
            t_fault += kvr_now_ns() - b;
            if (pack_rkeys)
                s = kvr_xfer_mem_pack(P.mem[l], &P.rkeys[l], &P.rkey_lens[l]);
        }
        if (s != KVR_OK) {
            snprintf(err, err_len, "allocating and registering the %zu-byte slab of layer %zu: %s",
                     slab, l, kvr_status_str(s));
            kvr_node_pool_destroy(&P);
            return s;
        }
    }
    P.setup_ns = kvr_now_ns() - t0;
    P.huge = huge;
    KVR_LOG_INFO(COMP,
                 "KV pool: %" PRIu64 " blocks of %d tokens x %zu layers = %.1f MiB in %.1f ms "
                 "(allocate + register %.1f ms, pre-fault %.1f ms, huge pages %s)",
                 n_blocks, L->block_size, nl, (double)slab * (double)nl / 1048576.0,
                 (double)P.setup_ns / 1e6, (double)t_alloc / 1e6, (double)t_fault / 1e6,
                 huge ? "advised" : "not available");
    *pool_p = P;
    return KVR_OK;
}

void kvr_node_pool_destroy(struct kvr_node_pool *P)
{
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
