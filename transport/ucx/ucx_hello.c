/*
 * ucx_hello.c - the UCX backend's admission of inbound connections: a
 * target created with require_token accepts an endpoint only once it has
 * presented a token given to kvr_xfer_token_allow, and closes one that
 * does not.
 *
 * UCX 1.13 has no hook on a connection made to a worker address: the
 * target's endpoint is made by UCX's wireup and the target's code first
 * sees it when something arrives on it.  So the initiator's first message
 * on every new endpoint is a HELLO active message (KVR_UCX_AM_HELLO) whose
 * header is the pair's token, and every message it sends (the HELLO and
 * the notifications) asks for a reply endpoint (UCP_AM_SEND_FLAG_REPLY),
 * which names the target's endpoint of that connection.  The target keeps a
 * bounded table of its inbound endpoints (UCX_INBOUND_MAX; KVR_UCX_INBOUND_MAX
 * lowers it, for tests).  Entries not admitted (pending, refused, closed)
 * take at most half of it, so a flood of endpoints without a valid HELLO
 * cannot take the room of admitted ones; with no room, the oldest closed
 * entry is reused, and a valid HELLO may reuse the least recently seen
 * entry admitted under its own token (a peer that reconnected); an entry
 * admitted under a token still allowed is never given up for anyone else's:
 * what comes on a new endpoint then is dropped and counted (stats.refused),
 * its endpoint left to UCX:
 *  - a HELLO with an allowed token admits its endpoint under that token;
 *  - a HELLO without one refuses the endpoint: counted (stats.refused),
 *    nothing from it ever delivered, and closed (ucp_ep_close_nbx, forced)
 *    on the engine's next progress, outside UCX's callback, counted again
 *    (stats.refused_connections).  A BYE active message (KVR_UCX_AM_BYE,
 *    its header says why) goes to the peer just before the close: its
 *    connection fails (KVR_ERR_PEER_FAILURE) even where UCX cannot say that
 *    the endpoint went (shared memory, UCX's error mode none), so an
 *    initiator that was cut off reconnects instead of sending into a closed
 *    endpoint.  A peer reached over TCP or RDMA (UCX's peer error mode)
 *    loses the connection with the close, and with it the puts it would
 *    still make over it;
 *  - anything else first (a notification) is dropped and counted, and the
 *    endpoint has UCX_HELLO_WAIT_MS for its HELLO before it is refused and
 *    closed the same way (not at once: a message still in flight from an
 *    endpoint closed before may come with the address UCX gave a new one);
 *  - a closed endpoint's address is remembered for UCX_CLOSED_KEEP_MS: UCX
 *    1.13 names an endpoint of an unchecked error mode by its address and
 *    hands even a freed one over as the reply endpoint of a stale message.
 *    What comes on it then is dropped, never closed twice; a valid HELLO
 *    there is a new endpoint at that address, and admitted;
 *  - a notification on an admitted endpoint is delivered with the token
 *    the endpoint was admitted under, once its header carries the same
 *    token and that token is still allowed.  The notification callback
 *    gets that token: it binds the notification to its sender;
 *  - kvr_xfer_token_revoke refuses every endpoint admitted under the token
 *    (ucx_token_revoked): closed as above, with a BYE, and counted in
 *    stats.revoked_connections.
 * Without require_token nothing is refused: notifications are delivered
 * with the token in their header.
 *
 * What is left (docs/security.md): an endpoint that never sends an active
 * message is invisible to the target (no UCX 1.13 call lists a worker's
 * endpoints), so a peer holding the target's rkeys can still write where
 * they reach without a HELLO; nothing it writes is announced.  Same-host
 * peers write through shared memory mapped into their own process, which
 * closing an endpoint does not unmap.  An endpoint UCX destroys on its own
 * (its peer gone) may leave a stale entry whose address UCX later reuses:
 * the new endpoint's HELLO replaces it, and a peer that skips the HELLO
 * still needs the old entry's token in its notifications' header.  A new
 * endpoint given a just-closed one's address and sending no HELLO is not
 * closed until that address is forgotten (its messages are dropped).
 */
#include "ucx_internal.h"

#include "kvr_clock.h"
#include "kvr_log.h"

#include <stdlib.h>
#include <string.h>

#define COMP "ucx"

static struct ucx_inbound *inbound_find(struct ucx_engine *e, ucp_ep_h ep)
{
    for (size_t i = 0; i < e->n_in; i++)
        if (e->in[i].ep == ep)
            return &e->in[i];
    return NULL;
}

