/*
 * xfer_mem.h - host memory preparation shared by the core and the backends
 * (xfer_mem.c): transparent huge pages and pre-faulting at registration.
 */
#ifndef KVR_XFER_MEM_H
#define KVR_XFER_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

struct kvr_xfer_prefault {
    bool thp;       /* MADV_HUGEPAGE accepted on the 2 MiB-aligned interior */
    bool populated; /* every page faulted in */
    uint64_t ns;    /* time it took */
};

/** false when KVR_XFER_PREFAULT=0 is in the environment. */
bool kvr_xfer_prefault_enabled(void);

/** Advises MADV_HUGEPAGE over the 2 MiB-aligned interior of [addr,
 *  addr+len) (step 1 alone: what KVR_XFER_MEM_DEFER_PREFAULT keeps);
 *  returns whether the kernel accepted it. */
bool kvr_xfer_mem_advise_huge(void *addr, size_t len);

/** Advises huge pages over [addr, addr+len) and faults every page in
 *  writable (readable for a read-only mapping), keeping the contents.  who
 *  names the region in log lines.  A mapping that cannot be populated is
 *  warned about and left as it is (out_p->populated false).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY (logged). */
kvr_status_t kvr_xfer_mem_prefault(void *addr, size_t len, const char *who,
                                   struct kvr_xfer_prefault *out_p);

#endif
