/*
 * chat_parse.c - the chat template's Jinja source into a syntax tree.
 *
 * Lexing: the template is cut into text and tags ({{ }}, {% %}, {# #});
 * whitespace control is applied to the text as Hugging Face renders chat
 * templates: "-" inside a tag strips all whitespace on that side,
 * trim_blocks drops the newline right after a block or comment tag, and
 * lstrip_blocks drops spaces and tabs between the start of a line and a
 * block or comment tag.  The inside of a tag becomes names, numbers, string
 * literals (Python escapes) and operators.
 *
 * Parsing: recursive descent, with Jinja's precedence (conditional
 * expression, or, and, not, comparisons / in / is, ~, + -, * / // %, unary
 * -, **, then postfix .attr [index] [a:b:c] (call) |filter).  Statement
 * bodies nest by their end tags.  Every error names the line and the
 * construct; nesting is bounded (128), so a hostile template cannot
 * exhaust the stack.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"
#include "tokenizer_unicode.h"

enum { MAX_DEPTH = 128 };

enum tk {
    TK_TEXT,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STR,
    TK_INT,
    TK_FLOAT,
    TK_OP,
    TK_EOF,
};

struct token {
    enum tk k;
    int line;
    struct jstr s; /* text, name, string value, operator */
    int64_t i;
    double f;
};

struct parser {
    struct arena *a;
    struct jfail *f;
    struct token *t;
    size_t n, cap, pos;
    int depth;
};

/* ---- arena and errors ---- */

void *kvr_chat_alloc(struct arena *a, struct jfail *f, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct arena_blk *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->limit && a->total + cap > a->limit)
            kvr_chat_fail(f, KVR_ERR_OVERLOAD,
                          "the template needs more than %zu bytes of memory (max_memory)",
                          a->limit);
        b = malloc(sizeof(*b) + cap);
        if (!b)
            kvr_chat_fail(f, KVR_ERR_NO_MEMORY, "out of memory");
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
        a->total += cap;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

void kvr_chat_arena_free(struct arena *a)
{
    for (struct arena_blk *b = a->head, *nb; b; b = nb) {
        nb = b->next;
        free(b);
    }
    a->head = NULL;
    a->total = 0;
}

void kvr_chat_fail(struct jfail *f, kvr_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
    va_end(ap);
    f->st = st;
    longjmp(f->jb, 1);
}

/* ---- lexing ---- */

static void push(struct parser *P, struct token t)
{
    if (P->n == P->cap) {
        size_t cap = P->cap ? P->cap * 2 : 256;
        struct token *nt = kvr_chat_alloc(P->a, P->f, cap * sizeof(*nt));
        if (P->n)
            memcpy(nt, P->t, P->n * sizeof(*nt));
        P->t = nt;
        P->cap = cap;
    }
    P->t[P->n++] = t;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool is_name0(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* a string literal at s[*i] (the quote); returns its value */
static struct jstr lex_string(struct parser *P, const char *s, size_t n, size_t *i, int line)
{
    char q = s[*i];
    size_t j = *i + 1;
    char *o = kvr_chat_alloc(P->a, P->f, n - j + 1);
    size_t ol = 0;
    for (;;) {
        if (j >= n)
            kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: string literal not closed", line);
        char c = s[j];
        if (c == q) {
            j++;
            break;
        }
        if (c != '\\') {
            o[ol++] = c;
            j++;
            continue;
        }
        if (j + 1 >= n)
            kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: string literal not closed", line);
        char e = s[j + 1];
        j += 2;
        switch (e) {
        case 'n':
            o[ol++] = '\n';
            break;
        case 't':
            o[ol++] = '\t';
            break;
        case 'r':
            o[ol++] = '\r';
            break;
        case '0':
            o[ol++] = '\0';
            break;
        case '\\':
            o[ol++] = '\\';
            break;
        case '\'':
            o[ol++] = '\'';
            break;
        case '"':
            o[ol++] = '"';
            break;
        case '\n':
            break;
        case 'x':
        case 'u':
        case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int v = j < n ? hexval(s[j]) : -1;
                if (v < 0)
                    kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: bad \\%c escape in a string",
                                  line, e);
                cp = cp * 16 + (uint32_t)v;
                j++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: \\%c escape outside Unicode", line,
                              e);
            ol += kvr_utf8_put(cp, o + ol); /* an escape is >= 4 source bytes */
            break;
        }
        default: /* Python keeps unknown escapes as they are */
            o[ol++] = '\\';
            o[ol++] = e;
            break;
        }
    }
    *i = j;
    return (struct jstr){o, ol};
}

