/*
 * fuzz_openai.c - fuzz target over the frontend's OpenAI request parser
 * (frontend/request.c, and chat.c's template rendering and tokenizing of
 * chat messages): the body of a /v1/completions or /v1/chat/completions
 * request, as the frontend's HTTP layer hands it on (kvr_json_parse, then
 * fe_req_parse, then fe_req_free whatever the outcome).
 *
 * An input is one mode byte, then the body:
 *   bit 0: chat (/v1/chat/completions), else /v1/completions
 *   bit 1: the model's context length unknown (0), else 256
 *   bit 2: the router's max_tokens bound 64, else none
 *   bit 3: n at most 4, else 16
 * The chat template and tokenizer are tests/fuzz/data/chat's (the tiny
 * model's tokenizer and a Llama-3-like template that reads string and
 * list contents and a chat_template_kwargs variable), loaded once.
 *
 * Checked beyond "no crash, no leak, no undefined behaviour": a rejection
 * has an HTTP status of 400, 404 or 500 and a message, and names the
 * parameter that was wrong (a member of the body, or the required one
 * that is missing) unless the body is not an object at all; an accepted
 * request is within every bound the rest of the frontend relies on.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "kvr_json.h"
#include "kvr_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct fe_config fe_cfg = {
    .model_name = "fuzz-model",
    .max_n = 16,
    .max_prompts = 64,
    .def_temperature = 1.0f,
    .def_top_p = 1.0f,
    .def_repetition_penalty = 1.0f,
};

static void setup_once(void)
{
    static bool ready;
    if (ready)
        return;
    kvr_log_set_level(KVR_LOG_ERROR);
    fe_chat_init(KVR_FUZZ_DATA "/chat");
    if (!fe_cfg.have_chat || !fe_have_tokenizer()) {
        fprintf(stderr, "fuzz_openai: no chat template/tokenizer in %s: %s\n",
                KVR_FUZZ_DATA "/chat", fe_chat_unavailable());
        abort();
    }
    ready = true;
}

/* param names a member of root: the whole name, one cut to fit param's
 * buffer (cap), or a member's member (stream_options.include_usage) */
static bool is_member(const kvr_json_t *root, const char *param, size_t cap)
{
    size_t pl = strlen(param), dot = strcspn(param, ".");
    for (size_t i = 0; i < root->n; i++) {
        size_t kl = strlen(root->keys[i]); /* a name with a NUL: up to it */
        if ((kl == pl || (pl == cap - 1 && kl > pl)) && !memcmp(root->keys[i], param, pl))
            return true;
        if (!strcmp(param, "stream_options.include_usage") && kl == dot &&
            !memcmp(root->keys[i], param, dot))
            return true;
    }
    return false;
}

static void check_ok(const struct fe_req *r, bool chat)
{
    if (r->n_prompts < 1 || r->n_prompts > fe_cfg.max_prompts || !r->prompts)
        abort();
    for (size_t i = 0; i < r->n_prompts; i++) {
        const struct fe_prompt *p = &r->prompts[i];
        if (!p->text == !p->ids || (p->ids && p->n_ids == 0))
            abort();
        if (p->text && chat) /* chat: the rendered messages' token ids */
            abort();
    }
    if (chat && !r->messages)
        abort();
    if (r->max_tokens < 1 || r->n < 1 || r->n > fe_cfg.max_n ||
        (uint64_t)r->n * r->n_prompts > (uint64_t)fe_cfg.max_n * 4)
        abort();
    if (r->n_stop > FE_MAX_STOPS || r->n_logit_bias > FE_MAX_LOGIT_BIAS ||
        r->n_stop_token_ids > sizeof(r->stop_token_ids) / sizeof(r->stop_token_ids[0]))
        abort();
    for (size_t i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0] || strlen(r->stop[i]) > 256)
            abort();
    for (size_t i = 0; i < r->n_logit_bias; i++)
        if (r->logit_bias[i].token_id > INT32_MAX || !(fabsf(r->logit_bias[i].bias) <= 100))
            abort();
    if (!(r->temperature >= 0 && r->temperature <= 2) || !(r->top_p > 0 && r->top_p <= 1) ||
        !(r->min_p >= 0 && r->min_p <= 1) ||
        !(r->repetition_penalty > 0 && r->repetition_penalty <= 10) ||
        !(fabsf(r->presence_penalty) <= 2) || !(fabsf(r->frequency_penalty) <= 2))
        abort();
    if (r->logprobs < -1 || r->logprobs > FE_MAX_TOP_LOGPROBS)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    bool chat = mode & 1;
    fe_cfg.context_len = (mode & 2) ? 0 : 256;
    fe_cfg.max_tokens_limit = (mode & 4) ? 64 : 0;
    fe_cfg.max_n = (mode & 8) ? 4 : 16;
    kvr_json_doc_t *doc = NULL;
    char err[512];
    if (kvr_json_parse((const char *)data + 1, size - 1, &doc, err, sizeof(err)) != KVR_OK)
        return 0; /* answered 400 by the HTTP layer before the parser */
    const kvr_json_t *root = kvr_json_root(doc);
    struct fe_req r;
    unsigned status = 0;
    char param[64] = "", msg[700] = "";
    kvr_status_t st = fe_req_parse(root, chat, &r, &status, param, sizeof(param), msg, sizeof(msg));
    if (getenv("FUZZ_VERBOSE")) /* what a seed got */
        fprintf(stderr, "fuzz_openai: %u %s: %s\n", st == KVR_OK ? 200 : status, param, msg);
    if (st == KVR_OK) {
        check_ok(&r, chat);
    } else {
        if ((status != 400 && status != 404 && status != 500) || !msg[0])
            abort();
        if (root->type == KVR_JSON_OBJECT && !is_member(root, param, sizeof(param)) &&
            strcmp(param, "model") != 0 && strcmp(param, chat ? "messages" : "prompt") != 0 &&
            strcmp(param, "n") != 0)
            abort(); /* a rejection that does not name what was wrong */
    }
    fe_req_free(&r);
    kvr_json_free(doc);
    return 0;
}
