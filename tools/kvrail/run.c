/*
 * run.c - `kvrail run`: single-process generation, the reference the
 * cluster's output is held against.
 *
 * Loads the model (and its tokenizer), allocates a small paged KV pool for
 * one sequence, prefills the prompt, then decodes one token at a time with
 * the same engine calls the prefill and decode nodes make, sampling with the
 * shared sampler (temperature 0 = greedy).  Generation stops after
 * --max-tokens tokens or at an end-of-sequence id (the tokenizer's and the
 * model's eos ids) unless --ignore-eos.  A --prompt is encoded with the
 * tokenizer's special-token rule (bos when its config says so);
 * --prompt-tokens are used as given; --chat FILE / --message role:content
 * render the model's chat template (chat_prompt.c), whose text is encoded
 * without special tokens (the template writes bos).
 *
 * --json prints one JSON object per line: {"prompt_tokens": [...]}, then one
 * per generated token {"token_id": N, "text": "...", "logprob": X} where
 * text is the incremental detokenizer's output for that token (never half a
 * UTF-8 character; what it still holds at the end goes to the last token),
 * with "top_logprobs": [{"token_id", "logprob"}, ...] under --logprobs N,
 * then {"finish_reason": "stop"|"length", "usage": {...}}: the lines of
 * `kvrail generate --json` (gen_output.h).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_prompt.h"
#include "gen_output.h"
#include "kvr_clock.h"
#include "kvr_cmd.h"
#include "kvr_engine.h"
#include "kvr_json.h"
#include "kvr_log.h"
#include "kvr_sample.h"
#include "kvr_tokenizer.h"
#include "run_device.h"

#define RUN_BLOCK_SIZE 16

struct run_opts {
    const char *model, *prompt, *prompt_tokens;
    int max_tokens, threads;
    int device;       /* -1 cpu, else cuda:N (--device) */
    int32_t kv_dtype; /* enum kvr_kv_dtype */
    int32_t numerics; /* enum kvr_numerics */
    bool json, ignore_eos, stats;
    int top_n; /* --logprobs N */
    struct kvr_sample_params sp;
    struct kvr_chat_prompt_opts chat;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrail run --model DIR (--prompt TEXT | --prompt-tokens 1,2,3 |\n"
               "                  --chat MESSAGES.json | --message role:content ...)\n"
               "                  --max-tokens N [--temperature T] [--top-p P] [--top-k K]\n"
               "                  [--min-p P] [--repetition-penalty R] [--seed S] [--json]\n"
               "                  [--ignore-eos] [--threads N] [--stats] [--chat-template NAME]\n"
               "                  [--presence-penalty X] [--frequency-penalty X]\n"
               "                  [--logit-bias ID:BIAS,...] [--logprobs N]\n"
               "                  [--kv-dtype f32|bf16|f16] [--numerics f32|bf16dot]\n"
               "                  [--device cpu|cuda:N]\n"
               "Generates in one process (no cluster); temperature 0 (default) is greedy.\n"
               "--kv-dtype: the KV cache's element type (default f32), as a cluster file's\n"
               "kv_dtype: the same output as a cluster with that kv_dtype.\n"
               "--numerics: the engine's numerics mode (default f32), as a cluster file's\n"
               "numerics (bf16dot: bf16 weights on AVX512-BF16; refused on a CPU without it).\n"
               "--device cuda:N runs on that GPU (a CUDA build; refused when there is none).\n"
               "--chat / --message render the model's chat template (tokenizer_config.json)\n"
               "with add_generation_prompt; --json then prints it as {\"chat_prompt\": ...}.\n");
}

static int parse_tokens(const char *s, int32_t **ids_p, size_t *n_p)
{
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    if (!ids)
        return -1;
    const char *p = s;
    while (*p) {
        char *e;
        errno = 0;
        long v = strtol(p, &e, 10);
        if (e == p || errno || v < 0 || v > INT32_MAX || (*e && *e != ',')) {
            fprintf(stderr,
                    "kvrail run: --prompt-tokens: '%s' is not a comma-separated list of "
                    "token ids\n",
                    s);
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *ni = realloc(ids, cap * sizeof(*ids));
            if (!ni) {
                free(ids);
                return -1;
            }
            ids = ni;
        }
        ids[n++] = (int32_t)v;
        p = *e ? e + 1 : e;
    }
    if (n == 0) {
        fprintf(stderr, "kvrail run: --prompt-tokens is empty\n");
        free(ids);
        return -1;
    }
    *ids_p = ids;
    *n_p = n;
    return 0;
}

