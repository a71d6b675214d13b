/*
 * cuda_kernels.cu - the CUDA backend's own kernels: embedding, RMSNorm,
 * RoPE, the KV store, paged attention, SwiGLU, bias and the f32 -> bf16/f16
 * narrowing of GEMM inputs.  The GEMMs themselves are cuBLAS
 * (cuda_backend.cu).
 *
 * Each kernel mirrors the CPU backend's arithmetic (engine/cpu/): the same
 * formulas in f32, exact f32 <-> bf16/f16 conversions (round to nearest
 * even), cosf/sinf/expf at full precision (no fast math).  Reductions have
 * a fixed order that depends only on the row's own length, never on the
 * other rows, so a row's result is the same in any batch (the sums are
 * ordered differently from the CPU's, hence the op tests' tolerances).
 *
 * Paged attention: one thread block per (row, KV head, group of up to
 * ATTN_GB query heads sharing it, split of ATTN_SPLIT keys of the row: a
 * decode step of one sequence still fills the GPU); NW warps split the
 * block's keys into contiguous chunks; a warp's lanes split head_dim (lane + 32 j), so every
 * K/V load of a warp is one coalesced run of a key's head_dim elements,
 * read once for all the heads of the group.  Each warp keeps an online
 * softmax (running max, sum, weighted V); the warps' partials are merged in
 * warp order, the splits' by a second kernel in split order.  The cuts
 * depend only on the row's own key range, so a row's result is the same in
 * any batch.  Decode and prefill rows are the same kernel: a prefill row
 * reads its whole causal prefix (no tiling across rows yet: its K/V reads
 * grow with the square of the prompt; see the benchmark's prefill split).
 */
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_kernels.h"

#define ATTN_NW    4   /* warps a block */
#define ATTN_GB    4   /* query heads a block */
#define ATTN_SPLIT 256 /* keys a block: a row's keys in splits of this many */

static unsigned blocks_for(size_t n, unsigned per)
{
    size_t b = (n + per - 1) / per;
    return b > 65535u * 16u ? 65535u * 16u : (unsigned)b;
}

template <typename T> __device__ __forceinline__ float ldf(const T *p, size_t i);
template <> __device__ __forceinline__ float ldf<float>(const float *p, size_t i)
{
    return p[i];
}
template <> __device__ __forceinline__ float ldf<__nv_bfloat16>(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}
template <> __device__ __forceinline__ float ldf<__half>(const __half *p, size_t i)
{
    return __half2float(p[i]);
}

template <typename T> __device__ __forceinline__ T stf(float v);
template <> __device__ __forceinline__ float stf<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 stf<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half stf<__half>(float v)
{
    return __float2half_rn(v);
}

/* ------------------------------------------------------------ embed */

template <typename T>
__global__ void embed_kernel(float *x, const int32_t *tokens, const T *emb, int32_t dim)
{
    const size_t m = blockIdx.x;
    const T *row = emb + (size_t)tokens[m] * (size_t)dim;
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
        x[m * (size_t)dim + (size_t)i] = ldf<T>(row, (size_t)i);
}

void kvr_cuda_embed(cudaStream_t s, float *x, const int32_t *tokens, int32_t M, const void *emb,
                    int32_t dtype, int32_t dim)
{
    if (M < 1)
        return;
    if (dtype == KVR_CUDA_DT_F32)
        embed_kernel<float><<<M, 256, 0, s>>>(x, tokens, (const float *)emb, dim);
    else if (dtype == KVR_CUDA_DT_BF16)
        embed_kernel<__nv_bfloat16><<<M, 256, 0, s>>>(x, tokens, (const __nv_bfloat16 *)emb, dim);
    else
        embed_kernel<__half><<<M, 256, 0, s>>>(x, tokens, (const __half *)emb, dim);
}

/* ------------------------------------------------------------ rmsnorm */

/* Sum over a block of 256 threads in a fixed tree (warp shuffles, then the
 * warps' sums in order). */
__device__ float block_sum256(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0;
    for (int w = 0; w < 8; w++)
        t += sh[w];
    __syncthreads();
    return t;
}

__global__ void rmsnorm_kernel(float *y, const float *x, int32_t dim, const float *w, float eps)
{
    __shared__ float sh[8];
    const size_t m = blockIdx.x;
    const float *xr = x + m * (size_t)dim;
    float *yr = y + m * (size_t)dim;
    float ss = 0;
    for (int32_t i = threadIdx.x; i < dim; i += 256)
        ss += xr[i] * xr[i];
    ss = block_sum256(ss, sh);
    float sc = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int32_t i = threadIdx.x; i < dim; i += 256)
        yr[i] = xr[i] * sc * w[i];
}

