/*
 * log.c - leveled, component-tagged logging to stderr.
 *
 * One line per call, written with a single write(2) so lines from several
 * threads or processes sharing a terminal do not interleave.
 */
#include "kvr_log.h"
#include "kvr_clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

int kvr_log_level_current = KVR_LOG_INFO;
static char log_process[48] = "kvrail";
static const char level_char[] = {'E', 'W', 'I', 'D', 'T'};

__attribute__((constructor)) static void log_init_from_env(void)
{
    const char *env = getenv("KVR_LOG_LEVEL");
    int lvl = env ? kvr_log_parse_level(env) : -1;
    if (lvl >= 0)
        kvr_log_level_current = lvl;
}

void kvr_log_set_level(enum kvr_log_level level)
{
    kvr_log_level_current = (int)level;
}

int kvr_log_parse_level(const char *name)
{
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; i++)
        if (strcasecmp(name, names[i]) == 0)
            return i;
    return -1;
}

void kvr_log_set_process(const char *name)
{
    snprintf(log_process, sizeof(log_process), "%s", name);
}

void kvr_log_vwrite(enum kvr_log_level level, const char *component, const char *fmt, va_list ap)
{
    char line[2048];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(
        line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %c %s %s[%d]: ", tm.tm_year + 1900,
        tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
        level_char[level < 0 || level > 4 ? 0 : level], log_process, component, (int)getpid());
    if (n < 0)
        return;
    if ((size_t)n < sizeof(line))
        n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    if ((size_t)n >= sizeof(line) - 1)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

void kvr_log_write(enum kvr_log_level level, const char *component, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvr_log_vwrite(level, component, fmt, ap);
    va_end(ap);
}

void kvr_sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}
