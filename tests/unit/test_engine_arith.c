/*
 * test_engine_arith.c - the CPU kernels compute the bits their class
 * recorded.  A node names the bit class of its kernels (kvr_engine_kernels():
 * "cpu-fma16.2", "cpu-base.2"; the suffix is KVR_CPU_ARITH_REV in
 * engine/cpu/cpu_backend.c) and the router keeps one class a cluster, so a
 * build whose kernels round one sum otherwise must carry another revision:
 * a change that moves a bit and leaves the revision as it was would put
 * nodes computing different logits into one cluster, unseen by every other
 * test (each compares a build's paths with each other).
 *
 * So this test fingerprints the bits (XXH3 over every position's prefill
 * logits, batched decode logits and the KV pool of test_seqs_run(), on f32,
 * bf16 and f16 weights, head_dim 64 and 30, odd K and N, over f32, bf16 and
 * f16 KV pools) of each class it can run here: the CPU's best kernels, the
 * baseline ones (KVR_CPU_MATMUL=base), and numerics bf16dot on bf16 weights
 * where the CPU has AVX512-BF16; and compares each with the line recorded
 * for the class in engine_arith.txt.  A fingerprint other than the one
 * recorded, or none recorded, fails with what to do: bump the revision and
 * record the lines `test_engine_arith MKMODEL RECORD --print` prints (the
 * old revisions' lines stay: a revision names one set of bits for good).
 *
 *   test_engine_arith KVRAIL_MKMODEL RECORD [--print]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "engine_test_util.h"
#include "kvr_engine.h"
#include "kvr_test.h"

static const struct {
    const char *args;
    int bf16; /* bf16 weights: numerics bf16dot applies */
} models[] = {
    {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 256 "
     "--vocab 300 --seed 21",
     0},
    {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 256 "
     "--vocab 300 --dtype bf16 --seed 22",
     1},
    {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 256 "
     "--vocab 300 --dtype f16 --seed 23",
     0},
    {"--arch qwen2 --layers 2 --hidden 120 --heads 4 --kv-heads 2 --intermediate 200 "
     "--vocab 300 --dtype f16 --seed 24",
     0},
    {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 347 "
     "--vocab 301 --seed 25",
     0},
    {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 347 "
     "--vocab 301 --dtype bf16 --seed 26",
     1},
};
#define N_MODELS (sizeof(models) / sizeof(models[0]))

/* One class to fingerprint: the kernels KVR_CPU_MATMUL names (NULL: the
 * CPU's best) under a numerics mode. */
struct cls {
    const char *matmul;
    int32_t numerics;
    char name[64]; /* kvr_engine_kernels() under matmul */
    int runs;      /* 0: not computable here */
    XXH3_state_t *h;
};

static void set_matmul(const char *v)
{
    if (v)
        setenv("KVR_CPU_MATMUL", v, 1);
    else
        unsetenv("KVR_CPU_MATMUL");
}

static void fingerprint(const char *dir, int bf16, struct cls *cl, int n_cls)
{
    char err[512];
    kvr_model_t *m;
    KVR_CHECK_STATUS(kvr_model_load(dir, &m, err, sizeof(err)), KVR_OK);
    const int32_t V = kvr_model_vocab(m), L = kvr_model_n_layers(m);
    for (int c = 0; c < n_cls; c++) {
        if (!cl[c].runs || (cl[c].numerics == KVR_NUMERICS_BF16DOT && !bf16))
            continue;
        for (int32_t dt = KVR_KV_F32; dt <= KVR_KV_BF16; dt++) {
            struct test_seqs r;
            set_matmul(cl[c].matmul);
            test_seqs_run(m, dt, cl[c].numerics, &r);
            set_matmul(NULL);
            XXH3_64bits_update(cl[c].h, r.prefill, (size_t)TEST_SEQS_NP * (size_t)V * 4);
            XXH3_64bits_update(cl[c].h, r.decode,
                               (size_t)TEST_SEQS_STEPS * TEST_SEQS_N * (size_t)V * 4);
            for (int32_t l = 0; l < L; l++)
                XXH3_64bits_update(cl[c].h, r.pool.layer_base[l],
                                   kvr_kv_layer_bytes(&r.pool.layout, TEST_SEQS_N * TEST_SEQS_NB));
            test_seqs_free(&r, L);
        }
    }
    kvr_model_destroy(m);
}

