/*
 * ucx.c - the UCX (ucp) transfer backend.
 *
 * Data path: a prepared list is posted as one ucp_put_nbx/ucp_get_nbx per
 * coalesced segment, each with the list's token as user data: a put UCX
 * completes at once (NULL) counts at once, one it returns a request for
 * counts from its callback.  The list completes when every segment has
 * completed LOCALLY - for a WRITE, the source buffer may be reused; for a
 * READ, the data is here - exactly what ucx_perftest's put_bw counts.  No
 * flush per post (on TCP a flush is a round trip through the target).
 * Remote visibility comes from the endpoint flush that kvr_xfer_notify puts
 * before a notification and that kvr_xfer_flush issues (peer_idle) when
 * anything was put since the last one.  Nothing allocates on that path: the
 * token is made when the list is prepared, requests come from UCX's pools.
 *
 * Notifications are active messages (UCP_FEATURE_AM, id KVR_UCX_AM_NOTIF,
 * forced eager so the receiver gets them in one callback; with the pair's
 * token as header and a reply endpoint, behind a HELLO that is each new
 * endpoint's first message: a target with require_token admits an
 * endpoint by its HELLO and closes one without, ucx_hello.c).  If anything was
 * put on the peer since the last flush, the notification first waits for an
 * endpoint flush - whose completion means the earlier writes are visible at
 * the target - and is sent from the flush callback; notifications keep their
 * order on a per-peer queue.
 *
 * Failure detection.  A peer on another host (or a peer whose address says
 * it is not a local process) is reached with UCP_ERR_HANDLING_MODE_PEER and an
 * endpoint error callback; UCP keepalive is set to 1 s (unless
 * UCX_KEEPALIVE_INTERVAL is in the environment).  UCX 1.13's shared-memory
 * transports (posix, sysv) have no peer failure handler, so PEER mode would
 * silently exclude them; a peer in the same kernel and pid namespace is
 * therefore reached with UCP_ERR_HANDLING_MODE_NONE (shared memory + cma
 * allowed) and watched through a pidfd: its death is seen within
 * KVR_UCX_WATCH_MS.  KVR_UCX_ERR_MODE=peer|none overrides the choice.
 *
 * The transports actually selected are read back from ucp_ep_print_info()
 * (captured with open_memstream) into peer->transports and logged;
 * require_rdma refuses lanes over tcp, posix, sysv, cma, self, knem, xpmem.
 *
 * Memory from kvr_xfer_mem_alloc is shared memory on huge pages where the
 * host allows (UCX's, or a huge-page tmpfs file of the pool's own; the
 * choice is ucx_local.c's; the core pre-faults it, xfer_mem.c).  The mapped
 * path: when the peer is a watched process on this host (or this process)
 * and its region is mapped here (its pool file, or ucp_rkey_ptr; UCX's is
 * populated once at rkey unpack, KVR_UCX_POPULATE=0: don't), every list whose segments all
 * land in mapped regions is posted as memcpys on the posting thread - no
 * UCX request, no callback, complete when the post returns (a READ too).
 * A release fence after the copies orders them before anything the thread
 * sends later, so a notification (an active message through the peer's
 * shared-memory FIFO or a socket) still arrives after the data.  A peer
 * that died is seen by the pidfd watch checked at every post (at most
 * KVR_UCX_WATCH_MS old): the post then fails with KVR_ERR_PEER_FAILURE.
 * KVR_UCX_MAPPED=0 leaves every put to UCX.  The connection's transports
 * then read "... +mapped(memcpy)".
 */
#include "ucx_internal.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define COMP "ucx"

/* The one mapping of UCX status codes to kvrail's. */
static kvr_status_t ucx_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return KVR_OK;
    case UCS_INPROGRESS:
        return KVR_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
        return KVR_ERR_NO_MEMORY;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
        return KVR_ERR_INVALID;
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
        return KVR_ERR_NO_RESOURCE;
    case UCS_ERR_TIMED_OUT:
        return KVR_ERR_TIMEOUT;
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
        return KVR_ERR_PEER_FAILURE;
    case UCS_ERR_UNSUPPORTED:
        return KVR_ERR_UNSUPPORTED;
    case UCS_ERR_CANCELED:
        return KVR_ERR_CANCELED;
    case UCS_ERR_NO_ELEM:
    case UCS_ERR_NO_DEVICE:
        return KVR_ERR_NOT_FOUND;
    case UCS_ERR_BUSY:
        return KVR_ERR_BUSY;
    case UCS_ERR_OUT_OF_RANGE:
        return KVR_ERR_OUT_OF_RANGE;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_IO_ERROR:
    default:
        return KVR_ERR_IO;
    }
}

/* ------------------------------------------------------------------------ */
/* host identity                                                             */

