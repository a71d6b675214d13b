/*
 * generate.c - `kvrail generate`: one request through the router, printed
 * as it streams.
 *
 *   kvrail generate [--router ENDPOINT] [--config FILE] [--max-tokens N]
 *                   [--temperature T] [--top-p P] [--top-k K] [--seed S]
 *                   [--ignore-eos] [--timeout MS] [--json] [--stats]
 *                   [--stop TEXT]... [--repetition-penalty R] [--n N] [--no-stream]
 *                   [--usage] [--min-p P] [--presence-penalty X] [--frequency-penalty X]
 *                   [--logit-bias ID:BIAS,...] [--logprobs N]
 *                   (PROMPT | --prompt-tokens ID,ID,... | --chat MESSAGES.json |
 *                    --message role:content ...)
 *                   [--chat-template NAME] [--model DIR]
 *
 * The router endpoint comes from --router, else the cluster file's
 * router.client (--config, or $KVRAIL_CONFIG), else tcp://127.0.0.1:7700.
 * --json prints the same lines as `kvrail run --json`: {"prompt_tokens":
 * [...]} first, then {"token_id": N, "text": "...", "logprob": X} per token
 * (with "top_logprobs": [{"token_id", "logprob"}, ...] under --logprobs N),
 * and last {"finish_reason": ..., "usage": {"prompt_tokens",
 * "completion_tokens", "cached_tokens"}} (gen_output.h).
 * --stats prints the request's usage (cached tokens, nodes, KV bytes moved,
 * TTFT) on stderr.  Exit status 0 on success, 1 with the router's error.
 * --chat / --message render the model's chat template (chat_prompt.c; the
 * model directory from --model, else the cluster file's model), print it
 * ({"chat_prompt": ...} with --json), and send its tokens (encoded here
 * without special tokens: the template writes bos) instead of text.
 * --stop TEXT (up to 16) ends generation at that text, which is not
 * printed, nor what follows it (text that may still become a stop string
 * is held back until it cannot; --json token lines too, their text cut at
 * the stop); --prompt-tokens sends token ids instead of text.  --n N runs N
 * requests of the same prompt at once (seed, when given, is seed + i for
 * choice i); with --json every token line then carries "index", and
 * without it each choice is printed whole at the end as "[i] text".
 * --no-stream prints the text once at the end.  The finish/usage line
 * ends --json output (one per choice, with "index", when --n > 1); --usage
 * prints it on stderr in text mode too.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_prompt.h"
#include "gen_output.h"
#include "kvr_client.h"
#include "kvr_cluster.h"
#include "kvr_cmd.h"
#include "kvr_json.h"
#include "kvr_tokenizer.h"

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:7700"

const char *kvr_cmd_router_endpoint(const char *router, const char *config, char *buf, size_t cap)
{
    if (router)
        return router;
    if (!config)
        config = getenv("KVRAIL_CONFIG");
    if (config) {
        kvr_cluster_t *cl = NULL;
        char err[512];
        if (kvr_cluster_load(config, &cl, err, sizeof(err)) != KVR_OK) {
            fprintf(stderr, "kvrail: %s\n", err);
            return NULL;
        }
        snprintf(buf, cap, "%s", cl->client_endpoint);
        kvr_cluster_free(cl);
        return buf;
    }
    return DEFAULT_ENDPOINT;
}

#define GEN_MAX_N    16
#define GEN_MAX_STOP 16

/* a --json token line held back while its text may still be cut by a stop */
struct ptok {
    uint32_t id;
    float logprob;
    size_t off, len; /* its text in stop.text */
    size_t n_top;
    uint32_t top_ids[KVR_GEN_MAX_TOP];
    float top_lps[KVR_GEN_MAX_TOP];
};

struct gen_out {
    bool json;
    bool first;
    bool buffer; /* text mode: keep the text, print it at the end */
    int index;   /* choice, printed with --json when n > 1; -1 = not printed */
    char *text;  /* buffered text */
    size_t n_text, cap_text;
    bool use_stop; /* --stop given: text goes through the cut */
    struct kvr_cli_stop stop;
    size_t printed; /* text mode: bytes of stop.text already out */
    struct ptok *q; /* --json: lines held back */
    size_t nq, capq, qhead;
};

