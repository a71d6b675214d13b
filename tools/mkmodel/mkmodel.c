/*
 * mkmodel.c - kvrail-mkmodel: writes a seeded random Llama-family model in
 * exactly the Hugging Face layout (config.json, generation_config.json,
 * tokenizer.json, tokenizer_config.json, model.safetensors or N shards with
 * model.safetensors.index.json).  It is the model every test and the
 * README's main command use.
 *
 * Weights are drawn from a counter-based generator keyed by (seed, tensor
 * name), so one tensor's values do not depend on the others or on the
 * sharding.  Matrices are uniform with variance 1/fan_in (activations stay
 * O(1) through any depth), norm weights 1 + small noise, biases small: the
 * logits are far from uniform, so greedy decoding exercises real choices.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "kvr_json.h"
#include "kvr_tokgen.h"
#include "kvr_version.h"

enum { DT_F32, DT_F16, DT_BF16 };

struct opts {
    const char *arch, *out;
    int layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, max_pos, shards;
    int dtype, sliding_window;
    bool tie, llama3_rope;
    double rope_theta;
    uint64_t seed;
};

struct tensor {
    char name[96];
    int64_t shape[2];
    int n_dims;
    int kind; /* 0 matrix, 1 norm weight, 2 bias, 3 embedding */
    size_t nbytes;
    int shard;
};

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (exp <= 0) { /* subnormal or zero */
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is right */
    return (uint16_t)(sign | h);
}

static size_t dt_size(int dt)
{
    return dt == DT_F32 ? 4 : 2;
}

static const char *dt_st(int dt)
{
    return dt == DT_F32 ? "F32" : dt == DT_F16 ? "F16" : "BF16";
}

static const char *dt_torch(int dt)
{
    return dt == DT_F32 ? "float32" : dt == DT_F16 ? "float16" : "bfloat16";
}

static int add_tensor(struct tensor *t, int *n, const char *name, int64_t r, int64_t c, int kind,
                      int dtype)
{
    struct tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->shape[0] = r;
    x->shape[1] = c;
    x->n_dims = c ? 2 : 1;
    x->kind = kind;
    x->nbytes = (size_t)r * (size_t)(c ? c : 1) * dt_size(dtype);
    return 0;
}

static int build_tensors(const struct opts *o, struct tensor **t_p)
{
    int max = 8 + o->layers * 16;
    struct tensor *t = calloc((size_t)max, sizeof(*t));
    if (!t)
        return -1;
    int n = 0, d = o->hidden, qd = o->heads * o->head_dim, kd = o->kv_heads * o->head_dim;
    bool bias = strcmp(o->arch, "qwen2") == 0;
    char nm[96];
    add_tensor(t, &n, "model.embed_tokens.weight", o->vocab, d, 3, o->dtype);
    for (int l = 0; l < o->layers; l++) {
#define L(s) (snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, s), nm)
        add_tensor(t, &n, L("input_layernorm.weight"), d, 0, 1, o->dtype);
        add_tensor(t, &n, L("self_attn.q_proj.weight"), qd, d, 0, o->dtype);
        add_tensor(t, &n, L("self_attn.k_proj.weight"), kd, d, 0, o->dtype);
        add_tensor(t, &n, L("self_attn.v_proj.weight"), kd, d, 0, o->dtype);
        if (bias) {
            add_tensor(t, &n, L("self_attn.q_proj.bias"), qd, 0, 2, o->dtype);
            add_tensor(t, &n, L("self_attn.k_proj.bias"), kd, 0, 2, o->dtype);
            add_tensor(t, &n, L("self_attn.v_proj.bias"), kd, 0, 2, o->dtype);
        }
        add_tensor(t, &n, L("self_attn.o_proj.weight"), d, qd, 0, o->dtype);
        add_tensor(t, &n, L("post_attention_layernorm.weight"), d, 0, 1, o->dtype);
        add_tensor(t, &n, L("mlp.gate_proj.weight"), o->intermediate, d, 0, o->dtype);
        add_tensor(t, &n, L("mlp.up_proj.weight"), o->intermediate, d, 0, o->dtype);
        add_tensor(t, &n, L("mlp.down_proj.weight"), d, o->intermediate, 0, o->dtype);
#undef L
    }
    add_tensor(t, &n, "model.norm.weight", d, 0, 1, o->dtype);
    if (!o->tie)
        add_tensor(t, &n, "lm_head.weight", o->vocab, d, 0, o->dtype);
    *t_p = t;
    return n;
}

