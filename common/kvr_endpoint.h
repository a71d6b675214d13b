/* kvr_endpoint.h: ZeroMQ endpoints as the cluster file writes them, turned
 * into what zmq_bind accepts.  zmq_bind takes an interface name or an IP
 * address, never a host name ("tcp://localhost:7700" fails with "No such
 * device"); kvr_endpoint_bind_form resolves the host of a tcp:// endpoint
 * with getaddrinfo so every bind accepts what a connect does. */
#ifndef KVR_ENDPOINT_H
#define KVR_ENDPOINT_H

#include <stddef.h>

#include "kvr_status.h"

/* Writes to OUT (size N) the endpoint EP in a form zmq_bind accepts: a
 * tcp:// endpoint whose host is a name (not "*", not an IP address) gets
 * the host's first address (IPv4 first, IPv6 in brackets); anything else is
 * copied as is.  KVR_ERR_INVALID with a message in ERR naming the endpoint
 * when the host does not resolve or OUT is too small. */
kvr_status_t kvr_endpoint_bind_form(const char *ep, char *out, size_t n, char *err, size_t errlen);

#endif
