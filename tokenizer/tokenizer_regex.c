/*
 * tokenizer_regex.c - pre-tokenizer Split / ByteLevel regexes run by
 * Oniguruma, the regex engine Hugging Face's tokenizers uses itself (Ruby
 * syntax, UTF-8), so any pattern a tokenizer.json names splits the same way.
 *
 * Splitting is the "Isolated" behaviour: every non-empty match is a piece,
 * and so is every non-empty stretch of text between matches; empty matches
 * make no piece (the search then moves on by one character).  Oniguruma needs
 * valid UTF-8: text holding invalid bytes is searched in a copy where each
 * invalid byte reads as U+FFFD (a symbol, which is how the hand-written
 * matchers classify it too), and the pieces are mapped back to the original
 * bytes.  A compiled regex is read-only; each split has its own match region,
 * so one regex serves many threads.
 */
#include <oniguruma.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_pretok.h"
#include "tokenizer_unicode.h"

struct kvr_pretok_regex {
    OnigRegex re;
};

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t onig_lock = PTHREAD_MUTEX_INITIALIZER;

static void onig_setup(void)
{
    OnigEncoding enc[] = {ONIG_ENCODING_UTF8};
    onig_initialize(enc, 1);
}

kvr_status_t kvr_pretok_regex_new(const char *pattern, size_t len, kvr_pretok_regex_t **re_p,
                                  char *err, size_t err_len)
{
    pthread_once(&onig_once, onig_setup);
    kvr_pretok_regex_t *r = calloc(1, sizeof(*r));
    if (!r)
        return KVR_ERR_NO_MEMORY;
    OnigErrorInfo einfo;
    pthread_mutex_lock(&onig_lock); /* onig_new shares tables while compiling */
    int rc = onig_new(&r->re, (const OnigUChar *)pattern, (const OnigUChar *)pattern + len,
                      ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_RUBY, &einfo);
    pthread_mutex_unlock(&onig_lock);
    if (rc != ONIG_NORMAL) {
        OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, rc, &einfo);
        if (err && err_len)
            snprintf(err, err_len, "%s", (const char *)msg);
        free(r);
        return rc == ONIGERR_MEMORY ? KVR_ERR_NO_MEMORY : KVR_ERR_INVALID;
    }
    *re_p = r;
    return KVR_OK;
}

void kvr_pretok_regex_free(kvr_pretok_regex_t *r)
{
    if (!r)
        return;
    onig_free(r->re);
    free(r);
}

/* s[0..len) with every invalid byte replaced by U+FFFD; off[k] is the
 * original offset of byte k of the copy (len + 1 entries for the end). */
static bool make_valid(const char *s, size_t len, char **v_p, size_t *vlen_p, uint32_t **off_p)
{
    char *v = malloc(len * 3 + 1);
    uint32_t *off = malloc((len * 3 + 1) * sizeof(uint32_t));
    if (!v || !off) {
        free(v);
        free(off);
        return false;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t l = kvr_utf8_next(u + i, len - i, &cp);
        if (cp & 0x80000000u) {
            memcpy(v + o, "\xef\xbf\xbd", 3);
            for (int k = 0; k < 3; k++)
                off[o + k] = (uint32_t)i;
            o += 3;
        } else {
            memcpy(v + o, s + i, l);
            for (size_t k = 0; k < l; k++)
                off[o + k] = (uint32_t)i;
            o += l;
        }
        i += l;
    }
    off[o] = (uint32_t)len;
    *v_p = v;
    *vlen_p = o;
    *off_p = off;
    return true;
}

static bool valid_utf8(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t l = kvr_utf8_next(u + i, len - i, &cp);
        if (cp & 0x80000000u)
            return false;
        i += l;
    }
    return true;
}

