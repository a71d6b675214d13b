/*
 * tokenizer.c - loading a Hugging Face tokenizer.json (+ tokenizer_config.json
 * and generation_config.json for bos/eos), and the lookups.
 *
 * Loading parses the JSON once (common/json.c), checks every part it relies
 * on - model type (BPE or Unigram), vocab, merges, added tokens, normalizer,
 * pre-tokenizer, post-processor, decoder - and turns them into flat tables:
 * id -> piece and id -> decoded bytes, piece -> id (and, for byte-level
 * models, raw bytes -> id) hash maps, and a (left id, right id) -> (rank,
 * merged id) merge map.  What it cannot honour exactly it refuses with
 * KVR_ERR_UNSUPPORTED and a message naming the key, instead of tokenizing
 * differently.  Encoding is in tokenizer_bpe.c, decoding in
 * tokenizer_detok.c; the object is read-only once loaded.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvr_json.h"
#include "kvr_log.h"
#include "tokenizer_internal.h"
#include "tokenizer_unicode.h"

/* ---- errors ---- */

static kvr_status_t fail(char *err, size_t err_len, kvr_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static kvr_status_t fail(char *err, size_t err_len, kvr_status_t st, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (err && err_len)
        snprintf(err, err_len, "%s", buf);
    KVR_LOG_DEBUG("tokenizer", "%s", buf);
    return st;
}

/* ---- maps ---- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static bool strmap_init(struct strmap *m, size_t expect)
{
    size_t cap = 64;
    while (cap < expect * 2)
        cap <<= 1;
    memset(m, 0, sizeof(*m));
    m->cap = cap;
    m->hash = malloc(cap * sizeof(uint64_t));
    m->off = malloc(cap * sizeof(uint32_t));
    m->len = malloc(cap * sizeof(uint32_t));
    m->val = malloc(cap * sizeof(int32_t));
    if (!m->hash || !m->off || !m->len || !m->val)
        return false;
    for (size_t i = 0; i < cap; i++)
        m->val[i] = -1;
    return true;
}

static void strmap_free(struct strmap *m)
{
    free(m->hash);
    free(m->off);
    free(m->len);
    free(m->val);
    free(m->pool);
}

int32_t kvr_tok_strmap_get(const struct strmap *m, const char *k, size_t n)
{
    if (!m->cap)
        return -1;
    uint64_t h = hash_bytes(k, n);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->val[i] < 0)
            return -1;
        if (m->hash[i] == h && m->len[i] == n && !memcmp(m->pool + m->off[i], k, n))
            return m->val[i];
    }
}

static bool strmap_grow(struct strmap *m)
{
    struct strmap g = *m;
    size_t cap = m->cap * 2;
    g.cap = cap;
    g.hash = malloc(cap * sizeof(uint64_t));
    g.off = malloc(cap * sizeof(uint32_t));
    g.len = malloc(cap * sizeof(uint32_t));
    g.val = malloc(cap * sizeof(int32_t));
    if (!g.hash || !g.off || !g.len || !g.val) {
        free(g.hash);
        free(g.off);
        free(g.len);
        free(g.val);
        return false;
    }
    for (size_t i = 0; i < cap; i++)
        g.val[i] = -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->val[i] < 0)
            continue;
        size_t j = m->hash[i] & (cap - 1);
        while (g.val[j] >= 0)
            j = (j + 1) & (cap - 1);
        g.hash[j] = m->hash[i];
        g.off[j] = m->off[i];
        g.len[j] = m->len[i];
        g.val[j] = m->val[i];
    }
    free(m->hash);
    free(m->off);
    free(m->len);
    free(m->val);
    *m = g;
    return true;
}

/* Inserts k -> v unless k is present (the first value stays). */
static bool strmap_put(struct strmap *m, const char *k, size_t n, int32_t v)
{
    if ((m->n + 1) * 2 > m->cap && !strmap_grow(m))
        return false;
    uint64_t h = hash_bytes(k, n);
    size_t i = h & (m->cap - 1);
    for (; m->val[i] >= 0; i = (i + 1) & (m->cap - 1))
        if (m->hash[i] == h && m->len[i] == n && !memcmp(m->pool + m->off[i], k, n))
            return true;
    if (m->pool_len + n > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap * 2 : 1 << 16;
        while (cap < m->pool_len + n)
            cap *= 2;
        char *p = realloc(m->pool, cap);
        if (!p)
            return false;
        m->pool = p;
        m->pool_cap = cap;
    }
    memcpy(m->pool + m->pool_len, k, n);
    m->hash[i] = h;
    m->off[i] = (uint32_t)m->pool_len;
    m->len[i] = (uint32_t)n;
    m->val[i] = v;
    m->pool_len += n;
    m->n++;
    return true;
}

static bool pairmap_init(struct pairmap *m, size_t expect)
{
    size_t cap = 64;
    while (cap < expect * 2)
        cap <<= 1;
    m->cap = cap;
    m->e = malloc(cap * sizeof(struct pair_ent));
    if (!m->e)
        return false;
    for (size_t i = 0; i < cap; i++)
        m->e[i].key = UINT64_MAX;
    return true;
}

static void pairmap_free(struct pairmap *m)
{
    free(m->e);
}

static void pairmap_put(struct pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t out)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = pair_hash(k) & (m->cap - 1);
    for (; m->e[i].key != UINT64_MAX; i = (i + 1) & (m->cap - 1))
        if (m->e[i].key == k)
            return; /* the lower rank stays */
    m->e[i] = (struct pair_ent){k, rank, out};
}

/* ---- growable byte / id buffers ---- */

bool kvr_tok_buf_put(struct buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool kvr_tok_ids_put(struct ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof(int32_t));
        if (!p)
            return false;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return true;
}

