/*
 * metrics.c - the metrics registry (kvr_metrics.h).
 *
 * Series live in a fixed table of pointers, appended under a mutex and
 * never removed before the registry is destroyed; a series' values are
 * atomics.  Counters and gauges hold a double as its bit pattern in a
 * 64-bit atomic (add is a compare-and-swap loop); a histogram holds one
 * atomic count per bucket (not cumulative) and its sum the same way.
 * Rendering walks the table once per family (the series of one name are
 * printed together, after one HELP and one TYPE line, as the format wants)
 * and makes the bucket counts cumulative.
 */
#include "kvr_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_log.h"

#define COMP "metrics"

const double kvr_metrics_latency_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                              0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                              1.0,    2.5,     5.0,    10.0,  30.0,   60.0};
const size_t kvr_metrics_latency_n =
    sizeof(kvr_metrics_latency_buckets) / sizeof(kvr_metrics_latency_buckets[0]);

struct kvr_metric {
    enum kvr_metric_type type;
    char *name, *help, *labels;
    _Atomic uint64_t value; /* double bits: counter, gauge; histogram: the sum */
    size_t n_bounds;
    double bounds[KVR_METRICS_MAX_BUCKETS];
    _Atomic uint64_t buckets[KVR_METRICS_MAX_BUCKETS + 1]; /* last: +Inf */
};

struct kvr_metrics {
    pthread_mutex_t mu;
    char *base;
    size_t n;
    kvr_metric_t *series[KVR_METRICS_MAX_SERIES];
};

static uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

kvr_status_t kvr_metrics_create(const char *base_labels, kvr_metrics_t **out)
{
    kvr_metrics_t *reg = calloc(1, sizeof *reg);
    if (!reg)
        return KVR_ERR_NO_MEMORY;
    reg->base = strdup(base_labels ? base_labels : "");
    if (!reg->base) {
        free(reg);
        return KVR_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&reg->mu, NULL);
    *out = reg;
    return KVR_OK;
}

static void metric_free(kvr_metric_t *m)
{
    free(m->name);
    free(m->help);
    free(m->labels);
    free(m);
}

void kvr_metrics_destroy(kvr_metrics_t *reg)
{
    if (!reg)
        return;
    for (size_t i = 0; i < reg->n; i++)
        metric_free(reg->series[i]);
    pthread_mutex_destroy(&reg->mu);
    free(reg->base);
    free(reg);
}

static bool valid_name(const char *s)
{
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++) {
        bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':';
        if (!alpha && !(p > s && *p >= '0' && *p <= '9'))
            return false;
    }
    return true;
}

