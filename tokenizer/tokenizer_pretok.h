/*
 * tokenizer_pretok.h - private to the tokenizer: the pre-tokenizer regexes
 * of byte-level BPE models, run by hand-written matchers
 * (tokenizer_pretok.c).
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

/** Splits s[0..len) into pieces, calling fn on each in order (a non-KVR_OK
 *  return stops the split and is returned).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; what fn returned. */
kvr_status_t kvr_pretok_split(enum kvr_pretok kind, const char *s, size_t len,
                              kvr_pretok_piece_fn fn, void *ctx);

#endif
