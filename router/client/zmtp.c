/*
 * zmtp.c - libkvrail-client's direct router link (zmtp.h): a DEALER peer
 * speaking ZMTP 3.1 (RFC 37), NULL mechanism, on one non-blocking TCP
 * socket driven by the caller's loop, so a frame from the router wakes the
 * caller's thread directly instead of going through ZeroMQ's I/O thread
 * first (one cross-thread wake-up less per direction).
 *
 * How it works.  A connection goes DOWN -> CONNECTING (non-blocking
 * connect) -> GREETING (our 64-byte greeting and READY are queued at once;
 * the peer's greeting is read and checked: signature ff .. 7f, major
 * version 3 or later, mechanism NULL) -> READY (the peer's READY command:
 * its properties parsed within its size, Socket-Type ROUTER, DEALER or
 * REP; an ERROR command's reason is kept) -> OPEN.  Messages sent before
 * OPEN wait in the output queue, as a DEALER's do.  Received bytes go into
 * one input buffer; kvr_zmtp_recv parses whole messages from it in place:
 * a flags byte (MORE 1, LONG 2, COMMAND 4; other bits refused), a 1- or
 * 8-byte size, the body; a frame larger than max_frame, a message larger
 * than max_frame + 4 KiB or with more than KVR_ZMTP_MAX_PARTS parts, a
 * command inside a message are protocol errors: the connection is dropped
 * with the reason (kvr_zmtp_error) and retried.  PING is answered with
 * PONG; other commands are skipped.  Buffers grow on demand up to their
 * bound (input: one message; output: OUT_MAX, then sends are refused).
 * A dropped connection is retried after 100 ms, doubling to 2 s, from a
 * timerfd in the link's epoll set, which also holds the socket (EPOLLIN,
 * EPOLLOUT while bytes wait), so the caller waits on one descriptor that
 * never changes; a host name's addresses (up to 4) are tried in turn.  A
 * read that leaves room in the buffer ends the reading (the socket is
 * drained; the set is level-triggered): no read is spent on EAGAIN.  Messages already whole when a
 * connection ends are still delivered; then KVR_ZMTP_EV_LOST.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "zmtp.h"

#define GREETING_LEN 64
#define MAX_COMMAND  4096        /* a handshake or control command */
#define OUT_MAX      (64u << 20) /* bytes queued to the router */
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 2000
#define MAX_ADDRS    4 /* of a host name (localhost: ::1 and 127.0.0.1) */

#define F_MORE    1u
#define F_LONG    2u
#define F_COMMAND 4u

enum state { ST_DOWN, ST_CONNECTING, ST_GREETING, ST_READY, ST_OPEN };

struct kvr_zmtp {
    int ep, sock, tfd;
    struct sockaddr_storage addr[MAX_ADDRS]; /* the endpoint's addresses, tried in turn */
    socklen_t addr_len[MAX_ADDRS];
    size_t n_addr, addr_i;
    enum state st;
    uint32_t sock_events; /* what sock is registered for in ep */
    size_t max_frame, in_max;
    uint8_t *in;
    size_t in_cap, in_r, in_w;
    bool deliver; /* whole messages in `in` are the router's (OPEN, or left from it) */
    uint8_t *out;
    size_t out_cap, out_r, out_w;
    uint8_t hs[GREETING_LEN + 64]; /* our greeting and READY */
    size_t hs_len, hs_off;
    unsigned retry_ms;
    unsigned pending; /* KVR_ZMTP_EV_* not yet returned by kvr_zmtp_io */
    char err[256];
};

static void set_sock_events(kvr_zmtp_t *z, uint32_t events)
{
    if (z->sock < 0 || z->sock_events == events)
        return;
    struct epoll_event ev = {.events = events, .data.fd = z->sock};
    if (epoll_ctl(z->ep, EPOLL_CTL_MOD, z->sock, &ev) == 0)
        z->sock_events = events;
}

static void arm_retry(kvr_zmtp_t *z)
{
    struct itimerspec its = {.it_value = {.tv_sec = z->retry_ms / 1000,
                                          .tv_nsec = (long)(z->retry_ms % 1000) * 1000000}};
    timerfd_settime(z->tfd, 0, &its, NULL);
    z->retry_ms = z->retry_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : z->retry_ms * 2;
}