static void read_boot_id(uint8_t out[16])
{
    char buf[64] = {0};
    memset(out, 0, 16);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    int k = 0;
    for (ssize_t i = 0; i < n && k < 32; i++) {
        char c = buf[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            continue;
        out[k / 2] = (uint8_t)(out[k / 2] | (k % 2 ? v : v << 4));
        k++;
    }
}

static uint64_t read_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* ------------------------------------------------------------------------ */
/* engine                                                                    */

static bool tl_is_rdma(const char *tl)
{
    static const char *const not_rdma[] = {
        "tcp",       "posix",    "sysv",   "cma",       "self",     "knem", "xpmem",
        "cuda_copy", "cuda_ipc", "sockcm", "rocm_copy", "rocm_ipc", NULL};
    for (size_t i = 0; not_rdma[i]; i++)
        if (strcmp(tl, not_rdma[i]) == 0)
            return false;
    return true;
}

/* resources of the context as "tl/dev ..."; *rdma_p: one of them is RDMA */
static void context_resources(ucp_context_h ctx, char *out, size_t cap, bool *rdma_p)
{
    char *text = NULL;
    size_t len = 0;
    *rdma_p = false;
    out[0] = '\0';
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return;
    ucp_context_print_info(ctx, f);
    fclose(f);
    size_t used = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, "resource") || !strstr(line, "--"))
            continue;
        char *res = strstr(line, "--") + 2;
        while (*res == ' ')
            res++;
        char tl[64];
        size_t n = strcspn(res, "/ ");
        snprintf(tl, sizeof(tl), "%.*s", (int)n, res);
        if (tl_is_rdma(tl))
            *rdma_p = true;
        int w = snprintf(out + used, cap - used, "%s%s", used ? " " : "", res);
        if (w > 0 && (size_t)w < cap - used)
            used += (size_t)w;
    }
    free(text);
}

static ucs_status_t am_notif_cb(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    struct ucx_engine *e = arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        KVR_LOG_ERROR(COMP, "%s: notification of %zu bytes arrived by rendezvous; dropped",
                      e->base.name, length);
        return UCS_OK;
    }
    /* require_token: only on an endpoint admitted by its HELLO, under its
     * token (ucx_hello.c) */
    const uint8_t *token = NULL;
    if (!ucx_inbound_notif(e, param, header, header_length, &token))
        return UCS_OK;
    kvr_xfer_deliver_notif(&e->base, data, length, token);
    return UCS_OK;
}

static kvr_status_t ucx_engine_init(kvr_xfer_engine_t *base)
{
    struct ucx_engine *e = ue(base);
    ucp_config_t *config;
    ucs_status_t st;
    kvr_status_t s = KVR_ERR_IO;

    e->efd = -1;
    read_boot_id(e->boot_id);
    e->pidns = read_pidns();

    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: ucp_config_read: %s", base->name, ucs_status_string(st));
        return ucx_status(st);
    }
    if (base->cfg.tls && (st = ucp_config_modify(config, "TLS", base->cfg.tls)) != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: tls '%s' refused by UCX: %s", base->name, base->cfg.tls,
                      ucs_status_string(st));
        s = KVR_ERR_INVALID;
        goto err_config;
    }
    if (base->cfg.devices &&
        (st = ucp_config_modify(config, "NET_DEVICES", base->cfg.devices)) != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: devices '%s' refused by UCX: %s", base->name, base->cfg.devices,
                      ucs_status_string(st));
        s = KVR_ERR_INVALID;
        goto err_config;
    }
    if (!getenv("UCX_KEEPALIVE_INTERVAL"))
        ucp_config_modify(config, "KEEPALIVE_INTERVAL", "1s");

    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = base->name,
    };
    st = ucp_init(&params, config, &e->ctx);
    ucp_config_release(config);
    config = NULL;
    if (st != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: ucp_init: %s", base->name, ucs_status_string(st));
        return ucx_status(st);
    }

    ucp_context_attr_t cattr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(e->ctx, &cattr) == UCS_OK)
        e->mem_types = cattr.memory_types;

    char res[512];
    bool rdma;
    context_resources(e->ctx, res, sizeof(res), &rdma);
    KVR_LOG_DEBUG(COMP, "%s: UCX resources: %s", base->name, res);
    if (base->cfg.require_rdma && !rdma) {
        KVR_LOG_ERROR(COMP,
                      "%s: require_rdma: UCX found no RDMA transport here (only: %s); "
                      "refusing to fall back to TCP or shared memory",
                      base->name, res[0] ? res : "nothing");
        s = KVR_ERR_NO_RDMA;
        goto err_cleanup;
    }

    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(e->ctx, &wp, &e->worker);
    if (st != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: ucp_worker_create: %s", base->name, ucs_status_string(st));
        s = ucx_status(st);
        goto err_cleanup;
    }
    st = ucp_worker_get_address(e->worker, &e->wa, &e->wa_len);
    if (st != UCS_OK) {
        s = ucx_status(st);
        goto err_worker;
    }
    ucp_am_handler_param_t ah = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = KVR_UCX_AM_NOTIF,
        .cb = am_notif_cb,
        .arg = e,
    };
    st = ucp_worker_set_am_recv_handler(e->worker, &ah);
    ah.id = KVR_UCX_AM_HELLO;
    ah.cb = ucx_am_hello_cb;
    if (st == UCS_OK)
        st = ucp_worker_set_am_recv_handler(e->worker, &ah);
    ah.id = KVR_UCX_AM_BYE;
    ah.cb = ucx_am_bye_cb;
    if (st == UCS_OK)
        st = ucp_worker_set_am_recv_handler(e->worker, &ah);
    if (st != UCS_OK) {
        s = ucx_status(st);
        goto err_address;
    }
    return KVR_OK;

err_address:
    ucp_worker_release_address(e->worker, e->wa);
err_worker:
    ucp_worker_destroy(e->worker);
err_cleanup:
    ucp_cleanup(e->ctx);
    return s;
err_config:
    ucp_config_release(config);
    return s;
}

static void ucx_engine_fini(kvr_xfer_engine_t *base)
{
    struct ucx_engine *e = ue(base);
    /* let orphaned requests finish (bounded), then tear down */
    for (int i = 0; i < 100 && ucp_worker_progress(e->worker); i++)
        ;
    ucp_worker_release_address(e->worker, e->wa);
    ucp_worker_destroy(e->worker);
    ucx_inbound_fini(e);
    while (e->orphan_errctx) { /* no callback runs after the worker */
        struct ucx_errctx *c = e->orphan_errctx;
        e->orphan_errctx = c->next;
        free(c);
    }
    ucp_cleanup(e->ctx);
    while (e->free_notifs) {
        struct ucx_notif *n = e->free_notifs;
        e->free_notifs = n->next;
        free(n);
    }
}

