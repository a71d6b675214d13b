/*
 * kvr_log.h - leveled logging with component names.
 *
 *   KVR_LOG_INFO("ucx", "connected to %s over %s", peer, tls);
 *
 * prints  "2026-12-01T05:58:44.123Z I ucx[1234]: connected to ..." on stderr.
 * The level comes from KVR_LOG_LEVEL (error|warn|info|debug|trace, default info)
 * or kvr_log_set_level(); the process name from kvr_log_set_process().
 */
#ifndef KVR_LOG_H
#define KVR_LOG_H

#include <stdarg.h>

enum kvr_log_level {
    KVR_LOG_ERROR = 0,
    KVR_LOG_WARN = 1,
    KVR_LOG_INFO = 2,
    KVR_LOG_DEBUG = 3,
    KVR_LOG_TRACE = 4,
};

extern int kvr_log_level_current;

void kvr_log_set_level(enum kvr_log_level level);
/** Parses "error", "warn", "info", "debug", "trace"; returns -1 if unknown. */
int kvr_log_parse_level(const char *name);
/** Names the process in every line (e.g. the node name from the cluster file). */
void kvr_log_set_process(const char *name);

void kvr_log_write(enum kvr_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kvr_log_vwrite(enum kvr_log_level level, const char *component, const char *fmt, va_list ap);

#define KVR_LOG(level, comp, ...)                                                                  \
    do {                                                                                           \
        if ((int)(level) <= kvr_log_level_current)                                                 \
            kvr_log_write((level), (comp), __VA_ARGS__);                                           \
    } while (0)

#define KVR_LOG_ERROR(comp, ...) KVR_LOG(KVR_LOG_ERROR, comp, __VA_ARGS__)
#define KVR_LOG_WARN(comp, ...)  KVR_LOG(KVR_LOG_WARN, comp, __VA_ARGS__)
#define KVR_LOG_INFO(comp, ...)  KVR_LOG(KVR_LOG_INFO, comp, __VA_ARGS__)
#define KVR_LOG_DEBUG(comp, ...) KVR_LOG(KVR_LOG_DEBUG, comp, __VA_ARGS__)
#define KVR_LOG_TRACE(comp, ...) KVR_LOG(KVR_LOG_TRACE, comp, __VA_ARGS__)

#endif
