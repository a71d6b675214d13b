/*
 * curve.c - ZeroMQ CURVE for kvrail's control plane (docs/security.md):
 * key files, and the socket options of the router's server sockets and of
 * the nodes' and clients' sockets.  A key pair NAME lives in a keys
 * directory as two files written by `kvrail keygen`:
 *   NAME.pub  the public key, Z85 (40 characters) and a newline
 *   NAME.key  "public Z85\nsecret Z85\n", mode 0600 (refused when others can
 *             read it: a secret key anyone on the host can read is no key)
 * Nodes use the key pair named after their node name, the router the one of
 * its router node ("router" when the file names none), clients the pairs in
 * KEYS/clients/ (the router accepts every .pub file there).
 */
#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zmq.h>

#include "kvr_proto.h"
#include "proto_err.h"

static bool z85_ok(const char *z)
{
    uint8_t bin[32];
    return strlen(z) == KVR_CURVE_Z85_LEN && zmq_z85_decode(bin, z) != NULL;
}

kvr_status_t kvr_proto_curve_available(char *err, size_t err_len)
{
    if (!zmq_has("curve")) {
        kvr_proto_set_err(
            err, err_len,
            "this libzmq has no CURVE (built without libsodium): auth: curve cannot work "
            "here");
        return KVR_ERR_UNSUPPORTED;
    }
    return KVR_OK;
}

kvr_status_t kvr_proto_curve_keygen(const char *dir, const char *name, char *err, size_t err_len)
{
    kvr_status_t st = kvr_proto_curve_available(err, err_len);
    if (st != KVR_OK)
        return st;
    char pub[KVR_CURVE_Z85_LEN + 1], sec[KVR_CURVE_Z85_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0) {
        kvr_proto_set_err(err, err_len, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
        return KVR_ERR_IO;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.key", dir, name);
    FILE *f = NULL;
    int fd = -1;
    {
        /* created 0600 from the start: never readable by others, even briefly */
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            kvr_proto_set_err(err, err_len, "%s: %s%s", path, strerror(errno),
                              errno == EEXIST ? " (remove it first to make a new key)" : "");
            return KVR_ERR_IO;
        }
        f = fdopen(fd, "w");
    }
    if (!f || fprintf(f, "%s\n%s\n", pub, sec) < 0 || fclose(f) != 0) {
        kvr_proto_set_err(err, err_len, "%s: cannot write: %s", path, strerror(errno));
        return KVR_ERR_IO;
    }
    snprintf(path, sizeof(path), "%s/%s.pub", dir, name);
    f = fopen(path, "w");
    if (!f || fprintf(f, "%s\n", pub) < 0 || fclose(f) != 0) {
        kvr_proto_set_err(err, err_len, "%s: cannot write: %s", path, strerror(errno));
        return KVR_ERR_IO;
    }
    return KVR_OK;
}

static kvr_status_t read_lines(const char *path, bool secret, char *l1, char *l2, char *err,
                               size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        kvr_proto_set_err(err, err_len, "%s: %s (kvrail keygen writes key files)", path,
                          strerror(errno));
        return KVR_ERR_NOT_FOUND;
    }
    struct stat sb;
    if (secret && fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077)) {
        fclose(f);
        kvr_proto_set_err(err, err_len,
                          "%s: a secret key readable by group or others (mode %03o): chmod 600 it",
                          path, (unsigned)(sb.st_mode & 0777));
        return KVR_ERR_INVALID;
    }
    char b1[128] = "", b2[128] = "";
    bool ok = fgets(b1, sizeof(b1), f) && (!secret || fgets(b2, sizeof(b2), f));
    fclose(f);
    b1[strcspn(b1, "\r\n")] = 0;
    b2[strcspn(b2, "\r\n")] = 0;
    if (!ok || !z85_ok(b1) || (secret && !z85_ok(b2))) {
        kvr_proto_set_err(err, err_len, "%s: not a kvrail key file (want %s of %d Z85 characters)",
                          path,
                          secret ? "two lines, public and secret key," : "one line, the public key",
                          KVR_CURVE_Z85_LEN);
        return KVR_ERR_INVALID;
    }
    memcpy(l1, b1, KVR_CURVE_Z85_LEN + 1);
    if (secret)
        memcpy(l2, b2, KVR_CURVE_Z85_LEN + 1);
    return KVR_OK;
}

kvr_status_t kvr_proto_curve_load_public(const char *dir, const char *name,
                                         char pub_p[KVR_CURVE_Z85_LEN + 1], char *err,
                                         size_t err_len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.pub", dir, name);
    return read_lines(path, false, pub_p, NULL, err, err_len);
}

kvr_status_t kvr_proto_curve_load_pair(const char *dir, const char *name,
                                       char pub_p[KVR_CURVE_Z85_LEN + 1],
                                       char sec_p[KVR_CURVE_Z85_LEN + 1], char *err, size_t err_len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.key", dir, name);
    return read_lines(path, true, pub_p, sec_p, err, err_len);
}

