/*
 * pool_device.h - where a node's KV pool lives: in host memory, or in the
 * HBM of the process's GPU (device: cuda:N in the cluster file, opened at
 * start by kvr_node_init).
 */
#ifndef KVR_NODE_POOL_DEVICE_H
#define KVR_NODE_POOL_DEVICE_H

/** The GPU index the pool's slabs are allocated on (KVR_MEM_CUDA through the
 *  transfer engine, no pre-fault: device memory is resident), or -1 for
 *  host memory. */
int kvr_node_pool_device(void);

#endif
