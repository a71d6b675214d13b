/*
 * kvr_test.h - minimal assertion macros for kvrail's C tests.
 * A failed check prints file:line and the expression, and exits 1.
 * KVR_SKIP(reason) exits 77, meson's skip code.
 */
#ifndef KVR_TEST_H
#define KVR_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define KVR_SKIP(...)                                                                              \
    do {                                                                                           \
        fprintf(stderr, "SKIP: ");                                                                 \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(77);                                                                                  \
    } while (0)

#endif
