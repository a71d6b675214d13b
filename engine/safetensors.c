/*
 * safetensors.c - memory-maps a .safetensors file read-only and validates
 * its header: every tensor's dtype, shape and data offsets are checked
 * against the file before any of it is used, so a truncated or corrupt file
 * gives an error naming the file and the tensor instead of a crash later.
 * The tensor list is sorted by name for bsearch lookups.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_json.h"

#define ST_MAX_HEADER (100u << 20)

#define ERR(...)                                                                                   \
    do {                                                                                           \
        if (err && err_len)                                                                        \
            snprintf(err, err_len, __VA_ARGS__);                                                   \
    } while (0)

const char *kvr_dtype_name(int32_t dtype)
{
    switch (dtype) {
    case KVR_DT_F32:
        return "f32";
    case KVR_DT_F16:
        return "f16";
    case KVR_DT_BF16:
        return "bf16";
    default:
        return "?";
    }
}

size_t kvr_dtype_size(int32_t dtype)
{
    return dtype == KVR_DT_F32 ? 4 : 2;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const struct kvr_st_tensor *)a)->name, ((const struct kvr_st_tensor *)b)->name);
}

void kvr_st_close(struct kvr_st_file *f)
{
    if (!f)
        return;
    if (f->map && f->map != MAP_FAILED)
        munmap(f->map, f->map_len);
    free(f->tensors);
    free(f->names);
    free(f->path);
    free(f);
}

static kvr_status_t parse_entry(const char *path, const char *name, const kvr_json_t *e,
                                size_t data_len, const unsigned char *data, struct kvr_st_tensor *t,
                                char *err, size_t err_len)
{
    if (e->type != KVR_JSON_OBJECT) {
        ERR("%s: tensor '%s': header entry is not an object", path, name);
        return KVR_ERR_INVALID;
    }
    const kvr_json_t *dt = kvr_json_get(e, "dtype");
    const kvr_json_t *shape = kvr_json_get(e, "shape");
    const kvr_json_t *offs = kvr_json_get(e, "data_offsets");
    if (!dt || dt->type != KVR_JSON_STRING) {
        ERR("%s: tensor '%s': missing or non-string \"dtype\"", path, name);
        return KVR_ERR_INVALID;
    }
    if (strcmp(dt->str, "F32") == 0) {
        t->dtype = KVR_DT_F32;
    } else if (strcmp(dt->str, "F16") == 0) {
        t->dtype = KVR_DT_F16;
    } else if (strcmp(dt->str, "BF16") == 0) {
        t->dtype = KVR_DT_BF16;
    } else {
        ERR("%s: tensor '%s': dtype \"%s\" not supported (F32, F16, BF16)", path, name, dt->str);
        return KVR_ERR_UNSUPPORTED;
    }
    if (!shape || shape->type != KVR_JSON_ARRAY || shape->n > KVR_ST_MAX_DIMS) {
        ERR("%s: tensor '%s': \"shape\" missing, not an array or more than %d dims", path, name,
            KVR_ST_MAX_DIMS);
        return KVR_ERR_INVALID;
    }
    uint64_t numel = 1;
    t->n_dims = (int32_t)shape->n;
    for (size_t i = 0; i < shape->n; i++) {
        const kvr_json_t *d = shape->items[i];
        if (d->type != KVR_JSON_NUMBER || !d->is_int || d->i64 < 0 || d->i64 > (1ll << 40)) {
            ERR("%s: tensor '%s': shape[%zu] is not a valid dimension", path, name, i);
            return KVR_ERR_INVALID;
        }
        t->shape[i] = d->i64;
        numel *= (uint64_t)d->i64;
        if (numel > (1ull << 40)) {
            ERR("%s: tensor '%s': shape too large", path, name);
            return KVR_ERR_INVALID;
        }
    }
    if (!offs || offs->type != KVR_JSON_ARRAY || offs->n != 2) {
        ERR("%s: tensor '%s': \"data_offsets\" missing or not [begin, end]", path, name);
        return KVR_ERR_INVALID;
    }
    const kvr_json_t *b = offs->items[0], *en = offs->items[1];
    if (b->type != KVR_JSON_NUMBER || !b->is_int || en->type != KVR_JSON_NUMBER || !en->is_int ||
        b->i64 < 0 || en->i64 < b->i64) {
        ERR("%s: tensor '%s': data_offsets are not integers 0 <= begin <= end", path, name);
        return KVR_ERR_INVALID;
    }
    if ((uint64_t)en->i64 > data_len) {
        ERR("%s: tensor '%s': data_offsets end %lld beyond the data region (%zu bytes): file "
            "truncated?",
            path, name, (long long)en->i64, data_len);
        return KVR_ERR_INVALID;
    }
    uint64_t want = numel * kvr_dtype_size(t->dtype);
    if ((uint64_t)(en->i64 - b->i64) != want) {
        ERR("%s: tensor '%s': data_offsets span %lld bytes but shape and dtype need %llu", path,
            name, (long long)(en->i64 - b->i64), (unsigned long long)want);
        return KVR_ERR_INVALID;
    }
    t->data = data + b->i64;
    t->nbytes = (size_t)want;
    return KVR_OK;
}

kvr_status_t kvr_st_open(const char *path, struct kvr_st_file **file_p, char *err, size_t err_len)
{
    kvr_status_t st = KVR_OK;
    kvr_json_doc_t *doc = NULL;
    struct kvr_st_file *f = calloc(1, sizeof(*f));
    if (!f)
        return KVR_ERR_NO_MEMORY;
    f->path = strdup(path);
    if (!f->path) {
        st = KVR_ERR_NO_MEMORY;
        goto err_free;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = errno == ENOENT ? KVR_ERR_NOT_FOUND : KVR_ERR_IO;
        ERR("%s: %s", path, strerror(errno));
        goto err_free;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        ERR("%s: fstat: %s", path, strerror(errno));
        close(fd);
        st = KVR_ERR_IO;
        goto err_free;
    }
    if (sb.st_size < 8) {
        ERR("%s: file is %lld bytes, too short for a safetensors header", path,
            (long long)sb.st_size);
        close(fd);
        st = KVR_ERR_INVALID;
        goto err_free;
    }
    f->map_len = (size_t)sb.st_size;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        ERR("%s: mmap: %s", path, strerror(errno));
        st = KVR_ERR_IO;
        goto err_free;
    }
    const unsigned char *base = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | base[i];
    if (hlen > f->map_len - 8 || hlen > ST_MAX_HEADER || hlen < 2) {
        ERR("%s: bad header length %llu (file has %zu bytes after the length field)", path,
            (unsigned long long)hlen, f->map_len - 8);
        st = KVR_ERR_INVALID;
        goto err_free;
    }
    char jerr[256];
    st = kvr_json_parse((const char *)base + 8, (size_t)hlen, &doc, jerr, sizeof(jerr));
    if (st != KVR_OK) {
        ERR("%s: header JSON: %s", path, jerr);
        goto err_free;
    }
    const kvr_json_t *root = kvr_json_root(doc);
    if (root->type != KVR_JSON_OBJECT) {
        ERR("%s: header JSON is not an object", path);
        st = KVR_ERR_INVALID;
        goto err_free;
    }
    const unsigned char *data = base + 8 + hlen;
    size_t data_len = f->map_len - 8 - (size_t)hlen;
    f->tensors = calloc(root->n ? root->n : 1, sizeof(*f->tensors));
    size_t names_len = 0;
    for (size_t i = 0; i < root->n; i++)
        names_len += root->key_lens[i] + 1;
    f->names = malloc(names_len + 1);
    if (!f->tensors || !f->names) {
        st = KVR_ERR_NO_MEMORY;
        goto err_free;
    }
    char *np = f->names;
    for (size_t i = 0; i < root->n; i++) {
        if (strcmp(root->keys[i], "__metadata__") == 0)
            continue;
        if (strlen(root->keys[i]) != root->key_lens[i]) {
            ERR("%s: a tensor name contains a NUL byte", path);
            st = KVR_ERR_INVALID;
            goto err_free;
        }
        struct kvr_st_tensor *t = &f->tensors[f->n_tensors];
        memcpy(np, root->keys[i], root->key_lens[i] + 1);
        t->name = np;
        np += root->key_lens[i] + 1;
        st = parse_entry(path, t->name, root->items[i], data_len, data, t, err, err_len);
        if (st != KVR_OK)
            goto err_free;
        f->n_tensors++;
    }
    kvr_json_free(doc);
    doc = NULL;
    qsort(f->tensors, f->n_tensors, sizeof(*f->tensors), cmp_tensor);
    for (size_t i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            ERR("%s: tensor '%s' appears twice in the header", path, f->tensors[i].name);
            st = KVR_ERR_INVALID;
            goto err_free;
        }
    }
    *file_p = f;
    return KVR_OK;
err_free:
    kvr_json_free(doc);
    kvr_st_close(f);
    return st;
}

const struct kvr_st_tensor *kvr_st_find(const struct kvr_st_file *f, const char *name)
{
    struct kvr_st_tensor key = {.name = name};
    return bsearch(&key, f->tensors, f->n_tensors, sizeof(key), cmp_tensor);
}
