/*
 * rt_metrics.h - the router's Prometheus endpoint: its counters, request
 * latencies and one row of series per node, in the shared metrics registry
 * (common/kvr_metrics.h), served on the router's metrics_port from the
 * cluster file (/metrics, /health, /ready).  Everything here runs on the
 * router's loop thread except the HTTP server's own thread.
 */
#ifndef RT_METRICS_H
#define RT_METRICS_H

#include "router.h"

/** Starts the endpoint when the router's node entry has a metrics_port
 *  (else does nothing); false (logged) when the port cannot be served. */
bool rt_metrics_start(rt_t *r);

/** Mirrors the router's counters and the nodes' rows into the registry, at
 *  most once per second, and sets /ready (a live decode node: requests can
 *  be served, prefilled remotely or locally). */
void rt_metrics_update(rt_t *r, uint64_t now);

/** A request ended with code and fin (its TTFT, end-to-end time, time per
 *  output token and tokens go into the histograms; a success is counted by
 *  its finish reason). */
void rt_metrics_request_done(rt_t *r, const struct rt_req *q, kvr_status_t code,
                             Kvrail__FinishReason fin, uint64_t now);

/** A request was migrated to another decode node (its node died or
 *  re-registered mid-stream). */
void rt_metrics_migration(void);

void rt_metrics_stop(void);

#endif
