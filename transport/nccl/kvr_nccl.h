/*
 * kvr_nccl.h - NCCL between one prefill and one decode node: the pair's
 * communicator (two ranks: P is 0, D is 1), set up from an id blob one side
 * makes and the other receives (in the P/D address exchange), and KV blocks
 * moved GPU to GPU by ncclSend / ncclRecv on the pair's stream - for
 * clusters whose GPUs reach each other without GPUDirect RDMA in verbs.
 *
 * Not a transfer backend (kvr_xfer.h) yet: NCCL is two-sided, so the decode
 * side must post the receive of each block it expects; the node protocol
 * that tells it which (kvrail.proto's KV-ready notice carries the block
 * ids) is the next step.  One GPU a rank: NCCL refuses two ranks of one
 * communicator on the same GPU, so the pair needs two GPUs to run.
 */
#ifndef KVR_NCCL_H
#define KVR_NCCL_H

#include <stddef.h>
#include <stdint.h>
#include <nccl.h>

#include "kvr_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVR_NCCL_BLOB_VERSION 1

typedef struct kvr_nccl_pair kvr_nccl_pair_t;

/** The one mapping of ncclResult_t: ncclSuccess -> KVR_OK, ncclInProgress
 *  -> KVR_INPROGRESS, invalid argument/usage -> KVR_ERR_INVALID, system /
 *  CUDA errors -> KVR_ERR_IO, remote error -> KVR_ERR_PEER_FAILURE, others
 *  -> KVR_ERR_INTERNAL. */
kvr_status_t kvr_nccl_status(ncclResult_t r);

/** The id blob of a unique id: magic, blob version, the NCCL version of
 *  this build, the id (fixed size: KVR_NCCL_BLOB_LEN bytes). */
#define KVR_NCCL_BLOB_LEN (16 + NCCL_UNIQUE_ID_BYTES)
void kvr_nccl_blob_pack(const ncclUniqueId *id, unsigned char blob[KVR_NCCL_BLOB_LEN]);

/** A new unique id (ncclGetUniqueId) packed into blob. */
kvr_status_t kvr_nccl_blob_new(unsigned char blob[KVR_NCCL_BLOB_LEN], char *err, size_t err_len);

/** Checks a received blob and extracts its id.
 *  @return KVR_OK; KVR_ERR_INVALID (length, magic); KVR_ERR_VERSION (blob
 *          version, or another NCCL major version than this build's). */
kvr_status_t kvr_nccl_blob_parse(const void *blob, size_t len, ncclUniqueId *id_p, char *err,
                                 size_t err_len);

/** Joins the pair's communicator as rank (0: P, 1: D) on the process's GPU
 *  (kvr_cuda_device_open first), waiting at most timeout_ms for the other
 *  rank (non-blocking init, polled).
 *  @return KVR_OK; KVR_ERR_TIMEOUT; an NCCL error mapped. */
kvr_status_t kvr_nccl_pair_open(const ncclUniqueId *id, int rank, int timeout_ms,
                                kvr_nccl_pair_t **pair_p, char *err, size_t err_len);
void kvr_nccl_pair_close(kvr_nccl_pair_t *pair);

/** Sends (rank 0) or receives (rank 1) n blocks of len bytes each, in one
 *  NCCL group on the pair's stream; the blocks of both sides must match in
 *  order and size.  Asynchronous: kvr_nccl_pair_wait. */
kvr_status_t kvr_nccl_pair_move(kvr_nccl_pair_t *pair, void *const *blocks, size_t n, size_t len);

/** Waits (polling, at most timeout_ms) for every move so far.
 *  @return KVR_OK; KVR_ERR_TIMEOUT; an error. */
kvr_status_t kvr_nccl_pair_wait(kvr_nccl_pair_t *pair, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif
