/*
 * tokenizer_text.c - the text primitives of the tokenizer: UTF-8 stepping
 * with Unicode's "maximal subpart" rule for invalid bytes, the \p{L} / \p{N}
 * / \s tests behind the hand-written pre-tokenizer matchers, and
 * normalization, on libutf8proc.
 *
 * Categories: a byte per BMP code point (letter / number / other), filled
 * once from utf8proc_category, so the matchers' per-character test is one
 * load; above the BMP utf8proc is asked directly.
 *
 * Normalization: utf8proc_map does the work.  Most text needs none, so each
 * form has a quick-check bitmap over all code points, built once from
 * utf8proc: a code point "may change" when it has a non-zero combining
 * class, when the form maps it to something else, or (composing forms) when
 * it ends another code point's canonical decomposition (so it may compose
 * with what precedes it).  Valid text then takes one utf8proc_map call.
 * Text with none of those is copied as it is; ASCII is never looked up.
 * Invalid UTF-8 bytes are kept and split the text into runs that utf8proc
 * normalizes one by one (it refuses invalid input).
 */
#include "tokenizer_unicode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum { CLS_L = 1, CLS_N = 2 };

static uint8_t bmp_cls[0x10000];
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static uint8_t cls_of_cat(utf8proc_category_t c)
{
    switch (c) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
        return CLS_L;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
        return CLS_N;
    default:
        return 0;
    }
}

static void bmp_build(void)
{
    for (uint32_t cp = 0; cp < 0x10000; cp++)
        bmp_cls[cp] = cls_of_cat(utf8proc_category((utf8proc_int32_t)cp));
}

static inline uint8_t cls(uint32_t cp)
{
    if (cp < 0x10000) {
        pthread_once(&bmp_once, bmp_build);
        return bmp_cls[cp];
    }
    return cp <= 0x10FFFF ? cls_of_cat(utf8proc_category((utf8proc_int32_t)cp)) : 0;
}

bool kvr_uni_is_letter(uint32_t cp)
{
    if (cp < 0x80)
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return cls(cp) == CLS_L;
}

bool kvr_uni_is_number(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    return cls(cp) == CLS_N;
}

const char *kvr_uni_version(void)
{
    return utf8proc_unicode_version();
}

bool kvr_uni_is_space(uint32_t cp)
{
    if (cp < 0x80)
        return cp == ' ' || (cp >= 9 && cp <= 13);
    switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

/* Length of the sequence a lead byte announces and the valid range of its
 * second byte; 0 when b cannot start a sequence. */
static int lead_info(unsigned char b, unsigned char *lo_p, unsigned char *hi_p)
{
    *lo_p = 0x80;
    *hi_p = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0)
            *lo_p = 0xA0;
        if (b == 0xED)
            *hi_p = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0)
            *lo_p = 0x90;
        if (b == 0xF4)
            *hi_p = 0x8F;
        return 4;
    }
    return 0;
}

size_t kvr_utf8_scan(const unsigned char *s, size_t n, uint32_t *cp_p, int *state_p)
{
    unsigned char lo, hi;
    int need = lead_info(s[0], &lo, &hi);
    if (need == 1) {
        *cp_p = s[0];
        *state_p = KVR_UTF8_OK;
        return 1;
    }
    if (need == 0) {
        *cp_p = 0xFFFD;
        *state_p = KVR_UTF8_INVALID;
        return 1;
    }
    uint32_t cp = s[0] & (0xFF >> (need + 1));
    size_t i = 1;
    for (; i < (size_t)need; i++) {
        if (i >= n) {
            *cp_p = 0xFFFD;
            *state_p = KVR_UTF8_TRUNCATED;
            return i;
        }
        unsigned char c = s[i];
        if (c < (i == 1 ? lo : 0x80) || c > (i == 1 ? hi : 0xBF)) {
            *cp_p = 0xFFFD;
            *state_p = KVR_UTF8_INVALID;
            return i; /* the maximal subpart s[0..i) */
        }
        cp = (cp << 6) | (c & 0x3F);
    }
    *cp_p = cp;
    *state_p = KVR_UTF8_OK;
    return i;
}

size_t kvr_utf8_next(const unsigned char *s, size_t n, uint32_t *cp_p)
{
    int st;
    size_t len = kvr_utf8_scan(s, n, cp_p, &st);
    if (st != KVR_UTF8_OK) {
        *cp_p = 0xFFFD | 0x80000000u;
        return 1;
    }
    return len;
}

size_t kvr_utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- normalization ---- */

#define N_CP 0x110000

struct form {
    utf8proc_option_t opts;
    pthread_once_t once;
    uint64_t maybe[N_CP / 64]; /* code points that may change */
};

static void build_nfc(void);
static void build_nfd(void);
static void build_nfkc(void);
static void build_nfkd(void);

static struct form forms[4] = {
    [KVR_UNI_NFC] = {UTF8PROC_STABLE | UTF8PROC_COMPOSE, PTHREAD_ONCE_INIT, {0}},
    [KVR_UNI_NFD] = {UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, PTHREAD_ONCE_INIT, {0}},
    [KVR_UNI_NFKC] = {UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, PTHREAD_ONCE_INIT, {0}},
    [KVR_UNI_NFKD] = {UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
                      PTHREAD_ONCE_INIT,
                      {0}},
};
static void (*const builders[4])(void) = {build_nfc, build_nfd, build_nfkc, build_nfkd};

static inline void mark(struct form *f, uint32_t cp)
{
    f->maybe[cp / 64] |= 1ull << (cp % 64);
}

