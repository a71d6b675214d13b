/*
 * verbs.c - the native libibverbs transfer backend: RC queue pairs.  This
 * file: engine, memory, connection handshake, data path, progress and the
 * ops table; verbs_dev.c: devices, GIDs, QP transitions, status mapping,
 * side-channel sockets; verbs_internal.h: what they share.
 *
 * Devices.  cfg->devices ("rxe0", "mlx5_0:1,mlx5_1", "rxe0:1:0" = port 1,
 * GID index 0) names the NICs; without
 * it the one nearest the calling thread's memory is used (NUMA node of the
 * NIC from sysfs against the node of the current CPU, then link speed).  On
 * each port the GID is cfg->gid_index, or else the first RoCE v2 entry with
 * an IPv4-mapped address, then any RoCE v2 entry, then any valid entry.
 * Every registered region gets one MR per device (LOCAL_WRITE | REMOTE_WRITE
 * | REMOTE_READ), once; its rkey blob carries one rkey per device.
 *
 * Connection handshake.  RC QPs need both ends' QP numbers, but only the
 * initiator calls kvr_xfer_connect(); the target only runs progress.  So
 * every engine listens on a TCP side channel; its address blob carries, per
 * device, name/port/GID/GID type/LID/MTU/speed, plus the IPv4 addresses and
 * port of the side channel and a random nonce.  connect() checks that the
 * two ends can talk (link layer, GID type, IPv4 vs IPv6 GID, IB subnet:
 * a mismatch is KVR_ERR_MISMATCH naming both ends), creates one CQ + RC QP
 * per rail (rail i = local device i <-> remote device i), opens the TCP
 * connection (the kernel completes it without the target's help) and sends
 * the request {nonce, per rail: QPN, PSN, GID, LID, MTU, RDMA-read depth};
 * it does not wait.  The target's progress accepts, creates its QPs, brings
 * them to RTS with path MTU = the lower of both ends and answers; the
 * initiator's progress brings its QPs to RTS.  Posts and notifications made
 * meanwhile are queued.  The TCP connection stays open: EOF on it is the
 * fastest sign that the other process died (on either side); a QP error
 * (retry exceeded) is the sign when the network went away.
 *
 * Data path.  A prepared list is turned once into chains of ibv_send_wr (one
 * chain per rail; with several rails, segments are cut into 1 MiB pieces and
 * spread by link speed).  A post links as much of each chain as the bounded
 * send queue has room for and posts it with one ibv_post_send; the rest
 * waits on the rail's FIFO and is posted by progress as completions free
 * slots (back-pressure: nothing dropped, post never blocks).  Signaling is
 * selective across posts: every 16th WR (at most SQ/4), and a chunk's last WR
 * when no signaled WR is in flight; an unsignaled tail left with none in
 * flight is covered by a signaled zero-length WRITE from progress.  Every WR
 * has a sequence number (wr_id); a completion retires all slots up to it and
 * completes every list whose last WR is among them (RC completes in order).
 * Notifications are SENDs from a registered ring on rail 0, into receive
 * buffers the target pre-posts (RNR retry "infinite" makes a slow target
 * back-pressure, not loss).  RC executes a QP's requests in order, so a
 * notification is seen only after the writes posted before it on that QP;
 * with several rails the SEND is also held until every other rail has
 * completed what was queued before it.
 *
 * Errors.  kvr_verbs_status() is the one mapping of ibv_wc_status and errno to
 * kvr_status_t.  The WR that failed gives its transfer the mapped status
 * (REM_ACCESS_ERR -> KVR_ERR_NOT_FOUND "bad remote key"); every other
 * transfer still queued or in flight on the peer gets KVR_ERR_PEER_FAILURE,
 * the peer is failed (a QP in error state cannot carry more), and
 * disconnect + connect gives a fresh one.
 */
#include "verbs_internal.h"

#include <sys/epoll.h>

static void vb_efd_add(struct vb_engine *ve, int fd);

/* ------------------------------------------------------------------------ */
/* engine                                                                    */

static kvr_status_t vb_engine_init(kvr_xfer_engine_t *e)
{
    struct vb_engine *ve = ENG(e);
    ve->lfd = -1;
    ve->efd = -1;
    const char *d = getenv("KVR_VERBS_SQ_DEPTH");
    ve->sq_depth = d ? (uint32_t)strtoul(d, NULL, 10) : VB_SQ_DEPTH;
    if (ve->sq_depth < 4 || ve->sq_depth > 16384)
        ve->sq_depth = VB_SQ_DEPTH;
    ve->nonce = ((uint64_t)kvr_verbs_rand32() << 32) ^ kvr_verbs_rand32() ^ (uint64_t)getpid();
    for (int i = 0; i < VB_MAX_DEV; i++)
        ve->inject_after[i] = UINT64_MAX;
    const char *cd = getenv("KVR_VERBS_RAIL_COOLDOWN_MS");
    ve->cooldown_ms = cd ? (uint32_t)strtoul(cd, NULL, 10) : VB_COOLDOWN_MS;
    if (ve->cooldown_ms == 0 || ve->cooldown_ms > 600000)
        ve->cooldown_ms = VB_COOLDOWN_MS;
    const char *inj = getenv("KVR_VERBS_FAIL_RAIL");
    unsigned ir = 0;
    unsigned long long ia = 0;
    int used = 0;
    while (inj && sscanf(inj, "%u:%llu%n", &ir, &ia, &used) == 2 && ir < VB_MAX_DEV) {
        ve->inject_after[ir] = ia;
        KVR_LOG_WARN(COMP,
                     "%s: KVR_VERBS_FAIL_RAIL: rail %u's QP will be put in error after %llu "
                     "WRs (a failover test)",
                     e->name, ir, ia);
        inj += used;
        inj = *inj == ',' ? inj + 1 : NULL;
    }
    char host[32] = "?";
    gethostname(host, sizeof(host) - 1);
    snprintf(ve->who, sizeof(ve->who), "%.20s pid %d on %.24s", e->name, (int)getpid(), host);
    kvr_status_t s = kvr_verbs_devices_open(ve);
    if (s != KVR_OK)
        return s;
    s = kvr_verbs_listen(ve);
    if (s != KVR_OK) {
        for (int i = 0; i < ve->ndev; i++)
            kvr_verbs_dev_close(&ve->dev[i]);
        return s;
    }
    return KVR_OK;
}

static void vb_inbound_destroy(struct vb_inbound *in);

/* before the regions are deregistered: the inbound QPs go (no remote access
 * lands any more) and their side channels close, which is how an initiator
 * learns that this engine shut down - it never sees a region vanish under a
 * live QP (no "bad remote key" for a clean shutdown) */
static void vb_engine_quiesce(kvr_xfer_engine_t *e)
{
    struct vb_engine *ve = ENG(e);
    while (ve->inbound) {
        struct vb_inbound *in = ve->inbound;
        ve->inbound = in->next;
        in->bye = 0;
        vb_inbound_destroy(in);
    }
    ve->nheld = 0;
}

static void vb_engine_fini(kvr_xfer_engine_t *e)
{
    struct vb_engine *ve = ENG(e);
    vb_engine_quiesce(e); /* (done already when the core destroys the engine) */
    if (ve->lfd >= 0)
        close(ve->lfd);
    if (ve->efd >= 0)
        close(ve->efd);
    for (int i = 0; i < ve->ndev; i++)
        kvr_verbs_dev_close(&ve->dev[i]);
}

static kvr_status_t vb_address(kvr_xfer_engine_t *e, void **buf_p, size_t *len_p)
{
    struct vb_engine *ve = ENG(e);
    struct vb_wire_addr *a = calloc(1, sizeof(*a));
    if (!a)
        return KVR_ERR_NO_MEMORY;
    a->magic = VB_HS_MAGIC;
    a->version = VB_HS_VERSION;
    a->nonce = ve->nonce;
    a->tcp_port = ve->lport;
    a->ndev = (uint8_t)ve->ndev;
    a->nip = (uint8_t)ve->nip;
    memcpy(a->ip, ve->ip, sizeof(a->ip));
    snprintf(a->host, sizeof(a->host), "%s", ve->who);
    for (int i = 0; i < ve->ndev; i++) {
        const struct vb_dev *d = &ve->dev[i];
        struct vb_wire_dev *w = &a->dev[i];
        snprintf(w->name, sizeof(w->name), "%s", d->name);
        w->port = d->port;
        w->link_layer = d->link_layer;
        w->mtu = (uint8_t)d->mtu;
        w->gid_index = (uint32_t)d->gid_index;
        w->gid_type = d->gid_type;
        w->speed_mbps = d->speed_mbps;
        w->lid = d->lid;
        memcpy(w->gid, d->gid.raw, 16);
    }
    *buf_p = a;
    *len_p = sizeof(*a);
    return KVR_OK;
}

/* ------------------------------------------------------------------------ */
/* memory                                                                    */

