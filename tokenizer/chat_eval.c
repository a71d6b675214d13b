/*
 * chat_eval.c - renders a parsed chat template (chat_parse.c): values,
 * scopes, statements, expressions, and the filters / tests / methods /
 * globals that chat templates call.
 *
 * Values are small structs (undefined, none, bool, int, float, string, list,
 * dict, namespace, builtin function, macro); lists, dicts and strings live
 * in the render's arena, so nothing is freed one by one and an error may
 * leave from anywhere with a longjmp.  The messages / tools / extra JSON is
 * converted once into values (strings point into the caller's JSON).
 * Scoping follows Jinja: a for loop has its own scope (so templates use
 * namespace() to carry state out of it), a macro runs in a scope over the
 * one it was defined in.  Every statement and expression step counts
 * against max_steps, output against max_output, the arena against
 * max_memory, and macro calls nest at most 64 deep: a template that loops
 * forever, recurses without end or writes without bound ends with an error.
 * Semantics follow Python's Jinja2 as transformers configures it
 * (trim_blocks, lstrip_blocks, tojson without HTML escaping, keys in
 * insertion order).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_internal.h"
#include "tokenizer_unicode.h"

enum { MAX_CALL_DEPTH = 64, MAX_EVAL_DEPTH = 512 };

enum vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC, V_MACRO };

enum fn {
    FN_RANGE,
    FN_NAMESPACE,
    FN_RAISE,
    FN_STRFTIME,
    FN_DICT,
    FN_CYCLE, /* loop.cycle; aux = loop.index0 */
};

struct list;
struct dict;
struct macro;

struct val {
    enum vt t;
    int64_t aux;
    union {
        bool b;
        int64_t i;
        double f;
        struct jstr s;
        struct list *l;
        struct dict *d;
        enum fn fn;
        struct macro *m;
    };
};

struct list {
    size_t n, cap;
    struct val *v;
};

struct dict {
    size_t n, cap;
    struct jstr *k;
    struct val *v;
    bool ns; /* a namespace(): attributes may be set */
};

struct scope {
    struct scope *parent;
    size_t n, cap;
    struct jstr *k;
    struct val *v;
};

struct macro {
    const struct node *def; /* N_MACRO, or the N_CALLBLOCK for caller() */
    struct scope *closure;
    struct val caller; /* the caller() a call block passes, or undefined */
};

struct obuf {
    char *p;
    size_t n, cap;
};

struct ctx {
    struct arena a;
    struct jfail f;
    const struct kvr_chat_options *o;
    struct obuf *out;
    size_t max_out;
    uint64_t steps, max_steps;
    int call_depth, eval_depth;
};

static const struct val UNDEF = {.t = V_UNDEF};

#define FAIL(c, line, st, ...) fail_at(c, line, st, __VA_ARGS__)

static _Noreturn void fail_at(struct ctx *c, int line, kvr_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static _Noreturn void fail_at(struct ctx *c, int line, kvr_status_t st, const char *fmt, ...)
{
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof(m), fmt, ap);
    va_end(ap);
    kvr_chat_fail(&c->f, st, "line %d: %s", line, m);
}

static void step(struct ctx *c, int line)
{
    if (++c->steps > c->max_steps)
        FAIL(c, line, KVR_ERR_OVERLOAD,
             "the template ran more than %llu steps (a loop that does not end?)",
             (unsigned long long)c->max_steps);
}

static void *alloc(struct ctx *c, size_t n)
{
    return kvr_chat_alloc(&c->a, &c->f, n);
}

static bool jeq(struct jstr a, const char *s)
{
    return a.n == strlen(s) && !memcmp(a.p, s, a.n);
}

static bool jsame(struct jstr a, struct jstr b)
{
    return a.n == b.n && !memcmp(a.p, b.p, a.n);
}

/* ---- constructors ---- */

static struct val vstr(struct jstr s)
{
    struct val v = {.t = V_STR};
    v.s = s;
    return v;
}

static struct val vcstr(const char *s)
{
    return vstr((struct jstr){s, strlen(s)});
}

static struct val vint(int64_t i)
{
    struct val v = {.t = V_INT};
    v.i = i;
    return v;
}

static struct val vfloat(double f)
{
    struct val v = {.t = V_FLOAT};
    v.f = f;
    return v;
}

static struct val vbool(bool b)
{
    struct val v = {.t = V_BOOL};
    v.b = b;
    return v;
}

static struct list *list_new(struct ctx *c, size_t cap)
{
    struct list *l = alloc(c, sizeof(*l));
    l->n = 0;
    l->cap = cap ? cap : 4;
    l->v = alloc(c, l->cap * sizeof(struct val));
    return l;
}

