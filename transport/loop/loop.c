/*
 * loop.c - the in-process copy backend: the reference for the contract.
 *
 * A loop engine's address blob names an engine of the same process (pid +
 * engine id); an rkey blob names one of its registered regions (region id).
 * Posting queues the list on the initiator engine; the initiator's progress
 * does the copies (memcpy) and completes the list.  A notification first
 * performs every copy still queued on the initiator, then is appended to the
 * target engine's inbox, and is delivered by the target engine's progress:
 * so it always follows the data it was sent after.
 *
 * Engines may live in different threads, so everything one engine reaches in
 * another (the registry of engines and regions, inboxes, the list of peers
 * connected to an engine, the region memory while copying) is guarded by one
 * process-wide mutex.  Destroying a target engine marks the peers connected
 * to it gone; their next post, notify or progress reports
 * KVR_ERR_PEER_FAILURE.  A region deregistered at the target refuses later
 * copies with KVR_ERR_NOT_FOUND instead of touching freed memory.
 */
#include "xfer_backend.h"

#include "kvr_log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define COMP "loop"

struct loop_region { /* shared between the owner mem and remote handles */
    uint64_t id;
    uint64_t engine_id;
    void *addr;
    size_t len;
    int refs;
    bool alive;
    struct loop_region *next; /* registry */
};

struct loop_notif {
    struct loop_notif *next;
    size_t len;
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* the sender's (xfer_token.c) */
    unsigned char msg[];
};

struct loop_peer;

struct loop_engine {
    struct kvr_xfer_engine base;
    uint64_t id;
    struct loop_engine *next;               /* registry (g_lock) */
    struct loop_notif *inbox, **inbox_tail; /* g_lock */
    struct loop_peer *inbound;              /* peers connected to this engine (g_lock) */
    int efd;                                /* -1 until event_fd is asked for */
    struct loop_dlist *pend, **pend_tail;   /* posted, not yet copied (owner thread) */
};

struct loop_peer {
    struct kvr_xfer_peer base;
    struct loop_engine *target; /* g_lock; NULL once the target is gone */
    atomic_int gone;
    struct loop_peer *in_next, *in_prev; /* target->inbound (g_lock) */
};

struct loop_mem {
    struct kvr_xfer_mem base;
    struct loop_region *reg;
};

struct loop_rmem {
    struct kvr_xfer_rmem base;
    struct loop_region *reg;
};

