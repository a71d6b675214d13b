/*
 * chaos_client.c - kvr-chaos-client, the load of the chaos test: a steady
 * closed loop of greedy token-id requests through libkvrail-client (so the
 * CURVE keys come from KVRAIL_ROUTER_KEY / KVRAIL_CLIENT_KEY), CONC streams
 * in flight on one client, cycling through the prompts until the stop file
 * exists (and at least --min requests were sent), then draining.
 *
 *   kvr-chaos-client --router EP --prompts FILE --outputs FILE
 *                    [--concurrency N] [--timeout-ms MS] [--min N]
 *                    [--stop-file PATH] [--max N]
 *
 * prompts: one JSON object a line, {"id": I, "tokens": [...], "max_tokens":
 * N}.  outputs: one line per request sent, {"seq", "id", "status" (0 =
 * completed), "status_name", "message", "tokens", "finish", "hung",
 * "start_ms", "end_ms", the router's "ttft_us", "total_us", "router_overhead_ns" and
 * "router_overhead_cpu_ns", "prefill_node", "decode_node"}.  A request whose
 * stream has not ended within --timeout-ms of its start is canceled and
 * written with "hung": true (the test's failure: every stream must end by
 * itself, with its tokens or a clear error).  Exit 0 when every request
 * was written.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvr_clock.h"
#include "kvr_client.h"
#include "kvr_json.h"

#define MAX_CONC 64

struct prompt {
    uint64_t id;
    uint32_t *tokens;
    size_t n;
    uint32_t max_tokens;
};

struct slot {
    kvr_gen_stream_t *s;
    const struct prompt *p;
    uint64_t seq, t0;
    uint32_t *out;
    float *lp; /* each output token's logprob */
    size_t n_out;
};

static void put_json_str(FILE *f, const char *s)
{
    kvr_json_fput_str(f, s, strlen(s));
}

static void write_result(FILE *f, const struct slot *sl, const struct kvr_gen_result *r, bool hung,
                         uint64_t t_base)
{
    fprintf(f, "{\"seq\": %" PRIu64 ", \"id\": %" PRIu64 ", \"status\": %d, \"status_name\": ",
            sl->seq, sl->p->id, hung ? (int)KVR_ERR_TIMEOUT : (int)r->status);
    put_json_str(f, hung ? "CLIENT_DEADLINE" : kvr_status_name(r->status));
    fprintf(f, ", \"message\": ");
    put_json_str(f, hung ? "no end of stream within the client's deadline" : r->message);
    fprintf(f, ", \"tokens\": [");
    for (size_t i = 0; i < sl->n_out; i++)
        fprintf(f, "%s%u", i ? ", " : "", sl->out[i]);
    fprintf(f, "], \"logprobs\": ["); /* as kvrail run --json prints them: exact */
    for (size_t i = 0; i < sl->n_out; i++)
        fprintf(f, "%s%.9g", i ? ", " : "", (double)sl->lp[i]);
    fprintf(f, "], \"finish\": %d, \"hung\": %s, \"start_ms\": %.3f, \"end_ms\": %.3f",
            (int)r->finish, hung ? "true" : "false", (double)(sl->t0 - t_base) / 1e6,
            (double)(kvr_now_ns() - t_base) / 1e6);
    fprintf(f,
            ", \"ttft_us\": %" PRIu64 ", \"total_us\": %" PRIu64
            ", \"router_overhead_ns\": %" PRIu64 ", \"router_overhead_cpu_ns\": %" PRIu64,
            r->ttft_us, r->total_us, r->router_overhead_ns, r->router_overhead_cpu_ns);
    fprintf(f, ", \"prefill_node\": ");
    put_json_str(f, r->prefill_node);
    fprintf(f, ", \"decode_node\": ");
    put_json_str(f, r->decode_node);
    fprintf(f, "}\n");
    fflush(f);
}

static size_t load_prompts(const char *path, struct prompt **out_p)
{
    kvr_json_doc_t *doc = NULL;
    char err[256];
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return 0;
    }
    struct prompt *ps = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        if (kvr_json_parse(line, (size_t)len, &doc, err, sizeof err) != KVR_OK)
            continue;
        const kvr_json_t *r = kvr_json_root(doc), *t = kvr_json_get(r, "tokens");
        if (t && t->type == KVR_JSON_ARRAY && t->n > 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                ps = realloc(ps, cap * sizeof *ps);
            }
            struct prompt *p = &ps[n++];
            p->id = (uint64_t)kvr_json_get_int(r, "id", (int64_t)n - 1, NULL);
            p->max_tokens = (uint32_t)kvr_json_get_int(r, "max_tokens", 8, NULL);
            p->n = t->n;
            p->tokens = malloc(t->n * sizeof *p->tokens);
            for (size_t i = 0; i < t->n; i++)
                p->tokens[i] = (uint32_t)kvr_json_at(t, i)->i64;
        }
        kvr_json_free(doc);
    }
    free(line);
    fclose(f);
    *out_p = ps;
    return n;
}

