/*
 * loadgen.c - kvrail-loadgen: drives a kvrail router with generation load
 * and reports latency and throughput.
 *
 * Load is open-loop (Poisson arrivals at --rate requests/s) or closed-loop
 * (--concurrency requests always in flight).  Prompts are synthetic (random
 * token ids, lengths drawn from --prompt-len, outputs from --output-len) or
 * read from --prompts FILE (JSON lines {"id", "tokens", "max_tokens"}).  One
 * DEALER socket carries every request, multiplexed by call id; one zmq_poll
 * loop sends arrivals and receives the token streams, stamping each chunk
 * with the monotonic clock as it arrives.
 *
 * Per request: TTFT (send -> first token), TPOT ((last - first) / (n - 1)),
 * inter-token latencies, end-to-end latency.  The report: p50/p90/p99 of
 * each, throughput (requests/s, output tokens/s), goodput (requests/s that
 * met --slo-ttft-ms and --slo-tpot-ms) as a table on stdout, --csv FILE (one
 * row per request), --summary-json FILE, --outputs FILE (JSON lines with the
 * generated token ids, for correctness tests) and --plot FILE.png (gnuplot,
 * when installed).  (The router's status: `kvrail status --json`.)
 * --openai http://HOST:PORT sends the same load to an OpenAI-compatible
 * endpoint (kvrail-frontend) instead: /v1/completions, streamed, on
 * keep-alive connections (lg_http.c), so the two paths compare on one
 * cluster; the model comes from GET /v1/models (or --model-name), and a
 * wrong endpoint fails at once with the cause.
 * With a cluster whose auth is curve, --router-key FILE.pub and
 * --client-key FILE.key (or $KVRAIL_ROUTER_KEY / $KVRAIL_CLIENT_KEY, as
 * libkvrail-client) make the router connection a CURVE client.
 * Test helpers: --cancel-after K cancels each request after K tokens;
 * --disconnect-after K drops the connection once any request has K tokens.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_cluster.h"
#include "kvr_json.h"
#include "kvr_log.h"
#include "kvr_proto.h"
#include "kvr_version.h"
#include "lg_http.h"

#define COMP "loadgen"

enum dist_kind { DIST_FIXED, DIST_UNIFORM, DIST_EXP };

struct dist {
    enum dist_kind kind;
    double a, b;
};

struct req {
    uint64_t id; /* user id (prompts file) or index */
    uint32_t *tokens;
    uint32_t ntokens;
    uint32_t max_tokens;
    uint64_t call_id;
    uint64_t request_id; /* router's */
    uint64_t t_sched, t_send, t_first, t_last, t_end;
    uint32_t *out;
    float *lp; /* each output token's logprob (protobuf path) */
    uint32_t nout, out_cap;
    double *itl; /* ms, nout - 1 */
    int state;   /* 0 waiting, 1 in flight, 2 done */
    int status;
    char message[160];
    bool cancel_sent;
    Kvrail__GenerateUsage usage;
    bool have_usage;
    char prefill_node[64], decode_node[64];
};

struct opts {
    const char *router;
    const char *mode;
    double rate;
    int concurrency;
    int requests;
    struct dist plen, olen;
    uint32_t vocab;
    uint64_t seed;
    const char *prompts;
    const char *outputs;
    const char *csv;
    const char *summary_json;
    const char *plot;
    double slo_ttft_ms, slo_tpot_ms;
    int timeout_ms;
    int cancel_after;
    int disconnect_after;
    int warmup;
    bool ignore_eos;
    bool quiet;
    int shared_prefix;
    double shared_frac;
    const char *label;
    struct lg_sampling sp;  /* default greedy, no filter, no penalty */
    const char *openai;     /* http://HOST:PORT: the OpenAI mode */
    const char *model_name; /* its model id (default: GET /v1/models) */
};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* A sampling option's number, in [lo, hi]; 0 or -1 with the error printed. */
static int sampling_arg(const char *name, const char *s, double lo, double hi, double *v_p)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kvrail-loadgen: --%s '%s': want a number in [%g, %g]\n", name, s, lo, hi);
        return -1;
    }
    *v_p = v;
    return 0;
}

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rnd01(void)
{
    return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0);
}

static int parse_dist(const char *s, struct dist *d_p)
{
    struct dist d = {0};
    char *end;
    if (strncmp(s, "uniform:", 8) == 0) {
        d.kind = DIST_UNIFORM;
        d.a = strtod(s + 8, &end);
        if (*end != ':')
            return -1;
        d.b = strtod(end + 1, &end);
    } else if (strncmp(s, "exp:", 4) == 0) {
        d.kind = DIST_EXP;
        d.a = strtod(s + 4, &end);
    } else {
        d.kind = DIST_FIXED;
        d.a = strtod(strncmp(s, "fixed:", 6) == 0 ? s + 6 : s, &end);
    }
    if (*end || d.a < 1 || (d.kind == DIST_UNIFORM && d.b < d.a))
        return -1;
    *d_p = d;
    return 0;
}

