/*
 * auth.c - the router's ZAP handler (ZeroMQ's authentication protocol, RFC
 * 27) for `auth: curve` (docs/security.md).  libzmq asks it, over the inproc
 * REP socket inproc://zeromq.zap.01, about every CURVE handshake on the
 * router's two endpoints; the domain says which ("node", "client").  A node
 * connection is accepted only with the public key of a prefill/decode node
 * of the cluster file (KEYS/NAME.pub), and its User-Id is that node's name:
 * node_ep.c then accepts a message as node NAME only from a connection whose
 * User-Id is NAME, so a key opens one name, never another.  A client
 * connection is accepted with any key of KEYS/clients/ (a .pub file; User-Id
 * "client:FILE").  Everything else is refused (400) and counted.  The keys
 * are read once at start-up; a missing node key is an error then.
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvr_log.h"
#include "router.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

kvr_status_t rt_auth_init(rt_t *r)
{
    if (r->cl->auth != KVR_AUTH_CURVE) {
        KVR_LOG_WARN("router",
                     "%s: auth: none%s: anyone who can reach %s or %s is trusted as a node or "
                     "client (gets prompts, KV addresses, streams tokens); see "
                     "docs/security.md",
                     r->cl->path, r->cl->auth_set ? "" : " (not set)", r->cl->node_bind,
                     r->cl->client_bind);
        return KVR_OK;
    }
    char err[512];
    kvr_status_t st = kvr_proto_curve_available(err, sizeof(err));
    if (st != KVR_OK) {
        KVR_LOG_ERROR("router", "%s", err);
        return st;
    }
    for (int i = 0; i < r->n_nodes; i++) {
        char z[KVR_CURVE_Z85_LEN + 1];
        st = kvr_proto_curve_load_public(r->cl->keys_dir, r->nodes[i].name, z, err, sizeof(err));
        if (st != KVR_OK) {
            KVR_LOG_ERROR("router", "node %s: %s", r->nodes[i].name, err);
            return st;
        }
        zmq_z85_decode(r->nodes[i].pubkey, z);
    }
    char dir[KVR_CLUSTER_PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/clients", r->cl->keys_dir);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && r->n_client_keys < RT_MAX_CLIENT_KEYS) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".pub") || l - 4 >= sizeof(r->client_keys[0].name))
            continue;
        char name[64], z[KVR_CURVE_Z85_LEN + 1];
        snprintf(name, sizeof(name), "%.*s", (int)(l - 4), e->d_name);
        if (kvr_proto_curve_load_public(dir, name, z, err, sizeof(err)) != KVR_OK) {
            KVR_LOG_WARN("router", "client key skipped: %s", err);
            continue;
        }
        struct rt_client_key *k = &r->client_keys[r->n_client_keys++];
        snprintf(k->name, sizeof(k->name), "%s", name);
        zmq_z85_decode(k->pub, z);
    }
    if (d)
        closedir(d);
    r->zap_sock = zmq_socket(r->zctx, ZMQ_REP);
    if (!r->zap_sock || zmq_bind(r->zap_sock, ZAP_ENDPOINT) != 0) {
        KVR_LOG_ERROR("router", "ZAP handler %s: %s", ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
        return KVR_ERR_IO;
    }
    KVR_LOG_INFO("router", "auth: curve, keys in %s: %d node keys, %zu client keys",
                 r->cl->keys_dir, r->n_nodes, r->n_client_keys);
    return KVR_OK;
}

void rt_auth_fini(rt_t *r)
{
    if (r->zap_sock)
        zmq_close(r->zap_sock);
    r->zap_sock = NULL;
}

/* One ZAP request: version, request id, domain, address, identity,
 * mechanism, credentials (CURVE: the client's 32-byte public key). */
static void zap_one(rt_t *r)
{
    zmq_msg_t part[8];
    size_t n = 0;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, r->zap_sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < 8)
            part[n++] = m;
        else
            zmq_msg_close(&m);
    }
    if (n == 0)
        return;
    const char *status = "400", *text = "unknown key";
    char user[80] = "";
    char domain[16] = "", mech[16] = "";
    if (n >= 7) {
        snprintf(domain, sizeof(domain), "%.*s", (int)zmq_msg_size(&part[2]),
                 (const char *)zmq_msg_data(&part[2]));
        snprintf(mech, sizeof(mech), "%.*s", (int)zmq_msg_size(&part[5]),
                 (const char *)zmq_msg_data(&part[5]));
    }
    if (n < 7 || strcmp(mech, "CURVE") || zmq_msg_size(&part[6]) != 32) {
        text = "CURVE required";
    } else {
        const uint8_t *key = zmq_msg_data(&part[6]);
        if (!strcmp(domain, "node")) {
            for (int i = 0; i < r->n_nodes; i++)
                if (!memcmp(r->nodes[i].pubkey, key, 32)) {
                    snprintf(user, sizeof(user), "%s", r->nodes[i].name);
                    status = "200";
                    text = "OK";
                }
        } else if (!strcmp(domain, "client")) {
            for (size_t i = 0; i < r->n_client_keys; i++)
                if (!memcmp(r->client_keys[i].pub, key, 32)) {
                    snprintf(user, sizeof(user), "client:%s", r->client_keys[i].name);
                    status = "200";
                    text = "OK";
                }
        }
        if (status[0] != '2') {
            char z[KVR_CURVE_Z85_LEN + 1] = "";
            zmq_z85_encode(z, key, 32);
            r->st.auth_refused++;
            if (rt_bad_log_ok(r))
                KVR_LOG_WARN("router",
                             "%s endpoint: connection from %.*s refused: public key %s is not "
                             "in %s (%" PRIu64 " refused so far)",
                             domain, (int)zmq_msg_size(&part[3]),
                             (const char *)zmq_msg_data(&part[3]), z,
                             !strcmp(domain, "node") ? "the nodes' keys" : "KEYS/clients/",
                             r->st.auth_refused);
        }
    }
    if (status[0] != '2' && n >= 6 && strcmp(mech, "CURVE")) {
        r->st.auth_refused++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "%s endpoint: a %s connection refused: CURVE required", domain,
                         mech);
    }
    /* reply: version, request id, status code, status text, user id,
     * metadata */
    zmq_send(r->zap_sock, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2)
        zmq_send(r->zap_sock, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), ZMQ_SNDMORE);
    else
        zmq_send(r->zap_sock, "", 0, ZMQ_SNDMORE);
    zmq_send(r->zap_sock, status, 3, ZMQ_SNDMORE);
    zmq_send(r->zap_sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(r->zap_sock, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(r->zap_sock, "", 0, 0);
    for (size_t i = 0; i < n; i++)
        zmq_msg_close(&part[i]);
}

void rt_auth_zap(rt_t *r)
{
    for (int i = 0; i < 64; i++) {
        int ev = 0;
        size_t sz = sizeof(ev);
        if (zmq_getsockopt(r->zap_sock, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
            return;
        zap_one(r);
    }
}

bool rt_auth_node_ok(rt_t *r, const kvr_proto_frame_t *f, const struct rt_node *n)
{
    if (r->cl->auth != KVR_AUTH_CURVE || !n)
        return true;
    if (!strcmp(f->user_id, n->name))
        return true;
    r->st.auth_refused++;
    if (rt_bad_log_ok(r))
        KVR_LOG_WARN("router",
                     "node endpoint: %s as node %s from a connection authenticated as '%s': "
                     "refused (a node's key opens only its own name)",
                     kvr_proto_method_label(f->hdr.method), n->name, f->user_id);
    return false;
}
