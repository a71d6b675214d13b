/*
 * request.c - an OpenAI /v1/completions or /v1/chat/completions body ->
 * struct fe_req.
 *
 * Every member of the body is looked at: a known field of the wrong type or
 * out of range is a 400 naming it; a field this server cannot honour
 * (echo, suffix, best_of other than n) is a 400 saying so; an unknown field is a 400 too, never
 * silently ignored, null or not.  A field given twice is a 400 (JSON allows duplicate names;
 * the bounded lists, stop and logit_bias, would otherwise add up past their bounds).  A model
 * other than the one served is a 404.  Strings stay in the JSON document, which outlives the
 * request.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

struct ctx {
    unsigned *status_p;
    char *param, *msg;
    size_t param_len, msg_len;
};

static kvr_status_t fail(struct ctx *c, unsigned status, kvr_status_t st, const char *param,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static kvr_status_t fail(struct ctx *c, unsigned status, kvr_status_t st, const char *param,
                         const char *fmt, ...)
{
    *c->status_p = status;
    snprintf(c->param, c->param_len, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, c->msg_len, fmt, ap);
    va_end(ap);
    return st;
}

static const char *type_name(const kvr_json_t *v)
{
    static const char *const n[] = {"null",     "a boolean", "a number",
                                    "a string", "an array",  "an object"};
    return n[v->type];
}

/* an integer in [lo, hi] */
static kvr_status_t get_int(struct ctx *c, const char *key, const kvr_json_t *v, int64_t lo,
                            int64_t hi, int64_t *out)
{
    if (v->type == KVR_JSON_NUMBER && !v->is_int && fabs(v->num) >= 9223372036854775808.0)
        /* whole but past int64 (1e300, 2^63): out of range, not a fraction */
        return fail(c, 400, KVR_ERR_INVALID, key, "'%s' is %g; it must be in [%lld, %lld]", key,
                    v->num, (long long)lo, (long long)hi);
    if (v->type != KVR_JSON_NUMBER || !v->is_int)
        return fail(c, 400, KVR_ERR_INVALID, key, "'%s' must be an integer, not %s", key,
                    v->type == KVR_JSON_NUMBER ? "a fraction" : type_name(v));
    if (v->i64 < lo || v->i64 > hi)
        return fail(c, 400, KVR_ERR_INVALID, key, "'%s' is %lld; it must be in [%lld, %lld]", key,
                    (long long)v->i64, (long long)lo, (long long)hi);
    *out = v->i64;
    return KVR_OK;
}

static kvr_status_t get_num(struct ctx *c, const char *key, const kvr_json_t *v, double lo,
                            double hi, double *out)
{
    if (v->type != KVR_JSON_NUMBER)
        return fail(c, 400, KVR_ERR_INVALID, key, "'%s' must be a number, not %s", key,
                    type_name(v));
    if (!(v->num >= lo && v->num <= hi))
        return fail(c, 400, KVR_ERR_INVALID, key, "'%s' is %g; it must be in [%g, %g]", key, v->num,
                    lo, hi);
    *out = v->num;
    return KVR_OK;
}

static kvr_status_t get_bool(struct ctx *c, const char *key, const kvr_json_t *v, bool *out)
{
    if (v->type != KVR_JSON_BOOL)
        return fail(c, 400, KVR_ERR_INVALID, key, "'%s' must be true or false, not %s", key,
                    type_name(v));
    *out = v->b;
    return KVR_OK;
}

static bool has_nul(const kvr_json_t *s)
{
    return strlen(s->str) != s->len;
}

/* token ids: an array of integers in [0, 2^31) */
static kvr_status_t get_ids(struct ctx *c, const char *key, const kvr_json_t *v,
                            struct fe_prompt *p)
{
    if (v->n == 0)
        return fail(c, 400, KVR_ERR_INVALID, key, "'%s' is an empty list of token ids", key);
    p->ids = malloc(v->n * sizeof(uint32_t));
    if (!p->ids)
        return fail(c, 500, KVR_ERR_NO_MEMORY, key, "out of memory for %zu token ids", v->n);
    p->n_ids = v->n;
    for (size_t i = 0; i < v->n; i++) {
        const kvr_json_t *t = v->items[i];
        if (t->type != KVR_JSON_NUMBER || !t->is_int || t->i64 < 0 || t->i64 > INT32_MAX)
            return fail(c, 400, KVR_ERR_INVALID, key,
                        "'%s' token id #%zu is not a non-negative integer (a prompt is a string, "
                        "a list of strings, a list of token ids or a list of such lists)",
                        key, i);
        p->ids[i] = (uint32_t)t->i64;
    }
    return KVR_OK;
}

