/*
 * up.c - `kvrail up FILE`: starts every node the cluster file places on this
 * host and keeps them running.
 *
 *   kvrail up [--timeout MS] [--log-dir DIR] [--bin-dir DIR] FILE
 *
 * A node is on this host when its host is localhost, 127.0.0.1, ::1 or this
 * machine's hostname.  Each is exec'd as `kvrail-<role> --config FILE --node
 * NAME`, the binary looked up next to the kvrail binary (also in the build
 * tree's router/, prefill/, decode/ folders), in --bin-dir, or in PATH.  The
 * router starts first; `up` waits until it answers, then starts the others
 * and waits (router Status, up to --timeout ms, default timeouts.connect_ms)
 * until every one of them has registered.  It then watches them: Ctrl-C or
 * SIGTERM stops them all (SIGTERM, then SIGKILL after 5 s); a node that dies
 * is reported and the rest are stopped.  Exit status 0 after a requested
 * stop, 1 when a node failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvr_client.h"
#include "kvr_clock.h"
#include "kvr_cluster.h"
#include "kvr_cmd.h"

struct child {
    const kvr_cluster_node_t *node;
    pid_t pid;
    bool exited;
    int wstatus;
};

static volatile sig_atomic_t up_stop;

static void up_on_signal(int sig)
{
    (void)sig;
    up_stop = 1;
}

static bool is_exec(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

/* Finds kvrail-<role>: --bin-dir, next to this binary, the build tree, PATH. */
static bool find_binary(const char *name, const char *bin_dir, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    const char *subdirs[] = {"",           "/../../router", "/../../prefill", "/../../decode",
                             "/../router", "/../prefill",   "/../decode"};
    if (bin_dir) {
        int len = snprintf(out, cap, "%s/%s", bin_dir, name);
        if (len > 0 && (size_t)len < cap && is_exec(out))
            return true;
    }
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = 0;
        for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
            int len = snprintf(out, cap, "%s%s/%s", self, subdirs[i], name);
            if (len > 0 && (size_t)len < cap && is_exec(out))
                return true;
        }
    }
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char *dup = strdup(path);
    if (!dup)
        return false;
    bool found = false;
    for (char *save = NULL, *d = strtok_r(dup, ":", &save); d && !found;
         d = strtok_r(NULL, ":", &save)) {
        int len = snprintf(out, cap, "%s/%s", d, name);
        found = len > 0 && (size_t)len < cap && is_exec(out);
    }
    free(dup);
    return found;
}