/* the inside of one tag, s[b..e) */
static void lex_tag(struct parser *P, const char *s, size_t b, size_t e, int *line)
{
    static const char *const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                      "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                      "]",  "{",  "}",  ",",  ":",  ".",  "|"};
    size_t i = b;
    while (i < e) {
        char c = s[i];
        if (is_ws(c)) {
            if (c == '\n')
                (*line)++;
            i++;
            continue;
        }
        struct token t = {.line = *line};
        if (c == '\'' || c == '"') {
            t.k = TK_STR;
            t.s = lex_string(P, s, e, &i, *line);
        } else if (is_name0(c)) {
            size_t j = i;
            while (j < e && (is_name0(s[j]) || is_digit(s[j])))
                j++;
            t.k = TK_NAME;
            t.s = (struct jstr){s + i, j - i};
            i = j;
        } else if (is_digit(c)) {
            size_t j = i;
            while (j < e && (is_digit(s[j]) || s[j] == '_'))
                j++;
            bool fl = false;
            if (j + 1 < e && s[j] == '.' && is_digit(s[j + 1])) {
                fl = true;
                j++;
                while (j < e && is_digit(s[j]))
                    j++;
            }
            if (j < e && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < e && (s[k] == '+' || s[k] == '-'))
                    k++;
                if (k < e && is_digit(s[k])) {
                    fl = true;
                    j = k;
                    while (j < e && is_digit(s[j]))
                        j++;
                }
            }
            char buf[64];
            size_t bl = 0;
            for (size_t k = i; k < j && bl < sizeof(buf) - 1; k++)
                if (s[k] != '_')
                    buf[bl++] = s[k];
            buf[bl] = 0;
            if (fl) {
                t.k = TK_FLOAT;
                t.f = strtod(buf, NULL);
            } else {
                t.k = TK_INT;
                t.i = strtoll(buf, NULL, 10);
            }
            i = j;
        } else {
            size_t k = 0;
            for (; k < sizeof(ops) / sizeof(ops[0]); k++) {
                size_t ol = strlen(ops[k]);
                if (ol <= e - i && !memcmp(s + i, ops[k], ol))
                    break;
            }
            if (k == sizeof(ops) / sizeof(ops[0]))
                kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: unexpected character '%c' in a tag",
                              *line, c);
            t.k = TK_OP;
            t.s = (struct jstr){ops[k], strlen(ops[k])};
            i += t.s.n;
        }
        push(P, t);
    }
}

/* end of the tag opened at s[i] ({{, {%, {#): the index of its closing
 * delimiter, skipping string literals */
static size_t tag_end(struct parser *P, const char *s, size_t n, size_t i, char kind, int line)
{
    char close = kind == '{' ? '}' : kind;
    size_t j = i + 2;
    while (j + 1 < n) {
        char c = s[j];
        if (kind != '#' && (c == '\'' || c == '"')) {
            size_t k = j + 1;
            while (k < n && s[k] != c) {
                if (s[k] == '\\')
                    k++;
                k++;
            }
            j = k + 1;
            continue;
        }
        if (c == close && s[j + 1] == '}')
            return j;
        j++;
    }
    kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: tag \"{%c\" is never closed", line, kind);
}

