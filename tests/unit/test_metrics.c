/*
 * test_metrics.c - the metrics registry (common/kvr_metrics.h): the text
 * format (HELP/TYPE once per family, base labels first, cumulative buckets,
 * _sum/_count, +Inf), label escaping, counters that never go down, exact
 * totals from two threads adding at once, and the bounds (bad names,
 * type clashes, a full table) answered with NULL, never a crash.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_metrics.h"
#include "kvr_test.h"

#define N_ADDS 200000

static void *adder(void *arg)
{
    kvr_metric_t **m = arg;
    for (int i = 0; i < N_ADDS; i++) {
        kvr_metric_add(m[0], 1);
        kvr_metric_observe(m[1], (i & 1) ? 0.5 : 2.0);
    }
    return NULL;
}

static int contains(const char *text, const char *line)
{
    if (!strstr(text, line))
        fprintf(stderr, "missing line: %s\n--- text ---\n%s", line, text);
    return strstr(text, line) != NULL;
}

int main(void)
{
    char base[KVR_METRICS_LABELS_MAX] = "";
    kvr_metrics_label(base, sizeof base, "node", "d\"0\\\n");
    KVR_CHECK(!strcmp(base, "node=\"d\\\"0\\\\\\n\""));
    kvr_metrics_label(base, sizeof base, "role", "decode");
    kvr_metrics_t *reg = NULL;
    KVR_CHECK_STATUS(kvr_metrics_create(base, &reg), KVR_OK);

    kvr_metric_t *ok = kvr_metrics_counter(reg, "kvrail_x_total", "X by result", "result=\"ok\"");
    kvr_metric_t *g = kvr_metrics_gauge(reg, "kvrail:level", "A level", NULL);
    kvr_metric_t *bad = kvr_metrics_counter(reg, "kvrail_x_total", "X by result", "result=\"bad\"");
    KVR_CHECK(ok && g && bad && ok != bad);
    KVR_CHECK(kvr_metrics_counter(reg, "kvrail_x_total", "X by result", "result=\"ok\"") == ok);
    KVR_CHECK(kvr_metrics_gauge(reg, "kvrail_x_total", "h", NULL) == NULL); /* type clash */
    KVR_CHECK(kvr_metrics_counter(reg, "9bad", "h", NULL) == NULL);
    KVR_CHECK(kvr_metrics_counter(reg, "bad-name", "h", NULL) == NULL);
    double inc[] = {1, 1};
    KVR_CHECK(kvr_metrics_get(reg, KVR_METRIC_HISTOGRAM, "h_bad", "h", NULL, inc, 2) == NULL);
    kvr_metric_add(NULL, 1); /* no-ops */
    kvr_metric_observe(NULL, 1);

    kvr_metric_add(ok, 3);
    kvr_metric_add(ok, -1); /* a counter never goes down */
    kvr_metric_set(ok, 2);
    KVR_CHECK(kvr_metric_value(ok) == 3);
    kvr_metric_set(ok, 7);
    KVR_CHECK(kvr_metric_value(ok) == 7);
    kvr_metric_set(g, 0.25);
    kvr_metric_add(g, -1);
    KVR_CHECK(kvr_metric_value(g) == -0.75);

    double b[] = {0.1, 1};
    kvr_metric_t *h =
        kvr_metrics_get(reg, KVR_METRIC_HISTOGRAM, "kvrail_lat_seconds", "Latency", NULL, b, 2);
    KVR_CHECK(h);
    kvr_metric_observe(h, 0.05);
    kvr_metric_observe(h, 0.1); /* le is inclusive */
    kvr_metric_observe(h, 0.5);
    kvr_metric_observe(h, 3);

    size_t len = 0;
    char *t = kvr_metrics_render(reg, &len);
    KVR_CHECK(t && strlen(t) == len);
    const char *lb = "node=\"d\\\"0\\\\\\n\",role=\"decode\"";
    char want[512];
    KVR_CHECK(contains(t, "# HELP kvrail_x_total X by result\n# TYPE kvrail_x_total counter\n"));
    snprintf(want, sizeof want,
             "kvrail_x_total{%s,result=\"ok\"} 7\nkvrail_x_total{%s,result=\"bad\"} 0\n", lb, lb);
    KVR_CHECK(contains(t, want)); /* one family together, though registered apart */
    snprintf(want, sizeof want, "# TYPE kvrail:level gauge\nkvrail:level{%s} -0.75\n", lb);
    KVR_CHECK(contains(t, want));
    snprintf(want, sizeof want,
             "# TYPE kvrail_lat_seconds histogram\n"
             "kvrail_lat_seconds_bucket{%s,le=\"0.10000000000000001\"} 2\n"
             "kvrail_lat_seconds_bucket{%s,le=\"1\"} 3\n"
             "kvrail_lat_seconds_bucket{%s,le=\"+Inf\"} 4\n"
             "kvrail_lat_seconds_sum{%s} 3.6499999999999999\n"
             "kvrail_lat_seconds_count{%s} 4\n",
             lb, lb, lb, lb, lb);
    KVR_CHECK(contains(t, want));
    char *p = t;
    int help = 0;
    while ((p = strstr(p, "# HELP kvrail_x_total")) != NULL) {
        help++;
        p++;
    }
    KVR_CHECK_EQ(help, 1);
    free(t);

    /* two threads at once: exact totals */
    kvr_metric_t *pair[2] = {
        kvr_metrics_counter(reg, "kvrail_adds_total", "Adds", NULL),
        kvr_metrics_get(reg, KVR_METRIC_HISTOGRAM, "kvrail_obs", "Observations", NULL, b, 2)};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        KVR_CHECK(pthread_create(&th[i], NULL, adder, pair) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    KVR_CHECK(kvr_metric_value(pair[0]) == 2.0 * N_ADDS);
    KVR_CHECK(kvr_metric_value(pair[1]) == 2.0 * N_ADDS);
    t = kvr_metrics_render(reg, NULL);
    snprintf(want, sizeof want, "kvrail_obs_sum{%s} %d\n", lb, (int)(2 * N_ADDS / 2 * 2.5));
    KVR_CHECK(contains(t, want));
    free(t);

    /* the table is bounded */
    kvr_metrics_t *small = NULL;
    KVR_CHECK_STATUS(kvr_metrics_create(NULL, &small), KVR_OK);
    char l[64];
    for (int i = 0; i < KVR_METRICS_MAX_SERIES; i++) {
        snprintf(l, sizeof l, "i=\"%d\"", i);
        KVR_CHECK(kvr_metrics_counter(small, "kvrail_many_total", "Many", l));
    }
    KVR_CHECK(kvr_metrics_counter(small, "kvrail_many_total", "Many", "i=\"x\"") == NULL);
    t = kvr_metrics_render(small, NULL);
    KVR_CHECK(t && contains(t, "kvrail_many_total{i=\"1023\"} 0\n"));
    free(t);
    kvr_metrics_destroy(small);
    kvr_metrics_destroy(reg);
    printf("metrics registry ok\n");
    return 0;
}
