/*
 * node_metrics.h - a prefill or decode node's Prometheus endpoint: the
 * node's counters (the same figures as its stats file) in the shared
 * metrics registry (common/kvr_metrics.h), served on the node's
 * metrics_port from the cluster file (/metrics, /health, /ready), and the
 * per-event histograms the roles feed directly (inter-token latency, KV
 * bytes and seconds per transfer, transfer failures by status).
 */
#ifndef KVR_NODE_METRICS_H
#define KVR_NODE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "node.h"

/* The figures a role hands to the mirror (ops->counters), by id: cumulative
 * counts and current levels, read straight from the role's fields. */
enum kvr_node_counter {
    /* prefill */
    KVR_NC_PREFILLS_OK,
    KVR_NC_PREFILLS_FAILED,
    KVR_NC_PREFILLS_CANCELED,
    KVR_NC_BYTES_PUSHED,
    KVR_NC_TRANSFER_NS,
    KVR_NC_DESCRIPTORS_RAW,
    KVR_NC_DESCRIPTORS_POSTED,
    KVR_NC_COMPUTED_TOKENS,
    KVR_NC_LOCAL_CACHED_TOKENS,
    KVR_NC_QUEUED,
    KVR_NC_ACTIVE,
    KVR_NC_BATCHED_PREFILLS,
    KVR_NC_STAGING_TOTAL,
    KVR_NC_STAGING_FREE,
    KVR_NC_STAGING_CACHED,
    /* decode */
    KVR_NC_TOTAL_BLOCKS,
    KVR_NC_FREE_BLOCKS,
    KVR_NC_EVICTABLE_BLOCKS,
    KVR_NC_CACHED_BLOCKS,
    KVR_NC_RESERVED_BLOCKS,
    KVR_NC_BATCH,
    KVR_NC_DONE,
    KVR_NC_FAILED,
    KVR_NC_CANCELED,
    KVR_NC_EXPIRED,
    KVR_NC_REJECTED,
    KVR_NC_LOCAL_PREFILLS,
    KVR_NC_REMOTE_PREFILLS,
    KVR_NC_KV_BYTES_RECEIVED,
    KVR_NC_TOKENS_OUT,
    KVR_NC_STEPS,
    KVR_NC_CACHED_TOKENS_REUSED,
    KVR_NC_PREEMPTIONS,
    KVR_NC_BAD_NOTIFICATIONS,
    KVR_NC_CHUNKS,
    KVR_NC_STEP_NS_LAST,
    KVR_NC_ITL_NS_MAX,
    KVR_NC_LEASE_RENEWALS,
    KVR_NC_COUNT
};

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

/* Per-event figures (loop thread; nothing when the endpoint is off). */
/** The gap between two tokens of one sequence (decode). */
void kvr_node_metrics_itl(uint64_t ns);
/** One request's KV transfer completed: bytes written, time on the wire
 *  (prefill). */
void kvr_node_metrics_kv_transfer(uint64_t bytes, uint64_t ns);
/** One request's KV transfer failed with st (prefill). */
void kvr_node_metrics_transfer_failed(kvr_status_t st);

#define KVR_NODE_METRICS_PERIOD_MS 1000

#endif
