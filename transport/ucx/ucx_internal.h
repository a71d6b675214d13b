/*
 * ucx_internal.h - the UCX backend's objects, shared by ucx.c (engine,
 * connections, UCX data path, notifications) and ucx_local.c (same-host
 * pools and the same-host data paths: mapped memcpy and process_vm_writev).
 */
#ifndef KVR_UCX_INTERNAL_H
#define KVR_UCX_INTERNAL_H

#include "xfer_backend.h"

#include <sys/types.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>

#define KVR_UCX_AM_NOTIF    0x4b56 /* "KV" */
#define KVR_UCX_AM_HELLO    0x4b48 /* "KH": an endpoint's first message (ucx_hello.c) */
#define KVR_UCX_AM_BYE      0x4b42 /* "KB": the target closes the endpoint (ucx_hello.c) */
#define KVR_UCX_BYE_REFUSED 'R'    /* the BYE's header: refused at connect */
#define KVR_UCX_BYE_REVOKED 'V'    /* its token revoked (kvr_xfer_token_revoke) */
/* ucx_hello.c: inbound endpoints a target keeps; how long one that sent
 * something else has for its HELLO; how long a closed one's address is
 * remembered; how often the table is scanned for both */
#define UCX_INBOUND_MAX     4096
#define UCX_HELLO_WAIT_MS   1000
#define UCX_CLOSED_KEEP_MS  10000
#define UCX_INBOUND_SCAN_MS 50
#define UCX_BYE_WAIT_MS     100         /* a refused endpoint's BYE: its close waits that long */
#define KVR_UCX_ADDR_MAGIC  0x41584355u /* "UCXA" */
#define KVR_UCX_WATCH_MS    10          /* pidfd poll period of local peers */
#define CLOSE_WAIT_MS       1000
#define CLOSE_FLUSH_MS      300

/* address payload: this header, then the ucp worker address */
struct ucx_addr_hdr {
    uint32_t magic;
    uint32_t pid;
    uint64_t pidns;      /* inode of /proc/self/ns/pid */
    uint8_t boot_id[16]; /* kernel boot id: same kernel <=> same host */
    uint32_t flags;
    uint32_t wa_len;
};

/** How a list is posted. */
enum ucx_path {
    UCX_PATH_UCP = 0, /* ucp_put_nbx / ucp_get_nbx, completion by callback */
    UCX_PATH_MAPPED,  /* memcpy into the peer's region mapped here (ucp_rkey_ptr) */
    UCX_PATH_CMA,     /* process_vm_writev / readv into the peer process */
};

enum notif_state { N_WAIT_FLUSH, N_READY, N_SENDING };

struct ucx_notif {
    struct ucx_notif *next; /* peer queue or engine free list */
    struct ucx_peer *peer;  /* NULL: orphaned (peer gone), freed by its callback */
    struct ucx_engine *eng;
    enum notif_state state;
    void *req;
    unsigned am_id; /* KVR_UCX_AM_NOTIF, or KVR_UCX_AM_HELLO (the connection's first) */
    uint32_t len;
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* the AM header: the pair's token */
    unsigned char msg[KVR_XFER_NOTIF_MAX];
};

/* an inbound endpoint, as its HELLO left it (ucx_hello.c) */
enum ucx_in_state {
    UCX_IN_PENDING = 0,
    UCX_IN_ADMITTED,
    UCX_IN_REFUSED,
    UCX_IN_CLOSED,
    UCX_IN_REVOKED, /* admitted under a token revoked since: closed at its next message */
};
struct ucx_inbound {
    ucp_ep_h ep; /* the target's endpoint of the connection (the reply endpoint) */
    enum ucx_in_state state;
    bool close;  /* refused: to be closed on the next progress */
    uint8_t bye; /* refused: why (KVR_UCX_BYE_*), told the peer before the close */
    bool bye_sent;
    void *bye_req;   /* the BYE's send, not done yet */
    uint64_t bye_by; /* closed by then even if it is not */
    uint64_t seen_ns;
    uint64_t deadline_ns;              /* pending: its HELLO is due by then */
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* admitted under */
};

/* a forced close of a refused endpoint that UCX did not finish at once */
struct ucx_close {
    struct ucx_close *next;
    struct ucx_engine *e;
    ucp_ep_h ep;
};