/* ---- byte-level map (GPT-2's bytes_to_unicode) ---- */

static uint32_t byte_to_cp[256];
static int16_t cp_to_byte[324];

static void bytelevel_build(void)
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int i = 0; i < 324; i++)
        cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++)
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
}

static void bytelevel_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bytelevel_build);
}

/* Raw bytes of a ByteLevel piece into out (room for len bytes); false when
 * the piece holds a character outside the map. */
static bool bytelevel_unmap(const char *s, size_t len, char *out, size_t *out_len_p)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += kvr_utf8_next((const unsigned char *)s + i, len - i, &cp);
        if (cp >= 324 || cp_to_byte[cp] < 0)
            return false;
        out[o++] = (char)cp_to_byte[cp];
    }
    *out_len_p = o;
    return true;
}

static int parse_byte_token(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ---- loading ---- */

static char *dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static const char *type_of(const kvr_json_t *v)
{
    const kvr_json_t *t = kvr_json_get(v, "type");
    return t && t->type == KVR_JSON_STRING ? t->str : NULL;
}

struct loader {
    kvr_tokenizer_t *t;
    const char *file;
    char *err;
    size_t err_len;
    bool no_fast_paths;
};

static kvr_status_t parse_normalizer(struct loader *L, const kvr_json_t *n)
{
    if (!n || n->type == KVR_JSON_NULL)
        return KVR_OK;
    const char *ty = type_of(n);
    if (!ty)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: normalizer without a \"type\"",
                    L->file);
    if (!strcmp(ty, "Sequence")) {
        const kvr_json_t *list = kvr_json_get(n, "normalizers");
        if (!list || list->type != KVR_JSON_ARRAY)
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: normalizer Sequence without a \"normalizers\" array", L->file);
        for (size_t i = 0; i < list->n; i++) {
            kvr_status_t st = parse_normalizer(L, list->items[i]);
            if (st != KVR_OK)
                return st;
        }
        return KVR_OK;
    }
    kvr_tokenizer_t *t = L->t;
    struct norm *nn = realloc(t->norms, (t->n_norms + 1) * sizeof(*nn));
    if (!nn)
        return KVR_ERR_NO_MEMORY;
    t->norms = nn;
    struct norm *o = &nn[t->n_norms];
    memset(o, 0, sizeof(*o));
    if (!strcmp(ty, "NFC") || !strcmp(ty, "NFD") || !strcmp(ty, "NFKC") || !strcmp(ty, "NFKD")) {
        o->op = NORM_UNICODE;
        o->form = !strcmp(ty, "NFC")    ? KVR_UNI_NFC
                  : !strcmp(ty, "NFD")  ? KVR_UNI_NFD
                  : !strcmp(ty, "NFKC") ? KVR_UNI_NFKC
                                        : KVR_UNI_NFKD;
    } else if (!strcmp(ty, "Strip")) {
        o->op = NORM_STRIP;
        o->left = kvr_json_get_bool(n, "strip_left", true, NULL);
        o->right = kvr_json_get_bool(n, "strip_right", true, NULL);
    } else if (!strcmp(ty, "Prepend")) {
        const kvr_json_t *p = kvr_json_get(n, "prepend");
        if (!p || p->type != KVR_JSON_STRING)
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: normalizer Prepend without a \"prepend\" string", L->file);
        o->op = NORM_PREPEND;
        o->a = dupn(p->str, p->len);
        o->alen = p->len;
        if (!o->a)
            return KVR_ERR_NO_MEMORY;
    } else if (!strcmp(ty, "Replace")) {
        const kvr_json_t *pat = kvr_json_get(kvr_json_get(n, "pattern"), "String");
        const kvr_json_t *rx = kvr_json_get(kvr_json_get(n, "pattern"), "Regex");
        const kvr_json_t *c = kvr_json_get(n, "content");
        if (rx && rx->type == KVR_JSON_STRING && !pat)
            pat = rx;
        if (!pat || pat->type != KVR_JSON_STRING || pat->len == 0 || !c ||
            c->type != KVR_JSON_STRING)
            return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                        "%s: normalizer Replace: only a non-empty {\"String\": ...} or "
                        "{\"Regex\": ...} pattern and a \"content\" string are supported",
                        L->file);
        if (pat == rx) {
            char rerr[256] = "";
            kvr_status_t rst = kvr_pretok_regex_new(rx->str, rx->len, &o->re, rerr, sizeof(rerr));
            if (rst == KVR_ERR_INVALID)
                return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                            "%s: normalizer Replace regex %.200s does not compile in "
                            "Oniguruma: %s",
                            L->file, rx->str, rerr);
            if (rst != KVR_OK)
                return rst;
        }
        o->op = NORM_REPLACE;
        o->a = dupn(pat->str, pat->len);
        o->alen = pat->len;
        o->b = dupn(c->str, c->len);
        o->blen = c->len;
        if (!o->a || !o->b) {
            free(o->a);
            free(o->b);
            return KVR_ERR_NO_MEMORY;
        }
    } else {
        return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                    "%s: normalizer type \"%s\" is not supported (NFC, NFD, NFKC, NFKD, "
                    "Strip, Prepend, Replace, Sequence are)",
                    L->file, ty);
    }
    t->n_norms++;
    return KVR_OK;
}

/* The pre-tokenizer regex: the hand-written matcher when the pattern is one
 * of the three it implements (unless the options turn fast paths off), and
 * always the Oniguruma regex, which any other pattern runs in. */
