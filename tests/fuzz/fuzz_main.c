/*
 * fuzz_main.c - the driver of a fuzz target when it is not built with
 * libFuzzer: runs LLVMFuzzerTestOneInput on every file named (directories:
 * every file in them, sorted), then, with --mutate N, on N deterministic
 * mutations of each (bytes flipped, set to 0/0xff, inserted, removed, the
 * input cut), from a fixed seed, so CI replays the same inputs every time.
 *
 *   fuzz-router [--mutate N] [--seed S] PATH...
 *
 * Exit 0 when every input ran (a crash is the failure); prints how many.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t runs;

static void run_mutations(const uint8_t *buf, size_t len, long n)
{
    uint8_t *m = malloc(len + 64);
    if (!m)
        return;
    for (long i = 0; i < n; i++) {
        size_t ml = len;
        memcpy(m, buf, len);
        int edits = 1 + (int)(rnd() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = ml ? rnd() % ml : 0;
            switch (rnd() % 6) {
            case 0:
                if (ml)
                    m[at] ^= (uint8_t)(1u << (rnd() % 8));
                break;
            case 1:
                if (ml)
                    m[at] = (rnd() & 1) ? 0xff : 0;
                break;
            case 2:
                if (ml)
                    m[at] = (uint8_t)rnd();
                break;
            case 3:
                if (ml < len + 64) {
                    memmove(m + at + 1, m + at, ml - at);
                    m[at] = (uint8_t)rnd();
                    ml++;
                }
                break;
            case 4:
                if (ml) {
                    memmove(m + at, m + at + 1, ml - at - 1);
                    ml--;
                }
                break;
            default:
                ml = at;
                break;
            }
        }
        LLVMFuzzerTestOneInput(m, ml);
        runs++;
    }
    free(m);
}

static int run_file(const char *path, long mutate)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    if (!buf || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
        fprintf(stderr, "%s: cannot read\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    runs++;
    run_mutations(buf, (size_t)len, mutate);
    free(buf);
    return 0;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path, long mutate)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return run_file(path, mutate);
    DIR *d = opendir(path);
    if (!d) {
        perror(path);
        return -1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char **nn = realloc(names, (n + 1) * sizeof(*nn));
        if (!nn)
            break;
        names = nn;
        size_t l = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(l);
        snprintf(names[n], l, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (run_file(names[i], mutate) != 0)
            rc = -1;
        free(names[i]);
    }
    free(names);
    if (!n) {
        fprintf(stderr, "%s: no inputs\n", path);
        rc = -1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    long mutate = 0;
    rng_state = 1;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--mutate") && i + 1 < argc)
            mutate = atol(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            rng_state = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: %s [--mutate N] [--seed S] PATH...\n", argv[0]);
            return 2;
        }
    }
    if (i == argc) {
        fprintf(stderr, "usage: %s [--mutate N] [--seed S] PATH...\n", argv[0]);
        return 2;
    }
    int rc = 0;
    for (; i < argc; i++)
        if (run_path(argv[i], mutate) != 0)
            rc = 1;
    printf("%zu inputs ran\n", runs);
    return rc;
}
