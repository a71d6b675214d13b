/*
 * cluster.c - loads the YAML cluster file (kvr_cluster.h) with libyaml's
 * document API: the file is parsed into a node tree (each node carries its
 * line), then walked by small typed readers that check every key against the
 * schema of docs/cluster-file.md.  Errors are formatted once, at the place
 * they are found, as "FILE:LINE: key 'K': what is wrong".
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <yaml.h>

#include "kvr_cluster.h"

struct ctx {
    const char *file;
    yaml_document_t *doc;
    char *err;
    size_t err_len;
};

static kvr_status_t fail(struct ctx *c, const yaml_node_t *at, const char *key, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));

static kvr_status_t fail(struct ctx *c, const yaml_node_t *at, const char *key, const char *fmt,
                         ...)
{
    if (!c->err || !c->err_len)
        return KVR_ERR_INVALID;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    unsigned long line = at ? (unsigned long)at->start_mark.line + 1 : 0;
    if (key)
        snprintf(c->err, c->err_len, "%s:%lu: key '%s': %s", c->file, line, key, what);
    else
        snprintf(c->err, c->err_len, "%s:%lu: %s", c->file, line, what);
    return KVR_ERR_INVALID;
}

static const char *scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static kvr_status_t get_str(struct ctx *c, const yaml_node_t *v, const char *key, char *out,
                            size_t cap)
{
    const char *s = scalar(v);
    if (!s)
        return fail(c, v, key, "expected a string");
    if (strlen(s) >= cap)
        return fail(c, v, key, "value is longer than %zu bytes", cap - 1);
    memcpy(out, s, strlen(s) + 1);
    return KVR_OK;
}

/* Integer with optional size suffix (k, M, G, KiB, MiB, GiB; bytes only). */
static kvr_status_t get_u64(struct ctx *c, const yaml_node_t *v, const char *key, uint64_t lo,
                            uint64_t hi, bool allow_suffix, uint64_t *out)
{
    const char *s = scalar(v);
    if (!s || !*s)
        return fail(c, v, key, "expected a non-negative integer");
    if (s[0] == '-')
        return fail(c, v, key, "'%s' is negative", s);
    errno = 0;
    char *end = NULL;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || errno == ERANGE)
        return fail(c, v, key, "'%s' is not an integer", s);
    uint64_t mul = 1;
    if (*end) {
        if (!allow_suffix)
            return fail(c, v, key, "'%s' is not an integer", s);
        static const struct {
            const char *sfx;
            uint64_t mul;
        } sfx[] = {{"k", 1000ull},      {"K", 1024ull},      {"KiB", 1024ull},
                   {"M", 1000000ull},   {"MiB", 1048576ull}, {"G", 1000000000ull},
                   {"GiB", 1ull << 30}, {"MB", 1000000ull},  {"GB", 1000000000ull},
                   {"KB", 1000ull}};
        bool found = false;
        for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++)
            if (strcmp(end, sfx[i].sfx) == 0) {
                mul = sfx[i].mul;
                found = true;
            }
        if (!found)
            return fail(c, v, key, "'%s': unknown size suffix '%s' (use KiB, MiB, GiB)", s, end);
    }
    if (x > UINT64_MAX / mul)
        return fail(c, v, key, "'%s' is too large", s);
    uint64_t r = (uint64_t)x * mul;
    if (r < lo || r > hi)
        return fail(c, v, key, "%" PRIu64 " is out of range [%" PRIu64 ", %" PRIu64 "]", r, lo, hi);
    *out = r;
    return KVR_OK;
}

static kvr_status_t get_u32(struct ctx *c, const yaml_node_t *v, const char *key, uint32_t lo,
                            uint32_t hi, uint32_t *out)
{
    uint64_t x;
    kvr_status_t st = get_u64(c, v, key, lo, hi, false, &x);
    if (st == KVR_OK)
        *out = (uint32_t)x;
    return st;
}

