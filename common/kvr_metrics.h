/*
 * kvr_metrics.h - the metrics registry every kvrail process exposes to
 * Prometheus (text exposition format 0.0.4): counters, gauges and
 * histograms with fixed buckets, each series a metric name plus its label
 * set, and labels common to the whole process (node, role, model).
 *
 * A series is created once (a mutex guards the bounded series table) and
 * then updated with relaxed atomics, without a lock or an allocation, from
 * any thread: a node's loop thread and its engine worker may both update.
 * Rendering takes the table's mutex only to walk it; it reads every value
 * with an atomic load, so a scrape never stops an update.
 */
#ifndef KVR_METRICS_H
#define KVR_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#define KVR_METRICS_MAX_SERIES  1024 /* series per registry; more is refused */
#define KVR_METRICS_MAX_BUCKETS 32   /* finite bucket bounds per histogram */
#define KVR_METRICS_LABELS_MAX  512  /* label text of one series */

enum kvr_metric_type {
    KVR_METRIC_COUNTER = 0,
    KVR_METRIC_GAUGE = 1,
    KVR_METRIC_HISTOGRAM = 2,
};

typedef struct kvr_metrics kvr_metrics_t;
typedef struct kvr_metric kvr_metric_t;

/** Creates a registry.  base_labels ("node=\"d0\",role=\"decode\"", or NULL)
 *  is put on every series; build it with kvr_metrics_label(). */
kvr_status_t kvr_metrics_create(const char *base_labels, kvr_metrics_t **out);
void kvr_metrics_destroy(kvr_metrics_t *reg);

/** The series name{labels} of a type: the existing one, or a new one.
 *  labels is "k=\"v\",k2=\"v2\"" or NULL; bounds (histograms only) are the
 *  finite upper bounds, increasing (+Inf is implied).  NULL (and one log
 *  line) when the name is not a Prometheus name, it exists with another
 *  type or help, the table is full, or out of memory: updates to NULL are
 *  no-ops, so a missing series never crashes the caller. */
kvr_metric_t *kvr_metrics_get(kvr_metrics_t *reg, enum kvr_metric_type type, const char *name,
                              const char *help, const char *labels, const double *bounds,
                              size_t n_bounds);

static inline kvr_metric_t *kvr_metrics_counter(kvr_metrics_t *reg, const char *name,
                                                const char *help, const char *labels)
{
    return kvr_metrics_get(reg, KVR_METRIC_COUNTER, name, help, labels, NULL, 0);
}

static inline kvr_metric_t *kvr_metrics_gauge(kvr_metrics_t *reg, const char *name,
                                              const char *help, const char *labels)
{
    return kvr_metrics_get(reg, KVR_METRIC_GAUGE, name, help, labels, NULL, 0);
}

/** Adds v (a counter takes only v >= 0). */
void kvr_metric_add(kvr_metric_t *m, double v);
/** Sets a gauge; or a counter mirrored from a cumulative figure kept
 *  elsewhere (a counter never goes down: a smaller v is ignored). */
void kvr_metric_set(kvr_metric_t *m, double v);
/** Counts v into a histogram's bucket and sum. */
void kvr_metric_observe(kvr_metric_t *m, double v);
/** The current value of a counter or gauge (histograms: the count). */
double kvr_metric_value(const kvr_metric_t *m);

/** The registry in the text exposition format, malloc'd and NUL-terminated
 *  (*len without the NUL); NULL when out of memory. */
char *kvr_metrics_render(kvr_metrics_t *reg, size_t *len);

/** Appends key="value" (value escaped as the format wants: \\ \" \n) to the
 *  label text buf, with a comma when buf is not empty.  Returns buf. */
char *kvr_metrics_label(char *buf, size_t size, const char *key, const char *value);

/** Buckets for latencies in seconds (100 us .. 60 s), and their count. */
extern const double kvr_metrics_latency_buckets[];
extern const size_t kvr_metrics_latency_n;

#endif
