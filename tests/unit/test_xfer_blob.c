/*
 * test_xfer_blob.c - the framing of address and rkey blobs (xfer_blob.h):
 * round trips, truncation at every length, every single-bit flip, trailing
 * bytes, another version (with a valid checksum), another backend, the
 * wrong kind; then the same through the public API of a loop engine.
 */
#include "xfer_backend.h"
#include "xfer_blob.h"
#include "kvr_test.h"
#include "kvr_log.h"

static void put_sum(uint8_t *b, size_t len)
{
    uint64_t c = kvr_xfer_blob_checksum(b, len);
    memcpy(b + 16, &c, 8); /* little-endian host */
}

int main(void)
{
    uint8_t payload[300];
    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (uint8_t)(i * 13 + 5);
    void *blob;
    size_t len;
    const void *pl;
    size_t pl_len;
    const char *why;

    kvr_log_set_level((enum kvr_log_level) - 1); /* thousands of refusals expected below */
    /* round trips of several sizes, both kinds */
    size_t sizes[] = {0, 1, 7, 24, 299, 300};
    for (size_t k = 0; k < 6; k++)
        for (uint16_t kind = 1; kind <= 2; kind++) {
            KVR_CHECK_STATUS(kvr_xfer_blob_frame(9, kind, payload, sizes[k], &blob, &len), KVR_OK);
            KVR_CHECK_EQ(len, KVR_XFER_BLOB_HDR_LEN + sizes[k]);
            KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, kind, blob, len, &pl, &pl_len, &why), KVR_OK);
            KVR_CHECK_EQ(pl_len, sizes[k]);
            KVR_CHECK(sizes[k] == 0 || memcmp(pl, payload, sizes[k]) == 0);
            /* wrong kind, wrong backend */
            KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 3 - kind, blob, len, &pl, &pl_len, &why),
                             KVR_ERR_INVALID);
            KVR_CHECK_STATUS(kvr_xfer_blob_parse(8, kind, blob, len, &pl, &pl_len, &why),
                             KVR_ERR_MISMATCH);
            KVR_CHECK(strstr(why, "backend") != NULL);
            free(blob);
        }

    KVR_CHECK_STATUS(kvr_xfer_blob_frame(9, 1, payload, sizeof(payload), &blob, &len), KVR_OK);
    uint8_t *b = blob;

    /* truncation at every length */
    for (size_t n = 0; n < len; n++) {
        why = NULL;
        kvr_status_t s = kvr_xfer_blob_parse(9, 1, b, n, &pl, &pl_len, &why);
        KVR_CHECK_STATUS(s, KVR_ERR_INVALID);
        KVR_CHECK(why && strstr(why, "truncated"));
    }
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 1, NULL, len, &pl, &pl_len, &why), KVR_ERR_INVALID);

    /* trailing bytes */
    uint8_t *longer = malloc(len + 5);
    memcpy(longer, b, len);
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 1, longer, len + 5, &pl, &pl_len, &why),
                     KVR_ERR_INVALID);
    free(longer);

    /* every single-bit flip is refused with a typed error */
    int corrupt = 0;
    for (size_t i = 0; i < len * 8; i++) {
        b[i / 8] ^= (uint8_t)(1u << (i % 8));
        kvr_status_t s = kvr_xfer_blob_parse(9, 1, b, len, &pl, &pl_len, &why);
        KVR_CHECK(s == KVR_ERR_CORRUPT || s == KVR_ERR_INVALID || s == KVR_ERR_VERSION);
        if (i / 8 >= 16) /* checksum and payload: always the checksum */
            KVR_CHECK_STATUS(s, KVR_ERR_CORRUPT);
        if (i / 8 >= 4 && i / 8 < 6) /* the version field */
            KVR_CHECK_STATUS(s, KVR_ERR_VERSION);
        corrupt += s == KVR_ERR_CORRUPT;
        b[i / 8] ^= (uint8_t)(1u << (i % 8));
    }
    KVR_CHECK(corrupt > (int)len * 6);
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 1, b, len, &pl, &pl_len, &why), KVR_OK);

    /* another version, checksum valid: still KVR_ERR_VERSION */
    b[4] = KVR_XFER_BLOB_VERSION + 1;
    put_sum(b, len);
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 1, b, len, &pl, &pl_len, &why), KVR_ERR_VERSION);
    /* ... even when it is shorter than our header (a different layout) */
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 1, b, 8, &pl, &pl_len, &why), KVR_ERR_VERSION);
    b[4] = KVR_XFER_BLOB_VERSION;
    put_sum(b, len);
    /* another backend with a valid checksum: mismatch */
    b[6] = 3;
    put_sum(b, len);
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 1, b, len, &pl, &pl_len, &why), KVR_ERR_MISMATCH);
    b[6] = 9;
    put_sum(b, len);
    /* unknown flags */
    b[10] = 1;
    put_sum(b, len);
    KVR_CHECK_STATUS(kvr_xfer_blob_parse(9, 1, b, len, &pl, &pl_len, &why), KVR_ERR_CORRUPT);
    free(blob);

    /* through the public API: a loop engine's address and rkey blobs */
    struct kvr_xfer_config cfg;
    kvr_xfer_config_init(&cfg);
    cfg.backend = "loop";
    kvr_xfer_engine_t *a, *t;
    KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &a), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &t), KVR_OK);
    static uint8_t region[65536];
    kvr_xfer_mem_t *m;
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(t, region, sizeof(region), KVR_MEM_HOST, 0, &m), KVR_OK);
    void *ab, *rb;
    size_t al, rl;
    KVR_CHECK_STATUS(kvr_xfer_address(t, &ab, &al), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_pack(m, &rb, &rl), KVR_OK);
    kvr_xfer_peer_t *p = NULL;
    kvr_xfer_rmem_t *r = NULL;
    for (size_t n = 0; n < al; n++)
        KVR_CHECK_STATUS(kvr_xfer_connect(a, ab, n, &p), KVR_ERR_INVALID);
    for (size_t i = 0; i < al * 8; i += 3) {
        ((uint8_t *)ab)[i / 8] ^= (uint8_t)(1u << (i % 8));
        kvr_status_t s = kvr_xfer_connect(a, ab, al, &p);
        KVR_CHECK(s == KVR_ERR_CORRUPT || s == KVR_ERR_INVALID || s == KVR_ERR_VERSION);
        ((uint8_t *)ab)[i / 8] ^= (uint8_t)(1u << (i % 8));
    }
    ((uint8_t *)ab)[6] = 2; /* claims to be a ucx blob */
    put_sum(ab, al);
    KVR_CHECK_STATUS(kvr_xfer_connect(a, ab, al, &p), KVR_ERR_MISMATCH);
    ((uint8_t *)ab)[6] = 1;
    put_sum(ab, al);
    KVR_CHECK(p == NULL);
    KVR_CHECK_STATUS(kvr_xfer_connect(a, ab, al, &p), KVR_OK);
    for (size_t n = 0; n < rl; n++)
        KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, rb, n, &r), KVR_ERR_INVALID);
    ((uint8_t *)rb)[4] = 7;
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, rb, rl, &r), KVR_ERR_VERSION);
    ((uint8_t *)rb)[4] = KVR_XFER_BLOB_VERSION;
    /* a region header that lies about its key length, checksum fixed up */
    ((uint8_t *)rb)[24 + 20] ^= 1;
    put_sum(rb, rl);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, rb, rl, &r), KVR_ERR_INVALID);
    ((uint8_t *)rb)[24 + 20] ^= 1;
    put_sum(rb, rl);
    KVR_CHECK(r == NULL);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, rb, rl, &r), KVR_OK);
    KVR_CHECK_EQ(kvr_xfer_rmem_len(r), sizeof(region));
    /* an address blob from another process is refused: loop is in-process */
    uint32_t otherpid = 1;
    memcpy((uint8_t *)ab + 24, &otherpid, 4);
    put_sum(ab, al);
    kvr_xfer_peer_t *q = NULL;
    KVR_CHECK_STATUS(kvr_xfer_connect(a, ab, al, &q), KVR_ERR_NOT_FOUND);
    free(ab);
    free(rb);
    kvr_xfer_engine_destroy(a);
    kvr_xfer_engine_destroy(t);
    fprintf(stderr, "xfer_blob: all checks passed\n");
    return 0;
}
