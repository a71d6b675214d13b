/*
 * test_pretok.c - the hand-written pre-tokenizer matchers (GPT-2, Llama 3,
 * Qwen2) against Oniguruma running the same patterns, and the normalization
 * quick check against utf8proc.
 *
 *   test_pretok CORPUS.json
 *
 * The matchers are only a fast path: encode uses one only while this test
 * shows it splitting exactly as Oniguruma does, on every string of the
 * tokenizer oracle's corpus and on generated strings (a seeded mix of
 * letters, digits, marks and spaces of many scripts, apostrophe
 * contractions in every case and Unicode case-folding look-alikes, CR/LF
 * runs, invalid UTF-8).  The quick check must never call text stable that a
 * form changes: every code point it passes, alone and after a sample of
 * others it passes, and every canonical decomposition written out, is left
 * unchanged by utf8proc.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "kvr_json.h"
#include "kvr_status.h"
#include "kvr_test.h"
#include "tokenizer_pretok.h"
#include "tokenizer_unicode.h"

struct cuts {
    size_t n, cap;
    size_t *end; /* end offset of each piece */
    const char *base;
};

static kvr_status_t collect(void *ctx, const char *s, size_t len)
{
    struct cuts *c = ctx;
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 64;
        c->end = realloc(c->end, c->cap * sizeof(size_t));
        KVR_CHECK(c->end != NULL);
    }
    c->end[c->n++] = (size_t)(s - c->base) + len;
    return KVR_OK;
}

static size_t n_strings;

