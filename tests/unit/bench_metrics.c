/*
 * bench_metrics.c - what one observation of a histogram costs (the decode
 * node's per-token kvrail:inter_token_latency_seconds update): 20 M calls,
 * best of 5, in ns per call.  Not a test; docs/metrics.md relates it to the
 * decode step.  Run: build/tests/unit/bench_metrics
 */
#include <stdio.h>

#include "kvr_clock.h"
#include "kvr_metrics.h"

int main(void)
{
    kvr_metrics_t *reg;
    if (kvr_metrics_create("node=\"d\",role=\"decode\",model=\"m\"", &reg) != KVR_OK)
        return 1;
    kvr_metric_t *h =
        kvr_metrics_get(reg, KVR_METRIC_HISTOGRAM, "kvrail:inter_token_latency_seconds", "gap",
                        NULL, kvr_metrics_latency_buckets, kvr_metrics_latency_n);
    const int n = 20000000;
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t t0 = kvr_now_ns();
        for (int i = 0; i < n; i++)
            kvr_metric_observe(h, (double)(i & 1023) * 1e-5);
        double ns = (double)(kvr_now_ns() - t0) / n;
        if (ns < best)
            best = ns;
    }
    printf("kvr_metric_observe (histogram, %zu buckets): %.1f ns per call (best of 5 x %d)\n",
           kvr_metrics_latency_n, best, n);
    kvr_metrics_destroy(reg);
    return 0;
}
