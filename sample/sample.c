/*
 * sample.c - the token sampler (see kvr_sample.h for the semantics).
 *
 * sample(): the temperature-scaled logits go to scratch; the tokens whose
 * logit is adjusted - the biased ones (a sorted list) and the seen ones (a
 * list and a bitmap) - are recomputed from the raw logit: + bias, then the
 * repetition penalty, then the frequency / presence penalty of the count of
 * generated occurrences (an array kept only when such a penalty is set),
 * then temperature.  The maximum is found; greedy stops there.  Otherwise a second pass turns the
 * scratch into unnormalized probabilities e_i = exp(z_i - z_max) (so e_max = 1), and the filters
 * work on those without sorting the vocabulary:
 *  - top-k: quickselect of the k best;
 *  - top-p: a quickselect by mass - partition around a pivot, keep the
 *    better side whole when its mass is below what is still needed, recurse
 *    into the side that holds the boundary - expected O(V);
 *  - min-p: e_i >= min_p (e_max = 1).
 * The uniform number u of (seed, step) then walks the survivors.  Every
 * comparison uses one total order (probability descending, then id
 * ascending), and every pass is deterministic, so the same seed gives the
 * same tokens.
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
    uint64_t *seen;    /* bitmap [n_vocab] of prompt + generated tokens */
    int32_t *seen_ids; /* [n_vocab] the same tokens as a list */
    int32_t n_seen;
    float *z;                    /* [n_vocab] processed logits */
    int32_t *cand;               /* [n_vocab] candidate ids */
    struct kvr_logit_bias *bias; /* [n_bias] sorted by token */
    size_t n_bias;
    uint32_t *count; /* [n_vocab] occurrences among the generated tokens, or NULL */
};

void kvr_sample_params_default(struct kvr_sample_params *p)
{
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->seed = 0;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
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
    if (!isfinite(p->presence_penalty) || p->presence_penalty < -2.0f || p->presence_penalty > 2.0f)
        return bad(err, err_len, "presence_penalty", p->presence_penalty, "in [-2, 2]; 0 = off");
    if (!isfinite(p->frequency_penalty) || p->frequency_penalty < -2.0f ||
        p->frequency_penalty > 2.0f)
        return bad(err, err_len, "frequency_penalty", p->frequency_penalty, "in [-2, 2]; 0 = off");
    if (p->n_logit_bias > KVR_SAMPLE_MAX_LOGIT_BIAS)
        return bad(err, err_len, "logit_bias entries", (double)p->n_logit_bias, "at most 300");
    if (p->n_logit_bias && !p->logit_bias)
        return bad(err, err_len, "logit_bias entries", (double)p->n_logit_bias, "given");
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const struct kvr_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0)
            return bad(err, err_len, "logit_bias token id", b->token, ">= 0");
        if (!isfinite(b->bias) || b->bias < -100.0f || b->bias > 100.0f) {
            if (err && err_len)
                snprintf(err, err_len,
                         "invalid sampling parameter logit_bias of token %d = %g (must be in "
                         "[-100, 100])",
                         (int)b->token, (double)b->bias);
            return KVR_ERR_INVALID;
        }
        for (size_t j = 0; j < i; j++) {
            if (p->logit_bias[j].token == b->token) {
                if (err && err_len)
                    snprintf(err, err_len,
                             "invalid sampling parameter logit_bias: token %d is given twice",
                             (int)b->token);
                return KVR_ERR_INVALID;
            }
        }
    }
    return KVR_OK;
}

