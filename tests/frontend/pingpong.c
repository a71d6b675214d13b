/*
 * pingpong.c - kvr-pingpong: the floor under kvrail-frontend's added
 * latency on this machine, measured directly.  Not a test: a benchmark
 * tool, run by hand (docs/frontend.md, "Overhead").
 *
 *   kvr-pingpong [--rounds N] [--size BYTES] [--block N]
 *
 * Two processes (fork) bounce a message of BYTES (default 64, about a
 * token's frame) N times (default 20000) over loopback, and the round
 * trips are timed on the client's side:
 *   - tcp:  a plain TCP socket each side (TCP_NODELAY), blocking read and
 *           write: one wake-up per direction;
 *   - tcp+epoll: the same, each side waiting in epoll_wait before it reads,
 *           as an event loop (the frontend's) does;
 *   - zmq:  a ZeroMQ DEALER (client) and ROUTER (server), blocking
 *           zmq_send / zmq_recv, as kvrail's router and its clients talk:
 *           each direction crosses the sender's I/O thread and the
 *           receiver's I/O thread as well as the socket;
 *   - tcp -> relay -> zmq: the same ROUTER, reached through a relay
 *           process shaped like kvrail-frontend (one epoll loop over a TCP
 *           socket and a DEALER's ZMQ_FD) that the client talks TCP to:
 *           the least one more process in the path can cost;
 *   - tcp -> relay (ZMTP) -> zmq: the same relay, but its router link is
 *           a plain non-blocking TCP socket in its own epoll set that
 *           speaks ZMTP 3.1 (RFC 37, NULL mechanism) itself, as a DEALER:
 *           no ZeroMQ I/O thread in the relay, so one wake-up less per
 *           direction.  The prototype of the frontend's direct link.
 * The two relay rows run interleaved, in blocks of --block round trips
 * (default 100), so both see the same load.
 * Also the cost of one system call (getpid through syscall(2), so libc
 * cannot cache it), which sets the price of every call above.  Prints a
 * markdown table of round-trip p50 / p99 / mean in microseconds.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "kvr-pingpong: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, uint64_t *rtt, int n)
{
    qsort(rtt, (size_t)n, sizeof(*rtt), cmp_u64);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (double)rtt[i];
    printf("| %s | %.1f | %.1f | %.1f |\n", name, (double)rtt[n / 2] / 1e3,
           (double)rtt[(size_t)n * 99 / 100] / 1e3, sum / n / 1e3);
    fflush(stdout);
}

static void full_io(int fd, char *buf, size_t len, bool wr)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = wr ? write(fd, buf + done, len - done) : read(fd, buf + done, len - done);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            die(wr ? "write" : "read (peer gone)");
        }
        done += (size_t)r;
    }
}

/* Waits in epoll_wait until fd is readable (ep: an epoll set holding fd). */
static void wait_readable(int ep)
{
    struct epoll_event ev;
    while (epoll_wait(ep, &ev, 1, 10000) != 1)
        if (errno != EINTR)
            die("epoll_wait");
}

static int epoll_of(int fd)
{
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
        die("epoll");
    return ep;
}

static void tcp_run(const char *name, bool use_epoll, int rounds, size_t size, uint64_t *rtt)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0)
        die("listen");
    int one = 1;
    char *buf = calloc(1, size);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) { /* the server: echo */
        int s = accept(ls, NULL, NULL);
        if (s < 0)
            die("accept");
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        int ep = use_epoll ? epoll_of(s) : -1;
        for (int i = 0; i < rounds; i++) {
            if (use_epoll)
                wait_readable(ep);
            full_io(s, buf, size, false);
            full_io(s, buf, size, true);
        }
        _exit(0);
    }
    close(ls);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0)
        die("connect");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int ep = use_epoll ? epoll_of(s) : -1;
    for (int i = 0; i < rounds; i++) {
        uint64_t t0 = now_ns();
        full_io(s, buf, size, true);
        if (use_epoll)
            wait_readable(ep);
        full_io(s, buf, size, false);
        rtt[i] = now_ns() - t0;
    }
    close(s);
    waitpid(pid, NULL, 0);
    free(buf);
    report(name, rtt, rounds);
}