/* the counts of each state: an entry leaves (uncount) or enters (count) it */
static void inbound_uncount(struct ucx_engine *e, const struct ucx_inbound *in)
{
    e->n_pending -= in->state == UCX_IN_PENDING;
    e->n_admitted -= in->state == UCX_IN_ADMITTED;
    e->n_dead -= in->state == UCX_IN_CLOSED;
}

static void inbound_count(struct ucx_engine *e, const struct ucx_inbound *in)
{
    e->n_pending += in->state == UCX_IN_PENDING;
    e->n_admitted += in->state == UCX_IN_ADMITTED;
    e->n_dead += in->state == UCX_IN_CLOSED;
}

/* moves an entry to state st */
static void inbound_set(struct ucx_engine *e, struct ucx_inbound *in, enum ucx_in_state st)
{
    inbound_uncount(e, in);
    in->state = st;
    inbound_count(e, in);
}

/* the least recently seen entry in state st (admitted: under token), or NULL */
static struct ucx_inbound *inbound_oldest(struct ucx_engine *e, enum ucx_in_state st,
                                          const uint8_t *token)
{
    struct ucx_inbound *o = NULL;
    for (size_t i = 0; i < e->n_in; i++) {
        struct ucx_inbound *in = &e->in[i];
        if (in->state == st && (!token || kvr_xfer_token_equal(in->token, token)) &&
            (!o || in->seen_ns < o->seen_ns))
            o = in;
    }
    return o;
}

/* the entry for ep, made when new: PENDING, or ADMITTED under token (a
 * valid HELLO; NULL: not admitted).  Entries not admitted take at most
 * half of the table; without room the oldest closed entry is reused (its
 * address forgotten), a HELLO may reuse the oldest entry admitted under
 * its own token, and an entry admitted under a token still allowed is
 * never given up: NULL then (counted by the caller's drop) */
static struct ucx_inbound *inbound_get(struct ucx_engine *e, ucp_ep_h ep, const uint8_t *token)
{
    struct ucx_inbound *in = inbound_find(e, ep);
    if (in)
        return in;
    if (!e->in) {
        const char *env = getenv("KVR_UCX_INBOUND_MAX"); /* tests: a small table */
        long v = env ? strtol(env, NULL, 10) : 0;
        e->in_max = v >= 4 && v < UCX_INBOUND_MAX ? (size_t)v : UCX_INBOUND_MAX;
        if (!(e->in = calloc(e->in_max, sizeof(*e->in))))
            return NULL;
    }
    if (e->n_in < e->in_max && (token || e->n_in - e->n_admitted < e->in_max / 2)) {
        in = &e->in[e->n_in++];
    } else if ((in = inbound_oldest(e, UCX_IN_CLOSED, NULL)) ||
               (in = inbound_oldest(e, UCX_IN_REVOKED, NULL)) ||
               (token && (in = inbound_oldest(e, UCX_IN_ADMITTED, token)))) {
        inbound_uncount(e, in);
    } else {
        if (e->full_logged++ % 1000 == 0)
            KVR_LOG_WARN(COMP,
                         "%s: inbound endpoint table full (%zu: %zu admitted, %zu pending their "
                         "HELLO): a new endpoint is not tracked, what it sends is dropped (%llu "
                         "so far)",
                         e->base.name, e->n_in, e->n_admitted, e->n_pending,
                         (unsigned long long)e->full_logged);
        return NULL;
    }
    memset(in, 0, sizeof(*in));
    in->ep = ep;
    in->state = token ? UCX_IN_ADMITTED : UCX_IN_PENDING;
    inbound_count(e, in);
    if (token)
        memcpy(in->token, token, KVR_XFER_TOKEN_LEN);
    in->seen_ns = kvr_now_ns();
    in->deadline_ns = in->seen_ns + UCX_HELLO_WAIT_MS * 1000000ull;
    return in;
}

/* an endpoint of this engine's own peers (UCX matched the inbound
 * connection to it): never closed here */
static bool own_ep(struct ucx_engine *e, ucp_ep_h ep)
{
    for (struct kvr_xfer_link *l = e->base.peers.next; l != &e->base.peers; l = l->next)
        if (container_of(container_of(l, kvr_xfer_peer_t, link), struct ucx_peer, base)->ep == ep)
            return true;
    return false;
}