static void list_add(struct ctx *c, struct list *l, struct val v)
{
    if (l->n == l->cap) {
        struct val *nv = alloc(c, l->cap * 2 * sizeof(struct val));
        memcpy(nv, l->v, l->n * sizeof(struct val));
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

static struct val vlist(struct list *l)
{
    struct val v = {.t = V_LIST};
    v.l = l;
    return v;
}

static struct dict *dict_new(struct ctx *c, size_t cap)
{
    struct dict *d = alloc(c, sizeof(*d));
    d->n = 0;
    d->cap = cap ? cap : 4;
    d->ns = false;
    d->k = alloc(c, d->cap * sizeof(struct jstr));
    d->v = alloc(c, d->cap * sizeof(struct val));
    return d;
}

static struct val *dict_find(const struct dict *d, struct jstr k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jsame(d->k[i], k))
            return &d->v[i];
    return NULL;
}

static void dict_set(struct ctx *c, struct dict *d, struct jstr k, struct val v)
{
    struct val *p = dict_find(d, k);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        struct jstr *nk = alloc(c, d->cap * 2 * sizeof(struct jstr));
        struct val *nv = alloc(c, d->cap * 2 * sizeof(struct val));
        memcpy(nk, d->k, d->n * sizeof(struct jstr));
        memcpy(nv, d->v, d->n * sizeof(struct val));
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static struct val vdict(struct dict *d)
{
    struct val v = {.t = V_DICT};
    v.d = d;
    return v;
}

static struct val vfn(enum fn f, int64_t aux)
{
    struct val v = {.t = V_FUNC, .aux = aux};
    v.fn = f;
    return v;
}

/* ---- output buffers ---- */

static void out_put(struct ctx *c, struct obuf *b, const char *s, size_t n, int line)
{
    if (b->n + n > c->max_out)
        FAIL(c, line, KVR_ERR_OVERLOAD, "the output would exceed %zu bytes (max_output)",
             c->max_out);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = alloc(c, cap);
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static struct jstr obuf_str(struct obuf *b)
{
    return (struct jstr){b->p ? b->p : "", b->n};
}

/* ---- scopes ---- */

static struct scope *scope_new(struct ctx *c, struct scope *parent)
{
    struct scope *s = alloc(c, sizeof(*s));
    memset(s, 0, sizeof(*s));
    s->parent = parent;
    return s;
}

static void scope_set(struct ctx *c, struct scope *s, struct jstr k, struct val v)
{
    for (size_t i = 0; i < s->n; i++)
        if (jsame(s->k[i], k)) {
            s->v[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct jstr *nk = alloc(c, cap * sizeof(struct jstr));
        struct val *nv = alloc(c, cap * sizeof(struct val));
        if (s->n) {
            memcpy(nk, s->k, s->n * sizeof(struct jstr));
            memcpy(nv, s->v, s->n * sizeof(struct val));
        }
        s->k = nk;
        s->v = nv;
        s->cap = cap;
    }
    s->k[s->n] = k;
    s->v[s->n++] = v;
}

static struct val *scope_find(struct scope *s, struct jstr k)
{
    for (; s; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (jsame(s->k[i], k))
                return &s->v[i];
    return NULL;
}

/* ---- JSON in ---- */

static struct val from_json(struct ctx *c, const kvr_json_t *j)
{
    if (!j)
        return UNDEF;
    switch (j->type) {
    case KVR_JSON_NULL:
        return (struct val){.t = V_NONE};
    case KVR_JSON_BOOL:
        return vbool(j->b);
    case KVR_JSON_NUMBER:
        return j->is_int ? vint(j->i64) : vfloat(j->num);
    case KVR_JSON_STRING:
        return vstr((struct jstr){j->str, j->len});
    case KVR_JSON_ARRAY: {
        struct list *l = list_new(c, j->n);
        for (size_t i = 0; i < j->n; i++)
            list_add(c, l, from_json(c, j->items[i]));
        return vlist(l);
    }
    case KVR_JSON_OBJECT: {
        struct dict *d = dict_new(c, j->n);
        for (size_t i = 0; i < j->n; i++)
            dict_set(c, d, (struct jstr){j->keys[i], j->key_lens[i]}, from_json(c, j->items[i]));
        return vdict(d);
    }
    }
    return UNDEF;
}

/* ---- conversions ---- */

static const char *type_name(const struct val *v)
{
    static const char *const n[] = {"undefined", "none", "boolean", "integer",  "float",
                                    "string",    "list", "dict",    "function", "macro"};
    if (v->t == V_DICT && v->d->ns)
        return "namespace";
    return n[v->t];
}

static bool truthy(const struct val *v)
{
    switch (v->t) {
    case V_UNDEF:
    case V_NONE:
        return false;
    case V_BOOL:
        return v->b;
    case V_INT:
        return v->i != 0;
    case V_FLOAT:
        return v->f != 0;
    case V_STR:
        return v->s.n > 0;
    case V_LIST:
        return v->l->n > 0;
    case V_DICT:
        return v->d->n > 0;
    default:
        return true;
    }
}

static void fmt_float(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f > 0 ? "inf" : "-inf");
        return;
    }
    /* Python's repr: the shortest that reads back, with a ".0" when integral */
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    if (!strpbrk(buf, ".eninf"))
        strncat(buf, ".0", cap - strlen(buf) - 1);
}

static void put_repr(struct ctx *c, struct obuf *b, const struct val *v, int line, int depth);

/* str(v) into b */
static void put_str(struct ctx *c, struct obuf *b, const struct val *v, int line)
{
    char buf[64];
    switch (v->t) {
    case V_UNDEF:
        return;
    case V_NONE:
        out_put(c, b, "None", 4, line);
        return;
    case V_BOOL:
        out_put(c, b, v->b ? "True" : "False", v->b ? 4 : 5, line);
        return;
    case V_INT:
        snprintf(buf, sizeof(buf), "%lld", (long long)v->i);
        out_put(c, b, buf, strlen(buf), line);
        return;
    case V_FLOAT:
        fmt_float(v->f, buf, sizeof(buf));
        out_put(c, b, buf, strlen(buf), line);
        return;
    case V_STR:
        out_put(c, b, v->s.p, v->s.n, line);
        return;
    default:
        put_repr(c, b, v, line, 0);
        return;
    }
}

static void put_repr(struct ctx *c, struct obuf *b, const struct val *v, int line, int depth)
{
    if (depth > 64)
        FAIL(c, line, KVR_ERR_OVERLOAD, "a value nested deeper than 64");
    switch (v->t) {
    case V_STR: {
        bool dq = memchr(v->s.p, '\'', v->s.n) && !memchr(v->s.p, '"', v->s.n);
        char q = dq ? '"' : '\'';
        out_put(c, b, &q, 1, line);
        for (size_t i = 0; i < v->s.n; i++) {
            char ch = v->s.p[i];
            const char *esc = ch == '\\'   ? "\\\\"
                              : ch == '\n' ? "\\n"
                              : ch == '\r' ? "\\r"
                              : ch == '\t' ? "\\t"
                              : ch == q    ? (dq ? "\\\"" : "\\'")
                                           : NULL;
            if (esc)
                out_put(c, b, esc, strlen(esc), line);
            else
                out_put(c, b, &ch, 1, line);
        }
        out_put(c, b, &q, 1, line);
        return;
    }
    case V_LIST:
        out_put(c, b, "[", 1, line);
        for (size_t i = 0; i < v->l->n; i++) {
            if (i)
                out_put(c, b, ", ", 2, line);
            put_repr(c, b, &v->l->v[i], line, depth + 1);
        }
        out_put(c, b, "]", 1, line);
        return;
    case V_DICT:
        out_put(c, b, "{", 1, line);
        for (size_t i = 0; i < v->d->n; i++) {
            if (i)
                out_put(c, b, ", ", 2, line);
            struct val k = vstr(v->d->k[i]);
            put_repr(c, b, &k, line, depth + 1);
            out_put(c, b, ": ", 2, line);
            put_repr(c, b, &v->d->v[i], line, depth + 1);
        }
        out_put(c, b, "}", 1, line);
        return;
    case V_FUNC:
    case V_MACRO:
        out_put(c, b, "<function>", 10, line);
        return;
    default:
        put_str(c, b, v, line);
        return;
    }
}

static struct jstr to_str(struct ctx *c, const struct val *v, int line)
{
    if (v->t == V_STR)
        return v->s;
    struct obuf b = {0};
    put_str(c, &b, v, line);
    return obuf_str(&b);
}

/* JSON as transformers' tojson writes it (json.dumps, ensure_ascii=False) */
static void put_json(struct ctx *c, struct obuf *b, const struct val *v, int indent, int depth,
                     int line)
{
    char buf[64];
    if (depth > 64)
        FAIL(c, line, KVR_ERR_OVERLOAD, "tojson: a value nested deeper than 64");
    switch (v->t) {
    case V_UNDEF:
    case V_NONE:
        out_put(c, b, "null", 4, line);
        return;
    case V_BOOL:
        out_put(c, b, v->b ? "true" : "false", v->b ? 4 : 5, line);
        return;
    case V_INT:
        snprintf(buf, sizeof(buf), "%lld", (long long)v->i);
        out_put(c, b, buf, strlen(buf), line);
        return;
    case V_FLOAT:
        if (isnan(v->f) || isinf(v->f)) {
            out_put(c, b,
                    isnan(v->f) ? "NaN"
                    : v->f > 0  ? "Infinity"
                                : "-Infinity",
                    isnan(v->f) ? 3
                    : v->f > 0  ? 8
                                : 9,
                    line);
            return;
        }
        fmt_float(v->f, buf, sizeof(buf));
        out_put(c, b, buf, strlen(buf), line);
        return;
    case V_STR: {
        out_put(c, b, "\"", 1, line);
        size_t run = 0;
        for (size_t i = 0; i < v->s.n; i++) {
            unsigned char ch = (unsigned char)v->s.p[i];
            const char *esc = NULL;
            char u[8];
            if (ch == '"')
                esc = "\\\"";
            else if (ch == '\\')
                esc = "\\\\";
            else if (ch == '\n')
                esc = "\\n";
            else if (ch == '\r')
                esc = "\\r";
            else if (ch == '\t')
                esc = "\\t";
            else if (ch == '\b')
                esc = "\\b";
            else if (ch == '\f')
                esc = "\\f";
            else if (ch < 0x20) {
                snprintf(u, sizeof(u), "\\u%04x", ch);
                esc = u;
            }
            if (esc) {
                out_put(c, b, v->s.p + run, i - run, line);
                out_put(c, b, esc, strlen(esc), line);
                run = i + 1;
            }
        }
        out_put(c, b, v->s.p + run, v->s.n - run, line);
        out_put(c, b, "\"", 1, line);
        return;
    }
    case V_LIST:
    case V_DICT: {
        bool is_list = v->t == V_LIST;
        size_t n = is_list ? v->l->n : v->d->n;
        out_put(c, b, is_list ? "[" : "{", 1, line);
        for (size_t i = 0; i < n; i++) {
            if (i)
                out_put(c, b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2, line);
            if (indent >= 0) {
                out_put(c, b, "\n", 1, line);
                for (int k = 0; k < indent * (depth + 1); k++)
                    out_put(c, b, " ", 1, line);
            }
            if (!is_list) {
                struct val k = vstr(v->d->k[i]);
                put_json(c, b, &k, indent, depth + 1, line);
                out_put(c, b, ": ", 2, line);
            }
            put_json(c, b, is_list ? &v->l->v[i] : &v->d->v[i], indent, depth + 1, line);
        }
        if (indent >= 0 && n) {
            out_put(c, b, "\n", 1, line);
            for (int k = 0; k < indent * depth; k++)
                out_put(c, b, " ", 1, line);
        }
        out_put(c, b, is_list ? "]" : "}", 1, line);
        return;
    }
    default:
        FAIL(c, line, KVR_ERR_INVALID, "tojson: a %s is not JSON", type_name(v));
    }
}

static bool equal(const struct val *a, const struct val *b, int depth)
{
    if (depth > 64)
        return false;
    bool an = a->t == V_INT || a->t == V_FLOAT || a->t == V_BOOL;
    bool bn = b->t == V_INT || b->t == V_FLOAT || b->t == V_BOOL;
    if (an && bn) {
        double x = a->t == V_INT ? (double)a->i : a->t == V_BOOL ? a->b : a->f;
        double y = b->t == V_INT ? (double)b->i : b->t == V_BOOL ? b->b : b->f;
        if (a->t == V_INT && b->t == V_INT)
            return a->i == b->i;
        return x == y;
    }
    if (a->t != b->t)
        return false;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE:
        return true;
    case V_STR:
        return jsame(a->s, b->s);
    case V_LIST:
        if (a->l->n != b->l->n)
            return false;
        for (size_t i = 0; i < a->l->n; i++)
            if (!equal(&a->l->v[i], &b->l->v[i], depth + 1))
                return false;
        return true;
    case V_DICT:
        if (a->d->n != b->d->n)
            return false;
        for (size_t i = 0; i < a->d->n; i++) {
            const struct val *o = dict_find(b->d, a->d->k[i]);
            if (!o || !equal(&a->d->v[i], o, depth + 1))
                return false;
        }
        return true;
    case V_FUNC:
        return a->fn == b->fn;
    case V_MACRO:
        return a->m == b->m;
    default:
        return false;
    }
}

static bool is_num(const struct val *v)
{
    return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL;
}

static double num(const struct val *v)
{
    return v->t == V_INT ? (double)v->i : v->t == V_BOOL ? (double)v->b : v->f;
}

static int compare(struct ctx *c, const struct val *a, const struct val *b, int line)
{
    if (is_num(a) && is_num(b)) {
        if (a->t == V_INT && b->t == V_INT)
            return a->i < b->i ? -1 : a->i > b->i;
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        int r = memcmp(a->s.p, b->s.p, n);
        return r ? (r < 0 ? -1 : 1) : a->s.n < b->s.n ? -1 : a->s.n > b->s.n;
    }
    FAIL(c, line, KVR_ERR_INVALID, "cannot compare a %s with a %s", type_name(a), type_name(b));
}

/* ---- UTF-8 helpers for string indexing ---- */

static size_t cp_count(struct jstr s)
{
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++)
        n += ((unsigned char)s.p[i] & 0xC0) != 0x80;
    return n;
}

/* byte offset of code point k */
static size_t cp_off(struct jstr s, size_t k)
{
    size_t i = 0;
    while (i < s.n && k) {
        i++;
        while (i < s.n && ((unsigned char)s.p[i] & 0xC0) == 0x80)
            i++;
        k--;
    }
    return i;
}

static struct jstr substr(struct jstr s, size_t a, size_t b)
{
    return (struct jstr){s.p + a, b - a};
}

static bool is_space_byte(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

/* Python str.strip family: chars NULL strips whitespace */
static struct jstr strip(struct jstr s, const struct jstr *chars, bool left, bool right)
{
    size_t a = 0, b = s.n;
    if (!chars) {
        while (left && a < b && is_space_byte(s.p[a]))
            a++;
        while (right && b > a && is_space_byte(s.p[b - 1]))
            b--;
    } else {
        /* code-point sets: compare whole UTF-8 sequences */
        for (bool again = true; again && left && a < b;) {
            again = false;
            for (size_t k = 0; k < chars->n;) {
                size_t l = 1;
                while (k + l < chars->n && ((unsigned char)chars->p[k + l] & 0xC0) == 0x80)
                    l++;
                if (b - a >= l && !memcmp(s.p + a, chars->p + k, l)) {
                    a += l;
                    again = true;
                    break;
                }
                k += l;
            }
        }
        for (bool again = true; again && right && b > a;) {
            again = false;
            for (size_t k = 0; k < chars->n;) {
                size_t l = 1;
                while (k + l < chars->n && ((unsigned char)chars->p[k + l] & 0xC0) == 0x80)
                    l++;
                if (b - a >= l && !memcmp(s.p + b - l, chars->p + k, l)) {
                    b -= l;
                    again = true;
                    break;
                }
                k += l;
            }
        }
    }
    return substr(s, a, b);
}

static const char *jmemmem(struct jstr h, struct jstr n)
{
    if (n.n == 0)
        return h.p;
    return memmem(h.p, h.n, n.p, n.n);
}

static struct jstr case_map(struct ctx *c, struct jstr s,
                            int mode /* 0 lower 1 upper 2 title 3 cap */)
{
    char *o = alloc(c, s.n + 1);
    bool word_start = true;
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.p[i];
        bool up;
        if (mode == 0)
            up = false;
        else if (mode == 1)
            up = true;
        else if (mode == 2)
            up = word_start;
        else
            up = i == 0;
        if (up && ch >= 'a' && ch <= 'z')
            ch = (char)(ch - 32);
        else if (!up && ch >= 'A' && ch <= 'Z' && mode != 1)
            ch = (char)(ch + 32);
        o[i] = ch;
        bool alpha =
            (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ((unsigned char)ch >= 0x80);
        word_start = !alpha && !(ch >= '0' && ch <= '9');
    }
    return (struct jstr){o, s.n};
}

static struct jstr concat(struct ctx *c, struct jstr a, struct jstr b, int line)
{
    if (a.n + b.n > c->max_out)
        FAIL(c, line, KVR_ERR_OVERLOAD, "a string would exceed %zu bytes (max_output)", c->max_out);
    char *p = alloc(c, a.n + b.n + 1);
    memcpy(p, a.p, a.n);
    memcpy(p + a.n, b.p, b.n);
    p[a.n + b.n] = 0;
    return (struct jstr){p, a.n + b.n};
}

/* ---- evaluation ---- */

static struct val eval(struct ctx *c, struct scope *s, const struct expr *e);
static int exec_body(struct ctx *c, struct scope *s, struct node **body, size_t n);

struct args {
    struct val *pos;
    size_t npos;
    const struct jstr *kwn;
    struct val *kw;
    size_t nkw;
};

static void eval_args(struct ctx *c, struct scope *s, const struct expr *e, struct args *a)
{
    a->npos = e->nargs;
    a->pos = e->nargs ? alloc(c, e->nargs * sizeof(struct val)) : NULL;
    for (size_t i = 0; i < e->nargs; i++)
        a->pos[i] = eval(c, s, e->args[i]);
    a->nkw = e->nkw;
    a->kwn = e->kwnames;
    a->kw = e->nkw ? alloc(c, e->nkw * sizeof(struct val)) : NULL;
    for (size_t i = 0; i < e->nkw; i++)
        a->kw[i] = eval(c, s, e->kwargs[i]);
}

/* argument i by position or by name; NULL when absent */
static const struct val *arg(const struct args *a, size_t i, const char *name)
{
    if (i < a->npos)
        return &a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (name && jeq(a->kwn[k], name))
            return &a->kw[k];
    return NULL;
}

static struct jstr arg_str(struct ctx *c, const struct args *a, size_t i, const char *name,
                           const char *what, int line)
{
    const struct val *v = arg(a, i, name);
    if (!v || v->t != V_STR)
        FAIL(c, line, KVR_ERR_INVALID, "%s: argument %zu (%s) must be a string", what, i + 1,
             name ? name : "");
    return v->s;
}

static struct val call_macro(struct ctx *c, struct macro *m, const struct args *a, int line);

/* iteration: the items a for loop or a filter walks */
static struct list *iter_items(struct ctx *c, const struct val *v, int line)
{
    if (v->t == V_LIST)
        return v->l;
    struct list *l;
    switch (v->t) {
    case V_UNDEF:
        return list_new(c, 1);
    case V_DICT:
        l = list_new(c, v->d->n);
        for (size_t i = 0; i < v->d->n; i++)
            list_add(c, l, vstr(v->d->k[i]));
        return l;
    case V_STR:
        l = list_new(c, v->s.n);
        for (size_t i = 0; i < v->s.n;) {
            size_t j = i + 1;
            while (j < v->s.n && ((unsigned char)v->s.p[j] & 0xC0) == 0x80)
                j++;
            list_add(c, l, vstr(substr(v->s, i, j)));
            i = j;
        }
        return l;
    default:
        FAIL(c, line, KVR_ERR_INVALID, "a %s is not iterable", type_name(v));
    }
}

static struct val items_of(struct ctx *c, const struct val *v, int line)
{
    if (v->t != V_DICT)
        FAIL(c, line, KVR_ERR_INVALID, "items() of a %s (a dict is needed)", type_name(v));
    struct list *l = list_new(c, v->d->n);
    for (size_t i = 0; i < v->d->n; i++) {
        struct list *p = list_new(c, 2);
        list_add(c, p, vstr(v->d->k[i]));
        list_add(c, p, v->d->v[i]);
        list_add(c, l, vlist(p));
    }
    return vlist(l);
}

static struct val attr_of(struct ctx *c, const struct val *v, struct jstr name, int line)
{
    if (v->t == V_DICT) {
        struct val *p = dict_find(v->d, name);
        return p ? *p : UNDEF;
    }
    if (v->t == V_UNDEF)
        FAIL(c, line, KVR_ERR_INVALID, "cannot read attribute \"%.*s\" of an undefined value",
             (int)name.n, name.p);
    if (v->t == V_NONE)
        FAIL(c, line, KVR_ERR_INVALID, "cannot read attribute \"%.*s\" of none", (int)name.n,
             name.p);
    return UNDEF;
}

static struct val index_of(struct ctx *c, const struct val *v, const struct val *ix, int line)
{
    if (v->t == V_DICT) {
        if (ix->t != V_STR)
            return UNDEF;
        struct val *p = dict_find(v->d, ix->s);
        return p ? *p : UNDEF;
    }
    if (v->t == V_LIST || v->t == V_STR) {
        if (ix->t != V_INT)
            FAIL(c, line, KVR_ERR_INVALID, "a %s index must be an integer, not a %s", type_name(v),
                 type_name(ix));
        int64_t n = v->t == V_LIST ? (int64_t)v->l->n : (int64_t)cp_count(v->s);
        int64_t i = ix->i < 0 ? ix->i + n : ix->i;
        if (i < 0 || i >= n)
            return UNDEF;
        if (v->t == V_LIST)
            return v->l->v[i];
        size_t a = cp_off(v->s, (size_t)i), b = cp_off(v->s, (size_t)i + 1);
        return vstr(substr(v->s, a, b));
    }
    if (v->t == V_UNDEF)
        FAIL(c, line, KVR_ERR_INVALID, "cannot index an undefined value");
    FAIL(c, line, KVR_ERR_INVALID, "cannot index a %s", type_name(v));
}

static struct val slice_of(struct ctx *c, const struct val *v, const struct val *a,
                           const struct val *b, const struct val *st, int line)
{
    if (v->t != V_LIST && v->t != V_STR)
        FAIL(c, line, KVR_ERR_INVALID, "cannot slice a %s", type_name(v));
    int64_t n = v->t == V_LIST ? (int64_t)v->l->n : (int64_t)cp_count(v->s);
    int64_t stp = st && st->t == V_INT ? st->i : 1;
    if (stp == 0)
        FAIL(c, line, KVR_ERR_INVALID, "slice step cannot be zero");
    int64_t lo, hi;
    if (stp > 0) {
        lo = a && a->t == V_INT ? a->i : 0;
        hi = b && b->t == V_INT ? b->i : n;
        if (lo < 0)
            lo = lo + n < 0 ? 0 : lo + n;
        if (hi < 0)
            hi = hi + n < 0 ? 0 : hi + n;
        if (lo > n)
            lo = n;
        if (hi > n)
            hi = n;
    } else {
        lo = a && a->t == V_INT ? a->i : n - 1;
        hi = b && b->t == V_INT ? b->i : -n - 1;
        if (lo < 0)
            lo = lo + n < -1 ? -1 : lo + n;
        if (hi < 0)
            hi = hi + n < -1 ? -1 : hi + n;
        if (lo >= n)
            lo = n - 1;
        if (hi >= n)
            hi = n - 1;
    }
    struct list *l = list_new(c, 4);
    for (int64_t i = lo; stp > 0 ? i < hi : i > hi; i += stp) {
        if (v->t == V_LIST)
            list_add(c, l, v->l->v[i]);
        else
            list_add(c, l,
                     vstr(substr(v->s, cp_off(v->s, (size_t)i), cp_off(v->s, (size_t)i + 1))));
    }
    if (v->t == V_LIST)
        return vlist(l);
    struct obuf o = {0};
    for (size_t i = 0; i < l->n; i++)
        out_put(c, &o, l->v[i].s.p, l->v[i].s.n, line);
    return vstr(obuf_str(&o));
}

static bool run_test(struct ctx *c, struct jstr name, const struct val *v, const struct args *a,
                     int line);

/* filters */
static struct val filter(struct ctx *c, struct jstr name, const struct val *v, const struct args *a,
                         int line)
{
#define IS(nm) jeq(name, nm)
    if (IS("trim")) {
        const struct val *ch = arg(a, 0, "chars");
        struct jstr s = to_str(c, v, line);
        return vstr(strip(s, ch && ch->t == V_STR ? &ch->s : NULL, true, true));
    }
    if (IS("tojson")) {
        const struct val *ind = arg(a, 0, "indent");
        struct obuf b = {0};
        put_json(c, &b, v, ind && ind->t == V_INT ? (int)ind->i : -1, 0, line);
        return vstr(obuf_str(&b));
    }
    if (IS("length") || IS("count")) {
        if (v->t == V_STR)
            return vint((int64_t)cp_count(v->s));
        if (v->t == V_LIST)
            return vint((int64_t)v->l->n);
        if (v->t == V_DICT)
            return vint((int64_t)v->d->n);
        if (v->t == V_UNDEF)
            return vint(0);
        FAIL(c, line, KVR_ERR_INVALID, "length of a %s", type_name(v));
    }
    if (IS("default") || IS("d")) {
        const struct val *dv = arg(a, 0, "default_value");
        const struct val *bo = arg(a, 1, "boolean");
        bool use = v->t == V_UNDEF || (bo && truthy(bo) && !truthy(v));
        return use ? (dv ? *dv : vcstr("")) : *v;
    }
    if (IS("items"))
        return items_of(c, v, line);
    if (IS("upper") || IS("lower") || IS("title") || IS("capitalize"))
        return vstr(case_map(c, to_str(c, v, line),
                             IS("lower")   ? 0
                             : IS("upper") ? 1
                             : IS("title") ? 2
                                           : 3));
    if (IS("string"))
        return vstr(to_str(c, v, line));
    if (IS("safe") || IS("e") || IS("escape")) {
        if (!IS("safe"))
            FAIL(c, line, KVR_ERR_UNSUPPORTED,
                 "the \"%.*s\" filter (HTML escaping) is not supported", (int)name.n, name.p);
        return *v;
    }
    if (IS("first") || IS("last")) {
        struct list *l = iter_items(c, v, line);
        if (!l->n)
            return UNDEF;
        return IS("first") ? l->v[0] : l->v[l->n - 1];
    }
    if (IS("list"))
        return vlist(iter_items(c, v, line));
    if (IS("reverse")) {
        if (v->t == V_STR) {
            struct val none = UNDEF, m1 = vint(-1);
            return slice_of(c, v, &none, &none, &m1, line);
        }
        struct list *l = iter_items(c, v, line), *r = list_new(c, l->n);
        for (size_t i = l->n; i-- > 0;)
            list_add(c, r, l->v[i]);
        return vlist(r);
    }
    if (IS("join")) {
        const struct val *sep = arg(a, 0, "d");
        const struct val *at = arg(a, 1, "attribute");
        struct list *l = iter_items(c, v, line);
        struct obuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i && sep && sep->t == V_STR)
                out_put(c, &b, sep->s.p, sep->s.n, line);
            struct val x = at && at->t == V_STR ? attr_of(c, &l->v[i], at->s, line) : l->v[i];
            put_str(c, &b, &x, line);
        }
        return vstr(obuf_str(&b));
    }
    if (IS("int")) {
        if (v->t == V_INT)
            return *v;
        if (v->t == V_FLOAT)
            return vint((int64_t)v->f);
        if (v->t == V_BOOL)
            return vint(v->b);
        if (v->t == V_STR) {
            char buf[64];
            size_t n = v->s.n < 63 ? v->s.n : 63;
            memcpy(buf, v->s.p, n);
            buf[n] = 0;
            char *end;
            long long x = strtoll(buf, &end, 10);
            return vint(end != buf ? x : 0);
        }
        return vint(0);
    }
    if (IS("float")) {
        if (is_num(v))
            return vfloat(num(v));
        if (v->t == V_STR) {
            char buf[64];
            size_t n = v->s.n < 63 ? v->s.n : 63;
            memcpy(buf, v->s.p, n);
            buf[n] = 0;
            return vfloat(strtod(buf, NULL));
        }
        return vfloat(0);
    }
    if (IS("abs")) {
        if (v->t == V_INT)
            return vint(v->i < 0 ? -v->i : v->i);
        if (v->t == V_FLOAT)
            return vfloat(fabs(v->f));
        FAIL(c, line, KVR_ERR_INVALID, "abs of a %s", type_name(v));
    }
    if (IS("replace")) {
        struct jstr s = to_str(c, v, line), old = arg_str(c, a, 0, "old", "replace", line),
                    nw = arg_str(c, a, 1, "new", "replace", line);
        const struct val *cnt = arg(a, 2, "count");
        int64_t left = cnt && cnt->t == V_INT ? cnt->i : -1;
        struct obuf b = {0};
        size_t i = 0;
        if (old.n == 0)
            return vstr(s);
        while (i < s.n) {
            const char *hit = left != 0 ? memmem(s.p + i, s.n - i, old.p, old.n) : NULL;
            if (!hit) {
                out_put(c, &b, s.p + i, s.n - i, line);
                break;
            }
            out_put(c, &b, s.p + i, (size_t)(hit - s.p) - i, line);
            out_put(c, &b, nw.p, nw.n, line);
            i = (size_t)(hit - s.p) + old.n;
            if (left > 0)
                left--;
        }
        return vstr(obuf_str(&b));
    }
    if (IS("indent")) {
        const struct val *w = arg(a, 0, "width");
        const struct val *first = arg(a, 1, "first");
        const struct val *blank = arg(a, 2, "blank");
        struct jstr pad = w && w->t == V_STR ? w->s : (struct jstr){"    ", 4};
        char sp[64];
        if (w && w->t == V_INT) {
            size_t n = w->i < 0 ? 0 : w->i > 63 ? 63 : (size_t)w->i;
            memset(sp, ' ', n);
            pad = (struct jstr){sp, n};
        }
        struct jstr s = to_str(c, v, line);
        struct obuf b = {0};
        bool at_start = true, is_first = true;
        for (size_t i = 0; i < s.n; i++) {
            if (at_start) {
                bool empty = s.p[i] == '\n';
                if ((!is_first || (first && truthy(first))) && (!empty || (blank && truthy(blank))))
                    out_put(c, &b, pad.p, pad.n, line);
                at_start = false;
                is_first = false;
            }
            out_put(c, &b, s.p + i, 1, line);
            if (s.p[i] == '\n')
                at_start = true;
        }
        return vstr(obuf_str(&b));
    }
    if (IS("map") || IS("selectattr") || IS("rejectattr") || IS("select") || IS("reject") ||
        IS("unique")) {
        struct list *l = iter_items(c, v, line), *r = list_new(c, l->n);
        if (IS("unique")) {
            for (size_t i = 0; i < l->n; i++) {
                bool seen = false;
                for (size_t k = 0; k < r->n && !seen; k++)
                    seen = equal(&r->v[k], &l->v[i], 0);
                if (!seen)
                    list_add(c, r, l->v[i]);
            }
            return vlist(r);
        }
        bool is_attr = IS("selectattr") || IS("rejectattr");
        bool keep_true = IS("select") || IS("selectattr");
        if (IS("map")) {
            const struct val *at = NULL;
            for (size_t k = 0; k < a->nkw; k++)
                if (jeq(a->kwn[k], "attribute"))
                    at = &a->kw[k];
            if (at && at->t == V_STR) {
                const struct val *dflt = NULL;
                for (size_t k = 0; k < a->nkw; k++)
                    if (jeq(a->kwn[k], "default"))
                        dflt = &a->kw[k];
                for (size_t i = 0; i < l->n; i++) {
                    struct val x = attr_of(c, &l->v[i], at->s, line);
                    list_add(c, r, x.t == V_UNDEF && dflt ? *dflt : x);
                }
                return vlist(r);
            }
            if (a->npos < 1 || a->pos[0].t != V_STR)
                FAIL(c, line, KVR_ERR_INVALID, "map needs a filter name or attribute=");
            struct args sub = {a->pos + 1, a->npos - 1, NULL, NULL, 0};
            for (size_t i = 0; i < l->n; i++)
                list_add(c, r, filter(c, a->pos[0].s, &l->v[i], &sub, line));
            return vlist(r);
        }
        size_t first_test = is_attr ? 1 : 0;
        if (is_attr && (a->npos < 1 || a->pos[0].t != V_STR))
            FAIL(c, line, KVR_ERR_INVALID, "%.*s needs an attribute name", (int)name.n, name.p);
        for (size_t i = 0; i < l->n; i++) {
            struct val x = is_attr ? attr_of(c, &l->v[i], a->pos[0].s, line) : l->v[i];
            bool ok;
            if (a->npos > first_test) {
                if (a->pos[first_test].t != V_STR)
                    FAIL(c, line, KVR_ERR_INVALID, "%.*s: the test name must be a string",
                         (int)name.n, name.p);
                struct args sub = {a->pos + first_test + 1, a->npos - first_test - 1, NULL, NULL,
                                   0};
                ok = run_test(c, a->pos[first_test].s, &x, &sub, line);
            } else {
                ok = truthy(&x);
            }
            if (ok == keep_true)
                list_add(c, r, l->v[i]);
        }
        return vlist(r);
    }
    if (IS("dictsort")) {
        if (v->t != V_DICT)
            FAIL(c, line, KVR_ERR_INVALID, "dictsort of a %s", type_name(v));
        struct val it = items_of(c, v, line);
        struct list *l = it.l;
        for (size_t i = 1; i < l->n; i++) /* insertion sort by key */
            for (size_t k = i;
                 k > 0 && compare(c, &l->v[k - 1].l->v[0], &l->v[k].l->v[0], line) > 0; k--) {
                struct val t = l->v[k];
                l->v[k] = l->v[k - 1];
                l->v[k - 1] = t;
            }
        return it;
    }
    if (IS("sum")) {
        struct list *l = iter_items(c, v, line);
        struct val acc = vint(0);
        for (size_t i = 0; i < l->n; i++) {
            if (!is_num(&l->v[i]))
                FAIL(c, line, KVR_ERR_INVALID, "sum of a %s", type_name(&l->v[i]));
            if (acc.t == V_INT && l->v[i].t != V_FLOAT)
                acc.i += l->v[i].t == V_INT ? l->v[i].i : l->v[i].b;
            else
                acc = vfloat(num(&acc) + num(&l->v[i]));
        }
        return acc;
    }
    if (IS("wordcount")) {
        struct jstr s = to_str(c, v, line);
        int64_t n = 0;
        bool in = false;
        for (size_t i = 0; i < s.n; i++) {
            bool sp = is_space_byte(s.p[i]);
            if (!sp && !in)
                n++;
            in = !sp;
        }
        return vint(n);
    }
    FAIL(c, line, KVR_ERR_UNSUPPORTED, "the \"%.*s\" filter is not supported", (int)name.n, name.p);
#undef IS
}

