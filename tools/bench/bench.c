/*
 * bench.c - kvrail-bench: bandwidth and latency of the kvrail transfer
 * engine, like ucx_perftest / ib_write_bw / nixlbench.
 *
 *   kvrail-bench [--backend ucx] [--op write] [--sizes 4K,1M] [--batch 1,256]
 *   kvrail-bench --role target --listen 18515 &
 *   kvrail-bench --role initiator --peer 127.0.0.1:18515
 *
 * Default role "local" runs the target and the initiator as two engines in
 * one process (one thread, both progressed).  In two processes the target
 * registers its pool and sends its address and rkey blobs over a TCP side
 * channel (chan.c); it then only progresses its engine and, with --check,
 * verifies the posts it is notified about.  The initiator sweeps every
 * (block size, batch) pair that fits the pool (run.c) and prints one row
 * each: a table on stdout, or a JSON document with --json.  Registration of
 * the pool is timed once at start-up, never on the data path.
 */
#include "bench.h"

#include "kvr_clock.h"
#include "kvr_log.h"
#include "kvr_version.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <sched.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_LIST 64

enum role { ROLE_LOCAL, ROLE_TARGET, ROLE_INITIATOR };

struct opts {
    enum role role;
    const char *peer;
    const char *listen;
    const char *backend;
    const char *tls;
    const char *devices;
    bool require_rdma;
    enum kvr_xfer_op op;
    uint64_t sizes[MAX_LIST];
    size_t nsizes;
    uint64_t batches[MAX_LIST];
    size_t nbatches;
    uint64_t pool;
    uint64_t footprint;
    uint64_t iters;
    double duration;
    int64_t warmup; /* -1: auto */
    uint32_t depth;
    bool coalesce;
    bool check;
    bool one_buffer;
    bool cpu_time;
    bool json;
    bool quiet;
    bool inject_corruption;
    bool target_event; /* target: sleep on the event fd when idle */
    bool mem_alloc;    /* pools from kvr_xfer_mem_alloc (default) or mmap + kvr_xfer_mem_reg */
    int timeout_ms;
    int wait_ms; /* target: waiting for the initiator; initiator: reaching the target */
};

/* ---- argument parsing ---- */

static void usage(FILE *f)
{
    const char *const *b = kvr_xfer_backends();
    fprintf(f, "usage: kvrail-bench [options]\n"
               "  --role local|target|initiator  both ends in one process (default), or one end\n"
               "  --listen [HOST:]PORT           target: side-channel address (default 18515)\n"
               "  --peer HOST:PORT               initiator: the target's side channel\n"
               "  --backend NAME                 transfer backend (built:");
    for (; b && *b; b++)
        fprintf(f, " %s", *b);
    fprintf(
        f,
        ")\n"
        "  --tls LIST                     UCX transports (UCX_TLS syntax)\n"
        "  --devices LIST                 NICs (UCX_NET_DEVICES syntax, or rxe0:1 for verbs)\n"
        "  --require-rdma                 refuse a TCP/shared-memory fall-back\n"
        "  --op write|read                one-sided WRITE (default) or READ\n"
        "  --sizes LIST                   block sizes (default 4K,16K,64K,256K,1M,4M,16M,64M)\n"
        "  --batch LIST                   descriptors per post (default 1,4,16,64,256,1024)\n"
        "  --pool-size SIZE               pool at each end (default 1G)\n"
        "  --mem alloc|reg                pools from kvr_xfer_mem_alloc (default: what the\n"
        "                                 backend reaches fastest) or mmap + kvr_xfer_mem_reg\n"
        "  --footprint SIZE               bytes the rotation touches (default: the pool;\n"
        "                                 small = hot caches, like ucx_perftest's one buffer)\n"
        "  --one-buffer                   every descriptor on the same block-sized buffer\n"
        "                                 (ucx_perftest's footprint; not with --check)\n"
        "  --cpu-time                     each post also timed in the thread's CPU time\n"
        "                                 (cpu_p50/cpu_p99: preemption excluded) and the\n"
        "                                 row's involuntary context switches (ivcsw) and\n"
        "                                 page faults (minflt); the memcpy column's copies\n"
        "                                 timed per post (mc_p50/mc_p99: the machine's tail)\n"
        "  --iters N                      posts per row (default: by --duration)\n"
        "  --duration SEC                 seconds per row (default 0.5)\n"
        "  --warmup N                     untimed posts before each row (default 2*depth)\n"
        "  --depth N                      posts in flight (default 4)\n"
        "  --coalesce                     lay descriptors out adjacent (the engine merges them)\n"
        "  --check                        verify every byte at the target\n"
        "  --json                         one JSON document on stdout instead of the table\n"
        "  --timeout MS                   bound on every wait (default 10000)\n"
        "  --wait MS                      target: wait for the initiator; initiator: for the\n"
        "                                 target to listen (default 60000 / 10000)\n"
        "  --target-wait spin|event       target, when idle: poll (default, like ucx_perftest)\n"
        "                                 or sleep on the engine's event fd (like ib_write_bw)\n"
        "  --quiet                        no progress line\n"
        "  --inject-corruption            target: damage one byte of the first checked post\n"
        "                                 (a self-test: --check must then fail)\n");
}

