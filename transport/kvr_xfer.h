/*
 * kvr_xfer.h - the kvrail transfer engine: one-sided KV block transfers.
 *
 * The contract (DESIGN.md "Transfer engine"):
 *  - memory is registered once (kvr_xfer_mem_reg), never on the data path;
 *  - a peer is reached from its opaque, versioned address blob;
 *  - remote regions arrive as opaque, versioned rkey blobs;
 *  - descriptor lists are prepared once (validated against the registered
 *    regions, adjacent descriptors coalesced) and posted many times;
 *  - every post is non-blocking; completion is tested, or waited for with a
 *    timeout (there is no infinite wait);
 *  - a notification is delivered at the peer only after the writes posted
 *    before it, on that peer, are visible there;
 *  - errors are typed: a dead peer gives KVR_ERR_PEER_FAILURE (or
 *    KVR_ERR_TIMEOUT), after which kvr_xfer_disconnect + kvr_xfer_connect
 *    reach a restarted peer.
 *
 * Threading: an engine and everything made from it belong to one thread.
 *
 * Typical initiator:
 *
 *   kvr_xfer_engine_create(&cfg, &eng);
 *   kvr_xfer_mem_reg(eng, buf, len, KVR_MEM_HOST, 0, &mem);
 *   kvr_xfer_connect(eng, peer_addr, peer_addr_len, &peer);
 *   kvr_xfer_rmem_unpack(peer, rkey_blob, rkey_len, &rmem);
 *   kvr_xfer_dlist_prepare(peer, KVR_XFER_WRITE, descs, n, &dl);
 *   for (;;) { kvr_xfer_post(dl); kvr_xfer_wait(dl, 5000); }
 *   kvr_xfer_notify(peer, msg, msg_len);   // after the writes above
 */
#ifndef KVR_XFER_H
#define KVR_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Version of the address and rkey blob formats; a blob of another version
 *  is refused with KVR_ERR_VERSION. */
#define KVR_XFER_BLOB_VERSION 1

/** Largest notification payload, bytes. */
#define KVR_XFER_NOTIF_MAX 4096

typedef struct kvr_xfer_engine kvr_xfer_engine_t; /* one per process/thread */
typedef struct kvr_xfer_mem kvr_xfer_mem_t;       /* a registered local region */
typedef struct kvr_xfer_peer kvr_xfer_peer_t;     /* a connection to a remote engine */
typedef struct kvr_xfer_rmem kvr_xfer_rmem_t;     /* a remote region, from its rkey blob */
typedef struct kvr_xfer_dlist kvr_xfer_dlist_t;   /* a prepared descriptor list */

enum kvr_mem_kind {
    KVR_MEM_HOST = 0,
    KVR_MEM_CUDA = 1, /* device memory; device index in kvr_xfer_mem_reg */
};

enum kvr_xfer_op {
    KVR_XFER_WRITE = 0, /* local -> remote */
    KVR_XFER_READ = 1,  /* remote -> local */
};

/** Called from kvr_xfer_progress() (on the receiving engine) for every
 *  notification that arrives; msg is valid only during the call.  token is
 *  the per-pair token (KVR_XFER_TOKEN_LEN bytes) the notification came
 *  under - the one its connection presented (kvr_xfer_connect_token),
 *  checked against kvr_xfer_token_allow's when the engine has
 *  require_token - or NULL when it came with none.  A receiver that knows
 *  which token it gave to whom binds a notification to its sender with
 *  it (a registered peer holding a token of its own cannot speak for
 *  another). */
typedef void (*kvr_xfer_notif_cb_t)(void *arg, const void *msg, size_t len, const uint8_t *token);

struct kvr_xfer_config {
    const char *backend;          /* "ucx", "verbs", "loop"; NULL: the default ("ucx" if built) */
    const char *name;             /* for log lines; NULL: "xfer" */
    int require_rdma;             /* 1: a TCP or shared-memory fall-back is a start-up error
                                     (KVR_ERR_NO_RDMA) at engine create or connect */
    const char *devices;          /* optional: NICs to use (UCX_NET_DEVICES syntax for ucx,
                                     "mlx5_0,mlx5_1" or "rxe0:1" for verbs); NULL: auto */
    const char *tls;              /* optional: UCX transport list (UCX_TLS syntax); NULL: auto */
    int gid_index;                /* verbs: GID index, -1 = auto (RoCE v2, IPv4-mapped first) */
    kvr_xfer_notif_cb_t notif_cb; /* optional: notifications for this engine */
    void *notif_arg;
    int require_token; /* 1: accept only peers that present a token given to
                          kvr_xfer_token_allow (kvr_xfer_connect_token): a
                          side channel (verbs) or notification (ucx) without
                          one is refused and counted (stats.refused) */
};