int main(int argc, char **argv)
{
    const char *router = NULL, *prompts_path = NULL, *outputs = NULL, *stop_file = NULL;
    int conc = 8, timeout_ms = 30000;
    long min_reqs = 0, max_reqs = 100000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "%s: %s needs a value\n", argv[0], a);
            return 2;
        }
        if (!strcmp(a, "--router"))
            router = v;
        else if (!strcmp(a, "--prompts"))
            prompts_path = v;
        else if (!strcmp(a, "--outputs"))
            outputs = v;
        else if (!strcmp(a, "--stop-file"))
            stop_file = v;
        else if (!strcmp(a, "--concurrency"))
            conc = atoi(v);
        else if (!strcmp(a, "--timeout-ms"))
            timeout_ms = atoi(v);
        else if (!strcmp(a, "--min"))
            min_reqs = atol(v);
        else if (!strcmp(a, "--max"))
            max_reqs = atol(v);
        else {
            fprintf(stderr, "%s: unknown option %s\n", argv[0], a);
            return 2;
        }
        i++;
    }
    if (!router || !prompts_path || !outputs || conc < 1 || conc > MAX_CONC) {
        fprintf(stderr,
                "usage: %s --router EP --prompts FILE --outputs FILE [--concurrency "
                "1..64] [--timeout-ms MS] [--min N] [--max N] [--stop-file PATH]\n",
                argv[0]);
        return 2;
    }
    struct prompt *ps = NULL;
    size_t np = load_prompts(prompts_path, &ps);
    FILE *out = fopen(outputs, "w");
    if (!np || !out) {
        fprintf(stderr, "%s: no prompts in %s or cannot write %s\n", argv[0], prompts_path,
                outputs);
        return 1;
    }
    kvr_client_t *c = NULL;
    if (kvr_client_connect(router, &c) != KVR_OK) {
        fprintf(stderr, "%s: connect %s: %s\n", argv[0], router, c ? kvr_client_error(c) : "");
        return 1;
    }
    struct slot slots[MAX_CONC] = {0};
    uint64_t sent = 0, done = 0, ok = 0, failed = 0, hung = 0, t_base = kvr_now_ns();
    int open = 0;
    for (;;) {
        struct stat sb;
        bool stopping = (long)sent >= max_reqs ||
                        ((long)sent >= min_reqs && stop_file && stat(stop_file, &sb) == 0);
        for (int i = 0; i < conc && !stopping; i++) {
            struct slot *sl = &slots[i];
            if (sl->s)
                continue;
            const struct prompt *p = &ps[sent % np];
            struct kvr_gen_params gp;
            kvr_gen_params_default(&gp);
            gp.token_ids = p->tokens;
            gp.n_token_ids = p->n;
            gp.max_tokens = p->max_tokens;
            gp.temperature = 0;
            gp.no_text = true;
            if (kvr_client_generate_start(c, &gp, &sl->s) != KVR_OK) {
                sl->s = NULL;
                break; /* the send queue is full: later */
            }
            sl->p = p;
            sl->seq = sent++;
            sl->t0 = kvr_now_ns();
            sl->n_out = 0;
            free(sl->out);
            free(sl->lp);
            sl->out = calloc(p->max_tokens + 1, sizeof *sl->out);
            sl->lp = calloc(p->max_tokens + 1, sizeof *sl->lp);
            if (!sl->out || !sl->lp) {
                fprintf(stderr, "kvr-chaos-client: out of memory for request %" PRIu64 "\n",
                        sl->seq);
                exit(2);
            }
            open++;
        }
        if (stopping && open == 0)
            break;
        (void)kvr_client_wait(c, 20);
        uint64_t now = kvr_now_ns();
        for (int i = 0; i < conc; i++) {
            struct slot *sl = &slots[i];
            if (!sl->s)
                continue;
            struct kvr_gen_token tok;
            kvr_status_t s;
            while ((s = kvr_gen_stream_next(sl->s, 0, &tok)) == KVR_OK)
                if (sl->n_out <= sl->p->max_tokens) {
                    sl->lp[sl->n_out] = tok.logprob;
                    sl->out[sl->n_out++] = tok.token_id;
                }
            bool is_hung = s != KVR_ERR_CLOSED && now - sl->t0 > (uint64_t)timeout_ms * 1000000ull;
            if (s != KVR_ERR_CLOSED && !is_hung)
                continue;
            const struct kvr_gen_result *r = kvr_gen_stream_result(sl->s);
            struct kvr_gen_result empty = {0};
            write_result(out, sl, r ? r : &empty, is_hung, t_base);
            hung += is_hung;
            ok += !is_hung && r && r->status == KVR_OK;
            failed += !is_hung && (!r || r->status != KVR_OK);
            done++;
            kvr_gen_stream_destroy(sl->s);
            sl->s = NULL;
            open--;
        }
    }
    fclose(out);
    kvr_client_close(c);
    printf("requests %" PRIu64 ": completed %" PRIu64 ", failed %" PRIu64 ", hung %" PRIu64 "\n",
           done, ok, failed, hung);
    for (int i = 0; i < MAX_CONC; i++) {
        free(slots[i].out);
        free(slots[i].lp);
    }
    for (size_t i = 0; i < np; i++)
        free(ps[i].tokens);
    free(ps);
    return done == sent ? 0 : 1;
}