static uint32_t draw(const struct dist *d)
{
    double v;
    switch (d->kind) {
    case DIST_UNIFORM:
        v = d->a + floor(rnd01() * (d->b - d->a + 1));
        break;
    case DIST_EXP:
        v = 1 + floor(-log(1 - rnd01()) * (d->a - 1));
        break;
    default:
        v = d->a;
    }
    return v < 1 ? 1 : (uint32_t)v;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrail-loadgen (--router ENDPOINT | --openai http://HOST:PORT) [options]\n"
               "  --openai URL             an OpenAI-compatible server (kvrail-frontend):\n"
               "                           streamed /v1/completions instead of the router\n"
               "  --model-name NAME        the model id to send (default: GET /v1/models)\n"
               "  --router-key FILE        CURVE: the router's public key (.pub), with\n"
               "  --client-key FILE        this client's key pair (.key) from `kvrail keygen`\n"
               "                           (default: $KVRAIL_ROUTER_KEY, $KVRAIL_CLIENT_KEY)\n"
               "  --mode open|closed       Poisson arrivals at --rate, or --concurrency in flight"
               " (closed)\n"
               "  --rate R                 open loop: requests/s (default 1)\n"
               "  --concurrency C          closed loop: requests in flight (default 1)\n"
               "  --requests N             how many requests (default 16)\n"
               "  --warmup N               requests run first and left out of the report\n"
               "  --prompt-len DIST        N | uniform:A:B | exp:MEAN  (default 128)\n"
               "  --output-len DIST        likewise (default 32)\n"
               "  --shared-prefix N        the first N tokens of a --shared-frac of the prompts"
               " are common\n"
               "  --shared-frac F          (default 0.5 when --shared-prefix is set)\n"
               "  --vocab V                synthetic token ids in [4, V) (default 256)\n"
               "  --seed S                 prompt generator seed (default 1)\n"
               "  --prompts FILE           JSON lines {\"id\",\"tokens\",\"max_tokens\"} instead\n"
               "  --no-ignore-eos          stop at EOS (synthetic load ignores EOS by default)\n"
               "  --temperature T          sample (default 0: greedy); request i uses seed i\n"
               "  --top-p P --top-k K --min-p P --repetition-penalty R   (default 1, 0 = off,\n"
               "                           0, 1)\n"
               "  --presence-penalty X --frequency-penalty X   (default 0)\n"
               "                           (every sampling parameter goes with --openai too)\n"
               "  --slo-ttft-ms X --slo-tpot-ms Y   goodput SLOs (default 1000, 100)\n"
               "  --timeout-ms T           per-request deadline (default 120000)\n"
               "  --outputs FILE --csv FILE --summary-json FILE --plot FILE.png --label NAME\n"
               "  --cancel-after K         cancel each request after K tokens\n"
               "  --disconnect-after K     drop the connection once a request has K tokens\n"
               "  --quiet                  no table on stdout\n"
               "  --version                print the version and git revision\n");
}

/* ---- zmq helpers ---- */

static void *open_socket(void *ctx, const char *endpoint)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    if (!s)
        return NULL;
    int zero = 0, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    /* CURVE: KVRAIL_ROUTER_KEY (the router's .pub) and KVRAIL_CLIENT_KEY (this
     * client's .key, from `kvrail keygen`), as libkvrail-client takes them
     * (--router-key / --client-key set them); keys asked for and unusable
     * are an error, never a silent plain connection */
    char kerr[512];
    if (kvr_proto_curve_client_env(s, kerr, sizeof kerr) != KVR_OK) {
        fprintf(stderr, "kvrail-loadgen: %s\n", kerr);
        zmq_close(s);
        return NULL;
    }
    if (zmq_connect(s, endpoint) != 0) {
        fprintf(stderr, "kvrail-loadgen: cannot connect to '%s': %s\n", endpoint,
                zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

static int wait_readable(void *sock, int timeout_ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, timeout_ms);
}

static void print_json_str(FILE *f, const char *s)
{
    char buf[512];
    size_t n = kvr_json_escape(buf, sizeof buf, s ? s : "", s ? strlen(s) : 0);
    if (n < sizeof buf)
        fputs(buf, f);
    else
        fputs("\"\"", f);
}

/* ---- requests ---- */

static int load_prompts(const char *path, struct req **reqs_p, int *n_p)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvrail-loadgen: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct req *reqs = NULL;
    int n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        lineno++;
        if (len <= 1)
            continue;
        kvr_json_doc_t *doc;
        char err[256];
        if (kvr_json_parse(line, (size_t)len, &doc, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrail-loadgen: %s:%d: %s\n", path, lineno, err);
            goto fail;
        }
        const kvr_json_t *root = kvr_json_root(doc), *toks = kvr_json_get(root, "tokens");
        if (!toks || toks->type != KVR_JSON_ARRAY || toks->n == 0) {
            fprintf(stderr, "kvrail-loadgen: %s:%d: \"tokens\" must be a non-empty array\n", path,
                    lineno);
            kvr_json_free(doc);
            goto fail;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            struct req *nr = realloc(reqs, (size_t)cap * sizeof *reqs);
            if (!nr) {
                kvr_json_free(doc);
                goto fail;
            }
            reqs = nr;
        }
        struct req *r = &reqs[n];
        memset(r, 0, sizeof *r);
        r->id = (uint64_t)kvr_json_get_int(root, "id", n, NULL);
        r->max_tokens = (uint32_t)kvr_json_get_int(root, "max_tokens", 16, NULL);
        r->ntokens = (uint32_t)toks->n;
        r->tokens = malloc(toks->n * sizeof *r->tokens);
        if (!r->tokens) {
            kvr_json_free(doc);
            goto fail;
        }
        for (size_t i = 0; i < toks->n; i++) {
            const kvr_json_t *t = toks->items[i];
            if (t->type != KVR_JSON_NUMBER || !t->is_int || t->i64 < 0) {
                fprintf(stderr, "kvrail-loadgen: %s:%d: token %zu is not a token id\n", path,
                        lineno, i);
                free(r->tokens);
                kvr_json_free(doc);
                goto fail;
            }
            r->tokens[i] = (uint32_t)t->i64;
        }
        n++;
        kvr_json_free(doc);
    }
    free(line);
    fclose(f);
    *reqs_p = reqs;
    *n_p = n;
    return 0;
fail:
    free(line);
    fclose(f);
    for (int i = 0; i < n; i++)
        free(reqs[i].tokens);
    free(reqs);
    return -1;
}

