/*
 * model.c - loads a Hugging Face model directory: config.json (architecture
 * and hyper-parameters, every key checked), the safetensors file(s) (single
 * model.safetensors, or the shards that model.safetensors.index.json names),
 * generation_config.json / tokenizer_config.json for bos/eos.
 *
 * Matrices stay in the memory mapping in their file dtype (f32/f16/bf16):
 * the compute backend converts as it multiplies.  Small vectors (norm
 * weights, biases) are copied to f32.  Every tensor the architecture needs
 * is looked up by its HF name and its shape and dtype checked, so a bad file
 * is an error naming the file and tensor, never a crash in the forward pass.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "engine_internal.h"
#include "kvr_json.h"
#include "kvr_log.h"

#define ERR(...)                                                                                   \
    do {                                                                                           \
        if (err && err_len)                                                                        \
            snprintf(err, err_len, __VA_ARGS__);                                                   \
    } while (0)

struct loader {
    kvr_model_t *m;
    char *err;
    size_t err_len;
};

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static void *own(kvr_model_t *m, size_t bytes)
{
    if (m->n_owned == m->cap_owned) {
        size_t nc = m->cap_owned ? m->cap_owned * 2 : 64;
        void **no = realloc(m->owned, nc * sizeof(*no));
        if (!no)
            return NULL;
        m->owned = no;
        m->cap_owned = nc;
    }
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p)
        m->owned[m->n_owned++] = p;
    return p;
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal */
            float f = ldexpf((float)man, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void to_f32(float *out, const void *src, int32_t dtype, size_t n)
{
    const uint16_t *h = src;
    switch (dtype) {
    case KVR_DT_F32:
        memcpy(out, src, n * 4);
        break;
    case KVR_DT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, h + i, 2);
            out[i] = f16_to_f32(v);
        }
        break;
    default:
        for (size_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, h + i, 2);
            out[i] = bf16_to_f32(v);
        }
        break;
    }
}

/* ------------------------------------------------------------ config */

static kvr_status_t cfg_int(struct loader *L, const char *file, const kvr_json_t *o,
                            const char *key, bool required, int64_t def, int64_t lo, int64_t hi,
                            int32_t *out)
{
    char *err = L->err;
    size_t err_len = L->err_len;
    const kvr_json_t *v = kvr_json_get(o, key);
    if (!v || v->type == KVR_JSON_NULL) {
        if (required) {
            ERR("%s: missing key \"%s\"", file, key);
            return KVR_ERR_INVALID;
        }
        *out = (int32_t)def;
        return KVR_OK;
    }
    if (v->type != KVR_JSON_NUMBER || !v->is_int) {
        ERR("%s: key \"%s\" must be an integer", file, key);
        return KVR_ERR_INVALID;
    }
    if (v->i64 < lo || v->i64 > hi) {
        ERR("%s: key \"%s\" = %lld outside [%lld, %lld]", file, key, (long long)v->i64,
            (long long)lo, (long long)hi);
        return KVR_ERR_INVALID;
    }
    *out = (int32_t)v->i64;
    return KVR_OK;
}

static kvr_status_t cfg_num(struct loader *L, const char *file, const kvr_json_t *o,
                            const char *key, double def, double lo, double hi, double *out)
{
    char *err = L->err;
    size_t err_len = L->err_len;
    const kvr_json_t *v = kvr_json_get(o, key);
    if (!v || v->type == KVR_JSON_NULL) {
        *out = def;
        return KVR_OK;
    }
    if (v->type != KVR_JSON_NUMBER || !(v->num >= lo && v->num <= hi)) {
        ERR("%s: key \"%s\" must be a number in [%g, %g]", file, key, lo, hi);
        return KVR_ERR_INVALID;
    }
    *out = v->num;
    return KVR_OK;
}