static kvr_status_t ucx_address(kvr_xfer_engine_t *base, void **buf_p, size_t *len_p)
{
    struct ucx_engine *e = ue(base);
    struct ucx_addr_hdr h = {
        .magic = KVR_UCX_ADDR_MAGIC,
        .pid = (uint32_t)getpid(),
        .pidns = e->pidns,
        .wa_len = (uint32_t)e->wa_len,
    };
    memcpy(h.boot_id, e->boot_id, sizeof(h.boot_id));
    uint8_t *b = malloc(sizeof(h) + e->wa_len);
    if (!b)
        return KVR_ERR_NO_MEMORY;
    memcpy(b, &h, sizeof(h));
    memcpy(b + sizeof(h), e->wa, e->wa_len);
    *buf_p = b;
    *len_p = sizeof(h) + e->wa_len;
    return KVR_OK;
}

static kvr_status_t ucx_event_fd(kvr_xfer_engine_t *base, int *fd_p)
{
    struct ucx_engine *e = ue(base);
    if (e->efd < 0) {
        ucs_status_t st = ucp_worker_get_efd(e->worker, &e->efd);
        if (st != UCS_OK)
            return ucx_status(st);
    }
    e->armed = true;
    *fd_p = e->efd;
    return KVR_OK;
}

/* ------------------------------------------------------------------------ */
/* memory                                                                    */

kvr_status_t ucx_mem_reg(kvr_xfer_mem_t *base)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    struct ucx_engine *e = ue(base->engine);
    ucs_memory_type_t mt = base->kind == KVR_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    if (!(e->mem_types & UCS_BIT(mt))) {
        KVR_LOG_ERROR(COMP, "%s: mem_reg: this UCX build does not support %s memory",
                      base->engine->name, ucs_memory_type_names[mt]);
        return KVR_ERR_UNSUPPORTED;
    }
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = base->addr,
        .length = base->len,
        .memory_type = mt,
    };
    ucs_status_t st = ucp_mem_map(e->ctx, &mp, &m->memh);
    if (st != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: ucp_mem_map(%p, %zu): %s", base->engine->name, base->addr,
                      base->len, ucs_status_string(st));
        return ucx_status(st);
    }
    return KVR_OK;
}

/* UCX shared memory (ucp_mem_map ALLOCATE); ucx_local_mem_alloc decides */
kvr_status_t ucx_mem_alloc_shm(kvr_xfer_mem_t *base)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    struct ucx_engine *e = ue(base->engine);
    if (base->kind != KVR_MEM_HOST)
        return KVR_ERR_UNSUPPORTED;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL,
        .length = base->len,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    ucs_status_t st = ucp_mem_map(e->ctx, &mp, &m->memh);
    if (st != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: ucp_mem_map(allocate %zu): %s", base->engine->name, base->len,
                      ucs_status_string(st));
        return ucx_status(st);
    }
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    st = ucp_mem_query(m->memh, &attr);
    if (st != UCS_OK || attr.length < base->len) {
        ucp_mem_unmap(e->ctx, m->memh);
        return st != UCS_OK ? ucx_status(st) : KVR_ERR_IO;
    }
    base->addr = attr.address;
    return KVR_OK;
}

static void ucx_mem_dereg(kvr_xfer_mem_t *base)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    ucp_mem_unmap(ue(base->engine)->ctx, m->memh);
    ucx_local_mem_free(base);
}

static kvr_status_t ucx_mem_pack(kvr_xfer_mem_t *base, void **buf_p, size_t *len_p)
{
    struct ucx_mem *m = container_of(base, struct ucx_mem, base);
    void *rk;
    size_t len;
    ucs_status_t st = ucp_rkey_pack(ue(base->engine)->ctx, m->memh, &rk, &len);
    if (st != UCS_OK)
        return ucx_status(st);
    struct ucx_rkey_hdr h = {.magic = KVR_UCX_RKEY_MAGIC, .rkey_len = (uint32_t)len, .fd = -1};
    if (m->file) {
        h.flags = KVR_UCX_RKEY_FILE;
        h.fd = m->fd;
        h.ino = m->ino;
        h.dev = m->dev;
        h.file_len = m->map_len;
    }
    uint8_t *b = malloc(sizeof(h) + len);
    if (b) {
        memcpy(b, &h, sizeof(h));
        memcpy(b + sizeof(h), rk, len);
    }
    ucp_rkey_buffer_release(rk);
    if (!b)
        return KVR_ERR_NO_MEMORY;
    *buf_p = b;
    *len_p = sizeof(h) + len;
    return KVR_OK;
}

/* ------------------------------------------------------------------------ */
/* peers                                                                     */

static void peer_failed(struct ucx_peer *p, kvr_status_t s, const char *why);
static int watch_peers(struct ucx_engine *e);

static kvr_status_t notif_queue(struct ucx_peer *p, unsigned am_id, const void *msg, size_t len);
static void ucx_disconnect(kvr_xfer_peer_t *base);

/* The endpoint's error callback goes through p->errctx, which outlives
 * the peer: UCX 1.13 may report the failure of an endpoint after
 * kvr_xfer_disconnect closed it (its close left to UCX, or even done: a
 * closed endpoint's remote dying later was seen to call it, with the freed
 * peer as its argument, in xfer_conformance_ucx_posix).  A released
 * context reports to nobody; contexts are freed with the engine (16 bytes
 * per connection made). */
