/*
 * up.c - `kvrail up FILE`: starts every node the cluster file places on this
 * host and supervises them.
 *
 *   kvrail up [--timeout MS] [--log-dir DIR] [--bin-dir DIR] FILE
 *
 * A node is on this host when its host is localhost, 127.0.0.1, ::1 or this
 * machine's hostname; for every node placed elsewhere `up` prints the command
 * to run on that host.  Each local node is exec'd as `kvrail-<role> --config
 * FILE --node NAME`, the binary looked up in --bin-dir, next to the kvrail
 * binary (also in the build tree's router/, prefill/, decode/ folders), or in
 * PATH.  The router starts first; `up` waits until it answers, then starts
 * the others and waits (router Status, up to --timeout ms, default
 * timeouts.connect_ms) until every one of them has registered; a node that
 * exits before then is a start-up failure (everything stops, exit 1).
 *
 * Then it supervises.  A node that exits is reported and handled by its
 * `restart` policy (nodes[].restart: on-failure (default), always, never):
 * restarted after a back-off of 0.5 s doubling to 30 s, at most restart_max
 * times in a row (a run of 60 s or more resets the count), else left down.
 * The other nodes keep running and serving; `up` exits 1 only when no node
 * is left running.  SIGINT/SIGTERM/SIGHUP stop every node (SIGTERM in reverse
 * start order, SIGKILL after 5 s) and `up` exits 0.
 *
 * Signals are handled synchronously: SIGCHLD, SIGINT, SIGTERM and SIGHUP are
 * blocked and collected with sigtimedwait() wherever `up` waits, so a node's
 * exit wakes the supervisor at once and nothing runs in a signal handler.
 * Each child sets PR_SET_PDEATHSIG (SIGKILL) between fork and exec and then
 * checks that its parent is still `up` (the parent may have died before the
 * prctl), so a SIGKILL of `up` takes its nodes, and the ports they hold, with
 * it.  SIGKILL rather than SIGTERM: nobody is left to escalate a node that
 * ignores SIGTERM.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvr_client.h"
#include "kvr_clock.h"
#include "kvr_cluster.h"
#include "kvr_cmd.h"

#define UP_BACKOFF_MS     500u   /* first restart delay; doubles per failure in a row */
#define UP_BACKOFF_MAX_MS 30000u /* ... up to this */
#define UP_STABLE_MS      60000u /* a run this long resets the failure count */
#define UP_STOP_MS        5000   /* SIGTERM -> SIGKILL */

struct child {
    const kvr_cluster_node_t *node;
    const char *bin;
    pid_t pid;   /* > 0 while running */
    bool exited; /* reaped; wstatus is valid */
    bool down;   /* left down by its policy */
    int wstatus;
    int failures;        /* restarts in a row */
    uint64_t started_ns; /* last start */
    uint64_t restart_ns; /* when to restart it, 0 = not scheduled */
};

static bool up_stop;
static sigset_t up_sigs; /* blocked for the whole of `up` */

/* Waits up to timeout_ms for SIGCHLD (returns true) or a stop signal (sets
 * up_stop).  timeout_ms 0 only collects what is pending. */