static void buf_text(struct gen_out *o, const char *t, size_t n)
{
    if (o->n_text + n + 1 > o->cap_text) {
        size_t cap = (o->cap_text + n + 1) * 2;
        char *p = realloc(o->text, cap);
        if (!p)
            return; /* the text is cut; generation goes on */
        o->text = p;
        o->cap_text = cap;
    }
    memcpy(o->text + o->n_text, t, n);
    o->n_text += n;
    o->text[o->n_text] = 0;
}

static void put_line(const struct gen_out *o, uint32_t id, const char *text, size_t len,
                     float logprob, size_t n_top, const uint32_t *top_ids, const float *top_lps)
{
    if (o->index >= 0)
        printf("{\"index\": %d, \"token_id\": %u, \"text\": ", o->index, id);
    else
        printf("{\"token_id\": %u, \"text\": ", id);
    kvr_json_fput_str(stdout, text, len);
    printf(", \"logprob\": " KVR_CLI_LOGPROB_FMT, (double)logprob);
    kvr_cli_put_top(stdout, n_top, top_ids, top_lps);
    printf("}\n");
}

static void put_text(struct gen_out *o, const char *t, size_t n)
{
    if (o->buffer)
        buf_text(o, t, n);
    else
        fwrite(t, 1, n, stdout);
}

/* With --stop: prints what the cut has released (end: everything left). */
static void release(struct gen_out *o, bool end)
{
    struct kvr_cli_stop *s = &o->stop;
    if (end)
        kvr_cli_stop_end(s);
    if (!o->json) {
        if (s->released > o->printed)
            put_text(o, s->text + o->printed, s->released - o->printed);
        o->printed = s->released;
        return;
    }
    while (o->qhead < o->nq) {
        const struct ptok *p = &o->q[o->qhead];
        if (s->hit && p->off >= s->len && p->len)
            break; /* its text is past the stop: not returned, as OpenAI does */
        if (!s->hit && p->off + p->len > s->released)
            break; /* may still be cut */
        size_t len = p->off + p->len > s->len ? s->len - p->off : p->len;
        put_line(o, p->id, s->text + p->off, len, p->logprob, p->n_top, p->top_ids, p->top_lps);
        o->qhead++;
    }
    if (s->hit || end)
        o->qhead = o->nq; /* nothing after the stop */
}

static int on_token(void *arg, const struct kvr_gen_token *t)
{
    struct gen_out *o = arg;
    if (o->json && o->first && (o->index < 0 || t->n_prompt_token_ids)) {
        printf("{\"prompt_tokens\": [");
        for (size_t i = 0; i < t->n_prompt_token_ids; i++)
            printf("%s%u", i ? ", " : "", t->prompt_token_ids[i]);
        printf("]}\n");
    }
    o->first = false;
    if (!o->use_stop) {
        if (o->json)
            put_line(o, t->token_id, t->text, t->text_len, t->logprob, t->n_top, t->top_ids,
                     t->top_logprobs);
        else
            put_text(o, t->text, t->text_len);
        fflush(stdout);
        return 0;
    }
    if (o->stop.hit)
        return 0; /* past the stop (the router ends the stream on this token) */
    if (o->json) {
        if (o->nq == o->capq) {
            size_t cap = o->capq ? 2 * o->capq : 64;
            struct ptok *q = realloc(o->q, cap * sizeof(*q));
            if (!q) {
                fprintf(stderr, "kvrail generate: out of memory holding back token lines\n");
                return 1; /* cancels the request */
            }
            o->q = q;
            o->capq = cap;
        }
        struct ptok *p = &o->q[o->nq++];
        p->id = t->token_id;
        p->logprob = t->logprob;
        p->off = o->stop.len;
        p->len = t->text_len;
        p->n_top = t->n_top;
        memcpy(p->top_ids, t->top_ids, t->n_top * sizeof(p->top_ids[0]));
        memcpy(p->top_lps, t->top_logprobs, t->n_top * sizeof(p->top_lps[0]));
    }
    kvr_cli_stop_feed(&o->stop, t->text, t->text_len);
    release(o, false);
    fflush(stdout);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvrail generate [--router ENDPOINT] [--config FILE] [--max-tokens N]\n"
            "                       [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
            "                       [--ignore-eos] [--timeout MS] [--json] [--stats]\n"
            "                       [--stop TEXT]... [--repetition-penalty R] [--n N]\n"
            "                       [--no-stream] [--usage] [--min-p P]\n"
            "                       [--presence-penalty X] [--frequency-penalty X]\n"
            "                       [--logit-bias ID:BIAS,...] [--logprobs N]\n"
            "                       (PROMPT | --prompt-tokens ID,ID,... | --chat MESSAGES.json |\n"
            "                        --message role:content ...)\n"
            "                       [--chat-template NAME] [--model DIR]\n");
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kvrail generate: %s '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* the chat prompt's token ids (the template rendered, then encoded without
 * special tokens); prints the rendered text first */
