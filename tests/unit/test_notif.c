/*
 * test_notif.c - the P -> D notification codec (node/notif.h): round trip
 * of every kind with every field, the exact little-endian bytes of the
 * header, and refusal of truncated buffers, another version, a byte-swapped
 * endianness marker, a bad magic, an unknown kind, a body length that
 * disagrees with the buffer and a name too long.
 */
#include <stdint.h>
#include <string.h>

#include "kvr_test.h"
#include "notif.h"

static struct kvr_notif sample(uint16_t kind)
{
    struct kvr_notif n;
    memset(&n, 0, sizeof n);
    n.kind = kind;
    n.request_id = 0x0102030405060708ull;
    n.incarnation = 0xfedcba9876543211ull;
    snprintf(n.node, sizeof n.node, "prefill-7");
    n.fingerprint = 0x1122334455667788ull;
    n.n_layers = 32;
    n.n_kv_heads = 8;
    n.head_dim = 128;
    n.block_size = 16;
    n.dtype = 0;
    n.proto_version = 3;
    n.first_token = 128001;
    n.logprob = -1.25f;
    n.n_tokens = 3500;
    n.cached_tokens = 512;
    n.bytes = 0x123456789aull;
    n.status = -11;
    n.first_block = 4000000000u;
    n.attempt = 0x80000002u;
    return n;
}

