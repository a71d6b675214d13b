/*
 * zmtp.h - libkvrail-client's direct router link (zmtp.c): a ZeroMQ DEALER
 * peer spoken by the library itself, ZMTP 3.1 (RFC 37) with the NULL or the
 * CURVE mechanism (zmtp_curve.c) over one non-blocking TCP socket, with no
 * ZeroMQ context and no I/O thread: the caller's own loop reads and writes
 * the socket.  Internal to the library (not installed).
 *
 * kvr_zmtp_fd() is an epoll descriptor that stays the same across
 * reconnects; it is readable (level-triggered) whenever kvr_zmtp_io() has
 * work: bytes from the router, room to write queued bytes, a reconnect
 * timer.  Messages are queued whole (kvr_zmtp_send) and received whole
 * (kvr_zmtp_recv); every byte from the peer is checked and every buffer is
 * bounded, so a broken or hostile peer costs a reconnect, never a crash or
 * unbounded memory.
 */
#ifndef KVR_ZMTP_H
#define KVR_ZMTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvr_status.h"
#include "zmtp_curve.h"

typedef struct kvr_zmtp kvr_zmtp_t;

#define KVR_ZMTP_MAX_PARTS 8 /* parts of one message (the protocol's have 2) */

/* what kvr_zmtp_io saw happen */
#define KVR_ZMTP_EV_CONNECTED 1u /* a connection completed its handshake */
#define KVR_ZMTP_EV_LOST      2u /* a connection that had completed it went down */

/** One received message: its parts point into the link's buffer, valid
 *  until the next call on the link. */
struct kvr_zmtp_msg {
    size_t nparts;
    const uint8_t *part[KVR_ZMTP_MAX_PARTS];
    size_t len[KVR_ZMTP_MAX_PARTS];
};

/** Opens a link to endpoint ("tcp://HOST:PORT"; HOST resolved now) and
 *  starts connecting; max_frame bounds a frame from the peer.  curve: the
 *  keys of a CURVE client (copied; zeroed when the link is closed), or NULL
 *  for the NULL mechanism; the peer must use the same mechanism.
 *  @return KVR_OK; KVR_ERR_INVALID (endpoint: err says why);
 *          KVR_ERR_NO_MEMORY; KVR_ERR_IO (err says why). */
kvr_status_t kvr_zmtp_open(const char *endpoint, size_t max_frame,
                           const struct kvr_zmtp_curve_keys *curve, kvr_zmtp_t **z_p, char *err,
                           size_t err_len);
void kvr_zmtp_close(kvr_zmtp_t *z);
/** The descriptor to wait on (see above). */
int kvr_zmtp_fd(const kvr_zmtp_t *z);
/** Reads, writes, reconnects: whatever can be done without waiting.
 *  @return KVR_ZMTP_EV_* bits. */
unsigned kvr_zmtp_io(kvr_zmtp_t *z);
/** Queues a message of n parts (written at once when the link is up and
 *  its queue empty).  @return KVR_OK; KVR_ERR_NO_RESOURCE (queue full);
 *  KVR_ERR_INVALID (no parts, too many). */
kvr_status_t kvr_zmtp_send(kvr_zmtp_t *z, const struct iovec *parts, size_t n);
/** The next whole message received.  @return KVR_OK; KVR_ERR_NO_RESOURCE
 *  (none yet). */
kvr_status_t kvr_zmtp_recv(kvr_zmtp_t *z, struct kvr_zmtp_msg *m);
/** Whether a connection is up (handshake done). */
bool kvr_zmtp_up(const kvr_zmtp_t *z);
/** Why the last connection failed or was dropped ("" if none). */
const char *kvr_zmtp_error(const kvr_zmtp_t *z);

#endif
