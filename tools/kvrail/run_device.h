/*
 * run_device.h - `kvrail run --device cpu|cuda:N`: where the run computes
 * and where its KV pool lives (run_device.c).
 */
#ifndef KVR_RUN_DEVICE_H
#define KVR_RUN_DEVICE_H

#include <stddef.h>

#include "kvr_status.h"

/** Parses "cpu" (-1) or "cuda:N" (N) into *index_p; 0, or -1 with the
 *  reason printed on stderr. */
int kvr_run_device_parse(const char *s, int *index_p);

/** Opens GPU index (nothing for -1); err says why not (no CUDA in this
 *  build, no driver or GPU, no such index). */
kvr_status_t kvr_run_device_open(int index, char *err, size_t err_len);

/** The compute backend name for kvr_ctx_opts: NULL (cpu) or "cuda". */
const char *kvr_run_device_backend(int index);

/** A zeroed KV slab of bytes in the device's memory (host for -1, HBM for
 *  cuda:N), or NULL; freed by kvr_run_device_slab_free with the same index. */
void *kvr_run_device_slab(int index, size_t bytes);
void kvr_run_device_slab_free(int index, void *p);

#endif