kvr_metric_t *kvr_metrics_get(kvr_metrics_t *reg, enum kvr_metric_type type, const char *name,
                              const char *help, const char *labels, const double *bounds,
                              size_t n_bounds)
{
    if (!reg)
        return NULL;
    if (!labels)
        labels = "";
    if (!valid_name(name) || strlen(labels) >= KVR_METRICS_LABELS_MAX ||
        (type == KVR_METRIC_HISTOGRAM && (n_bounds == 0 || n_bounds > KVR_METRICS_MAX_BUCKETS))) {
        KVR_LOG_ERROR(COMP, "metric '%s' {%s}: not a valid name, labels or bucket list (a bug)",
                      name ? name : "(null)", labels);
        return NULL;
    }
    for (size_t i = 1; i < n_bounds; i++)
        if (!(bounds[i] > bounds[i - 1])) {
            KVR_LOG_ERROR(COMP, "metric '%s': bucket bounds must increase (a bug)", name);
            return NULL;
        }
    pthread_mutex_lock(&reg->mu);
    kvr_metric_t *found = NULL;
    for (size_t i = 0; i < reg->n; i++) {
        kvr_metric_t *m = reg->series[i];
        if (strcmp(m->name, name) != 0)
            continue;
        if (m->type != type) {
            pthread_mutex_unlock(&reg->mu);
            KVR_LOG_ERROR(COMP, "metric '%s' exists with another type (a bug)", name);
            return NULL;
        }
        if (!strcmp(m->labels, labels)) {
            found = m;
            break;
        }
    }
    if (!found && reg->n >= KVR_METRICS_MAX_SERIES) {
        pthread_mutex_unlock(&reg->mu);
        KVR_LOG_WARN(COMP, "metric '%s' {%s} not kept: the registry holds %d series already", name,
                     labels, KVR_METRICS_MAX_SERIES);
        return NULL;
    }
    if (!found) {
        kvr_metric_t *m = calloc(1, sizeof *m);
        if (m) {
            m->type = type;
            m->name = strdup(name);
            m->help = strdup(help ? help : "");
            m->labels = strdup(labels);
            m->n_bounds = type == KVR_METRIC_HISTOGRAM ? n_bounds : 0;
            if (m->n_bounds)
                memcpy(m->bounds, bounds, n_bounds * sizeof(double));
            if (!m->name || !m->help || !m->labels) {
                metric_free(m);
                m = NULL;
            }
        }
        if (m)
            reg->series[reg->n++] = m;
        found = m;
    }
    pthread_mutex_unlock(&reg->mu);
    return found;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, d2u(u2d(old) + v), memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void kvr_metric_add(kvr_metric_t *m, double v)
{
    if (!m || m->type == KVR_METRIC_HISTOGRAM || isnan(v) ||
        (m->type == KVR_METRIC_COUNTER && v < 0))
        return;
    atomic_add_double(&m->value, v);
}

void kvr_metric_set(kvr_metric_t *m, double v)
{
    if (!m || m->type == KVR_METRIC_HISTOGRAM || isnan(v))
        return;
    if (m->type == KVR_METRIC_GAUGE) {
        atomic_store_explicit(&m->value, d2u(v), memory_order_relaxed);
        return;
    }
    uint64_t old = atomic_load_explicit(&m->value, memory_order_relaxed);
    while (v > u2d(old) && !atomic_compare_exchange_weak_explicit(
                               &m->value, &old, d2u(v), memory_order_relaxed, memory_order_relaxed))
        ;
}

void kvr_metric_observe(kvr_metric_t *m, double v)
{
    if (!m || m->type != KVR_METRIC_HISTOGRAM || isnan(v))
        return;
    size_t i = 0;
    while (i < m->n_bounds && v > m->bounds[i])
        i++;
    atomic_fetch_add_explicit(&m->buckets[i], 1, memory_order_relaxed);
    atomic_add_double(&m->value, v);
}

double kvr_metric_value(const kvr_metric_t *m)
{
    if (!m)
        return 0;
    if (m->type != KVR_METRIC_HISTOGRAM)
        return u2d(atomic_load_explicit(&m->value, memory_order_relaxed));
    uint64_t n = 0;
    for (size_t i = 0; i <= m->n_bounds; i++)
        n += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
    return (double)n;
}

char *kvr_metrics_label(char *buf, size_t size, const char *key, const char *value)
{
    size_t n = strnlen(buf, size);
    if (n + 1 >= size)
        return buf;
    int k = snprintf(buf + n, size - n, "%s%s=\"", n ? "," : "", key);
    if (k < 0 || (size_t)k >= size - n) {
        buf[n] = 0;
        return buf;
    }
    n += (size_t)k;
    for (const char *p = value ? value : ""; *p && n + 3 < size; p++) {
        if (*p == '\\' || *p == '"') {
            buf[n++] = '\\';
            buf[n++] = *p;
        } else if (*p == '\n') {
            buf[n++] = '\\';
            buf[n++] = 'n';
        } else {
            buf[n++] = *p;
        }
    }
    buf[n++] = '"';
    buf[n] = 0;
    return buf;
}

struct out {
    char *p;
    size_t n, cap;
    bool failed;
};

static void outf(struct out *o, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->p ? o->p + o->n : NULL, o->p ? o->cap - o->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            o->failed = true;
            return;
        }
        if (o->p && o->n + (size_t)k < o->cap) {
            o->n += (size_t)k;
            return;
        }
        size_t cap = (o->cap + (size_t)k + 1) * 2;
        char *np = realloc(o->p, cap);
        if (!np) {
            o->failed = true;
            return;
        }
        o->p = np;
        o->cap = cap;
    }
}

