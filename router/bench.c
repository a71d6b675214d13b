/*
 * bench.c - kvrail-router-bench: the router's own cost per request, apart
 * from any model.
 *
 *   kvrail-router-bench --router PATH/kvrail-router [--requests N]
 *                       [--concurrency C] [--prompt-tokens T] [--max-tokens M]
 *                       [--decode D] [--prefill P] [--groups G] [--json]
 *
 * Starts a real kvrail-router on a generated cluster file, then plays P
 * prefill and D decode nodes itself (DEALER sockets speaking the node
 * protocol, answering at once: Reserved, PrefillDone, M tokens, BlockStored
 * events for the prompt's full blocks) and a client keeping C Generate
 * streams open.  Prompts of T tokens share a prefix with one of G groups, so
 * the block directory and the prefix credit are exercised.  Reports the
 * router's in-process per-request overhead (decode + validate + hash +
 * directory lookup + pick + frames, from `Status`), the per-token forwarding
 * cost, and the client-observed time to first token through the router and
 * the scripted nodes.
 *
 *   kvrail-router-bench --router PATH --idle SECONDS [--decode D] [--prefill P]
 *
 * measures an idle router instead: the scripted nodes only heartbeat (every
 * 200 ms, as the cluster file says) for SECONDS; reports the router's CPU
 * seconds per minute (/proc/PID/stat) and the wake-ups of its loop thread
 * (context switches, /proc/PID/task/PID/status), and those of all its
 * threads (ZeroMQ's I/O thread included).  D and P may be 0 (with D 0 the
 * cluster file still names a decode node, which never connects).
 */
#include <dirent.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_blockhash.h"
#include "kvr_client.h"
#include "kvr_clock.h"
#include "kvr_proto.h"

#define MAXN 16

struct fnode {
    char name[32];
    bool decode;
    void *s;
    uint64_t seq;
};

struct pend {
    uint64_t rid;
    int d; /* decode node index */
    uint32_t n_tokens, max_tokens;
    uint64_t hashes[256];
    size_t n_hashes;
    bool used;
};

static struct fnode nodes[MAXN];
static int n_nodes;
static struct pend pends[4096];

static void nsend(struct fnode *n, unsigned method, const ProtobufCMessage *m)
{
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, (uint16_t)method, 0};
    if (kvr_proto_send(n->s, NULL, 0, &h, m) != KVR_OK)
        fprintf(stderr, "bench: %s cannot send\n", n->name);
}

static void reg(struct fnode *n)
{
    Kvrail__RegisterRequest rq = KVRAIL__REGISTER_REQUEST__INIT;
    Kvrail__KvLayout lay = KVRAIL__KV_LAYOUT__INIT;
    lay.layers = 2;
    lay.kv_heads = 2;
    lay.head_dim = 16;
    lay.block_size = 16;
    lay.dtype = "f32";
    lay.max_context = 8192;
    lay.vocab_size = 32000;
    rq.node_name = n->name;
    rq.role = n->decode ? KVRAIL__ROLE__ROLE_DECODE : KVRAIL__ROLE__ROLE_PREFILL;
    rq.model_fingerprint = "bench";
    rq.layout = &lay;
    rq.transport = "loop";
    rq.total_blocks = n->decode ? 1000000 : 0;
    rq.protocol_version = KVR_PROTO_VERSION;
    rq.incarnation = 1;
    nsend(n, KVRAIL__METHOD__REGISTER, &rq.base);
}

static void heartbeat(struct fnode *n)
{
    Kvrail__Heartbeat hb = KVRAIL__HEARTBEAT__INIT;
    hb.node_name = n->name;
    hb.free_blocks = n->decode ? 1000000 : 0;
    hb.total_blocks = n->decode ? 1000000 : 0;
    hb.incarnation = 1;
    hb.block_event_seq = n->seq;
    nsend(n, KVRAIL__METHOD__HEARTBEAT, &hb.base);
}

static struct pend *pend_get(uint64_t rid, bool create)
{
    struct pend *p = &pends[rid % 4096];
    if (create) {
        memset(p, 0, sizeof(*p));
        p->rid = rid;
        p->used = true;
        return p;
    }
    return p->used && p->rid == rid ? p : NULL;
}

