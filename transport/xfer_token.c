/*
 * xfer_token.c - per-pair tokens: which peers a target engine accepts.
 *
 * The party that introduces an initiator to a target (the router, when it
 * first sends a prefill node a decode node's address) makes a random token
 * for the pair, gives it to the target (kvr_xfer_token_allow) and to the
 * initiator with the address (kvr_xfer_connect_token).  The initiator
 * presents it where the target can check it: verbs in the side-channel
 * handshake (the target refuses the connection), UCX in the HELLO that is
 * a new endpoint's first message (the target closes an endpoint without
 * one, ucx/ucx_hello.c) and in the header of every notification, loop and
 * cuda_ipc with every notification.  Every notification is delivered with
 * the token it came under (kvr_xfer_notif_cb_t), so the receiver can bind
 * it to the peer it gave that token to.  A target created with
 * require_token refuses what comes without an allowed token and counts it
 * (stats.refused, logged); without require_token tokens are carried and
 * not checked.  Revoking a token stops it for new connections and
 * notifications, and the backend closes the inbound connections admitted
 * under it (the token_revoked op: UCX's endpoints, verbs' side channels and
 * their QPs) on its next progress, counted in stats.revoked_connections;
 * the revocation is logged once, naming the peer the token was given to
 * (kvr_xfer_token_allow_for).  loop and cuda_ipc keep no inbound
 * connection: each notification is checked as it comes.  The table is a
 * small array, bounded (KVR_XFER_TOKENS_MAX): allow and revoke are rare
 * (one per pair), the check is one scan.  Tokens are secrets: compared
 * without an early exit (kvr_xfer_token_equal).
 */
#include "xfer_backend.h"

#include "kvr_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "xfer"

bool kvr_xfer_token_is_zero(const uint8_t *t)
{
    uint8_t acc = 0;
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        acc |= t[i];
    return acc == 0;
}

/* compares without an early exit: a token is checked against the secrets
 * held here, and the time taken must not say how much of it matched */
bool kvr_xfer_token_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

static ssize_t find(const kvr_xfer_engine_t *e, const uint8_t *t)
{
    for (size_t i = 0; i < e->ntokens; i++)
        if (kvr_xfer_token_equal(e->tokens[i], t))
            return (ssize_t)i;
    return -1;
}

static void owner_set(kvr_xfer_engine_t *e, size_t i, const char *owner)
{
    snprintf(e->owners[i], sizeof(e->owners[i]), "%s", owner ? owner : "");
}

kvr_status_t kvr_xfer_token_allow_for(kvr_xfer_engine_t *e, const uint8_t token[KVR_XFER_TOKEN_LEN],
                                      const char *owner)
{
    if (!e || !token || kvr_xfer_token_is_zero(token))
        return KVR_ERR_INVALID;
    ssize_t at = find(e, token);
    if (at >= 0) {
        if (owner && owner[0])
            owner_set(e, (size_t)at, owner);
        return KVR_OK;
    }
    if (e->ntokens >= KVR_XFER_TOKENS_MAX) {
        KVR_LOG_ERROR(COMP, "%s: token_allow: %d tokens held already; revoke those of peers gone",
                      e->name, KVR_XFER_TOKENS_MAX);
        return KVR_ERR_NO_RESOURCE;
    }
    if (!e->tokens) {
        e->tokens = calloc(KVR_XFER_TOKENS_MAX, sizeof(*e->tokens));
        e->owners = calloc(KVR_XFER_TOKENS_MAX, sizeof(*e->owners));
        if (!e->tokens || !e->owners) {
            kvr_xfer_tokens_free(e);
            return KVR_ERR_NO_MEMORY;
        }
    }
    memcpy(e->tokens[e->ntokens], token, KVR_XFER_TOKEN_LEN);
    owner_set(e, e->ntokens++, owner);
    return KVR_OK;
}

kvr_status_t kvr_xfer_token_allow(kvr_xfer_engine_t *e, const uint8_t token[KVR_XFER_TOKEN_LEN])
{
    return kvr_xfer_token_allow_for(e, token, NULL);
}

void kvr_xfer_token_revoke(kvr_xfer_engine_t *e, const uint8_t token[KVR_XFER_TOKEN_LEN])
{
    if (!e || !token)
        return;
    ssize_t i = find(e, token);
    if (i < 0)
        return;
    char owner[KVR_XFER_OWNER_MAX];
    memcpy(owner, e->owners[i], sizeof(owner));
    size_t last = --e->ntokens;
    memcpy(e->tokens[i], e->tokens[last], KVR_XFER_TOKEN_LEN);
    memcpy(e->owners[i], e->owners[last], sizeof(owner));
    /* the connections admitted under it: closed on the next progress */
    size_t n = e->ops->token_revoked ? e->ops->token_revoked(e, token) : 0;
    const char *who = owner[0] ? owner : "a peer not named at allow (kvr_xfer_token_allow_for)";
    if (n)
        KVR_LOG_WARN(COMP,
                     "%s: transfer token of %s revoked: the %zu inbound connection(s) admitted "
                     "under it are refused and closed (UCX: at their next message)",
                     e->name, who, n);
    else
        KVR_LOG_DEBUG(COMP, "%s: transfer token of %s revoked (no connection admitted under it)",
                      e->name, who);
}

bool kvr_xfer_token_allowed(const kvr_xfer_engine_t *e, const uint8_t *token)
{
    return token && !kvr_xfer_token_is_zero(token) && find(e, token) >= 0;
}

void kvr_xfer_refused(kvr_xfer_engine_t *e, const char *why)
{
    if (e->stats.refused++ % 1000 == 0)
        KVR_LOG_WARN(COMP, "%s: refused a peer: %s (%llu refused so far)", e->name, why,
                     (unsigned long long)e->stats.refused);
}

bool kvr_xfer_token_ok(kvr_xfer_engine_t *e, const uint8_t *token)
{
    if (!e->cfg.require_token)
        return true;
    if (token && !kvr_xfer_token_is_zero(token) && find(e, token) >= 0)
        return true;
    if (e->stats.refused++ % 1000 == 0)
        KVR_LOG_WARN(COMP,
                     "%s: refused a peer %s (%llu refused so far): only peers introduced with "
                     "a token (kvr_xfer_token_allow) are accepted",
                     e->name,
                     token && !kvr_xfer_token_is_zero(token) ? "with an unknown token"
                                                             : "without a token",
                     (unsigned long long)e->stats.refused);
    return false;
}

void kvr_xfer_tokens_free(kvr_xfer_engine_t *e)
{
    free(e->tokens);
    free(e->owners);
    e->tokens = NULL;
    e->owners = NULL;
    e->ntokens = 0;
}