kvr_status_t kvr_pretok_regex_split(const kvr_pretok_regex_t *r, const char *s, size_t len,
                                    kvr_pretok_piece_fn fn, void *ctx)
{
    if (len == 0)
        return KVR_OK;
    char *v = NULL;
    uint32_t *off = NULL;
    const char *t = s;
    size_t tlen = len;
    if (!valid_utf8(s, len)) {
        if (!make_valid(s, len, &v, &tlen, &off))
            return KVR_ERR_NO_MEMORY;
        t = v;
    }
    OnigRegion *reg = onig_region_new();
    if (!reg) {
        free(v);
        free(off);
        return KVR_ERR_NO_MEMORY;
    }
    const OnigUChar *str = (const OnigUChar *)t, *end = str + tlen;
    kvr_status_t st = KVR_OK;
    size_t pos = 0, prev = 0; /* search start; end of the last piece */
#define ORIG(k) (off ? off[k] : (uint32_t)(k))
#define EMIT(a, b)                                                                                 \
    do {                                                                                           \
        if ((b) > (a)) {                                                                           \
            st = fn(ctx, s + ORIG(a), ORIG(b) - ORIG(a));                                          \
            if (st != KVR_OK)                                                                      \
                goto out;                                                                          \
        }                                                                                          \
    } while (0)
    while (pos < tlen) {
        int rc = onig_search(r->re, str, end, str + pos, end, reg, ONIG_OPTION_NONE);
        if (rc == ONIG_MISMATCH)
            break;
        if (rc < 0) {
            st = rc == ONIGERR_MEMORY ? KVR_ERR_NO_MEMORY : KVR_ERR_INTERNAL;
            goto out;
        }
        size_t ms = (size_t)reg->beg[0], me = (size_t)reg->end[0];
        if (me == ms) { /* empty: no piece; step over one character */
            uint32_t cp;
            pos = ms + kvr_utf8_next(str + ms, tlen - ms, &cp);
            continue;
        }
        EMIT(prev, ms);
        EMIT(ms, me);
        prev = pos = me;
    }
    EMIT(prev, tlen);
#undef EMIT
#undef ORIG
out:
    onig_region_free(reg, 1);
    free(v);
    free(off);
    return st;
}

struct repl_ctx {
    char *o;
    size_t n, cap;
};

static bool repl_put(struct repl_ctx *r, const char *s, size_t n)
{
    if (r->n + n + 1 > r->cap) {
        size_t cap = (r->n + n + 1) * 2;
        char *p = realloc(r->o, cap);
        if (!p)
            return false;
        r->o = p;
        r->cap = cap;
    }
    memcpy(r->o + r->n, s, n);
    r->n += n;
    r->o[r->n] = 0;
    return true;
}

kvr_status_t kvr_pretok_regex_replace(const kvr_pretok_regex_t *r, const char *s, size_t len,
                                      const char *repl, size_t repl_len, char **out_p,
                                      size_t *out_len_p)
{
    /* the text must be valid UTF-8 here: normalizers run on text that the
     * JSON parser or the caller gave; invalid bytes are kept, unmatched */
    struct repl_ctx rc = {0};
    kvr_status_t st = KVR_OK;
    OnigRegion *reg = onig_region_new();
    if (!reg || !repl_put(&rc, "", 0)) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    const OnigUChar *str = (const OnigUChar *)s, *end = str + len;
    size_t pos = 0, prev = 0;
    bool valid = valid_utf8(s, len);
    while (valid && pos < len) {
        int rc2 = onig_search(r->re, str, end, str + pos, end, reg, ONIG_OPTION_NONE);
        if (rc2 == ONIG_MISMATCH)
            break;
        if (rc2 < 0) {
            st = rc2 == ONIGERR_MEMORY ? KVR_ERR_NO_MEMORY : KVR_ERR_INTERNAL;
            goto out;
        }
        size_t ms = (size_t)reg->beg[0], me = (size_t)reg->end[0];
        if (me == ms) {
            uint32_t cp;
            pos = ms + kvr_utf8_next(str + ms, len - ms, &cp);
            continue;
        }
        if (!repl_put(&rc, s + prev, ms - prev) || !repl_put(&rc, repl, repl_len)) {
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
        prev = pos = me;
    }
    if (!repl_put(&rc, s + prev, len - prev))
        st = KVR_ERR_NO_MEMORY;
out:
    if (reg)
        onig_region_free(reg, 1);
    if (st != KVR_OK) {
        free(rc.o);
        return st;
    }
    *out_p = rc.o;
    *out_len_p = rc.n;
    return KVR_OK;
}