static kvr_status_t parse_prompt(struct ctx *c, const kvr_json_t *v, struct fe_req *r)
{
    size_t n = 1;
    bool list_of_lists = false, list_of_strings = false;
    if (v->type == KVR_JSON_ARRAY) {
        if (v->n == 0)
            return fail(c, 400, KVR_ERR_INVALID, "prompt", "'prompt' is an empty list");
        const kvr_json_t *e0 = v->items[0];
        if (e0->type == KVR_JSON_STRING)
            list_of_strings = true;
        else if (e0->type == KVR_JSON_ARRAY)
            list_of_lists = true;
        if (list_of_strings || list_of_lists)
            n = v->n;
    } else if (v->type != KVR_JSON_STRING) {
        return fail(c, 400, KVR_ERR_INVALID, "prompt",
                    "'prompt' must be a string, a list of strings, a list of token ids or a list "
                    "of lists of token ids, not %s",
                    type_name(v));
    }
    if (n > fe_cfg.max_prompts)
        return fail(c, 400, KVR_ERR_INVALID, "prompt",
                    "%zu prompts in one request; this server takes at most %u", n,
                    fe_cfg.max_prompts);
    r->prompts = calloc(n, sizeof(*r->prompts));
    if (!r->prompts)
        return fail(c, 500, KVR_ERR_NO_MEMORY, "prompt", "out of memory");
    r->n_prompts = n;
    if (v->type == KVR_JSON_STRING) {
        if (has_nul(v))
            return fail(c, 400, KVR_ERR_INVALID, "prompt", "'prompt' contains a NUL character");
        r->prompts[0].text = v->str;
        return KVR_OK;
    }
    if (!list_of_strings && !list_of_lists)
        return get_ids(c, "prompt", v, &r->prompts[0]);
    for (size_t i = 0; i < n; i++) {
        const kvr_json_t *e = v->items[i];
        if (list_of_strings) {
            if (e->type != KVR_JSON_STRING)
                return fail(c, 400, KVR_ERR_INVALID, "prompt",
                            "'prompt' mixes strings with %s (element %zu)", type_name(e), i);
            if (has_nul(e))
                return fail(c, 400, KVR_ERR_INVALID, "prompt",
                            "'prompt' element %zu contains a NUL character", i);
            r->prompts[i].text = e->str;
        } else {
            if (e->type != KVR_JSON_ARRAY)
                return fail(c, 400, KVR_ERR_INVALID, "prompt",
                            "'prompt' mixes lists of token ids with %s (element %zu)", type_name(e),
                            i);
            kvr_status_t st = get_ids(c, "prompt", e, &r->prompts[i]);
            if (st != KVR_OK)
                return st;
        }
    }
    return KVR_OK;
}

static kvr_status_t parse_stop(struct ctx *c, const kvr_json_t *v, struct fe_req *r)
{
    if (v->type != KVR_JSON_STRING && v->type != KVR_JSON_ARRAY)
        return fail(c, 400, KVR_ERR_INVALID, "stop",
                    "'stop' must be a string or a list of strings, not %s", type_name(v));
    if (v->type == KVR_JSON_ARRAY && v->n > FE_MAX_STOPS) {
        return fail(c, 400, KVR_ERR_INVALID, "stop", "%zu stop strings; at most %d", v->n,
                    FE_MAX_STOPS);
    }
    size_t n = v->type == KVR_JSON_STRING ? 1 : v->n;
    for (size_t i = 0; i < n; i++) {
        const kvr_json_t *s = v->type == KVR_JSON_STRING ? v : v->items[i];
        if (s->type != KVR_JSON_STRING)
            return fail(c, 400, KVR_ERR_INVALID, "stop", "'stop' element %zu is %s, not a string",
                        i, type_name(s));
        if (s->len == 0 || s->len > 256 || has_nul(s))
            return fail(c, 400, KVR_ERR_INVALID, "stop",
                        "'stop' element %zu is empty, longer than 256 bytes or contains NUL", i);
        r->stop[r->n_stop++] = s->str;
    }
    return KVR_OK;
}

