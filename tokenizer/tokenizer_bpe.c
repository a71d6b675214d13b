/*
 * tokenizer_bpe.c - encoding: the text is split on added tokens
 * (leftmost-longest; lstrip/rstrip trim the neighbouring text), each other
 * section normalized (NFC, Prepend, Replace as listed), pre-tokenized
 * (byte-level: the Split regex matchers of tokenizer_pretok.c; sentencepiece:
 * Metaspace or nothing), and each word merged by BPE.
 *
 * BPE: symbols start as single bytes (byte-level: the vocabulary is keyed by
 * the raw bytes its ByteLevel pieces stand for) or single characters
 * (sentencepiece: a character outside the vocabulary falls back to its
 * <0xXX> byte tokens, or <unk>); a min-heap of (rank, position) over the
 * adjacent pairs with lazy invalidation merges the lowest rank first,
 * leftmost on ties, as Hugging Face does - O(n log n) a word.  Short words
 * go through a per-thread cache first.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "tokenizer_unicode.h"

/* ---- BPE ---- */

struct heap_ent {
    int32_t rank, pos, left, right;
};

struct bpe {
    const kvr_tokenizer_t *t;
    struct ids *out;
    /* scratch, grown as words need */
    int32_t *id, *prev, *next;
    uint32_t *start, *len; /* byte span of each symbol in the word (SP unknowns) */
    struct heap_ent *heap;
    size_t cap;
    size_t section; /* index of the current added-token section (Metaspace "first") */
};

static inline bool heap_less(const struct heap_ent *a, const struct heap_ent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
    struct heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static bool bpe_reserve(struct bpe *b, size_t n)
{
    if (n <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *id = realloc(b->id, cap * sizeof(int32_t));
    if (id)
        b->id = id;
    int32_t *pr = realloc(b->prev, cap * sizeof(int32_t));
    if (pr)
        b->prev = pr;
    int32_t *nx = realloc(b->next, cap * sizeof(int32_t));
    if (nx)
        b->next = nx;
    uint32_t *st = realloc(b->start, cap * sizeof(uint32_t));
    if (st)
        b->start = st;
    uint32_t *ln = realloc(b->len, cap * sizeof(uint32_t));
    if (ln)
        b->len = ln;
    struct heap_ent *hp = realloc(b->heap, cap * 3 * sizeof(struct heap_ent));
    if (hp)
        b->heap = hp;
    if (!id || !pr || !nx || !st || !ln || !hp)
        return false;
    b->cap = cap;
    return true;
}

static void bpe_try(struct bpe *b, size_t *hn, int32_t pos)
{
    int32_t nx = b->next[pos];
    if (nx < 0)
        return;
    int32_t rank, out;
    if (kvr_tok_pairmap_get(&b->t->merges, b->id[pos], b->id[nx], &rank, &out))
        heap_push(b->heap, hn, (struct heap_ent){rank, pos, b->id[pos], b->id[nx]});
}

/* Merges symbols 0..n-1 (id/start/len filled) and emits the result. */
static kvr_status_t bpe_merge_emit(struct bpe *b, const char *word, size_t n)
{
    const kvr_tokenizer_t *t = b->t;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        b->prev[i] = (int32_t)i - 1;
        b->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++)
        bpe_try(b, &hn, (int32_t)i);
    while (hn) {
        struct heap_ent e = heap_pop(b->heap, &hn);
        int32_t p = e.pos, nx = b->next[p];
        if (b->id[p] != e.left || nx < 0 || b->id[nx] != e.right)
            continue; /* stale */
        int32_t rank = 0, out = -1;
        kvr_tok_pairmap_get(&t->merges, e.left, e.right, &rank, &out);
        b->id[p] = out;
        b->len[p] += b->len[nx];
        b->id[nx] = -3; /* dead */
        b->next[p] = b->next[nx];
        if (b->next[nx] >= 0)
            b->prev[b->next[nx]] = p;
        if (b->prev[p] >= 0)
            bpe_try(b, &hn, b->prev[p]);
        bpe_try(b, &hn, p);
    }
    bool last_unk = false;
    for (int32_t i = 0; i >= 0; i = b->next[i]) {
        int32_t id = b->id[i];
        if (id >= 0) {
            last_unk = false;
            if (!kvr_tok_ids_put(b->out, id))
                return KVR_ERR_NO_MEMORY;
            continue;
        }
        /* a character outside the vocabulary */
        bool all = t->byte_fallback;
        for (uint32_t k = 0; all && k < b->len[i]; k++)
            all = t->byte_id[(unsigned char)word[b->start[i] + k]] >= 0;
        if (all) {
            last_unk = false;
            for (uint32_t k = 0; k < b->len[i]; k++)
                if (!kvr_tok_ids_put(b->out, t->byte_id[(unsigned char)word[b->start[i] + k]]))
                    return KVR_ERR_NO_MEMORY;
        } else if (t->unk_id >= 0) {
            if (!(t->fuse_unk && last_unk) && !kvr_tok_ids_put(b->out, t->unk_id))
                return KVR_ERR_NO_MEMORY;
            last_unk = true;
        }
    }
    return KVR_OK;
}

/* ---- word cache ----
 * Words repeat ("the", " of", "\n"): a per-thread direct-mapped cache of
 * short words -> their ids skips BPE for them.  Per thread, so a tokenizer
 * stays read-only and shareable; keyed by the tokenizer's uid, so a freed and
 * reloaded tokenizer at the same address never sees stale entries. */

enum { WC_SLOTS = 4096, WC_MAXLEN = 24, WC_MAXIDS = 6 };

struct wc_ent {
    uint64_t uid, hash;
    uint8_t len, n;
    char w[WC_MAXLEN];
    int32_t ids[WC_MAXIDS];
};

static _Thread_local struct wc_ent *tls_wc;
static pthread_key_t wc_key;
static pthread_once_t wc_once = PTHREAD_ONCE_INIT;
static bool wc_key_ok;

static void wc_make_key(void)
{
    wc_key_ok = pthread_key_create(&wc_key, free) == 0;
}

static struct wc_ent *wc_get(void)
{
    if (!tls_wc) {
        pthread_once(&wc_once, wc_make_key);
        if (!wc_key_ok)
            return NULL;
        tls_wc = calloc(WC_SLOTS, sizeof(struct wc_ent));
        if (tls_wc)
            pthread_setspecific(wc_key, tls_wc); /* freed at thread exit */
    }
    return tls_wc;
}

static inline uint64_t wc_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 32);
}

