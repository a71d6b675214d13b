/*
 * xfer.c - the core of the transfer engine, common to every backend.
 *
 * The core owns what does not depend on the wire: the backend registry (one
 * #if per backend, missing optional ops filled with stubs), the config copy,
 * blob framing (xfer_blob.h: magic, version, backend id, kind, length,
 * XXH64), validation and coalescing of descriptor lists, post/test/wait with
 * timeouts, telemetry, and the bookkeeping that lets destroy/disconnect
 * release whatever is still open.  Backends see only well-formed objects:
 * the core callocs each object with the backend's size, fills the base
 * struct and calls the backend's op (xfer_backend.h).
 *
 * Nothing on the post path allocates: kvr_xfer_post() checks two flags,
 * reads the clock once at the start of the post and calls the backend's post
 * op on the segments prepared once by kvr_xfer_dlist_prepare().  A second
 * read at the end is the completion stamp of a post the backend completed
 * inline (same-host copies: a completion-time read, needed for complete_ns);
 * a post left in flight reads it only on every KVR_XFER_POST_SAMPLE-th post
 * of its list (and its first): post_ns is sampled, post_timed says when.  Completions seen inside
 * progress share one clock read per progress call (stamp_ns below), so a progress call that
 * completes nothing reads no clock.
 */
#include "xfer_backend.h"
#if KVR_HAVE_CUDA
#include "cuda_ipc.h"
#endif
#include "xfer_mem.h"
#include "xfer_blob.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#define COMP "xfer"

/* bounded waits used by release paths (never infinite) */
#define RELEASE_WAIT_MS      2000
#define RELEASE_WAIT_DEAD_MS 100

/* Completion stamp shared by every completion of one progress call (0: read
 * the clock at the next completion).  An engine belongs to one thread, so a
 * thread-local cache is enough; it is cleared before and after each call so
 * that a completion outside a progress call reads a fresh clock. */
static _Thread_local uint64_t stamp_ns;

static int core_progress(kvr_xfer_engine_t *e)
{
    stamp_ns = 0;
    int n = e->ops->progress(e);
    stamp_ns = 0;
    return n;
}

/* ------------------------------------------------------------------------ */
/* intrusive lists                                                           */

static void link_init(struct kvr_xfer_link *h)
{
    h->prev = h->next = h;
}

static void link_add_tail(struct kvr_xfer_link *h, struct kvr_xfer_link *n)
{
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}