/* "256K", "1M", "1GiB", "4096" -> bytes (binary suffixes). */
static bool parse_size(const char *s, uint64_t *v_p)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return false;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    case 't':
    case 'T':
        shift = 40;
        end++;
        break;
    default:
        break;
    }
    if (shift && (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0))
        end += strlen(end);
    else if (!shift && strcasecmp(end, "B") == 0)
        end++;
    if (*end != '\0' || v == 0 || (shift && v > (UINT64_MAX >> shift)))
        return false;
    *v_p = (uint64_t)v << shift;
    return true;
}

static bool parse_list(const char *opt, const char *s, bool sizes, uint64_t *out, size_t *n_p)
{
    char buf[1024];
    size_t n = 0;
    if (strlen(s) >= sizeof(buf) || *s == '\0') {
        fprintf(stderr, "kvrail-bench: %s: empty or too long list\n", opt);
        return false;
    }
    strcpy(buf, s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        char *end;
        bool ok;
        if (sizes) {
            ok = parse_size(tok, &v);
        } else {
            errno = 0;
            v = strtoull(tok, &end, 10);
            ok = errno == 0 && *end == '\0' && *tok >= '0' && *tok <= '9' && v > 0 && v <= 1000000;
        }
        if (!ok) {
            fprintf(stderr, "kvrail-bench: %s: bad value '%s' (want %s)\n", opt, tok,
                    sizes ? "a size > 0 like 4096, 16K, 1M" : "a count 1..1000000");
            return false;
        }
        if (n == MAX_LIST) {
            fprintf(stderr, "kvrail-bench: %s: more than %d values\n", opt, MAX_LIST);
            return false;
        }
        out[n++] = v;
    }
    if (n == 0) {
        fprintf(stderr, "kvrail-bench: %s: no values\n", opt);
        return false;
    }
    *n_p = n;
    return true;
}