static int make_prompts(const struct opts *o, int total, struct req **reqs_p)
{
    struct req *reqs = calloc((size_t)total, sizeof *reqs);
    if (!reqs)
        return -1;
    uint32_t *prefix = NULL;
    if (o->shared_prefix > 0) {
        prefix = malloc((size_t)o->shared_prefix * sizeof *prefix);
        if (!prefix) {
            free(reqs);
            return -1;
        }
        for (int i = 0; i < o->shared_prefix; i++)
            prefix[i] = 4 + (uint32_t)(rnd() % (o->vocab - 4));
    }
    for (int i = 0; i < total; i++) {
        struct req *r = &reqs[i];
        r->id = (uint64_t)i;
        r->ntokens = draw(&o->plen);
        r->max_tokens = draw(&o->olen);
        r->tokens = malloc(r->ntokens * sizeof *r->tokens);
        if (!r->tokens)
            return -1;
        uint32_t shared = 0;
        if (prefix && rnd01() < o->shared_frac)
            shared =
                r->ntokens < (uint32_t)o->shared_prefix ? r->ntokens : (uint32_t)o->shared_prefix;
        for (uint32_t k = 0; k < r->ntokens; k++)
            r->tokens[k] = k < shared ? prefix[k] : 4 + (uint32_t)(rnd() % (o->vocab - 4));
    }
    free(prefix);
    *reqs_p = reqs;
    return 0;
}

static kvr_status_t send_generate(void *sock, const struct opts *o, struct req *r)
{
    Kvrail__GenerateRequest g = KVRAIL__GENERATE_REQUEST__INIT;
    Kvrail__SamplingParams sp = KVRAIL__SAMPLING_PARAMS__INIT;
    sp.temperature = (float)o->sp.temperature;
    sp.top_p = (float)o->sp.top_p;
    sp.top_k = o->sp.top_k;
    sp.min_p = (float)o->sp.min_p;
    sp.repetition_penalty = (float)o->sp.repetition_penalty;
    sp.presence_penalty = (float)o->sp.presence_penalty;
    sp.frequency_penalty = (float)o->sp.frequency_penalty;
    sp.seed = r->id;
    sp.has_seed = 1;
    g.token_ids = r->tokens;
    g.n_token_ids = r->ntokens;
    g.max_tokens = r->max_tokens;
    g.sampling = &sp;
    g.ignore_eos = o->ignore_eos;
    g.no_text = 1;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__GENERATE, r->call_id};
    return kvr_proto_send(sock, NULL, 0, &h, &g.base);
}

static void send_cancel(void *sock, struct req *r)
{
    Kvrail__CancelRequest c = KVRAIL__CANCEL_REQUEST__INIT;
    c.request_id = r->request_id;
    c.call_id = r->call_id;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__CANCEL, 1ull << 62 | r->call_id};
    (void)kvr_proto_send(sock, NULL, 0, &h, &c.base);
    r->cancel_sent = true;
}

static void finish(struct req *r, int status, const char *msg)
{
    if (r->state == 2)
        return;
    r->state = 2;
    r->t_end = kvr_now_ns();
    r->status = status;
    size_t n = msg ? strlen(msg) : 0;
    if (n >= sizeof r->message)
        n = sizeof r->message - 1;
    if (n)
        memcpy(r->message, msg, n);
    r->message[n] = 0;
}

static void on_chunk(struct req *r, const Kvrail__GenerateChunk *c)
{
    uint64_t now = kvr_now_ns();
    if (r->nout == r->out_cap) {
        uint32_t cap = r->out_cap ? 2 * r->out_cap : 64;
        uint32_t *no = realloc(r->out, cap * sizeof *no);
        if (no)
            r->out = no;
        double *ni = realloc(r->itl, cap * sizeof *ni);
        if (ni)
            r->itl = ni;
        float *nl = realloc(r->lp, cap * sizeof *nl);
        if (nl)
            r->lp = nl;
        if (!no || !ni || !nl) {
            finish(r, KVR_ERR_NO_MEMORY, "out of memory");
            return;
        }
        r->out_cap = cap;
    }
    if (r->nout == 0)
        r->t_first = now;
    else
        r->itl[r->nout - 1] = (double)(now - r->t_last) / 1e6;
    r->t_last = now;
    r->request_id = c->request_id;
    r->lp[r->nout] = c->logprob;
    r->out[r->nout++] = c->token_id;
}

/* ---- statistics ---- */

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, dcmp);
    double k = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(k), hi = (size_t)ceil(k);
    return v[lo] + (v[hi] - v[lo]) * (k - (double)lo);
}

struct metric {
    const char *name;
    double p50, p90, p99, mean;
    size_t n;
};

static void summarize(struct metric *m, const char *name, double *v, size_t n)
{
    m->name = name;
    m->n = n;
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += v[i];
    m->mean = n ? s / (double)n : NAN;
    m->p50 = pct(v, n, 50);
    m->p90 = pct(v, n, 90);
    m->p99 = pct(v, n, 99);
}

static double ttft_ms(const struct req *r)
{
    return (double)(r->t_first - r->t_send) / 1e6;
}

static double tpot_ms(const struct req *r)
{
    return r->nout > 1 ? (double)(r->t_last - r->t_first) / 1e6 / (r->nout - 1) : 0;
}

