/*
 * proto_err.h - private to proto/: the one formatter of the "err, err_len"
 * messages that frame.c and curve.c return to their callers.
 */
#ifndef KVR_PROTO_ERR_H
#define KVR_PROTO_ERR_H

#include <stddef.h>

/** printf into err (err_len bytes, NUL-terminated); nothing when err is NULL. */
void kvr_proto_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
