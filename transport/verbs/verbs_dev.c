/*
 * verbs_dev.c - the device side of the verbs backend (see verbs.c for the
 * design): the one mapping of ibv_wc_status / errno to kvr_status_t; device
 * choice (by name, else the NIC nearest this thread's NUMA node, then the
 * fastest port); GID choice (RoCE v2 with an IPv4-mapped address first);
 * QP creation and the INIT -> RTR -> RTS transitions; the check that two
 * ends can talk (link layer, GID type and family, IB subnet); and the
 * non-blocking TCP helpers of the connection side channel.
 */
#include "verbs_internal.h"

/* ------------------------------------------------------------------------ */
/* the one status mapping                                                    */

/* wc >= 0: an ibv_wc_status; otherwise err is an errno. */
kvr_status_t kvr_verbs_status(int wc, int err)
{
    if (wc >= 0) {
        switch ((enum ibv_wc_status)wc) {
        case IBV_WC_SUCCESS:
            return KVR_OK;
        case IBV_WC_REM_ACCESS_ERR:
            return KVR_ERR_NOT_FOUND; /* rkey unknown at the peer, or range outside it */
        case IBV_WC_LOC_PROT_ERR:
        case IBV_WC_LOC_LEN_ERR:
        case IBV_WC_REM_INV_REQ_ERR:
        case IBV_WC_MW_BIND_ERR:
            return KVR_ERR_INVALID;
        case IBV_WC_WR_FLUSH_ERR:
        case IBV_WC_RETRY_EXC_ERR:
        case IBV_WC_RNR_RETRY_EXC_ERR:
        case IBV_WC_REM_ABORT_ERR:
        case IBV_WC_RESP_TIMEOUT_ERR:
            return KVR_ERR_PEER_FAILURE;
        default:
            return KVR_ERR_IO;
        }
    }
    switch (err) {
    case 0:
        return KVR_OK;
    case ENOMEM:
        return KVR_ERR_NO_MEMORY;
    case EAGAIN:
        return KVR_ERR_NO_RESOURCE;
    case EINVAL:
        return KVR_ERR_INVALID;
    case ENODEV:
    case ENOENT:
        return KVR_ERR_NOT_FOUND;
    case ETIMEDOUT:
        return KVR_ERR_TIMEOUT;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
        return KVR_ERR_PEER_FAILURE;
    default:
        return KVR_ERR_IO;
    }
}

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */

const char *kvr_verbs_mtu_str(enum ibv_mtu m)
{
    switch (m) {
    case IBV_MTU_256:
        return "256";
    case IBV_MTU_512:
        return "512";
    case IBV_MTU_1024:
        return "1024";
    case IBV_MTU_2048:
        return "2048";
    case IBV_MTU_4096:
        return "4096";
    }
    return "?";
}

const char *kvr_verbs_gid_type_str(uint32_t t)
{
    return t == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : t == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1" : "IB";
}

bool kvr_verbs_gid_v4(const uint8_t *g)
{
    static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g, pre, 12) == 0;
}

void kvr_verbs_gid_str(const uint8_t *g, char *buf, size_t cap)
{
    if (kvr_verbs_gid_v4(g))
        snprintf(buf, cap, "::ffff:%u.%u.%u.%u", g[12], g[13], g[14], g[15]);
    else if (!inet_ntop(AF_INET6, g, buf, (socklen_t)cap))
        snprintf(buf, cap, "?");
}

static bool vb_gid_zero(const union ibv_gid *g)
{
    return g->global.subnet_prefix == 0 && g->global.interface_id == 0;
}

static uint32_t vb_speed_mbps(uint8_t speed, uint8_t width)
{
    uint32_t lane;
    switch (speed) {
    case 1:
        lane = 2500;
        break;
    case 2:
        lane = 5000;
        break;
    case 4:
    case 8:
        lane = 10000;
        break;
    case 16:
        lane = 14000;
        break;
    case 32:
        lane = 25000;
        break;
    case 64:
        lane = 50000;
        break;
    case 128:
        lane = 100000;
        break;
    default:
        lane = 10000;
    }
    uint32_t w = width == 2 ? 4 : width == 4 ? 8 : width == 8 ? 12 : width == 16 ? 2 : 1;
    return lane * w;
}

