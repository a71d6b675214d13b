/*
 * blockhash.c - block content hashes and chained sequence hashes (see
 * kvr_blockhash.h).  Tokens and hashes are serialized little-endian
 * explicitly, so the hashes agree across hosts of any byte order.
 */
#include "kvr_blockhash.h"

#include <xxhash.h>

#define KVR_BLOCKHASH_STACK_TOKENS 256

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
#endif

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint64_t kvr_blockhash_block(const uint32_t *tokens, size_t block_size)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return XXH3_64bits_withSeed(tokens, 4 * block_size, KVR_BLOCKHASH_SEED);
#else
    XXH3_state_t st;
    unsigned char buf[4 * KVR_BLOCKHASH_STACK_TOKENS];
    XXH3_64bits_reset_withSeed(&st, KVR_BLOCKHASH_SEED);
    for (size_t i = 0; i < block_size;) {
        size_t n = block_size - i < KVR_BLOCKHASH_STACK_TOKENS ? block_size - i
                                                               : KVR_BLOCKHASH_STACK_TOKENS;
        for (size_t j = 0; j < n; j++)
            put_le32(buf + 4 * j, tokens[i + j]);
        XXH3_64bits_update(&st, buf, 4 * n);
        i += n;
    }
    return XXH3_64bits_digest(&st);
#endif
}

uint64_t kvr_blockhash_chain(uint64_t prev_seq, uint64_t block_hash)
{
    unsigned char buf[16];
    put_le64(buf, prev_seq);
    put_le64(buf + 8, block_hash);
    return XXH3_64bits_withSeed(buf, sizeof buf, KVR_BLOCKHASH_SEED);
}

kvr_status_t kvr_blockhash_seq(const uint32_t *tokens, size_t ntokens, size_t block_size,
                               uint64_t *hashes, size_t max_hashes, size_t *count_p)
{
    if (block_size == 0 || !count_p)
        return KVR_ERR_INVALID;
    size_t n = ntokens / block_size;
    if (n > max_hashes)
        n = max_hashes;
    if (n > 0 && (!tokens || !hashes))
        return KVR_ERR_INVALID;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = kvr_blockhash_block(tokens + i * block_size, block_size);
        s = i == 0 ? h : kvr_blockhash_chain(s, h);
        hashes[i] = s;
    }
    *count_p = n;
    return KVR_OK;
}