/** Per-pair token: whoever introduces two engines (the router) makes one,
 *  gives it to the target (kvr_xfer_token_allow) and to the initiator
 *  (kvr_xfer_connect_token). */
#define KVR_XFER_TOKEN_LEN  16
#define KVR_XFER_TOKENS_MAX 4096 /* tokens an engine holds at once */
#define KVR_XFER_OWNER_MAX  64   /* kvr_xfer_token_allow_for's owner name, with its NUL */

/** Initializes cfg to defaults (backend NULL, gid_index -1, ...). */
void kvr_xfer_config_init(struct kvr_xfer_config *cfg);

/** Names of the backends built into this binary, NULL-terminated. */
const char *const *kvr_xfer_backends(void);

/** Creates an engine.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND (no such backend in this build);
 *          KVR_ERR_NO_RDMA (require_rdma and no RDMA device); KVR_ERR_IO;
 *          KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_xfer_engine_create(const struct kvr_xfer_config *cfg,
                                    kvr_xfer_engine_t **engine_p);

/** Destroys an engine; peers, regions and lists still open are released. */
void kvr_xfer_engine_destroy(kvr_xfer_engine_t *engine);

/** Backend name ("ucx", ...). */
const char *kvr_xfer_engine_backend(const kvr_xfer_engine_t *engine);

/** Packs this engine's address into a versioned blob (malloc'd, caller frees).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_xfer_address(kvr_xfer_engine_t *engine, void **blob_p, size_t *len_p);

/** Registers [addr, addr+len) for remote access and local use.
 *  Costly (pins pages): do it once at start-up.  len > 0; regions above 4 GiB
 *  are allowed but DESIGN.md keeps each layer slab below that.
 *  @return KVR_OK; KVR_ERR_INVALID (NULL/zero length); KVR_ERR_UNSUPPORTED
 *          (memory kind not supported by the backend/build); KVR_ERR_IO. */
kvr_status_t kvr_xfer_mem_reg(kvr_xfer_engine_t *engine, void *addr, size_t len,
                              enum kvr_mem_kind kind, int device, kvr_xfer_mem_t **mem_p);

/** Deregisters a region.  Lists that use it must have been released.
 *  A region from kvr_xfer_mem_alloc is freed too. */
void kvr_xfer_mem_dereg(kvr_xfer_mem_t *mem);

/** Allocates len bytes that the backend can reach fastest, registered
 *  (released with kvr_xfer_mem_dereg).  With UCX on one host this is shared
 *  memory the peer maps directly, which makes puts one-sided memcpys (plain
 *  malloc'd memory falls back to copies through the target's progress); the
 *  target's KV pool should come from here.  Other backends: page-aligned
 *  host memory, registered.
 *  @return KVR_OK; KVR_ERR_INVALID (zero length); KVR_ERR_UNSUPPORTED (kind);
 *          KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_xfer_mem_alloc(kvr_xfer_engine_t *engine, size_t len, enum kvr_mem_kind kind,
                                int device, kvr_xfer_mem_t **mem_p);

/** Flags of kvr_xfer_mem_reg_flags / kvr_xfer_mem_alloc_flags (0: as
 *  kvr_xfer_mem_reg / kvr_xfer_mem_alloc). */
enum kvr_xfer_mem_flags {
    /* Register without faulting the pages in (huge pages are still advised):
     * the caller pre-faults the region itself with kvr_xfer_mem_populate,
     * piece by piece and from any thread, and must not let a put or its own
     * code touch a piece before that (a first touch on the data path costs
     * a fault per page).  Lets a large pool be registered - and announced -
     * at once and be faulted in the background.  A backend that pins memory
     * at registration (verbs) faults it there regardless. */
    KVR_XFER_MEM_DEFER_PREFAULT = 1u << 0,
};

/** kvr_xfer_mem_reg with flags (enum kvr_xfer_mem_flags); KVR_ERR_INVALID
 *  for an unknown flag. */