static void lex(struct parser *P, const char *s, size_t n)
{
    int line = 1;
    size_t i = 0;
    bool strip_next = false, trim_nl = false;
    while (i <= n) {
        /* the next tag */
        size_t j = i;
        while (j + 1 < n &&
               !(s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#')))
            j++;
        if (j + 1 >= n)
            j = n;
        size_t tb = i, te = j; /* the text before it */
        if (strip_next)
            while (tb < te && is_ws(s[tb]))
                tb++;
        else if (trim_nl) {
            if (tb < te && s[tb] == '\n')
                tb++;
            else if (te - tb >= 2 && s[tb] == '\r' && s[tb + 1] == '\n')
                tb += 2;
        }
        char kind = j < n ? s[j + 1] : 0;
        bool minus = j < n && j + 2 < n && s[j + 2] == '-';
        bool plus = j < n && j + 2 < n && s[j + 2] == '+';
        if (minus) {
            while (te > tb && is_ws(s[te - 1]))
                te--;
        } else if ((kind == '%' || kind == '#') && !plus) {
            /* lstrip_blocks: only spaces/tabs since the line started */
            size_t k = te;
            while (k > tb && (s[k - 1] == ' ' || s[k - 1] == '\t'))
                k--;
            if (k == 0 || s[k - 1] == '\n' || (k == tb && tb > i))
                te = k;
            else if (k == tb && tb == i && i > 0 && s[i - 1] == '\n')
                te = k;
        }
        for (size_t k = i; k < j; k++)
            if (s[k] == '\n')
                line++;
        if (te > tb)
            push(P, (struct token){.k = TK_TEXT, .line = line, .s = {s + tb, te - tb}});
        if (j >= n)
            break;
        int tag_line = line;
        size_t close = tag_end(P, s, n, j, kind, tag_line);
        size_t cb = j + 2 + (minus || plus ? 1 : 0);
        size_t ce = close;
        bool rminus = ce > cb && s[ce - 1] == '-';
        if (rminus)
            ce--;
        if (kind == '#') {
            for (size_t k = j; k < close; k++)
                if (s[k] == '\n')
                    line++;
        } else {
            push(P, (struct token){.k = kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, .line = line});
            lex_tag(P, s, cb, ce, &line);
            push(P, (struct token){.k = kind == '{' ? TK_VAR_END : TK_BLOCK_END, .line = line});
        }
        strip_next = rminus;
        trim_nl = kind != '{';
        i = close + 2;
    }
    push(P, (struct token){.k = TK_EOF, .line = line});
}

/* ---- parsing helpers ---- */

static struct token *peek(struct parser *P)
{
    return &P->t[P->pos];
}

static struct token *next(struct parser *P)
{
    struct token *t = &P->t[P->pos];
    if (t->k != TK_EOF)
        P->pos++;
    return t;
}

static bool is_op(const struct token *t, const char *op)
{
    return t->k == TK_OP && t->s.n == strlen(op) && !memcmp(t->s.p, op, t->s.n);
}

static bool is_name(const struct token *t, const char *nm)
{
    return t->k == TK_NAME && t->s.n == strlen(nm) && !memcmp(t->s.p, nm, t->s.n);
}

static const char *tk_desc(const struct token *t, char *buf, size_t cap)
{
    switch (t->k) {
    case TK_NAME:
    case TK_OP:
        snprintf(buf, cap, "\"%.*s\"", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p);
        return buf;
    case TK_STR:
        return "a string";
    case TK_INT:
    case TK_FLOAT:
        return "a number";
    case TK_VAR_END:
        return "\"}}\"";
    case TK_BLOCK_END:
        return "\"%}\"";
    case TK_EOF:
        return "the end of the template";
    default:
        return "text";
    }
}

static _Noreturn void unexpected(struct parser *P, const struct token *t, const char *want)
{
    char b[64];
    kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: expected %s, found %s", t->line, want,
                  tk_desc(t, b, sizeof(b)));
}

static void expect_op(struct parser *P, const char *op)
{
    struct token *t = next(P);
    if (!is_op(t, op)) {
        char w[16];
        snprintf(w, sizeof(w), "\"%s\"", op);
        unexpected(P, t, w);
    }
}

static struct jstr expect_name(struct parser *P)
{
    struct token *t = next(P);
    if (t->k != TK_NAME)
        unexpected(P, t, "a name");
    return t->s;
}

static struct expr *mk(struct parser *P, enum expr_kind k, int line)
{
    struct expr *e = kvr_chat_alloc(P->a, P->f, sizeof(*e));
    memset(e, 0, sizeof(*e));
    e->k = k;
    e->line = line;
    return e;
}

/* a growable pointer list in the arena */
struct plist {
    void **p;
    size_t n, cap;
};

static void plist_add(struct parser *P, struct plist *l, void *v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        void **np = kvr_chat_alloc(P->a, P->f, cap * sizeof(void *));
        if (l->n)
            memcpy(np, l->p, l->n * sizeof(void *));
        l->p = np;
        l->cap = cap;
    }
    l->p[l->n++] = v;
}

static void enter(struct parser *P, int line)
{
    if (++P->depth > MAX_DEPTH)
        kvr_chat_fail(P->f, KVR_ERR_OVERLOAD, "line %d: nesting deeper than %d", line, MAX_DEPTH);
}

/* ---- expressions ---- */

static struct expr *parse_expr(struct parser *P);
static struct expr *parse_or(struct parser *P);
static struct expr *parse_unary(struct parser *P);