static void write_plot(const struct opts *o, struct req *reqs, int first, int total)
{
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "kvrail-loadgen: gnuplot not installed: no plot (%s)\n", o->plot);
        return;
    }
    char dat[] = "/tmp/kvr-loadgen-XXXXXX";
    int fd = mkstemp(dat);
    if (fd < 0)
        return;
    FILE *f = fdopen(fd, "w");
    for (int i = first; i < total; i++)
        if (reqs[i].status == 0 && reqs[i].nout > 0)
            fprintf(f, "%.3f %.3f %.3f %u\n", (double)(reqs[i].t_send - reqs[first].t_send) / 1e9,
                    ttft_ms(&reqs[i]), tpot_ms(&reqs[i]), reqs[i].ntokens);
    fclose(f);
    FILE *g = popen("gnuplot", "w");
    if (!g) {
        unlink(dat);
        return;
    }
    fprintf(g,
            "set terminal png size 1000,500\nset output '%s'\nset multiplot layout 1,2 title '%s'\n"
            "set xlabel 'prompt tokens'\nset ylabel 'TTFT (ms)'\nplot '%s' using 4:2 with points "
            "pt 7 title 'TTFT'\nset xlabel 'request start (s)'\nset ylabel 'TPOT (ms)'\nplot '%s' "
            "using 1:3 with points pt 7 title 'TPOT'\nunset multiplot\n",
            o->plot, o->label ? o->label : "kvrail-loadgen", dat, dat);
    pclose(g);
    unlink(dat);
}

static void report(const struct opts *o, struct req *reqs, int first, int total, double wall_s)
{
    int n = total - first, ok = 0, good = 0, failed = 0, canceled = 0, overload = 0;
    double *ttft = calloc((size_t)n + 1, sizeof(double));
    double *tpot = calloc((size_t)n + 1, sizeof(double));
    double *e2e = calloc((size_t)n + 1, sizeof(double));
    size_t nitl = 0, nt = 0, np = 0;
    uint64_t out_tokens = 0, in_tokens = 0, cached = 0, kv_bytes = 0;
    for (int i = first; i < total; i++)
        nitl += reqs[i].nout > 1 ? reqs[i].nout - 1 : 0;
    double *itl = calloc(nitl + 1, sizeof(double));
    nitl = 0;
    for (int i = first; i < total; i++) {
        struct req *r = &reqs[i];
        if (r->status == KVR_ERR_CANCELED)
            canceled++;
        else if (r->status == KVR_ERR_OVERLOAD)
            overload++;
        else if (r->status != 0)
            failed++;
        if (r->status != 0 || r->nout == 0)
            continue;
        ok++;
        out_tokens += r->nout;
        in_tokens += r->ntokens;
        cached += r->usage.cached_tokens;
        kv_bytes += r->usage.kv_bytes_moved;
        ttft[nt++] = ttft_ms(r);
        if (r->nout > 1)
            tpot[np++] = tpot_ms(r);
        e2e[nt - 1] = (double)(r->t_last - r->t_send) / 1e6;
        for (uint32_t k = 0; k + 1 < r->nout; k++)
            itl[nitl++] = r->itl[k];
        if (ttft_ms(r) <= o->slo_ttft_ms && tpot_ms(r) <= o->slo_tpot_ms)
            good++;
    }
    struct metric m[4];
    summarize(&m[0], "TTFT ms", ttft, nt);
    summarize(&m[1], "TPOT ms", tpot, np);
    summarize(&m[2], "ITL ms", itl, nitl);
    summarize(&m[3], "E2E ms", e2e, nt);
    if (!o->quiet) {
        printf("kvrail-loadgen %s: %s loop, %d requests (%d ok, %d failed, %d canceled, %d "
               "overloaded) in %.2f s\n",
               o->label ? o->label : "", strcmp(o->mode, "open") == 0 ? "open" : "closed", n, ok,
               failed, canceled, overload, wall_s);
        printf("| metric  |      n |     mean |      p50 |      p90 |      p99 |\n");
        printf("|---------|-------:|---------:|---------:|---------:|---------:|\n");
        for (int i = 0; i < 4; i++)
            printf("| %-7s | %6zu | %8.2f | %8.2f | %8.2f | %8.2f |\n", m[i].name, m[i].n,
                   m[i].mean, m[i].p50, m[i].p90, m[i].p99);
        printf("throughput: %.2f req/s, %.1f output tok/s, %.1f prompt tok/s; goodput (TTFT <= %g "
               "ms, TPOT <= %g ms): %.2f req/s (%d/%d)\n",
               ok / wall_s, (double)out_tokens / wall_s, (double)in_tokens / wall_s, o->slo_ttft_ms,
               o->slo_tpot_ms, good / wall_s, good, n);
        printf("prompt tokens served from cache: %" PRIu64 ", KV bytes moved: %" PRIu64 "\n",
               cached, kv_bytes);
    }
    if (o->summary_json) {
        FILE *f = fopen(o->summary_json, "w");
        if (f) {
            fprintf(f, "{\"label\": ");
            print_json_str(f, o->label ? o->label : "");
            fprintf(f,
                    ", \"requests\": %d, \"ok\": %d, \"failed\": %d, \"canceled\": %d, "
                    "\"overloaded\": %d, \"wall_s\": %.4f, \"req_per_s\": %.4f, "
                    "\"out_tok_per_s\": %.3f, \"goodput_req_per_s\": %.4f, \"good\": %d, "
                    "\"cached_tokens\": %" PRIu64 ", \"kv_bytes\": %" PRIu64,
                    n, ok, failed, canceled, overload, wall_s, ok / wall_s,
                    (double)out_tokens / wall_s, good / wall_s, good, cached, kv_bytes);
            const char *keys[4] = {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"};
            for (int i = 0; i < 4; i++)
                fprintf(f,
                        ", \"%s\": {\"n\": %zu, \"mean\": %.4f, \"p50\": %.4f, \"p90\": %.4f, "
                        "\"p99\": %.4f}",
                        keys[i], m[i].n, isnan(m[i].mean) ? 0 : m[i].mean,
                        isnan(m[i].p50) ? 0 : m[i].p50, isnan(m[i].p90) ? 0 : m[i].p90,
                        isnan(m[i].p99) ? 0 : m[i].p99);
            fprintf(f, "}\n");
            fclose(f);
        }
    }
    if (o->csv) {
        FILE *f = fopen(o->csv, "w");
        if (f) {
            fprintf(f, "id,prompt_tokens,output_tokens,status,ttft_ms,tpot_ms,e2e_ms,"
                       "cached_tokens,kv_bytes,local_prefill,prefill_node,decode_node\n");
            for (int i = first; i < total; i++) {
                struct req *r = &reqs[i];
                fprintf(f, "%" PRIu64 ",%u,%u,%d,%.3f,%.3f,%.3f,%u,%" PRIu64 ",%d,%s,%s\n", r->id,
                        r->ntokens, r->nout, r->status, r->nout ? ttft_ms(r) : 0, tpot_ms(r),
                        r->nout ? (double)(r->t_last - r->t_send) / 1e6 : 0, r->usage.cached_tokens,
                        r->usage.kv_bytes_moved, r->usage.local_prefill, r->prefill_node,
                        r->decode_node);
            }
            fclose(f);
        }
    }
    if (o->plot)
        write_plot(o, reqs, first, total);
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
}

static void write_outputs(const char *path, struct req *reqs, int total)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kvrail-loadgen: cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    for (int i = 0; i < total; i++) {
        struct req *r = &reqs[i];
        fprintf(f, "{\"id\": %" PRIu64 ", \"status\": %d, \"message\": ", r->id, r->status);
        print_json_str(f, r->message);
        fprintf(f, ", \"tokens\": [");
        for (uint32_t k = 0; k < r->nout; k++)
            fprintf(f, "%s%u", k ? ", " : "", r->out[k]);
        /* as `kvrail run --json` prints them (KVR_CLI_LOGPROB_FMT): exact */
        fprintf(f, "], \"logprobs\": %s", r->lp ? "[" : "null");
        for (uint32_t k = 0; r->lp && k < r->nout; k++)
            fprintf(f, "%s%.9g", k ? ", " : "", (double)r->lp[k]);
        fprintf(f,
                "%s, \"finish\": %d, \"cached_tokens\": %u, \"local_prefill\": %s, "
                "\"kv_bytes\": %" PRIu64 ", \"prefill_node\": ",
                r->lp ? "]" : "", r->usage.finish, r->usage.cached_tokens,
                r->usage.local_prefill ? "true" : "false", r->usage.kv_bytes_moved);
        print_json_str(f, r->prefill_node);
        fprintf(f, ", \"decode_node\": ");
        print_json_str(f, r->decode_node);
        fprintf(f, ", \"request_id\": %" PRIu64 ", \"ttft_ms\": %.3f}\n", r->request_id,
                r->nout ? ttft_ms(r) : 0.0);
    }
    fclose(f);
}

