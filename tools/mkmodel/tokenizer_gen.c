/*
 * tokenizer_gen.c - writes a small but real byte-level BPE tokenizer.json for
 * generated test models (tools/mkmodel).
 *
 * The built-in English/code sample is pre-tokenized with Llama 3's regex
 * (the same matcher encode uses); BPE training then repeatedly merges the
 * most frequent adjacent pair (counted over distinct words weighted by their
 * frequency; ties broken by a hash of the pair and the seed) until the
 * vocabulary is full or no pair occurs twice.  Ids: 0-255 the bytes (in
 * ByteLevel spelling), 256-258 the special tokens <|begin_of_text|>,
 * <|end_of_text|>, <|eot_id|>, then the merges; whatever is left of
 * vocab_size is filled with <|reserved_special_token_N|>.  The file uses the
 * Llama 3 pre-tokenizer and a TemplateProcessing post-processor that
 * prepends <|begin_of_text|>, so the tokenizer loads here and in Hugging
 * Face's implementations alike.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_json.h"
#include "kvr_log.h"
#include "kvr_tokgen.h"
#include "tokenizer_pretok.h"
#include "tokenizer_unicode.h"

static const char SAMPLE[] =
    "The quick brown fox jumps over the lazy dog. A disaggregated inference cluster splits "
    "the work of a language model in two: prefill nodes read the whole prompt at once and "
    "build its key-value cache, while decode nodes extend that cache one token at a time. "
    "The router assigns every request to a pair of nodes, and it remembers where each block "
    "of the cache lives, so that a prompt which shares a prefix with an earlier one is sent "
    "where that prefix is already stored. When the prefill node has computed a layer, it "
    "writes the layer's keys and values straight into the memory of the decode node, with "
    "one-sided remote writes, and then it moves on to the next layer.\n"
    "Once upon a time there was a little girl who lived in a village near the forest. "
    "Whenever she went out, the little girl wore a red riding cloak, so everyone in the "
    "village called her Little Red Riding Hood. One morning, she asked her mother if she "
    "could go to visit her grandmother, as it had been a while since they had seen each "
    "other. \"That's a good idea,\" her mother said. They packed a nice basket for her to "
    "take to her grandmother, and she set off through the woods.\n"
    "In 2024 the team measured 1,250 tokens per second on 8 cores; in 2025 they reached "
    "3,400 with better kernels. The numbers 0 1 2 3 4 5 6 7 8 9 10 11 12 100 256 1024 4096 "
    "appear often in code.\n"
    "def forward(self, x):\n"
    "    h = self.embed(x)\n"
    "    for layer in self.layers:\n"
    "        h = layer(h)\n"
    "    return self.norm(h)\n\n"
    "int main(int argc, char **argv)\n"
    "{\n"
    "    for (int i = 0; i < argc; i++)\n"
    "        printf(\"%s\\n\", argv[i]);\n"
    "    return 0;\n"
    "}\n"
    "{\"model\": \"llama\", \"layers\": 32, \"heads\": 8, \"vocab_size\": 32000}\n"
    "It's what we're doing: they'll see that I'm right, and you've got to admit it's not "
    "what we'd planned. Isn't it? We can't stop now; we won't.\n"
    "Hello, world! How are you today? I am fine, thank you. What time is it? It is ten "
    "o'clock in the morning, and the weather is nice and sunny outside.\n"
    "The tokenizer turns text into numbers, and the detokenizer turns numbers back into "
    "text. Streaming output must never break a character in half: some characters, like "
    "caf\xc3\xa9, na\xc3\xafve, \xe6\x97\xa5\xe6\x9c\xac or \xf0\x9f\x98\x80, take more "
    "than one byte.\n";

static const char *const SPECIALS[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"};
enum { N_SPECIAL = 3 };

struct word {
    int32_t *sym;
    size_t n;
    uint32_t count;
};

struct wordset {
    struct word *w;
    size_t n, cap;
};

static kvr_status_t add_word(void *ctx, const char *s, size_t len)
{
    struct wordset *ws = ctx;
    for (size_t i = 0; i < ws->n; i++) {
        struct word *w = &ws->w[i];
        if (w->n != len)
            continue;
        size_t k = 0;
        while (k < len && w->sym[k] == (unsigned char)s[k])
            k++;
        if (k == len) {
            w->count++;
            return KVR_OK;
        }
    }
    if (ws->n == ws->cap) {
        size_t cap = ws->cap ? ws->cap * 2 : 256;
        struct word *p = realloc(ws->w, cap * sizeof(*p));
        if (!p)
            return KVR_ERR_NO_MEMORY;
        ws->w = p;
        ws->cap = cap;
    }
    struct word *w = &ws->w[ws->n];
    w->sym = malloc(len * sizeof(int32_t));
    if (!w->sym)
        return KVR_ERR_NO_MEMORY;
    for (size_t k = 0; k < len; k++)
        w->sym[k] = (unsigned char)s[k];
    w->n = len;
    w->count = 1;
    ws->n++;
    return KVR_OK;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ByteLevel spelling of a byte string */