/* The fingerprint RECORD holds for (class, numerics): 1 found, 0 none. */
static int recorded(const char *path, const char *cls, const char *numerics, char *hex, size_t n)
{
    FILE *f = fopen(path, "r");
    KVR_CHECK(f != NULL);
    char line[256], c[64], nm[32], h[32];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "%63s %31s %31s", c, nm, h) != 3)
            continue;
        if (strcmp(c, cls) == 0 && strcmp(nm, numerics) == 0) {
            snprintf(hex, n, "%s", h);
            found = 1;
        }
    }
    fclose(f);
    return found;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        KVR_SKIP("usage: test_engine_arith KVRAIL_MKMODEL RECORD [--print]");
    const int print = argc > 3 && strcmp(argv[3], "--print") == 0;
    char err[512];
    struct cls cl[] = {
        {.matmul = NULL, .numerics = KVR_NUMERICS_F32},
        {.matmul = "base", .numerics = KVR_NUMERICS_F32},
        {.matmul = NULL, .numerics = KVR_NUMERICS_BF16DOT},
    };
    const int n_cls = (int)(sizeof(cl) / sizeof(cl[0]));
    /* which classes run here: each one's name, and whether bf16dot is had
     * (a context on the bf16 model, refused on a CPU without AVX512-BF16) */
    char d0[512], cmd[8192];
    KVR_CHECK(kvr_test_mkdtemp(d0, sizeof d0, "kvr-test-engine-arith"));
    snprintf(cmd, sizeof(cmd), "%s --out %s %s >/dev/null", argv[1], d0, models[1].args);
    KVR_CHECK(system(cmd) == 0);
    kvr_model_t *m;
    KVR_CHECK_STATUS(kvr_model_load(d0, &m, err, sizeof(err)), KVR_OK);
    for (int c = 0; c < n_cls; c++) {
        set_matmul(cl[c].matmul);
        snprintf(cl[c].name, sizeof cl[c].name, "%s", kvr_engine_kernels("cpu"));
        kvr_ctx_t *ctx = NULL;
        struct kvr_ctx_opts o = {.n_threads = 1, .numerics = cl[c].numerics};
        kvr_status_t st = kvr_ctx_create(m, &o, &ctx, err, sizeof(err));
        set_matmul(NULL);
        cl[c].runs = st == KVR_OK;
        if (st != KVR_OK) {
            KVR_EXPECT(cl[c].numerics == KVR_NUMERICS_BF16DOT && st == KVR_ERR_UNSUPPORTED,
                       "kernels %s, numerics %s: context refused: %s", cl[c].name,
                       kvr_numerics_name(cl[c].numerics), err);
            printf("%s %s: not here (%s)\n", cl[c].name, kvr_numerics_name(cl[c].numerics), err);
        }
        /* the CPU's best is the baseline (a build or CPU without v3/v4):
         * one class, fingerprinted once */
        if (c == 1 && strcmp(cl[0].name, cl[1].name) == 0)
            cl[c].runs = 0;
        kvr_ctx_destroy(ctx);
        cl[c].h = XXH3_createState();
        KVR_CHECK(cl[c].h != NULL);
        XXH3_64bits_reset(cl[c].h);
    }
    kvr_model_destroy(m);
    kvr_test_rmtree(d0);

    for (size_t i = 0; i < N_MODELS; i++) {
        char d[512];
        KVR_CHECK(kvr_test_mkdtemp(d, sizeof d, "kvr-test-engine-arith"));
        snprintf(cmd, sizeof(cmd), "%s --out %s %s >/dev/null", argv[1], d, models[i].args);
        KVR_CHECK(system(cmd) == 0);
        fingerprint(d, models[i].bf16, cl, n_cls);
        kvr_test_rmtree(d);
    }

    int checked = 0;
    for (int c = 0; c < n_cls; c++) {
        if (!cl[c].runs)
            continue;
        char got[32], want[32];
        const char *nm = kvr_numerics_name(cl[c].numerics);
        snprintf(got, sizeof got, "%016llx", (unsigned long long)XXH3_64bits_digest(cl[c].h));
        if (print) {
            printf("%s %s %s\n", cl[c].name, nm, got);
            continue;
        }
        if (!recorded(argv[2], cl[c].name, nm, want, sizeof want)) {
            KVR_EXPECT(0,
                       "kernels %s, numerics %s: no fingerprint recorded in %s (this one: %s). "
                       "A new arithmetic revision (KVR_CPU_ARITH_REV) records the lines "
                       "`test_engine_arith KVRAIL_MKMODEL %s --print` prints",
                       cl[c].name, nm, argv[2], got, argv[2]);
            continue;
        }
        KVR_EXPECT(strcmp(got, want) == 0,
                   "kernels %s, numerics %s compute other bits than that class recorded "
                   "(fingerprint %s, recorded %s in %s): a change moved a bit the CPU kernels "
                   "compute, so it is another class. Bump KVR_CPU_ARITH_REV in "
                   "engine/cpu/cpu_backend.c and add the lines `test_engine_arith KVRAIL_MKMODEL "
                   "%s --print` prints (keep the old ones), or undo the change",
                   cl[c].name, nm, got, want, argv[2], argv[2]);
        if (strcmp(got, want) == 0)
            printf("%s %s: %s, as recorded\n", cl[c].name, nm, got);
        checked++;
    }
    for (int c = 0; c < n_cls; c++)
        XXH3_freeState(cl[c].h);
    if (!print)
        KVR_EXPECT(checked > 0 || kvr_test_fails, "no class fingerprinted");
    return kvr_test_fails ? 1 : 0;
}
