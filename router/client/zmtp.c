/*
 * zmtp.c - libkvrail-client's direct router link (zmtp.h): a DEALER peer
 * speaking ZMTP 3.1 (RFC 37), NULL or CURVE mechanism, on one non-blocking
 * TCP socket driven by the caller's loop, so a frame from the router wakes the
 * caller's thread directly instead of going through ZeroMQ's I/O thread
 * first (one cross-thread wake-up less per direction).
 *
 * How it works.  A connection goes DOWN -> CONNECTING (non-blocking
 * connect) -> GREETING (our 64-byte greeting and READY are queued at once;
 * the peer's greeting is read and checked: signature ff .. 7f, major
 * version 3 or later, mechanism NULL) -> READY (the peer's READY command:
 * its properties parsed within its size, Socket-Type ROUTER, DEALER or
 * REP; an ERROR command's reason is kept) -> OPEN.  Messages sent before
 * OPEN wait in the output queue, as a DEALER's do.
 *
 * CURVE (keys given; zmtp_curve.c does the cryptography): the greeting
 * names CURVE and a HELLO follows it; the peer's greeting must name CURVE;
 * GREETING -> WELCOME (its WELCOME checked, our INITIATE queued
 * behind the HELLO) -> READY (its box opened, its metadata checked as
 * above) -> OPEN.  Every frame is then a MESSAGE command's body in a frame
 * with no flags, as libzmq sends it: the MORE and COMMAND flags travel
 * inside the box.  Sending seals each part into the output queue (frames
 * queued before OPEN wait plain and are sealed at OPEN; the queue's bound
 * counts their growth).  Receiving, unseal() opens each whole MESSAGE
 * frame in the input buffer in place and moves its data down into a plain
 * frame, so kvr_zmtp_recv parses the same frames either way: `in` holds
 * [in_r, in_p) opened frames and [in_x, in_w) sealed ones, the gap between
 * closed when the buffer is compacted.  A box that does not open, a nonce
 * not above the last (a replay), a wrong size, a WELCOME the router's key
 * did not seal, drop the connection with that reason; the router closing
 * it after our HELLO (a server that cannot open it) or INITIATE (a client
 * key it does not take) is reported as such.  Received bytes go into
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
#include "zmtp_curve.h"

#define GREETING_LEN 64
#define MAX_COMMAND  4096        /* a handshake or control command */
#define OUT_MAX      (64u << 20) /* bytes queued to the router */
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 2000
#define MAX_ADDRS    4 /* of a host name (localhost: ::1 and 127.0.0.1) */

#define F_MORE    1u
#define F_LONG    2u
#define F_COMMAND 4u

enum state { ST_DOWN, ST_CONNECTING, ST_GREETING, ST_WELCOME, ST_READY, ST_OPEN };

struct kvr_zmtp {
    int ep, sock, tfd;
    struct sockaddr_storage addr[MAX_ADDRS]; /* the endpoint's addresses, tried in turn */
    socklen_t addr_len[MAX_ADDRS];
    size_t n_addr, addr_i;
    enum state st;
    uint32_t sock_events; /* what sock is registered for in ep */
    size_t max_frame, in_max;
    uint8_t *in;
    /* [in_r, in_p): frames for kvr_zmtp_recv; [in_x, in_w): CURVE MESSAGEs
     * not opened yet (NULL, or before OPEN: in_p == in_x == in_w) */
    size_t in_cap, in_r, in_p, in_x, in_w;
    size_t msg_plain; /* CURVE: bytes opened so far of a message not yet whole */
    bool deliver;     /* whole messages in `in` are the router's (OPEN, or left from it) */
    uint8_t *out;
    size_t out_cap, out_r, out_w;
    size_t seal_extra;    /* CURVE before OPEN: what the queued frames grow by once sealed */
    kvr_zmtp_curve_t *cv; /* CURVE (keys given), or NULL: the NULL mechanism */
    uint8_t hs[KVR_CURVE_INITIATE_MAX + 16]; /* our greeting and READY (CURVE: HELLO, INITIATE) */
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
        z->in_r = z->in_p = z->in_x = z->in_w = 0;
        z->deliver = false;
    } else {
        z->in_x = z->in_w = z->in_p; /* what was not opened is not the router's */
    }
    z->msg_plain = 0;
    if (z->cv)
        kvr_zmtp_curve_end(z->cv);
    if (z->sock >= 0) {
        epoll_ctl(z->ep, EPOLL_CTL_DEL, z->sock, NULL);
        close(z->sock);
        z->sock = -1;
    }
    /* an open connection may have taken part of a message: what it had not
     * written is lost, as a DEALER's pipe to a peer is; before that, nothing
     * was written and the queue waits for the next connection */
    if (z->st == ST_OPEN)
        z->out_r = z->out_w = z->seal_extra = 0;
    z->st = ST_DOWN;
    arm_retry(z);
}