static int vb_sysfs_int(const char *fmt, const char *name, int dflt)
{
    char path[256];
    snprintf(path, sizeof(path), fmt, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return dflt;
    int v = dflt;
    if (fscanf(f, "%d", &v) != 1)
        v = dflt;
    fclose(f);
    return v;
}

uint32_t kvr_verbs_rand32(void)
{
    return (uint32_t)((kvr_now_ns() * 0x9E3779B97F4A7C15ull) >> 40) ^ (uint32_t)rand();
}

/* ------------------------------------------------------------------------ */
/* devices                                                                   */

static kvr_status_t vb_dev_pick_gid(struct vb_dev *d, int want, const char *ename)
{
    struct ibv_port_attr pa;
    if (ibv_query_port(d->ctx, d->port, &pa)) {
        KVR_LOG_ERROR(COMP, "%s: %s:%u: ibv_query_port: %s", ename, d->name, d->port,
                      strerror(errno));
        return kvr_verbs_status(-1, errno);
    }
    int best = -1, score = -1;
    for (int i = 0; i < pa.gid_tbl_len && i < 256; i++) {
        struct ibv_gid_entry ent;
        if (ibv_query_gid_ex(d->ctx, d->port, (uint32_t)i, &ent, 0))
            continue;
        if (vb_gid_zero(&ent.gid))
            continue;
        int sc = 1;
        if (ent.gid_type == IBV_GID_TYPE_ROCE_V2)
            sc = kvr_verbs_gid_v4(ent.gid.raw) ? 4 : 3;
        if (pa.link_layer != IBV_LINK_LAYER_ETHERNET)
            sc = 2;
        if (want >= 0 && i != want)
            continue;
        if (sc > score) {
            score = sc;
            best = i;
            d->gid = ent.gid;
            d->gid_type = ent.gid_type;
        }
    }
    if (best < 0) {
        if (want >= 0)
            KVR_LOG_ERROR(COMP, "%s: %s:%u: GID index %d is not a valid GID entry", ename, d->name,
                          d->port, want);
        else
            KVR_LOG_ERROR(COMP, "%s: %s:%u: no valid GID (is the netdev up with an address?)",
                          ename, d->name, d->port);
        return KVR_ERR_NOT_FOUND;
    }
    d->gid_index = best;
    return KVR_OK;
}

static kvr_status_t vb_dev_open(struct vb_engine *ve, struct ibv_device *ibdev, uint8_t port,
                                int gid_index, struct vb_dev *d)
{
    const char *en = ve->base.name;
    snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(ibdev));
    d->port = port;
    d->ctx = ibv_open_device(ibdev);
    if (!d->ctx) {
        KVR_LOG_ERROR(COMP, "%s: ibv_open_device %s: %s", en, d->name, strerror(errno));
        return kvr_verbs_status(-1, errno);
    }
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    kvr_status_t s;
    if (ibv_query_device(d->ctx, &da) || ibv_query_port(d->ctx, port, &pa)) {
        KVR_LOG_ERROR(COMP, "%s: %s:%u: query: %s", en, d->name, port, strerror(errno));
        s = kvr_verbs_status(-1, errno);
        goto err_close;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        KVR_LOG_ERROR(COMP, "%s: %s:%u: port is %s, not ACTIVE", en, d->name, port,
                      ibv_port_state_str(pa.state));
        s = KVR_ERR_IO;
        goto err_close;
    }
    d->lid = pa.lid;
    d->link_layer = pa.link_layer;
    d->mtu = pa.active_mtu;
    d->speed_mbps = vb_speed_mbps(pa.active_speed, pa.active_width);
    d->max_msg = pa.max_msg_sz ? pa.max_msg_sz : VB_MAX_WR_LEN;
    d->rd_atom = (uint32_t)(da.max_qp_rd_atom < 16 ? da.max_qp_rd_atom : 16);
    if (d->rd_atom == 0)
        d->rd_atom = 1;
    d->numa = vb_sysfs_int("/sys/class/infiniband/%s/device/numa_node", d->name, -1);
    s = vb_dev_pick_gid(d, gid_index, en);
    if (s != KVR_OK)
        goto err_close;
    d->pd = ibv_alloc_pd(d->ctx);
    if (!d->pd) {
        KVR_LOG_ERROR(COMP, "%s: %s: ibv_alloc_pd: %s", en, d->name, strerror(errno));
        s = kvr_verbs_status(-1, errno);
        goto err_close;
    }
    d->chan = ibv_create_comp_channel(d->ctx);
    if (!d->chan) {
        KVR_LOG_ERROR(COMP, "%s: %s: ibv_create_comp_channel: %s", en, d->name, strerror(errno));
        s = kvr_verbs_status(-1, errno);
        goto err_pd;
    }
    fcntl(d->chan->fd, F_SETFL, fcntl(d->chan->fd, F_GETFL) | O_NONBLOCK);
    /* port state from async events (verbs.c, vb_async_events): read without blocking */
    fcntl(d->ctx->async_fd, F_SETFL, fcntl(d->ctx->async_fd, F_GETFL) | O_NONBLOCK);
    char g[64];
    kvr_verbs_gid_str(d->gid.raw, g, sizeof(g));
    KVR_LOG_INFO(COMP, "%s: using %s:%u gid[%d] %s (%s) mtu %s %u Mb/s numa %d", en, d->name, port,
                 d->gid_index, g, kvr_verbs_gid_type_str(d->gid_type), kvr_verbs_mtu_str(d->mtu),
                 d->speed_mbps, d->numa);
    return KVR_OK;

err_pd:
    ibv_dealloc_pd(d->pd);
    d->pd = NULL;
err_close:
    ibv_close_device(d->ctx);
    d->ctx = NULL;
    return s;
}