static void build(struct form *f)
{
    bool composes = f->opts & UTF8PROC_COMPOSE;
    utf8proc_option_t dec = (f->opts & UTF8PROC_COMPAT) | UTF8PROC_DECOMPOSE;
    for (uint32_t cp = 0x80; cp < N_CP; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->category == UTF8PROC_CATEGORY_CN)
            continue; /* unassigned: every form leaves it */
        if (p->combining_class) {
            mark(f, cp);
            continue;
        }
        utf8proc_int32_t d[32];
        int bound = 0;
        utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, dec, &bound);
        if (composes) {
            /* the last piece of a canonical decomposition may compose with
             * what precedes it in other text (compatibility ones never
             * recompose, and singletons form no pair) */
            int cb = 0;
            utf8proc_ssize_t cn =
                utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, UTF8PROC_DECOMPOSE, &cb);
            if (cn >= 2 && cn <= 32)
                mark(f, (uint32_t)d[cn - 1]);
            n = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, dec, &bound);
        }
        if (n == 1 && (uint32_t)d[0] == cp)
            continue;
        if (!composes) {
            mark(f, cp);
            continue;
        }
        utf8proc_uint8_t in[4], *out = NULL;
        utf8proc_ssize_t il = utf8proc_encode_char((utf8proc_int32_t)cp, in);
        utf8proc_ssize_t ol = utf8proc_map(in, il, &out, f->opts);
        if (ol != il || memcmp(out, in, (size_t)il))
            mark(f, cp);
        free(out);
    }
    /* Hangul: V and T jamo compose with what precedes them (utf8proc does
     * Hangul algorithmically, not through the decomposition table) */
    if (composes) {
        for (uint32_t cp = 0x1161; cp <= 0x1175; cp++)
            mark(f, cp);
        for (uint32_t cp = 0x11A8; cp <= 0x11C2; cp++)
            mark(f, cp);
    }
}

static void build_nfc(void)
{
    build(&forms[KVR_UNI_NFC]);
}
static void build_nfd(void)
{
    build(&forms[KVR_UNI_NFD]);
}
static void build_nfkc(void)
{
    build(&forms[KVR_UNI_NFKC]);
}
static void build_nfkd(void)
{
    build(&forms[KVR_UNI_NFKD]);
}

bool kvr_uni_may_change(enum kvr_uni_form form, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && u[i] < 0x80)
        i++;
    if (i == n)
        return false;
    struct form *f = &forms[form];
    pthread_once(&f->once, builders[form]);
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int st;
        i += kvr_utf8_scan(u + i, n - i, &cp, &st);
        if (st == KVR_UTF8_OK && (f->maybe[cp / 64] >> (cp % 64) & 1))
            return true;
    }
    return false;
}

/* utf8proc_map of one valid run, appended to *o */
static bool map_run(const struct form *f, const unsigned char *s, size_t n, char **o_p,
                    size_t *ol_p, size_t *cap_p)
{
    if (n == 0)
        return true;
    utf8proc_uint8_t *m = NULL;
    utf8proc_ssize_t ml = utf8proc_map(s, (utf8proc_ssize_t)n, &m, f->opts);
    if (ml < 0)
        return false; /* only out of memory: the run is valid UTF-8 */
    if (*ol_p + (size_t)ml + 1 > *cap_p) {
        size_t cap = (*ol_p + (size_t)ml + 1) * 2;
        char *p = realloc(*o_p, cap);
        if (!p) {
            free(m);
            return false;
        }
        *o_p = p;
        *cap_p = cap;
    }
    memcpy(*o_p + *ol_p, m, (size_t)ml);
    *ol_p += (size_t)ml;
    free(m);
    return true;
}

bool kvr_uni_normalize(enum kvr_uni_form form, const char *s, size_t n, char **out_p,
                       size_t *out_len_p)
{
    if (!kvr_uni_may_change(form, s, n)) {
        char *o = malloc(n + 1);
        if (!o)
            return false;
        memcpy(o, s, n);
        o[n] = 0;
        *out_p = o;
        *out_len_p = n;
        return true;
    }
    const struct form *f = &forms[form];
    const unsigned char *u = (const unsigned char *)s;
    utf8proc_uint8_t *whole = NULL;
    utf8proc_ssize_t wl = utf8proc_map(u, (utf8proc_ssize_t)n, &whole, f->opts);
    if (wl >= 0) { /* valid UTF-8: one call */
        *out_p = (char *)whole;
        *out_len_p = (size_t)wl;
        return true;
    }
    if (wl == UTF8PROC_ERROR_NOMEM)
        return false;
    size_t cap = n + 16, ol = 0, run = 0;
    char *o = malloc(cap);
    if (!o)
        return false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int st;
        size_t l = kvr_utf8_scan(u + i, n - i, &cp, &st);
        if (st == KVR_UTF8_OK) {
            i += l;
            continue;
        }
        /* an invalid byte: normalize the run before it, keep the byte */
        if (!map_run(f, u + run, i - run, &o, &ol, &cap))
            goto nomem;
        if (ol + 2 > cap) {
            char *p = realloc(o, cap * 2);
            if (!p)
                goto nomem;
            o = p;
            cap *= 2;
        }
        o[ol++] = (char)u[i];
        i++;
        run = i;
    }
    if (!map_run(f, u + run, n - run, &o, &ol, &cap))
        goto nomem;
    o[ol] = 0;
    *out_p = o;
    *out_len_p = ol;
    return true;
nomem:
    free(o);
    return false;
}