static kvr_status_t vb_mem_reg(kvr_xfer_mem_t *m)
{
    struct vb_engine *ve = ENG(m->engine);
    struct vb_mem *vm = MEM(m);
    if (m->kind != KVR_MEM_HOST) {
        KVR_LOG_ERROR(COMP, "%s: mem_reg: only host memory in this build", m->engine->name);
        return KVR_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < ve->ndev; i++) {
        vm->mr[i] =
            ibv_reg_mr(ve->dev[i].pd, m->addr, m->len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        if (!vm->mr[i]) {
            int err = errno;
            KVR_LOG_ERROR(COMP, "%s: ibv_reg_mr %zu bytes on %s: %s%s", m->engine->name, m->len,
                          ve->dev[i].name, strerror(err),
                          err == ENOMEM ? " (locked-memory limit? ulimit -l)" : "");
            while (i-- > 0)
                ibv_dereg_mr(vm->mr[i]);
            return kvr_verbs_status(-1, err);
        }
    }
    return KVR_OK;
}

static void vb_mem_dereg(kvr_xfer_mem_t *m)
{
    struct vb_engine *ve = ENG(m->engine);
    struct vb_mem *vm = MEM(m);
    for (int i = 0; i < ve->ndev; i++)
        if (vm->mr[i])
            ibv_dereg_mr(vm->mr[i]);
}

static kvr_status_t vb_mem_pack(kvr_xfer_mem_t *m, void **buf_p, size_t *len_p)
{
    struct vb_engine *ve = ENG(m->engine);
    uint32_t *k = malloc(sizeof(uint32_t) * (size_t)(1 + ve->ndev));
    if (!k)
        return KVR_ERR_NO_MEMORY;
    k[0] = (uint32_t)ve->ndev;
    for (int i = 0; i < ve->ndev; i++)
        k[1 + i] = MEM(m)->mr[i]->rkey;
    *buf_p = k;
    *len_p = sizeof(uint32_t) * (size_t)(1 + ve->ndev);
    return KVR_OK;
}

static kvr_status_t vb_rmem_unpack(kvr_xfer_rmem_t *r, const void *buf, size_t len)
{
    struct vb_rmem *vr = RMEM(r);
    uint32_t n;
    if (len < 4)
        goto bad;
    memcpy(&n, buf, 4);
    if (n == 0 || n > VB_MAX_DEV || len != 4 * (size_t)(n + 1))
        goto bad;
    vr->nkey = n;
    memcpy(vr->rkey, (const uint8_t *)buf + 4, 4 * (size_t)n);
    if ((int)n < PEER(r->peer)->remote.ndev)
        goto bad;
    return KVR_OK;
bad:
    KVR_LOG_ERROR(COMP,
                  "%s: rkey blob: backend key of %zu bytes is not one rkey per device of "
                  "the peer",
                  r->peer->engine->name, len);
    return KVR_ERR_INVALID;
}

static void vb_rmem_release(kvr_xfer_rmem_t *r) {}

/* ------------------------------------------------------------------------ */
/* rails: posting and retiring                                               */

static uint32_t vb_rail_free(const struct vb_rail *r, uint32_t depth)
{
    return depth - (uint32_t)(r->posted - r->done);
}

static void vb_fifo_push(struct vb_rail *r, struct vb_item *it)
{
    it->next = NULL;
    it->queued = true;
    if (r->tail)
        r->tail->next = it;
    else
        r->head = it;
    r->tail = it;
}

static void vb_fifo_pop(struct vb_rail *r)
{
    struct vb_item *it = r->head;
    r->head = it->next;
    if (!r->head)
        r->tail = NULL;
    it->next = NULL;
    it->queued = false;
}

static void vb_part_done(struct vb_part *pt, kvr_status_t s)
{
    struct vb_dlist *dl = pt->dl;
    if (s != KVR_OK && dl->err == KVR_OK)
        dl->err = s;
    if (dl->left && --dl->left == 0)
        kvr_xfer_dlist_complete(&dl->base, dl->err);
}

static void vb_peer_failed(struct vb_peer *vp, kvr_status_t first, struct vb_dlist *first_dl,
                           const char *why);
static void vb_rail_failover(struct vb_peer *vp, int ri, kvr_status_t s, const char *why);
static void vb_peer_transports(struct vb_peer *vp, const char *state);

/* signal every Nth WR of a rail: N <= depth / 4, so a full send queue always
 * holds a signaled WR and a tail to flush is always shorter than the room */
static uint32_t vb_signal_every(uint32_t depth)
{
    uint32_t n = depth / 4;
    return n > VB_SIGNAL_EVERY ? VB_SIGNAL_EVERY : n ? n : 1;
}

/* posts WRs [pt->posted, pt->posted + n) of a part; 0 or an errno.  A WR is
 * signaled when its sequence number is N - 1 modulo N, or when it ends
 * the chunk and no signaled WR is in flight (nothing would report this chunk
 * soon); the others complete with the next signaled WR on the QP (RC retires
 * a QP's WRs in order), or with a flush from vb_rail_flush(). */
static int vb_post_chunk(struct vb_rail *r, struct vb_part *pt, uint32_t n, uint32_t depth)
{
    uint32_t a = pt->posted, b = a + n, every = vb_signal_every(depth);
    uint64_t sig = r->sig;
    for (uint32_t k = a; k < b; k++) {
        uint64_t seq = r->posted + (k - a);
        struct ibv_send_wr *w = &pt->wr[k];
        w->wr_id = seq;
        bool on = (seq % every) == every - 1 || (k == b - 1 && sig <= r->done);
        w->send_flags = on ? IBV_SEND_SIGNALED : 0;
        if (on)
            sig = seq + 1;
        struct vb_slot *sl = &r->slots[seq % depth];
        sl->dl = pt->dl;
        sl->kind = VB_ITEM_PART;
        sl->end = k == pt->nwr - 1;
        sl->pi = (uint8_t)(pt - pt->dl->part);
        sl->len = pt->sge[k].length;
        sl->wi = k;
        r->bytes += pt->sge[k].length;
    }
    struct vb_engine *ve = ENG(r->peer->base.engine);
    int ri = (int)(r - r->peer->rail);
    if (r->posted + n > ve->inject_after[ri]) {
        /* these WRs will be flushed, never executed: a failover must redo them */
        KVR_LOG_WARN(COMP, "%s: KVR_VERBS_FAIL_RAIL: QP %u of rail %d put in error now",
                     ve->base.name, r->qp->qp_num, ri);
        ve->inject_after[ri] = UINT64_MAX;
        kvr_verbs_qp_to_error(r->qp);
    }
    struct ibv_send_wr *save = pt->wr[b - 1].next, *bad = NULL;
    pt->wr[b - 1].next = NULL;
    int rc = ibv_post_send(r->qp, &pt->wr[a], &bad);
    pt->wr[b - 1].next = save;
    if (rc)
        return rc;
    r->posted += n;
    r->sig = sig;
    pt->posted = b;
    return 0;
}

/* WRs posted after the last signaled one, with no signaled WR in flight to
 * report them: post a signaled zero-length RDMA WRITE whose completion
 * retires them all.  It names no region (address and rkey 0: a zero-length
 * RDMA operation's R_Key is not checked, IBTA C9-88), so it cannot fail on a
 * region the target deregistered meanwhile.  0, or an errno. */
static int vb_rail_flush(struct vb_rail *r, uint32_t depth)
{
    if (r->posted == r->sig || r->sig > r->done || vb_rail_free(r, depth) == 0)
        return 0;
    struct ibv_send_wr wr = {.wr_id = r->posted,
                             .num_sge = 0,
                             .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad = NULL;
    wr.wr.rdma.remote_addr = 0; /* zero length: no region named, none checked (IBTA C9-88) */
    wr.wr.rdma.rkey = 0;
    struct vb_slot *sl = &r->slots[r->posted % depth];
    sl->dl = NULL;
    sl->kind = VB_ITEM_FLUSH;
    sl->end = 1;
    int rc = ibv_post_send(r->qp, &wr, &bad);
    if (rc) {
        sl->kind = 0;
        return rc;
    }
    r->posted++;
    r->sig = r->posted;
    r->flushes++;
    return 0;
}

static int vb_post_notif(struct vb_rail *r, struct vb_notif *nt, uint32_t depth)
{
    struct vb_peer *vp = r->peer;
    struct ibv_sge sge = {.addr = (uintptr_t)(vp->nbuf + (size_t)nt->slot * VB_NOTIF_BUF),
                          .length = nt->len,
                          .lkey = vp->nmr[r->ldev]->lkey};
    struct ibv_send_wr wr = {.wr_id = r->posted,
                             .sg_list = &sge,
                             .num_sge = nt->len ? 1 : 0,
                             .opcode = IBV_WR_SEND_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED,
                             .imm_data = htonl(nt->seq)},
                       *bad = NULL;
    struct vb_slot *sl = &r->slots[r->posted % depth];
    sl->dl = NULL;
    sl->kind = VB_ITEM_NOTIF;
    sl->end = 1;
    int rc = ibv_post_send(r->qp, &wr, &bad);
    if (rc)
        return rc;
    r->posted++;
    r->sig = r->posted;
    return 0;
}

/* a notification goes out on its rail (vp->nr) once every live other rail
 * retired what was enqueued on it before the notification: RC orders its
 * own rail, the fence the others */
static bool vb_fence_ok(const struct vb_peer *vp, const struct vb_notif *nt)
{
    for (int i = 0; i < vp->nrails; i++)
        if (i != vp->nr && !vp->rail[i].down && vp->rail[i].done_enq < nt->fence[i])
            return false;
    return true;
}

/* posts what waits on the rail's FIFO while the send queue has room */
static int vb_rail_kick(struct vb_rail *r)
{
    struct vb_peer *vp = r->peer;
    uint32_t depth = ENG(vp->base.engine)->sq_depth;
    int n = 0;
    while (r->head && vp->state == VB_READY) {
        uint32_t room = vb_rail_free(r, depth);
        if (room == 0)
            break;
        int rc;
        if (r->head->kind == VB_ITEM_PART) {
            struct vb_part *pt = container_of(r->head, struct vb_part, item);
            uint32_t left = pt->nwr - pt->posted, c = left < room ? left : room;
            rc = vb_post_chunk(r, pt, c, depth);
            if (rc == 0 && pt->posted == pt->nwr)
                vb_fifo_pop(r);
        } else {
            struct vb_notif *nt = container_of(r->head, struct vb_notif, item);
            if (!vb_fence_ok(vp, nt))
                break;
            rc = vb_post_notif(r, nt, depth);
            if (rc == 0)
                vb_fifo_pop(r);
        }
        if (rc) {
            char why[128];
            snprintf(why, sizeof(why), "ibv_post_send on %s: %s",
                     ENG(vp->base.engine)->dev[r->ldev].name, strerror(rc));
            vb_rail_failover(vp, (int)(r - vp->rail), kvr_verbs_status(-1, rc), why);
            return n;
        }
        n++;
    }
    return n;
}

/* retires slots [r->done, upto) as successful */
static void vb_retire(struct vb_rail *r, uint64_t upto, uint32_t depth)
{
    struct vb_peer *vp = r->peer;
    for (; r->done < upto; r->done++) {
        struct vb_slot *sl = &r->slots[r->done % depth];
        if (sl->kind == VB_ITEM_NOTIF) {
            vp->nb_tail++;
            r->done_enq++;
        } else if (sl->kind == VB_ITEM_PART) {
            r->done_enq++;
            r->bytes_done += sl->len;
            if (sl->end && sl->dl) {
                struct vb_dlist *dl = sl->dl;
                sl->dl = NULL;
                vb_part_done(&dl->part[sl->pi], KVR_OK);
            }
        }
        sl->kind = 0;
    }
}

/* ------------------------------------------------------------------------ */
/* peers                                                                     */

static void vb_peer_failed(struct vb_peer *vp, kvr_status_t first, struct vb_dlist *first_dl,
                           const char *why)
{
    if (vp->state == VB_FAILED)
        return;
    struct vb_engine *ve = ENG(vp->base.engine);
    uint32_t depth = ve->sq_depth;
    vp->state = VB_FAILED;
    kvr_xfer_peer_fail(&vp->base, KVR_ERR_PEER_FAILURE, why);
    for (int i = 0; i < vp->nrails; i++) {
        struct vb_rail *r = &vp->rail[i];
        if (r->qp)
            kvr_verbs_qp_to_error(r->qp);
        /* in flight: the failing list gets its own status, the others peer failure */
        for (; r->done < r->posted; r->done++) {
            struct vb_slot *sl = &r->slots[r->done % depth];
            if (sl->dl && sl->end) {
                struct vb_dlist *dl = sl->dl;
                sl->dl = NULL;
                vb_part_done(&dl->part[sl->pi], dl == first_dl ? first : KVR_ERR_PEER_FAILURE);
            }
        }
        while (r->head) {
            struct vb_item *it = r->head;
            vb_fifo_pop(r);
            if (it->kind == VB_ITEM_PART) {
                struct vb_part *pt = container_of(it, struct vb_part, item);
                vb_part_done(pt, pt->dl == first_dl ? first : KVR_ERR_PEER_FAILURE);
            }
        }
    }
    vp->nb_tail = vp->nb_head;
    if (vp->fd >= 0) {
        close(vp->fd);
        vp->fd = -1;
    }
}

/* ------------------------------------------------------------------------ */
/* rail failover                                                             */

/* gives a part's WRs the keys of rail j (its local device's lkey, the
 * remote device's rkey: the target registered every region on every device
 * it named) */
static void vb_part_rekey(struct vb_peer *vp, struct vb_part *pt, int j)
{
    const struct vb_rail *r = &vp->rail[j];
    for (uint32_t k = 0; k < pt->nwr; k++) {
        pt->sge[k].lkey = MEM(pt->ref[k].l)->mr[r->ldev]->lkey;
        pt->wr[k].wr.rdma.rkey = RMEM(pt->ref[k].r)->rkey[r->rdev];
    }
    pt->rail = j;
}

/* the live rail with the least queued or in flight; -1: none */
static int vb_live_rail(const struct vb_peer *vp, int prefer)
{
    if (prefer >= 0 && prefer < vp->nrails && !vp->rail[prefer].down)
        return prefer;
    int best = -1;
    for (int i = 0; i < vp->nrails; i++) {
        const struct vb_rail *r = &vp->rail[i];
        if (!r->down &&
            (best < 0 || r->enq - r->done_enq < vp->rail[best].enq - vp->rail[best].done_enq))
            best = i;
    }
    return best;
}

/* queues a part on rail j ahead of what waits there (after a part already
 * half posted): it was submitted before them */
static void vb_push_front(struct vb_rail *r, struct vb_part *pt)
{
    struct vb_item *it = &pt->item;
    it->queued = true;
    struct vb_item *h = r->head;
    if (h && h->kind == VB_ITEM_PART && container_of(h, struct vb_part, item)->posted) {
        it->next = h->next;
        h->next = it;
        if (r->tail == h)
            r->tail = it;
        return;
    }
    it->next = h;
    r->head = it;
    if (!r->tail)
        r->tail = it;
}

/* Rail ri failed (a QP error, or a post to it refused).  The loss of the
 * last rail fails the peer.  Otherwise the rail goes down (until a probe
 * brings it back) and every part it held - in flight or queued - is
 * resubmitted on a live rail, ahead of what waits there, from its first WR
 * not retired (RC retires in order: those before it are complete at the
 * target; those after may or may not have executed, and a WRITE or READ
 * again is harmless, the source and destination of an incomplete post are
 * the caller's untouched buffers).
 * If it carried the notifications, they move to the lowest live rail: every
 * one not yet completed is sent again there, in order (one that did arrive
 * is dropped by the target by its sequence number).  A notification waits
 * for the moved WRs.  A part's list fails when the part was submitted
 * VB_MAX_ATTEMPTS times. */
static void vb_rail_failover(struct vb_peer *vp, int ri, kvr_status_t s, const char *why)
{
    struct vb_rail *r = &vp->rail[ri];
    struct vb_engine *ve = ENG(vp->base.engine);
    uint32_t depth = ve->sq_depth;
    /* the other rails that can take its parts: up, and on a port that is
     * up (links that went down together fail now, not after the retries of
     * RC on each: those take seconds) */
    int others = 0;
    char pwhy[128];
    for (int i = 0; i < vp->nrails; i++)
        others += i != ri && !vp->rail[i].down &&
                  kvr_verbs_port_ready(ve, vp->rail[i].ldev, pwhy, sizeof(pwhy));
    if (others == 0 || vp->state != VB_READY) {
        vb_peer_failed(vp, s, NULL, why);
        return;
    }
    r->down = true;
    r->probe = VB_PROBE_COOL;
    r->next_ns = kvr_now_ns() + (uint64_t)ve->cooldown_ms * 1000000u;
    r->failovers++;
    ve->base.stats.failovers++;
    if (r->qp)
        kvr_verbs_qp_to_error(r->qp);
    /* the parts it held: queued ones, then those with WRs in flight (its
     * notifications, queued or in flight, are all sent again below).  A
     * part resumes at its first WR not retired: RC retired the WRs before
     * it in order, so they are complete at the target */
    struct vb_part *moved = NULL;
    uint32_t nmoved = 0, nresent = 0;
    char nmsg[96] = "";
    while (r->head) {
        struct vb_item *it = r->head;
        vb_fifo_pop(r);
        if (it->kind != VB_ITEM_PART)
            continue;
        struct vb_part *pt = container_of(it, struct vb_part, item);
        pt->moving = true;
        pt->resume = pt->posted; /* (a half-posted head: lowered below) */
        pt->item.next = moved ? &moved->item : NULL;
        moved = pt;
        nmoved++;
    }
    for (; r->done < r->posted; r->done++) {
        struct vb_slot *sl = &r->slots[r->done % depth];
        if (sl->kind == VB_ITEM_PART && sl->dl) {
            struct vb_part *pt = &sl->dl->part[sl->pi];
            if (!pt->moving) {
                pt->moving = true;
                pt->resume = sl->wi;
                pt->item.next = moved ? &moved->item : NULL;
                moved = pt;
                nmoved++;
            } else if (sl->wi < pt->resume) {
                pt->resume = sl->wi;
            }
        }
        sl->dl = NULL;
        sl->kind = 0;
    }
    /* what it held moved away: its counters say it holds nothing, and no
     * notification waits for it any more (down rails are not fenced on) */
    r->sig = r->posted;
    r->done_enq = r->enq;
    if (ri == vp->nr) {
        int j = 0;
        while (vp->rail[j].down)
            j++;
        vp->nr = j;
        for (uint64_t k = vp->nb_tail; k < vp->nb_head; k++) {
            struct vb_notif *nt = &vp->nodes[k % VB_NOTIF_SLOTS];
            vp->rail[j].enq++;
            vb_fifo_push(&vp->rail[j], &nt->item);
            nresent++;
        }
        snprintf(nmsg, sizeof(nmsg),
                 "; notifications now on rail %d (%u not acknowledged: sent again)", j, nresent);
    }
    vb_peer_transports(vp, vp->tstate);
    KVR_LOG_WARN(COMP,
                 "%s: rail %d (%s -> %s of %.64s) failed: %s; %u transfer part(s) resubmitted on "
                 "the other rails%s; a probe in %u ms",
                 ve->base.name, ri, ve->dev[r->ldev].name, vp->remote.dev[r->rdev].name,
                 vp->remote.host, why, nmoved, nmsg, ve->cooldown_ms);
    while (moved) {
        struct vb_part *pt = moved;
        moved = pt->item.next ? container_of(pt->item.next, struct vb_part, item) : NULL;
        pt->item.next = NULL;
        pt->moving = false;
        int j = vb_live_rail(vp, -1);
        if (++pt->attempts >= VB_MAX_ATTEMPTS || j < 0) {
            KVR_LOG_ERROR(COMP, "%s: a transfer failed on %u rails in turn; giving it up",
                          ve->base.name, (unsigned)pt->attempts);
            vb_part_done(pt, KVR_ERR_PEER_FAILURE);
            continue;
        }
        vb_part_rekey(vp, pt, j);
        pt->posted = pt->resume;
        struct vb_rail *rj = &vp->rail[j];
        rj->enq += pt->nwr - pt->resume;
        /* queued notifications wait for it: for everything enqueued on rail j
         * (it goes ahead of what waits there, behind what is in flight) */
        for (struct vb_item *it = vp->rail[vp->nr].head; it && j != vp->nr; it = it->next)
            if (it->kind == VB_ITEM_NOTIF)
                container_of(it, struct vb_notif, item)->fence[j] = rj->enq;
        vb_push_front(rj, pt);
    }
    for (int i = 0; i < vp->nrails && vp->state == VB_READY; i++)
        if (!vp->rail[i].down)
            vb_rail_kick(&vp->rail[i]);
}

static void vb_rail_fini(struct vb_rail *r)
{
    if (r->pfd >= 0)
        close(r->pfd);
    r->pfd = -1;
    free(r->prep);
    r->prep = NULL;
    if (r->qp)
        ibv_destroy_qp(r->qp);
    if (r->cq)
        ibv_destroy_cq(r->cq);
    free(r->slots);
    r->qp = NULL;
    r->cq = NULL;
    r->slots = NULL;
}

static void vb_peer_unlink(struct vb_engine *ve, struct vb_peer *vp)
{
    for (struct vb_peer **pp = &ve->peers; *pp; pp = &(*pp)->next)
        if (*pp == vp) {
            *pp = vp->next;
            break;
        }
}

static void vb_peer_transports(struct vb_peer *vp, const char *state)
{
    struct vb_engine *ve = ENG(vp->base.engine);
    char *t = vp->base.transports;
    size_t cap = sizeof(vp->base.transports), len = 0;
    t[0] = 0;
    for (int i = 0; i < vp->nrails && len < cap; i++) {
        const struct vb_dev *d = &ve->dev[vp->rail[i].ldev];
        const struct vb_wire_dev *rd = &vp->remote.dev[vp->rail[i].rdev];
        len += (size_t)snprintf(t + len, cap - len, "%src/%s:%u->%.32s:%u%s", i ? "," : "", d->name,
                                d->port, rd->name, rd->port, vp->rail[i].down ? "(down)" : "");
    }
    if (state != vp->tstate)
        snprintf(vp->tstate, sizeof(vp->tstate), "%s", state);
    if (len < cap)
        snprintf(t + len, cap - len, " %s %s", kvr_verbs_gid_type_str(ve->dev[0].gid_type), state);
}

static size_t vb_peer_rails(const kvr_xfer_peer_t *p, struct kvr_xfer_rail_stats *rs, size_t cap)
{
    const struct vb_peer *vp = container_of(p, const struct vb_peer, base);
    const struct vb_engine *ve = container_of(p->engine, const struct vb_engine, base);
    for (int i = 0; i < vp->nrails && (size_t)i < cap; i++) {
        const struct vb_rail *r = &vp->rail[i];
        const struct vb_dev *d = &ve->dev[r->ldev];
        const struct vb_wire_dev *rd = &vp->remote.dev[r->rdev];
        struct kvr_xfer_rail_stats *o = &rs[i];
        memset(o, 0, sizeof(*o));
        snprintf(o->local, sizeof(o->local), "%.40s:%u", d->name, d->port);
        snprintf(o->remote, sizeof(o->remote), "%.40s:%u", rd->name, rd->port);
        o->bytes = r->bytes;
        o->bytes_done = r->bytes_done;
        o->failovers = r->failovers;
        o->down = r->down;
        o->notif = i == vp->nr;
    }
    return (size_t)vp->nrails;
}

static kvr_status_t vb_connect(kvr_xfer_peer_t *p, const void *addr, size_t len)
{
    struct vb_engine *ve = ENG(p->engine);
    struct vb_peer *vp = PEER(p);
    const char *en = p->engine->name;
    const struct vb_wire_addr *a = addr;
    vp->fd = -1;
    if (len != sizeof(*a) || a->magic != VB_HS_MAGIC || a->version != VB_HS_VERSION ||
        a->ndev == 0 || a->ndev > VB_MAX_DEV || a->nip == 0 || a->nip > VB_MAX_IP) {
        KVR_LOG_ERROR(COMP,
                      "%s: connect: the address payload (%zu bytes) is not a verbs "
                      "address of version %d",
                      en, len, VB_HS_VERSION);
        return len != sizeof(*a)             ? KVR_ERR_INVALID
               : a->version != VB_HS_VERSION ? KVR_ERR_VERSION
                                             : KVR_ERR_INVALID;
    }
    vp->remote = *a;
    vp->remote.host[sizeof(vp->remote.host) - 1] = 0;
    vp->nrails = ve->ndev < a->ndev ? ve->ndev : a->ndev;
    kvr_status_t s;
    for (int i = 0; i < vp->nrails; i++) {
        s = kvr_verbs_check_pair(en, &ve->dev[i], &a->dev[i], vp->remote.host);
        if (s != KVR_OK)
            return s;
    }
    struct vb_hs *req = calloc(1, sizeof(*req));
    if (!req)
        return KVR_ERR_NO_MEMORY;
    req->magic = VB_HS_MAGIC;
    req->version = VB_HS_VERSION;
    req->nonce = a->nonce;
    memcpy(req->token, p->token, sizeof(req->token));
    req->nrails = (uint32_t)vp->nrails;
    vp->conn = ((uint64_t)kvr_verbs_rand32() << 32 | kvr_verbs_rand32()) | 1;
    req->conn = vp->conn;
    snprintf(req->who, sizeof(req->who), "%s", ve->who);
    for (int i = 0; i < vp->nrails; i++) {
        struct vb_rail *r = &vp->rail[i];
        r->peer = vp;
        r->ldev = i;
        r->rdev = i;
        r->pfd = -1;
        uint32_t sp = a->dev[i].speed_mbps;
        r->weight = ve->dev[i].speed_mbps < sp ? ve->dev[i].speed_mbps : sp;
        if (r->weight == 0)
            r->weight = 1;
        r->slots = calloc(ve->sq_depth, sizeof(*r->slots));
        if (!r->slots) {
            s = KVR_ERR_NO_MEMORY;
            goto err_rails;
        }
        s = kvr_verbs_qp_create(ve, i, ve->sq_depth, 1, &r->armed, &r->cq, &r->qp);
        if (s == KVR_OK && ve->efd >= 0) {
            ibv_req_notify_cq(r->cq, 0);
            r->armed = true;
        }
        if (s != KVR_OK)
            goto err_rails;
        r->psn = kvr_verbs_rand32() & 0xffffff;
        struct vb_wire_rail *w = &req->rail[i];
        w->dev = (uint32_t)i;
        w->qpn = r->qp->qp_num;
        w->psn = r->psn;
        w->mtu = (uint32_t)ve->dev[i].mtu;
        w->rd_atom = ve->dev[i].rd_atom;
        w->lid = ve->dev[i].lid;
        memcpy(w->gid, ve->dev[i].gid.raw, 16);
    }
    vp->nbuf = aligned_alloc(4096, (size_t)VB_NOTIF_SLOTS * VB_NOTIF_BUF);
    if (!vp->nbuf) {
        s = KVR_ERR_NO_MEMORY;
        goto err_rails;
    }
    for (int i = 0; i < vp->nrails; i++) { /* notifications may go on any rail */
        vp->nmr[i] = ibv_reg_mr(ve->dev[vp->rail[i].ldev].pd, vp->nbuf,
                                (size_t)VB_NOTIF_SLOTS * VB_NOTIF_BUF, IBV_ACCESS_LOCAL_WRITE);
        if (!vp->nmr[i]) {
            s = kvr_verbs_status(-1, errno);
            goto err_mr;
        }
    }
    for (int i = 0; i < VB_NOTIF_SLOTS; i++)
        vp->nodes[i].item.kind = VB_ITEM_NOTIF;
    /* side channel: try the addresses in order */
    for (int i = 0; i < a->nip && vp->fd < 0; i++)
        vp->fd = kvr_verbs_tcp_connect(a->ip[i], a->tcp_port, VB_TCP_TIMEOUT);
    if (vp->fd < 0) {
        KVR_LOG_ERROR(COMP,
                      "%s: connect: side channel to %.64s (port %u, %u addresses, first "
                      "%u.%u.%u.%u) refused or unreachable: is the target alive?",
                      en, vp->remote.host, a->tcp_port, a->nip, a->ip[0][0], a->ip[0][1],
                      a->ip[0][2], a->ip[0][3]);
        s = KVR_ERR_PEER_FAILURE;
        goto err_mr;
    }
    if (kvr_verbs_send_all(vp->fd, req, sizeof(*req), VB_TCP_TIMEOUT) != 0) {
        KVR_LOG_ERROR(COMP, "%s: connect: sending the handshake to %.64s: %s", en, vp->remote.host,
                      strerror(errno));
        s = KVR_ERR_PEER_FAILURE;
        goto err_fd;
    }
    free(req);
    vb_efd_add(ve, vp->fd);
    vp->state = VB_CONNECTING;
    vp->hs_deadline = kvr_deadline_ns(VB_HS_TIMEOUT_MS);
    vb_peer_transports(vp, "connecting");
    vp->next = ve->peers;
    ve->peers = vp;
    return KVR_OK;

err_fd:
    close(vp->fd);
    vp->fd = -1;
err_mr:
    for (int i = 0; i < vp->nrails; i++) {
        if (vp->nmr[i])
            ibv_dereg_mr(vp->nmr[i]);
        vp->nmr[i] = NULL;
    }
    free(vp->nbuf);
    vp->nbuf = NULL;
err_rails:
    for (int i = 0; i < vp->nrails; i++)
        vb_rail_fini(&vp->rail[i]);
    free(req);
    return s;
}

/* the reply of the target arrived: bring our QPs to RTS */
static void vb_peer_ready(struct vb_peer *vp)
{
    struct vb_engine *ve = ENG(vp->base.engine);
    struct vb_hs *rp = &vp->reply;
    char why[256];
    if (rp->magic != VB_HS_MAGIC || rp->version != VB_HS_VERSION) {
        vb_peer_failed(vp, KVR_ERR_VERSION, NULL, "handshake reply of another version");
        return;
    }
    if (rp->status != KVR_OK) {
        rp->why[sizeof(rp->why) - 1] = 0;
        snprintf(why, sizeof(why), "target %.64s refused the connection: %s", vp->remote.host,
                 rp->why);
        vb_peer_failed(vp, (kvr_status_t)rp->status, NULL, why);
        return;
    }
    if ((int)rp->nrails != vp->nrails) {
        vb_peer_failed(vp, KVR_ERR_INVALID, NULL, "handshake reply with another rail count");
        return;
    }
    for (int i = 0; i < vp->nrails; i++) {
        struct vb_rail *r = &vp->rail[i];
        const struct vb_wire_rail *w = &rp->rail[i];
        kvr_status_t s = kvr_verbs_qp_connect(ve, r->ldev, r->qp, w, w->mtu, r->psn, w->rd_atom);
        if (s != KVR_OK) {
            vb_peer_failed(vp, s, NULL, "QP to RTS failed");
            return;
        }
        if (i == 0 || w->mtu < vp->mtu) /* shown: the smallest path MTU of the rails */
            vp->mtu = w->mtu;
    }
    vp->state = VB_READY;
    char st[64];
    snprintf(st, sizeof(st), "mtu %s", kvr_verbs_mtu_str((enum ibv_mtu)vp->mtu));
    vb_peer_transports(vp, st);
    KVR_LOG_INFO(COMP, "%s: connected to %.64s over %s", vp->base.engine->name, vp->remote.host,
                 vp->base.transports);
    for (int i = 0; i < vp->nrails; i++)
        vb_rail_kick(&vp->rail[i]);
}

static void vb_disconnect(kvr_xfer_peer_t *p)
{
    struct vb_engine *ve = ENG(p->engine);
    struct vb_peer *vp = PEER(p);
    vb_peer_unlink(ve, vp);
    if (vp->fd >= 0)
        close(vp->fd);
    vp->fd = -1;
    if (vp->nrails > 1) { /* per-rail telemetry, once per connection */
        char line[256];
        size_t used = 0;
        for (int i = 0; i < vp->nrails; i++) {
            const struct vb_rail *r = &vp->rail[i];
            int w = snprintf(line + used, sizeof(line) - used, "%s%s: %.1f MiB%s%s", i ? ", " : "",
                             ve->dev[r->ldev].name, (double)r->bytes / 1048576.0,
                             r->failovers ? ", failed over" : "", r->down ? " (down)" : "");
            if (w > 0 && (size_t)w < sizeof(line) - used)
                used += (size_t)w;
        }
        KVR_LOG_INFO(COMP, "%s: rails to %.64s: %s", ve->base.name, vp->remote.host, line);
    }
    for (int i = 0; i < vp->nrails; i++)
        vb_rail_fini(&vp->rail[i]);
    for (int i = 0; i < vp->nrails; i++)
        if (vp->nmr[i])
            ibv_dereg_mr(vp->nmr[i]);
    free(vp->nbuf);
}

static bool vb_peer_idle(kvr_xfer_peer_t *p)
{
    struct vb_peer *vp = PEER(p);
    if (vp->state == VB_FAILED)
        return true;
    for (int i = 0; i < vp->nrails; i++)
        if (vp->rail[i].head || vp->rail[i].done != vp->rail[i].posted)
            return false;
    return true;
}

/* ------------------------------------------------------------------------ */
/* descriptor lists                                                          */

static kvr_status_t vb_dlist_prepare(kvr_xfer_dlist_t *d)
{
    struct vb_dlist *vd = DLIST(d);
    struct vb_peer *vp = PEER(d->peer);
    struct vb_engine *ve = ENG(d->peer->engine);
    int nr = vp->nrails;
    uint64_t piece = VB_MAX_WR_LEN;
    for (int i = 0; i < nr; i++)
        if (ve->dev[vp->rail[i].ldev].max_msg < piece)
            piece = ve->dev[vp->rail[i].ldev].max_msg;
    if (nr > 1 && piece > VB_STRIPE_PIECE)
        piece = VB_STRIPE_PIECE;
    /* count pieces, assign them to rails by bytes per weight */
    uint64_t load[VB_MAX_DEV] = {0};
    uint32_t cnt[VB_MAX_DEV] = {0};
    size_t total = 0;
    for (size_t k = 0; k < d->nseg; k++)
        total += (size_t)((d->segs[k].len + piece - 1) / piece);
    uint8_t *owner = malloc(total ? total : 1);
    if (!owner)
        return KVR_ERR_NO_MEMORY;
    size_t q = 0;
    for (size_t k = 0; k < d->nseg; k++)
        for (uint64_t off = 0; off < d->segs[k].len; off += piece) {
            uint64_t len = d->segs[k].len - off < piece ? d->segs[k].len - off : piece;
            int best = 0;
            for (int i = 1; i < nr; i++)
                if ((double)(load[i] + len) / vp->rail[i].weight <
                    (double)(load[best] + len) / vp->rail[best].weight)
                    best = i;
            load[best] += len;
            cnt[best]++;
            owner[q++] = (uint8_t)best;
        }
    vd->mem = calloc(total ? total : 1,
                     sizeof(struct ibv_send_wr) + sizeof(struct ibv_sge) + sizeof(struct vb_wref));
    if (!vd->mem) {
        free(owner);
        return KVR_ERR_NO_MEMORY;
    }
    struct ibv_send_wr *wr = vd->mem;
    struct ibv_sge *sge = (struct ibv_sge *)(wr + total);
    struct vb_wref *ref = (struct vb_wref *)(sge + total);
    size_t base = 0;
    vd->nparts = nr;
    for (int i = 0; i < nr; i++) {
        struct vb_part *pt = &vd->part[i];
        pt->item.kind = VB_ITEM_PART;
        pt->dl = vd;
        pt->wr = wr + base;
        pt->sge = sge + base;
        pt->ref = ref + base;
        pt->rail = i;
        base += cnt[i];
        cnt[i] = 0; /* refilled below */
    }
    enum ibv_wr_opcode opc = d->op == KVR_XFER_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    q = 0;
    for (size_t k = 0; k < d->nseg; k++) {
        const struct kvr_xfer_seg *sg = &d->segs[k];
        for (uint64_t off = 0; off < sg->len; off += piece) {
            uint64_t len = sg->len - off < piece ? sg->len - off : piece;
            int ri = owner[q++];
            struct vb_part *pt = &vd->part[ri];
            struct vb_rail *r = &vp->rail[ri];
            uint32_t j = cnt[ri]++;
            struct ibv_sge *s = &pt->sge[j];
            s->addr = (uintptr_t)sg->laddr + off;
            s->length = (uint32_t)len;
            s->lkey = MEM(sg->lmem)->mr[r->ldev]->lkey;
            struct ibv_send_wr *w = &pt->wr[j];
            w->sg_list = s;
            w->num_sge = 1;
            w->opcode = opc;
            w->wr.rdma.remote_addr = sg->raddr + off;
            w->wr.rdma.rkey = RMEM(sg->rmem)->rkey[r->rdev];
            w->next = NULL;
            pt->ref[j] = (struct vb_wref){sg->lmem, sg->rmem};
            if (j)
                pt->wr[j - 1].next = w;
        }
    }
    for (int i = 0; i < nr; i++)
        vd->part[i].nwr = cnt[i];
    free(owner);
    return KVR_OK;
}

static void vb_dlist_release(kvr_xfer_dlist_t *d)
{
    struct vb_dlist *vd = DLIST(d);
    struct vb_peer *vp = PEER(d->peer);
    struct vb_engine *ve = ENG(d->peer->engine);
    for (int i = 0; i < vd->nparts; i++) {
        struct vb_rail *r = &vp->rail[vd->part[i].rail]; /* where failover put it */
        if (vd->part[i].item.queued) {                   /* unlink from the FIFO */
            struct vb_item **pp = &r->head, *prev = NULL;
            while (*pp && *pp != &vd->part[i].item) {
                prev = *pp;
                pp = &(*pp)->next;
            }
            if (*pp) {
                *pp = vd->part[i].item.next;
                if (r->tail == &vd->part[i].item)
                    r->tail = prev;
                /* its unposted WRs never will be: no notification waits for them */
                r->enq -= vd->part[i].nwr - vd->part[i].posted;
                for (struct vb_item *it = vp->rail[vp->nr].head; it; it = it->next)
                    if (it->kind == VB_ITEM_NOTIF &&
                        container_of(it, struct vb_notif, item)->fence[r - vp->rail] > r->enq)
                        container_of(it, struct vb_notif, item)->fence[r - vp->rail] = r->enq;
            }
        }
    }
    for (int i = 0; i < vp->nrails; i++) /* any rail may hold its WRs after a failover */
        if (vp->rail[i].slots)
            for (uint32_t k = 0; k < ve->sq_depth; k++)
                if (vp->rail[i].slots[k].dl == vd)
                    vp->rail[i].slots[k].dl = NULL;
    free(vd->mem);
}

static kvr_status_t vb_post(kvr_xfer_dlist_t *d)
{
    struct vb_dlist *vd = DLIST(d);
    struct vb_peer *vp = PEER(d->peer);
    if (vp->state == VB_FAILED)
        return KVR_ERR_PEER_FAILURE;
    vd->err = KVR_OK;
    vd->left = 0;
    for (int i = 0; i < vd->nparts; i++)
        if (vd->part[i].nwr)
            vd->left++;
    for (int i = 0; i < vd->nparts; i++) {
        struct vb_part *pt = &vd->part[i];
        if (!pt->nwr)
            continue;
        int ri = vb_live_rail(vp, i); /* its own rail, or a live one after a failover */
        if (ri < 0)
            return KVR_ERR_PEER_FAILURE; /* (the peer fails with its last rail) */
        if (pt->rail != ri)
            vb_part_rekey(vp, pt, ri);
        struct vb_rail *r = &vp->rail[ri];
        pt->attempts = 0;
        pt->posted = 0;
        r->enq += pt->nwr;
        bool was_empty = r->head == NULL;
        vb_fifo_push(r, &pt->item);
        if (was_empty)
            vb_rail_kick(r);
    }
    return KVR_INPROGRESS;
}

static kvr_status_t vb_notify(kvr_xfer_peer_t *p, const void *msg, size_t len)
{
    struct vb_peer *vp = PEER(p);
    if (vp->state == VB_FAILED)
        return KVR_ERR_PEER_FAILURE;
    /* a free send buffer: wait (bounded) for completions to give one back */
    uint64_t deadline = kvr_deadline_ns(2000);
    while (vp->nb_head - vp->nb_tail >= VB_NOTIF_SLOTS) {
        if (kvr_now_ns() >= deadline || vp->state == VB_FAILED) {
            KVR_LOG_WARN(COMP, "%s: notify: %d notifications to %.64s still unsent",
                         p->engine->name, VB_NOTIF_SLOTS, vp->remote.host);
            return vp->state == VB_FAILED ? KVR_ERR_PEER_FAILURE : KVR_ERR_NO_RESOURCE;
        }
        if (p->engine->ops->progress(p->engine) == 0)
            sched_yield();
    }
    /* back to rail 0, the preferred rail, once a probe brought it back and
     * every notification sent on the other rail was acknowledged (none is
     * then left to send again from there); the fence below orders it after
     * what went before on the other rails, the target's hold-back after the
     * last one it may not have polled yet */
    if (vp->nr != 0 && !vp->rail[0].down && vp->nb_tail == vp->nb_head) {
        KVR_LOG_INFO(COMP, "%s: notifications to %.64s back on rail 0 (from rail %d)",
                     p->engine->name, vp->remote.host, vp->nr);
        vp->nr = 0;
    }
    uint32_t slot = (uint32_t)(vp->nb_head++ % VB_NOTIF_SLOTS);
    if (len)
        memcpy(vp->nbuf + (size_t)slot * VB_NOTIF_BUF, msg, len);
    struct vb_notif *nt = &vp->nodes[slot];
    nt->slot = slot;
    nt->len = (uint32_t)len;
    nt->seq = ++vp->nseq;
    for (int i = 0; i < vp->nrails; i++)
        nt->fence[i] = vp->rail[i].enq;
    struct vb_rail *r = &vp->rail[vp->nr];
    r->enq++;
    bool was_empty = r->head == NULL;
    vb_fifo_push(r, &nt->item);
    if (was_empty)
        vb_rail_kick(r);
    return vp->state == VB_FAILED ? KVR_ERR_PEER_FAILURE : KVR_OK;
}

/* ------------------------------------------------------------------------ */
/* target side: inbound connections                                          */

static void vb_inbound_destroy(struct vb_inbound *in)
{
    for (int i = 0; i < in->nrails; i++) {
        if (in->rail[i].qp)
            ibv_destroy_qp(in->rail[i].qp);
        if (in->rail[i].cq)
            ibv_destroy_cq(in->rail[i].cq);
        if (in->rail[i].rmr)
            ibv_dereg_mr(in->rail[i].rmr);
        free(in->rail[i].rbuf);
    }
    if (in->fd >= 0) {
        if (in->bye)
            (void)!send(in->fd, &in->bye, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        close(in->fd);
    }
    free(in);
}

static int vb_inbound_post_recv(struct vb_inbound *in, int ri, uint32_t i)
{
    struct ibv_sge sge = {.addr = (uintptr_t)(in->rail[ri].rbuf + (size_t)i * VB_NOTIF_BUF),
                          .length = VB_NOTIF_BUF,
                          .lkey = in->rail[ri].rmr->lkey};
    struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    return ibv_post_recv(in->rail[ri].qp, &wr, &bad);
}

/* the inbounds of one initiator connection (its first and its probes' share
 * req.conn) share the sequence number of the last notification delivered */
static void vb_conn_seq_set(struct vb_engine *ve, uint64_t conn, uint32_t seq)
{
    for (struct vb_inbound *o = ve->inbound; o; o = o->next)
        if (o->req.conn == conn)
            o->nseq = seq;
}

/* the request is complete: create the QPs, bring them to RTS, answer */
static void vb_inbound_accept(struct vb_inbound *in)
{
    struct vb_engine *ve = in->eng;
    const char *en = ve->base.name;
    struct vb_hs *rq = &in->req;
    struct vb_hs *rp = calloc(1, sizeof(*rp));
    if (!rp) {
        in->dead = true;
        return;
    }
    rq->who[sizeof(rq->who) - 1] = 0;
    rp->magic = VB_HS_MAGIC;
    rp->version = VB_HS_VERSION;
    snprintf(rp->who, sizeof(rp->who), "%s", ve->who);
    kvr_status_t s = KVR_OK;
    if (rq->magic != VB_HS_MAGIC || rq->version != VB_HS_VERSION) {
        s = KVR_ERR_VERSION;
        snprintf(rp->why, sizeof(rp->why), "handshake version %u, this engine speaks %d",
                 rq->version, VB_HS_VERSION);
    } else if (rq->nonce != ve->nonce) {
        s = KVR_ERR_MISMATCH;
        snprintf(rp->why, sizeof(rp->why), "address blob of another engine (nonce)");
    } else if (!kvr_xfer_token_ok(&ve->base, rq->token)) {
        s = KVR_ERR_MISMATCH;
        snprintf(rp->why, sizeof(rp->why),
                 "no token this engine was given: a peer not introduced to it");
    } else if (rq->nrails == 0 || rq->nrails > (uint32_t)ve->ndev) {
        s = KVR_ERR_INVALID;
        snprintf(rp->why, sizeof(rp->why), "%u rails asked, %d devices here", rq->nrails, ve->ndev);
    }
    for (uint32_t i = 0; s == KVR_OK && i < rq->nrails; i++) {
        const struct vb_wire_rail *w = &rq->rail[i];
        if (w->dev >= (uint32_t)ve->ndev) {
            s = KVR_ERR_INVALID;
            snprintf(rp->why, sizeof(rp->why), "rail %u names device %u", i, w->dev);
            break;
        }
        struct vb_dev *d = &ve->dev[w->dev];
        char why[128];
        if (!kvr_verbs_port_ready(ve, (int)w->dev, why, sizeof(why))) {
            s = KVR_ERR_IO; /* (answered at once: RTR would block for seconds) */
            snprintf(rp->why, sizeof(rp->why), "rail %u: %s", i, why);
            break;
        }
        in->rail[i].dev = (int)w->dev;
        in->nrails = (int)i + 1;
        s = kvr_verbs_qp_create(ve, (int)w->dev, 4, VB_RQ_DEPTH, &in->rail[i].armed,
                                &in->rail[i].cq, &in->rail[i].qp);
        if (s != KVR_OK) {
            snprintf(rp->why, sizeof(rp->why), "creating a QP on %s failed", d->name);
            break;
        }
        if (ve->efd >= 0)
            in->rail[i].armed = ibv_req_notify_cq(in->rail[i].cq, 0) == 0;
        /* receive buffers on every rail: notifications move when a rail fails */
        in->rail[i].rbuf = aligned_alloc(4096, (size_t)VB_RQ_DEPTH * VB_NOTIF_BUF);
        in->rail[i].rmr = in->rail[i].rbuf ? ibv_reg_mr(d->pd, in->rail[i].rbuf,
                                                        (size_t)VB_RQ_DEPTH * VB_NOTIF_BUF,
                                                        IBV_ACCESS_LOCAL_WRITE)
                                           : NULL;
        for (uint32_t k = 0; in->rail[i].rmr && k < VB_RQ_DEPTH; k++)
            if (vb_inbound_post_recv(in, (int)i, k))
                s = KVR_ERR_IO;
        if (!in->rail[i].rmr)
            s = KVR_ERR_NO_MEMORY;
        if (s != KVR_OK) {
            snprintf(rp->why, sizeof(rp->why), "receive buffers on %s failed", d->name);
            break;
        }
        uint32_t mtu = w->mtu < (uint32_t)d->mtu ? w->mtu : (uint32_t)d->mtu;
        uint32_t rd = w->rd_atom < d->rd_atom ? w->rd_atom : d->rd_atom;
        uint32_t psn = kvr_verbs_rand32() & 0xffffff;
        s = kvr_verbs_qp_connect(ve, (int)w->dev, in->rail[i].qp, w, mtu, psn, rd);
        if (s != KVR_OK) {
            snprintf(rp->why, sizeof(rp->why), "QP on %s to RTS failed (mtu %s)", d->name,
                     kvr_verbs_mtu_str((enum ibv_mtu)mtu));
            break;
        }
        struct vb_wire_rail *o = &rp->rail[i];
        o->qpn = in->rail[i].qp->qp_num;
        o->psn = psn;
        o->mtu = mtu;
        o->rd_atom = rd;
        o->lid = d->lid;
        memcpy(o->gid, d->gid.raw, 16);
        if (mtu != (uint32_t)d->mtu || mtu != w->mtu)
            KVR_LOG_INFO(COMP, "%s: path MTU %s (local %s, %.64s %s)", en,
                         kvr_verbs_mtu_str((enum ibv_mtu)mtu), kvr_verbs_mtu_str(d->mtu), rq->who,
                         kvr_verbs_mtu_str((enum ibv_mtu)w->mtu));
    }
    rp->status = s;
    rp->nrails = rq->nrails;
    if (s != KVR_OK)
        KVR_LOG_ERROR(COMP, "%s: refused connection from %.64s: %s", en, rq->who, rp->why);
    if (kvr_verbs_send_all(in->fd, rp, sizeof(*rp), VB_TCP_TIMEOUT) != 0 || s != KVR_OK)
        in->dead = true;
    else {
        in->ready = true;
        for (struct vb_inbound *o = ve->inbound; o; o = o->next) /* a probe's: the sequence */
            if (o != in && o->ready && o->req.conn == rq->conn)
                in->nseq = o->nseq;
        KVR_LOG_DEBUG(COMP, "%s: accepted %.64s (%d rails)", en, rq->who, in->nrails);
    }
    free(rp);
}

/* ------------------------------------------------------------------------ */
/* event fd: an epoll set of the side-channel sockets and the CQ channels    */

/* polls a CQ; when it is empty and an event fd exists, arms it and polls
 * once more (a completion between the poll and the arm raises no event) */
static int vb_cq_poll(struct vb_engine *ve, struct ibv_cq *cq, bool *armed, struct ibv_wc *wc)
{
    int n = ibv_poll_cq(cq, VB_CQ_BATCH, wc);
    if (n == 0 && ve->efd >= 0 && !*armed) {
        ibv_req_notify_cq(cq, 0);
        *armed = true;
        n = ibv_poll_cq(cq, VB_CQ_BATCH, wc);
    }
    return n;
}

static void vb_efd_add(struct vb_engine *ve, int fd)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (ve->efd >= 0 && fd >= 0)
        epoll_ctl(ve->efd, EPOLL_CTL_ADD, fd, &ev);
}

/* reads and acknowledges CQ events: their CQs are disarmed */
static void vb_drain_cq_events(struct vb_engine *ve)
{
    for (int i = 0; i < ve->ndev; i++) {
        struct ibv_cq *cq;
        void *ctx;
        while (ve->dev[i].chan && ibv_get_cq_event(ve->dev[i].chan, &cq, &ctx) == 0) {
            ibv_ack_cq_events(cq, 1);
            *(bool *)ctx = false;
        }
    }
}

static kvr_status_t vb_event_fd(kvr_xfer_engine_t *e, int *fd_p)
{
    struct vb_engine *ve = ENG(e);
    if (ve->efd < 0) {
        ve->efd = epoll_create1(EPOLL_CLOEXEC);
        if (ve->efd < 0)
            return kvr_verbs_status(-1, errno);
        vb_efd_add(ve, ve->lfd);
        for (int i = 0; i < ve->ndev; i++) {
            vb_efd_add(ve, ve->dev[i].chan->fd);
            vb_efd_add(ve, ve->dev[i].ctx->async_fd); /* port events wake a sleeper */
        }
        for (struct vb_peer *vp = ve->peers; vp; vp = vp->next) {
            vb_efd_add(ve, vp->fd);
            for (int i = 0; i < vp->nrails; i++)
                vp->rail[i].armed = ibv_req_notify_cq(vp->rail[i].cq, 0) == 0;
        }
        for (struct vb_inbound *in = ve->inbound; in; in = in->next) {
            vb_efd_add(ve, in->fd);
            for (int i = 0; i < in->nrails; i++)
                if (in->rail[i].cq)
                    in->rail[i].armed = ibv_req_notify_cq(in->rail[i].cq, 0) == 0;
        }
    }
    *fd_p = ve->efd;
    return KVR_OK;
}

/* notification k of rail ri, number seq, is next: delivered, its buffer
 * posted again */
static void vb_inbound_deliver(struct vb_inbound *in, int ri, uint32_t k, uint32_t len,
                               uint32_t seq)
{
    struct vb_engine *ve = in->eng;
    vb_conn_seq_set(ve, in->req.conn, seq);
    /* with the token its side channel presented (checked at accept); none
     * after that token was revoked */
    if (in->revoked)
        kvr_xfer_refused(&ve->base, "a notification under a revoked token");
    else
        kvr_xfer_deliver_notif(&ve->base, in->rail[ri].rbuf + (size_t)k * VB_NOTIF_BUF, len,
                               in->req.token);
    if (vb_inbound_post_recv(in, ri, k))
        in->rail[ri].dead = true;
}

/* notifications arrive on any rail (the initiator moves them off a failed
 * one, sending again those it has no acknowledgement of, and back to rail 0
 * when it returns): delivered in sequence, a repeat dropped, one that came
 * ahead of an earlier one held (the initiator sent the next only after the
 * earlier was acknowledged, so that one is in another rail's CQ, or another
 * inbound's of the connection, not polled yet: vb_held_deliver()).  A
 * completion error on a rail: with one rail the connection is dead ('E'
 * tells the initiator); with several, the rail is (the initiator fails it
 * over), and the connection when all are. */
static int vb_inbound_poll_cq(struct vb_inbound *in)
{
    struct vb_engine *ve = in->eng;
    int total = 0;
    for (int ri = 0; ri < in->nrails; ri++) { /* (also when dead: what arrived before) */
        if (!in->rail[ri].cq || in->rail[ri].dead)
            continue;
        struct ibv_wc wc[VB_CQ_BATCH];
        int n = vb_cq_poll(ve, in->rail[ri].cq, &in->rail[ri].armed, wc);
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) {
                if (!in->rail[ri].dead && wc[i].status != IBV_WC_WR_FLUSH_ERR)
                    KVR_LOG_WARN(COMP, "%s: inbound %.64s rail %d (%s): %s", ve->base.name,
                                 in->req.who, ri, ve->dev[in->rail[ri].dev].name,
                                 ibv_wc_status_str(wc[i].status));
                in->rail[ri].dead = true;
                continue;
            }
            if (!(wc[i].opcode & IBV_WC_RECV))
                continue;
            uint32_t k = (uint32_t)wc[i].wr_id;
            uint32_t seq = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
            int32_t ahead = (int32_t)(seq - in->nseq);
            if (ahead == 1) {
                vb_inbound_deliver(in, ri, k, wc[i].byte_len, seq);
            } else if (ahead > 1 && in->nheld < VB_MAX_DEV * VB_RQ_DEPTH) {
                in->held[in->nheld++] = (struct vb_held){
                    .seq = seq, .len = wc[i].byte_len, .k = (uint16_t)k, .rail = (uint8_t)ri};
                ve->nheld++;
            } else {
                KVR_LOG_DEBUG(COMP,
                              "%s: notification %u of %.64s again (after a failover): dropped",
                              ve->base.name, seq, in->req.who);
                if (vb_inbound_post_recv(in, ri, k))
                    in->rail[ri].dead = true;
            }
        }
        total += n > 0 ? n : 0;
    }
    int alive = 0;
    for (int ri = 0; ri < in->nrails; ri++)
        alive += !in->rail[ri].dead;
    if (alive == 0 && !in->dead) {
        in->dead = true;
        in->bye = 'E';
    }
    return total;
}