void kvr_verbs_dev_close(struct vb_dev *d)
{
    if (d->chan)
        ibv_destroy_comp_channel(d->chan);
    d->chan = NULL;
    if (d->pd)
        ibv_dealloc_pd(d->pd);
    if (d->ctx)
        ibv_close_device(d->ctx);
    d->pd = NULL;
    d->ctx = NULL;
}

/* the NUMA node of the calling thread: where its memory is first touched */
static int vb_my_numa(void)
{
    unsigned cpu = 0, node = 0;
    if (getcpu(&cpu, &node) != 0)
        return -1;
    return (int)node;
}

kvr_status_t kvr_verbs_devices_open(struct vb_engine *ve)
{
    const char *en = ve->base.name;
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        if (list)
            ibv_free_device_list(list);
        KVR_LOG_ERROR(COMP,
                      "%s: no RDMA device (ibv_get_device_list found none; load a "
                      "driver, e.g. rdma_rxe for soft-RoCE)",
                      en);
        return KVR_ERR_NO_RDMA;
    }
    kvr_status_t s = KVR_OK;
    const char *spec = ve->base.cfg.devices;
    if (!spec || !*spec)
        spec = getenv("KVR_VERBS_DEVICES");
    if (spec && *spec) {
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", spec);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
            if (ve->ndev == VB_MAX_DEV) {
                KVR_LOG_ERROR(COMP, "%s: devices '%s': at most %d devices", en, spec, VB_MAX_DEV);
                s = KVR_ERR_INVALID;
                goto out;
            }
            unsigned port = 1;
            int gid = ve->base.cfg.gid_index;
            char *colon = strchr(tok, ':');
            if (colon) { /* name:port or name:port:gid_index */
                *colon = 0;
                char *end;
                port = (unsigned)strtoul(colon + 1, &end, 10);
                bool ok = end != colon + 1 && port > 0 && port < 256;
                if (ok && *end == ':') {
                    char *g = end + 1;
                    gid = (int)strtol(g, &end, 10);
                    ok = end != g && gid >= 0;
                }
                if (!ok || *end) {
                    KVR_LOG_ERROR(COMP,
                                  "%s: devices '%s': bad '%s:%s' (want name[:port[:gid_index]])",
                                  en, spec, tok, colon + 1);
                    s = KVR_ERR_INVALID;
                    goto out;
                }
            }
            struct ibv_device *found = NULL;
            for (int i = 0; i < n; i++)
                if (strcmp(ibv_get_device_name(list[i]), tok) == 0)
                    found = list[i];
            if (!found) {
                char names[256] = "";
                for (int i = 0; i < n; i++)
                    snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                             i ? " " : "", ibv_get_device_name(list[i]));
                KVR_LOG_ERROR(COMP, "%s: RDMA device '%s' not found (present: %s)", en, tok, names);
                s = KVR_ERR_NOT_FOUND;
                goto out;
            }
            s = vb_dev_open(ve, found, (uint8_t)port, gid, &ve->dev[ve->ndev]);
            if (s != KVR_OK)
                goto out;
            ve->ndev++;
        }
        if (ve->ndev == 0) {
            KVR_LOG_ERROR(COMP, "%s: devices '%s' names no device", en, spec);
            s = KVR_ERR_INVALID;
        }
        goto out;
    }
    /* auto: the active port nearest this thread's NUMA node, then the fastest */
    int node = vb_my_numa(), best = -1;
    long best_score = -1;
    for (int i = 0; i < n; i++) {
        struct ibv_context *ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        struct ibv_port_attr pa;
        if (ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) {
            int dn = vb_sysfs_int("/sys/class/infiniband/%s/device/numa_node",
                                  ibv_get_device_name(list[i]), -1);
            long sc = (dn == node ? 2
                       : dn < 0   ? 1
                                  : 0) *
                          100000000L +
                      vb_speed_mbps(pa.active_speed, pa.active_width);
            if (sc > best_score) {
                best_score = sc;
                best = i;
            }
        }
        ibv_close_device(ctx);
    }
    if (best < 0) {
        KVR_LOG_ERROR(COMP, "%s: no RDMA device with an ACTIVE port 1", en);
        s = KVR_ERR_NO_RDMA;
        goto out;
    }
    s = vb_dev_open(ve, list[best], 1, ve->base.cfg.gid_index, &ve->dev[0]);
    if (s == KVR_OK)
        ve->ndev = 1;
