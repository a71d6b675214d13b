/*
 * keygen.c - `kvrail keygen`: writes the CURVE key pairs of a cluster
 * (docs/security.md).
 *
 *   kvrail keygen --config FILE [--client NAME]...
 *       into the file's `keys:` directory (made 0700 when missing): a pair
 *       for the router and for every prefill/decode node that has none yet,
 *       and client pairs under clients/ (the router accepts those keys)
 *   kvrail keygen DIR NAME...
 *       a pair NAME per name into DIR
 *
 * A pair is NAME.key (public and secret key, created 0600) and NAME.pub;
 * an existing pair is kept (remove it to make a new one).  Copy to each host
 * only what it needs: a node its own NAME.key and the router's .pub, the
 * router its own .key and every node's and client's .pub.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_cluster.h"
#include "kvr_cmd.h"
#include "kvr_proto.h"

static int one(const char *dir, const char *name)
{
    char path[4200], err[512];
    snprintf(path, sizeof(path), "%s/%s.key", dir, name);
    if (access(path, F_OK) == 0) {
        printf("%s: kept (exists)\n", path);
        return 0;
    }
    if (kvr_proto_curve_keygen(dir, name, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail keygen: %s\n", err);
        return 1;
    }
    printf("%s: written (and %s.pub)\n", path, name);
    return 0;
}

static int mkdir_private(const char *dir)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvrail keygen: mkdir %s: %s\n", dir, strerror(errno));
        return 1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrail keygen --config FILE [--client NAME]...\n"
               "       kvrail keygen DIR NAME...\n"
               "Writes CURVE key pairs (NAME.key 0600, NAME.pub) for `auth: curve`.\n");
}

int kvr_cmd_keygen(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"client", required_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = NULL;
    const char *clients[64];
    int n_clients = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:C:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'C':
            if (n_clients < 64)
                clients[n_clients++] = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    char err[1024];
    if (kvr_proto_curve_available(err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail keygen: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (!config) {
        if (argc - optind < 2) {
            usage(stderr);
            return 2;
        }
        const char *dir = argv[optind];
        if (mkdir_private(dir))
            return 1;
        for (int i = optind + 1; i < argc; i++)
            rc |= one(dir, argv[i]);
        return rc;
    }
    kvr_cluster_t *cl = NULL;
    if (kvr_cluster_load(config, &cl, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail keygen: %s\n", err);
        return 1;
    }
    if (!cl->keys_dir[0]) {
        fprintf(stderr,
                "kvrail keygen: %s has no 'keys:' (the directory of the key files; "
                "add it with auth: curve)\n",
                config);
        kvr_cluster_free(cl);
        return 1;
    }
    if (mkdir_private(cl->keys_dir)) {
        kvr_cluster_free(cl);
        return 1;
    }
    rc |= one(cl->keys_dir, kvr_proto_curve_router_name(cl));
    for (size_t i = 0; i < cl->n_nodes; i++)
        if (cl->nodes[i].role != KVR_NODE_ROLE_ROUTER)
            rc |= one(cl->keys_dir, cl->nodes[i].name);
    if (n_clients) {
        char cdir[KVR_CLUSTER_PATH_MAX + 16];
        snprintf(cdir, sizeof(cdir), "%s/clients", cl->keys_dir);
        rc |= mkdir_private(cdir);
        for (int i = 0; i < n_clients && !rc; i++)
            rc |= one(cdir, clients[i]);
    }
    kvr_cluster_free(cl);
    return rc;
}