/* Ends the connection (why: the reason kept for kvr_zmtp_error) and arms
 * the retry.  keep: whole messages already received stay deliverable. */
static void drop(kvr_zmtp_t *z, bool keep, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void drop(kvr_zmtp_t *z, bool keep, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(z->err, sizeof(z->err), fmt, ap);
    va_end(ap);
    if (z->st == ST_OPEN)
        z->pending |= KVR_ZMTP_EV_LOST;
    else /* never up: the host's next address next time */
        z->addr_i = (z->addr_i + 1) % (z->n_addr ? z->n_addr : 1);
    if (!keep || z->st != ST_OPEN) {
        z->in_r = z->in_w = 0;
        z->deliver = false;
    }
    if (z->sock >= 0) {
        epoll_ctl(z->ep, EPOLL_CTL_DEL, z->sock, NULL);
        close(z->sock);
        z->sock = -1;
    }
    /* an open connection may have taken part of a message: what it had not
     * written is lost, as a DEALER's pipe to a peer is; before that, nothing
     * was written and the queue waits for the next connection */
    if (z->st == ST_OPEN)
        z->out_r = z->out_w = 0;
    z->st = ST_DOWN;
    arm_retry(z);
}

/* Our greeting (signature, version 3.1, mechanism NULL, as-server 0,
 * filler) and READY command with Socket-Type DEALER, into z->hs. */
static void build_handshake(kvr_zmtp_t *z)
{
    uint8_t *p = z->hs;
    memset(p, 0, GREETING_LEN);
    p[0] = 0xff;
    p[9] = 0x7f;
    p[10] = 3;
    p[11] = 1;
    memcpy(p + 12, "NULL", 4);
    p += GREETING_LEN;
    static const char body[] = "\x05READY\x0bSocket-Type\x00\x00\x00\x06"
                               "DEALER";
    *p++ = F_COMMAND;
    *p++ = (uint8_t)(sizeof(body) - 1);
    memcpy(p, body, sizeof(body) - 1);
    p += sizeof(body) - 1;
    z->hs_len = (size_t)(p - z->hs);
    z->hs_off = 0;
}

static void start_connect(kvr_zmtp_t *z)
{
    z->in_r = z->in_w = 0;
    z->deliver = false;
    z->sock = socket(z->addr[z->addr_i].ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (z->sock < 0) {
        drop(z, false, "socket: %s", strerror(errno));
        return;
    }
    int one = 1;
    setsockopt(z->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    z->sock_events = EPOLLIN | EPOLLOUT;
    struct epoll_event ev = {.events = z->sock_events, .data.fd = z->sock};
    if (epoll_ctl(z->ep, EPOLL_CTL_ADD, z->sock, &ev) != 0) {
        drop(z, false, "epoll_ctl: %s", strerror(errno));
        return;
    }
    build_handshake(z);
    if (connect(z->sock, (struct sockaddr *)&z->addr[z->addr_i], z->addr_len[z->addr_i]) == 0)
        z->st = ST_GREETING;
    else if (errno == EINPROGRESS)
        z->st = ST_CONNECTING;
    else
        drop(z, false, "connect: %s", strerror(errno));
}

/* Writes what is queued (the handshake first; messages once OPEN). */
static void flush(kvr_zmtp_t *z)
{
    while (z->sock >= 0) {
        const uint8_t *p;
        size_t n;
        bool hs = z->hs_off < z->hs_len;
        if (hs) {
            p = z->hs + z->hs_off;
            n = z->hs_len - z->hs_off;
        } else if (z->st == ST_OPEN && z->out_r < z->out_w) {
            p = z->out + z->out_r;
            n = z->out_w - z->out_r;
        } else {
            break;
        }
        ssize_t w = send(z->sock, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                drop(z, true, "write to the router: %s", strerror(errno));
            break;
        }
        if (hs)
            z->hs_off += (size_t)w;
        else
            z->out_r += (size_t)w;
    }
    if (z->out_r == z->out_w)
        z->out_r = z->out_w = 0;
    bool waiting = z->hs_off < z->hs_len || (z->st == ST_OPEN && z->out_r < z->out_w);
    set_sock_events(z, EPOLLIN | (waiting ? EPOLLOUT : 0u));
}

/* Reads what the socket has, into `in` (grown up to in_max). */
static void fill(kvr_zmtp_t *z)
{
    while (z->sock >= 0) {
        if (z->in_r == z->in_w)
            z->in_r = z->in_w = 0;
        if (z->in_w == z->in_cap) {
            if (z->in_r > 0) {
                memmove(z->in, z->in + z->in_r, z->in_w - z->in_r);
                z->in_w -= z->in_r;
                z->in_r = 0;
            } else if (z->in_cap < z->in_max) {
                size_t cap = z->in_cap * 2 > z->in_max ? z->in_max : z->in_cap * 2;
                uint8_t *b = realloc(z->in, cap);
                if (!b) {
                    drop(z, false, "out of memory for a %zu-byte input buffer", cap);
                    return;
                }
                z->in = b;
                z->in_cap = cap;
            } else {
                return; /* full of whole messages: taken by kvr_zmtp_recv first */
            }
        }
        size_t room = z->in_cap - z->in_w;
        ssize_t r = recv(z->sock, z->in + z->in_w, room, 0);
        if (r > 0) {
            z->in_w += (size_t)r;
            if ((size_t)r < room)
                return; /* drained: more would wake the (level-triggered) set again */
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (r == 0)
            drop(z, true, "the router closed the connection");
        else
            drop(z, true, "read from the router: %s", strerror(errno));
        return;
    }
}

/* The frame at `in` + pos: its flags, header and body sizes.  Returns 2
 * (whole), 1 (its header here, not all its body), 0 (not even its
 * header), -1 (a protocol error: z->err set). */
static int frame_at(kvr_zmtp_t *z, size_t pos, size_t limit, unsigned *flags, size_t *hl,
                    size_t *size)
{
    size_t avail = z->in_w - pos;
    if (avail < 1)
        return 0;
    *flags = z->in[pos];
    if (*flags & ~(F_MORE | F_LONG | F_COMMAND)) {
        snprintf(z->err, sizeof(z->err), "frame flags 0x%02x have reserved bits set", *flags);
        return -1;
    }
    *hl = (*flags & F_LONG) ? 9 : 2;
    if (avail < *hl)
        return 0;
    uint64_t n = z->in[pos + 1];
    if (*flags & F_LONG)
        for (size_t k = 2; k < 9; k++)
            n = n << 8 | z->in[pos + k];
    if (n > limit) {
        snprintf(z->err, sizeof(z->err), "a %s of %llu bytes exceeds the %zu-byte limit",
                 (*flags & F_COMMAND) ? "command" : "frame", (unsigned long long)n, limit);
        return -1;
    }
    *size = (size_t)n;
    return avail - *hl >= *size ? 2 : 1;
}

/* The value of property `name` in a READY body's properties [p, end). */
static bool property(const uint8_t *p, const uint8_t *end, const char *name, const uint8_t **v,
                     size_t *vl)
{
    while (p < end) {
        size_t nl = *p++;
        if ((size_t)(end - p) < nl + 4)
            return false;
        const uint8_t *nm = p;
        p += nl;
        size_t l = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
        p += 4;
        if ((size_t)(end - p) < l)
            return false;
        if (nl == strlen(name) && !strncasecmp((const char *)nm, name, nl)) {
            *v = p;
            *vl = l;
            return true;
        }
        p += l;
    }
    return false;
}

/* Copies up to cap-1 bytes of s as printable text (for an error message). */
static void printable(char *dst, size_t cap, const uint8_t *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++)
        dst[k++] = s[i] >= 0x20 && s[i] < 0x7f ? (char)s[i] : '?';
    dst[k] = 0;
}

/* The peer's greeting; returns false when not all here yet or dropped. */
static bool take_greeting(kvr_zmtp_t *z)
{
    const uint8_t *g = z->in + z->in_r;
    size_t avail = z->in_w - z->in_r;
    if (avail >= 1 && g[0] != 0xff) {
        drop(z, false, "the peer is not a ZeroMQ socket (its first byte is 0x%02x, not 0xff)",
             g[0]);
        return false;
    }
    if (avail >= 10 && !(g[9] & 1)) {
        drop(z, false, "the peer speaks ZMTP 1.0 (a ZeroMQ older than 3.x); ZMTP 3 is needed");
        return false;
    }
    if (avail >= 11 && g[10] < 3) {
        drop(z, false, "the peer speaks ZMTP %u.x; ZMTP 3 is needed", g[10]);
        return false;
    }
    if (avail < GREETING_LEN)
        return false;
    static const uint8_t null_mech[20] = {'N', 'U', 'L', 'L'};
    if (memcmp(g + 12, null_mech, sizeof(null_mech)) != 0) {
        char m[21];
        printable(m, sizeof(m), g + 12, strnlen((const char *)g + 12, 20));
        drop(z, false,
             "the router uses the %s mechanism; the direct link speaks NULL only (for CURVE "
             "use the libzmq link)",
             m);
        return false;
    }
    z->in_r += GREETING_LEN;
    z->st = ST_READY;
    return true;
}

/* The peer's READY (or ERROR); returns false when not all here or dropped. */
static bool take_ready(kvr_zmtp_t *z)
{
    unsigned flags;
    size_t hl, size;
    int r = frame_at(z, z->in_r, MAX_COMMAND, &flags, &hl, &size);
    if (r < 0) {
        char why[sizeof(z->err)];
        snprintf(why, sizeof(why), "%s", z->err);
        drop(z, false, "handshake: %s", why);
        return false;
    }
    if (r < 2)
        return false;
    const uint8_t *b = z->in + z->in_r + hl, *end = b + size;
    if (!(flags & F_COMMAND) || (flags & F_MORE) || size < 1 || b[0] + 1u > size) {
        drop(z, false, "handshake: the peer sent no READY command after its greeting");
        return false;
    }
    size_t nl = b[0];
    const uint8_t *name = b + 1, *props = b + 1 + nl;
    if (nl == 5 && !memcmp(name, "ERROR", 5)) {
        char why[256];
        size_t rl = props < end ? *props : 0;
        printable(why, sizeof(why), props + 1, rl <= (size_t)(end - props - 1) ? rl : 0);
        drop(z, false, "the router refused the connection: %s", why);
        return false;
    }
    if (nl != 5 || memcmp(name, "READY", 5) != 0) {
        char c[64];
        printable(c, sizeof(c), name, nl);
        drop(z, false, "handshake: the peer sent a '%s' command, not READY", c);
        return false;
    }
    const uint8_t *v;
    size_t vl;
    if (!property(props, end, "Socket-Type", &v, &vl)) {
        drop(z, false, "handshake: the peer's READY has no Socket-Type (or is malformed)");
        return false;
    }
    if (!((vl == 6 && !memcmp(v, "ROUTER", 6)) || (vl == 6 && !memcmp(v, "DEALER", 6)) ||
          (vl == 3 && !memcmp(v, "REP", 3)))) {
        char t[64];
        printable(t, sizeof(t), v, vl);
        drop(z, false, "the peer is a %s socket; a DEALER talks to a ROUTER", t);
        return false;
    }
    z->in_r += hl + size;
    z->st = ST_OPEN;
    z->deliver = true;
    z->retry_ms = RETRY_MIN_MS;
    z->err[0] = 0;
    z->pending |= KVR_ZMTP_EV_CONNECTED;
    return true;
}

unsigned kvr_zmtp_io(kvr_zmtp_t *z)
{
    if (z->st == ST_DOWN) {
        uint64_t n;
        if (read(z->tfd, &n, sizeof(n)) == (ssize_t)sizeof(n))
            start_connect(z);
    }
    if (z->st == ST_CONNECTING) {
        if (connect(z->sock, (struct sockaddr *)&z->addr[z->addr_i], z->addr_len[z->addr_i]) == 0 ||
            errno == EISCONN)
            z->st = ST_GREETING;
        else if (errno != EINPROGRESS && errno != EALREADY && errno != EINTR)
            drop(z, false, "connect: %s", strerror(errno));
    }
    if (z->st >= ST_GREETING) {
        flush(z);
        fill(z);
        if (z->st == ST_GREETING)
            take_greeting(z);
        if (z->st == ST_READY && take_ready(z))
            flush(z); /* what waited for the connection */
    }
    unsigned ev = z->pending;
    z->pending = 0;
    return ev;
}

/* Appends a frame header (flags, size) to out. */
static size_t put_header(uint8_t *p, unsigned flags, size_t size)
{
    if (size <= 255) {
        p[0] = (uint8_t)flags;
        p[1] = (uint8_t)size;
        return 2;
    }
    p[0] = (uint8_t)(flags | F_LONG);
    for (int k = 0; k < 8; k++)
        p[1 + k] = (uint8_t)((uint64_t)size >> (56 - 8 * k));
    return 9;
}

/* Makes room for n more bytes in out (within OUT_MAX). */
static bool out_room(kvr_zmtp_t *z, size_t n)
{
    if (z->out_w + n <= z->out_cap)
        return true;
    if (z->out_r > 0) {
        memmove(z->out, z->out + z->out_r, z->out_w - z->out_r);
        z->out_w -= z->out_r;
        z->out_r = 0;
    }
    if (z->out_w + n > OUT_MAX)
        return false;
    if (z->out_w + n <= z->out_cap)
        return true;
    size_t cap = z->out_cap ? z->out_cap : 65536;
    while (cap < z->out_w + n)
        cap *= 2;
    cap = cap > OUT_MAX ? OUT_MAX : cap;
    uint8_t *b = realloc(z->out, cap);
    if (!b)
        return false;
    z->out = b;
    z->out_cap = cap;
    return true;
}

kvr_status_t kvr_zmtp_send(kvr_zmtp_t *z, const struct iovec *parts, size_t n)
{
    if (n == 0 || n > KVR_ZMTP_MAX_PARTS)
        return KVR_ERR_INVALID;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += 9 + parts[i].iov_len;
    bool was_empty = z->out_r == z->out_w;
    if (!out_room(z, total))
        return KVR_ERR_NO_RESOURCE;
    for (size_t i = 0; i < n; i++) {
        z->out_w += put_header(z->out + z->out_w, i + 1 < n ? F_MORE : 0, parts[i].iov_len);
        if (parts[i].iov_len)
            memcpy(z->out + z->out_w, parts[i].iov_base, parts[i].iov_len);
        z->out_w += parts[i].iov_len;
    }
    if (z->st == ST_OPEN && was_empty) /* else EPOLLOUT is armed, or not connected yet */
        flush(z);
    return KVR_OK;
}

/* Answers a PING (RFC 37: PONG carries the PING's context). */
static void command(kvr_zmtp_t *z, const uint8_t *b, size_t size)
{
    if (size >= 7 && b[0] == 4 && !memcmp(b + 1, "PING", 4)) {
        size_t ctx = size - 7 > 16 ? 16 : size - 7;
        uint8_t pong[2 + 5 + 16] = {F_COMMAND, (uint8_t)(5 + ctx), 4, 'P', 'O', 'N', 'G'};
        memcpy(pong + 7, b + 7, ctx);
        if (out_room(z, 7 + ctx)) {
            memcpy(z->out + z->out_w, pong, 7 + ctx);
            z->out_w += 7 + ctx;
            flush(z);
        }
    }
}

kvr_status_t kvr_zmtp_recv(kvr_zmtp_t *z, struct kvr_zmtp_msg *m)
{
    while (z->deliver) {
        size_t pos = z->in_r, total = 0;
        m->nparts = 0;
        for (;;) {
            unsigned flags;
            size_t hl, size;
            int r = frame_at(z, pos, z->max_frame, &flags, &hl, &size);
            if (r < 0) {
                char why[sizeof(z->err)];
                snprintf(why, sizeof(why), "%s", z->err);
                drop(z, false, "bad data from the router: %s", why);
                return KVR_ERR_CLOSED;
            }
            if (r == 0)
                return KVR_ERR_NO_RESOURCE;
            total += hl + size;
            if (!(flags & F_COMMAND) &&
                (m->nparts == KVR_ZMTP_MAX_PARTS || total > z->in_max - 64)) {
                drop(z, false,
                     "bad data from the router: a message of more than %d parts or %zu bytes",
                     KVR_ZMTP_MAX_PARTS, z->in_max - 64);
                return KVR_ERR_CLOSED;
            }
            if (r == 1)
                return KVR_ERR_NO_RESOURCE;
            if (flags & F_COMMAND) {
                if (m->nparts > 0 || (flags & F_MORE)) {
                    drop(z, false, "bad data from the router: a command inside a message");
                    return KVR_ERR_CLOSED;
                }
                command(z, z->in + pos + hl, size);
                z->in_r = pos + hl + size;
                break; /* the next message */
            }
            m->part[m->nparts] = z->in + pos + hl;
            m->len[m->nparts++] = size;
            pos += hl + size;
            if (!(flags & F_MORE)) {
                z->in_r = pos;
                return KVR_OK;
            }
        }
    }
    return KVR_ERR_NO_RESOURCE;
}

/* Splits "tcp://HOST:PORT" (HOST may be [v6]) and resolves it. */
static kvr_status_t resolve(kvr_zmtp_t *z, const char *endpoint, char *err, size_t err_len)
{
    if (strncmp(endpoint, "tcp://", 6) != 0) {
        snprintf(err, err_len,
                 "the direct router link takes tcp://HOST:PORT endpoints, not '%s' (use the "
                 "libzmq link for other transports)",
                 endpoint);
        return KVR_ERR_INVALID;
    }
    const char *h = endpoint + 6, *colon = strrchr(h, ':');
    char host[256];
    size_t hl = colon ? (size_t)(colon - h) : 0;
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (!colon || hl == 0 || hl >= sizeof(host) || !colon[1]) {
        snprintf(err, err_len, "the endpoint '%s' is not tcp://HOST:PORT", endpoint);
        return KVR_ERR_INVALID;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int e = getaddrinfo(host, colon + 1, &hints, &ai);
    if (e != 0 || !ai) {
        snprintf(err, err_len, "cannot resolve the router's address '%s': %s", endpoint,
                 e ? gai_strerror(e) : "no address");
        return KVR_ERR_INVALID;
    }
    for (struct addrinfo *p = ai; p && z->n_addr < MAX_ADDRS; p = p->ai_next)
        if (p->ai_addrlen <= sizeof(z->addr[0])) {
            memcpy(&z->addr[z->n_addr], p->ai_addr, p->ai_addrlen);
            z->addr_len[z->n_addr++] = p->ai_addrlen;
        }
    freeaddrinfo(ai);
    if (z->n_addr == 0) {
        snprintf(err, err_len, "the router's address '%s' has no usable address", endpoint);
        return KVR_ERR_INVALID;
    }
    return KVR_OK;
}

kvr_status_t kvr_zmtp_open(const char *endpoint, size_t max_frame, kvr_zmtp_t **z_p, char *err,
                           size_t err_len)
{
    kvr_zmtp_t *z = calloc(1, sizeof(*z));
    if (!z)
        return KVR_ERR_NO_MEMORY;
    z->sock = z->tfd = z->ep = -1;
    z->max_frame = max_frame;
    z->in_max = max_frame + 4096 + 9 * KVR_ZMTP_MAX_PARTS;
    z->in_cap = 65536 < z->in_max ? 65536 : z->in_max;
    z->in = malloc(z->in_cap);
    z->retry_ms = RETRY_MIN_MS;
    kvr_status_t st = z->in ? resolve(z, endpoint, err, err_len) : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK) {
        z->ep = epoll_create1(EPOLL_CLOEXEC);
        z->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = z->tfd};
        if (z->ep < 0 || z->tfd < 0 || epoll_ctl(z->ep, EPOLL_CTL_ADD, z->tfd, &ev) != 0) {
            snprintf(err, err_len, "epoll/timerfd: %s", strerror(errno));
            st = KVR_ERR_IO;
        }
    }
    if (st != KVR_OK) {
        kvr_zmtp_close(z);
        return st;
    }
    start_connect(z);
    *z_p = z;
    return KVR_OK;
}

void kvr_zmtp_close(kvr_zmtp_t *z)
{
    if (!z)
        return;
    if (z->sock >= 0)
        close(z->sock);
    if (z->tfd >= 0)
        close(z->tfd);
    if (z->ep >= 0)
        close(z->ep);
    free(z->in);
    free(z->out);
    free(z);
}

int kvr_zmtp_fd(const kvr_zmtp_t *z)
{
    return z->ep;
}

bool kvr_zmtp_up(const kvr_zmtp_t *z)
{
    return z->st == ST_OPEN;
}

const char *kvr_zmtp_error(const kvr_zmtp_t *z)
{
    return z->err;
}