static bool parse_int(const char *opt, const char *s, long long lo, long long hi, long long *v_p)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "kvrail-bench: %s: bad value '%s' (want %lld..%lld)\n", opt, s, lo, hi);
        return false;
    }
    *v_p = v;
    return true;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lopts[] = {
        {"role", required_argument, NULL, 'r'},
        {"listen", required_argument, NULL, 'l'},
        {"peer", required_argument, NULL, 'p'},
        {"backend", required_argument, NULL, 'b'},
        {"tls", required_argument, NULL, 'T'},
        {"devices", required_argument, NULL, 'D'},
        {"require-rdma", no_argument, NULL, 'R'},
        {"op", required_argument, NULL, 'o'},
        {"sizes", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'B'},
        {"pool-size", required_argument, NULL, 'P'},
        {"iters", required_argument, NULL, 'n'},
        {"duration", required_argument, NULL, 'd'},
        {"warmup", required_argument, NULL, 'w'},
        {"depth", required_argument, NULL, 'q'},
        {"coalesce", no_argument, NULL, 'C'},
        {"check", no_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"timeout", required_argument, NULL, 't'},
        {"wait", required_argument, NULL, 'W'},
        {"quiet", no_argument, NULL, 'Q'},
        {"inject-corruption", no_argument, NULL, 'X'},
        {"footprint", required_argument, NULL, 'F'},
        {"one-buffer", no_argument, NULL, 'O'},
        {"cpu-time", no_argument, NULL, 'U'},
        {"mem", required_argument, NULL, 'M'},
        {"target-wait", required_argument, NULL, 'E'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    static const uint64_t def_sizes[] = {4u << 10, 16u << 10, 64u << 10, 256u << 10,
                                         1u << 20, 4u << 20,  16u << 20, 64u << 20};
    static const uint64_t def_batch[] = {1, 4, 16, 64, 256, 1024};
    long long v;
    int c;

    memset(o, 0, sizeof(*o));
    o->role = ROLE_LOCAL;
    o->listen = "18515";
    o->op = KVR_XFER_WRITE;
    memcpy(o->sizes, def_sizes, sizeof(def_sizes));
    o->nsizes = sizeof(def_sizes) / sizeof(def_sizes[0]);
    memcpy(o->batches, def_batch, sizeof(def_batch));
    o->nbatches = sizeof(def_batch) / sizeof(def_batch[0]);
    o->pool = 1ull << 30;
    o->duration = 0.5;
    o->warmup = -1;
    o->depth = 4;
    o->timeout_ms = 10000;
    o->wait_ms = -1;
    o->mem_alloc = true;

    while ((c = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (strcmp(optarg, "local") == 0)
                o->role = ROLE_LOCAL;
            else if (strcmp(optarg, "target") == 0)
                o->role = ROLE_TARGET;
            else if (strcmp(optarg, "initiator") == 0)
                o->role = ROLE_INITIATOR;
            else {
                fprintf(stderr, "kvrail-bench: --role: '%s' is not local, target or initiator\n",
                        optarg);
                return 2;
            }
            break;
        case 'l':
            o->listen = optarg;
            break;
        case 'p':
            o->peer = optarg;
            break;
        case 'b':
            o->backend = optarg;
            break;
        case 'T':
            o->tls = optarg;
            break;
        case 'D':
            o->devices = optarg;
            break;
        case 'R':
            o->require_rdma = true;
            break;
        case 'o':
            if (strcmp(optarg, "write") == 0)
                o->op = KVR_XFER_WRITE;
            else if (strcmp(optarg, "read") == 0)
                o->op = KVR_XFER_READ;
            else {
                fprintf(stderr, "kvrail-bench: --op: '%s' is not write or read\n", optarg);
                return 2;
            }
            break;
        case 's':
            if (!parse_list("--sizes", optarg, true, o->sizes, &o->nsizes))
                return 2;
            break;
        case 'B':
            if (!parse_list("--batch", optarg, false, o->batches, &o->nbatches))
                return 2;
            break;
        case 'P':
            if (!parse_size(optarg, &o->pool)) {
                fprintf(stderr, "kvrail-bench: --pool-size: bad size '%s'\n", optarg);
                return 2;
            }
            break;
        case 'n':
            if (!parse_int("--iters", optarg, 1, 1000000000, &v))
                return 2;
            o->iters = (uint64_t)v;
            break;
        case 'd': {
            char *end;
            o->duration = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(o->duration > 0 && o->duration <= 3600)) {
                fprintf(stderr, "kvrail-bench: --duration: bad value '%s' (want 0 < s <= 3600)\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'w':
            if (!parse_int("--warmup", optarg, 0, 1000000, &v))
                return 2;
            o->warmup = v;
            break;
        case 'q':
            if (!parse_int("--depth", optarg, 1, 4096, &v))
                return 2;
            o->depth = (uint32_t)v;
            break;
        case 'C':
            o->coalesce = true;
            break;
        case 'c':
            o->check = true;
            break;
        case 'j':
            o->json = true;
            break;
        case 't':
            if (!parse_int("--timeout", optarg, 1, 3600000, &v))
                return 2;
            o->timeout_ms = (int)v;
            break;
        case 'W':
            if (!parse_int("--wait", optarg, 1, 3600000, &v))
                return 2;
            o->wait_ms = (int)v;
            break;
        case 'E':
            if (strcmp(optarg, "spin") == 0)
                o->target_event = false;
            else if (strcmp(optarg, "event") == 0)
                o->target_event = true;
            else {
                fprintf(stderr, "kvrail-bench: --target-wait: '%s' is not spin or event\n", optarg);
                return 2;
            }
            break;
        case 'M':
            if (strcmp(optarg, "alloc") == 0)
                o->mem_alloc = true;
            else if (strcmp(optarg, "reg") == 0)
                o->mem_alloc = false;
            else {
                fprintf(stderr, "kvrail-bench: --mem: '%s' is not alloc or reg\n", optarg);
                return 2;
            }
            break;
        case 'F':
            if (!parse_size(optarg, &o->footprint)) {
                fprintf(stderr, "kvrail-bench: --footprint: bad size '%s'\n", optarg);
                return 2;
            }
            break;
        case 'O':
            o->one_buffer = true;
            break;
        case 'U':
            o->cpu_time = true;
            break;
        case 'X':
            o->inject_corruption = true;
            break;
        case 'Q':
            o->quiet = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case 'V':
            kvr_version_print("kvrail-bench");
            exit(0);
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvrail-bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->role == ROLE_INITIATOR && !o->peer) {
        fprintf(stderr, "kvrail-bench: --role initiator needs --peer HOST:PORT\n");
        return 2;
    }
    if (o->role != ROLE_INITIATOR && o->peer) {
        fprintf(stderr, "kvrail-bench: --peer is for --role initiator\n");
        return 2;
    }
    if (o->one_buffer && o->check) {
        fprintf(stderr, "kvrail-bench: --one-buffer cannot be combined with --check (every "
                        "post rewrites the same bytes)\n");
        return 2;
    }
    if (o->wait_ms < 0)
        o->wait_ms = o->role == ROLE_TARGET ? 60000 : 10000;
    return 0;
}

/* ---- helpers ---- */

static const char *fmt_size(uint64_t v, char *buf, size_t len)
{
    if (v >= (1ull << 30) && v % (1ull << 30) == 0)
        snprintf(buf, len, "%" PRIu64 "G", v >> 30);
    else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
        snprintf(buf, len, "%" PRIu64 "M", v >> 20);
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, len, "%" PRIu64 "K", v >> 10);
    else
        snprintf(buf, len, "%" PRIu64, v);
    return buf;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static kvr_status_t engine_make(const struct opts *o, const char *name, kvr_xfer_notif_cb_t cb,
                                void *arg, kvr_xfer_engine_t **eng_p)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = o->backend;
    cfg.name = name;
    cfg.require_rdma = o->require_rdma;
    cfg.devices = o->devices;
    cfg.tls = o->tls;
    cfg.notif_cb = cb;
    cfg.notif_arg = arg;
    kvr_status_t st = kvr_xfer_engine_create(&cfg, eng_p);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrail-bench: cannot create the %s engine (backend %s): %s\n", name,
                o->backend ? o->backend : "default", kvr_status_str(st));
        if (st == KVR_ERR_NOT_FOUND)
            usage(stderr);
    }
    return st;
}

/* Makes a pool.  --mem reg: mmap'd, pre-faulted, then registered
 * (*reg_ns_p: kvr_xfer_mem_reg alone).  --mem alloc: kvr_xfer_mem_alloc
 * (memory the backend reaches fastest, e.g. UCX shared memory on one host;
 * *reg_ns_p: the allocation + registration), then pre-faulted. */
static kvr_status_t pool_make(const struct opts *o, kvr_xfer_engine_t *eng, uint64_t len,
                              bool pattern, uint8_t **pool_p, kvr_xfer_mem_t **mem_p,
                              uint64_t *reg_ns_p)
{
    uint64_t t0 = 0, t1 = 0;
    kvr_status_t st;
    void *p;
    if (o->mem_alloc) {
        t0 = kvr_now_ns();
        st = kvr_xfer_mem_alloc(eng, len, KVR_MEM_HOST, 0, mem_p);
        t1 = kvr_now_ns();
        if (st != KVR_OK) {
            fprintf(stderr, "kvrail-bench: kvr_xfer_mem_alloc of %" PRIu64 " bytes failed: %s\n",
                    len, kvr_status_str(st));
            return st;
        }
        p = kvr_xfer_mem_addr(*mem_p);
    } else {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr, "kvrail-bench: cannot allocate a pool of %" PRIu64 " bytes: %s\n", len,
                    strerror(errno));
            return KVR_ERR_NO_MEMORY;
        }
    }
    if (pattern)
        bench_pattern_fill(p, 0, len, 0);
    else
        memset(p, 0, len);
    if (!o->mem_alloc) {
        t0 = kvr_now_ns();
        st = kvr_xfer_mem_reg(eng, p, len, KVR_MEM_HOST, 0, mem_p);
        t1 = kvr_now_ns();
        if (st != KVR_OK) {
            fprintf(stderr, "kvrail-bench: registering %" PRIu64 " bytes failed: %s\n", len,
                    kvr_status_str(st));
            munmap(p, len);
            return st;
        }
    }
    *pool_p = p;
    *reg_ns_p = t1 - t0;
    return KVR_OK;
}