static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)ep;
    struct ucx_errctx *c = arg;
    if (c->p)
        peer_failed(c->p, KVR_ERR_PEER_FAILURE, ucs_status_string(st));
}

static void errctx_release(struct ucx_engine *e, struct ucx_errctx *c)
{
    c->p = NULL;
    c->next = e->orphan_errctx;
    e->orphan_errctx = c;
}

/* lanes of an endpoint, "tl/dev(use,use) ..."; *rdma_p: every lane is RDMA */
static void ep_transports(ucp_ep_h ep, char *out, size_t cap, bool *all_rdma_p)
{
    char *text = NULL;
    size_t len = 0;
    size_t used = 0;
    *all_rdma_p = true;
    out[0] = '\0';
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return;
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *l = strstr(line, "lane[");
        if (!l || !(l = strchr(l, ':')))
            continue;
        l++;
        while (*l == ' ')
            l++;
        char *colon = strchr(l, ':'); /* "1:tcp/lo.0 md[1] -> ... am am_bw#0" */
        if (colon && colon < strchr(l, ' '))
            l = colon + 1;
        char res[96], tl[64], uses[128] = "";
        size_t n = strcspn(l, " ");
        snprintf(res, sizeof(res), "%.*s", (int)n, l);
        char *dot = strrchr(res, '.');
        if (dot && dot > strchr(res, '/'))
            *dot = '\0'; /* drop the ".0" path index */
        snprintf(tl, sizeof(tl), "%.*s", (int)strcspn(res, "/"), res);
        if (!tl_is_rdma(tl))
            *all_rdma_p = false;
        char *arrow = strstr(l, "->");
        if (arrow) {
            char *u = strchr(arrow + 3, ' '); /* skip "md[1]/tcp/sysdev[255]" */
            size_t k = 0;
            while (u && *u) {
                while (*u == ' ')
                    u++;
                size_t w = strcspn(u, " #");
                if (w == 0)
                    break;
                int r = snprintf(uses + k, sizeof(uses) - k, "%s%.*s", k ? "," : "", (int)w, u);
                if (r > 0 && (size_t)r < sizeof(uses) - k)
                    k += (size_t)r;
                u += w;
                u += strcspn(u, " ");
            }
        }
        int r = snprintf(out + used, cap - used, "%s%s(%s)", used ? " " : "", res, uses);
        if (r > 0 && (size_t)r < cap - used)
            used += (size_t)r;
    }
    free(text);
}

static void close_ep(struct ucx_engine *e, ucp_ep_h ep, bool force, int wait_ms)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    void *req = ucp_ep_close_nbx(ep, &prm);
    if (!UCS_PTR_IS_PTR(req))
        return;
    uint64_t deadline = kvr_deadline_ns(wait_ms);
    while (ucp_request_check_status(req) == UCS_INPROGRESS && kvr_now_ns() < deadline)
        ucp_worker_progress(e->worker);
    if (ucp_request_check_status(req) == UCS_INPROGRESS && wait_ms)
        KVR_LOG_WARN(COMP, "%s: endpoint close still in progress after %d ms; left to UCX",
                     e->base.name, CLOSE_WAIT_MS);
    ucp_request_free(req);
}

