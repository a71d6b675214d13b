/*
 * kvr_cluster.h - the cluster file: one YAML document describing the whole
 * cluster (router endpoints, every node, the model, block size, timeouts,
 * thresholds).  Every kvrail process loads it with kvr_cluster_load() and
 * finds itself with kvr_cluster_find(--node NAME).  The schema is documented
 * in docs/cluster-file.md.
 *
 * Loading is strict: an unknown key, a wrong type, a value out of range, a
 * duplicate node name or a missing required key is an error whose message
 * names the file, the line and the key.  Relative paths (model) are resolved
 * against the directory of the cluster file.
 */
#ifndef KVR_CLUSTER_H
#define KVR_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#define KVR_CLUSTER_NAME_MAX 64
#define KVR_CLUSTER_STR_MAX  256
#define KVR_CLUSTER_PATH_MAX 4096

enum kvr_node_role {
    KVR_NODE_ROLE_PREFILL = 1,
    KVR_NODE_ROLE_DECODE = 2,
    KVR_NODE_ROLE_ROUTER = 3,
};

/* `kvrail up`'s policy for a node that exits (nodes[].restart). */
enum kvr_restart {
    KVR_RESTART_ON_FAILURE = 0, /* default: restart after a non-zero exit or a signal */
    KVR_RESTART_ALWAYS = 1,     /* restart after any exit */
    KVR_RESTART_NEVER = 2,      /* report it and leave it down */
};

typedef struct kvr_cluster_node {
    char name[KVR_CLUSTER_NAME_MAX];
    char host[KVR_CLUSTER_STR_MAX]; /* default "localhost" */
    enum kvr_node_role role;
    char device[32];                   /* "cpu" (default) or "cuda:N" */
    int device_index;                  /* N of cuda:N, -1 for cpu */
    char transport[16];                /* "ucx" (default) | "verbs" | "loop" | "cuda_ipc" */
    char tls[KVR_CLUSTER_STR_MAX];     /* UCX_TLS value, "" = UCX default */
    char devices[KVR_CLUSTER_STR_MAX]; /* UCX_NET_DEVICES / verbs device, "" = any */
    bool require_rdma;                 /* a TCP fallback is a start-up error */
    uint64_t pool_blocks;              /* decode: KV pool size in blocks (0 = from pool_bytes) */
    uint64_t pool_bytes;               /* decode: KV pool size in bytes (0 = from pool_blocks) */
    int threads;                       /* compute threads, default 1 */
    int max_batch;                     /* decode: running sequences, default 32 */
    enum kvr_restart restart;          /* what `kvrail up` does when it exits */
    int restart_max;                   /* restarts in a row before left down, default 5 */
    uint16_t metrics_port;             /* HTTP /metrics /health /ready, 0 = none (default) */
    int line;                          /* line of the node in the file */
} kvr_cluster_node_t;

/* How a decode node reserves KV blocks (limits.reservation). */
enum kvr_reservation {
    KVR_RESERVE_PAGED = 0, /* the prompt's blocks + headroom; grown while decoding; the
                              youngest sequence is preempted (recomputed) when the pool is full */
    KVR_RESERVE_WHOLE = 1, /* prompt + max_tokens up front: never preempted */
};

enum kvr_auth {
    KVR_AUTH_NONE = 0,  /* anyone who reaches an endpoint is trusted (warned at start) */
    KVR_AUTH_CURVE = 1, /* ZeroMQ CURVE: keys in keys_dir (docs/security.md) */
};

typedef struct kvr_cluster {
    char path[KVR_CLUSTER_PATH_MAX];           /* the file as given */
    enum kvr_auth auth;                        /* "auth:", default none */
    bool auth_set;                             /* "auth:" given (none explicitly) */
    char keys_dir[KVR_CLUSTER_PATH_MAX];       /* "keys:", resolved; required with curve */
    char name[KVR_CLUSTER_NAME_MAX];           /* "cluster:", default "kvrail" */
    char model_dir[KVR_CLUSTER_PATH_MAX];      /* resolved against the file's directory */
    uint32_t block_size;                       /* tokens per KV block, default 16 */
    char kv_dtype[8];                          /* KV pool elements: f32 (default), bf16, f16 */
    char numerics[16];                         /* engine numerics: f32 (default), bf16dot */
    char client_endpoint[KVR_CLUSTER_STR_MAX]; /* router.client, tcp://host:port */
    char node_endpoint[KVR_CLUSTER_STR_MAX];   /* router.node */
    char client_bind[KVR_CLUSTER_STR_MAX];     /* router.client_bind, default = client */
    char node_bind[KVR_CLUSTER_STR_MAX];       /* router.node_bind, default = node */
    struct {
        uint32_t lease_ms;             /* reservation lease, default 10000 */
        uint32_t queue_ms;             /* max wait in the queue when full, default 5000 */
        uint32_t heartbeat_ms;         /* node heartbeat interval, default 1000 */
        uint32_t heartbeat_timeout_ms; /* missing this long = dead, default 3000 */
        uint32_t request_ms;           /* whole request deadline, default 300000 */
        uint32_t prefill_ms;           /* prefill (reserve -> first token), default 60000 */
        uint32_t client_idle_ms;       /* stream with no client ping/ack, default 0 = off */
        uint32_t connect_ms;           /* node registration wait, default 30000 */
    } timeouts;
    uint32_t local_prefill_tokens; /* uncached suffix <= this: decode prefills, default 32 */
    uint32_t max_queue;            /* requests waiting for capacity, default 256 */
    uint32_t prefill_retries;      /* default 2 */
    uint32_t max_tokens_limit;     /* largest max_tokens a client may ask, default 8192 */
    /* decode: a local prefill runs in chunks of this many tokens between
     * decode steps; 0 (default) = the engine's chunk (its max_tokens, 512) */
    uint32_t prefill_chunk_tokens;
    enum kvr_reservation reservation;     /* decode KV reservation, default paged */
    uint32_t reservation_headroom_blocks; /* paged: blocks beyond the prompt's, default 2 */
    size_t n_nodes;
    kvr_cluster_node_t *nodes;
} kvr_cluster_t;

/** Loads and validates a cluster file.  err (may be NULL) receives
 *  "FILE:LINE: key 'K': what is wrong".
 *  @return KVR_OK; KVR_ERR_NOT_FOUND (no such file); KVR_ERR_INVALID (syntax
 *          or schema error); KVR_ERR_NO_MEMORY; KVR_ERR_IO. */
kvr_status_t kvr_cluster_load(const char *path, kvr_cluster_t **cluster_p, char *err,
                              size_t err_len);

/** Same, from text in memory; name is used in messages and as the base of
 *  relative paths (its directory). */
kvr_status_t kvr_cluster_parse(const char *text, size_t len, const char *name,
                               kvr_cluster_t **cluster_p, char *err, size_t err_len);

void kvr_cluster_free(kvr_cluster_t *cluster);

/** The node named name, or NULL. */
const kvr_cluster_node_t *kvr_cluster_find(const kvr_cluster_t *cluster, const char *name);

/** The first node of a role, or NULL. */
const kvr_cluster_node_t *kvr_cluster_first(const kvr_cluster_t *cluster, enum kvr_node_role role);

/** True when the node's host names this machine: "localhost", "127.0.0.1",
 *  "::1", gethostname() (with or without domain). */
bool kvr_cluster_node_is_local(const kvr_cluster_node_t *node);

/** "prefill" | "decode" | "router" | "?" */
const char *kvr_node_role_name(enum kvr_node_role role);

#endif