/* (args, name=value) after the "(" */
static void parse_args(struct parser *P, struct expr *e)
{
    struct plist args = {0}, kwn = {0}, kwv = {0};
    while (!is_op(peek(P), ")")) {
        struct token *t = peek(P);
        if (t->k == TK_NAME && is_op(&P->t[P->pos + 1], "=")) {
            next(P);
            next(P);
            struct jstr *nm = kvr_chat_alloc(P->a, P->f, sizeof(*nm));
            *nm = t->s;
            plist_add(P, &kwn, nm);
            plist_add(P, &kwv, parse_expr(P));
        } else {
            if (kwn.n)
                kvr_chat_fail(P->f, KVR_ERR_INVALID,
                              "line %d: a positional argument after a keyword argument", t->line);
            plist_add(P, &args, parse_expr(P));
        }
        if (!is_op(peek(P), ","))
            break;
        next(P);
    }
    expect_op(P, ")");
    e->args = (struct expr **)args.p;
    e->nargs = args.n;
    e->nkw = kwn.n;
    e->kwargs = (struct expr **)kwv.p;
    if (kwn.n) {
        e->kwnames = kvr_chat_alloc(P->a, P->f, kwn.n * sizeof(struct jstr));
        for (size_t i = 0; i < kwn.n; i++)
            e->kwnames[i] = *(struct jstr *)kwn.p[i];
    }
}

static struct expr *parse_primary(struct parser *P)
{
    struct token *t = next(P);
    struct expr *e;
    switch (t->k) {
    case TK_STR:
        e = mk(P, E_STR, t->line);
        e->s = t->s;
        /* adjacent literals concatenate */
        while (peek(P)->k == TK_STR) {
            struct token *u = next(P);
            char *c = kvr_chat_alloc(P->a, P->f, e->s.n + u->s.n + 1);
            memcpy(c, e->s.p, e->s.n);
            memcpy(c + e->s.n, u->s.p, u->s.n);
            e->s = (struct jstr){c, e->s.n + u->s.n};
        }
        return e;
    case TK_INT:
        e = mk(P, E_INT, t->line);
        e->i = t->i;
        return e;
    case TK_FLOAT:
        e = mk(P, E_FLOAT, t->line);
        e->f = t->f;
        return e;
    case TK_NAME:
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") ||
            is_name(t, "False")) {
            e = mk(P, E_BOOL, t->line);
            e->i = t->s.p[0] == 't' || t->s.p[0] == 'T';
            return e;
        }
        if (is_name(t, "none") || is_name(t, "None"))
            return mk(P, E_NONE, t->line);
        e = mk(P, E_NAME, t->line);
        e->s = t->s;
        return e;
    case TK_OP:
        if (is_op(t, "(")) {
            enter(P, t->line);
            if (is_op(peek(P), ")")) { /* the empty tuple */
                next(P);
                P->depth--;
                return mk(P, E_TUPLE, t->line);
            }
            struct expr *first = parse_expr(P);
            if (is_op(peek(P), ",")) {
                struct plist items = {0};
                plist_add(P, &items, first);
                while (is_op(peek(P), ",")) {
                    next(P);
                    if (is_op(peek(P), ")"))
                        break;
                    plist_add(P, &items, parse_expr(P));
                }
                first = mk(P, E_TUPLE, t->line);
                first->args = (struct expr **)items.p;
                first->nargs = items.n;
            }
            expect_op(P, ")");
            P->depth--;
            return first;
        }
        if (is_op(t, "[")) {
            enter(P, t->line);
            struct plist items = {0};
            while (!is_op(peek(P), "]")) {
                plist_add(P, &items, parse_expr(P));
                if (!is_op(peek(P), ","))
                    break;
                next(P);
            }
            expect_op(P, "]");
            P->depth--;
            e = mk(P, E_LIST, t->line);
            e->args = (struct expr **)items.p;
            e->nargs = items.n;
            return e;
        }
        if (is_op(t, "{")) {
            enter(P, t->line);
            struct plist keys = {0}, vals = {0};
            while (!is_op(peek(P), "}")) {
                plist_add(P, &keys, parse_expr(P));
                expect_op(P, ":");
                plist_add(P, &vals, parse_expr(P));
                if (!is_op(peek(P), ","))
                    break;
                next(P);
            }
            expect_op(P, "}");
            P->depth--;
            e = mk(P, E_DICT, t->line);
            e->args = (struct expr **)keys.p;
            e->nargs = keys.n;
            e->kwargs = (struct expr **)vals.p;
            e->nkw = vals.n;
            return e;
        }
        break;
    default:
        break;
    }
    unexpected(P, t, "an expression");
}

/* filter or test name with optional arguments: "name", "name(args)";
 * tests also take one bare argument ("is divisibleby 3") */
static void parse_callee(struct parser *P, struct expr *e, bool test)
{
    struct jstr nm = expect_name(P);
    /* dotted names (rare): keep the last part */
    while (is_op(peek(P), ".")) {
        next(P);
        nm = expect_name(P);
    }
    e->s = nm;
    if (is_op(peek(P), "(")) {
        next(P);
        parse_args(P, e);
    } else if (test) {
        struct token *t = peek(P);
        if (t->k == TK_STR || t->k == TK_INT || t->k == TK_FLOAT ||
            (t->k == TK_NAME && !is_name(t, "and") && !is_name(t, "or") && !is_name(t, "else") &&
             !is_name(t, "if") && !is_name(t, "in") && !is_name(t, "is") && !is_name(t, "not"))) {
            e->args = kvr_chat_alloc(P->a, P->f, sizeof(struct expr *));
            e->args[0] = parse_primary(P);
            e->nargs = 1;
        }
    }
}