static bool run_test(struct ctx *c, struct jstr name, const struct val *v, const struct args *a,
                     int line)
{
#define IS(nm) jeq(name, nm)
    const struct val *x = arg(a, 0, NULL);
    if (IS("defined"))
        return v->t != V_UNDEF;
    if (IS("undefined"))
        return v->t == V_UNDEF;
    if (IS("none"))
        return v->t == V_NONE;
    if (IS("string"))
        return v->t == V_STR;
    if (IS("number"))
        return v->t == V_INT || v->t == V_FLOAT;
    if (IS("integer"))
        return v->t == V_INT;
    if (IS("float"))
        return v->t == V_FLOAT;
    if (IS("boolean"))
        return v->t == V_BOOL;
    if (IS("true"))
        return v->t == V_BOOL && v->b;
    if (IS("false"))
        return v->t == V_BOOL && !v->b;
    if (IS("mapping"))
        return v->t == V_DICT;
    if (IS("sequence"))
        return v->t == V_LIST || v->t == V_STR || v->t == V_DICT;
    if (IS("iterable"))
        return v->t == V_LIST || v->t == V_STR || v->t == V_DICT;
    if (IS("callable"))
        return v->t == V_FUNC || v->t == V_MACRO;
    if (IS("even") || IS("odd")) {
        if (v->t != V_INT)
            FAIL(c, line, KVR_ERR_INVALID, "\"is %.*s\" of a %s", (int)name.n, name.p,
                 type_name(v));
        return (v->i % 2 == 0) == IS("even");
    }
    if (IS("divisibleby")) {
        if (v->t != V_INT || !x || x->t != V_INT || x->i == 0)
            FAIL(c, line, KVR_ERR_INVALID, "divisibleby needs two integers (and not 0)");
        return v->i % x->i == 0;
    }
    if (IS("lower") || IS("upper")) {
        if (v->t != V_STR)
            return false;
        for (size_t i = 0; i < v->s.n; i++) {
            char ch = v->s.p[i];
            if (IS("lower") ? (ch >= 'A' && ch <= 'Z') : (ch >= 'a' && ch <= 'z'))
                return false;
        }
        return true;
    }
    if (x && (IS("eq") || IS("equalto") || IS("==")))
        return equal(v, x, 0);
    if (x && (IS("ne") || IS("!=")))
        return !equal(v, x, 0);
    if (x && (IS("lt") || IS("lessthan")))
        return compare(c, v, x, line) < 0;
    if (x && (IS("gt") || IS("greaterthan")))
        return compare(c, v, x, line) > 0;
    if (x && IS("le"))
        return compare(c, v, x, line) <= 0;
    if (x && IS("ge"))
        return compare(c, v, x, line) >= 0;
    if (x && IS("in")) {
        if (x->t == V_LIST) {
            for (size_t i = 0; i < x->l->n; i++)
                if (equal(v, &x->l->v[i], 0))
                    return true;
            return false;
        }
        if (x->t == V_STR && v->t == V_STR)
            return jmemmem(x->s, v->s) != NULL;
        if (x->t == V_DICT && v->t == V_STR)
            return dict_find(x->d, v->s) != NULL;
        return false;
    }
    FAIL(c, line, KVR_ERR_UNSUPPORTED, "the \"is %.*s\" test is not supported", (int)name.n,
         name.p);
#undef IS
}