/* held notifications whose turn came, in sequence (a repeat dropped) */
static int vb_held_deliver(struct vb_engine *ve)
{
    int n = 0;
    for (bool more = ve->nheld > 0; more;) {
        more = false;
        for (struct vb_inbound *in = ve->inbound; in; in = in->next)
            for (uint32_t h = 0; h < in->nheld;) {
                struct vb_held x = in->held[h];
                int32_t ahead = (int32_t)(x.seq - in->nseq);
                if (ahead > 1) {
                    h++;
                    continue;
                }
                in->held[h] = in->held[--in->nheld];
                ve->nheld--;
                if (ahead == 1) {
                    vb_inbound_deliver(in, x.rail, x.k, x.len, x.seq);
                    n++;
                    more = true;
                } else if (vb_inbound_post_recv(in, x.rail, x.k)) {
                    in->rail[x.rail].dead = true;
                }
            }
    }
    return n;
}

static int vb_rail_poll(struct vb_rail *r, uint32_t depth);

/* The inbound side channels are bounded: VB_INBOUND_MAX in all, of which
 * VB_HS_PENDING_MAX waiting for their handshake request, each for
 * VB_HS_TIMEOUT_MS at most: a peer that connects and never speaks holds
 * nothing for long, and a flood of them is closed at accept (counted in
 * stats.refused) and never closes an accepted connection. */