/* Forks the echo server: a ZeroMQ ROUTER on an ephemeral port, answering
 * rounds messages; its endpoint into ep. */
static pid_t zmq_server(int rounds, size_t size, char *ep, size_t ep_len)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        die("pipe");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        char *buf = calloc(1, size);
        void *ctx = zmq_ctx_new();
        void *r = zmq_socket(ctx, ZMQ_ROUTER);
        size_t el = ep_len;
        if (zmq_bind(r, "tcp://127.0.0.1:*") != 0 ||
            zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, ep, &el) != 0)
            die("zmq_bind");
        if (write(pfd[1], ep, strlen(ep) + 1) < 0)
            die("pipe write");
        char id[256];
        for (int i = 0; i < rounds; i++) {
            int il = zmq_recv(r, id, sizeof(id), 0);
            if (il < 0 || zmq_recv(r, buf, size, 0) < 0)
                die("zmq_recv (server)");
            zmq_send(r, id, (size_t)il, ZMQ_SNDMORE);
            zmq_send(r, buf, size, 0);
        }
        int zero = 0;
        zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_close(r);
        zmq_ctx_term(ctx);
        _exit(0);
    }
    memset(ep, 0, ep_len);
    if (read(pfd[0], ep, ep_len - 1) <= 0)
        die("pipe read");
    close(pfd[0]);
    close(pfd[1]);
    return pid;
}

/* ZMTP 3.1 (RFC 37), NULL mechanism, the DEALER side, just enough for the
 * prototype: a blocking handshake, then single-frame messages.  The
 * greeting is the 10-byte signature (ff, 8 padding bytes, 7f), version 3.1,
 * the mechanism "NULL" padded to 20 bytes, as-server 0 and 31 filler bytes;
 * then a READY command (flags 0x04) with Socket-Type=DEALER.  A frame is a
 * flags byte (MORE 1, LONG 2, COMMAND 4) and a 1- or 8-byte size. */
static int zmtp_connect(const char *ep)
{
    int port = 0;
    if (sscanf(ep, "tcp://127.0.0.1:%d", &port) != 1)
        die("zmtp endpoint");
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        die("connect (zmtp)");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint8_t g[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 1, 'N', 'U', 'L', 'L'};
    static const char st[] = "\x0bSocket-Type\x00\x00\x00\x06"
                             "DEALER";
    uint8_t ready[2 + 6 + sizeof(st) - 1] = {
        0x04, (uint8_t)(6 + sizeof(st) - 1), 5, 'R', 'E', 'A', 'D', 'Y'};
    memcpy(ready + 8, st, sizeof(st) - 1);
    full_io(fd, (char *)g, sizeof(g), true);
    full_io(fd, (char *)ready, sizeof(ready), true);
    uint8_t peer[64], hdr[2], body[255];
    full_io(fd, (char *)peer, sizeof(peer), false);
    if (peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3 || memcmp(peer + 12, "NULL", 5) != 0)
        die("zmtp greeting");
    full_io(fd, (char *)hdr, 2, false);
    if (hdr[0] != 0x04)
        die("zmtp READY expected");
    full_io(fd, (char *)body, hdr[1], false);
    if (hdr[1] < 6 || memcmp(body, "\x05READY", 6) != 0)
        die("zmtp READY");
    return fd;
}

/* Reads one short data frame of size bytes (skipping commands) into buf. */
static void zmtp_recv(int fd, char *buf, size_t size)
{
    for (;;) {
        uint8_t hdr[9];
        full_io(fd, (char *)hdr, 2, false);
        uint64_t len = hdr[1];
        if (hdr[0] & 0x02) {
            full_io(fd, (char *)hdr + 2, 7, false);
            len = 0;
            for (int k = 1; k < 9; k++)
                len = len << 8 | hdr[k];
        }
        if (!(hdr[0] & 0x04) && len == size) {
            full_io(fd, buf, size, false);
            return;
        }
        char skip[256];
        while (len > 0) { /* a command (PING...) or an unexpected frame */
            size_t n = len < sizeof(skip) ? (size_t)len : sizeof(skip);
            full_io(fd, skip, n, false);
            len -= n;
        }
    }
}

