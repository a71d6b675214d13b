/*
 * chat_internal.h - private to the chat template interpreter: the syntax
 * tree chat_parse.c builds and chat_eval.c walks, and the arena both
 * allocate from.
 */
#ifndef KVR_CHAT_INTERNAL_H
#define KVR_CHAT_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_chat.h"

/* ---- arena: everything of one compile or one render; freed at once ---- */

struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    char data[];
};

struct arena {
    struct arena_blk *head;
    size_t total, limit; /* bytes taken from malloc, and the most allowed */
};

/* the error exit of a compile or render: message, status, longjmp */
struct jfail {
    jmp_buf jb;
    kvr_status_t st;
    char msg[512];
};

void *kvr_chat_alloc(struct arena *a, struct jfail *f, size_t n);
void kvr_chat_arena_free(struct arena *a);
_Noreturn void kvr_chat_fail(struct jfail *f, kvr_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

struct jstr {
    const char *p;
    size_t n;
};

/* ---- expressions ---- */

enum expr_kind {
    E_STR,
    E_INT,
    E_FLOAT,
    E_BOOL,
    E_NONE,
    E_NAME,
    E_ATTR,  /* a.name */
    E_INDEX, /* a[b] */
    E_SLICE, /* a[b:c:d], absent parts NULL */
    E_CALL,  /* a(args, name=kw) */
    E_FILTER,
    E_TEST,
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,
    E_AND,
    E_OR,
    E_COND, /* b if a else c */
    E_LIST,
    E_TUPLE,
    E_DICT,
};

enum bin_op {
    B_ADD,
    B_SUB,
    B_MUL,
    B_DIV,
    B_FLOORDIV,
    B_MOD,
    B_POW,
    B_CONCAT,
    B_EQ,
    B_NE,
    B_LT,
    B_LE,
    B_GT,
    B_GE,
    B_IN,
    B_NOTIN,
};

struct expr {
    enum expr_kind k;
    int line;
    struct jstr s; /* E_STR, E_NAME, E_ATTR name, E_FILTER / E_TEST name */
    int64_t i;     /* E_INT, E_BOOL, E_BIN op, E_TEST negated */
    double f;
    struct expr *a, *b, *c;
    /* E_CALL / E_FILTER / E_TEST arguments; E_LIST / E_TUPLE items; E_DICT
     * keys in args, values in kwargs */
    struct expr **args;
    size_t nargs;
    struct jstr *kwnames;
    struct expr **kwargs;
    size_t nkw;
};

/* ---- statements ---- */

enum node_kind {
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,      /* set target = expr; target a name, a.attr, or names (unpacking) */
    N_SETBLOCK, /* set name %}...{% endset */
    N_MACRO,
    N_CALLBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_BLOCK, /* generation blocks: the body as it is */
};

struct node {
    enum node_kind k;
    int line;
    struct jstr text;  /* N_TEXT; N_SET / N_SETBLOCK / N_MACRO name */
    struct jstr attr;  /* N_SET a.attr: the attribute */
    struct jstr *vars; /* N_FOR loop variables; N_SET unpacking; N_MACRO / N_CALLBLOCK params */
    size_t nvars;
    struct expr **defaults; /* N_MACRO / N_CALLBLOCK parameter defaults (NULL: none) */
    struct expr *e;    /* N_OUT, N_IF condition, N_FOR iterable, N_SET value, N_CALLBLOCK call */
    struct expr *cond; /* N_FOR "if" filter */
    struct node **body, **orelse;
    size_t nbody, norelse;
};

struct kvr_chat_template {
    struct arena arena;
    struct node **body;
    size_t nbody;
};

/** Parses src into tpl (its arena); errors through f. */
void kvr_chat_parse(struct kvr_chat_template *tpl, const char *src, size_t len, struct jfail *f);

#endif
