/*
 * chat.c - /v1/chat/completions: an OpenAI messages list -> prompt token ids,
 * with the model's own chat template (tokenizer_config.json's
 * chat_template, rendered by the tokenizer library's kvr_chat_*).
 *
 * At start the template is loaded and compiled once (a compiled template
 * is read-only, so every connection thread renders it at once), and the
 * tokenizer is loaded.  The rendered text already holds what the template
 * puts there (bos_token included), so it is encoded without adding special
 * tokens, as Hugging Face's apply_chat_template(tokenize=True) does.  When
 * the model has no template, chat is off and every chat request is
 * answered 501 with the reason.  The tokenizer is loaded whatever the
 * template: it also gives the text of the top-N alternatives of logprobs
 * (fe_token_text).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_log.h"
#include "frontend.h"

#include "kvr_chat.h"
#include "kvr_tokenizer.h"

static kvr_chat_template_t *tpl;
static char *bos, *eos;
static kvr_tokenizer_t *tok;

static char why_off[1024] = "chat completions are not set up yet (fe_chat_init not called)";

const char *fe_chat_unavailable(void)
{
    return why_off;
}

void fe_chat_init(const char *model_dir)
{
    char err[512];
    char *src = NULL;
    if (model_dir && kvr_tokenizer_load(model_dir, &tok, err, sizeof(err)) != KVR_OK) {
        tok = NULL;
        KVR_LOG_WARN(FE_COMP, "no tokenizer (%s): chat and top-N logprobs are off", err);
    }
    if (!model_dir) {
        snprintf(why_off, sizeof(why_off),
                 "chat completions (messages) need the model's chat template; start the frontend "
                 "with --config (the cluster file names the model folder)");
        return;
    }
    kvr_status_t st = kvr_chat_template_load(model_dir, NULL, &src, &bos, &eos, err, sizeof(err));
    if (st == KVR_OK)
        st = kvr_chat_template_new(src, strlen(src), &tpl, err, sizeof(err));
    free(src);
    if (st != KVR_OK) {
        snprintf(why_off, sizeof(why_off),
                 "chat completions (messages) need the model's chat template: %s; use "
                 "/v1/completions with the prompt already in the chat format",
                 err);
        KVR_LOG_WARN(FE_COMP, "chat off: %s", err);
        return;
    }
    if (!tok) {
        kvr_chat_template_destroy(tpl);
        tpl = NULL;
        snprintf(why_off, sizeof(why_off),
                 "chat completions (messages) need the model's tokenizer, which did not load "
                 "(see the frontend's log)");
        KVR_LOG_WARN(FE_COMP, "chat off: no tokenizer");
        return;
    }
    fe_cfg.have_chat = true;
    KVR_LOG_INFO(FE_COMP, "chat template of %s loaded", model_dir);
}

kvr_status_t fe_chat_prompt(const kvr_json_t *messages, const kvr_json_t *kwargs,
                            struct fe_prompt *p, char *msg, size_t msg_len)
{
    if (!tpl)
        return KVR_ERR_UNSUPPORTED;
    struct kvr_chat_options o = {
        .add_generation_prompt = true,
        .bos_token = bos,
        .eos_token = eos,
        .extra = kwargs,
    };
    char *text = NULL, err[512];
    size_t len = 0;
    kvr_status_t st = kvr_chat_template_render(tpl, messages, &o, &text, &len, err, sizeof(err));
    if (st != KVR_OK) {
        snprintf(msg, msg_len, "the model's chat template cannot render these messages: %s", err);
        return st == KVR_ERR_NO_MEMORY ? st : KVR_ERR_INVALID;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    st = kvr_tokenizer_encode(tok, text, len, false, &ids, &n);
    free(text);
    if (st != KVR_OK) {
        snprintf(msg, msg_len, "tokenizing the rendered chat failed: %s", kvr_status_str(st));
        return st;
    }
    if (n == 0) {
        free(ids);
        snprintf(msg, msg_len, "the chat template rendered these messages to nothing");
        return KVR_ERR_INVALID;
    }
    p->ids = (uint32_t *)ids; /* same size and representation, ids are >= 0 */
    p->n_ids = n;
    return KVR_OK;
}

bool fe_have_tokenizer(void)
{
    return tok != NULL;
}

kvr_status_t fe_token_text(uint32_t id, char **text_p, size_t *len_p)
{
    if (!tok)
        return KVR_ERR_UNSUPPORTED;
    int32_t i = (int32_t)id;
    return kvr_tokenizer_decode(tok, &i, 1, false, text_p, len_p);
}