kvr_status_t kvr_xfer_mem_reg_flags(kvr_xfer_engine_t *engine, void *addr, size_t len,
                                    enum kvr_mem_kind kind, int device, unsigned flags,
                                    kvr_xfer_mem_t **mem_p);

/** kvr_xfer_mem_alloc with flags (enum kvr_xfer_mem_flags); KVR_ERR_INVALID
 *  for an unknown flag. */
kvr_status_t kvr_xfer_mem_alloc_flags(kvr_xfer_engine_t *engine, size_t len, enum kvr_mem_kind kind,
                                      int device, unsigned flags, kvr_xfer_mem_t **mem_p);

/** Faults [offset, offset+len) of a host region in, writable, keeping its
 *  contents (MADV_POPULATE_WRITE; the pages around the range's ends are
 *  whole pages).  For a region registered with KVR_XFER_MEM_DEFER_PREFAULT.
 *  Touches no engine state: may run on any thread, concurrently with the
 *  engine's use of the rest of the region (not with its dereg), and with
 *  other populates.
 *  @return KVR_OK; KVR_ERR_INVALID (NULL, not host memory, range outside
 *          the region); KVR_ERR_NO_MEMORY (the host has no memory for it);
 *          KVR_ERR_IO (the mapping cannot be populated; logged). */
kvr_status_t kvr_xfer_mem_populate(kvr_xfer_mem_t *mem, size_t offset, size_t len);

/** Start of a registered region (the address given to kvr_xfer_mem_reg, or
 *  the memory kvr_xfer_mem_alloc allocated). */
void *kvr_xfer_mem_addr(const kvr_xfer_mem_t *mem);

/** Packs a region's remote key (address, length, kind, backend key) into a
 *  versioned blob (malloc'd, caller frees).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_xfer_mem_pack(kvr_xfer_mem_t *mem, void **blob_p, size_t *len_p);

/** Connects to the engine whose address blob is given.  Logs the transports
 *  actually selected for the connection.
 *  @return KVR_OK; KVR_ERR_INVALID / KVR_ERR_CORRUPT (truncated or damaged
 *          blob); KVR_ERR_VERSION (other blob version); KVR_ERR_MISMATCH
 *          (blob of another backend); KVR_ERR_NO_RDMA (require_rdma and the
 *          connection would use TCP or shared memory); KVR_ERR_IO. */
kvr_status_t kvr_xfer_connect(kvr_xfer_engine_t *engine, const void *blob, size_t len,
                              kvr_xfer_peer_t **peer_p);

/** kvr_xfer_connect presenting token to the target (a target created with
 *  require_token accepts the connection's side channel / notifications
 *  only when it was given the same token).  Same returns. */
kvr_status_t kvr_xfer_connect_token(kvr_xfer_engine_t *engine, const void *blob, size_t len,
                                    const uint8_t token[KVR_XFER_TOKEN_LEN],
                                    kvr_xfer_peer_t **peer_p);

/** Lets peers that present token in (kept until revoked).
 *  @return KVR_OK (also when already allowed); KVR_ERR_INVALID (NULL, all
 *          zero); KVR_ERR_NO_RESOURCE (KVR_XFER_TOKENS_MAX held). */
kvr_status_t kvr_xfer_token_allow(kvr_xfer_engine_t *engine,
                                  const uint8_t token[KVR_XFER_TOKEN_LEN]);

/** kvr_xfer_token_allow naming the peer the token is given to (owner: up
 *  to KVR_XFER_OWNER_MAX - 1 characters; NULL: unnamed): the engine's logs
 *  about the token (its revocation) name it.  Allowing a token held
 *  already renames it.  Same returns. */
kvr_status_t kvr_xfer_token_allow_for(kvr_xfer_engine_t *engine,
                                      const uint8_t token[KVR_XFER_TOKEN_LEN], const char *owner);

/** Stops accepting token for new side channels and notifications, and
 *  closes every inbound connection admitted under it (ucx: the endpoint,
 *  verbs: the side channel and its QPs) on the engine's next progress, as
 *  a refused one is: nothing more from it is delivered, the initiator's
 *  connection fails, each is counted in stats.revoked_connections, and the
 *  revocation is logged once naming the token's owner.  loop and cuda_ipc
 *  keep no connection: their notifications are checked one by one. */
void kvr_xfer_token_revoke(kvr_xfer_engine_t *engine, const uint8_t token[KVR_XFER_TOKEN_LEN]);