out:
    if (s != KVR_OK)
        for (int i = 0; i < ve->ndev; i++)
            kvr_verbs_dev_close(&ve->dev[i]);
    if (s != KVR_OK)
        ve->ndev = 0;
    ibv_free_device_list(list);
    return s;
}

static void vb_add_ip(struct vb_engine *ve, const uint8_t ip[4])
{
    for (int i = 0; i < ve->nip; i++)
        if (memcmp(ve->ip[i], ip, 4) == 0)
            return;
    if (ve->nip < VB_MAX_IP)
        memcpy(ve->ip[ve->nip++], ip, 4);
}

kvr_status_t kvr_verbs_listen(struct vb_engine *ve)
{
    ve->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ve->lfd < 0)
        return kvr_verbs_status(-1, errno);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t sl = sizeof(sa);
    if (bind(ve->lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(ve->lfd, 64) ||
        getsockname(ve->lfd, (struct sockaddr *)&sa, &sl)) {
        int err = errno;
        KVR_LOG_ERROR(COMP, "%s: side channel listen: %s", ve->base.name, strerror(err));
        close(ve->lfd);
        ve->lfd = -1;
        return kvr_verbs_status(-1, err);
    }
    ve->lport = ntohs(sa.sin_port);
    /* side-channel addresses: the GIDs' IPv4 first, then the host's, loopback last */
    for (int i = 0; i < ve->ndev; i++)
        if (kvr_verbs_gid_v4(ve->dev[i].gid.raw) && ve->dev[i].gid.raw[12] != 127)
            vb_add_ip(ve, ve->dev[i].gid.raw + 12);
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) == 0) {
        for (struct ifaddrs *a = ifa; a; a = a->ifa_next)
            if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET) {
                const uint8_t *ip = (const uint8_t *)&((struct sockaddr_in *)a->ifa_addr)->sin_addr;
                if (ip[0] != 127)
                    vb_add_ip(ve, ip);
            }
        freeifaddrs(ifa);
    }
    static const uint8_t lo[4] = {127, 0, 0, 1};
    vb_add_ip(ve, lo);
    return KVR_OK;
}

