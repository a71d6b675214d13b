/*
 * threadpool.c - a parallel-for pool: the caller publishes (fn, arg) and
 * bumps a generation counter; workers spin briefly on it (a step's ops come
 * back to back), then sleep on a condition variable, so an idle engine uses
 * no CPU.  The caller runs share 0 itself and waits for the others on an
 * atomic counter, spinning briefly, then on a second condition variable.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#define SPIN_ITERS 20000

struct kvr_tp {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    atomic_uint gen;
    atomic_int pending;
    atomic_bool stop;
    kvr_tp_fn fn;
    void *arg;
};

struct worker_arg {
    kvr_tp_t *tp;
    int ith;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker(void *p)
{
    struct worker_arg wa = *(struct worker_arg *)p;
    free(p);
    kvr_tp_t *tp = wa.tp;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop) && spins < SPIN_ITERS) {
            cpu_relax();
            spins++;
        }
        if (g == seen && !atomic_load(&tp->stop)) {
            pthread_mutex_lock(&tp->mu);
            while ((g = atomic_load(&tp->gen)) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv_work, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop))
            return NULL;
        seen = g;
        tp->fn(tp->arg, wa.ith, tp->n);
        if (atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->cv_done);
            pthread_mutex_unlock(&tp->mu);
        }
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
    pthread_cond_init(&tp->cv_work, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof(*tp->threads));
    if (!tp->threads) {
        kvr_tp_destroy(tp);
        return KVR_ERR_NO_MEMORY;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa) {
            wa->tp = tp;
            wa->ith = i;
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
        pthread_cond_broadcast(&tp->cv_work);
        pthread_mutex_unlock(&tp->mu);
        for (int i = 1; i < tp->n; i++)
            pthread_join(tp->threads[i], NULL);
        free(tp->threads);
    }
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv_work);
    pthread_cond_destroy(&tp->cv_done);
    free(tp);
}

int kvr_tp_size(const kvr_tp_t *tp)
{
    return tp->n;
}

void kvr_tp_run(kvr_tp_t *tp, kvr_tp_fn fn, void *arg)
{
    if (tp->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store(&tp->pending, tp->n - 1);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, tp->n);
    int spins = 0;
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0 && spins < SPIN_ITERS) {
        cpu_relax();
        spins++;
    }
    if (atomic_load(&tp->pending) > 0) {
        pthread_mutex_lock(&tp->mu);
        while (atomic_load(&tp->pending) > 0)
            pthread_cond_wait(&tp->cv_done, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
    }
}
