/*
 * cuda_ipc.c - the "cuda_ipc" transfer backend: KV blocks from device
 * memory to device memory between processes of one host, by CUDA IPC.
 *
 * Memory.  A KVR_MEM_CUDA region is exported as a CUDA IPC handle
 * (cudaIpcGetMemHandle) of the allocation around it, with the region's
 * offset in that allocation (cuMemGetAddressRange, looked up in the driver
 * at run time so the binary needs no driver to start); the rkey blob
 * carries both.  A peer maps it once (cudaIpcOpenMemHandle; one mapping a
 * handle per process, shared and counted across rkeys).  A host region may
 * be registered as a local source or destination (pinned with
 * cudaHostRegister) but cannot be packed: remote host memory is another
 * backend's (ucx).  kvr_xfer_mem_alloc gives zeroed device memory
 * (cudaMalloc) for KVR_MEM_CUDA - a decode node's KV pool in HBM - and
 * pinned host memory for KVR_MEM_HOST.
 *
 * Data.  A post queues one cudaMemcpyAsync per coalesced segment on the
 * engine's stream (device to device; the GPU's copy engines, over NVLink or
 * PCIe when the peer's region is on another GPU) and records an event after
 * them; progress completes the list when its event has fired.
 *
 * Notifications.  Each engine has an abstract-namespace Unix datagram socket
 * (its name and the host's boot id are the address blob; a peer of another
 * host is refused at connect).  A notification records an event on the
 * stream behind every copy posted before it and is sent by progress only
 * once that event has fired, in order: the peer reads it after the data is
 * in its memory.  Datagrams from another user are dropped (SO_PASSCRED).
 * Each datagram begins with the connection's per-pair token (16 bytes,
 * zeros: none): checked with require_token (xfer_token.c) and handed to
 * the notification callback, which binds the notification to its sender.
 * The engine has no event fd (copy completions do not wake a poll): its
 * owner polls progress.
 *
 * What runs without a GPU: the engine, its socket and address, connect,
 * notifications with no copy before them (no CUDA call is made until the
 * first registration of device memory or post).  Everything with device
 * memory needs one (tests/gpu/test_cuda_ipc.c says which is which).
 */
#include "cuda_ipc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "kvr_clock.h"
#include "kvr_cuda.h"
#include "kvr_log.h"

#define COMP       "cuda_ipc"
#define ADDR_MAGIC 0x4b564349u /* "KVCI" */
#define RKEY_MAGIC 0x4b564352u /* "KVCR" */

struct ci_addr {
    uint32_t magic;
    uint32_t pid;
    uint64_t engine_id;
    char boot_id[40];
    char sock[64]; /* abstract name, without the leading NUL */
};

struct ci_rkey {
    uint32_t magic;
    int32_t device;
    uint64_t offset; /* of the region in the exported allocation */
    cudaIpcMemHandle_t handle;
};

/* one mapping of a peer's allocation, shared by every rmem of it (process-wide) */
struct ci_import {
    cudaIpcMemHandle_t handle;
    void *base;
    int refs;
    struct ci_import *next;
};

struct ci_notif {
    struct ci_notif *next;
    kvr_xfer_peer_t *peer;
    cudaEvent_t ev; /* NULL: nothing was posted before it */
    size_t len;
    uint8_t token[KVR_XFER_TOKEN_LEN]; /* the connection's, sent first */
    unsigned char msg[];
};

struct ci_dlist {
    struct kvr_xfer_dlist base;
    cudaEvent_t ev;
    struct ci_dlist *next; /* the engine's in-flight lists */
    bool queued;
};

struct ci_engine {
    struct kvr_xfer_engine base;
    uint64_t id;
    int sock;
    struct ci_addr addr;
    cudaStream_t stream; /* created with the first device work */
    bool cuda;           /* stream exists */
    struct ci_dlist *inflight;
    struct ci_notif *nq, **nq_tail; /* notifications waiting for their event */
};

struct ci_mem {
    struct kvr_xfer_mem base;
    struct ci_rkey key;
    bool host_registered;
    bool owned; /* allocated by mem_alloc: freed at dereg */
};

struct ci_peer {
    struct kvr_xfer_peer base;
    struct sockaddr_un to;
    socklen_t to_len;
};

struct ci_rmem {
    struct kvr_xfer_rmem base;
    struct ci_import *imp;
    char *local; /* where offset 0 of the remote region is mapped here */
};