static kvr_status_t set_regex(struct loader *L, const char *pattern, size_t len)
{
    kvr_tokenizer_t *t = L->t;
    char rerr[256] = "";
    kvr_status_t st = kvr_pretok_regex_new(pattern, len, &t->regex, rerr, sizeof(rerr));
    if (st == KVR_ERR_INVALID)
        return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                    "%s: pre_tokenizer regex %.200s does not compile in Oniguruma: %s", L->file,
                    pattern, rerr);
    if (st != KVR_OK)
        return st;
    t->has_regex = true;
    t->pretok = L->no_fast_paths ? KVR_PRETOK_NONE : kvr_pretok_fast_path(pattern, len);
    return KVR_OK;
}

static kvr_status_t parse_pretok(struct loader *L, const kvr_json_t *p, bool *bytelevel_p)
{
    if (!p || p->type == KVR_JSON_NULL)
        return KVR_OK;
    kvr_tokenizer_t *t = L->t;
    const char *ty = type_of(p);
    if (!ty)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: pre_tokenizer without a \"type\"",
                    L->file);
    if (!strcmp(ty, "Sequence")) {
        const kvr_json_t *list = kvr_json_get(p, "pretokenizers");
        if (!list || list->type != KVR_JSON_ARRAY)
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: pre_tokenizer Sequence without a \"pretokenizers\" array", L->file);
        for (size_t i = 0; i < list->n; i++) {
            kvr_status_t st = parse_pretok(L, list->items[i], bytelevel_p);
            if (st != KVR_OK)
                return st;
        }
        return KVR_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        *bytelevel_p = true;
        t->bl_prefix_space = kvr_json_get_bool(p, "add_prefix_space", false, NULL);
        if (kvr_json_get_bool(p, "use_regex", true, NULL)) {
            if (t->has_regex)
                return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                            "%s: a Split regex followed by ByteLevel use_regex is not supported",
                            L->file);
            return set_regex(L, kvr_pretok_regex_gpt2, strlen(kvr_pretok_regex_gpt2));
        }
        return KVR_OK;
    }
    if (!strcmp(ty, "Split")) {
        const kvr_json_t *re = kvr_json_get(kvr_json_get(p, "pattern"), "Regex");
        const char *beh = kvr_json_get_str(p, "behavior", "Isolated", NULL);
        if (!re || re->type != KVR_JSON_STRING)
            return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                        "%s: pre_tokenizer Split: only {\"Regex\": ...} patterns are supported",
                        L->file);
        if (strcmp(beh, "Isolated") || kvr_json_get_bool(p, "invert", false, NULL))
            return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                        "%s: pre_tokenizer Split: behavior \"%s\"%s is not supported (Isolated "
                        "is)",
                        L->file, beh,
                        kvr_json_get_bool(p, "invert", false, NULL) ? " with invert" : "");
        if (t->has_regex)
            return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                        "%s: more than one pre-tokenizer regex", L->file);
        return set_regex(L, re->str, re->len);
    }
    if (!strcmp(ty, "Metaspace")) {
        const char *r = kvr_json_get_str(p, "replacement", "\xe2\x96\x81", NULL);
        size_t rl = strlen(r);
        if (rl == 0 || rl >= sizeof(t->ms_repl))
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: pre_tokenizer Metaspace: bad \"replacement\"", L->file);
        memcpy(t->ms_repl, r, rl + 1);
        t->ms_repl_len = rl;
        t->metaspace = true;
        t->ms_split = kvr_json_get_bool(p, "split", true, NULL);
        const char *ps = kvr_json_get_str(p, "prepend_scheme", NULL, NULL);
        if (ps)
            t->ms_prepend = !strcmp(ps, "never") ? 0 : !strcmp(ps, "first") ? 1 : 2;
        else
            t->ms_prepend = kvr_json_get_bool(p, "add_prefix_space", true, NULL) ? 2 : 0;
        return KVR_OK;
    }
    return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                "%s: pre_tokenizer type \"%s\" is not supported (ByteLevel, Split, Metaspace, "
                "Sequence are)",
                L->file, ty);
}

static kvr_status_t parse_decoder(struct loader *L, const kvr_json_t *d)
{
    if (!d || d->type == KVR_JSON_NULL)
        return KVR_OK;
    const char *ty = type_of(d);
    if (!ty)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: decoder without a \"type\"", L->file);
    if (!strcmp(ty, "Sequence")) {
        const kvr_json_t *list = kvr_json_get(d, "decoders");
        if (!list || list->type != KVR_JSON_ARRAY)
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: decoder Sequence without a \"decoders\" array", L->file);
        for (size_t i = 0; i < list->n; i++) {
            kvr_status_t st = parse_decoder(L, list->items[i]);
            if (st != KVR_OK)
                return st;
        }
        return KVR_OK;
    }
    if (!strcmp(ty, "Strip")) {
        L->t->sp_strip = (int)kvr_json_get_int(d, "start", 0, NULL);
        return KVR_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        const char *ps = kvr_json_get_str(d, "prepend_scheme", "always", NULL);
        L->t->sp_strip = strcmp(ps, "never") ? 1 : 0;
        return KVR_OK;
    }
    /* ByteLevel, Replace("▁" -> " "), ByteFallback, Fuse: what the two model
     * kinds decode as anyway */
    if (!strcmp(ty, "ByteLevel") || !strcmp(ty, "Replace") || !strcmp(ty, "ByteFallback") ||
        !strcmp(ty, "Fuse"))
        return KVR_OK;
    return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED, "%s: decoder type \"%s\" is not supported",
                L->file, ty);
}

