/*
 * sample.c - the token sampler (see kvr_sample.h for the semantics).
 *
 * sample(): copy the logits into scratch applying the repetition penalty
 * (a bitmap of the tokens seen), then
 *  - greedy: argmax;
 *  - otherwise divide by the temperature, find the candidates that survive
 *    top-k / top-p / min-p, and walk them in descending order with a uniform
 *    number u drawn from (seed, step).  The candidates are found without
 *    sorting the whole vocabulary: quickselect the best K (K = top_k, or a
 *    guess that doubles until the nucleus fits), sort only those.  With no
 *    filter at all the walk is over the whole vocabulary in id order.
 * Every order is total (logit descending, then id ascending), so the result
 * does not depend on the selection's internals: same seed, same tokens.
 */
#include "kvr_sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvr_sampler {
    struct kvr_sample_params p;
    int32_t n_vocab;
    uint64_t step;
    uint64_t *seen; /* bitmap [n_vocab] of prompt + generated tokens */
    float *z;       /* [n_vocab] processed logits */
    int32_t *cand;  /* [n_vocab] candidate ids */
};

void kvr_sample_params_default(struct kvr_sample_params *p)
{
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->seed = 0;
}

static kvr_status_t bad(char *err, size_t err_len, const char *field, double v, const char *want)
{
    if (err && err_len)
        snprintf(err, err_len, "invalid sampling parameter %s = %g (must be %s)", field, v, want);
    return KVR_ERR_INVALID;
}

kvr_status_t kvr_sample_params_validate(const struct kvr_sample_params *p, char *err,
                                        size_t err_len)
{
    if (!p) {
        if (err && err_len)
            snprintf(err, err_len, "sampling parameters missing");
        return KVR_ERR_INVALID;
    }
    if (!isfinite(p->temperature) || p->temperature < 0.0f || p->temperature > 100.0f)
        return bad(err, err_len, "temperature", p->temperature, "in [0, 100]; 0 = greedy");
    if (p->top_k < 0)
        return bad(err, err_len, "top_k", p->top_k, ">= 0; 0 = off");
    if (!isfinite(p->top_p) || !(p->top_p > 0.0f) || p->top_p > 1.0f)
        return bad(err, err_len, "top_p", p->top_p, "in (0, 1]; 1 = off");
    if (!isfinite(p->min_p) || p->min_p < 0.0f || p->min_p > 1.0f)
        return bad(err, err_len, "min_p", p->min_p, "in [0, 1]; 0 = off");
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty > 0.0f) ||
        p->repetition_penalty > 100.0f)
        return bad(err, err_len, "repetition_penalty", p->repetition_penalty,
                   "in (0, 100]; 1 = off");
    return KVR_OK;
}

kvr_status_t kvr_sampler_create(const struct kvr_sample_params *p, int32_t vocab_size,
                                kvr_sampler_t **sampler_p, char *err, size_t err_len)
{
    kvr_status_t st = kvr_sample_params_validate(p, err, err_len);
    if (st != KVR_OK)
        return st;
    if (vocab_size < 1) {
        if (err && err_len)
            snprintf(err, err_len, "sampler: vocab_size %d must be >= 1", (int)vocab_size);
        return KVR_ERR_INVALID;
    }
    if (!sampler_p)
        return KVR_ERR_INVALID;
    kvr_sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        goto err_nomem;
    s->p = *p;
    s->n_vocab = vocab_size;
    s->seen = calloc(((size_t)vocab_size + 63) / 64, sizeof(uint64_t));
    s->z = malloc((size_t)vocab_size * sizeof(float));
    s->cand = malloc((size_t)vocab_size * sizeof(int32_t));
    if (!s->seen || !s->z || !s->cand)
        goto err_free;
    *sampler_p = s;
    return KVR_OK;

err_free:
    kvr_sampler_destroy(s);
err_nomem:
    if (err && err_len)
        snprintf(err, err_len, "sampler: out of memory for a vocabulary of %d", (int)vocab_size);
    return KVR_ERR_NO_MEMORY;
}

void kvr_sampler_destroy(kvr_sampler_t *s)
{
    if (!s)
        return;
    free(s->seen);
    free(s->z);
    free(s->cand);
    free(s);
}

static void mark_seen(kvr_sampler_t *s, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id >= 0 && id < s->n_vocab)
            s->seen[(uint32_t)id / 64] |= 1ull << ((uint32_t)id % 64);
    }
}

void kvr_sampler_add_prompt(kvr_sampler_t *s, const int32_t *ids, size_t n)
{
    if (s && ids)
        mark_seen(s, ids, n);
}

void kvr_sampler_add_generated(kvr_sampler_t *s, const int32_t *ids, size_t n)
{
    if (!s || !ids)
        return;
    mark_seen(s, ids, n);
    s->step += n;
}

uint64_t kvr_sampler_step(const kvr_sampler_t *s)
{
    return s ? s->step : 0;
}

float kvr_sample_logprob(const float *logits, int32_t n, int32_t id)
{
    if (!logits || id < 0 || id >= n)
        return -INFINITY;
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > m)
            m = logits[i];
    if (!isfinite(m))
        return -INFINITY;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)logits[i] - m);
    return (float)((double)logits[id] - m - log(sum));
}

