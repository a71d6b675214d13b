/*
 * cublas_dl.c - kvr_cublas_load(): cuBLAS opened with dlopen (see
 * kvr_cublas_dl.h for why).  One attempt a process, under pthread_once; the
 * outcome and its message are kept for later callers.
 */
#define KVR_CUBLAS_DL_IMPL
#include "kvr_cublas_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KVR_STR_(x)   #x
#define KVR_STR(x)    KVR_STR_(x)
#define CUBLAS_SONAME "libcublas.so." KVR_STR(CUBLAS_VER_MAJOR)

struct kvr_cublas_fns kvr_cublas;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static kvr_status_t g_status = KVR_ERR_NOT_FOUND;
static char g_err[512];

static void *open_cublas(void)
{
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h)
        return h;
    char first[256];
    snprintf(first, sizeof first, "%s", dlerror());
#ifdef KVR_CUDA_LIBDIR
    h = dlopen(KVR_CUDA_LIBDIR "/" CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h)
        return h;
#endif
    snprintf(g_err, sizeof g_err,
             "%s: install the CUDA %d cuBLAS runtime (libcublas, libcublasLt) where the loader "
             "finds it (ldconfig or LD_LIBRARY_PATH), or run on device: cpu",
             first, CUBLAS_VER_MAJOR);
    return NULL;
}

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p && !g_err[0])
        snprintf(g_err, sizeof g_err,
                 "%s has no symbol %s: a cuBLAS older than the %d.%d headers this build used; "
                 "install the CUDA %d cuBLAS runtime",
                 CUBLAS_SONAME, name, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_MAJOR);
    return p;
}

static void load_once(void)
{
    void *h = open_cublas();
    if (!h)
        return;
    struct kvr_cublas_fns f;
    /* dlsym returns void *; the members are function pointers (POSIX lets
     * the one convert to the other), copied through memcpy to say so */
    void *p[6] = {sym(h, "cublasCreate_v2"),    sym(h, "cublasDestroy_v2"),
                  sym(h, "cublasSetStream_v2"), sym(h, "cublasSetMathMode"),
                  sym(h, "cublasGemmEx"),       sym(h, "cublasGetStatusString")};
    for (size_t i = 0; i < 6; i++)
        if (!p[i]) {
            dlclose(h);
            return;
        }
    _Static_assert(sizeof f == sizeof p, "one pointer a cuBLAS entry point");
    memcpy(&f, p, sizeof f);
    kvr_cublas = f;
    g_status = KVR_OK;
}

kvr_status_t kvr_cublas_load(char *err, size_t err_len)
{
    pthread_once(&g_once, load_once);
    if (g_status != KVR_OK && err && err_len)
        snprintf(err, err_len, "%s", g_err);
    return g_status;
}