/* The post-processor template: a SpecialToken first (bos) / last (eos). */
static void parse_post(struct loader *L, const kvr_json_t *p)
{
    const char *ty = type_of(p);
    if (!ty)
        return;
    if (!strcmp(ty, "Sequence")) {
        const kvr_json_t *list = kvr_json_get(p, "processors");
        for (size_t i = 0; list && i < list->n; i++)
            parse_post(L, list->items[i]);
        return;
    }
    if (strcmp(ty, "TemplateProcessing"))
        return;
    const kvr_json_t *single = kvr_json_get(p, "single");
    if (!single || single->type != KVR_JSON_ARRAY || single->n == 0)
        return;
    for (int end = 0; end < 2; end++) {
        const kvr_json_t *it = single->items[end ? single->n - 1 : 0];
        const kvr_json_t *sp = kvr_json_get(it, "SpecialToken");
        if (!sp)
            continue;
        const char *name = kvr_json_get_str(sp, "id", NULL, NULL);
        if (!name)
            continue;
        int32_t id = kvr_tok_strmap_get(&L->t->pieces, name, strlen(name));
        const kvr_json_t *st = kvr_json_get(kvr_json_get(p, "special_tokens"), name);
        const kvr_json_t *ids = kvr_json_get(st, "ids");
        if (ids && ids->type == KVR_JSON_ARRAY && ids->n == 1 &&
            ids->items[0]->type == KVR_JSON_NUMBER && ids->items[0]->is_int &&
            ids->items[0]->i64 >= 0 && ids->items[0]->i64 < L->t->n_ids)
            id = (int32_t)ids->items[0]->i64;
        /* an id without a piece would be encoded and then not decodable */
        if (id < 0 || id >= L->t->n_ids || !L->t->piece[id])
            continue;
        if (end) {
            L->t->eos_id = L->t->eos_id < 0 ? id : L->t->eos_id;
            L->t->add_eos = true;
        } else {
            L->t->bos_id = id;
            L->t->add_bos = true;
        }
    }
}

static bool set_piece(kvr_tokenizer_t *t, int32_t id, const char *s, size_t len)
{
    free(t->piece[id]);
    t->piece[id] = dupn(s, len);
    t->piece_len[id] = (uint32_t)len;
    return t->piece[id] != NULL;
}

static kvr_status_t load_model(struct loader *L, const kvr_json_t *model)
{
    kvr_tokenizer_t *t = L->t;
    const kvr_json_t *vocab = kvr_json_get(model, "vocab");
    if (t->unigram) {
        /* [[piece, score], ...]: the id is the index */
        if (!vocab || vocab->type != KVR_JSON_ARRAY || vocab->n == 0 || vocab->n >= (1 << 24))
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: Unigram model.vocab is missing, empty or not an array", L->file);
        for (size_t i = 0; i < vocab->n; i++) {
            const kvr_json_t *v = vocab->items[i];
            if (v->type != KVR_JSON_ARRAY || v->n != 2 || v->items[0]->type != KVR_JSON_STRING ||
                v->items[1]->type != KVR_JSON_NUMBER)
                return fail(L->err, L->err_len, KVR_ERR_INVALID,
                            "%s: Unigram model.vocab[%zu] is not [piece, score]", L->file, i);
        }
        int64_t unk = kvr_json_get_int(model, "unk_id", -1, NULL);
        if (unk < 0 || unk >= (int64_t)vocab->n)
            return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                        "%s: a Unigram model without an unk_id in the vocabulary is not supported",
                        L->file);
        t->n_ids = (int32_t)vocab->n;
        return KVR_OK;
    }
    if (!vocab || vocab->type != KVR_JSON_OBJECT)
        return fail(L->err, L->err_len, KVR_ERR_INVALID,
                    "%s: model.vocab is missing or not an object", L->file);
    const kvr_json_t *merges = kvr_json_get(model, "merges");
    if (merges && merges->type != KVR_JSON_ARRAY)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: model.merges is not an array",
                    L->file);
    if (vocab->n == 0)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: model.vocab is empty", L->file);
    int64_t max_id = -1;
    for (size_t i = 0; i < vocab->n; i++) {
        const kvr_json_t *v = vocab->items[i];
        if (v->type != KVR_JSON_NUMBER || !v->is_int || v->i64 < 0 || v->i64 >= (1 << 24))
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: model.vocab[\"%.80s\"] is not a token id in [0, 2^24)", L->file,
                        vocab->keys[i]);
        if (v->i64 > max_id)
            max_id = v->i64;
    }
    t->n_ids = (int32_t)max_id + 1; /* grown by added tokens later */
    return KVR_OK;
}

static kvr_status_t alloc_ids(kvr_tokenizer_t *t, int32_t n)
{
    t->n_ids = n;
    t->piece = calloc((size_t)n, sizeof(char *));
    t->piece_len = calloc((size_t)n, sizeof(uint32_t));
    t->dec = calloc((size_t)n, sizeof(char *));
    t->dec_len = calloc((size_t)n, sizeof(uint32_t));
    t->byte_tok = malloc((size_t)n * sizeof(int16_t));
    t->added_ix = malloc((size_t)n * sizeof(int32_t));
    if (!t->piece || !t->piece_len || !t->dec || !t->dec_len || !t->byte_tok || !t->added_ix)
        return KVR_ERR_NO_MEMORY;
    for (int32_t i = 0; i < n; i++) {
        t->byte_tok[i] = -1;
        t->added_ix[i] = -1;
    }
    return KVR_OK;
}

static const char *token_name(const kvr_json_t *v)
{
    /* "bos_token": "<s>" or {"content": "<s>", ...} */
    if (!v)
        return NULL;
    if (v->type == KVR_JSON_STRING)
        return v->str;
    return kvr_json_get_str(v, "content", NULL, NULL);
}

static kvr_status_t add_eos(kvr_tokenizer_t *t, int32_t id)
{
    if (id < 0 || id >= t->n_ids)
        return KVR_OK;
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id)
            return KVR_OK;
    int32_t *p = realloc(t->eos_ids, (t->n_eos + 1) * sizeof(int32_t));
    if (!p)
        return KVR_ERR_NO_MEMORY;
    t->eos_ids = p;
    t->eos_ids[t->n_eos++] = id;
    return KVR_OK;
}

