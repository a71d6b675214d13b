/*
 * tokenizer_pretok.h - private to the tokenizer: the pre-tokenizer regexes
 * of byte-level BPE models, run by Oniguruma (tokenizer_regex.c) or, for the
 * three patterns shown equal to Oniguruma by tests/unit/test_pretok.c, by
 * hand-written matchers (tokenizer_pretok.c).
 */
#ifndef KVR_TOKENIZER_PRETOK_H
#define KVR_TOKENIZER_PRETOK_H

#include <stddef.h>

#include "kvr_status.h"

enum kvr_pretok {
    KVR_PRETOK_NONE,   /* the whole text is one piece */
    KVR_PRETOK_GPT2,   /* ByteLevel use_regex: GPT-2's pattern */
    KVR_PRETOK_LLAMA3, /* Llama 3's Split pattern (\p{N}{1,3}) */
    KVR_PRETOK_QWEN2,  /* Qwen2's Split pattern (\p{N}) */
};

/* The patterns exactly as tokenizer.json spells them. */
extern const char kvr_pretok_regex_llama3[];
extern const char kvr_pretok_regex_qwen2[];
extern const char kvr_pretok_regex_gpt2[];

typedef kvr_status_t (*kvr_pretok_piece_fn)(void *ctx, const char *piece, size_t len);

/** The hand-written matcher for a pattern spelled exactly as one of the
 *  three above, or KVR_PRETOK_NONE. */
enum kvr_pretok kvr_pretok_fast_path(const char *pattern, size_t len);

/** Splits s[0..len) into pieces, calling fn on each in order (a non-KVR_OK
 *  return stops the split and is returned).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; what fn returned. */
kvr_status_t kvr_pretok_split(enum kvr_pretok kind, const char *s, size_t len,
                              kvr_pretok_piece_fn fn, void *ctx);

/* ---- any pattern, through Oniguruma (tokenizer_regex.c) ---- */

typedef struct kvr_pretok_regex kvr_pretok_regex_t;

/** Compiles pattern[0..len) (Ruby syntax, UTF-8, as Hugging Face's
 *  tokenizers compiles it).  err receives Oniguruma's message.
 *  @return KVR_OK; KVR_ERR_INVALID (the pattern does not compile);
 *          KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_pretok_regex_new(const char *pattern, size_t len, kvr_pretok_regex_t **re_p,
                                  char *err, size_t err_len);
void kvr_pretok_regex_free(kvr_pretok_regex_t *re);
/** Splits s[0..len) at the regex's matches (behaviour "Isolated"), calling
 *  fn on each piece in order, as kvr_pretok_split does.
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; KVR_ERR_INTERNAL (Oniguruma failed,
 *          e.g. its backtracking limit); what fn returned. */
kvr_status_t kvr_pretok_regex_split(const kvr_pretok_regex_t *re, const char *s, size_t len,
                                    kvr_pretok_piece_fn fn, void *ctx);

/** s[0..len) with every non-empty match replaced by repl (the Replace
 *  normalizer's Regex pattern); *out_p malloc'd and NUL-terminated.
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; KVR_ERR_INTERNAL (Oniguruma failed). */
kvr_status_t kvr_pretok_regex_replace(const kvr_pretok_regex_t *re, const char *s, size_t len,
                                      const char *repl, size_t repl_len, char **out_p,
                                      size_t *out_len_p);

#endif