/* marks an entry refused, to be closed on the next progress (with a BYE
 * saying why: KVR_UCX_BYE_*); false when it is not to be closed (one of
 * this engine's own endpoints, or refused already) */
static bool inbound_refuse(struct ucx_engine *e, struct ucx_inbound *in, uint8_t bye)
{
    in->seen_ns = kvr_now_ns();
    if (in->state == UCX_IN_REFUSED)
        return false; /* closed already, or being closed */
    inbound_set(e, in, UCX_IN_REFUSED);
    in->bye = bye;
    in->close = !own_ep(e, in->ep);
    e->n_close += in->close;
    return in->close;
}

/* refuses the endpoint: counted and logged (kvr_xfer_refused), marked, and
 * closed on the next progress */
static void refuse(struct ucx_engine *e, ucp_ep_h ep, const char *why)
{
    kvr_xfer_refused(&e->base, why);
    struct ucx_inbound *in = ep ? inbound_get(e, ep, NULL) : NULL;
    if (in && inbound_refuse(e, in, KVR_UCX_BYE_REFUSED))
        KVR_LOG_DEBUG(COMP, "%s: endpoint %p refused: %s", e->base.name, (void *)ep, why);
}

/* the endpoint a message came on (the sender asked for a reply endpoint), or NULL */
static ucp_ep_h reply_ep(const ucp_am_recv_param_t *param)
{
    return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
}

/* a message that is dropped without refusing its endpoint (yet): counted */
static void drop(struct ucx_engine *e, const char *why)
{
    kvr_xfer_refused(&e->base, why);
}

ucs_status_t ucx_am_hello_cb(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    (void)data;
    (void)length;
    struct ucx_engine *e = arg;
    ucp_ep_h ep = reply_ep(param);
    const uint8_t *token = header_length == KVR_XFER_TOKEN_LEN ? header : NULL;
    if (!e->base.cfg.require_token)
        return UCS_OK; /* nothing to admit: notifications carry their token */
    if (!ep) {
        drop(e, "a HELLO without a reply endpoint");
        return UCS_OK;
    }
    struct ucx_inbound *in = inbound_find(e, ep);
    bool valid = token && !kvr_xfer_token_is_zero(token) && kvr_xfer_token_allowed(&e->base, token);
    if (in && in->state == UCX_IN_REVOKED && !valid) {
        /* (its endpoint never says HELLO twice: a new one at its address) */
        in->state = UCX_IN_CLOSED; /* forgets the old endpoint's revocation */
        in->seen_ns = kvr_now_ns();
        inbound_count(e, in);
    }
    if (in && (in->state == UCX_IN_REFUSED || (in->state == UCX_IN_CLOSED && !valid))) {
        /* (a closed one's address taken by a new endpoint is admitted by a
         * valid HELLO; an invalid one is dropped: it may be the old one's) */
        drop(e, "a HELLO on an endpoint refused before");
        return UCS_OK;
    }
    if (!valid) {
        refuse(e, ep,
               token && !kvr_xfer_token_is_zero(token)
                   ? "its HELLO presents a token this engine was not given"
                   : "its HELLO presents no token");
        return UCS_OK;
    }
    if (!in && !(in = inbound_get(e, ep, token))) {
        drop(e, "no room in the inbound endpoint table for an admitted one");
        return UCS_OK;
    }
    inbound_set(e, in, UCX_IN_ADMITTED);
    in->seen_ns = kvr_now_ns();
    memcpy(in->token, token, KVR_XFER_TOKEN_LEN);
    e->admitted++;
    KVR_LOG_DEBUG(COMP, "%s: endpoint %p admitted by its HELLO", e->base.name, (void *)ep);
    return UCS_OK;
}

