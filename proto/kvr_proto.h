/*
 * kvr_proto.h - framing of kvrail's control plane over ZeroMQ.
 *
 * Every message is two frames (plus the routing-id frame a ROUTER socket adds):
 *
 *   [envelope: 16 bytes][payload: one protobuf message, possibly empty]
 *
 * envelope, little-endian:
 *   0..1  magic 'K' 'R'
 *   2     protocol version (KVR_PROTO_VERSION)
 *   3     flags (KVR_PROTO_F_*)
 *   4..5  method (enum Kvrail__Method from kvrail_common.proto)
 *   6..7  reserved, 0
 *   8..15 call id (chosen by the caller; replies and stream frames echo it)
 *
 * A frame with KVR_PROTO_F_ERROR carries a kvrail.Status payload whatever the
 * method (method 0 and call id 0: the reply to a message whose envelope was
 * unreadable).  A server-streaming call ends with a frame flagged KVR_PROTO_F_END
 * (for Generate its payload is kvrail.StreamEnd).  Sends and receives never
 * block (ZMQ_DONTWAIT); the caller polls.  Decoding reports garbage,
 * truncation, a wrong version and unknown methods as distinct statuses with a
 * message saying what was wrong.
 */
#ifndef KVR_PROTO_H
#define KVR_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "kvr_cluster.h"
#include "kvr_status.h"
#include "kvrail_common.pb-c.h"
#include "kvrail_client.pb-c.h"
#include "kvrail_node.pb-c.h"

#define KVR_PROTO_VERSION 1
#define KVR_PROTO_HDR_LEN 16
#define KVR_PROTO_MAGIC0  'K'
#define KVR_PROTO_MAGIC1  'R'
/** Largest payload accepted (a 1M-token prompt is ~5 MB of varints). */
#define KVR_PROTO_MAX_PAYLOAD (16u << 20)
/** Largest routing id kept from a ROUTER socket. */
#define KVR_PROTO_MAX_ROUTE 256

enum kvr_proto_flag {
    KVR_PROTO_F_END = 1u << 0,   /* last frame of a call (stream end or unary reply) */
    KVR_PROTO_F_ERROR = 1u << 1, /* payload is kvrail.Status describing an error */
};

typedef struct kvr_proto_hdr {
    uint8_t version;
    uint8_t flags;
    uint16_t method;
    uint64_t call_id;
} kvr_proto_hdr_t;

/** One received message: routing id (ROUTER sockets), envelope, payload. */
typedef struct kvr_proto_frame {
    uint8_t route[KVR_PROTO_MAX_ROUTE];
    size_t route_len;
    bool have_hdr; /* the envelope parsed (call id and method are meaningful) */
    kvr_proto_hdr_t hdr;
    uint8_t *payload; /* malloc'd, owned by the frame; NULL when empty */
    size_t payload_len;
    size_t nparts; /* frames after the routing id */
    int src_fd;    /* routed: the peer's socket fd (ZMQ_SRCFD; matches monitor events), else -1 */
    char user_id[64]; /* the ZAP handler's User-Id of the peer (CURVE: the key's owner), or "" */
} kvr_proto_frame_t;

/** Writes the 16-byte envelope. */
void kvr_proto_hdr_pack(const kvr_proto_hdr_t *hdr, uint8_t out[KVR_PROTO_HDR_LEN]);

/** Parses an envelope.
 *  @return KVR_OK; KVR_ERR_CORRUPT (not 16 bytes or bad magic);
 *          KVR_ERR_VERSION (another protocol version; call id still set in
 *          *hdr_p so the caller can answer); KVR_ERR_UNSUPPORTED (unknown
 *          method; *hdr_p set). err (if non-NULL) says what was wrong. */
kvr_status_t kvr_proto_hdr_unpack(const void *buf, size_t len, kvr_proto_hdr_t *hdr_p, char *err,
                                  size_t err_len);

/** Name of a method ("GENERATE"), or NULL when the number is unknown. */
const char *kvr_proto_method_name(unsigned method);

/** Name of a method for messages: never NULL ("UNKNOWN" when unknown). */
const char *kvr_proto_method_label(unsigned method);

/** The payload message type of a request/notification of this method
 *  (replies of GENERATE/CANCEL/STATUS/REGISTER/HEARTBEAT/RESYNC have their own
 *  types: kvr_proto_method_reply_desc). NULL when unknown. */