/** Closes a connection (without waiting on a dead peer for more than a short,
 *  bounded time).  Remote regions and lists made on it are released too. */
void kvr_xfer_disconnect(kvr_xfer_peer_t *peer);

/** KVR_OK while the peer is healthy; KVR_ERR_PEER_FAILURE once it failed. */
kvr_status_t kvr_xfer_peer_status(const kvr_xfer_peer_t *peer);

/** Declares a peer that still answers but completes nothing failed
 *  (KVR_ERR_TIMEOUT, logged with why): posts on it fail, and releasing its
 *  lists or disconnecting it no longer waits for the writes in flight beyond
 *  the short bound kept for a dead peer.  For a caller whose own deadline
 *  for those writes has passed. */
void kvr_xfer_peer_abort(kvr_xfer_peer_t *peer, const char *why);

/** Human-readable description of the transports the connection uses
 *  (e.g. "rc_mlx5/mlx5_0:1", "tcp/lo", "posix/memory"). */
const char *kvr_xfer_peer_transports(const kvr_xfer_peer_t *peer);

/** One rail (a local NIC paired with a remote one) of a connection. */
struct kvr_xfer_rail_stats {
    char local[48];      /* "rxe0:1" */
    char remote[48];     /* the target's device, "rxe1:1" */
    uint64_t bytes;      /* data bytes posted on the rail (again after a failover) */
    uint64_t bytes_done; /* of those, completed on the rail */
    uint64_t failovers;  /* times the rail failed and its transfers moved to others */
    uint32_t down;       /* 1: failed, resting or being probed; carries nothing */
    uint32_t notif;      /* 1: the rail notifications are sent on now */
};

/** The rails of a connection (verbs; 0 for backends without rails): fills
 *  up to cap entries and returns how many rails the connection has. */
size_t kvr_xfer_peer_rails(const kvr_xfer_peer_t *peer, struct kvr_xfer_rail_stats *rails,
                           size_t cap);

/** Unpacks a remote key blob received from the peer.
 *  @return KVR_OK; KVR_ERR_INVALID / KVR_ERR_CORRUPT; KVR_ERR_VERSION;
 *          KVR_ERR_MISMATCH; KVR_ERR_PEER_FAILURE; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_xfer_rmem_unpack(kvr_xfer_peer_t *peer, const void *blob, size_t len,
                                  kvr_xfer_rmem_t **rmem_p);

/** Releases a remote region. */
void kvr_xfer_rmem_release(kvr_xfer_rmem_t *rmem);

/** Size of a remote region in bytes. */
uint64_t kvr_xfer_rmem_len(const kvr_xfer_rmem_t *rmem);

/** One transfer descriptor: len bytes between lmem+loff and rmem+roff. */
struct kvr_xfer_desc {
    kvr_xfer_mem_t *lmem;
    uint64_t loff;
    kvr_xfer_rmem_t *rmem;
    uint64_t roff;
    uint64_t len;
};

/** Prepares a descriptor list on one peer.  Every descriptor is checked
 *  against its regions; runs of descriptors adjacent in both the local and
 *  the remote region are coalesced into one.  The list may be posted any
 *  number of times, one post in flight at a time.
 *  @return KVR_OK; KVR_ERR_INVALID (n == 0, zero length, NULL region, region
 *          of another engine or peer); KVR_ERR_OUT_OF_RANGE (outside a
 *          registered region); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_xfer_dlist_prepare(kvr_xfer_peer_t *peer, enum kvr_xfer_op op,
                                    const struct kvr_xfer_desc *descs, size_t n,
                                    kvr_xfer_dlist_t **dlist_p);

/** Releases a list; an in-flight post is waited for a bounded time first. */
void kvr_xfer_dlist_release(kvr_xfer_dlist_t *dlist);

/** Number of descriptors as given and after coalescing. */
size_t kvr_xfer_dlist_count(const kvr_xfer_dlist_t *dlist, size_t *coalesced_p);

/** Posts a prepared list.  Never blocks: a full send queue is retried inside
 *  the backend on progress.
 *  @return KVR_INPROGRESS (posted); KVR_OK (already complete);
 *          KVR_ERR_BUSY (the previous post of this list is still in flight);
 *          KVR_ERR_PEER_FAILURE; KVR_ERR_IO. */
kvr_status_t kvr_xfer_post(kvr_xfer_dlist_t *dlist);

