/*
 * threadpool.h - private to the CPU backend: a fixed pool of worker threads
 * that run one parallel-for at a time.
 */
#ifndef KVR_CPU_THREADPOOL_H
#define KVR_CPU_THREADPOOL_H

#include "kvr_status.h"

typedef struct kvr_tp kvr_tp_t;
typedef void (*kvr_tp_fn)(void *arg, int ith, int nth);

/** n_threads >= 1 (the caller counts as thread 0: n_threads - 1 workers).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; KVR_ERR_NO_RESOURCE (pthread_create). */
kvr_status_t kvr_tp_create(int n_threads, kvr_tp_t **tp_p);
void kvr_tp_destroy(kvr_tp_t *tp);
int kvr_tp_size(const kvr_tp_t *tp);
/** Runs fn(arg, ith, nth) on every thread, ith = 0..nth-1 (0 is the caller),
 *  and returns when all are done. */
void kvr_tp_run(kvr_tp_t *tp, kvr_tp_fn fn, void *arg);

#endif
