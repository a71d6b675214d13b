/*
 * tokcheck.c - the C side of the tokenizer oracle test (oracle.mjs).
 *
 *   tokcheck DIR CORPUS.json OUT.json [REPEAT [onig]]
 *   tokcheck --gen FILE VOCAB_SIZE SEED   (writes kvr_tokenizer_gen_bytelevel's file)
 *
 * Loads the tokenizer in DIR, reads CORPUS.json (an array of strings), and
 * writes OUT.json: for every string the ids with and without special tokens,
 * decode() of the ids (with and without skip_special), and whether streaming
 * detokenization (one id at a time, then flush) reproduced decode() exactly
 * and never returned a piece that ends inside a UTF-8 character.  Then it
 * times encode over the whole corpus REPEAT times (default 5) and writes
 * the best time (the thread's CPU time, which other load on the machine
 * does not inflate): "bench": {"bytes": ..., "best_s": ...}.  With "onig" every
 * pre-tokenizer regex runs in Oniguruma (the hand-written fast paths off).
 * Exit 0 when it ran (the comparison is oracle.mjs's job), 1 on error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr_json.h"
#include "kvr_tokenizer.h"
#include "kvr_tokgen.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: stable on a shared machine */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void put_str(FILE *f, const char *s, size_t n)
{
    size_t need = kvr_json_escape(NULL, 0, s, n);
    char *b = malloc(need + 1);
    if (!b) {
        fputs("\"\"", f);
        return;
    }
    kvr_json_escape(b, need + 1, s, n);
    fwrite(b, 1, need, f);
    free(b);
}

static void put_ids(FILE *f, const int32_t *ids, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? "," : "", (int)ids[i]);
    fputc(']', f);
}

/* does s[0..n) end on a character boundary (no partial sequence at its end)? */
static int ends_complete(const char *s, size_t n)
{
    size_t i = n, cont = 0;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80 && cont < 4) {
        i--;
        cont++;
    }
    if (i == 0)
        return cont == 0;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead < 0x80 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    return cont == want || (lead < 0xC0 && cont == 0);
}