static kvr_status_t ucx_connect(kvr_xfer_peer_t *base, const void *addr, size_t len)
{
    struct ucx_peer *p = up(base);
    struct ucx_engine *e = ue(base->engine);
    struct ucx_addr_hdr h;
    if (len < sizeof(h)) {
        KVR_LOG_ERROR(COMP, "%s: connect: UCX address of %zu bytes is too short", e->base.name,
                      len);
        return KVR_ERR_INVALID;
    }
    memcpy(&h, addr, sizeof(h));
    if (h.magic != KVR_UCX_ADDR_MAGIC || h.wa_len != len - sizeof(h) || h.wa_len == 0) {
        KVR_LOG_ERROR(COMP, "%s: connect: malformed UCX address", e->base.name);
        return KVR_ERR_INVALID;
    }
    p->pidfd = -1;
    p->pid = (pid_t)h.pid;
    p->fl = calloc(1, sizeof(*p->fl));
    if (!p->fl)
        return KVR_ERR_NO_MEMORY;
    p->fl->p = p;

    bool local = memcmp(h.boot_id, e->boot_id, 16) == 0 && h.pidns == e->pidns && e->pidns;
    bool mode_peer = !local;
    const char *env = getenv("KVR_UCX_ERR_MODE");
    if (env && strcmp(env, "peer") == 0)
        mode_peer = true;
    else if (env && strcmp(env, "none") == 0)
        mode_peer = false;
    if (!mode_peer && local && p->pid != getpid()) {
        p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
        if (p->pidfd < 0 && errno == ESRCH) {
            KVR_LOG_ERROR(COMP, "%s: connect: peer process %d is not running", e->base.name,
                          (int)p->pid);
            free(p->fl);
            return KVR_ERR_PEER_FAILURE;
        }
        if (p->pidfd < 0)
            mode_peer = true; /* no way to watch it: let UCX do it */
    }

    /* UCX reads the address without its length and asserts on a bad one:
     * parsed first in a child, then given to UCX padded (ucx_check.c) */
    uint8_t *wa = ucx_check_pad((const uint8_t *)addr + sizeof(h), h.wa_len);
    const char *why = "";
    kvr_status_t cs = wa ? ucx_check_address(e, wa, &p->shm, &why) : KVR_ERR_NO_MEMORY;
    p->same_host = local;
    if (cs != KVR_OK) {
        KVR_LOG_ERROR(COMP,
                      "%s: connect to pid %d: its UCX worker address (%u bytes) is not one this "
                      "UCX can use: %s; the peer sent a damaged or foreign address",
                      e->base.name, (int)p->pid, h.wa_len, wa ? why : "out of memory");
        free(wa);
        if (p->pidfd >= 0)
            close(p->pidfd);
        free(p->fl);
        return cs;
    }
    p->errctx = calloc(1, sizeof(*p->errctx));
    if (!p->errctx) {
        free(wa);
        if (p->pidfd >= 0)
            close(p->pidfd);
        free(p->fl);
        return KVR_ERR_NO_MEMORY;
    }
    p->errctx->p = p;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)wa,
        .err_mode = mode_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = ep_err_cb, .arg = p->errctx},
    };
    ucs_status_t st = ucp_ep_create(e->worker, &ep, &p->ep);
    free(wa);
    if (st != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: connect to pid %d: ucp_ep_create: %s%s", e->base.name, (int)p->pid,
                      ucs_status_string(st),
                      st == UCS_ERR_UNREACHABLE && mode_peer
                          ? " (UCX 1.13 shared memory has no peer failure handler; use tcp)"
                          : "");
        if (p->pidfd >= 0)
            close(p->pidfd);
        free(p->fl);
        free(p->errctx);
        return ucx_status(st);
    }
    p->mode_peer = mode_peer;
    p->local_ok = local && !mode_peer && (p->pidfd >= 0 || p->pid == getpid());

    bool all_rdma;
    ep_transports(p->ep, base->transports, sizeof(base->transports), &all_rdma);
    if (!base->transports[0])
        snprintf(base->transports, sizeof(base->transports), "unknown");
    if (base->engine->cfg.require_rdma && !all_rdma) {
        KVR_LOG_ERROR(COMP,
                      "%s: require_rdma: the connection to pid %d would use %s - not RDMA; "
                      "refusing the TCP/shared-memory fall-back",
                      e->base.name, (int)p->pid, base->transports);
        close_ep(e, p->ep, true, CLOSE_WAIT_MS);
        errctx_release(e, p->errctx);
        if (p->pidfd >= 0)
            close(p->pidfd);
        free(p->fl);
        return KVR_ERR_NO_RDMA;
    }
    if (p->pidfd >= 0)
        e->nwatch++;
    /* the endpoint's first message: the HELLO with the pair's token, which
     * a target with require_token wants before anything (ucx_hello.c);
     * KVR_UCX_HELLO=0 leaves it out (tests: a peer that skips it) */
    const char *he = getenv("KVR_UCX_HELLO");
    kvr_status_t hs =
        he && strcmp(he, "0") == 0 ? KVR_OK : notif_queue(p, KVR_UCX_AM_HELLO, NULL, 0);
    if (hs != KVR_OK) {
        KVR_LOG_ERROR(COMP, "%s: connect to pid %d: HELLO not sent: %s", e->base.name, (int)p->pid,
                      kvr_status_str(hs));
        ucx_disconnect(base);
        return hs;
    }
    KVR_LOG_INFO(COMP, "%s: connected to pid %d%s over %s (failure detection: %s)", e->base.name,
                 (int)p->pid, local ? " (this host)" : "", base->transports,
                 mode_peer       ? "UCX peer errors + keepalive"
                 : p->pidfd >= 0 ? "pidfd watch"
                                 : "none (same process)");
    return KVR_OK;
}

static void notif_put(struct ucx_engine *e, struct ucx_notif *n)
{
    n->peer = NULL;
    n->req = NULL;
    n->next = e->free_notifs;
    e->free_notifs = n;
}

static void ucx_disconnect(kvr_xfer_peer_t *base)
{
    struct ucx_peer *p = up(base);
    struct ucx_engine *e = ue(base->engine);
    /* a peer that said BYE closed its end itself: ours is closed without
     * force and not waited for (UCX 1.13, shared memory: a forced close
     * there left a wireup message pending that another worker's destroy
     * then asserted on) */
    bool force = base->status != KVR_OK && !p->said_bye;
    if (!force && base->inflight) { /* deliver what was queued, briefly */
        uint64_t deadline = kvr_deadline_ns(CLOSE_FLUSH_MS);
        while (base->inflight && base->status == KVR_OK && kvr_now_ns() < deadline)
            ucp_worker_progress(e->worker);
        force = base->inflight != 0 || base->status != KVR_OK;
    }
    if (!force && !p->mode_peer && p->pidfd >= 0) {
        struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};
        force = poll(&pf, 1, 0) > 0; /* died meanwhile */
    }
    while (p->nq) { /* orphan what UCX still holds; its callback frees it */
        struct ucx_notif *n = p->nq;
        p->nq = n->next;
        if (n->req)
            n->peer = NULL;
        else
            notif_put(e, n);
    }
    if (p->fl->pending)
        p->fl->p = NULL; /* orphaned: its callback frees it */
    else
        free(p->fl);
    close_ep(e, p->ep, force, p->said_bye ? 0 : CLOSE_WAIT_MS);
    errctx_release(e, p->errctx);
    if (p->pidfd >= 0) {
        close(p->pidfd);
        e->nwatch--;
    }
}