void kvr_cuda_rmsnorm(cudaStream_t s, float *y, const float *x, int32_t M, int32_t dim,
                      const float *w, float eps)
{
    if (M >= 1)
        rmsnorm_kernel<<<M, 256, 0, s>>>(y, x, dim, w, eps);
}

/* ------------------------------------------------------------ rope */

/* rotate-half: pairs (i, i + half) by pos * inv_freq[i] */
__global__ void rope_kernel(float *x, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                            const float *inv_freq)
{
    const int32_t m = blockIdx.x, h = blockIdx.y, half = head_dim / 2;
    float *v = x + ((size_t)m * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = (float)pos[m] * inv_freq[i];
        float c = cosf(ang), sn = sinf(ang);
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * sn;
        v[i + half] = b * c + a * sn;
    }
}

void kvr_cuda_rope(cudaStream_t s, float *x, int32_t M, int32_t n_heads, int32_t head_dim,
                   const int32_t *pos, const float *inv_freq)
{
    if (M < 1 || n_heads < 1)
        return;
    int32_t half = head_dim / 2;
    unsigned nt = half < 32 ? 32 : half > 128 ? 128 : (unsigned)half;
    dim3 g((unsigned)M, (unsigned)n_heads);
    rope_kernel<<<g, nt, 0, s>>>(x, n_heads, head_dim, pos, inv_freq);
}

/* ------------------------------------------------------------ KV store */

/* element offset of (block, kv, head, slot) in a layer slab (kvr_kv_offset) */
__device__ __forceinline__ size_t kv_off(int32_t blk, int kv, int32_t h, int32_t slot,
                                         int32_t n_kv_heads, int32_t bs, int32_t hd)
{
    return ((((size_t)blk * 2 + (size_t)kv) * (size_t)n_kv_heads + (size_t)h) * (size_t)bs +
            (size_t)slot) *
           (size_t)hd;
}

template <typename T>
__global__ void kv_store_kernel(struct kvr_cuda_attn a, const float *k, const float *v)
{
    const int32_t r = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    const int32_t p = a.pos[r];
    const int32_t blk = a.tables[a.tab_off[r] + p / a.block_size], slot = p % a.block_size;
    T *base = (T *)a.layer_base;
    size_t src = ((size_t)r * (size_t)a.n_kv_heads + (size_t)h) * (size_t)hd;
    T *dk = base + kv_off(blk, 0, h, slot, a.n_kv_heads, a.block_size, hd);
    T *dv = base + kv_off(blk, 1, h, slot, a.n_kv_heads, a.block_size, hd);
    for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) {
        dk[i] = stf<T>(k[src + (size_t)i]);
        dv[i] = stf<T>(v[src + (size_t)i]);
    }
}

void kvr_cuda_kv_store(cudaStream_t s, const struct kvr_cuda_attn *a, const float *k,
                       const float *v)
{
    if (a->n_rows < 1)
        return;
    dim3 g((unsigned)a->n_rows, (unsigned)a->n_kv_heads);
    unsigned nt = a->head_dim < 32 ? 32 : a->head_dim > 256 ? 256 : (unsigned)a->head_dim;
    if (a->kv_dtype == KVR_CUDA_KV_F32)
        kv_store_kernel<float><<<g, nt, 0, s>>>(*a, k, v);
    else if (a->kv_dtype == KVR_CUDA_KV_BF16)
        kv_store_kernel<__nv_bfloat16><<<g, nt, 0, s>>>(*a, k, v);
    else
        kv_store_kernel<__half><<<g, nt, 0, s>>>(*a, k, v);
}