static kvr_status_t load_configs(kvr_tokenizer_t *t, const char *dir, char *err, size_t err_len)
{
    char path[4160];
    kvr_json_doc_t *doc = NULL;
    char jerr[256];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        kvr_status_t st = kvr_json_parse_file(path, &doc, jerr, sizeof(jerr));
        if (st != KVR_OK)
            return fail(err, err_len, st, "%s", jerr);
        const kvr_json_t *r = kvr_json_root(doc);
        const char *bos = token_name(kvr_json_get(r, "bos_token"));
        const char *eos = token_name(kvr_json_get(r, "eos_token"));
        if (bos) {
            int32_t id = kvr_tok_strmap_get(&t->pieces, bos, strlen(bos));
            if (id >= 0)
                t->bos_id = id;
        }
        if (eos) {
            int32_t id = kvr_tok_strmap_get(&t->pieces, eos, strlen(eos));
            if (id >= 0)
                t->eos_id = id;
        }
        const kvr_json_t *ab = kvr_json_get(r, "add_bos_token");
        if (ab && ab->type == KVR_JSON_BOOL)
            t->add_bos = ab->b && t->bos_id >= 0;
        const kvr_json_t *ae = kvr_json_get(r, "add_eos_token");
        if (ae && ae->type == KVR_JSON_BOOL)
            t->add_eos = ae->b && t->eos_id >= 0;
        kvr_json_free(doc);
        doc = NULL;
    }
    /* no configuration naming them: the conventional special tokens */
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>"};
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>"};
    for (size_t i = 0; t->bos_id < 0 && i < sizeof(bos_names) / sizeof(bos_names[0]); i++) {
        int32_t id = kvr_tok_strmap_get(&t->pieces, bos_names[i], strlen(bos_names[i]));
        if (kvr_tokenizer_is_special(t, id))
            t->bos_id = id;
    }
    for (size_t i = 0; t->eos_id < 0 && i < sizeof(eos_names) / sizeof(eos_names[0]); i++) {
        int32_t id = kvr_tok_strmap_get(&t->pieces, eos_names[i], strlen(eos_names[i]));
        if (kvr_tokenizer_is_special(t, id))
            t->eos_id = id;
    }
    if (t->eos_id >= 0 && add_eos(t, t->eos_id) != KVR_OK)
        return KVR_ERR_NO_MEMORY;
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    if (stat(path, &sb) == 0) {
        kvr_status_t st = kvr_json_parse_file(path, &doc, jerr, sizeof(jerr));
        if (st != KVR_OK)
            return fail(err, err_len, st, "%s", jerr);
        const kvr_json_t *r = kvr_json_root(doc);
        const kvr_json_t *e = kvr_json_get(r, "eos_token_id");
        if (e && e->type == KVR_JSON_NUMBER && e->is_int && e->i64 >= 0 && e->i64 < t->n_ids) {
            if (t->eos_id < 0)
                t->eos_id = (int32_t)e->i64;
            st = add_eos(t, (int32_t)e->i64);
        } else if (e && e->type == KVR_JSON_ARRAY) {
            for (size_t i = 0; i < e->n && st == KVR_OK; i++)
                if (e->items[i]->type == KVR_JSON_NUMBER && e->items[i]->is_int &&
                    e->items[i]->i64 >= 0 && e->items[i]->i64 < t->n_ids) {
                    if (t->eos_id < 0)
                        t->eos_id = (int32_t)e->items[i]->i64;
                    st = add_eos(t, (int32_t)e->items[i]->i64);
                }
        }
        if (t->bos_id < 0) {
            int64_t b = kvr_json_get_int(r, "bos_token_id", -1, NULL);
            if (b >= 0 && b < t->n_ids && t->piece[b])
                t->bos_id = (int32_t)b;
        }
        kvr_json_free(doc);
        if (st != KVR_OK)
            return st;
    }
    return KVR_OK;
}

