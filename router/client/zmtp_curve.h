/*
 * zmtp_curve.h - the CURVE mechanism of libkvrail-client's direct router
 * link (zmtp_curve.c): the client side of CurveZMQ (RFC 26) as ZMTP 3.1
 * carries it (mechanism "CURVE"), on command bodies only.  zmtp.c frames
 * them, reads and writes the socket, and drops the connection with the
 * reason these functions give.  Internal to the library (not installed).
 *
 * One kvr_zmtp_curve per link holds the long-term keys (this client's
 * pair, the router's public key) and the current connection's short-term
 * state; kvr_zmtp_curve_hello starts a connection, kvr_zmtp_curve_end ends
 * it, kvr_zmtp_curve_destroy zeroes everything.
 */
#ifndef KVR_ZMTP_CURVE_H
#define KVR_ZMTP_CURVE_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#define KVR_CURVE_KEY_LEN 32

/** The keys of a CURVE client (binary, 32 bytes each). */
struct kvr_zmtp_curve_keys {
    uint8_t server[KVR_CURVE_KEY_LEN]; /* the router's long-term public key S */
    uint8_t pub[KVR_CURVE_KEY_LEN];    /* this client's long-term pair C */
    uint8_t sec[KVR_CURVE_KEY_LEN];
};

typedef struct kvr_zmtp_curve kvr_zmtp_curve_t;

#define KVR_CURVE_HELLO_LEN    200 /* the HELLO command's body */
#define KVR_CURVE_WELCOME_LEN  168
#define KVR_CURVE_INITIATE_MAX 640
#define KVR_CURVE_MSG_OVERHEAD                                                                     \
    33 /* "\7MESSAGE", nonce, MAC, flags: a MESSAGE body's bytes over its data */

/* the flags byte inside a MESSAGE box (libzmq's msg_t flags) */
#define KVR_CURVE_F_MORE    1u
#define KVR_CURVE_F_COMMAND 2u

/** A link's CURVE state for keys (copied; the caller may zero its copy).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; KVR_ERR_IO (libsodium would not
 *          initialise). */
kvr_status_t kvr_zmtp_curve_create(const struct kvr_zmtp_curve_keys *keys, kvr_zmtp_curve_t **c_p);
/** Zeroes every key (long- and short-term) and frees. */
void kvr_zmtp_curve_destroy(kvr_zmtp_curve_t *c);
/** Starts a connection: a fresh short-term pair C', nonces from 1, and its
 *  HELLO body (KVR_CURVE_HELLO_LEN bytes) into out.
 *  @return KVR_OK; KVR_ERR_INVALID (the router's key is no Curve25519 key). */
kvr_status_t kvr_zmtp_curve_hello(kvr_zmtp_curve_t *c, uint8_t out[KVR_CURVE_HELLO_LEN]);
/** Ends the connection: its short-term keys zeroed. */
void kvr_zmtp_curve_end(kvr_zmtp_curve_t *c);
/** Checks the router's WELCOME body (exactly KVR_CURVE_WELCOME_LEN bytes,
 *  its box from S to C') and writes the INITIATE body (cookie, Box[C +
 *  vouch + metadata Socket-Type DEALER](C'->S')) into out.
 *  @return its length; 0 on a bad WELCOME (err says what was wrong). */
size_t kvr_zmtp_curve_welcome(kvr_zmtp_curve_t *c, const uint8_t *body, size_t len,
                              uint8_t out[KVR_CURVE_INITIATE_MAX], char *err, size_t err_len);
/** Opens the router's READY body in place; *meta_p / *meta_len_p: its
 *  metadata (properties), inside body.
 *  @return KVR_OK; KVR_ERR_CORRUPT (size, box; err says which). */
kvr_status_t kvr_zmtp_curve_ready(kvr_zmtp_curve_t *c, uint8_t *body, size_t len,
                                  const uint8_t **meta_p, size_t *meta_len_p, char *err,
                                  size_t err_len);
/** Writes a MESSAGE body of len + KVR_CURVE_MSG_OVERHEAD bytes at body:
 *  data (which may already lie at body + KVR_CURVE_MSG_OVERHEAD, or
 *  anywhere else not overlapping body's first 33 bytes) sealed under the
 *  next nonce with flags (KVR_CURVE_F_*) inside the box. */
void kvr_zmtp_curve_seal(kvr_zmtp_curve_t *c, uint8_t *body, unsigned flags, const void *data,
                         size_t len);
/** Opens a MESSAGE body from the router in place: its nonce must exceed
 *  every earlier one (replay), its box must open; *flags_p (KVR_CURVE_F_*),
 *  *data_p / *len_p: the data, inside body.
 *  @return KVR_OK; KVR_ERR_CORRUPT (err says what was wrong). */
kvr_status_t kvr_zmtp_curve_open(kvr_zmtp_curve_t *c, uint8_t *body, size_t len, unsigned *flags_p,
                                 const uint8_t **data_p, size_t *len_p, char *err, size_t err_len);

#endif