static void link_del(struct kvr_xfer_link *n)
{
    if (n->next == NULL)
        return;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

static bool link_empty(const struct kvr_xfer_link *h)
{
    return h->next == h;
}

/* ------------------------------------------------------------------------ */
/* backend registry                                                          */

static const struct kvr_xfer_ops *const registry[] = {
#if KVR_HAVE_UCX
    &kvr_xfer_ucx_ops,
#endif
#if KVR_HAVE_VERBS
    &kvr_xfer_verbs_ops,
#endif
    &kvr_xfer_loop_ops,
#if KVR_HAVE_CUDA
    &kvr_xfer_cuda_ipc_ops, /* transport/cuda/: device memory on one host */
#endif
};
#define NBACKENDS (sizeof(registry) / sizeof(registry[0]))

static struct kvr_xfer_ops filled[NBACKENDS]; /* registry with stubs filled in */
static bool usable[NBACKENDS];
static const char *names[NBACKENDS + 1];
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

static kvr_status_t stub_dlist_prepare(kvr_xfer_dlist_t *d)
{
    return KVR_OK;
}

static void stub_dlist_release(kvr_xfer_dlist_t *d) {}

static kvr_status_t stub_event_fd(kvr_xfer_engine_t *e, int *fd_p)
{
    return KVR_ERR_UNSUPPORTED;
}

static void registry_init(void)
{
    size_t k = 0;
    for (size_t i = 0; i < NBACKENDS; i++) {
        struct kvr_xfer_ops *o = &filled[i];
        *o = *registry[i];
        if (!o->dlist_prepare)
            o->dlist_prepare = stub_dlist_prepare;
        if (!o->dlist_release)
            o->dlist_release = stub_dlist_release;
        if (!o->event_fd)
            o->event_fd = stub_event_fd;
        usable[i] = o->name && o->engine_init && o->engine_fini && o->address && o->mem_reg &&
                    o->mem_dereg && o->mem_pack && o->connect && o->disconnect && o->rmem_unpack &&
                    o->rmem_release && o->post && o->notify && o->peer_idle && o->progress &&
                    o->engine_size >= sizeof(struct kvr_xfer_engine) &&
                    o->mem_size >= sizeof(struct kvr_xfer_mem) &&
                    o->peer_size >= sizeof(struct kvr_xfer_peer) &&
                    o->rmem_size >= sizeof(struct kvr_xfer_rmem) &&
                    o->dlist_size >= sizeof(struct kvr_xfer_dlist);
        if (!usable[i]) {
            KVR_LOG_ERROR(COMP, "backend '%s' lacks a required op or base struct; not offered",
                          o->name ? o->name : "?");
            continue;
        }
        names[k++] = o->name;
    }
    names[k] = NULL;
}

const char *const *kvr_xfer_backends(void)
{
    pthread_once(&registry_once, registry_init);
    return names;
}

static const struct kvr_xfer_ops *registry_find(const char *name)
{
    pthread_once(&registry_once, registry_init);
    for (size_t i = 0; i < NBACKENDS; i++)
        if (usable[i] && strcmp(filled[i].name, name) == 0)
            return &filled[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* blob framing                                                              */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t kvr_xfer_blob_checksum(const void *blob, size_t len)
{
    const uint8_t *b = blob;
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, b, 16);
    if (len > KVR_XFER_BLOB_HDR_LEN)
        XXH64_update(&st, b + KVR_XFER_BLOB_HDR_LEN, len - KVR_XFER_BLOB_HDR_LEN);
    return XXH64_digest(&st);
}

kvr_status_t kvr_xfer_blob_frame(uint16_t backend_id, uint16_t kind, const void *payload,
                                 size_t payload_len, void **blob_p, size_t *len_p)
{
    if (payload_len > KVR_XFER_BLOB_MAX || (payload_len && !payload))
        return KVR_ERR_INVALID;
    size_t len = KVR_XFER_BLOB_HDR_LEN + payload_len;
    uint8_t *b = malloc(len);
    if (!b)
        return KVR_ERR_NO_MEMORY;
    put32(b, KVR_XFER_BLOB_MAGIC);
    put16(b + 4, KVR_XFER_BLOB_VERSION);
    put16(b + 6, backend_id);
    put16(b + 8, kind);
    put16(b + 10, 0);
    put32(b + 12, (uint32_t)payload_len);
    if (payload_len)
        memcpy(b + KVR_XFER_BLOB_HDR_LEN, payload, payload_len);
    put64(b + 16, kvr_xfer_blob_checksum(b, len));
    *blob_p = b;
    *len_p = len;
    return KVR_OK;
}

kvr_status_t kvr_xfer_blob_parse(uint16_t backend_id, uint16_t kind, const void *blob, size_t len,
                                 const void **payload_p, size_t *payload_len_p, const char **why_p)
{
    const uint8_t *b = blob;
    const char *why;
    kvr_status_t s;

    if (!b) {
        why = "NULL blob";
        s = KVR_ERR_INVALID;
    } else if (len < 6) {
        why = "truncated: shorter than the magic and version";
        s = KVR_ERR_INVALID;
    } else if (get32(b) != KVR_XFER_BLOB_MAGIC) {
        why = "bad magic: not a kvrail transfer blob";
        s = KVR_ERR_CORRUPT;
    } else if (get16(b + 4) != KVR_XFER_BLOB_VERSION) {
        why = "blob of another format version";
        s = KVR_ERR_VERSION;
    } else if (len < KVR_XFER_BLOB_HDR_LEN) {
        why = "truncated: shorter than the header";
        s = KVR_ERR_INVALID;
    } else if ((uint64_t)get32(b + 12) + KVR_XFER_BLOB_HDR_LEN != len) {
        why = (uint64_t)get32(b + 12) + KVR_XFER_BLOB_HDR_LEN > len
                  ? "truncated: shorter than its payload length"
                  : "length mismatch: bytes after the payload";
        s = KVR_ERR_INVALID;
    } else if (get64(b + 16) != kvr_xfer_blob_checksum(b, len)) {
        why = "checksum mismatch: blob damaged";
        s = KVR_ERR_CORRUPT;
    } else if (get16(b + 10) != 0) {
        why = "unknown flags";
        s = KVR_ERR_CORRUPT;
    } else if (get16(b + 6) != backend_id) {
        why = "blob of another backend";
        s = KVR_ERR_MISMATCH;
    } else if (get16(b + 8) != kind) {
        why = kind == KVR_XFER_BLOB_ADDRESS ? "an rkey blob where an address blob was expected"
                                            : "an address blob where an rkey blob was expected";
        s = KVR_ERR_INVALID;
    } else {
        *payload_p = b + KVR_XFER_BLOB_HDR_LEN;
        *payload_len_p = len - KVR_XFER_BLOB_HDR_LEN;
        return KVR_OK;
    }
    if (why_p)
        *why_p = why;
    return s;
}

/* ------------------------------------------------------------------------ */
/* engine                                                                    */

void kvr_xfer_config_init(struct kvr_xfer_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->gid_index = -1;
}

static kvr_status_t copy_str(char *dst, size_t cap, const char *src, const char *what)
{
    if (!src) {
        dst[0] = '\0';
        return KVR_OK;
    }
    if (strlen(src) >= cap) {
        KVR_LOG_ERROR(COMP, "config: %s longer than %zu bytes", what, cap - 1);
        return KVR_ERR_INVALID;
    }
    strcpy(dst, src);
    return KVR_OK;
}

kvr_status_t kvr_xfer_engine_create(const struct kvr_xfer_config *cfg, kvr_xfer_engine_t **engine_p)
{
    struct kvr_xfer_config defaults;
    if (!engine_p)
        return KVR_ERR_INVALID;
    if (!cfg) {
        kvr_xfer_config_init(&defaults);
        cfg = &defaults;
    }
    const char *bname = cfg->backend;
    if (!bname) {
        const char *const *list = kvr_xfer_backends();
        bname = "loop";
        for (size_t i = 0; list[i]; i++)
            if (strcmp(list[i], "ucx") == 0)
                bname = "ucx";
    }
    const struct kvr_xfer_ops *ops = registry_find(bname);
    if (!ops) {
        KVR_LOG_ERROR(COMP, "no transfer backend '%s' in this build", bname);
        return KVR_ERR_NOT_FOUND;
    }

    kvr_xfer_engine_t *e = calloc(1, ops->engine_size);
    if (!e)
        return KVR_ERR_NO_MEMORY;
    e->ops = ops;
    e->cfg = *cfg;
    kvr_status_t s;
    if ((s = copy_str(e->name, sizeof(e->name), cfg->name ? cfg->name : "xfer", "name")) ||
        (s = copy_str(e->devices, sizeof(e->devices), cfg->devices, "devices")) ||
        (s = copy_str(e->tls, sizeof(e->tls), cfg->tls, "tls")))
        goto err_free;
    e->cfg.backend = ops->name;
    e->cfg.name = e->name;
    e->cfg.devices = cfg->devices ? e->devices : NULL;
    e->cfg.tls = cfg->tls ? e->tls : NULL;
    link_init(&e->mems);
    link_init(&e->peers);

    s = ops->engine_init(e);
    if (s != KVR_OK)
        goto err_free;
    KVR_LOG_DEBUG(COMP, "%s: engine created (backend %s)", e->name, ops->name);
    *engine_p = e;
    return KVR_OK;

err_free:
    free(e);
    return s;
}

void kvr_xfer_engine_destroy(kvr_xfer_engine_t *e)
{
    if (!e)
        return;
    while (!link_empty(&e->peers))
        kvr_xfer_disconnect(container_of(e->peers.next, kvr_xfer_peer_t, link));
    if (e->ops->engine_quiesce) /* nobody writes into the regions any more */
        e->ops->engine_quiesce(e);
    while (!link_empty(&e->mems))
        kvr_xfer_mem_dereg(container_of(e->mems.next, kvr_xfer_mem_t, link));
    e->ops->engine_fini(e);
    kvr_xfer_tokens_free(e);
    free(e);
}

const char *kvr_xfer_engine_backend(const kvr_xfer_engine_t *e)
{
    return e->ops->name;
}

kvr_status_t kvr_xfer_address(kvr_xfer_engine_t *e, void **blob_p, size_t *len_p)
{
    void *pl = NULL;
    size_t pl_len = 0;
    if (!e || !blob_p || !len_p)
        return KVR_ERR_INVALID;
    kvr_status_t s = e->ops->address(e, &pl, &pl_len);
    if (s != KVR_OK)
        return s;
    s = kvr_xfer_blob_frame(e->ops->id, KVR_XFER_BLOB_ADDRESS, pl, pl_len, blob_p, len_p);
    free(pl);
    return s;
}

int kvr_xfer_progress(kvr_xfer_engine_t *e)
{
    return core_progress(e);
}

kvr_status_t kvr_xfer_event_fd(kvr_xfer_engine_t *e, int *fd_p)
{
    if (!e || !fd_p)
        return KVR_ERR_INVALID;
    return e->ops->event_fd(e, fd_p);
}

void kvr_xfer_engine_stats(const kvr_xfer_engine_t *e, struct kvr_xfer_engine_stats *stats_p)
{
    *stats_p = e->stats;
}

/* ------------------------------------------------------------------------ */
/* memory                                                                    */

kvr_status_t kvr_xfer_mem_reg(kvr_xfer_engine_t *e, void *addr, size_t len, enum kvr_mem_kind kind,
                              int device, kvr_xfer_mem_t **mem_p)
{
    return kvr_xfer_mem_reg_flags(e, addr, len, kind, device, 0, mem_p);
}

/* KVR_XFER_MEM_DEFER_PREFAULT: huge pages advised, nothing faulted */
static kvr_status_t prepare_host(void *addr, size_t len, unsigned flags, const char *who,
                                 struct kvr_xfer_prefault *pf)
{
    if (!kvr_xfer_prefault_enabled())
        return KVR_OK;
    if (flags & KVR_XFER_MEM_DEFER_PREFAULT) {
        pf->thp = kvr_xfer_mem_advise_huge(addr, len);
        return KVR_OK;
    }
    return kvr_xfer_mem_prefault(addr, len, who, pf);
}

kvr_status_t kvr_xfer_mem_reg_flags(kvr_xfer_engine_t *e, void *addr, size_t len,
                                    enum kvr_mem_kind kind, int device, unsigned flags,
                                    kvr_xfer_mem_t **mem_p)
{
    if (!e || !mem_p || (flags & ~(unsigned)KVR_XFER_MEM_DEFER_PREFAULT))
        return KVR_ERR_INVALID;
    if (!addr || len == 0) {
        KVR_LOG_ERROR(COMP, "%s: mem_reg: %s", e->name, !addr ? "NULL address" : "zero length");
        return KVR_ERR_INVALID;
    }
    if (kind != KVR_MEM_HOST && kind != KVR_MEM_CUDA)
        return KVR_ERR_INVALID;
    if ((uintptr_t)addr + len < (uintptr_t)addr)
        return KVR_ERR_INVALID;
    kvr_xfer_mem_t *m = calloc(1, e->ops->mem_size);
    if (!m)
        return KVR_ERR_NO_MEMORY;
    m->engine = e;
    m->addr = addr;
    m->len = len;
    m->kind = kind;
    m->device = device;
    uint64_t t0 = kvr_now_ns();
    struct kvr_xfer_prefault pf = {0};
    kvr_status_t s = KVR_OK;
    if (kind == KVR_MEM_HOST)
        s = prepare_host(addr, len, flags, e->name, &pf);
    if (s == KVR_OK)
        s = e->ops->mem_reg(m);
    if (s != KVR_OK) {
        free(m);
        return s;
    }
    link_add_tail(&e->mems, &m->link);
    KVR_LOG_DEBUG(COMP, "%s: registered %zu bytes at %p in %.3f ms (pre-faulting %.3f ms)", e->name,
                  len, addr, (double)(kvr_now_ns() - t0) / 1e6, (double)pf.ns / 1e6);
    *mem_p = m;
    return KVR_OK;
}

void kvr_xfer_mem_dereg(kvr_xfer_mem_t *m)
{
    if (!m)
        return;
    m->engine->ops->mem_dereg(m);
    link_del(&m->link);
    free(m->core_alloc);
    free(m);
}

kvr_status_t kvr_xfer_mem_alloc(kvr_xfer_engine_t *e, size_t len, enum kvr_mem_kind kind,
                                int device, kvr_xfer_mem_t **mem_p)
{
    return kvr_xfer_mem_alloc_flags(e, len, kind, device, 0, mem_p);
}

kvr_status_t kvr_xfer_mem_alloc_flags(kvr_xfer_engine_t *e, size_t len, enum kvr_mem_kind kind,
                                      int device, unsigned flags, kvr_xfer_mem_t **mem_p)
{
    if (!e || !mem_p || len == 0 || (flags & ~(unsigned)KVR_XFER_MEM_DEFER_PREFAULT)) {
        KVR_LOG_ERROR(COMP, "%s: mem_alloc: %s", e ? e->name : "?",
                      len == 0 ? "zero length"
                      : mem_p  ? "unknown flag"
                               : "NULL argument");
        return KVR_ERR_INVALID;
    }
    if (!e->ops->mem_alloc) {
        if (kind != KVR_MEM_HOST)
            return KVR_ERR_UNSUPPORTED;
        /* 2 MiB-aligned when large: whole transparent huge pages */
        size_t align = len >= (2u << 20) ? (2u << 20) : 4096u;
        size_t rounded = (len + align - 1) & ~(align - 1);
        void *p = aligned_alloc(align, rounded);
        if (!p)
            return KVR_ERR_NO_MEMORY;
        kvr_status_t s = kvr_xfer_mem_reg_flags(e, p, len, kind, device, flags, mem_p);
        if (s != KVR_OK) {
            free(p);
            return s;
        }
        (*mem_p)->core_alloc = p;
        return KVR_OK;
    }
    kvr_xfer_mem_t *m = calloc(1, e->ops->mem_size);
    if (!m)
        return KVR_ERR_NO_MEMORY;
    m->engine = e;
    m->len = len;
    m->kind = kind;
    m->device = device;
    uint64_t t0 = kvr_now_ns();
    kvr_status_t s = e->ops->mem_alloc(m);
    if (s != KVR_OK) {
        free(m);
        return s;
    }
    uint64_t t1 = kvr_now_ns();
    struct kvr_xfer_prefault pf = {0};
    if (kind == KVR_MEM_HOST && (s = prepare_host(m->addr, len, flags, e->name, &pf)) != KVR_OK) {
        e->ops->mem_dereg(m);
        free(m);
        return s;
    }
    link_add_tail(&e->mems, &m->link);
    KVR_LOG_DEBUG(COMP,
                  "%s: allocated and registered %zu bytes at %p in %.3f ms, pre-faulted in %.1f "
                  "ms (transparent huge pages %s)",
                  e->name, len, m->addr, (double)(t1 - t0) / 1e6, (double)pf.ns / 1e6,
                  pf.thp ? "advised" : "not available");
    *mem_p = m;
    return KVR_OK;
}

void *kvr_xfer_mem_addr(const kvr_xfer_mem_t *m)
{
    return m->addr;
}

kvr_status_t kvr_xfer_mem_pack(kvr_xfer_mem_t *m, void **blob_p, size_t *len_p)
{
    void *key = NULL;
    size_t key_len = 0;
    if (!m || !blob_p || !len_p)
        return KVR_ERR_INVALID;
    const struct kvr_xfer_ops *ops = m->engine->ops;
    kvr_status_t s = ops->mem_pack(m, &key, &key_len);
    if (s != KVR_OK)
        return s;
    if (key_len > KVR_XFER_BLOB_MAX) {
        free(key);
        return KVR_ERR_INVALID;
    }
    size_t pl_len = KVR_XFER_RKEY_HDR_LEN + key_len;
    uint8_t *pl = malloc(pl_len);
    if (!pl) {
        free(key);
        return KVR_ERR_NO_MEMORY;
    }
    put64(pl, (uint64_t)(uintptr_t)m->addr);
    put64(pl + 8, m->len);
    put32(pl + 16, (uint32_t)m->kind);
    put32(pl + 20, (uint32_t)key_len);
    if (key_len)
        memcpy(pl + KVR_XFER_RKEY_HDR_LEN, key, key_len);
    free(key);
    s = kvr_xfer_blob_frame(ops->id, KVR_XFER_BLOB_RKEY, pl, pl_len, blob_p, len_p);
    free(pl);
    return s;
}

/* ------------------------------------------------------------------------ */
/* peers                                                                     */

kvr_status_t kvr_xfer_connect(kvr_xfer_engine_t *e, const void *blob, size_t len,
                              kvr_xfer_peer_t **peer_p)
{
    return kvr_xfer_connect_token(e, blob, len, NULL, peer_p);
}

kvr_status_t kvr_xfer_connect_token(kvr_xfer_engine_t *e, const void *blob, size_t len,
                                    const uint8_t token[KVR_XFER_TOKEN_LEN],
                                    kvr_xfer_peer_t **peer_p)
{
    const void *pl;
    size_t pl_len;
    const char *why = NULL;
    if (!e || !peer_p)
        return KVR_ERR_INVALID;
    kvr_status_t s =
        kvr_xfer_blob_parse(e->ops->id, KVR_XFER_BLOB_ADDRESS, blob, len, &pl, &pl_len, &why);
    if (s != KVR_OK) {
        KVR_LOG_ERROR(COMP, "%s: connect: address blob refused (%zu bytes): %s", e->name, len, why);
        return s;
    }
    kvr_xfer_peer_t *p = calloc(1, e->ops->peer_size);
    if (!p)
        return KVR_ERR_NO_MEMORY;
    p->engine = e;
    p->status = KVR_OK;
    if (token) /* presented by the backend's connect (xfer_token.c) */
        memcpy(p->token, token, KVR_XFER_TOKEN_LEN);
    link_init(&p->rmems);
    link_init(&p->dlists);
    s = e->ops->connect(p, pl, pl_len);
    if (s != KVR_OK) {
        free(p);
        return s;
    }
    link_add_tail(&e->peers, &p->link);
    *peer_p = p;
    return KVR_OK;
}

void kvr_xfer_disconnect(kvr_xfer_peer_t *p)
{
    if (!p)
        return;
    while (!link_empty(&p->dlists))
        kvr_xfer_dlist_release(container_of(p->dlists.next, kvr_xfer_dlist_t, link));
    while (!link_empty(&p->rmems))
        kvr_xfer_rmem_release(container_of(p->rmems.next, kvr_xfer_rmem_t, link));
    p->engine->ops->disconnect(p);
    link_del(&p->link);
    free(p);
}

kvr_status_t kvr_xfer_peer_status(const kvr_xfer_peer_t *p)
{
    return p->status;
}

void kvr_xfer_peer_abort(kvr_xfer_peer_t *p, const char *why)
{
    if (p)
        kvr_xfer_peer_fail(p, KVR_ERR_TIMEOUT, why);
}

const char *kvr_xfer_peer_transports(const kvr_xfer_peer_t *p)
{
    return p->transports[0] ? p->transports : "unknown";
}

size_t kvr_xfer_peer_rails(const kvr_xfer_peer_t *p, struct kvr_xfer_rail_stats *rails, size_t cap)
{
    if (!p || (cap && !rails) || !p->engine->ops->peer_rails)
        return 0;
    return p->engine->ops->peer_rails(p, rails, cap);
}

void kvr_xfer_peer_fail(kvr_xfer_peer_t *p, kvr_status_t s, const char *why)
{
    if (p->status != KVR_OK)
        return;
    p->status = s;
    p->engine->stats.errors++;
    KVR_LOG_ERROR(COMP, "%s: peer %p (%s) failed: %s (%s)", p->engine->name, (void *)p,
                  kvr_xfer_peer_transports(p), why ? why : "", kvr_status_str(s));
}

kvr_status_t kvr_xfer_rmem_unpack(kvr_xfer_peer_t *p, const void *blob, size_t len,
                                  kvr_xfer_rmem_t **rmem_p)
{
    const uint8_t *pl;
    size_t pl_len;
    const char *why = NULL;
    if (!p || !rmem_p)
        return KVR_ERR_INVALID;
    kvr_xfer_engine_t *e = p->engine;
    kvr_status_t s = kvr_xfer_blob_parse(e->ops->id, KVR_XFER_BLOB_RKEY, blob, len,
                                         (const void **)&pl, &pl_len, &why);
    if (s == KVR_OK && pl_len < KVR_XFER_RKEY_HDR_LEN) {
        why = "rkey payload shorter than its region header";
        s = KVR_ERR_INVALID;
    }
    if (s == KVR_OK && get32(pl + 20) != pl_len - KVR_XFER_RKEY_HDR_LEN) {
        why = "rkey key length disagrees with the blob";
        s = KVR_ERR_INVALID;
    }
    if (s == KVR_OK && (get64(pl + 8) == 0 || get64(pl) + get64(pl + 8) < get64(pl) ||
                        get32(pl + 16) > KVR_MEM_CUDA)) {
        why = "rkey names an impossible region";
        s = KVR_ERR_INVALID;
    }
    if (s != KVR_OK) {
        KVR_LOG_ERROR(COMP, "%s: rmem_unpack: rkey blob refused (%zu bytes): %s", e->name, len,
                      why);
        return s;
    }
    if (p->status != KVR_OK)
        return p->status;
    kvr_xfer_rmem_t *r = calloc(1, e->ops->rmem_size);
    if (!r)
        return KVR_ERR_NO_MEMORY;
    r->peer = p;
    r->addr = get64(pl);
    r->len = get64(pl + 8);
    r->kind = (enum kvr_mem_kind)get32(pl + 16);
    s = e->ops->rmem_unpack(r, pl + KVR_XFER_RKEY_HDR_LEN, pl_len - KVR_XFER_RKEY_HDR_LEN);
    if (s != KVR_OK) {
        free(r);
        return s;
    }
    link_add_tail(&p->rmems, &r->link);
    *rmem_p = r;
    return KVR_OK;
}

void kvr_xfer_rmem_release(kvr_xfer_rmem_t *r)
{
    if (!r)
        return;
    r->peer->engine->ops->rmem_release(r);
    link_del(&r->link);
    free(r);
}

uint64_t kvr_xfer_rmem_len(const kvr_xfer_rmem_t *r)
{
    return r->len;
}

/* ------------------------------------------------------------------------ */
/* descriptor lists                                                          */

static bool range_ok(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

kvr_status_t kvr_xfer_dlist_prepare(kvr_xfer_peer_t *p, enum kvr_xfer_op op,
                                    const struct kvr_xfer_desc *descs, size_t n,
                                    kvr_xfer_dlist_t **dlist_p)
{
    if (!p || !dlist_p)
        return KVR_ERR_INVALID;
    kvr_xfer_engine_t *e = p->engine;
    if (op != KVR_XFER_WRITE && op != KVR_XFER_READ) {
        KVR_LOG_ERROR(COMP, "%s: dlist_prepare: unknown op %d", e->name, (int)op);
        return KVR_ERR_INVALID;
    }
    if (n == 0 || !descs || n > UINT32_MAX) {
        KVR_LOG_ERROR(COMP, "%s: dlist_prepare: %s", e->name,
                      n == 0   ? "empty list"
                      : !descs ? "NULL descriptors"
                               : "too many descriptors");
        return KVR_ERR_INVALID;
    }
    /* validate everything first, count the segments after coalescing */
    size_t nseg = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const struct kvr_xfer_desc *d = &descs[i];
        if (!d->lmem || !d->rmem || d->len == 0 || d->lmem->engine != e || d->rmem->peer != p) {
            KVR_LOG_ERROR(COMP, "%s: dlist_prepare: descriptor %zu: %s", e->name, i,
                          !d->lmem || !d->rmem   ? "NULL region"
                          : d->len == 0          ? "zero length"
                          : d->lmem->engine != e ? "local region of another engine"
                                                 : "remote region of another peer");
            return KVR_ERR_INVALID;
        }
        if (!range_ok(d->loff, d->len, d->lmem->len) || !range_ok(d->roff, d->len, d->rmem->len)) {
            KVR_LOG_ERROR(COMP,
                          "%s: dlist_prepare: descriptor %zu (loff %llu roff %llu len %llu) "
                          "outside its %s region (%llu bytes)",
                          e->name, i, (unsigned long long)d->loff, (unsigned long long)d->roff,
                          (unsigned long long)d->len,
                          range_ok(d->loff, d->len, d->lmem->len) ? "remote" : "local",
                          (unsigned long long)(range_ok(d->loff, d->len, d->lmem->len)
                                                   ? d->rmem->len
                                                   : d->lmem->len));
            return KVR_ERR_OUT_OF_RANGE;
        }
        const struct kvr_xfer_desc *q = i ? &descs[i - 1] : NULL;
        if (!q || q->lmem != d->lmem || q->rmem != d->rmem || q->loff + q->len != d->loff ||
            q->roff + q->len != d->roff)
            nseg++;
        bytes += d->len;
    }

    kvr_xfer_dlist_t *dl = calloc(1, e->ops->dlist_size);
    if (!dl)
        return KVR_ERR_NO_MEMORY;
    dl->segs = calloc(nseg, sizeof(*dl->segs));
    if (!dl->segs) {
        free(dl);
        return KVR_ERR_NO_MEMORY;
    }
    dl->peer = p;
    dl->op = op;
    dl->ndesc = n;
    dl->nseg = nseg;
    dl->bytes = bytes;
    dl->status = KVR_OK;
    size_t k = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        const struct kvr_xfer_desc *d = &descs[i];
        const struct kvr_xfer_desc *q = i ? &descs[i - 1] : NULL;
        if (!q || q->lmem != d->lmem || q->rmem != d->rmem || q->loff + q->len != d->loff ||
            q->roff + q->len != d->roff) {
            struct kvr_xfer_seg *s = &dl->segs[++k];
            s->lmem = d->lmem;
            s->rmem = d->rmem;
            s->laddr = (char *)d->lmem->addr + d->loff;
            s->raddr = d->rmem->addr + d->roff;
            s->len = d->len;
        } else {
            dl->segs[k].len += d->len;
        }
    }
    dl->stats.ndesc = (uint32_t)n;
    dl->stats.ndesc_coalesced = (uint32_t)nseg;
    dl->stats.bytes = bytes;
    kvr_status_t s = e->ops->dlist_prepare(dl);
    if (s != KVR_OK) {
        free(dl->segs);
        free(dl);
        return s;
    }
    link_add_tail(&p->dlists, &dl->link);
    *dlist_p = dl;
    return KVR_OK;
}

/* progress until the list is done or the deadline passes; no status change */
static void wait_bounded(kvr_xfer_dlist_t *dl, int timeout_ms)
{
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    while (dl->inflight && kvr_now_ns() < deadline)
        if (core_progress(dl->peer->engine) == 0)
            sched_yield();
}

void kvr_xfer_dlist_release(kvr_xfer_dlist_t *dl)
{
    if (!dl)
        return;
    kvr_xfer_engine_t *e = dl->peer->engine;
    if (dl->inflight) {
        wait_bounded(dl, dl->peer->status == KVR_OK ? RELEASE_WAIT_MS : RELEASE_WAIT_DEAD_MS);
        if (dl->inflight)
            KVR_LOG_WARN(COMP, "%s: releasing a list whose post is still in flight", e->name);
    }
    e->ops->dlist_release(dl);
    link_del(&dl->link);
    free(dl->segs);
    free(dl);
}

size_t kvr_xfer_dlist_count(const kvr_xfer_dlist_t *dl, size_t *coalesced_p)
{
    if (coalesced_p)
        *coalesced_p = dl->nseg;
    return dl->ndesc;
}

kvr_status_t kvr_xfer_post(kvr_xfer_dlist_t *dl)
{
    kvr_xfer_peer_t *p = dl->peer;
    kvr_xfer_engine_t *e = p->engine;
    if (dl->inflight)
        return KVR_ERR_BUSY;
    if (p->status != KVR_OK)
        return p->status;
    uint64_t t0 = kvr_now_ns();
    dl->t_post_ns = t0;
    dl->inflight = true;
    dl->status = KVR_INPROGRESS;
    dl->stats.complete_ns = 0;
    stamp_ns = 0; /* a completion inside the post reads its own clock */
    kvr_status_t s = e->ops->post(dl);
    bool timed = s != KVR_INPROGRESS || !dl->inflight || dl->nposts % KVR_XFER_POST_SAMPLE == 0;
    dl->nposts++;
    uint64_t t1 = 0;
    if (timed) {
        t1 = kvr_now_ns();
        dl->stats.post_ns = t1 - t0;
    }
    dl->stats.post_timed = timed;
    e->stats.posts++;
    if (dl->op == KVR_XFER_WRITE)
        e->stats.bytes_written += dl->bytes;
    else
        e->stats.bytes_read += dl->bytes;
    if (s == KVR_INPROGRESS)
        return dl->inflight ? KVR_INPROGRESS : dl->status;
    if (dl->inflight) { /* done or failed without the backend completing it */
        stamp_ns = t1;  /* the end of the post is its completion */
        kvr_xfer_dlist_complete(dl, s);
        stamp_ns = 0;
    }
    return dl->status;
}

void kvr_xfer_dlist_complete(kvr_xfer_dlist_t *dl, kvr_status_t s)
{
    if (!dl->inflight)
        return;
    dl->inflight = false;
    dl->status = s;
    if (stamp_ns < dl->t_post_ns) /* none yet in this call, or posted after it */
        stamp_ns = kvr_now_ns();
    dl->stats.complete_ns = stamp_ns - dl->t_post_ns;
    if (dl->stats.complete_ns == 0)
        dl->stats.complete_ns = 1;
    if (s != KVR_OK)
        dl->peer->engine->stats.errors++;
}

kvr_status_t kvr_xfer_test(const kvr_xfer_dlist_t *dl)
{
    return dl->inflight ? KVR_INPROGRESS : dl->status;
}

kvr_status_t kvr_xfer_wait(kvr_xfer_dlist_t *dl, int timeout_ms)
{
    if (!dl || timeout_ms < 0)
        return KVR_ERR_INVALID;
    kvr_xfer_engine_t *e = dl->peer->engine;
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    unsigned idle = 0;
    while (dl->inflight) {
        if (core_progress(e) == 0 && ++idle >= 64) {
            idle = 0;
            sched_yield();
        }
        if (dl->inflight && kvr_now_ns() >= deadline)
            return KVR_ERR_TIMEOUT;
    }
    return dl->status;
}

void kvr_xfer_dlist_stats(const kvr_xfer_dlist_t *dl, struct kvr_xfer_stats *stats_p)
{
    *stats_p = dl->stats;
}

/* ------------------------------------------------------------------------ */
/* notifications                                                             */

kvr_status_t kvr_xfer_notify(kvr_xfer_peer_t *p, const void *msg, size_t len)
{
    if (!p || (len && !msg))
        return KVR_ERR_INVALID;
    if (len > KVR_XFER_NOTIF_MAX) {
        KVR_LOG_ERROR(COMP, "%s: notify: %zu bytes, the most is %d", p->engine->name, len,
                      KVR_XFER_NOTIF_MAX);
        return KVR_ERR_INVALID;
    }
    if (p->status != KVR_OK)
        return p->status;
    kvr_status_t s = p->engine->ops->notify(p, msg, len);
    if (s == KVR_OK || s == KVR_INPROGRESS) {
        p->engine->stats.notifs_sent++;
        return KVR_OK;
    }
    p->engine->stats.errors++;
    return s;
}

void kvr_xfer_deliver_notif(kvr_xfer_engine_t *e, const void *msg, size_t len, const uint8_t *token)
{
    e->stats.notifs_received++;
    if (token && kvr_xfer_token_is_zero(token))
        token = NULL;
    if (e->cfg.notif_cb)
        e->cfg.notif_cb(e->cfg.notif_arg, msg, len, token);
}

kvr_status_t kvr_xfer_flush(kvr_xfer_peer_t *p, int timeout_ms)
{
    if (!p || timeout_ms < 0)
        return KVR_ERR_INVALID;
    kvr_xfer_engine_t *e = p->engine;
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    for (;;) {
        if (p->status != KVR_OK)
            return p->status;
        if (e->ops->peer_idle(p))
            return KVR_OK;
        if (kvr_now_ns() >= deadline)
            return KVR_ERR_TIMEOUT;
        if (core_progress(e) == 0)
            sched_yield();
    }
}