static int cmp_added_len(const void *a, const void *b, void *ctx)
{
    const struct added *ad = ctx;
    size_t la = ad[*(const int32_t *)a].len, lb = ad[*(const int32_t *)b].len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static kvr_status_t build(struct loader *L, const kvr_json_t *root)
{
    kvr_tokenizer_t *t = L->t;
    kvr_status_t st;
    if (root->type != KVR_JSON_OBJECT)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: the top level is not an object",
                    L->file);
    const kvr_json_t *model = kvr_json_get(root, "model");
    if (!model || model->type != KVR_JSON_OBJECT)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: no \"model\" object", L->file);
    const char *mt = type_of(model);
    t->unigram = mt && !strcmp(mt, "Unigram");
    if (mt && strcmp(mt, "BPE") && !t->unigram)
        return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                    "%s: model type \"%s\" is not supported (BPE and Unigram are)", L->file, mt);
    if (!mt && !kvr_json_get(model, "merges"))
        return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                    "%s: model has neither a \"type\" nor BPE \"merges\"", L->file);

    bool bytelevel = false;
    st = parse_normalizer(L, kvr_json_get(root, "normalizer"));
    if (st == KVR_OK)
        st = parse_pretok(L, kvr_json_get(root, "pre_tokenizer"), &bytelevel);
    if (st == KVR_OK)
        st = parse_decoder(L, kvr_json_get(root, "decoder"));
    if (st != KVR_OK)
        return st;
    const char *dty = type_of(kvr_json_get(root, "decoder"));
    if (dty && !strcmp(dty, "ByteLevel"))
        bytelevel = true;
    t->kind = bytelevel ? KIND_BYTELEVEL : KIND_SP;
    t->ignore_merges = kvr_json_get_bool(model, "ignore_merges", false, NULL);
    t->byte_fallback = kvr_json_get_bool(model, "byte_fallback", false, NULL);
    t->fuse_unk = kvr_json_get_bool(model, "fuse_unk", false, NULL);
    const kvr_json_t *cs = kvr_json_get(model, "continuing_subword_prefix");
    const kvr_json_t *ew = kvr_json_get(model, "end_of_word_suffix");
    if ((cs && cs->type == KVR_JSON_STRING && cs->len) ||
        (ew && ew->type == KVR_JSON_STRING && ew->len))
        return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                    "%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported",
                    L->file);
    const kvr_json_t *dr = kvr_json_get(model, "dropout");
    if (dr && dr->type == KVR_JSON_NUMBER && dr->num > 0)
        return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED, "%s: BPE dropout is not supported",
                    L->file);
    if (!bytelevel && t->has_regex)
        return fail(L->err, L->err_len, KVR_ERR_UNSUPPORTED,
                    "%s: a Split regex without ByteLevel is not supported", L->file);
    if (t->unigram && bytelevel)
        return fail(
            L->err, L->err_len, KVR_ERR_UNSUPPORTED,
            "%s: a Unigram model with a ByteLevel pre-tokenizer or decoder is not supported",
            L->file);

    st = load_model(L, model);
    if (st != KVR_OK)
        return st;
    const kvr_json_t *vocab = kvr_json_get(model, "vocab");
    const kvr_json_t *merges = kvr_json_get(model, "merges");
    const kvr_json_t *added = kvr_json_get(root, "added_tokens");
    if (added && added->type != KVR_JSON_ARRAY && added->type != KVR_JSON_NULL)
        return fail(L->err, L->err_len, KVR_ERR_INVALID, "%s: added_tokens is not an array",
                    L->file);
    int32_t n_ids = t->n_ids;
    for (size_t i = 0; added && added->type == KVR_JSON_ARRAY && i < added->n; i++) {
        const kvr_json_t *a = added->items[i];
        int64_t id = kvr_json_get_int(a, "id", -1, NULL);
        const char *c = kvr_json_get_str(a, "content", NULL, NULL);
        if (id < 0 || id >= (1 << 24) || !c || !*c)
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: added_tokens[%zu] needs an \"id\" in [0, 2^24) and a non-empty "
                        "\"content\"",
                        L->file, i);
        if (id + 1 > n_ids)
            n_ids = (int32_t)id + 1;
    }
    st = alloc_ids(t, n_ids);
    if (st != KVR_OK)
        return st;
    if (!strmap_init(&t->pieces, vocab->n + 64) || (bytelevel && !strmap_init(&t->raw, vocab->n)))
        return KVR_ERR_NO_MEMORY;
    char *tmp = malloc(1024);
    if (!tmp)
        return KVR_ERR_NO_MEMORY;
    size_t tmp_cap = 1024;
    if (t->unigram) {
        t->uni_n = (int32_t)vocab->n;
        t->uni_score = malloc(vocab->n * sizeof(float));
        if (!t->uni_score)
            goto err_nomem;
        double min = INFINITY;
        for (size_t i = 0; i < vocab->n; i++) {
            const kvr_json_t *v = vocab->items[i];
            t->uni_score[i] = (float)v->items[1]->num;
            if (v->items[1]->num < min)
                min = v->items[1]->num;
            if (v->items[0]->len > t->uni_max_len)
                t->uni_max_len = v->items[0]->len;
        }
        t->uni_unk_score = min - 10.0; /* HF's kUnkPenalty */
    }
    for (size_t i = 0; i < vocab->n; i++) {
        int32_t id = t->unigram ? (int32_t)i : (int32_t)vocab->items[i]->i64;
        const char *k = t->unigram ? vocab->items[i]->items[0]->str : vocab->keys[i];
        size_t kl = t->unigram ? vocab->items[i]->items[0]->len : vocab->key_lens[i];
        if (!set_piece(t, id, k, kl) || !strmap_put(&t->pieces, k, kl, id))
            goto err_nomem;
        if (kl > tmp_cap) {
            char *nt = realloc(tmp, kl);
            if (!nt)
                goto err_nomem;
            tmp = nt;
            tmp_cap = kl;
        }
        size_t rl;
        if (bytelevel) {
            if (bytelevel_unmap(k, kl, tmp, &rl)) {
                if (!strmap_put(&t->raw, tmp, rl, id))
                    goto err_nomem;
            } else {
                memcpy(tmp, k, kl); /* not byte-level text: decodes as itself */
                rl = kl;
            }
        } else {
            int b = parse_byte_token(k, kl);
            if (b >= 0) {
                t->byte_tok[id] = (int16_t)b;
                rl = 0;
            } else {
                /* the Replace decoder: "▁" -> " " */
                rl = 0;
                for (size_t j = 0; j < kl;) {
                    if (kl - j >= 3 && !memcmp(k + j, "\xe2\x96\x81", 3)) {
                        tmp[rl++] = ' ';
                        j += 3;
                    } else {
                        tmp[rl++] = k[j++];
                    }
                }
            }
        }
        free(t->dec[id]);
        t->dec[id] = dupn(tmp, rl);
        t->dec_len[id] = (uint32_t)rl;
        if (!t->dec[id])
            goto err_nomem;
    }
    free(tmp);
    tmp = NULL;
    for (int b = 0; b < 256; b++) {
        char p[8];
        size_t pl;
        if (bytelevel) {
            pl = kvr_utf8_put(byte_to_cp[b], p);
        } else {
            snprintf(p, sizeof(p), "<0x%02X>", b);
            pl = 6;
        }
        t->byte_id[b] = kvr_tok_strmap_get(&t->pieces, p, pl);
    }
    const char *unk = kvr_json_get_str(model, "unk_token", NULL, NULL);
    t->unk_id = t->unigram ? (int32_t)kvr_json_get_int(model, "unk_id", -1, NULL)
                : unk      ? kvr_tok_strmap_get(&t->pieces, unk, strlen(unk))
                           : -1;

    /* merges */
    size_t n_merges = merges ? merges->n : 0;
    if (!pairmap_init(&t->merges, n_merges + 1))
        return KVR_ERR_NO_MEMORY;
    struct buf cat = {0};
    size_t skipped = 0;
    const char *ws = t->metaspace ? t->ms_repl : "\xe2\x96\x81";
    size_t wsl = strlen(ws);
    bool cross = false;
    for (size_t i = 0; i < n_merges; i++) {
        const kvr_json_t *m = merges->items[i];
        const char *a, *b;
        size_t al, bl;
        if (m->type == KVR_JSON_STRING) {
            const char *sp = memchr(m->str, ' ', m->len);
            if (!sp) {
                free(cat.p);
                return fail(L->err, L->err_len, KVR_ERR_INVALID,
                            "%s: model.merges[%zu] \"%.80s\" is not \"left right\"", L->file, i,
                            m->str);
            }
            a = m->str;
            al = (size_t)(sp - m->str);
            b = sp + 1;
            bl = m->len - al - 1;
        } else if (m->type == KVR_JSON_ARRAY && m->n == 2 && m->items[0]->type == KVR_JSON_STRING &&
                   m->items[1]->type == KVR_JSON_STRING) {
            a = m->items[0]->str;
            al = m->items[0]->len;
            b = m->items[1]->str;
            bl = m->items[1]->len;
        } else {
            free(cat.p);
            return fail(L->err, L->err_len, KVR_ERR_INVALID,
                        "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", L->file, i);
        }
        int32_t ia = kvr_tok_strmap_get(&t->pieces, a, al),
                ib = kvr_tok_strmap_get(&t->pieces, b, bl);
        cat.n = 0;
        if (!kvr_tok_buf_put(&cat, a, al) || !kvr_tok_buf_put(&cat, b, bl)) {
            free(cat.p);
            return KVR_ERR_NO_MEMORY;
        }
        int32_t io = kvr_tok_strmap_get(&t->pieces, cat.p, cat.n);
        if (ia < 0 || ib < 0 || io < 0) {
            skipped++;
            continue;
        }
        pairmap_put(&t->merges, ia, ib, (int32_t)i, io);
        if (!(al >= wsl && !memcmp(a + al - wsl, ws, wsl)) && bl >= wsl && !memcmp(b, ws, wsl))
            cross = true;
    }
    free(cat.p);
    t->sp_word_split = t->kind == KIND_SP && !cross && !t->ignore_merges && !t->unigram;
    if (skipped)
        KVR_LOG_WARN("tokenizer", "%s: %zu merges name pieces outside the vocabulary; ignored",
                     L->file, skipped);

    /* added tokens */
    if (added && added->type == KVR_JSON_ARRAY && added->n) {
        t->added = calloc(added->n, sizeof(struct added));
        if (!t->added)
            return KVR_ERR_NO_MEMORY;
        for (size_t i = 0; i < added->n; i++) {
            const kvr_json_t *a = added->items[i];
            struct added *d = &t->added[t->n_added];
            const kvr_json_t *c = kvr_json_get(a, "content");
            d->id = (int32_t)kvr_json_get_int(a, "id", -1, NULL);
            d->content = dupn(c->str, c->len);
            d->len = c->len;
            if (!d->content)
                return KVR_ERR_NO_MEMORY;
            d->special = kvr_json_get_bool(a, "special", false, NULL);
            d->lstrip = kvr_json_get_bool(a, "lstrip", false, NULL);
            d->rstrip = kvr_json_get_bool(a, "rstrip", false, NULL);
            d->normalized = kvr_json_get_bool(a, "normalized", !d->special, NULL);
            t->added_ix[d->id] = (int32_t)t->n_added;
            if (!t->piece[d->id] && !set_piece(t, d->id, d->content, d->len))
                return KVR_ERR_NO_MEMORY;
            if (!strmap_put(&t->pieces, d->content, d->len, d->id))
                return KVR_ERR_NO_MEMORY;
            t->n_added++;
        }
        /* per first byte, longest first (leftmost-longest matching) */
        size_t cnt[256] = {0};
        for (size_t i = 0; i < t->n_added; i++)
            cnt[(unsigned char)t->added[i].content[0]]++;
        for (int b = 0; b < 256; b++) {
            if (!cnt[b])
                continue;
            int32_t *l = malloc((cnt[b] + 1) * sizeof(int32_t));
            if (!l)
                return KVR_ERR_NO_MEMORY;
            size_t k = 0;
            for (size_t i = 0; i < t->n_added; i++)
                if ((unsigned char)t->added[i].content[0] == b)
                    l[k++] = (int32_t)i;
            qsort_r(l, k, sizeof(int32_t), cmp_added_len, t->added);
            l[k] = -1;
            t->added_by_first[b] = l;
        }
    }
    parse_post(L, kvr_json_get(root, "post_processor"));
    if (t->kind == KIND_BYTELEVEL) {
        for (int b = 0; b < 256; b++)
            if (t->byte_id[b] < 0)
                KVR_LOG_DEBUG("tokenizer", "%s: byte 0x%02X has no token", L->file, b);
    }
    return KVR_OK;

