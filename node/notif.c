/*
 * notif.c - the P -> D notification codec (notif.h): every field written
 * and read byte by byte, little endian, whatever the host; the decoder
 * checks the header and every length before it reads a field.
 */
#include "notif.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct wbuf {
    uint8_t *p;
    size_t n;
};

static void put_u16(struct wbuf *w, uint16_t v)
{
    w->p[w->n++] = (uint8_t)v;
    w->p[w->n++] = (uint8_t)(v >> 8);
}

static void put_u32(struct wbuf *w, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        w->p[w->n++] = (uint8_t)(v >> (8 * i));
}

static void put_u64(struct wbuf *w, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        w->p[w->n++] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p, size_t *off)
{
    uint16_t v = (uint16_t)(p[*off] | (uint16_t)p[*off + 1] << 8);
    *off += 2;
    return v;
}

static uint32_t get_u32(const uint8_t *p, size_t *off)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[*off + (size_t)i] << (8 * i);
    *off += 4;
    return v;
}

static uint64_t get_u64(const uint8_t *p, size_t *off)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[*off + (size_t)i] << (8 * i);
    *off += 8;
    return v;
}

size_t kvr_notif_encode(const struct kvr_notif *n, void *buf, size_t cap)
{
    size_t name_len = strnlen(n->node, sizeof n->node);
    if (name_len >= sizeof n->node || n->n_top > KVR_NOTIF_MAX_TOP)
        return 0;
    size_t body = KVR_NOTIF_BODY_MIN + name_len + 8 * (size_t)n->n_top;
    if (!buf || cap < KVR_NOTIF_HDR_LEN + body)
        return 0;
    struct wbuf w = {buf, 0};
    put_u32(&w, KVR_NOTIF_MAGIC);
    put_u16(&w, KVR_NOTIF_VERSION);
    put_u16(&w, n->kind);
    put_u32(&w, KVR_NOTIF_ENDIAN);
    put_u32(&w, (uint32_t)body);
    put_u64(&w, n->request_id);
    put_u64(&w, n->incarnation);
    put_u64(&w, n->fingerprint);
    put_u64(&w, n->bytes);
    put_u32(&w, (uint32_t)n->n_layers);
    put_u32(&w, (uint32_t)n->n_kv_heads);
    put_u32(&w, (uint32_t)n->head_dim);
    put_u32(&w, (uint32_t)n->block_size);
    put_u32(&w, (uint32_t)n->dtype);
    put_u32(&w, n->proto_version);
    put_u32(&w, (uint32_t)n->first_token);
    uint32_t lp;
    memcpy(&lp, &n->logprob, sizeof lp);
    put_u32(&w, lp);
    put_u32(&w, n->n_tokens);
    put_u32(&w, n->cached_tokens);
    put_u32(&w, (uint32_t)n->status);
    put_u32(&w, n->first_block);
    put_u32(&w, n->attempt);
    w.p[w.n++] = n->n_top;
    put_u16(&w, (uint16_t)name_len);
    memcpy(w.p + w.n, n->node, name_len);
    w.n += name_len;
    for (int i = 0; i < n->n_top; i++) {
        put_u32(&w, (uint32_t)n->top_ids[i]);
        memcpy(&lp, &n->top_lps[i], sizeof lp);
        put_u32(&w, lp);
    }
    return w.n;
}

static kvr_status_t bad(kvr_status_t s, char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static kvr_status_t bad(kvr_status_t s, char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return s;
}

kvr_status_t kvr_notif_decode(const void *buf, size_t len, struct kvr_notif *n_p, char *err,
                              size_t err_len)
{
    const uint8_t *p = buf;
    size_t off = 0;
    if (!p || len < KVR_NOTIF_HDR_LEN)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification of %zu bytes is shorter than its %d-byte header", len,
                   KVR_NOTIF_HDR_LEN);
    uint32_t magic = get_u32(p, &off);
    uint16_t version = get_u16(p, &off);
    uint16_t kind = get_u16(p, &off);
    uint32_t marker = get_u32(p, &off);
    uint32_t body = get_u32(p, &off);
    if (magic != KVR_NOTIF_MAGIC)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification magic %08x, want %08x (not a kvrail node, or a corrupt message)",
                   magic, KVR_NOTIF_MAGIC);
    if (marker != KVR_NOTIF_ENDIAN)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification endianness marker %08x, want %08x (the sender did not encode "
                   "little endian)",
                   marker, KVR_NOTIF_ENDIAN);
    if (version != KVR_NOTIF_VERSION)
        return bad(KVR_ERR_MISMATCH, err, err_len,
                   "notification version %u, this node speaks %u (run the same kvrail release "
                   "on prefill and decode nodes)",
                   version, KVR_NOTIF_VERSION);
    if (kind < KVR_NOTIF_HELLO || kind > KVR_NOTIF_KV_PROGRESS)
        return bad(KVR_ERR_INVALID, err, err_len, "notification kind %u is unknown", kind);
    if (body != len - KVR_NOTIF_HDR_LEN)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification body length %u, but %zu bytes follow the header (truncated?)",
                   body, len - KVR_NOTIF_HDR_LEN);
    if (body < KVR_NOTIF_BODY_MIN)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification body of %u bytes is shorter than its %d fixed bytes", body,
                   KVR_NOTIF_BODY_MIN);
    struct kvr_notif n;
    memset(&n, 0, sizeof n);
    n.kind = kind;
    n.request_id = get_u64(p, &off);
    n.incarnation = get_u64(p, &off);
    n.fingerprint = get_u64(p, &off);
    n.bytes = get_u64(p, &off);
    n.n_layers = (int32_t)get_u32(p, &off);
    n.n_kv_heads = (int32_t)get_u32(p, &off);
    n.head_dim = (int32_t)get_u32(p, &off);
    n.block_size = (int32_t)get_u32(p, &off);
    n.dtype = (int32_t)get_u32(p, &off);
    n.proto_version = get_u32(p, &off);
    n.first_token = (int32_t)get_u32(p, &off);
    uint32_t lp = get_u32(p, &off);
    memcpy(&n.logprob, &lp, sizeof lp);
    n.n_tokens = get_u32(p, &off);
    n.cached_tokens = get_u32(p, &off);
    n.status = (int32_t)get_u32(p, &off);
    n.first_block = get_u32(p, &off);
    n.attempt = get_u32(p, &off);
    n.n_top = p[off++];
    uint16_t name_len = get_u16(p, &off);
    if (name_len >= sizeof n.node)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification node name of %u bytes, the most is %zu", name_len,
                   sizeof n.node - 1);
    if (n.n_top > KVR_NOTIF_MAX_TOP)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification lists %u alternatives of the first token, the most is %d", n.n_top,
                   KVR_NOTIF_MAX_TOP);
    if ((size_t)body != KVR_NOTIF_BODY_MIN + (size_t)name_len + 8u * n.n_top)
        return bad(KVR_ERR_INVALID, err, err_len,
                   "notification body of %u bytes, its fields, a %u-byte name and %u "
                   "alternatives need %u",
                   body, name_len, n.n_top, KVR_NOTIF_BODY_MIN + name_len + 8u * n.n_top);
    memcpy(n.node, p + off, name_len);
    n.node[name_len] = 0;
    off += name_len;
    for (int i = 0; i < n.n_top; i++) {
        n.top_ids[i] = (int32_t)get_u32(p, &off);
        uint32_t tl = get_u32(p, &off);
        memcpy(&n.top_lps[i], &tl, sizeof tl);
    }
    *n_p = n;
    return KVR_OK;
}
