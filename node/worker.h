/*
 * worker.h - the engine worker: the thread that owns a node's compute
 * context and runs the model, so that the node's event loop never does.
 *
 * The loop hands the worker a job (kvr_worker_submit); the worker runs it
 * with its context and answers with events: KVR_WORKER_LAYER when the
 * job's prefill finished a layer (from the engine's layer callback, through
 * kvr_worker_layer_done) and KVR_WORKER_DONE when the job is over.  Both
 * directions are messages on an inproc ZeroMQ PAIR socket pair carrying a
 * job pointer; the loop polls its end with its router socket and transfer
 * event fd.  Nothing is shared under a lock: a job's inputs are written by
 * the loop before it is sent and not touched until its DONE event arrives
 * (the message orders the memory); its outputs (status, logits, timings)
 * are written by the worker before DONE.  The one thing the loop writes
 * during a job is its cancel flag, an atomic the layer callback reads.
 * Jobs run one at a time, in the order they were submitted.
 */
#ifndef KVR_NODE_WORKER_H
#define KVR_NODE_WORKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvr_engine.h"
#include "kvr_status.h"

typedef struct kvr_worker kvr_worker_t;

struct kvr_worker_job;

/** The work of a job, run on the worker thread with its context; returns
 *  the job's status. */
typedef kvr_status_t (*kvr_worker_run_fn)(struct kvr_worker_job *job, kvr_ctx_t *ctx);

struct kvr_worker_job {
    kvr_worker_run_fn run;
    void *arg;          /* the submitter's */
    atomic_bool cancel; /* set by the loop; the layer callback stops the job */
    /* written by the worker before DONE */
    kvr_status_t status;
    uint64_t t_start_ns, t_end_ns; /* the worker's own clock readings */
    /* private */
    kvr_worker_t *worker;
};

enum kvr_worker_event_kind {
    KVR_WORKER_LAYER = 1, /* layer `layer` of the job's prefill is in the pool */
    KVR_WORKER_DONE = 2,  /* the job is over: its outputs may be read */
};

struct kvr_worker_event {
    enum kvr_worker_event_kind kind;
    int32_t layer;
    struct kvr_worker_job *job;
};

/** Creates the compute context for model (opts as kvr_ctx_create) and the
 *  worker thread that owns it; zctx is the node's ZeroMQ context.
 *  @return KVR_OK; errors of kvr_ctx_create; KVR_ERR_IO (socket or thread). */
kvr_status_t kvr_worker_create(void *zctx, const kvr_model_t *model,
                               const struct kvr_ctx_opts *opts, kvr_worker_t **worker_p, char *err,
                               size_t err_len);

/** Cancels the job in flight (if any), waits for the thread to end and
 *  frees the context.  NULL is a no-op. */
void kvr_worker_destroy(kvr_worker_t *w);

/** Hands job to the worker (loop thread).  The job and what it points at
 *  must stay untouched until its DONE event.
 *  @return KVR_OK; KVR_ERR_IO (the message could not be queued). */
kvr_status_t kvr_worker_submit(kvr_worker_t *w, struct kvr_worker_job *job);

/** The loop's end of the event socket (for zmq_poll, ZMQ_POLLIN). */
void *kvr_worker_socket(kvr_worker_t *w);

/** Takes one waiting event (loop thread, never blocks).
 *  @return true with *ev_p set; false when none is waiting. */
bool kvr_worker_next_event(kvr_worker_t *w, struct kvr_worker_event *ev_p);

/** From the engine's layer callback on the worker thread: posts a LAYER
 *  event for job and returns KVR_ERR_CANCELED when the loop canceled the
 *  job, else KVR_OK.  Usable directly as a kvr_layer_done_fn with the job
 *  as its argument. */
kvr_status_t kvr_worker_layer_done(void *job, int32_t layer);

/** The most tokens one prefill call of the context computes at once. */
int32_t kvr_worker_max_tokens(const kvr_worker_t *w);

/** Jobs submitted and not yet reported DONE (loop thread). */
int kvr_worker_in_flight(const kvr_worker_t *w);

#endif
