/*
 * pool_device.c - the pool's device (pool_device.h): the process's GPU when
 * this build has CUDA and the node opened one, else host memory.
 */
#include "pool_device.h"

#include "kvr_config.h"
#if KVR_HAVE_CUDA
#include "kvr_cuda.h"
#endif

int kvr_node_pool_device(void)
{
#if KVR_HAVE_CUDA
    return kvr_cuda_device();
#else
    return -1;
#endif
}
