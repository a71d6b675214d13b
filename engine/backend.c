/*
 * backend.c - the registry of compute backends: one explicit table, the CPU
 * backend always, others under their KVR_HAVE_* guard.  The default (no
 * name) is "cuda" in a process that opened a GPU (a node with device:
 * cuda:N, kvr_cuda_device_open at its start), else "cpu".
 */
#include <string.h>

#include "kvr_compute_backend.h"
#include "kvr_config.h"
#if KVR_HAVE_CUDA
#include "kvr_cuda.h"
#include "kvr_cuda_backend.h"
#endif

static const struct kvr_compute_ops *const backends[] = {
    &kvr_cpu_ops,
#if KVR_HAVE_CUDA
    &kvr_cuda_ops,
#endif
    NULL,
};

const struct kvr_compute_ops *kvr_compute_backend_find(const char *name)
{
    if (!name || !name[0]) {
        name = "cpu";
#if KVR_HAVE_CUDA
        if (kvr_cuda_device() >= 0)
            name = "cuda";
#endif
    }
    for (size_t i = 0; backends[i]; i++)
        if (strcmp(backends[i]->name, name) == 0)
            return backends[i];
    return NULL;
}