/* decode node streams the request's tokens and stores its blocks */
static void stream_tokens(struct pend *p, bool skip_first)
{
    struct fnode *d = &nodes[p->d];
    for (uint32_t i = skip_first ? 1 : 0; i < p->max_tokens; i++) {
        Kvrail__Token t = KVRAIL__TOKEN__INIT;
        t.request_id = p->rid;
        t.index = i;
        t.token_id = 1000 + i;
        t.logprob = -1.0f;
        t.finish = i + 1 == p->max_tokens ? KVRAIL__FINISH_REASON__FINISH_LENGTH
                                          : KVRAIL__FINISH_REASON__FINISH_NONE;
        nsend(d, KVRAIL__METHOD__TOKEN, &t.base);
    }
    Kvrail__BlockEvent ev = KVRAIL__BLOCK_EVENT__INIT;
    Kvrail__BlockEvent *evp[1] = {&ev};
    Kvrail__BlockEvents be = KVRAIL__BLOCK_EVENTS__INIT;
    be.node_name = d->name;
    be.events = evp;
    be.n_events = 1;
    ev.seq = ++d->seq;
    ev.kind = KVRAIL__BLOCK_EVENT__KIND__STORED;
    ev.block_hashes = p->hashes;
    ev.n_block_hashes = p->n_hashes;
    nsend(d, KVRAIL__METHOD__BLOCK_EVENTS, &be.base);
    p->used = false;
}