static void pool_free(const struct opts *o, kvr_xfer_mem_t *mem, uint8_t *pool, uint64_t len)
{
    kvr_xfer_mem_dereg(mem); /* frees a kvr_xfer_mem_alloc region too */
    if (!o->mem_alloc)
        munmap(pool, len);
}

/* ---- output ---- */

struct report {
    const struct opts *o;
    const char *backend;
    const char *transports;
    uint64_t pool;
    uint64_t reg_ns, target_reg_ns;
    struct bench_row *rows;
    size_t nrows;
};

static void print_table_head(const struct report *r)
{
    char b1[32];
    printf("# kvrail-bench: backend %s, op %s, pool %s, depth %u, %s\n", r->backend,
           r->o->op == KVR_XFER_WRITE ? "write" : "read", fmt_size(r->pool, b1, sizeof(b1)),
           r->o->depth, r->o->role == ROLE_LOCAL ? "one process" : "two processes");
    printf("# transports: %s\n", r->transports);
    printf("# %s of the pool: initiator %.3f ms",
           r->o->mem_alloc ? "kvr_xfer_mem_alloc (allocation + registration)"
                           : "kvr_xfer_mem_reg (registration)",
           (double)r->reg_ns / 1e6);
    if (r->target_reg_ns)
        printf(", target %.3f ms", (double)r->target_reg_ns / 1e6);
    printf("\n");
    printf("%6s %5s %5s %8s %9s %9s %6s %10s %9s %9s %9s %9s %9s %-5s", "block", "batch", "segs",
           "posts", "GB/s", "memcpy", "ratio", "posts/s", "post_p50", "desc_p50", "post_p99",
           "lat_p50", "lat_p99", "check");
    if (r->o->cpu_time)
        printf(" %9s %9s %7s %7s %9s %9s", "cpu_p50", "cpu_p99", "ivcsw", "minflt", "mc_p50",
               "mc_p99");
    printf("\n%6s %5s %5s %8s %9s %9s %6s %10s %9s %9s %9s %9s %9s", "", "", "", "", "(1e9B/s)",
           "(1e9B/s)", "", "", "(us)", "(us)", "(us)", "(us)", "(us)");
    if (r->o->cpu_time)
        printf("       %9s %9s %7s %7s %9s %9s", "(us)", "(us)", "", "", "(us)", "(us)");
    printf("\n");
    fflush(stdout);
}

static void print_table_row(const struct bench_row *w)
{
    char b1[32];
    if (w->error[0]) {
        printf("%6s %5u  error: %s\n", fmt_size(w->cfg.bsize, b1, sizeof(b1)), w->cfg.batch,
               w->error);
    } else {
        printf("%6s %5u %5zu %8" PRIu64 " %9.3f %9.3f %6.2f %10.0f %9.3f %9.4f %9.3f %9.1f %9.1f "
               "%-5s",
               fmt_size(w->cfg.bsize, b1, sizeof(b1)), w->cfg.batch, w->nseg, w->posts, w->gbps,
               w->memcpy_gbps, w->memcpy_ratio, w->posts_per_s, w->post_ns_p50 / 1e3,
               w->post_ns_per_desc_p50 / 1e3, w->post_ns_p99 / 1e3, w->lat_us_p50, w->lat_us_p99,
               w->cfg.check ? (w->check_ok ? "ok" : "FAILED") : "-");
        if (w->cfg.cpu_time)
            printf(" %9.3f %9.3f %7" PRIu64 " %7" PRIu64 " %9.3f %9.3f", w->post_cpu_ns_p50 / 1e3,
                   w->post_cpu_ns_p99 / 1e3, w->nivcsw, w->nminflt, w->memcpy_post_ns_p50 / 1e3,
                   w->memcpy_post_ns_p99 / 1e3);
        printf("\n");
    }
    fflush(stdout);
}