/* Reads an id or a list of ids (eos_token_id may be either). */
static kvr_status_t cfg_ids(struct loader *L, const char *file, const kvr_json_t *o,
                            const char *key, int32_t *ids, size_t cap, size_t *n_p)
{
    char *err = L->err;
    size_t err_len = L->err_len;
    const kvr_json_t *v = kvr_json_get(o, key);
    *n_p = 0;
    if (!v || v->type == KVR_JSON_NULL)
        return KVR_OK;
    if (v->type == KVR_JSON_NUMBER && v->is_int && v->i64 >= 0 && v->i64 < INT32_MAX) {
        ids[0] = (int32_t)v->i64;
        *n_p = 1;
        return KVR_OK;
    }
    if (v->type == KVR_JSON_ARRAY) {
        for (size_t i = 0; i < v->n && *n_p < cap; i++) {
            const kvr_json_t *e = v->items[i];
            if (e->type != KVR_JSON_NUMBER || !e->is_int || e->i64 < 0 || e->i64 >= INT32_MAX) {
                ERR("%s: key \"%s\"[%zu] is not a token id", file, key, i);
                return KVR_ERR_INVALID;
            }
            ids[(*n_p)++] = (int32_t)e->i64;
        }
        return KVR_OK;
    }
    ERR("%s: key \"%s\" must be a token id or a list of them", file, key);
    return KVR_ERR_INVALID;
}

static kvr_status_t parse_rope_scaling(struct loader *L, const char *file, const kvr_json_t *rs,
                                       struct kvr_model_config *c)
{
    char *err = L->err;
    size_t err_len = L->err_len;
    kvr_status_t st;
    c->rope_kind = 0;
    if (!rs || rs->type == KVR_JSON_NULL)
        return KVR_OK;
    if (rs->type != KVR_JSON_OBJECT) {
        ERR("%s: key \"rope_scaling\" must be an object or null", file);
        return KVR_ERR_INVALID;
    }
    const char *type = kvr_json_get_str(rs, "rope_type", NULL, NULL);
    if (!type)
        type = kvr_json_get_str(rs, "type", NULL, NULL);
    if (!type) {
        ERR("%s: key \"rope_scaling.rope_type\" missing", file);
        return KVR_ERR_INVALID;
    }
    if (strcmp(type, "default") == 0)
        return KVR_OK;
    if ((st = cfg_num(L, file, rs, "factor", 1.0, 1e-6, 1e6, &c->rope_factor)) != KVR_OK)
        return st;
    if (strcmp(type, "linear") == 0) {
        c->rope_kind = 1;
        return KVR_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        c->rope_kind = 2;
        if ((st = cfg_num(L, file, rs, "low_freq_factor", 1.0, 1e-6, 1e6, &c->rope_low_freq)) ||
            (st = cfg_num(L, file, rs, "high_freq_factor", 4.0, 1e-6, 1e6, &c->rope_high_freq)) ||
            (st = cfg_int(L, file, rs, "original_max_position_embeddings", false, 8192, 1, 1 << 24,
                          &c->rope_orig_max_pos)))
            return st;
        if (c->rope_high_freq <= c->rope_low_freq) {
            ERR("%s: rope_scaling: high_freq_factor must exceed low_freq_factor", file);
            return KVR_ERR_INVALID;
        }
        return KVR_OK;
    }
    ERR("%s: rope_scaling type \"%s\" not supported (default, linear, llama3)", file, type);
    return KVR_ERR_UNSUPPORTED;
}

