/*
 * fuzz_zmtp.c - fuzz target over libkvrail-client's direct router link
 * (router/client/zmtp.c, zmtp_curve.c): what a broken or hostile router
 * sends the frontend, on a real loopback TCP connection, through the
 * link's own API (kvr_zmtp_open, kvr_zmtp_io, kvr_zmtp_recv,
 * kvr_zmtp_send), with the NULL or the CURVE mechanism.
 *
 * How it works.  A listening socket on 127.0.0.1 stands in for the router;
 * each input opens a link to it, accepts the connection, and plays the
 * input's records as the router's side of the conversation.  What the
 * link writes back is read and checked as it goes (its greeting, NULL's
 * READY, CURVE's HELLO and INITIATE, then frames: every one well formed,
 * every CURVE MESSAGE box opening under rising nonces).  For CURVE, the
 * records are sealed here, with fixed long- and short-term keys for the
 * router and the client's key pair, so the fuzzer reaches MESSAGE parsing
 * without having to forge a box; raw records reach everything else.  The
 * connection is reset at the end (no TIME_WAIT piles up).
 *
 * An input is a config byte, then records:
 *   config: bit 0: CURVE (else NULL); bits 1-2: max_frame 16, 256, 4096 or
 *           100000 (the buffer then grows past its first 64 KiB); bit 3: a
 *           2-part message sent before the handshake (queued plain; CURVE
 *           seals it at OPEN)
 *   record: op (1 byte): bits 0-2 what, bits 3-7 chunk: the record's bytes
 *           go out in pieces of that many (0: at once), the link driven
 *           after each piece (partial reads)
 *     0 raw: n (1 byte; 255: 2 more, little-endian), n bytes as they are
 *     1 greeting: the mechanism's own 64 bytes (CURVE: as-server 1)
 *     2 handshake: NULL: READY with properties n (1 byte) + bytes;
 *       CURVE: the WELCOME to the client's HELLO, byte k (1 byte; 0: none)
 *       % 168 flipped
 *     3 NULL: ERROR, n + reason bytes;  CURVE: READY, nonce step (1 byte),
 *       n + metadata bytes, sealed
 *     4 frame: f (1 byte), n (as raw), n bytes.  NULL: flags f & 0x85
 *       (0x80: a reserved bit), 8-byte size if f & 0x08.  CURVE: a MESSAGE,
 *       f & 3 inside its box (MORE, COMMAND; f & 4: a reserved bit), f >> 4
 *       the frame's own flags, then a nonce step (1 byte; 0: a replay)
 *     5 send: parts (1 byte, % 10), a length byte per part (x 37 bytes)
 *     6 close: the router shuts its side (the link reads the end); with
 *       chunk bits set, resets the connection instead
 *     7 big frames: f as in 4, units (1 byte; x 512 bytes of a pattern),
 *       count (1 byte; % 16 + 1 frames in one piece, so the link's buffer
 *       grows and fills with whole messages; 256 KiB a record, 1 MiB an
 *       input at most), CURVE: a nonce step per frame (1 byte); chunk in
 *       units of 4096 bytes
 * Built two ways: with libFuzzer (tests/fuzz/libfuzzer.sh) and as a plain
 * driver over the seed corpus (fuzz_main.c); mkseeds.py writes the seeds.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "zmtp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CLIENT_OUT_MAX (1u << 20) /* what is kept of the link's output */

static struct {
    bool ready;
    int lfd;
    char endpoint[64];
    uint8_t s_pub[32], s_sec[32];   /* the router's long-term pair S */
    uint8_t sn_pub[32], sn_sec[32]; /* its short-term pair S' */
    struct kvr_zmtp_curve_keys keys;
} g;