static void print_json(const struct report *r, const struct bench_bye *bye)
{
    const struct opts *o = r->o;
    printf("{\"tool\":\"kvrail-bench\",\"version\":1,\"backend\":");
    json_str(stdout, r->backend);
    printf(",\"transports\":");
    json_str(stdout, r->transports);
    printf(",\"mem\":\"%s\",\"one_buffer\":%s,\"footprint_bytes\":%" PRIu64,
           o->mem_alloc ? "alloc" : "reg", o->one_buffer ? "true" : "false",
           o->footprint ? o->footprint : r->pool);
    printf(",\"role\":\"%s\",\"op\":\"%s\",\"pool_bytes\":%" PRIu64
           ",\"reg_ms\":%.4f,\"target_reg_ms\":%.4f,\"depth\":%u,\"check\":%s",
           o->role == ROLE_LOCAL ? "local" : "initiator",
           o->op == KVR_XFER_WRITE ? "write" : "read", r->pool, (double)r->reg_ns / 1e6,
           (double)r->target_reg_ns / 1e6, o->depth, o->check ? "true" : "false");
    if (bye)
        printf(",\"target\":{\"notifs\":%" PRIu64 ",\"verified_bytes\":%" PRIu64
               ",\"failures\":%" PRIu64 "}",
               bye->notifs, bye->verified_bytes, bye->failures);
    printf(",\"rows\":[");
    for (size_t i = 0; i < r->nrows; i++) {
        const struct bench_row *w = &r->rows[i];
        printf("%s\n{\"op\":\"%s\",\"block_size\":%" PRIu64 ",\"batch\":%u,", i ? "," : "",
               w->cfg.op == KVR_XFER_WRITE ? "write" : "read", w->cfg.bsize, w->cfg.batch);
        if (w->error[0]) {
            printf("\"error\":");
            json_str(stdout, w->error);
            printf("}");
            continue;
        }
        printf("\"ndesc\":%zu,\"ndesc_coalesced\":%zu,\"lists\":%u,\"depth\":%u,\"posts\":%" PRIu64
               ",\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"gbps\":%.6f,\"posts_per_s\":%.1f,"
               "\"post_ns_p50\":%.1f,\"post_ns_p99\":%.1f,\"post_ns_per_desc_p50\":%.2f,"
               "\"memcpy_ns_per_desc_p50\":%.2f,\"memcpy_gbps\":%.4f,\"memcpy_ratio\":%.4f,"
               "\"lat_us_p50\":%.3f,\"lat_us_p99\":%.3f,\"check\":%s,\"verified_bytes\":%" PRIu64,
               w->ndesc, w->nseg, w->nlists, w->cfg.depth, w->posts, w->bytes, w->seconds, w->gbps,
               w->posts_per_s, w->post_ns_p50, w->post_ns_p99, w->post_ns_per_desc_p50,
               w->memcpy_ns_per_desc_p50, w->memcpy_gbps, w->memcpy_ratio, w->lat_us_p50,
               w->lat_us_p99, w->cfg.check ? (w->check_ok ? "\"ok\"" : "\"failed\"") : "null",
               w->verified_bytes);
        if (w->cfg.cpu_time)
            printf(",\"post_cpu_ns_p50\":%.1f,\"post_cpu_ns_p99\":%.1f,\"nivcsw\":%" PRIu64
                   ",\"nminflt\":%" PRIu64
                   ",\"memcpy_post_ns_p50\":%.1f,\"memcpy_post_ns_p99\":%.1f",
                   w->post_cpu_ns_p50, w->post_cpu_ns_p99, w->nivcsw, w->nminflt,
                   w->memcpy_post_ns_p50, w->memcpy_post_ns_p99);
        printf("}");
    }
    printf("\n]}\n");
    fflush(stdout);
}

/* Runs the sweep; returns the number of failed rows. */
static size_t sweep(const struct opts *o, kvr_xfer_engine_t *eng, kvr_xfer_peer_t *peer,
                    kvr_xfer_mem_t *lmem, uint8_t *lpool, kvr_xfer_rmem_t *rmem, uint64_t pool,
                    struct bench_target *t, struct report *r)
{
    size_t failed = 0;
    bool line = !o->quiet && isatty(STDERR_FILENO);
    r->rows = calloc(o->nsizes * o->nbatches, sizeof(*r->rows));
    if (!r->rows) {
        fprintf(stderr, "kvrail-bench: out of memory\n");
        return 1;
    }
    if (!o->json)
        print_table_head(r);
    for (size_t si = 0; si < o->nsizes; si++) {
        for (size_t bi = 0; bi < o->nbatches; bi++) {
            struct bench_row_cfg cfg = {
                .op = o->op,
                .bsize = o->sizes[si],
                .batch = (uint32_t)o->batches[bi],
                .depth = o->depth,
                .iters = o->iters,
                .duration = o->duration,
                .warmup = o->warmup >= 0 ? (uint64_t)o->warmup : 2u * o->depth,
                .footprint = o->footprint,
                .coalesce = o->coalesce,
                .check = o->check,
                .one_buffer = o->one_buffer,
                .cpu_time = o->cpu_time,
                .timeout_ms = o->timeout_ms,
            };
            /* the default sweep skips what does not fit; an explicit list reports it */
            if ((o->one_buffer ? cfg.bsize : cfg.bsize * cfg.batch) > pool &&
                o->nsizes * o->nbatches > 1) {
                char b1[32], b2[32];
                fprintf(stderr, "kvrail-bench: skipping %s x %u: more than the pool (%s)\n",
                        fmt_size(cfg.bsize, b1, sizeof(b1)), cfg.batch,
                        fmt_size(pool, b2, sizeof(b2)));
                continue;
            }
            struct bench_row *w = &r->rows[r->nrows++];
            kvr_status_t st = bench_row_run(eng, peer, lmem, lpool, rmem, pool, t, &cfg, line, w);
            if (st != KVR_OK || (o->check && !w->check_ok)) {
                failed++;
                if (!w->error[0])
                    snprintf(w->error, sizeof(w->error), "%s", kvr_status_str(st));
            }
            if (!o->json)
                print_table_row(w);
            if (st == KVR_ERR_PEER_FAILURE || kvr_xfer_peer_status(peer) != KVR_OK)
                return failed + 1; /* nothing more can run on this peer */
        }
    }
    if (r->nrows == 0) {
        fprintf(stderr, "kvrail-bench: no (size, batch) pair fits the pool of %" PRIu64 " bytes\n",
                pool);
        failed++;
    }
    return failed;
}