/* The members of a request body fe_req_parse knows (each has its branch
 * there), NUL-separated: both endpoints', then /v1/completions', then chat's. */
static const char common_fields[] =
    "model\0max_tokens\0temperature\0top_p\0top_k\0min_p\0repetition_penalty\0"
    "presence_penalty\0frequency_penalty\0seed\0stop\0stop_token_ids\0ignore_eos\0n\0"
    "logprobs\0logit_bias\0stream\0stream_options\0user\0";
static const char completion_fields[] = "prompt\0best_of\0echo\0suffix\0";
static const char chat_fields[] =
    "messages\0chat_template_kwargs\0top_logprobs\0max_completion_tokens\0";

static bool in_list(const char *k, const char *list)
{
    for (const char *p = list; *p; p += strlen(p) + 1)
        if (!strcmp(k, p))
            return true;
    return false;
}

static bool known_field(const char *k, bool chat)
{
    return in_list(k, common_fields) || in_list(k, chat ? chat_fields : completion_fields);
}

/* a field accepted only at its default: anything else is named as unsupported */
static kvr_status_t only_default(struct ctx *c, const char *key, const kvr_json_t *v, bool ok,
                                 const char *why)
{
    if (ok)
        return KVR_OK;
    (void)v;
    return fail(c, 400, KVR_ERR_UNSUPPORTED, key, "'%s' is not supported by kvrail: %s", key, why);
}

/* logit_bias: {"token id": bias in [-100, 100], ...}, as OpenAI sends it
 * (ids as strings; the router checks them against the vocabulary). */
static kvr_status_t parse_logit_bias(struct ctx *c, const kvr_json_t *v, struct fe_req *r)
{
    if (v->type != KVR_JSON_OBJECT)
        return fail(c, 400, KVR_ERR_INVALID, "logit_bias",
                    "'logit_bias' must be an object mapping token ids to biases, not %s",
                    type_name(v));
    if (v->n > FE_MAX_LOGIT_BIAS)
        return fail(c, 400, KVR_ERR_INVALID, "logit_bias",
                    "'logit_bias' has %zu entries (at most %d)", v->n, FE_MAX_LOGIT_BIAS);
    for (size_t j = 0; j < v->n; j++) {
        const char *key = v->keys[j];
        char *end = NULL;
        unsigned long long id = strtoull(key, &end, 10);
        if (!*key || *end || key[0] < '0' || key[0] > '9' || id > INT32_MAX)
            return fail(c, 400, KVR_ERR_INVALID, "logit_bias",
                        "'logit_bias' key '%s' is not a token id (a decimal integer)", key);
        double b = 0;
        kvr_status_t st = get_num(c, "logit_bias", v->items[j], -100, 100, &b);
        if (st != KVR_OK)
            return st;
        for (size_t i = 0; i < r->n_logit_bias; i++)
            if (r->logit_bias[i].token_id == id)
                return fail(c, 400, KVR_ERR_INVALID, "logit_bias",
                            "'logit_bias' names token %llu twice", id);
        r->logit_bias[r->n_logit_bias].token_id = (uint32_t)id;
        r->logit_bias[r->n_logit_bias].bias = (float)b;
        r->n_logit_bias++;
    }
    return KVR_OK;
}