/* Writes tensor t's values (generated from seed and its name) to f. */
static int write_data(FILE *f, const struct opts *o, const struct tensor *t)
{
    uint64_t s = XXH3_64bits_withSeed(t->name, strlen(t->name), o->seed);
    size_t n = t->nbytes / dt_size(o->dtype);
    int64_t fan_in = t->n_dims == 2 ? t->shape[1] : 1;
    float a; /* uniform in [-a, a]: variance a^2 / 3 */
    switch (t->kind) {
    case 0:
        a = sqrtf(3.0f / (float)fan_in);
        break;
    case 1:
        a = 0.2f;
        break; /* 1 + U(-0.2, 0.2) */
    case 2:
        a = 0.1f;
        break;
    default:
        a = 1.0f;
        break; /* embedding */
    }
    unsigned char buf[1 << 16];
    size_t per = sizeof(buf) / dt_size(o->dtype), done = 0;
    while (done < n) {
        size_t k = n - done < per ? n - done : per;
        for (size_t i = 0; i < k; i++) {
            uint64_t r = splitmix(&s);
            float u = (float)((double)(r >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
            float v = u * a + (t->kind == 1 ? 1.0f : 0.0f);
            if (o->dtype == DT_F32) {
                memcpy(buf + i * 4, &v, 4);
            } else {
                uint16_t h = o->dtype == DT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
                memcpy(buf + i * 2, &h, 2);
            }
        }
        if (fwrite(buf, dt_size(o->dtype), k, f) != k)
            return -1;
        done += k;
    }
    return 0;
}

static int write_safetensors(const char *path, const struct opts *o, const struct tensor *t, int n,
                             int shard)
{
    size_t cap = 4096 + (size_t)n * 200, len = 0, off = 0;
    char *h = malloc(cap);
    if (!h)
        return -1;
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        if (t[i].shard != shard)
            continue;
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld",
                                t[i].name, dt_st(o->dtype), (long long)t[i].shape[0]);
        if (t[i].n_dims == 2)
            len += (size_t)snprintf(h + len, cap - len, ",%lld", (long long)t[i].shape[1]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
                                off + t[i].nbytes);
        off += t[i].nbytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) /* data region 8-byte aligned, as the reference writer does */
        h[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "kvrail-mkmodel: %s: %s\n", path, strerror(errno));
        free(h);
        return -1;
    }
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int rc = fwrite(lenb, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len ? 0 : -1;
    for (int i = 0; i < n && rc == 0; i++)
        if (t[i].shard == shard)
            rc = write_data(f, o, &t[i]);
    if (fclose(f) != 0)
        rc = -1;
    if (rc)
        fprintf(stderr, "kvrail-mkmodel: %s: write failed\n", path);
    free(h);
    return rc;
}

static FILE *open_out(const char *dir, const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "kvrail-mkmodel: %s: %s\n", path, strerror(errno));
    return f;
}