static int chat_tokens(const struct kvr_chat_prompt_opts *chat, const char *model,
                       const char *config, bool json, uint32_t **ids_p, size_t *n_p)
{
    char dir[4096], err[1024];
    if (!model) {
        if (!config)
            config = getenv("KVRAIL_CONFIG");
        kvr_cluster_t *cl = NULL;
        if (!config || kvr_cluster_load(config, &cl, err, sizeof(err)) != KVR_OK) {
            fprintf(stderr,
                    "kvrail generate: --chat needs the model's tokenizer_config.json: "
                    "give --model DIR, or a cluster file (--config, $KVRAIL_CONFIG)%s%s\n",
                    config ? ": " : "", config ? err : "");
            return -1;
        }
        snprintf(dir, sizeof(dir), "%s", cl->model_dir);
        kvr_cluster_free(cl);
        model = dir;
    }
    char *text = NULL;
    if (kvr_chat_prompt_render("kvrail generate", model, chat, &text) != 0)
        return -1;
    if (json) {
        printf("{\"chat_prompt\": ");
        kvr_json_fput_str(stdout, text, strlen(text));
        printf("}\n");
    } else {
        fputs(text, stdout);
    }
    kvr_tokenizer_t *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = -1;
    if (kvr_tokenizer_load(model, &tok, err, sizeof(err)) != KVR_OK)
        fprintf(stderr, "kvrail generate: tokenizer: %s\n", err);
    else if (kvr_tokenizer_encode(tok, text, strlen(text), false, &ids, &n) != KVR_OK || !n)
        fprintf(stderr, "kvrail generate: the chat prompt encodes to no tokens\n");
    else if ((*ids_p = malloc(n * sizeof(uint32_t)))) {
        for (size_t i = 0; i < n; i++)
            (*ids_p)[i] = (uint32_t)ids[i];
        *n_p = n;
        rc = 0;
    }
    free(ids);
    free(text);
    kvr_tokenizer_destroy(tok);
    return rc;
}

/* "1,2, 3" -> ids; every id a decimal < 2^32, at least one */
static int parse_ids(const char *s, uint32_t **ids_p, size_t *n_p)
{
    size_t cap = 1;
    for (const char *q = s; *q; q++)
        cap += *q == ',';
    uint32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    size_t n = 0;
    const char *q = s;
    for (;;) {
        while (*q == ' ')
            q++;
        char *end;
        unsigned long long v = strtoull(q, &end, 10);
        if (end == q || v > 0xffffffffull || *q == '-') {
            fprintf(stderr,
                    "kvrail generate: --prompt-tokens '%s': want token ids separated by commas "
                    "(e.g. 1,15043,3186)\n",
                    s);
            free(ids);
            return -1;
        }
        ids[n++] = (uint32_t)v;
        q = end;
        while (*q == ' ')
            q++;
        if (!*q)
            break;
        if (*q++ != ',') {
            fprintf(stderr, "kvrail generate: --prompt-tokens '%s': unexpected '%c'\n", s, q[-1]);
            free(ids);
            return -1;
        }
    }
    *ids_p = ids;
    *n_p = n;
    return 0;
}

static const char *finish_name(enum kvr_finish f)
{
    switch (f) {
    case KVR_FINISH_LENGTH:
        return "length";
    case KVR_FINISH_STOP:
        return "stop";
    case KVR_FINISH_CANCELED:
        return "canceled";
    case KVR_FINISH_ERROR:
        return "error";
    default:
        return "none";
    }
}

static void print_usage_line(FILE *f, int index, const struct kvr_gen_result *r)
{
    kvr_cli_put_usage(f, index, finish_name(r->finish), r->prompt_tokens, r->completion_tokens,
                      r->cached_tokens);
}

