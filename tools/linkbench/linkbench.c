/*
 * linkbench.c - kvr-link-bench: the cost of libkvrail-client's two router
 * links, side by side in one run (docs/frontend.md, "The direct router
 * link"; docs/security.md for CURVE).  A benchmark tool, run by hand
 * (tools/linkbench/run.py starts the routers); not a test.
 *
 *   kvr-link-bench --router ENDPOINT [--rounds N] [--block N]
 *
 * Opens both links to one router: the direct one (kvr_client_connect_direct:
 * ZMTP spoken on the caller's own socket, CURVE from zmtp_curve.c when keys
 * are set) and libzmq's (kvr_client_connect: a DEALER, libzmq's CURVE).
 * Both take CURVE keys from KVRAIL_ROUTER_KEY / KVRAIL_CLIENT_KEY, so one
 * environment runs both over CURVE or both over NULL.  It then times N
 * PING round trips (kvr_client_ping: the router answers PING itself) on
 * each, interleaved in blocks of --block (default 100) so both see the same
 * load, and the process's CPU time (user + system, I/O threads included)
 * spent in each link's blocks.  Prints a markdown table: round trip p50 /
 * p99 / mean in microseconds, CPU microseconds per round trip, and the
 * direct link's figures over libzmq's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kvr_client.h"
#include "kvr_clock.h"

static uint64_t cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000u +
           (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000u;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct link {
    const char *name;
    kvr_client_t *c;
    uint64_t *rt;
    size_t n;
    uint64_t cpu;
};

int main(int argc, char **argv)
{
    const char *router = NULL;
    size_t rounds = 20000, block = 100;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--router") && i + 1 < argc)
            router = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--block") && i + 1 < argc)
            block = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr, "usage: kvr-link-bench --router ENDPOINT [--rounds N] [--block N]\n");
            return 2;
        }
    }
    if (!router || rounds == 0 || block == 0) {
        fprintf(stderr, "usage: kvr-link-bench --router ENDPOINT [--rounds N] [--block N]\n");
        return 2;
    }
    bool curve = getenv("KVRAIL_ROUTER_KEY") != NULL;
    struct link l[2] = {{.name = "direct"}, {.name = "zmq"}};
    if (kvr_client_connect_direct(router, &l[0].c) != KVR_OK ||
        kvr_client_connect(router, &l[1].c) != KVR_OK) {
        fprintf(stderr, "kvr-link-bench: cannot open the links to %s\n", router);
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        l[k].rt = calloc(rounds, sizeof(uint64_t));
        if (!l[k].rt)
            return 1;
        /* connected (and warm) before timing */
        int tries = 0;
        while (kvr_client_ping(l[k].c, 1000) != KVR_OK)
            if (++tries == 10) {
                fprintf(stderr, "kvr-link-bench: the %s link: no PING reply: %s\n", l[k].name,
                        kvr_client_error(l[k].c));
                return 1;
            }
        for (int w = 0; w < 200; w++)
            kvr_client_ping(l[k].c, 1000);
    }
    while (l[0].n < rounds) {
        for (int k = 0; k < 2; k++) {
            uint64_t c0 = cpu_ns();
            for (size_t b = 0; b < block && l[k].n < rounds; b++) {
                uint64_t t0 = kvr_now_ns();
                if (kvr_client_ping(l[k].c, 5000) != KVR_OK) {
                    fprintf(stderr, "kvr-link-bench: the %s link: PING failed: %s\n", l[k].name,
                            kvr_client_error(l[k].c));
                    return 1;
                }
                l[k].rt[l[k].n++] = kvr_now_ns() - t0;
            }
            l[k].cpu += cpu_ns() - c0;
        }
    }
    printf("| link (%s, %zu round trips each, blocks of %zu) | p50 us | p99 us | mean us | CPU "
           "us/rt |\n|---|---:|---:|---:|---:|\n",
           curve ? "CURVE" : "NULL", rounds, block);
    double f[2][4];
    for (int k = 0; k < 2; k++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < l[k].n; i++)
            sum += l[k].rt[i];
        qsort(l[k].rt, l[k].n, sizeof(uint64_t), cmp_u64);
        f[k][0] = l[k].rt[l[k].n / 2] / 1e3;
        f[k][1] = l[k].rt[l[k].n * 99 / 100] / 1e3;
        f[k][2] = (double)sum / (double)l[k].n / 1e3;
        f[k][3] = (double)l[k].cpu / (double)l[k].n / 1e3;
        printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", l[k].name, f[k][0], f[k][1], f[k][2],
               f[k][3]);
    }
    printf("| direct / zmq | %.2fx | %.2fx | %.2fx | %.2fx |\n", f[0][0] / f[1][0],
           f[0][1] / f[1][1], f[0][2] / f[1][2], f[0][3] / f[1][3]);
    for (int k = 0; k < 2; k++) {
        kvr_client_close(l[k].c);
        free(l[k].rt);
    }
    return 0;
}
