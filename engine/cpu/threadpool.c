/*
 * threadpool.c - a parallel-for pool with dynamic chunk scheduling.
 *
 * One 64-bit atomic word holds (generation << 32 | next chunk).  The caller
 * stores (gen + 1, SETUP), publishes (fn, arg, n_chunks), then stores
 * (gen + 1, 0) and wakes the workers.  Everyone claims chunks with a compare-and-swap that also
 * checks the generation, so a worker that wakes late can never take a chunk of a later run; the
 * caller claims chunks too, so a run completes even when the machine is oversubscribed and workers
 * are not scheduled.  Completion is a second counter; the caller spins on it with sched_yield
 * (giving its core to a worker that holds the last chunk).  Workers spin briefly for the next run
 * (a step's ops come back to back), then sleep on a condition variable: an idle engine uses no CPU.
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define SPIN_ITERS 4000
#define SETUP      UINT32_MAX /* chunk field while a run is being set up */

struct kvr_tp {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t state; /* gen << 32 | next chunk */
    atomic_int done;        /* chunks finished in this generation */
    atomic_bool stop;
    kvr_tp_fn fn;
    void *arg;
    int n_chunks;
};

struct worker_arg {
    kvr_tp_t *tp;
    int tid;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claims and runs chunks of generation gen until none are left. */
static void work(kvr_tp_t *tp, uint32_t gen, int tid)
{
    uint64_t s = atomic_load_explicit(&tp->state, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(s >> 32) != gen)
            return;
        uint32_t c = (uint32_t)s;
        if (c == SETUP) { /* the caller is publishing this generation's job */
            cpu_relax();
            s = atomic_load_explicit(&tp->state, memory_order_acquire);
            continue;
        }
        int n_chunks = tp->n_chunks;
        if (c >= (uint32_t)n_chunks)
            return;
        if (!atomic_compare_exchange_weak_explicit(&tp->state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        tp->fn(tp->arg, (int)c, n_chunks, tid);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
        s = atomic_load_explicit(&tp->state, memory_order_acquire);
    }
}

static void *worker(void *p)
{
    struct worker_arg wa = *(struct worker_arg *)p;
    free(p);
    kvr_tp_t *tp = wa.tp;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = (uint32_t)(atomic_load_explicit(&tp->state, memory_order_acquire) >> 32)) ==
                   seen &&
               !atomic_load(&tp->stop) && spins < SPIN_ITERS) {
            cpu_relax();
            spins++;
        }
        if (g == seen && !atomic_load(&tp->stop)) {
            pthread_mutex_lock(&tp->mu);
            while ((g = (uint32_t)(atomic_load(&tp->state) >> 32)) == seen &&
                   !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop))
            return NULL;
        seen = g;
        work(tp, g, wa.tid);
    }
}

kvr_status_t kvr_tp_create(int n_threads, kvr_tp_t **tp_p)
{
    if (n_threads < 1)
        n_threads = 1;
    kvr_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return KVR_ERR_NO_MEMORY;
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof(*tp->threads));
    if (!tp->threads) {
        kvr_tp_destroy(tp);
        return KVR_ERR_NO_MEMORY;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa) {
            wa->tp = tp;
            wa->tid = i;
        }
        if (!wa || pthread_create(&tp->threads[i], NULL, worker, wa) != 0) {
            kvr_status_t st = wa ? KVR_ERR_NO_RESOURCE : KVR_ERR_NO_MEMORY;
            free(wa);
            tp->n = i; /* join only those started */
            kvr_tp_destroy(tp);
            return st;
        }
    }
    *tp_p = tp;
    return KVR_OK;
}

void kvr_tp_destroy(kvr_tp_t *tp)
{
    if (!tp)
        return;
    if (tp->threads) {
        pthread_mutex_lock(&tp->mu);
        atomic_store(&tp->stop, true);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
        for (int i = 1; i < tp->n; i++)
            pthread_join(tp->threads[i], NULL);
        free(tp->threads);
    }
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp);
}

int kvr_tp_size(const kvr_tp_t *tp)
{
    return tp->n;
}

void kvr_tp_run(kvr_tp_t *tp, kvr_tp_fn fn, void *arg, int n_chunks)
{
    if (n_chunks <= 0)
        return;
    if (tp->n == 1 || n_chunks == 1) {
        for (int c = 0; c < n_chunks; c++)
            fn(arg, c, n_chunks, 0);
        return;
    }
    /* first close the previous generation to late claimers, then publish */
    uint32_t gen = (uint32_t)(atomic_load(&tp->state) >> 32) + 1;
    atomic_store(&tp->state, (uint64_t)gen << 32 | SETUP);
    tp->fn = fn;
    tp->arg = arg;
    tp->n_chunks = n_chunks;
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->state, (uint64_t)gen << 32, memory_order_release);
    pthread_mutex_lock(&tp->mu);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    work(tp, gen, 0);
    int spins = 0;
    while (atomic_load_explicit(&tp->done, memory_order_acquire) < n_chunks) {
        if (++spins < 256)
            cpu_relax();
        else
            sched_yield();
    }
}
