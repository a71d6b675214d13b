/*
 * nccl_pair.c - the (P, D) pair communicator of kvr_nccl.h.
 *
 * The blob: "KVNC", the blob version (u16), the NCCL version code of this
 * build (u32, so two builds of different NCCL majors refuse each other
 * instead of hanging in init), 6 bytes reserved, the 128-byte unique id.
 * The communicator is initialized non-blocking (ncclConfig_t.blocking = 0)
 * and polled with ncclCommGetAsyncError against a deadline, so a peer that
 * never joins gives KVR_ERR_TIMEOUT, not a hang.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "kvr_clock.h"
#include "kvr_cuda.h"
#include "kvr_log.h"
#include "kvr_nccl.h"

#define COMP "nccl"

struct kvr_nccl_pair {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t done;
    int rank;
};

kvr_status_t kvr_nccl_status(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return KVR_OK;
    case ncclInProgress:
        return KVR_INPROGRESS;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return KVR_ERR_INVALID;
    case ncclSystemError:
    case ncclUnhandledCudaError:
        return KVR_ERR_IO;
    case ncclRemoteError:
        return KVR_ERR_PEER_FAILURE;
    default:
        return KVR_ERR_INTERNAL;
    }
}

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void kvr_nccl_blob_pack(const ncclUniqueId *id, unsigned char blob[KVR_NCCL_BLOB_LEN])
{
    memset(blob, 0, KVR_NCCL_BLOB_LEN);
    memcpy(blob, "KVNC", 4);
    put16(blob + 4, KVR_NCCL_BLOB_VERSION);
    put32(blob + 6, NCCL_VERSION_CODE);
    memcpy(blob + 16, id->internal, NCCL_UNIQUE_ID_BYTES);
}

kvr_status_t kvr_nccl_blob_new(unsigned char blob[KVR_NCCL_BLOB_LEN], char *err, size_t err_len)
{
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        snprintf(err, err_len, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return kvr_nccl_status(r);
    }
    kvr_nccl_blob_pack(&id, blob);
    return KVR_OK;
}

kvr_status_t kvr_nccl_blob_parse(const void *blob, size_t len, ncclUniqueId *id_p, char *err,
                                 size_t err_len)
{
    const unsigned char *b = blob;
    if (!b || len != KVR_NCCL_BLOB_LEN) {
        snprintf(err, err_len, "nccl id blob of %zu bytes, want %d", len, KVR_NCCL_BLOB_LEN);
        return KVR_ERR_INVALID;
    }
    if (memcmp(b, "KVNC", 4) != 0) {
        snprintf(err, err_len, "not an nccl id blob (magic)");
        return KVR_ERR_INVALID;
    }
    unsigned v = (unsigned)b[4] | (unsigned)b[5] << 8;
    if (v != KVR_NCCL_BLOB_VERSION) {
        snprintf(err, err_len, "nccl id blob version %u, this build speaks %d", v,
                 KVR_NCCL_BLOB_VERSION);
        return KVR_ERR_VERSION;
    }
    uint32_t nv = get32(b + 6);
    if (nv / 10000 != NCCL_VERSION_CODE / 10000) {
        snprintf(err, err_len,
                 "the peer's NCCL is %u.%u, this build's %d.%d: one major version a "
                 "cluster",
                 nv / 10000, nv / 100 % 100, NCCL_VERSION_CODE / 10000,
                 NCCL_VERSION_CODE / 100 % 100);
        return KVR_ERR_VERSION;
    }
    memcpy(id_p->internal, b + 16, NCCL_UNIQUE_ID_BYTES);
    return KVR_OK;
}

kvr_status_t kvr_nccl_pair_open(const ncclUniqueId *id, int rank, int timeout_ms,
                                kvr_nccl_pair_t **pair_p, char *err, size_t err_len)
{
    if (rank != 0 && rank != 1) {
        snprintf(err, err_len, "nccl pair: rank %d (0 = prefill, 1 = decode)", rank);
        return KVR_ERR_INVALID;
    }
    kvr_status_t s = kvr_cuda_bind();
    if (s != KVR_OK) {
        snprintf(err, err_len, "nccl pair: no GPU opened in this process");
        return s;
    }
    kvr_nccl_pair_t *p = calloc(1, sizeof *p);
    if (!p)
        return KVR_ERR_NO_MEMORY;
    p->rank = rank;
    cudaError_t ce = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        snprintf(err, err_len, "nccl pair: %s", cudaGetErrorString(ce));
        kvr_nccl_pair_close(p);
        return kvr_cuda_status(ce);
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&p->comm, 2, *id, rank, &cfg);
    uint64_t end = kvr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (r == ncclInProgress || r == ncclSuccess) {
        ncclResult_t st = ncclSuccess;
        if (p->comm && ncclCommGetAsyncError(p->comm, &st) != ncclSuccess)
            st = ncclInternalError;
        if (st != ncclInProgress) {
            r = st;
            break;
        }
        if (kvr_now_ns() > end) {
            snprintf(err, err_len, "nccl pair: rank %d: the other rank did not join in %d ms", rank,
                     timeout_ms);
            kvr_nccl_pair_close(p);
            return KVR_ERR_TIMEOUT;
        }
    }
    if (r != ncclSuccess) {
        snprintf(err, err_len, "nccl pair: rank %d: %s", rank, ncclGetErrorString(r));
        kvr_nccl_pair_close(p);
        return kvr_nccl_status(r);
    }
    KVR_LOG_INFO(COMP, "pair communicator up (rank %d of 2)", rank);
    *pair_p = p;
    return KVR_OK;
}

void kvr_nccl_pair_close(kvr_nccl_pair_t *p)
{
    if (!p)
        return;
    if (p->comm)
        ncclCommAbort(p->comm);
    if (p->done)
        cudaEventDestroy(p->done);
    if (p->stream)
        cudaStreamDestroy(p->stream);
    free(p);
}

kvr_status_t kvr_nccl_pair_move(kvr_nccl_pair_t *p, void *const *blocks, size_t n, size_t len)
{
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; r == ncclSuccess && i < n; i++)
        r = p->rank == 0 ? ncclSend(blocks[i], len, ncclUint8, 1, p->comm, p->stream)
                         : ncclRecv(blocks[i], len, ncclUint8, 0, p->comm, p->stream);
    ncclResult_t g = ncclGroupEnd();
    if (r == ncclSuccess)
        r = g;
    if (r != ncclSuccess && r != ncclInProgress) {
        KVR_LOG_ERROR(COMP, "move of %zu blocks: %s", n, ncclGetErrorString(r));
        return kvr_nccl_status(r);
    }
    KVR_CUDA_CHECK(cudaEventRecord(p->done, p->stream));
    return KVR_OK;
}

kvr_status_t kvr_nccl_pair_wait(kvr_nccl_pair_t *p, int timeout_ms)
{
    uint64_t end = kvr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        cudaError_t q = cudaEventQuery(p->done);
        if (q == cudaSuccess)
            return KVR_OK;
        if (q != cudaErrorNotReady)
            return kvr_cuda_fail(q, "nccl move", __FILE__, __LINE__);
        ncclResult_t st;
        if (ncclCommGetAsyncError(p->comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress) {
            KVR_LOG_ERROR(COMP, "pair: %s", ncclGetErrorString(st));
            return kvr_nccl_status(st);
        }
        if (kvr_now_ns() > end)
            return KVR_ERR_TIMEOUT;
    }
}