/* Appends a frame header (flags, size) at p; returns its length. */
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

/* The bytes of a frame of n bytes (header and body). */
static size_t frame_len(size_t n)
{
    return (n <= 255 ? 2 : 9) + n;
}

/* Our greeting (signature, version 3.1, mechanism NULL or CURVE, as-server
 * 0, filler) and first command, into z->hs: NULL's READY with Socket-Type
 * DEALER, or CURVE's HELLO (a fresh short-term key pair).  False: the
 * router's key is unusable. */
static bool build_handshake(kvr_zmtp_t *z)
{
    uint8_t *p = z->hs;
    memset(p, 0, GREETING_LEN);
    p[0] = 0xff;
    p[9] = 0x7f;
    p[10] = 3;
    p[11] = 1;
    memcpy(p + 12, z->cv ? "CURVE" : "NULL", z->cv ? 5 : 4);
    p += GREETING_LEN;
    if (z->cv) {
        p += put_header(p, F_COMMAND, KVR_CURVE_HELLO_LEN);
        if (kvr_zmtp_curve_hello(z->cv, p) != KVR_OK)
            return false;
        p += KVR_CURVE_HELLO_LEN;
        z->hs_len = (size_t)(p - z->hs);
        z->hs_off = 0;
        return true;
    }
    static const char body[] = "\x05READY\x0bSocket-Type\x00\x00\x00\x06"
                               "DEALER";
    *p++ = F_COMMAND;
    *p++ = (uint8_t)(sizeof(body) - 1);
    memcpy(p, body, sizeof(body) - 1);
    p += sizeof(body) - 1;
    z->hs_len = (size_t)(p - z->hs);
    z->hs_off = 0;
    return true;
}