/* ------------------------------------------------------------ attention */

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* DJ: head_dim elements a lane holds (head_dim <= 32 * DJ) */
template <typename T, int DJ>
__global__ void attn_kernel(struct kvr_cuda_attn a, const float *q, float *out)
{
    __shared__ float sh_m[ATTN_NW][ATTN_GB], sh_l[ATTN_NW][ATTN_GB];
    __shared__ float sh_o[ATTN_NW][ATTN_GB][32 * DJ];
    const int32_t r = blockIdx.x, hd = a.head_dim, H = a.n_heads;
    const int32_t group = H / a.n_kv_heads, gblocks = (group + ATTN_GB - 1) / ATTN_GB;
    const int32_t kvh = (int32_t)blockIdx.y / gblocks,
                  g0 = ((int32_t)blockIdx.y % gblocks) * ATTN_GB;
    const int32_t ng = group - g0 < ATTN_GB ? group - g0 : ATTN_GB;
    const int32_t h0 = kvh * group + g0;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int32_t p = a.pos[r];
    const int32_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    /* this block's split of the row's keys: [s0, s1), ATTN_SPLIT keys from
     * lo, the same cut whatever the batch; its warps take a quarter each */
    const int32_t s0 = lo + (int32_t)blockIdx.z * ATTN_SPLIT;
    const int32_t s1 = s0 + ATTN_SPLIT < p + 1 ? s0 + ATTN_SPLIT : p + 1;
    const int32_t nk = s1 > s0 ? s1 - s0 : 0, chunk = (nk + ATTN_NW - 1) / ATTN_NW;
    const int32_t t0 = s0 + w * chunk, t1 = t0 + chunk < s1 ? t0 + chunk : s1;
    const int32_t *bt = a.tables + a.tab_off[r];
    const T *base = (const T *)a.layer_base;

    float qv[ATTN_GB][DJ], acc[ATTN_GB][DJ], m[ATTN_GB], l[ATTN_GB];
#pragma unroll
    for (int g = 0; g < ATTN_GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0;
#pragma unroll
        for (int j = 0; j < DJ; j++) {
            int d = lane + 32 * j;
            qv[g][j] = g < ng && d < hd
                           ? q[((size_t)r * (size_t)H + (size_t)(h0 + g)) * (size_t)hd + (size_t)d]
                           : 0.0f;
            acc[g][j] = 0;
        }
    }
    /* KU keys a step: their K/V loads are all issued before the first is
     * used (the memory-level parallelism a decode row needs); the keys are
     * still folded in one at a time, in order */
    constexpr int KU = DJ <= 4 ? 4 : 2;
    for (int32_t t = t0; t < t1; t += KU) {
        float kk[KU][DJ], vv[KU][DJ];
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int32_t tu = t + u < t1 ? t + u : t; /* past the end: a valid key, unused */
            const int32_t blk = bt[tu / a.block_size], slot = tu % a.block_size;
            const T *kp = base + kv_off(blk, 0, kvh, slot, a.n_kv_heads, a.block_size, hd);
            const T *vp = base + kv_off(blk, 1, kvh, slot, a.n_kv_heads, a.block_size, hd);
#pragma unroll
            for (int j = 0; j < DJ; j++) {
                int d = lane + 32 * j;
                kk[u][j] = d < hd ? ldf<T>(kp, (size_t)d) : 0.0f;
                vv[u][j] = d < hd ? ldf<T>(vp, (size_t)d) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            if (t + u >= t1)
                break;
#pragma unroll
            for (int g = 0; g < ATTN_GB; g++) {
                if (g >= ng)
                    break;
                float dot = 0;
#pragma unroll
                for (int j = 0; j < DJ; j++)
                    dot = fmaf(qv[g][j], kk[u][j], dot);
                float sc = warp_sum(dot) * a.scale;
                float mn = sc > m[g] ? sc : m[g];
                float corr = expf(m[g] - mn), pe = expf(sc - mn);
                l[g] = l[g] * corr + pe;
#pragma unroll
                for (int j = 0; j < DJ; j++)
                    acc[g][j] = fmaf(pe, vv[u][j], acc[g][j] * corr);
                m[g] = mn;
            }
        }
    }
#pragma unroll
    for (int g = 0; g < ATTN_GB; g++) {
        if (lane == 0) {
            sh_m[w][g] = m[g];
            sh_l[w][g] = l[g];
        }
#pragma unroll
        for (int j = 0; j < DJ; j++)
            sh_o[w][g][lane + 32 * j] = acc[g][j];
    }
    __syncthreads();
    /* merge the warps' partials in warp order: thread (g, d); one split:
     * the output, else this split's (max, sum, unnormalized O) for the
     * merge kernel (an empty split: sum 0) */
    const int32_t nz = (int32_t)gridDim.z, z = (int32_t)blockIdx.z;
    for (int32_t i = threadIdx.x; i < ng * hd; i += blockDim.x) {
        int32_t g = i / hd, d = i % hd;
        float mx = -INFINITY;
        for (int ww = 0; ww < ATTN_NW; ww++)
            mx = sh_m[ww][g] > mx ? sh_m[ww][g] : mx;
        float L = 0, o = 0;
        for (int ww = 0; ww < ATTN_NW; ww++) {
            if (sh_l[ww][g] == 0.0f)
                continue; /* an empty chunk */
            float f = expf(sh_m[ww][g] - mx);
            L += sh_l[ww][g] * f;
            o += sh_o[ww][g][d] * f;
        }
        size_t rh = (size_t)r * (size_t)H + (size_t)(h0 + g);
        if (nz == 1) {
            out[rh * (size_t)hd + (size_t)d] = o / L;
        } else {
            size_t pz = rh * (size_t)nz + (size_t)z;
            a.part_o[pz * (size_t)hd + (size_t)d] = o;
            if (d == 0) {
                a.part_ml[2 * pz] = mx;
                a.part_ml[2 * pz + 1] = L;
            }
        }
    }
}

