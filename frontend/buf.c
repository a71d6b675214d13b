/*
 * buf.c - a growable byte buffer for building HTTP bodies (JSON, SSE,
 * Prometheus text).  An allocation failure sets oom and drops the append;
 * the caller checks oom once, before sending.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"

void fe_buf_free(struct fe_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

static bool reserve(struct fe_buf *b, size_t add)
{
    if (b->oom)
        return false;
    if (b->len + add + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + add + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void fe_buf_put(struct fe_buf *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void fe_buf_puts(struct fe_buf *b, const char *s)
{
    fe_buf_put(b, s, strlen(s));
}

void fe_buf_printf(struct fe_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        fe_buf_put(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void fe_buf_json_str(struct fe_buf *b, const char *s, size_t n)
{
    /* the common case (a token's text, printable ASCII with nothing to
     * escape) in one pass and one copy; anything else as kvr_json_escape has it */
    size_t k = 0;
    while (k < n && (unsigned char)s[k] >= 0x20 && (unsigned char)s[k] < 0x7f && s[k] != '"' &&
           s[k] != '\\')
        k++;
    if (k == n) {
        if (!reserve(b, n + 2))
            return;
        b->p[b->len] = '"';
        memcpy(b->p + b->len + 1, s, n);
        b->p[b->len + 1 + n] = '"';
        b->len += n + 2;
        b->p[b->len] = 0;
        return;
    }
    size_t need = kvr_json_escape(NULL, 0, s, n);
    if (!reserve(b, need))
        return;
    kvr_json_escape(b->p + b->len, need + 1, s, n);
    b->len += need;
    b->p[b->len] = 0;
}

void fe_buf_json_num(struct fe_buf *b, double v)
{
    if (isnan(v))
        fe_buf_puts(b, "null");
    else if (isinf(v))
        fe_buf_puts(b, v < 0 ? "-9999.0" : "9999.0");
    else
        fe_buf_printf(b, "%.9g", v);
}
