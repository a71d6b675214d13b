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
 * not checked.  The table is a small array, bounded (KVR_XFER_TOKENS_MAX):
 * allow and revoke are rare (one per pair), the check is one scan.
 */
#include "xfer_backend.h"

#include "kvr_log.h"

#include <stdlib.h>
#include <string.h>

#define COMP "xfer"

static bool zero(const uint8_t *t)
{
    uint8_t acc = 0;
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        acc |= t[i];
    return acc == 0;
}

/* compares without an early exit */
static bool same(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (int i = 0; i < KVR_XFER_TOKEN_LEN; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

static ssize_t find(const kvr_xfer_engine_t *e, const uint8_t *t)
{
    for (size_t i = 0; i < e->ntokens; i++)
        if (same(e->tokens[i], t))
            return (ssize_t)i;
    return -1;
}

kvr_status_t kvr_xfer_token_allow(kvr_xfer_engine_t *e, const uint8_t token[KVR_XFER_TOKEN_LEN])
{
    if (!e || !token || zero(token))
        return KVR_ERR_INVALID;
    if (find(e, token) >= 0)
        return KVR_OK;
    if (e->ntokens >= KVR_XFER_TOKENS_MAX) {
        KVR_LOG_ERROR(COMP, "%s: token_allow: %d tokens held already; revoke those of peers gone",
                      e->name, KVR_XFER_TOKENS_MAX);
        return KVR_ERR_NO_RESOURCE;
    }
    if (!e->tokens) {
        e->tokens = calloc(KVR_XFER_TOKENS_MAX, sizeof(*e->tokens));
        if (!e->tokens)
            return KVR_ERR_NO_MEMORY;
    }
    memcpy(e->tokens[e->ntokens++], token, KVR_XFER_TOKEN_LEN);
    return KVR_OK;
}

void kvr_xfer_token_revoke(kvr_xfer_engine_t *e, const uint8_t token[KVR_XFER_TOKEN_LEN])
{
    if (!e || !token)
        return;
    ssize_t i = find(e, token);
    if (i < 0)
        return;
    memcpy(e->tokens[i], e->tokens[--e->ntokens], KVR_XFER_TOKEN_LEN);
}

bool kvr_xfer_token_allowed(const kvr_xfer_engine_t *e, const uint8_t *token)
{
    return token && !zero(token) && find(e, token) >= 0;
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
    if (token && !zero(token) && find(e, token) >= 0)
        return true;
    if (e->stats.refused++ % 1000 == 0)
        KVR_LOG_WARN(COMP,
                     "%s: refused a peer %s (%llu refused so far): only peers introduced with "
                     "a token (kvr_xfer_token_allow) are accepted",
                     e->name, token && !zero(token) ? "with an unknown token" : "without a token",
                     (unsigned long long)e->stats.refused);
    return false;
}

void kvr_xfer_tokens_free(kvr_xfer_engine_t *e)
{
    free(e->tokens);
    e->tokens = NULL;
    e->ntokens = 0;
}
