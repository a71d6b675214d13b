/*
 * bench_gpu.c - the GPU benchmark, one run, every figure beside its
 * reference measured in the same run (markdown tables on stdout):
 *
 *   copy       cudaMemcpy device to device of 1 GiB: the practical HBM rate
 *              (bytes read + written per second);
 *   attention  the paged-attention op alone, batch 64, context 4,096, a
 *              1B-shaped layer (32 heads, 8 KV heads, head_dim 64), KV f32
 *              and bf16: KV bytes read per second, as % of the copy rate;
 *   decode     kvrail's decode step (kvr_engine_decode, the cuda backend)
 *              of --model (a 1B-shaped bf16 model: mkmodel --layers 16
 *              --hidden 2048 --heads 32 --kv-heads 8 --head-dim 64
 *              --intermediate 8192 --vocab 128256 --dtype bf16) at batch 1,
 *              8, 64 with every sequence at context 4,096: ms a step, and
 *              the op split from the backend's CUDA-event timers;
 *   prefill    2,048 tokens in one chunk: the time in cuBLAS vs our kernels;
 *   ipc        a CUDA IPC push (cudaIpcGetMemHandle in a second process,
 *              cudaIpcOpenMemHandle here, cudaMemcpyAsync, completion by
 *              event) of 16 layers x 256 blocks of 64 KiB against cudaMemcpy
 *              device to device of the same blocks in this process.
 *
 * usage: bench_gpu --model DIR [--quick]     (exit 77 without a GPU)
 *        bench_gpu --ipc-child               (internal: the IPC target)
 */
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "kvr_clock.h"
#include "kvr_compute_backend.h"
#include "kvr_cuda.h"
#include "kvr_cuda_backend.h"
#include "kvr_engine.h"
#include "engine_internal.h"

extern char **environ;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_gpu: %s: %s\n", #call, cudaGetErrorString(e_));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

/* ms of a D2D copy of bytes (median of reps), by events */
static double copy_ms(void *dst, const void *src, size_t bytes, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double t[16];
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, 0));
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t[i] = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return median(t, reps);
}

/* ------------------------------------------------------------ attention */

static double bench_attention(int32_t kvdt, int B, int ctx, double copy_gbs)
{
    const int32_t Hkv = 8, H = 32, hd = 64, bs = 16;
    struct kvr_kv_layout l = {
        .n_layers = 1, .n_kv_heads = Hkv, .head_dim = hd, .block_size = bs, .dtype = kvdt};
    int32_t per = ctx / bs + 1, nb = B * per;
    size_t slab = kvr_kv_layer_bytes(&l, nb);
    void *pool;
    CK(cudaMalloc(&pool, slab));
    CK(cudaMemset(pool, 0, slab));
    CK(cudaDeviceSynchronize()); /* the legacy stream's memset, before the backend's stream */
    struct kvr_backend_params p = {.n_threads = 1,
                                   .max_rows = 64,
                                   .max_cols = 2048,
                                   .max_seq_len = ctx + 16,
                                   .max_head_dim = hd};
    struct kvr_compute_backend *be;
    if (kvr_cuda_ops.create(&p, &be) != KVR_OK)
        exit(1);
    int32_t *tables = malloc((size_t)nb * 4);
    for (int32_t i = 0; i < nb; i++)
        tables[i] = i;
    int32_t *pos = be->ops->alloc(be, (size_t)B * 4);
    const int32_t **bt = be->ops->alloc(be, (size_t)B * sizeof(void *));
    float *q = be->ops->alloc(be, (size_t)B * H * hd * 4),
          *o = be->ops->alloc(be, (size_t)B * H * hd * 4);
    for (int i = 0; i < B; i++) {
        pos[i] = ctx - 1;
        bt[i] = tables + (size_t)i * per;
    }
    struct kvr_attn_args a = {.n_rows = B,
                              .pos = pos,
                              .block_table = bt,
                              .layer_base = pool,
                              .layout = &l,
                              .n_heads = H,
                              .scale = 0.125f};
    kvr_cuda_backend_set_profile(be, true); /* the op's GPU time by events */
    be->ops->attention(be, &a, q, o);       /* warm: staging, first launch */
    kvr_cuda_backend_stats_reset(be);
    const int reps = 10;
    for (int i = 0; i < reps; i++)
        be->ops->attention(be, &a, q, o);
    struct kvr_cuda_stats st;
    kvr_cuda_backend_stats(be, &st);
    double ms = st.op_ms[KVR_CUDA_OP_ATTENTION] / reps;
    double bytes = (double)B * ctx * Hkv * hd * 2 * (double)kvr_kv_dtype_size(kvdt);
    double gbs = bytes / (ms / 1e3) / 1e9;
    printf("| %s | %d | %d | %.3f | %.0f | %.1f %% |\n", kvr_kv_dtype_name(kvdt), B, ctx, ms, gbs,
           100.0 * gbs / copy_gbs);
    be->ops->free(be, pos);
    be->ops->free(be, (void *)bt);
    be->ops->free(be, q);
    be->ops->free(be, o);
    be->ops->destroy(be);
    free(tables);
    cudaFree(pool);
    return gbs;
}