/* n streams of one prompt at once on one client; every token is handed to
 * its choice's gen_out as it arrives.  res[i] gets each result.  Returns
 * KVR_OK when every choice ended ok, else the first failure. */
static kvr_status_t run_many(kvr_client_t *cl, const struct kvr_gen_params *p, int n,
                             struct gen_out *o, int timeout_ms, struct kvr_gen_result *res)
{
    kvr_gen_stream_t *ss[GEN_MAX_N] = {0};
    bool open[GEN_MAX_N] = {0};
    kvr_status_t first_err = KVR_OK;
    int n_open = 0;
    for (int i = 0; i < n; i++) {
        struct kvr_gen_params pi = *p;
        if (p->has_seed)
            pi.seed = p->seed + (uint64_t)i;
        pi.return_prompt_tokens = p->return_prompt_tokens && i == 0;
        memset(&res[i], 0, sizeof res[i]);
        kvr_status_t st = kvr_client_generate_start(cl, &pi, &ss[i]);
        if (st != KVR_OK) {
            res[i].status = st;
            snprintf(res[i].message, sizeof res[i].message, "cannot start choice %d: %s", i,
                     kvr_client_error(cl));
            if (first_err == KVR_OK)
                first_err = st;
            continue;
        }
        open[i] = true;
        n_open++;
    }
    int waited = 0;
    while (n_open > 0) {
        if (waited >= timeout_ms) {
            for (int i = 0; i < n; i++)
                if (open[i]) {
                    res[i].status = KVR_ERR_TIMEOUT;
                    snprintf(res[i].message, sizeof res[i].message,
                             "no end within --timeout %d ms (canceled)", timeout_ms);
                    if (first_err == KVR_OK)
                        first_err = KVR_ERR_TIMEOUT;
                }
            break;
        }
        if (kvr_client_wait(cl, 100) == KVR_ERR_TIMEOUT)
            waited += 100;
        for (int i = 0; i < n; i++) {
            if (!open[i])
                continue;
            struct kvr_gen_token t;
            kvr_status_t st;
            while ((st = kvr_gen_stream_next(ss[i], 0, &t)) == KVR_OK)
                on_token(&o[i], &t);
            if (st == KVR_ERR_CLOSED) {
                res[i] = *kvr_gen_stream_result(ss[i]);
                if (res[i].status != KVR_OK && first_err == KVR_OK)
                    first_err = res[i].status;
                open[i] = false;
                n_open--;
            }
        }
    }
    for (int i = 0; i < n; i++)
        kvr_gen_stream_destroy(ss[i]); /* cancels what is still open */
    return first_err;
}