static kvr_status_t parse_config(struct loader *L, const char *file, const kvr_json_t *r)
{
    char *err = L->err;
    size_t err_len = L->err_len;
    struct kvr_model_config *c = &L->m->cfg;
    kvr_status_t st;
    if (r->type != KVR_JSON_OBJECT) {
        ERR("%s: top level is not an object", file);
        return KVR_ERR_INVALID;
    }
    const kvr_json_t *archs = kvr_json_get(r, "architectures");
    const char *arch = NULL;
    if (archs && archs->type == KVR_JSON_ARRAY && archs->n >= 1 &&
        archs->items[0]->type == KVR_JSON_STRING)
        arch = archs->items[0]->str;
    if (!arch) {
        ERR("%s: key \"architectures\" missing or not a list of strings", file);
        return KVR_ERR_INVALID;
    }
    if (strcmp(arch, "LlamaForCausalLM") == 0) {
        c->arch = KVR_ARCH_LLAMA;
    } else if (strcmp(arch, "Qwen2ForCausalLM") == 0) {
        c->arch = KVR_ARCH_QWEN2;
    } else if (strcmp(arch, "MistralForCausalLM") == 0) {
        c->arch = KVR_ARCH_MISTRAL;
    } else {
        ERR("%s: key \"architectures\": \"%s\" not supported (LlamaForCausalLM, "
            "Qwen2ForCausalLM, MistralForCausalLM)",
            file, arch);
        return KVR_ERR_UNSUPPORTED;
    }
    const char *act = kvr_json_get_str(r, "hidden_act", "silu", NULL);
    if (strcmp(act, "silu") != 0) {
        ERR("%s: key \"hidden_act\": \"%s\" not supported (silu)", file, act);
        return KVR_ERR_UNSUPPORTED;
    }
    if (kvr_json_get_bool(r, "mlp_bias", false, NULL)) {
        ERR("%s: key \"mlp_bias\": true not supported", file);
        return KVR_ERR_UNSUPPORTED;
    }
    if ((st = cfg_int(L, file, r, "hidden_size", true, 0, 1, 1 << 16, &c->hidden)) ||
        (st = cfg_int(L, file, r, "intermediate_size", true, 0, 1, 1 << 18, &c->intermediate)) ||
        (st = cfg_int(L, file, r, "num_hidden_layers", true, 0, 1, 1024, &c->n_layers)) ||
        (st = cfg_int(L, file, r, "num_attention_heads", true, 0, 1, 1024, &c->n_heads)) ||
        (st = cfg_int(L, file, r, "num_key_value_heads", false, c->n_heads, 1, 1024,
                      &c->n_kv_heads)) ||
        (st = cfg_int(L, file, r, "vocab_size", true, 0, 1, 1 << 24, &c->vocab)) ||
        (st = cfg_int(L, file, r, "max_position_embeddings", false, 4096, 1, 1 << 24, &c->max_pos)))
        return st;
    if (c->hidden % c->n_heads != 0 && !kvr_json_get(r, "head_dim")) {
        ERR("%s: hidden_size %d not divisible by num_attention_heads %d", file, c->hidden,
            c->n_heads);
        return KVR_ERR_INVALID;
    }
    if ((st =
             cfg_int(L, file, r, "head_dim", false, c->hidden / c->n_heads, 2, 1024, &c->head_dim)))
        return st;
    if (c->head_dim % 2 != 0) {
        ERR("%s: head_dim %d must be even for RoPE", file, c->head_dim);
        return KVR_ERR_INVALID;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        ERR("%s: num_attention_heads %d not a multiple of num_key_value_heads %d", file, c->n_heads,
            c->n_kv_heads);
        return KVR_ERR_INVALID;
    }
    double eps;
    if ((st = cfg_num(L, file, r, "rms_norm_eps", 1e-6, 0, 1, &eps)) ||
        (st = cfg_num(L, file, r, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta)))
        return st;
    c->norm_eps = (float)eps;
    bool ok = true;
    c->tie_embeddings = kvr_json_get_bool(r, "tie_word_embeddings", false, &ok);
    if (!ok) {
        ERR("%s: key \"tie_word_embeddings\" must be a boolean", file);
        return KVR_ERR_INVALID;
    }
    c->sliding_window = 0;
    bool use_sw = c->arch == KVR_ARCH_MISTRAL;
    if (c->arch == KVR_ARCH_QWEN2)
        use_sw = kvr_json_get_bool(r, "use_sliding_window", false, NULL);
    if (use_sw &&
        (st = cfg_int(L, file, r, "sliding_window", false, 0, 0, 1 << 24, &c->sliding_window)))
        return st;
    if ((st = parse_rope_scaling(L, file, kvr_json_get(r, "rope_scaling"), c)))
        return st;
    int32_t bos[1];
    size_t nb;
    if ((st = cfg_ids(L, file, r, "bos_token_id", bos, 1, &nb)))
        return st;
    c->bos_id = nb ? bos[0] : -1;
    if ((st = cfg_ids(L, file, r, "eos_token_id", c->eos_ids, KVR_MAX_EOS, &c->n_eos)))
        return st;
    return KVR_OK;
}