static int parse_num(const char *flag, const char *s, double *out)
{
    char *e;
    errno = 0;
    double v = strtod(s, &e);
    if (e == s || *e || errno || !isfinite(v)) {
        fprintf(stderr, "kvrail run: %s: '%s' is not a number\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

struct pending {
    bool have;
    int32_t id;
    float logprob;
    char *text;
    size_t len, cap;
    size_t n_top;
    uint32_t top_ids[KVR_SAMPLE_MAX_TOP_LOGPROBS];
    float top_lps[KVR_SAMPLE_MAX_TOP_LOGPROBS];
};

static void pending_set(struct pending *p, int32_t id, float lp, const char *t, size_t n)
{
    p->have = true;
    p->id = id;
    p->logprob = lp;
    p->n_top = 0;
    p->len = 0;
    if (n + 1 > p->cap) {
        char *nt = realloc(p->text, n + 64);
        if (!nt)
            return;
        p->text = nt;
        p->cap = n + 64;
    }
    if (n)
        memcpy(p->text, t, n);
    p->len = n;
}

static void pending_append(struct pending *p, const char *t, size_t n)
{
    if (p->len + n + 1 > p->cap) {
        char *nt = realloc(p->text, p->len + n + 64);
        if (!nt)
            return;
        p->text = nt;
        p->cap = p->len + n + 64;
    }
    memcpy(p->text + p->len, t, n);
    p->len += n;
}

static void pending_flush(struct pending *p)
{
    if (!p->have)
        return;
    printf("{\"token_id\": %d, \"text\": ", p->id);
    kvr_json_fput_str(stdout, p->text ? p->text : "", p->len);
    printf(", \"logprob\": " KVR_CLI_LOGPROB_FMT, (double)p->logprob);
    kvr_cli_put_top(stdout, p->n_top, p->top_ids, p->top_lps);
    printf("}\n");
    fflush(stdout);
    p->have = false;
}

int kvr_cmd_run(int argc, char **argv)
{
    struct run_opts o = {.max_tokens = -1, .device = -1};
    kvr_sample_params_default(&o.sp);
    static const struct option lo[] = {{"model", 1, 0, 'm'},
                                       {"prompt", 1, 0, 'p'},
                                       {"prompt-tokens", 1, 0, 'P'},
                                       {"max-tokens", 1, 0, 'n'},
                                       {"temperature", 1, 0, 't'},
                                       {"top-p", 1, 0, 'u'},
                                       {"top-k", 1, 0, 'k'},
                                       {"min-p", 1, 0, 'i'},
                                       {"repetition-penalty", 1, 0, 'r'},
                                       {"seed", 1, 0, 's'},
                                       {"json", 0, 0, 'j'},
                                       {"ignore-eos", 0, 0, 'E'},
                                       {"threads", 1, 0, 'T'},
                                       {"stats", 0, 0, 'S'},
                                       {"chat", 1, 0, 'C'},
                                       {"message", 1, 0, 'M'},
                                       {"chat-template", 1, 0, 'N'},
                                       {"kv-dtype", 1, 0, 'K'},
                                       {"numerics", 1, 0, 260},
                                       {"presence-penalty", 1, 0, 256},
                                       {"frequency-penalty", 1, 0, 257},
                                       {"logit-bias", 1, 0, 258},
                                       {"logprobs", 1, 0, 259},
                                       {"device", 1, 0, 'D'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    static struct kvr_cli_logit_bias lb;
    static struct kvr_logit_bias slb[KVR_CLI_MAX_LOGIT_BIAS];
    lb.n = 0;
    int c;
    double v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            o.model = optarg;
            break;
        case 'p':
            o.prompt = optarg;
            break;
        case 'P':
            o.prompt_tokens = optarg;
            break;
        case 'C':
            o.chat.file = optarg;
            break;
        case 'N':
            o.chat.template_name = optarg;
            break;
        case 'M':
            if (o.chat.n_messages == KVR_CHAT_MAX_MESSAGES) {
                fprintf(stderr, "kvrail run: more than %d --message options\n",
                        KVR_CHAT_MAX_MESSAGES);
                return 2;
            }
            o.chat.messages[o.chat.n_messages++] = optarg;
            break;
        case 'j':
            o.json = true;
            break;
        case 'D':
            if (kvr_run_device_parse(optarg, &o.device) != 0)
                return 2;
            break;
        case 'K':
            if (kvr_kv_dtype_parse(optarg, &o.kv_dtype) != KVR_OK) {
                fprintf(stderr, "kvrail run: --kv-dtype: '%s' is not f32, bf16 or f16\n", optarg);
                return 2;
            }
            break;
        case 260:
            if (kvr_numerics_parse(optarg, &o.numerics) != KVR_OK) {
                fprintf(stderr, "kvrail run: --numerics: '%s' is not f32 or bf16dot\n", optarg);
                return 2;
            }
            break;
        case 'E':
            o.ignore_eos = true;
            break;
        case 'S':
            o.stats = true;
            break;
        case 'n':
        case 'k':
        case 'T':
        case 's': {
            char *e;
            errno = 0;
            unsigned long long u = strtoull(optarg, &e, 10);
            if (e == optarg || *e || errno || optarg[0] == '-' || (c != 's' && u > 1000000000ull)) {
                fprintf(stderr, "kvrail run: %s: '%s' is not a non-negative integer\n",
                        argv[optind - 1], optarg);
                return 2;
            }
            if (c == 'n')
                o.max_tokens = (int)u;
            else if (c == 'k')
                o.sp.top_k = (int32_t)u;
            else if (c == 'T')
                o.threads = (int)u;
            else
                o.sp.seed = u;
            break;
        }
        case 't':
        case 'u':
        case 'i':
        case 'r':
            if (parse_num(argv[optind - 1], optarg, &v))
                return 2;
            if (c == 't')
                o.sp.temperature = (float)v;
            else if (c == 'u')
                o.sp.top_p = (float)v;
            else if (c == 'i')
                o.sp.min_p = (float)v;
            else
                o.sp.repetition_penalty = (float)v;
            break;
        case 256:
        case 257:
            if (parse_num(argv[optind - 1], optarg, &v))
                return 2;
            if (c == 256)
                o.sp.presence_penalty = (float)v;
            else
                o.sp.frequency_penalty = (float)v;
            break;
        case 258:
            if (kvr_cli_logit_bias_parse("kvrail run", optarg, &lb) != 0)
                return 2;
            break;
        case 259:
            if (parse_num(argv[optind - 1], optarg, &v))
                return 2;
            if (v < 0 || v > KVR_SAMPLE_MAX_TOP_LOGPROBS || v != (int)v) {
                fprintf(stderr, "kvrail run: --logprobs: %s is not a whole number in [0, %d]\n",
                        optarg, KVR_SAMPLE_MAX_TOP_LOGPROBS);
                return 2;
            }
            o.top_n = (int)v;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    for (size_t i = 0; i < lb.n; i++)
        slb[i] = (struct kvr_logit_bias){(int32_t)lb.ids[i], lb.bias[i]};
    o.sp.logit_bias = slb;
    o.sp.n_logit_bias = lb.n;
    if (optind < argc) {
        fprintf(stderr, "kvrail run: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    bool chat = kvr_chat_prompt_wanted(&o.chat);
    if (!o.model || (!!o.prompt + !!o.prompt_tokens + chat) != 1 || o.max_tokens < 0) {
        fprintf(stderr, "kvrail run: need --model, exactly one of --prompt / --prompt-tokens / "
                        "--chat / --message, and --max-tokens\n");
        usage(stderr);
        return 2;
    }
    char err[1024];
    if (kvr_sample_params_validate(&o.sp, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail run: %s\n", err);
        return 2;
    }

    int rc = 1;
    kvr_model_t *m = NULL;
    kvr_tokenizer_t *tok = NULL;
    kvr_ctx_t *ctx = NULL;
    kvr_sampler_t *smp = NULL;
    kvr_detok_t *dt = NULL;
    int32_t *prompt = NULL, *bt = NULL;
    char *chat_text = NULL;
    float *logits = NULL;
    struct kvr_kv_pool pool = {0};
    struct pending pend = {0};
    size_t n_prompt = 0;
    kvr_status_t st;
    if ((st = kvr_run_device_open(o.device, err, sizeof(err))) != KVR_OK) {
        fprintf(stderr, "kvrail run: --device: %s\n", err);
        goto out;
    }
    uint64_t t0 = kvr_now_ns();

    if ((st = kvr_model_load(o.model, &m, err, sizeof(err))) != KVR_OK) {
        fprintf(stderr, "kvrail run: %s\n", err);
        goto out;
    }
    st = kvr_tokenizer_load(o.model, &tok, err, sizeof(err));
    if (st != KVR_OK) {
        if (o.prompt || chat) {
            fprintf(stderr, "kvrail run: tokenizer: %s\n", err);
            goto out;
        }
        KVR_LOG_WARN("run", "no tokenizer (%s): token text will be empty", err);
        tok = NULL;
    }
    if (chat) {
        /* the template writes bos itself: encoded without special tokens, as
         * transformers' apply_chat_template(tokenize=True) does */
        if (kvr_chat_prompt_render("kvrail run", o.model, &o.chat, &chat_text) != 0)
            goto out;
        if (o.json) {
            printf("{\"chat_prompt\": ");
            kvr_json_fput_str(stdout, chat_text, strlen(chat_text));
            printf("}\n");
        } else {
            fputs(chat_text, stdout);
        }
    }
    if (o.prompt || chat) {
        const char *text = chat ? chat_text : o.prompt;
        if ((st = kvr_tokenizer_encode(tok, text, strlen(text), !chat, &prompt, &n_prompt)) !=
            KVR_OK) {
            fprintf(stderr, "kvrail run: encoding the prompt: %s\n", kvr_status_str(st));
            goto out;
        }
        if (n_prompt == 0) {
            fprintf(stderr, "kvrail run: the prompt encodes to no tokens\n");
            goto out;
        }
    } else if (parse_tokens(o.prompt_tokens, &prompt, &n_prompt) != 0) {
        goto out;
    }
    const int32_t V = kvr_model_vocab(m), L = kvr_model_n_layers(m);
    for (size_t i = 0; i < n_prompt; i++) {
        if (prompt[i] >= V) {
            fprintf(stderr,
                    "kvrail run: prompt token %d (index %zu) outside the vocabulary of %d\n",
                    prompt[i], i, V);
            goto out;
        }
    }
    size_t total = n_prompt + (size_t)o.max_tokens;
    if (total > (size_t)kvr_model_max_pos(m)) {
        fprintf(stderr,
                "kvrail run: prompt (%zu tokens) + --max-tokens %d exceeds the model's context "
                "of %d\n",
                n_prompt, o.max_tokens, kvr_model_max_pos(m));
        goto out;
    }
    struct kvr_ctx_opts co = {.backend = kvr_run_device_backend(o.device),
                              .n_threads = o.threads,
                              .max_batch = 1,
                              .numerics = o.numerics};
    if ((st = kvr_ctx_create(m, &co, &ctx, err, sizeof(err))) != KVR_OK) {
        fprintf(stderr, "kvrail run: %s\n", err);
        goto out;
    }
    if ((st = kvr_sampler_create(&o.sp, V, &smp, err, sizeof(err))) != KVR_OK) {
        fprintf(stderr, "kvrail run: sampler: %s\n", err);
        goto out;
    }
    kvr_sampler_add_prompt(smp, prompt, n_prompt);
    if (tok && (st = kvr_detok_create(tok, true, &dt)) != KVR_OK) {
        fprintf(stderr, "kvrail run: detokenizer: %s\n", kvr_status_str(st));
        goto out;
    }
    /* the pool: blocks 0..nb-1 of one sequence */
    int32_t nb = (int32_t)((total + RUN_BLOCK_SIZE) / RUN_BLOCK_SIZE);
    kvr_kv_layout_init(m, RUN_BLOCK_SIZE, o.kv_dtype, &pool.layout);
    pool.n_blocks = nb;
    pool.layer_base = calloc((size_t)L, sizeof(*pool.layer_base));
    bt = malloc((size_t)nb * sizeof(*bt));
    logits = malloc((size_t)V * sizeof(float));
    if (!pool.layer_base || !bt || !logits)
        goto err_nomem;
    for (int32_t l = 0; l < L; l++) {
        pool.layer_base[l] = kvr_run_device_slab(o.device, kvr_kv_layer_bytes(&pool.layout, nb));
        if (!pool.layer_base[l])
            goto err_nomem;
    }
    for (int32_t i = 0; i < nb; i++)
        bt[i] = i;
    if (o.json) {
        printf("{\"prompt_tokens\": [");
        for (size_t i = 0; i < n_prompt; i++)
            printf("%s%d", i ? ", " : "", prompt[i]);
        printf("]}\n");
        fflush(stdout);
    }
    const int32_t *eos_m, *eos_t = NULL;
    size_t n_eos_m = kvr_model_eos_ids(m, &eos_m),
           n_eos_t = tok ? kvr_tokenizer_eos_ids(tok, &eos_t) : 0;
    uint64_t t_load = kvr_now_ns();
    struct kvr_prefill_req req = {
        .tokens = prompt, .n_tokens = (int32_t)n_prompt, .block_table = bt, .n_blocks = nb};
    if (o.max_tokens > 0 && (st = kvr_engine_prefill(ctx, &pool, &req, logits)) != KVR_OK) {
        fprintf(stderr, "kvrail run: prefill: %s\n", kvr_status_str(st));
        goto out;
    }
    uint64_t t_prefill = kvr_now_ns();
    int n_gen = 0;
    const char *finish = "length";
    for (int i = 0; i < o.max_tokens; i++) {
        int32_t id;
        float lp;
        if ((st = kvr_sampler_sample(smp, logits, &id, &lp)) != KVR_OK) {
            fprintf(stderr, "kvrail run: sampling: %s\n", kvr_status_str(st));
            goto out;
        }
        n_gen++;
        const char *text = "";
        size_t tlen = 0;
        if (dt && (st = kvr_detok_feed(dt, id, &text, &tlen)) != KVR_OK) {
            text = "";
            tlen = 0;
        }
        if (o.json) {
            pending_flush(&pend);
            pending_set(&pend, id, lp, text, tlen);
            if (o.top_n) {
                int32_t ti[KVR_SAMPLE_MAX_TOP_LOGPROBS];
                int32_t nt = kvr_sample_top_logprobs(logits, V, o.top_n, ti, pend.top_lps);
                for (int32_t k = 0; k < nt; k++)
                    pend.top_ids[k] = (uint32_t)ti[k];
                pend.n_top = (size_t)nt;
            }
        } else if (tlen) {
            fwrite(text, 1, tlen, stdout);
            fflush(stdout);
        }
        bool eos = false;
        for (size_t k = 0; k < n_eos_m && !eos; k++)
            eos = id == eos_m[k];
        for (size_t k = 0; k < n_eos_t && !eos; k++)
            eos = id == eos_t[k];
        if (eos && !o.ignore_eos) {
            finish = "stop";
            break;
        }
        if (i + 1 == o.max_tokens)
            break;
        struct kvr_decode_seq q = {
            .token = id, .pos = (int32_t)n_prompt + i, .block_table = bt, .n_blocks = nb};
        if ((st = kvr_engine_decode(ctx, &pool, &q, 1, logits)) != KVR_OK) {
            fprintf(stderr, "kvrail run: decode: %s\n", kvr_status_str(st));
            goto out;
        }
    }
    if (dt) {
        const char *text;
        size_t tlen;
        if (kvr_detok_flush(dt, &text, &tlen) == KVR_OK && tlen) {
            if (o.json)
                pending_append(&pend, text, tlen);
            else
                fwrite(text, 1, tlen, stdout);
        }
    }
    if (o.json) {
        pending_flush(&pend);
        kvr_cli_put_usage(stdout, -1, finish, (uint32_t)n_prompt, (uint32_t)n_gen, 0);
    } else {
        printf("\n");
    }
    uint64_t t_end = kvr_now_ns();
    if (o.stats)
        fprintf(stderr,
                "kvrail run: load %.1f ms, prefill %zu tokens %.1f ms (%.0f tok/s), decode %d "
                "tokens %.1f ms (%.1f tok/s)\n",
                (double)(t_load - t0) / 1e6, n_prompt, (double)(t_prefill - t_load) / 1e6,
                (double)n_prompt / ((double)(t_prefill - t_load) / 1e9 + 1e-12), n_gen,
                (double)(t_end - t_prefill) / 1e6,
                n_gen > 1 ? (double)(n_gen - 1) / ((double)(t_end - t_prefill) / 1e9) : 0.0);
    rc = 0;
    goto out;
err_nomem:
    fprintf(stderr, "kvrail run: out of memory\n");
out:
    if (pool.layer_base) {
        for (int32_t l = 0; m && l < kvr_model_n_layers(m); l++)
            kvr_run_device_slab_free(o.device, pool.layer_base[l]);
        free(pool.layer_base);
    }
    free(pend.text);
    free(bt);
    free(logits);
    free(prompt);
    free(chat_text);
    kvr_detok_destroy(dt);
    kvr_sampler_destroy(smp);
    kvr_ctx_destroy(ctx);
    kvr_tokenizer_destroy(tok);
    kvr_model_destroy(m);
    return rc;
}
