/*
 * metrics_http.c - /metrics, /health and /ready over HTTP
 * (kvr_metrics_http.h), on libmicrohttpd's internal poll thread.
 *
 * Only GET and HEAD are answered (405 otherwise, without reading a body);
 * an unknown path is 404.  At most KVR_METRICS_HTTP_MAX_CONN connections,
 * each with a 16 KiB memory limit and a KVR_METRICS_HTTP_TIMEOUT idle
 * timeout, so a slowloris or a flood costs bounded memory and never
 * reaches the process's loop.  The ready state is a mutex-guarded flag and
 * message set by the process's loop thread.
 */
#include "kvr_metrics_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kvr_log.h"

#define COMP "metrics"

#include <microhttpd.h>

struct kvr_metrics_http {
    kvr_metrics_t *reg;
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    bool ready;
    char why[256];
};

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *type,
                              char *body, size_t len, bool owned)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
    if (!r) {
        if (owned)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned status, const char *s)
{
    return answer(c, status, "text/plain; charset=utf-8", (char *)s, strlen(s), false);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **ctx)
{
    (void)version;
    (void)upload;
    (void)upload_len;
    (void)ctx;
    kvr_metrics_http_t *srv = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD are served here\n");
    if (!strcmp(url, "/metrics")) {
        size_t len = 0;
        char *body = kvr_metrics_render(srv->reg, &len);
        if (!body)
            return text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory rendering metrics\n");
        return answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len, true);
    }
    if (!strcmp(url, "/health"))
        return text(c, MHD_HTTP_OK, "ok\n");
    if (!strcmp(url, "/ready")) {
        char msg[300];
        pthread_mutex_lock(&srv->mu);
        bool ready = srv->ready;
        snprintf(msg, sizeof msg, "%s\n", ready ? "ready" : srv->why);
        pthread_mutex_unlock(&srv->mu);
        return text(c, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, msg);
    }
    return text(c, MHD_HTTP_NOT_FOUND,
                "not found: this port serves /metrics, /health and /ready\n");
}

kvr_status_t kvr_metrics_http_start(kvr_metrics_t *reg, const char *host, uint16_t port,
                                    kvr_metrics_http_t **out, char *err, size_t err_len)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, NULL, &hints, &ai);
    if (gai != 0 || !ai) {
        snprintf(err, err_len, "metrics: host '%s' does not resolve to an IPv4 address (%s)", host,
                 gai_strerror(gai));
        return KVR_ERR_INVALID;
    }
    sa.sin_addr = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
    freeaddrinfo(ai);

    kvr_metrics_http_t *srv = calloc(1, sizeof *srv);
    if (!srv)
        return KVR_ERR_NO_MEMORY;
    srv->reg = reg;
    pthread_mutex_init(&srv->mu, NULL);
    snprintf(srv->why, sizeof srv->why, "starting");
    srv->d = MHD_start_daemon(MHD_USE_POLL_INTERNAL_THREAD, port, NULL, NULL, handle, srv,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)KVR_METRICS_HTTP_MAX_CONN,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KVR_METRICS_HTTP_TIMEOUT,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384, MHD_OPTION_END);
    if (!srv->d) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(err, err_len,
                 "metrics: cannot serve HTTP on %s:%u (%s); is metrics_port taken by another "
                 "process? pick a free one in the cluster file",
                 ip, (unsigned)port, host);
        pthread_mutex_destroy(&srv->mu);
        free(srv);
        return KVR_ERR_IO;
    }
    KVR_LOG_INFO(COMP, "serving /metrics /health /ready on http://%s:%u", host, (unsigned)port);
    *out = srv;
    return KVR_OK;
}

void kvr_metrics_http_set_ready(kvr_metrics_http_t *srv, bool ready, const char *why)
{
    if (!srv)
        return;
    pthread_mutex_lock(&srv->mu);
    srv->ready = ready;
    snprintf(srv->why, sizeof srv->why, "%s", why ? why : (ready ? "ready" : "not ready"));
    pthread_mutex_unlock(&srv->mu);
}

void kvr_metrics_http_stop(kvr_metrics_http_t *srv)
{
    if (!srv)
        return;
    MHD_stop_daemon(srv->d);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}
