/*
 * kvr_clock.h - monotonic time.  Every timeout in kvrail is computed from
 * these; wall-clock time is never used for waits.
 */
#ifndef KVR_CLOCK_H
#define KVR_CLOCK_H

#include <stdint.h>
#include <time.h>

/** Monotonic nanoseconds since an arbitrary epoch (CLOCK_MONOTONIC). */
static inline uint64_t kvr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvr_now_us(void)
{
    return kvr_now_ns() / 1000u;
}

static inline uint64_t kvr_now_ms(void)
{
    return kvr_now_ns() / 1000000u;
}

/** Deadline helper: returns now + timeout_ms in ns; timeout_ms < 0 is refused
 *  by callers (nothing waits forever), so it is clamped to 0 here. */
static inline uint64_t kvr_deadline_ns(int timeout_ms)
{
    return kvr_now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
}

/** Sleeps for at least ns nanoseconds. */
void kvr_sleep_ns(uint64_t ns);

#endif