/* ------------------------------------------------------------------------ */
/* queue pairs                                                               */

kvr_status_t kvr_verbs_qp_create(struct vb_engine *ve, int dev, uint32_t sq, uint32_t rq,
                                 bool *armed, struct ibv_cq **cq_p, struct ibv_qp **qp_p)
{
    struct vb_dev *d = &ve->dev[dev];
    /* cq_context: the flag that says the CQ is armed (cleared by its event) */
    struct ibv_cq *cq = ibv_create_cq(d->ctx, (int)(sq + rq + 8), armed, d->chan, 0);
    if (!cq) {
        KVR_LOG_ERROR(COMP, "%s: %s: ibv_create_cq: %s", ve->base.name, d->name, strerror(errno));
        return kvr_verbs_status(-1, errno);
    }
    struct ibv_qp_init_attr ia = {
        .send_cq = cq,
        .recv_cq = cq,
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
        .cap = {.max_send_wr = sq,
                .max_recv_wr = rq ? rq : 1,
                .max_send_sge = 1,
                .max_recv_sge = 1},
    };
    struct ibv_qp *qp = ibv_create_qp(d->pd, &ia);
    if (!qp) {
        int err = errno;
        KVR_LOG_ERROR(COMP, "%s: %s: ibv_create_qp (sq %u): %s", ve->base.name, d->name, sq,
                      strerror(err));
        ibv_destroy_cq(cq);
        return kvr_verbs_status(-1, err);
    }
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = d->port,
        .qp_access_flags =
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
    };
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        int err = errno;
        KVR_LOG_ERROR(COMP, "%s: %s: QP -> INIT: %s", ve->base.name, d->name, strerror(err));
        ibv_destroy_qp(qp);
        ibv_destroy_cq(cq);
        return kvr_verbs_status(-1, err);
    }
    *cq_p = cq;
    *qp_p = qp;
    return KVR_OK;
}

/* INIT -> RTR -> RTS against the remote QP described by r */
kvr_status_t kvr_verbs_qp_connect(struct vb_engine *ve, int dev, struct ibv_qp *qp,
                                  const struct vb_wire_rail *r, uint32_t mtu, uint32_t my_psn,
                                  uint32_t rd_atom)
{
    struct vb_dev *d = &ve->dev[dev];
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = (enum ibv_mtu)mtu,
        .dest_qp_num = r->qpn,
        .rq_psn = r->psn,
        .max_dest_rd_atomic = (uint8_t)rd_atom,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1,
                    .dlid = r->lid,
                    .sl = 0,
                    .src_path_bits = 0,
                    .port_num = d->port,
                    .grh = {.hop_limit = 64, .sgid_index = (uint8_t)d->gid_index}},
    };
    memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        int err = errno;
        KVR_LOG_ERROR(COMP, "%s: %s: QP %u -> RTR (remote QPN %u, mtu %s): %s", ve->base.name,
                      d->name, qp->qp_num, r->qpn, kvr_verbs_mtu_str((enum ibv_mtu)mtu),
                      strerror(err));
        return kvr_verbs_status(-1, err);
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 16; /* 4.096 us * 2^16 = 268 ms, times retry_cnt */
    a.retry_cnt = 7;
    a.rnr_retry = 7; /* infinite: a target short of receive buffers slows us down */
    a.sq_psn = my_psn;
    a.max_rd_atomic = (uint8_t)rd_atom;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
        int err = errno;
        KVR_LOG_ERROR(COMP, "%s: %s: QP %u -> RTS: %s", ve->base.name, d->name, qp->qp_num,
                      strerror(err));
        return kvr_verbs_status(-1, err);
    }
    return KVR_OK;
}

