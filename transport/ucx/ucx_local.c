/*
 * ucx_local.c - the UCX backend on one host: the pool's memory and the two
 * same-host data paths that bypass UCX's put.
 *
 * Why.  A KV pool is far larger than the caches, so a put to a peer on this
 * host runs at the speed of a copy from DRAM to DRAM - if the pages are there
 * and the MMU keeps up.  Measured on the shared development VM (1 GiB, 256
 * KiB blocks): memcpy between 4 KiB pages 0.1-2.6 GB/s (every page a TLB
 * miss, and on this nested-paging VM often a hypervisor exit), between
 * transparent huge pages 5-10 GB/s, process_vm_writev into another process's
 * huge pages 4.3-5.8 GB/s.  Huge pages decide it; which memory can have them
 * depends on the host, so kvr_xfer_mem_alloc picks:
 *
 *   - UCX shared memory (ucp_mem_map ALLOCATE, the posix transport) when it
 *     can be huge: /sys/kernel/mm/transparent_hugepage/shmem_enabled allows
 *     it (the core advises MADV_HUGEPAGE), or enough hugetlbfs pages are free
 *     (UCX_POSIX_HUGETLB_MODE=try takes them).  A peer maps it
 *     (ucp_rkey_ptr) and writes it with memcpy: UCX_PATH_MAPPED;
 *   - otherwise anonymous memory with MADV_HUGEPAGE (transparent huge pages
 *     "madvise" or "always"), registered with ucp_mem_map: a peer process on
 *     this host writes it with process_vm_writev - one system call per post
 *     for up to IOV_MAX segments, the kernel copying through its direct map
 *     into the huge pages: UCX_PATH_CMA;
 *   - 4 KiB shared memory when neither has huge pages (mapped path).
 *   KVR_UCX_POOL=shm|anon forces the choice.
 *
 * The paths.  Both need a peer whose death is seen: on this host, watched by
 * pidfd (ucx.c checks the watch at every post); an engine of this process
 * gets the mapped path only (its death is kvr_xfer_engine_destroy, seen by
 * UCX alone: a region it registered stays UCX's).  Both are synchronous:
 * the post returns KVR_OK with the data in the peer's memory, so a
 * notification sent after it (ordered by a release fence after memcpys, by
 * the system call otherwise) arrives after the data, and kvr_xfer_flush has
 * nothing to wait for.  A dead peer: the pidfd watch, or process_vm_writev's
 * ESRCH, gives KVR_ERR_PEER_FAILURE.  process_vm_writev access is probed at
 * rkey unpack (one byte read); a peer that refuses it (ptrace policy) keeps
 * UCX's puts, with a warning.  KVR_UCX_MAPPED=0 / KVR_UCX_CMA=0 leave the
 * respective regions to UCX.  The connection's transports gain
 * "+mapped(memcpy)" or "+cma(process_vm_writev)" when a path is used.
 */
#include "ucx_internal.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define COMP     "ucx"
#define HUGE_2M  (2ul << 20)
#define CMA_IOVS 1024 /* IOV_MAX: segments per process_vm_writev */

/* ------------------------------------------------------------------------ */
/* the pool                                                                  */

/* the bracketed word of a sysfs choice file ("always [madvise] never") */
static bool sysfs_choice(const char *path, char *out, size_t cap)
{
    char buf[256];
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *a = strchr(buf, '['), *b = a ? strchr(a, ']') : NULL;
    if (!a || !b)
        return false;
    snprintf(out, cap, "%.*s", (int)(b - a - 1), a + 1);
    return true;
}

/* free hugetlbfs bytes of the default huge page size */
static uint64_t hugetlb_free_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return 0;
    char line[128];
    unsigned long long nfree = 0, kb = 0;
    while (fgets(line, sizeof(line), f)) {
        sscanf(line, "HugePages_Free: %llu", &nfree);
        sscanf(line, "Hugepagesize: %llu kB", &kb);
    }
    fclose(f);
    return (uint64_t)nfree * kb * 1024u;
}