/** Tests the last post of a list (does not progress the engine).
 *  Complete means LOCAL completion: for a WRITE list, the source buffer may
 *  be reused; remote visibility is guaranteed by kvr_xfer_notify ordering
 *  (a notification arrives only after the writes posted before it are
 *  visible) and by kvr_xfer_flush.  A READ list is complete when the data
 *  is in local memory (that is visibility already).
 *  @return KVR_OK (complete); KVR_INPROGRESS; an error of the transfer
 *          (KVR_ERR_PEER_FAILURE, KVR_ERR_IO, KVR_ERR_CANCELED, ...). */
kvr_status_t kvr_xfer_test(const kvr_xfer_dlist_t *dlist);

/** Progresses the engine until the list's last post completes (locally, as
 *  kvr_xfer_test) or timeout_ms passes.
 *  @return as kvr_xfer_test; KVR_ERR_TIMEOUT. */
kvr_status_t kvr_xfer_wait(kvr_xfer_dlist_t *dlist, int timeout_ms);

/** Sends a notification to the peer.  It is delivered (to the peer engine's
 *  notif_cb) only after every write posted before it on this peer is visible
 *  in the peer's memory.  Non-blocking.
 *  @return KVR_OK (queued or sent); KVR_ERR_INVALID (len > KVR_XFER_NOTIF_MAX);
 *          KVR_ERR_PEER_FAILURE; KVR_ERR_IO. */
kvr_status_t kvr_xfer_notify(kvr_xfer_peer_t *peer, const void *msg, size_t len);

/** Progresses until every post and notification queued on the peer has
 *  completed and every write posted on it is visible in the peer's memory,
 *  or timeout_ms passes.
 *  @return KVR_OK; KVR_ERR_TIMEOUT; KVR_ERR_PEER_FAILURE. */
kvr_status_t kvr_xfer_flush(kvr_xfer_peer_t *peer, int timeout_ms);

/** Makes progress on every connection: completes transfers, delivers
 *  notifications, detects peer failures.  Returns the number of events
 *  handled (0 when idle). */
int kvr_xfer_progress(kvr_xfer_engine_t *engine);

/** A file descriptor that becomes readable when the engine has work for
 *  kvr_xfer_progress() (for poll/epoll loops).
 *  @return KVR_OK; KVR_ERR_UNSUPPORTED (then poll with a short timeout). */
kvr_status_t kvr_xfer_event_fd(kvr_xfer_engine_t *engine, int *fd_p);

/** Per-transfer telemetry of the last completed post of a list. */
struct kvr_xfer_stats {
    uint32_t ndesc;           /* descriptors as given */
    uint32_t ndesc_coalesced; /* descriptors posted */
    uint64_t bytes;
    uint64_t post_ns;     /* time spent inside kvr_xfer_post (see post_timed) */
    uint64_t complete_ns; /* post start -> completion observed */
    uint32_t post_timed;  /* 1: post_ns was measured on this post; 0: it is an earlier
                             post's (a post left in flight is timed on every
                             KVR_XFER_POST_SAMPLE-th post of its list and its first:
                             one clock read per post on the hot path) */
};

/** Posts of a list between two timed ones (see kvr_xfer_stats.post_timed). */
#define KVR_XFER_POST_SAMPLE 8

/** Telemetry of the list's last post (complete_ns 0 while in flight). */
void kvr_xfer_dlist_stats(const kvr_xfer_dlist_t *dlist, struct kvr_xfer_stats *stats_p);

/** Engine-wide counters (since create). */
struct kvr_xfer_engine_stats {
    uint64_t posts;
    uint64_t bytes_written;
    uint64_t bytes_read;
    uint64_t notifs_sent;
    uint64_t notifs_received;
    uint64_t errors;
    uint64_t failovers; /* verbs: rails that failed with their transfers moved to others */
    uint64_t refused;   /* require_token: side channels / notifications without a token */
    uint64_t refused_connections; /* require_token, ucx: inbound endpoints closed at connect
                                     (a HELLO without an allowed token, or none in time) */
    uint64_t revoked_connections; /* ucx, verbs: inbound connections closed because the token
                                     they were admitted under was revoked */
};
void kvr_xfer_engine_stats(const kvr_xfer_engine_t *engine, struct kvr_xfer_engine_stats *stats_p);

#ifdef __cplusplus
}
#endif
#endif