/* Finds the id of an added token in tokenizer.json by its content. */
static int32_t added_token_id(const kvr_json_t *tokj, const char *content)
{
    const kvr_json_t *at = kvr_json_get(tokj, "added_tokens");
    if (!at || at->type != KVR_JSON_ARRAY)
        return -1;
    for (size_t i = 0; i < at->n; i++) {
        const char *c = kvr_json_get_str(at->items[i], "content", NULL, NULL);
        int64_t id = kvr_json_get_int(at->items[i], "id", -1, NULL);
        if (c && strcmp(c, content) == 0 && id >= 0 && id < INT32_MAX)
            return (int32_t)id;
    }
    return -1;
}

static const char *token_str(const kvr_json_t *tc, const char *key)
{
    const kvr_json_t *v = kvr_json_get(tc, key);
    if (v && v->type == KVR_JSON_STRING)
        return v->str;
    if (v && v->type == KVR_JSON_OBJECT)
        return kvr_json_get_str(v, "content", NULL, NULL);
    return NULL;
}

/* bos/eos: generation_config.json wins over config.json; when neither has
 * them, tokenizer_config.json's token strings are looked up in
 * tokenizer.json's added_tokens. */
static kvr_status_t load_special_ids(struct loader *L)
{
    kvr_model_t *m = L->m;
    struct kvr_model_config *c = &m->cfg;
    kvr_status_t st = KVR_OK;
    char jerr[512];
    char *p = path_join(m->dir, "generation_config.json");
    if (!p)
        return KVR_ERR_NO_MEMORY;
    if (file_exists(p)) {
        kvr_json_doc_t *d = NULL;
        st = kvr_json_parse_file(p, &d, jerr, sizeof(jerr));
        if (st != KVR_OK) {
            if (L->err && L->err_len)
                snprintf(L->err, L->err_len, "%s", jerr);
            free(p);
            return st;
        }
        int32_t bos[1], eos[KVR_MAX_EOS];
        size_t nb = 0, ne = 0;
        const kvr_json_t *r = kvr_json_root(d);
        st = cfg_ids(L, p, r, "bos_token_id", bos, 1, &nb);
        if (st == KVR_OK)
            st = cfg_ids(L, p, r, "eos_token_id", eos, KVR_MAX_EOS, &ne);
        kvr_json_free(d);
        if (st != KVR_OK) {
            free(p);
            return st;
        }
        if (nb)
            c->bos_id = bos[0];
        if (ne) {
            memcpy(c->eos_ids, eos, ne * sizeof(eos[0]));
            c->n_eos = ne;
        }
    }
    free(p);
    if (c->bos_id >= 0 && c->n_eos > 0)
        return KVR_OK;
    char *tcp = path_join(m->dir, "tokenizer_config.json");
    char *tjp = path_join(m->dir, "tokenizer.json");
    kvr_json_doc_t *tc = NULL, *tj = NULL;
    if (!tcp || !tjp) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    if (!file_exists(tcp) || !file_exists(tjp))
        goto out;
    if (kvr_json_parse_file(tcp, &tc, jerr, sizeof(jerr)) != KVR_OK ||
        kvr_json_parse_file(tjp, &tj, jerr, sizeof(jerr)) != KVR_OK) {
        /* the tokenizer loader reports these files' errors; ids stay unknown */
        KVR_LOG_WARN("engine", "bos/eos lookup: %s", jerr);
        goto out;
    }
    const char *b = token_str(kvr_json_root(tc), "bos_token");
    const char *e = token_str(kvr_json_root(tc), "eos_token");
    if (c->bos_id < 0 && b)
        c->bos_id = added_token_id(kvr_json_root(tj), b);
    if (c->n_eos == 0 && e) {
        int32_t id = added_token_id(kvr_json_root(tj), e);
        if (id >= 0)
            c->eos_ids[c->n_eos++] = id;
    }
out:
    kvr_json_free(tc);
    kvr_json_free(tj);
    free(tcp);
    free(tjp);
    return st;
}

/* ------------------------------------------------------------ tensors */