const ProtobufCMessageDescriptor *kvr_proto_method_desc(unsigned method);
const ProtobufCMessageDescriptor *kvr_proto_method_reply_desc(unsigned method);

/** Sends [route][envelope][payload] without blocking.  route may be NULL
 *  (DEALER sockets).  msg may be NULL (empty payload).
 *  @return KVR_OK; KVR_ERR_NO_RESOURCE (EAGAIN: high-water mark reached, or
 *          ROUTER with no such peer when ZMQ_ROUTER_MANDATORY is set);
 *          KVR_ERR_NOT_FOUND (EHOSTUNREACH: peer unknown); KVR_ERR_IO. */
kvr_status_t kvr_proto_send(void *sock, const void *route, size_t route_len,
                            const kvr_proto_hdr_t *hdr, const ProtobufCMessage *msg);

/** The two parts kvr_proto_send sends: the envelope into env, the payload
 *  packed into a malloc'd *buf_p (free it).  @return KVR_OK; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_proto_pack_parts(const kvr_proto_hdr_t *hdr, const ProtobufCMessage *msg,
                                  uint8_t env[KVR_PROTO_HDR_LEN], uint8_t **buf_p, size_t *len_p);

/** Convenience: sends an error (flags END|ERROR, kvrail.Status payload). */
kvr_status_t kvr_proto_send_error(void *sock, const void *route, size_t route_len, unsigned method,
                                  uint64_t call_id, kvr_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/** Receives one whole message without blocking; all its parts are always
 *  consumed.  routed: the socket is a ROUTER (first part is the routing id).
 *  frame_p is filled as far as parsing got (route always, hdr when have_hdr);
 *  release it with kvr_proto_frame_clear().
 *  @return KVR_OK; KVR_ERR_NO_RESOURCE (nothing waiting);
 *          KVR_ERR_CORRUPT (wrong number of parts, bad envelope, oversized);
 *          KVR_ERR_VERSION; KVR_ERR_UNSUPPORTED (unknown method); KVR_ERR_IO.
 *          err says what was wrong. */
kvr_status_t kvr_proto_recv(void *sock, bool routed, kvr_proto_frame_t *frame_p, char *err,
                            size_t err_len);

/** The checks and copy of kvr_proto_recv on a message's parts however they
 *  arrived (libkvrail-client's direct link has its own): nparts parts after
 *  any routing id, env and payload the first two (NULL past nparts).  Sets
 *  frame's hdr / have_hdr, nparts and payload (copied); the caller has
 *  zeroed it and set route, src_fd, user_id.
 *  @return as kvr_proto_recv (KVR_OK; KVR_ERR_CORRUPT; KVR_ERR_VERSION;
 *          KVR_ERR_UNSUPPORTED; KVR_ERR_NO_MEMORY). */
kvr_status_t kvr_proto_frame_parts(kvr_proto_frame_t *frame, size_t nparts, const void *env,
                                   size_t env_len, const void *payload, size_t payload_len,
                                   char *err, size_t err_len);

void kvr_proto_frame_clear(kvr_proto_frame_t *frame);

/** Unpacks the payload as `desc` (NULL: the method's request type, or
 *  kvrail.Status when the frame has the ERROR flag: a caller that casts the
 *  result to the method's type must first refuse ERROR-flagged frames, or
 *  use kvr_proto_decode_request).  Free with
 *  protobuf_c_message_free_unpacked(msg, NULL).
 *  @return KVR_OK; KVR_ERR_INVALID (payload is not a valid message of that
 *          type: garbage or truncated; err says which type). */
kvr_status_t kvr_proto_decode(const kvr_proto_frame_t *frame,
                              const ProtobufCMessageDescriptor *desc, ProtobufCMessage **msg_p,
                              char *err, size_t err_len);

/** Unpacks a request or notification: the payload as the method's own
 *  type (`desc`, or the method's request type when NULL), never as
 *  kvrail.Status.  A frame with KVR_PROTO_F_ERROR is refused.
 *  @return KVR_OK; KVR_ERR_INVALID (an ERROR-flagged frame, or a payload
 *          that is not a valid message of that type); KVR_ERR_UNSUPPORTED
 *          (a method without a request type). */
kvr_status_t kvr_proto_decode_request(const kvr_proto_frame_t *frame,
                                      const ProtobufCMessageDescriptor *desc,
                                      ProtobufCMessage **msg_p, char *err, size_t err_len);

/** Packs a message into a malloc'd buffer (for tests and raw senders). */
kvr_status_t kvr_proto_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p);

