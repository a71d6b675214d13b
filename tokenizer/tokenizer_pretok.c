/*
 * tokenizer_pretok.c - the fast paths of three pre-tokenizer regexes of
 * byte-level BPE models, as hand-written matchers (any other pattern runs in
 * Oniguruma, tokenizer_regex.c; tests/unit/test_pretok.c checks that these
 * split exactly as Oniguruma does on the oracle corpus and generated text):
 *
 *  GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *  Llama 3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *  Qwen2   the same with \p{N} for \p{N}{1,3}
 *
 * The text is first classified once per code point (letter, number, space,
 * CR/LF, other); each alternative is then matched in the regex's order with
 * exactly the backtracking the regex engine would do (worked out per
 * alternative in the comments), and the first that matches wins.  The Split
 * behaviour is "Isolated": every match is its own piece, and so is any text
 * between matches (these patterns leave none).
 */
#include "tokenizer_pretok.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer_unicode.h"

enum { C_L = 1, C_N = 2, C_S = 4, C_CRLF = 8 };

const char kvr_pretok_regex_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char kvr_pretok_regex_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char kvr_pretok_regex_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum kvr_pretok kvr_pretok_fast_path(const char *pattern, size_t len)
{
    static const struct {
        const char *re;
        enum kvr_pretok kind;
    } known[] = {{kvr_pretok_regex_llama3, KVR_PRETOK_LLAMA3},
                 {kvr_pretok_regex_qwen2, KVR_PRETOK_QWEN2},
                 {kvr_pretok_regex_gpt2, KVR_PRETOK_GPT2}};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strlen(known[i].re) == len && !memcmp(known[i].re, pattern, len))
            return known[i].kind;
    return KVR_PRETOK_NONE;
}

struct text {
    size_t n;           /* code points */
    const uint32_t *cp; /* [n] */
    const uint8_t *cls; /* [n] */
};

static inline bool is(const struct text *t, size_t i, uint8_t c)
{
    return i < t->n && (t->cls[i] & c);
}

static inline bool other(const struct text *t, size_t i) /* [^\s\p{L}\p{N}] */
{
    return i < t->n && !(t->cls[i] & (C_L | C_N | C_S));
}

/* Case folding as Oniguruma's (?i:...) does it for the contraction letters:
 * ASCII, and U+017F LATIN SMALL LETTER LONG S, which folds to 's' (no other
 * code point folds to one of s, t, r, v, m, l, d; test_pretok checks). */
static inline uint32_t lower(uint32_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c == 0x17F ? 's' : c;
}

static size_t run(const struct text *t, size_t i, uint8_t c)
{
    while (i < t->n && (t->cls[i] & c))
        i++;
    return i;
}

static size_t run_other(const struct text *t, size_t i)
{
    while (other(t, i))
        i++;
    return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i: returns the end, or 0 */
static size_t contraction(const struct text *t, size_t i, bool fold)
{
    if (t->cp[i] != '\'' || i + 1 >= t->n)
        return 0;
    uint32_t a = fold ? lower(t->cp[i + 1]) : t->cp[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return i + 2;
    if (i + 2 >= t->n)
        return 0;
    uint32_t b = fold ? lower(t->cp[i + 2]) : t->cp[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return i + 3;
    return 0;
}

/* \s+(?!\S) then \s+ : the space run [i, j); if text follows it, the last
 * space is left for the next match (the lookahead fails on \S otherwise). */
static size_t spaces(const struct text *t, size_t i)
{
    size_t j = run(t, i, C_S);
    if (j == t->n || j - i == 1)
        return j; /* (?!\S) holds at the end; a single space: \s+ takes it */
    return j - 1;
}

static size_t match_gpt2(const struct text *t, size_t i)
{
    size_t e;
    if ((e = contraction(t, i, false)))
        return e;
    bool sp = t->cp[i] == ' ';
    if (sp && is(t, i + 1, C_L))
        return run(t, i + 1, C_L);
    if (is(t, i, C_L))
        return run(t, i, C_L);
    if (sp && is(t, i + 1, C_N))
        return run(t, i + 1, C_N);
    if (is(t, i, C_N))
        return run(t, i, C_N);
    if (sp && other(t, i + 1))
        return run_other(t, i + 1);
    if (other(t, i))
        return run_other(t, i);
    if (is(t, i, C_S))
        return spaces(t, i);
    return i + 1;
}

static size_t match_llama3(const struct text *t, size_t i, size_t max_digits)
{
    size_t e;
    if ((e = contraction(t, i, true)))
        return e;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!is(t, i, C_CRLF | C_L | C_N) && is(t, i + 1, C_L))
        return run(t, i + 1, C_L);
    if (is(t, i, C_L))
        return run(t, i, C_L);
    /* \p{N}{1,3} */
    if (is(t, i, C_N)) {
        e = i;
        while (e < t->n && e - i < max_digits && (t->cls[e] & C_N))
            e++;
        return e;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    if (t->cp[i] == ' ' && other(t, i + 1))
        return run(t, run_other(t, i + 1), C_CRLF);
    if (other(t, i))
        return run(t, run_other(t, i), C_CRLF);
    /* \s*[\r\n]+ : \s* backs off to the last CR/LF of the space run */
    size_t j = run(t, i, C_S);
    for (size_t q = j; q > i; q--)
        if (t->cls[q - 1] & C_CRLF)
            return q;
    if (j > i)
        return spaces(t, i);
    return i + 1;
}

kvr_status_t kvr_pretok_split(enum kvr_pretok kind, const char *s, size_t len,
                              kvr_pretok_piece_fn fn, void *ctx)
{
    if (len == 0)
        return KVR_OK;
    if (kind == KVR_PRETOK_NONE)
        return fn(ctx, s, len);
    uint32_t *cp = malloc(len * sizeof(uint32_t));
    uint32_t *off = malloc((len + 1) * sizeof(uint32_t));
    uint8_t *cls = malloc(len);
    kvr_status_t st = KVR_OK;
    if (!cp || !off || !cls) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t l = u[i] < 0x80 ? (c = u[i], 1) : kvr_utf8_next(u + i, len - i, &c);
        uint8_t k = 0;
        if (!(c & 0x80000000u)) {
            if (kvr_uni_is_letter(c))
                k = C_L;
            else if (kvr_uni_is_number(c))
                k = C_N;
            else if (kvr_uni_is_space(c))
                k = (uint8_t)(C_S | (c == '\r' || c == '\n' ? C_CRLF : 0));
        }
        cp[n] = c;
        cls[n] = k;
        off[n] = (uint32_t)i;
        n++;
        i += l;
    }
    off[n] = (uint32_t)len;
    struct text t = {n, cp, cls};
    for (size_t i = 0; i < n;) {
        size_t e;
        switch (kind) {
        case KVR_PRETOK_GPT2:
            e = match_gpt2(&t, i);
            break;
        case KVR_PRETOK_QWEN2:
            e = match_llama3(&t, i, 1);
            break;
        default:
            e = match_llama3(&t, i, 3);
            break;
        }
        st = fn(ctx, s + off[i], off[e] - off[i]);
        if (st != KVR_OK)
            goto out;
        i = e;
    }
out:
    free(cp);
    free(off);
    free(cls);
    return st;
}
