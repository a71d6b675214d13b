/*
 * kvr_tokgen.h - a small generated tokenizer for test models
 * (tokenizer_gen.c): kvrail-mkmodel writes it next to a generated model, the
 * tokenizer tests load it.
 */
#ifndef KVR_TOKGEN_H
#define KVR_TOKGEN_H

#include <stdint.h>

#include "kvr_status.h"

/** Writes a byte-level BPE tokenizer.json at path: the 256 byte tokens, merges
 *  learned from a built-in English/code sample until the vocabulary (with the
 *  special tokens <|begin_of_text|>, <|end_of_text|>, ...) has vocab_size
 *  entries, the Llama 3 pre-tokenizer regex and ByteLevel decoder.  seed
 *  breaks ties between equally frequent pairs; the same seed gives the same
 *  file.  Ids: 0-255 the bytes, 256 <|begin_of_text|> (bos), 257
 *  <|end_of_text|> (eos), 258 <|eot_id|>, then the merges.  Writes nothing
 *  else (the post-processor prepends bos; without a tokenizer_config.json the
 *  loader takes these two as bos/eos; the caller may write one).
 *  When the sample yields fewer merges than vocab_size needs, the rest of
 *  the ids are <|reserved_special_token_N|> added tokens, so the file always
 *  has exactly vocab_size ids.
 *  @return KVR_OK; KVR_ERR_INVALID (vocab_size < 259 or > 2^22, NULL path);
 *          KVR_ERR_IO (the file cannot be written); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_tokenizer_gen_bytelevel(const char *path, int vocab_size, uint64_t seed);

#endif