static int bias_cmp(const void *a, const void *b)
{
    int32_t x = ((const struct kvr_logit_bias *)a)->token;
    int32_t y = ((const struct kvr_logit_bias *)b)->token;
    return (x > y) - (x < y);
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
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token >= vocab_size) {
            if (err && err_len)
                snprintf(err, err_len,
                         "invalid sampling parameter logit_bias: token %d is outside the "
                         "vocabulary (%d tokens)",
                         (int)p->logit_bias[i].token, (int)vocab_size);
            return KVR_ERR_INVALID;
        }
    }
    kvr_sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        goto err_nomem;
    s->p = *p;
    s->p.logit_bias = NULL; /* the caller's; s->bias is the sampler's copy */
    s->n_vocab = vocab_size;
    if (p->n_logit_bias) {
        s->bias = malloc(p->n_logit_bias * sizeof(*s->bias));
        if (!s->bias)
            goto err_free;
        memcpy(s->bias, p->logit_bias, p->n_logit_bias * sizeof(*s->bias));
        qsort(s->bias, p->n_logit_bias, sizeof(*s->bias), bias_cmp);
        s->n_bias = p->n_logit_bias;
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        s->count = calloc((size_t)vocab_size, sizeof(uint32_t));
        if (!s->count)
            goto err_free;
    }
    s->seen = calloc(((size_t)vocab_size + 63) / 64, sizeof(uint64_t));
    s->z = malloc((size_t)vocab_size * sizeof(float));
    s->cand = malloc((size_t)vocab_size * sizeof(int32_t));
    s->seen_ids = malloc((size_t)vocab_size * sizeof(int32_t));
    if (!s->seen || !s->z || !s->cand || !s->seen_ids)
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
    free(s->seen_ids);
    free(s->bias);
    free(s->count);
    free(s);
}

static void mark_seen(kvr_sampler_t *s, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= s->n_vocab)
            continue;
        uint64_t bit = 1ull << ((uint32_t)id % 64);
        if (!(s->seen[(uint32_t)id / 64] & bit)) {
            s->seen[(uint32_t)id / 64] |= bit;
            s->seen_ids[s->n_seen++] = id;
        }
    }
}

void kvr_sampler_add_prompt(kvr_sampler_t *s, const int32_t *ids, size_t n)
{
    if (s && ids)
        mark_seen(s, ids, n);
}

static void count_generated(kvr_sampler_t *s, const int32_t *ids, size_t n)
{
    if (!s->count)
        return;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->n_vocab && s->count[ids[i]] < UINT32_MAX)
            s->count[ids[i]]++;
}

void kvr_sampler_add_generated(kvr_sampler_t *s, const int32_t *ids, size_t n)
{
    if (!s || !ids)
        return;
    mark_seen(s, ids, n);
    count_generated(s, ids, n);
    s->step += n;
}

uint64_t kvr_sampler_step(const kvr_sampler_t *s)
{
    return s ? s->step : 0;
}

/* The log-softmax's max and log of the sum of exp(logit - max); false when
 * no logit is finite (then every logprob is -inf). */
static bool lse_parts(const float *logits, int32_t n, float *m_p, double *log_sum_p)
{
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > m)
            m = logits[i];
    if (!isfinite(m))
        return false;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > -INFINITY)
            sum += expf(logits[i] - m);
    *m_p = m;
    *log_sum_p = log(sum);
    return true;
}

