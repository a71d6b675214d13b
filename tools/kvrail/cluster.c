/*
 * cluster.c - `kvrail cluster`: cluster file tools for launchers (the Slurm
 * batch script, Kubernetes probes, systemd, scripts).
 *
 *   kvrail cluster render ...            a concrete file from a template (render.c)
 *   kvrail cluster nodes FILE            one line per node: NAME ROLE HOST, the
 *                                        router first (launchers start them in
 *                                        this order)
 *   kvrail cluster wait FILE [--node NAME] [--timeout MS]
 *                                        exit 0 once the router answers and
 *                                        NAME (default: every node of FILE) is
 *                                        alive; 1 at the timeout (default
 *                                        timeouts.connect_ms) naming who is
 *                                        missing.  A readiness probe.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_client.h"
#include "kvr_clock.h"
#include "kvr_cluster.h"
#include "kvr_cmd.h"

static const char cluster_usage[] =
    "usage: kvrail cluster render --template FILE (--hosts H,... | --hosts-file F) [--prefill N]\n"
    "                             [--decode M] [--model DIR] [-o OUT]\n"
    "       kvrail cluster nodes FILE\n"
    "       kvrail cluster wait FILE [--node NAME] [--timeout MS]\n";

static int cluster_nodes(int argc, char **argv)
{
    if (argc != 2) {
        fputs(cluster_usage, stderr);
        return 2;
    }
    kvr_cluster_t *cl = NULL;
    char err[1024];
    if (kvr_cluster_load(argv[1], &cl, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail cluster nodes: %s\n", err);
        return 1;
    }
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < cl->n_nodes; i++) {
            const kvr_cluster_node_t *n = &cl->nodes[i];
            if ((n->role == KVR_NODE_ROLE_ROUTER) == (pass == 0))
                printf("%s %s %s\n", n->name, kvr_node_role_name(n->role), n->host);
        }
    kvr_cluster_free(cl);
    return 0;
}

/* Names in want (NULL: every non-router node of cl) not alive in s, into
 * missing; returns how many. */
static size_t not_alive(const kvr_cluster_t *cl, const char *want,
                        const struct kvr_cluster_status *s, char *missing, size_t cap)
{
    size_t n = 0;
    missing[0] = 0;
    for (size_t i = 0; i < cl->n_nodes; i++) {
        const kvr_cluster_node_t *nd = &cl->nodes[i];
        if (nd->role == KVR_NODE_ROLE_ROUTER || (want && strcmp(want, nd->name)))
            continue;
        bool alive = false;
        for (size_t j = 0; j < s->n_nodes; j++)
            alive |= !strcmp(s->nodes[j].name, nd->name) && s->nodes[j].alive;
        if (!alive) {
            n++;
            size_t len = strlen(missing);
            snprintf(missing + len, cap - len, " %s", nd->name);
        }
    }
    return n;
}

static int cluster_wait(int argc, char **argv)
{
    static const struct option opts[] = {
        {"node", required_argument, NULL, 'n'},
        {"timeout", required_argument, NULL, 'T'},
        {NULL, 0, NULL, 0},
    };
    const char *want = NULL;
    long timeout_ms = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "n:T:", opts, NULL)) != -1) {
        if (c == 'n') {
            want = optarg;
        } else if (c == 'T') {
            char *end;
            timeout_ms = strtol(optarg, &end, 10);
            if (*end || timeout_ms <= 0 || timeout_ms > 86400000) {
                fprintf(stderr, "kvrail cluster wait: --timeout '%s' is not 1..86400000 ms\n",
                        optarg);
                return 2;
            }
        } else {
            fputs(cluster_usage, stderr);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fputs(cluster_usage, stderr);
        return 2;
    }
    kvr_cluster_t *cl = NULL;
    char err[1024];
    if (kvr_cluster_load(argv[optind], &cl, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail cluster wait: %s\n", err);
        return 1;
    }
    if (want && (!kvr_cluster_find(cl, want))) {
        fprintf(stderr, "kvrail cluster wait: %s has no node '%s'\n", argv[optind], want);
        kvr_cluster_free(cl);
        return 1;
    }
    if (timeout_ms < 0)
        timeout_ms = (long)cl->timeouts.connect_ms;
    bool router_only = want && kvr_cluster_find(cl, want)->role == KVR_NODE_ROLE_ROUTER;
    kvr_client_t *cli = NULL;
    int rc = 1;
    static struct kvr_cluster_status s;
    char missing[1024] = " (router not answering)";
    uint64_t deadline = kvr_deadline_ns((int)timeout_ms);
    if (kvr_client_connect(cl->client_endpoint, &cli) != KVR_OK) {
        fprintf(stderr, "kvrail cluster wait: cannot connect to %s\n", cl->client_endpoint);
        goto out;
    }
    for (;;) {
        uint64_t now = kvr_now_ns();
        int step = now < deadline ? (int)((deadline - now) / 1000000u) : 0;
        if (step > 1000)
            step = 1000;
        if (step <= 0) {
            fprintf(stderr, "kvrail cluster wait: not alive after %ld ms:%s\n", timeout_ms,
                    missing);
            break;
        }
        if (kvr_client_status(cli, step, &s) == KVR_OK) {
            if (router_only || !not_alive(cl, want, &s, missing, sizeof(missing))) {
                rc = 0;
                break;
            }
        } else {
            snprintf(missing, sizeof(missing), " (router at %s not answering: %s)",
                     cl->client_endpoint, kvr_client_error(cli));
        }
        usleep(100000);
    }
out:
    if (cli)
        kvr_client_close(cli);
    kvr_cluster_free(cl);
    return rc;
}

int kvr_cmd_cluster(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "render"))
        return kvr_cmd_cluster_render(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "nodes"))
        return cluster_nodes(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "wait"))
        return cluster_wait(argc - 1, argv + 1);
    bool help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    fputs(cluster_usage, help ? stdout : stderr);
    return help ? 0 : 2;
}
