/*
 * node.h - the runtime that kvrail-prefill and kvrail-decode share: command
 * line (--config FILE --node NAME), cluster file, model, transfer engine,
 * the DEALER socket to the router's node endpoint (routing id = node name),
 * registration and heartbeats, the poll loop, the P/D notification format
 * and the stats file that tests read.
 *
 * One thread runs everything: kvr_node_poll() waits on the router socket and
 * the transfer engine's event fd (or a short timeout), progresses the
 * engine and hands each decoded control message to the role's handler.
 */
#ifndef KVR_NODE_H
#define KVR_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_cluster.h"
#include "kvr_engine.h"
#include "kvr_proto.h"
#include "kvr_sample.h"
#include "kvr_status.h"
#include "kvr_xfer.h"

/* ---- P -> D notification (after the KV writes, on the same peer) ---- */

#define KVR_NOTIF_MAGIC   0x4e52564bu /* "KVRN" */
#define KVR_NOTIF_VERSION 1

enum kvr_notif_kind {
    KVR_NOTIF_HELLO = 1,    /* first message on a new peer: layout + fingerprint */
    KVR_NOTIF_KV_READY = 2, /* every layer of a request written; first token */
    KVR_NOTIF_KV_ABORT = 3, /* the request stopped; no more writes will follow */
};

struct kvr_notif {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint64_t request_id;
    uint64_t incarnation; /* of the sender */
    char node[KVR_CLUSTER_NAME_MAX];
    /* HELLO */
    uint64_t fingerprint;
    int32_t n_layers, n_kv_heads, head_dim, block_size, dtype;
    uint32_t proto_version;
    /* KV_READY */
    int32_t first_token;
    float logprob;
    uint32_t n_tokens; /* prompt tokens */
    uint32_t cached_tokens;
    uint64_t bytes;       /* bytes written for the request */
    int32_t status;       /* KV_ABORT: why */
    uint32_t first_block; /* KV_READY/KV_ABORT: the decode node's block id of the first
                             uncached block: tells two dispatches of one request apart */
};

/* ---- the node ---- */

typedef struct kvr_node kvr_node_t;

/** Handler of one decoded control message (msg is freed after it returns). */
typedef void (*kvr_node_msg_fn)(void *arg, unsigned method, ProtobufCMessage *msg);

struct kvr_node {
    kvr_cluster_t *cluster;
    const kvr_cluster_node_t *self;
    enum kvr_node_role role;
    char name[KVR_CLUSTER_NAME_MAX];
    uint64_t incarnation;
    const char *stats_path; /* --stats-file, or NULL */

    kvr_model_t *model;
    struct kvr_kv_layout layout;
    uint64_t fingerprint;
    char fingerprint_str[24];

    kvr_xfer_engine_t *xfer;
    int xfer_fd; /* -1: none (poll with a short timeout) */
    void *zctx;
    void *sock;

    bool registered;
    uint64_t last_register_ns, last_heartbeat_ns, last_hb_reply_ns;
    uint32_t heartbeat_ms;
    uint64_t bad_frames;

    kvr_node_msg_fn on_msg;
    void *on_msg_arg;
};

/** Parses the command line, loads the cluster file and the model, checks
 *  that --node names a node of `role`, creates the transfer engine (notif_cb
 *  may be NULL) and connects to the router.  err receives what was wrong.
 *  @return KVR_OK; KVR_ERR_INVALID (usage, cluster file, role);
 *          KVR_ERR_NOT_FOUND; errors of model load and engine create. */
kvr_status_t kvr_node_init(kvr_node_t *node, int argc, char **argv, enum kvr_node_role role,
                           kvr_xfer_notif_cb_t notif_cb, void *notif_arg, char *err,
                           size_t err_len);
void kvr_node_fini(kvr_node_t *node);

/** Sends one message to the router (never blocks; a full queue is logged).
 *  @return as kvr_proto_send. */
kvr_status_t kvr_node_send(kvr_node_t *node, unsigned method, const ProtobufCMessage *msg);

/** Fills the common fields of a RegisterRequest (name, role, fingerprint,
 *  layout, transport, address blob, pid, host, incarnation); layout_p and
 *  addr are storage owned by the caller that must outlive the send. */
void kvr_node_fill_register(kvr_node_t *node, Kvrail__RegisterRequest *r,
                            Kvrail__KvLayout *layout_p, const void *addr, size_t addr_len);

/** Waits up to timeout_ms for a control message or transfer event, then
 *  progresses the transfer engine and dispatches every waiting message.
 *  Returns the number of messages and transfer events handled. */
int kvr_node_poll(kvr_node_t *node, int timeout_ms);

/** Dispatches only the control messages already waiting (no wait, no
 *  transfer progress): for use from inside a long computation. */
int kvr_node_drain(kvr_node_t *node);

/** True when a Register (re)send is due: not registered and 1 s passed. */
bool kvr_node_register_due(kvr_node_t *node);
/** True when the heartbeat interval passed since the last one (and marks it sent). */
bool kvr_node_heartbeat_due(kvr_node_t *node);

/** Writes text to the stats file atomically (tmp + rename). */
void kvr_node_write_stats(const kvr_node_t *node, const char *json);

/** Sets *stop when SIGINT/SIGTERM arrived. */
bool kvr_node_stopping(void);

/** Converts proto sampling parameters (0 = default for top_p and
 *  repetition_penalty) to the sampler's; seed given separately. */
void kvr_node_sampling(const Kvrail__SamplingParams *sp, uint64_t seed,
                       struct kvr_sample_params *out_p);

#endif