/* ------------------------------------------------------------ engine */

static void op_split(const struct kvr_cuda_stats *st, double *total_p)
{
    double tot = 0;
    for (int i = 0; i < KVR_CUDA_OP_N; i++)
        tot += st->op_ms[i];
    *total_p = tot;
}

static void bench_engine(const char *dir, bool quick)
{
    char err[512];
    kvr_model_t *m;
    if (kvr_model_load(dir, &m, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        exit(1);
    }
    const int ctx = 4096, maxB = 64, T = 2048;
    struct kvr_ctx_opts co = {
        .backend = "cuda", .max_batch = maxB, .max_tokens = T, .max_seq_len = ctx + 16};
    kvr_ctx_t *c;
    if (kvr_ctx_create(m, &co, &c, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "bench_gpu: ctx: %s\n", err);
        exit(1);
    }
    struct kvr_kv_pool pool = {0};
    kvr_kv_layout_init(m, 16, KVR_KV_F32, &pool.layout);
    int32_t per = ctx / 16 + 2, L = kvr_model_n_layers(m);
    pool.n_blocks = maxB * per;
    pool.layer_base = calloc((size_t)L, sizeof *pool.layer_base);
    for (int32_t l = 0; l < L; l++) {
        CK(cudaMalloc(&pool.layer_base[l], kvr_kv_layer_bytes(&pool.layout, pool.n_blocks)));
        CK(cudaMemset(pool.layer_base[l], 0, kvr_kv_layer_bytes(&pool.layout, pool.n_blocks)));
        CK(cudaDeviceSynchronize()); /* before the backend's non-blocking stream */
    }
    int32_t *tables = malloc((size_t)pool.n_blocks * 4);
    for (int32_t i = 0; i < pool.n_blocks; i++)
        tables[i] = i;
    float *logits = malloc((size_t)maxB * kvr_model_vocab(m) * 4);
    /* the ctx's backend, for its timers (engine_internal.h: a benchmark may look) */
    struct kvr_compute_backend *be = c->be;
    printf("\n### decode step (%s, KV f32, context %d; the KV of the pool is zeros: the timing "
           "does not depend on it)\n\n",
           kvr_model_dtype(m), ctx);
    printf("| batch | ms / step | tokens / s | GEMM (cuBLAS) ms | attention ms | attention GB/s | "
           "other ms |\n|---|---|---|---|---|---|---|\n");
    const int Bs[] = {1, 8, 64};
    for (int bi = 0; bi < 3; bi++) {
        int B = Bs[bi];
        struct kvr_decode_seq seqs[64];
        for (int i = 0; i < B; i++)
            seqs[i] = (struct kvr_decode_seq){.token = 1 + i,
                                              .pos = ctx - 1,
                                              .block_table = tables + (size_t)i * per,
                                              .n_blocks = per};
        kvr_engine_decode(c, &pool, seqs, B, logits); /* warm */
        const int reps = quick ? 3 : 10;
        double t[16];
        for (int r = 0; r < reps; r++) { /* wall time, ops asynchronous */
            uint64_t t0 = kvr_now_ns();
            if (kvr_engine_decode(c, &pool, seqs, B, logits) != KVR_OK) {
                fprintf(stderr, "bench_gpu: decode failed\n");
                exit(1);
            }
            t[r] = (double)(kvr_now_ns() - t0) / 1e6;
        }
        kvr_cuda_backend_set_profile(be, true); /* the op split: every op timed */
        kvr_cuda_backend_stats_reset(be);
        for (int r = 0; r < reps; r++)
            kvr_engine_decode(c, &pool, seqs, B, logits);
        kvr_cuda_backend_set_profile(be, false);
        struct kvr_cuda_stats st;
        kvr_cuda_backend_stats(be, &st);
        double tot;
        op_split(&st, &tot);
        double ms = median(t, reps), att = st.op_ms[KVR_CUDA_OP_ATTENTION] / reps;
        double kvb = (double)B * ctx * L * pool.layout.n_kv_heads * pool.layout.head_dim * 2 * 4;
        printf("| %d | %.3f | %.0f | %.3f | %.3f | %.0f | %.3f |\n", B, ms, B / (ms / 1e3),
               st.gemm_ms / reps, att, kvb / (att / 1e3) / 1e9,
               (tot - st.gemm_ms - st.op_ms[KVR_CUDA_OP_ATTENTION]) / reps);
    }
    printf("\n(ms / step: host wall time of kvr_engine_decode with the ops asynchronous, logits "
           "on the host; the op columns: GPU time by CUDA events, in a second pass with profiling "
           "on, where every op synchronizes)\n");

    /* prefill 2,048 tokens */
    int32_t *toks = malloc((size_t)T * 4);
    for (int i = 0; i < T; i++)
        toks[i] = 1 + i % 1000;
    struct kvr_prefill_req rq = {
        .tokens = toks, .n_tokens = T, .block_table = tables, .n_blocks = per};
    kvr_engine_prefill(c, &pool, &rq, logits); /* warm */
    uint64_t t0 = kvr_now_ns();
    kvr_engine_prefill(c, &pool, &rq, logits);
    double ms = (double)(kvr_now_ns() - t0) / 1e6;
    kvr_cuda_backend_set_profile(be, true);
    kvr_cuda_backend_stats_reset(be);
    kvr_engine_prefill(c, &pool, &rq, logits);
    kvr_cuda_backend_set_profile(be, false);
    struct kvr_cuda_stats st;
    kvr_cuda_backend_stats(be, &st);
    double tot;
    op_split(&st, &tot);
    printf("\n### prefill %d tokens (one chunk)\n\n| wall ms | GPU op ms | cuBLAS ms | cuBLAS "
           "share | our kernels ms | of which attention | TFLOP/s in cuBLAS "
           "|\n|---|---|---|---|---|---|---|\n",
           T);
    printf("| %.1f | %.1f | %.1f | %.1f %% | %.1f | %.1f | %.0f |\n", ms, tot, st.gemm_ms,
           100.0 * st.gemm_ms / tot, tot - st.gemm_ms, st.op_ms[KVR_CUDA_OP_ATTENTION],
           st.gemm_flops / (st.gemm_ms / 1e3) / 1e12);
    printf("\n| op | calls | ms |\n|---|---|---|\n");
    for (int i = 0; i < KVR_CUDA_OP_N; i++)
        printf("| %s | %" PRIu64 " | %.2f |\n", kvr_cuda_op_name(i), st.op_calls[i], st.op_ms[i]);
    free(toks);
    free(logits);
    free(tables);
    for (int32_t l = 0; l < L; l++)
        cudaFree(pool.layer_base[l]);
    free(pool.layer_base);
    kvr_ctx_destroy(c);
    kvr_model_destroy(m);
}

/* ------------------------------------------------------------ IPC */

#define IPC_LAYERS 16
#define IPC_BLOCKS 256
#define IPC_BLOCK  65536

static int ipc_child(void)
{
    char err[256];
    if (kvr_cuda_device_open(0, 0, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "ipc child: %s\n", err);
        return 1;
    }
    size_t bytes = (size_t)IPC_LAYERS * IPC_BLOCKS * IPC_BLOCK;
    void *buf;
    CK(cudaMalloc(&buf, bytes));
    cudaIpcMemHandle_t h;
    CK(cudaIpcGetMemHandle(&h, buf));
    fwrite(&h, sizeof h, 1, stdout);
    fflush(stdout);
    char c;
    (void)!read(0, &c, 1); /* the parent is done (or gone) */
    cudaFree(buf);
    return 0;
}

static void bench_ipc(const char *self)
{
    int to_child[2], from_child[2];
    if (pipe(to_child) || pipe(from_child))
        exit(1);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    posix_spawn_file_actions_addclose(&fa, to_child[1]);
    posix_spawn_file_actions_addclose(&fa, from_child[0]);
    char *argv[] = {(char *)self, (char *)"--ipc-child", NULL};
    pid_t pid;
    if (posix_spawn(&pid, self, &fa, NULL, argv, environ) != 0) {
        fprintf(stderr, "bench_gpu: cannot spawn the IPC child\n");
        return;
    }
    close(to_child[0]);
    close(from_child[1]);
    cudaIpcMemHandle_t h;
    size_t got = 0;
    while (got < sizeof h) {
        ssize_t n = read(from_child[0], (char *)&h + got, sizeof h - got);
        if (n <= 0) {
            fprintf(stderr, "bench_gpu: the IPC child sent no handle\n");
            close(to_child[1]);
            waitpid(pid, NULL, 0);
            return;
        }
        got += (size_t)n;
    }
    void *remote;
    CK(cudaIpcOpenMemHandle(&remote, h, cudaIpcMemLazyEnablePeerAccess));
    size_t bytes = (size_t)IPC_LAYERS * IPC_BLOCKS * IPC_BLOCK;
    void *src, *local;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&local, bytes));
    CK(cudaMemset(src, 1, bytes));
    CK(cudaDeviceSynchronize()); /* the legacy stream's memset, before stream s */
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    /* the pushes: one copy per layer of its 256 adjacent blocks (coalesced,
     * as the transfer engine posts them); host time to the completion event */
    double t_ipc[8], t_d2d[8];
    for (int rep = 0; rep < 8; rep++) {
        for (int k = 0; k < 2; k++) {
            void *dst = k ? local : remote;
            uint64_t t0 = kvr_now_ns();
            for (int l = 0; l < IPC_LAYERS; l++) {
                size_t off = (size_t)l * IPC_BLOCKS * IPC_BLOCK;
                CK(cudaMemcpyAsync((char *)dst + off, (char *)src + off,
                                   (size_t)IPC_BLOCKS * IPC_BLOCK, cudaMemcpyDeviceToDevice, s));
            }
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            (k ? t_d2d : t_ipc)[rep] = (double)(kvr_now_ns() - t0) / 1e6;
        }
    }
    double mi = median(t_ipc, 8), md = median(t_d2d, 8);
    printf("\n### CUDA IPC push vs cudaMemcpy D2D (%d layers x %d blocks x %d KiB = %zu MiB)\n\n| "
           "path | ms | GB/s | ratio |\n|---|---|---|---|\n",
           IPC_LAYERS, IPC_BLOCKS, IPC_BLOCK / 1024, bytes >> 20);
    printf("| cudaMemcpy D2D (same process) | %.3f | %.0f | 1.00 |\n", md,
           bytes / (md / 1e3) / 1e9);
    printf("| CUDA IPC push (other process) | %.3f | %.0f | %.2f |\n", mi, bytes / (mi / 1e3) / 1e9,
           md / mi);
    CK(cudaIpcCloseMemHandle(remote));
    cudaFree(src);
    cudaFree(local);
    cudaStreamDestroy(s);
    close(to_child[1]);
    waitpid(pid, NULL, 0);
    close(from_child[0]);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--ipc-child"))
        return ipc_child();
    const char *model = NULL;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
    }
    char err[512];
    if (kvr_cuda_device_open(0, 0, err, sizeof err) != KVR_OK) {
        printf("SKIP: %s\n", err);
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("## kvrail GPU benchmark: %s (%d SMs)\n\n", prop.name, prop.multiProcessorCount);
    size_t cb = (size_t)1 << 30;
    void *x, *y;
    CK(cudaMalloc(&x, cb));
    CK(cudaMalloc(&y, cb));
    CK(cudaMemset(x, 1, cb));
    copy_ms(y, x, cb, 2);
    double cms = copy_ms(y, x, cb, 9);
    double copy_gbs = 2.0 * (double)cb / (cms / 1e3) / 1e9;
    cudaFree(x);
    cudaFree(y);
    printf("### device-to-device copy\n\n| bytes | ms | GB/s (read + written) |\n|---|---|---|\n| "
           "1 GiB | %.3f | %.0f |\n",
           cms, copy_gbs);
    printf("\n### paged attention op (32 heads, 8 KV heads, head_dim 64, block 16)\n\n| KV | batch "
           "| context | ms | KV GB/s read | of the copy rate |\n|---|---|---|---|---|---|\n");
    bench_attention(KVR_KV_F32, 64, 4096, copy_gbs);
    bench_attention(KVR_KV_BF16, 64, 4096, copy_gbs);
    bench_attention(KVR_KV_F32, 8, 4096, copy_gbs);
    bench_attention(KVR_KV_F32, 1, 4096, copy_gbs);
    fflush(stdout);
    bench_ipc("/proc/self/exe");
    fflush(stdout);
    if (model)
        bench_engine(model, quick);
    else
        printf("\n(no --model: decode and prefill not measured)\n");
    return 0;
}