err_nomem:
    free(tmp);
    return KVR_ERR_NO_MEMORY;
}

kvr_status_t kvr_tokenizer_load(const char *path, kvr_tokenizer_t **tok_p, char *err,
                                size_t err_len)
{
    return kvr_tokenizer_load_opts(path, NULL, tok_p, err, err_len);
}

kvr_status_t kvr_tokenizer_load_opts(const char *path, const struct kvr_tokenizer_options *opts,
                                     kvr_tokenizer_t **tok_p, char *err, size_t err_len)
{
    if (!path || !tok_p)
        return fail(err, err_len, KVR_ERR_INVALID, "tokenizer: no path given");
    bytelevel_init();
    char file[4096], dir[4096];
    if (strlen(path) > 4000)
        return fail(err, err_len, KVR_ERR_INVALID, "tokenizer: path too long");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return fail(err, err_len, errno == ENOENT ? KVR_ERR_NOT_FOUND : KVR_ERR_IO, "%s: %s", path,
                    strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof(dir), "%s", path);
        snprintf(file, sizeof(file), "%s/tokenizer.json", path);
        if (stat(file, &sb) != 0)
            return fail(err, err_len, KVR_ERR_NOT_FOUND, "%s: %s", file, strerror(errno));
    } else {
        snprintf(file, sizeof(file), "%s", path);
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof(dir), ".");
    }
    kvr_json_doc_t *doc = NULL;
    char jerr[512];
    kvr_status_t st = kvr_json_parse_file(file, &doc, jerr, sizeof(jerr));
    if (st != KVR_OK)
        return fail(err, err_len, st == KVR_ERR_NO_MEMORY ? st : KVR_ERR_INVALID, "%s", jerr);
    kvr_tokenizer_t *t = calloc(1, sizeof(*t));
    if (!t) {
        kvr_json_free(doc);
        return KVR_ERR_NO_MEMORY;
    }
    static atomic_uint_fast64_t next_uid = 1;
    t->uid = atomic_fetch_add(&next_uid, 1);
    t->bos_id = t->eos_id = t->unk_id = -1;
    struct loader L = {t, file, err, err_len, opts && opts->no_fast_paths};
    st = build(&L, kvr_json_root(doc));
    kvr_json_free(doc);
    if (st == KVR_OK)
        st = load_configs(t, dir, err, err_len);
    if (st != KVR_OK) {
        if (st == KVR_ERR_NO_MEMORY)
            fail(err, err_len, st, "%s: out of memory", file);
        kvr_tokenizer_destroy(t);
        return st;
    }
    KVR_LOG_DEBUG("tokenizer", "%s: %s, %d ids, %zu added, bos %d eos %d", file,
                  kvr_tokenizer_kind(t), (int)t->n_ids, t->n_added, (int)t->bos_id, (int)t->eos_id);
    *tok_p = t;
    return KVR_OK;
}

