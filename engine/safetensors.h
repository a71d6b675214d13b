/*
 * safetensors.h - private: read-only memory-mapped safetensors files.
 *
 * File format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {...}}, then the data region; offsets are relative to it.
 */
#ifndef KVR_SAFETENSORS_H
#define KVR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

enum kvr_dtype {
    KVR_DT_F32 = 0,
    KVR_DT_F16 = 1,
    KVR_DT_BF16 = 2,
};

#define KVR_ST_MAX_DIMS 8

struct kvr_st_tensor {
    const char *name; /* NUL-terminated, owned by the file */
    int32_t dtype;    /* enum kvr_dtype */
    int32_t n_dims;
    int64_t shape[KVR_ST_MAX_DIMS];
    const void *data; /* into the mapping */
    size_t nbytes;
};

struct kvr_st_file {
    char *path;
    void *map;
    size_t map_len;
    struct kvr_st_tensor *tensors;
    size_t n_tensors;
    char *names; /* storage of the tensor names */
};

/** Maps and validates path.  Checks: size >= 8, header length within the
 *  file and <= 100 MiB, header JSON an object of tensor entries, known dtype
 *  (F32/F16/BF16; others KVR_ERR_UNSUPPORTED), shape non-negative, offsets
 *  inside the data region and equal to numel * element size.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND; KVR_ERR_IO; KVR_ERR_INVALID;
 *          KVR_ERR_UNSUPPORTED; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_st_open(const char *path, struct kvr_st_file **file_p, char *err, size_t err_len);
void kvr_st_close(struct kvr_st_file *f);
/** The tensor called name, or NULL. */
const struct kvr_st_tensor *kvr_st_find(const struct kvr_st_file *f, const char *name);
/** "f32", "f16", "bf16". */
const char *kvr_dtype_name(int32_t dtype);
size_t kvr_dtype_size(int32_t dtype);

#endif