static bool contains(struct ctx *c, const struct val *hay, const struct val *needle, int line)
{
    switch (hay->t) {
    case V_STR:
        if (needle->t != V_STR)
            FAIL(c, line, KVR_ERR_INVALID, "\"in <string>\" needs a string on the left, not a %s",
                 type_name(needle));
        return jmemmem(hay->s, needle->s) != NULL;
    case V_LIST:
        for (size_t i = 0; i < hay->l->n; i++)
            if (equal(needle, &hay->l->v[i], 0))
                return true;
        return false;
    case V_DICT:
        return needle->t == V_STR && dict_find(hay->d, needle->s) != NULL;
    case V_UNDEF:
        return false;
    default:
        FAIL(c, line, KVR_ERR_INVALID, "\"in\" a %s", type_name(hay));
    }
}

/* str / list / dict methods: returns false when obj has no such method */
static bool method(struct ctx *c, const struct val *obj, struct jstr name, const struct args *a,
                   int line, struct val *out)
{
#define IS(nm) jeq(name, nm)
    if (obj->t == V_STR) {
        struct jstr s = obj->s;
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            const struct val *ch = arg(a, 0, "chars");
            *out =
                vstr(strip(s, ch && ch->t == V_STR ? &ch->s : NULL, !IS("rstrip"), !IS("lstrip")));
            return true;
        }
        if (IS("startswith") || IS("endswith")) {
            const struct val *p = arg(a, 0, "prefix");
            bool r = false;
            struct list one = {1, 1, (struct val *)p};
            const struct list *cands = p && p->t == V_LIST ? p->l : &one;
            if (!p || (p->t != V_STR && p->t != V_LIST))
                FAIL(c, line, KVR_ERR_INVALID, "%.*s needs a string", (int)name.n, name.p);
            for (size_t i = 0; i < cands->n && !r; i++) {
                const struct val *x = &cands->v[i];
                if (x->t != V_STR)
                    continue;
                r = x->s.n <= s.n &&
                    !memcmp(IS("startswith") ? s.p : s.p + s.n - x->s.n, x->s.p, x->s.n);
            }
            *out = vbool(r);
            return true;
        }
        if (IS("split") || IS("rsplit")) {
            const struct val *sep = arg(a, 0, "sep");
            const struct val *mx = arg(a, 1, "maxsplit");
            int64_t left = mx && mx->t == V_INT ? mx->i : -1;
            struct list *l = list_new(c, 4);
            if (!sep || sep->t == V_NONE) { /* on whitespace runs */
                size_t i = 0;
                while (i < s.n) {
                    while (i < s.n && is_space_byte(s.p[i]))
                        i++;
                    if (i >= s.n)
                        break;
                    size_t j = i;
                    if (left == 0)
                        j = s.n;
                    else
                        while (j < s.n && !is_space_byte(s.p[j]))
                            j++;
                    list_add(c, l,
                             vstr(left == 0 ? strip(substr(s, i, j), NULL, false, true)
                                            : substr(s, i, j)));
                    if (left > 0)
                        left--;
                    i = j;
                }
                *out = vlist(l);
                return true;
            }
            if (sep->t != V_STR || sep->s.n == 0)
                FAIL(c, line, KVR_ERR_INVALID, "split: the separator must be a non-empty string");
            if (IS("rsplit") && left >= 0)
                FAIL(c, line, KVR_ERR_UNSUPPORTED, "rsplit with maxsplit is not supported");
            size_t i = 0;
            for (;;) {
                step(c, line);
                const char *hit = left != 0 ? jmemmem(substr(s, i, s.n), sep->s) : NULL;
                if (!hit) {
                    list_add(c, l, vstr(substr(s, i, s.n)));
                    break;
                }
                list_add(c, l, vstr(substr(s, i, (size_t)(hit - s.p))));
                i = (size_t)(hit - s.p) + sep->s.n;
                if (left > 0)
                    left--;
            }
            *out = vlist(l);
            return true;
        }
        if (IS("upper") || IS("lower") || IS("title") || IS("capitalize")) {
            *out = vstr(case_map(c, s, IS("lower") ? 0 : IS("upper") ? 1 : IS("title") ? 2 : 3));
            return true;
        }
        if (IS("replace")) {
            *out = filter(c, name, obj, a, line);
            return true;
        }
        if (IS("find") || IS("count")) {
            struct jstr n = arg_str(c, a, 0, "sub", "find", line);
            if (IS("find")) {
                const char *h = jmemmem(s, n);
                *out = vint(h ? (int64_t)cp_count(substr(s, 0, (size_t)(h - s.p))) : -1);
            } else {
                int64_t k = 0;
                for (size_t i = 0; n.n && i + n.n <= s.n;) {
                    const char *h = memmem(s.p + i, s.n - i, n.p, n.n);
                    if (!h)
                        break;
                    k++;
                    i = (size_t)(h - s.p) + n.n;
                }
                *out = vint(k);
            }
            return true;
        }
        if (IS("join")) {
            const struct val *it = arg(a, 0, "iterable");
            if (!it)
                FAIL(c, line, KVR_ERR_INVALID, "join needs a list");
            struct list *l = iter_items(c, it, line);
            struct obuf b = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (i)
                    out_put(c, &b, s.p, s.n, line);
                put_str(c, &b, &l->v[i], line);
            }
            *out = vstr(obuf_str(&b));
            return true;
        }
        if (IS("isdigit") || IS("isalpha") || IS("isspace")) {
            bool r = s.n > 0;
            for (size_t i = 0; i < s.n && r; i++) {
                char ch = s.p[i];
                r = IS("isdigit")   ? (ch >= '0' && ch <= '9')
                    : IS("isalpha") ? ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z')
                                    : is_space_byte(ch);
            }
            *out = vbool(r);
            return true;
        }
        return false;
    }
    if (obj->t == V_DICT) {
        if (IS("items")) {
            *out = items_of(c, obj, line);
            return true;
        }
        if (IS("keys") || IS("values")) {
            struct list *l = list_new(c, obj->d->n);
            for (size_t i = 0; i < obj->d->n; i++)
                list_add(c, l, IS("keys") ? vstr(obj->d->k[i]) : obj->d->v[i]);
            *out = vlist(l);
            return true;
        }
        if (IS("get")) {
            const struct val *k = arg(a, 0, "key");
            const struct val *d = arg(a, 1, "default");
            struct val *p = k && k->t == V_STR ? dict_find(obj->d, k->s) : NULL;
            *out = p ? *p : d ? *d : (struct val){.t = V_NONE};
            return true;
        }
        return false;
    }
    if (obj->t == V_LIST) {
        if (IS("append")) {
            if (a->npos != 1)
                FAIL(c, line, KVR_ERR_INVALID, "append takes one argument");
            list_add(c, obj->l, a->pos[0]);
            *out = (struct val){.t = V_NONE};
            return true;
        }
        if (IS("index")) {
            const struct val *x = arg(a, 0, NULL);
            for (size_t i = 0; x && i < obj->l->n; i++)
                if (equal(x, &obj->l->v[i], 0)) {
                    *out = vint((int64_t)i);
                    return true;
                }
            FAIL(c, line, KVR_ERR_INVALID, "index: the value is not in the list");
        }
        return false;
    }
    return false;
