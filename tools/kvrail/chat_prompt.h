/*
 * chat_prompt.h - `--chat` for kvrail run / generate: a messages list (a
 * JSON file, or --message role:content options) rendered through the
 * model's chat template (chat_prompt.c).
 */
#ifndef KVR_CHAT_PROMPT_H
#define KVR_CHAT_PROMPT_H

#include <stdbool.h>
#include <stddef.h>

enum { KVR_CHAT_MAX_MESSAGES = 256 };

struct kvr_chat_prompt_opts {
    const char *file; /* JSON: a messages array, or {"messages": [...], "tools": [...]} */
    const char *messages[KVR_CHAT_MAX_MESSAGES]; /* "role:content" */
    size_t n_messages;
    const char *template_name; /* when chat_template is a list; NULL: default */
};

/** True when --chat or --message was given. */
bool kvr_chat_prompt_wanted(const struct kvr_chat_prompt_opts *o);

/** Renders the prompt with the chat template in model_dir's
 *  tokenizer_config.json (add_generation_prompt on).  *text_p is malloc'd.
 *  Prints what was wrong (prefixed by who) and returns -1 on error. */
int kvr_chat_prompt_render(const char *who, const char *model_dir,
                           const struct kvr_chat_prompt_opts *o, char **text_p);

#endif
