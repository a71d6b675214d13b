/*
 * json.c - strict RFC 8259 JSON parser building a DOM in an arena.
 *
 * A recursive-descent parser over buf[0..len) (not NUL-terminated).  Every
 * node, string and item array is carved out of one arena of chunks owned by
 * the document, so kvr_json_free() is a walk over the chunk list.  While a
 * container is parsed, its children are pushed onto one shared growable
 * stack; when it closes they are copied into the arena in one piece and
 * popped, so no container ever reallocates in the arena.
 *
 * Strictness: no trailing commas, no comments, no leading zeros, no NaN or
 * Infinity, control characters in strings refused, strings must be valid
 * UTF-8, lone surrogate escapes refused, nothing but whitespace after the
 * root value.  A leading UTF-8 byte order mark is skipped (RFC 8259 s8.1
 * allows parsers to ignore it).  Errors report byte offset, line and column.
 */
#include "kvr_json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH   512
#define ARENA_CHUNK_SIZE (64 * 1024)

struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    /* data follows, max_align_t aligned */
    _Alignas(max_align_t) unsigned char data[];
};

struct kvr_json_doc {
    struct arena_chunk *chunks;
    kvr_json_t *root;
};

struct parser {
    const char *buf;
    size_t len, pos;
    kvr_json_doc_t *doc;
    int depth;
    /* shared child stack: values, and keys for objects */
    kvr_json_t **vals;
    const char **keys;
    size_t *klens;
    size_t sp, scap;
    char *err;
    size_t err_len;
    kvr_status_t status; /* KVR_ERR_INVALID or KVR_ERR_NO_MEMORY once failed */
};

