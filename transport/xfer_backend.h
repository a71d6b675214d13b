/*
 * xfer_backend.h - what a transfer backend implements.  Only backends and
 * the core (xfer.c) include this file.
 *
 * The core owns validation, blob framing (magic, version, backend id,
 * checksum), descriptor coalescing, telemetry and timeouts.  A backend sees
 * only well-formed objects: it allocates nothing for the base objects
 * itself; the core callocs `*_size` bytes for each object, fills the base
 * struct (always the first member of the backend's struct, reached back with
 * container_of) and calls the backend's init op.
 *
 * Optional ops are marked; the core fills the missing ones with stubs that
 * return KVR_ERR_UNSUPPORTED.
 */
#ifndef KVR_XFER_BACKEND_H
#define KVR_XFER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_config.h"
#include "kvr_xfer.h"

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

struct kvr_xfer_ops;

/* Core-private intrusive list link: the core tracks every object so that
 * destroy/disconnect can release what is still open.  Backends leave it alone. */
struct kvr_xfer_link {
    struct kvr_xfer_link *prev, *next;
};

struct kvr_xfer_engine {
    const struct kvr_xfer_ops *ops;
    struct kvr_xfer_config cfg; /* copied; strings below are owned copies */
    char name[64];
    char devices[256];
    char tls[256];
    struct kvr_xfer_engine_stats stats;
    struct kvr_xfer_link mems, peers;      /* core-private */
    uint8_t (*tokens)[KVR_XFER_TOKEN_LEN]; /* kvr_xfer_token_allow's (xfer_token.c) */
    char (*owners)[KVR_XFER_OWNER_MAX];    /* whom each was given to (logs) */
    size_t ntokens;
};

struct kvr_xfer_mem {
    kvr_xfer_engine_t *engine;
    void *addr;
    size_t len;
    enum kvr_mem_kind kind;
    int device;
    struct kvr_xfer_link link; /* core-private */
    void *core_alloc;          /* core-private: memory the core allocated for mem_alloc */
};

struct kvr_xfer_peer {
    kvr_xfer_engine_t *engine;
    kvr_status_t status;  /* KVR_OK or the sticky failure */
    char transports[256]; /* filled by connect: what the link really uses */
    uint32_t inflight;    /* posts + notifications not yet complete (backend keeps it) */
    uint8_t token[KVR_XFER_TOKEN_LEN];        /* presented to the target (zeros: none) */
    struct kvr_xfer_link link, rmems, dlists; /* core-private */
};

struct kvr_xfer_rmem {
    kvr_xfer_peer_t *peer;
    uint64_t addr; /* remote virtual address of offset 0 */
    uint64_t len;
    enum kvr_mem_kind kind;
    struct kvr_xfer_link link; /* core-private */
};

/* A coalesced descriptor as the backend posts it. */
struct kvr_xfer_seg {
    kvr_xfer_mem_t *lmem;
    kvr_xfer_rmem_t *rmem;
    void *laddr;    /* lmem->addr + loff */
    uint64_t raddr; /* rmem->addr + roff */
    uint64_t len;
};

struct kvr_xfer_dlist {
    kvr_xfer_peer_t *peer;
    enum kvr_xfer_op op;
    size_t ndesc; /* as given */
    size_t nseg;  /* after coalescing */
    struct kvr_xfer_seg *segs;
    uint64_t bytes;
    /* state of the last post: the backend sets status to KVR_OK or an error
     * when it completes and calls kvr_xfer_dlist_complete(). */
    kvr_status_t status; /* KVR_OK initially (nothing in flight) */
    bool inflight;
    uint64_t t_post_ns;
    uint64_t nposts; /* posts so far: every KVR_XFER_POST_SAMPLE-th is timed */
    struct kvr_xfer_stats stats;
    struct kvr_xfer_link link; /* core-private */
};

struct kvr_xfer_ops {
    const char *name;
    uint16_t id; /* in blobs: refuse another backend's blob */
    size_t engine_size, mem_size, peer_size, rmem_size, dlist_size;

    kvr_status_t (*engine_init)(kvr_xfer_engine_t *e);
    void (*engine_fini)(kvr_xfer_engine_t *e);
    /* payload of the address blob; *buf_p malloc'd */
    kvr_status_t (*address)(kvr_xfer_engine_t *e, void **buf_p, size_t *len_p);

    kvr_status_t (*mem_reg)(kvr_xfer_mem_t *m);
    void (*mem_dereg)(kvr_xfer_mem_t *m);
    /* backend part of the rkey blob (the core adds addr/len/kind); malloc'd */
    kvr_status_t (*mem_pack)(kvr_xfer_mem_t *m, void **buf_p, size_t *len_p);

    kvr_status_t (*connect)(kvr_xfer_peer_t *p, const void *addr, size_t len);
    void (*disconnect)(kvr_xfer_peer_t *p);