float kvr_sample_logprob(const float *logits, int32_t n, int32_t id)
{
    if (!logits || id < 0 || id >= n)
        return -INFINITY;
    float m;
    double ls;
    if (!lse_parts(logits, n, &m, &ls))
        return -INFINITY;
    return (float)((double)logits[id] - m - ls);
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

/* Total order: a before b when e[a] > e[b], or equal and a < b. */
static inline int better(const float *e, int32_t a, int32_t b)
{
    return e[a] > e[b] || (e[a] == e[b] && a < b);
}

static inline void swap32(int32_t *c, int32_t i, int32_t j)
{
    int32_t t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* Median of three candidates as the pivot index (deterministic). */
static int32_t pivot_of(const float *e, const int32_t *c, int32_t lo, int32_t hi)
{
    int32_t a = lo, b = lo + (hi - lo) / 2, d = hi - 1;
    if (better(e, c[a], c[b])) {
        if (better(e, c[b], c[d]))
            return b;
        return better(e, c[a], c[d]) ? d : a;
    }
    if (better(e, c[a], c[d]))
        return a;
    return better(e, c[b], c[d]) ? d : b;
}

/* Lomuto partition of c[lo..hi) around the candidate at index pv: the
 * better ones first; returns the pivot's final index; *mass_p = mass of
 * the better side. */
static int32_t partition(const float *e, int32_t *c, int32_t lo, int32_t hi, int32_t pv,
                         double *mass_p)
{
    swap32(c, pv, hi - 1);
    int32_t p = c[hi - 1], w = lo;
    double mass = 0.0;
    for (int32_t i = lo; i < hi - 1; i++) {
        if (better(e, c[i], p)) {
            mass += e[c[i]];
            swap32(c, i, w++);
        }
    }
    swap32(c, w, hi - 1);
    *mass_p = mass;
    return w;
}

/* The best k finite entries of z[0..n) (logit descending, id ascending)
 * into out[0..k) in heap order, in one pass: a min-heap whose root is the
 * worst kept; almost every entry is rejected by one comparison with it.
 * Returns how many were kept (< k when fewer are finite). */
static int32_t top_k_heap(const float *z, int32_t n, int32_t k, int32_t *out)
{
    int32_t h = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!(z[i] > -INFINITY))
            continue;
        int32_t r;
        if (h < k) {
            /* sift up: parents are worse than children */
            r = h++;
            while (r > 0 && better(z, out[(r - 1) / 2], i)) {
                out[r] = out[(r - 1) / 2];
                r = (r - 1) / 2;
            }
            out[r] = i;
            continue;
        }
        if (!better(z, i, out[0]))
            continue;
        r = 0; /* replace the root, sift down */
        for (;;) {
            int32_t c = 2 * r + 1;
            if (c >= h)
                break;
            if (c + 1 < h && better(z, out[c], out[c + 1]))
                c++;
            if (!better(z, i, out[c]))
                break;
            out[r] = out[c];
            r = c;
        }
        out[r] = i;
    }
    return h;
}

int32_t kvr_sample_top_logprobs(const float *logits, int32_t n, int32_t k, int32_t *ids, float *lps)
{
    if (!logits || !ids || !lps || n < 1 || k < 1)
        return 0;
    if (k > KVR_SAMPLE_MAX_TOP_LOGPROBS)
        k = KVR_SAMPLE_MAX_TOP_LOGPROBS;
    int32_t h = top_k_heap(logits, n, k, ids);
    for (int32_t i = 1; i < h; i++) { /* heap order -> best first (h <= 20) */
        int32_t v = ids[i], j = i;
        for (; j > 0 && better(logits, v, ids[j - 1]); j--)
            ids[j] = ids[j - 1];
        ids[j] = v;
    }
    float m;
    double ls;
    bool fin = lse_parts(logits, n, &m, &ls);
    for (int32_t i = 0; i < h; i++)
        lps[i] = fin ? (float)((double)logits[ids[i]] - m - ls) : -INFINITY;
    return h;
}

/* The raw logit of id after the logit bias, the repetition penalty (when
 * seen) and the frequency / presence penalties. */
static float adjusted(const kvr_sampler_t *s, const float *logits, int32_t id)
{
    float v = logits[id];
    if (s->n_bias) {
        size_t lo = 0, hi = s->n_bias;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (s->bias[mid].token < id)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < s->n_bias && s->bias[lo].token == id)
            v += s->bias[lo].bias;
    }
    const float pen = s->p.repetition_penalty;
    if (pen != 1.0f && (s->seen[(uint32_t)id / 64] >> ((uint32_t)id % 64) & 1))
        v = v > 0.0f ? v / pen : v * pen;
    if (s->count && s->count[id])
        v -= s->p.frequency_penalty * (float)s->count[id] + s->p.presence_penalty;
    return v;
}

/* Moves the smallest best-first prefix of c[0..n) whose mass reaches need
 * to the front; returns its length (>= 1). */
