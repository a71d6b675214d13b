/*
 * cuda_ipc.h - the "cuda_ipc" transfer backend's ops (cuda_ipc.c), for the
 * registry in transport/xfer.c.
 */
#ifndef KVR_CUDA_IPC_H
#define KVR_CUDA_IPC_H

#include "xfer_backend.h"

extern const struct kvr_xfer_ops kvr_xfer_cuda_ipc_ops;

#endif
