/*
 * tokenizer_internal.h - private to the tokenizer files: the tokenizer
 * object, its maps, and the helpers they share.
 *   tokenizer.c        loading tokenizer.json (+ configs), lookups
 *   tokenizer_bpe.c    encoding: added tokens, normalizers, pre-tokenizers, BPE
 *   tokenizer_detok.c  decoding and streaming detokenization
 */
#ifndef KVR_TOKENIZER_INTERNAL_H
#define KVR_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_tokenizer.h"
#include "tokenizer_pretok.h"
#include "tokenizer_unicode.h"

enum kind { KIND_BYTELEVEL, KIND_SP };

enum norm_op { NORM_UNICODE, NORM_PREPEND, NORM_REPLACE, NORM_STRIP };

struct norm {
    enum norm_op op;
    enum kvr_uni_form form; /* NORM_UNICODE */
    bool left, right;       /* NORM_STRIP */
    kvr_pretok_regex_t *re; /* NORM_REPLACE with a Regex pattern (a unused) */
    char *a;                /* prepend text / replace pattern */
    char *b;                /* replace content */
    size_t alen, blen;
};

/* string -> int32 open-addressing map; keys are copied into its pool */
struct strmap {
    size_t cap; /* power of two */
    size_t n;
    uint64_t *hash;
    uint32_t *off, *len;
    int32_t *val; /* -1 = empty */
    char *pool;
    size_t pool_len, pool_cap;
};

struct pair_ent {
    uint64_t key; /* (a << 32 | b), UINT64_MAX empty */
    int32_t rank, out;
};

struct pairmap {
    size_t cap;
    struct pair_ent *e; /* one cache line holds four: one miss a lookup */
};

struct added {
    int32_t id;
    char *content;
    size_t len;
    bool special, lstrip, rstrip, normalized;
};

struct kvr_tokenizer {
    enum kind kind;
    bool has_regex;            /* a Split / ByteLevel regex splits the text */
    enum kvr_pretok pretok;    /* its hand-written fast path, or NONE */
    kvr_pretok_regex_t *regex; /* the regex in Oniguruma */
    bool bl_prefix_space;      /* ByteLevel add_prefix_space */
    bool metaspace, ms_split;
    int ms_prepend; /* 0 never, 1 first, 2 always */
    char ms_repl[8];
    size_t ms_repl_len;
    struct norm *norms;
    size_t n_norms;
    bool ignore_merges, byte_fallback, fuse_unk;
    /* sentencepiece: no merge joins a piece ending in a non-"▁" character to
     * one starting with "▁", so text may be cut before every such "▁" and
     * each word merged alone, with the same result (and word-sized scratch) */
    bool sp_word_split;
    int32_t unk_id;
    /* Unigram model (tokenizer_unigram.c): scores of the ids [0, uni_n) */
    bool unigram;
    int32_t uni_n;
    float *uni_score; /* -INFINITY: not a model piece */
    double uni_unk_score;
    size_t uni_max_len;
    int sp_strip; /* decoder: leading spaces stripped at the stream start */

    uint64_t uid; /* unique per loaded tokenizer: the word cache's key */
    int32_t n_ids;
    char **piece;         /* [n_ids] original piece, NUL-terminated, or NULL */
    uint32_t *piece_len;  /* [n_ids] */
    char **dec;           /* [n_ids] bytes a vocabulary piece decodes to */
    uint32_t *dec_len;    /* [n_ids] */
    int16_t *byte_tok;    /* [n_ids] byte value of <0xXX> tokens (SP), else -1 */
    int32_t *added_ix;    /* [n_ids] index into added[], or -1 */
    struct strmap pieces; /* piece -> id (vocabulary, then added tokens) */
    struct strmap raw;    /* byte-level: raw bytes -> id */
    struct pairmap merges;
    int32_t byte_id[256]; /* byte-level: id of each single byte; SP: <0xXX> */

    struct added *added;
    size_t n_added;
    int32_t *added_by_first[256]; /* indices, longest content first, -1 ended */

    int32_t bos_id, eos_id;
    bool add_bos, add_eos;
    int32_t *eos_ids;
    size_t n_eos;
};

struct buf {
    char *p;
    size_t n, cap;
};

struct ids {
    int32_t *p;
    size_t n, cap;
};

int32_t kvr_tok_strmap_get(const struct strmap *m, const char *k, size_t n);
bool kvr_tok_buf_put(struct buf *b, const void *s, size_t n);
bool kvr_tok_ids_put(struct ids *v, int32_t id);
/** Appends the Unigram (Viterbi) pieces of one word. */
kvr_status_t kvr_tok_unigram_word(const kvr_tokenizer_t *t, struct ids *out, const char *w,
                                  size_t n);

static inline uint64_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

static inline bool kvr_tok_pairmap_get(const struct pairmap *m, int32_t a, int32_t b,
                                       int32_t *rank_p, int32_t *out_p)
{
    if (a < 0 || b < 0 || !m->cap)
        return false;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = pair_hash(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const struct pair_ent *e = &m->e[i];
        if (e->key == k) {
            *rank_p = e->rank;
            *out_p = e->out;
            return true;
        }
        if (e->key == UINT64_MAX)
            return false;
    }
}

#endif
