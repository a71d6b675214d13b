/*
 * threadpool.h - private to the CPU backend: a fixed pool of worker threads
 * that run one parallel-for at a time, with dynamic chunk scheduling.
 */
#ifndef KVR_CPU_THREADPOOL_H
#define KVR_CPU_THREADPOOL_H

#include "kvr_status.h"

typedef struct kvr_tp kvr_tp_t;
/* Processes chunk `chunk` of n_chunks; tid (0..size-1) names the thread, for
 * per-thread scratch. */
typedef void (*kvr_tp_fn)(void *arg, int chunk, int n_chunks, int tid);

/** n_threads >= 1 (the caller counts as thread 0: n_threads - 1 workers).
 *  @return KVR_OK; KVR_ERR_NO_MEMORY; KVR_ERR_NO_RESOURCE (pthread_create). */
kvr_status_t kvr_tp_create(int n_threads, kvr_tp_t **tp_p);
void kvr_tp_destroy(kvr_tp_t *tp);
int kvr_tp_size(const kvr_tp_t *tp);
/** Runs fn(arg, c, n_chunks, tid) for every chunk c in 0..n_chunks-1, spread
 *  over the threads as they come (the caller takes chunks too), and returns
 *  when all are done.  A descheduled worker delays nobody: whoever is
 *  running takes the remaining chunks. */
void kvr_tp_run(kvr_tp_t *tp, kvr_tp_fn fn, void *arg, int n_chunks);

#endif