static kvr_status_t ucx_rmem_unpack(kvr_xfer_rmem_t *base, const void *buf, size_t len)
{
    struct ucx_rmem *r = container_of(base, struct ucx_rmem, base);
    struct ucx_peer *p = up(base->peer);
    struct ucx_rkey_hdr h;
    if (len <= sizeof(h))
        return KVR_ERR_INVALID;
    memcpy(&h, buf, sizeof(h));
    if (h.magic != KVR_UCX_RKEY_MAGIC || h.rkey_len != len - sizeof(h) ||
        (h.flags & ~KVR_UCX_RKEY_FILE) != 0) {
        KVR_LOG_ERROR(COMP, "%s: rkey of pid %d: not a kvrail UCX rkey (magic, length or flags)",
                      base->peer->engine->name, (int)p->pid);
        return KVR_ERR_CORRUPT;
    }
    /* its structure checked, then given to UCX padded (ucx_check.c) */
    uint8_t *rk = ucx_check_pad((const uint8_t *)buf + sizeof(h), h.rkey_len);
    const char *why = "";
    kvr_status_t cs = rk ? ucx_check_rkey(rk, h.rkey_len, &why) : KVR_ERR_NO_MEMORY;
    if (cs != KVR_OK) {
        KVR_LOG_ERROR(COMP,
                      "%s: rkey of pid %d (%u bytes) is not one this UCX can use: %s; the peer "
                      "sent a damaged or foreign rkey",
                      base->peer->engine->name, (int)p->pid, h.rkey_len,
                      rk ? why : "out of memory");
        free(rk);
        return cs;
    }
    /* a shared-memory key names a segment that UCX maps while unpacking (and
     * UCX 1.13 crashed when it could not): it must be the peer's and there.
     * (A peer on another host: UCX finds its shared memory unreachable and
     * skips those keys.) */
    char swhy[256];
    cs = p->same_host ? ucx_check_rkey_shm(p, rk, h.rkey_len, base->len, swhy, sizeof(swhy))
                      : KVR_OK;
    if (cs != KVR_OK) {
        KVR_LOG_ERROR(COMP,
                      "%s: rkey of pid %d refused before UCX maps it: %s; the peer sent a "
                      "damaged or forged rkey (%s)",
                      base->peer->engine->name, (int)p->pid, swhy, kvr_status_name(cs));
        free(rk);
        return cs;
    }
    ucs_status_t st = ucp_ep_rkey_unpack(p->ep, rk, &r->rkey);
    free(rk);
    if (st != UCS_OK) {
        KVR_LOG_ERROR(COMP, "%s: ucp_ep_rkey_unpack: %s", base->peer->engine->name,
                      ucs_status_string(st));
        return st == UCS_ERR_INVALID_PARAM ? KVR_ERR_CORRUPT : ucx_status(st);
    }
    /* a peer on this host: its region mapped here, or process_vm_writev */
    ucx_local_rmem_unpack(p, r, &h);
    return KVR_OK;
}

static void ucx_rmem_release(kvr_xfer_rmem_t *base)
{
    struct ucx_rmem *r = container_of(base, struct ucx_rmem, base);
    ucp_rkey_destroy(r->rkey);
    ucx_local_rmem_release(r);
}

/* ------------------------------------------------------------------------ */
/* data path                                                                 */

static kvr_status_t ucx_dlist_prepare(kvr_xfer_dlist_t *base)
{
    struct ucx_dlist *d = container_of(base, struct ucx_dlist, base);
    d->tok = calloc(1, sizeof(*d->tok));
    if (!d->tok)
        return KVR_ERR_NO_MEMORY;
    d->tok->d = d;
    kvr_status_t s = ucx_local_dlist_prepare(d);
    if (s != KVR_OK)
        free(d->tok);
    return s;
}

static void ucx_dlist_release(kvr_xfer_dlist_t *base)
{
    struct ucx_dlist *d = container_of(base, struct ucx_dlist, base);
    ucx_local_dlist_release(d);
    if (d->tok->pending) { /* operations pending: the last callback frees the token */
        d->tok->d = NULL;
        if (base->inflight)
            base->peer->inflight--;
    } else {
        free(d->tok);
    }
}

/* one operation of a post is done; the last one completes the list */
static void tok_done(struct ucx_tok *t, ucs_status_t st)
{
    if (st != UCS_OK && t->err == KVR_OK)
        t->err = ucx_status(st);
    if (--t->pending > 0)
        return;
    if (!t->d) {
        free(t);
        return;
    }
    kvr_xfer_dlist_t *d = &t->d->base;
    kvr_status_t s = t->err == KVR_OK            ? KVR_OK
                     : d->peer->status != KVR_OK ? d->peer->status
                                                 : t->err;
    t->err = KVR_OK;
    d->peer->inflight--;
    kvr_xfer_dlist_complete(d, s);
}

static void op_cb(void *req, ucs_status_t st, void *user_data)
{
    ucp_request_free(req);
    tok_done(user_data, st);
}

/* gives a list a fresh token, leaving the old one to its pending callbacks */
static void tok_orphan(struct ucx_dlist *d)
{
    struct ucx_tok *fresh = calloc(1, sizeof(*fresh));
    if (!fresh)
        return; /* the old token stays attached; its callbacks complete nothing new */
    d->tok->d = NULL;
    fresh->d = d;
    d->tok = fresh;
}

