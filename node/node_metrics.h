/*
 * node_metrics.h - a prefill or decode node's Prometheus endpoint: the
 * node's counters (the same figures as its stats file) in the shared
 * metrics registry (common/kvr_metrics.h), served on the node's
 * metrics_port from the cluster file (/metrics, /health, /ready).
 */
#ifndef KVR_NODE_METRICS_H
#define KVR_NODE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "node.h"

/** Starts the endpoint when the node has a metrics_port (else does
 *  nothing).  A port that cannot be served is a start-up error. */
kvr_status_t kvr_node_metrics_start(kvr_node_t *node, char *err, size_t err_len);

/** Mirrors the node's figures into the registry (at most once per
 *  KVR_NODE_METRICS_PERIOD_MS) and sets /ready (registered with the
 *  router).  Called by the loop thread; returns the ms until it is due
 *  next (INT32_MAX when the endpoint is off). */
int kvr_node_metrics_update(kvr_node_t *node, uint64_t now_ns);

/** Stops the endpoint. */
void kvr_node_metrics_stop(void);

#define KVR_NODE_METRICS_PERIOD_MS 1000

#endif