#undef IS
}

static struct val call_fn(struct ctx *c, const struct val *f, const struct args *a, int line)
{
    if (f->t == V_MACRO)
        return call_macro(c, f->m, a, line);
    if (f->t != V_FUNC)
        FAIL(c, line, KVR_ERR_INVALID, "a %s is not callable", type_name(f));
    switch (f->fn) {
    case FN_RANGE: {
        int64_t lo = 0, hi, st = 1;
        for (size_t i = 0; i < a->npos; i++)
            if (a->pos[i].t != V_INT)
                FAIL(c, line, KVR_ERR_INVALID, "range needs integers");
        if (a->npos == 1)
            hi = a->pos[0].i;
        else if (a->npos == 2 || a->npos == 3) {
            lo = a->pos[0].i;
            hi = a->pos[1].i;
            if (a->npos == 3)
                st = a->pos[2].i;
        } else
            FAIL(c, line, KVR_ERR_INVALID, "range takes 1 to 3 arguments");
        if (st == 0)
            FAIL(c, line, KVR_ERR_INVALID, "range step cannot be zero");
        /* the list is made whole: refuse one longer than the step budget */
        double count = ((double)hi - (double)lo) / (double)st;
        if (count > (double)(c->max_steps - c->steps))
            FAIL(c, line, KVR_ERR_OVERLOAD,
                 "range of %.0f items exceeds the template's %llu steps (max_steps)", count,
                 (unsigned long long)c->max_steps);
        struct list *l = list_new(c, 8);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
            step(c, line);
            list_add(c, l, vint(i));
        }
        return vlist(l);
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        struct dict *d = dict_new(c, a->nkw + 1);
        d->ns = f->fn == FN_NAMESPACE;
        if (a->npos == 1 && a->pos[0].t == V_DICT)
            for (size_t i = 0; i < a->pos[0].d->n; i++)
                dict_set(c, d, a->pos[0].d->k[i], a->pos[0].d->v[i]);
        for (size_t i = 0; i < a->nkw; i++)
            dict_set(c, d, a->kwn[i], a->kw[i]);
        return vdict(d);
    }
    case FN_RAISE: {
        struct jstr m = a->npos ? to_str(c, &a->pos[0], line) : (struct jstr){"", 0};
        FAIL(c, line, KVR_ERR_INVALID, "the template raised an exception: %.*s",
             (int)(m.n > 300 ? 300 : m.n), m.p);
    }
    case FN_STRFTIME: {
        struct jstr fmt = arg_str(c, a, 0, "format", "strftime_now", line);
        char f0[256], buf[512];
        size_t n = fmt.n < sizeof(f0) - 1 ? fmt.n : sizeof(f0) - 1;
        memcpy(f0, fmt.p, n);
        f0[n] = 0;
        time_t t = c->o && c->o->now ? (time_t)c->o->now : time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        size_t l = strftime(buf, sizeof(buf), f0, &tm);
        char *p = alloc(c, l + 1);
        memcpy(p, buf, l + 1);
        return vstr((struct jstr){p, l});
    }
    case FN_CYCLE: {
        if (!a->npos)
            return UNDEF;
        return a->pos[f->aux % (int64_t)a->npos];
    }
    }
    return UNDEF;
}