kvr_status_t fe_req_parse(const kvr_json_t *root, bool chat, struct fe_req *r, unsigned *status_p,
                          char *param, size_t param_len, char *msg, size_t msg_len)
{
    struct ctx c = {status_p, param, msg, param_len, msg_len};
    memset(r, 0, sizeof(*r));
    r->chat = chat;
    r->max_tokens = 16; /* OpenAI's default for completions */
    r->temperature = fe_cfg.def_temperature;
    r->top_p = fe_cfg.def_top_p;
    r->top_k = fe_cfg.def_top_k;
    r->repetition_penalty = fe_cfg.def_repetition_penalty;
    r->min_p = fe_cfg.def_min_p;
    r->n = 1;
    r->logprobs = -1;
    if (!root || root->type != KVR_JSON_OBJECT)
        return fail(&c, 400, KVR_ERR_INVALID, "", "the request body must be a JSON object, not %s",
                    root ? type_name(root) : "empty");
    bool have_prompt = false, have_model = false, have_stream_options = false;
    bool have_best_of = false, have_max_tokens = false;
    int64_t top_logprobs = -1; /* chat: top_logprobs, -1 = not given */
    const kvr_json_t *kwargs = NULL;
    int64_t best_of = 1;
    for (size_t i = 0; i < root->n; i++) {
        const char *k = root->keys[i];
        const kvr_json_t *v = root->items[i];
        kvr_status_t st = KVR_OK;
        int64_t iv = 0;
        double dv = 0;
        if (root->key_lens[i] != strlen(k))
            return fail(&c, 400, KVR_ERR_INVALID, k,
                        "Unrecognized request argument supplied: '%s' followed by a NUL "
                        "character (no field has one)",
                        k);
        if (!known_field(k, chat))
            return fail(&c, 400, KVR_ERR_INVALID, k,
                        "Unrecognized request argument supplied: %s (kvrail answers every field "
                        "or refuses it)",
                        k);
        /* every member before this one is a known field, none twice: at most
         * a few dozen to compare */
        for (size_t j = 0; j < i; j++)
            if (!strcmp(root->keys[j], k))
                return fail(&c, 400, KVR_ERR_INVALID, k,
                            "'%s' is given more than once in the request body", k);
        if (v->type == KVR_JSON_NULL && strcmp(k, "model") && strcmp(k, "prompt"))
            continue; /* null = the default, as the SDKs send it */
        if (!strcmp(k, "model")) {
            if (v->type != KVR_JSON_STRING)
                return fail(&c, 400, KVR_ERR_INVALID, k, "'model' must be a string, not %s",
                            type_name(v));
            if (has_nul(v) || strcmp(v->str, fe_cfg.model_name) != 0)
                return fail(&c, 404, KVR_ERR_NOT_FOUND, k,
                            "The model '%s' does not exist; this server serves '%s' (see "
                            "GET /v1/models)",
                            v->str, fe_cfg.model_name);
            have_model = true;
        } else if (!strcmp(k, "messages") && chat) {
            if (v->type != KVR_JSON_ARRAY || v->n == 0)
                return fail(&c, 400, KVR_ERR_INVALID, k,
                            "'messages' must be a non-empty list of {\"role\", \"content\"} "
                            "objects");
            for (size_t j = 0; j < v->n; j++) {
                const kvr_json_t *m = v->items[j];
                const kvr_json_t *role = kvr_json_get(m, "role");
                if (m->type != KVR_JSON_OBJECT || !role || role->type != KVR_JSON_STRING)
                    return fail(&c, 400, KVR_ERR_INVALID, k,
                                "'messages' element %zu is not an object with a string 'role'", j);
                const kvr_json_t *content = kvr_json_get(m, "content");
                if (content && content->type != KVR_JSON_STRING &&
                    content->type != KVR_JSON_ARRAY && content->type != KVR_JSON_NULL)
                    return fail(&c, 400, KVR_ERR_INVALID, k,
                                "'messages' element %zu: 'content' must be a string or a list "
                                "of parts, not %s",
                                j, type_name(content));
            }
            r->messages = v;
        } else if (!strcmp(k, "chat_template_kwargs") && chat) {
            if (v->type != KVR_JSON_OBJECT)
                return fail(&c, 400, KVR_ERR_INVALID, k,
                            "'chat_template_kwargs' must be an object (variables for the "
                            "template)");
            kwargs = v;
        } else if (!strcmp(k, "logprobs") && chat) {
            bool b = false;
            st = get_bool(&c, k, v, &b);
            r->logprobs = b ? 0 : -1;
        } else if (!strcmp(k, "top_logprobs") && chat) {
            st = get_int(&c, k, v, 0, FE_MAX_TOP_LOGPROBS, &top_logprobs);
        } else if (!strcmp(k, "prompt") && !chat) {
            st = parse_prompt(&c, v, r);
            have_prompt = true;
        } else if (!strcmp(k, "max_tokens") || (chat && !strcmp(k, "max_completion_tokens"))) {
            st = get_int(&c, k, v, 1, fe_cfg.context_len ? fe_cfg.context_len : 1 << 20, &iv);
            r->max_tokens = (uint32_t)iv;
            have_max_tokens = true;
        } else if (!strcmp(k, "temperature")) {
            st = get_num(&c, k, v, 0, 2, &dv);
            r->temperature = (float)dv;
        } else if (!strcmp(k, "top_p")) {
            st = get_num(&c, k, v, 0, 1, &dv);
            if (st == KVR_OK && dv <= 0)
                return fail(&c, 400, KVR_ERR_INVALID, k, "'top_p' must be in (0, 1]");
            r->top_p = (float)dv;
        } else if (!strcmp(k, "top_k")) {
            st = get_int(&c, k, v, -1, 1 << 20, &iv);
            r->top_k = iv > 0 ? (uint32_t)iv : 0; /* -1 and 0 = off, as in vLLM */
        } else if (!strcmp(k, "min_p")) {
            st = get_num(&c, k, v, 0, 1, &dv);
            r->min_p = (float)dv;
        } else if (!strcmp(k, "repetition_penalty")) {
            st = get_num(&c, k, v, 0, 10, &dv);
            if (st == KVR_OK && dv <= 0)
                return fail(&c, 400, KVR_ERR_INVALID, k, "'repetition_penalty' must be > 0");
            r->repetition_penalty = (float)dv;
        } else if (!strcmp(k, "presence_penalty")) {
            st = get_num(&c, k, v, -2, 2, &dv);
            r->presence_penalty = (float)dv;
        } else if (!strcmp(k, "frequency_penalty")) {
            st = get_num(&c, k, v, -2, 2, &dv);
            r->frequency_penalty = (float)dv;
        } else if (!strcmp(k, "seed")) {
            if (v->type != KVR_JSON_NUMBER || !v->is_int)
                return fail(&c, 400, KVR_ERR_INVALID, k, "'seed' must be an integer, not %s",
                            type_name(v));
            r->seed = (uint64_t)v->i64;
            r->has_seed = true;
        } else if (!strcmp(k, "stop")) {
            st = parse_stop(&c, v, r);
        } else if (!strcmp(k, "stop_token_ids")) {
            if (v->type != KVR_JSON_ARRAY || v->n > 32)
                return fail(&c, 400, KVR_ERR_INVALID, k,
                            "'stop_token_ids' must be a list of at most 32 token ids");
            for (size_t j = 0; j < v->n; j++) {
                st = get_int(&c, k, v->items[j], 0, INT32_MAX, &iv);
                if (st != KVR_OK)
                    return st;
                r->stop_token_ids[r->n_stop_token_ids++] = (uint32_t)iv;
            }
        } else if (!strcmp(k, "ignore_eos")) {
            st = get_bool(&c, k, v, &r->ignore_eos);
        } else if (!strcmp(k, "n")) {
            st = get_int(&c, k, v, 1, fe_cfg.max_n, &iv);
            r->n = (uint32_t)iv;
        } else if (!strcmp(k, "best_of") && !chat) {
            st = get_int(&c, k, v, 1, fe_cfg.max_n, &best_of);
            have_best_of = true;
        } else if (!strcmp(k, "logprobs") && !chat) {
            st = get_int(&c, k, v, 0, FE_MAX_TOP_LOGPROBS, &iv);
            r->logprobs = (int)iv;
        } else if (!strcmp(k, "echo") && !chat) {
            bool b = false;
            st = get_bool(&c, k, v, &b);
            if (st == KVR_OK)
                st = only_default(&c, k, v, !b, "echo: true (the prompt in the output)");
        } else if (!strcmp(k, "suffix") && !chat) {
            st = only_default(&c, k, v, false, "suffix (insertion) needs a model trained for it");
        } else if (!strcmp(k, "logit_bias")) {
            st = parse_logit_bias(&c, v, r);
        } else if (!strcmp(k, "stream")) {
            st = get_bool(&c, k, v, &r->stream);
        } else if (!strcmp(k, "stream_options")) {
            if (v->type != KVR_JSON_OBJECT)
                return fail(&c, 400, KVR_ERR_INVALID, k, "'stream_options' must be an object");
            for (size_t j = 0; j < v->n; j++) {
                if (strcmp(v->keys[j], "include_usage") != 0)
                    return fail(&c, 400, KVR_ERR_INVALID, k,
                                "unknown member '%s' of 'stream_options' (include_usage is known)",
                                v->keys[j]);
                if (v->items[j]->type != KVR_JSON_NULL) {
                    st = get_bool(&c, "stream_options.include_usage", v->items[j],
                                  &r->include_usage);
                    if (st != KVR_OK)
                        return st;
                }
            }
            have_stream_options = true;
        } else if (!strcmp(k, "user")) {
            if (v->type != KVR_JSON_STRING)
                return fail(&c, 400, KVR_ERR_INVALID, k, "'user' must be a string");
            /* an end-user id for the operator's logs; it changes nothing, as in OpenAI */
        } else {
            return fail(&c, 400, KVR_ERR_INVALID, k,
                        "Unrecognized request argument supplied: %s (kvrail answers every field "
                        "or refuses it)",
                        k);
        }
        if (st != KVR_OK)
            return st;
    }
    if (!have_model)
        return fail(&c, 400, KVR_ERR_INVALID, "model",
                    "'model' is required (this server serves '%s')", fe_cfg.model_name);
    if (!chat && !have_prompt)
        return fail(&c, 400, KVR_ERR_INVALID, "prompt", "'prompt' is required");
    if (chat && !r->messages)
        return fail(&c, 400, KVR_ERR_INVALID, "messages", "'messages' is required");
    if (chat) {
        r->prompts = calloc(1, sizeof(*r->prompts));
        if (!r->prompts)
            return fail(&c, 500, KVR_ERR_NO_MEMORY, "messages", "out of memory");
        r->n_prompts = 1;
        char m[600];
        kvr_status_t st = fe_chat_prompt(r->messages, kwargs, &r->prompts[0], m, sizeof(m));
        if (st != KVR_OK)
            return fail(&c, st == KVR_ERR_NO_MEMORY ? 500 : 400, st, "messages", "%s", m);
        if (!have_max_tokens) { /* OpenAI: up to the end of the context */
            size_t left = fe_cfg.context_len > r->prompts[0].n_ids
                              ? fe_cfg.context_len - r->prompts[0].n_ids
                              : 16;
            if (!fe_cfg.context_len)
                left = 16;
            if (fe_cfg.max_tokens_limit && left > fe_cfg.max_tokens_limit)
                left = fe_cfg.max_tokens_limit;
            r->max_tokens = (uint32_t)left;
        }
    }
    if (chat && top_logprobs >= 0) {
        if (r->logprobs < 0 && top_logprobs > 0)
            return fail(&c, 400, KVR_ERR_INVALID, "top_logprobs",
                        "'top_logprobs' needs 'logprobs': true");
        if (r->logprobs >= 0)
            r->logprobs = (int)top_logprobs;
    }
    if (r->logprobs > 0 && !fe_have_tokenizer())
        return fail(&c, 400, KVR_ERR_UNSUPPORTED, chat ? "top_logprobs" : "logprobs",
                    "top-N logprobs need the model's tokenizer in the frontend (start it with "
                    "--config; see its log for why the tokenizer did not load)");
    if (have_stream_options && !r->stream)
        return fail(&c, 400, KVR_ERR_INVALID, "stream_options",
                    "'stream_options' is only allowed when 'stream' is true");
    if (have_best_of && best_of != (int64_t)r->n)
        return fail(&c, 400, KVR_ERR_UNSUPPORTED, "best_of",
                    "'best_of' other than n is not supported (kvrail does not rank candidates)");
    if ((uint64_t)r->n * r->n_prompts > (uint64_t)fe_cfg.max_n * 4)
        return fail(&c, 400, KVR_ERR_INVALID, "n",
                    "%zu prompts x n %u = %llu choices; this server runs at most %u at once",
                    r->n_prompts, r->n, (unsigned long long)r->n * r->n_prompts, fe_cfg.max_n * 4);
    return KVR_OK;
}

void fe_req_free(struct fe_req *r)
{
    for (size_t i = 0; i < r->n_prompts; i++)
        free(r->prompts[i].ids);
    free(r->prompts);
    r->prompts = NULL;
    r->n_prompts = 0;
}
