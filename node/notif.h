/*
 * notif.h - the P -> D notification (HELLO, KV_READY, KV_ABORT,
 * KV_PROGRESS) and its
 * wire encoding.
 *
 * A prefill node sends these on the transfer peer after its KV writes
 * (kvr_xfer_notify orders them after the writes), so they are the one
 * message between two nodes that does not go through the router.  They are
 * encoded explicitly, little endian, field by field (never a C struct on
 * the wire, whose padding and byte order depend on the compiler and the
 * host), like the transport's address blobs:
 *
 *   offset size  field
 *        0    4  magic "KVRN" (0x4e52564b, little endian)
 *        4    2  version (KVR_NOTIF_VERSION)
 *        6    2  kind (enum kvr_notif_kind)
 *        8    4  endianness marker 0x01020304, written little endian
 *       12    4  body length in bytes (what follows this header)
 *       16    .  body: request_id u64, incarnation u64, fingerprint u64,
 *                bytes u64, n_layers i32, n_kv_heads i32, head_dim i32,
 *                block_size i32, dtype i32, proto_version u32,
 *                first_token i32, logprob f32 (IEEE bits), n_tokens u32,
 *                cached_tokens u32, status i32, first_block u32,
 *                attempt u32, n_top u8, node name length u16, node name
 *                bytes (no NUL), then n_top times {token i32, logprob f32}
 *                (the first token's most likely alternatives, KV_READY)
 *
 * The decoder checks every one of these (magic, marker, version, kind,
 * that the body length is what the buffer holds and what the fields need,
 * the name's length) and says which one was wrong.
 */
#ifndef KVR_NODE_NOTIF_H
#define KVR_NODE_NOTIF_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_cluster.h"
#include "kvr_status.h"

#define KVR_NOTIF_MAGIC    0x4e52564bu /* "KVRN" */
#define KVR_NOTIF_VERSION  4           /* 1 was the raw C struct; 2 had no attempt; 3 no n_top */
#define KVR_NOTIF_ENDIAN   0x01020304u
#define KVR_NOTIF_HDR_LEN  16
#define KVR_NOTIF_BODY_MIN 87 /* the fixed fields, before the name */
#define KVR_NOTIF_MAX_TOP  20 /* alternatives of the first token (KVR_SAMPLE_MAX_TOP_LOGPROBS) */
#define KVR_NOTIF_WIRE_MAX                                                                         \
    (KVR_NOTIF_HDR_LEN + KVR_NOTIF_BODY_MIN + KVR_CLUSTER_NAME_MAX + 8 * KVR_NOTIF_MAX_TOP)

enum kvr_notif_kind {
    KVR_NOTIF_HELLO = 1,       /* first message on a new peer: layout + fingerprint */
    KVR_NOTIF_KV_READY = 2,    /* every layer of a request written; first token */
    KVR_NOTIF_KV_ABORT = 3,    /* the request stopped; no more writes will follow */
    KVR_NOTIF_KV_PROGRESS = 4, /* still queued or computing on P: renew the lease */
};

/* The decoded notification (host representation). */
struct kvr_notif {
    uint16_t kind;
    uint64_t request_id;
    uint64_t incarnation; /* of the sender */
    char node[KVR_CLUSTER_NAME_MAX];
    /* HELLO */
    uint64_t fingerprint;
    int32_t n_layers, n_kv_heads, head_dim, block_size, dtype;
    uint32_t proto_version;
    /* KV_READY */
    int32_t first_token;
    float logprob;
    uint32_t n_tokens; /* prompt tokens */
    uint32_t cached_tokens;
    uint64_t bytes;       /* bytes written for the request */
    int32_t status;       /* KV_ABORT: why */
    uint32_t first_block; /* KV_READY/KV_ABORT: the decode node's block id of the first
                             uncached block: tells two dispatches of one request apart */
    uint32_t attempt;     /* KV_READY/KV_ABORT/KV_PROGRESS: the Prefill's attempt on this
                             reservation (a retry elsewhere counts it up; an older
                             attempt's notification is ignored) */
    uint8_t n_top;        /* KV_READY: top_ids/top_lps entries (<= KVR_NOTIF_MAX_TOP) */
    int32_t top_ids[KVR_NOTIF_MAX_TOP];
    float top_lps[KVR_NOTIF_MAX_TOP];
};

/** Encodes n into buf (at least KVR_NOTIF_WIRE_MAX bytes are always enough).
 *  @return the encoded length; 0 when cap is too small, n->node is longer
 *          than KVR_CLUSTER_NAME_MAX - 1 bytes or n_top > KVR_NOTIF_MAX_TOP. */
size_t kvr_notif_encode(const struct kvr_notif *n, void *buf, size_t cap);

/** Decodes len bytes at buf into *n_p (set only on success); err receives
 *  what was wrong.
 *  @return KVR_OK; KVR_ERR_INVALID (truncated, bad magic, wrong endianness
 *          marker, unknown kind, body length that disagrees with the buffer,
 *          node name too long, n_top > KVR_NOTIF_MAX_TOP); KVR_ERR_MISMATCH (another version). */
kvr_status_t kvr_notif_decode(const void *buf, size_t len, struct kvr_notif *n_p, char *err,
                              size_t err_len);

#endif