/* which memory a pool of len bytes gets; *why_p says why (for the log) */
static bool pool_wants_anon(size_t len, char *why, size_t cap)
{
    const char *env = getenv("KVR_UCX_POOL");
    if (env && strcmp(env, "shm") == 0) {
        snprintf(why, cap, "KVR_UCX_POOL=shm");
        return false;
    }
    if (env && strcmp(env, "anon") == 0) {
        snprintf(why, cap, "KVR_UCX_POOL=anon");
        return true;
    }
    char shmem[32] = "", thp[32] = "";
    sysfs_choice("/sys/kernel/mm/transparent_hugepage/shmem_enabled", shmem, sizeof(shmem));
    sysfs_choice("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof(thp));
    if (strcmp(shmem, "always") == 0 || strcmp(shmem, "within_size") == 0 ||
        strcmp(shmem, "advise") == 0 || strcmp(shmem, "force") == 0) {
        snprintf(why, cap, "shared memory can have huge pages (shmem_enabled %s)", shmem);
        return false;
    }
    uint64_t htlb = hugetlb_free_bytes();
    if (htlb >= len) {
        snprintf(why, cap, "%llu MiB of hugetlbfs pages free", (unsigned long long)(htlb >> 20));
        return false;
    }
    if (strcmp(thp, "always") == 0 || strcmp(thp, "madvise") == 0) {
        snprintf(why, cap,
                 "shared memory has no huge pages here (shmem_enabled %s, %llu MiB hugetlbfs "
                 "free), anonymous memory has (enabled %s)",
                 shmem[0] ? shmem : "?", (unsigned long long)(htlb >> 20), thp);
        return true;
    }
    snprintf(why, cap, "no huge pages for any memory here (transparent_hugepage %s)",
             thp[0] ? thp : "unknown");
    return false;
}

kvr_status_t ucx_local_mem_alloc(kvr_xfer_mem_t *base)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    struct ucx_engine *e = ue(base->engine);
    if (base->kind != KVR_MEM_HOST)
        return KVR_ERR_UNSUPPORTED;
    char why[256];
    bool anon = pool_wants_anon(base->len, why, sizeof(why));
    if (!e->pool_logged) {
        e->pool_logged = true;
        KVR_LOG_INFO(COMP, "%s: pools from %s: %s", e->base.name,
                     anon ? "anonymous memory (transparent huge pages), reached from this host "
                            "by process_vm_writev"
                          : "UCX shared memory, mapped by peers on this host",
                     why);
    }
    if (!anon)
        return ucx_mem_alloc_shm(base);

    /* 2 MiB-aligned, so that every page of the pool can be huge */
    size_t len = (base->len + HUGE_2M - 1) & ~(HUGE_2M - 1);
    size_t maplen = len + HUGE_2M;
    uint8_t *raw = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        KVR_LOG_ERROR(COMP, "%s: mmap of a %zu-byte pool: %s", e->base.name, maplen,
                      strerror(errno));
        return KVR_ERR_NO_MEMORY;
    }
    uint8_t *a = (uint8_t *)(((uintptr_t)raw + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
    if (a > raw)
        munmap(raw, (size_t)(a - raw));
    if ((size_t)(raw + maplen - (a + len)) > 0)
        munmap(a + len, (size_t)(raw + maplen - (a + len)));
    madvise(a, len, MADV_HUGEPAGE); /* before any fault; the core populates */
    madvise(a, len, MADV_DONTFORK); /* a child must not turn the pool copy-on-write */
    base->addr = a;
    m->anon = a;
    m->anon_len = len;
    kvr_status_t s = ucx_mem_reg(base);
    if (s != KVR_OK) {
        munmap(a, len);
        m->anon = NULL;
    }
    return s;
}

void ucx_local_mem_free(kvr_xfer_mem_t *base)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    if (m->anon)
        munmap(m->anon, m->anon_len);
    m->anon = NULL;
}

/* ------------------------------------------------------------------------ */
/* remote regions                                                            */