static void same(const struct kvr_notif *a, const struct kvr_notif *b)
{
    KVR_CHECK_EQ(a->kind, b->kind);
    KVR_CHECK(a->request_id == b->request_id);
    KVR_CHECK(a->incarnation == b->incarnation);
    KVR_CHECK(strcmp(a->node, b->node) == 0);
    KVR_CHECK(a->fingerprint == b->fingerprint);
    KVR_CHECK_EQ(a->n_layers, b->n_layers);
    KVR_CHECK_EQ(a->n_kv_heads, b->n_kv_heads);
    KVR_CHECK_EQ(a->head_dim, b->head_dim);
    KVR_CHECK_EQ(a->block_size, b->block_size);
    KVR_CHECK_EQ(a->dtype, b->dtype);
    KVR_CHECK_EQ(a->proto_version, b->proto_version);
    KVR_CHECK_EQ(a->first_token, b->first_token);
    KVR_CHECK(memcmp(&a->logprob, &b->logprob, sizeof a->logprob) == 0);
    KVR_CHECK_EQ(a->n_tokens, b->n_tokens);
    KVR_CHECK_EQ(a->cached_tokens, b->cached_tokens);
    KVR_CHECK(a->bytes == b->bytes);
    KVR_CHECK_EQ(a->status, b->status);
    KVR_CHECK_EQ(a->first_block, b->first_block);
    KVR_CHECK_EQ(a->attempt, b->attempt);
    KVR_CHECK_EQ(a->n_top, b->n_top);
    for (int i = 0; i < a->n_top; i++) {
        KVR_CHECK_EQ(a->top_ids[i], b->top_ids[i]);
        KVR_CHECK(memcmp(&a->top_lps[i], &b->top_lps[i], sizeof a->top_lps[i]) == 0);
    }
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

int main(void)
{
    uint8_t buf[KVR_NOTIF_WIRE_MAX], bad[KVR_NOTIF_WIRE_MAX];
    char err[256];
    struct kvr_notif out;

    /* round trip of each kind */
    for (uint16_t k = KVR_NOTIF_HELLO; k <= KVR_NOTIF_KV_PROGRESS; k++) {
        struct kvr_notif n = sample(k);
        size_t len = kvr_notif_encode(&n, buf, sizeof buf);
        KVR_CHECK_EQ(len, KVR_NOTIF_HDR_LEN + KVR_NOTIF_BODY_MIN + strlen("prefill-7"));
        memset(&out, 0xa5, sizeof out);
        KVR_CHECK_STATUS(kvr_notif_decode(buf, len, &out, err, sizeof err), KVR_OK);
        same(&n, &out);
    }
    /* an empty name, and the longest one */
    struct kvr_notif n = sample(KVR_NOTIF_KV_READY);
    n.node[0] = 0;
    size_t len = kvr_notif_encode(&n, buf, sizeof buf);
    KVR_CHECK_STATUS(kvr_notif_decode(buf, len, &out, err, sizeof err), KVR_OK);
    same(&n, &out);
    memset(n.node, 'x', sizeof n.node - 1);
    n.node[sizeof n.node - 1] = 0;
    len = kvr_notif_encode(&n, buf, sizeof buf);
    KVR_CHECK(len > 0 && len <= KVR_NOTIF_WIRE_MAX);
    KVR_CHECK_STATUS(kvr_notif_decode(buf, len, &out, err, sizeof err), KVR_OK);
    same(&n, &out);
    /* a buffer too small to encode into */
    KVR_CHECK_EQ(kvr_notif_encode(&n, buf, len - 1), 0);
    /* the first token's alternatives, up to the most, with the longest name */
    n.n_top = KVR_NOTIF_MAX_TOP;
    for (int i = 0; i < KVR_NOTIF_MAX_TOP; i++) {
        n.top_ids[i] = 128000 - i;
        n.top_lps[i] = -0.5f * (float)i - 0.125f;
    }
    len = kvr_notif_encode(&n, buf, sizeof buf);
    KVR_CHECK_EQ(len, KVR_NOTIF_WIRE_MAX - 1); /* the longest name, the most alternatives */
    KVR_CHECK_STATUS(kvr_notif_decode(buf, len, &out, err, sizeof err), KVR_OK);
    same(&n, &out);
    n.n_top = KVR_NOTIF_MAX_TOP + 1;
    KVR_CHECK_EQ(kvr_notif_encode(&n, buf, sizeof buf), 0);
    /* an n_top past the most is refused by the decoder too */
    n.n_top = 0;
    len = kvr_notif_encode(&n, buf, sizeof buf);
    buf[KVR_NOTIF_HDR_LEN + KVR_NOTIF_BODY_MIN - 3] = KVR_NOTIF_MAX_TOP + 1;
    KVR_CHECK_STATUS(kvr_notif_decode(buf, len, &out, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "alternatives") != NULL);

    /* the header bytes are little endian whatever the host */
    n = sample(KVR_NOTIF_KV_READY);
    len = kvr_notif_encode(&n, buf, sizeof buf);
    const uint8_t hdr[] = {'K',  'V',  'R',  'N', KVR_NOTIF_VERSION, 0, KVR_NOTIF_KV_READY, 0,
                           0x04, 0x03, 0x02, 0x01};
    KVR_CHECK(memcmp(buf, hdr, sizeof hdr) == 0);
    KVR_CHECK_EQ(buf[12] | buf[13] << 8, len - KVR_NOTIF_HDR_LEN);
    KVR_CHECK_EQ(buf[16], 0x08); /* request_id, least significant byte first */
    KVR_CHECK_EQ(buf[23], 0x01);

    /* truncated: at every length short of the whole */
    for (size_t cut = 0; cut < len; cut++) {
        memset(&out, 0, sizeof out);
        out.request_id = 42;
        KVR_CHECK_STATUS(kvr_notif_decode(buf, cut, &out, err, sizeof err), KVR_ERR_INVALID);
        KVR_CHECK(out.request_id == 42); /* untouched on failure */
        KVR_CHECK(err[0] != 0);
    }
    /* one byte too many */
    memcpy(bad, buf, len);
    bad[len] = 0;
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len + 1, &out, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "length") != NULL);

    /* wrong version (1 was the raw C struct) */
    memcpy(bad, buf, len);
    bad[4] = 1;
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_MISMATCH);
    KVR_CHECK(strstr(err, "version") != NULL);
    bad[4] = KVR_NOTIF_VERSION + 1;
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_MISMATCH);

    /* wrong endianness marker: what a big-endian host writing natively sends */
    memcpy(bad, buf, len);
    const uint8_t be[] = {0x01, 0x02, 0x03, 0x04};
    memcpy(bad + 8, be, 4);
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "endianness") != NULL);

    /* bad magic */
    memcpy(bad, buf, len);
    bad[0] ^= 0xff;
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "magic") != NULL);

    /* unknown kinds */
    memcpy(bad, buf, len);
    bad[6] = 0;
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_INVALID);
    bad[6] = 5;
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_INVALID);

    /* body length field that disagrees with the buffer */
    memcpy(bad, buf, len);
    put32(bad + 12, (uint32_t)(len - KVR_NOTIF_HDR_LEN - 1));
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_INVALID);

    /* a name length that overruns the body, or the limit */
    memcpy(bad, buf, len);
    size_t name_off = KVR_NOTIF_HDR_LEN + KVR_NOTIF_BODY_MIN - 2;
    bad[name_off] = (uint8_t)(bad[name_off] + 1);
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_INVALID);
    bad[name_off] = 0xff;
    bad[name_off + 1] = 0xff;
    KVR_CHECK_STATUS(kvr_notif_decode(bad, len, &out, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "name") != NULL);

    /* NULL buffer */
    KVR_CHECK_STATUS(kvr_notif_decode(NULL, 0, &out, err, sizeof err), KVR_ERR_INVALID);
    printf("notification codec: ok\n");
    return 0;
}