static atomic_uint_fast64_t g_next_id = 1;
static pthread_mutex_t g_imp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ci_import *g_imports;

static struct ci_engine *ce(kvr_xfer_engine_t *e)
{
    return container_of(e, struct ci_engine, base);
}

static struct ci_peer *cp(kvr_xfer_peer_t *p)
{
    return container_of(p, struct ci_peer, base);
}

static void read_boot_id(char out[40])
{
    memset(out, 0, 40);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(out, 40, f))
            out[0] = 0;
        fclose(f);
    }
    out[strcspn(out, "\n")] = 0;
}

/* The stream and device binding of the engine's thread, made on first use. */
static kvr_status_t ensure_cuda(struct ci_engine *e)
{
    if (e->cuda)
        return KVR_OK;
    kvr_status_t s = kvr_cuda_bind();
    if (s != KVR_OK) {
        KVR_LOG_ERROR(COMP, "%s: no GPU opened in this process (kvr_cuda_device_open first)",
                      e->base.name);
        return s;
    }
    KVR_CUDA_CHECK(cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking));
    e->cuda = true;
    return KVR_OK;
}

/* --- engine --- */

static kvr_status_t ci_engine_init(kvr_xfer_engine_t *base)
{
    struct ci_engine *e = ce(base);
    if (base->cfg.require_rdma) {
        KVR_LOG_ERROR(COMP, "%s: require_rdma: cuda_ipc copies on one host, no RDMA", base->name);
        return KVR_ERR_NO_RDMA;
    }
    e->sock = -1;
    e->nq_tail = &e->nq;
    e->id = atomic_fetch_add(&g_next_id, 1);
    e->addr.magic = ADDR_MAGIC;
    e->addr.pid = (uint32_t)getpid();
    e->addr.engine_id = e->id;
    read_boot_id(e->addr.boot_id);
    /* pid, engine and start time: a restarted process (same pid) gets
     * another name, so a peer of its previous life cannot reach it */
    snprintf(e->addr.sock, sizeof e->addr.sock, "kvrail-cuda-ipc-%u-%llu-%08x", (unsigned)getpid(),
             (unsigned long long)e->id, (unsigned)(kvr_now_ns() & 0xffffffffu));
    e->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (e->sock < 0) {
        KVR_LOG_ERROR(COMP, "%s: socket: %s", base->name, strerror(errno));
        return KVR_ERR_IO;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(e->addr.sock);
    memcpy(sa.sun_path + 1, e->addr.sock, n);
    int one = 1;
    int rcvbuf = 4 << 20;
    if (bind(e->sock, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0 ||
        setsockopt(e->sock, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0 ||
        setsockopt(e->sock, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) != 0) {
        KVR_LOG_ERROR(COMP, "%s: bind @%s: %s", base->name, e->addr.sock, strerror(errno));
        close(e->sock);
        e->sock = -1;
        return KVR_ERR_IO;
    }
    return KVR_OK;
}

static void ci_engine_fini(kvr_xfer_engine_t *base)
{
    struct ci_engine *e = ce(base);
    while (e->nq) {
        struct ci_notif *n = e->nq;
        e->nq = n->next;
        if (n->ev)
            cudaEventDestroy(n->ev);
        free(n);
    }
    if (e->cuda) {
        cudaStreamSynchronize(e->stream);
        cudaStreamDestroy(e->stream);
    }
    if (e->sock >= 0)
        close(e->sock);
}

static kvr_status_t ci_address(kvr_xfer_engine_t *base, void **buf_p, size_t *len_p)
{
    struct ci_addr *a = malloc(sizeof *a);
    if (!a)
        return KVR_ERR_NO_MEMORY;
    *a = ce(base)->addr;
    *buf_p = a;
    *len_p = sizeof *a;
    return KVR_OK;
}

/* --- memory --- */

/* cuMemGetAddressRange from the driver the runtime has loaded (not linked:
 * the binary starts without a driver) */
typedef int (*get_range_fn)(unsigned long long *base, size_t *size, unsigned long long ptr);

static kvr_status_t ci_mem_reg(kvr_xfer_mem_t *base)
{
    struct ci_mem *m = container_of(base, struct ci_mem, base);
    struct ci_engine *e = ce(base->engine);
    kvr_status_t s = ensure_cuda(e);
    if (s != KVR_OK)
        return s;
    if (base->kind == KVR_MEM_HOST) {
        /* a local staging source/destination; never packed */
        cudaError_t ce_ = cudaHostRegister(base->addr, base->len, cudaHostRegisterDefault);
        if (ce_ != cudaSuccess)
            return kvr_cuda_fail(ce_, "cudaHostRegister", __FILE__, __LINE__);
        m->host_registered = true;
        return KVR_OK;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    get_range_fn fn = NULL;
    if (lib) { /* POSIX's way from dlsym's void * to a function pointer */
        void *sym = dlsym(lib, "cuMemGetAddressRange_v2");
        memcpy(&fn, &sym, sizeof fn);
    }
    unsigned long long abase = 0;
    size_t asize = 0;
    int rr = fn ? fn(&abase, &asize, (unsigned long long)(uintptr_t)base->addr) : -1;
    if (lib)
        dlclose(lib);
    if (rr != 0) {
        KVR_LOG_ERROR(COMP,
                      "%s: mem_reg: %p is not device memory of this process (cuMemGetAddressRange)",
                      base->engine->name, base->addr);
        return KVR_ERR_INVALID;
    }
    if ((uintptr_t)base->addr + base->len > abase + asize) {
        KVR_LOG_ERROR(COMP, "%s: mem_reg: [%p, +%zu) runs past its allocation", base->engine->name,
                      base->addr, base->len);
        return KVR_ERR_OUT_OF_RANGE;
    }
    m->key.magic = RKEY_MAGIC;
    m->key.device = base->device;
    m->key.offset = (uint64_t)((uintptr_t)base->addr - abase);
    KVR_CUDA_CHECK(cudaIpcGetMemHandle(&m->key.handle, (void *)(uintptr_t)abase));
    return KVR_OK;
}

static void ci_mem_dereg(kvr_xfer_mem_t *base)
{
    struct ci_mem *m = container_of(base, struct ci_mem, base);
    if (m->owned) {
        if (base->kind == KVR_MEM_CUDA)
            cudaFree(base->addr);
        else
            cudaFreeHost(base->addr);
    } else if (m->host_registered) {
        cudaHostUnregister(base->addr);
    }
}

/* Device memory (cudaMalloc, zeroed) for KVR_MEM_CUDA, exported as above;
 * pinned host memory (cudaMallocHost, local only) for KVR_MEM_HOST. */
static kvr_status_t ci_mem_alloc(kvr_xfer_mem_t *base)
{
    struct ci_mem *m = container_of(base, struct ci_mem, base);
    kvr_status_t s = ensure_cuda(ce(base->engine));
    if (s != KVR_OK)
        return s;
    if (base->kind == KVR_MEM_HOST) {
        KVR_CUDA_CHECK(cudaMallocHost(&base->addr, base->len));
        memset(base->addr, 0, base->len);
        m->owned = true;
        return KVR_OK;
    }
    KVR_CUDA_CHECK(cudaMalloc(&base->addr, base->len));
    cudaError_t e = cudaMemset(base->addr, 0, base->len);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        cudaFree(base->addr);
        return kvr_cuda_fail(e, "cudaMemset of a new region", __FILE__, __LINE__);
    }
    s = ci_mem_reg(base);
    if (s != KVR_OK) {
        cudaFree(base->addr);
        return s;
    }
    m->owned = true;
    return KVR_OK;
}

static kvr_status_t ci_mem_pack(kvr_xfer_mem_t *base, void **buf_p, size_t *len_p)
{
    struct ci_mem *m = container_of(base, struct ci_mem, base);
    if (base->kind != KVR_MEM_CUDA) {
        KVR_LOG_ERROR(COMP, "%s: mem_pack: host memory is not reachable by cuda_ipc peers",
                      base->engine->name);
        return KVR_ERR_UNSUPPORTED;
    }
    struct ci_rkey *k = malloc(sizeof *k);
    if (!k)
        return KVR_ERR_NO_MEMORY;
    *k = m->key;
    *buf_p = k;
    *len_p = sizeof *k;
    return KVR_OK;
}

/* --- peers --- */

static kvr_status_t ci_connect(kvr_xfer_peer_t *base, const void *addr, size_t len)
{
    struct ci_peer *p = cp(base);
    struct ci_engine *e = ce(base->engine);
    struct ci_addr a;
    if (len != sizeof a) {
        KVR_LOG_ERROR(COMP, "%s: connect: address of %zu bytes, want %zu", base->engine->name, len,
                      sizeof a);
        return KVR_ERR_INVALID;
    }
    memcpy(&a, addr, sizeof a);
    if (a.magic != ADDR_MAGIC || !memchr(a.sock, 0, sizeof a.sock) ||
        !memchr(a.boot_id, 0, sizeof a.boot_id)) {
        KVR_LOG_ERROR(COMP, "%s: connect: not a cuda_ipc address", base->engine->name);
        return KVR_ERR_INVALID;
    }
    if (strcmp(a.boot_id, e->addr.boot_id) != 0 || !e->addr.boot_id[0]) {
        KVR_LOG_ERROR(COMP,
                      "%s: connect: the peer runs on another host (boot id %s, here %s); "
                      "cuda_ipc reaches GPUs of this host only: use ucx or verbs",
                      base->engine->name, a.boot_id, e->addr.boot_id);
        return KVR_ERR_UNSUPPORTED;
    }
    memset(&p->to, 0, sizeof p->to);
    p->to.sun_family = AF_UNIX;
    size_t n = strlen(a.sock);
    memcpy(p->to.sun_path + 1, a.sock, n);
    p->to_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    snprintf(base->transports, sizeof base->transports, "cuda_ipc/copy-engine");
    KVR_LOG_INFO(COMP, "%s: connected to pid %u engine %llu over cuda_ipc", base->engine->name,
                 a.pid, (unsigned long long)a.engine_id);
    return KVR_OK;
}

static void ci_disconnect(kvr_xfer_peer_t *base)
{
    struct ci_engine *e = ce(base->engine);
    /* notifications still queued for it are dropped */
    for (struct ci_notif **pp = &e->nq; *pp;) {
        struct ci_notif *n = *pp;
        if (n->peer != base) {
            pp = &n->next;
            continue;
        }
        *pp = n->next;
        if (n->ev)
            cudaEventDestroy(n->ev);
        free(n);
    }
    e->nq_tail = &e->nq;
    while (*e->nq_tail)
        e->nq_tail = &(*e->nq_tail)->next;
}

static kvr_status_t ci_rmem_unpack(kvr_xfer_rmem_t *base, const void *buf, size_t len)
{
    struct ci_rmem *r = container_of(base, struct ci_rmem, base);
    struct ci_rkey k;
    if (len != sizeof k) {
        KVR_LOG_ERROR(COMP, "rmem_unpack: rkey of %zu bytes, want %zu", len, sizeof k);
        return KVR_ERR_INVALID;
    }
    memcpy(&k, buf, sizeof k);
    if (k.magic != RKEY_MAGIC || base->kind != KVR_MEM_CUDA) {
        KVR_LOG_ERROR(COMP, "rmem_unpack: not a cuda_ipc device rkey");
        return KVR_ERR_INVALID;
    }
    kvr_status_t s = ensure_cuda(ce(base->peer->engine));
    if (s != KVR_OK)
        return s;
    pthread_mutex_lock(&g_imp_lock);
    struct ci_import *imp = g_imports;
    while (imp && memcmp(&imp->handle, &k.handle, sizeof k.handle) != 0)
        imp = imp->next;
    if (!imp) {
        imp = calloc(1, sizeof *imp);
        cudaError_t e =
            imp ? cudaIpcOpenMemHandle(&imp->base, k.handle, cudaIpcMemLazyEnablePeerAccess)
                : cudaErrorMemoryAllocation;
        if (e != cudaSuccess) {
            pthread_mutex_unlock(&g_imp_lock);
            free(imp);
            return kvr_cuda_fail(e, "cudaIpcOpenMemHandle", __FILE__, __LINE__);
        }
        imp->handle = k.handle;
        imp->next = g_imports;
        g_imports = imp;
    }
    imp->refs++;
    pthread_mutex_unlock(&g_imp_lock);
    r->imp = imp;
    r->local = (char *)imp->base + k.offset;
    return KVR_OK;
}

static void ci_rmem_release(kvr_xfer_rmem_t *base)
{
    struct ci_rmem *r = container_of(base, struct ci_rmem, base);
    pthread_mutex_lock(&g_imp_lock);
    if (--r->imp->refs == 0) {
        for (struct ci_import **pp = &g_imports; *pp; pp = &(*pp)->next)
            if (*pp == r->imp) {
                *pp = r->imp->next;
                break;
            }
        cudaIpcCloseMemHandle(r->imp->base);
        free(r->imp);
    }
    pthread_mutex_unlock(&g_imp_lock);
}

/* --- data path --- */

static void inflight_remove(struct ci_engine *e, struct ci_dlist *d)
{
    if (!d->queued)
        return;
    for (struct ci_dlist **pp = &e->inflight; *pp; pp = &(*pp)->next)
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    d->queued = false;
    d->base.peer->inflight--;
}

static kvr_status_t ci_post(kvr_xfer_dlist_t *base)
{
    struct ci_dlist *d = container_of(base, struct ci_dlist, base);
    struct ci_engine *e = ce(base->peer->engine);
    if (base->peer->status != KVR_OK)
        return base->peer->status;
    kvr_status_t s = ensure_cuda(e);
    if (s != KVR_OK)
        return s;
    if (!d->ev)
        KVR_CUDA_CHECK(cudaEventCreateWithFlags(&d->ev, cudaEventDisableTiming));
    for (size_t i = 0; i < base->nseg; i++) {
        const struct kvr_xfer_seg *g = &base->segs[i];
        struct ci_rmem *r = container_of(g->rmem, struct ci_rmem, base);
        char *remote = r->local + (g->raddr - g->rmem->addr);
        void *dst = base->op == KVR_XFER_WRITE ? (void *)remote : g->laddr;
        const void *src =
            base->op == KVR_XFER_WRITE ? (const void *)g->laddr : (const void *)remote;
        KVR_CUDA_CHECK(cudaMemcpyAsync(dst, src, g->len, cudaMemcpyDefault, e->stream));
    }
    KVR_CUDA_CHECK(cudaEventRecord(d->ev, e->stream));
    d->next = e->inflight;
    e->inflight = d;
    d->queued = true;
    base->peer->inflight++;
    return KVR_INPROGRESS;
}

static void ci_dlist_release(kvr_xfer_dlist_t *base)
{
    struct ci_dlist *d = container_of(base, struct ci_dlist, base);
    struct ci_engine *e = ce(base->peer->engine);
    if (d->queued && d->ev)
        cudaEventSynchronize(d->ev); /* the copies read the list's memory */
    inflight_remove(e, d);
    if (d->ev)
        cudaEventDestroy(d->ev);
}

static kvr_status_t ci_notify(kvr_xfer_peer_t *base, const void *msg, size_t len)
{
    struct ci_engine *e = ce(base->engine);
    if (base->status != KVR_OK)
        return base->status;
    struct ci_notif *n = malloc(sizeof *n + len);
    if (!n)
        return KVR_ERR_NO_MEMORY;
    n->next = NULL;
    n->peer = base;
    n->ev = NULL;
    n->len = len;
    memcpy(n->token, base->token, sizeof n->token);
    memcpy(n->msg, msg, len);
    if (e->cuda) { /* behind every copy posted so far */
        cudaError_t ce_ = cudaEventCreateWithFlags(&n->ev, cudaEventDisableTiming);
        if (ce_ == cudaSuccess)
            ce_ = cudaEventRecord(n->ev, e->stream);
        if (ce_ != cudaSuccess) {
            if (n->ev)
                cudaEventDestroy(n->ev);
            free(n);
            return kvr_cuda_fail(ce_, "notify: cudaEventRecord", __FILE__, __LINE__);
        }
    }
    *e->nq_tail = n;
    e->nq_tail = &n->next;
    base->inflight++;
    return KVR_OK;
}

static bool ci_peer_idle(kvr_xfer_peer_t *base)
{
    return base->inflight == 0 || base->status != KVR_OK;
}

/* sends the queued notifications whose copies are done, in order */
static int flush_notifs(struct ci_engine *e)
{
    int done = 0;
    while (e->nq) {
        struct ci_notif *n = e->nq;
        if (n->ev) {
            cudaError_t q = cudaEventQuery(n->ev);
            if (q == cudaErrorNotReady)
                break;
            if (q != cudaSuccess) {
                kvr_cuda_fail(q, "notify: the copies before it", __FILE__, __LINE__);
                kvr_xfer_peer_fail(n->peer, kvr_cuda_status(q),
                                   "a copy before a notification failed");
            }
        }
        if (n->peer->status == KVR_OK) {
            struct iovec iov[2] = {{n->token, sizeof n->token}, {n->msg, n->len}};
            struct msghdr mh = {.msg_name = &cp(n->peer)->to,
                                .msg_namelen = cp(n->peer)->to_len,
                                .msg_iov = iov,
                                .msg_iovlen = 2};
            ssize_t w = sendmsg(e->sock, &mh, 0);
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break; /* the peer's queue is full: again on the next progress */
            if (w < 0)
                kvr_xfer_peer_fail(n->peer, KVR_ERR_PEER_FAILURE, strerror(errno));
        }
        e->nq = n->next;
        if (!e->nq)
            e->nq_tail = &e->nq;
        n->peer->inflight--;
        if (n->ev)
            cudaEventDestroy(n->ev);
        free(n);
        done++;
    }
    return done;
}

/* receives notifications from processes of this user */
static int recv_notifs(struct ci_engine *e)
{
    int done = 0;
    unsigned char buf[KVR_XFER_TOKEN_LEN + KVR_XFER_NOTIF_MAX];
    union {
        char c[CMSG_SPACE(sizeof(struct ucred))];
        struct cmsghdr align;
    } ctl;
    for (;;) {
        struct iovec iov = {buf, sizeof buf};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.c, .msg_controllen = sizeof ctl.c};
        ssize_t n = recvmsg(e->sock, &mh, MSG_DONTWAIT);
        if (n < 0)
            break;
        const struct ucred *cr = NULL;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS)
                cr = (const struct ucred *)CMSG_DATA(c);
        if (!cr || cr->uid != getuid() || (mh.msg_flags & MSG_TRUNC) || n < KVR_XFER_TOKEN_LEN) {
            KVR_LOG_WARN(COMP, "%s: dropped a datagram (%s)", e->base.name,
                         !cr                      ? "no credentials"
                         : cr->uid != getuid()    ? "another user"
                         : n < KVR_XFER_TOKEN_LEN ? "shorter than its token"
                                                  : "too long");
            continue;
        }
        if (!kvr_xfer_token_ok(&e->base, buf)) /* require_token: introduced only */
            continue;
        kvr_xfer_deliver_notif(&e->base, buf + KVR_XFER_TOKEN_LEN, (size_t)n - KVR_XFER_TOKEN_LEN,
                               buf);
        done++;
    }
    return done;
}

static int ci_progress(kvr_xfer_engine_t *base)
{
    struct ci_engine *e = ce(base);
    int n = 0;
    for (struct ci_dlist **pp = &e->inflight; *pp;) {
        struct ci_dlist *d = *pp;
        cudaError_t q = cudaEventQuery(d->ev);
        if (q == cudaErrorNotReady) {
            pp = &d->next;
            continue;
        }
        *pp = d->next;
        d->queued = false;
        d->base.peer->inflight--;
        kvr_status_t s = q == cudaSuccess ? KVR_OK : kvr_cuda_fail(q, "copy", __FILE__, __LINE__);
        if (s != KVR_OK)
            kvr_xfer_peer_fail(d->base.peer, s, "a CUDA copy failed");
        kvr_xfer_dlist_complete(&d->base, s);
        n++;
    }
    n += flush_notifs(e);
    n += recv_notifs(e);
    return n;
}

const struct kvr_xfer_ops kvr_xfer_cuda_ipc_ops = {
    .name = "cuda_ipc",
    .id = 5,
    .engine_size = sizeof(struct ci_engine),
    .mem_size = sizeof(struct ci_mem),
    .peer_size = sizeof(struct ci_peer),
    .rmem_size = sizeof(struct ci_rmem),
    .dlist_size = sizeof(struct ci_dlist),
    .engine_init = ci_engine_init,
    .engine_fini = ci_engine_fini,
    .address = ci_address,
    .mem_reg = ci_mem_reg,
    .mem_dereg = ci_mem_dereg,
    .mem_pack = ci_mem_pack,
    .connect = ci_connect,
    .disconnect = ci_disconnect,
    .rmem_unpack = ci_rmem_unpack,
    .rmem_release = ci_rmem_release,
    .dlist_release = ci_dlist_release,
    .post = ci_post,
    .notify = ci_notify,
    .peer_idle = ci_peer_idle,
    .progress = ci_progress,
    .mem_alloc = ci_mem_alloc,
};