static int stream_check(const kvr_tokenizer_t *tok, const int32_t *ids, size_t n, bool skip,
                        const char *want, size_t want_len)
{
    kvr_detok_t *d;
    if (kvr_detok_create(tok, skip, &d) != KVR_OK)
        return 0;
    char *acc = malloc(want_len * 2 + 64);
    size_t al = 0, cap = want_len * 2 + 64;
    int ok = acc != NULL;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *p;
        size_t l;
        kvr_status_t st = i < n ? kvr_detok_feed(d, ids[i], &p, &l) : kvr_detok_flush(d, &p, &l);
        if (st != KVR_OK || !ends_complete(p, l) || al + l > cap) {
            ok = 0;
            break;
        }
        memcpy(acc + al, p, l);
        al += l;
    }
    ok = ok && al == want_len && !memcmp(acc, want, al);
    free(acc);
    kvr_detok_destroy(d);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--gen")) {
        /* tokcheck --gen FILE VOCAB_SIZE SEED: the generator's output, for
         * the oracle to load too */
        kvr_status_t gs =
            kvr_tokenizer_gen_bytelevel(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10));
        if (gs != KVR_OK)
            fprintf(stderr, "tokcheck: gen %s: %s\n", argv[2], kvr_status_name(gs));
        return gs == KVR_OK ? 0 : 1;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: tokcheck DIR CORPUS.json OUT.json [REPEAT [onig]]\n");
        return 1;
    }
    int repeat = argc > 4 ? atoi(argv[4]) : 5;
    char err[512];
    kvr_tokenizer_t *tok;
    /* "onig": every pre-tokenizer regex through Oniguruma (no fast paths) */
    struct kvr_tokenizer_options topts = {.no_fast_paths = argc > 5 && !strcmp(argv[5], "onig")};
    kvr_status_t st = kvr_tokenizer_load_opts(argv[1], &topts, &tok, err, sizeof(err));
    if (st != KVR_OK) {
        fprintf(stderr, "tokcheck: %s (%s)\n", err, kvr_status_name(st));
        return 1;
    }
    kvr_json_doc_t *doc;
    st = kvr_json_parse_file(argv[2], &doc, err, sizeof(err));
    if (st != KVR_OK) {
        fprintf(stderr, "tokcheck: %s\n", err);
        return 1;
    }
    const kvr_json_t *corpus = kvr_json_root(doc);
    if (corpus->type != KVR_JSON_ARRAY) {
        fprintf(stderr, "tokcheck: %s: not an array of strings\n", argv[2]);
        return 1;
    }
    FILE *f = fopen(argv[3], "w");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    fprintf(f, "{\"kind\":\"%s\",\"vocab_size\":%d,\"bos\":%d,\"eos\":%d,\"results\":[\n",
            kvr_tokenizer_kind(tok), (int)kvr_tokenizer_vocab_size(tok),
            (int)kvr_tokenizer_bos_id(tok), (int)kvr_tokenizer_eos_id(tok));
    size_t bytes = 0;
    for (size_t i = 0; i < corpus->n; i++) {
        const kvr_json_t *s = corpus->items[i];
        if (s->type != KVR_JSON_STRING) {
            fprintf(stderr, "tokcheck: corpus[%zu] is not a string\n", i);
            return 1;
        }
        bytes += s->len;
        int32_t *ids, *ids_ns;
        size_t n, n_ns;
        if (kvr_tokenizer_encode(tok, s->str, s->len, true, &ids, &n) != KVR_OK ||
            kvr_tokenizer_encode(tok, s->str, s->len, false, &ids_ns, &n_ns) != KVR_OK) {
            fprintf(stderr, "tokcheck: encode failed on corpus[%zu]\n", i);
            return 1;
        }
        char *dec, *dec_skip;
        size_t dl, dsl;
        if (kvr_tokenizer_decode(tok, ids_ns, n_ns, false, &dec, &dl) != KVR_OK ||
            kvr_tokenizer_decode(tok, ids, n, true, &dec_skip, &dsl) != KVR_OK) {
            fprintf(stderr, "tokcheck: decode failed on corpus[%zu]\n", i);
            return 1;
        }
        int s1 = stream_check(tok, ids_ns, n_ns, false, dec, dl);
        int s2 = stream_check(tok, ids, n, true, dec_skip, dsl);
        fprintf(f, "%s{\"ids\":", i ? ",\n" : "");
        put_ids(f, ids, n);
        fprintf(f, ",\"ids_nospecial\":");
        put_ids(f, ids_ns, n_ns);
        fprintf(f, ",\"decoded\":");
        put_str(f, dec, dl);
        fprintf(f, ",\"decoded_skip\":");
        put_str(f, dec_skip, dsl);
        fprintf(f, ",\"stream_ok\":%s}", s1 && s2 ? "true" : "false");
        free(ids);
        free(ids_ns);
        free(dec);
        free(dec_skip);
    }
    /* every id of the vocabulary, in chunks of 256 of a stride permutation:
     * decode() of each chunk (the oracle compares it) and streaming of all */
    {
        int32_t nv = kvr_tokenizer_vocab_size(tok);
        int64_t stride = 7919;
        while (nv % stride == 0)
            stride += 2;
        int32_t *perm = malloc((size_t)nv * sizeof(int32_t));
        size_t np = 0;
        for (int64_t i = 0; perm && i < nv; i++) {
            int32_t id = (int32_t)((i * stride + 13) % nv);
            if (kvr_tokenizer_id_to_piece(tok, id, NULL))
                perm[np++] = id;
        }
        fprintf(f, "\n],\"vocab_chunks\":[");
        int all_ok = perm != NULL;
        for (size_t c = 0; perm && c < np; c += 256) {
            size_t m = np - c < 256 ? np - c : 256;
            char *dec;
            size_t dl;
            if (kvr_tokenizer_decode(tok, perm + c, m, false, &dec, &dl) != KVR_OK) {
                fprintf(stderr, "tokcheck: decode of vocabulary chunk %zu failed\n", c / 256);
                return 1;
            }
            all_ok = all_ok && stream_check(tok, perm + c, m, false, dec, dl);
            fprintf(f, "%s\n{\"ids\":", c ? "," : "");
            put_ids(f, perm + c, m);
            fprintf(f, ",\"decoded\":");
            put_str(f, dec, dl);
            fputc('}', f);
            free(dec);
        }
        fprintf(f, "],\"vocab_stream_ok\":%s", all_ok ? "true" : "false");
        free(perm);
    }
    /* throughput: encode (no specials added) over the corpus, best of REPEAT */
    double best = 1e9;
    size_t total_ids = 0;
    for (int r = 0; r < repeat; r++) {
        double t0 = now();
        total_ids = 0;
        for (size_t i = 0; i < corpus->n; i++) {
            int32_t *ids;
            size_t n;
            kvr_tokenizer_encode(tok, corpus->items[i]->str, corpus->items[i]->len, false, &ids,
                                 &n);
            total_ids += n;
            free(ids);
        }
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    fprintf(f, ",\"bench\":{\"bytes\":%zu,\"tokens\":%zu,\"best_s\":%.6f}}\n", bytes, total_ids,
            best);
    fclose(f);
    kvr_json_free(doc);
    kvr_tokenizer_destroy(tok);
    return 0;
}