int kvr_cmd_generate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"router", required_argument, NULL, 'r'},
        {"config", required_argument, NULL, 'c'},
        {"max-tokens", required_argument, NULL, 'n'},
        {"temperature", required_argument, NULL, 't'},
        {"top-p", required_argument, NULL, 'p'},
        {"top-k", required_argument, NULL, 'k'},
        {"seed", required_argument, NULL, 's'},
        {"ignore-eos", no_argument, NULL, 'e'},
        {"timeout", required_argument, NULL, 'T'},
        {"json", no_argument, NULL, 'j'},
        {"stats", no_argument, NULL, 'S'},
        {"chat", required_argument, NULL, 'C'},
        {"message", required_argument, NULL, 'M'},
        {"chat-template", required_argument, NULL, 'N'},
        {"model", required_argument, NULL, 'm'},
        {"stop", required_argument, NULL, 'x'},
        {"prompt-tokens", required_argument, NULL, 'P'},
        {"repetition-penalty", required_argument, NULL, 'R'},
        {"n", required_argument, NULL, 'i'},
        {"no-stream", no_argument, NULL, 'B'},
        {"usage", no_argument, NULL, 'U'},
        {"min-p", required_argument, NULL, 256},
        {"presence-penalty", required_argument, NULL, 257},
        {"frequency-penalty", required_argument, NULL, 258},
        {"logit-bias", required_argument, NULL, 259},
        {"logprobs", required_argument, NULL, 260},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *router = NULL, *config = NULL, *model = NULL;
    static struct kvr_chat_prompt_opts chat;
    memset(&chat, 0, sizeof(chat));
    struct kvr_gen_params p;
    kvr_gen_params_default(&p);
    p.max_tokens = 64;
    double v;
    int timeout_ms = 300000;
    bool stats = false, no_stream = false, want_usage = false;
    struct gen_out o = {.json = false, .first = true, .index = -1};
    const char *stops[GEN_MAX_STOP];
    size_t n_stops = 0;
    const char *prompt_tokens = NULL;
    int n_choices = 1;
    static struct kvr_cli_logit_bias lb;
    static struct kvr_gen_logit_bias glb[KVR_CLI_MAX_LOGIT_BIAS];
    lb.n = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:c:n:t:p:k:s:eT:jSh", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            router = optarg;
            break;
        case 'c':
            config = optarg;
            break;
        case 'n':
            if (parse_num("--max-tokens", optarg, 0, 4294967295.0, &v))
                return 2;
            p.max_tokens = (uint32_t)v;
            break;
        case 't':
            if (parse_num("--temperature", optarg, -1e9, 1e9, &v))
                return 2;
            p.temperature = (float)v;
            break;
        case 'p':
            if (parse_num("--top-p", optarg, -1e9, 1e9, &v))
                return 2;
            p.top_p = (float)v;
            break;
        case 'k':
            if (parse_num("--top-k", optarg, 0, 4294967295.0, &v))
                return 2;
            p.top_k = (uint32_t)v;
            break;
        case 's':
            p.seed = strtoull(optarg, NULL, 0);
            p.has_seed = true;
            break;
        case 'e':
            p.ignore_eos = true;
            break;
        case 'T':
            if (parse_num("--timeout", optarg, 1, 86400000, &v))
                return 2;
            timeout_ms = (int)v;
            break;
        case 'j':
            o.json = true;
            break;
        case 'S':
            stats = true;
            break;
        case 'C':
            chat.file = optarg;
            break;
        case 'N':
            chat.template_name = optarg;
            break;
        case 'm':
            model = optarg;
            break;
        case 'M':
            if (chat.n_messages == KVR_CHAT_MAX_MESSAGES) {
                fprintf(stderr, "kvrail generate: more than %d --message options\n",
                        KVR_CHAT_MAX_MESSAGES);
                return 2;
            }
            chat.messages[chat.n_messages++] = optarg;
            break;
        case 'x':
            if (n_stops == GEN_MAX_STOP) {
                fprintf(stderr, "kvrail generate: more than %d --stop options\n", GEN_MAX_STOP);
                return 2;
            }
            if (!*optarg) {
                fprintf(stderr, "kvrail generate: --stop '' : a stop text cannot be empty\n");
                return 2;
            }
            stops[n_stops++] = optarg;
            break;
        case 'P':
            prompt_tokens = optarg;
            break;
        case 'R':
            if (parse_num("--repetition-penalty", optarg, 0.01, 100, &v))
                return 2;
            p.repetition_penalty = (float)v;
            break;
        case 'i':
            if (parse_num("--n", optarg, 1, GEN_MAX_N, &v))
                return 2;
            if (v != (int)v) {
                fprintf(stderr, "kvrail generate: --n wants a whole number of choices, 1..%d\n",
                        GEN_MAX_N);
                return 2;
            }
            n_choices = (int)v;
            break;
        case 'B':
            no_stream = true;
            break;
        case 'U':
            want_usage = true;
            break;
        case 256:
            if (parse_num("--min-p", optarg, 0, 1, &v))
                return 2;
            p.min_p = (float)v;
            break;
        case 257:
        case 258:
            if (parse_num(c == 257 ? "--presence-penalty" : "--frequency-penalty", optarg, -2, 2,
                          &v))
                return 2;
            if (c == 257)
                p.presence_penalty = (float)v;
            else
                p.frequency_penalty = (float)v;
            break;
        case 259:
            if (kvr_cli_logit_bias_parse("kvrail generate", optarg, &lb) != 0)
                return 2;
            break;
        case 260:
            if (parse_num("--logprobs", optarg, 0, KVR_GEN_MAX_TOP, &v))
                return 2;
            p.top_logprobs = (uint32_t)v;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    bool want_chat = kvr_chat_prompt_wanted(&chat);
    if (want_chat && prompt_tokens) {
        fprintf(stderr,
                "kvrail generate: --prompt-tokens and --chat/--message exclude each other\n");
        return 2;
    }
    if (optind + (want_chat || prompt_tokens ? 0 : 1) != argc) {
        usage(stderr);
        return 2;
    }
    p.stop = stops;
    p.n_stop = n_stops;
    for (size_t i = 0; i < lb.n; i++)
        glb[i] = (struct kvr_gen_logit_bias){lb.ids[i], lb.bias[i]};
    p.logit_bias = glb;
    p.n_logit_bias = lb.n;
    o.use_stop = n_stops > 0;
    o.stop.stops = stops;
    o.stop.n_stops = n_stops;
    uint32_t *chat_ids = NULL;
    if (prompt_tokens) {
        if (parse_ids(prompt_tokens, &chat_ids, &p.n_token_ids) != 0)
            return 2;
        p.token_ids = chat_ids;
    } else if (want_chat) {
        if (chat_tokens(&chat, model, config, o.json, &chat_ids, &p.n_token_ids) != 0)
            return 1;
        p.token_ids = chat_ids;
    } else {
        p.prompt = argv[optind];
    }
    p.return_prompt_tokens = o.json;
    char buf[512];
    const char *ep = kvr_cmd_router_endpoint(router, config, buf, sizeof(buf));
    if (!ep) {
        free(chat_ids);
        return 1;
    }
    kvr_client_t *cl = NULL;
    kvr_status_t st = kvr_client_connect(ep, &cl);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrail generate: cannot connect to %s: %s\n", ep, kvr_status_str(st));
        free(chat_ids);
        return 1;
    }
    /* a router that is not there is an error now, not after --timeout */
    if ((st = kvr_client_ping(cl, timeout_ms < 5000 ? timeout_ms : 5000)) != KVR_OK) {
        fprintf(stderr, "kvrail generate: the router at %s does not answer: %s\n", ep,
                kvr_client_error(cl));
        kvr_client_close(cl);
        free(chat_ids);
        return 1;
    }
    struct kvr_gen_result res, many[GEN_MAX_N];
    struct gen_out outs[GEN_MAX_N];
    if (n_choices == 1) {
        o.buffer = no_stream;
        st = kvr_client_generate(cl, &p, on_token, &o, timeout_ms, &res);
        many[0] = res;
        if (o.use_stop)
            release(&o, true);
        if (o.buffer && o.text)
            fputs(o.text, stdout);
        free(o.text);
        free(o.q);
        kvr_cli_stop_free(&o.stop);
    } else {
        for (int i = 0; i < n_choices; i++) {
            outs[i] = o;
            outs[i].index = i;
            outs[i].buffer = true; /* text mode: each choice whole at the end */
        }
        st = run_many(cl, &p, n_choices, outs, timeout_ms, many);
        res = many[0];
        for (int i = 0; i < n_choices; i++) {
            if (outs[i].use_stop)
                release(&outs[i], true);
            if (!o.json)
                printf("%s[%d] %s", i ? "\n" : "", i, outs[i].text ? outs[i].text : "");
            free(outs[i].text);
            free(outs[i].q);
            kvr_cli_stop_free(&outs[i].stop);
            if (many[i].status != KVR_OK && st != KVR_OK && res.status == KVR_OK)
                res = many[i];
        }
    }
    if (!o.json)
        printf("\n");
    if ((o.json || want_usage) && st == KVR_OK)
        for (int i = 0; i < n_choices; i++)
            print_usage_line(o.json ? stdout : stderr, n_choices > 1 ? i : -1, &many[i]);
    if (stats || (st != KVR_OK))
        fflush(stdout);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrail generate: %s: %s\n", kvr_status_name(st), res.message);
        kvr_client_close(cl);
        free(chat_ids);
        return 1;
    }
    if (stats)
        fprintf(stderr,
                "kvrail generate: request %" PRIu64 ": %u prompt tokens (%u cached), %u generated, "
                "prefill %s%s, decode %s, KV moved %" PRIu64 " bytes, TTFT %.1f ms, total %.1f ms, "
                "router overhead %.1f us\n",
                res.request_id, res.prompt_tokens, res.cached_tokens, res.completion_tokens,
                res.local_prefill ? "local on " : "",
                res.local_prefill ? res.decode_node : res.prefill_node, res.decode_node,
                res.kv_bytes_moved, (double)res.ttft_us / 1000.0, (double)res.total_us / 1000.0,
                (double)res.router_overhead_ns / 1000.0);
    kvr_client_close(cl);
    free(chat_ids);
    return 0;
}
