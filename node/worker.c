/*
 * worker.c - the engine worker thread (worker.h).
 *
 * Two inproc PAIR sockets per direction-free pair: the loop's end sends job
 * pointers and receives events; the worker's end receives job pointers
 * (blocking) and sends events.  A NULL job pointer tells the thread to end.
 * Each message is one fixed-size struct copied by value.
 */
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_log.h"

#define COMP "worker"

struct kvr_worker {
    void *loop_sock;   /* loop thread: sends jobs, receives events */
    void *worker_sock; /* worker thread: receives jobs, sends events */
    kvr_ctx_t *ctx;
    pthread_t thread;
    bool started;
    int in_flight;                  /* loop thread only */
    struct kvr_worker_job *current; /* loop thread's view: the job submitted last */
    int32_t max_tokens;
};

struct wire_event {
    uint32_t kind;
    int32_t layer;
    struct kvr_worker_job *job;
};

static void send_event(kvr_worker_t *w, uint32_t kind, int32_t layer, struct kvr_worker_job *job)
{
    struct wire_event ev = {kind, layer, job};
    /* inproc PAIR with no high-water mark limit reached in practice; a
     * failure here is a programming error worth a log */
    while (zmq_send(w->worker_sock, &ev, sizeof ev, 0) < 0) {
        if (errno == EINTR)
            continue;
        KVR_LOG_ERROR(COMP, "sending a worker event: %s", zmq_strerror(errno));
        return;
    }
}

static void *worker_main(void *arg)
{
    kvr_worker_t *w = arg;
    for (;;) {
        struct kvr_worker_job *job = NULL;
        int n = zmq_recv(w->worker_sock, &job, sizeof job, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            KVR_LOG_ERROR(COMP, "receiving a job: %s", zmq_strerror(errno));
            break;
        }
        if (n != (int)sizeof job || !job)
            break;
        job->t_start_ns = kvr_now_ns();
        job->status = job->run(job, w->ctx);
        job->t_end_ns = kvr_now_ns();
        send_event(w, KVR_WORKER_DONE, -1, job);
    }
    return NULL;
}

kvr_status_t kvr_worker_layer_done(void *arg, int32_t layer)
{
    struct kvr_worker_job *job = arg;
    send_event(job->worker, KVR_WORKER_LAYER, layer, job);
    return atomic_load_explicit(&job->cancel, memory_order_relaxed) ? KVR_ERR_CANCELED : KVR_OK;
}

kvr_status_t kvr_worker_create(void *zctx, const kvr_model_t *model,
                               const struct kvr_ctx_opts *opts, kvr_worker_t **worker_p, char *err,
                               size_t err_len)
{
    static atomic_int serial;
    kvr_worker_t *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, err_len, "out of memory");
        return KVR_ERR_NO_MEMORY;
    }
    kvr_status_t s = kvr_ctx_create(model, opts, &w->ctx, err, err_len);
    if (s != KVR_OK) {
        free(w);
        return s;
    }
    w->max_tokens = kvr_ctx_max_tokens(w->ctx);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://kvr-worker-%d", atomic_fetch_add(&serial, 1));
    w->loop_sock = zmq_socket(zctx, ZMQ_PAIR);
    w->worker_sock = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    if (!w->loop_sock || !w->worker_sock || zmq_bind(w->loop_sock, ep) != 0 ||
        zmq_connect(w->worker_sock, ep) != 0) {
        snprintf(err, err_len, "worker sockets (%s): %s", ep, zmq_strerror(errno));
        goto err_close;
    }
    /* no limit on queued events: a job posts at most n_layers + 1 of them */
    zmq_setsockopt(w->loop_sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(w->loop_sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(w->worker_sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(w->worker_sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(w->loop_sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(w->worker_sock, ZMQ_LINGER, &zero, sizeof zero);
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc != 0) {
        snprintf(err, err_len, "engine worker thread: %s", strerror(rc));
        goto err_close;
    }
    w->started = true;
    *worker_p = w;
    return KVR_OK;
err_close:
    if (w->loop_sock)
        zmq_close(w->loop_sock);
    if (w->worker_sock)
        zmq_close(w->worker_sock);
    kvr_ctx_destroy(w->ctx);
    free(w);
    return KVR_ERR_IO;
}

void kvr_worker_destroy(kvr_worker_t *w)
{
    if (!w)
        return;
    if (w->started) {
        if (w->in_flight && w->current)
            atomic_store(&w->current->cancel, true);
        struct kvr_worker_job *stop = NULL;
        while (zmq_send(w->loop_sock, &stop, sizeof stop, 0) < 0 && errno == EINTR)
            ;
        pthread_join(w->thread, NULL);
    }
    zmq_close(w->loop_sock);
    zmq_close(w->worker_sock);
    kvr_ctx_destroy(w->ctx);
    free(w);
}

kvr_status_t kvr_worker_submit(kvr_worker_t *w, struct kvr_worker_job *job)
{
    job->worker = w;
    atomic_store(&job->cancel, false);
    job->status = KVR_INPROGRESS;
    while (zmq_send(w->loop_sock, &job, sizeof job, 0) < 0) {
        if (errno == EINTR)
            continue;
        KVR_LOG_ERROR(COMP, "submitting a job: %s", zmq_strerror(errno));
        return KVR_ERR_IO;
    }
    w->in_flight++;
    w->current = job;
    return KVR_OK;
}

void *kvr_worker_socket(kvr_worker_t *w)
{
    return w->loop_sock;
}

bool kvr_worker_next_event(kvr_worker_t *w, struct kvr_worker_event *ev_p)
{
    struct wire_event ev;
    int n;
    while ((n = zmq_recv(w->loop_sock, &ev, sizeof ev, ZMQ_DONTWAIT)) < 0 && errno == EINTR)
        ;
    if (n != (int)sizeof ev)
        return false;
    if (ev.kind == KVR_WORKER_DONE)
        w->in_flight--;
    ev_p->kind = (enum kvr_worker_event_kind)ev.kind;
    ev_p->layer = ev.layer;
    ev_p->job = ev.job;
    return true;
}

int32_t kvr_worker_max_tokens(const kvr_worker_t *w)
{
    return w->max_tokens;
}

int kvr_worker_in_flight(const kvr_worker_t *w)
{
    return w->in_flight;
}