static void *arena_alloc(kvr_json_doc_t *doc, size_t n)
{
    const size_t align = _Alignof(max_align_t);
    n = (n + align - 1) & ~(align - 1);
    struct arena_chunk *c = doc->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK_SIZE ? n : ARENA_CHUNK_SIZE;
        c = malloc(sizeof(*c) + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = doc->chunks;
        doc->chunks = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

__attribute__((format(printf, 2, 3))) static void fail(struct parser *p, const char *fmt, ...)
{
    if (p->status != KVR_OK)
        return;
    p->status = KVR_ERR_INVALID;
    if (!p->err || p->err_len == 0)
        return;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->buf[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    int n = snprintf(p->err, p->err_len, "line %zu col %zu (byte %zu): ", line, col, p->pos);
    if (n < 0 || (size_t)n >= p->err_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + n, p->err_len - (size_t)n, fmt, ap);
    va_end(ap);
}

static void fail_nomem(struct parser *p)
{
    if (p->status != KVR_OK)
        return;
    p->status = KVR_ERR_NO_MEMORY;
    if (p->err && p->err_len)
        snprintf(p->err, p->err_len, "out of memory at byte %zu", p->pos);
}

static void skip_ws(struct parser *p)
{
    while (p->pos < p->len) {
        char c = p->buf[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            p->pos++;
        else
            break;
    }
}

static const char *describe(struct parser *p)
{
    static _Thread_local char d[32];
    if (p->pos >= p->len)
        return "end of input";
    unsigned char c = (unsigned char)p->buf[p->pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(d, sizeof(d), "'%c'", c);
    else
        snprintf(d, sizeof(d), "byte 0x%02x", c);
    return d;
}

static bool stack_push(struct parser *p, const char *key, size_t klen, kvr_json_t *v)
{
    if (p->sp == p->scap) {
        size_t ncap = p->scap ? p->scap * 2 : 64;
        kvr_json_t **nv = realloc(p->vals, ncap * sizeof(*nv));
        if (!nv)
            return false;
        p->vals = nv;
        const char **nk = realloc(p->keys, ncap * sizeof(*nk));
        if (!nk)
            return false;
        p->keys = nk;
        size_t *nl = realloc(p->klens, ncap * sizeof(*nl));
        if (!nl)
            return false;
        p->klens = nl;
        p->scap = ncap;
    }
    p->vals[p->sp] = v;
    p->keys[p->sp] = key;
    p->klens[p->sp] = klen;
    p->sp++;
    return true;
}

static kvr_json_t *new_node(struct parser *p, enum kvr_json_type t)
{
    kvr_json_t *v = arena_alloc(p->doc, sizeof(*v));
    if (!v) {
        fail_nomem(p);
        return NULL;
    }
    memset(v, 0, sizeof(*v));
    v->type = t;
    return v;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool read_hex4(struct parser *p, unsigned *out)
{
    if (p->len - p->pos < 4) {
        fail(p, "truncated \\u escape");
        return false;
    }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->buf[p->pos + (size_t)i]);
        if (h < 0) {
            p->pos += (size_t)i;
            fail(p, "invalid hex digit %s in \\u escape", describe(p));
            return false;
        }
        v = v * 16 + (unsigned)h;
    }
    p->pos += 4;
    *out = v;
    return true;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Length of a valid UTF-8 sequence at s[0..n), or 0 if invalid. */
static size_t utf8_valid_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t need;
    unsigned cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((need == 3 && cp < 0x800) || (need == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    if (cp >= 0xd800 && cp <= 0xdfff)
        return 0;
    return need;
}

/* Parses a string at p->pos (the opening quote); returns arena copy. */
static char *parse_string(struct parser *p, size_t *len_p)
{
    p->pos++; /* opening quote */
    /* first pass: find the end and validate, to size the output */
    size_t start = p->pos, i = start;
    while (i < p->len && p->buf[i] != '"') {
        if (p->buf[i] == '\\')
            i++;
        i++;
    }
    if (i >= p->len) {
        p->pos = start - 1;
        fail(p, "unterminated string");
        return NULL;
    }
    /* unescaped output is never longer than the escaped input */
    char *out = arena_alloc(p->doc, i - start + 1);
    if (!out) {
        fail_nomem(p);
        return NULL;
    }
    size_t o = 0;
    while (p->buf[p->pos] != '"') {
        unsigned char c = (unsigned char)p->buf[p->pos];
        if (c < 0x20) {
            fail(p, "control character 0x%02x in string (must be escaped)", c);
            return NULL;
        }
        if (c == '\\') {
            p->pos++;
            char e = p->buf[p->pos];
            switch (e) {
            case '"':
                out[o++] = '"';
                break;
            case '\\':
                out[o++] = '\\';
                break;
            case '/':
                out[o++] = '/';
                break;
            case 'b':
                out[o++] = '\b';
                break;
            case 'f':
                out[o++] = '\f';
                break;
            case 'n':
                out[o++] = '\n';
                break;
            case 'r':
                out[o++] = '\r';
                break;
            case 't':
                out[o++] = '\t';
                break;
            case 'u': {
                p->pos++;
                unsigned cp;
                if (!read_hex4(p, &cp))
                    return NULL;
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    unsigned lo;
                    if (p->len - p->pos < 2 || p->buf[p->pos] != '\\' ||
                        p->buf[p->pos + 1] != 'u') {
                        fail(p, "high surrogate \\u%04X not followed by a low surrogate", cp);
                        return NULL;
                    }
                    p->pos += 2;
                    if (!read_hex4(p, &lo))
                        return NULL;
                    if (lo < 0xdc00 || lo > 0xdfff) {
                        fail(p, "high surrogate \\u%04X followed by \\u%04X, not a low surrogate",
                             cp, lo);
                        return NULL;
                    }
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                    fail(p, "lone low surrogate \\u%04X", cp);
                    return NULL;
                }
                o += put_utf8(out + o, cp);
                continue; /* pos already past the escape */
            }
            default:
                fail(p, "invalid escape \\%s", describe(p));
                return NULL;
            }
            p->pos++;
            continue;
        }
        size_t n = utf8_valid_len((const unsigned char *)p->buf + p->pos, i - p->pos);
        if (n == 0) {
            fail(p, "invalid UTF-8 byte 0x%02x in string", c);
            return NULL;
        }
        memcpy(out + o, p->buf + p->pos, n);
        o += n;
        p->pos += n;
    }
    p->pos++; /* closing quote */
    out[o] = '\0';
    *len_p = o;
    return out;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static kvr_json_t *parse_number(struct parser *p)
{
    size_t s = p->pos;
    bool integer = true;
    if (p->pos < p->len && p->buf[p->pos] == '-')
        p->pos++;
    if (p->pos >= p->len || !is_digit(p->buf[p->pos])) {
        fail(p, "expected a digit, found %s", describe(p));
        return NULL;
    }
    if (p->buf[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->len && is_digit(p->buf[p->pos])) {
            fail(p, "leading zero in number");
            return NULL;
        }
    } else {
        while (p->pos < p->len && is_digit(p->buf[p->pos]))
            p->pos++;
    }
    if (p->pos < p->len && p->buf[p->pos] == '.') {
        integer = false;
        p->pos++;
        if (p->pos >= p->len || !is_digit(p->buf[p->pos])) {
            fail(p, "expected a digit after '.', found %s", describe(p));
            return NULL;
        }
        while (p->pos < p->len && is_digit(p->buf[p->pos]))
            p->pos++;
    }
    if (p->pos < p->len && (p->buf[p->pos] == 'e' || p->buf[p->pos] == 'E')) {
        integer = false;
        p->pos++;
        if (p->pos < p->len && (p->buf[p->pos] == '+' || p->buf[p->pos] == '-'))
            p->pos++;
        if (p->pos >= p->len || !is_digit(p->buf[p->pos])) {
            fail(p, "expected a digit in exponent, found %s", describe(p));
            return NULL;
        }
        while (p->pos < p->len && is_digit(p->buf[p->pos]))
            p->pos++;
    }
    size_t n = p->pos - s;
    char small[64];
    char *tmp = n < sizeof(small) ? small : malloc(n + 1);
    if (!tmp) {
        fail_nomem(p);
        return NULL;
    }
    memcpy(tmp, p->buf + s, n);
    tmp[n] = '\0';
    kvr_json_t *v = new_node(p, KVR_JSON_NUMBER);
    if (v) {
        v->num = strtod(tmp, NULL);
        if (integer) {
            errno = 0;
            long long ll = strtoll(tmp, NULL, 10);
            if (errno == 0) {
                v->i64 = ll;
                v->is_int = true;
            }
        }
        /* a non-integer's i64 is its value truncated and saturated: a cast
         * of a double outside int64 (1e300, a large integer literal) or of
         * a NaN is undefined behaviour */
        if (!v->is_int) {
            if (!(v->num == v->num))
                v->i64 = 0;
            else if (v->num >= 9223372036854775808.0)
                v->i64 = INT64_MAX;
            else if (v->num < -9223372036854775808.0)
                v->i64 = INT64_MIN;
            else
                v->i64 = (int64_t)v->num;
        }
    }
    if (tmp != small)
        free(tmp);
    return v;
}

static bool match_lit(struct parser *p, const char *lit)
{
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->buf + p->pos, lit, n) != 0)
        return false;
    p->pos += n;
    return true;
}

static kvr_json_t *parse_value(struct parser *p);

static bool finish_container(struct parser *p, kvr_json_t *v, size_t base, bool obj)
{
    size_t n = p->sp - base;
    v->n = n;
    if (n) {
        v->items = arena_alloc(p->doc, n * sizeof(*v->items));
        if (!v->items)
            goto nomem;
        memcpy(v->items, p->vals + base, n * sizeof(*v->items));
        if (obj) {
            v->keys = arena_alloc(p->doc, n * sizeof(*v->keys));
            v->key_lens = arena_alloc(p->doc, n * sizeof(*v->key_lens));
            if (!v->keys || !v->key_lens)
                goto nomem;
            memcpy(v->keys, p->keys + base, n * sizeof(*v->keys));
            memcpy(v->key_lens, p->klens + base, n * sizeof(*v->key_lens));
        }
    }
    p->sp = base;
    return true;
nomem:
    fail_nomem(p);
    return false;
}

static kvr_json_t *parse_array(struct parser *p)
{
    kvr_json_t *v = new_node(p, KVR_JSON_ARRAY);
    if (!v)
        return NULL;
    size_t base = p->sp;
    p->pos++; /* '[' */
    skip_ws(p);
    if (p->pos < p->len && p->buf[p->pos] == ']') {
        p->pos++;
        return finish_container(p, v, base, false) ? v : NULL;
    }
    for (;;) {
        skip_ws(p);
        kvr_json_t *e = parse_value(p);
        if (!e)
            return NULL;
        if (!stack_push(p, NULL, 0, e)) {
            fail_nomem(p);
            return NULL;
        }
        skip_ws(p);
        if (p->pos < p->len && p->buf[p->pos] == ',') {
            p->pos++;
            skip_ws(p);
            if (p->pos < p->len && p->buf[p->pos] == ']') {
                fail(p, "trailing comma in array");
                return NULL;
            }
            continue;
        }
        if (p->pos < p->len && p->buf[p->pos] == ']') {
            p->pos++;
            break;
        }
        fail(p, "expected ',' or ']' in array, found %s", describe(p));
        return NULL;
    }
    return finish_container(p, v, base, false) ? v : NULL;
}

static kvr_json_t *parse_object(struct parser *p)
{
    kvr_json_t *v = new_node(p, KVR_JSON_OBJECT);
    if (!v)
        return NULL;
    size_t base = p->sp;
    p->pos++; /* '{' */
    skip_ws(p);
    if (p->pos < p->len && p->buf[p->pos] == '}') {
        p->pos++;
        return finish_container(p, v, base, true) ? v : NULL;
    }
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->buf[p->pos] != '"') {
            if (p->pos < p->len && p->buf[p->pos] == '}')
                fail(p, "trailing comma in object");
            else
                fail(p, "expected a string key in object, found %s", describe(p));
            return NULL;
        }
        size_t klen;
        char *key = parse_string(p, &klen);
        if (!key)
            return NULL;
        skip_ws(p);
        if (p->pos >= p->len || p->buf[p->pos] != ':') {
            fail(p, "expected ':' after key \"%s\", found %s", key, describe(p));
            return NULL;
        }
        p->pos++;
        skip_ws(p);
        kvr_json_t *e = parse_value(p);
        if (!e)
            return NULL;
        if (!stack_push(p, key, klen, e)) {
            fail_nomem(p);
            return NULL;
        }
        skip_ws(p);
        if (p->pos < p->len && p->buf[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->buf[p->pos] == '}') {
            p->pos++;
            break;
        }
        fail(p, "expected ',' or '}' in object, found %s", describe(p));
        return NULL;
    }
    return finish_container(p, v, base, true) ? v : NULL;
}

static kvr_json_t *parse_value(struct parser *p)
{
    if (p->pos >= p->len) {
        fail(p, "expected a value, found end of input");
        return NULL;
    }
    char c = p->buf[p->pos];
    kvr_json_t *v;
    switch (c) {
    case '{':
    case '[':
        if (++p->depth > JSON_MAX_DEPTH) {
            fail(p, "nesting deeper than %d", JSON_MAX_DEPTH);
            return NULL;
        }
        v = c == '{' ? parse_object(p) : parse_array(p);
        p->depth--;
        return v;
    case '"': {
        size_t len;
        char *s = parse_string(p, &len);
        if (!s)
            return NULL;
        v = new_node(p, KVR_JSON_STRING);
        if (v) {
            v->str = s;
            v->len = len;
        }
        return v;
    }
    case 't':
    case 'f':
        if (match_lit(p, "true") || match_lit(p, "false")) {
            v = new_node(p, KVR_JSON_BOOL);
            if (v)
                v->b = c == 't';
            return v;
        }
        break;
    case 'n':
        if (match_lit(p, "null"))
            return new_node(p, KVR_JSON_NULL);
        break;
    default:
        if (c == '-' || is_digit(c))
            return parse_number(p);
        break;
    }
    fail(p, "expected a value, found %s", describe(p));
    return NULL;
}

kvr_status_t kvr_json_parse(const char *buf, size_t len, kvr_json_doc_t **doc_p, char *err,
                            size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!doc_p || (!buf && len)) {
        if (err && err_len)
            snprintf(err, err_len, "kvr_json_parse: NULL argument");
        return KVR_ERR_INVALID;
    }
    kvr_json_doc_t *doc = calloc(1, sizeof(*doc));
    if (!doc) {
        if (err && err_len)
            snprintf(err, err_len, "out of memory");
        return KVR_ERR_NO_MEMORY;
    }
    struct parser p = {.buf = buf, .len = len, .doc = doc, .err = err, .err_len = err_len};
    if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0)
        p.pos = 3;
    skip_ws(&p);
    doc->root = parse_value(&p);
    if (doc->root) {
        skip_ws(&p);
        if (p.pos < p.len)
            fail(&p, "unexpected %s after the end of the JSON value", describe(&p));
    }
    free(p.vals);
    free(p.keys);
    free(p.klens);
    if (p.status != KVR_OK || !doc->root) {
        kvr_status_t s = p.status != KVR_OK ? p.status : KVR_ERR_INVALID;
        kvr_json_free(doc);
        return s;
    }
    *doc_p = doc;
    return KVR_OK;
}

kvr_status_t kvr_json_parse_file(const char *path, kvr_json_doc_t **doc_p, char *err,
                                 size_t err_len)
{
    char *buf = NULL;
    kvr_status_t st;
    FILE *f = fopen(path, "rb");
    if (!f) {
        st = errno == ENOENT ? KVR_ERR_NOT_FOUND : KVR_ERR_IO;
        if (err && err_len)
            snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return st;
    }
    if (fseek(f, 0, SEEK_END) != 0)
        goto err_io;
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto err_io;
    buf = malloc((size_t)sz + 1);
    if (!buf) {
        fclose(f);
        if (err && err_len)
            snprintf(err, err_len, "%s: out of memory (%ld bytes)", path, sz);
        return KVR_ERR_NO_MEMORY;
    }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz)
        goto err_io;
    fclose(f);
    char inner[256];
    st = kvr_json_parse(buf, (size_t)sz, doc_p, inner, sizeof(inner));
    free(buf);
    if (st != KVR_OK && err && err_len)
        snprintf(err, err_len, "%s: %s", path, inner);
    return st;
err_io:
    if (err && err_len)
        snprintf(err, err_len, "%s: read error: %s", path, strerror(errno));
    fclose(f);
    free(buf);
    return KVR_ERR_IO;
}

