/*
 * test_cuda_stage.c - the pinned-host staging ring (transport/cuda/
 * kvr_cuda_stage.h): the refusal under require_gpudirect, the ring's slot
 * accounting and back-pressure, the byte counters, and that what goes out
 * and comes in is the data.
 *
 * On every machine with plain host memory standing in for device memory
 * (kvr_cuda_stage_host_mem: the copies are memcpy and complete at once; the
 * ring, the counters, the back-pressure and the refusal are the code a GPU
 * runs).  With a GPU it runs the same sequence again with
 * kvr_cuda_stage_cuda_mem: cudaMallocHost slots, cudaMemcpyAsync from and
 * to cudaMalloc'd memory, completion by event - covered only there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "kvr_cuda.h"
#include "kvr_cuda_stage.h"
#include "kvr_test.h"

#define SLOT  4096
#define NSLOT 4

/* "device" memory of the table: host memory, or cudaMalloc'd */
static void *dev_alloc(bool gpu, size_t n)
{
    void *p = NULL;
    if (!gpu)
        return calloc(1, n);
    return cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
}

static void dev_put(bool gpu, void *d, const void *h, size_t n)
{
    if (gpu)
        cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    else
        memcpy(d, h, n);
}

static void dev_get(bool gpu, void *h, const void *d, size_t n)
{
    if (gpu)
        cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    else
        memcpy(h, d, n);
}

static void dev_free(bool gpu, void *p)
{
    if (gpu)
        cudaFree(p);
    else
        free(p);
}

/* waits for slot's copy (bounded) */
static kvr_status_t settle(kvr_cuda_stage_t *s, size_t slot)
{
    for (long i = 0; i < 100000000L; i++) {
        kvr_status_t st = kvr_cuda_stage_poll(s, slot);
        if (st != KVR_INPROGRESS)
            return st;
    }
    return KVR_ERR_TIMEOUT;
}