/* ---- roles ---- */

static void local_notif(void *arg, const void *msg, size_t len, const uint8_t *token)
{
    (void)token;
    struct bench_target *t = arg;
    struct bench_ack a = bench_target_on_notif(t, msg, len);
    bench_target_on_ack(t, &a);
}

static void remote_notif(void *arg, const void *msg, size_t len, const uint8_t *token)
{
    (void)token;
    struct bench_target *t = arg;
    struct bench_ack a = bench_target_on_notif(t, msg, len);
    if (bench_chan_send(t->fd, BENCH_MSG_ACK, &a, sizeof(a)) != KVR_OK)
        t->failures++;
}

/* Connects eng to the target (address blob) and unpacks its pool's rkey. */
static kvr_status_t reach_target(kvr_xfer_engine_t *eng, const void *addr, size_t addr_len,
                                 const void *rkey, size_t rkey_len, kvr_xfer_peer_t **peer_p,
                                 kvr_xfer_rmem_t **rmem_p)
{
    kvr_status_t st = kvr_xfer_connect(eng, addr, addr_len, peer_p);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrail-bench: connecting to the target failed: %s\n", kvr_status_str(st));
        return st;
    }
    st = kvr_xfer_rmem_unpack(*peer_p, rkey, rkey_len, rmem_p);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrail-bench: the target's rkey blob: %s\n", kvr_status_str(st));
        kvr_xfer_disconnect(*peer_p);
    }
    return st;
}

static int run_local(const struct opts *o)
{
    struct bench_target t = {.fd = -1, .inject_corruption = o->inject_corruption};
    kvr_xfer_engine_t *te = NULL, *ie = NULL;
    kvr_xfer_mem_t *tmem = NULL, *imem = NULL;
    kvr_xfer_peer_t *peer = NULL;
    kvr_xfer_rmem_t *rmem = NULL;
    uint8_t *ipool = NULL;
    void *addr = NULL, *rkey = NULL;
    size_t addr_len, rkey_len;
    struct report r = {.o = o, .pool = o->pool};
    int rc = 1;

    if (engine_make(o, "bench-target", local_notif, &t, &te) != KVR_OK)
        return 1;
    if (engine_make(o, "bench-initiator", NULL, NULL, &ie) != KVR_OK)
        goto out_te;
    if (pool_make(o, te, o->pool, o->op == KVR_XFER_READ && o->check, &t.pool, &tmem,
                  &r.target_reg_ns) != KVR_OK)
        goto out_ie;
    t.pool_len = o->pool;
    t.engine = te;
    if (pool_make(o, ie, o->pool, false, &ipool, &imem, &r.reg_ns) != KVR_OK)
        goto out_tpool;
    if (kvr_xfer_address(te, &addr, &addr_len) != KVR_OK ||
        kvr_xfer_mem_pack(tmem, &rkey, &rkey_len) != KVR_OK) {
        fprintf(stderr, "kvrail-bench: packing the target's address or rkey failed\n");
        goto out_ipool;
    }
    if (reach_target(ie, addr, addr_len, rkey, rkey_len, &peer, &rmem) != KVR_OK)
        goto out_ipool;
    r.backend = kvr_xfer_engine_backend(ie);
    r.transports = kvr_xfer_peer_transports(peer);

    size_t failed = sweep(o, ie, peer, imem, ipool, rmem, o->pool, &t, &r);
    if (o->json)
        print_json(&r, NULL);
    if (t.failures)
        fprintf(stderr, "kvrail-bench: target saw %" PRIu64 " verification failures\n", t.failures);
    rc = failed || t.failures ? 1 : 0;

    kvr_xfer_disconnect(peer);
out_ipool:
    free(addr);
    free(rkey);
    pool_free(o, imem, ipool, o->pool);
out_tpool:
    pool_free(o, tmem, t.pool, o->pool);
out_ie:
    kvr_xfer_engine_destroy(ie);
out_te:
    kvr_xfer_engine_destroy(te);
    free(r.rows);
    return rc;
}

