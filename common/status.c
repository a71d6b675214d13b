/*
 * status.c - names and descriptions of kvr_status_t values.
 */
#include "kvr_status.h"

#define STATUS_TABLE(X)                                                                            \
    X(KVR_OK, "success")                                                                           \
    X(KVR_INPROGRESS, "operation in progress")                                                     \
    X(KVR_ERR_INVALID, "invalid argument or malformed input")                                      \
    X(KVR_ERR_NO_MEMORY, "out of memory")                                                          \
    X(KVR_ERR_NO_RESOURCE, "resource temporarily unavailable")                                     \
    X(KVR_ERR_TIMEOUT, "timed out")                                                                \
    X(KVR_ERR_PEER_FAILURE, "peer failure")                                                        \
    X(KVR_ERR_UNSUPPORTED, "operation not supported")                                              \
    X(KVR_ERR_IO, "input/output error")                                                            \
    X(KVR_ERR_VERSION, "version mismatch")                                                         \
    X(KVR_ERR_OUT_OF_RANGE, "out of registered range")                                             \
    X(KVR_ERR_NOT_FOUND, "not found")                                                              \
    X(KVR_ERR_CANCELED, "canceled")                                                                \
    X(KVR_ERR_OVERLOAD, "overloaded")                                                              \
    X(KVR_ERR_MISMATCH, "layout or fingerprint mismatch")                                          \
    X(KVR_ERR_BUSY, "busy")                                                                        \
    X(KVR_ERR_CORRUPT, "corrupt data")                                                             \
    X(KVR_ERR_NO_RDMA, "RDMA required but not available")                                          \
    X(KVR_ERR_CLOSED, "closed")                                                                    \
    X(KVR_ERR_INTERNAL, "internal error")

const char *kvr_status_str(kvr_status_t status)
{
    switch (status) {
#define X(code, text)                                                                              \
    case code:                                                                                     \
        return text;
        STATUS_TABLE(X)
#undef X
    }
    return "unknown status";
}

const char *kvr_status_name(kvr_status_t status)
{
    switch (status) {
#define X(code, text)                                                                              \
    case code:                                                                                     \
        return #code;
        STATUS_TABLE(X)
#undef X
    }
    return "KVR_?";
}