/* CURVE (curve.c, docs/security.md).  Key pair NAME: KEYS/NAME.pub (public
 * key, Z85) and KEYS/NAME.key (public and secret key, mode 0600). */
#define KVR_CURVE_Z85_LEN 40

/** KVR_OK when this libzmq has CURVE; else KVR_ERR_UNSUPPORTED and why. */
kvr_status_t kvr_proto_curve_available(char *err, size_t err_len);
/** Writes a new key pair NAME into dir (NAME.key created 0600; an existing
 *  one is not overwritten).  @return KVR_OK; KVR_ERR_IO; KVR_ERR_UNSUPPORTED. */
kvr_status_t kvr_proto_curve_keygen(const char *dir, const char *name, char *err, size_t err_len);
/** Reads KEYS/NAME.pub.  @return KVR_OK; KVR_ERR_NOT_FOUND; KVR_ERR_INVALID. */
kvr_status_t kvr_proto_curve_load_public(const char *dir, const char *name,
                                         char pub_p[KVR_CURVE_Z85_LEN + 1], char *err,
                                         size_t err_len);
/** Reads KEYS/NAME.key, refused when group or others may read it.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND; KVR_ERR_INVALID. */
kvr_status_t kvr_proto_curve_load_pair(const char *dir, const char *name,
                                       char pub_p[KVR_CURVE_Z85_LEN + 1],
                                       char sec_p[KVR_CURVE_Z85_LEN + 1], char *err,
                                       size_t err_len);
/** The name of the router's key pair: its node name in the file, or "router". */
const char *kvr_proto_curve_router_name(const kvr_cluster_t *cl);
/** Makes sock (before bind) a CURVE server with the router's key pair; its
 *  peers are checked by the ZAP handler under `domain` ("node", "client"). */
kvr_status_t kvr_proto_curve_server(void *sock, const kvr_cluster_t *cl, const char *domain,
                                    char *err, size_t err_len);
/** Makes sock (before connect) a CURVE client of the router with key pair
 *  `name`; nothing when the cluster's auth is none.
 *  @return KVR_OK; KVR_ERR_NOT_FOUND / KVR_ERR_INVALID (key files);
 *          KVR_ERR_UNSUPPORTED (no CURVE in libzmq). */
kvr_status_t kvr_proto_curve_client(void *sock, const kvr_cluster_t *cl, const char *name,
                                    char *err, size_t err_len);
/** A client's CURVE keys, Z85 and binary (kvr_proto_curve_env_keys). */
struct kvr_curve_env_keys {
    char server[KVR_CURVE_Z85_LEN + 1], pub[KVR_CURVE_Z85_LEN + 1], sec[KVR_CURVE_Z85_LEN + 1];
    uint8_t server_bin[32], pub_bin[32], sec_bin[32];
};
/** The one place that reads a client's CURVE keys from the environment:
 *  KVRAIL_ROUTER_KEY (path of the router's .pub) and KVRAIL_CLIENT_KEY
 *  (path of this client's .key) into *keys_p, *set_p true; neither set:
 *  *set_p false (auth: none).  The caller zeroes *keys_p after use.
 *  @return KVR_OK; KVR_ERR_INVALID (one without the other, a bad file);
 *          KVR_ERR_NOT_FOUND. */
kvr_status_t kvr_proto_curve_env_keys(struct kvr_curve_env_keys *keys_p, bool *set_p, char *err,
                                      size_t err_len);
/** A client's CURVE keys from the environment (kvr_proto_curve_env_keys)
 *  set on sock; neither set: nothing (auth: none).  @return KVR_OK; KVR_ERR_INVALID (one
 *  without the other, a bad file); KVR_ERR_NOT_FOUND; KVR_ERR_UNSUPPORTED. */
kvr_status_t kvr_proto_curve_client_env(void *sock, char *err, size_t err_len);
/** The same with keys given (Z85): the router's public key, this side's pair. */
kvr_status_t kvr_proto_curve_client_keys(void *sock, const char *server_pub, const char *pub,
                                         const char *sec, char *err, size_t err_len);

#endif