bool ucx_inbound_notif(struct ucx_engine *e, const ucp_am_recv_param_t *param, const void *header,
                       size_t header_length, const uint8_t **token_p)
{
    ucp_ep_h ep = reply_ep(param);
    const uint8_t *token = header_length == KVR_XFER_TOKEN_LEN ? header : NULL;
    *token_p = token;
    if (!e->base.cfg.require_token)
        return true;
    if (!ep) {
        drop(e, "a notification without a reply endpoint");
        return false;
    }
    struct ucx_inbound *in = inbound_find(e, ep);
    if (!in) {
        /* a HELLO is due first: the endpoint has UCX_HELLO_WAIT_MS for it
         * (a message still in flight from an endpoint closed before, whose
         * address UCX gave this one, must not cost the new one its
         * connection) and is closed without it */
        if (!(in = inbound_get(e, ep, NULL))) {
            drop(e, "a notification on a new endpoint, the inbound endpoint table full");
            return false;
        }
    }
    if (in->state == UCX_IN_REVOKED) { /* it is alive: it spoke.  Closed now */
        drop(e, "a notification under a revoked token");
        inbound_refuse(e, in, KVR_UCX_BYE_REVOKED);
        return false;
    }
    if (in->state != UCX_IN_ADMITTED) {
        drop(e, in->state == UCX_IN_PENDING ? "a notification before its endpoint's HELLO"
                                            : "a notification on an endpoint refused before");
        return false;
    }
    in->seen_ns = kvr_now_ns();
    if (!token || !kvr_xfer_token_equal(token, in->token)) {
        drop(e, "a notification under another token than its endpoint's HELLO");
        return false;
    }
    if (!kvr_xfer_token_ok(&e->base, in->token)) /* revoked since: counted there */
        return false;
    *token_p = in->token;
    return true;
}

/* the close is done: the entry is kept a while (UCX_CLOSED_KEEP_MS) as
 * closed, because a message still in flight on the endpoint may yet come
 * with its address (UCX 1.13 names an endpoint of an unchecked error mode
 * by its address, and may hand a freed one over as the reply endpoint):
 * dropped, never closed twice.  A new endpoint UCX makes at that address
 * is admitted by a valid HELLO. */
static void inbound_closed(struct ucx_engine *e, ucp_ep_h ep)
{
    struct ucx_inbound *in = inbound_find(e, ep);
    if (!in || in->state != UCX_IN_REFUSED)
        return;
    inbound_set(e, in, UCX_IN_CLOSED);
    in->seen_ns = kvr_now_ns();
}

/* a forced close that UCX did not finish at once: the entry stays refused
 * (what still arrives on the endpoint is dropped) until it has */
static bool closing_unlink(struct ucx_engine *e, struct ucx_close *c)
{
    for (struct ucx_close **pp = &e->closing; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            return true;
        }
    return false;
}

static void close_cb(void *req, ucs_status_t st, void *user_data)
{
    (void)st;
    struct ucx_close *c = user_data;
    ucp_request_free(req);
    if (!closing_unlink(c->e, c))
        return; /* not ours any more */
    inbound_closed(c->e, c->ep);
    free(c);
}

/* tells the peer why its endpoint is to be closed: its connection fails
 * (ucx_am_bye_cb), even where UCX itself cannot say that the endpoint went
 * (shared memory, error mode none).  The close waits for the send (UCX
 * 1.13 asserts at worker destroy on a wireup message left pending by a
 * forced close right after a send), UCX_BYE_WAIT_MS at most; the request,
 * or NULL when it is done */
static void *bye(struct ucx_engine *e, const struct ucx_inbound *in)
{
    uint8_t why = in->bye;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
    };
    void *req = ucp_am_send_nbx(in->ep, KVR_UCX_AM_BYE, &why, sizeof(why), NULL, 0, &prm);
    if (UCS_PTR_IS_PTR(req))
        return req;
    if (UCS_PTR_IS_ERR(req))
        KVR_LOG_DEBUG(COMP, "%s: BYE to endpoint %p not sent: %s", e->base.name, (void *)in->ep,
                      ucs_status_string(UCS_PTR_STATUS(req)));
    return NULL;
}