    kvr_status_t (*rmem_unpack)(kvr_xfer_rmem_t *r, const void *buf, size_t len);
    void (*rmem_release)(kvr_xfer_rmem_t *r);

    kvr_status_t (*dlist_prepare)(kvr_xfer_dlist_t *d); /* optional: default none */
    void (*dlist_release)(kvr_xfer_dlist_t *d);         /* optional: default none */
    /* posts d->segs; returns KVR_INPROGRESS or KVR_OK (done) or an error.
     * Completion later: set d->status, call kvr_xfer_dlist_complete(d). */
    kvr_status_t (*post)(kvr_xfer_dlist_t *d);

    kvr_status_t (*notify)(kvr_xfer_peer_t *p, const void *msg, size_t len);
    /* true when every operation on p has completed (or p failed) */
    bool (*peer_idle)(kvr_xfer_peer_t *p);
    int (*progress)(kvr_xfer_engine_t *e);
    kvr_status_t (*event_fd)(kvr_xfer_engine_t *e, int *fd_p); /* optional: default unsupported */
    /* allocates and registers m->len bytes of m->kind, sets m->addr; mem_dereg
     * frees it.  optional: default the core allocates page-aligned host
     * memory, calls mem_reg, and frees it after mem_dereg */
    kvr_status_t (*mem_alloc)(kvr_xfer_mem_t *m);
    /* stops remote access to the engine's memory before kvr_xfer_engine_destroy
     * deregisters it (peers then see the engine go away, not a bad key), and
     * lets what is in flight finish, bounded.  optional: default none */
    void (*engine_quiesce)(kvr_xfer_engine_t *e);
    /* the connection's rails (kvr_xfer_peer_rails).  optional: default none */
    size_t (*peer_rails)(const kvr_xfer_peer_t *p, struct kvr_xfer_rail_stats *rails, size_t cap);
    /* token was revoked (no longer in the engine's table): marks every
     * inbound connection admitted under it refused, to be closed by a later
     * progress (counted in stats.revoked_connections then; UCX: once it
     * speaks again, ucx_hello.c says why) and returns how many.  Called outside the backend's
     * callbacks or inside the notification callback: closes nothing itself.  optional: default none
     * (a backend that checks every notification as it comes) */
    size_t (*token_revoked)(kvr_xfer_engine_t *e, const uint8_t *token);
};

/* --- services of the core, for backends --- */

/** Marks the list's post complete with status s (KVR_OK or an error) and
 *  records telemetry.  Safe to call from inside progress or post. */
void kvr_xfer_dlist_complete(kvr_xfer_dlist_t *d, kvr_status_t s);

/** Marks a peer failed (sticky) and logs it once. */
void kvr_xfer_peer_fail(kvr_xfer_peer_t *p, kvr_status_t s, const char *why);

/** Whether the KVR_XFER_TOKEN_LEN bytes at t are all zero (no token). */
bool kvr_xfer_token_is_zero(const uint8_t *t);
/** Whether two tokens (KVR_XFER_TOKEN_LEN bytes each) are equal, compared
 *  without an early exit: use it wherever a token is checked. */
bool kvr_xfer_token_equal(const uint8_t *a, const uint8_t *b);
/** require_token: whether token (KVR_XFER_TOKEN_LEN bytes, or NULL for
 *  none) is one the engine was given; counts a refusal in stats.refused.
 *  Always true without require_token. */
bool kvr_xfer_token_ok(kvr_xfer_engine_t *e, const uint8_t *token);
/** Whether token (KVR_XFER_TOKEN_LEN bytes) is one the engine was given;
 *  counts nothing. */
bool kvr_xfer_token_allowed(const kvr_xfer_engine_t *e, const uint8_t *token);
/** Counts a refused peer or message in stats.refused and logs why (the
 *  first, then every 1000th). */
void kvr_xfer_refused(kvr_xfer_engine_t *e, const char *why);
/** Frees the engine's tokens (engine destroy). */
void kvr_xfer_tokens_free(kvr_xfer_engine_t *e);
/** Delivers a received notification to the engine's callback, with the
 *  token it came under (KVR_XFER_TOKEN_LEN bytes: the one its connection
 *  presented; NULL or all zeros: none; the callback gets NULL then). */
void kvr_xfer_deliver_notif(kvr_xfer_engine_t *e, const void *msg, size_t len,
                            const uint8_t *token);

/** Backends registered in this build (xfer.c, one #if KVR_HAVE_<NAME> per backend;
 *  kvr_config.h says which meson built). */
extern const struct kvr_xfer_ops kvr_xfer_loop_ops;
#if KVR_HAVE_UCX
extern const struct kvr_xfer_ops kvr_xfer_ucx_ops;
#endif
#if KVR_HAVE_VERBS
extern const struct kvr_xfer_ops kvr_xfer_verbs_ops;
#endif

#endif