static void node_msg(int idx, kvr_proto_frame_t *f)
{
    struct fnode *n = &nodes[idx];
    ProtobufCMessage *m = NULL;
    if (f->hdr.flags & KVR_PROTO_F_ERROR) {
        if (kvr_proto_decode(f, NULL, &m, NULL, 0) == KVR_OK) {
            fprintf(stderr, "bench: %s got error: %s\n", n->name, ((Kvrail__Status *)m)->message);
            protobuf_c_message_free_unpacked(m, NULL);
        }
        return;
    }
    unsigned method = f->hdr.method;
    const ProtobufCMessageDescriptor *desc =
        method == KVRAIL__METHOD__REGISTER    ? &kvrail__register_reply__descriptor
        : method == KVRAIL__METHOD__HEARTBEAT ? &kvrail__heartbeat_reply__descriptor
                                              : NULL;
    if (kvr_proto_decode(f, desc, &m, NULL, 0) != KVR_OK)
        return;
    if (method == KVRAIL__METHOD__RESERVE) {
        Kvrail__Reserve *r = (Kvrail__Reserve *)m;
        struct pend *p = pend_get(r->request_id, true);
        p->d = idx;
        p->n_tokens = (uint32_t)r->n_token_ids;
        p->max_tokens = r->max_tokens;
        /* a node hashes its own prompt blocks (Reserve carries none) */
        size_t nh = 0;
        if (kvr_blockhash_seq(r->token_ids, r->n_token_ids, 16, p->hashes, 256, &nh) != KVR_OK)
            nh = 0;
        p->n_hashes = nh;
        uint32_t blocks[512];
        uint32_t nb = (p->n_tokens + 15) / 16;
        for (uint32_t i = 0; i < nb && i < 512; i++)
            blocks[i] = i;
        Kvrail__Reserved rd = KVRAIL__RESERVED__INIT;
        rd.request_id = r->request_id;
        rd.block_ids = blocks;
        rd.n_block_ids = nb < 512 ? nb : 512;
        rd.node_name = n->name;
        nsend(n, KVRAIL__METHOD__RESERVED, &rd.base);
        if (r->local_prefill)
            stream_tokens(p, false);
    } else if (method == KVRAIL__METHOD__PREFILL_TARGET) {
        Kvrail__PrefillTarget *t = (Kvrail__PrefillTarget *)m;
        Kvrail__PrefillDone pd = KVRAIL__PREFILL_DONE__INIT;
        pd.request_id = t->request_id;
        pd.bytes_moved = 4096;
        pd.node_name = n->name;
        nsend(n, KVRAIL__METHOD__PREFILL_DONE, &pd.base);
        struct pend *p = pend_get(t->request_id, false);
        if (p)
            stream_tokens(p, false);
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

static void drain_nodes(void)
{
    for (int i = 0; i < n_nodes; i++)
        for (;;) {
            kvr_proto_frame_t f;
            if (kvr_proto_recv(nodes[i].s, false, &f, NULL, 0) != KVR_OK)
                break;
            node_msg(i, &f);
            kvr_proto_frame_clear(&f);
        }
}

/* CPU seconds of process pid, and context switches of its thread tid (or of
 * all its threads when tid is 0). */
static bool proc_sample(pid_t pid, pid_t tid, double *cpu_p, uint64_t *switches_p)
{
    char path[160], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *e = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!e || sscanf(e + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return false;
    *cpu_p = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    uint64_t sw = 0;
    char tasks[64];
    snprintf(tasks, sizeof(tasks), "/proc/%d/task", (int)pid);
    DIR *d = opendir(tasks);
    if (!d)
        return false;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.' || (tid && atoi(de->d_name) != (int)tid))
            continue;
        snprintf(path, sizeof(path), "%s/%.32s/status", tasks, de->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        char line[256];
        unsigned long v;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "voluntary_ctxt_switches: %lu", &v) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %lu", &v) == 1)
                sw += v;
        fclose(f);
    }
    closedir(d);
    *switches_p = sw;
    return true;
}

/* The scripted nodes heartbeat every 200 ms for secs; the router's CPU and
 * wake-ups over that window. */
static int idle_run(pid_t router, int secs, int np, int nd)
{
    double c0, c1, a0, a1;
    uint64_t w0, w1, s0, s1;
    if (!proc_sample(router, router, &c0, &w0) || !proc_sample(router, 0, &a0, &s0))
        return 1;
    uint64_t t0 = kvr_now_ns(), end = t0 + (uint64_t)secs * 1000000000ull, next_hb = t0;
    for (uint64_t now = t0; now < end; now = kvr_now_ns()) {
        if (now >= next_hb) {
            for (int i = 0; i < n_nodes; i++)
                heartbeat(&nodes[i]);
            next_hb += 200000000ull;
        }
        drain_nodes();
        uint64_t until = next_hb < end ? next_hb : end;
        if (until > now) {
            struct timespec ts = {0, (long)(until - now)};
            nanosleep(&ts, NULL);
        }
    }
    double secs_d = (double)(kvr_now_ns() - t0) / 1e9;
    if (!proc_sample(router, router, &c1, &w1) || !proc_sample(router, 0, &a1, &s1))
        return 1;
    (void)a0;
    (void)a1;
    printf("kvrail-router-bench: idle router, %dP+%dD scripted nodes heartbeating every 200 ms, "
           "%.0f s\n",
           np, nd, secs_d);
    printf("| router CPU s / min | loop-thread wake-ups / s | context switches / s, all threads |\n"
           "|---:|---:|---:|\n");
    printf("| %.3f | %.1f | %.1f |\n", (c1 - c0) * 60.0 / secs_d, (double)(w1 - w0) / secs_d,
           (double)(s1 - s0) / secs_d);
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"router", required_argument, NULL, 'r'},
        {"requests", required_argument, NULL, 'n'},
        {"concurrency", required_argument, NULL, 'c'},
        {"prompt-tokens", required_argument, NULL, 't'},
        {"max-tokens", required_argument, NULL, 'm'},
        {"decode", required_argument, NULL, 'd'},
        {"prefill", required_argument, NULL, 'p'},
        {"groups", required_argument, NULL, 'g'},
        {"json", no_argument, NULL, 'j'},
        {"idle", required_argument, NULL, 'i'},
        {NULL, 0, NULL, 0},
    };
    const char *router = NULL;
    int requests = 2000, conc = 8, ptok = 512, maxtok = 8, nd = 2, np = 2, groups = 8, idle = 0;
    bool json = false;
    int c;
    while ((c = getopt_long(argc, argv, "r:n:c:t:m:d:p:g:ji:", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            router = optarg;
            break;
        case 'n':
            requests = atoi(optarg);
            break;
        case 'c':
            conc = atoi(optarg);
            break;
        case 't':
            ptok = atoi(optarg);
            break;
        case 'm':
            maxtok = atoi(optarg);
            break;
        case 'd':
            nd = atoi(optarg);
            break;
        case 'p':
            np = atoi(optarg);
            break;
        case 'g':
            groups = atoi(optarg);
            break;
        case 'j':
            json = true;
            break;
        case 'i':
            idle = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: kvrail-router-bench --router PATH [--requests N] "
                            "[--concurrency C] [--prompt-tokens T] [--max-tokens M] [--decode D] "
                            "[--prefill P] [--groups G] [--json] [--idle SECONDS]\n");
            return 2;
        }
    }
    if (!router || requests < 1 || conc < 1 || conc > 256 || ptok < 1 || ptok > 4000 ||
        maxtok < 1 || nd < (idle ? 0 : 1) || np < 0 || nd + np > MAXN || groups < 1 || idle < 0 ||
        idle > 3600) {
        fprintf(stderr, "kvrail-router-bench: --router is required; values out of range\n");
        return 2;
    }
    char dir[] = "/tmp/kvr-rbench-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cfg[128], ep_c[64], ep_n[64];
    int port = 30000 + (int)(getpid() % 20000);
    snprintf(ep_c, sizeof(ep_c), "tcp://127.0.0.1:%d", port);
    snprintf(ep_n, sizeof(ep_n), "tcp://127.0.0.1:%d", port + 1);
    snprintf(cfg, sizeof(cfg), "%s/cluster.yaml", dir);
    FILE *f = fopen(cfg, "w");
    if (!f)
        return 1;
    fprintf(f,
            "model: none\nrouter: {client: '%s', node: '%s'}\n"
            "timeouts: {heartbeat_ms: 200, heartbeat_timeout_ms: 5000}\n"
            "thresholds: {local_prefill_tokens: 16}\nnodes:\n  - {name: router, role: router}\n",
            ep_c, ep_n);
    for (int i = 0; i < np; i++)
        fprintf(f, "  - {name: p%d, role: prefill}\n", i);
    /* a cluster has a decode node: with --decode 0 (idle) it never connects */
    for (int i = 0; i < (nd ? nd : 1); i++)
        fprintf(f, "  - {name: d%d, role: decode}\n", i);
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("KVR_LOG_LEVEL", "warn", 1);
        execl(router, router, "--config", cfg, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    void *zctx = zmq_ctx_new();
    for (int i = 0; i < np + nd; i++) {
        struct fnode *n = &nodes[n_nodes++];
        n->decode = i >= np;
        snprintf(n->name, sizeof(n->name), n->decode ? "d%d" : "p%d", n->decode ? i - np : i);
        n->s = zmq_socket(zctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(n->s, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(n->s, ZMQ_ROUTING_ID, n->name, strlen(n->name));
        zmq_connect(n->s, ep_n);
    }
    kvr_client_t *cl = NULL;
    kvr_client_connect(ep_c, &cl);
    uint64_t dl = kvr_deadline_ns(10000);
    while (kvr_client_ping(cl, 200) != KVR_OK)
        if (kvr_now_ns() > dl) {
            fprintf(stderr, "kvrail-router-bench: router does not answer\n");
            return 1;
        }
    for (int i = 0; i < n_nodes; i++)
        reg(&nodes[i]);
    static struct kvr_cluster_status st;
    dl = kvr_deadline_ns(5000);
    for (;;) {
        drain_nodes();
        int alive = 0;
        if (kvr_client_status(cl, 1000, &st) == KVR_OK)
            for (size_t i = 0; i < st.n_nodes; i++)
                alive += st.nodes[i].alive;
        if (alive == n_nodes)
            break;
        if (kvr_now_ns() > dl) {
            fprintf(stderr, "kvrail-router-bench: nodes did not register\n");
            return 1;
        }
    }
    if (idle) {
        int rc = idle_run(pid, idle, np, nd);
        kvr_client_close(cl);
        for (int i = 0; i < n_nodes; i++)
            zmq_close(nodes[i].s);
        zmq_ctx_term(zctx);
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        char rm[128];
        snprintf(rm, sizeof(rm), "rm -rf %s", dir);
        return system(rm) != 0 ? 1 : rc;
    }

    uint32_t *prompts = malloc((size_t)conc * (size_t)ptok * sizeof(uint32_t));
    uint64_t *ttft = calloc((size_t)requests, sizeof(uint64_t));
    kvr_gen_stream_t **streams = calloc((size_t)conc, sizeof(*streams));
    uint64_t *t_start = calloc((size_t)conc, sizeof(uint64_t));
    bool *got_first = calloc((size_t)conc, sizeof(bool));
    if (!prompts || !ttft || !streams || !t_start || !got_first)
        return 1;
    int started = 0, done = 0, failed = 0, n_ttft = 0;
    uint64_t rng = 12345, t_begin = kvr_now_ns(), last_hb = 0;
    while (done < requests) {
        for (int s = 0; s < conc && started < requests; s++) {
            if (streams[s])
                continue;
            uint32_t *pr = prompts + (size_t)s * (size_t)ptok;
            int g = started % groups;
            int shared = ptok * 3 / 4; /* 3/4 of the prompt is the group's prefix */
            for (int i = 0; i < ptok; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                pr[i] = i < shared ? (uint32_t)(g * 7919 + i) % 30000 + 1
                                   : (uint32_t)(rng >> 40) % 30000 + 1;
            }
            struct kvr_gen_params p;
            kvr_gen_params_default(&p);
            p.token_ids = pr;
            p.n_token_ids = (size_t)ptok;
            p.max_tokens = (uint32_t)maxtok;
            p.no_text = true;
            if (kvr_client_generate_start(cl, &p, &streams[s]) != KVR_OK) {
                fprintf(stderr, "kvrail-router-bench: send failed\n");
                return 1;
            }
            t_start[s] = kvr_now_ns();
            got_first[s] = false;
            started++;
        }
        drain_nodes();
        uint64_t now = kvr_now_ns();
        if (now - last_hb > 100000000ull) {
            for (int i = 0; i < n_nodes; i++)
                heartbeat(&nodes[i]);
            last_hb = now;
        }
        for (int s = 0; s < conc; s++) {
            if (!streams[s])
                continue;
            struct kvr_gen_token t;
            kvr_status_t rs;
            while ((rs = kvr_gen_stream_next(streams[s], 0, &t)) == KVR_OK)
                if (!got_first[s]) {
                    got_first[s] = true;
                    ttft[n_ttft++] = kvr_now_ns() - t_start[s];
                }
            if (rs == KVR_ERR_CLOSED) {
                if (kvr_gen_stream_result(streams[s])->status != KVR_OK) {
                    if (failed < 5)
                        fprintf(stderr, "request failed: %s\n",
                                kvr_gen_stream_result(streams[s])->message);
                    failed++;
                }
                kvr_gen_stream_destroy(streams[s]);
                streams[s] = NULL;
                done++;
            }
        }
        if (kvr_now_ns() - t_begin > 120000000000ull) {
            fprintf(stderr, "kvrail-router-bench: not done after 120 s (%d of %d)\n", done,
                    requests);
            return 1;
        }
    }
    double secs = (double)(kvr_now_ns() - t_begin) / 1e9;
    drain_nodes();
    if (kvr_client_status(cl, 3000, &st) != KVR_OK)
        return 1;
    qsort(ttft, (size_t)n_ttft, sizeof(uint64_t), cmp_u64);
    uint64_t t50 = n_ttft ? ttft[n_ttft / 2] : 0,
             t99 = n_ttft ? ttft[(size_t)(n_ttft * 99 / 100)] : 0;
    if (json) {
        printf("{\"requests\": %d, \"failed\": %d, \"concurrency\": %d, \"prompt_tokens\": %d, "
               "\"max_tokens\": %d, \"decode\": %d, \"prefill\": %d, \"seconds\": %.3f, "
               "\"overhead_p50_ns\": %" PRIu64 ", \"overhead_p99_ns\": %" PRIu64
               ", \"overhead_max_ns\": %" PRIu64 ", \"overhead_cpu_p50_ns\": %" PRIu64
               ", \"overhead_cpu_p99_ns\": %" PRIu64 ", \"token_p50_ns\": %" PRIu64
               ", \"token_p99_ns\": %" PRIu64 ", \"ttft_p50_ns\": %" PRIu64
               ", \"ttft_p99_ns\": %" PRIu64 ", \"local_prefills\": %" PRIu64
               ", \"disagg_prefills\": %" PRIu64 ", \"directory_blocks\": %" PRIu64 "}\n",
               requests, failed, conc, ptok, maxtok, nd, np, secs, st.overhead_p50_ns,
               st.overhead_p99_ns, st.overhead_max_ns, st.overhead_cpu_p50_ns,
               st.overhead_cpu_p99_ns, st.token_overhead_p50_ns, st.token_overhead_p99_ns, t50, t99,
               st.local_prefills, st.disagg_prefills, st.directory_blocks);
    } else {
        printf("kvrail-router-bench: %d requests (%d failed) of %d prompt tokens, %d output "
               "tokens, %d in flight, %dP+%dD scripted nodes, %.2f s (%.0f req/s)\n",
               requests, failed, ptok, maxtok, conc, np, nd, secs, requests / secs);
        printf("| metric | p50 | p99 | max |\n|---|---:|---:|---:|\n");
        printf("| router overhead per request (in-process) | %.1f us | %.1f us | %.1f us |\n",
               st.overhead_p50_ns / 1e3, st.overhead_p99_ns / 1e3, st.overhead_max_ns / 1e3);
        printf("| same, router thread CPU time | %.1f us | %.1f us | |\n",
               st.overhead_cpu_p50_ns / 1e3, st.overhead_cpu_p99_ns / 1e3);
        printf("| router per streamed token (in-process) | %.1f us | %.1f us | |\n",
               st.token_overhead_p50_ns / 1e3, st.token_overhead_p99_ns / 1e3);
        printf("| client TTFT via router + scripted nodes | %.1f us | %.1f us | |\n", t50 / 1e3,
               t99 / 1e3);
        printf("prefills: %" PRIu64 " disaggregated, %" PRIu64 " local; directory %" PRIu64
               " blocks\n",
               st.disagg_prefills, st.local_prefills, st.directory_blocks);
    }
    kvr_client_close(cl);
    for (int i = 0; i < n_nodes; i++)
        zmq_close(nodes[i].s);
    zmq_ctx_term(zctx);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return failed ? 1 : 0;
}
