/*
 * fuzz_cluster.c - fuzz target over the cluster file parser (common/
 * cluster.c, YAML through libyaml): the input is a cluster file.  When it
 * parses, what it promised holds: every node has a non-empty, NUL-
 * terminated name shorter than KVR_CLUSTER_NAME_MAX and a known role, names
 * are unique (kvr_cluster_find finds each node as itself), the block size
 * is at least 1, auth: curve has a keys directory; each node's host is
 * asked whether it is this machine (kvr_cluster_node_is_local).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of its own (not NUL-terminated) so ASan sees a read past it */
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    kvr_cluster_t *cl = NULL;
    char err[512];
    kvr_status_t st = kvr_cluster_parse(text, size, "/tmp/fuzz/cluster.yaml", &cl, err, sizeof err);
    free(text);
    if (st != KVR_OK) {
        if (cl || !memchr(err, 0, sizeof err) || !err[0])
            abort(); /* a refusal says why, and leaves nothing behind */
        return 0;
    }
    if (cl->block_size < 1 || (cl->auth == KVR_AUTH_CURVE && !cl->keys_dir[0]))
        abort();
    for (size_t i = 0; i < cl->n_nodes; i++) {
        const kvr_cluster_node_t *n = &cl->nodes[i];
        size_t l = strnlen(n->name, sizeof n->name);
        if (l == 0 || l == sizeof n->name || !memchr(n->host, 0, sizeof n->host))
            abort();
        if (n->role != KVR_NODE_ROLE_PREFILL && n->role != KVR_NODE_ROLE_DECODE &&
            n->role != KVR_NODE_ROLE_ROUTER)
            abort();
        if (kvr_cluster_find(cl, n->name) != n)
            abort();
        volatile bool local = kvr_cluster_node_is_local(n);
        (void)local;
        (void)kvr_node_role_name(n->role);
    }
    kvr_cluster_free(cl);
    return 0;
}
