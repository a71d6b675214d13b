/*
 * kvr_test.h - minimal assertion macros for kvrail's C tests.
 * A failed check prints file:line and the expression, and exits 1.
 * KVR_SKIP(reason) exits 77, meson's skip code.
 * kvr_test_mkdtemp / kvr_test_rmtree: a test's work directory under $TMPDIR,
 * removed when the test passes, kept (and named) when it fails.
 */
#ifndef KVR_TEST_H
#define KVR_TEST_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVR_CHECK(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define KVR_CHECK_EQ(a, b)                                                                         \
    do {                                                                                           \
        long long _a = (long long)(a), _b = (long long)(b);                                        \
        if (_a != _b) {                                                                            \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b,  \
                    _a, _b);                                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define KVR_CHECK_STATUS(expr, want)                                                               \
    do {                                                                                           \
        int _s = (int)(expr);                                                                      \
        if (_s != (int)(want)) {                                                                   \
            fprintf(stderr, "%s:%d: %s returned %s (%d), want %s\n", __FILE__, __LINE__, #expr,    \
                    kvr_status_name((kvr_status_t)_s), _s, #want);                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* KVR_EXPECT(cond, fmt, ...): a check that goes on after a failure, saying
 * what was wrong and counting it in kvr_test_fails (the test returns
 * non-zero at its end when it is not 0). */
static int kvr_test_fails __attribute__((unused));
#define KVR_EXPECT(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            kvr_test_fails++;                                                                      \
        }                                                                                          \
    } while (0)

/* set by KVR_SKIP: a skipped test's work directories go like a passed one's */
static int kvr_test_skipping_ __attribute__((unused));

#define KVR_SKIP(...)                                                                              \
    do {                                                                                           \
        kvr_test_skipping_ = 1;                                                                    \
        fprintf(stderr, "SKIP: ");                                                                 \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(77);                                                                                  \
    } while (0)

/*
 * Work directories, the same policy as tests/integration/cluster_lib.py's
 * workdir(): kvr_test_mkdtemp makes $TMPDIR/NAME-XXXXXX (/tmp without
 * TMPDIR; tests/run.sh gives each run a TMPDIR of its own) and records it;
 * a passing test removes it with kvr_test_rmtree (nftw, no shell).  One
 * still recorded at exit (a failed KVR_CHECK exits 1 there) is kept for
 * diagnosis and named on stderr, less its model weights (*.safetensors,
 * *.gguf: kvrail-mkmodel remakes them bit for bit) unless KVR_KEEP_WORKDIR=1,
 * which also keeps a passing test's directory.  A test killed by a signal
 * (meson's timeout) runs no atexit and keeps it whole.
 */
#define KVR_TEST_MAX_DIRS 8
static char kvr_test_dirs_[KVR_TEST_MAX_DIRS][512] __attribute__((unused));

static inline int kvr_test_keep_all_(void)
{
    const char *k = getenv("KVR_KEEP_WORKDIR");
    return k && strcmp(k, "1") == 0;
}

static inline int kvr_test_rm_(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)st, (void)type, (void)f;
    remove(path); /* depth first: a directory is empty by its turn */
    return 0;
}

static inline int kvr_test_drop_weights_(const char *path, const struct stat *st, int type,
                                         struct FTW *f)
{
    (void)st, (void)f;
    const char *dot = strrchr(path, '.');
    if (type == FTW_F && dot && (strcmp(dot, ".safetensors") == 0 || strcmp(dot, ".gguf") == 0))
        unlink(path);
    return 0;
}

static inline void kvr_test_workdirs_at_exit_(void)
{
    int keep_all = kvr_test_keep_all_();
    for (int i = 0; i < KVR_TEST_MAX_DIRS; i++) {
        char *d = kvr_test_dirs_[i];
        if (!d[0])
            continue;
        if (kvr_test_skipping_ && !keep_all) {
            nftw(d, kvr_test_rm_, 16, FTW_DEPTH | FTW_PHYS);
        } else if (keep_all) {
            fprintf(stderr, "kept %s (KVR_KEEP_WORKDIR=1)\n", d);
        } else {
            nftw(d, kvr_test_drop_weights_, 16, FTW_PHYS);
            fprintf(stderr,
                    "kept %s for diagnosis, model weights removed (KVR_KEEP_WORKDIR=1 keeps "
                    "everything)\n",
                    d);
        }
        d[0] = 0;
    }
}

/* Makes $TMPDIR/NAME-XXXXXX in buf (n bytes) and records it; buf or NULL. */
static inline char *kvr_test_mkdtemp(char *buf, size_t n, const char *name)
{
    static int registered;
    const char *t = getenv("TMPDIR");
    int r = snprintf(buf, n, "%s/%s-XXXXXX", t && t[0] ? t : "/tmp", name);
    if (r < 0 || (size_t)r >= n || (size_t)r >= sizeof kvr_test_dirs_[0] || !mkdtemp(buf))
        return NULL;
    for (int i = 0; i < KVR_TEST_MAX_DIRS; i++) {
        if (!kvr_test_dirs_[i][0]) {
            memcpy(kvr_test_dirs_[i], buf, (size_t)r + 1);
            if (!registered++)
                atexit(kvr_test_workdirs_at_exit_);
            return buf;
        }
    }
    rmdir(buf);
    return NULL;
}

/* Removes a directory from kvr_test_mkdtemp and everything in it: the end
 * of a passing test (kept, and said, under KVR_KEEP_WORKDIR=1). */
static inline void kvr_test_rmtree(const char *dir)
{
    for (int i = 0; i < KVR_TEST_MAX_DIRS; i++) {
        if (strcmp(kvr_test_dirs_[i], dir) != 0)
            continue;
        if (kvr_test_keep_all_()) {
            fprintf(stderr, "kept %s (KVR_KEEP_WORKDIR=1)\n", dir);
        } else {
            nftw(dir, kvr_test_rm_, 16, FTW_DEPTH | FTW_PHYS);
        }
        kvr_test_dirs_[i][0] = 0;
        return;
    }
}

#endif
