/*
 * kvr_cuda_stage.h - staging KV blocks through pinned host buffers, for a
 * transfer path that cannot reach GPU memory directly (no CUDA IPC, no
 * GPUDirect RDMA, a UCX without CUDA): the sender copies device -> pinned
 * host, the host transport moves the bytes, the receiver copies pinned
 * host -> device.
 *
 * A stage is a ring of fixed-size slots of pinned memory.  out() starts the
 * device -> host copy of one block into a free slot, in() the host -> device
 * copy out of one; poll() reports a slot's copy complete; release() returns
 * it.  No slot free is back-pressure (KVR_ERR_NO_RESOURCE), never a wait.
 * Every staged byte is counted; the first use logs once, naming why the
 * path is staged; a stage configured with require_gpudirect is refused at
 * create, with that reason (the cluster file's require_gpudirect: true).
 *
 * The copies go through a table of memory ops: kvr_cuda_stage_cuda_mem
 * (cudaMallocHost, cudaMemcpyAsync on the stage's stream, an event a slot)
 * or, for tests on a machine without a GPU, kvr_cuda_stage_host_mem (plain
 * host memory standing in for device memory: malloc and memcpy, complete at
 * once) - the ring, the accounting, the back-pressure and the refusal are
 * the same code either way.
 */
#ifndef KVR_CUDA_STAGE_H
#define KVR_CUDA_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvr_cuda_stage kvr_cuda_stage_t;

struct kvr_cuda_stage_mem {
    const char *name;
    kvr_status_t (*init)(void **ctx_p, size_t n_slots);
    void (*fini)(void *ctx);
    void *(*alloc_pinned)(void *ctx, size_t bytes);
    void (*free_pinned)(void *ctx, void *p);
    /* starts copying len bytes for slot; dir 0: device -> host, 1: host -> device */
    kvr_status_t (*copy)(void *ctx, size_t slot, void *dst, const void *src, size_t len, int dir);
    /* KVR_OK when slot's copy is complete, KVR_INPROGRESS, or its error */
    kvr_status_t (*query)(void *ctx, size_t slot);
};

extern const struct kvr_cuda_stage_mem kvr_cuda_stage_cuda_mem;
extern const struct kvr_cuda_stage_mem kvr_cuda_stage_host_mem;

struct kvr_cuda_stage_config {
    const char *name;       /* for the log line: "decode0 -> prefill1" */
    const char *why;        /* why the path is staged: "UCX without CUDA support" */
    size_t slot_bytes;      /* largest block a slot takes */
    size_t n_slots;         /* ring size (>= 1) */
    bool require_gpudirect; /* the cluster file's require_gpudirect: refuse */
    const struct kvr_cuda_stage_mem *mem;
};

struct kvr_cuda_stage_stats {
    uint64_t out_ops, out_bytes; /* device -> host */
    uint64_t in_ops, in_bytes;   /* host -> device */
    uint64_t no_slot;            /* calls refused for want of a free slot */
    uint64_t max_in_use;         /* most slots held at once */
};

/** Creates a stage.  @return KVR_OK; KVR_ERR_UNSUPPORTED (require_gpudirect:
 *  err says which path and why); KVR_ERR_INVALID (zero sizes);
 *  KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_cuda_stage_create(const struct kvr_cuda_stage_config *cfg,
                                   kvr_cuda_stage_t **stage_p, char *err, size_t err_len);
void kvr_cuda_stage_destroy(kvr_cuda_stage_t *stage);

/** Starts copying len bytes of device memory src into a free slot; *slot_p
 *  names it, *host_p is its pinned memory (valid once kvr_cuda_stage_poll
 *  says the copy is done, until kvr_cuda_stage_release).
 *  @return KVR_OK; KVR_ERR_INVALID (len 0 or over slot_bytes);
 *          KVR_ERR_NO_RESOURCE (no free slot: release one and retry). */
kvr_status_t kvr_cuda_stage_out(kvr_cuda_stage_t *stage, const void *src, size_t len,
                                size_t *slot_p, void **host_p);

/** A free slot to receive len bytes into (*host_p); kvr_cuda_stage_in
 *  then copies them to device memory.  @return as kvr_cuda_stage_out. */
kvr_status_t kvr_cuda_stage_take(kvr_cuda_stage_t *stage, size_t len, size_t *slot_p,
                                 void **host_p);
/** Starts copying slot's first len bytes to device memory dst. */
kvr_status_t kvr_cuda_stage_in(kvr_cuda_stage_t *stage, size_t slot, void *dst, size_t len);

/** KVR_OK when slot's copy is complete; KVR_INPROGRESS; an error. */
kvr_status_t kvr_cuda_stage_poll(kvr_cuda_stage_t *stage, size_t slot);

/** Returns a slot (its copy complete) to the ring. */
void kvr_cuda_stage_release(kvr_cuda_stage_t *stage, size_t slot);

void kvr_cuda_stage_stats(const kvr_cuda_stage_t *stage, struct kvr_cuda_stage_stats *st);

#ifdef __cplusplus
}
#endif

#endif