static bool vb_inbound_room(struct vb_engine *ve)
{
    unsigned all = 0, pending = 0;
    for (const struct vb_inbound *in = ve->inbound; in; in = in->next) {
        all++;
        pending += !in->ready && !in->dead;
    }
    if (all < VB_INBOUND_MAX && pending < VB_HS_PENDING_MAX)
        return true;
    kvr_xfer_refused(&ve->base, all >= VB_INBOUND_MAX
                                    ? "a side channel beyond the inbound table (VB_INBOUND_MAX)"
                                    : "a side channel while too many wait for their handshake");
    return false;
}

/* side channel: accept, read handshakes, notice EOF (rate-limited) */
static int vb_poll_sockets(struct vb_engine *ve)
{
    int n = 0;
    for (;;) {
        int fd = accept4(ve->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            break;
        if (!vb_inbound_room(ve)) {
            close(fd);
            n++;
            continue;
        }
        struct vb_inbound *in = calloc(1, sizeof(*in));
        if (!in) {
            close(fd);
            break;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        in->fd = fd;
        in->eng = ve;
        in->hs_deadline = kvr_deadline_ns(VB_HS_TIMEOUT_MS);
        vb_efd_add(ve, fd);
        in->next = ve->inbound;
        ve->inbound = in;
        n++;
    }
    for (struct vb_inbound **pp = &ve->inbound; *pp;) {
        struct vb_inbound *in = *pp;
        if (!in->dead) {
            if (!in->ready) {
                int rc = kvr_verbs_recv_some(in->fd, &in->req, &in->rlen, sizeof(in->req));
                if (rc > 0) {
                    vb_inbound_accept(in), n++;
                } else if (rc < 0) {
                    in->dead = true;
                } else if (kvr_now_ns() > in->hs_deadline) {
                    kvr_xfer_refused(&ve->base, "no handshake request within 10 s of connecting");
                    in->dead = true;
                }
            } else {
                char c;
                ssize_t r = recv(in->fd, &c, 1, MSG_DONTWAIT);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    KVR_LOG_INFO(COMP, "%s: initiator %.64s went away", ve->base.name, in->req.who);
                    in->dead = true;
                }
            }
        }
        if (in->dead) {
            if (in->revoked) {
                ve->base.stats.revoked_connections++;
                KVR_LOG_DEBUG(COMP, "%s: %.64s closed: its token was revoked", ve->base.name,
                              in->req.who);
            }
            vb_inbound_poll_cq(in); /* deliver what arrived before (revoked: dropped) */
            vb_held_deliver(ve);
            if (in->nheld)
                KVR_LOG_WARN(COMP,
                             "%s: %.64s went away with %u notification(s) ahead of one that "
                             "never came: dropped",
                             ve->base.name, in->req.who, in->nheld);
            ve->nheld -= in->nheld;
            *pp = in->next;
            vb_inbound_destroy(in);
            n++;
            continue;
        }
        pp = &in->next;
    }
    for (struct vb_peer *vp = ve->peers; vp; vp = vp->next) {
        if (vp->state == VB_CONNECTING) {
            int rc = kvr_verbs_recv_some(vp->fd, &vp->reply, &vp->rlen, sizeof(vp->reply));
            if (rc > 0)
                vb_peer_ready(vp), n++;
            else if (rc < 0)
                vb_peer_failed(vp, KVR_ERR_PEER_FAILURE, NULL,
                               "side channel closed during the handshake");
            else if (kvr_now_ns() > vp->hs_deadline)
                vb_peer_failed(vp, KVR_ERR_TIMEOUT, NULL, "no handshake reply in 10 s");
        } else if (vp->state == VB_READY && vp->fd >= 0) {
            char c = 0;
            ssize_t r = recv(vp->fd, &c, 1, MSG_DONTWAIT);
            if (r >= 0 || (errno != EAGAIN && errno != EINTR)) {
                for (int i = 0; i < vp->nrails && vp->state == VB_READY; i++)
                    n += vb_rail_poll(&vp->rail[i], ve->sq_depth); /* retire what completed */
                vb_peer_failed(vp, KVR_ERR_PEER_FAILURE, NULL,
                               r == 1 && c == 'E'   ? "the target's QP failed (see its log)"
                               : r == 1 && c == 'V' ? "the target revoked the transfer token "
                                                      "this connection was admitted under and "
                                                      "closed it (reconnect with the token it "
                                                      "holds now)"
                                                    : "side channel closed: the target engine "
                                                      "shut down or its process is gone");
            }
        }
    }
    return n;
}

/* the token_revoked op: the side channels admitted under token (and their
 * QPs) are closed on the next progress, 'V' telling the initiator why */
static size_t vb_token_revoked(kvr_xfer_engine_t *base, const uint8_t *token)
{
    size_t n = 0;
    for (struct vb_inbound *in = ENG(base)->inbound; in; in = in->next)
        if (in->ready && !in->dead && kvr_xfer_token_equal(in->req.token, token)) {
            in->revoked = true;
            in->dead = true;
            in->bye = 'V';
            n++;
        }
    return n;
}

static bool vb_handshaking(const struct vb_engine *ve)
{
    for (const struct vb_peer *vp = ve->peers; vp; vp = vp->next)
        if (vp->state == VB_CONNECTING)
            return true;
    for (const struct vb_inbound *in = ve->inbound; in; in = in->next)
        if (!in->ready)
            return true;
    return false;
}

/* true when the side channel closed (the target engine shut down - it closes
 * its inbound QPs and side channels before deregistering anything - or its
 * process died) within timeout_ms; false when the target says its QP failed
 * ('E': our request was bad) or says nothing */
static bool vb_side_closed(struct vb_peer *vp, int timeout_ms)
{
    if (vp->fd < 0)
        return true;
    struct pollfd pf = {.fd = vp->fd, .events = POLLIN};
    if (poll(&pf, 1, timeout_ms) <= 0)
        return false;
    char c = 0;
    ssize_t n = recv(vp->fd, &c, 1, MSG_DONTWAIT);
    if (n == 1)
        return false;
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

/* vb_rail_flush(); a failed post fails the peer */
static void vb_rail_flush_or_fail(struct vb_rail *r, uint32_t depth)
{
    int rc = vb_rail_flush(r, depth);
    if (rc) {
        struct vb_peer *vp = r->peer;
        char why[128];
        snprintf(why, sizeof(why), "ibv_post_send (completion flush) on %s: %s",
                 ENG(vp->base.engine)->dev[r->ldev].name, strerror(rc));
        vb_peer_failed(vp, kvr_verbs_status(-1, rc), NULL, why);
    }
}

static int vb_rail_poll(struct vb_rail *r, uint32_t depth)
{
    struct ibv_wc wc[VB_CQ_BATCH];
    int n = vb_cq_poll(ENG(r->peer->base.engine), r->cq, &r->armed, wc);
    struct vb_peer *vp = r->peer;
    for (int i = 0; i < n && vp->state != VB_FAILED && !r->down; i++) {
        uint64_t seq = wc[i].wr_id;
        if (seq < r->done || seq >= r->posted)
            continue;
        if (wc[i].status == IBV_WC_SUCCESS) {
            vb_retire(r, seq + 1, depth);
            continue;
        }
        /* the rail, not the transfer: the network path or the QP failed */
        bool rail_err = wc[i].status == IBV_WC_RETRY_EXC_ERR ||
                        wc[i].status == IBV_WC_WR_FLUSH_ERR || wc[i].status == IBV_WC_FATAL_ERR ||
                        wc[i].status == IBV_WC_LOC_QP_OP_ERR;
        /* everything before it on an RC QP succeeded - unless it was flushed:
         * unsignaled WRs before a flushed one were flushed too, silently */
        if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
            vb_retire(r, seq, depth);
        struct vb_slot *sl = &r->slots[seq % depth];
        struct vb_dlist *dl = sl->dl;
        kvr_status_t s = kvr_verbs_status((int)wc[i].status, 0);
        /* an access error with the side channel closed: the target went
         * away (a clean shutdown quiesces first and gives no access error) */
        bool gone = wc[i].status == IBV_WC_REM_ACCESS_ERR && vb_side_closed(vp, 0);
        if (gone)
            s = KVR_ERR_PEER_FAILURE;
        char why[256]; /* logged once, by the core's kvr_xfer_peer_fail() */
        struct vb_engine *ve = ENG(vp->base.engine);
        snprintf(why, sizeof(why), "%s on %s QP %u (%s of %.64s): %s%s; that transfer: %s",
                 dl ? (dl->base.op == KVR_XFER_WRITE ? "RDMA WRITE" : "RDMA READ")
                 : sl->kind == VB_ITEM_FLUSH ? "zero-length RDMA WRITE (completion flush)"
                                             : "notification SEND",
                 ve->dev[r->ldev].name, r->qp->qp_num, vp->remote.dev[r->rdev].name,
                 vp->remote.host, ibv_wc_status_str(wc[i].status),
                 gone ? " (the target shut down: its side channel closed)"
                 : wc[i].status == IBV_WC_REM_ACCESS_ERR
                     ? " (bad remote key, or the region was deregistered at the target)"
                     : "",
                 kvr_status_name(s));
        if (rail_err && !gone && !vb_side_closed(vp, 0))
            vb_rail_failover(vp, (int)(r - vp->rail), s, why);
        else
            vb_peer_failed(vp, s, dl, why);
    }
    if (n > 0 && vp->state == VB_READY)
        n += vb_rail_kick(r);
    return n > 0 ? n : 0;
}

/* ------------------------------------------------------------------------ */
/* the way back of a failed rail                                             */

static void vb_probe_fail(struct vb_peer *vp, int ri, const char *why)
{
    struct vb_rail *r = &vp->rail[ri];
    struct vb_engine *ve = ENG(vp->base.engine);
    if (r->pfd >= 0)
        close(r->pfd);
    r->pfd = -1;
    r->probe = VB_PROBE_COOL;
    r->next_ns = kvr_now_ns() + (uint64_t)ve->cooldown_ms * 1000000u;
    KVR_LOG_WARN(COMP, "%s: rail %d (%s) probe failed: %s; the next in %u ms", ve->base.name, ri,
                 ve->dev[r->ldev].name, why, ve->cooldown_ms);
}

/* the cool-down is over: a fresh QP on the rail's device and a one-rail
 * handshake with the target on a new side channel, which the target accepts
 * like any connection (a new inbound QP on the rail's remote device; the
 * side channel stays open until this peer goes) */
static void vb_probe_start(struct vb_peer *vp, int ri)
{
    struct vb_engine *ve = ENG(vp->base.engine);
    struct vb_rail *r = &vp->rail[ri];
    char why[128];
    if (!kvr_verbs_port_ready(ve, r->ldev, why, sizeof(why))) {
        /* no probe while the link is down: it would only block in RTR */
        r->next_ns = kvr_now_ns() + (uint64_t)ve->cooldown_ms * 1000000u;
        if (!r->port_down)
            KVR_LOG_WARN(COMP, "%s: rail %d not probed while %s; checked again every %u ms",
                         ve->base.name, ri, why, ve->cooldown_ms);
        r->port_down = true;
        return;
    }
    r->port_down = false;
    struct ibv_wc wc[VB_CQ_BATCH];
    while (r->cq && ibv_poll_cq(r->cq, VB_CQ_BATCH, wc) > 0) /* the old QP's flushed WRs */
        ;
    if (r->qp)
        ibv_destroy_qp(r->qp);
    if (r->cq)
        ibv_destroy_cq(r->cq);
    r->qp = NULL;
    r->cq = NULL;
    r->armed = false;
    kvr_status_t s = kvr_verbs_qp_create(ve, r->ldev, ve->sq_depth, 1, &r->armed, &r->cq, &r->qp);
    if (s != KVR_OK) {
        vb_probe_fail(vp, ri, "creating a QP failed");
        return;
    }
    if (ve->efd >= 0)
        r->armed = ibv_req_notify_cq(r->cq, 0) == 0;
    r->psn = kvr_verbs_rand32() & 0xffffff;
    struct vb_hs *req = calloc(1, sizeof(*req));
    if (!r->prep)
        r->prep = calloc(1, sizeof(*r->prep));
    if (!req || !r->prep) {
        free(req);
        vb_probe_fail(vp, ri, "out of memory");
        return;
    }
    req->magic = VB_HS_MAGIC;
    req->version = VB_HS_VERSION;
    req->nonce = vp->remote.nonce;
    memcpy(req->token, vp->base.token, sizeof(req->token));
    req->conn = vp->conn; /* its notifications share the connection's sequence */
    req->nrails = 1;
    snprintf(req->who, sizeof(req->who), "%s", ve->who);
    const struct vb_dev *d = &ve->dev[r->ldev];
    struct vb_wire_rail *w = &req->rail[0];
    w->dev = (uint32_t)r->rdev;
    w->qpn = r->qp->qp_num;
    w->psn = r->psn;
    w->mtu = (uint32_t)d->mtu;
    w->rd_atom = d->rd_atom;
    w->lid = d->lid;
    memcpy(w->gid, d->gid.raw, 16);
    const struct vb_wire_addr *a = &vp->remote;
    for (int i = 0; i < a->nip && r->pfd < 0; i++)
        r->pfd = kvr_verbs_tcp_connect(a->ip[i], a->tcp_port, VB_TCP_TIMEOUT);
    int rc = r->pfd < 0 ? -1 : kvr_verbs_send_all(r->pfd, req, sizeof(*req), VB_TCP_TIMEOUT);
    free(req);
    if (rc != 0) {
        vb_probe_fail(vp, ri, "the target's side channel refused or unreachable");
        return;
    }
    r->plen = 0;
    r->probe = VB_PROBE_HANDSHAKE;
    r->next_ns = kvr_deadline_ns(VB_HS_TIMEOUT_MS);
}

/* the handshake's reply: the new QP to RTS, then a signaled zero-length
 * WRITE on it - the probe of the path itself */
static void vb_probe_reply(struct vb_peer *vp, int ri)
{
    struct vb_engine *ve = ENG(vp->base.engine);
    struct vb_rail *r = &vp->rail[ri];
    int rc = kvr_verbs_recv_some(r->pfd, r->prep, &r->plen, sizeof(*r->prep));
    if (rc == 0) {
        if (kvr_now_ns() > r->next_ns)
            vb_probe_fail(vp, ri, "no handshake reply in 10 s");
        return;
    }
    const struct vb_hs *rp = r->prep;
    if (rc < 0 || rp->magic != VB_HS_MAGIC || rp->status != KVR_OK || rp->nrails != 1) {
        vb_probe_fail(vp, ri, rc < 0 ? "side channel closed" : "the target refused the rail");
        return;
    }
    const struct vb_wire_rail *w = &rp->rail[0];
    if (kvr_verbs_qp_connect(ve, r->ldev, r->qp, w, w->mtu, r->psn, w->rd_atom) != KVR_OK) {
        vb_probe_fail(vp, ri, "QP to RTS failed");
        return;
    }
    struct ibv_send_wr wr = {.wr_id = r->posted,
                             .num_sge = 0,
                             .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad = NULL;
    struct vb_slot *sl = &r->slots[r->posted % ve->sq_depth];
    sl->dl = NULL;
    sl->kind = VB_ITEM_FLUSH;
    sl->end = 1;
    if (ibv_post_send(r->qp, &wr, &bad) != 0) {
        vb_probe_fail(vp, ri, "posting the probe WRITE failed");
        return;
    }
    r->probe_seq = r->posted;
    r->posted++;
    r->sig = r->posted;
    r->probe = VB_PROBE_CHECK;
    r->next_ns = kvr_deadline_ns(VB_HS_TIMEOUT_MS);
}

/* a down rail's completions: only the probe's counts */
static int vb_probe_poll(struct vb_peer *vp, int ri)
{
    struct vb_engine *ve = ENG(vp->base.engine);
    struct vb_rail *r = &vp->rail[ri];
    if (r->probe == VB_PROBE_COOL) {
        if (kvr_now_ns() >= r->next_ns)
            vb_probe_start(vp, ri);
        return 0;
    }
    if (r->probe == VB_PROBE_HANDSHAKE) {
        vb_probe_reply(vp, ri);
        return 0;
    }
    struct ibv_wc wc[VB_CQ_BATCH];
    int n = vb_cq_poll(ve, r->cq, &r->armed, wc);
    for (int i = 0; i < n; i++) {
        if (wc[i].wr_id != r->probe_seq)
            continue;
        if (wc[i].status != IBV_WC_SUCCESS) {
            vb_probe_fail(vp, ri, ibv_wc_status_str(wc[i].status));
            return n;
        }
        r->done = r->posted;
        r->done_enq = r->enq;
        r->down = false;
        vb_peer_transports(vp, vp->tstate);
        KVR_LOG_INFO(COMP, "%s: rail %d (%s -> %s of %.64s) is back (transports %s)", ve->base.name,
                     ri, ve->dev[r->ldev].name, vp->remote.dev[r->rdev].name, vp->remote.host,
                     vp->base.transports);
        return n;
    }
    if (n == 0 && kvr_now_ns() > r->next_ns)
        vb_probe_fail(vp, ri, "no completion of the probe WRITE in 10 s");
    return n;
}

/* Port d of this engine went down (IBV_EVENT_PORT_ERR): every live rail on
 * it fails over now, busy or idle, and a probe under way on it starts
 * again after a cool-down.  RC would otherwise retry on it for seconds
 * (retry count x timeout), and soft-RoCE on Linux 6.1 may never complete a
 * WR whose packet the stack dropped on the down netdev (its requester waits
 * for the dropped skb forever: "RDMA/rxe: Get rid of pkt resend on err",
 * linux-rdma, 2024), so no completion would ever say so. */
static void vb_port_lost(struct vb_engine *ve, int d)
{
    char why[128];
    snprintf(why, sizeof(why), "%s:%u went down (IBV_EVENT_PORT_ERR)", ve->dev[d].name,
             ve->dev[d].port);
    for (struct vb_peer *vp = ve->peers; vp; vp = vp->next)
        for (int i = 0; i < vp->nrails && vp->state == VB_READY; i++) {
            struct vb_rail *r = &vp->rail[i];
            if (r->ldev != d)
                continue;
            if (!r->down)
                vb_rail_failover(vp, i, KVR_ERR_PEER_FAILURE, why);
            else if (r->probe != VB_PROBE_COOL)
                vb_probe_fail(vp, i, why);
        }
}

/* The devices' async events, read without blocking and each acknowledged:
 * a port going down fails its rails over (vb_port_lost); a port coming
 * back is logged (its down rails are probed after their cool-down).  The
 * port state comes from these events, not from polling the ports. */
static int vb_async_events(struct vb_engine *ve)
{
    int n = 0;
    for (int d = 0; d < ve->ndev; d++) {
        struct vb_dev *dv = &ve->dev[d];
        struct ibv_async_event ev;
        while (ibv_get_async_event(dv->ctx, &ev) == 0) {
            enum ibv_event_type t = ev.event_type;
            bool port_ev = t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_PORT_ACTIVE ||
                           t == IBV_EVENT_GID_CHANGE || t == IBV_EVENT_LID_CHANGE;
            int port = port_ev ? ev.element.port_num : 0;
            ibv_ack_async_event(&ev);
            n++;
            if (port_ev && port != dv->port)
                continue;
            if (t == IBV_EVENT_PORT_ERR) {
                dv->port_errs++;
                KVR_LOG_WARN(COMP, "%s: %s:%u: port down (async event IBV_EVENT_PORT_ERR)",
                             ve->base.name, dv->name, dv->port);
                vb_port_lost(ve, d);
            } else if (t == IBV_EVENT_PORT_ACTIVE) {
                KVR_LOG_INFO(COMP,
                             "%s: %s:%u: port active again (async event IBV_EVENT_PORT_ACTIVE)",
                             ve->base.name, dv->name, dv->port);
            } else {
                KVR_LOG_DEBUG(COMP, "%s: %s: async event %s", ve->base.name, dv->name,
                              ibv_event_type_str(t));
            }
        }
    }
    return n;
}

static int vb_progress(kvr_xfer_engine_t *e)
{
    struct vb_engine *ve = ENG(e);
    int n = 0;
    if (ve->efd >= 0)
        vb_drain_cq_events(ve);
    /* completions first: what finished before a peer died still counts.  An
     * unsignaled tail left by the last call is flushed before polling (a
     * caller that posts between two calls covers it with its next post
     * instead); with an event fd the caller may sleep, so also after. */
    for (struct vb_peer *vp = ve->peers; vp; vp = vp->next) {
        if (vp->state != VB_READY)
            continue;
        for (int i = 0; i < vp->nrails && vp->state == VB_READY; i++) {
            if (vp->rail[i].down) { /* cooling down or probing */
                n += vb_probe_poll(vp, i);
                continue;
            }
            vb_rail_flush_or_fail(&vp->rail[i], ve->sq_depth);
            n += vb_rail_poll(&vp->rail[i], ve->sq_depth);
            if (ve->efd >= 0 && vp->state == VB_READY && !vp->rail[i].down)
                vb_rail_flush_or_fail(&vp->rail[i], ve->sq_depth);
        }
        if (vp->state == VB_READY && vp->rail[vp->nr].head) /* fenced notifications */
            n += vb_rail_kick(&vp->rail[vp->nr]);
    }
    for (struct vb_inbound *in = ve->inbound; in; in = in->next)
        if (in->ready && !in->dead)
            n += vb_inbound_poll_cq(in);
    if (ve->nheld)
        n += vb_held_deliver(ve);
    uint64_t now = kvr_now_ns();
    if (now - ve->last_poll_ns >= VB_POLL_EVERY_NS || vb_handshaking(ve)) {
        ve->last_poll_ns = now;
        n += vb_async_events(ve);
        n += vb_poll_sockets(ve);
    }
    return n;
}

const struct kvr_xfer_ops kvr_xfer_verbs_ops = {
    .name = "verbs",
    .id = 3,
    .engine_size = sizeof(struct vb_engine),
    .mem_size = sizeof(struct vb_mem),
    .peer_size = sizeof(struct vb_peer),
    .rmem_size = sizeof(struct vb_rmem),
    .dlist_size = sizeof(struct vb_dlist),
    .engine_init = vb_engine_init,
    .engine_fini = vb_engine_fini,
    .address = vb_address,
    .mem_reg = vb_mem_reg,
    .mem_dereg = vb_mem_dereg,
    .mem_pack = vb_mem_pack,
    .connect = vb_connect,
    .disconnect = vb_disconnect,
    .rmem_unpack = vb_rmem_unpack,
    .rmem_release = vb_rmem_release,
    .dlist_prepare = vb_dlist_prepare,
    .dlist_release = vb_dlist_release,
    .post = vb_post,
    .notify = vb_notify,
    .peer_idle = vb_peer_idle,
    .progress = vb_progress,
    .event_fd = vb_event_fd,
    .engine_quiesce = vb_engine_quiesce,
    .peer_rails = vb_peer_rails,
    .token_revoked = vb_token_revoked,
};
