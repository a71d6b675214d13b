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
 * bounded table of its inbound endpoints (UCX_INBOUND_MAX, the least
 * recently seen one reused when full):
 *  - a HELLO with an allowed token admits its endpoint under that token;
 *  - a HELLO without one refuses the endpoint: counted (stats.refused),
 *    nothing from it ever delivered, and closed (ucp_ep_close_nbx, forced)
 *    on the engine's next progress, outside UCX's callback, counted again
 *    (stats.refused_connections).  A peer reached over TCP or RDMA (UCX's
 *    peer error mode) loses the connection, and with it the puts it would
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
 *    token and that token is still allowed (kvr_xfer_token_revoke stops
 *    it).  The notification callback gets that token: it binds the
 *    notification to its sender.
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

static bool token_zero(const uint8_t *t)
{
    uint8_t acc = 0;
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        acc |= t[i];
    return acc == 0;
}

static bool token_same(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

static struct ucx_inbound *inbound_find(struct ucx_engine *e, ucp_ep_h ep)
{
    for (size_t i = 0; i < e->n_in; i++)
        if (e->in[i].ep == ep)
            return &e->in[i];
    return NULL;
}

/* the entry for ep, made (or the least recently seen one reused) when new */
static struct ucx_inbound *inbound_get(struct ucx_engine *e, ucp_ep_h ep)
{
    struct ucx_inbound *in = inbound_find(e, ep);
    if (in)
        return in;
    if (!e->in && !(e->in = calloc(UCX_INBOUND_MAX, sizeof(*e->in))))
        return NULL;
    if (e->n_in < UCX_INBOUND_MAX) {
        in = &e->in[e->n_in++];
    } else {
        in = &e->in[0];
        for (size_t i = 1; i < e->n_in; i++)
            if (e->in[i].seen_ns < in->seen_ns)
                in = &e->in[i];
        if (in->state == UCX_IN_PENDING)
            e->n_pending--;
        if (in->state == UCX_IN_CLOSED)
            e->n_dead--;
        KVR_LOG_WARN(COMP, "%s: %d inbound endpoints known: the least recently seen one forgotten",
                     e->base.name, UCX_INBOUND_MAX);
    }
    memset(in, 0, sizeof(*in));
    in->ep = ep;
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

/* refuses the endpoint: counted and logged (kvr_xfer_refused), marked, and
 * closed on the next progress */
static void refuse(struct ucx_engine *e, ucp_ep_h ep, const char *why)
{
    kvr_xfer_refused(&e->base, why);
    if (!ep)
        return;
    struct ucx_inbound *in = inbound_get(e, ep);
    if (!in)
        return;
    in->seen_ns = kvr_now_ns();
    if (in->state == UCX_IN_REFUSED)
        return; /* closed already, or being closed */
    if (in->state == UCX_IN_PENDING)
        e->n_pending--;
    in->state = UCX_IN_REFUSED;
    in->close = !own_ep(e, ep);
    e->n_close += in->close;
    KVR_LOG_DEBUG(COMP, "%s: endpoint %p refused: %s", e->base.name, (void *)ep, why);
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
    ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    const uint8_t *token = header_length == KVR_XFER_TOKEN_LEN ? header : NULL;
    if (!e->base.cfg.require_token)
        return UCS_OK; /* nothing to admit: notifications carry their token */
    if (!ep) {
        drop(e, "a HELLO without a reply endpoint");
        return UCS_OK;
    }
    struct ucx_inbound *in = inbound_find(e, ep);
    bool valid = token && !token_zero(token) && kvr_xfer_token_allowed(&e->base, token);
    if (in && (in->state == UCX_IN_REFUSED || (in->state == UCX_IN_CLOSED && !valid))) {
        /* (a closed one's address taken by a new endpoint is admitted by a
         * valid HELLO; an invalid one is dropped: it may be the old one's) */
        drop(e, "a HELLO on an endpoint refused before");
        return UCS_OK;
    }
    if (!valid) {
        refuse(e, ep,
               token && !token_zero(token) ? "its HELLO presents a token this engine was not given"
                                           : "its HELLO presents no token");
        return UCS_OK;
    }
    if (!in && !(in = inbound_get(e, ep))) {
        drop(e, "no memory for the inbound endpoint table");
        return UCS_OK;
    }
    if (in->state == UCX_IN_PENDING)
        e->n_pending--;
    if (in->state == UCX_IN_CLOSED)
        e->n_dead--;
    in->state = UCX_IN_ADMITTED;
    in->seen_ns = kvr_now_ns();
    memcpy(in->token, token, KVR_XFER_TOKEN_LEN);
    e->admitted++;
    KVR_LOG_DEBUG(COMP, "%s: endpoint %p admitted by its HELLO", e->base.name, (void *)ep);
    return UCS_OK;
}

bool ucx_inbound_notif(struct ucx_engine *e, const ucp_am_recv_param_t *param, const void *header,
                       size_t header_length, const uint8_t **token_p)
{
    ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
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
        if (!(in = inbound_get(e, ep))) {
            drop(e, "no memory for the inbound endpoint table");
            return false;
        }
        in->state = UCX_IN_PENDING;
        in->seen_ns = kvr_now_ns();
        in->deadline_ns = in->seen_ns + UCX_HELLO_WAIT_MS * 1000000ull;
        e->n_pending++;
    }
    if (in->state != UCX_IN_ADMITTED) {
        drop(e, in->state == UCX_IN_PENDING ? "a notification before its endpoint's HELLO"
                                            : "a notification on an endpoint refused before");
        return false;
    }
    in->seen_ns = kvr_now_ns();
    if (!token || !token_same(token, in->token)) {
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
    in->state = UCX_IN_CLOSED;
    in->seen_ns = kvr_now_ns();
    e->n_dead++;
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
                e->n_dead--;
                *in = e->in[--e->n_in];
                i--; /* the last entry moved here */
            }
        }
    }
    if (!e->n_close)
        return 0;
    e->n_close = 0;
    for (size_t i = 0; i < e->n_in; i++) {
        struct ucx_inbound *in = &e->in[i];
        if (!in->close)
            continue;
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
        e->base.stats.refused_connections++;
        n++;
        KVR_LOG_DEBUG(COMP, "%s: endpoint %p closed", e->base.name, (void *)c->ep);
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
    return n;
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
