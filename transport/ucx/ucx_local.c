/*
 * ucx_local.c - the UCX backend on one host: the pool's memory and the two
 * same-host data paths that bypass UCX's put.
 *
 * Why.  A KV pool is far larger than the caches, so a put to a peer on this
 * host runs at the speed of a copy from DRAM to DRAM - if the pages are there
 * and the MMU keeps up.  Measured on the shared development VM (1 GiB, 64
 * KiB blocks): memcpy between 4 KiB pages 0.4-2.9 GB/s (every page a TLB
 * miss, and on this nested-paging VM often a hypervisor exit), between huge
 * pages 9-13 GB/s; process_vm_writev into another process's huge pages
 * 5.4-7.2 GB/s (it pins and maps every 4 KiB page: ~0.6 x memcpy at 64 KiB,
 * and a system call costs ~1 us here).  So the pool must be shared memory
 * on huge pages, mapped by the peer.  kvr_xfer_mem_alloc picks:
 *
 *   - UCX shared memory (ucp_mem_map ALLOCATE, the posix transport) when it
 *     can be huge: /sys/kernel/mm/transparent_hugepage/shmem_enabled allows
 *     it (the core advises MADV_HUGEPAGE), or enough hugetlbfs pages are free
 *     (UCX_POSIX_HUGETLB_MODE=try takes them).  A peer maps it
 *     (ucp_rkey_ptr) and writes it with memcpy: UCX_PATH_MAPPED;
 *   - otherwise a file of the pool's own in a tmpfs mounted for it alone
 *     with huge=always (fsopen + fsmount: attached to no directory, gone
 *     with the file; huge=always of a mount holds whatever shmem_enabled
 *     says, unless it says "deny").  Registered with ucp_mem_map; the rkey
 *     carries the file's fd number and identity, and a peer on this host
 *     takes the file with pidfd_getfd (the same ptrace permission as
 *     process_vm_writev), checks its inode, maps it and writes it with
 *     memcpy: UCX_PATH_MAPPED again, 0.8-1.0 x memcpy from 64 KiB up;
 *   - when no tmpfs can be mounted (CAP_SYS_ADMIN missing) anonymous memory
 *     with MADV_HUGEPAGE, registered with ucp_mem_map: a peer process on
 *     this host writes it with process_vm_writev - one system call per post
 *     for up to IOV_MAX segments: UCX_PATH_CMA;
 *   - 4 KiB shared memory when nothing has huge pages (mapped path).
 *   KVR_UCX_POOL=shm|file|anon forces the choice (file falls back to anon).
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
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

enum pool_kind { POOL_SHM, POOL_FILE, POOL_ANON };

/* which memory a pool of len bytes gets; why says why (for the log) */
static enum pool_kind pool_choice(size_t len, char *why, size_t cap)
{
    const char *env = getenv("KVR_UCX_POOL");
    if (env && strcmp(env, "shm") == 0) {
        snprintf(why, cap, "KVR_UCX_POOL=shm");
        return POOL_SHM;
    }
    if (env && strcmp(env, "file") == 0) {
        snprintf(why, cap, "KVR_UCX_POOL=file");
        return POOL_FILE;
    }
    if (env && strcmp(env, "anon") == 0) {
        snprintf(why, cap, "KVR_UCX_POOL=anon");
        return POOL_ANON;
    }
    char shmem[32] = "", thp[32] = "";
    sysfs_choice("/sys/kernel/mm/transparent_hugepage/shmem_enabled", shmem, sizeof(shmem));
    sysfs_choice("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof(thp));
    if (strcmp(shmem, "always") == 0 || strcmp(shmem, "within_size") == 0 ||
        strcmp(shmem, "advise") == 0 || strcmp(shmem, "force") == 0) {
        snprintf(why, cap, "shared memory can have huge pages (shmem_enabled %s)", shmem);
        return POOL_SHM;
    }
    uint64_t htlb = hugetlb_free_bytes();
    if (htlb >= len) {
        snprintf(why, cap, "%llu MiB of hugetlbfs pages free", (unsigned long long)(htlb >> 20));
        return POOL_SHM;
    }
    if (strcmp(shmem, "deny") != 0) {
        snprintf(why, cap,
                 "UCX shared memory has no huge pages here (shmem_enabled %s, %llu MiB hugetlbfs "
                 "free); a tmpfs mount of the pool's own can (huge=always)",
                 shmem[0] ? shmem : "?", (unsigned long long)(htlb >> 20));
        return POOL_FILE;
    }
    if (strcmp(thp, "always") == 0 || strcmp(thp, "madvise") == 0) {
        snprintf(why, cap,
                 "shared memory has no huge pages here (shmem_enabled %s, %llu MiB hugetlbfs "
                 "free), anonymous memory has (enabled %s)",
                 shmem[0] ? shmem : "?", (unsigned long long)(htlb >> 20), thp);
        return POOL_ANON;
    }
    snprintf(why, cap, "no huge pages for any memory here (transparent_hugepage %s)",
             thp[0] ? thp : "unknown");
    return POOL_SHM;
}

/* len bytes of fd (or anonymous memory, fd -1) mapped at a 2 MiB boundary,
 * so that every page can be a huge one; NULL on failure (errno) */
static uint8_t *map_aligned(int fd, size_t len)
{
    size_t maplen = len + HUGE_2M;
    uint8_t *raw = mmap(NULL, maplen, fd < 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)raw + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
    if (fd >= 0 &&
        mmap(a, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        int err = errno;
        munmap(raw, maplen);
        errno = err;
        return NULL;
    }
    if (a > raw)
        munmap(raw, (size_t)(a - raw));
    if (raw + maplen > a + len)
        munmap(a + len, (size_t)(raw + maplen - (a + len)));
    return a;
}

/* An unlinked file of len bytes in a tmpfs mounted for it alone with
 * huge=always (fsopen/fsmount: a mount attached nowhere, gone with its last
 * file reference).  Needs CAP_SYS_ADMIN; -1 with why filled otherwise. */
static int huge_file(size_t len, char *why, size_t cap)
{
    int fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
    if (fs < 0) {
        snprintf(why, cap, "fsopen(tmpfs): %s%s", strerror(errno),
                 errno == EPERM ? " (mounting a tmpfs needs CAP_SYS_ADMIN)" : "");
        return -1;
    }
    char size[32];
    snprintf(size, sizeof(size), "%zu", len);
    int mnt = -1, fd = -1;
    if (fsconfig(fs, FSCONFIG_SET_STRING, "huge", "always", 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "size", size, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0700", 0) < 0 ||
        fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
        snprintf(why, cap, "fsconfig(tmpfs huge=always size=%s): %s", size, strerror(errno));
        goto out;
    }
    mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOEXEC | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (mnt < 0) {
        snprintf(why, cap, "fsmount(tmpfs): %s", strerror(errno));
        goto out;
    }
    fd = openat(mnt, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, cap, "O_TMPFILE in the pool's tmpfs: %s", strerror(errno));
        goto out;
    }
    if (ftruncate(fd, (off_t)len) < 0) {
        snprintf(why, cap, "ftruncate of the pool file to %zu bytes: %s", len, strerror(errno));
        close(fd);
        fd = -1;
    }
out:
    if (mnt >= 0)
        close(mnt);
    close(fs);
    return fd;
}

/* the pool in a huge-page tmpfs file; KVR_ERR_UNSUPPORTED when none can be
 * made here (why says why) */
static kvr_status_t mem_alloc_file(struct ucx_mem *m, size_t len, char *why, size_t cap)
{
    int fd = huge_file(len, why, cap);
    if (fd < 0)
        return KVR_ERR_UNSUPPORTED;
    struct stat st;
    uint8_t *a = fstat(fd, &st) == 0 ? map_aligned(fd, len) : NULL;
    if (!a) {
        snprintf(why, cap, "mmap of the %zu-byte pool file: %s", len, strerror(errno));
        close(fd);
        return KVR_ERR_UNSUPPORTED;
    }
    madvise(a, len, MADV_DONTFORK); /* a child gets none of it */
    m->base.addr = a;
    m->map = a;
    m->map_len = len;
    m->file = true;
    m->fd = fd;
    m->ino = (uint64_t)st.st_ino;
    m->dev = (uint64_t)st.st_dev;
    kvr_status_t s = ucx_mem_reg(&m->base);
    if (s != KVR_OK)
        ucx_local_mem_free(&m->base);
    return s;
}

kvr_status_t ucx_local_mem_alloc(kvr_xfer_mem_t *base)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    struct ucx_engine *e = ue(base->engine);
    if (base->kind != KVR_MEM_HOST)
        return KVR_ERR_UNSUPPORTED;
    char why[256], fwhy[160] = "";
    enum pool_kind kind = pool_choice(base->len, why, sizeof(why));
    /* 2 MiB-aligned, so that every page of the pool can be huge */
    size_t len = (base->len + HUGE_2M - 1) & ~(HUGE_2M - 1);
    if (kind == POOL_FILE) {
        kvr_status_t s = mem_alloc_file(m, len, fwhy, sizeof(fwhy));
        if (s != KVR_ERR_UNSUPPORTED) {
            if (!e->pool_logged && s == KVR_OK)
                KVR_LOG_INFO(COMP,
                             "%s: pools in huge-page tmpfs files of their own, mapped by peers on "
                             "this host (memcpy): %s",
                             e->base.name, why);
            e->pool_logged = e->pool_logged || s == KVR_OK;
            return s;
        }
        /* no tmpfs of our own here: anonymous huge pages, written by peers
         * with process_vm_writev (slower per page) */
        kind = POOL_ANON;
        size_t used = strlen(why);
        snprintf(why + used, sizeof(why) - used, ", but %s", fwhy);
    }
    if (!e->pool_logged) {
        e->pool_logged = true;
        KVR_LOG_INFO(COMP, "%s: pools from %s: %s", e->base.name,
                     kind == POOL_ANON
                         ? "anonymous memory (transparent huge pages), reached from this host "
                           "by process_vm_writev"
                         : "UCX shared memory, mapped by peers on this host",
                     why);
    }
    if (kind == POOL_SHM)
        return ucx_mem_alloc_shm(base);

    uint8_t *a = map_aligned(-1, len);
    if (!a) {
        KVR_LOG_ERROR(COMP, "%s: mmap of a %zu-byte pool: %s", e->base.name, len, strerror(errno));
        return KVR_ERR_NO_MEMORY;
    }
    madvise(a, len, MADV_HUGEPAGE); /* before any fault; the core populates */
    madvise(a, len, MADV_DONTFORK); /* a child must not turn the pool copy-on-write */
    base->addr = a;
    m->map = a;
    m->map_len = len;
    kvr_status_t s = ucx_mem_reg(base);
    if (s != KVR_OK)
        ucx_local_mem_free(base);
    return s;
}

void ucx_local_mem_free(kvr_xfer_mem_t *base)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    if (m->map)
        munmap(m->map, m->map_len);
    if (m->file)
        close(m->fd);
    m->map = NULL;
    m->file = false;
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

/* The owner's pool file, taken from its fd table (pidfd_getfd: the same
 * ptrace permission as process_vm_writev) and mapped here; false (logged)
 * when it cannot be. */
static bool map_file(struct ucx_peer *p, struct ucx_rmem *r, const struct ucx_rkey_hdr *h)
{
    const char *name = p->base.engine->name;
    if (h->fd < 0 || h->file_len < r->base.len || h->file_len > SIZE_MAX / 2) {
        KVR_LOG_WARN(COMP, "%s: pid %d's pool file: bad fd %d or length %llu (region %llu)", name,
                     (int)p->pid, (int)h->fd, (unsigned long long)h->file_len,
                     (unsigned long long)r->base.len);
        return false;
    }
    int fd = p->pid == getpid() ? fcntl(h->fd, F_DUPFD_CLOEXEC, 0)
                                : (int)syscall(SYS_pidfd_getfd, p->pidfd, h->fd, 0);
    if (fd < 0) {
        KVR_LOG_WARN(COMP,
                     "%s: pidfd_getfd of pid %d's pool file (fd %d): %s; its puts take another "
                     "path (to allow this one, run both processes as one user and allow ptrace "
                     "between them)",
                     name, (int)p->pid, (int)h->fd, strerror(errno));
        return false;
    }
    struct stat st;
    uint8_t *a = NULL;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != h->ino || (uint64_t)st.st_dev != h->dev ||
        (uint64_t)st.st_size < h->file_len) {
        KVR_LOG_WARN(COMP, "%s: pid %d's fd %d is not the pool file its rkey names", name,
                     (int)p->pid, (int)h->fd);
    } else if (!(a = map_aligned(fd, (size_t)h->file_len))) {
        KVR_LOG_WARN(COMP, "%s: mmap of pid %d's %llu-byte pool file: %s", name, (int)p->pid,
                     (unsigned long long)h->file_len, strerror(errno));
    }
    /* what the owner has already faulted in (SEEK_DATA extents) is mapped
     * here now, so that no first touch lands on the data path (a fault per
     * page: per 2 MiB where the file has huge pages, per 4 KiB where it fell
     * back); holes are left alone - populating them would allocate the part
     * of the pool its owner is still faulting in the background, here and
     * on this thread's NUMA node.  KVR_UCX_POPULATE=0: nothing populated. */
    if (a && !env_off("KVR_UCX_POPULATE")) {
        uint64_t t0 = kvr_now_ns(), done = 0;
        off_t end = (off_t)h->file_len, at = 0;
        while (at < end) {
            off_t d = lseek(fd, at, SEEK_DATA);
            if (d < 0 || d >= end)
                break;
            off_t e = lseek(fd, d, SEEK_HOLE);
            if (e < 0 || e > end)
                e = end;
            if (madvise(a + d, (size_t)(e - d), MADV_POPULATE_WRITE) != 0)
                break;
            done += (uint64_t)(e - d);
            at = e;
        }
        KVR_LOG_DEBUG(COMP, "%s: pid %d's pool file: %llu of %llu bytes populated here in %.1f ms",
                      name, (int)p->pid, (unsigned long long)done, (unsigned long long)h->file_len,
                      (double)(kvr_now_ns() - t0) / 1e6);
    }
    close(fd);
    if (!a)
        return false;
    madvise(a, (size_t)h->file_len, MADV_DONTFORK);
    r->ptr = a;
    r->map_len = (size_t)h->file_len;
    return true;
}

void ucx_local_rmem_unpack(struct ucx_peer *p, struct ucx_rmem *r, const struct ucx_rkey_hdr *h)
{
    kvr_xfer_engine_t *e = p->base.engine;
    void *ptr;
    if ((h->flags & KVR_UCX_RKEY_FILE) && p->local_ok && r->base.kind == KVR_MEM_HOST &&
        !env_off("KVR_UCX_MAPPED") && map_file(p, r, h)) {
        note_path(p, "+mapped(memcpy)",
                  "its pool file mapped here, puts are memcpys on the posting thread", r);
        return;
    }
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

void ucx_local_rmem_release(struct ucx_rmem *r)
{
    if (r->map_len)
        munmap(r->ptr, r->map_len);
    r->ptr = NULL;
    r->map_len = 0;
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
