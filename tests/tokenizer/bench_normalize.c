/*
 * bench_normalize.c - what the normalization quick check saves: NFC and
 * NFKC of text that needs no change (ASCII; mixed scripts already in NFC),
 * and of text that does (decomposed accents), through kvr_uni_normalize
 * (quick check, then a copy or utf8proc) and through utf8proc_map alone,
 * in one run.  MB/s of the thread's CPU time, best of 5.
 *
 *   bench_normalize [MB]      (default 4 MB of each text)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tokenizer_unicode.h"

static double cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *fill(const char *unit, size_t bytes, size_t *len_p)
{
    size_t ul = strlen(unit), n = bytes / ul * ul;
    char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i += ul)
        memcpy(b + i, unit, ul);
    b[n] = 0;
    *len_p = n;
    return b;
}

/* best MB/s of 5 passes over text in 4 KiB lines (as a tokenizer sees
 * sections of a prompt) */
static double run(const char *text, size_t len, int form, int direct)
{
    static const utf8proc_option_t opts[] = {UTF8PROC_STABLE | UTF8PROC_COMPOSE, 0,
                                             UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT};
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = cpu();
        for (size_t off = 0; off < len; off += 4096) {
            size_t n = len - off < 4096 ? len - off : 4096;
            while (n < len - off && ((unsigned char)text[off + n] & 0xC0) == 0x80)
                n++; /* whole characters */
            char *o = NULL;
            size_t ol;
            if (direct) {
                utf8proc_uint8_t *m = NULL;
                utf8proc_map((const utf8proc_uint8_t *)text + off, (utf8proc_ssize_t)n, &m,
                             opts[form]);
                o = (char *)m;
            } else {
                kvr_uni_normalize((enum kvr_uni_form)form, text + off, n, &o, &ol);
            }
            free(o);
        }
        double dt = cpu() - t0;
        best = dt < best ? dt : best;
    }
    return (double)len / 1e6 / best;
}

int main(int argc, char **argv)
{
    size_t bytes = (size_t)((argc > 1 ? atof(argv[1]) : 4.0) * 1e6);
    struct {
        const char *name, *unit;
    } texts[] = {
        {"ASCII", "The quick brown fox jumps over the lazy dog; x[i] += 42.\n"},
        {"mixed, already NFC",
         "caf\xc3\xa9 Stra\xc3\x9f"
         "e \xd1\x80\xd1\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9 "
         "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 "
         "\xf0\x9f\x91\x8d hello\n"},
        {"decomposed (changes)",
         "cafe\xcc\x81 nai\xcc\x88ve re\xcc\x81sume\xcc\x81 \xef\xac\x81x\n"},
    };
    printf("| text | form | kvr_uni_normalize MB/s | utf8proc_map MB/s | ratio |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (size_t k = 0; k < sizeof(texts) / sizeof(texts[0]); k++) {
        size_t len;
        char *t = fill(texts[k].unit, bytes, &len);
        for (int form = 0; form <= 2; form += 2) {
            double q = run(t, len, form, 0), d = run(t, len, form, 1);
            printf("| %s | %s | %.1f | %.1f | %.1fx |\n", texts[k].name, form ? "NFKC" : "NFC", q,
                   d, q / d);
        }
        free(t);
    }
    return 0;
}
