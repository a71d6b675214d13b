/*
 * test_pool_prefault.c - the KV pool's pre-fault (node/pool.c) on a real
 * transfer engine of the named backend (argv[1], default "loop"), checked
 * by page residency (mincore), not by time:
 *
 *  - kvr_node_pool_create: every page of every layer resident on return;
 *  - kvr_node_pool_create_async, held by KVR_NODE_PREFAULT_GATE after its
 *    first chunk: the horizon is that chunk, its pages are resident in
 *    every layer and the pool's last block is not; once the gate file
 *    exists the horizon reaches every block, all pages resident, with a
 *    fault time and no error;
 *  - destroy while the thread is held: it stops and joins;
 *  - kvr_xfer_mem_populate refuses a range outside the region.
 */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kvr_test.h"
#include "pool.h"

#define BLOCKS 2048 /* x 8 KiB = 16 MiB a layer */

static const char *backend = "loop";
static size_t page;

/* pages of [p, p+len) resident (len > 0, p page-aligned) */
static size_t resident(const void *p, size_t len)
{
    size_t n = (len + page - 1) / page, r = 0;
    unsigned char *v = malloc(n);
    KVR_CHECK(v);
    KVR_CHECK(mincore((void *)p, len, v) == 0);
    for (size_t i = 0; i < n; i++)
        r += v[i] & 1;
    free(v);
    return r;
}

/* polls (1 ms apart, up to 60 s) until the horizon reaches want */
static uint32_t wait_faulted(const struct kvr_node_pool *P, uint32_t want)
{
    for (int i = 0; i < 60000; i++) {
        uint32_t f = kvr_node_pool_faulted(P);
        if (f >= want)
            return f;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    return kvr_node_pool_faulted(P);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        backend = argv[1];
    /* the loop backend's pool is aligned_alloc'd: meson's MALLOC_PERTURB_
     * would write every page of it, and residency would mean nothing */
    mallopt(M_PERTURB, 0);
    page = (size_t)sysconf(_SC_PAGESIZE);
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = "pool-test";
    kvr_xfer_engine_t *e;
    kvr_status_t st = kvr_xfer_engine_create(&cfg, &e);
    if (st == KVR_ERR_NOT_FOUND || st == KVR_ERR_NO_RDMA)
        KVR_SKIP("backend %s not usable here (%s)", backend, kvr_status_str(st));
    KVR_CHECK_STATUS(st, KVR_OK);

    struct kvr_kv_layout L = {0};
    L.n_layers = 3;
    L.n_kv_heads = 2;
    L.block_size = 16;
    L.head_dim = 32;
    size_t bb = kvr_kv_block_bytes(&L), slab = bb * BLOCKS;
    KVR_CHECK_EQ(bb, 8192);
    char err[256];

    /* synchronous: all resident on return */
    struct kvr_node_pool P;
    KVR_CHECK_STATUS(kvr_node_pool_create(e, &L, BLOCKS, true, &P, err, sizeof err), KVR_OK);
    KVR_CHECK_EQ(kvr_node_pool_faulted(&P), BLOCKS);
    KVR_CHECK_STATUS(kvr_node_pool_fault_status(&P), KVR_OK);
    for (int l = 0; l < L.n_layers; l++) {
        KVR_CHECK(P.rkeys[l] && P.rkey_lens[l] > 0);
        KVR_CHECK_EQ(resident(P.kv.layer_base[l], slab), slab / page);
    }
    /* populate: a range outside the region is refused */
    KVR_CHECK_STATUS(kvr_xfer_mem_populate(P.mem[0], slab - page, 2 * page), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_xfer_mem_populate(P.mem[0], slab + 1, 0), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_xfer_mem_populate(P.mem[0], slab - page, page), KVR_OK);
    kvr_node_pool_destroy(&P);

    /* in the background, held after the first chunk by the gate */
    char dir[512];
    KVR_CHECK(kvr_test_mkdtemp(dir, sizeof dir, "kvr-pool-test"));
    char gate[600];
    snprintf(gate, sizeof gate, "%s/go", dir);
    setenv("KVR_NODE_PREFAULT_GATE", gate, 1);
    KVR_CHECK_STATUS(kvr_node_pool_create_async(e, &L, BLOCKS, true, &P, err, sizeof err), KVR_OK);
    uint32_t chunk = (2u << 20) / (uint32_t)bb; /* 256 blocks: 2 MiB of a layer */
    KVR_CHECK_EQ(wait_faulted(&P, 1), chunk);
    KVR_CHECK_EQ(kvr_node_pool_faulted(&P), chunk); /* held */
    KVR_CHECK_EQ(kvr_node_pool_fault_ns(&P), 0);
    for (int l = 0; l < L.n_layers; l++) {
        const uint8_t *base = (const uint8_t *)P.kv.layer_base[l];
        KVR_CHECK_EQ(resident(base, chunk * bb), chunk * bb / page);
        KVR_CHECK_EQ(resident(base + slab - bb, bb), 0); /* the last block: untouched */
    }
    FILE *f = fopen(gate, "w");
    KVR_CHECK(f);
    fclose(f);
    KVR_CHECK_EQ(wait_faulted(&P, BLOCKS), BLOCKS);
    KVR_CHECK_STATUS(kvr_node_pool_fault_status(&P), KVR_OK);
    for (int i = 0; i < 60000 && kvr_node_pool_fault_ns(&P) == 0; i++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    KVR_CHECK(kvr_node_pool_fault_ns(&P) > 0);
    for (int l = 0; l < L.n_layers; l++)
        KVR_CHECK_EQ(resident(P.kv.layer_base[l], slab), slab / page);
    kvr_node_pool_destroy(&P);

    /* destroyed while held: the thread stops and is joined */
    unlink(gate);
    KVR_CHECK_STATUS(kvr_node_pool_create_async(e, &L, BLOCKS, false, &P, err, sizeof err), KVR_OK);
    KVR_CHECK_EQ(wait_faulted(&P, 1), chunk);
    kvr_node_pool_destroy(&P);
    KVR_CHECK(P.fault == NULL && P.mem == NULL);
    kvr_test_rmtree(dir);

    kvr_xfer_engine_destroy(e);
    printf("pool_prefault (%s): ok\n", backend);
    return 0;
}