void kvr_json_free(kvr_json_doc_t *doc)
{
    if (!doc)
        return;
    struct arena_chunk *c = doc->chunks;
    while (c) {
        struct arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    free(doc);
}

const kvr_json_t *kvr_json_root(const kvr_json_doc_t *doc)
{
    return doc ? doc->root : NULL;
}

const kvr_json_t *kvr_json_get(const kvr_json_t *v, const char *key)
{
    if (!v || v->type != KVR_JSON_OBJECT || !key)
        return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < v->n; i++)
        if (v->key_lens[i] == kl && memcmp(v->keys[i], key, kl) == 0)
            return v->items[i];
    return NULL;
}

const kvr_json_t *kvr_json_at(const kvr_json_t *v, size_t i)
{
    if (!v || v->type != KVR_JSON_ARRAY || i >= v->n)
        return NULL;
    return v->items[i];
}

static const kvr_json_t *get_typed(const kvr_json_t *obj, const char *key, enum kvr_json_type t,
                                   bool *ok)
{
    const kvr_json_t *v = kvr_json_get(obj, key);
    if (!v || v->type == KVR_JSON_NULL)
        return NULL;
    if (v->type != t) {
        if (ok)
            *ok = false;
        return NULL;
    }
    return v;
}

int64_t kvr_json_get_int(const kvr_json_t *obj, const char *key, int64_t def, bool *ok)
{
    const kvr_json_t *v = get_typed(obj, key, KVR_JSON_NUMBER, ok);
    if (!v)
        return def;
    if (!v->is_int) {
        if (ok)
            *ok = false;
        return def;
    }
    return v->i64;
}

