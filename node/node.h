/*
 * node.h - the runtime that kvrail-prefill and kvrail-decode share: command
 * line (--config FILE --node NAME), cluster file, model, transfer engine,
 * the DEALER socket to the router's node endpoint (routing id = node name),
 * registration and heartbeats, the event loop and the stats file that
 * tests read.  The rest of node/ is what both roles use besides: the KV
 * pool (pool.h), the block table (blocktab.h), the engine worker
 * (worker.h) and the P -> D notification codec (notif.h).
 *
 * Two threads: the loop (kvr_node_run) waits on the router socket, the
 * transfer engine's event fd and the engine worker's event socket, with a
 * timeout set by the next due timer (heartbeat, registration, stats, the
 * role's own); it progresses the transfer engine and hands each decoded
 * control message and each worker event to the role.  The engine worker
 * thread runs the model and nothing else, so the loop answers the router
 * within milliseconds during any computation.
 */
#ifndef KVR_NODE_H
#define KVR_NODE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_cluster.h"
#include "kvr_engine.h"
#include "kvr_proto.h"
#include "kvr_sample.h"
#include "kvr_status.h"
#include "kvr_xfer.h"
#include "notif.h"
#include "worker.h"

/* ---- the node ---- */

typedef struct kvr_node kvr_node_t;

struct kvr_sbuf;

/** What a role plugs into the loop (kvr_node_run); every callback runs on
 *  the loop thread with the role's arg. */
struct kvr_node_ops {
    /* sends the role's RegisterRequest (kvr_node_fill_register + its fields) */
    void (*send_register)(void *arg);
    /* sends the role's Heartbeat */
    void (*send_heartbeat)(void *arg);
    /* one decoded control message (freed after it returns) */
    void (*on_msg)(void *arg, unsigned method, ProtobufCMessage *msg);
    /* one event of the engine worker */
    void (*on_worker)(void *arg, const struct kvr_worker_event *ev);
    /* the role's work between waits; returns how long the loop may wait
     * for input (ms; 0 = come back at once) */
    int (*turn)(void *arg);
    /* appends the role's fields to the stats object (after the common ones,
     * each starting with ", ") */
    void (*stats)(void *arg, struct kvr_sbuf *b);
    /* hands the role's figures to the metrics mirror (node_metrics.h):
     * put(ctx, id, value) once per figure, no rendering, no allocation */
    void (*counters)(void *arg, void (*put)(void *ctx, int id, double v), void *ctx);
};

struct kvr_node {
    kvr_cluster_t *cluster;
    const kvr_cluster_node_t *self;
    enum kvr_node_role role;
    char name[KVR_CLUSTER_NAME_MAX];
    uint64_t incarnation;
    const char *stats_path; /* --stats-file, or NULL */
    const char *kernels;    /* the engine kernels' bit class (kvr_engine_kernels()), or
                               NULL: registered in the KV layout descriptor */

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
    /* the wait before the next REGISTER while unregistered: 1 s (0), doubled
     * by each refusal up to KVR_NODE_REGISTER_BACKOFF_MAX_MS, 1 s again once
     * registered: a node the router keeps refusing (another model, layout or
     * kernels than the live nodes') retries, as the refusal can pass (the
     * live node it clashed with dies), but neither floods the router nor
     * writes its log full, a line a second for as long as it runs */
    uint32_t register_retry_ms;
    uint32_t heartbeat_ms;
    uint64_t bad_frames;

    kvr_worker_t *worker; /* NULL until kvr_node_start_worker */

    const struct kvr_node_ops *ops;
    void *ops_arg;
    bool stats_dirty;
    uint64_t last_stats_ns;
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

/** Creates the engine worker (worker.h) that owns the node's compute
 *  context; its events reach ops->on_worker from then on.
 *  @return as kvr_worker_create. */
kvr_status_t kvr_node_start_worker(kvr_node_t *node, const struct kvr_ctx_opts *opts, char *err,
                                   size_t err_len);

/** Runs the loop until SIGINT/SIGTERM: registration (again every second
 *  until the router accepts), heartbeats every interval, ops->turn, the
 *  wait, the dispatch of messages and worker events, and the stats file
 *  (when dirty, at most every 50 ms; every 500 ms regardless). */
void kvr_node_run(kvr_node_t *node, const struct kvr_node_ops *ops, void *arg);

/** Marks the stats file for rewriting at the next chance. */
void kvr_node_stats_dirty(kvr_node_t *node);

/** Whether the router has accepted this node's registration. */
static inline bool kvr_node_registered(const kvr_node_t *node)
{
    return node->registered;
}

/* ---- a growable text buffer for the stats JSON ---- */

struct kvr_sbuf {
    char *p;
    size_t n, cap;
    bool failed; /* an allocation failed: the text is incomplete */
};

void kvr_sbuf_printf(struct kvr_sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** Renders the node's stats object (common fields, then ops->stats) into b:
 *  what the stats file holds and what the metrics mirror copies. */
void kvr_node_stats_render(kvr_node_t *node, struct kvr_sbuf *b);

/** Sets *stop when SIGINT/SIGTERM arrived. */
bool kvr_node_stopping(void);

/** Converts proto sampling parameters (0 = default for top_p and
 *  repetition_penalty) to the sampler's; seed given separately.  The logit
 *  bias is copied into an array of out_p's own: kvr_node_sampling_free()
 *  releases it.  @return KVR_OK; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_node_sampling(const Kvrail__SamplingParams *sp, uint64_t seed,
                               struct kvr_sample_params *out_p);
void kvr_node_sampling_free(struct kvr_sample_params *p);

#endif