struct loop_dlist {
    struct kvr_xfer_dlist base;
    struct loop_dlist *pend_next;
    bool queued;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct loop_engine *g_engines;
static struct loop_region *g_regions;
static uint64_t g_next_id = 1;

static struct loop_engine *le(kvr_xfer_engine_t *e)
{
    return container_of(e, struct loop_engine, base);
}

static struct loop_peer *lp(kvr_xfer_peer_t *p)
{
    return container_of(p, struct loop_peer, base);
}

static void signal_efd(struct loop_engine *e)
{
    if (e->efd >= 0) {
        uint64_t one = 1;
        ssize_t r = write(e->efd, &one, sizeof(one));
        (void)r;
    }
}

/* g_lock held */
static void region_unref(struct loop_region *r)
{
    if (--r->refs > 0)
        return;
    for (struct loop_region **pp = &g_regions; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    free(r);
}

/* --- engine --- */

static kvr_status_t loop_engine_init(kvr_xfer_engine_t *base)
{
    struct loop_engine *e = le(base);
    if (base->cfg.require_rdma) {
        KVR_LOG_ERROR(COMP, "%s: require_rdma: the loop backend copies in memory, no RDMA",
                      base->name);
        return KVR_ERR_NO_RDMA;
    }
    e->efd = -1;
    e->inbox_tail = &e->inbox;
    e->pend_tail = &e->pend;
    pthread_mutex_lock(&g_lock);
    e->id = g_next_id++;
    e->next = g_engines;
    g_engines = e;
    pthread_mutex_unlock(&g_lock);
    return KVR_OK;
}

static void loop_engine_fini(kvr_xfer_engine_t *base)
{
    struct loop_engine *e = le(base);
    pthread_mutex_lock(&g_lock);
    for (struct loop_engine **pp = &g_engines; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    for (struct loop_peer *p = e->inbound; p; p = p->in_next) {
        p->target = NULL;
        atomic_store(&p->gone, 1);
    }
    e->inbound = NULL;
    struct loop_notif *n = e->inbox;
    e->inbox = NULL;
    pthread_mutex_unlock(&g_lock);
    while (n) {
        struct loop_notif *next = n->next;
        free(n);
        n = next;
    }
    if (e->efd >= 0)
        close(e->efd);
}

static kvr_status_t loop_address(kvr_xfer_engine_t *base, void **buf_p, size_t *len_p)
{
    uint64_t *a = malloc(2 * sizeof(uint64_t));
    if (!a)
        return KVR_ERR_NO_MEMORY;
    a[0] = (uint64_t)getpid();
    a[1] = le(base)->id;
    *buf_p = a;
    *len_p = 2 * sizeof(uint64_t);
    return KVR_OK;
}

static kvr_status_t loop_event_fd(kvr_xfer_engine_t *base, int *fd_p)
{
    struct loop_engine *e = le(base);
    if (e->efd < 0) {
        e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (e->efd < 0)
            return KVR_ERR_IO;
        if (e->inbox || e->pend)
            signal_efd(e);
    }
    *fd_p = e->efd;
    return KVR_OK;
}

/* --- memory --- */

static kvr_status_t loop_mem_reg(kvr_xfer_mem_t *base)
{
    struct loop_mem *m = container_of(base, struct loop_mem, base);
    if (base->kind != KVR_MEM_HOST) {
        KVR_LOG_ERROR(COMP, "%s: mem_reg: the loop backend copies host memory only",
                      base->engine->name);
        return KVR_ERR_UNSUPPORTED;
    }
    struct loop_region *r = calloc(1, sizeof(*r));
    if (!r)
        return KVR_ERR_NO_MEMORY;
    r->addr = base->addr;
    r->len = base->len;
    r->refs = 1;
    r->alive = true;
    r->engine_id = le(base->engine)->id;
    pthread_mutex_lock(&g_lock);
    r->id = g_next_id++;
    r->next = g_regions;
    g_regions = r;
    pthread_mutex_unlock(&g_lock);
    m->reg = r;
    return KVR_OK;
}

static void loop_mem_dereg(kvr_xfer_mem_t *base)
{
    struct loop_mem *m = container_of(base, struct loop_mem, base);
    pthread_mutex_lock(&g_lock);
    m->reg->alive = false;
    region_unref(m->reg);
    pthread_mutex_unlock(&g_lock);
}

static kvr_status_t loop_mem_pack(kvr_xfer_mem_t *base, void **buf_p, size_t *len_p)
{
    struct loop_mem *m = container_of(base, struct loop_mem, base);
    uint64_t *k = malloc(2 * sizeof(uint64_t));
    if (!k)
        return KVR_ERR_NO_MEMORY;
    k[0] = m->reg->engine_id;
    k[1] = m->reg->id;
    *buf_p = k;
    *len_p = 2 * sizeof(uint64_t);
    return KVR_OK;
}

/* --- peers --- */

static kvr_status_t loop_connect(kvr_xfer_peer_t *base, const void *addr, size_t len)
{
    struct loop_peer *p = lp(base);
    uint64_t a[2];
    if (len != sizeof(a)) {
        KVR_LOG_ERROR(COMP, "%s: connect: loop address of %zu bytes, want %zu", base->engine->name,
                      len, sizeof(a));
        return KVR_ERR_INVALID;
    }
    memcpy(a, addr, sizeof(a));
    if (a[0] != (uint64_t)getpid()) {
        KVR_LOG_ERROR(COMP,
                      "%s: connect: address names an engine of process %llu; loop connects "
                      "engines of one process only",
                      base->engine->name, (unsigned long long)a[0]);
        return KVR_ERR_NOT_FOUND;
    }
    pthread_mutex_lock(&g_lock);
    struct loop_engine *t = g_engines;
    while (t && t->id != a[1])
        t = t->next;
    if (t) {
        p->target = t;
        p->in_prev = NULL;
        p->in_next = t->inbound;
        if (t->inbound)
            t->inbound->in_prev = p;
        t->inbound = p;
    }
    pthread_mutex_unlock(&g_lock);
    if (!t) {
        KVR_LOG_ERROR(COMP, "%s: connect: no loop engine %llu in this process (destroyed?)",
                      base->engine->name, (unsigned long long)a[1]);
        return KVR_ERR_NOT_FOUND;
    }
    snprintf(base->transports, sizeof(base->transports), "loop/memcpy");
    KVR_LOG_INFO(COMP, "%s: connected to loop engine %llu over %s", base->engine->name,
                 (unsigned long long)a[1], base->transports);
    return KVR_OK;
}

static void pend_remove(struct loop_engine *e, struct loop_dlist *d);

static void loop_disconnect(kvr_xfer_peer_t *base)
{
    struct loop_peer *p = lp(base);
    struct loop_engine *e = le(base->engine);
    for (struct loop_dlist *d = e->pend; d;) { /* lists are released first; be safe */
        struct loop_dlist *next = d->pend_next;
        if (d->base.peer == base)
            pend_remove(e, d);
        d = next;
    }
    pthread_mutex_lock(&g_lock);
    if (p->target) {
        if (p->in_prev)
            p->in_prev->in_next = p->in_next;
        else
            p->target->inbound = p->in_next;
        if (p->in_next)
            p->in_next->in_prev = p->in_prev;
        p->target = NULL;
    }
    pthread_mutex_unlock(&g_lock);
}

static bool check_gone(struct loop_peer *p)
{
    if (atomic_load(&p->gone) && p->base.status == KVR_OK)
        kvr_xfer_peer_fail(&p->base, KVR_ERR_PEER_FAILURE, "target loop engine destroyed");
    return p->base.status != KVR_OK;
}

static kvr_status_t loop_rmem_unpack(kvr_xfer_rmem_t *base, const void *buf, size_t len)
{
    struct loop_rmem *r = container_of(base, struct loop_rmem, base);
    struct loop_peer *p = lp(base->peer);
    uint64_t k[2];
    if (len != sizeof(k))
        return KVR_ERR_INVALID;
    memcpy(k, buf, sizeof(k));
    kvr_status_t s = KVR_ERR_NOT_FOUND;
    pthread_mutex_lock(&g_lock);
    if (!p->target) {
        s = KVR_ERR_PEER_FAILURE;
    } else if (k[0] != p->target->id) {
        s = KVR_ERR_MISMATCH;
    } else {
        for (struct loop_region *g = g_regions; g; g = g->next)
            if (g->id == k[1] && g->alive) {
                if ((uint64_t)(uintptr_t)g->addr != base->addr || g->len < base->len) {
                    s = KVR_ERR_CORRUPT;
                    break;
                }
                g->refs++;
                r->reg = g;
                s = KVR_OK;
                break;
            }
    }
    pthread_mutex_unlock(&g_lock);
    if (s != KVR_OK)
        KVR_LOG_ERROR(COMP, "%s: rmem_unpack: %s", base->peer->engine->name,
                      s == KVR_ERR_MISMATCH    ? "rkey of another engine than this peer"
                      : s == KVR_ERR_CORRUPT   ? "rkey disagrees with the region it names"
                      : s == KVR_ERR_NOT_FOUND ? "no such registered region at the peer"
                                               : "peer gone");
    return s;
}

static void loop_rmem_release(kvr_xfer_rmem_t *base)
{
    struct loop_rmem *r = container_of(base, struct loop_rmem, base);
    pthread_mutex_lock(&g_lock);
    region_unref(r->reg);
    pthread_mutex_unlock(&g_lock);
}

/* --- data path --- */

static void pend_remove(struct loop_engine *e, struct loop_dlist *d)
{
    if (!d->queued)
        return;
    struct loop_dlist **pp = &e->pend;
    while (*pp != d)
        pp = &(*pp)->pend_next;
    *pp = d->pend_next;
    if (e->pend_tail == &d->pend_next)
        e->pend_tail = pp;
    d->queued = false;
    d->pend_next = NULL;
    d->base.peer->inflight--;
}

/* performs the copies of one list and completes it */
static void run_list(struct loop_dlist *d)
{
    kvr_xfer_dlist_t *b = &d->base;
    struct loop_peer *p = lp(b->peer);
    kvr_status_t s = KVR_OK;
    pthread_mutex_lock(&g_lock);
    if (!p->target) {
        s = KVR_ERR_PEER_FAILURE;
    } else {
        for (size_t i = 0; i < b->nseg; i++) {
            const struct kvr_xfer_seg *g = &b->segs[i];
            struct loop_region *r = container_of(g->rmem, struct loop_rmem, base)->reg;
            if (!r->alive) {
                s = KVR_ERR_NOT_FOUND;
                break;
            }
            if (b->op == KVR_XFER_WRITE)
                memcpy((void *)(uintptr_t)g->raddr, g->laddr, g->len);
            else
                memcpy(g->laddr, (const void *)(uintptr_t)g->raddr, g->len);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (s == KVR_ERR_PEER_FAILURE)
        check_gone(p);
    else if (s != KVR_OK)
        KVR_LOG_ERROR(COMP, "%s: transfer to a region deregistered at the target",
                      b->peer->engine->name);
    kvr_xfer_dlist_complete(b, s);
}

/* runs queued lists: all of them (p == NULL) or those of one peer */
static int run_pending(struct loop_engine *e, kvr_xfer_peer_t *only)
{
    int n = 0;
    struct loop_dlist *d = e->pend;
    while (d) {
        struct loop_dlist *next = d->pend_next;
        if (!only || d->base.peer == only) {
            pend_remove(e, d);
            run_list(d);
            n++;
        }
        d = next;
    }
    return n;
}

static kvr_status_t loop_post(kvr_xfer_dlist_t *base)
{
    struct loop_dlist *d = container_of(base, struct loop_dlist, base);
    struct loop_engine *e = le(base->peer->engine);
    if (check_gone(lp(base->peer)))
        return base->peer->status;
    d->pend_next = NULL;
    d->queued = true;
    *e->pend_tail = d;
    e->pend_tail = &d->pend_next;
    base->peer->inflight++;
    signal_efd(e);
    return KVR_INPROGRESS;
}

static void loop_dlist_release(kvr_xfer_dlist_t *base)
{
    pend_remove(le(base->peer->engine), container_of(base, struct loop_dlist, base));
}

static kvr_status_t loop_notify(kvr_xfer_peer_t *base, const void *msg, size_t len)
{
    struct loop_peer *p = lp(base);
    run_pending(le(base->engine), base); /* the data first */
    if (check_gone(p))
        return base->status;
    struct loop_notif *n = malloc(sizeof(*n) + len);
    if (!n)
        return KVR_ERR_NO_MEMORY;
    n->next = NULL;
    n->len = len;
    memcpy(n->token, base->token, sizeof(n->token));
    if (len)
        memcpy(n->msg, msg, len);
    pthread_mutex_lock(&g_lock);
    struct loop_engine *t = p->target;
    if (t) {
        *t->inbox_tail = n;
        t->inbox_tail = &n->next;
        signal_efd(t);
    }
    pthread_mutex_unlock(&g_lock);
    if (!t) {
        free(n);
        check_gone(p);
        return base->status;
    }
    return KVR_OK;
}

static bool loop_peer_idle(kvr_xfer_peer_t *base)
{
    return base->inflight == 0 || base->status != KVR_OK;
}

static int loop_progress(kvr_xfer_engine_t *base)
{
    struct loop_engine *e = le(base);
    int n = 0;
    if (e->efd >= 0) {
        uint64_t v;
        ssize_t r = read(e->efd, &v, sizeof(v));
        (void)r;
    }
    n += run_pending(e, NULL);
    if (e->inbox) { /* unlocked peek: a miss is seen on the next call */
        pthread_mutex_lock(&g_lock);
        struct loop_notif *list = e->inbox;
        e->inbox = NULL;
        e->inbox_tail = &e->inbox;
        pthread_mutex_unlock(&g_lock);
        while (list) {
            struct loop_notif *next = list->next;
            if (kvr_xfer_token_ok(base, list->token)) /* require_token: introduced only */
                kvr_xfer_deliver_notif(base, list->msg, list->len, list->token);
            free(list);
            list = next;
            n++;
        }
    }
    for (struct kvr_xfer_link *l = base->peers.next; l != &base->peers; l = l->next) {
        kvr_xfer_peer_t *p = container_of(l, kvr_xfer_peer_t, link);
        if (p->status == KVR_OK && atomic_load(&lp(p)->gone)) {
            check_gone(lp(p));
            n++;
        }
    }
    return n;
}

const struct kvr_xfer_ops kvr_xfer_loop_ops = {
    .name = "loop",
    .id = 1,
    .engine_size = sizeof(struct loop_engine),
    .mem_size = sizeof(struct loop_mem),
    .peer_size = sizeof(struct loop_peer),
    .rmem_size = sizeof(struct loop_rmem),
    .dlist_size = sizeof(struct loop_dlist),
    .engine_init = loop_engine_init,
    .engine_fini = loop_engine_fini,
    .address = loop_address,
    .mem_reg = loop_mem_reg,
    .mem_dereg = loop_mem_dereg,
    .mem_pack = loop_mem_pack,
    .connect = loop_connect,
    .disconnect = loop_disconnect,
    .rmem_unpack = loop_rmem_unpack,
    .rmem_release = loop_rmem_release,
    .dlist_release = loop_dlist_release,
    .post = loop_post,
    .notify = loop_notify,
    .peer_idle = loop_peer_idle,
    .progress = loop_progress,
    .event_fd = loop_event_fd,
};