static void handle_frame(void *sock, const struct opts *o, struct req *reqs, int total,
                         kvr_proto_frame_t *fr, int *done_p, bool *disconnect_p)
{
    if (!fr->have_hdr || fr->hdr.method != KVRAIL__METHOD__GENERATE)
        return;
    uint64_t cid = fr->hdr.call_id;
    if (cid == 0 || cid > (uint64_t)total)
        return;
    struct req *r = &reqs[cid - 1];
    if (r->state != 1)
        return;
    char err[256];
    ProtobufCMessage *m = NULL;
    if (fr->hdr.flags & KVR_PROTO_F_ERROR) {
        if (kvr_proto_decode(fr, &kvrail__status__descriptor, &m, err, sizeof err) == KVR_OK) {
            Kvrail__Status *st = (Kvrail__Status *)m;
            finish(r, st->code ? st->code : KVR_ERR_INTERNAL, st->message);
        } else {
            finish(r, KVR_ERR_INVALID, err);
        }
        (*done_p)++;
    } else if (fr->hdr.flags & KVR_PROTO_F_END) {
        if (kvr_proto_decode(fr, &kvrail__stream_end__descriptor, &m, err, sizeof err) == KVR_OK) {
            Kvrail__StreamEnd *se = (Kvrail__StreamEnd *)m;
            if (se->usage) {
                r->usage = *se->usage;
                r->usage.prefill_node = NULL;
                r->usage.decode_node = NULL;
                snprintf(r->prefill_node, sizeof r->prefill_node, "%s",
                         se->usage->prefill_node ? se->usage->prefill_node : "");
                snprintf(r->decode_node, sizeof r->decode_node, "%s",
                         se->usage->decode_node ? se->usage->decode_node : "");
                r->have_usage = true;
            }
            int code = se->status ? se->status->code : 0;
            finish(r, code, se->status ? se->status->message : "");
        } else {
            finish(r, KVR_ERR_INVALID, err);
        }
        (*done_p)++;
    } else {
        if (kvr_proto_decode(fr, &kvrail__generate_chunk__descriptor, &m, err, sizeof err) ==
            KVR_OK) {
            on_chunk(r, (Kvrail__GenerateChunk *)m);
            if (o->cancel_after > 0 && !r->cancel_sent && r->nout >= (uint32_t)o->cancel_after)
                send_cancel(sock, r);
            if (o->disconnect_after > 0 && r->nout >= (uint32_t)o->disconnect_after)
                *disconnect_p = true;
        }
    }
    if (m)
        protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- the OpenAI mode's sink (lg_http.h) ---- */
static int g_http_done; /* requests the HTTP side ended */

static void http_tokens(struct req *r, uint32_t n, uint64_t now)
{
    if (r->state != 1)
        return;
    Kvrail__GenerateChunk c = KVRAIL__GENERATE_CHUNK__INIT;
    for (uint32_t k = 0; k < n; k++) /* ids are not in the SSE text; gaps within an event 0 */
        on_chunk(r, &c);
    (void)now;
}

static void http_end(struct req *r, int status, const char *msg, uint32_t prompt_tokens,
                     uint32_t completion_tokens, uint32_t cached_tokens)
{
    if (r->state != 1)
        return;
    r->usage.prompt_tokens = prompt_tokens;
    r->usage.completion_tokens = completion_tokens;
    r->usage.cached_tokens = cached_tokens;
    r->have_usage = status == 0;
    finish(r, status, msg);
    g_http_done++;
}

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

int main(int argc, char **argv)
{
    struct opts o = {.router = NULL,
                     .mode = "closed",
                     .rate = 1,
                     .concurrency = 1,
                     .requests = 16,
                     .plen = {DIST_FIXED, 128, 0},
                     .olen = {DIST_FIXED, 32, 0},
                     .vocab = 256,
                     .seed = 1,
                     .slo_ttft_ms = 1000,
                     .slo_tpot_ms = 100,
                     .timeout_ms = 120000,
                     .ignore_eos = true,
                     .shared_frac = 0.5,
                     .sp = {.top_p = 1, .repetition_penalty = 1}};
    enum {
        O_MODE = 256,
        O_RATE,
        O_CONC,
        O_REQS,
        O_PLEN,
        O_OLEN,
        O_VOCAB,
        O_SEED,
        O_PROMPTS,
        O_OUTPUTS,
        O_CSV,
        O_SUMMARY,
        O_PLOT,
        O_SLO_TTFT,
        O_SLO_TPOT,
        O_TIMEOUT,
        O_CANCEL,
        O_DISC,
        O_WARMUP,
        O_NOEOS,
        O_QUIET,
        O_SHARED,
        O_SHARED_FRAC,
        O_LABEL,
        O_OPENAI,
        O_TEMP,
        O_PRES,
        O_FREQ,
        O_TOPP,
        O_TOPK,
        O_MINP,
        O_REP,
        O_ROUTER_KEY,
        O_CLIENT_KEY,
        O_MODEL_NAME,
        O_ROUTER,
        O_CONFIG
    };
    static const struct option lo[] = {
        {"router", required_argument, 0, O_ROUTER},
        {"config", required_argument, 0, O_CONFIG},
        {"mode", required_argument, 0, O_MODE},
        {"rate", required_argument, 0, O_RATE},
        {"concurrency", required_argument, 0, O_CONC},
        {"requests", required_argument, 0, O_REQS},
        {"prompt-len", required_argument, 0, O_PLEN},
        {"output-len", required_argument, 0, O_OLEN},
        {"vocab", required_argument, 0, O_VOCAB},
        {"seed", required_argument, 0, O_SEED},
        {"prompts", required_argument, 0, O_PROMPTS},
        {"outputs", required_argument, 0, O_OUTPUTS},
        {"csv", required_argument, 0, O_CSV},
        {"summary-json", required_argument, 0, O_SUMMARY},
        {"plot", required_argument, 0, O_PLOT},
        {"slo-ttft-ms", required_argument, 0, O_SLO_TTFT},
        {"slo-tpot-ms", required_argument, 0, O_SLO_TPOT},
        {"timeout-ms", required_argument, 0, O_TIMEOUT},
        {"cancel-after", required_argument, 0, O_CANCEL},
        {"disconnect-after", required_argument, 0, O_DISC},
        {"warmup", required_argument, 0, O_WARMUP},
        {"no-ignore-eos", no_argument, 0, O_NOEOS},
        {"quiet", no_argument, 0, O_QUIET},
        {"shared-prefix", required_argument, 0, O_SHARED},
        {"shared-frac", required_argument, 0, O_SHARED_FRAC},
        {"label", required_argument, 0, O_LABEL},
        {"openai", required_argument, 0, O_OPENAI},
        {"temperature", required_argument, 0, O_TEMP},
        {"presence-penalty", required_argument, 0, O_PRES},
        {"frequency-penalty", required_argument, 0, O_FREQ},
        {"top-p", required_argument, 0, O_TOPP},
        {"top-k", required_argument, 0, O_TOPK},
        {"min-p", required_argument, 0, O_MINP},
        {"repetition-penalty", required_argument, 0, O_REP},
        {"router-key", required_argument, 0, O_ROUTER_KEY},
        {"client-key", required_argument, 0, O_CLIENT_KEY},
        {"model-name", required_argument, 0, O_MODEL_NAME},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    int c;
    const char *config = NULL;
    static char endpoint[KVR_CLUSTER_STR_MAX];
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case O_CONFIG:
            config = optarg;
            break;
        case O_ROUTER:
            o.router = optarg;
            break;
        case O_MODE:
            o.mode = optarg;
            break;
        case O_RATE:
            o.rate = atof(optarg);
            break;
        case O_CONC:
            o.concurrency = atoi(optarg);
            break;
        case O_REQS:
            o.requests = atoi(optarg);
            break;
        case O_PLEN:
        case O_OLEN:
            if (parse_dist(optarg, c == O_PLEN ? &o.plen : &o.olen) != 0) {
                fprintf(stderr,
                        "kvrail-loadgen: bad length distribution '%s' (N, uniform:A:B "
                        "or exp:MEAN, values >= 1)\n",
                        optarg);
                return 2;
            }
            break;
        case O_VOCAB:
            o.vocab = (uint32_t)atoi(optarg);
            break;
        case O_SEED:
            o.seed = strtoull(optarg, NULL, 0);
            break;
        case O_PROMPTS:
            o.prompts = optarg;
            break;
        case O_OUTPUTS:
            o.outputs = optarg;
            break;
        case O_CSV:
            o.csv = optarg;
            break;
        case O_SUMMARY:
            o.summary_json = optarg;
            break;
        case O_PLOT:
            o.plot = optarg;
            break;
        case O_SLO_TTFT:
            o.slo_ttft_ms = atof(optarg);
            break;
        case O_SLO_TPOT:
            o.slo_tpot_ms = atof(optarg);
            break;
        case O_TIMEOUT:
            o.timeout_ms = atoi(optarg);
            break;
        case O_CANCEL:
            o.cancel_after = atoi(optarg);
            break;
        case O_DISC:
            o.disconnect_after = atoi(optarg);
            break;
        case O_WARMUP:
            o.warmup = atoi(optarg);
            break;
        case O_NOEOS:
            o.ignore_eos = false;
            break;
        case O_QUIET:
            o.quiet = true;
            break;
        case O_SHARED:
            o.shared_prefix = atoi(optarg);
            break;
        case O_SHARED_FRAC:
            o.shared_frac = atof(optarg);
            break;
        case O_LABEL:
            o.label = optarg;
            break;
        case O_OPENAI:
            o.openai = optarg;
            break;
        case O_TEMP:
            if (sampling_arg("temperature", optarg, 0, 100, &o.sp.temperature))
                return 2;
            break;
        case O_PRES:
            if (sampling_arg("presence-penalty", optarg, -2, 2, &o.sp.presence_penalty))
                return 2;
            break;
        case O_FREQ:
            if (sampling_arg("frequency-penalty", optarg, -2, 2, &o.sp.frequency_penalty))
                return 2;
            break;
        case O_TOPP:
            if (sampling_arg("top-p", optarg, 0, 1, &o.sp.top_p) || o.sp.top_p == 0) {
                fprintf(stderr, "kvrail-loadgen: --top-p must be in (0, 1]\n");
                return 2;
            }
            break;
        case O_MINP:
            if (sampling_arg("min-p", optarg, 0, 1, &o.sp.min_p))
                return 2;
            break;
        case O_REP:
            if (sampling_arg("repetition-penalty", optarg, 0.01, 100, &o.sp.repetition_penalty))
                return 2;
            break;
        case O_TOPK: {
            double k;
            if (sampling_arg("top-k", optarg, 0, 1 << 24, &k) || k != (uint32_t)k) {
                fprintf(stderr, "kvrail-loadgen: --top-k takes a whole number (0 = off)\n");
                return 2;
            }
            o.sp.top_k = (uint32_t)k;
            break;
        }
        case O_ROUTER_KEY:
            setenv("KVRAIL_ROUTER_KEY", optarg, 1);
            break;
        case O_CLIENT_KEY:
            setenv("KVRAIL_CLIENT_KEY", optarg, 1);
            break;
        case O_MODEL_NAME:
            o.model_name = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            kvr_version_print("kvrail-loadgen");
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!o.router && config) {
        kvr_cluster_t *cl = NULL;
        char err[512];
        if (kvr_cluster_load(config, &cl, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrail-loadgen: %s\n", err);
            return 2;
        }
        snprintf(endpoint, sizeof endpoint, "%s", cl->client_endpoint);
        kvr_cluster_free(cl);
        o.router = endpoint;
    }
    if (!o.router && !o.openai) {
        fprintf(stderr, "kvrail-loadgen: --router ENDPOINT, --config FILE or --openai URL is "
                        "required\n");
        usage(stderr);
        return 2;
    }
    if (strcmp(o.mode, "open") != 0 && strcmp(o.mode, "closed") != 0) {
        fprintf(stderr, "kvrail-loadgen: --mode must be open or closed, not '%s'\n", o.mode);
        return 2;
    }
    if (o.rate <= 0 || o.concurrency < 1 || o.requests < 1 || o.vocab < 5 || o.warmup < 0 ||
        o.timeout_ms < 1) {
        fprintf(stderr, "kvrail-loadgen: --rate > 0, --concurrency >= 1, --requests >= 1, "
                        "--vocab >= 5, --timeout-ms >= 1 required\n");
        return 2;
    }
    rng_state ^= o.seed * 0x2545F4914F6CDD1Dull;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int rc = 1;
    void *ctx = NULL, *sock = NULL;
    struct lg_http *http = NULL;
    if (!o.openai) {
        ctx = zmq_ctx_new();
        sock = ctx ? open_socket(ctx, o.router) : NULL;
        if (!sock)
            goto out_ctx;
    }

    struct req *reqs = NULL;
    int total;
    if (o.prompts) {
        if (load_prompts(o.prompts, &reqs, &total) != 0)
            goto out_sock;
        if (total == 0) {
            fprintf(stderr, "kvrail-loadgen: %s holds no prompts\n", o.prompts);
            goto out_sock;
        }
        o.warmup = 0;
    } else {
        total = o.requests + o.warmup;
        if (make_prompts(&o, total, &reqs) != 0) {
            fprintf(stderr, "kvrail-loadgen: out of memory\n");
            goto out_sock;
        }
    }
    for (int i = 0; i < total; i++)
        reqs[i].call_id = (uint64_t)i + 1;
    if (o.openai) {
        static const struct lg_http_sink sink = {http_tokens, http_end};
        char err[512];
        int conns = strcmp(o.mode, "open") == 0 ? total : o.concurrency;
        http = lg_http_open(o.openai, o.model_name, conns, &sink, err, sizeof err);
        if (!http) {
            fprintf(stderr, "kvrail-loadgen: %s\n", err);
            rc = 2;
            goto out_reqs;
        }
        if (o.cancel_after || o.disconnect_after)
            fprintf(stderr, "kvrail-loadgen: --cancel-after / --disconnect-after are the "
                            "protobuf path's; ignored with --openai\n");
    }

    /* warm-up requests run closed-loop one at a time, then the measured load */
    bool open = strcmp(o.mode, "open") == 0;
    int next = 0, done = 0, inflight = 0, first_measured = o.warmup;
    bool disconnect = false;
    uint64_t t0 = 0, next_arrival = 0;
    while (done < total && !g_stop && !disconnect) {
        uint64_t now = kvr_now_ns();
        bool warm = next < o.warmup;
        if (next == first_measured && t0 == 0 && done == first_measured) {
            t0 = now;
            next_arrival = now;
        }
        /* send what is due */
        while (next < total &&
               (warm ? inflight == 0 && done == next
                     : (t0 && (open ? now >= next_arrival : inflight < o.concurrency)))) {
            struct req *r = &reqs[next];
            r->t_sched = open && !warm ? next_arrival : now;
            r->t_send = now;
            r->state = 1;
            if (http) {
                int before = g_http_done;
                (void)lg_http_send(http, r, next, r->tokens, r->ntokens, r->max_tokens, &o.sp,
                                   r->id, o.ignore_eos);
                inflight++;
                done += g_http_done - before;
                inflight -= g_http_done - before;
            } else {
                kvr_status_t s = send_generate(sock, &o, r);
                if (s != KVR_OK) {
                    finish(r, s, "send failed");
                    done++;
                } else {
                    inflight++;
                }
            }
            next++;
            if (open && !warm)
                next_arrival += (uint64_t)(-log(1 - rnd01()) / o.rate * 1e9);
            warm = next < o.warmup;
            if (warm)
                break;
        }
        int timeout = 50;
        if (open && t0 && next < total) {
            int64_t dt = ((int64_t)next_arrival - (int64_t)kvr_now_ns()) / 1000000;
            timeout = dt < 0 ? 0 : dt < 50 ? (int)dt : 50;
        }
        if (http) {
            int before = g_http_done;
            lg_http_poll(http, timeout);
            done += g_http_done - before;
            inflight -= g_http_done - before;
        } else if (wait_readable(sock, timeout) > 0) {
            for (int k = 0; k < 256; k++) {
                kvr_proto_frame_t fr;
                char err[256];
                kvr_status_t s = kvr_proto_recv(sock, false, &fr, err, sizeof err);
                if (s == KVR_ERR_NO_RESOURCE) {
                    kvr_proto_frame_clear(&fr);
                    break;
                }
                int before = done;
                if (s == KVR_OK)
                    handle_frame(sock, &o, reqs, total, &fr, &done, &disconnect);
                else
                    fprintf(stderr, "kvrail-loadgen: bad frame from the router: %s\n", err);
                inflight -= done - before;
                kvr_proto_frame_clear(&fr);
            }
        }
        /* deadlines */
        now = kvr_now_ns();
        for (int i = 0; i < next; i++)
            if (reqs[i].state == 1 && now - reqs[i].t_send > (uint64_t)o.timeout_ms * 1000000ull) {
                if (http)
                    lg_http_drop(http, &reqs[i]);
                finish(&reqs[i], KVR_ERR_TIMEOUT, "no end of stream before --timeout-ms");
                done++;
                inflight--;
            }
    }
    double wall_s = t0 ? (double)(kvr_now_ns() - t0) / 1e9 : 0;
    if (disconnect) {
        /* drop the connection with requests in flight (a client that goes away) */
        zmq_close(sock);
        sock = NULL;
        for (int i = 0; i < total; i++)
            if (reqs[i].state == 1)
                finish(&reqs[i], KVR_ERR_CANCELED, "client disconnected");
        printf("kvrail-loadgen: disconnected with requests in flight\n");
    }
    if (wall_s <= 0)
        wall_s = 1e-9;
    report(&o, reqs, first_measured, total, wall_s);
    if (o.outputs)
        write_outputs(o.outputs, reqs, total);
    rc = 0;
    for (int i = first_measured; i < total; i++)
        if (reqs[i].status != 0 && reqs[i].status != KVR_ERR_CANCELED && !o.cancel_after &&
            !o.disconnect_after)
            rc = 3;
    if (g_stop)
        rc = 130;
out_reqs:
    lg_http_close(http);
    for (int i = 0; i < total; i++) {
        free(reqs[i].tokens);
        free(reqs[i].out);
        free(reqs[i].lp);
        free(reqs[i].itl);
    }
    free(reqs);
out_sock:
    if (sock)
        zmq_close(sock);
out_ctx:
    if (ctx)
        zmq_ctx_term(ctx);
    return rc;
}
