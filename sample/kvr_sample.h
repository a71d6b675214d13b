/*
 * kvr_sample.h - token sampling from logits: greedy, temperature, top-k,
 * top-p, min-p and repetition penalty, with a per-request seed.
 *
 * Order of the processing (vLLM's): logit bias added to the raw logits, then
 * repetition penalty over every token seen (prompt and generated: logit /
 * penalty when positive, logit * penalty otherwise), then the frequency and
 * presence penalties over the generated tokens only (logit -= frequency *
 * count + presence * (count > 0), OpenAI's definition), then temperature,
 * then top-k, top-p
 * (the smallest set of most likely tokens whose probability reaches top_p),
 * then min-p (drop tokens below min_p * the most likely one's probability).
 * temperature == 0 is greedy: the argmax of the penalized logits (lowest id on
 * ties); the filters do not change it.
 *
 * Randomness is counter-based: the uniform number that picks generated token
 * number i of a request depends only on (seed, i).  A decode node that takes
 * over a request after the prefill node sampled its first token therefore
 * continues the same stream as a single process would: create a sampler with
 * the same params, add the prompt, add the already generated tokens with
 * kvr_sampler_add_generated(), and sample on.
 *
 * The logprob returned with each token is the log-softmax of the RAW logits
 * (before penalty, temperature and filters), i.e. the model's own
 * log-probability of that token, as OpenAI-style "logprobs" report it.
 *
 * kvr_sample_top_logprobs() gives the k most likely tokens of the same raw
 * log-softmax (the numbers equal bit for bit the logprob of a sampled token).
 *
 * A sampler allocates its scratch at creation (the per-token counts only when
 * a frequency or presence penalty is set); sampling does not allocate.
 */
#ifndef KVR_SAMPLE_H
#define KVR_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#define KVR_SAMPLE_MAX_LOGIT_BIAS   300 /* entries of logit_bias (OpenAI's bound) */
#define KVR_SAMPLE_MAX_TOP_LOGPROBS 20  /* alternatives per token (OpenAI's bound) */

struct kvr_logit_bias {
    int32_t token; /* [0, vocab_size) */
    float bias;    /* [-100, 100] */
};

struct kvr_sample_params {
    float temperature;        /* >= 0; 0 = greedy.                      default 0 */
    int32_t top_k;            /* >= 0; 0 = off.                         default 0 */
    float top_p;              /* (0, 1]; 1 = off.                       default 1 */
    float min_p;              /* [0, 1]; 0 = off.                       default 0 */
    float repetition_penalty; /* > 0; 1 = off.                          default 1 */
    uint64_t seed;            /* any value.                             default 0 */
    float presence_penalty;   /* [-2, 2]; 0 = off.                      default 0 */
    float frequency_penalty;  /* [-2, 2]; 0 = off.                      default 0 */
    /* n_logit_bias entries, token ids distinct; copied by kvr_sampler_create
     * (the caller's array need not outlive the call).          default none */
    const struct kvr_logit_bias *logit_bias;
    size_t n_logit_bias;
};

typedef struct kvr_sampler kvr_sampler_t;

/** Fills *p with the defaults above (greedy, no filters, seed 0). */
void kvr_sample_params_default(struct kvr_sample_params *p);

/** Checks client-supplied values: NaN/inf anywhere, temperature < 0 or > 100,
 *  top_k < 0, top_p outside (0, 1], min_p outside [0, 1], repetition_penalty
 *  <= 0 or > 100, presence/frequency penalty outside [-2, 2], more than
 *  KVR_SAMPLE_MAX_LOGIT_BIAS biases, a bias outside [-100, 100], a negative
 *  or repeated token id (ids >= the vocabulary are the sampler's check).
 *  err (may be NULL) names the field and the value.
 *  @return KVR_OK; KVR_ERR_INVALID. */
kvr_status_t kvr_sample_params_validate(const struct kvr_sample_params *p, char *err,
                                        size_t err_len);

/** Creates the sampler of one request over a vocabulary of vocab_size logits.
 *  @return KVR_OK; KVR_ERR_INVALID (params as above, vocab_size < 1; message
 *          in err); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_sampler_create(const struct kvr_sample_params *p, int32_t vocab_size,
                                kvr_sampler_t **sampler_p, char *err, size_t err_len);
void kvr_sampler_destroy(kvr_sampler_t *s);

/** Adds prompt tokens to the history the repetition penalty looks at.  Ids
 *  outside [0, vocab_size) are ignored. */
void kvr_sampler_add_prompt(kvr_sampler_t *s, const int32_t *ids, size_t n);
/** Adds tokens generated elsewhere (e.g. the first token sampled by a prefill
 *  node): history, and the step counter advances by n. */
void kvr_sampler_add_generated(kvr_sampler_t *s, const int32_t *ids, size_t n);
/** Number of tokens generated so far (the counter of the RNG). */
uint64_t kvr_sampler_step(const kvr_sampler_t *s);

/** Samples the next token from logits[0..vocab_size) (not modified), records
 *  it in the history and advances the step.  logprob_p may be NULL.
 *  @return KVR_OK; KVR_ERR_INVALID (NULL logits; or every logit NaN/-inf). */
kvr_status_t kvr_sampler_sample(kvr_sampler_t *s, const float *logits, int32_t *token_p,
                                float *logprob_p);

/** Stateless helper: log-softmax of logits[0..n) at index id. */
float kvr_sample_logprob(const float *logits, int32_t n, int32_t id);

/** Stateless helper: the k (<= KVR_SAMPLE_MAX_TOP_LOGPROBS) most likely
 *  entries of logits[0..n) (logit descending, id ascending on ties) into
 *  ids[0..) and their log-softmax into lps[0..), best first; NaN and -inf
 *  entries are never listed.  Each lps[i] equals kvr_sample_logprob(logits,
 *  n, ids[i]) exactly.  @return how many were written (< k when fewer are
 *  finite). */
int32_t kvr_sample_top_logprobs(const float *logits, int32_t n, int32_t k, int32_t *ids,
                                float *lps);

#endif