static size_t bytelevel_spell(const unsigned char *b, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned c = b[i];
        uint32_t cp;
        if ((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE) {
            cp = c;
        } else {
            /* the n-th byte outside the printable ranges maps to 256 + n */
            unsigned k = 0;
            for (unsigned d = 0; d < c; d++)
                if (!((d >= '!' && d <= '~') || (d >= 0xA1 && d <= 0xAC) || d >= 0xAE))
                    k++;
            cp = 256 + k;
        }
        o += kvr_utf8_put(cp, out + o);
    }
    return o;
}

static void put_json_str(FILE *f, const char *s, size_t n)
{
    char small[256];
    size_t need = kvr_json_escape(NULL, 0, s, n);
    char *b = need < sizeof(small) ? small : malloc(need + 1);
    if (!b)
        return;
    kvr_json_escape(b, need + 1, s, n); /* + 1: it NUL-terminates */
    fwrite(b, 1, need, f);
    if (b != small)
        free(b);
}

kvr_status_t kvr_tokenizer_gen_bytelevel(const char *path, int vocab_size, uint64_t seed)
{
    if (!path || vocab_size < 256 + N_SPECIAL || vocab_size > (1 << 22)) {
        KVR_LOG_ERROR("tokenizer", "gen: vocab_size %d outside [%d, %d]", vocab_size,
                      256 + N_SPECIAL, 1 << 22);
        return KVR_ERR_INVALID;
    }
    kvr_status_t st = KVR_OK;
    struct wordset ws = {0};
    /* token id -> bytes */
    size_t n_tok = 256 + N_SPECIAL;
    unsigned char **tb = calloc((size_t)vocab_size, sizeof(*tb));
    size_t *tl = calloc((size_t)vocab_size, sizeof(*tl));
    int32_t(*merge)[2] = calloc((size_t)vocab_size, sizeof(*merge));
    size_t n_merge = 0;
    FILE *f = NULL;
    char *spell = NULL;
    if (!tb || !tl || !merge) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    for (int b = 0; b < 256; b++) {
        tb[b] = malloc(1);
        if (!tb[b]) {
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
        tb[b][0] = (unsigned char)b;
        tl[b] = 1;
    }
    st = kvr_pretok_split(KVR_PRETOK_LLAMA3, SAMPLE, sizeof(SAMPLE) - 1, add_word, &ws);
    if (st != KVR_OK)
        goto out;

    while (n_tok < (size_t)vocab_size) {
        /* count pairs: a small open-addressing table */
        size_t cap = 1 << 16;
        uint64_t *key = malloc(cap * sizeof(uint64_t));
        uint32_t *cnt = calloc(cap, sizeof(uint32_t));
        if (!key || !cnt) {
            free(key);
            free(cnt);
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
        memset(key, 0xff, cap * sizeof(uint64_t));
        uint64_t best = UINT64_MAX, best_tie = 0;
        uint32_t best_cnt = 0;
        for (size_t i = 0; i < ws.n; i++) {
            const struct word *w = &ws.w[i];
            for (size_t k = 0; k + 1 < w->n; k++) {
                uint64_t kk = (uint64_t)(uint32_t)w->sym[k] << 32 | (uint32_t)w->sym[k + 1];
                size_t h = mix(kk) & (cap - 1);
                while (key[h] != UINT64_MAX && key[h] != kk)
                    h = (h + 1) & (cap - 1);
                key[h] = kk;
                cnt[h] += w->count;
                uint64_t tie = mix(kk ^ seed);
                if (cnt[h] > best_cnt || (cnt[h] == best_cnt && tie < best_tie)) {
                    best = kk;
                    best_cnt = cnt[h];
                    best_tie = tie;
                }
            }
        }
        free(key);
        free(cnt);
        if (best_cnt < 2)
            break;
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xffffffffu);
        int32_t id = (int32_t)n_tok;
        tl[id] = tl[a] + tl[b];
        tb[id] = malloc(tl[id]);
        if (!tb[id]) {
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
        memcpy(tb[id], tb[a], tl[a]);
        memcpy(tb[id] + tl[a], tb[b], tl[b]);
        /* the same bytes may already be a token (ab+c after a+bc): reuse it */
        for (size_t j = 256 + N_SPECIAL; j < n_tok; j++) {
            if (tl[j] == tl[id] && !memcmp(tb[j], tb[id], tl[id])) {
                free(tb[id]);
                tb[id] = NULL;
                id = (int32_t)j;
                break;
            }
        }
        if (n_merge == (size_t)vocab_size)
            break; /* cannot happen before the vocabulary fills; a bound */
        merge[n_merge][0] = a;
        merge[n_merge][1] = b;
        n_merge++;
        if (id == (int32_t)n_tok)
            n_tok++;
        for (size_t i = 0; i < ws.n; i++) {
            struct word *w = &ws.w[i];
            size_t o = 0;
            for (size_t k = 0; k < w->n; k++) {
                if (k + 1 < w->n && w->sym[k] == a && w->sym[k + 1] == b) {
                    w->sym[o++] = id;
                    k++;
                } else {
                    w->sym[o++] = w->sym[k];
                }
            }
            w->n = o;
        }
    }

    f = fopen(path, "w");
    if (!f) {
        KVR_LOG_ERROR("tokenizer", "gen: cannot write %s", path);
        st = KVR_ERR_IO;
        goto out;
    }
    size_t max_len = 0;
    for (size_t i = 0; i < n_tok; i++)
        if (i < 256 || i >= 256 + N_SPECIAL)
            max_len = tl[i] > max_len ? tl[i] : max_len;
    spell = malloc(max_len * 4 * 2 + 16);
    if (!spell) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    fprintf(f, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
               "  \"added_tokens\": [\n");
    int n_added = N_SPECIAL + (vocab_size - (int)n_tok);
    for (int i = 0; i < n_added; i++) {
        char name[64];
        int id = i < N_SPECIAL ? 256 + i : (int)n_tok + (i - N_SPECIAL);
        if (i < N_SPECIAL)
            snprintf(name, sizeof(name), "%s", SPECIALS[i]);
        else
            snprintf(name, sizeof(name), "<|reserved_special_token_%d|>", i - N_SPECIAL);
        fprintf(f,
                "    {\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": "
                "false, \"rstrip\": false, \"normalized\": false, \"special\": true}%s\n",
                id, name, i + 1 < n_added ? "," : "");
    }
    fprintf(f, "  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\"type\": \"Sequence\", "
               "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": ");
    put_json_str(f, kvr_pretok_regex_llama3, strlen(kvr_pretok_regex_llama3));
    fprintf(f, "}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
               "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}]},\n");
    fprintf(f, "  \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
               "[{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\", \"type_id\": 0}}, "
               "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": "
               "{\"id\": \"<|begin_of_text|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
               "\"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<|begin_of_text|>\", "
               "\"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
               "\"special_tokens\": {\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", "
               "\"ids\": [256], \"tokens\": [\"<|begin_of_text|>\"]}}},\n");
    fprintf(f, "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
               "\"trim_offsets\": true, \"use_regex\": true},\n");
    fprintf(f, "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
               "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, "
               "\"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
               "    \"vocab\": {");
    bool first = true;
    for (size_t i = 0; i < n_tok; i++) {
        if (i >= 256 && i < 256 + N_SPECIAL)
            continue;
        size_t sl = bytelevel_spell(tb[i], tl[i], spell);
        fprintf(f, "%s\n      ", first ? "" : ",");
        put_json_str(f, spell, sl);
        fprintf(f, ": %zu", i);
        first = false;
    }
    fprintf(f, "\n    },\n    \"merges\": [");
    for (size_t m = 0; m < n_merge; m++) {
        size_t al = bytelevel_spell(tb[merge[m][0]], tl[merge[m][0]], spell);
        spell[al++] = ' ';
        size_t bl = bytelevel_spell(tb[merge[m][1]], tl[merge[m][1]], spell + al);
        fprintf(f, "%s\n      ", m ? "," : "");
        put_json_str(f, spell, al + bl);
    }
    fprintf(f, "\n    ]\n  }\n}\n");
    if (fclose(f) != 0) {
        f = NULL;
        KVR_LOG_ERROR("tokenizer", "gen: writing %s failed", path);
        st = KVR_ERR_IO;
        goto out;
    }
    f = NULL;
    KVR_LOG_DEBUG("tokenizer", "gen: %s: %d ids, %zu merges learned", path, vocab_size, n_merge);

out:
    if (f)
        fclose(f);
    free(spell);
    for (size_t i = 0; i < ws.n; i++)
        free(ws.w[i].sym);
    free(ws.w);
    for (int i = 0; tb && i < vocab_size; i++)
        free(tb[i]);
    free(tb);
    free(tl);
    free(merge);
    return st;
}