static void start_connect(kvr_zmtp_t *z)
{
    z->in_r = z->in_p = z->in_x = z->in_w = 0;
    z->msg_plain = 0;
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
    if (!build_handshake(z)) {
        drop(z, false,
             "the router's key in KVRAIL_ROUTER_KEY is not a usable Curve25519 public key");
        return;
    }
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

static void unseal(kvr_zmtp_t *z);

/* Why the router closed the connection, by how far the handshake got. */
static const char *closed_reason(const kvr_zmtp_t *z)
{
    /* a CURVE server that cannot open a HELLO closes at once, often before
     * any of its greeting is out */
    bool hello_out = z->st == ST_GREETING && z->hs_off == z->hs_len;
    if (z->cv && (z->st == ST_WELCOME || hello_out))
        return "the router closed the connection after our CURVE HELLO: most likely its key is "
               "not the one in KVRAIL_ROUTER_KEY (a CURVE server drops a HELLO it cannot open)";
    if (z->cv && z->st == ST_READY)
        return "the router closed the connection after our CURVE INITIATE: it did not accept "
               "this client's key, KVRAIL_CLIENT_KEY (the router takes the keys in its "
               "KEYS/clients/)";
    return NULL;
}

/* Moves what kvr_zmtp_recv has not taken, and the CURVE bytes not yet
 * opened, to the start of `in` (closing the gap between them). */
static void compact(kvr_zmtp_t *z)
{
    size_t p = z->in_p - z->in_r, x = z->in_w - z->in_x;
    memmove(z->in, z->in + z->in_r, p);
    memmove(z->in + p, z->in + z->in_x, x);
    z->in_r = 0;
    z->in_p = z->in_x = p;
    z->in_w = p + x;
}

/* Reads what the socket has, into `in` (grown up to in_max). */
static void fill(kvr_zmtp_t *z)
{
    while (z->sock >= 0) {
        if (z->in_r == z->in_w)
            z->in_r = z->in_p = z->in_x = z->in_w = 0;
        if (z->in_w == z->in_cap) {
            if (z->in_r > 0 || z->in_x > z->in_p) {
                compact(z);
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
            if (!z->cv || z->st != ST_OPEN)
                z->in_p = z->in_x = z->in_w; /* plaintext (NULL, a handshake command) */
            if ((size_t)r < room)
                return; /* drained: more would wake the (level-triggered) set again */
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        unseal(z); /* what the router sent before it left is its */
        if (z->sock < 0)
            return;
        const char *why = closed_reason(z);
        if (r == 0 || (why && errno == ECONNRESET))
            drop(z, true, "%s", why ? why : "the router closed the connection");
        else
            drop(z, true, "read from the router: %s", strerror(errno));
        return;
    }
}

/* The frame at `in` + pos: its flags, header and body sizes.  Returns 2
 * (whole), 1 (its header here, not all its body), 0 (not even its
 * header), -1 (a protocol error: z->err set). */
static int frame_at(kvr_zmtp_t *z, size_t pos, size_t end, size_t limit, unsigned *flags,
                    size_t *hl, size_t *size)
{
    size_t avail = end - pos;
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
    uint8_t mech[20] = {0};
    memcpy(mech, z->cv ? "CURVE" : "NULL", z->cv ? 5 : 4);
    if (memcmp(g + 12, mech, sizeof(mech)) != 0) {
        char m[21];
        printable(m, sizeof(m), g + 12, strnlen((const char *)g + 12, 20));
        if (z->cv)
            drop(z, false,
                 "the router uses the %s mechanism, not CURVE, and this client has CURVE keys "
                 "(KVRAIL_ROUTER_KEY / KVRAIL_CLIENT_KEY): unset them for an auth: none "
                 "cluster",
                 m);
        else
            drop(z, false,
                 "the router uses the %s mechanism and this client has no CURVE keys: set "
                 "KVRAIL_ROUTER_KEY and KVRAIL_CLIENT_KEY (docs/security.md)",
                 m);
        return false;
    }
    /* as-server (byte 32) is not checked: libzmq sends 0 whatever the role */
    z->in_r += GREETING_LEN;
    z->st = z->cv ? ST_WELCOME : ST_READY;
    return true;
}

/* The next handshake command, checked: a command frame, named stage (an
 * ERROR: the router's reason).  Returns 1 (here: *b_p, *size_p, *hl_p
 * set: its body, size and header length), 0 (not all here yet),
 * -1 (dropped).  stage: the command due ("READY", "WELCOME"). */
static int take_command(kvr_zmtp_t *z, const char *stage, uint8_t **b_p, size_t *size_p,
                        size_t *hl_p)
{
    unsigned flags;
    size_t hl, size;
    int r = frame_at(z, z->in_r, z->in_p, MAX_COMMAND, &flags, &hl, &size);
    if (r < 0) {
        char why[sizeof(z->err)];
        snprintf(why, sizeof(why), "%s", z->err);
        drop(z, false, "handshake: %s", why);
        return -1;
    }
    if (r < 2)
        return 0;
    uint8_t *b = z->in + z->in_r + hl, *end = b + size;
    if (!(flags & F_COMMAND) || (flags & F_MORE) || size < 1 || b[0] + 1u > size) {
        drop(z, false, "handshake: the peer sent no %s command after its %s", stage,
             z->st == ST_READY && z->cv ? "WELCOME" : "greeting");
        return -1;
    }
    size_t nl = b[0];
    const uint8_t *name = b + 1, *props = b + 1 + nl;
    if (nl == 5 && !memcmp(name, "ERROR", 5)) {
        char why[256];
        size_t rl = props < end ? *props : 0;
        printable(why, sizeof(why), props + 1, rl <= (size_t)(end - props - 1) ? rl : 0);
        if (z->cv && z->st == ST_READY)
            drop(z, false,
                 "the router refused the connection: %s (after our CURVE INITIATE: it did "
                 "not accept this client's key, KVRAIL_CLIENT_KEY)",
                 why);
        else
            drop(z, false, "the router refused the connection: %s", why);
        return -1;
    }
    if (nl != strlen(stage) || memcmp(name, stage, nl) != 0) {
        char c[64];
        printable(c, sizeof(c), name, nl);
        drop(z, false, "handshake: the peer sent a '%s' command, not %s", c, stage);
        return -1;
    }
    *b_p = b;
    *size_p = size;
    *hl_p = hl;
    return 1;
}

/* CURVE: the router's WELCOME, answered with our INITIATE (queued behind
 * the HELLO in hs); returns false when not all here or dropped. */
static bool take_welcome(kvr_zmtp_t *z)
{
    uint8_t *b;
    size_t size, hl;
    if (take_command(z, "WELCOME", &b, &size, &hl) <= 0)
        return false;
    uint8_t init[KVR_CURVE_INITIATE_MAX];
    char why[200];
    size_t n = kvr_zmtp_curve_welcome(z->cv, b, size, init, why, sizeof(why));
    if (n == 0) {
        drop(z, false, "%s", why);
        return false;
    }
    if (z->hs_off == z->hs_len) /* the greeting and HELLO are out (the WELCOME says so) */
        z->hs_off = z->hs_len = 0;
    if (z->hs_len + frame_len(n) > sizeof(z->hs)) {
        drop(z, false, "handshake: the router sent its WELCOME before our HELLO was out");
        return false;
    }
    z->hs_len += put_header(z->hs + z->hs_len, F_COMMAND, n);
    memcpy(z->hs + z->hs_len, init, n);
    z->hs_len += n;
    z->in_r += hl + size;
    z->st = ST_READY;
    flush(z);
    return z->sock >= 0;
}

static bool seal_queue(kvr_zmtp_t *z);

/* The peer's READY (or ERROR); returns false when not all here or dropped.
 * CURVE: its box opened, its metadata checked alike. */
static bool take_ready(kvr_zmtp_t *z)
{
    uint8_t *b;
    size_t size, hl;
    if (take_command(z, "READY", &b, &size, &hl) <= 0)
        return false;
    const uint8_t *props = b + 6, *end = b + size;
    if (z->cv) {
        size_t ml;
        char why[200];
        if (kvr_zmtp_curve_ready(z->cv, b, size, &props, &ml, why, sizeof(why)) != KVR_OK) {
            drop(z, false, "%s", why);
            return false;
        }
        end = props + ml;
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
    if (z->cv)
        z->in_p = z->in_x = z->in_r; /* what follows is sealed */
    z->st = ST_OPEN;
    if (z->cv && !seal_queue(z)) {
        drop(z, false, "out of memory sealing the queued messages");
        return false;
    }
    z->deliver = true;
    z->retry_ms = RETRY_MIN_MS;
    z->err[0] = 0;
    z->pending |= KVR_ZMTP_EV_CONNECTED;
    return true;
}

/* CURVE, OPEN: opens the MESSAGE frames whole in [in_x, in_w) into plain
 * frames at in_p (the MORE and COMMAND flags from inside the box), for
 * kvr_zmtp_recv.  A frame too large, a message too large, a MORE flag
 * outside the box, a box that does not open or a replayed nonce drop the
 * connection. */
static void unseal(kvr_zmtp_t *z)
{
    while (z->cv && z->st == ST_OPEN) {
        unsigned flags;
        size_t hl, size;
        int r = frame_at(z, z->in_x, z->in_w, z->max_frame + KVR_CURVE_MSG_OVERHEAD, &flags, &hl,
                         &size);
        if (r < 0) {
            char why[sizeof(z->err)];
            snprintf(why, sizeof(why), "%s", z->err);
            drop(z, false, "bad data from the router: %s", why);
            return;
        }
        if (r == 0)
            return;
        if (z->msg_plain + hl + size > z->in_max - 64) {
            drop(z, false, "bad data from the router: a message of more than %d parts or %zu bytes",
                 KVR_ZMTP_MAX_PARTS, z->in_max - 64);
            return;
        }
        if (r == 1)
            return;
        if (flags & F_MORE) {
            drop(z, false, "bad data from the router: a CURVE frame with MORE set outside its box");
            return;
        }
        unsigned inner;
        const uint8_t *data;
        size_t len;
        char why[200];
        if (kvr_zmtp_curve_open(z->cv, z->in + z->in_x + hl, size, &inner, &data, &len, why,
                                sizeof(why)) != KVR_OK) {
            drop(z, false, "bad data from the router: %s", why);
            return;
        }
        size_t ph = put_header(z->in + z->in_p,
                               ((inner & KVR_CURVE_F_MORE) ? F_MORE : 0u) |
                                   ((inner & KVR_CURVE_F_COMMAND) ? F_COMMAND : 0u),
                               len);
        memmove(z->in + z->in_p + ph, data, len);
        z->in_p += ph + len;
        z->in_x += hl + size;
        z->msg_plain = (inner & KVR_CURVE_F_MORE) ? z->msg_plain + ph + len : 0;
    }
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
        if (z->st == ST_WELCOME)
            take_welcome(z);
        if (z->st == ST_READY && take_ready(z))
            flush(z); /* what waited for the connection */
        unseal(z);
    }
    unsigned ev = z->pending;
    z->pending = 0;
    return ev;
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
    if (z->out_w + z->seal_extra + n > OUT_MAX)
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

/* The bytes a frame of n bytes takes queued: sealed (CURVE, OPEN), or
 * plain (NULL; CURVE before OPEN, sealed then). */
static size_t queued_len(const kvr_zmtp_t *z, size_t n)
{
    return z->cv && z->st == ST_OPEN ? frame_len(KVR_CURVE_MSG_OVERHEAD + n) : frame_len(n);
}

/* Appends a frame (flags: F_MORE, F_COMMAND) to out, room made: CURVE's
 * once OPEN as a MESSAGE with the flags inside its box and none outside
 * (as libzmq sends it), else as it is. */
static void put_frame(kvr_zmtp_t *z, unsigned flags, const void *data, size_t len)
{
    if (z->cv && z->st == ST_OPEN) {
        z->out_w += put_header(z->out + z->out_w, 0, KVR_CURVE_MSG_OVERHEAD + len);
        kvr_zmtp_curve_seal(z->cv, z->out + z->out_w,
                            ((flags & F_MORE) ? KVR_CURVE_F_MORE : 0u) |
                                ((flags & F_COMMAND) ? KVR_CURVE_F_COMMAND : 0u),
                            data, len);
        z->out_w += KVR_CURVE_MSG_OVERHEAD + len;
        return;
    }
    z->out_w += put_header(z->out + z->out_w, flags, len);
    if (len)
        memcpy(z->out + z->out_w, data, len);
    z->out_w += len;
    if (z->cv) /* sealed at OPEN */
        z->seal_extra += frame_len(KVR_CURVE_MSG_OVERHEAD + len) - frame_len(len);
}

/* CURVE, at OPEN: the frames queued before it, sealed in order (the
 * queue's bound counted their growth: seal_extra). */
static bool seal_queue(kvr_zmtp_t *z)
{
    if (z->out_r == z->out_w) {
        z->out_r = z->out_w = z->seal_extra = 0;
        return true;
    }
    size_t cap = z->out_w - z->out_r + z->seal_extra;
    uint8_t *b = malloc(cap), *old = z->out;
    if (!b)
        return false;
    size_t r = z->out_r, end = z->out_w;
    z->out = b;
    z->out_cap = cap;
    z->out_r = z->out_w = z->seal_extra = 0;
    while (r < end) {
        unsigned flags = old[r];
        size_t hl = (flags & F_LONG) ? 9 : 2, n = old[r + 1];
        if (flags & F_LONG)
            for (size_t k = 2; k < 9; k++)
                n = n << 8 | old[r + k];
        put_frame(z, flags & (F_MORE | F_COMMAND), old + r + hl, n);
        r += hl + n;
    }
    free(old);
    return true;
}

kvr_status_t kvr_zmtp_send(kvr_zmtp_t *z, const struct iovec *parts, size_t n)
{
    if (n == 0 || n > KVR_ZMTP_MAX_PARTS)
        return KVR_ERR_INVALID;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += queued_len(z, parts[i].iov_len);
    bool was_empty = z->out_r == z->out_w;
    if (!out_room(z, total))
        return KVR_ERR_NO_RESOURCE;
    for (size_t i = 0; i < n; i++)
        put_frame(z, i + 1 < n ? F_MORE : 0, parts[i].iov_base, parts[i].iov_len);
    if (z->st == ST_OPEN && was_empty) /* else EPOLLOUT is armed, or not connected yet */
        flush(z);
    return KVR_OK;
}

/* Answers a PING (RFC 37: PONG carries the PING's context). */
static void command(kvr_zmtp_t *z, const uint8_t *b, size_t size)
{
    if (size >= 7 && b[0] == 4 && !memcmp(b + 1, "PING", 4)) {
        size_t ctx = size - 7 > 16 ? 16 : size - 7;
        uint8_t pong[5 + 16] = {4, 'P', 'O', 'N', 'G'};
        memcpy(pong + 5, b + 7, ctx);
        if (out_room(z, queued_len(z, 5 + ctx))) {
            put_frame(z, F_COMMAND, pong, 5 + ctx);
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
            int r = frame_at(z, pos, z->in_p, z->max_frame, &flags, &hl, &size);
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

kvr_status_t kvr_zmtp_open(const char *endpoint, size_t max_frame,
                           const struct kvr_zmtp_curve_keys *curve, kvr_zmtp_t **z_p, char *err,
                           size_t err_len)
{
    kvr_zmtp_t *z = calloc(1, sizeof(*z));
    if (!z)
        return KVR_ERR_NO_MEMORY;
    z->sock = z->tfd = z->ep = -1;
    z->max_frame = max_frame;
    z->in_max = max_frame + 4096 + (9 + KVR_CURVE_MSG_OVERHEAD) * KVR_ZMTP_MAX_PARTS;
    z->in_cap = 65536 < z->in_max ? 65536 : z->in_max;
    z->in = malloc(z->in_cap);
    z->retry_ms = RETRY_MIN_MS;
    kvr_status_t st = z->in ? resolve(z, endpoint, err, err_len) : KVR_ERR_NO_MEMORY;
    if (st == KVR_OK && curve && (st = kvr_zmtp_curve_create(curve, &z->cv)) != KVR_OK)
        snprintf(err, err_len, "libsodium: %s", kvr_status_str(st));
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
    kvr_zmtp_curve_destroy(z->cv); /* the keys zeroed */
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
