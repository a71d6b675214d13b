/*
 * gen_output.h - what `kvrail run` and `kvrail generate` share so that their
 * --json output compares line by line: the sampling options the router
 * carries beyond the basic ones (--logit-bias, --logprobs N), the
 * top_logprobs member of a token line, the stop-text cut, and the final
 * finish/usage line (gen_output.c).
 */
#ifndef KVR_GEN_OUTPUT_H
#define KVR_GEN_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVR_CLI_MAX_LOGIT_BIAS 300 /* the sampler's bound */

/* A logprob in --json output: 9 significant digits give a float's exact
 * value back, so two outputs compare bit for bit as text (every engine path
 * is bit-identical; 6 decimals would hide a difference in the last bits). */
#define KVR_CLI_LOGPROB_FMT "%.9g"

struct kvr_cli_logit_bias {
    uint32_t ids[KVR_CLI_MAX_LOGIT_BIAS];
    float bias[KVR_CLI_MAX_LOGIT_BIAS];
    size_t n;
};

/** Adds "ID:BIAS[,ID:BIAS...]" (a repeated --logit-bias) to lb.  Prints
 *  what was wrong, prefixed by who, and returns -1 on a bad entry, an id
 *  given twice, a bias outside [-100, 100] or more than the bound. */
int kvr_cli_logit_bias_parse(const char *who, const char *arg, struct kvr_cli_logit_bias *lb);

/** Writes `, "top_logprobs": [{"token_id": N, "logprob": X}, ...]` (the
 *  n alternatives, best first) - nothing when n is 0. */
void kvr_cli_put_top(FILE *f, size_t n, const uint32_t *ids, const float *lps);

/** The final line of --json output (and of text output, on stderr):
 *  {"finish_reason": "...", "usage": {"prompt_tokens": P, "completion_tokens":
 *  C, "cached_tokens": K}}, with "index": I first when index >= 0. */
void kvr_cli_put_usage(FILE *f, int index, const char *finish, uint32_t prompt, uint32_t completion,
                       uint32_t cached);

/* ---- stop strings, cut as OpenAI does: the stop text and what follows it
 * are not printed; text that may still become a stop is held back ---- */
struct kvr_cli_stop {
    const char *const *stops;
    size_t n_stops;
    char *text; /* everything received */
    size_t len, cap;
    size_t released; /* bytes of text that may be printed */
    bool hit;        /* a stop string was found: text ends at it */
};

/** Appends t[0..n) and updates released / hit. */
void kvr_cli_stop_feed(struct kvr_cli_stop *s, const char *t, size_t n);
/** The end of the stream: whatever is held back is released (unless hit). */
void kvr_cli_stop_end(struct kvr_cli_stop *s);
void kvr_cli_stop_free(struct kvr_cli_stop *s);

#endif