struct ucx_engine {
    struct kvr_xfer_engine base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *wa;
    size_t wa_len;
    uint8_t boot_id[16];
    uint64_t pidns;
    uint64_t mem_types;
    int efd;    /* ucp_worker_get_efd, once asked for */
    bool armed; /* event fd handed out: arm the worker when idle */
    uint64_t next_watch_ns;
    unsigned nwatch; /* peers with a pidfd */
    struct ucx_notif *free_notifs;
    bool pool_logged;       /* ucx_local_mem_alloc said which memory pools get */
    struct ucx_inbound *in; /* inbound endpoints (ucx_hello.c), [in_max] */
    size_t n_in, in_max;
    struct ucx_close *closing;
    struct ucx_errctx *orphan_errctx;  /* of endpoints left to UCX at disconnect */
    size_t n_pending, n_close, n_dead; /* entries pending their HELLO, to close, closed */
    size_t n_admitted;                 /* entries admitted */
    uint64_t full_logged;              /* endpoints not tracked: the table was full */
    uint64_t next_scan_ns;             /* for pending HELLOs and closed entries */
    uint64_t admitted;                 /* endpoints admitted by their HELLO */
};

/* which of a peer's memory domains (its MD indices: the bits of an rkey's
 * md_map) are UCX shared memory, whose keys name a segment that unpacking
 * maps: read from its worker address by the check's child */
struct ucx_shm_mds {
    uint64_t posix, sysv;
    bool known; /* false: not parsed (KVR_UCX_CHECK=0, another UCX): keys judged by their form */
};

/* the endpoint error callback's argument (ucx.c ep_err_cb): p is NULLed
 * at disconnect and the context kept (on the engine) until it is destroyed */
struct ucx_errctx {
    struct ucx_peer *p;
    struct ucx_errctx *next;
};

struct ucx_peer {
    struct kvr_xfer_peer base;
    ucp_ep_h ep;
    struct ucx_errctx *errctx;
    bool mode_peer;        /* UCP_ERR_HANDLING_MODE_PEER */
    bool unflushed;        /* something was put since the last flush */
    struct ucx_pflush *fl; /* kvr_xfer_flush's endpoint flush (made at connect) */
    int pidfd;             /* local peer watched, or -1 */
    pid_t pid;
    struct ucx_notif *nq;   /* notifications in order: waiting flush, ready, sending */
    bool local_ok;          /* same host, death watched (pidfd) or this process */
    bool same_host;         /* its address names this host and pid namespace */
    bool said_bye;          /* the target closed its end (ucx_am_bye_cb) */
    struct ucx_shm_mds shm; /* its MDs whose rkeys name shared memory (ucx_check.c) */
};

/* the endpoint flush kvr_xfer_flush issues; outlives its peer when the peer
 * is disconnected with it pending (its callback frees it then) */
struct ucx_pflush {
    struct ucx_peer *p; /* NULL: orphaned */
    bool pending;
};

struct ucx_mem {
    struct kvr_xfer_mem base;
    ucp_mem_h memh;
    void *map; /* ucx_local_mem_alloc's mapping (anonymous or the file), or NULL */
    size_t map_len;
    bool file;         /* map is a huge-page tmpfs file of its own, fd: */
    int fd;            /* that file (peers on this host take it with pidfd_getfd) */
    uint64_t ino, dev; /* its identity, checked by the peer that maps it */
};

/* the UCX rkey payload: this header, then ucp_rkey_pack's buffer */
#define KVR_UCX_RKEY_MAGIC 0x4b584355u /* "UCXK" */
#define KVR_UCX_RKEY_FILE  1u          /* flags: the region is the file fd of the owner */
struct ucx_rkey_hdr {
    uint32_t magic;
    uint32_t flags;
    int32_t fd; /* in the owner process (pidfd_getfd), with KVR_UCX_RKEY_FILE */
    uint32_t rkey_len;
    uint64_t ino, dev, file_len;
};

struct ucx_rmem {
    struct kvr_xfer_rmem base;
    ucp_rkey_h rkey;
    uint8_t *ptr;   /* the region mapped here (offset 0), or NULL */
    size_t map_len; /* ptr is our mapping of the owner's pool file: munmap at release */
    bool cma;       /* reachable with process_vm_writev (probed at unpack) */
};

struct ucx_tok {         /* outlives its list when released with operations pending */
    struct ucx_dlist *d; /* NULL: orphaned, freed by the last callback */
    uint32_t pending;    /* UCX requests of the current post not yet done */
    kvr_status_t err;    /* first error among them */
};

struct ucx_dlist {
    struct kvr_xfer_dlist base;
    struct ucx_tok *tok;
    enum ucx_path path;
    struct iovec *liov, *riov; /* UCX_PATH_CMA: one pair per segment */
};

static inline struct ucx_engine *ue(kvr_xfer_engine_t *e)
{
    return container_of(e, struct ucx_engine, base);
}

static inline struct ucx_peer *up(kvr_xfer_peer_t *p)
{
    return container_of(p, struct ucx_peer, base);
}

