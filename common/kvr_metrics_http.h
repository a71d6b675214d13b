/*
 * kvr_metrics_http.h - the HTTP endpoint of a process's metrics registry:
 * GET /metrics (Prometheus text format 0.0.4), GET /health (200 while the
 * process runs) and GET /ready (200 once the process says it is ready,
 * 503 with the reason before).  It runs on its own thread (libmicrohttpd's
 * internal poll thread), so a slow or broken HTTP client never touches the
 * process's event loop; connections are bounded and time out.
 */
#ifndef KVR_METRICS_HTTP_H
#define KVR_METRICS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_metrics.h"
#include "kvr_status.h"

#define KVR_METRICS_HTTP_MAX_CONN 32 /* concurrent connections; more are refused */
#define KVR_METRICS_HTTP_TIMEOUT  5  /* seconds a connection may idle */

typedef struct kvr_metrics_http kvr_metrics_http_t;

/** Serves reg on host:port (host resolved to its IPv4 address; "localhost"
 *  is loopback, "0.0.0.0" every interface).  Not ready until told.
 *  @return KVR_OK; KVR_ERR_INVALID (host does not resolve); KVR_ERR_IO
 *          (the port cannot be bound: err says which and why);
 *          KVR_ERR_UNSUPPORTED (built without libmicrohttpd). */
kvr_status_t kvr_metrics_http_start(kvr_metrics_t *reg, const char *host, uint16_t port,
                                    kvr_metrics_http_t **out, char *err, size_t err_len);

/** Sets what /ready answers: 200, or 503 with why (copied). Any thread. */
void kvr_metrics_http_set_ready(kvr_metrics_http_t *srv, bool ready, const char *why);

/** Stops the thread and closes the socket. NULL is a no-op. */
void kvr_metrics_http_stop(kvr_metrics_http_t *srv);

#endif
