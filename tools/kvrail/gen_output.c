/*
 * gen_output.c - the output shared by `kvrail run` and `kvrail generate`
 * (gen_output.h): --logit-bias parsing, the top_logprobs member of a token
 * line, the final finish/usage line, and the stop-text cut.
 *
 * The stop cut keeps all the text received; after each piece it looks for
 * the earliest stop string in the tail that could hold a new one, and
 * otherwise releases everything except the longest end of the text that is
 * a proper prefix of some stop string (it may still become one).
 */
#include "gen_output.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kvr_cli_logit_bias_parse(const char *who, const char *arg, struct kvr_cli_logit_bias *lb)
{
    const char *p = arg;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long long id = strtoull(p, &end, 10);
        if (end == p || *end != ':' || errno || *p == '-' || id > INT32_MAX) {
            fprintf(stderr, "%s: --logit-bias '%s': want ID:BIAS[,ID:BIAS...] (ID a token id)\n",
                    who, arg);
            return -1;
        }
        p = end + 1;
        double b = strtod(p, &end);
        if (end == p || (*end && *end != ',') || !(b >= -100.0 && b <= 100.0)) {
            fprintf(stderr,
                    "%s: --logit-bias '%s': the bias of token %llu must be in [-100, 100]\n", who,
                    arg, id);
            return -1;
        }
        for (size_t i = 0; i < lb->n; i++)
            if (lb->ids[i] == id) {
                fprintf(stderr, "%s: --logit-bias: token %llu is given twice\n", who, id);
                return -1;
            }
        if (lb->n == KVR_CLI_MAX_LOGIT_BIAS) {
            fprintf(stderr, "%s: --logit-bias: more than %d tokens\n", who, KVR_CLI_MAX_LOGIT_BIAS);
            return -1;
        }
        lb->ids[lb->n] = (uint32_t)id;
        lb->bias[lb->n] = (float)b;
        lb->n++;
        p = *end ? end + 1 : end;
    }
    return 0;
}

void kvr_cli_put_top(FILE *f, size_t n, const uint32_t *ids, const float *lps)
{
    if (!n)
        return;
    fputs(", \"top_logprobs\": [", f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s{\"token_id\": %u, \"logprob\": " KVR_CLI_LOGPROB_FMT "}", i ? ", " : "",
                ids[i], (double)lps[i]);
    fputs("]", f);
}

void kvr_cli_put_usage(FILE *f, int index, const char *finish, uint32_t prompt, uint32_t completion,
                       uint32_t cached)
{
    fputs("{", f);
    if (index >= 0)
        fprintf(f, "\"index\": %d, ", index);
    fprintf(f,
            "\"finish_reason\": \"%s\", \"usage\": {\"prompt_tokens\": %u, \"completion_tokens\": "
            "%u, \"cached_tokens\": %u}}\n",
            finish, prompt, completion, cached);
}

static size_t max_stop_len(const struct kvr_cli_stop *s)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n_stops; i++)
        if (strlen(s->stops[i]) > m)
            m = strlen(s->stops[i]);
    return m;
}

void kvr_cli_stop_feed(struct kvr_cli_stop *s, const char *t, size_t n)
{
    if (s->hit || !n)
        return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *p = realloc(s->text, cap);
        if (!p) {
            s->hit = true; /* cannot hold it: end the output here, never print past a stop */
            return;
        }
        s->text = p;
        s->cap = cap;
    }
    size_t before = s->len;
    memcpy(s->text + s->len, t, n);
    s->len += n;
    s->text[s->len] = 0;
    size_t ml = max_stop_len(s);
    size_t from = before >= ml ? before - ml + 1 : 0;
    long best = -1;
    for (size_t i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        const char *hit = sl ? memmem(s->text + from, s->len - from, s->stops[i], sl) : NULL;
        if (hit && (best < 0 || hit - s->text < best))
            best = hit - s->text;
    }
    if (best >= 0) {
        s->len = (size_t)best;
        s->text[s->len] = 0;
        s->released = s->len;
        s->hit = true;
        return;
    }
    size_t hold = 0, avail = s->len - s->released;
    for (size_t i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t k = sl - 1 < avail ? sl - 1 : avail; k > hold; k--)
            if (!memcmp(s->text + s->len - k, s->stops[i], k)) {
                hold = k;
                break;
            }
    }
    s->released = s->len - hold;
}

void kvr_cli_stop_end(struct kvr_cli_stop *s)
{
    s->released = s->len;
}

void kvr_cli_stop_free(struct kvr_cli_stop *s)
{
    free(s->text);
    s->text = NULL;
    s->len = s->cap = s->released = 0;
}
