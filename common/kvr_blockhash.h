/*
 * kvr_blockhash.h - content and chained hashes of full KV blocks.
 *
 * DESIGN.md "Block hash" (compatible with Dynamo's router hash): the content
 * hash of a full block is XXH3_64bits_withSeed over its tokens as
 * little-endian uint32 (4 * block_size bytes), seed 1337.  The chained
 * sequence hash is s_0 = h_0, s_i = XXH3_64bits_withSeed(le64(s_{i-1}) ||
 * le64(h_i), 1337).  Only full blocks are hashed; a trailing partial block
 * has no hash.  The block directory and the prefix caches are keyed by s_i.
 */
#ifndef KVR_BLOCKHASH_H
#define KVR_BLOCKHASH_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Seed of every block hash. */
#define KVR_BLOCKHASH_SEED 1337u

/** Content hash of one full block of block_size tokens. */
uint64_t kvr_blockhash_block(const uint32_t *tokens, size_t block_size);

/** Chains a block's content hash onto the previous sequence hash. */
uint64_t kvr_blockhash_chain(uint64_t prev_seq, uint64_t block_hash);

/** Sequence hashes of the full blocks of tokens[0..ntokens): writes
 *  min(ntokens / block_size, max_hashes) hashes to hashes and their count to
 *  *count_p.  @return KVR_OK; KVR_ERR_INVALID (block_size 0, NULL pointers
 *  with a non-zero count). */
kvr_status_t kvr_blockhash_seq(const uint32_t *tokens, size_t ntokens, size_t block_size,
                               uint64_t *hashes, size_t max_hashes, size_t *count_p);

#ifdef __cplusplus
}
#endif
#endif