static kvr_status_t get_bool(struct ctx *c, const yaml_node_t *v, const char *key, bool *out)
{
    const char *s = scalar(v);
    if (s && (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on"))) {
        *out = true;
        return KVR_OK;
    }
    if (s && (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off"))) {
        *out = false;
        return KVR_OK;
    }
    return fail(c, v, key, "expected true or false");
}

static bool valid_endpoint(const char *s)
{
    if (strncmp(s, "tcp://", 6) && strncmp(s, "ipc://", 6) && strncmp(s, "inproc://", 9))
        return false;
    if (!strncmp(s, "tcp://", 6)) {
        const char *colon = strrchr(s + 6, ':');
        if (!colon || colon == s + 6 || !colon[1])
            return false;
        for (const char *p = colon + 1; *p; p++)
            if (!isdigit((unsigned char)*p))
                return false;
        long port = strtol(colon + 1, NULL, 10);
        if (port < 1 || port > 65535)
            return false;
    }
    return true;
}

static kvr_status_t get_endpoint(struct ctx *c, const yaml_node_t *v, const char *key, char *out,
                                 size_t cap)
{
    kvr_status_t st = get_str(c, v, key, out, cap);
    if (st != KVR_OK)
        return st;
    if (!valid_endpoint(out))
        return fail(c, v, key, "'%s' is not a ZeroMQ endpoint (want tcp://HOST:PORT or ipc://PATH)",
                    out);
    return KVR_OK;
}

#define FOREACH_PAIR(c, map, kname, val)                                                           \
    for (yaml_node_pair_t *_p_##kname = (map)->data.mapping.pairs.start;                           \
         _p_##kname < (map)->data.mapping.pairs.top; _p_##kname++)                                 \
        for (const yaml_node_t *_k_##kname = yaml_document_get_node((c)->doc, _p_##kname->key),    \
                               *val = yaml_document_get_node((c)->doc, _p_##kname->value);         \
             _k_##kname; _k_##kname = NULL)                                                        \
            for (const char *kname = scalar(_k_##kname) ? scalar(_k_##kname) : ""; kname;          \
                 kname = NULL)

static kvr_status_t want_map(struct ctx *c, const yaml_node_t *v, const char *key)
{
    if (!v || v->type != YAML_MAPPING_NODE)
        return fail(c, v, key, "expected a mapping (key: value lines)");
    return KVR_OK;
}

static kvr_status_t parse_router(struct ctx *c, const yaml_node_t *map, kvr_cluster_t *cl)
{
    kvr_status_t st = want_map(c, map, "router");
    if (st != KVR_OK)
        return st;
    FOREACH_PAIR(c, map, k, v)
    {
        if (!strcmp(k, "client"))
            st = get_endpoint(c, v, "router.client", cl->client_endpoint,
                              sizeof(cl->client_endpoint));
        else if (!strcmp(k, "node"))
            st = get_endpoint(c, v, "router.node", cl->node_endpoint, sizeof(cl->node_endpoint));
        else if (!strcmp(k, "client_bind"))
            st = get_endpoint(c, v, "router.client_bind", cl->client_bind, sizeof(cl->client_bind));
        else if (!strcmp(k, "node_bind"))
            st = get_endpoint(c, v, "router.node_bind", cl->node_bind, sizeof(cl->node_bind));
        else
            st = fail(c, v, k,
                      "unknown key in 'router' (known: client, node, client_bind, "
                      "node_bind)");
        if (st != KVR_OK)
            return st;
    }
    if (!cl->client_endpoint[0])
        return fail(c, map, "router.client", "missing (the client endpoint, tcp://HOST:PORT)");
    if (!cl->node_endpoint[0])
        return fail(c, map, "router.node", "missing (the node endpoint, tcp://HOST:PORT)");
    if (!strcmp(cl->client_endpoint, cl->node_endpoint))
        return fail(c, map, "router.node", "same endpoint as router.client");
    return KVR_OK;
}

static kvr_status_t parse_timeouts(struct ctx *c, const yaml_node_t *map, kvr_cluster_t *cl)
{
    kvr_status_t st = want_map(c, map, "timeouts");
    if (st != KVR_OK)
        return st;
    static const struct {
        const char *key;
        size_t off;
        uint32_t lo, hi;
    } keys[] = {
        {"lease_ms", offsetof(kvr_cluster_t, timeouts.lease_ms), 10, 3600000},
        {"queue_ms", offsetof(kvr_cluster_t, timeouts.queue_ms), 0, 3600000},
        {"heartbeat_ms", offsetof(kvr_cluster_t, timeouts.heartbeat_ms), 10, 600000},
        {"heartbeat_timeout_ms", offsetof(kvr_cluster_t, timeouts.heartbeat_timeout_ms), 20,
         3600000},
        {"request_ms", offsetof(kvr_cluster_t, timeouts.request_ms), 10, 86400000},
        {"prefill_ms", offsetof(kvr_cluster_t, timeouts.prefill_ms), 10, 3600000},
        {"client_idle_ms", offsetof(kvr_cluster_t, timeouts.client_idle_ms), 0, 86400000},
        {"connect_ms", offsetof(kvr_cluster_t, timeouts.connect_ms), 10, 3600000},
    };
    FOREACH_PAIR(c, map, k, v)
    {
        size_t i;
        for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (!strcmp(k, keys[i].key))
                break;
        if (i == sizeof(keys) / sizeof(keys[0]))
            return fail(c, v, k,
                        "unknown key in 'timeouts' (known: lease_ms, queue_ms, heartbeat_ms, "
                        "heartbeat_timeout_ms, request_ms, prefill_ms, client_idle_ms, "
                        "connect_ms)");
        char full[96];
        snprintf(full, sizeof(full), "timeouts.%s", k);
        st = get_u32(c, v, full, keys[i].lo, keys[i].hi,
                     (uint32_t *)(void *)((char *)cl + keys[i].off));
        if (st != KVR_OK)
            return st;
    }
    if (cl->timeouts.heartbeat_timeout_ms <= cl->timeouts.heartbeat_ms)
        return fail(c, map, "timeouts.heartbeat_timeout_ms",
                    "%u must be larger than heartbeat_ms (%u)", cl->timeouts.heartbeat_timeout_ms,
                    cl->timeouts.heartbeat_ms);
    return KVR_OK;
}

static kvr_status_t parse_transport(struct ctx *c, const yaml_node_t *v, const char *key,
                                    kvr_cluster_node_t *n)
{
    kvr_status_t st;
    if (v && v->type == YAML_SCALAR_NODE) {
        st = get_str(c, v, key, n->transport, sizeof(n->transport));
    } else {
        st = want_map(c, v, key);
        if (st != KVR_OK)
            return st;
        FOREACH_PAIR(c, v, k, tv)
        {
            char full[320];
            snprintf(full, sizeof(full), "%s.%s", key, k);
            if (!strcmp(k, "backend"))
                st = get_str(c, tv, full, n->transport, sizeof(n->transport));
            else if (!strcmp(k, "tls"))
                st = get_str(c, tv, full, n->tls, sizeof(n->tls));
            else if (!strcmp(k, "devices"))
                st = get_str(c, tv, full, n->devices, sizeof(n->devices));
            else if (!strcmp(k, "require_rdma"))
                st = get_bool(c, tv, full, &n->require_rdma);
            else
                st = fail(c, tv, full,
                          "unknown key in transport (known: backend, tls, devices, require_rdma)");
            if (st != KVR_OK)
                return st;
        }
    }
    if (st != KVR_OK)
        return st;
    if (strcmp(n->transport, "ucx") && strcmp(n->transport, "verbs") &&
        strcmp(n->transport, "loop") && strcmp(n->transport, "cuda_ipc"))
        return fail(c, v, key, "unknown transport '%s' (want ucx, verbs, loop or cuda_ipc)",
                    n->transport);
    return KVR_OK;
}

static kvr_status_t parse_node(struct ctx *c, const yaml_node_t *map, size_t idx,
                               kvr_cluster_node_t *n)
{
    char pfx[160];
    snprintf(pfx, sizeof(pfx), "nodes[%zu]", idx);
    kvr_status_t st = want_map(c, map, pfx);
    if (st != KVR_OK)
        return st;
    memset(n, 0, sizeof(*n));
    n->line = (int)map->start_mark.line + 1;
    strcpy(n->host, "localhost");
    strcpy(n->device, "cpu");
    n->device_index = -1;
    strcpy(n->transport, "ucx");
    n->threads = 1;
    n->max_batch = 32;
    n->restart = KVR_RESTART_ON_FAILURE;
    n->restart_max = 5;
    bool have_role = false;
    FOREACH_PAIR(c, map, k, v)
    {
        char full[256];
        snprintf(full, sizeof(full), "%s.%s", pfx, k);
        uint64_t x;
        if (!strcmp(k, "name")) {
            st = get_str(c, v, full, n->name, sizeof(n->name));
            if (st == KVR_OK) {
                if (!n->name[0])
                    return fail(c, v, full, "empty name");
                for (const char *p = n->name; *p; p++)
                    if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
                        return fail(c, v, full,
                                    "'%s' has a character other than letters, digits, - _ .",
                                    n->name);
            }
        } else if (!strcmp(k, "host")) {
            st = get_str(c, v, full, n->host, sizeof(n->host));
        } else if (!strcmp(k, "role")) {
            const char *s = scalar(v);
            have_role = true;
            if (s && !strcmp(s, "prefill"))
                n->role = KVR_NODE_ROLE_PREFILL;
            else if (s && !strcmp(s, "decode"))
                n->role = KVR_NODE_ROLE_DECODE;
            else if (s && !strcmp(s, "router"))
                n->role = KVR_NODE_ROLE_ROUTER;
            else
                st = fail(c, v, full, "'%s' is not a role (want prefill, decode or router)",
                          s ? s : "(not a string)");
        } else if (!strcmp(k, "device")) {
            st = get_str(c, v, full, n->device, sizeof(n->device));
            if (st == KVR_OK) {
                if (!strcmp(n->device, "cpu")) {
                    n->device_index = -1;
                } else if (!strncmp(n->device, "cuda:", 5) &&
                           isdigit((unsigned char)n->device[5])) {
                    char *end;
                    long d = strtol(n->device + 5, &end, 10);
                    if (*end || d > 1024)
                        return fail(c, v, full, "'%s' is not a device (want cpu or cuda:N)",
                                    n->device);
                    n->device_index = (int)d;
                } else if (!strcmp(n->device, "cuda")) {
                    n->device_index = 0;
                } else {
                    return fail(c, v, full, "'%s' is not a device (want cpu or cuda:N)", n->device);
                }
            }
        } else if (!strcmp(k, "transport")) {
            st = parse_transport(c, v, full, n);
        } else if (!strcmp(k, "pool_blocks")) {
            st = get_u64(c, v, full, 1, 1ull << 32, false, &n->pool_blocks);
        } else if (!strcmp(k, "pool_bytes")) {
            st = get_u64(c, v, full, 4096, 1ull << 50, true, &n->pool_bytes);
        } else if (!strcmp(k, "threads")) {
            st = get_u64(c, v, full, 1, 1024, false, &x);
            n->threads = (int)x;
        } else if (!strcmp(k, "max_batch")) {
            st = get_u64(c, v, full, 1, 65536, false, &x);
            n->max_batch = (int)x;
        } else if (!strcmp(k, "restart")) {
            const char *s = scalar(v);
            if (s && !strcmp(s, "on-failure"))
                n->restart = KVR_RESTART_ON_FAILURE;
            else if (s && !strcmp(s, "always"))
                n->restart = KVR_RESTART_ALWAYS;
            else if (s && !strcmp(s, "never"))
                n->restart = KVR_RESTART_NEVER;
            else
                st = fail(c, v, full,
                          "'%s' is not a restart policy (want always, on-failure or never)",
                          s ? s : "(not a string)");
        } else if (!strcmp(k, "restart_max")) {
            st = get_u64(c, v, full, 0, 1000, false, &x);
            n->restart_max = (int)x;
        } else if (!strcmp(k, "metrics_port")) {
            st = get_u64(c, v, full, 0, 65535, false, &x);
            n->metrics_port = (uint16_t)x;
        } else {
            st = fail(c, v, full,
                      "unknown key in a node (known: name, host, role, device, transport, "
                      "pool_blocks, pool_bytes, threads, max_batch, restart, restart_max, "
                      "metrics_port)");
        }
        if (st != KVR_OK)
            return st;
    }
    if (!n->name[0])
        return fail(c, map, pfx, "node has no 'name'");
    snprintf(pfx, sizeof(pfx), "nodes[%zu] (%s).role", idx, n->name);
    if (!have_role)
        return fail(c, map, pfx, "missing (want prefill, decode or router)");
    if (n->role == KVR_NODE_ROLE_DECODE && !n->pool_blocks && !n->pool_bytes)
        n->pool_blocks = 1024;
    if (n->pool_blocks && n->pool_bytes) {
        snprintf(pfx, sizeof(pfx), "nodes[%zu] (%s).pool_bytes", idx, n->name);
        return fail(c, map, pfx, "give pool_blocks or pool_bytes, not both");
    }
    return KVR_OK;
}

static void resolve_path(const char *file, const char *p, char *out, size_t cap)
{
    if (p[0] == '/' || !strchr(file, '/')) {
        snprintf(out, cap, "%s", p);
        return;
    }
    const char *slash = strrchr(file, '/');
    snprintf(out, cap, "%.*s/%s", (int)(slash - file), file, p);
}

static kvr_status_t parse_root(struct ctx *c, const yaml_node_t *root, kvr_cluster_t *cl)
{
    if (!root)
        return fail(c, NULL, NULL, "the file is empty (want a mapping with router, nodes, model)");
    kvr_status_t st = want_map(c, root, "(top level)");
    if (st != KVR_OK)
        return st;
    const yaml_node_t *nodes = NULL, *router = NULL;
    char model[KVR_CLUSTER_PATH_MAX] = "";
    char keys[KVR_CLUSTER_PATH_MAX] = "";
    FOREACH_PAIR(c, root, k, v)
    {
        if (!strcmp(k, "auth")) {
            const char *a = scalar(v);
            cl->auth_set = true;
            if (a && !strcmp(a, "none"))
                cl->auth = KVR_AUTH_NONE;
            else if (a && !strcmp(a, "curve"))
                cl->auth = KVR_AUTH_CURVE;
            else
                st = fail(c, v, k,
                          "'%s' is not an authentication (want curve: ZeroMQ CURVE keys from "
                          "'keys:'; or none: anyone who reaches the router is trusted)",
                          a ? a : "(not a string)");
        } else if (!strcmp(k, "keys")) {
            st = get_str(c, v, k, keys, sizeof(keys));
        } else if (!strcmp(k, "cluster")) {
            st = get_str(c, v, k, cl->name, sizeof(cl->name));
        } else if (!strcmp(k, "model")) {
            st = get_str(c, v, k, model, sizeof(model));
        } else if (!strcmp(k, "block_size")) {
            st = get_u32(c, v, k, 1, 1024, &cl->block_size);
        } else if (!strcmp(k, "kv_dtype")) {
            st = get_str(c, v, k, cl->kv_dtype, sizeof(cl->kv_dtype));
            if (st == KVR_OK && strcmp(cl->kv_dtype, "f32") && strcmp(cl->kv_dtype, "bf16") &&
                strcmp(cl->kv_dtype, "f16"))
                st = fail(c, v, k,
                          "'%s' is not a KV dtype (want f32: full precision, the default; bf16 "
                          "or f16: half the KV memory and transfer bytes)",
                          cl->kv_dtype);
        } else if (!strcmp(k, "numerics")) {
            st = get_str(c, v, k, cl->numerics, sizeof(cl->numerics));
            if (st == KVR_OK && strcmp(cl->numerics, "f32") && strcmp(cl->numerics, "bf16dot"))
                st = fail(c, v, k,
                          "'%s' is not a numerics mode (want f32: the default, any AVX2 CPU; "
                          "bf16dot: bf16 weights on AVX512-BF16 vdpbf16ps, every node's CPU "
                          "must have avx512_bf16)",
                          cl->numerics);
        } else if (!strcmp(k, "router")) {
            router = v;
            st = parse_router(c, v, cl);
        } else if (!strcmp(k, "timeouts")) {
            st = parse_timeouts(c, v, cl);
        } else if (!strcmp(k, "thresholds")) {
            st = want_map(c, v, k);
            if (st == KVR_OK) {
                FOREACH_PAIR(c, v, tk, tv)
                {
                    if (!strcmp(tk, "local_prefill_tokens"))
                        st = get_u32(c, tv, "thresholds.local_prefill_tokens", 0, 1u << 30,
                                     &cl->local_prefill_tokens);
                    else
                        st = fail(c, tv, tk,
                                  "unknown key in 'thresholds' (known: local_prefill_tokens)");
                    if (st != KVR_OK)
                        return st;
                }
            }
        } else if (!strcmp(k, "limits")) {
            st = want_map(c, v, k);
            if (st == KVR_OK) {
                FOREACH_PAIR(c, v, lk, lv)
                {
                    char full[96];
                    snprintf(full, sizeof(full), "limits.%s", lk);
                    if (!strcmp(lk, "max_queue"))
                        st = get_u32(c, lv, full, 0, 1u << 20, &cl->max_queue);
                    else if (!strcmp(lk, "prefill_retries"))
                        st = get_u32(c, lv, full, 0, 100, &cl->prefill_retries);
                    else if (!strcmp(lk, "max_tokens"))
                        st = get_u32(c, lv, full, 1, 1u << 24, &cl->max_tokens_limit);
                    else if (!strcmp(lk, "prefill_chunk_tokens"))
                        st = get_u32(c, lv, full, 0, 1u << 20, &cl->prefill_chunk_tokens);
                    else if (!strcmp(lk, "reservation")) {
                        const char *rs = scalar(lv);
                        if (rs && !strcmp(rs, "paged"))
                            cl->reservation = KVR_RESERVE_PAGED;
                        else if (rs && !strcmp(rs, "whole"))
                            cl->reservation = KVR_RESERVE_WHOLE;
                        else
                            st = fail(c, lv, full,
                                      "'%s' is not a reservation policy (want paged: the "
                                      "prompt's blocks, grown while decoding; or whole: prompt + "
                                      "max_tokens up front)",
                                      rs ? rs : "(not a string)");
                    } else if (!strcmp(lk, "reservation_headroom_blocks"))
                        st = get_u32(c, lv, full, 0, 1u << 16, &cl->reservation_headroom_blocks);
                    else
                        st = fail(c, lv, full,
                                  "unknown key in 'limits' (known: max_queue, prefill_retries, "
                                  "max_tokens, prefill_chunk_tokens, reservation, "
                                  "reservation_headroom_blocks)");
                    if (st != KVR_OK)
                        return st;
                }
            }
        } else if (!strcmp(k, "nodes")) {
            nodes = v;
        } else {
            st = fail(c, v, k,
                      "unknown top-level key (known: cluster, model, block_size, kv_dtype, "
                      "numerics, auth, "
                      "keys, router, timeouts, thresholds, limits, nodes)");
        }
        if (st != KVR_OK)
            return st;
    }
    if (!router)
        return fail(c, root, "router", "missing (router: {client: tcp://..., node: tcp://...})");
    if (!model[0])
        return fail(c, root, "model", "missing (the model directory)");
    resolve_path(c->file, model, cl->model_dir, sizeof(cl->model_dir));
    if (cl->auth == KVR_AUTH_CURVE && !keys[0])
        return fail(c, root, "keys",
                    "missing: auth: curve needs the directory of the key files (kvrail keygen "
                    "DIR writes them)");
    if (keys[0])
        resolve_path(c->file, keys, cl->keys_dir, sizeof(cl->keys_dir));
    if (!nodes)
        return fail(c, root, "nodes", "missing (the list of nodes)");
    if (nodes->type != YAML_SEQUENCE_NODE)
        return fail(c, nodes, "nodes", "expected a list (- name: ...)");
    size_t n = (size_t)(nodes->data.sequence.items.top - nodes->data.sequence.items.start);
    if (n == 0)
        return fail(c, nodes, "nodes", "the list is empty");
    cl->nodes = calloc(n, sizeof(*cl->nodes));
    if (!cl->nodes)
        return KVR_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *nv = yaml_document_get_node(c->doc, nodes->data.sequence.items.start[i]);
        st = parse_node(c, nv, i, &cl->nodes[i]);
        if (st != KVR_OK)
            return st;
        cl->n_nodes = i + 1;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(cl->nodes[j].name, cl->nodes[i].name)) {
                char full[96];
                snprintf(full, sizeof(full), "nodes[%zu].name", i);
                return fail(c, nv, full, "duplicate node name '%s' (first on line %d)",
                            cl->nodes[i].name, cl->nodes[j].line);
            }
    }
    if (!kvr_cluster_first(cl, KVR_NODE_ROLE_DECODE))
        return fail(c, nodes, "nodes", "no node has role decode (a cluster needs at least one)");
    if (!cl->client_bind[0])
        memcpy(cl->client_bind, cl->client_endpoint, sizeof(cl->client_bind));
    if (!cl->node_bind[0])
        memcpy(cl->node_bind, cl->node_endpoint, sizeof(cl->node_bind));
    return KVR_OK;
}

static void set_defaults(kvr_cluster_t *cl)
{
    strcpy(cl->name, "kvrail");
    cl->block_size = 16;
    strcpy(cl->kv_dtype, "f32");
    strcpy(cl->numerics, "f32");
    cl->timeouts.lease_ms = 10000;
    cl->timeouts.queue_ms = 5000;
    cl->timeouts.heartbeat_ms = 1000;
    cl->timeouts.heartbeat_timeout_ms = 3000;
    cl->timeouts.request_ms = 300000;
    cl->timeouts.prefill_ms = 60000;
    cl->timeouts.client_idle_ms = 0;
    cl->timeouts.connect_ms = 30000;
    cl->local_prefill_tokens = 32;
    cl->max_queue = 256;
    cl->prefill_retries = 2;
    cl->max_tokens_limit = 8192;
    cl->prefill_chunk_tokens = 0;
    cl->reservation = KVR_RESERVE_PAGED;
    cl->reservation_headroom_blocks = 2;
}

kvr_status_t kvr_cluster_parse(const char *text, size_t len, const char *name,
                               kvr_cluster_t **cluster_p, char *err, size_t err_len)
{
    if (!text || !name || !cluster_p)
        return KVR_ERR_INVALID;
    kvr_cluster_t *cl = calloc(1, sizeof(*cl));
    if (!cl)
        return KVR_ERR_NO_MEMORY;
    snprintf(cl->path, sizeof(cl->path), "%s", name);
    set_defaults(cl);

    kvr_status_t st = KVR_OK;
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        st = KVR_ERR_NO_MEMORY;
        goto err_free;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        if (err && err_len)
            snprintf(err, err_len, "%s:%lu: YAML syntax error: %s%s%s", name,
                     (unsigned long)parser.problem_mark.line + 1,
                     parser.problem ? parser.problem : "unknown", parser.context ? " " : "",
                     parser.context ? parser.context : "");
        st = KVR_ERR_INVALID;
        goto err_parser;
    }
    struct ctx c = {.file = name, .doc = &doc, .err = err, .err_len = err_len};
    st = parse_root(&c, yaml_document_get_root_node(&doc), cl);
    yaml_document_delete(&doc);
    if (st != KVR_OK)
        goto err_parser;
    yaml_parser_delete(&parser);
    *cluster_p = cl;
    return KVR_OK;

err_parser:
    yaml_parser_delete(&parser);
err_free:
    kvr_cluster_free(cl);
    return st;
}

kvr_status_t kvr_cluster_load(const char *path, kvr_cluster_t **cluster_p, char *err,
                              size_t err_len)
{
    if (!path)
        return KVR_ERR_INVALID;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        if (err && err_len)
            snprintf(err, err_len, "%s: cannot open cluster file: %s", path, strerror(e));
        return e == ENOENT ? KVR_ERR_NOT_FOUND : KVR_ERR_IO;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    kvr_status_t st = KVR_OK;
    if (!buf) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    for (;;) {
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
        if (len == cap) {
            if (cap >= (16u << 20)) {
                if (err && err_len)
                    snprintf(err, err_len, "%s: cluster file larger than 16 MiB", path);
                st = KVR_ERR_INVALID;
                goto out;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = KVR_ERR_NO_MEMORY;
                goto out;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        if (err && err_len)
            snprintf(err, err_len, "%s: read error", path);
        st = KVR_ERR_IO;
        goto out;
    }
    st = kvr_cluster_parse(buf, len, path, cluster_p, err, err_len);
out:
    free(buf);
    fclose(f);
    return st;
}

void kvr_cluster_free(kvr_cluster_t *cluster)
{
    if (!cluster)
        return;
    free(cluster->nodes);
    free(cluster);
}

const kvr_cluster_node_t *kvr_cluster_find(const kvr_cluster_t *cluster, const char *name)
{
    if (!cluster || !name)
        return NULL;
    for (size_t i = 0; i < cluster->n_nodes; i++)
        if (!strcmp(cluster->nodes[i].name, name))
            return &cluster->nodes[i];
    return NULL;
}

const kvr_cluster_node_t *kvr_cluster_first(const kvr_cluster_t *cluster, enum kvr_node_role role)
{
    if (!cluster)
        return NULL;
    for (size_t i = 0; i < cluster->n_nodes; i++)
        if (cluster->nodes[i].role == role)
            return &cluster->nodes[i];
    return NULL;
}

bool kvr_cluster_node_is_local(const kvr_cluster_node_t *node)
{
    if (!node)
        return false;
    const char *h = node->host;
    if (!strcmp(h, "localhost") || !strcmp(h, "127.0.0.1") || !strcmp(h, "::1") || !h[0])
        return true;
    char me[256] = "";
    if (gethostname(me, sizeof(me) - 1) != 0)
        return false;
    if (!strcasecmp(h, me))
        return true;
    size_t hl = strcspn(h, "."), ml = strcspn(me, ".");
    return hl == ml && !strncasecmp(h, me, hl);
}

const char *kvr_node_role_name(enum kvr_node_role role)
{
    switch (role) {
    case KVR_NODE_ROLE_PREFILL:
        return "prefill";
    case KVR_NODE_ROLE_DECODE:
        return "decode";
    case KVR_NODE_ROLE_ROUTER:
        return "router";
    }
    return "?";
}