static kvr_status_t bpe_word_uncached(struct bpe *b, const char *w, size_t len);

static kvr_status_t bpe_word(void *ctx, const char *w, size_t len)
{
    struct bpe *b = ctx;
    if (len == 0)
        return KVR_OK;
    if (b->t->unigram)
        return kvr_tok_unigram_word(b->t, b->out, w, len);
    struct wc_ent *wc = len <= WC_MAXLEN ? wc_get() : NULL;
    if (!wc)
        return bpe_word_uncached(b, w, len);
    uint64_t h = wc_hash(w, len);
    struct wc_ent *e = &wc[h & (WC_SLOTS - 1)];
    if (e->uid == b->t->uid && e->hash == h && e->len == len && !memcmp(e->w, w, len)) {
        for (uint8_t i = 0; i < e->n; i++)
            if (!kvr_tok_ids_put(b->out, e->ids[i]))
                return KVR_ERR_NO_MEMORY;
        return KVR_OK;
    }
    size_t n0 = b->out->n;
    kvr_status_t st = bpe_word_uncached(b, w, len);
    size_t made = b->out->n - n0;
    if (st == KVR_OK && made <= WC_MAXIDS) {
        e->uid = b->t->uid;
        e->hash = h;
        e->len = (uint8_t)len;
        e->n = (uint8_t)made;
        memcpy(e->w, w, len);
        if (made) /* a word that made no id (nothing encodable): out->p may be NULL */
            memcpy(e->ids, b->out->p + n0, made * sizeof(int32_t));
    }
    return st;
}

static kvr_status_t bpe_word_uncached(struct bpe *b, const char *w, size_t len)
{
    const kvr_tokenizer_t *t = b->t;
    if (t->ignore_merges) {
        int32_t id = t->kind == KIND_BYTELEVEL ? kvr_tok_strmap_get(&t->raw, w, len)
                                               : kvr_tok_strmap_get(&t->pieces, w, len);
        if (id >= 0)
            return kvr_tok_ids_put(b->out, id) ? KVR_OK : KVR_ERR_NO_MEMORY;
    }
    if (!bpe_reserve(b, len))
        return KVR_ERR_NO_MEMORY;
    size_t n = 0;
    if (t->kind == KIND_BYTELEVEL) {
        for (size_t i = 0; i < len; i++) {
            b->id[n] = t->byte_id[(unsigned char)w[i]];
            b->start[n] = (uint32_t)i;
            b->len[n] = 1;
            n++;
        }
    } else {
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            size_t l = kvr_utf8_next((const unsigned char *)w + i, len - i, &cp);
            b->id[n] = kvr_tok_strmap_get(&t->pieces, w + i, l);
            if (b->id[n] < 0)
                b->id[n] = -1; /* unknown: byte fallback or unk when emitted */
            b->start[n] = (uint32_t)i;
            b->len[n] = (uint32_t)l;
            n++;
            i += l;
        }
    }
    return bpe_merge_emit(b, w, n);
}

/* Sentencepiece text as words: cut before each "▁" that follows another
 * character (exact when sp_word_split holds, see tokenizer_internal.h). */