static int32_t select_mass(const float *e, int32_t *c, int32_t n, double need)
{
    int32_t lo = 0, hi = n, kept = 0; /* c[0..kept) are in; the boundary is in [lo, hi) */
    while (hi > lo) {
        double m;
        int32_t q = partition(e, c, lo, hi, pivot_of(e, c, lo, hi), &m);
        if (m >= need) {
            hi = q; /* the boundary is among the better side */
            if (hi == lo)
                return kept > 0 ? kept : 1;
            continue;
        }
        need -= m + e[c[q]];
        kept = q + 1;
        if (need <= 0.0)
            return kept;
        lo = q + 1;
    }
    return kept > 0 ? kept : n;
}

kvr_status_t kvr_sampler_sample(kvr_sampler_t *s, const float *logits, int32_t *token_p,
                                float *logprob_p)
{
    if (!s || !logits || !token_p)
        return KVR_ERR_INVALID;
    const int32_t n = s->n_vocab;
    const float inv_t = s->p.temperature > 0.0f ? 1.0f / s->p.temperature : 1.0f;
    float *z = s->z;
    for (int32_t i = 0; i < n; i++)
        z[i] = logits[i] * inv_t;
    for (size_t k = 0; k < s->n_bias; k++)
        z[s->bias[k].token] = adjusted(s, logits, s->bias[k].token) * inv_t;
    if (s->p.repetition_penalty != 1.0f || s->count)
        for (int32_t k = 0; k < s->n_seen; k++)
            z[s->seen_ids[k]] = adjusted(s, logits, s->seen_ids[k]) * inv_t;
    /* argmax, lowest id on ties; NaN and -inf never win */
    int32_t best = -1;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (z[i] > bv) {
            bv = z[i];
            best = i;
        }
    }
    if (best < 0)
        return KVR_ERR_INVALID; /* nothing finite to choose from */

    int32_t tok = best;
    if (s->p.temperature > 0.0f) {
        /* e_i = exp(z_i - z_max) in place (e_max = 1): over the whole
         * vocabulary, or only over the top-k picked from z in one pass */
        const float zmax = z[best];
        int32_t keep = 0;
        double total = 0.0;
        if (s->p.top_k > 0 && s->p.top_k < n) {
            keep = top_k_heap(z, n, s->p.top_k, s->cand);
            for (int32_t i = 0; i < keep; i++) {
                int32_t id = s->cand[i];
                z[id] = expf(z[id] - zmax);
                total += z[id];
            }
        } else {
            for (int32_t i = 0; i < n; i++) {
                float e = z[i] > -INFINITY ? expf(z[i] - zmax) : 0.0f; /* NaN -> 0 */
                z[i] = e;
                if (e > 0.0f) {
                    s->cand[keep++] = i;
                    total += e;
                }
            }
        }
        const float *e = z;
        if (s->p.top_p < 1.0f && keep > 1)
            keep = select_mass(e, s->cand, keep, (double)s->p.top_p * total);
        if (s->p.min_p > 0.0f) {
            int32_t w = 0;
            for (int32_t i = 0; i < keep; i++)
                if (e[s->cand[i]] >= s->p.min_p || s->cand[i] == best)
                    s->cand[w++] = s->cand[i];
            keep = w;
        }
        double mass = 0.0;
        for (int32_t i = 0; i < keep; i++)
            mass += e[s->cand[i]];
        double target = uniform01(s->p.seed, s->step) * mass, acc = 0.0;
        tok = s->cand[keep - 1];
        for (int32_t i = 0; i < keep; i++) {
            acc += e[s->cand[i]];
            if (target < acc) {
                tok = s->cand[i];
                break;
            }
        }
    }
    if (logprob_p)
        *logprob_p = kvr_sample_logprob(logits, n, tok);
    mark_seen(s, &tok, 1);
    count_generated(s, &tok, 1);
    s->step++;
    *token_p = tok;
    return KVR_OK;
}