static void compare(enum kvr_pretok kind, const kvr_pretok_regex_t *re, const char *s, size_t len)
{
    struct cuts a = {.base = s}, b = {.base = s};
    KVR_CHECK_STATUS(kvr_pretok_split(kind, s, len, collect, &a), KVR_OK);
    KVR_CHECK_STATUS(kvr_pretok_regex_split(re, s, len, collect, &b), KVR_OK);
    bool same = a.n == b.n && (a.n == 0 || !memcmp(a.end, b.end, a.n * sizeof(size_t)));
    if (!same) {
        fprintf(stderr, "pattern %d splits differently on \"", (int)kind);
        for (size_t i = 0; i < len; i++)
            fprintf(stderr, (unsigned char)s[i] < 0x20 ? "\\x%02x" : "%c", (unsigned char)s[i]);
        fprintf(stderr, "\"\n  hand-written:");
        for (size_t i = 0; i < a.n; i++)
            fprintf(stderr, " %zu", a.end[i]);
        fprintf(stderr, "\n  Oniguruma:   ");
        for (size_t i = 0; i < b.n; i++)
            fprintf(stderr, " %zu", b.end[i]);
        fprintf(stderr, "\n");
        exit(1);
    }
    free(a.end);
    free(b.end);
    n_strings++;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* a generated string: code points from weighted pools, plus invalid bytes */
static size_t gen(char *out)
{
    static const uint32_t pools[][2] = {
        {'a', 'z'},         {'A', 'Z'},         {'0', '9'},         {' ', ' '},
        {' ', ' '},         {'!', '/'},         {':', '@'},         {'[', '`'},
        {'{', '~'},         {'\t', '\n'},       {'\r', '\r'},       {0x0B, 0x0C},
        {0xA0, 0xFF},       {0x100, 0x17F},     {0x300, 0x36F},     {0x391, 0x3A9},
        {0x410, 0x44F},     {0x5D0, 0x5EA},     {0x627, 0x64A},     {0x660, 0x669},
        {0x905, 0x94D},     {0x966, 0x96F},     {0xE01, 0xE3A},     {0x1100, 0x11C2},
        {0x1680, 0x1680},   {0x2000, 0x200D},   {0x2028, 0x2029},   {0x202F, 0x202F},
        {0x205F, 0x205F},   {0x2070, 0x2079},   {0x2160, 0x216F},   {0x212A, 0x212B},
        {0x3000, 0x3002},   {0x3041, 0x30FA},   {0x4E00, 0x4E80},   {0xAC00, 0xAC40},
        {0xFF01, 0xFF5E},   {0x1F300, 0x1F64F}, {0x1F3FB, 0x1F3FF}, {0xFE0F, 0xFE0F},
        {0x10400, 0x1044F}, {0x1D7CE, 0x1D7FF}, {0x85, 0x85},       {0x17F, 0x17F},
        {0x130, 0x131},     {'\'', '\''},       {'\'', '\''},       {'\'', '\''},
    };
    static const char *const contr[] = {"'s", "'t",  "'re", "'ve", "'m",  "'ll", "'d",       "'S",
                                        "'T", "'RE", "'Ve", "'M",  "'lL", "'D",  "'\xc5\xbf"};
    size_t o = 0;
    int n = 1 + (int)rnd(40);
    for (int i = 0; i < n; i++) {
        uint32_t r = rnd(100);
        if (r < 6) {
            const char *c = contr[rnd(sizeof(contr) / sizeof(contr[0]))];
            memcpy(out + o, c, strlen(c));
            o += strlen(c);
        } else if (r < 8) {
            out[o++] = (char)(0x80 + rnd(0x80)); /* a stray byte: invalid UTF-8 */
        } else if (r < 12) {
            static const char *const nl[] = {"\r\n", "\n\n", " \n", "\n ", "  \r\n  "};
            const char *c = nl[rnd(5)];
            memcpy(out + o, c, strlen(c));
            o += strlen(c);
        } else {
            const uint32_t *p = pools[rnd(sizeof(pools) / sizeof(pools[0]))];
            o += kvr_utf8_put(p[0] + rnd(p[1] - p[0] + 1), out + o);
        }
    }
    return o;
}

static void test_equivalence(const char *corpus_path)
{
    static const struct {
        enum kvr_pretok kind;
        const char *pattern;
    } pats[] = {{KVR_PRETOK_GPT2, kvr_pretok_regex_gpt2},
                {KVR_PRETOK_LLAMA3, kvr_pretok_regex_llama3},
                {KVR_PRETOK_QWEN2, kvr_pretok_regex_qwen2}};
    kvr_json_doc_t *doc = NULL;
    char err[512];
    KVR_CHECK_STATUS(kvr_json_parse_file(corpus_path, &doc, err, sizeof(err)), KVR_OK);
    const kvr_json_t *corpus = kvr_json_root(doc);
    KVR_CHECK(corpus->type == KVR_JSON_ARRAY && corpus->n > 0);
    for (size_t k = 0; k < 3; k++) {
        kvr_pretok_regex_t *re = NULL;
        KVR_CHECK_STATUS(
            kvr_pretok_regex_new(pats[k].pattern, strlen(pats[k].pattern), &re, err, sizeof(err)),
            KVR_OK);
        for (size_t i = 0; i < corpus->n; i++)
            compare(pats[k].kind, re, corpus->items[i]->str, corpus->items[i]->len);
        char buf[512];
        for (int i = 0; i < 30000; i++) {
            size_t n = gen(buf);
            compare(pats[k].kind, re, buf, n);
        }
        kvr_pretok_regex_free(re);
    }
    kvr_json_free(doc);
    printf("pretok: hand-written == Oniguruma on %zu strings (3 patterns)\n", n_strings);
}

static bool stable(enum kvr_uni_form form, const utf8proc_uint8_t *s, size_t n)
{
    static const utf8proc_option_t opts[] = {
        [KVR_UNI_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [KVR_UNI_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [KVR_UNI_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [KVR_UNI_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    utf8proc_uint8_t *o = NULL;
    utf8proc_ssize_t ol = utf8proc_map(s, (utf8proc_ssize_t)n, &o, opts[form]);
    bool same = ol == (utf8proc_ssize_t)n && !memcmp(o, s, n);
    free(o);
    return same;
}

static void test_quick_check(void)
{
    for (int form = 0; form < 4; form++) {
        /* the passed code points, and a sample of them to pair with */
        uint32_t sample[256];
        size_t ns = 0, passed = 0;
        for (uint32_t cp = 0; cp < 0x110000; cp++) {
            if (cp >= 0xD800 && cp <= 0xDFFF)
                continue;
            char b[4];
            size_t l = kvr_utf8_put(cp, b);
            if (kvr_uni_may_change((enum kvr_uni_form)form, b, l))
                continue;
            passed++;
            if (!stable((enum kvr_uni_form)form, (const utf8proc_uint8_t *)b, l)) {
                fprintf(stderr, "form %d: U+%04X passes the quick check but changes\n", form,
                        (unsigned)cp);
                exit(1);
            }
            if (ns < 256 && rnd(2000) == 0)
                sample[ns++] = cp;
        }
        KVR_CHECK(ns > 100);
        for (uint32_t cp = 0; cp < 0x110000; cp += 1 + rnd(7)) {
            if (cp >= 0xD800 && cp <= 0xDFFF)
                continue;
            char b[8];
            size_t l = kvr_utf8_put(sample[rnd((uint32_t)ns)], b);
            l += kvr_utf8_put(cp, b + l);
            if (kvr_uni_may_change((enum kvr_uni_form)form, b, l))
                continue;
            if (!stable((enum kvr_uni_form)form, (const utf8proc_uint8_t *)b, l)) {
                fprintf(stderr, "form %d: a pair ending in U+%04X passes but changes\n", form,
                        (unsigned)cp);
                exit(1);
            }
        }
        /* every canonical decomposition, as text: the composing forms turn it
         * back into the composite, so the quick check must not pass it */
        for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
            if (cp >= 0xD800 && cp <= 0xDFFF)
                continue;
            utf8proc_int32_t d[32];
            int bound = 0;
            utf8proc_ssize_t n =
                utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, UTF8PROC_DECOMPOSE, &bound);
            if (n < 2 || n > 32)
                continue;
            char b[32 * 4];
            size_t l = 0;
            for (utf8proc_ssize_t k = 0; k < n; k++)
                l += kvr_utf8_put((uint32_t)d[k], b + l);
            if (!kvr_uni_may_change((enum kvr_uni_form)form, b, l) &&
                !stable((enum kvr_uni_form)form, (const utf8proc_uint8_t *)b, l)) {
                fprintf(stderr, "form %d: the decomposition of U+%04X passes but changes\n", form,
                        (unsigned)cp);
                exit(1);
            }
        }
        printf("quick check form %d: %zu code points pass, all stable\n", form, passed);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_pretok CORPUS.json\n");
        return 2;
    }
    test_equivalence(argv[1]);
    test_quick_check();
    printf("pretok: ok\n");
    return 0;
}
