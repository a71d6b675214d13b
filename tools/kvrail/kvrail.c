/*
 * kvrail.c - the `kvrail` operator tool: dispatches to its subcommands.
 * `kvrail --version` prints the project version meson was configured with.
 */
#include <stdio.h>
#include <string.h>

#ifndef KVR_VERSION
#error "KVR_VERSION comes from meson (tools/kvrail/meson.build)"
#endif

#include "kvr_cmd.h"
#include "kvr_version.h"

struct subcmd {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
};

static const struct subcmd cmds[] = {
    {"run", kvr_cmd_run, "single-process reference generation (no cluster)"},
    {"generate", kvr_cmd_generate, "generate text through the router, streaming"},
    {"status", kvr_cmd_status, "nodes, load, cached blocks, KV bytes moved"},
    {"up", kvr_cmd_up, "start every node a cluster file places on this host"},
    {"cluster", kvr_cmd_cluster, "cluster file tools: `cluster render` fills in hosts"},
    {"keygen", kvr_cmd_keygen, "CURVE key pairs for auth: curve (docs/security.md)"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrail <command> [options]\n       kvrail --version\n\ncommands:\n");
    for (const struct subcmd *c = cmds; c->name; c++)
        fprintf(f, "  %-10s %s\n", c->name, c->help);
    fprintf(f, "\n'kvrail <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        kvr_version_print("kvrail");
        return 0;
    }
    for (const struct subcmd *c = cmds; c->name; c++)
        if (strcmp(argv[1], c->name) == 0)
            return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "kvrail: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