/* splitmix64: the counter-based generator; u depends on (seed, step) only. */
static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double uniform01(uint64_t seed, uint64_t step)
{
    uint64_t x = splitmix64(splitmix64(seed) ^ splitmix64(step ^ 0x5851F42D4C957F2Dull));
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* Total order: a before b when z[a] > z[b], or equal and a < b. */
static inline int better(const float *z, int32_t a, int32_t b)
{
    return z[a] > z[b] || (z[a] == z[b] && a < b);
}

/* Partitions c[0..n) so that the best k come first (in any order). */
static void select_best(const float *z, int32_t *c, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t pv = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (better(z, c[i], pv))
                i++;
            while (better(z, pv, c[j]))
                j--;
            if (i <= j) {
                int32_t t = c[i];
                c[i] = c[j];
                c[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

static void sort_best(const float *z, int32_t *c, int32_t n)
{
    /* insertion sort for short runs, else a simple heap sort (no qsort_r
     * context needed, deterministic under the total order) */
    if (n <= 32) {
        for (int32_t i = 1; i < n; i++) {
            int32_t v = c[i], j = i - 1;
            while (j >= 0 && better(z, v, c[j])) {
                c[j + 1] = c[j];
                j--;
            }
            c[j + 1] = v;
        }
        return;
    }
    /* min-heap on "better" so that popping the worst to the end leaves best first */
    for (int32_t start = n / 2 - 1; start >= 0; start--) {
        int32_t r = start;
        for (;;) {
            int32_t ch = 2 * r + 1;
            if (ch >= n)
                break;
            if (ch + 1 < n && better(z, c[ch], c[ch + 1]))
                ch++;
            if (!better(z, c[r], c[ch]))
                break;
            int32_t t = c[r];
            c[r] = c[ch];
            c[ch] = t;
            r = ch;
        }
    }
    for (int32_t end = n - 1; end > 0; end--) {
        int32_t t = c[0];
        c[0] = c[end];
        c[end] = t;
        int32_t r = 0;
        for (;;) {
            int32_t ch = 2 * r + 1;
            if (ch >= end)
                break;
            if (ch + 1 < end && better(z, c[ch], c[ch + 1]))
                ch++;
            if (!better(z, c[r], c[ch]))
                break;
            t = c[r];
            c[r] = c[ch];
            c[ch] = t;
            r = ch;
        }
    }
}

kvr_status_t kvr_sampler_sample(kvr_sampler_t *s, const float *logits, int32_t *token_p,
                                float *logprob_p)
{
    if (!s || !logits || !token_p)
        return KVR_ERR_INVALID;
    const int32_t n = s->n_vocab;
    const float pen = s->p.repetition_penalty;
    float *z = s->z;
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (isnan(v))
            v = -INFINITY;
        if (pen != 1.0f && (s->seen[(uint32_t)i / 64] >> ((uint32_t)i % 64) & 1))
            v = v > 0.0f ? v / pen : v * pen;
        z[i] = v;
        if (v != -INFINITY && (best < 0 || v > z[best]))
            best = i;
    }
    if (best < 0)
        return KVR_ERR_INVALID; /* nothing finite to choose from */

    int32_t tok = best;
    if (s->p.temperature > 0.0f) {
        const float inv_t = 1.0f / s->p.temperature;
        const float zmax = z[best] * inv_t;
        double total = 0.0; /* normalizer over the whole vocabulary */
        for (int32_t i = 0; i < n; i++) {
            z[i] = z[i] == -INFINITY ? -INFINITY : z[i] * inv_t;
            total += exp((double)z[i] - zmax);
        }
        /* min-p: a logit threshold relative to the best */
        float zmin = -INFINITY;
        if (s->p.min_p > 0.0f)
            zmin = zmax + logf(s->p.min_p);
        int32_t nc = 0;
        for (int32_t i = 0; i < n; i++)
            if (z[i] != -INFINITY && z[i] >= zmin)
                s->cand[nc++] = i;
        const int filtered = s->p.top_k > 0 || s->p.top_p < 1.0f;
        int32_t keep = nc;
        if (filtered) {
            int32_t k = s->p.top_k > 0 && s->p.top_k < nc ? s->p.top_k : nc;
            int32_t guess = s->p.top_k > 0 ? k : (nc < 256 ? nc : 256);
            for (;;) {
                select_best(z, s->cand, nc, guess);
                sort_best(z, s->cand, guess);
                keep = guess < k ? guess : k;
                if (s->p.top_p >= 1.0f)
                    break;
                double cum = 0.0;
                int32_t i = 0;
                for (; i < keep; i++) {
                    cum += exp((double)z[s->cand[i]] - zmax) / total;
                    if (cum >= (double)s->p.top_p) {
                        i++;
                        break;
                    }
                }
                if (cum >= (double)s->p.top_p || guess >= k) {
                    keep = i < keep ? i : keep;
                    break;
                }
                guess = guess * 4 < nc ? guess * 4 : nc;
            }
        }
        double mass = 0.0;
        for (int32_t i = 0; i < keep; i++)
            mass += exp((double)z[s->cand[i]] - zmax);
        double target = uniform01(s->p.seed, s->step) * mass, acc = 0.0;
        tok = s->cand[keep - 1];
        for (int32_t i = 0; i < keep; i++) {
            acc += exp((double)z[s->cand[i]] - zmax);
            if (target < acc) {
                tok = s->cand[i];
                break;
            }
        }
    }
    if (logprob_p)
        *logprob_p = kvr_sample_logprob(logits, n, tok);
    mark_seen(s, &tok, 1);
    s->step++;
    *token_p = tok;
    return KVR_OK;
}