/* Writes buf as one data frame in one write(2). */
static void zmtp_send(int fd, const char *buf, size_t size, char *tmp)
{
    size_t h;
    if (size < 256) {
        tmp[0] = 0;
        tmp[1] = (char)size;
        h = 2;
    } else {
        tmp[0] = 0x02;
        for (int k = 0; k < 8; k++)
            tmp[1 + k] = (char)((uint64_t)size >> (56 - 8 * k));
        h = 9;
    }
    memcpy(tmp + h, buf, size);
    full_io(fd, tmp, h + size, true);
}

/* The client's side of a plain ZeroMQ round trip: a DEALER, blocking. */
static void zmq_run(int rounds, size_t size, uint64_t *rtt)
{
    char ep[256];
    pid_t srv = zmq_server(rounds, size, ep, sizeof(ep));
    char *buf = calloc(1, size);
    int zero = 0;
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    if (zmq_connect(d, ep) != 0)
        die("zmq_connect");
    for (int i = 0; i < rounds; i++) {
        uint64_t t0 = now_ns();
        if (zmq_send(d, buf, size, 0) < 0 || zmq_recv(d, buf, size, 0) < 0)
            die("zmq send/recv (client)");
        rtt[i] = now_ns() - t0;
    }
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(d);
    zmq_ctx_term(ctx);
    waitpid(srv, NULL, 0);
    free(buf);
    report("zmq (DEALER-ROUTER)", rtt, rounds);
}

/* A relay's epoll set: the client's socket s and the router side's fd. */
static int relay_set(int s, int fd)
{
    int epfd = epoll_of(s);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        die("epoll (relay)");
    return epfd;
}

/* Waits for a relay's events (0 on a signal). */
static int relay_wait(int epfd, struct epoll_event got[2])
{
    int n = epoll_wait(epfd, got, 2, 10000);
    if (n < 0 && errno != EINTR)
        die("epoll_wait (relay)");
    return n < 0 ? 0 : n;
}

/* The relay's loop with a libzmq DEALER: one epoll set over the client's
 * TCP socket s and the DEALER's ZMQ_FD (draining ZeroMQ until EAGAIN, as
 * kvrail-frontend does), forwarding each message both ways. */
static void relay_zmq(int s, const char *ep, int rounds, size_t size, char *buf)
{
    int zero = 0;
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zfd = -1;
    size_t zl = sizeof(zfd);
    if (zmq_connect(d, ep) != 0 || zmq_getsockopt(d, ZMQ_FD, &zfd, &zl) != 0)
        die("zmq_connect (relay)");
    int epfd = relay_set(s, zfd);
    int answered = 0;
    while (answered < rounds) {
        struct epoll_event got[2];
        int n = relay_wait(epfd, got);
        for (int k = 0; k < n; k++)
            if (got[k].data.fd == s) {
                full_io(s, buf, size, false);
                if (zmq_send(d, buf, size, 0) < 0)
                    die("zmq_send (relay)");
            }
        /* ZeroMQ's rule for its descriptor: receive until EAGAIN, also
         * after a send (which may have taken the wake-up) */
        while (zmq_recv(d, buf, size, ZMQ_DONTWAIT) >= 0) {
            full_io(s, buf, size, true);
            answered++;
        }
    }
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(d);
    zmq_ctx_term(ctx);
}

/* The relay's loop with its own ZMTP link: one epoll set over the client's
 * socket and the router's TCP socket, no ZeroMQ thread at all. */
static void relay_zmtp(int s, const char *ep, int rounds, size_t size, char *buf)
{
    int z = zmtp_connect(ep);
    char *tmp = malloc(size + 9);
    if (!tmp)
        die("malloc");
    int epfd = relay_set(s, z);
    int answered = 0;
    while (answered < rounds) {
        struct epoll_event got[2];
        int n = relay_wait(epfd, got);
        for (int k = 0; k < n; k++) {
            if (got[k].data.fd == s) {
                full_io(s, buf, size, false);
                zmtp_send(z, buf, size, tmp);
            } else {
                zmtp_recv(z, buf, size);
                full_io(s, buf, size, true);
                answered++;
            }
        }
    }
    free(tmp);
    close(z);
}