static struct expr *parse_postfix(struct parser *P)
{
    struct expr *e = parse_primary(P);
    for (;;) {
        struct token *t = peek(P);
        if (is_op(t, ".")) {
            next(P);
            struct token *nm = next(P);
            if (nm->k != TK_NAME && nm->k != TK_INT)
                unexpected(P, nm, "an attribute name");
            struct expr *x;
            if (nm->k == TK_INT) { /* a.0 is a[0] */
                x = mk(P, E_INDEX, t->line);
                x->b = mk(P, E_INT, t->line);
                x->b->i = nm->i;
            } else {
                x = mk(P, E_ATTR, t->line);
                x->s = nm->s;
            }
            x->a = e;
            e = x;
        } else if (is_op(t, "[")) {
            next(P);
            enter(P, t->line);
            struct expr *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (!is_op(peek(P), ":") && !is_op(peek(P), "]"))
                    parts[np] = parse_expr(P);
                if (is_op(peek(P), ":") && np < 2) {
                    next(P);
                    slice = true;
                    np++;
                    continue;
                }
                break;
            }
            expect_op(P, "]");
            P->depth--;
            struct expr *x = mk(P, slice ? E_SLICE : E_INDEX, t->line);
            x->a = e;
            if (slice) {
                x->b = parts[0];
                x->c = parts[1];
                x->args = kvr_chat_alloc(P->a, P->f, sizeof(struct expr *));
                x->args[0] = parts[2];
                x->nargs = 1;
            } else {
                if (!parts[0])
                    unexpected(P, peek(P), "an index");
                x->b = parts[0];
            }
            e = x;
        } else if (is_op(t, "(")) {
            next(P);
            enter(P, t->line);
            struct expr *x = mk(P, E_CALL, t->line);
            x->a = e;
            parse_args(P, x);
            P->depth--;
            e = x;
        } else {
            return e;
        }
    }
}

/* filters bind tighter than every operator but the postfix ones */
static struct expr *parse_filtered(struct parser *P)
{
    struct expr *e = parse_postfix(P);
    while (is_op(peek(P), "|")) {
        int line = next(P)->line;
        struct expr *x = mk(P, E_FILTER, line);
        x->a = e;
        parse_callee(P, x, false);
        e = x;
    }
    return e;
}

static struct expr *parse_pow(struct parser *P)
{
    struct expr *e = parse_filtered(P);
    if (is_op(peek(P), "**")) {
        int line = next(P)->line;
        struct expr *x = mk(P, E_BIN, line);
        x->i = B_POW;
        x->a = e;
        x->b = parse_unary(P);
        return x;
    }
    return e;
}

static struct expr *parse_unary(struct parser *P)
{
    struct token *t = peek(P);
    if (is_op(t, "-") || is_op(t, "+")) {
        next(P);
        enter(P, t->line);
        struct expr *x = mk(P, is_op(t, "-") ? E_NEG : E_POS, t->line);
        x->a = parse_unary(P);
        P->depth--;
        return x;
    }
    return parse_pow(P);
}

static struct expr *bin(struct parser *P, int op, struct expr *a, struct expr *b, int line)
{
    struct expr *x = mk(P, E_BIN, line);
    x->i = op;
    x->a = a;
    x->b = b;
    return x;
}

static struct expr *parse_mul(struct parser *P)
{
    struct expr *e = parse_unary(P);
    for (;;) {
        struct token *t = peek(P);
        int op = is_op(t, "*")    ? B_MUL
                 : is_op(t, "/")  ? B_DIV
                 : is_op(t, "//") ? B_FLOORDIV
                 : is_op(t, "%")  ? B_MOD
                                  : -1;
        if (op < 0)
            return e;
        next(P);
        e = bin(P, op, e, parse_unary(P), t->line);
    }
}

static struct expr *parse_add(struct parser *P)
{
    struct expr *e = parse_mul(P);
    for (;;) {
        struct token *t = peek(P);
        int op = is_op(t, "+") ? B_ADD : is_op(t, "-") ? B_SUB : -1;
        if (op < 0)
            return e;
        next(P);
        e = bin(P, op, e, parse_mul(P), t->line);
    }
}