void kvr_verbs_qp_to_error(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* two ends can talk: same link layer, GID type and address family (and IB subnet) */
kvr_status_t kvr_verbs_check_pair(const char *en, const struct vb_dev *l,
                                  const struct vb_wire_dev *r, const char *rhost)
{
    const char *what = NULL;
    if (l->link_layer != r->link_layer)
        what = "link layer";
    else if (l->gid_type != r->gid_type)
        what = "GID type";
    else if (l->link_layer == IBV_LINK_LAYER_ETHERNET &&
             kvr_verbs_gid_v4(l->gid.raw) != kvr_verbs_gid_v4(r->gid))
        what = "GID address family (IPv4-mapped vs IPv6)";
    else if (l->link_layer != IBV_LINK_LAYER_ETHERNET && memcmp(l->gid.raw, r->gid, 8) != 0)
        what = "IB subnet prefix";
    if (!what)
        return KVR_OK;
    char lg[64], rg[64];
    kvr_verbs_gid_str(l->gid.raw, lg, sizeof(lg));
    kvr_verbs_gid_str(r->gid, rg, sizeof(rg));
    KVR_LOG_ERROR(COMP,
                  "%s: connect: %s mismatch: local %s:%u gid[%d] %s (%s, %s) vs remote %s "
                  "%.64s:%u gid[%u] %s (%s, %s)",
                  en, what, l->name, l->port, l->gid_index, lg, kvr_verbs_gid_type_str(l->gid_type),
                  l->link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand", rhost,
                  r->name, r->port, r->gid_index, rg, kvr_verbs_gid_type_str(r->gid_type),
                  r->link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
    return KVR_ERR_MISMATCH;
}

/* true when device dev's port is ACTIVE and still has the GID it was
 * opened with (a netdev that went down loses its link-local address): a QP
 * brought to RTR on it otherwise waits seconds for an address resolution
 * that cannot succeed, inside ibv_modify_qp.  why (cap bytes) says which. */
bool kvr_verbs_port_ready(struct vb_engine *ve, int dev, char *why, size_t cap)
{
    struct vb_dev *d = &ve->dev[dev];
    struct ibv_port_attr pa;
    union ibv_gid g;
    if (ibv_query_port(d->ctx, d->port, &pa) != 0) {
        snprintf(why, cap, "%s:%u: ibv_query_port: %s", d->name, d->port, strerror(errno));
        return false;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        snprintf(why, cap, "%s:%u is %s", d->name, d->port, ibv_port_state_str(pa.state));
        return false;
    }
    if (ibv_query_gid(d->ctx, d->port, d->gid_index, &g) != 0 ||
        memcmp(g.raw, d->gid.raw, 16) != 0) {
        snprintf(why, cap, "%s:%u has lost gid[%d] (its netdev's address)", d->name, d->port,
                 d->gid_index);
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* side channel                                                              */

int kvr_verbs_tcp_connect(const uint8_t ip[4], uint16_t port, int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    memcpy(&sa.sin_addr, ip, 4);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (errno != EINPROGRESS)
            goto err;
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, timeout_ms) != 1)
            goto err;
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr)
            goto err;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
err:
    close(fd);
    return -1;
}

/* writes all of buf on a non-blocking socket, waiting at most timeout_ms */
int kvr_verbs_send_all(int fd, const void *buf, size_t len, int timeout_ms)
{
    const char *p = buf;
    uint64_t deadline = kvr_deadline_ns(timeout_ms);
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (kvr_now_ns() >= deadline)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        poll(&pf, 1, 10);
    }
    return 0;
}

/* reads into buf up to want bytes; 1 complete, 0 not yet, -1 EOF/error */
int kvr_verbs_recv_some(int fd, void *buf, size_t *have, size_t want)
{
    while (*have < want) {
        ssize_t n = recv(fd, (char *)buf + *have, want - *have, 0);
        if (n > 0) {
            *have += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        return -1;
    }
    return 1;
}
