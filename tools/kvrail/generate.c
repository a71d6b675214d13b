/*
 * generate.c - `kvrail generate`: one request through the router, printed
 * as it streams.
 *
 *   kvrail generate [--router ENDPOINT] [--config FILE] [--max-tokens N]
 *                   [--temperature T] [--top-p P] [--top-k K] [--seed S]
 *                   [--ignore-eos] [--timeout MS] [--json] [--stats]
 *                   (PROMPT | --chat MESSAGES.json | --message role:content ...)
 *                   [--chat-template NAME] [--model DIR]
 *
 * The router endpoint comes from --router, else the cluster file's
 * router.client (--config, or $KVRAIL_CONFIG), else tcp://127.0.0.1:7700.
 * --json prints the same lines as `kvrail run --json`: {"prompt_tokens":
 * [...]} first, then {"token_id": N, "text": "...", "logprob": X} per token.
 * --stats prints the request's usage (cached tokens, nodes, KV bytes moved,
 * TTFT) on stderr.  Exit status 0 on success, 1 with the router's error.
 * --chat / --message render the model's chat template (chat_prompt.c; the
 * model directory from --model, else the cluster file's model), print it
 * ({"chat_prompt": ...} with --json), and send its tokens (encoded here
 * without special tokens: the template writes bos) instead of text.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_prompt.h"
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

struct gen_out {
    bool json;
    bool first;
};

static int on_token(void *arg, const struct kvr_gen_token *t)
{
    struct gen_out *o = arg;
    if (o->json) {
        if (o->first) {
            printf("{\"prompt_tokens\": [");
            for (size_t i = 0; i < t->n_prompt_token_ids; i++)
                printf("%s%u", i ? ", " : "", t->prompt_token_ids[i]);
            printf("]}\n");
        }
        printf("{\"token_id\": %u, \"text\": ", t->token_id);
        kvr_json_fput_str(stdout, t->text, t->text_len);
        printf(", \"logprob\": %.6f}\n", (double)t->logprob);
    } else {
        fwrite(t->text, 1, t->text_len, stdout);
    }
    o->first = false;
    fflush(stdout);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvrail generate [--router ENDPOINT] [--config FILE] [--max-tokens N]\n"
            "                       [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
            "                       [--ignore-eos] [--timeout MS] [--json] [--stats]\n"
            "                       (PROMPT | --chat MESSAGES.json | --message role:content ...)\n"
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
    bool stats = false;
    struct gen_out o = {.json = false, .first = true};
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
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    bool want_chat = kvr_chat_prompt_wanted(&chat);
    if (optind + (want_chat ? 0 : 1) != argc) {
        usage(stderr);
        return 2;
    }
    uint32_t *chat_ids = NULL;
    if (want_chat) {
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
    struct kvr_gen_result res;
    st = kvr_client_generate(cl, &p, on_token, &o, timeout_ms, &res);
    if (!o.json)
        printf("\n");
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
