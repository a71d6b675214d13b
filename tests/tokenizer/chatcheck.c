/*
 * chatcheck.c - the C side of the chat template oracle (chat_oracle.mjs).
 *
 *   chatcheck CASES.json OUT.json
 *   chatcheck --bench TEMPLATE_FILE MESSAGES.json N   (p50 / p99 of N renders)
 *
 * CASES.json is a list of {"template": text, "messages": [...],
 * "add_generation_prompt": bool, "bos_token", "eos_token", "tools",
 * "extra"}; OUT.json gets, for each, {"ok": true, "text": ...} or
 * {"ok": false, "error": ...}.  The comparison is the oracle's job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr_chat.h"
#include "kvr_json.h"

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

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench(const char *tfile, const char *mfile, int n)
{
    kvr_json_doc_t *td = NULL, *md = NULL;
    char err[512];
    FILE *f = fopen(tfile, "rb");
    if (!f) {
        perror(tfile);
        return 1;
    }
    static char src[1 << 20];
    size_t sl = fread(src, 1, sizeof(src) - 1, f);
    fclose(f);
    (void)td;
    if (kvr_json_parse_file(mfile, &md, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "chatcheck: %s\n", err);
        return 1;
    }
    kvr_chat_template_t *t;
    if (kvr_chat_template_new(src, sl, &t, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "chatcheck: %s\n", err);
        return 1;
    }
    struct kvr_chat_options o = {
        .add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>"};
    double *ts = malloc((size_t)n * sizeof(double));
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        char *out;
        double t0 = now();
        if (kvr_chat_template_render(t, kvr_json_root(md), &o, &out, &len, err, sizeof(err)) !=
            KVR_OK) {
            fprintf(stderr, "chatcheck: %s\n", err);
            return 1;
        }
        ts[i] = now() - t0;
        free(out);
    }
    qsort(ts, (size_t)n, sizeof(double), cmp_d);
    printf("{\"renders\": %d, \"bytes\": %zu, \"p50_us\": %.2f, \"p99_us\": %.2f}\n", n, len,
           ts[n / 2] * 1e6, ts[(size_t)n * 99 / 100] * 1e6);
    free(ts);
    kvr_chat_template_destroy(t);
    kvr_json_free(md);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--bench"))
        return bench(argv[2], argv[3], atoi(argv[4]));
    if (argc != 3) {
        fprintf(stderr,
                "usage: chatcheck CASES.json OUT.json | --bench TEMPLATE MESSAGES.json N\n");
        return 2;
    }
    kvr_json_doc_t *doc;
    char err[512];
    if (kvr_json_parse_file(argv[1], &doc, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "chatcheck: %s\n", err);
        return 1;
    }
    const kvr_json_t *cases = kvr_json_root(doc);
    FILE *f = fopen(argv[2], "w");
    if (!f || cases->type != KVR_JSON_ARRAY) {
        fprintf(stderr, "chatcheck: cannot write %s or cases not a list\n", argv[2]);
        return 1;
    }
    fputs("[\n", f);
    for (size_t i = 0; i < cases->n; i++) {
        const kvr_json_t *c = cases->items[i];
        const kvr_json_t *tp = kvr_json_get(c, "template");
        struct kvr_chat_options o = {
            .add_generation_prompt = kvr_json_get_bool(c, "add_generation_prompt", false, NULL),
            .bos_token = kvr_json_get_str(c, "bos_token", "", NULL),
            .eos_token = kvr_json_get_str(c, "eos_token", "", NULL),
            .tools = kvr_json_get(c, "tools"),
            .extra = kvr_json_get(c, "extra"),
            .now = 1700000000,
        };
        if (o.tools && o.tools->type == KVR_JSON_NULL)
            o.tools = NULL;
        char *out = NULL;
        size_t len = 0;
        kvr_status_t st = kvr_chat_render(tp->str, tp->len, kvr_json_get(c, "messages"), &o, &out,
                                          &len, err, sizeof(err));
        fputs(i ? ",\n" : "", f);
        if (st == KVR_OK) {
            fputs("{\"ok\": true, \"text\": ", f);
            put_str(f, out, len);
            free(out);
        } else {
            fprintf(f, "{\"ok\": false, \"status\": \"%s\", \"error\": ", kvr_status_name(st));
            put_str(f, err, strlen(err));
        }
        fputs("}", f);
    }
    fputs("\n]\n", f);
    fclose(f);
    kvr_json_free(doc);
    return 0;
}
