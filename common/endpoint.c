/* endpoint.c: a cluster file's ZeroMQ endpoint in the form zmq_bind takes.
 *
 * zmq_bind resolves "tcp://HOST:PORT" only as an interface name or an IP
 * address; a host name such as "localhost" fails with ENODEV ("No such
 * device") while zmq_connect accepts it.  kvr_endpoint_bind_form splits a
 * tcp:// endpoint at its last ':', leaves "*", IPv4 and bracketed IPv6 hosts
 * alone, and otherwise asks getaddrinfo for the host's addresses, taking the
 * first IPv4 one (the family the rest of the cluster dials first) or else
 * the first IPv6 one in brackets.  Other transports (ipc://, inproc://) are
 * copied unchanged. */
#include "kvr_endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static kvr_status_t copy_out(const char *s, char *out, size_t n, const char *ep, char *err,
                             size_t errlen)
{
    int w = snprintf(out, n, "%s", s);
    if (w < 0 || (size_t)w >= n) {
        snprintf(err, errlen, "endpoint %s: too long for a %zu-byte buffer", ep, n);
        return KVR_ERR_INVALID;
    }
    return KVR_OK;
}

kvr_status_t kvr_endpoint_bind_form(const char *ep, char *out, size_t n, char *err, size_t errlen)
{
    static const char tcp[] = "tcp://";
    if (strncmp(ep, tcp, sizeof(tcp) - 1) != 0)
        return copy_out(ep, out, n, ep, err, errlen);
    const char *host = ep + sizeof(tcp) - 1;
    const char *colon = strrchr(host, ':');
    if (!colon || colon == host) {
        snprintf(err, errlen, "endpoint %s: expected tcp://HOST:PORT", ep);
        return KVR_ERR_INVALID;
    }
    char name[256];
    size_t hl = (size_t)(colon - host);
    if (hl >= sizeof(name)) {
        snprintf(err, errlen, "endpoint %s: host longer than %zu bytes", ep, sizeof(name) - 1);
        return KVR_ERR_INVALID;
    }
    memcpy(name, host, hl);
    name[hl] = '\0';
    struct in_addr a4;
    if (!strcmp(name, "*") || name[0] == '[' || inet_pton(AF_INET, name, &a4) == 1)
        return copy_out(ep, out, n, ep, err, errlen);

    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(name, NULL, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen,
                 "endpoint %s: host '%s' does not resolve (%s); give an IP address, '*' or a "
                 "name in /etc/hosts or DNS",
                 ep, name, gai_strerror(gai));
        return KVR_ERR_INVALID;
    }
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *p = ai; p && !pick; p = p->ai_next)
        if (p->ai_family == AF_INET)
            pick = p;
    for (const struct addrinfo *p = ai; p && !pick; p = p->ai_next)
        if (p->ai_family == AF_INET6)
            pick = p;
    char addr[INET6_ADDRSTRLEN] = "";
    if (pick && pick->ai_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)pick->ai_addr)->sin_addr, addr,
                  sizeof(addr));
    else if (pick)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)pick->ai_addr)->sin6_addr, addr,
                  sizeof(addr));
    int v6 = pick && pick->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (!addr[0]) {
        snprintf(err, errlen, "endpoint %s: host '%s' has no IPv4 or IPv6 address", ep, name);
        return KVR_ERR_INVALID;
    }
    char buf[512];
    snprintf(buf, sizeof(buf), "tcp://%s%s%s%s", v6 ? "[" : "", addr, v6 ? "]" : "", colon);
    return copy_out(buf, out, n, ep, err, errlen);
}
