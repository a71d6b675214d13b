/*
 * util.c - small helpers every router module uses: the random stream
 * (splitmix64: seeds and tie-breaks), the ring of timing samples behind the
 * Status percentiles, the thread CPU clock, the rate limit of log lines
 * about bad input, and the timer: modules arm the earliest time something is
 * due and the loop sleeps until then (no periodic tick).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

#define BAD_LOG_WINDOW_NS  1000000000ull
#define BAD_LOG_PER_WINDOW 20

uint64_t rt_rand(rt_t *r)
{
    /* splitmix64 */
    uint64_t z = (r->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

size_t rt_prompt_bytes_max(const rt_t *r)
{
    return r->context ? (size_t)r->context * RT_PROMPT_BYTES_PER_TOKEN : RT_PROMPT_BYTES_NO_CTX;
}

uint64_t rt_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void rt_timer_arm(rt_t *r, uint64_t t)
{
    if (t < r->next_deadline)
        r->next_deadline = t;
}

bool rt_bad_log_ok(rt_t *r)
{
    uint64_t now = kvr_now_ns();
    if (now - r->bad_log_window_ns > BAD_LOG_WINDOW_NS) {
        if (r->bad_log_suppressed)
            KVR_LOG_WARN("router", "%" PRIu64 " more log lines about bad input suppressed",
                         r->bad_log_suppressed);
        r->bad_log_window_ns = now;
        r->bad_log_count = 0;
        r->bad_log_suppressed = 0;
    }
    if (r->bad_log_count < BAD_LOG_PER_WINDOW) {
        r->bad_log_count++;
        return true;
    }
    if (!r->bad_log_suppressed++)
        rt_timer_arm(r, r->bad_log_window_ns + BAD_LOG_WINDOW_NS + 1);
    return false;
}

void rt_bad_log_tick(rt_t *r, uint64_t now)
{
    if (!r->bad_log_suppressed)
        return;
    if (now - r->bad_log_window_ns > BAD_LOG_WINDOW_NS)
        rt_bad_log_ok(r); /* logs how many lines were suppressed */
    else
        rt_timer_arm(r, r->bad_log_window_ns + BAD_LOG_WINDOW_NS + 1);
}

void rt_samples_add(struct rt_samples *s, uint64_t ns)
{
    s->v[s->n % RT_SAMPLES] = ns;
    s->n++;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t rt_samples_pct(const struct rt_samples *s, double q)
{
    size_t n = s->n < RT_SAMPLES ? s->n : RT_SAMPLES;
    if (!n)
        return 0;
    static uint64_t tmp[RT_SAMPLES];
    memcpy(tmp, s->v, n * sizeof(uint64_t));
    qsort(tmp, n, sizeof(uint64_t), cmp_u64);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return tmp[i < n ? i : n - 1];
}
