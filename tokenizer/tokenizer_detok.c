/*
 * tokenizer_detok.c - decoding and streaming detokenization.
 *
 * Every id goes through one streaming machine (struct kvr_detok): vocabulary
 * pieces contribute bytes to a lossy UTF-8 decoder that emits a character
 * only once it is complete (invalid bytes become U+FFFD by the
 * maximal-subpart rule, as TextDecoder and from_utf8_lossy do); an added
 * token, and a sentencepiece text piece after <0xXX> byte tokens, first
 * flush it, as the Hugging Face decoders decode such runs separately.
 * decode() is "feed all, flush", so the streamed pieces concatenated equal
 * decode() by construction.  The sentencepiece Strip decoder cuts leading
 * spaces at the start of the stream only.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "tokenizer_unicode.h"

/* ---- decoding ---- */

struct kvr_detok {
    const kvr_tokenizer_t *t;
    bool skip_special;
    bool at_start;  /* nothing but stripped spaces emitted yet */
    int strip_left; /* leading spaces the sentencepiece Strip decoder still cuts */
    unsigned char pend[4];
    size_t npend;
    struct buf out;
};

static bool emit(kvr_detok_t *d, const char *s, size_t n)
{
    if (n && d->at_start) {
        /* Strip cuts up to `start` leading spaces of the whole text */
        while (d->strip_left > 0 && n && s[0] == ' ') {
            s++;
            n--;
            d->strip_left--;
        }
        if (!n)
            return true;
        d->at_start = false;
    }
    return kvr_tok_buf_put(&d->out, s, n);
}

static const char REPL[] = "\xef\xbf\xbd";

/* Feeds bytes to the lossy UTF-8 decoder. */
static bool utf8_feed(kvr_detok_t *d, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        d->pend[d->npend++] = (unsigned char)s[i];
        while (d->npend) {
            uint32_t cp;
            int state;
            size_t l = kvr_utf8_scan(d->pend, d->npend, &cp, &state);
            if (state == KVR_UTF8_TRUNCATED)
                break;
            if (!(state == KVR_UTF8_OK ? emit(d, (const char *)d->pend, l) : emit(d, REPL, 3)))
                return false;
            memmove(d->pend, d->pend + l, d->npend - l);
            d->npend -= l;
        }
    }
    return true;
}

static bool utf8_flush(kvr_detok_t *d)
{
    if (!d->npend)
        return true;
    d->npend = 0;
    return emit(d, REPL, 3);
}

kvr_status_t kvr_detok_create(const kvr_tokenizer_t *t, bool skip_special, kvr_detok_t **d_p)
{
    if (!t || !d_p)
        return KVR_ERR_INVALID;
    kvr_detok_t *d = calloc(1, sizeof(*d));
    if (!d)
        return KVR_ERR_NO_MEMORY;
    d->t = t;
    d->skip_special = skip_special;
    d->at_start = true;
    d->strip_left = t->sp_strip;
    *d_p = d;
    return KVR_OK;
}

void kvr_detok_destroy(kvr_detok_t *d)
{
    if (!d)
        return;
    free(d->out.p);
    free(d);
}

static kvr_status_t detok_push(kvr_detok_t *d, int32_t id)
{
    const kvr_tokenizer_t *t = d->t;
    if (id < 0 || id >= t->n_ids || !t->piece[id])
        return KVR_ERR_OUT_OF_RANGE;
    int32_t ax = t->added_ix[id];
    if (ax >= 0) {
        const struct added *a = &t->added[ax];
        if (d->skip_special && a->special)
            return KVR_OK;
        if (t->kind == KIND_BYTELEVEL) {
            /* the ByteLevel decoder passes added tokens through verbatim */
            if (!utf8_flush(d) || !emit(d, a->content, a->len))
                return KVR_ERR_NO_MEMORY;
            return KVR_OK;
        }
    }
    if (t->kind == KIND_SP && t->byte_tok[id] >= 0) {
        char c = (char)t->byte_tok[id];
        return utf8_feed(d, &c, 1) ? KVR_OK : KVR_ERR_NO_MEMORY;
    }
    if (t->kind == KIND_SP && !utf8_flush(d))
        return KVR_ERR_NO_MEMORY;
    if (t->dec[id])
        return utf8_feed(d, t->dec[id], t->dec_len[id]) ? KVR_OK : KVR_ERR_NO_MEMORY;
    /* an added token that is not in the vocabulary (sentencepiece) */
    struct buf r = {0};
    const char *p = t->piece[id];
    size_t pl = t->piece_len[id];
    for (size_t j = 0; j < pl;) {
        bool hit = pl - j >= 3 && !memcmp(p + j, "\xe2\x96\x81", 3);
        if (!(hit ? kvr_tok_buf_put(&r, " ", 1) : kvr_tok_buf_put(&r, p + j, 1))) {
            free(r.p);
            return KVR_ERR_NO_MEMORY;
        }
        j += hit ? 3 : 1;
    }
    bool ok = utf8_feed(d, r.p, r.n);
    free(r.p);
    return ok ? KVR_OK : KVR_ERR_NO_MEMORY;
}

kvr_status_t kvr_detok_feed(kvr_detok_t *d, int32_t id, const char **text_p, size_t *len_p)
{
    if (!d || !text_p || !len_p)
        return KVR_ERR_INVALID;
    d->out.n = 0;
    kvr_status_t st = detok_push(d, id);
    *text_p = d->out.p ? d->out.p : "";
    *len_p = st == KVR_OK ? d->out.n : 0;
    return st;
}

kvr_status_t kvr_detok_flush(kvr_detok_t *d, const char **text_p, size_t *len_p)
{
    if (!d || !text_p || !len_p)
        return KVR_ERR_INVALID;
    d->out.n = 0;
    if (!utf8_flush(d))
        return KVR_ERR_NO_MEMORY;
    *text_p = d->out.p ? d->out.p : "";
    *len_p = d->out.n;
    d->at_start = true;
    d->strip_left = d->t->sp_strip;
    return KVR_OK;
}

kvr_status_t kvr_tokenizer_decode(const kvr_tokenizer_t *t, const int32_t *ids, size_t n,
                                  bool skip_special, char **text_p, size_t *len_p)
{
    if (!t || (!ids && n) || !text_p)
        return KVR_ERR_INVALID;
    kvr_detok_t d = {
        .t = t, .skip_special = skip_special, .at_start = true, .strip_left = t->sp_strip};
    kvr_status_t st = KVR_OK;
    for (size_t i = 0; i < n && st == KVR_OK; i++)
        st = detok_push(&d, ids[i]);
    if (st == KVR_OK && !utf8_flush(&d))
        st = KVR_ERR_NO_MEMORY;
    if (st == KVR_OK && !d.out.p && !kvr_tok_buf_put(&d.out, "", 0))
        st = KVR_ERR_NO_MEMORY;
    if (st != KVR_OK) {
        free(d.out.p);
        return st;
    }
    *text_p = d.out.p;
    if (len_p)
        *len_p = d.out.n;
    return KVR_OK;
}