static kvr_status_t ucx_post(kvr_xfer_dlist_t *base)
{
    struct ucx_dlist *d = container_of(base, struct ucx_dlist, base);
    struct ucx_peer *p = up(base->peer);
    struct ucx_engine *e = ue(p->base.engine);
    struct ucx_tok *t = d->tok;
    ucp_ep_h ep = p->ep;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH};
    const struct kvr_xfer_seg *g = base->segs;
    const struct kvr_xfer_seg *end = g + base->nseg;
    ucs_status_ptr_t r;

    if (e->nwatch && p->pidfd >= 0) {
        /* shared-memory puts may complete inline, so that progress never runs */
        watch_peers(e);
        if (p->base.status != KVR_OK)
            return p->base.status;
    }
    if (d->path != UCX_PATH_UCP)
        return ucx_local_post(d);
    t->pending = 1; /* held until everything is issued */
    t->err = KVR_OK;
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = op_cb;
    prm.user_data = t;
    for (; g < end; g++) {
        prm.memh = container_of(g->lmem, struct ucx_mem, base)->memh;
        ucp_rkey_h rkey = container_of(g->rmem, struct ucx_rmem, base)->rkey;
        r = base->op == KVR_XFER_WRITE ? ucp_put_nbx(ep, g->laddr, g->len, g->raddr, rkey, &prm)
                                       : ucp_get_nbx(ep, g->laddr, g->len, g->raddr, rkey, &prm);
        if (UCS_PTR_IS_PTR(r))
            t->pending++; /* its callback (local completion) counts it down */
        else if (r != NULL)
            goto err;
    }
    if (base->op == KVR_XFER_WRITE)
        p->unflushed = true; /* notify / kvr_xfer_flush flush the endpoint first */
    if (--t->pending == 0)
        return t->err; /* every segment completed inline (shared memory: memcpy) */
    p->base.inflight++;
    return KVR_INPROGRESS;

err:
    if (--t->pending > 0)
        tok_orphan(d); /* issued operations finish on their own */
    if (p->base.status != KVR_OK)
        return p->base.status;
    KVR_LOG_ERROR(COMP, "%s: post: %s", p->base.engine->name, ucs_status_string(UCS_PTR_STATUS(r)));
    return ucx_status(UCS_PTR_STATUS(r));
}

/* completes every list in flight on a peer that failed without UCX noticing */
void ucx_peer_failed(struct ucx_peer *p, kvr_status_t s, const char *why)
{
    peer_failed(p, s, why);
}

static void peer_failed(struct ucx_peer *p, kvr_status_t s, const char *why)
{
    kvr_xfer_peer_fail(&p->base, s, why);
    if (p->mode_peer)
        return; /* UCX purges the requests itself, with errors */
    for (struct kvr_xfer_link *l = p->base.dlists.next; l != &p->base.dlists; l = l->next) {
        kvr_xfer_dlist_t *b = container_of(l, kvr_xfer_dlist_t, link);
        struct ucx_dlist *d = container_of(b, struct ucx_dlist, base);
        if (!b->inflight || !d->tok->pending)
            continue;
        tok_orphan(d); /* the force close completes the old token's requests */
        p->base.inflight--;
        kvr_xfer_dlist_complete(b, s);
    }
}

static void notif_send(struct ucx_peer *p, struct ucx_notif *n);

/* sends the ready notifications at the head of the queue, in order */
static void notif_pump(struct ucx_peer *p)
{
    struct ucx_notif *next;
    for (struct ucx_notif *n = p->nq; n; n = next) {
        next = n->next; /* notif_send may complete n inline and recycle it */
        if (n->state == N_SENDING)
            continue;
        if (n->state != N_READY)
            break;
        notif_send(p, n);
    }
}

static void notif_unlink(struct ucx_peer *p, struct ucx_notif *n)
{
    for (struct ucx_notif **pp = &p->nq; *pp; pp = &(*pp)->next)
        if (*pp == n) {
            *pp = n->next;
            return;
        }
}

static void am_sent_cb(void *req, ucs_status_t st, void *user_data)
{
    struct ucx_notif *n = user_data;
    ucp_request_free(req);
    n->req = NULL;
    struct ucx_peer *p = n->peer;
    if (p) {
        notif_unlink(p, n);
        p->base.inflight--;
        if (st != UCS_OK)
            peer_failed(p, p->mode_peer ? KVR_ERR_PEER_FAILURE : ucx_status(st),
                        "notification not delivered");
    }
    notif_put(n->eng, n);
}

static void notif_send(struct ucx_peer *p, struct ucx_notif *n)
{
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = am_sent_cb,
        .user_data = n,
        /* REPLY: the target learns its endpoint of this connection, which
         * the HELLO admitted (ucx_hello.c) */
        .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
    };
    n->state = N_SENDING;
    /* the header is the pair's token (xfer_token.c), copied: the send may
     * outlive the peer */
    memcpy(n->token, p->base.token, sizeof(n->token));
    ucs_status_ptr_t r =
        ucp_am_send_nbx(p->ep, n->am_id, n->token, sizeof(n->token), n->msg, n->len, &prm);
    if (UCS_PTR_IS_PTR(r)) {
        n->req = r;
        return;
    }
    notif_unlink(p, n);
    p->base.inflight--;
    if (r != NULL)
        peer_failed(p, ucx_status(UCS_PTR_STATUS(r)), "notification send failed");
    notif_put(n->eng, n);
}

static void notif_flush_cb(void *req, ucs_status_t st, void *user_data)
{
    struct ucx_notif *n = user_data;
    ucp_request_free(req);
    n->req = NULL;
    struct ucx_peer *p = n->peer;
    if (!p) {
        notif_put(n->eng, n);
        return;
    }
    if (st != UCS_OK) {
        notif_unlink(p, n);
        p->base.inflight--;
        notif_put(n->eng, n);
        peer_failed(p, KVR_ERR_PEER_FAILURE, "flush before a notification failed");
        return;
    }
    n->state = N_READY;
    notif_pump(p);
}

static kvr_status_t ucx_notify(kvr_xfer_peer_t *base, const void *msg, size_t len)
{
    return notif_queue(up(base), KVR_UCX_AM_NOTIF, msg, len);
}

/* queues an active message behind the peer's others (and behind a flush of
 * the writes before it) */