static int run_target(const struct opts *o)
{
    struct bench_target t = {.fd = -1, .inject_corruption = o->inject_corruption};
    kvr_xfer_engine_t *eng = NULL;
    kvr_xfer_mem_t *mem = NULL;
    void *addr = NULL, *rkey = NULL, *msg = NULL, *setup = NULL;
    size_t addr_len = 0, rkey_len = 0;
    uint32_t type, len;
    uint64_t reg_ns = 0;
    int lfd = -1, rc = 1;
    kvr_status_t st;

    if (engine_make(o, "bench-target", remote_notif, &t, &eng) != KVR_OK)
        return 1;
    if (kvr_xfer_address(eng, &addr, &addr_len) != KVR_OK) {
        fprintf(stderr, "kvrail-bench: packing the target's address failed\n");
        goto out_eng;
    }
    if (bench_chan_listen(o->listen, &lfd) != KVR_OK)
        goto out_eng;
    fprintf(stderr, "kvrail-bench: target (backend %s) listening on %s\n",
            kvr_xfer_engine_backend(eng), o->listen);
    if (bench_chan_accept(lfd, o->wait_ms, &t.fd) != KVR_OK)
        goto out_listen;

    st = bench_chan_recv(t.fd, o->timeout_ms, &type, &msg, &len);
    if (st != KVR_OK || type != BENCH_MSG_HELLO || len != sizeof(struct bench_hello)) {
        fprintf(stderr, "kvrail-bench: the initiator sent no valid hello (%s)\n",
                st != KVR_OK ? kvr_status_str(st) : "wrong message");
        goto out_fd;
    }
    struct bench_hello hello;
    memcpy(&hello, msg, sizeof(hello));
    hello.backend[sizeof(hello.backend) - 1] = '\0';
    if (hello.proto != BENCH_PROTO || strcmp(hello.backend, kvr_xfer_engine_backend(eng)) != 0) {
        char err[160];
        snprintf(err, sizeof(err), "target runs backend %s (bench protocol %u), initiator %s (%u)",
                 kvr_xfer_engine_backend(eng), BENCH_PROTO, hello.backend, hello.proto);
        fprintf(stderr, "kvrail-bench: %s\n", err);
        (void)bench_chan_send(t.fd, BENCH_MSG_ERROR, err, (uint32_t)strlen(err) + 1);
        goto out_fd;
    }
    if (pool_make(o, eng, o->pool, hello.op == KVR_XFER_READ && hello.check, &t.pool, &mem,
                  &reg_ns) != KVR_OK) {
        const char *err = "target could not allocate or register its pool";
        (void)bench_chan_send(t.fd, BENCH_MSG_ERROR, err, (uint32_t)strlen(err) + 1);
        goto out_fd;
    }
    t.pool_len = o->pool;
    fprintf(stderr, "kvrail-bench: target registered %" PRIu64 " bytes in %.3f ms\n", o->pool,
            (double)reg_ns / 1e6);
    if (kvr_xfer_mem_pack(mem, &rkey, &rkey_len) != KVR_OK) {
        fprintf(stderr, "kvrail-bench: packing the pool's rkey failed\n");
        goto out_pool;
    }
    struct bench_setup s = {.proto = BENCH_PROTO,
                            .addr_len = (uint32_t)addr_len,
                            .rkey_len = (uint32_t)rkey_len,
                            .reg_ns = reg_ns,
                            .pool_len = o->pool};
    size_t slen = sizeof(s) + addr_len + rkey_len;
    setup = malloc(slen);
    if (!setup)
        goto out_pool;
    memcpy(setup, &s, sizeof(s));
    memcpy((char *)setup + sizeof(s), addr, addr_len);
    memcpy((char *)setup + sizeof(s) + addr_len, rkey, rkey_len);
    if (bench_chan_send(t.fd, BENCH_MSG_SETUP, setup, (uint32_t)slen) != KVR_OK)
        goto out_pool;

    /* serve: progress the engine until the initiator says it is done.
     * --target-wait spin polls without sleeping (as ucx_perftest's server);
     * event sleeps on the engine's event fd and the side channel when idle
     * (as ib_write_bw's server), where the backend has an event fd. */
    int efd = -1;
    bool sleep_idle = o->target_event && kvr_xfer_event_fd(eng, &efd) == KVR_OK;
    if (o->target_event && !sleep_idle)
        fprintf(stderr, "kvrail-bench: backend %s has no event fd: the target spins\n",
                kvr_xfer_engine_backend(eng));
    for (uint64_t spin = 0;; spin++) {
        int n = kvr_xfer_progress(eng);
        if (n > 0 && (spin & 255u) != 0)
            continue;
        if (n == 0 && sleep_idle) {
            struct pollfd pfd[2] = {{.fd = efd, .events = POLLIN}, {.fd = t.fd, .events = POLLIN}};
            (void)poll(pfd, 2, 100);
        } else if (n == 0 && hello.check) {
            sched_yield(); /* idle: let the initiator run on a crowded machine */
        }
        free(msg);
        msg = NULL;
        st = bench_chan_recv(t.fd, 0, &type, &msg, &len);
        if (st == KVR_ERR_TIMEOUT)
            continue;
        if (st != KVR_OK) {
            fprintf(stderr, "kvrail-bench: the initiator went away (%s)\n", kvr_status_str(st));
            goto out_pool;
        }
        if (type == BENCH_MSG_DONE)
            break;
        if (type == BENCH_MSG_ERROR)
            fprintf(stderr, "kvrail-bench: initiator: %s\n", (char *)msg);
    }
    struct bench_bye bye = {
        .notifs = t.notifs, .verified_bytes = t.verified_bytes, .failures = t.failures};
    (void)bench_chan_send(t.fd, BENCH_MSG_BYE, &bye, sizeof(bye));
    fprintf(stderr,
            "kvrail-bench: target done: %" PRIu64 " notifications, %" PRIu64
            " bytes verified, %" PRIu64 " failures\n",
            t.notifs, t.verified_bytes, t.failures);
    rc = t.failures ? 1 : 0;

out_pool:
    pool_free(o, mem, t.pool, o->pool);
out_fd:
    close(t.fd);
out_listen:
    close(lfd);
out_eng:
    free(setup);
    free(msg);
    free(addr);
    free(rkey);
    kvr_xfer_engine_destroy(eng);
    return rc;
}