static struct expr *parse_concat(struct parser *P)
{
    struct expr *e = parse_add(P);
    while (is_op(peek(P), "~")) {
        int line = next(P)->line;
        e = bin(P, B_CONCAT, e, parse_add(P), line);
    }
    return e;
}

static struct expr *parse_compare(struct parser *P)
{
    struct expr *e = parse_concat(P);
    for (;;) {
        struct token *t = peek(P);
        int op = is_op(t, "==")     ? B_EQ
                 : is_op(t, "!=")   ? B_NE
                 : is_op(t, "<")    ? B_LT
                 : is_op(t, "<=")   ? B_LE
                 : is_op(t, ">")    ? B_GT
                 : is_op(t, ">=")   ? B_GE
                 : is_name(t, "in") ? B_IN
                                    : -1;
        if (op < 0 && is_name(t, "not") && is_name(&P->t[P->pos + 1], "in")) {
            next(P);
            op = B_NOTIN;
        }
        if (op >= 0) {
            next(P);
            e = bin(P, op, e, parse_concat(P), t->line);
            continue;
        }
        if (is_name(t, "is")) {
            next(P);
            struct expr *x = mk(P, E_TEST, t->line);
            if (is_name(peek(P), "not")) {
                next(P);
                x->i = 1;
            }
            x->a = e;
            parse_callee(P, x, true);
            e = x;
            continue;
        }
        return e;
    }
}

static struct expr *parse_not(struct parser *P)
{
    struct token *t = peek(P);
    if (is_name(t, "not")) {
        next(P);
        enter(P, t->line);
        struct expr *x = mk(P, E_NOT, t->line);
        x->a = parse_not(P);
        P->depth--;
        return x;
    }
    return parse_compare(P);
}

static struct expr *parse_and(struct parser *P)
{
    struct expr *e = parse_not(P);
    while (is_name(peek(P), "and")) {
        int line = next(P)->line;
        struct expr *x = mk(P, E_AND, line);
        x->a = e;
        x->b = parse_not(P);
        e = x;
    }
    return e;
}

static struct expr *parse_or(struct parser *P)
{
    struct expr *e = parse_and(P);
    while (is_name(peek(P), "or")) {
        int line = next(P)->line;
        struct expr *x = mk(P, E_OR, line);
        x->a = e;
        x->b = parse_and(P);
        e = x;
    }
    return e;
}

static struct expr *parse_expr(struct parser *P)
{
    enter(P, peek(P)->line);
    struct expr *e = parse_or(P);
    if (is_name(peek(P), "if")) {
        int line = next(P)->line;
        struct expr *x = mk(P, E_COND, line);
        x->b = e;
        x->a = parse_or(P);
        if (is_name(peek(P), "else")) {
            next(P);
            x->c = parse_expr(P);
        }
        e = x;
    }
    P->depth--;
    return e;
}

/* ---- statements ---- */

static struct node *mknode(struct parser *P, enum node_kind k, int line)
{
    struct node *n = kvr_chat_alloc(P->a, P->f, sizeof(*n));
    memset(n, 0, sizeof(*n));
    n->k = k;
    n->line = line;
    return n;
}

static void block_end(struct parser *P)
{
    struct token *t = next(P);
    if (t->k != TK_BLOCK_END)
        unexpected(P, t, "\"%}\"");
}

/* statements until a block tag whose keyword is one of stops (returned in
 * *stop_p, the tag's keyword consumed, not its end) */
static void parse_body(struct parser *P, struct plist *out, const char *const *stops,
                       const char **stop_p, const char *what, int open_line);

static struct node **finish(struct plist *l, size_t *n_p)
{
    *n_p = l->n;
    return (struct node **)l->p;
}

/* "(a, b=1, ...)" parameter list of macro / call */
static void parse_params(struct parser *P, struct node *n)
{
    struct plist names = {0}, defs = {0};
    expect_op(P, "(");
    while (!is_op(peek(P), ")")) {
        struct jstr *nm = kvr_chat_alloc(P->a, P->f, sizeof(*nm));
        *nm = expect_name(P);
        plist_add(P, &names, nm);
        struct expr *d = NULL;
        if (is_op(peek(P), "=")) {
            next(P);
            d = parse_expr(P);
        }
        plist_add(P, &defs, d);
        if (!is_op(peek(P), ","))
            break;
        next(P);
    }
    expect_op(P, ")");
    n->nvars = names.n;
    n->vars = kvr_chat_alloc(P->a, P->f, (names.n + 1) * sizeof(struct jstr));
    for (size_t i = 0; i < names.n; i++)
        n->vars[i] = *(struct jstr *)names.p[i];
    n->defaults = (struct expr **)defs.p;
}