const char *kvr_proto_curve_router_name(const kvr_cluster_t *cl)
{
    const kvr_cluster_node_t *r = kvr_cluster_first(cl, KVR_NODE_ROLE_ROUTER);
    return r ? r->name : "router";
}

kvr_status_t kvr_proto_curve_server(void *sock, const kvr_cluster_t *cl, const char *domain,
                                    char *err, size_t err_len)
{
    kvr_status_t st = kvr_proto_curve_available(err, err_len);
    if (st != KVR_OK)
        return st;
    char pub[KVR_CURVE_Z85_LEN + 1], sec[KVR_CURVE_Z85_LEN + 1];
    st = kvr_proto_curve_load_pair(cl->keys_dir, kvr_proto_curve_router_name(cl), pub, sec, err,
                                   err_len);
    if (st != KVR_OK)
        return st;
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, KVR_CURVE_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0) {
        kvr_proto_set_err(err, err_len, "CURVE server options: %s", zmq_strerror(zmq_errno()));
        return KVR_ERR_IO;
    }
    return KVR_OK;
}

kvr_status_t kvr_proto_curve_client_keys(void *sock, const char *server_pub, const char *pub,
                                         const char *sec, char *err, size_t err_len)
{
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_pub, KVR_CURVE_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, KVR_CURVE_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, KVR_CURVE_Z85_LEN) != 0) {
        kvr_proto_set_err(err, err_len, "CURVE client options: %s", zmq_strerror(zmq_errno()));
        return KVR_ERR_IO;
    }
    return KVR_OK;
}

kvr_status_t kvr_proto_curve_client(void *sock, const kvr_cluster_t *cl, const char *name,
                                    char *err, size_t err_len)
{
    if (cl->auth != KVR_AUTH_CURVE)
        return KVR_OK;
    kvr_status_t st = kvr_proto_curve_available(err, err_len);
    if (st != KVR_OK)
        return st;
    char spub[KVR_CURVE_Z85_LEN + 1], pub[KVR_CURVE_Z85_LEN + 1], sec[KVR_CURVE_Z85_LEN + 1];
    st = kvr_proto_curve_load_public(cl->keys_dir, kvr_proto_curve_router_name(cl), spub, err,
                                     err_len);
    if (st == KVR_OK)
        st = kvr_proto_curve_load_pair(cl->keys_dir, name, pub, sec, err, err_len);
    if (st == KVR_OK)
        st = kvr_proto_curve_client_keys(sock, spub, pub, sec, err, err_len);
    return st;
}

kvr_status_t kvr_proto_curve_env_keys(struct kvr_curve_env_keys *keys_p, bool *set_p, char *err,
                                      size_t err_len)
{
    const char *rk = getenv("KVRAIL_ROUTER_KEY"), *ck = getenv("KVRAIL_CLIENT_KEY");
    if (!rk && !ck) {
        *set_p = false;
        return KVR_OK;
    }
    if (!rk || !ck) {
        kvr_proto_set_err(
            err, err_len,
            "KVRAIL_ROUTER_KEY (the router's .pub) and KVRAIL_CLIENT_KEY (this client's "
            ".key) go together; %s is not set",
            rk ? "KVRAIL_CLIENT_KEY" : "KVRAIL_ROUTER_KEY");
        return KVR_ERR_INVALID;
    }
    struct kvr_curve_env_keys k;
    kvr_status_t st = read_lines(rk, false, k.server, NULL, err, err_len);
    if (st == KVR_OK)
        st = read_lines(ck, true, k.pub, k.sec, err, err_len);
    if (st == KVR_OK &&
        (!zmq_z85_decode(keys_p->server_bin, k.server) || !zmq_z85_decode(keys_p->pub_bin, k.pub) ||
         !zmq_z85_decode(keys_p->sec_bin, k.sec))) {
        kvr_proto_set_err(err, err_len, "%s / %s: not Z85 keys", rk, ck);
        st = KVR_ERR_INVALID;
    }
    if (st == KVR_OK) {
        memcpy(keys_p->server, k.server, sizeof(k.server));
        memcpy(keys_p->pub, k.pub, sizeof(k.pub));
        memcpy(keys_p->sec, k.sec, sizeof(k.sec));
        *set_p = true;
    }
    explicit_bzero(&k, sizeof(k));
    return st;
}

kvr_status_t kvr_proto_curve_client_env(void *sock, char *err, size_t err_len)
{
    struct kvr_curve_env_keys k;
    bool set = false;
    kvr_status_t st = kvr_proto_curve_env_keys(&k, &set, err, err_len);
    if (st != KVR_OK || !set)
        return st;
    st = kvr_proto_curve_available(err, err_len);
    if (st == KVR_OK)
        st = kvr_proto_curve_client_keys(sock, k.server, k.pub, k.sec, err, err_len);
    explicit_bzero(&k, sizeof(k));
    return st;
}