/* --- ucx_local.c --- */

/** Allocates m->len bytes for kvr_xfer_mem_alloc and registers them:
 *  anonymous transparent-huge-page memory or UCX shared memory, whichever
 *  this host makes faster (see ucx_local.c). */
kvr_status_t ucx_local_mem_alloc(kvr_xfer_mem_t *m);
/** Frees what ucx_local_mem_alloc allocated (after ucp_mem_unmap). */
void ucx_local_mem_free(kvr_xfer_mem_t *m);
/** At rkey unpack: maps the region here when it can be (sets r->ptr): the
 *  owner's pool file (h names it) or UCX's shared memory; else probes
 *  process_vm_writev access to the peer (sets r->cma). */
void ucx_local_rmem_unpack(struct ucx_peer *p, struct ucx_rmem *r, const struct ucx_rkey_hdr *h);
/** Unmaps what ucx_local_rmem_unpack mapped. */
void ucx_local_rmem_release(struct ucx_rmem *r);
/** At list prepare: picks d->path and builds the iovecs of UCX_PATH_CMA. */
kvr_status_t ucx_local_dlist_prepare(struct ucx_dlist *d);
void ucx_local_dlist_release(struct ucx_dlist *d);
/** Posts a list of path MAPPED or CMA; synchronous: KVR_OK or an error. */
kvr_status_t ucx_local_post(struct ucx_dlist *d);

/* --- ucx_check.c --- */

#define KVR_UCX_PAD      4096 /* zero bytes after a peer's blob handed to UCX */
#define KVR_UCX_CHECK_MS 3000 /* bound on the child that parses it first */

/** A malloc'd copy of len bytes followed by KVR_UCX_PAD zeros (NULL: no memory). */
uint8_t *ucx_check_pad(const void *src, size_t len);
/** Parses a padded worker address in a forked child as UCX would.
 *  @return KVR_OK; KVR_ERR_CORRUPT (UCX refused it, crashed or hung on it;
 *          *why_p says which); KVR_ERR_IO (no child could be made). */
kvr_status_t ucx_check_address(struct ucx_engine *e, const uint8_t *padded, struct ucx_shm_mds *shm,
                               const char **why_p);
/** Checks the structure of a packed UCX rkey of len bytes.
 *  @return KVR_OK; KVR_ERR_CORRUPT (*why_p says what is wrong). */
kvr_status_t ucx_check_rkey(const uint8_t *rk, size_t len, const char **why_p);
/** Checks every shared-memory key of a structurally sound rkey of peer p
 *  (same host) against the segment it names, before UCX maps it: the
 *  segment must exist, be the peer's, and hold region_len bytes.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND (no such segment) or KVR_ERR_CORRUPT
 *          (another process's, too small, a form not accepted); why names it. */
kvr_status_t ucx_check_rkey_shm(const struct ucx_peer *p, const uint8_t *rk, size_t len,
                                uint64_t region_len, char *why, size_t cap);

/* from ucx.c */
void ucx_peer_failed(struct ucx_peer *p, kvr_status_t s, const char *why);
kvr_status_t ucx_mem_reg(kvr_xfer_mem_t *m);       /* ucp_mem_map of m->addr */
kvr_status_t ucx_mem_alloc_shm(kvr_xfer_mem_t *m); /* ucp_mem_map ALLOCATE */

/* ucx_hello.c: admission of inbound endpoints (require_token) */
ucs_status_t ucx_am_hello_cb(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param);
/** Whether a notification that arrived with this header may be delivered;
 *  *token_p: the token to deliver it with (NULL: none).  Refusals are
 *  counted and their endpoint closed on the next ucx_inbound_progress. */
bool ucx_inbound_notif(struct ucx_engine *e, const ucp_am_recv_param_t *param, const void *header,
                       size_t header_length, const uint8_t **token_p);
/** The token_revoked op: refuses the endpoints admitted under token (closed
 *  on the next ucx_inbound_progress, with a BYE); returns how many. */
size_t ucx_token_revoked(kvr_xfer_engine_t *base, const uint8_t *token);
/** An initiator's handler of the target's BYE: the connection it came on
 *  fails (KVR_ERR_PEER_FAILURE), saying why. */
ucs_status_t ucx_am_bye_cb(void *arg, const void *header, size_t header_length, void *data,
                           size_t length, const ucp_am_recv_param_t *param);
/** Closes the refused endpoints (outside UCX's callbacks). */
int ucx_inbound_progress(struct ucx_engine *e);
void ucx_inbound_fini(struct ucx_engine *e); /* after ucp_worker_destroy */

#endif