/* A Prometheus float: integers without a fraction, +Inf/-Inf/NaN spelled so. */
static void outnum(struct out *o, double v)
{
    if (isnan(v))
        outf(o, "NaN");
    else if (isinf(v))
        outf(o, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9e15)
        outf(o, "%.0f", v);
    else
        outf(o, "%.17g", v);
}

/* "{base,labels,extra}" or "" when all are empty */
static void outlabels(struct out *o, const char *base, const char *labels, const char *extra)
{
    const char *parts[3] = {base, labels, extra};
    bool any = false;
    for (int i = 0; i < 3; i++) {
        if (!parts[i] || !*parts[i])
            continue;
        outf(o, "%s%s", any ? "," : "{", parts[i]);
        any = true;
    }
    if (any)
        outf(o, "}");
}

static void render_help(struct out *o, const char *help)
{
    outf(o, " ");
    for (const char *p = help; *p; p++) {
        if (*p == '\\')
            outf(o, "\\\\");
        else if (*p == '\n')
            outf(o, "\\n");
        else
            outf(o, "%c", *p);
    }
    outf(o, "\n");
}

static void render_series(struct out *o, const char *base, const kvr_metric_t *m)
{
    if (m->type != KVR_METRIC_HISTOGRAM) {
        outf(o, "%s", m->name);
        outlabels(o, base, m->labels, NULL);
        outf(o, " ");
        outnum(o, u2d(atomic_load_explicit(&m->value, memory_order_relaxed)));
        outf(o, "\n");
        return;
    }
    /* load the buckets first: count is their sum, never less than a bucket */
    uint64_t cum = 0;
    char le[64];
    for (size_t i = 0; i <= m->n_bounds; i++) {
        cum += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
        if (i < m->n_bounds)
            snprintf(le, sizeof le, "le=\"%.17g\"", m->bounds[i]);
        else
            snprintf(le, sizeof le, "le=\"+Inf\"");
        outf(o, "%s_bucket", m->name);
        outlabels(o, base, m->labels, le);
        outf(o, " %llu\n", (unsigned long long)cum);
    }
    outf(o, "%s_sum", m->name);
    outlabels(o, base, m->labels, NULL);
    outf(o, " ");
    outnum(o, u2d(atomic_load_explicit(&m->value, memory_order_relaxed)));
    outf(o, "\n%s_count", m->name);
    outlabels(o, base, m->labels, NULL);
    outf(o, " %llu\n", (unsigned long long)cum);
}

char *kvr_metrics_render(kvr_metrics_t *reg, size_t *len)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    struct out o = {0};
    outf(&o, "%s", "");
    pthread_mutex_lock(&reg->mu);
    for (size_t i = 0; i < reg->n; i++) {
        const kvr_metric_t *m = reg->series[i];
        bool seen = false; /* the family was printed with an earlier series */
        for (size_t j = 0; j < i && !seen; j++)
            seen = !strcmp(reg->series[j]->name, m->name);
        if (seen)
            continue;
        outf(&o, "# HELP %s", m->name);
        render_help(&o, m->help);
        outf(&o, "# TYPE %s %s\n", m->name, types[m->type]);
        for (size_t j = i; j < reg->n; j++)
            if (!strcmp(reg->series[j]->name, m->name))
                render_series(&o, reg->base, reg->series[j]);
    }
    pthread_mutex_unlock(&reg->mu);
    if (o.failed) {
        free(o.p);
        return NULL;
    }
    if (len)
        *len = o.n;
    return o.p;
}
