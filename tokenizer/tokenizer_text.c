/*
 * tokenizer_text.c - the text primitives of the tokenizer: UTF-8 stepping
 * with Unicode's "maximal subpart" rule for invalid bytes, the \p{L} / \p{N}
 * / \s tests behind the pre-tokenizer matchers, and NFC normalization.
 *
 * The category tests take an ASCII fast path and otherwise binary-search the
 * generated range tables (tokenizer_unicode.c).  NFC is the textbook
 * algorithm: full canonical decomposition (Hangul algorithmic), canonical
 * ordering of combining marks, then canonical composition; text without any
 * code point >= U+0300 is already NFC and is copied as it is.
 */
#include "tokenizer_unicode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

bool kvr_uni_is_letter(uint32_t cp)
{
    if (cp < 0x80)
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(kvr_uni_letter, kvr_uni_letter_n, cp);
}

bool kvr_uni_is_number(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    return in_ranges(kvr_uni_number, kvr_uni_number_n, cp);
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

/* ---- NFC ---- */

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28,
    NCOUNT = VCOUNT * TCOUNT,
    SCOUNT = LCOUNT * NCOUNT,
};

#define RAW_BYTE 0x80000000u /* an invalid input byte carried through as is */

static int ccc_of(uint32_t cp)
{
    if (cp < 0x300 || (cp & RAW_BYTE))
        return 0;
    size_t lo = 0, hi = kvr_uni_ccc_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < kvr_uni_ccc[mid][0])
            hi = mid;
        else if (cp > kvr_uni_ccc[mid][1])
            lo = mid + 1;
        else
            return (int)kvr_uni_ccc[mid][2];
    }
    return 0;
}

/* Appends the full canonical decomposition of cp to out; returns the count. */
static size_t decompose(uint32_t cp, uint32_t *out)
{
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t si = cp - SBASE;
        out[0] = LBASE + si / NCOUNT;
        out[1] = VBASE + (si % NCOUNT) / TCOUNT;
        if (si % TCOUNT) {
            out[2] = TBASE + si % TCOUNT;
            return 3;
        }
        return 2;
    }
    if (cp >= 0xC0 && !(cp & RAW_BYTE)) {
        size_t lo = 0, hi = kvr_uni_decomp_cp_n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (cp < kvr_uni_decomp_cp[mid])
                hi = mid;
            else if (cp > kvr_uni_decomp_cp[mid])
                lo = mid + 1;
            else {
                uint32_t at = kvr_uni_decomp_at[mid];
                size_t len = at & 0xFF;
                memcpy(out, &kvr_uni_decomp_pool[at >> 8], len * sizeof(uint32_t));
                return len;
            }
        }
    }
    out[0] = cp;
    return 1;
}

static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = kvr_uni_comp_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const uint32_t *e = kvr_uni_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1]))
            hi = mid;
        else if (a > e[0] || b > e[1])
            lo = mid + 1;
        else
            return e[2];
    }
    return 0;
}

/* ---- NFC quick check ----
 * A code point "may change" NFC when it has a non-zero combining class, a
 * canonical decomposition that does not recompose to itself, or can be the
 * second half of a composition.  Text without any such code point is
 * already NFC.  Bitmap for the BMP, built once; binary searches above it. */

static uint64_t nfc_maybe_bmp[0x10000 / 64];
static uint32_t *nfc_seconds; /* sorted second halves of compositions */
static size_t nfc_n_seconds;

static bool nfc_slow(const unsigned char *u, size_t n, char **out_p, size_t *out_len_p);

static void mark(uint32_t cp)
{
    if (cp < 0x10000)
        nfc_maybe_bmp[cp / 64] |= 1ull << (cp % 64);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void nfc_quick_build(void)
{
    for (size_t i = 0; i < kvr_uni_ccc_n; i++)
        for (uint32_t cp = kvr_uni_ccc[i][0]; cp <= kvr_uni_ccc[i][1] && cp < 0x10000; cp++)
            mark(cp);
    for (size_t i = 0; i < kvr_uni_decomp_cp_n; i++) {
        uint32_t cp = kvr_uni_decomp_cp[i];
        if (cp >= 0x10000)
            continue;
        char in[4], *o = NULL;
        size_t il = kvr_utf8_put(cp, in), ol = 0;
        if (!nfc_slow((const unsigned char *)in, il, &o, &ol) || ol != il || memcmp(o, in, il))
            mark(cp);
        free(o);
    }
    for (uint32_t cp = 0x1161; cp <= 0x1175; cp++) /* Hangul V and T jamo */
        mark(cp);
    for (uint32_t cp = 0x11A8; cp <= 0x11C2; cp++)
        mark(cp);
    nfc_seconds = malloc(kvr_uni_comp_n * sizeof(uint32_t));
    if (!nfc_seconds)
        return; /* then every non-ASCII-ish text takes the slow path */
    for (size_t i = 0; i < kvr_uni_comp_n; i++) {
        mark(kvr_uni_comp[i][1]);
        nfc_seconds[i] = kvr_uni_comp[i][1];
    }
    qsort(nfc_seconds, kvr_uni_comp_n, sizeof(uint32_t), cmp_u32);
    nfc_n_seconds = kvr_uni_comp_n;
}

static bool in_sorted(const uint32_t *a, size_t n, uint32_t v)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else if (a[mid] > v)
            hi = mid;
        else
            return true;
    }
    return false;
}