static void note_path(struct ucx_peer *p, const char *tag, const char *what,
                      const struct ucx_rmem *r)
{
    kvr_xfer_peer_t *pb = &p->base;
    if (strstr(pb->transports, tag))
        return;
    size_t used = strlen(pb->transports);
    snprintf(pb->transports + used, sizeof(pb->transports) - used, " %s", tag);
    KVR_LOG_INFO(COMP, "%s: pid %d's region of %llu bytes: %s (transports now %s)",
                 pb->engine->name, (int)p->pid, (unsigned long long)r->base.len, what,
                 pb->transports);
}

static bool env_off(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
}

void ucx_local_rmem_unpack(struct ucx_peer *p, struct ucx_rmem *r)
{
    kvr_xfer_engine_t *e = p->base.engine;
    void *ptr;
    if (ucp_rkey_ptr(r->rkey, r->base.addr, &ptr) == UCS_OK) {
        /* the peer's shared memory, mapped here: fault the mapping in once
         * now, so that no first touch lands on the data path */
        if (!env_off("KVR_UCX_POPULATE")) {
            uint64_t t0 = kvr_now_ns();
            uintptr_t a = (uintptr_t)ptr & ~(uintptr_t)4095;
            size_t n = (size_t)((uintptr_t)ptr + r->base.len - a);
            int rc = madvise((void *)a, n, MADV_POPULATE_WRITE);
            KVR_LOG_DEBUG(COMP, "%s: remote region of %llu bytes mapped; populated in %.1f ms%s",
                          e->name, (unsigned long long)r->base.len,
                          (double)(kvr_now_ns() - t0) / 1e6, rc == 0 ? "" : " (madvise failed)");
        }
        if (p->local_ok && !env_off("KVR_UCX_MAPPED")) {
            r->ptr = ptr;
            note_path(p, "+mapped(memcpy)", "mapped here, puts are memcpys on the posting thread",
                      r);
        }
        return;
    }
    /* (an engine of this process: its death - kvr_xfer_engine_destroy - is
     * seen only by UCX, so its puts stay UCX's) */
    if (!p->local_ok || p->pid == getpid() || r->base.kind != KVR_MEM_HOST ||
        env_off("KVR_UCX_CMA"))
        return;
    uint8_t byte;
    struct iovec l = {&byte, 1}, rv = {(void *)(uintptr_t)r->base.addr, 1};
    if (process_vm_readv(p->pid, &l, 1, &rv, 1, 0) == 1) {
        r->cma = true;
        note_path(p, "+cma(process_vm_writev)",
                  "reached with process_vm_writev, one system call per post", r);
        return;
    }
    KVR_LOG_WARN(COMP,
                 "%s: process_vm_readv of pid %d's region at 0x%llx failed (%s): puts to it go "
                 "through UCX (%s); to allow the direct copy, run both processes as one user "
                 "and allow ptrace between them (kernel.yama.ptrace_scope)",
                 e->name, (int)p->pid, (unsigned long long)r->base.addr, strerror(errno),
                 p->base.transports);
}

/* ------------------------------------------------------------------------ */
/* lists                                                                     */

kvr_status_t ucx_local_dlist_prepare(struct ucx_dlist *d)
{
    kvr_xfer_dlist_t *b = &d->base;
    bool mapped = true, cma = true;
    for (size_t i = 0; i < b->nseg; i++) {
        const struct ucx_rmem *r = container_of(b->segs[i].rmem, struct ucx_rmem, base);
        bool host = b->segs[i].lmem->kind == KVR_MEM_HOST;
        mapped = mapped && host && r->ptr;
        cma = cma && host && r->cma;
    }
    d->path = mapped ? UCX_PATH_MAPPED : cma ? UCX_PATH_CMA : UCX_PATH_UCP;
    if (d->path != UCX_PATH_CMA)
        return KVR_OK;
    d->liov = calloc(b->nseg, sizeof(*d->liov));
    d->riov = calloc(b->nseg, sizeof(*d->riov));
    if (!d->liov || !d->riov) {
        ucx_local_dlist_release(d);
        return KVR_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < b->nseg; i++) {
        d->liov[i] = (struct iovec){b->segs[i].laddr, b->segs[i].len};
        d->riov[i] = (struct iovec){(void *)(uintptr_t)b->segs[i].raddr, b->segs[i].len};
    }
    return KVR_OK;
}