static struct val call_macro(struct ctx *c, struct macro *m, const struct args *a, int line)
{
    if (++c->call_depth > MAX_CALL_DEPTH)
        FAIL(c, line, KVR_ERR_OVERLOAD, "macro calls nested deeper than %d (endless recursion?)",
             MAX_CALL_DEPTH);
    const struct node *d = m->def;
    struct scope *s = scope_new(c, m->closure);
    if (a->npos > d->nvars)
        FAIL(c, line, KVR_ERR_INVALID, "macro %.*s takes %zu arguments, %zu given", (int)d->text.n,
             d->text.p, d->nvars, a->npos);
    for (size_t i = 0; i < d->nvars; i++) {
        struct val v = UNDEF;
        bool got = false;
        if (i < a->npos) {
            v = a->pos[i];
            got = true;
        }
        for (size_t k = 0; k < a->nkw; k++)
            if (jsame(a->kwn[k], d->vars[i])) {
                v = a->kw[k];
                got = true;
            }
        if (!got && d->defaults && d->defaults[i])
            v = eval(c, m->closure, d->defaults[i]);
        scope_set(c, s, d->vars[i], v);
    }
    if (m->caller.t != V_UNDEF)
        scope_set(c, s, (struct jstr){"caller", 6}, m->caller);
    struct obuf *saved = c->out, b = {0};
    c->out = &b;
    exec_body(c, s, d->body, d->nbody);
    c->out = saved;
    c->call_depth--;
    return vstr(obuf_str(&b));
}