static kvr_status_t sp_words(struct bpe *b, const char *s, size_t len)
{
    const kvr_tokenizer_t *t = b->t;
    if (!t->sp_word_split)
        return bpe_word(b, s, len);
    const char *ws = t->metaspace ? t->ms_repl : "\xe2\x96\x81";
    size_t wl = t->metaspace ? t->ms_repl_len : 3, w0 = 0;
    for (size_t i = 1; i + wl <= len; i++) {
        if (memcmp(s + i, ws, wl) || (i >= wl && !memcmp(s + i - wl, ws, wl)))
            continue;
        kvr_status_t st = bpe_word(b, s + w0, i - w0);
        if (st != KVR_OK)
            return st;
        w0 = i;
    }
    return bpe_word(b, s + w0, len - w0);
}

/* Metaspace: spaces -> replacement, prefix by the scheme, split before each
 * replacement when split is set. */
static kvr_status_t metaspace_words(struct bpe *b, const char *s, size_t len)
{
    const kvr_tokenizer_t *t = b->t;
    struct buf m = {0};
    kvr_status_t st = KVR_OK;
    bool starts = len >= t->ms_repl_len && !memcmp(s, t->ms_repl, t->ms_repl_len);
    if (!starts && len && s[0] == ' ')
        starts = true;
    if (!starts && (t->ms_prepend == 2 || (t->ms_prepend == 1 && b->section == 0)))
        if (!kvr_tok_buf_put(&m, t->ms_repl, t->ms_repl_len))
            return KVR_ERR_NO_MEMORY;
    for (size_t i = 0; i < len; i++) {
        if (!(s[i] == ' ' ? kvr_tok_buf_put(&m, t->ms_repl, t->ms_repl_len)
                          : kvr_tok_buf_put(&m, s + i, 1))) {
            free(m.p);
            return KVR_ERR_NO_MEMORY;
        }
    }
    if (!t->ms_split) {
        st = sp_words(b, m.p, m.n);
    } else {
        size_t w0 = 0;
        for (size_t i = 1; i <= m.n && st == KVR_OK; i++) {
            if (i == m.n ||
                (m.n - i >= t->ms_repl_len && !memcmp(m.p + i, t->ms_repl, t->ms_repl_len))) {
                st = bpe_word(b, m.p + w0, i - w0);
                w0 = i;
            }
        }
    }
    free(m.p);
    return st;
}

static bool is_ws_at(const char *s, size_t n, size_t i, size_t *l_p);
static void trim_end(const char *s, size_t a, size_t *e_p);

/* Normalizes and encodes one section of text between added tokens. */
static kvr_status_t encode_section(struct bpe *b, const char *s, size_t len)
{
    const kvr_tokenizer_t *t = b->t;
    char *cur = NULL;
    size_t cur_len = len;
    kvr_status_t st = KVR_OK;
    for (size_t k = 0; k < t->n_norms; k++) {
        const struct norm *nm = &t->norms[k];
        const char *src = cur ? cur : s;
        char *o = NULL;
        size_t ol = 0;
        if (nm->op == NORM_UNICODE) {
            if (!kvr_uni_normalize(nm->form, src, cur_len, &o, &ol))
                goto err_nomem;
        } else if (nm->op == NORM_STRIP) {
            /* White_Space at either end, as Rust's char::is_whitespace */
            size_t a = 0, e = cur_len, l;
            while (nm->left && a < e && is_ws_at(src, e, a, &l))
                a += l;
            if (nm->right)
                trim_end(src, a, &e);
            o = malloc(e - a + 1);
            if (!o)
                goto err_nomem;
            memcpy(o, src + a, e - a);
            ol = e - a;
        } else if (nm->op == NORM_PREPEND) {
            if (cur_len == 0)
                continue;
            o = malloc(cur_len + nm->alen + 1);
            if (!o)
                goto err_nomem;
            memcpy(o, nm->a, nm->alen);
            memcpy(o + nm->alen, src, cur_len);
            ol = cur_len + nm->alen;
        } else if (nm->re) {
            struct buf r = {0};
            kvr_status_t rst =
                kvr_pretok_regex_replace(nm->re, src, cur_len, nm->b, nm->blen, &r.p, &r.n);
            if (rst != KVR_OK) {
                free(cur);
                return rst;
            }
            o = r.p;
            ol = r.n;
        } else {
            struct buf r = {0};
            for (size_t i = 0; i < cur_len;) {
                bool hit = cur_len - i >= nm->alen && !memcmp(src + i, nm->a, nm->alen);
                if (!(hit ? kvr_tok_buf_put(&r, nm->b, nm->blen)
                          : kvr_tok_buf_put(&r, src + i, 1))) {
                    free(r.p);
                    goto err_nomem;
                }
                i += hit ? nm->alen : 1;
            }
            o = r.p ? r.p : calloc(1, 1);
            ol = r.n;
            if (!o)
                goto err_nomem;
        }
        free(cur);
        cur = o;
        cur_len = ol;
    }
    const char *text = cur ? cur : s;
    if (cur_len == 0)
        goto out;
    if (t->kind == KIND_BYTELEVEL) {
        if (t->bl_prefix_space && text[0] != ' ') {
            char *p = malloc(cur_len + 2);
            if (!p)
                goto err_nomem;
            p[0] = ' ';
            memcpy(p + 1, text, cur_len);
            free(cur);
            cur = p;
            text = p;
            cur_len++;
        }
        if (t->pretok != KVR_PRETOK_NONE)
            st = kvr_pretok_split(t->pretok, text, cur_len, bpe_word, b);
        else if (t->has_regex)
            st = kvr_pretok_regex_split(t->regex, text, cur_len, bpe_word, b);
        else
            st = bpe_word(b, text, cur_len);
    } else if (t->metaspace) {
        st = metaspace_words(b, text, cur_len);
    } else {
        st = sp_words(b, text, cur_len);
    }
out:
    free(cur);
    return st;
err_nomem:
    free(cur);
    return KVR_ERR_NO_MEMORY;
}