static bool nfc_may_change(uint32_t cp)
{
    if (cp < 0x10000)
        return nfc_maybe_bmp[cp / 64] >> (cp % 64) & 1;
    return !nfc_seconds || ccc_of(cp) != 0 ||
           in_sorted(kvr_uni_decomp_cp, kvr_uni_decomp_cp_n, cp) ||
           in_sorted(nfc_seconds, nfc_n_seconds, cp);
}

bool kvr_uni_nfc(const char *s, size_t n, char **out_p, size_t *out_len_p)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    const unsigned char *u = (const unsigned char *)s;
    bool simple = true;
    for (size_t i = 0; i < n; i++) {
        /* U+0300 is CC 80; lead bytes >= 0xCC start code points >= U+0300 */
        if (u[i] >= 0xCC) {
            simple = false;
            break;
        }
    }
    if (!simple) {
        pthread_once(&once, nfc_quick_build);
        simple = true;
        for (size_t i = 0; i < n && simple;) {
            uint32_t cp;
            int st;
            i += kvr_utf8_scan(u + i, n - i, &cp, &st);
            if (st == KVR_UTF8_OK && cp >= 0x300 && nfc_may_change(cp))
                simple = false;
        }
    }
    if (simple) {
        char *o = malloc(n + 1);
        if (!o)
            return false;
        memcpy(o, s, n);
        o[n] = 0;
        *out_p = o;
        *out_len_p = n;
        return true;
    }
    return nfc_slow(u, n, out_p, out_len_p);
}

static bool nfc_slow(const unsigned char *u, size_t n, char **out_p, size_t *out_len_p)
{
    /* every code point decomposes into at most 18 (Unicode's bound) */
    uint32_t *cps = malloc((n * 4 + 18) * sizeof(uint32_t));
    if (!cps)
        return false;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int st;
        size_t len = kvr_utf8_scan(u + i, n - i, &cp, &st);
        if (st != KVR_UTF8_OK) {
            cps[m++] = RAW_BYTE | u[i];
            i++;
            continue;
        }
        i += len;
        m += decompose(cp, cps + m);
    }
    /* canonical ordering: stable insertion sort of each run of marks */
    for (size_t i = 1; i < m; i++) {
        int c = ccc_of(cps[i]);
        if (c == 0)
            continue;
        size_t j = i;
        uint32_t v = cps[i];
        while (j > 0 && ccc_of(cps[j - 1]) > c) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = v;
    }
    /* composition, in place */
    size_t w = 0;
    long starter = -1;
    int last_ccc = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = cps[i];
        int cc = ccc_of(c);
        if (starter >= 0 && !(c & RAW_BYTE)) {
            bool adjacent = (size_t)starter == w - 1;
            if (adjacent || (last_ccc != 0 && last_ccc < cc)) {
                uint32_t k = compose(cps[starter], c);
                if (k) {
                    cps[starter] = k;
                    continue;
                }
            }
        }
        if (cc == 0) {
            starter = (c & RAW_BYTE) ? -1 : (long)w;
            last_ccc = 0;
        } else {
            last_ccc = cc;
        }
        cps[w++] = c;
    }
    char *o = malloc(w * 4 + 1);
    if (!o) {
        free(cps);
        return false;
    }
    size_t ol = 0;
    for (size_t i = 0; i < w; i++) {
        if (cps[i] & RAW_BYTE)
            o[ol++] = (char)(cps[i] & 0xFF);
        else
            ol += kvr_utf8_put(cps[i], o + ol);
    }
    o[ol] = 0;
    free(cps);
    *out_p = o;
    *out_len_p = ol;
    return true;
}
