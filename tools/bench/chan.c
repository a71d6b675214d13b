/*
 * chan.c - the TCP side channel of kvrail-bench.
 *
 * Target and initiator exchange the engine address blob, the pool's rkey
 * blob and, in --check mode, one acknowledgement per verified post.  Every
 * message is a 8-byte header (type, payload length; host byte order: both
 * ends run the same binary) followed by the payload.  Every wait is bounded:
 * accept and connect by the caller's timeout, each send/recv by poll().
 */
#include "bench.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHAN_MAX_MSG (64u << 20)
#define CHAN_IO_MS   10000

struct chan_hdr {
    uint32_t type;
    uint32_t len;
};

/* Splits "[HOST:]PORT" into host (may be empty) and port. */
static kvr_status_t split_hostport(const char *spec, char *host, size_t host_len, char *port,
                                   size_t port_len)
{
    const char *colon = strrchr(spec, ':');
    const char *p = colon ? colon + 1 : spec;
    size_t hl = colon ? (size_t)(colon - spec) : 0;
    if (*p == '\0' || strlen(p) >= port_len || hl >= host_len) {
        KVR_LOG_ERROR("bench", "bad address '%s' (want [HOST:]PORT)", spec);
        return KVR_ERR_INVALID;
    }
    for (const char *c = p; *c; c++) {
        if (*c < '0' || *c > '9') {
            KVR_LOG_ERROR("bench", "bad port in '%s' (want [HOST:]PORT)", spec);
            return KVR_ERR_INVALID;
        }
    }
    memcpy(host, spec, hl);
    host[hl] = '\0';
    /* [v6]:port */
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    snprintf(port, port_len, "%s", p);
    return KVR_OK;
}

static void set_sock_opts(int fd)
{
    int one = 1;
    struct timeval tv = {.tv_sec = CHAN_IO_MS / 1000, .tv_usec = 0};
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

kvr_status_t bench_chan_listen(const char *spec, int *fd_p)
{
    char host[256], port[16];
    struct addrinfo hints = {0}, *res = NULL, *ai;
    kvr_status_t st = split_hostport(spec, host, sizeof(host), port, sizeof(port));
    if (st != KVR_OK)
        return st;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (rc != 0) {
        KVR_LOG_ERROR("bench", "listen %s: %s", spec, gai_strerror(rc));
        return KVR_ERR_INVALID;
    }
    int fd = -1, err = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        int one = 1;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 4) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        KVR_LOG_ERROR("bench", "listen %s: %s", spec, strerror(err));
        return KVR_ERR_IO;
    }
    *fd_p = fd;
    return KVR_OK;
}

kvr_status_t bench_chan_accept(int lfd, int timeout_ms, int *fd_p)
{
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int rc;
    do {
        rc = poll(&pfd, 1, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
        KVR_LOG_ERROR("bench", "no initiator connected within %d ms", timeout_ms);
        return KVR_ERR_TIMEOUT;
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        KVR_LOG_ERROR("bench", "accept: %s", strerror(errno));
        return KVR_ERR_IO;
    }
    set_sock_opts(fd);
    *fd_p = fd;
    return KVR_OK;
}

kvr_status_t bench_chan_connect(const char *spec, int timeout_ms, int *fd_p)
{
    char host[256], port[16];
    struct addrinfo hints = {0}, *res = NULL, *ai;
    kvr_status_t st = split_hostport(spec, host, sizeof(host), port, sizeof(port));
    if (st != KVR_OK)
        return st;
    if (host[0] == '\0') {
        KVR_LOG_ERROR("bench", "--peer '%s' names no host (want HOST:PORT)", spec);
        return KVR_ERR_INVALID;
    }
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        KVR_LOG_ERROR("bench", "peer %s: %s", spec, gai_strerror(rc));
        return KVR_ERR_INVALID;
    }
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    int err = 0;
    for (;;) {
        for (ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                err = errno;
                continue;
            }
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                freeaddrinfo(res);
                set_sock_opts(fd);
                *fd_p = fd;
                return KVR_OK;
            }
            err = errno;
            close(fd);
        }
        if (kvr_now_ns() >= deadline)
            break;
        kvr_sleep_ns(50 * 1000000ull);
    }
    freeaddrinfo(res);
    KVR_LOG_ERROR("bench", "cannot reach target %s within %d ms: %s", spec, timeout_ms,
                  strerror(err));
    return KVR_ERR_TIMEOUT;
}

static kvr_status_t write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            KVR_LOG_ERROR("bench", "side channel send: %s", strerror(errno));
            return errno == EPIPE || errno == ECONNRESET ? KVR_ERR_CLOSED : KVR_ERR_IO;
        }
        p += n;
        len -= (size_t)n;
    }
    return KVR_OK;
}

/* Reads exactly len bytes before the deadline. */
static kvr_status_t read_all(int fd, void *buf, size_t len, uint64_t deadline)
{
    uint8_t *p = buf;
    while (len > 0) {
        uint64_t now = kvr_now_ns();
        int left = now >= deadline ? 0 : (int)((deadline - now) / 1000000u) + 1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) {
            KVR_LOG_ERROR("bench", "side channel: message cut off (timeout)");
            return KVR_ERR_TIMEOUT;
        }
        ssize_t n = recv(fd, p, len, 0);
        if (n == 0)
            return KVR_ERR_CLOSED;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            KVR_LOG_ERROR("bench", "side channel recv: %s", strerror(errno));
            return errno == ECONNRESET ? KVR_ERR_CLOSED : KVR_ERR_IO;
        }
        p += n;
        len -= (size_t)n;
    }
    return KVR_OK;
}

kvr_status_t bench_chan_send(int fd, uint32_t type, const void *buf, uint32_t len)
{
    struct chan_hdr h = {.type = type, .len = len};
    kvr_status_t st = write_all(fd, &h, sizeof(h));
    if (st == KVR_OK && len > 0)
        st = write_all(fd, buf, len);
    return st;
}

kvr_status_t bench_chan_recv(int fd, int timeout_ms, uint32_t *type_p, void **buf_p,
                             uint32_t *len_p)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc;
    do {
        rc = poll(&pfd, 1, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0)
        return KVR_ERR_TIMEOUT;
    if (rc < 0)
        return KVR_ERR_IO;

    struct chan_hdr h;
    uint64_t deadline = kvr_deadline_ns(CHAN_IO_MS);
    kvr_status_t st = read_all(fd, &h, sizeof(h), deadline);
    if (st != KVR_OK)
        return st;
    if (h.len > CHAN_MAX_MSG || h.type < BENCH_MSG_HELLO || h.type > BENCH_MSG_ERROR) {
        KVR_LOG_ERROR("bench", "side channel: bad message (type %u, %u bytes)", h.type, h.len);
        return KVR_ERR_CORRUPT;
    }
    void *buf = NULL;
    if (h.len > 0) {
        buf = malloc(h.len + 1u);
        if (!buf)
            return KVR_ERR_NO_MEMORY;
        st = read_all(fd, buf, h.len, deadline);
        if (st != KVR_OK) {
            free(buf);
            return st;
        }
        ((char *)buf)[h.len] = '\0'; /* ERROR texts */
    }
    *type_p = h.type;
    *buf_p = buf;
    *len_p = h.len;
    return KVR_OK;
}
