/*
 * xfer_mem.c - how the core prepares host memory for registration: huge
 * pages where the system has them and every page faulted in, once, at
 * registration / allocation, so that no first touch lands on the data path.
 *
 * A KV pool is written by a peer: on a fresh mapping every 4 KiB page costs
 * a fault (and, for shared memory, allocating and zeroing a page in the
 * page cache) the first time a put lands on it - measured on the shared
 * development machine, a 1 GiB pool touched first by puts moved 0.04 GB/s
 * while memcpy over warm memory does 10+.  Here:
 *
 *  1. madvise(MADV_HUGEPAGE) on the 2 MiB-aligned interior: transparent huge
 *     pages where /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or
 *     "always" (for shared memory: shmem_enabled "advise"/"within_size");
 *     hugetlbfs is UCX's (UCX_POSIX_HUGETLB_MODE=try allocates its shared
 *     segments from hugetlbfs when huge pages are configured);
 *  2. madvise(MADV_POPULATE_WRITE): the kernel faults every page writable in
 *     one call (no user-visible change of the contents: a registered user
 *     buffer keeps its bytes); a read-only mapping gets MADV_POPULATE_READ.
 *     Kernels before 5.14 lack both: each page is then read once.
 *
 * The faulting thread is the registering one, so first-touch placement puts
 * the pages on its NUMA node: register from the thread (and node) that uses
 * the pool.  KVR_XFER_PREFAULT=0 turns all of it off (e.g. for a pool
 * larger than the memory one wants committed at start-up).
 *
 * KVR_XFER_MEM_DEFER_PREFAULT does step 1 only; the owner then faults the
 * region piece by piece with kvr_xfer_mem_populate (step 2 on a range),
 * typically on a thread of its own while the first pieces are in use: a
 * 1 GiB pool on a VM whose first touch costs 10-16 us per 4 KiB page is
 * seconds of faulting that need not stand between start-up and service.
 */
#include "xfer_mem.h"
#include "xfer_backend.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define COMP "xfer"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define HUGE_2M (2u << 20)

bool kvr_xfer_prefault_enabled(void)
{
    const char *env = getenv("KVR_XFER_PREFAULT");
    return !env || strcmp(env, "0") != 0;
}

bool kvr_xfer_mem_advise_huge(void *addr, size_t len)
{
    uintptr_t ha = ((uintptr_t)addr + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1);
    uintptr_t he = ((uintptr_t)addr + len) & ~(uintptr_t)(HUGE_2M - 1);
    return he > ha && madvise((void *)ha, he - ha, MADV_HUGEPAGE) == 0;
}

/* Step 2 on [addr, addr+len): *populated_p tells whether every page is in. */
static kvr_status_t populate(void *addr, size_t len, const char *who, bool *populated_p)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096u;
    uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(page - 1);
    uintptr_t end = (uintptr_t)addr + len;

    *populated_p = false;
    if (madvise((void *)a, end - a, MADV_POPULATE_WRITE) == 0) {
        *populated_p = true;
    } else if (errno == ENOMEM) {
        KVR_LOG_ERROR(COMP,
                      "%s: pre-faulting %zu bytes at %p: out of memory (the pool does not fit "
                      "in this host's free memory; make it smaller)",
                      who, len, addr);
        return KVR_ERR_NO_MEMORY;
    } else if (madvise((void *)a, end - a, MADV_POPULATE_READ) == 0) {
        *populated_p = true;      /* a read-only mapping (a READ list's source) */
    } else if (errno == EINVAL) { /* kernel < 5.14: read each page */
        for (uintptr_t p = a; p < end; p += page)
            (void)*(volatile const uint8_t *)(p < (uintptr_t)addr ? (uintptr_t)addr : p);
        *populated_p = true;
    } else {
        KVR_LOG_WARN(COMP,
                     "%s: pre-faulting %zu bytes at %p failed (%s); first touches will fault "
                     "on the data path",
                     who, len, addr, strerror(errno));
    }
    return KVR_OK;
}

kvr_status_t kvr_xfer_mem_prefault(void *addr, size_t len, const char *who,
                                   struct kvr_xfer_prefault *out_p)
{
    struct kvr_xfer_prefault r = {0};
    uint64_t t0 = kvr_now_ns();
    r.thp = kvr_xfer_mem_advise_huge(addr, len);
    kvr_status_t s = populate(addr, len, who, &r.populated);
    if (s != KVR_OK)
        return s;
    r.ns = kvr_now_ns() - t0;
    KVR_LOG_DEBUG(COMP, "%s: %zu bytes at %p pre-faulted in %.1f ms (transparent huge pages %s)",
                  who, len, addr, (double)r.ns / 1e6, r.thp ? "advised" : "not available");
    if (out_p)
        *out_p = r;
    return KVR_OK;
}

kvr_status_t kvr_xfer_mem_populate(kvr_xfer_mem_t *m, size_t offset, size_t len)
{
    if (!m || m->kind != KVR_MEM_HOST || offset > m->len || len > m->len - offset) {
        KVR_LOG_ERROR(COMP, "mem_populate: %s",
                      !m                        ? "NULL region"
                      : m->kind != KVR_MEM_HOST ? "not host memory"
                                                : "range outside the region");
        return KVR_ERR_INVALID;
    }
    if (len == 0)
        return KVR_OK;
    bool populated;
    kvr_status_t s = populate((uint8_t *)m->addr + offset, len, m->engine->name, &populated);
    if (s == KVR_OK && !populated)
        s = KVR_ERR_IO; /* logged by populate */
    return s;
}
