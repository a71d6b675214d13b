/*
 * chat_prompt.c - `--chat FILE` / `--message role:content` of kvrail run:
 * builds the messages list (from the file, or from the options in order),
 * loads the model's chat template and bos/eos from tokenizer_config.json
 * (kvr_chat_template_load) and renders it with add_generation_prompt, so a
 * person sees the model's chat format and generates from it.
 */
#include "chat_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_chat.h"
#include "kvr_json.h"

bool kvr_chat_prompt_wanted(const struct kvr_chat_prompt_opts *o)
{
    return o->file || o->n_messages;
}

/* the --message options as a JSON array */
static char *messages_json(const char *who, const struct kvr_chat_prompt_opts *o)
{
    size_t cap = 64, n = 0;
    for (size_t i = 0; i < o->n_messages; i++)
        cap += kvr_json_escape(NULL, 0, o->messages[i], strlen(o->messages[i])) + 64;
    char *j = malloc(cap);
    if (!j)
        return NULL;
    n += (size_t)snprintf(j + n, cap - n, "[");
    for (size_t i = 0; i < o->n_messages; i++) {
        const char *m = o->messages[i], *colon = strchr(m, ':');
        if (!colon || colon == m) {
            fprintf(stderr, "%s: --message '%s' is not role:content (e.g. user:Hello)\n", who, m);
            free(j);
            return NULL;
        }
        n += (size_t)snprintf(j + n, cap - n, "%s{\"role\": ", i ? ", " : "");
        n += kvr_json_escape(j + n, cap - n, m, (size_t)(colon - m));
        n += (size_t)snprintf(j + n, cap - n, ", \"content\": ");
        n += kvr_json_escape(j + n, cap - n, colon + 1, strlen(colon + 1));
        n += (size_t)snprintf(j + n, cap - n, "}");
    }
    snprintf(j + n, cap - n, "]");
    return j;
}

int kvr_chat_prompt_render(const char *who, const char *model_dir,
                           const struct kvr_chat_prompt_opts *o, char **text_p)
{
    char err[1024];
    int rc = -1;
    char *tmpl = NULL, *bos = NULL, *eos = NULL, *mj = NULL;
    kvr_json_doc_t *doc = NULL;
    if (o->file && o->n_messages) {
        fprintf(stderr, "%s: give --chat FILE or --message options, not both\n", who);
        return -1;
    }
    if (kvr_chat_template_load(model_dir, o->template_name, &tmpl, &bos, &eos, err, sizeof(err)) !=
        KVR_OK) {
        fprintf(stderr, "%s: chat template: %s\n", who, err);
        goto out;
    }
    kvr_status_t st;
    if (o->file) {
        st = kvr_json_parse_file(o->file, &doc, err, sizeof(err));
    } else {
        if (!(mj = messages_json(who, o)))
            goto out;
        st = kvr_json_parse(mj, strlen(mj), &doc, err, sizeof(err));
    }
    if (st != KVR_OK) {
        fprintf(stderr, "%s: messages: %s\n", who, err);
        goto out;
    }
    const kvr_json_t *root = kvr_json_root(doc), *msgs = root, *tools = NULL;
    if (root->type == KVR_JSON_OBJECT) {
        msgs = kvr_json_get(root, "messages");
        tools = kvr_json_get(root, "tools");
    }
    if (!msgs || msgs->type != KVR_JSON_ARRAY) {
        fprintf(stderr,
                "%s: %s: expected a JSON array of {\"role\", \"content\"} messages (or an object "
                "with \"messages\")\n",
                who, o->file ? o->file : "--message");
        goto out;
    }
    struct kvr_chat_options co = {
        .add_generation_prompt = true, .bos_token = bos, .eos_token = eos, .tools = tools};
    size_t len;
    if (kvr_chat_render(tmpl, strlen(tmpl), msgs, &co, text_p, &len, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "%s: chat template of %s: %s\n", who, model_dir, err);
        goto out;
    }
    rc = 0;
out:
    free(tmpl);
    free(bos);
    free(eos);
    free(mj);
    kvr_json_free(doc);
    return rc;
}