int ucx_inbound_progress(struct ucx_engine *e)
{
    int n = 0;
    uint64_t now = 0;
    if ((e->n_pending || e->n_dead) && (now = kvr_now_ns()) >= e->next_scan_ns) {
        e->next_scan_ns = now + UCX_INBOUND_SCAN_MS * 1000000ull;
        for (size_t i = 0; i < e->n_in; i++) {
            struct ucx_inbound *in = &e->in[i];
            if (in->state == UCX_IN_PENDING && now >= in->deadline_ns) {
                refuse(e, in->ep, "no HELLO in time after its first message");
            } else if (in->state == UCX_IN_CLOSED &&
                       now - in->seen_ns >= UCX_CLOSED_KEEP_MS * 1000000ull) {
                inbound_uncount(e, in);
                *in = e->in[--e->n_in];
                i--; /* the last entry moved here */
            }
        }
    }
    if (!e->n_close)
        return 0;
    size_t waiting = 0; /* for their BYE to leave */
    now = kvr_now_ns();
    for (size_t i = 0; i < e->n_in; i++) {
        struct ucx_inbound *in = &e->in[i];
        if (!in->close)
            continue;
        if (!in->bye_sent) { /* this round the BYE (revoked), a later one the close */
            in->bye_sent = true;
            in->bye_req = in->bye == KVR_UCX_BYE_REVOKED ? bye(e, in) : NULL;
            in->bye_by = now + UCX_BYE_WAIT_MS * 1000000ull;
            waiting++;
            continue;
        }
        if (in->bye_req) {
            if (ucp_request_check_status(in->bye_req) == UCS_INPROGRESS && now < in->bye_by) {
                waiting++;
                continue;
            }
            ucp_request_free(in->bye_req); /* (the forced close ends it) */
            in->bye_req = NULL;
        }
        in->close = false;
        struct ucx_close *c = malloc(sizeof(*c));
        if (!c)
            continue; /* refused all the same; not closed */
        c->e = e;
        c->ep = in->ep;
        ucp_request_param_t prm = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .flags = UCP_EP_CLOSE_FLAG_FORCE,
            .cb.send = close_cb,
            .user_data = c,
        };
        if (in->bye == KVR_UCX_BYE_REVOKED)
            e->base.stats.revoked_connections++;
        else
            e->base.stats.refused_connections++;
        n++;
        KVR_LOG_DEBUG(COMP, "%s: endpoint %p closed (%s)", e->base.name, (void *)c->ep,
                      in->bye == KVR_UCX_BYE_REVOKED ? "its token revoked" : "refused");
        /* linked first: UCX may run the callback before it returns */
        c->next = e->closing;
        e->closing = c;
        void *req = ucp_ep_close_nbx(c->ep, &prm);
        if (UCS_PTR_IS_PTR(req))
            continue;               /* close_cb ends it */
        if (closing_unlink(e, c)) { /* done at once, without the callback */
            inbound_closed(e, c->ep);
            free(c);
        }
    }
    e->n_close = waiting;
    return n + (int)waiting;
}

/* The endpoints admitted under the token are refused, and closed (with a
 * BYE) at their next message, not at once: UCX 1.13 destroys an inbound
 * endpoint on its own when its peer closes it, with no callback, so an
 * entry may name a freed endpoint, and one that has just spoken is the
 * only one known alive (a peer that reconnected with its new token has
 * already left its old endpoint).  What comes on one is dropped; a valid
 * HELLO at its address is a new endpoint, admitted. */
size_t ucx_token_revoked(kvr_xfer_engine_t *base, const uint8_t *token)
{
    struct ucx_engine *e = ue(base);
    size_t n = 0;
    for (size_t i = 0; i < e->n_in; i++) {
        struct ucx_inbound *in = &e->in[i];
        if (in->state == UCX_IN_ADMITTED && kvr_xfer_token_equal(in->token, token)) {
            inbound_set(e, in, UCX_IN_REVOKED);
            n++;
        }
    }
    return n;
}

ucs_status_t ucx_am_bye_cb(void *arg, const void *header, size_t header_length, void *data,
                           size_t length, const ucp_am_recv_param_t *param)
{
    (void)data;
    (void)length;
    struct ucx_engine *e = arg;
    ucp_ep_h ep = reply_ep(param);
    uint8_t why = header_length == 1 ? *(const uint8_t *)header : 0;
    for (struct kvr_xfer_link *l = e->base.peers.next; ep && l != &e->base.peers; l = l->next) {
        struct ucx_peer *p = up(container_of(l, kvr_xfer_peer_t, link));
        if (p->ep != ep || p->base.status != KVR_OK)
            continue;
        p->said_bye = true;
        ucx_peer_failed(p, KVR_ERR_PEER_FAILURE,
                        why == KVR_UCX_BYE_REVOKED
                            ? "the target revoked the transfer token this connection was admitted "
                              "under and closed it (reconnect with the token it holds now)"
                            : "the target refused this connection: its HELLO presented no token "
                              "the target was given, or came too late (see the target's log)");
    }
    return UCS_OK;
}

/* after the worker is destroyed: no callback runs any more */
void ucx_inbound_fini(struct ucx_engine *e)
{
    while (e->closing) {
        struct ucx_close *c = e->closing;
        e->closing = c->next;
        free(c);
    }
    free(e->in);
    e->in = NULL;
    e->n_in = 0;
}
