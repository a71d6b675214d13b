/*
 * test_xfer_desc.c - descriptor lists: validation against the registered
 * regions (bounds, overflow, zero length, foreign regions) and coalescing of
 * runs adjacent in both the local and the remote region, with the segments
 * the backend would post checked one by one (loop backend, one process).
 */
#include "xfer_backend.h"
#include "kvr_test.h"

#define LEN (1u << 20)

static kvr_xfer_engine_t *mk(const char *name)
{
    struct kvr_xfer_config cfg;
    kvr_xfer_engine_t *e;
    kvr_xfer_config_init(&cfg);
    cfg.backend = "loop";
    cfg.name = name;
    KVR_CHECK_STATUS(kvr_xfer_engine_create(&cfg, &e), KVR_OK);
    return e;
}

int main(void)
{
    static uint8_t la[LEN], lb[LEN], ra[LEN], rb[LEN / 2];
    kvr_xfer_engine_t *a = mk("a"), *b = mk("b");
    kvr_xfer_mem_t *ma, *mb, *xa, *xb;
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(a, la, LEN, KVR_MEM_HOST, 0, &ma), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(a, lb, LEN, KVR_MEM_HOST, 0, &mb), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(b, ra, LEN, KVR_MEM_HOST, 0, &xa), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_mem_reg(b, rb, LEN / 2, KVR_MEM_HOST, 0, &xb), KVR_OK);
    void *blob;
    size_t len;
    kvr_xfer_peer_t *p;
    kvr_xfer_rmem_t *r1, *r2;
    KVR_CHECK_STATUS(kvr_xfer_address(b, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_connect(a, blob, len, &p), KVR_OK);
    free(blob);
    KVR_CHECK_STATUS(kvr_xfer_mem_pack(xa, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, blob, len, &r1), KVR_OK);
    free(blob);
    KVR_CHECK_STATUS(kvr_xfer_mem_pack(xb, &blob, &len), KVR_OK);
    KVR_CHECK_STATUS(kvr_xfer_rmem_unpack(p, blob, len, &r2), KVR_OK);
    free(blob);
    KVR_CHECK_EQ(kvr_xfer_rmem_len(r2), LEN / 2);

    kvr_xfer_dlist_t *dl;
    size_t co;

    /* 1. a run adjacent on both sides collapses to one segment */
    struct kvr_xfer_desc d[16];
    for (int i = 0; i < 16; i++)
        d[i] = (struct kvr_xfer_desc){ma, 4096 + i * 4096u, r1, 65536 + i * 4096u, 4096};
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, 16, &dl), KVR_OK);
    KVR_CHECK_EQ(kvr_xfer_dlist_count(dl, &co), 16);
    KVR_CHECK_EQ(co, 1);
    KVR_CHECK(dl->segs[0].laddr == la + 4096);
    KVR_CHECK_EQ(dl->segs[0].raddr, (uint64_t)(uintptr_t)ra + 65536);
    KVR_CHECK_EQ(dl->segs[0].len, 16 * 4096);
    KVR_CHECK_EQ(dl->bytes, 16 * 4096);
    kvr_xfer_dlist_release(dl);

    /* 2. adjacent locally only, remotely only, other region, reversed order: no merge */
    struct kvr_xfer_desc m[7] = {
        {ma, 0, r1, 0, 100},     {ma, 100, r1, 200, 100}, /* local adjacent, remote gap */
        {ma, 300, r1, 300, 100},                          /* remote adjacent, local gap */
        {mb, 400, r1, 400, 100},                          /* remote adjacent, other local region */
        {mb, 500, r2, 500, 100},                          /* local adjacent, other remote region */
        {mb, 600, r2, 600, 50}, /* merges with the previous: both adjacent */
        {mb, 550, r2, 550, 50}, /* before, not after: no merge */
    };
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_READ, m, 7, &dl), KVR_OK);
    KVR_CHECK_EQ(kvr_xfer_dlist_count(dl, &co), 7);
    KVR_CHECK_EQ(co, 6);
    KVR_CHECK_EQ(dl->segs[4].len, 150);
    KVR_CHECK(dl->segs[4].laddr == lb + 500);
    KVR_CHECK_EQ(dl->segs[5].len, 50);
    KVR_CHECK_EQ(dl->bytes, 600);
    struct kvr_xfer_stats st;
    kvr_xfer_dlist_stats(dl, &st);
    KVR_CHECK_EQ(st.ndesc, 7);
    KVR_CHECK_EQ(st.ndesc_coalesced, 6);
    KVR_CHECK_EQ(st.bytes, 600);
    KVR_CHECK_EQ(st.complete_ns, 0);
    kvr_xfer_dlist_release(dl);

    /* 3. two runs split by one gap, then the coalesced list moves the right bytes */
    struct kvr_xfer_desc g[6];
    for (int i = 0; i < 6; i++)
        g[i] = (struct kvr_xfer_desc){ma, i * 1000u + (i >= 3 ? 5 : 0), r1, 7 + i * 1000u, 1000};
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, g, 6, &dl), KVR_OK);
    KVR_CHECK_EQ(kvr_xfer_dlist_count(dl, &co), 6);
    KVR_CHECK_EQ(co, 2);
    for (size_t i = 0; i < LEN; i++)
        la[i] = (uint8_t)(i * 7 + 1);
    memset(ra, 0, LEN);
    KVR_CHECK(kvr_xfer_post(dl) >= 0);
    KVR_CHECK_STATUS(kvr_xfer_wait(dl, 1000), KVR_OK);
    for (int i = 0; i < 6; i++)
        KVR_CHECK(memcmp(ra + 7 + i * 1000, la + i * 1000 + (i >= 3 ? 5 : 0), 1000) == 0);
    KVR_CHECK_EQ(ra[6], 0);
    KVR_CHECK_EQ(ra[7 + 6000], 0);
    kvr_xfer_dlist_stats(dl, &st);
    KVR_CHECK(st.complete_ns > 0);
    KVR_CHECK_EQ(st.ndesc_coalesced, 2);
    kvr_xfer_dlist_release(dl);

    /* 4. bounds: the last byte is fine, one past is not; zero length; wrap-around */
    struct kvr_xfer_desc e1 = {ma, LEN - 1, r1, LEN - 1, 1};
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &e1, 1, &dl), KVR_OK);
    kvr_xfer_dlist_release(dl);
    struct kvr_xfer_desc whole = {ma, 0, r2, 0, LEN / 2};
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &whole, 1, &dl), KVR_OK);
    kvr_xfer_dlist_release(dl);
    dl = NULL;
    struct kvr_xfer_desc bad[] = {
        {ma, LEN - 1, r1, 0, 2},        /* local end */
        {ma, 0, r1, LEN - 1, 2},        /* remote end */
        {ma, 0, r2, 0, LEN / 2 + 1},    /* the smaller remote region */
        {ma, LEN, r1, 0, 1},            /* local offset at the end */
        {ma, 1, r1, UINT64_MAX, 2},     /* remote offset wraps */
        {ma, UINT64_MAX - 1, r1, 0, 4}, /* local offset wraps */
        {ma, 0, r1, 0, UINT64_MAX},     /* length wraps */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &bad[i], 1, &dl),
                         KVR_ERR_OUT_OF_RANGE);
    /* one bad descriptor anywhere refuses the whole list */
    d[9].len = 0;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, 16, &dl), KVR_ERR_INVALID);
    d[9].len = 4096;
    d[15].roff = LEN;
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, 16, &dl), KVR_ERR_OUT_OF_RANGE);
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, 0, &dl), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, NULL, 3, &dl), KVR_ERR_INVALID);
    struct kvr_xfer_desc foreign = {xa, 0, r1, 0, 10}; /* local region of the other engine */
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, &foreign, 1, &dl), KVR_ERR_INVALID);
    KVR_CHECK(dl == NULL);

    /* 5. a list is released by disconnect; engines release everything left */
    KVR_CHECK_STATUS(kvr_xfer_dlist_prepare(p, KVR_XFER_WRITE, d, 15, &dl), KVR_OK);
    kvr_xfer_engine_destroy(a);
    kvr_xfer_engine_destroy(b);
    fprintf(stderr, "xfer_desc: all checks passed\n");
    return 0;
}