static kvr_status_t open_files(struct loader *L)
{
    kvr_model_t *m = L->m;
    char *err = L->err;
    size_t err_len = L->err_len;
    kvr_status_t st = KVR_OK;
    kvr_json_doc_t *idx = NULL;
    char *ip = path_join(m->dir, "model.safetensors.index.json");
    char *sp = path_join(m->dir, "model.safetensors");
    char **names = NULL;
    size_t n_names = 0;
    if (!ip || !sp) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    if (file_exists(ip)) {
        char jerr[512];
        st = kvr_json_parse_file(ip, &idx, jerr, sizeof(jerr));
        if (st != KVR_OK) {
            ERR("%s", jerr);
            goto out;
        }
        const kvr_json_t *wm = kvr_json_get(kvr_json_root(idx), "weight_map");
        if (!wm || wm->type != KVR_JSON_OBJECT || wm->n == 0) {
            ERR("%s: key \"weight_map\" missing or not a non-empty object", ip);
            st = KVR_ERR_INVALID;
            goto out;
        }
        names = calloc(wm->n, sizeof(*names));
        if (!names) {
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
        for (size_t i = 0; i < wm->n; i++) {
            const kvr_json_t *f = wm->items[i];
            if (f->type != KVR_JSON_STRING || strchr(f->str, '/') || f->str[0] == '.') {
                ERR("%s: weight_map[\"%s\"] is not a file name in the model directory", ip,
                    wm->keys[i]);
                st = KVR_ERR_INVALID;
                goto out;
            }
            size_t j;
            for (j = 0; j < n_names; j++)
                if (strcmp(names[j], f->str) == 0)
                    break;
            if (j == n_names)
                names[n_names++] = (char *)f->str;
        }
        m->files = calloc(n_names, sizeof(*m->files));
        if (!m->files) {
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
        for (size_t j = 0; j < n_names; j++) {
            char *fp = path_join(m->dir, names[j]);
            if (!fp) {
                st = KVR_ERR_NO_MEMORY;
                goto out;
            }
            st = kvr_st_open(fp, &m->files[j], err, err_len);
            free(fp);
            if (st != KVR_OK)
                goto out;
            m->n_files++;
        }
        /* every tensor of the map must be in the shard it names */
        for (size_t i = 0; i < wm->n; i++) {
            for (size_t j = 0; j < m->n_files; j++) {
                if (strcmp(names[j], wm->items[i]->str) != 0)
                    continue;
                if (!kvr_st_find(m->files[j], wm->keys[i])) {
                    ERR("%s: tensor '%s' listed in %s is not in that file", m->files[j]->path,
                        wm->keys[i], ip);
                    st = KVR_ERR_NOT_FOUND;
                    goto out;
                }
            }
        }
    } else if (file_exists(sp)) {
        m->files = calloc(1, sizeof(*m->files));
        if (!m->files) {
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
        st = kvr_st_open(sp, &m->files[0], err, err_len);
        if (st == KVR_OK)
            m->n_files = 1;
    } else {
        ERR("%s: neither model.safetensors nor model.safetensors.index.json found", m->dir);
        st = KVR_ERR_NOT_FOUND;
    }
out:
    free(names);
    kvr_json_free(idx);
    free(ip);
    free(sp);
    return st;
}

static const struct kvr_st_tensor *find_tensor(const kvr_model_t *m, const char *name,
                                               const struct kvr_st_file **file_p)
{
    for (size_t i = 0; i < m->n_files; i++) {
        const struct kvr_st_tensor *t = kvr_st_find(m->files[i], name);
        if (t) {
            *file_p = m->files[i];
            return t;
        }
    }
    return NULL;
}

static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

/* Looks a tensor up and checks its shape: rows x cols (cols 0: a vector). */
static kvr_status_t get_tensor(struct loader *L, const char *name, int32_t rows, int32_t cols,
                               bool optional, const struct kvr_st_tensor **t_p)
{
    char *err = L->err;
    size_t err_len = L->err_len;
    const struct kvr_st_file *f = NULL;
    const struct kvr_st_tensor *t = find_tensor(L->m, name, &f);
    if (!t) {
        *t_p = NULL;
        if (optional)
            return KVR_OK;
        ERR("%s: tensor '%s' missing (searched %zu safetensors file%s)", L->m->dir, name,
            L->m->n_files, L->m->n_files == 1 ? "" : "s");
        return KVR_ERR_NOT_FOUND;
    }
    int64_t want[2] = {rows, cols};
    int nd = cols ? 2 : 1;
    if (t->n_dims != nd || t->shape[0] != want[0] || (nd == 2 && t->shape[1] != want[1])) {
        char got[96], exp[96];
        fmt_shape(got, sizeof(got), t->shape, t->n_dims);
        fmt_shape(exp, sizeof(exp), want, nd);
        ERR("%s: tensor '%s' has shape %s, config.json implies %s", f->path, name, got, exp);
        return KVR_ERR_INVALID;
    }
    L->m->n_params += t->nbytes / kvr_dtype_size(t->dtype);
    *t_p = t;
    return KVR_OK;
}

static kvr_status_t load_matrix(struct loader *L, const char *name, int32_t rows, int32_t cols,
                                struct kvr_weight *w)
{
    const struct kvr_st_tensor *t;
    kvr_status_t st = get_tensor(L, name, rows, cols, false, &t);
    if (st != KVR_OK)
        return st;
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    size_t align = kvr_dtype_size(t->dtype);
    if ((uintptr_t)t->data % align != 0) { /* misaligned in the file: copy */
        void *p = own(L->m, t->nbytes);
        if (!p)
            return KVR_ERR_NO_MEMORY;
        memcpy(p, t->data, t->nbytes);
        w->data = p;
    }
    return KVR_OK;
}

static kvr_status_t load_vector(struct loader *L, const char *name, int32_t n, bool optional,
                                float **out)
{
    const struct kvr_st_tensor *t;
    kvr_status_t st = get_tensor(L, name, n, 0, optional, &t);
    *out = NULL;
    if (st != KVR_OK || !t)
        return st;
    float *p = own(L->m, (size_t)n * 4);
    if (!p)
        return KVR_ERR_NO_MEMORY;
    to_f32(p, t->data, t->dtype, (size_t)n);
    *out = p;
    return KVR_OK;
}

static kvr_status_t load_weights(struct loader *L)
{
    kvr_model_t *m = L->m;
    const struct kvr_model_config *c = &m->cfg;
    struct kvr_model_weights *w = &m->w;
    char *err = L->err;
    size_t err_len = L->err_len;
    kvr_status_t st;
    int32_t d = c->hidden, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    char name[128];
    if ((st = load_matrix(L, "model.embed_tokens.weight", c->vocab, d, &w->embed)))
        return st;
    w->layers = calloc((size_t)c->n_layers, sizeof(*w->layers));
    if (!w->layers)
        return KVR_ERR_NO_MEMORY;
    for (int32_t l = 0; l < c->n_layers; l++) {
        struct kvr_layer_weights *lw = &w->layers[l];
#define N(s) (snprintf(name, sizeof(name), "model.layers.%d.%s", l, s), name)
        bool qkv_bias = c->arch == KVR_ARCH_QWEN2;
        if ((st = load_vector(L, N("input_layernorm.weight"), d, false, &lw->attn_norm)) ||
            (st = load_matrix(L, N("self_attn.q_proj.weight"), qd, d, &lw->wq)) ||
            (st = load_matrix(L, N("self_attn.k_proj.weight"), kd, d, &lw->wk)) ||
            (st = load_matrix(L, N("self_attn.v_proj.weight"), kd, d, &lw->wv)) ||
            (st = load_matrix(L, N("self_attn.o_proj.weight"), d, qd, &lw->wo)) ||
            (st = load_vector(L, N("self_attn.q_proj.bias"), qd, !qkv_bias, &lw->bq)) ||
            (st = load_vector(L, N("self_attn.k_proj.bias"), kd, !qkv_bias, &lw->bk)) ||
            (st = load_vector(L, N("self_attn.v_proj.bias"), kd, !qkv_bias, &lw->bv)) ||
            (st = load_vector(L, N("self_attn.o_proj.bias"), d, true, &lw->bo)) ||
            (st = load_vector(L, N("post_attention_layernorm.weight"), d, false, &lw->ffn_norm)) ||
            (st = load_matrix(L, N("mlp.gate_proj.weight"), c->intermediate, d, &lw->w_gate)) ||
            (st = load_matrix(L, N("mlp.up_proj.weight"), c->intermediate, d, &lw->w_up)) ||
            (st = load_matrix(L, N("mlp.down_proj.weight"), d, c->intermediate, &lw->w_down)))
            return st;
#undef N
    }
    if ((st = load_vector(L, "model.norm.weight", d, false, &w->final_norm)))
        return st;
    const struct kvr_st_file *f;
    if (c->tie_embeddings) {
        w->lm_head = w->embed;
    } else if (!find_tensor(m, "lm_head.weight", &f)) {
        ERR("%s: tensor 'lm_head.weight' missing and config.json has tie_word_embeddings "
            "false",
            m->dir);
        return KVR_ERR_NOT_FOUND;
    } else if ((st = load_matrix(L, "lm_head.weight", c->vocab, d, &w->lm_head))) {
        return st;
    }
    return KVR_OK;
}

/* RoPE inverse frequencies with rope_scaling applied, as HF's
 * _compute_llama3_parameters / linear scaling. */
static kvr_status_t init_rope(kvr_model_t *m)
{
    const struct kvr_model_config *c = &m->cfg;
    int32_t half = c->head_dim / 2;
    m->inv_freq = own(m, (size_t)half * 4);
    if (!m->inv_freq)
        return KVR_ERR_NO_MEMORY;
    for (int32_t i = 0; i < half; i++) {
        double f = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->head_dim);
        if (c->rope_kind == 1) {
            f /= c->rope_factor;
        } else if (c->rope_kind == 2) {
            double old = c->rope_orig_max_pos;
            double low_wl = old / c->rope_low_freq, high_wl = old / c->rope_high_freq;
            double wl = 2.0 * M_PI / f;
            if (wl < high_wl) {
                /* high frequency: unchanged */
            } else if (wl > low_wl) {
                f /= c->rope_factor;
            } else {
                double s = (old / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                f = (1.0 - s) * f / c->rope_factor + s * f;
            }
        }
        m->inv_freq[i] = (float)f;
    }
    return KVR_OK;
}

static void fp_add(XXH3_state_t *s, const void *p, size_t n)
{
    XXH3_64bits_update(s, p, n);
}

static kvr_status_t compute_fingerprint(kvr_model_t *m)
{
    XXH3_state_t *s = XXH3_createState();
    if (!s)
        return KVR_ERR_NO_MEMORY;
    XXH3_64bits_reset_withSeed(s, 0x6b7672);
    const struct kvr_model_config *c = &m->cfg;
    int32_t ints[] = {(int32_t)c->arch,  c->hidden,     c->intermediate,  c->n_layers,
                      c->n_heads,        c->n_kv_heads, c->head_dim,      c->vocab,
                      c->sliding_window, c->rope_kind,  c->tie_embeddings};
    fp_add(s, ints, sizeof(ints));
    fp_add(s, &c->norm_eps, sizeof(c->norm_eps));
    fp_add(s, m->inv_freq, (size_t)c->head_dim / 2 * 4);
    for (size_t i = 0; i < m->n_files; i++) {
        const struct kvr_st_file *f = m->files[i];
        for (size_t j = 0; j < f->n_tensors; j++) {
            const struct kvr_st_tensor *t = &f->tensors[j];
            fp_add(s, t->name, strlen(t->name) + 1);
            fp_add(s, &t->dtype, sizeof(t->dtype));
            fp_add(s, t->shape, sizeof(t->shape[0]) * (size_t)t->n_dims);
            size_t n = t->nbytes < 4096 ? t->nbytes : 4096;
            fp_add(s, t->data, n);
            fp_add(s, (const char *)t->data + t->nbytes - n, n);
        }
    }
    m->fingerprint = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return KVR_OK;
}

kvr_status_t kvr_model_load(const char *dir, kvr_model_t **model_p, char *err, size_t err_len)
{
    kvr_status_t st;
    kvr_json_doc_t *cfg = NULL;
    char *cp = NULL;
    if (err && err_len)
        err[0] = '\0';
    if (!dir || !model_p) {
        ERR("kvr_model_load: NULL argument");
        return KVR_ERR_INVALID;
    }
    kvr_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return KVR_ERR_NO_MEMORY;
    struct loader L = {.m = m, .err = err, .err_len = err_len};
    m->dir = strdup(dir);
    cp = path_join(dir, "config.json");
    if (!m->dir || !cp) {
        st = KVR_ERR_NO_MEMORY;
        goto err_free;
    }
    st = kvr_json_parse_file(cp, &cfg, err, err_len);
    if (st != KVR_OK)
        goto err_free;
    if ((st = parse_config(&L, cp, kvr_json_root(cfg))) || (st = load_special_ids(&L)) ||
        (st = open_files(&L)) || (st = load_weights(&L)) || (st = init_rope(m)) ||
        (st = compute_fingerprint(m)))
        goto err_free;
    if (m->cfg.tie_embeddings) {
        const struct kvr_st_file *f;
        if (find_tensor(m, "lm_head.weight", &f))
            KVR_LOG_DEBUG("engine", "%s: tie_word_embeddings: lm_head.weight ignored", dir);
    }
    kvr_json_free(cfg);
    free(cp);
    KVR_LOG_DEBUG("engine", "%s: %s, %d layers, d=%d, heads %d/%d, vocab %d, %s, %llu params", dir,
                  kvr_model_arch(m), m->cfg.n_layers, m->cfg.hidden, m->cfg.n_heads,
                  m->cfg.n_kv_heads, m->cfg.vocab, kvr_model_dtype(m),
                  (unsigned long long)m->n_params);
    *model_p = m;
    return KVR_OK;
err_free:
    if (st == KVR_ERR_NO_MEMORY && err && err_len && !err[0])
        ERR("%s: out of memory", dir);
    kvr_json_free(cfg);
    free(cp);
    kvr_model_destroy(m);
    return st;
}

void kvr_model_destroy(kvr_model_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_files; i++)
        kvr_st_close(m->files[i]);
    free(m->files);
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->w.layers);
    free(m->dir);
    free(m);
}

int32_t kvr_model_n_layers(const kvr_model_t *m)
{
    return m->cfg.n_layers;
}
int32_t kvr_model_n_heads(const kvr_model_t *m)
{
    return m->cfg.n_heads;
}
int32_t kvr_model_n_kv_heads(const kvr_model_t *m)
{
    return m->cfg.n_kv_heads;
}
int32_t kvr_model_head_dim(const kvr_model_t *m)
{
    return m->cfg.head_dim;
}
int32_t kvr_model_hidden(const kvr_model_t *m)
{
    return m->cfg.hidden;
}
int32_t kvr_model_intermediate(const kvr_model_t *m)
{
    return m->cfg.intermediate;
}
int32_t kvr_model_vocab(const kvr_model_t *m)
{
    return m->cfg.vocab;
}
int32_t kvr_model_max_pos(const kvr_model_t *m)
{
    return m->cfg.max_pos;
}
int32_t kvr_model_bos_id(const kvr_model_t *m)
{
    return m->cfg.bos_id;
}
size_t kvr_model_eos_ids(const kvr_model_t *m, const int32_t **ids_p)
{
    *ids_p = m->cfg.eos_ids;
    return m->cfg.n_eos;
}
int32_t kvr_model_eos_id(const kvr_model_t *m)
{
    return m->cfg.n_eos ? m->cfg.eos_ids[0] : -1;
}
const char *kvr_model_arch(const kvr_model_t *m)
{
    switch (m->cfg.arch) {
    case KVR_ARCH_QWEN2:
        return "Qwen2ForCausalLM";
    case KVR_ARCH_MISTRAL:
        return "MistralForCausalLM";
    default:
        return "LlamaForCausalLM";
    }
}
const char *kvr_model_dtype(const kvr_model_t *m)
{
    return kvr_dtype_name(m->w.embed.dtype);
}
uint64_t kvr_model_n_params(const kvr_model_t *m)
{
    return m->n_params;
}
uint64_t kvr_model_fingerprint(const kvr_model_t *m)
{
    return m->fingerprint;
}
