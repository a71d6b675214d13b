/*
 * fuzz_model.c - fuzz target over model loading (engine/): the safetensors
 * header parser and config.json.
 *
 * The first byte of an input picks what the rest is:
 *   even  a .safetensors file: opened alone (kvr_st_open; every tensor it
 *         accepts must lie inside the mapping, with the size its shape and
 *         dtype say), then as the weights of the tiny model of
 *         tests/fuzz/data/model (its config.json) by kvr_model_load;
 *   odd   a config.json, loaded by kvr_model_load beside the tiny model's
 *         weights, generation_config.json and tokenizer_config.json.
 * The files are written to a private temporary directory (removed at exit);
 * a model that loads has layers, a vocabulary and a fingerprint.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_engine.h"
#include "kvr_log.h"
#include "safetensors.h"

#ifndef KVR_FUZZ_DATA
#error "KVR_FUZZ_DATA: the tests/fuzz/data directory"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char st_dir[64], cfg_dir[64];

static void join(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void cleanup(void)
{
    static const char *const names[] = {"config.json", "model.safetensors",
                                        "generation_config.json", "tokenizer_config.json"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        join(p, sizeof p, st_dir, names[i]);
        unlink(p);
        join(p, sizeof p, cfg_dir, names[i]);
        unlink(p);
    }
    rmdir(st_dir);
    rmdir(cfg_dir);
}

static void link_fixed(const char *dir, const char *name)
{
    char p[128];
    join(p, sizeof p, dir, name);
    if (symlink(name[0] == 'm'   ? KVR_FUZZ_DATA "/model/model.safetensors"
                : name[0] == 'c' ? KVR_FUZZ_DATA "/model/config.json"
                : name[0] == 'g' ? KVR_FUZZ_DATA "/model/generation_config.json"
                                 : KVR_FUZZ_DATA "/model/tokenizer_config.json",
                p) != 0) {
        perror(p);
        abort();
    }
}

static void setup_once(void)
{
    if (st_dir[0])
        return;
    kvr_log_set_level(KVR_LOG_ERROR);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(st_dir, sizeof st_dir, "%s/fuzz-model-st-XXXXXX", base);
    snprintf(cfg_dir, sizeof cfg_dir, "%s/fuzz-model-cfg-XXXXXX", base);
    if (!mkdtemp(st_dir) || !mkdtemp(cfg_dir)) {
        perror("fuzz_model: mkdtemp");
        abort();
    }
    atexit(cleanup);
    link_fixed(st_dir, "config.json");
    link_fixed(st_dir, "generation_config.json");
    link_fixed(st_dir, "tokenizer_config.json");
    link_fixed(cfg_dir, "model.safetensors");
    link_fixed(cfg_dir, "generation_config.json");
    link_fixed(cfg_dir, "tokenizer_config.json");
}

static void write_file(const char *dir, const char *name, const uint8_t *data, size_t size)
{
    char p[128];
    join(p, sizeof p, dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(p);
        abort();
    }
}

static void load_model(const char *dir)
{
    kvr_model_t *m = NULL;
    char err[512];
    if (kvr_model_load(dir, &m, err, sizeof err) != KVR_OK)
        return;
    if (kvr_model_n_layers(m) < 1 || kvr_model_vocab(m) < 1 || kvr_model_head_dim(m) < 1)
        abort();
    volatile uint64_t fp = kvr_model_fingerprint(m);
    (void)fp;
    kvr_model_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    if (size == 0)
        return 0;
    const uint8_t sel = data[0];
    data++;
    size--;
    if (sel & 1) {
        write_file(cfg_dir, "config.json", data, size);
        load_model(cfg_dir);
        return 0;
    }
    write_file(st_dir, "model.safetensors", data, size);
    char p[128];
    join(p, sizeof p, st_dir, "model.safetensors");
    struct kvr_st_file *f = NULL;
    char err[512];
    if (kvr_st_open(p, &f, err, sizeof err) == KVR_OK) {
        const unsigned char *lo = f->map, *hi = lo + f->map_len;
        for (size_t i = 0; i < f->n_tensors; i++) {
            const struct kvr_st_tensor *t = &f->tensors[i];
            const unsigned char *d = t->data;
            uint64_t numel = 1;
            for (int k = 0; k < t->n_dims; k++)
                numel *= (uint64_t)t->shape[k];
            if (d < lo || d > hi || t->nbytes > (size_t)(hi - d) ||
                t->nbytes != numel * kvr_dtype_size(t->dtype) || !kvr_st_find(f, t->name))
                abort();
        }
        kvr_st_close(f);
    }
    load_model(st_dir);
    return 0;
}