void kvr_tokenizer_destroy(kvr_tokenizer_t *t)
{
    if (!t)
        return;
    for (int32_t i = 0; t->piece && i < t->n_ids; i++)
        free(t->piece[i]);
    for (int32_t i = 0; t->dec && i < t->n_ids; i++)
        free(t->dec[i]);
    free(t->piece);
    free(t->piece_len);
    free(t->dec);
    free(t->dec_len);
    free(t->byte_tok);
    free(t->added_ix);
    strmap_free(&t->pieces);
    strmap_free(&t->raw);
    pairmap_free(&t->merges);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    for (int b = 0; b < 256; b++)
        free(t->added_by_first[b]);
    for (size_t i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
        kvr_pretok_regex_free(t->norms[i].re);
    }
    free(t->norms);
    free(t->eos_ids);
    free(t->uni_score);
    kvr_pretok_regex_free(t->regex);
    free(t);
}

/* ---- lookups ---- */

int32_t kvr_tokenizer_vocab_size(const kvr_tokenizer_t *t)
{
    return t ? t->n_ids : 0;
}

const char *kvr_tokenizer_id_to_piece(const kvr_tokenizer_t *t, int32_t id, size_t *len_p)
{
    if (!t || id < 0 || id >= t->n_ids || !t->piece[id])
        return NULL;
    if (len_p)
        *len_p = t->piece_len[id];
    return t->piece[id];
}

int32_t kvr_tokenizer_piece_to_id(const kvr_tokenizer_t *t, const char *piece, size_t len)
{
    if (!t || !piece)
        return -1;
    return kvr_tok_strmap_get(&t->pieces, piece, len);
}

bool kvr_tokenizer_is_special(const kvr_tokenizer_t *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_ids || t->added_ix[id] < 0)
        return false;
    return t->added[t->added_ix[id]].special;
}

int32_t kvr_tokenizer_bos_id(const kvr_tokenizer_t *t)
{
    return t ? t->bos_id : -1;
}

int32_t kvr_tokenizer_eos_id(const kvr_tokenizer_t *t)
{
    return t ? t->eos_id : -1;
}

size_t kvr_tokenizer_eos_ids(const kvr_tokenizer_t *t, const int32_t **ids_p)
{
    if (!t) {
        if (ids_p)
            *ids_p = NULL;
        return 0;
    }
    if (ids_p)
        *ids_p = t->eos_ids;
    return t->n_eos;
}

bool kvr_tokenizer_is_eos(const kvr_tokenizer_t *t, int32_t id)
{
    for (size_t i = 0; t && i < t->n_eos; i++)
        if (t->eos_ids[i] == id)
            return true;
    return false;
}

bool kvr_tokenizer_adds_bos(const kvr_tokenizer_t *t)
{
    return t && t->add_bos && t->bos_id >= 0;
}

const char *kvr_tokenizer_kind(const kvr_tokenizer_t *t)
{
    if (t && t->unigram)
        return "unigram";
    return t && t->kind == KIND_SP ? "bpe-sentencepiece" : "bpe-bytelevel";
}