static void run(const struct kvr_cuda_stage_mem *mem, bool gpu)
{
    char err[512];
    kvr_cuda_stage_t *s = NULL;
    struct kvr_cuda_stage_config cfg = {.name = "decode0 -> prefill1",
                                        .why = "UCX without CUDA support",
                                        .slot_bytes = SLOT,
                                        .n_slots = NSLOT,
                                        .require_gpudirect = true,
                                        .mem = mem};
    kvr_status_t st = kvr_cuda_stage_create(&cfg, &s, err, sizeof err);
    KVR_EXPECT(st == KVR_ERR_UNSUPPORTED && !s && strstr(err, "require_gpudirect") &&
                   strstr(err, "UCX without CUDA support") && strstr(err, "decode0 -> prefill1"),
               "require_gpudirect must refuse, naming the path and why: %d '%s'", st, err);
    cfg.require_gpudirect = false;
    cfg.n_slots = 0;
    KVR_EXPECT(kvr_cuda_stage_create(&cfg, &s, err, sizeof err) == KVR_ERR_INVALID, "zero slots");
    cfg.n_slots = NSLOT;
    st = kvr_cuda_stage_create(&cfg, &s, err, sizeof err);
    KVR_EXPECT(st == KVR_OK && s, "create: %s", err);
    if (!s)
        return;

    /* 8 blocks of "device" memory with distinct bytes */
    unsigned char *h = malloc(8 * SLOT), *back = malloc(8 * SLOT);
    for (size_t i = 0; i < 8 * SLOT; i++)
        h[i] = (unsigned char)(i * 7 + i / SLOT);
    void *dev = dev_alloc(gpu, 8 * SLOT);
    dev_put(gpu, dev, h, 8 * SLOT);

    size_t slot[8];
    void *hp[8];
    for (int i = 0; i < NSLOT; i++) {
        st = kvr_cuda_stage_out(s, (char *)dev + i * SLOT, SLOT - (size_t)i, &slot[i], &hp[i]);
        KVR_EXPECT(st == KVR_OK, "out %d: %s", i, kvr_status_str(st));
    }
    st = kvr_cuda_stage_out(s, (char *)dev + 4 * SLOT, SLOT, &slot[4], &hp[4]);
    KVR_EXPECT(st == KVR_ERR_NO_RESOURCE, "a fifth block with %d slots: %s, want no_resource",
               NSLOT, kvr_status_str(st));
    for (int i = 0; i < NSLOT; i++) {
        KVR_EXPECT(settle(s, slot[i]) == KVR_OK, "poll %d", i);
        KVR_EXPECT(memcmp(hp[i], h + (size_t)i * SLOT, SLOT - (size_t)i) == 0,
                   "slot of block %d holds other bytes", i);
    }
    KVR_EXPECT(slot[0] != slot[1] && slot[1] != slot[2] && slot[2] != slot[3],
               "a slot given twice");
    kvr_cuda_stage_release(s, slot[1]);
    kvr_cuda_stage_release(s, slot[1]); /* twice: a no-op */
    st = kvr_cuda_stage_out(s, (char *)dev + 5 * SLOT, SLOT, &slot[5], &hp[5]);
    KVR_EXPECT(st == KVR_OK && slot[5] == slot[1],
               "the released slot is reused: %s slot %zu (want %zu)", kvr_status_str(st), slot[5],
               slot[1]);
    KVR_EXPECT(settle(s, slot[5]) == KVR_OK && memcmp(hp[5], h + 5 * SLOT, SLOT) == 0, "block 5");
    KVR_EXPECT(kvr_cuda_stage_out(s, dev, SLOT + 1, &slot[6], &hp[6]) == KVR_ERR_INVALID,
               "a block over the slot size");
    KVR_EXPECT(kvr_cuda_stage_out(s, dev, 0, &slot[6], &hp[6]) == KVR_ERR_INVALID,
               "an empty block");
    for (int i = 0; i < NSLOT; i++)
        kvr_cuda_stage_release(s, slot[i == 1 ? 5 : i]);

    /* in: host bytes -> a slot -> "device" memory */
    void *dst = dev_alloc(gpu, 2 * SLOT);
    size_t k;
    void *hk;
    KVR_EXPECT(kvr_cuda_stage_in(s, 0, dst, SLOT) == KVR_ERR_INVALID, "in on a slot not taken");
    st = kvr_cuda_stage_take(s, SLOT, &k, &hk);
    KVR_EXPECT(st == KVR_OK, "take: %s", kvr_status_str(st));
    if (st == KVR_OK) {
        memcpy(hk, h + 6 * SLOT, SLOT);
        KVR_EXPECT(kvr_cuda_stage_in(s, k, (char *)dst + SLOT, SLOT) == KVR_OK, "in");
        KVR_EXPECT(settle(s, k) == KVR_OK, "poll in");
        dev_get(gpu, back, (char *)dst + SLOT, SLOT);
        KVR_EXPECT(memcmp(back, h + 6 * SLOT, SLOT) == 0, "the block that came in differs");
        kvr_cuda_stage_release(s, k);
        KVR_EXPECT(kvr_cuda_stage_in(s, k, dst, SLOT) == KVR_ERR_INVALID, "in on a released slot");
    }

    struct kvr_cuda_stage_stats t;
    kvr_cuda_stage_stats(s, &t);
    uint64_t want_out = 4 * (uint64_t)SLOT - 6 + SLOT;
    KVR_EXPECT(t.out_ops == 5 && t.out_bytes == want_out, "out: %llu ops %llu bytes, want 5 / %llu",
               (unsigned long long)t.out_ops, (unsigned long long)t.out_bytes,
               (unsigned long long)want_out);
    KVR_EXPECT(t.in_ops == 1 && t.in_bytes == SLOT, "in: %llu ops %llu bytes",
               (unsigned long long)t.in_ops, (unsigned long long)t.in_bytes);
    KVR_EXPECT(t.no_slot == 1 && t.max_in_use == NSLOT, "no_slot %llu, max_in_use %llu",
               (unsigned long long)t.no_slot, (unsigned long long)t.max_in_use);
    printf("%s: refusal, ring of %d, back-pressure, counters (out %llu B, in %llu B): %s\n",
           mem->name, NSLOT, (unsigned long long)t.out_bytes, (unsigned long long)t.in_bytes,
           kvr_test_fails ? "FAILED" : "OK");
    kvr_cuda_stage_destroy(s);
    dev_free(gpu, dev);
    dev_free(gpu, dst);
    free(h);
    free(back);
}

int main(void)
{
    run(&kvr_cuda_stage_host_mem, false);
    char err[256];
    if (kvr_cuda_device_open(0, 0, err, sizeof err) != KVR_OK)
        printf("cuda staging (cudaMallocHost, cudaMemcpyAsync, events) not run: %s\n", err);
    else
        run(&kvr_cuda_stage_cuda_mem, true);
    return kvr_test_fails ? 1 : 0;
}
