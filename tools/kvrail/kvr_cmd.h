/*
 * kvr_cmd.h - subcommands of the `kvrail` command-line tool.  Each takes the
 * arguments after the subcommand name (argv[0] is the subcommand) and returns
 * the process exit status.
 */
#ifndef KVR_CMD_H
#define KVR_CMD_H

int kvr_cmd_run(int argc, char **argv);            /* run.c: single-process reference generation */
int kvr_cmd_generate(int argc, char **argv);       /* generate.c: stream from the router */
int kvr_cmd_status(int argc, char **argv);         /* status.c: cluster status */
int kvr_cmd_up(int argc, char **argv);             /* up.c: start this host's nodes */
int kvr_cmd_keygen(int argc, char **argv);         /* keygen.c: CURVE key pairs */
int kvr_cmd_cluster(int argc, char **argv);        /* cluster.c: `cluster render|nodes|wait` */
int kvr_cmd_cluster_render(int argc, char **argv); /* render.c */

#include <stddef.h>

/** Router client endpoint from --router, else --config / $KVRAIL_CONFIG,
 *  else the default tcp://127.0.0.1:7700 (generate.c; shared with status). */
const char *kvr_cmd_router_endpoint(const char *router, const char *config, char *buf, size_t cap);

#endif