double kvr_json_get_num(const kvr_json_t *obj, const char *key, double def, bool *ok)
{
    const kvr_json_t *v = get_typed(obj, key, KVR_JSON_NUMBER, ok);
    return v ? v->num : def;
}

bool kvr_json_get_bool(const kvr_json_t *obj, const char *key, bool def, bool *ok)
{
    const kvr_json_t *v = get_typed(obj, key, KVR_JSON_BOOL, ok);
    return v ? v->b : def;
}

const char *kvr_json_get_str(const kvr_json_t *obj, const char *key, const char *def, bool *ok)
{
    const kvr_json_t *v = get_typed(obj, key, KVR_JSON_STRING, ok);
    return v ? v->str : def;
}

size_t kvr_json_escape(char *buf, size_t cap, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (o < cap)                                                                               \
            buf[o] = (c);                                                                          \
        o++;                                                                                       \
    } while (0)
    PUT('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            PUT('\\');
            PUT('"');
            break;
        case '\\':
            PUT('\\');
            PUT('\\');
            break;
        case '\n':
            PUT('\\');
            PUT('n');
            break;
        case '\r':
            PUT('\\');
            PUT('r');
            break;
        case '\t':
            PUT('\\');
            PUT('t');
            break;
        case '\b':
            PUT('\\');
            PUT('b');
            break;
        case '\f':
            PUT('\\');
            PUT('f');
            break;
        default:
            if (c >= 0x80) {
                size_t n = utf8_valid_len((const unsigned char *)s + i, len - i);
                if (n == 0) { /* invalid UTF-8: U+FFFD keeps the output valid JSON */
                    PUT('\\');
                    PUT('u');
                    PUT('f');
                    PUT('f');
                    PUT('f');
                    PUT('d');
                } else {
                    for (size_t k = 0; k < n; k++)
                        PUT(s[i + k]);
                    i += n - 1;
                }
            } else if (c < 0x20 || c == 0x7f) {
                PUT('\\');
                PUT('u');
                PUT('0');
                PUT('0');
                PUT(hex[c >> 4]);
                PUT(hex[c & 15]);
            } else {
                PUT((char)c);
            }
        }
    }
    PUT('"');
#undef PUT
    if (cap)
        buf[o < cap ? o : cap - 1] = '\0';
    return o;
}

void kvr_json_fput_str(FILE *f, const char *s, size_t len)
{
    char small[1024];
    size_t need = kvr_json_escape(small, sizeof(small), s, len);
    if (need < sizeof(small)) {
        fputs(small, f);
        return;
    }
    char *big = malloc(need + 1);
    if (!big)
        return;
    kvr_json_escape(big, need + 1, s, len);
    fputs(big, f);
    free(big);
}
