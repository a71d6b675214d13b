/*
 * kvr_chat.h - a model's chat template (the Jinja "chat_template" of
 * tokenizer_config.json) rendered in C: an OpenAI-style messages list in,
 * the exact prompt text the model was trained on out.
 *
 * The interpreter covers what real chat templates use (Llama 2/3/3.1,
 * Qwen2/2.5/3, Mistral and the like): statements if/elif/else, for (with
 * loop.*, else, an "if" filter, break/continue), set (also set blocks and
 * namespace() attributes), macro and call blocks, generation blocks;
 * expressions with literals, arithmetic, comparisons, and/or/not, in, is
 * tests, ~, conditional expressions, slices, filters (trim, tojson, length,
 * default, items, join, map, selectattr, ...), string/list/dict methods
 * (strip, startswith, split, upper, get, ...), raise_exception,
 * strftime_now, range, namespace; whitespace control {%- -%} with Hugging
 * Face's trim_blocks and lstrip_blocks.  Anything else is an error naming the
 * line and the construct, never a different rendering.  Rendering is
 * bounded: output size, work (steps), recursion depth and memory all have
 * limits that end it with an error.
 *
 * A compiled template is read-only: many threads may render it at once.
 */
#ifndef KVR_CHAT_H
#define KVR_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_json.h"
#include "kvr_status.h"

typedef struct kvr_chat_template kvr_chat_template_t;

struct kvr_chat_options {
    bool add_generation_prompt;
    const char *bos_token; /* NULL: "" */
    const char *eos_token;
    /** The "tools" / "documents" variables (JSON arrays), NULL when absent
     *  (the template then sees them undefined). */
    const kvr_json_t *tools;
    const kvr_json_t *documents;
    /** More variables (a JSON object, e.g. {"enable_thinking": false}). */
    const kvr_json_t *extra;
    /** strftime_now's clock (seconds since the epoch); 0: the real time. */
    int64_t now;
    /** Limits (0: the default): output bytes (4 MiB), steps (10 million),
     *  memory (256 MiB). */
    size_t max_output;
    uint64_t max_steps;
    size_t max_memory;
};

/** Compiles template text.  err names the line and the construct that is
 *  malformed or not supported.
 *  @return KVR_OK; KVR_ERR_INVALID (a syntax error); KVR_ERR_UNSUPPORTED (a
 *          Jinja construct this interpreter lacks); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_chat_template_new(const char *src, size_t len, kvr_chat_template_t **tpl_p,
                                   char *err, size_t err_len);
void kvr_chat_template_destroy(kvr_chat_template_t *tpl);

/** Renders messages (a JSON array of {"role", "content", ...} objects;
 *  content a string or a list of parts) into *out_p (malloc'd,
 *  NUL-terminated; free() it), *len_p bytes.
 *  @return KVR_OK; KVR_ERR_INVALID (the template failed: raise_exception, a
 *          type error, an undefined callable; err says which and where);
 *          KVR_ERR_UNSUPPORTED (a filter, test or method it lacks);
 *          KVR_ERR_OVERLOAD (a limit: output, steps, depth, memory);
 *          KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_chat_template_render(const kvr_chat_template_t *tpl, const kvr_json_t *messages,
                                      const struct kvr_chat_options *opts, char **out_p,
                                      size_t *len_p, char *err, size_t err_len);

/** Compiles and renders in one call. */
kvr_status_t kvr_chat_render(const char *tmpl, size_t tmpl_len, const kvr_json_t *messages,
                             const struct kvr_chat_options *opts, char **out_p, size_t *len_p,
                             char *err, size_t err_len);

/** Reads the chat template of a model: path is tokenizer_config.json or a
 *  directory holding it.  chat_template may be a string or a list of
 *  {"name", "template"}; name picks one from the list (NULL: "default", or
 *  the only one).  *tmpl_p, and *bos_p / *eos_p (may be NULL; the
 *  bos_token / eos_token strings, NULL when absent) are malloc'd.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND (no file, no chat_template, no template
 *          of that name: err lists the names); KVR_ERR_INVALID; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_chat_template_load(const char *path, const char *name, char **tmpl_p, char **bos_p,
                                    char **eos_p, char *err, size_t err_len);

#endif