/* out[r][h] = the splits' partials merged in split order */
__global__ void attn_merge_kernel(struct kvr_cuda_attn a, float *out, int32_t nz)
{
    const int32_t r = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    const size_t rh = (size_t)r * (size_t)a.n_heads + (size_t)h;
    const float *ml = a.part_ml + 2 * rh * (size_t)nz;
    float mx = -INFINITY;
    for (int32_t z = 0; z < nz; z++)
        if (ml[2 * z + 1] != 0.0f && ml[2 * z] > mx)
            mx = ml[2 * z];
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float L = 0, o = 0;
        for (int32_t z = 0; z < nz; z++) {
            if (ml[2 * z + 1] == 0.0f)
                continue; /* past the row's keys */
            float f = expf(ml[2 * z] - mx);
            L += ml[2 * z + 1] * f;
            o += a.part_o[(rh * (size_t)nz + (size_t)z) * (size_t)hd + (size_t)d] * f;
        }
        out[rh * (size_t)hd + (size_t)d] = o / L;
    }
}

template <typename T>
static void attn_launch(cudaStream_t s, const struct kvr_cuda_attn *a, const float *q, float *out)
{
    int32_t group = a->n_heads / a->n_kv_heads;
    dim3 g((unsigned)a->n_rows, (unsigned)(a->n_kv_heads * ((group + ATTN_GB - 1) / ATTN_GB)),
           (unsigned)a->n_splits);
    const unsigned nt = ATTN_NW * 32;
    switch ((a->head_dim + 31) / 32) {
    case 1:
        attn_kernel<T, 1><<<g, nt, 0, s>>>(*a, q, out);
        break;
    case 2:
        attn_kernel<T, 2><<<g, nt, 0, s>>>(*a, q, out);
        break;
    case 3:
        attn_kernel<T, 3><<<g, nt, 0, s>>>(*a, q, out);
        break;
    case 4:
        attn_kernel<T, 4><<<g, nt, 0, s>>>(*a, q, out);
        break;
    case 5:
    case 6:
        attn_kernel<T, 6><<<g, nt, 0, s>>>(*a, q, out);
        break;
    default: /* head_dim <= 256, checked at create */
        attn_kernel<T, 8><<<g, nt, 0, s>>>(*a, q, out);
        break;
    }
}

int32_t kvr_cuda_attn_splits(int32_t max_keys)
{
    return max_keys < 1 ? 1 : (max_keys + ATTN_SPLIT - 1) / ATTN_SPLIT;
}

void kvr_cuda_attention(cudaStream_t s, const struct kvr_cuda_attn *a, const float *q, float *out)
{
    if (a->n_rows < 1)
        return;
    if (a->kv_dtype == KVR_CUDA_KV_F32)
        attn_launch<float>(s, a, q, out);
    else if (a->kv_dtype == KVR_CUDA_KV_BF16)
        attn_launch<__nv_bfloat16>(s, a, q, out);
    else
        attn_launch<__half>(s, a, q, out);
    if (a->n_splits > 1) {
        dim3 g((unsigned)a->n_rows, (unsigned)a->n_heads);
        unsigned nt = a->head_dim < 32 ? 32 : a->head_dim > 256 ? 256 : (unsigned)a->head_dim;
        attn_merge_kernel<<<g, nt, 0, s>>>(*a, out, a->n_splits);
    }
}

/* ------------------------------------------------------------ elementwise */

__global__ void swiglu_kernel(float *g, const float *u, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = g[i];
        g[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

void kvr_cuda_swiglu(cudaStream_t s, float *g, const float *u, size_t n)
{
    if (n)
        swiglu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(g, u, n);
}

__global__ void bias_kernel(float *y, const float *b, size_t n, int32_t N)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += b[i % (size_t)N];
}

void kvr_cuda_add_bias(cudaStream_t s, float *y, const float *b, int32_t M, int32_t N)
{
    size_t n = (size_t)M * (size_t)N;
    if (n)
        bias_kernel<<<blocks_for(n, 256), 256, 0, s>>>(y, b, n, N);
}

template <typename T> __global__ void narrow_kernel(T *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = stf<T>(src[i]);
}

void kvr_cuda_narrow(cudaStream_t s, void *dst, const float *src, size_t n, int32_t dtype)
{
    if (!n)
        return;
    if (dtype == KVR_CUDA_DT_BF16)
        narrow_kernel<__nv_bfloat16>
            <<<blocks_for(n, 256), 256, 0, s>>>((__nv_bfloat16 *)dst, src, n);
    else
        narrow_kernel<__half><<<blocks_for(n, 256), 256, 0, s>>>((__half *)dst, src, n);
}