static struct val arith(struct ctx *c, int op, const struct val *x, const struct val *y, int line)
{
    if (op == B_CONCAT)
        return vstr(concat(c, to_str(c, x, line), to_str(c, y, line), line));
    if (op == B_ADD) {
        if (x->t == V_STR && y->t == V_STR)
            return vstr(concat(c, x->s, y->s, line));
        if (x->t == V_LIST && y->t == V_LIST) {
            struct list *l = list_new(c, x->l->n + y->l->n);
            for (size_t i = 0; i < x->l->n; i++)
                list_add(c, l, x->l->v[i]);
            for (size_t i = 0; i < y->l->n; i++)
                list_add(c, l, y->l->v[i]);
            return vlist(l);
        }
    }
    if (op == B_MUL && ((x->t == V_STR && y->t == V_INT) || (x->t == V_INT && y->t == V_STR))) {
        struct jstr s = x->t == V_STR ? x->s : y->s;
        int64_t k = x->t == V_INT ? x->i : y->i;
        struct obuf b = {0};
        if (k > 0 && s.n && (uint64_t)k > c->max_out / s.n)
            FAIL(c, line, KVR_ERR_OVERLOAD, "a string would exceed %zu bytes (max_output)",
                 c->max_out);
        for (int64_t i = 0; i < k; i++)
            out_put(c, &b, s.p, s.n, line);
        return vstr(obuf_str(&b));
    }
    if (op == B_MOD && x->t == V_STR)
        FAIL(c, line, KVR_ERR_UNSUPPORTED, "%%-formatting of strings is not supported");
    if (!is_num(x) || !is_num(y))
        FAIL(c, line, KVR_ERR_INVALID,
             "unsupported operand types for an arithmetic operator: %s and %s", type_name(x),
             type_name(y));
    bool ints = x->t != V_FLOAT && y->t != V_FLOAT;
    int64_t a = x->t == V_INT ? x->i : x->t == V_BOOL ? x->b : 0;
    int64_t b = y->t == V_INT ? y->i : y->t == V_BOOL ? y->b : 0;
    double fa = num(x), fb = num(y);
    switch (op) {
    case B_ADD:
        return ints ? vint(a + b) : vfloat(fa + fb);
    case B_SUB:
        return ints ? vint(a - b) : vfloat(fa - fb);
    case B_MUL:
        return ints ? vint(a * b) : vfloat(fa * fb);
    case B_DIV:
        if (fb == 0)
            FAIL(c, line, KVR_ERR_INVALID, "division by zero");
        return vfloat(fa / fb);
    case B_FLOORDIV:
    case B_MOD:
        if (fb == 0)
            FAIL(c, line, KVR_ERR_INVALID, "division by zero");
        if (ints) {
            int64_t q = a / b, r = a % b;
            if (r && ((r < 0) != (b < 0))) {
                q--;
                r += b;
            }
            return op == B_MOD ? vint(r) : vint(q);
        } else {
            double q = floor(fa / fb);
            return op == B_MOD ? vfloat(fa - q * fb) : vfloat(q);
        }
    case B_POW:
        if (ints && b >= 0) {
            int64_t r = 1;
            for (int64_t i = 0; i < b && i < 64; i++)
                r *= a;
            return vint(r);
        }
        return vfloat(pow(fa, fb));
    default:
        return UNDEF;
    }
}

static struct val eval(struct ctx *c, struct scope *s, const struct expr *e)
{
    step(c, e->line);
    if (++c->eval_depth > MAX_EVAL_DEPTH)
        FAIL(c, e->line, KVR_ERR_OVERLOAD, "expressions nested deeper than %d", MAX_EVAL_DEPTH);
    struct val r = UNDEF;
    switch (e->k) {
    case E_STR:
        r = vstr(e->s);
        break;
    case E_INT:
        r = vint(e->i);
        break;
    case E_FLOAT:
        r = vfloat(e->f);
        break;
    case E_BOOL:
        r = vbool(e->i != 0);
        break;
    case E_NONE:
        r = (struct val){.t = V_NONE};
        break;
    case E_NAME: {
        struct val *p = scope_find(s, e->s);
        r = p ? *p : UNDEF;
        break;
    }
    case E_ATTR: {
        struct val o = eval(c, s, e->a);
        r = attr_of(c, &o, e->s, e->line);
        break;
    }
    case E_INDEX: {
        struct val o = eval(c, s, e->a), ix = eval(c, s, e->b);
        r = index_of(c, &o, &ix, e->line);
        break;
    }
    case E_SLICE: {
        struct val o = eval(c, s, e->a);
        struct val a = e->b ? eval(c, s, e->b) : UNDEF, b = e->c ? eval(c, s, e->c) : UNDEF,
                   st = e->args[0] ? eval(c, s, e->args[0]) : UNDEF;
        r = slice_of(c, &o, &a, &b, &st, e->line);
        break;
    }
    case E_CALL: {
        struct args a;
        if (e->a->k == E_ATTR) {
            struct val o = eval(c, s, e->a->a);
            eval_args(c, s, e, &a);
            if (method(c, &o, e->a->s, &a, e->line, &r))
                break;
            struct val f = attr_of(c, &o, e->a->s, e->line);
            if (f.t == V_UNDEF)
                FAIL(c, e->line, KVR_ERR_UNSUPPORTED, "a %s has no method \"%.*s\"", type_name(&o),
                     (int)e->a->s.n, e->a->s.p);
            r = call_fn(c, &f, &a, e->line);
            break;
        }
        struct val f = eval(c, s, e->a);
        eval_args(c, s, e, &a);
        if (f.t == V_UNDEF && e->a->k == E_NAME)
            FAIL(c, e->line, KVR_ERR_UNSUPPORTED, "\"%.*s\" is not defined (no such function)",
                 (int)e->a->s.n, e->a->s.p);
        r = call_fn(c, &f, &a, e->line);
        break;
    }
    case E_FILTER: {
        struct val v = eval(c, s, e->a);
        struct args a;
        eval_args(c, s, e, &a);
        r = filter(c, e->s, &v, &a, e->line);
        break;
    }
    case E_TEST: {
        struct val v = eval(c, s, e->a);
        struct args a;
        eval_args(c, s, e, &a);
        bool t = run_test(c, e->s, &v, &a, e->line);
        r = vbool(e->i ? !t : t);
        break;
    }
    case E_NOT: {
        struct val v = eval(c, s, e->a);
        r = vbool(!truthy(&v));
        break;
    }
    case E_NEG:
    case E_POS: {
        struct val v = eval(c, s, e->a);
        if (v.t == V_INT)
            r = vint(e->k == E_NEG ? -v.i : v.i);
        else if (v.t == V_FLOAT)
            r = vfloat(e->k == E_NEG ? -v.f : v.f);
        else
            FAIL(c, e->line, KVR_ERR_INVALID, "unary %c of a %s", e->k == E_NEG ? '-' : '+',
                 type_name(&v));
        break;
    }
    case E_AND: {
        struct val a = eval(c, s, e->a);
        r = truthy(&a) ? eval(c, s, e->b) : a;
        break;
    }
    case E_OR: {
        struct val a = eval(c, s, e->a);
        r = truthy(&a) ? a : eval(c, s, e->b);
        break;
    }
    case E_COND: {
        struct val cond = eval(c, s, e->a);
        r = truthy(&cond) ? eval(c, s, e->b) : e->c ? eval(c, s, e->c) : UNDEF;
        break;
    }
    case E_BIN: {
        struct val a = eval(c, s, e->a), b = eval(c, s, e->b);
        switch (e->i) {
        case B_EQ:
            r = vbool(equal(&a, &b, 0));
            break;
        case B_NE:
            r = vbool(!equal(&a, &b, 0));
            break;
        case B_LT:
            r = vbool(compare(c, &a, &b, e->line) < 0);
            break;
        case B_LE:
            r = vbool(compare(c, &a, &b, e->line) <= 0);
            break;
        case B_GT:
            r = vbool(compare(c, &a, &b, e->line) > 0);
            break;
        case B_GE:
            r = vbool(compare(c, &a, &b, e->line) >= 0);
            break;
        case B_IN:
            r = vbool(contains(c, &b, &a, e->line));
            break;
        case B_NOTIN:
            r = vbool(!contains(c, &b, &a, e->line));
            break;
        default:
            r = arith(c, (int)e->i, &a, &b, e->line);
            break;
        }
        break;
    }
    case E_LIST:
    case E_TUPLE: {
        struct list *l = list_new(c, e->nargs);
        for (size_t i = 0; i < e->nargs; i++)
            list_add(c, l, eval(c, s, e->args[i]));
        r = vlist(l);
        break;
    }
    case E_DICT: {
        struct dict *d = dict_new(c, e->nargs);
        for (size_t i = 0; i < e->nargs; i++) {
            struct val k = eval(c, s, e->args[i]);
            if (k.t != V_STR)
                FAIL(c, e->line, KVR_ERR_UNSUPPORTED, "dict keys must be strings, not %s",
                     type_name(&k));
            dict_set(c, d, k.s, eval(c, s, e->kwargs[i]));
        }
        r = vdict(d);
        break;
    }
    }
    c->eval_depth--;
    return r;
}

/* ---- statements ---- */

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static void assign_unpack(struct ctx *c, struct scope *s, const struct jstr *vars, size_t n,
                          const struct val *v, int line)
{
    if (n == 1) {
        scope_set(c, s, vars[0], *v);
        return;
    }
    if (v->t != V_LIST || v->l->n != n)
        FAIL(c, line, KVR_ERR_INVALID, "cannot unpack a %s into %zu names", type_name(v), n);
    for (size_t i = 0; i < n; i++)
        scope_set(c, s, vars[i], v->l->v[i]);
}

static int exec_for(struct ctx *c, struct scope *s, const struct node *n)
{
    struct val it = eval(c, s, n->e);
    struct list *items = iter_items(c, &it, n->line);
    struct scope *ls = scope_new(c, s);
    if (n->cond) { /* the loop filter runs before loop.* is known */
        struct list *kept = list_new(c, items->n);
        for (size_t i = 0; i < items->n; i++) {
            assign_unpack(c, ls, n->vars, n->nvars, &items->v[i], n->line);
            struct val ok = eval(c, ls, n->cond);
            if (truthy(&ok))
                list_add(c, kept, items->v[i]);
        }
        items = kept;
    }
    size_t len = items->n;
    for (size_t i = 0; i < len; i++) {
        step(c, n->line);
        assign_unpack(c, ls, n->vars, n->nvars, &items->v[i], n->line);
        struct dict *loop = dict_new(c, 12);
        dict_set(c, loop, (struct jstr){"index", 5}, vint((int64_t)i + 1));
        dict_set(c, loop, (struct jstr){"index0", 6}, vint((int64_t)i));
        dict_set(c, loop, (struct jstr){"revindex", 8}, vint((int64_t)(len - i)));
        dict_set(c, loop, (struct jstr){"revindex0", 9}, vint((int64_t)(len - i - 1)));
        dict_set(c, loop, (struct jstr){"first", 5}, vbool(i == 0));
        dict_set(c, loop, (struct jstr){"last", 4}, vbool(i == len - 1));
        dict_set(c, loop, (struct jstr){"length", 6}, vint((int64_t)len));
        dict_set(c, loop, (struct jstr){"previtem", 8}, i ? items->v[i - 1] : UNDEF);
        dict_set(c, loop, (struct jstr){"nextitem", 8}, i + 1 < len ? items->v[i + 1] : UNDEF);
        dict_set(c, loop, (struct jstr){"cycle", 5}, vfn(FN_CYCLE, (int64_t)i));
        scope_set(c, ls, (struct jstr){"loop", 4}, vdict(loop));
        int fl = exec_body(c, ls, n->body, n->nbody);
        if (fl == FLOW_BREAK)
            break;
    }
    if (len == 0 && n->norelse)
        return exec_body(c, s, n->orelse, n->norelse);
    return FLOW_NEXT;
}