/* this input's conversation */
static struct {
    kvr_zmtp_t *z;
    int fd; /* the router's end */
    bool curve, have_key, closed;
    size_t max_frame;
    uint8_t cn_pub[32]; /* the client's C' (its HELLO) */
    uint8_t k[crypto_box_BEFORENMBYTES];
    uint64_t nonce; /* the router's last short nonce */
    /* the link's output, parsed as it comes */
    uint8_t *out;
    size_t out_len, out_pos;
    int out_stage; /* 0 greeting, 1 first command, 2 (CURVE) INITIATE, 3 frames */
    uint64_t out_nonce;
    bool out_more;      /* a message's MORE part was last */
    size_t msgs, pongs; /* received whole, PONGs the link wrote */
    /* the data frames sent, in order: what the link delivers must be
     * these, whole messages of them (a prefix: a fault ends it); off once
     * raw bytes have been sent (they may frame anything) */
    struct sent {
        uint64_t hash;
        size_t len;
        bool more;
    } * sent;
    size_t n_sent, cap_sent, next_sent;
    bool unframed;
    size_t big_bytes; /* sent by record 7 */
} c;

static void setup_once(void)
{
    if (g.ready)
        return;
    if (sodium_init() < 0)
        abort();
    uint8_t seed[crypto_box_SEEDBYTES];
    memset(seed, 'S', sizeof(seed));
    crypto_box_seed_keypair(g.s_pub, g.s_sec, seed);
    memset(seed, 's', sizeof(seed));
    crypto_box_seed_keypair(g.sn_pub, g.sn_sec, seed);
    memset(seed, 'C', sizeof(seed));
    crypto_box_seed_keypair(g.keys.pub, g.keys.sec, seed);
    memcpy(g.keys.server, g.s_pub, 32);
    g.lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (g.lfd < 0 || bind(g.lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(g.lfd, 64) != 0 ||
        getsockname(g.lfd, (struct sockaddr *)&a, &al) != 0) {
        perror("fuzz_zmtp: listen on 127.0.0.1");
        abort();
    }
    snprintf(g.endpoint, sizeof(g.endpoint), "tcp://127.0.0.1:%u", ntohs(a.sin_port));
    g.ready = true;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* ---- the link's output, checked ---- */

/* One whole frame of the link's (after the greeting): flags, body. */
static void check_frame(unsigned flags, uint8_t *b, size_t n)
{
    if (flags & ~7u)
        abort();            /* reserved bits from the link */
    if (c.out_stage == 1) { /* NULL's READY or CURVE's HELLO */
        if (!(flags & 4) || (flags & 1))
            abort();
        if (!c.curve) {
            if (n < 6 || memcmp(b, "\x05READY", 6) != 0)
                abort();
            c.out_stage = 3;
            return;
        }
        if (n != 200 || memcmp(b, "\x05HELLO\x01\x00", 8) != 0)
            abort();
        memcpy(c.cn_pub, b + 80, 32);
        if (crypto_box_beforenm(c.k, c.cn_pub, g.sn_sec) != 0)
            abort();
        c.have_key = true;
        c.out_stage = 2;
        return;
    }
    if (c.out_stage == 2) { /* CURVE's INITIATE */
        if (!(flags & 4) || n < 9 || memcmp(b, "\x08INITIATE", 9) != 0)
            abort();
        c.out_stage = 3;
        return;
    }
    unsigned inner = flags;
    if (c.curve) { /* every frame a MESSAGE whose box opens */
        if ((flags & ~2u) || n < 33 || memcmp(b, "\x07MESSAGE", 8) != 0)
            abort();
        uint64_t nonce = get_u64(b + 8);
        if (nonce <= c.out_nonce)
            abort();
        c.out_nonce = nonce;
        uint8_t nn[24];
        memcpy(nn, "CurveZMQMESSAGEC", 16);
        memcpy(nn + 16, b + 8, 8);
        if (crypto_box_open_easy_afternm(b + 32, b + 16, n - 16, nn, c.k) != 0)
            abort();
        inner = (b[32] & 1 ? 1u : 0u) | (b[32] & 2 ? 4u : 0u);
        if (b[32] & ~3u)
            abort();
        b += 33;
        n -= 33;
    }
    if (inner & 4) { /* a command: PONG only, never inside a message */
        if (c.out_more || (inner & 1) || n < 5 || memcmp(b, "\x04PONG", 5) != 0)
            abort();
        c.pongs++;
        return;
    }
    c.out_more = inner & 1;
}

/* Reads what the link wrote and checks each whole frame of it. */
static void read_link(void)
{
    for (;;) {
        if (c.out_len == CLIENT_OUT_MAX) { /* keep the unparsed tail */
            memmove(c.out, c.out + c.out_pos, c.out_len - c.out_pos);
            c.out_len -= c.out_pos;
            c.out_pos = 0;
            if (c.out_len == CLIENT_OUT_MAX)
                abort(); /* a frame larger than anything sent */
        }
        ssize_t r = recv(c.fd, c.out + c.out_len, CLIENT_OUT_MAX - c.out_len, MSG_DONTWAIT);
        if (r <= 0)
            break;
        c.out_len += (size_t)r;
    }
    for (;;) {
        uint8_t *p = c.out + c.out_pos;
        size_t avail = c.out_len - c.out_pos;
        if (c.out_stage == 0) {
            if (avail < 64)
                return;
            if (p[0] != 0xff || p[9] != 0x7f || p[10] != 3 ||
                memcmp(p + 12, c.curve ? "CURVE" : "NULL", c.curve ? 6 : 5) != 0)
                abort();
            c.out_pos += 64;
            c.out_stage = 1;
            continue;
        }
        if (avail < 2)
            return;
        size_t hl = (p[0] & 2) ? 9 : 2;
        if (avail < hl)
            return;
        uint64_t n = p[1];
        if (p[0] & 2)
            n = get_u64(p + 1);
        if (n > CLIENT_OUT_MAX)
            abort();
        if (avail - hl < n)
            return;
        check_frame(p[0], p + hl, (size_t)n);
        c.out_pos += hl + (size_t)n;
    }
}

/* ---- the link driven ---- */

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* A data frame about to go out (commands are not delivered: not kept). */
static void sent_frame(const uint8_t *p, size_t n, bool more)
{
    if (c.n_sent == c.cap_sent) {
        c.cap_sent = c.cap_sent ? 2 * c.cap_sent : 64;
        c.sent = realloc(c.sent, c.cap_sent * sizeof(*c.sent));
        if (!c.sent)
            abort();
    }
    c.sent[c.n_sent++] = (struct sent){fnv(p, n), n, more};
}

static void check_msg(const struct kvr_zmtp_msg *m)
{
    if (m->nparts < 1 || m->nparts > KVR_ZMTP_MAX_PARTS)
        abort();
    for (size_t i = 0; i < m->nparts; i++) {
        if (m->len[i] > c.max_frame)
            abort();
        uint64_t h = fnv(m->part[i], m->len[i]); /* every byte read (ASan) */
        if (c.unframed)
            continue;
        if (c.next_sent == c.n_sent)
            abort(); /* a part that was never sent */
        const struct sent *e = &c.sent[c.next_sent++];
        if (e->hash != h || e->len != m->len[i] || e->more != (i + 1 < m->nparts))
            abort(); /* not the frame sent, or not where it was */
    }
    c.msgs++;
}

/* Drives the link: passes x (its I/O, every whole message taken, its
 * output read and checked). */
static void drive_n(int passes)
{
    for (int k = 0; k < passes; k++) {
        unsigned ev = kvr_zmtp_io(c.z);
        if ((ev & KVR_ZMTP_EV_LOST) && !kvr_zmtp_error(c.z)[0])
            abort(); /* a connection lost without a reason */
        if ((ev & KVR_ZMTP_EV_CONNECTED) && !(ev & KVR_ZMTP_EV_LOST) && !kvr_zmtp_up(c.z))
            abort();
        struct kvr_zmtp_msg m;
        kvr_status_t st;
        while ((st = kvr_zmtp_recv(c.z, &m)) == KVR_OK)
            check_msg(&m);
        if (st == KVR_ERR_CLOSED && (!kvr_zmtp_error(c.z)[0] || kvr_zmtp_up(c.z)))
            abort();
        read_link();
    }
}

static void drive(void)
{
    drive_n(3); /* the input buffer full of whole messages: taken, then read on */
}

/* Sends b[0..n) to the link, chunk bytes at a time (0: at once), driving
 * it after each piece. */
static void put(const uint8_t *b, size_t n, size_t chunk)
{
    if (c.closed || kvr_zmtp_error(c.z)[0])
        return; /* the link dropped the connection (its reason kept until it is up again) */
    size_t off = 0;
    int stuck = 0;
    while (off < n && stuck < 8) {
        size_t w = chunk && n - off > chunk ? chunk : n - off;
        ssize_t r = send(c.fd, b + off, w, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) {
            off += (size_t)r;
            stuck = 0;
        } else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            break; /* the link reset the connection */
        } else {
            stuck++;
        }
        drive_n(off < n ? 1 : 3);
    }
}

static size_t frame_hdr(uint8_t *p, unsigned flags, size_t n, bool force_long)
{
    if (n <= 255 && !force_long) {
        p[0] = (uint8_t)flags;
        p[1] = (uint8_t)n;
        return 2;
    }
    p[0] = (uint8_t)(flags | 2);
    put_u64(p + 1, n);
    return 9;
}

/* A CURVE command sealed under the router's next nonce (+ step). */
static size_t seal(uint8_t *out, const char *name, const char prefix[16], uint8_t step,
                   const uint8_t *plain, size_t n)
{
    size_t nl = strlen(name);
    out[0] = (uint8_t)nl;
    memcpy(out + 1, name, nl);
    c.nonce += step;
    put_u64(out + 1 + nl, c.nonce);
    uint8_t nn[24];
    memcpy(nn, prefix, 16);
    put_u64(nn + 16, c.nonce);
    crypto_box_easy_afternm(out + 9 + nl, plain, n, nn, c.k);
    return 9 + nl + 16 + n;
}

/* The length of a record's byte string: 1 byte, 255: 2 more (LE). */
static size_t take_len(const uint8_t *d, size_t size, size_t *pos)
{
    if (*pos >= size)
        return 0;
    size_t n = d[(*pos)++];
    if (n == 255 && *pos + 2 <= size) {
        n = d[*pos] | (size_t)d[*pos + 1] << 8;
        *pos += 2;
    }
    return n > size - *pos ? size - *pos : n;
}

static uint8_t take_byte(const uint8_t *d, size_t size, size_t *pos)
{
    return *pos < size ? d[(*pos)++] : 0;
}

static uint8_t pattern[255 * 37];

static void send_parts(size_t nparts, const uint8_t *lens)
{
    struct iovec iov[10];
    for (size_t i = 0; i < nparts; i++) {
        iov[i].iov_base = pattern;
        iov[i].iov_len = (size_t)lens[i] * 37;
    }
    kvr_status_t st = kvr_zmtp_send(c.z, iov, nparts);
    if ((nparts == 0 || nparts > KVR_ZMTP_MAX_PARTS) != (st == KVR_ERR_INVALID))
        abort();
    drive();
}

static void reset_conn(void)
{
    if (c.fd >= 0) {
        struct linger l = {1, 0}; /* RST: no TIME_WAIT on either side */
        setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
        close(c.fd);
        c.fd = -1;
    }
}

/* Record 7: count frames of units x 512 pattern bytes, sent as one piece. */
static void big_frames(const uint8_t *data, size_t size, size_t *pos, size_t chunk)
{
    uint8_t f = take_byte(data, size, pos);
    size_t n = (size_t)take_byte(data, size, pos) * 512;
    size_t count = take_byte(data, size, pos) % 16 + 1;
    /* at most 256 KiB a record, 1 MiB an input (enough to fill the largest
     * buffer, ~100 KiB, several times over; more only costs runs) */
    if (n * count > (256u << 10))
        count = n ? (256u << 10) / n : count;
    if (c.big_bytes + n * count > (1u << 20) || kvr_zmtp_error(c.z)[0])
        return;
    c.big_bytes += n * count;
    size_t each = 9 + 16 + 16 + 1 + n; /* a CURVE frame's most */
    uint8_t *b = malloc(count * each), *plain = malloc(n + 1);
    if (!b || !plain)
        abort();
    for (size_t i = 0; i < n; i++)
        plain[1 + i] = (uint8_t)(i * 31 + (i >> 9));
    size_t len = 0;
    for (size_t k = 0; k < count; k++) {
        if (!c.curve) {
            len += frame_hdr(b + len, f & 0x85, n, f & 8);
            memcpy(b + len, plain + 1, n);
            len += n;
            if (!(f & 4))
                sent_frame(plain + 1, n, f & 1);
            continue;
        }
        uint8_t step = take_byte(data, size, pos);
        if (!c.have_key)
            continue;
        if (!(f & 2))
            sent_frame(plain + 1, n, f & 1);
        plain[0] = (uint8_t)(f & 7);
        size_t hl = frame_hdr(b + len, f >> 4, 33 + n, false);
        seal(b + len + hl, "MESSAGE", "CurveZMQMESSAGES", step, plain, n + 1);
        len += hl + 33 + n;
    }
    put(b, len, chunk);
    free(b);
    free(plain);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    if (size < 1)
        return 0;
    static const size_t max_frames[] = {16, 256, 4096, 100000};
    static uint8_t *outbuf;
    if (!outbuf && !(outbuf = malloc(CLIENT_OUT_MAX)))
        abort();
    memset(&c, 0, sizeof(c));
    c.out = outbuf;
    c.fd = -1;
    c.curve = data[0] & 1;
    c.max_frame = max_frames[(data[0] >> 1) & 3];
    char err[256];
    if (kvr_zmtp_open(g.endpoint, c.max_frame, c.curve ? &g.keys : NULL, &c.z, err, sizeof(err)) !=
        KVR_OK) {
        fprintf(stderr, "fuzz_zmtp: open %s: %s\n", g.endpoint, err);
        abort();
    }
    struct pollfd pfd = {.fd = g.lfd, .events = POLLIN};
    if (poll(&pfd, 1, 10000) != 1 || (c.fd = accept4(g.lfd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
        fprintf(stderr, "fuzz_zmtp: the link did not connect to %s\n", g.endpoint);
        abort();
    }
    int one = 1; /* as libzmq's router: no Nagle delay behind an unacknowledged segment */
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (data[0] & 8)
        send_parts(2, (const uint8_t[]){1, 9});
    drive();
    uint8_t *buf = malloc(size + 512), *pbuf = malloc(size + 1);
    if (!buf || !pbuf)
        abort();
    size_t pos = 1;
    while (pos < size) {
        uint8_t op = data[pos++];
        size_t chunk = op >> 3, n = 0, k;
        uint8_t f, step;
        switch (op & 7) {
        case 0:
            k = take_len(data, size, &pos);
            c.unframed |= k > 0;
            put(data + pos, k, chunk);
            pos += k;
            break;
        case 1:
            memset(buf, 0, 64);
            buf[0] = 0xff;
            buf[9] = 0x7f;
            buf[10] = 3;
            buf[11] = 1;
            memcpy(buf + 12, c.curve ? "CURVE" : "NULL", c.curve ? 5 : 4);
            buf[32] = c.curve;
            put(buf, 64, chunk);
            break;
        case 2:
            if (!c.curve) {
                k = take_len(data, size, &pos);
                n = frame_hdr(buf, 4, 6 + k, false);
                memcpy(buf + n, "\x05READY", 6);
                memcpy(buf + n + 6, data + pos, k);
                pos += k;
                put(buf, n + 6 + k, chunk);
                break;
            }
            f = take_byte(data, size, &pos);
            if (!c.have_key)
                break; /* no HELLO to answer */
            n = frame_hdr(buf, 4, 168, false);
            {
                uint8_t plain[128], *w = buf + n;
                memcpy(w, "\x07WELCOME", 8);
                memset(w + 8, 'w', 16);
                memcpy(plain, g.sn_pub, 32);
                memset(plain + 32, 'k', 96); /* the cookie (the client sends it back) */
                uint8_t nn[24];
                memcpy(nn, "WELCOME-", 8);
                memcpy(nn + 8, w + 8, 16);
                if (crypto_box_easy(w + 24, plain, sizeof(plain), nn, c.cn_pub, g.s_sec) != 0)
                    abort();
                if (f)
                    w[f % 168] ^= 0x20;
            }
            put(buf, n + 168, chunk);
            break;
        case 3:
            if (!c.curve) {
                k = take_len(data, size, &pos);
                n = frame_hdr(buf, 4, 7 + k, false);
                memcpy(buf + n,
                       "\x05"
                       "ERROR",
                       6);
                buf[n + 6] = (uint8_t)k;
                memcpy(buf + n + 7, data + pos, k);
                pos += k;
                put(buf, n + 7 + k, chunk);
                break;
            }
            step = take_byte(data, size, &pos);
            k = take_len(data, size, &pos);
            if (c.have_key) {
                uint8_t *body = buf + 16;
                size_t bl = seal(body, "READY", "CurveZMQREADY---", step, data + pos, k);
                n = frame_hdr(buf, 4, bl, false);
                memmove(buf + n, body, bl);
                put(buf, n + bl, chunk);
            }
            pos += k;
            break;
        case 4:
            f = take_byte(data, size, &pos);
            k = take_len(data, size, &pos);
            if (!c.curve) {
                n = frame_hdr(buf, f & 0x85, k, f & 8);
                memcpy(buf + n, data + pos, k);
                pos += k;
                if (!(f & 4))
                    sent_frame(buf + n, k, f & 1);
                put(buf, n + k, chunk);
                break;
            }
            memcpy(pbuf + 1, data + pos, k);
            pos += k;
            step = take_byte(data, size, &pos);
            if (c.have_key) {
                uint8_t *body = buf + 16, *plain = pbuf;
                plain[0] = (uint8_t)(f & 7);
                size_t bl = seal(body, "MESSAGE", "CurveZMQMESSAGES", step, plain, k + 1);
                n = frame_hdr(buf, f >> 4, bl, false);
                memmove(buf + n, body, bl);
                if (!(f & 2))
                    sent_frame(pbuf + 1, k, f & 1);
                put(buf, n + bl, chunk);
            }
            break;
        case 5: {
            size_t np = take_byte(data, size, &pos) % 10;
            uint8_t lens[10] = {0};
            for (size_t i = 0; i < np; i++)
                lens[i] = take_byte(data, size, &pos);
            send_parts(np, lens);
            break;
        }
        case 6:
            if (chunk) {
                reset_conn(); /* RST: the link's next read or write fails */
                drive();
                reset_conn();
            } else if (!c.closed) {
                shutdown(c.fd, SHUT_WR);
            }
            c.closed = true;
            drive();
            break;
        default:
            big_frames(data, size, &pos, chunk * 4096);
            break;
        }
    }
    free(buf);
    free(pbuf);
    drive();
    if (getenv("FUZZ_VERBOSE")) /* what a seed reached */
        fprintf(stderr, "fuzz_zmtp: %s, %zu messages, %zu PONGs; %s\n",
                kvr_zmtp_up(c.z) ? "up" : "down", c.msgs, c.pongs, kvr_zmtp_error(c.z));
    reset_conn();
    kvr_zmtp_close(c.z);
    free(c.sent);
    for (;;) { /* a reconnect the link's timer made (a slow run) */
        int fd = accept4(g.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            break;
        c.fd = fd;
        reset_conn();
    }
    return 0;
}