static bool up_wait_signal(int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    bool child = false;
    for (;;) {
        int sig = sigtimedwait(&up_sigs, NULL, &ts);
        if (sig == SIGCHLD)
            child = true;
        else if (sig > 0)
            up_stop = true;
        else if (errno != EINTR)
            return child; /* EAGAIN: timed out */
        if (sig > 0) {    /* got one: collect whatever else is pending, then return */
            ts.tv_sec = 0;
            ts.tv_nsec = 0;
        }
    }
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

/* fork + exec of one node; the child dies with `up` (see the file comment). */
static pid_t spawn(struct child *c, const char *config, const char *log_dir)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* child: only async-signal-safe calls until exec */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(127);
    if (log_dir) {
        char lp[PATH_MAX];
        int len = snprintf(lp, sizeof(lp), "%s/%s.log", log_dir, c->node->name);
        int fd = len < 0 || (size_t)len >= sizeof(lp)
                     ? -1
                     : open(lp, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the mask survives exec */
    char *args[] = {(char *)c->bin,        "--config", (char *)config, "--node",
                    (char *)c->node->name, NULL};
    execv(c->bin, args);
    dprintf(2, "kvrail up: exec %s: %s\n", c->bin, strerror(errno));
    _exit(127);
}

static bool start(struct child *c, const char *config, const char *log_dir)
{
    c->pid = spawn(c, config, log_dir);
    if (c->pid < 0) {
        fprintf(stderr, "kvrail up: fork for %s: %s\n", c->node->name, strerror(errno));
        c->pid = 0;
        return false;
    }
    c->exited = false;
    c->started_ns = kvr_now_ns();
    c->restart_ns = 0;
    fprintf(stderr, "kvrail up: started %s (%s, pid %d)\n", c->node->name,
            kvr_node_role_name(c->node->role), (int)c->pid);
    return true;
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

/* Reaps exited children; returns the first one that exited, or NULL.  The
 * others stay marked exited for the next call to report. */
static struct child *reap(struct child *ch, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ch[i].pid <= 0 || ch[i].exited)
            continue;
        int ws;
        if (waitpid(ch[i].pid, &ws, WNOHANG) == ch[i].pid) {
            ch[i].exited = true;
            ch[i].wstatus = ws;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (ch[i].pid > 0 && ch[i].exited)
            return &ch[i];
    return NULL;
}

static bool running(const struct child *c)
{
    return c->pid > 0 && !c->exited;
}

static void stop_all(struct child *ch, size_t n)
{
    for (size_t i = n; i-- > 0;) /* reverse start order: router last */
        if (running(&ch[i]))
            kill(ch[i].pid, SIGTERM);
    uint64_t deadline = kvr_deadline_ns(UP_STOP_MS);
    for (;;) {
        reap(ch, n);
        bool left = false;
        for (size_t i = 0; i < n; i++)
            left |= running(&ch[i]);
        if (!left)
            return;
        if (kvr_now_ns() > deadline)
            break;
        up_wait_signal(50);
    }
    for (size_t i = 0; i < n; i++)
        if (running(&ch[i])) {
            fprintf(stderr, "kvrail up: node %s did not stop within %d ms: SIGKILL\n",
                    ch[i].node->name, UP_STOP_MS);
            kill(ch[i].pid, SIGKILL);
            waitpid(ch[i].pid, &ch[i].wstatus, 0);
            ch[i].exited = true;
        }
}

/* Waits until the router knows every started prefill/decode node as alive.
 * A node that exits meanwhile is a start-up failure. */
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
        up_wait_signal(100);
    }
    kvr_client_close(cl);
    return rc;
}

/* Waits until the router (ch[0]) answers a ping. */
static bool wait_router(const char *ep, struct child *ch, int timeout_ms)
{
    kvr_client_t *c0 = NULL;
    bool ok = false;
    if (kvr_client_connect(ep, &c0) == KVR_OK) {
        uint64_t dl = kvr_deadline_ns(timeout_ms);
        while (!up_stop && kvr_now_ns() < dl && !reap(ch, 1)) {
            if (kvr_client_ping(c0, 500) == KVR_OK) {
                ok = true;
                break;
            }
            up_wait_signal(0);
        }
        kvr_client_close(c0);
    }
    if (!ok) {
        if (ch[0].exited)
            describe_exit(&ch[0]);
        else if (!up_stop)
            fprintf(stderr, "kvrail up: the router does not answer on %s\n", ep);
    }
    return ok;
}

static uint32_t backoff_ms(int failures)
{
    uint32_t ms = UP_BACKOFF_MS;
    for (int i = 1; i < failures && ms < UP_BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < UP_BACKOFF_MAX_MS ? ms : UP_BACKOFF_MAX_MS;
}

/* A node exited after start-up: report it, then restart later or leave it
 * down, as its policy says. */
static void on_exit_after_ready(struct child *c)
{
    describe_exit(c);
    bool failed = !(WIFEXITED(c->wstatus) && WEXITSTATUS(c->wstatus) == 0);
    const kvr_cluster_node_t *nd = c->node;
    pid_t old = c->pid;
    c->pid = 0;
    if (kvr_now_ns() - c->started_ns >= (uint64_t)UP_STABLE_MS * 1000000u)
        c->failures = 0;
    const char *why = NULL;
    if (nd->restart == KVR_RESTART_NEVER)
        why = "its restart policy is never";
    else if (nd->restart == KVR_RESTART_ON_FAILURE && !failed)
        why = "it exited with status 0 and its restart policy is on-failure";
    else if (c->failures >= nd->restart_max)
        why = "it reached restart_max";
    if (why) {
        c->down = true;
        fprintf(stderr, "kvrail up: leaving %s down (%s; pid %d); the other nodes keep running\n",
                nd->name, why, (int)old);
        return;
    }
    c->failures++;
    uint32_t ms = backoff_ms(c->failures);
    c->restart_ns = kvr_deadline_ns(ms);
    fprintf(stderr, "kvrail up: restarting %s in %u ms (restart %d of at most %d in a row)\n",
            nd->name, ms, c->failures, nd->restart_max);
}

/* Runs until a stop signal or until no node is left; returns the exit status. */
static int supervise(struct child *ch, size_t n, const char *config, const char *log_dir)
{
    while (!up_stop) {
        struct child *dead;
        while ((dead = reap(ch, n)))
            on_exit_after_ready(dead);
        uint64_t now = kvr_now_ns(), next = 0;
        size_t alive = 0;
        for (size_t i = 0; i < n; i++) {
            struct child *c = &ch[i];
            if (c->restart_ns && c->restart_ns <= now && !start(c, config, log_dir)) {
                c->down = true;
                c->restart_ns = 0;
            }
            if (c->restart_ns && (!next || c->restart_ns < next))
                next = c->restart_ns;
            alive += running(c) || c->restart_ns;
        }
        if (!alive) {
            fprintf(stderr, "kvrail up: no node left running\n");
            return 1;
        }
        int wait_ms = 10000;
        if (next)
            wait_ms = (int)((next - now) / 1000000u) + 1;
        up_wait_signal(wait_ms);
    }
    size_t down = 0;
    for (size_t i = 0; i < n; i++)
        down += ch[i].down;
    fprintf(stderr, "kvrail up: stopping %zu node(s)%s\n", n - down,
            down ? " (others were left down)" : "");
    stop_all(ch, n);
    return 0;
}

/* For every node placed on another host: the command to run there. */
static void print_remote(const kvr_cluster_t *cl, const char *config)
{
    char abs[PATH_MAX];
    const char *path = realpath(config, abs) ? abs : config;
    for (size_t i = 0; i < cl->n_nodes; i++) {
        const kvr_cluster_node_t *nd = &cl->nodes[i];
        if (kvr_cluster_node_is_local(nd))
            continue;
        fprintf(stderr,
                "kvrail up: %s (%s) is placed on %s; run there: kvrail-%s --config %s --node %s\n",
                nd->name, kvr_node_role_name(nd->role), nd->host, kvr_node_role_name(nd->role),
                path, nd->name);
    }
}

static const char up_usage[] =
    "usage: kvrail up [--timeout MS] [--log-dir DIR] [--bin-dir DIR] FILE\n";

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
            fputs(up_usage, stdout);
            return 0;
        default:
            fputs(up_usage, stderr);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fputs(up_usage, stderr);
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
    if (log_dir && mkdir(log_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvrail up: --log-dir %s: %s\n", log_dir, strerror(errno));
        kvr_cluster_free(cl);
        return 1;
    }

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
    print_remote(cl, config);
    if (!n) {
        char host[256] = "?";
        gethostname(host, sizeof(host) - 1);
        fprintf(stderr, "kvrail up: %s places no node on this host (%s)\n", config, host);
        goto out;
    }
    static char bins[3][PATH_MAX];
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
    for (size_t i = 0; i < n; i++)
        ch[i].bin = bins[ch[i].node->role - 1];

    sigemptyset(&up_sigs);
    sigaddset(&up_sigs, SIGCHLD);
    sigaddset(&up_sigs, SIGINT);
    sigaddset(&up_sigs, SIGTERM);
    sigaddset(&up_sigs, SIGHUP);
    sigprocmask(SIG_BLOCK, &up_sigs, NULL);

    bool router_here = ch[0].node->role == KVR_NODE_ROLE_ROUTER;
    for (size_t i = 0; i < n && !up_stop; i++) {
        if (!start(&ch[i], config, log_dir))
            goto stop;
        if (i == 0 && router_here && !wait_router(cl->client_endpoint, ch, timeout_ms) && !up_stop)
            goto stop;
    }
    if (up_stop || wait_registered(cl->client_endpoint, ch, n, timeout_ms) != 0) {
        if (up_stop) {
            stop_all(ch, n);
            rc = 0;
            goto out;
        }
        goto stop;
    }
    fprintf(stderr, "kvrail up: %zu node(s) up; router at %s. Ctrl-C stops them.\n", n,
            cl->client_endpoint);
    printf("ready\n");
    fflush(stdout);
    rc = supervise(ch, n, config, log_dir);
    if (rc != 0)
        goto stop;
    goto out;
stop:
    stop_all(ch, n);
    rc = 1;
out:
    free(ch);
    kvr_cluster_free(cl);
    return rc;
}
