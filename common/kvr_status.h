/*
 * kvr_status.h - the one status type of kvrail.
 *
 * Modelled on UCX's ucs_status_t: KVR_OK is 0, KVR_INPROGRESS is positive,
 * every error is negative.  Each backend maps its native codes (errno,
 * ucs_status_t, ibv_wc_status, cudaError_t) to these in exactly one function.
 */
#ifndef KVR_STATUS_H
#define KVR_STATUS_H

typedef enum kvr_status {
    KVR_OK = 0,
    KVR_INPROGRESS = 1, /* operation posted, not yet complete */

    KVR_ERR_INVALID = -1,      /* bad argument or malformed input */
    KVR_ERR_NO_MEMORY = -2,    /* allocation failed */
    KVR_ERR_NO_RESOURCE = -3,  /* back-pressure: retry later */
    KVR_ERR_TIMEOUT = -4,      /* a bounded wait expired */
    KVR_ERR_PEER_FAILURE = -5, /* the remote side died or its QP/endpoint failed */
    KVR_ERR_UNSUPPORTED = -6,  /* operation not implemented by this backend */
    KVR_ERR_IO = -7,           /* local I/O or transport error */
    KVR_ERR_VERSION = -8,      /* peer speaks another protocol/blob version */
    KVR_ERR_OUT_OF_RANGE = -9, /* offset/length outside a registered region */
    KVR_ERR_NOT_FOUND = -10,   /* no such object, file, key, tensor */
    KVR_ERR_CANCELED = -11,    /* canceled by the caller or a peer */
    KVR_ERR_OVERLOAD = -12,    /* queue full / capacity exhausted past the queue timeout */
    KVR_ERR_MISMATCH = -13,    /* layouts/fingerprints of two ends disagree */
    KVR_ERR_BUSY = -14,        /* object still in use */
    KVR_ERR_CORRUPT = -15,     /* checksum or structural corruption detected */
    KVR_ERR_NO_RDMA = -16,     /* require_rdma set but only TCP/shm transports found */
    KVR_ERR_CLOSED = -17,      /* object was shut down */
    KVR_ERR_INTERNAL = -18,    /* a bug: an invariant did not hold */
} kvr_status_t;

#define KVR_STATUS_IS_ERR(s) ((s) < 0)

/** Returns a constant, human-readable name for a status ("timeout", ...).
 *  Unknown values give "unknown status". Never NULL. */
const char *kvr_status_str(kvr_status_t status);

/** Returns the symbolic name ("KVR_ERR_TIMEOUT"), or "KVR_?" when unknown. */
const char *kvr_status_name(kvr_status_t status);

#endif
