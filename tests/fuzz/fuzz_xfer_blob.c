/*
 * fuzz_xfer_blob.c - fuzz target over the transfer engine's address and
 * rkey blobs: what a peer (through the router) hands kvr_xfer_connect and
 * kvr_xfer_rmem_unpack.  The first byte picks what the rest is:
 *
 *   0  a whole blob, as received: kvr_xfer_blob_parse for every backend and
 *      kind, then kvr_xfer_connect of a UCX and a loop engine on it;
 *   1  a UCX address payload (the kvrail header, then UCX's worker address),
 *      framed with a correct checksum - so that the payload parsers, not
 *      the checksum, meet the input - and given to kvr_xfer_connect;
 *   2  a UCX rkey payload (region header + kvrail UCX header + UCX's rkey),
 *      framed and given to kvr_xfer_rmem_unpack on a connection of the
 *      engine to itself;
 *   3  a loop address payload, framed, to the loop engine's connect.
 *
 * The UCX parses run in a forked child first (transport/ucx/ucx_check.c):
 * a crash there is a refused blob, not a crash of this target; a crash
 * anywhere else is a finding.  Seeds: corpus/xfer_blob, blobs of a UCX
 * (sm,self) and a loop engine of the development VM, each behind its mode
 * byte: "ucx-rkey-file" is a pool in a huge-page tmpfs file, "ucx-rkey-anon"
 * one in anonymous memory.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_xfer.h"
#include "xfer_blob.h"

/* LeakSanitizer (libfuzzer.sh's build): the engines below live as long as
 * the process, and UCX keeps its endpoints' and interfaces' memory where
 * LeakSanitizer cannot follow (it reported them at exit), so what setup()
 * allocates is not checked; what an input allocates still is. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#define KVR_LSAN 1
#endif
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvr_xfer_engine_t *g_ucx, *g_loop;
static kvr_xfer_peer_t *g_self; /* g_ucx connected to itself */

static kvr_xfer_engine_t *engine(const char *backend)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = backend;
    cfg.name = "fuzz";
    cfg.tls = strcmp(backend, "ucx") == 0 ? "sm,self" : NULL;
    kvr_xfer_engine_t *e = NULL;
    if (kvr_xfer_engine_create(&cfg, &e) != KVR_OK)
        return NULL;
    return e;
}

static void setup(void)
{
    static int done;
    if (done)
        return;
    done = 1;
#ifdef KVR_LSAN
    __lsan_disable();
#endif
    g_loop = engine("loop");
    g_ucx = engine("ucx");
    void *a;
    size_t al;
    if (g_ucx && kvr_xfer_address(g_ucx, &a, &al) == KVR_OK) {
        if (kvr_xfer_connect(g_ucx, a, al, &g_self) != KVR_OK)
            g_self = NULL;
        free(a);
    }
#ifdef KVR_LSAN
    __lsan_enable();
#endif
}

static void try_connect(kvr_xfer_engine_t *e, const void *blob, size_t len)
{
    kvr_xfer_peer_t *p;
    if (e && kvr_xfer_connect(e, blob, len, &p) == KVR_OK)
        kvr_xfer_disconnect(p);
}

static void framed(uint16_t backend, uint16_t kind, const uint8_t *pl, size_t n)
{
    void *blob;
    size_t len;
    if (kvr_xfer_blob_frame(backend, kind, pl, n, &blob, &len) != KVR_OK)
        return;
    if (kind == KVR_XFER_BLOB_ADDRESS) {
        try_connect(backend == 2 ? g_ucx : g_loop, blob, len);
    } else if (g_self) {
        kvr_xfer_rmem_t *r;
        if (kvr_xfer_rmem_unpack(g_self, blob, len, &r) == KVR_OK)
            kvr_xfer_rmem_release(r);
    }
    free(blob);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size < 1)
        return 0;
    const uint8_t *pl = data + 1;
    size_t n = size - 1;
    switch (data[0] % 4) {
    case 0:
        for (uint16_t b = 0; b <= 4; b++)
            for (uint16_t k = 0; k <= 3; k++) {
                const void *p;
                size_t pn;
                const char *why;
                (void)kvr_xfer_blob_parse(b, k, pl, n, &p, &pn, &why);
            }
        try_connect(g_ucx, pl, n);
        try_connect(g_loop, pl, n);
        break;
    case 1: {
        /* the address names this process (bytes 4-7: pid), so that a seed
         * made by a process long gone still reaches UCX's parse */
        uint8_t *c = malloc(n + 1);
        if (!c)
            break;
        memcpy(c, pl, n);
        uint32_t pid = (uint32_t)getpid();
        if (n >= 8)
            memcpy(c + 4, &pid, 4);
        framed(2, KVR_XFER_BLOB_ADDRESS, c, n);
        free(c);
        break;
    }
    case 2:
        framed(2, KVR_XFER_BLOB_RKEY, pl, n);
        break;
    case 3:
        framed(1, KVR_XFER_BLOB_ADDRESS, pl, n);
        break;
    }
    return 0;
}