/* Ids of <|begin_of_text|> and <|end_of_text|> in the written tokenizer.json. */
static int special_ids(const char *path, int *bos, int *eos)
{
    kvr_json_doc_t *d = NULL;
    char err[512];
    *bos = *eos = -1;
    if (kvr_json_parse_file(path, &d, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail-mkmodel: the generated tokenizer is not valid JSON: %s\n", err);
        return -1;
    }
    const kvr_json_t *at = kvr_json_get(kvr_json_root(d), "added_tokens");
    for (size_t i = 0; at && i < at->n; i++) {
        const char *c = kvr_json_get_str(at->items[i], "content", "", NULL);
        int id = (int)kvr_json_get_int(at->items[i], "id", -1, NULL);
        if (strcmp(c, "<|begin_of_text|>") == 0)
            *bos = id;
        if (strcmp(c, "<|end_of_text|>") == 0)
            *eos = id;
    }
    kvr_json_free(d);
    if (*bos < 0 || *eos < 0) {
        fprintf(stderr,
                "kvrail-mkmodel: %s: added_tokens lack <|begin_of_text|> or "
                "<|end_of_text|>\n",
                path);
        return -1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrail-mkmodel --out DIR [options]\n"
               "  --arch llama|qwen2|mistral   architecture (default llama)\n"
               "  --layers N --hidden N --heads N --kv-heads N --head-dim N\n"
               "  --intermediate N --vocab N --max-pos N   sizes (default: the tiny model\n"
               "                               2 layers, hidden 64, 4 heads, 2 kv heads,\n"
               "                               intermediate 192, vocab 512, max-pos 4096)\n"
               "  --dtype f32|f16|bf16         weight dtype (default f32)\n"
               "  --shards N                   N safetensors shards + index (default 1)\n"
               "  --tie                        tie_word_embeddings (no lm_head.weight)\n"
               "  --rope-theta X               default 10000 (llama), 1e6 (qwen2, mistral)\n"
               "  --rope-scaling llama3        llama3 rope_scaling (factor 8)\n"
               "  --sliding-window N           mistral/qwen2 sliding window (default none)\n"
               "  --seed S                     default 0\n"
               "  --version                    print the version and git revision\n");
}

static int parse_int(const char *s, const char *flag, int lo, int hi, int *out)
{
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (errno || *e || v < lo || v > hi) {
        fprintf(stderr, "kvrail-mkmodel: %s: '%s' is not an integer in [%d, %d]\n", flag, s, lo,
                hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {.arch = "llama",
                     .layers = 2,
                     .hidden = 64,
                     .heads = 4,
                     .kv_heads = 2,
                     .intermediate = 192,
                     .vocab = 512,
                     .max_pos = 4096,
                     .shards = 1,
                     .dtype = DT_F32,
                     .rope_theta = 0};
    static const struct option lo[] = {{"arch", 1, 0, 'a'},
                                       {"layers", 1, 0, 'l'},
                                       {"hidden", 1, 0, 'd'},
                                       {"heads", 1, 0, 'H'},
                                       {"kv-heads", 1, 0, 'K'},
                                       {"head-dim", 1, 0, 'D'},
                                       {"intermediate", 1, 0, 'f'},
                                       {"vocab", 1, 0, 'v'},
                                       {"max-pos", 1, 0, 'p'},
                                       {"dtype", 1, 0, 't'},
                                       {"shards", 1, 0, 's'},
                                       {"tie", 0, 0, 'T'},
                                       {"rope-theta", 1, 0, 'r'},
                                       {"rope-scaling", 1, 0, 'R'},
                                       {"sliding-window", 1, 0, 'w'},
                                       {"seed", 1, 0, 'S'},
                                       {"out", 1, 0, 'o'},
                                       {"help", 0, 0, 'h'},
                                       {"version", 0, 0, 'V'},
                                       {0, 0, 0, 0}};
    int c, rc = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'a':
            o.arch = optarg;
            break;
        case 'l':
            bad = parse_int(optarg, "--layers", 1, 1024, &o.layers);
            break;
        case 'd':
            bad = parse_int(optarg, "--hidden", 1, 65536, &o.hidden);
            break;
        case 'H':
            bad = parse_int(optarg, "--heads", 1, 1024, &o.heads);
            break;
        case 'K':
            bad = parse_int(optarg, "--kv-heads", 1, 1024, &o.kv_heads);
            break;
        case 'D':
            bad = parse_int(optarg, "--head-dim", 2, 1024, &o.head_dim);
            break;
        case 'f':
            bad = parse_int(optarg, "--intermediate", 1, 1 << 18, &o.intermediate);
            break;
        case 'v':
            bad = parse_int(optarg, "--vocab", 1, 1 << 24, &o.vocab);
            break;
        case 'p':
            bad = parse_int(optarg, "--max-pos", 1, 1 << 24, &o.max_pos);
            break;
        case 's':
            bad = parse_int(optarg, "--shards", 1, 1000, &o.shards);
            break;
        case 'w':
            bad = parse_int(optarg, "--sliding-window", 1, 1 << 24, &o.sliding_window);
            break;
        case 'T':
            o.tie = true;
            break;
        case 'r':
            o.rope_theta = strtod(optarg, NULL);
            bad = !(o.rope_theta > 1);
            break;
        case 'R':
            bad = strcmp(optarg, "llama3") != 0;
            o.llama3_rope = !bad;
            break;
        case 'S':
            o.seed = strtoull(optarg, NULL, 0);
            break;
        case 'o':
            o.out = optarg;
            break;
        case 't':
            if (strcmp(optarg, "f32") == 0)
                o.dtype = DT_F32;
            else if (strcmp(optarg, "f16") == 0)
                o.dtype = DT_F16;
            else if (strcmp(optarg, "bf16") == 0)
                o.dtype = DT_BF16;
            else
                bad = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            kvr_version_print("kvrail-mkmodel");
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvrail-mkmodel: bad value '%s' for %s\n", optarg, argv[optind - 1]);
            return 2;
        }
    }
    const char *archname, *model_type;
    if (strcmp(o.arch, "llama") == 0) {
        archname = "LlamaForCausalLM";
        model_type = "llama";
    } else if (strcmp(o.arch, "qwen2") == 0) {
        archname = "Qwen2ForCausalLM";
        model_type = "qwen2";
    } else if (strcmp(o.arch, "mistral") == 0) {
        archname = "MistralForCausalLM";
        model_type = "mistral";
    } else {
        fprintf(stderr, "kvrail-mkmodel: --arch '%s': llama, qwen2 or mistral\n", o.arch);
        return 2;
    }
    if (!o.out) {
        usage(stderr);
        return 2;
    }
    if (!o.head_dim) {
        if (o.hidden % o.heads) {
            fprintf(stderr, "kvrail-mkmodel: --hidden %d not divisible by --heads %d\n", o.hidden,
                    o.heads);
            return 2;
        }
        o.head_dim = o.hidden / o.heads;
    }
    if (o.heads % o.kv_heads || o.head_dim % 2) {
        fprintf(stderr, "kvrail-mkmodel: --heads must be a multiple of --kv-heads and the head "
                        "dim even\n");
        return 2;
    }
    if (o.rope_theta == 0)
        o.rope_theta = strcmp(o.arch, "llama") == 0 ? (o.llama3_rope ? 500000.0 : 10000.0) : 1e6;
    if (mkdir(o.out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvrail-mkmodel: %s: %s\n", o.out, strerror(errno));
        return 1;
    }
    char path[4096];
    struct tensor *t = NULL;

    /* tokenizer first: its special ids go into the configs */
    snprintf(path, sizeof(path), "%s/tokenizer.json", o.out);
    kvr_status_t tst = kvr_tokenizer_gen_bytelevel(path, o.vocab, o.seed);
    if (tst != KVR_OK) {
        fprintf(stderr, "kvrail-mkmodel: %s: tokenizer generation failed: %s\n", path,
                kvr_status_str(tst));
        return 1;
    }
    int bos, eos;
    if (special_ids(path, &bos, &eos) != 0)
        return 1;

    FILE *f = open_out(o.out, "config.json", path, sizeof(path));
    if (!f)
        return 1;
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n"
            "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": 1e-05,\n"
            "  \"rope_theta\": %.1f,\n  \"vocab_size\": %d,\n  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n  \"attention_dropout\": 0.0,\n"
            "  \"initializer_range\": 0.02,\n  \"use_cache\": true,\n",
            archname, model_type, o.hidden, o.intermediate, o.layers, o.heads, o.kv_heads,
            o.head_dim, o.max_pos, o.rope_theta, o.vocab, o.tie ? "true" : "false",
            dt_torch(o.dtype));
    if (strcmp(o.arch, "llama") == 0) {
        fprintf(f, "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n");
        if (o.llama3_rope)
            fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                       "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                       "\"original_max_position_embeddings\": 8192},\n");
        else
            fprintf(f, "  \"rope_scaling\": null,\n");
    } else if (strcmp(o.arch, "qwen2") == 0) {
        if (o.sliding_window)
            fprintf(f, "  \"use_sliding_window\": true,\n  \"sliding_window\": %d,\n",
                    o.sliding_window);
        else
            fprintf(f, "  \"use_sliding_window\": false,\n  \"sliding_window\": %d,\n", o.max_pos);
        fprintf(f, "  \"max_window_layers\": %d,\n", o.layers);
    } else if (o.sliding_window) {
        fprintf(f, "  \"sliding_window\": %d,\n", o.sliding_window);
    } else {
        fprintf(f, "  \"sliding_window\": null,\n");
    }
    fprintf(f, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"kvrail_seed\": %llu\n}\n",
            bos, eos, (unsigned long long)o.seed);
    if (fclose(f) != 0)
        return 1;

    if (!(f = open_out(o.out, "generation_config.json", path, sizeof(path))))
        return 1;
    fprintf(f, "{\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"do_sample\": false\n}\n",
            bos, eos);
    if (fclose(f) != 0)
        return 1;
    if (!(f = open_out(o.out, "tokenizer_config.json", path, sizeof(path))))
        return 1;
    fprintf(f,
            "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n"
            "  \"bos_token\": \"<|begin_of_text|>\",\n  \"eos_token\": \"<|end_of_text|>\",\n"
            "  \"model_max_length\": %d,\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n",
            o.max_pos);
    if (fclose(f) != 0)
        return 1;

    int n = build_tensors(&o, &t);
    if (n < 0)
        return 1;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += t[i].nbytes;
    if (o.shards > n)
        o.shards = n;
    /* contiguous split by bytes */
    size_t acc = 0;
    for (int i = 0; i < n; i++) {
        int s = (int)((double)acc / (double)total * o.shards);
        t[i].shard = s < o.shards ? s : o.shards - 1;
        acc += t[i].nbytes;
    }
    if (o.shards == 1) {
        snprintf(path, sizeof(path), "%s/model.safetensors", o.out);
        if (write_safetensors(path, &o, t, n, 0))
            goto out;
    } else {
        for (int s = 0; s < o.shards; s++) {
            snprintf(path, sizeof(path), "%s/model-%05d-of-%05d.safetensors", o.out, s + 1,
                     o.shards);
            if (write_safetensors(path, &o, t, n, s))
                goto out;
        }
        if (!(f = open_out(o.out, "model.safetensors.index.json", path, sizeof(path))))
            goto out;
        fprintf(f, "{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {\n", total);
        for (int i = 0; i < n; i++)
            fprintf(f, "    \"%s\": \"model-%05d-of-%05d.safetensors\"%s\n", t[i].name,
                    t[i].shard + 1, o.shards, i + 1 < n ? "," : "");
        fprintf(f, "  }\n}\n");
        if (fclose(f) != 0)
            goto out;
    }
    rc = 0;
out:
    free(t);
    return rc;
}
