/*
 * test_blockhash.c - block hashes: the DESIGN.md test vector, chaining,
 * partial blocks, and prefix sharing (two prompts with a common prefix share
 * exactly the sequence hashes of their common full blocks).
 */
#include <stdint.h>
#include <xxhash.h>

#include "kvr_blockhash.h"
#include "kvr_test.h"

int main(void)
{
    const uint32_t v[4] = {1, 2, 3, 4};
    KVR_CHECK(kvr_blockhash_block(v, 4) == 14643705804678351452ull);

    /* chaining by hand: le64(s_0) || le64(h_1) */
    uint32_t toks[40];
    for (uint32_t i = 0; i < 40; i++)
        toks[i] = i * 7919u + 3u;
    uint64_t hs[16];
    size_t n = 99;
    KVR_CHECK_STATUS(kvr_blockhash_seq(toks, 11, 4, hs, 16, &n), KVR_OK);
    KVR_CHECK_EQ(n, 2); /* the partial third block is not hashed */
    uint64_t h0 = kvr_blockhash_block(toks, 4), h1 = kvr_blockhash_block(toks + 4, 4);
    KVR_CHECK(hs[0] == h0);
    unsigned char buf[16];
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)(h0 >> (8 * i));
        buf[8 + i] = (unsigned char)(h1 >> (8 * i));
    }
    KVR_CHECK(hs[1] == XXH3_64bits_withSeed(buf, 16, 1337));
    KVR_CHECK(hs[1] == kvr_blockhash_chain(h0, h1));
    KVR_CHECK(hs[1] != h1); /* the chain depends on the prefix */

    /* same prefix, different tail: shared hashes for shared full blocks only */
    uint32_t other[40];
    memcpy(other, toks, sizeof other);
    other[21] ^= 1u; /* inside block 5 (tokens 20..23) */
    uint64_t ha[10], hb[10];
    size_t na, nb;
    KVR_CHECK_STATUS(kvr_blockhash_seq(toks, 40, 4, ha, 10, &na), KVR_OK);
    KVR_CHECK_STATUS(kvr_blockhash_seq(other, 40, 4, hb, 10, &nb), KVR_OK);
    KVR_CHECK_EQ(na, 10);
    KVR_CHECK_EQ(nb, 10);
    for (int i = 0; i < 5; i++)
        KVR_CHECK(ha[i] == hb[i]);
    for (int i = 5; i < 10; i++)
        KVR_CHECK(ha[i] != hb[i]);

    /* max_hashes caps the output; zero tokens give zero hashes */
    KVR_CHECK_STATUS(kvr_blockhash_seq(toks, 40, 4, ha, 3, &na), KVR_OK);
    KVR_CHECK_EQ(na, 3);
    KVR_CHECK_STATUS(kvr_blockhash_seq(NULL, 0, 16, NULL, 0, &na), KVR_OK);
    KVR_CHECK_EQ(na, 0);

    /* bad input */
    KVR_CHECK_STATUS(kvr_blockhash_seq(toks, 40, 0, ha, 10, &na), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_blockhash_seq(NULL, 40, 4, ha, 10, &na), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_blockhash_seq(toks, 40, 4, ha, 10, NULL), KVR_ERR_INVALID);
    printf("blockhash: ok\n");
    return 0;
}
