/*
 * kvr_tokenizer.h - Hugging Face tokenizer.json tokenizers: encode, decode and
 * incremental (streaming) detokenization.
 *
 * Three model families are supported:
 *  - byte-level BPE (GPT-2, Llama 3, Qwen2, ...): the pre-tokenizer's Split
 *    regex runs in Oniguruma (GPT-2's, Llama 3's and Qwen2's in hand-written
 *    matchers tested equal to it), bytes are mapped by the ByteLevel
 *    byte-to-unicode table, and each word is merged by merge rank;
 *  - sentencepiece-style BPE with byte fallback (Llama 2, Mistral): normalizer
 *    Prepend("▁") + Replace(" ", "▁") or a Metaspace pre-tokenizer, merges,
 *    <0xXX> byte-fallback tokens, and the matching decoder;
 *  - Unigram (sentencepiece unigram), Viterbi over the vocabulary scores.
 * Normalizers NFC / NFD / NFKC / NFKD come from libutf8proc.
 * Added tokens (special or not) are split out of the text before the model
 * runs, honouring lstrip/rstrip/single_word.  tokenizer_config.json and
 * generation_config.json next to tokenizer.json, when present, give bos/eos
 * and add_bos_token.
 *
 * A loaded tokenizer is read-only: encode/decode/lookups may be called from
 * many threads at once.  A detokenizer (kvr_detok_t) belongs to one stream.
 */
#ifndef KVR_TOKENIZER_H
#define KVR_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

typedef struct kvr_tokenizer kvr_tokenizer_t;
typedef struct kvr_detok kvr_detok_t;

/** Loads a tokenizer.  path is either a tokenizer.json file or a directory
 *  holding one (tokenizer_config.json / generation_config.json are read from
 *  the same directory when present).  err (may be NULL) receives a message
 *  naming the file and the key that was wrong.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND (no such file); KVR_ERR_INVALID
 *          (malformed JSON, missing or malformed model/vocab/merges);
 *          KVR_ERR_UNSUPPORTED (a model type, pre-tokenizer regex or
 *          normalizer this implementation does not know); KVR_ERR_NO_MEMORY;
 *          KVR_ERR_IO. */
kvr_status_t kvr_tokenizer_load(const char *path, kvr_tokenizer_t **tok_p, char *err,
                                size_t err_len);

struct kvr_tokenizer_options {
    /** Run every pre-tokenizer regex in Oniguruma, even the three patterns
     *  (GPT-2, Llama 3, Qwen2) that have hand-written matchers (for tests
     *  and benchmarks; the result is the same, only slower). */
    bool no_fast_paths;
};

/** kvr_tokenizer_load with options (NULL: the defaults). */
kvr_status_t kvr_tokenizer_load_opts(const char *path, const struct kvr_tokenizer_options *opts,
                                     kvr_tokenizer_t **tok_p, char *err, size_t err_len);
void kvr_tokenizer_destroy(kvr_tokenizer_t *tok);

/** Encodes text[0..len) (UTF-8; invalid bytes are encoded as their bytes, or
 *  U+FFFD where the model cannot) into token ids.  Added/special tokens in the
 *  text are recognised.  add_special prepends bos when the tokenizer's
 *  configuration says to (add_bos_token, or the post-processor's template).
 *  *ids_p is malloc'd (free() it); *n_p its length.
 *  @return KVR_OK; KVR_ERR_INVALID (NULL arguments); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_tokenizer_encode(const kvr_tokenizer_t *tok, const char *text, size_t len,
                                  bool add_special, int32_t **ids_p, size_t *n_p);

/** Decodes ids into UTF-8 text (malloc'd, NUL-terminated; free() it).  Bytes
 *  that do not form valid UTF-8 come out as U+FFFD, like Hugging Face's
 *  decoder.  skip_special drops special added tokens (bos, eos, ...).
 *  @return KVR_OK; KVR_ERR_OUT_OF_RANGE (an id outside the vocabulary);
 *          KVR_ERR_INVALID; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_tokenizer_decode(const kvr_tokenizer_t *tok, const int32_t *ids, size_t n,
                                  bool skip_special, char **text_p, size_t *len_p);

/** Number of ids: one more than the largest id of the vocabulary and the
 *  added tokens. */
int32_t kvr_tokenizer_vocab_size(const kvr_tokenizer_t *tok);
/** The piece of an id as it is written in tokenizer.json ("Ġhello", "▁the",
 *  "<0x0A>", "<|end_of_text|>"); NULL when the id has none.  *len_p (may be
 *  NULL) receives its byte length. */
const char *kvr_tokenizer_id_to_piece(const kvr_tokenizer_t *tok, int32_t id, size_t *len_p);
/** The id of a piece (vocabulary or added token), or -1. */
int32_t kvr_tokenizer_piece_to_id(const kvr_tokenizer_t *tok, const char *piece, size_t len);
/** True for added tokens marked "special". */
bool kvr_tokenizer_is_special(const kvr_tokenizer_t *tok, int32_t id);
/** bos id, or -1 when the tokenizer has none. */
int32_t kvr_tokenizer_bos_id(const kvr_tokenizer_t *tok);
/** The main eos id (tokenizer_config's eos_token), or -1. */
int32_t kvr_tokenizer_eos_id(const kvr_tokenizer_t *tok);
/** Every id that ends generation (eos_token plus generation_config.json's
 *  eos_token_id list); returns their count and points *ids_p at them. */
size_t kvr_tokenizer_eos_ids(const kvr_tokenizer_t *tok, const int32_t **ids_p);
/** True when id is one of kvr_tokenizer_eos_ids(). */
bool kvr_tokenizer_is_eos(const kvr_tokenizer_t *tok, int32_t id);
/** Whether encode(add_special=true) prepends bos. */
bool kvr_tokenizer_adds_bos(const kvr_tokenizer_t *tok);
/** "bpe-bytelevel", "bpe-sentencepiece" or "unigram". */
const char *kvr_tokenizer_kind(const kvr_tokenizer_t *tok);

/* ---- incremental detokenization (one per output stream) ----
 * Feed the generated ids one at a time; each call returns the text that has
 * become final: never half a UTF-8 character, and the concatenation of every
 * returned piece plus kvr_detok_flush() equals kvr_tokenizer_decode() of all
 * the ids fed (with the same skip_special).  A sentencepiece leading space is
 * stripped only at the start of the stream, as decode does. */

/** @return KVR_OK; KVR_ERR_INVALID; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_detok_create(const kvr_tokenizer_t *tok, bool skip_special, kvr_detok_t **detok_p);
void kvr_detok_destroy(kvr_detok_t *detok);
/** Feeds one id.  *text_p points into the detokenizer (valid until the next
 *  call) at the newly completed text, *len_p bytes, possibly 0.
 *  @return KVR_OK; KVR_ERR_OUT_OF_RANGE (bad id; nothing changes);
 *          KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_detok_feed(kvr_detok_t *detok, int32_t id, const char **text_p, size_t *len_p);
/** Ends the stream: returns what is still held back (an incomplete UTF-8
 *  tail, as U+FFFD), and resets the detokenizer for a new stream. */
kvr_status_t kvr_detok_flush(kvr_detok_t *detok, const char **text_p, size_t *len_p);

#endif