static kvr_status_t notif_queue(struct ucx_peer *p, unsigned am_id, const void *msg, size_t len)
{
    kvr_xfer_peer_t *base = &p->base;
    struct ucx_engine *e = ue(base->engine);
    struct ucx_notif *n = e->free_notifs;
    if (n)
        e->free_notifs = n->next;
    else if (!(n = malloc(sizeof(*n))))
        return KVR_ERR_NO_MEMORY;
    n->next = NULL;
    n->peer = p;
    n->eng = e;
    n->req = NULL;
    n->am_id = am_id;
    n->len = (uint32_t)len;
    if (len)
        memcpy(n->msg, msg, len);
    struct ucx_notif **tail = &p->nq;
    while (*tail)
        tail = &(*tail)->next;
    *tail = n;
    base->inflight++;

    if (!p->unflushed) {
        n->state = N_READY;
        notif_pump(p);
        return base->status;
    }
    n->state = N_WAIT_FLUSH;
    p->unflushed = false;
    ucp_request_param_t fp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = notif_flush_cb,
        .user_data = n,
    };
    ucs_status_ptr_t r = ucp_ep_flush_nbx(p->ep, &fp);
    if (UCS_PTR_IS_PTR(r)) {
        n->req = r;
        return KVR_OK;
    }
    if (r == NULL) {
        n->state = N_READY;
        notif_pump(p);
        return base->status;
    }
    notif_unlink(p, n);
    base->inflight--;
    notif_put(e, n);
    peer_failed(p, ucx_status(UCS_PTR_STATUS(r)), "flush before a notification failed");
    return base->status;
}

static void pflush_cb(void *req, ucs_status_t st, void *user_data)
{
    struct ucx_pflush *fl = user_data;
    ucp_request_free(req);
    fl->pending = false;
    struct ucx_peer *p = fl->p;
    if (!p) {
        free(fl);
        return;
    }
    p->base.inflight--;
    if (st != UCS_OK)
        peer_failed(p, KVR_ERR_PEER_FAILURE, "endpoint flush failed");
}

/* kvr_xfer_flush's test: lists complete on local completion, so when
 * something was put since the last endpoint flush, one is issued here and
 * the peer is idle only once it completed (the writes are visible then). */
static bool ucx_peer_idle(kvr_xfer_peer_t *base)
{
    struct ucx_peer *p = up(base);
    if (base->status != KVR_OK)
        return true;
    if (p->unflushed && !p->fl->pending) {
        ucp_request_param_t fp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = pflush_cb,
            .user_data = p->fl,
        };
        p->unflushed = false;
        ucs_status_ptr_t r = ucp_ep_flush_nbx(p->ep, &fp);
        if (UCS_PTR_IS_PTR(r)) {
            p->fl->pending = true;
            base->inflight++;
        } else if (r != NULL) {
            peer_failed(p, ucx_status(UCS_PTR_STATUS(r)), "endpoint flush failed");
            return true;
        }
    }
    return base->inflight == 0;
}

/* polls the pidfds of watched local peers, at most every KVR_UCX_WATCH_MS */
static int watch_peers(struct ucx_engine *e)
{
    int n = 0;
    struct timespec ts; /* the coarse clock (~5 ns, 1-4 ms steps): a 10 ms period */
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (now < e->next_watch_ns)
        return 0;
    e->next_watch_ns = now + KVR_UCX_WATCH_MS * 1000000ull;
    for (struct kvr_xfer_link *l = e->base.peers.next; l != &e->base.peers; l = l->next) {
        struct ucx_peer *p = up(container_of(l, kvr_xfer_peer_t, link));
        if (p->pidfd < 0 || p->base.status != KVR_OK)
            continue;
        struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};
        if (poll(&pf, 1, 0) > 0) {
            char why[64];
            snprintf(why, sizeof(why), "process %d exited", (int)p->pid);
            peer_failed(p, KVR_ERR_PEER_FAILURE, why);
            n++;
        }
    }
    return n;
}

static int ucx_progress(kvr_xfer_engine_t *base)
{
    struct ucx_engine *e = ue(base);
    int n = (int)ucp_worker_progress(e->worker);
    if (e->n_in)
        n += ucx_inbound_progress(e); /* closes the endpoints refused in there */
    if (e->nwatch)
        n += watch_peers(e);
    if (n == 0 && e->armed && ucp_worker_arm(e->worker) == UCS_ERR_BUSY)
        n = 1;
    return n;
}

const struct kvr_xfer_ops kvr_xfer_ucx_ops = {
    .name = "ucx",
    .id = 2,
    .engine_size = sizeof(struct ucx_engine),
    .mem_size = sizeof(struct ucx_mem),
    .peer_size = sizeof(struct ucx_peer),
    .rmem_size = sizeof(struct ucx_rmem),
    .dlist_size = sizeof(struct ucx_dlist),
    .engine_init = ucx_engine_init,
    .engine_fini = ucx_engine_fini,
    .address = ucx_address,
    .mem_reg = ucx_mem_reg,
    .mem_dereg = ucx_mem_dereg,
    .mem_pack = ucx_mem_pack,
    .connect = ucx_connect,
    .disconnect = ucx_disconnect,
    .rmem_unpack = ucx_rmem_unpack,
    .rmem_release = ucx_rmem_release,
    .dlist_prepare = ucx_dlist_prepare,
    .dlist_release = ucx_dlist_release,
    .post = ucx_post,
    .notify = ucx_notify,
    .peer_idle = ucx_peer_idle,
    .progress = ucx_progress,
    .token_revoked = ucx_token_revoked,
    .event_fd = ucx_event_fd,
    .mem_alloc = ucx_local_mem_alloc,
};