static pid_t spawn(const char *bin, const char *config, const kvr_cluster_node_t *n,
                   const char *log_dir)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* child */
    if (log_dir) {
        char lp[PATH_MAX];
        int len = snprintf(lp, sizeof(lp), "%s/%s.log", log_dir, n->name);
        int fd = len < 0 || (size_t)len >= sizeof(lp)
                     ? -1
                     : open(lp, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    char *args[] = {(char *)bin, "--config", (char *)config, "--node", (char *)n->name, NULL};
    execv(bin, args);
    fprintf(stderr, "kvrail up: exec %s: %s\n", bin, strerror(errno));
    _exit(127);
}

static void describe_exit(const struct child *c)
{
    if (WIFEXITED(c->wstatus))
        fprintf(stderr, "kvrail up: node %s (%s, pid %d) exited with status %d\n", c->node->name,
                kvr_node_role_name(c->node->role), (int)c->pid, WEXITSTATUS(c->wstatus));
    else if (WIFSIGNALED(c->wstatus))
        fprintf(stderr, "kvrail up: node %s (%s, pid %d) was killed by signal %d\n", c->node->name,
                kvr_node_role_name(c->node->role), (int)c->pid, WTERMSIG(c->wstatus));
}

/* Reaps exited children; returns the first one that exited, or NULL. */
static struct child *reap(struct child *ch, size_t n)
{
    struct child *first = NULL;
    for (size_t i = 0; i < n; i++) {
        if (ch[i].pid <= 0 || ch[i].exited)
            continue;
        int ws;
        pid_t r = waitpid(ch[i].pid, &ws, WNOHANG);
        if (r == ch[i].pid) {
            ch[i].exited = true;
            ch[i].wstatus = ws;
            if (!first)
                first = &ch[i];
        }
    }
    return first;
}

static void stop_all(struct child *ch, size_t n)
{
    for (size_t i = n; i-- > 0;) /* reverse start order: router last */
        if (ch[i].pid > 0 && !ch[i].exited)
            kill(ch[i].pid, SIGTERM);
    uint64_t deadline = kvr_deadline_ns(5000);
    for (;;) {
        reap(ch, n);
        bool left = false;
        for (size_t i = 0; i < n; i++)
            left |= ch[i].pid > 0 && !ch[i].exited;
        if (!left)
            return;
        if (kvr_now_ns() > deadline)
            break;
        usleep(20000);
    }
    for (size_t i = 0; i < n; i++)
        if (ch[i].pid > 0 && !ch[i].exited) {
            fprintf(stderr, "kvrail up: node %s did not stop within 5 s: SIGKILL\n",
                    ch[i].node->name);
            kill(ch[i].pid, SIGKILL);
            waitpid(ch[i].pid, &ch[i].wstatus, 0);
            ch[i].exited = true;
        }
}

/* Waits until the router knows every started prefill/decode node as alive. */
static int wait_registered(const char *ep, struct child *ch, size_t n, int timeout_ms)
{
    kvr_client_t *cl = NULL;
    if (kvr_client_connect(ep, &cl) != KVR_OK) {
        fprintf(stderr, "kvrail up: cannot connect to the router at %s\n", ep);
        return -1;
    }
    static struct kvr_cluster_status s;
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    int rc = -1;
    char missing[1024] = "";
    while (!up_stop) {
        struct child *dead = reap(ch, n);
        if (dead) {
            describe_exit(dead);
            break;
        }
        if (kvr_client_status(cl, 1000, &s) == KVR_OK) {
            missing[0] = 0;
            for (size_t i = 0; i < n; i++) {
                if (ch[i].node->role == KVR_NODE_ROLE_ROUTER)
                    continue;
                bool alive = false;
                for (size_t j = 0; j < s.n_nodes; j++)
                    if (!strcmp(s.nodes[j].name, ch[i].node->name))
                        alive = s.nodes[j].alive;
                if (!alive && strlen(missing) + strlen(ch[i].node->name) + 2 < sizeof(missing)) {
                    strcat(missing, " ");
                    strcat(missing, ch[i].node->name);
                }
            }
            if (!missing[0]) {
                rc = 0;
                break;
            }
        } else {
            snprintf(missing, sizeof(missing), " (router not answering: %s)", kvr_client_error(cl));
        }
        if (kvr_now_ns() > deadline) {
            fprintf(stderr, "kvrail up: not registered after %d ms:%s\n", timeout_ms, missing);
            break;
        }
        usleep(100000);
    }
    kvr_client_close(cl);
    return rc;
}

int kvr_cmd_up(int argc, char **argv)
{
    static const struct option opts[] = {
        {"timeout", required_argument, NULL, 'T'},
        {"log-dir", required_argument, NULL, 'l'},
        {"bin-dir", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int timeout_ms = -1;
    const char *log_dir = NULL, *bin_dir = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "T:l:b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'T':
            timeout_ms = atoi(optarg);
            break;
        case 'l':
            log_dir = optarg;
            break;
        case 'b':
            bin_dir = optarg;
            break;
        case 'h':
            printf("usage: kvrail up [--timeout MS] [--log-dir DIR] [--bin-dir DIR] FILE\n");
            return 0;
        default:
            fprintf(stderr,
                    "usage: kvrail up [--timeout MS] [--log-dir DIR] [--bin-dir DIR] FILE\n");
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "usage: kvrail up [--timeout MS] [--log-dir DIR] [--bin-dir DIR] FILE\n");
        return 2;
    }
    const char *config = argv[optind];
    kvr_cluster_t *cl = NULL;
    char err[1024];
    if (kvr_cluster_load(config, &cl, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail up: %s\n", err);
        return 1;
    }
    if (timeout_ms <= 0)
        timeout_ms = (int)cl->timeouts.connect_ms;
    if (log_dir)
        mkdir(log_dir, 0755);

    /* the router first, then the others in file order */
    struct child *ch = calloc(cl->n_nodes, sizeof(*ch));
    size_t n = 0;
    int rc = 1;
    if (!ch)
        goto out;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < cl->n_nodes; i++) {
            const kvr_cluster_node_t *nd = &cl->nodes[i];
            if ((nd->role == KVR_NODE_ROLE_ROUTER) != (pass == 0) || !kvr_cluster_node_is_local(nd))
                continue;
            ch[n++].node = nd;
        }
    if (!n) {
        char host[256] = "?";
        gethostname(host, sizeof(host) - 1);
        fprintf(stderr, "kvrail up: %s places no node on this host (%s)\n", config, host);
        goto out;
    }
    char bins[3][PATH_MAX];
    const char *names[3] = {"kvrail-prefill", "kvrail-decode", "kvrail-router"};
    for (size_t k = 0; k < 3; k++) {
        enum kvr_node_role role = (enum kvr_node_role)(k + 1);
        bool needed = false;
        for (size_t i = 0; i < n; i++)
            needed |= ch[i].node->role == role;
        if (needed && !find_binary(names[k], bin_dir, bins[k], sizeof(bins[k]))) {
            fprintf(stderr, "kvrail up: %s not found (next to kvrail, in --bin-dir or in PATH)\n",
                    names[k]);
            goto out;
        }
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = up_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    bool router_here = ch[0].node->role == KVR_NODE_ROLE_ROUTER;
    for (size_t i = 0; i < n; i++) {
        const char *bin = bins[ch[i].node->role - 1];
        ch[i].pid = spawn(bin, config, ch[i].node, log_dir);
        if (ch[i].pid < 0) {
            fprintf(stderr, "kvrail up: fork: %s\n", strerror(errno));
            goto stop;
        }
        fprintf(stderr, "kvrail up: started %s (%s, pid %d)\n", ch[i].node->name,
                kvr_node_role_name(ch[i].node->role), (int)ch[i].pid);
        if (i == 0 && router_here) {
            kvr_client_t *c0 = NULL;
            bool ok = false;
            if (kvr_client_connect(cl->client_endpoint, &c0) == KVR_OK) {
                uint64_t dl = kvr_deadline_ns(timeout_ms);
                while (!up_stop && kvr_now_ns() < dl && !reap(ch, 1))
                    if (kvr_client_ping(c0, 500) == KVR_OK) {
                        ok = true;
                        break;
                    }
                kvr_client_close(c0);
            }
            if (!ok) {
                if (ch[0].exited)
                    describe_exit(&ch[0]);
                else
                    fprintf(stderr, "kvrail up: the router does not answer on %s\n",
                            cl->client_endpoint);
                goto stop;
            }
        }
    }
    if (wait_registered(cl->client_endpoint, ch, n, timeout_ms) != 0)
        goto stop;
    fprintf(stderr, "kvrail up: %zu node(s) up; router at %s. Ctrl-C stops them.\n", n,
            cl->client_endpoint);
    printf("ready\n");
    fflush(stdout);
    while (!up_stop) {
        struct child *dead = reap(ch, n);
        if (dead) {
            describe_exit(dead);
            fprintf(stderr, "kvrail up: stopping the other nodes\n");
            goto stop;
        }
        usleep(100000);
    }
    fprintf(stderr, "kvrail up: stopping %zu node(s)\n", n);
    stop_all(ch, n);
    rc = 0;
    goto out;
stop:
    stop_all(ch, n);
    rc = 1;
out:
    free(ch);
    kvr_cluster_free(cl);
    return rc;
}