void ucx_local_dlist_release(struct ucx_dlist *d)
{
    free(d->liov);
    free(d->riov);
    d->liov = d->riov = NULL;
}

static kvr_status_t post_mapped(kvr_xfer_dlist_t *b)
{
    const struct kvr_xfer_seg *g = b->segs, *end = g + b->nseg;
    if (b->op == KVR_XFER_WRITE) {
        for (; g < end; g++) {
            const struct kvr_xfer_rmem *r = g->rmem;
            memcpy(container_of(r, struct ucx_rmem, base)->ptr + (g->raddr - r->addr), g->laddr,
                   g->len);
        }
    } else {
        for (; g < end; g++) {
            const struct kvr_xfer_rmem *r = g->rmem;
            memcpy(g->laddr, container_of(r, struct ucx_rmem, base)->ptr + (g->raddr - r->addr),
                   g->len);
        }
    }
    /* the copies before anything this thread sends next (a notification) */
    atomic_thread_fence(memory_order_release);
    return KVR_OK;
}

static kvr_status_t cma_error(struct ucx_dlist *d, int err)
{
    struct ucx_peer *p = up(d->base.peer);
    if (err == ESRCH) {
        char why[64];
        snprintf(why, sizeof(why), "process %d exited", (int)p->pid);
        ucx_peer_failed(p, KVR_ERR_PEER_FAILURE, why);
        return KVR_ERR_PEER_FAILURE;
    }
    KVR_LOG_ERROR(COMP, "%s: process_vm_%s to pid %d: %s%s", p->base.engine->name,
                  d->base.op == KVR_XFER_WRITE ? "writev" : "readv", (int)p->pid, strerror(err),
                  err == EFAULT ? " (a region is no longer mapped there: deregistered?)" : "");
    return err == ENOMEM ? KVR_ERR_NO_MEMORY : KVR_ERR_IO;
}

/* one segment from byte `off` on, until done (short transfers retried) */
static kvr_status_t cma_rest(struct ucx_dlist *d, size_t i, size_t off)
{
    struct ucx_peer *p = up(d->base.peer);
    bool w = d->base.op == KVR_XFER_WRITE;
    while (off < d->liov[i].iov_len) {
        struct iovec l = {(uint8_t *)d->liov[i].iov_base + off, d->liov[i].iov_len - off};
        struct iovec r = {(uint8_t *)d->riov[i].iov_base + off, d->riov[i].iov_len - off};
        ssize_t n = w ? process_vm_writev(p->pid, &l, 1, &r, 1, 0)
                      : process_vm_readv(p->pid, &l, 1, &r, 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return cma_error(d, n < 0 ? errno : EFAULT);
        off += (size_t)n;
    }
    return KVR_OK;
}

static kvr_status_t post_cma(struct ucx_dlist *d)
{
    struct ucx_peer *p = up(d->base.peer);
    bool w = d->base.op == KVR_XFER_WRITE;
    size_t nseg = d->base.nseg;
    for (size_t i = 0; i < nseg;) {
        size_t k = nseg - i < CMA_IOVS ? nseg - i : CMA_IOVS;
        ssize_t n = w ? process_vm_writev(p->pid, d->liov + i, k, d->riov + i, k, 0)
                      : process_vm_readv(p->pid, d->liov + i, k, d->riov + i, k, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return cma_error(d, errno);
        /* whole segments done; a short transfer finishes segment by segment */
        size_t got = (size_t)n, j = i;
        while (j < i + k && got >= d->liov[j].iov_len)
            got -= d->liov[j++].iov_len;
        if (j < i + k) {
            kvr_status_t s = cma_rest(d, j, got);
            if (s != KVR_OK)
                return s;
            j++;
        }
        i = j;
    }
    return KVR_OK;
}

kvr_status_t ucx_local_post(struct ucx_dlist *d)
{
    return d->path == UCX_PATH_MAPPED ? post_mapped(&d->base) : post_cma(d);
}