/* The added token starting at s[i], longest first; -1 if none. */
static int32_t added_at(const kvr_tokenizer_t *t, const char *s, size_t len, size_t i)
{
    const int32_t *l = t->added_by_first[(unsigned char)s[i]];
    if (!l)
        return -1;
    for (; *l >= 0; l++) {
        const struct added *a = &t->added[*l];
        if (a->len <= len - i && !memcmp(s + i, a->content, a->len))
            return *l;
    }
    return -1;
}

static bool is_ws_at(const char *s, size_t n, size_t i, size_t *l_p)
{
    uint32_t cp;
    size_t l = kvr_utf8_next((const unsigned char *)s + i, n - i, &cp);
    *l_p = l;
    return !(cp & 0x80000000u) && kvr_uni_is_space(cp);
}

/* Trims whitespace at the end of s[a..*e_p). */
static void trim_end(const char *s, size_t a, size_t *e_p)
{
    size_t e = *e_p;
    while (e > a) {
        size_t k = e - 1; /* step back over continuation bytes */
        while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80)
            k--;
        size_t l;
        if (!is_ws_at(s, e, k, &l) || k + l != e)
            break;
        e = k;
    }
    *e_p = e;
}

kvr_status_t kvr_tokenizer_encode(const kvr_tokenizer_t *t, const char *text, size_t len,
                                  bool add_special, int32_t **ids_p, size_t *n_p)
{
    if (!t || (!text && len) || !ids_p || !n_p)
        return KVR_ERR_INVALID;
    struct ids out = {0};
    struct bpe b = {.t = t, .out = &out};
    kvr_status_t st = KVR_OK;
    if (add_special && t->add_bos && t->bos_id >= 0 && !kvr_tok_ids_put(&out, t->bos_id))
        goto err_nomem;
    /* sections between added tokens */
    size_t sec_start = 0, section = 0;
    bool strip_next = false; /* previous added token has rstrip */
    for (size_t i = 0; i <= len;) {
        int32_t a = i < len && t->n_added ? added_at(t, text, len, i) : -1;
        if (a < 0 && i < len) {
            i++;
            continue;
        }
        size_t s0 = sec_start, s1 = i;
        if (strip_next)
            while (s0 < s1) {
                size_t l;
                if (!is_ws_at(text, s1, s0, &l))
                    break;
                s0 += l;
            }
        if (a >= 0 && t->added[a].lstrip)
            trim_end(text, s0, &s1);
        if (s1 > s0) {
            b.section = section;
            st = encode_section(&b, text + s0, s1 - s0);
            if (st != KVR_OK)
                goto out;
        }
        if (sec_start < i)
            section++; /* the untrimmed section counts (as JS's split does) */
        if (a < 0)
            break;
        if (!kvr_tok_ids_put(&out, t->added[a].id))
            goto err_nomem;
        section++;
        strip_next = t->added[a].rstrip;
        i += t->added[a].len;
        sec_start = i;
    }
    if (add_special && t->add_eos && t->eos_id >= 0 && !kvr_tok_ids_put(&out, t->eos_id))
        goto err_nomem;
    *ids_p = out.p ? out.p : malloc(sizeof(int32_t));
    if (!*ids_p)
        goto err_nomem;
    *n_p = out.n;
    out.p = NULL;
    goto out;
err_nomem:
    st = KVR_ERR_NO_MEMORY;
out:
    free(out.p);
    free(b.id);
    free(b.prev);
    free(b.next);
    free(b.start);
    free(b.len);
    free(b.heap);
    return st;
}