struct relay {
    pid_t srv, rel;
    int s; /* the client's TCP socket to the relay */
};

/* Starts an echo ROUTER and a relay in front of it (zmtp: the relay's own
 * ZMTP link, else a libzmq DEALER); the client's socket in r->s. */
static void relay_start(struct relay *r, bool zmtp, int rounds, size_t size)
{
    char ep[256];
    r->srv = zmq_server(rounds, size, ep, sizeof(ep));
    int one = 1;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0)
        die("listen");
    r->rel = fork();
    if (r->rel < 0)
        die("fork");
    if (r->rel == 0) {
        int s = accept(ls, NULL, NULL);
        if (s < 0)
            die("accept");
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        char *buf = calloc(1, size);
        (zmtp ? relay_zmtp : relay_zmq)(s, ep, rounds, size, buf);
        _exit(0);
    }
    close(ls);
    r->s = socket(AF_INET, SOCK_STREAM, 0);
    if (r->s < 0 || connect(r->s, (struct sockaddr *)&a, sizeof(a)) != 0)
        die("connect");
    setsockopt(r->s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* The frontend's shape, with each kind of router link: rounds round trips
 * through each relay, alternating blocks of block round trips between
 * the two (block = rounds: one after the other) so both see the same
 * load.  The rows' difference against "zmq" is what one more process in
 * the path costs here before it does any work of its own. */
static void relay_run(int rounds, int block, size_t size, uint64_t *rtt)
{
    struct relay r[2];
    relay_start(&r[0], false, rounds, size);
    relay_start(&r[1], true, rounds, size);
    uint64_t *rtt2 = calloc((size_t)rounds, sizeof(*rtt2));
    char *buf = calloc(1, size);
    if (!rtt2 || !buf)
        die("calloc");
    uint64_t *out[2] = {rtt, rtt2};
    for (int done = 0; done < rounds; done += block)
        for (int m = 0; m < 2; m++)
            for (int i = done; i < done + block && i < rounds; i++) {
                uint64_t t0 = now_ns();
                full_io(r[m].s, buf, size, true);
                full_io(r[m].s, buf, size, false);
                out[m][i] = now_ns() - t0;
            }
    for (int m = 0; m < 2; m++) {
        close(r[m].s);
        waitpid(r[m].rel, NULL, 0);
        waitpid(r[m].srv, NULL, 0);
    }
    report("tcp -> relay (epoll loop + libzmq DEALER) -> zmq", rtt, rounds);
    report("tcp -> relay (epoll loop + own ZMTP 3.1 link) -> zmq", rtt2, rounds);
    free(rtt2);
    free(buf);
}

int main(int argc, char **argv)
{
    int rounds = 20000, block = 0;
    size_t size = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--block") && i + 1 < argc)
            block = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: kvr-pingpong [--rounds N] [--size BYTES] [--block N]\n"
                   "  --block N: the two relay rows alternate every N round trips (default 100)\n");
            return 0;
        } else {
            fprintf(stderr, "kvr-pingpong: unknown argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (rounds < 100 || size < 1 || size > (1u << 20)) {
        fprintf(stderr, "kvr-pingpong: --rounds at least 100, --size 1 .. 1 MiB\n");
        return 2;
    }
    if (block <= 0 || block > rounds)
        block = block <= 0 ? 100 : rounds;
    uint64_t *rtt = calloc((size_t)rounds, sizeof(*rtt));
    if (!rtt)
        die("calloc");
    signal(SIGPIPE, SIG_IGN);
    printf("| %d round trips of %zu bytes | p50 us | p99 us | mean us |\n|---|---:|---:|---:|\n",
           rounds, size);
    /* one system call */
    for (int i = 0; i < rounds; i++) {
        uint64_t t0 = now_ns();
        for (int k = 0; k < 10; k++)
            syscall(SYS_getpid);
        rtt[i] = (now_ns() - t0) / 10;
    }
    report("one system call (getpid)", rtt, rounds);
    tcp_run("tcp", false, rounds, size, rtt);
    tcp_run("tcp + epoll_wait", true, rounds, size, rtt);
    zmq_run(rounds, size, rtt);
    relay_run(rounds, block, size, rtt);
    free(rtt);
    return 0;
}