static int exec_node(struct ctx *c, struct scope *s, const struct node *n)
{
    step(c, n->line);
    switch (n->k) {
    case N_TEXT:
        out_put(c, c->out, n->text.p, n->text.n, n->line);
        return FLOW_NEXT;
    case N_OUT: {
        struct val v = eval(c, s, n->e);
        put_str(c, c->out, &v, n->line);
        return FLOW_NEXT;
    }
    case N_IF: {
        struct val v = eval(c, s, n->e);
        if (truthy(&v))
            return exec_body(c, s, n->body, n->nbody);
        return exec_body(c, s, n->orelse, n->norelse);
    }
    case N_FOR:
        return exec_for(c, s, n);
    case N_SET: {
        struct val v = eval(c, s, n->e);
        if (n->attr.n) {
            struct val *ns = scope_find(s, n->text);
            if (!ns || ns->t != V_DICT || !ns->d->ns)
                FAIL(c, n->line, KVR_ERR_INVALID,
                     "set %.*s.%.*s: %.*s is not a namespace() (only namespaces take attributes)",
                     (int)n->text.n, n->text.p, (int)n->attr.n, n->attr.p, (int)n->text.n,
                     n->text.p);
            dict_set(c, ns->d, n->attr, v);
        } else if (n->nvars) {
            assign_unpack(c, s, n->vars, n->nvars, &v, n->line);
        } else {
            scope_set(c, s, n->text, v);
        }
        return FLOW_NEXT;
    }
    case N_SETBLOCK: {
        struct obuf *saved = c->out, b = {0};
        c->out = &b;
        exec_body(c, s, n->body, n->nbody);
        c->out = saved;
        scope_set(c, s, n->text, vstr(obuf_str(&b)));
        return FLOW_NEXT;
    }
    case N_MACRO: {
        struct macro *m = alloc(c, sizeof(*m));
        m->def = n;
        m->closure = s;
        m->caller = UNDEF;
        struct val v = {.t = V_MACRO};
        v.m = m;
        scope_set(c, s, n->text, v);
        return FLOW_NEXT;
    }
    case N_CALLBLOCK: {
        const struct expr *call = n->e;
        struct val f = eval(c, s, call->a);
        if (f.t != V_MACRO)
            FAIL(c, n->line, KVR_ERR_INVALID, "{%% call %%} of a %s (a macro is needed)",
                 type_name(&f));
        struct macro *caller = alloc(c, sizeof(*caller));
        caller->def = n;
        caller->closure = s;
        caller->caller = UNDEF;
        struct macro *m = alloc(c, sizeof(*m));
        *m = *f.m;
        m->caller = (struct val){.t = V_MACRO};
        m->caller.m = caller;
        struct args a;
        eval_args(c, s, call, &a);
        struct val r = call_macro(c, m, &a, n->line);
        put_str(c, c->out, &r, n->line);
        return FLOW_NEXT;
    }
    case N_BREAK:
        return FLOW_BREAK;
    case N_CONTINUE:
        return FLOW_CONTINUE;
    case N_BLOCK:
        return exec_body(c, s, n->body, n->nbody);
    }
    return FLOW_NEXT;
}

static int exec_body(struct ctx *c, struct scope *s, struct node **body, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int fl = exec_node(c, s, body[i]);
        if (fl != FLOW_NEXT)
            return fl;
    }
    return FLOW_NEXT;
}

/* ---- API ---- */

static void set_err(char *err, size_t err_len, const char *msg)
{
    if (err && err_len)
        snprintf(err, err_len, "%s", msg);
}

kvr_status_t kvr_chat_template_new(const char *src, size_t len, kvr_chat_template_t **tpl_p,
                                   char *err, size_t err_len)
{
    if (!src || !tpl_p)
        return KVR_ERR_INVALID;
    kvr_chat_template_t *t = calloc(1, sizeof(*t));
    if (!t)
        return KVR_ERR_NO_MEMORY;
    t->arena.limit = 64u << 20;
    struct jfail f;
    /* the arena keeps the source's strings: copy it in first */
    if (setjmp(f.jb)) {
        set_err(err, err_len, f.msg);
        kvr_chat_arena_free(&t->arena);
        free(t);
        return f.st;
    }
    char *copy = kvr_chat_alloc(&t->arena, &f, len + 1);
    memcpy(copy, src, len);
    copy[len] = 0;
    kvr_chat_parse(t, copy, len, &f);
    *tpl_p = t;
    return KVR_OK;
}

void kvr_chat_template_destroy(kvr_chat_template_t *t)
{
    if (!t)
        return;
    kvr_chat_arena_free(&t->arena);
    free(t);
}

/* the render proper; errors leave through c->f */
static void render(struct ctx *c, const kvr_chat_template_t *t, const kvr_json_t *messages,
                   struct obuf *b)
{
    const struct kvr_chat_options *o = c->o;
    struct scope *g = scope_new(c, NULL);
    scope_set(c, g, (struct jstr){"messages", 8},
              messages ? from_json(c, messages) : vlist(list_new(c, 1)));
    scope_set(c, g, (struct jstr){"add_generation_prompt", 21}, vbool(o->add_generation_prompt));
    scope_set(c, g, (struct jstr){"bos_token", 9}, vcstr(o->bos_token ? o->bos_token : ""));
    scope_set(c, g, (struct jstr){"eos_token", 9}, vcstr(o->eos_token ? o->eos_token : ""));
    if (o->tools)
        scope_set(c, g, (struct jstr){"tools", 5}, from_json(c, o->tools));
    if (o->documents)
        scope_set(c, g, (struct jstr){"documents", 9}, from_json(c, o->documents));
    if (o->extra && o->extra->type == KVR_JSON_OBJECT)
        for (size_t i = 0; i < o->extra->n; i++)
            scope_set(c, g, (struct jstr){o->extra->keys[i], o->extra->key_lens[i]},
                      from_json(c, o->extra->items[i]));
    scope_set(c, g, (struct jstr){"range", 5}, vfn(FN_RANGE, 0));
    scope_set(c, g, (struct jstr){"namespace", 9}, vfn(FN_NAMESPACE, 0));
    scope_set(c, g, (struct jstr){"raise_exception", 15}, vfn(FN_RAISE, 0));
    scope_set(c, g, (struct jstr){"strftime_now", 12}, vfn(FN_STRFTIME, 0));
    scope_set(c, g, (struct jstr){"dict", 4}, vfn(FN_DICT, 0));
    c->out = b;
    exec_body(c, scope_new(c, g), t->body, t->nbody);
}

kvr_status_t kvr_chat_template_render(const kvr_chat_template_t *t, const kvr_json_t *messages,
                                      const struct kvr_chat_options *opts, char **out_p,
                                      size_t *len_p, char *err, size_t err_len)
{
    static const struct kvr_chat_options dflt;
    if (!t || !out_p)
        return KVR_ERR_INVALID;
    struct ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return KVR_ERR_NO_MEMORY;
    c->o = opts ? opts : &dflt;
    c->max_out = c->o->max_output ? c->o->max_output : 4u << 20;
    c->max_steps = c->o->max_steps ? c->o->max_steps : 10000000;
    c->a.limit = c->o->max_memory ? c->o->max_memory : 256u << 20;
    struct obuf *b = calloc(1, sizeof(*b));
    if (!b) {
        free(c);
        return KVR_ERR_NO_MEMORY;
    }
    kvr_status_t st = KVR_OK;
    if (setjmp(c->f.jb) == 0) {
        render(c, t, messages, b);
        char *res = malloc(b->n + 1);
        if (res) {
            if (b->n)
                memcpy(res, b->p, b->n);
            res[b->n] = 0;
            *out_p = res;
            if (len_p)
                *len_p = b->n;
        }
        c->f.st = res ? KVR_OK : KVR_ERR_NO_MEMORY;
    } else {
        set_err(err, err_len, c->f.msg);
    }
    st = c->f.st;
    kvr_chat_arena_free(&c->a);
    free(b);
    free(c);
    return st;
}

kvr_status_t kvr_chat_render(const char *tmpl, size_t tmpl_len, const kvr_json_t *messages,
                             const struct kvr_chat_options *opts, char **out_p, size_t *len_p,
                             char *err, size_t err_len)
{
    kvr_chat_template_t *t;
    kvr_status_t st = kvr_chat_template_new(tmpl, tmpl_len, &t, err, err_len);
    if (st != KVR_OK)
        return st;
    st = kvr_chat_template_render(t, messages, opts, out_p, len_p, err, err_len);
    kvr_chat_template_destroy(t);
    return st;
}