static int run_initiator(const struct opts *o)
{
    struct bench_target t = {.fd = -1};
    kvr_xfer_engine_t *eng = NULL;
    kvr_xfer_mem_t *mem = NULL;
    kvr_xfer_peer_t *peer = NULL;
    kvr_xfer_rmem_t *rmem = NULL;
    uint8_t *pool = NULL;
    void *msg = NULL;
    uint32_t type, len;
    struct report r = {.o = o};
    int rc = 1;
    kvr_status_t st;

    if (engine_make(o, "bench-initiator", NULL, NULL, &eng) != KVR_OK)
        return 1;
    if (bench_chan_connect(o->peer, o->wait_ms, &t.fd) != KVR_OK)
        goto out_eng;
    struct bench_hello hello = {.proto = BENCH_PROTO, .op = (uint32_t)o->op, .check = o->check};
    snprintf(hello.backend, sizeof(hello.backend), "%s", kvr_xfer_engine_backend(eng));
    if (bench_chan_send(t.fd, BENCH_MSG_HELLO, &hello, sizeof(hello)) != KVR_OK)
        goto out_fd;
    /* the target registers its pool before it answers: allow for that */
    st = bench_chan_recv(t.fd, o->timeout_ms + 60000, &type, &msg, &len);
    if (st == KVR_OK && type == BENCH_MSG_ERROR) {
        fprintf(stderr, "kvrail-bench: target refused: %s\n", (char *)msg);
        goto out_fd;
    }
    struct bench_setup s;
    if (st != KVR_OK || type != BENCH_MSG_SETUP || len < sizeof(s)) {
        fprintf(stderr, "kvrail-bench: no valid set-up from the target (%s)\n",
                st != KVR_OK ? kvr_status_str(st) : "wrong message");
        goto out_fd;
    }
    memcpy(&s, msg, sizeof(s));
    if (s.proto != BENCH_PROTO || (uint64_t)s.addr_len + s.rkey_len != len - sizeof(s)) {
        fprintf(stderr, "kvrail-bench: malformed set-up message from the target\n");
        goto out_fd;
    }
    r.target_reg_ns = s.reg_ns;
    r.pool = o->pool < s.pool_len ? o->pool : s.pool_len;
    if (pool_make(o, eng, o->pool, false, &pool, &mem, &r.reg_ns) != KVR_OK)
        goto out_fd;
    if (reach_target(eng, (char *)msg + sizeof(s), s.addr_len, (char *)msg + sizeof(s) + s.addr_len,
                     s.rkey_len, &peer, &rmem) != KVR_OK)
        goto out_pool;
    r.backend = kvr_xfer_engine_backend(eng);
    r.transports = kvr_xfer_peer_transports(peer);

    size_t failed = sweep(o, eng, peer, mem, pool, rmem, r.pool, &t, &r);

    struct bench_bye bye = {0};
    bool have_bye = false;
    (void)kvr_xfer_flush(peer, o->timeout_ms);
    if (bench_chan_send(t.fd, BENCH_MSG_DONE, NULL, 0) == KVR_OK) {
        uint64_t deadline = kvr_deadline_ns(o->timeout_ms);
        while (!have_bye && kvr_now_ns() < deadline) {
            free(msg);
            msg = NULL;
            st = bench_chan_recv(t.fd, 100, &type, &msg, &len);
            if (st == KVR_OK && type == BENCH_MSG_BYE && len == sizeof(bye)) {
                memcpy(&bye, msg, sizeof(bye));
                have_bye = true;
            } else if (st != KVR_OK && st != KVR_ERR_TIMEOUT) {
                break;
            }
        }
    }
    if (!have_bye) {
        fprintf(stderr, "kvrail-bench: the target did not confirm the end of the run\n");
        failed++;
    } else if (bye.failures) {
        fprintf(stderr, "kvrail-bench: target saw %" PRIu64 " verification failures\n",
                bye.failures);
        failed++;
    }
    if (o->json)
        print_json(&r, have_bye ? &bye : NULL);
    rc = failed ? 1 : 0;
    kvr_xfer_disconnect(peer);
out_pool:
    pool_free(o, mem, pool, o->pool);
out_fd:
    close(t.fd);
out_eng:
    free(msg);
    free(r.rows);
    kvr_xfer_engine_destroy(eng);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc;
    kvr_log_set_process(o.role == ROLE_TARGET ? "bench-target" : "kvrail-bench");
    switch (o.role) {
    case ROLE_TARGET:
        return run_target(&o);
    case ROLE_INITIATOR:
        return run_initiator(&o);
    default:
        return run_local(&o);
    }
}
