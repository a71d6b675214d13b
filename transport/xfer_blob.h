/*
 * xfer_blob.h - framing of the opaque address and rkey blobs (private to
 * transport/ and its tests).
 *
 * Every blob is a 24-byte little-endian header followed by the payload:
 *
 *   off  size  field
 *     0     4  magic        "KVRX" (0x5852564b)
 *     4     2  version      KVR_XFER_BLOB_VERSION
 *     6     2  backend id   kvr_xfer_ops.id (loop 1, ucx 2, verbs 3)
 *     8     2  kind         1 address, 2 rkey
 *    10     2  flags        0
 *    12     4  payload length, bytes
 *    16     8  XXH64 (seed 0) of bytes 0..15 followed by the payload
 *    24     n  payload
 *
 * magic and version sit at fixed offsets forever, so that any later version
 * is recognised as such (KVR_ERR_VERSION) before its layout is interpreted.
 * The rkey payload starts with a 24-byte region header (remote address,
 * length, memory kind, backend key length) and then the backend's key.
 */
#ifndef KVR_XFER_BLOB_H
#define KVR_XFER_BLOB_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#define KVR_XFER_BLOB_MAGIC   0x5852564bu /* "KVRX" little-endian */
#define KVR_XFER_BLOB_HDR_LEN 24u
#define KVR_XFER_BLOB_MAX     (16u << 20) /* sanity bound on a payload */
#define KVR_XFER_RKEY_HDR_LEN 24u

enum kvr_xfer_blob_kind {
    KVR_XFER_BLOB_ADDRESS = 1,
    KVR_XFER_BLOB_RKEY = 2,
};

/** Frames a payload into a blob (malloc'd, caller frees).
 *  @return KVR_OK; KVR_ERR_INVALID (payload too large); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_xfer_blob_frame(uint16_t backend_id, uint16_t kind, const void *payload,
                                 size_t payload_len, void **blob_p, size_t *len_p);

/** Checks a blob and returns a pointer to its payload (inside blob).
 *  @return KVR_OK; KVR_ERR_INVALID (NULL, truncated, trailing bytes, wrong
 *          kind); KVR_ERR_CORRUPT (bad magic or checksum); KVR_ERR_VERSION;
 *          KVR_ERR_MISMATCH (blob of another backend).  why_p, when not NULL,
 *          gets a constant description of the failure. */
kvr_status_t kvr_xfer_blob_parse(uint16_t backend_id, uint16_t kind, const void *blob, size_t len,
                                 const void **payload_p, size_t *payload_len_p, const char **why_p);

/** XXH64 checksum as stored in the header (for tests that craft blobs). */
uint64_t kvr_xfer_blob_checksum(const void *blob, size_t len);

#endif