static struct node *parse_stmt(struct parser *P, struct token *kw)
{
    int line = kw->line;
    if (is_name(kw, "if") || is_name(kw, "elif")) {
        struct node *n = mknode(P, N_IF, line);
        n->e = parse_expr(P);
        block_end(P);
        static const char *const stops[] = {"elif", "else", "endif", NULL};
        struct plist body = {0}, orelse = {0};
        const char *stop;
        parse_body(P, &body, stops, &stop, "if", line);
        n->body = finish(&body, &n->nbody);
        if (!strcmp(stop, "elif")) {
            enter(P, line);
            plist_add(P, &orelse, parse_stmt(P, &P->t[P->pos - 1]));
            P->depth--;
            n->orelse = finish(&orelse, &n->norelse);
            return n; /* the nested if consumed endif */
        }
        if (!strcmp(stop, "else")) {
            block_end(P);
            static const char *const stops2[] = {"endif", NULL};
            parse_body(P, &orelse, stops2, &stop, "if", line);
            n->orelse = finish(&orelse, &n->norelse);
        }
        block_end(P);
        return n;
    }
    if (is_name(kw, "for")) {
        struct node *n = mknode(P, N_FOR, line);
        struct plist vars = {0};
        bool paren = is_op(peek(P), "(");
        if (paren)
            next(P);
        for (;;) {
            struct jstr *nm = kvr_chat_alloc(P->a, P->f, sizeof(*nm));
            *nm = expect_name(P);
            plist_add(P, &vars, nm);
            if (!is_op(peek(P), ","))
                break;
            next(P);
        }
        if (paren)
            expect_op(P, ")");
        n->nvars = vars.n;
        n->vars = kvr_chat_alloc(P->a, P->f, vars.n * sizeof(struct jstr));
        for (size_t i = 0; i < vars.n; i++)
            n->vars[i] = *(struct jstr *)vars.p[i];
        if (!is_name(next(P), "in"))
            unexpected(P, &P->t[P->pos - 1], "\"in\"");
        n->e = parse_or(P); /* not parse_expr: "if" here filters */
        if (is_name(peek(P), "if")) {
            next(P);
            n->cond = parse_expr(P);
        }
        if (is_name(peek(P), "recursive"))
            kvr_chat_fail(P->f, KVR_ERR_UNSUPPORTED,
                          "line %d: recursive for loops are not supported", line);
        block_end(P);
        static const char *const stops[] = {"else", "endfor", NULL};
        struct plist body = {0}, orelse = {0};
        const char *stop;
        parse_body(P, &body, stops, &stop, "for", line);
        n->body = finish(&body, &n->nbody);
        if (!strcmp(stop, "else")) {
            block_end(P);
            static const char *const stops2[] = {"endfor", NULL};
            parse_body(P, &orelse, stops2, &stop, "for", line);
            n->orelse = finish(&orelse, &n->norelse);
        }
        block_end(P);
        return n;
    }
    if (is_name(kw, "set")) {
        struct jstr nm = expect_name(P);
        if (is_op(peek(P), ".")) {
            next(P);
            struct node *n = mknode(P, N_SET, line);
            n->text = nm;
            n->attr = expect_name(P);
            expect_op(P, "=");
            n->e = parse_expr(P);
            block_end(P);
            return n;
        }
        if (peek(P)->k == TK_BLOCK_END) { /* set block */
            block_end(P);
            struct node *n = mknode(P, N_SETBLOCK, line);
            n->text = nm;
            static const char *const stops[] = {"endset", NULL};
            struct plist body = {0};
            const char *stop;
            parse_body(P, &body, stops, &stop, "set", line);
            n->body = finish(&body, &n->nbody);
            block_end(P);
            return n;
        }
        struct node *n = mknode(P, N_SET, line);
        n->text = nm;
        if (is_op(peek(P), ",")) { /* set a, b = ... */
            struct plist vars = {0};
            struct jstr *first = kvr_chat_alloc(P->a, P->f, sizeof(*first));
            *first = nm;
            plist_add(P, &vars, first);
            while (is_op(peek(P), ",")) {
                next(P);
                struct jstr *v = kvr_chat_alloc(P->a, P->f, sizeof(*v));
                *v = expect_name(P);
                plist_add(P, &vars, v);
            }
            n->nvars = vars.n;
            n->vars = kvr_chat_alloc(P->a, P->f, vars.n * sizeof(struct jstr));
            for (size_t i = 0; i < vars.n; i++)
                n->vars[i] = *(struct jstr *)vars.p[i];
        }
        expect_op(P, "=");
        n->e = parse_expr(P);
        if (is_op(peek(P), ",")) { /* set a, b = x, y */
            struct expr *t = mk(P, E_TUPLE, line);
            struct plist items = {0};
            plist_add(P, &items, n->e);
            while (is_op(peek(P), ",")) {
                next(P);
                plist_add(P, &items, parse_expr(P));
            }
            t->args = (struct expr **)items.p;
            t->nargs = items.n;
            n->e = t;
        }
        block_end(P);
        return n;
    }
    if (is_name(kw, "macro")) {
        struct node *n = mknode(P, N_MACRO, line);
        n->text = expect_name(P);
        parse_params(P, n);
        block_end(P);
        static const char *const stops[] = {"endmacro", NULL};
        struct plist body = {0};
        const char *stop;
        parse_body(P, &body, stops, &stop, "macro", line);
        n->body = finish(&body, &n->nbody);
        if (peek(P)->k == TK_NAME)
            next(P); /* endmacro name */
        block_end(P);
        return n;
    }
    if (is_name(kw, "call")) {
        struct node *n = mknode(P, N_CALLBLOCK, line);
        if (is_op(peek(P), "("))
            parse_params(P, n);
        n->e = parse_expr(P);
        if (n->e->k != E_CALL)
            kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: {%% call %%} needs a macro call", line);
        block_end(P);
        static const char *const stops[] = {"endcall", NULL};
        struct plist body = {0};
        const char *stop;
        parse_body(P, &body, stops, &stop, "call", line);
        n->body = finish(&body, &n->nbody);
        block_end(P);
        return n;
    }
    if (is_name(kw, "generation")) {
        struct node *n = mknode(P, N_BLOCK, line);
        block_end(P);
        static const char *const stops[] = {"endgeneration", NULL};
        struct plist body = {0};
        const char *stop;
        parse_body(P, &body, stops, &stop, "generation", line);
        n->body = finish(&body, &n->nbody);
        block_end(P);
        return n;
    }
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        struct node *n = mknode(P, is_name(kw, "break") ? N_BREAK : N_CONTINUE, line);
        block_end(P);
        return n;
    }
    if (kw->k == TK_NAME)
        kvr_chat_fail(P->f, KVR_ERR_UNSUPPORTED,
                      "line %d: the {%% %.*s %%} statement is not supported (if, for, set, "
                      "macro, call, generation, break, continue are)",
                      line, (int)(kw->s.n > 40 ? 40 : kw->s.n), kw->s.p);
    unexpected(P, kw, "a statement keyword");
}

static void parse_body(struct parser *P, struct plist *out, const char *const *stops,
                       const char **stop_p, const char *what, int open_line)
{
    enter(P, open_line);
    for (;;) {
        struct token *t = next(P);
        if (t->k == TK_EOF) {
            if (!stops)
                break;
            kvr_chat_fail(P->f, KVR_ERR_INVALID, "line %d: {%% %s %%} is never closed (%s%s)",
                          open_line, what, "expected {% ", stops[0]);
        }
        if (t->k == TK_TEXT) {
            struct node *n = mknode(P, N_TEXT, t->line);
            n->text = t->s;
            plist_add(P, out, n);
        } else if (t->k == TK_VAR_BEGIN) {
            struct node *n = mknode(P, N_OUT, t->line);
            n->e = parse_expr(P);
            struct token *e = next(P);
            if (e->k != TK_VAR_END)
                unexpected(P, e, "\"}}\"");
            plist_add(P, out, n);
        } else if (t->k == TK_BLOCK_BEGIN) {
            struct token *kw = next(P);
            for (size_t i = 0; stops && stops[i]; i++) {
                if (is_name(kw, stops[i])) {
                    *stop_p = stops[i];
                    P->depth--;
                    return;
                }
            }
            if (kw->k == TK_NAME &&
                (is_name(kw, "endif") || is_name(kw, "endfor") || is_name(kw, "else") ||
                 is_name(kw, "elif") || is_name(kw, "endset") || is_name(kw, "endmacro") ||
                 is_name(kw, "endcall") || is_name(kw, "endgeneration")))
                kvr_chat_fail(P->f, KVR_ERR_INVALID,
                              "line %d: {%% %.*s %%} without its opening tag", kw->line,
                              (int)kw->s.n, kw->s.p);
            plist_add(P, out, parse_stmt(P, kw));
        } else {
            unexpected(P, t, "text or a tag");
        }
    }
    P->depth--;
}

void kvr_chat_parse(struct kvr_chat_template *tpl, const char *src, size_t len, struct jfail *f)
{
    struct parser P = {.a = &tpl->arena, .f = f};
    lex(&P, src, len);
    struct plist body = {0};
    parse_body(&P, &body, NULL, NULL, "template", 1);
    tpl->body = finish(&body, &tpl->nbody);
}
