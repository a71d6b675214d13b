/*
 * tokenizer_unicode.h - private to the tokenizer: the generated Unicode tables
 * (tokenizer_unicode.c) and the lookups over them (tokenizer_text.c):
 * category tests for the pre-tokenizer regexes, UTF-8 stepping, NFC.
 */
#ifndef KVR_TOKENIZER_UNICODE_H
#define KVR_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern const char kvr_unicode_version[];
extern const uint32_t kvr_uni_letter[][2];
extern const size_t kvr_uni_letter_n;
extern const uint32_t kvr_uni_number[][2];
extern const size_t kvr_uni_number_n;
extern const uint32_t kvr_uni_ccc[][3];
extern const size_t kvr_uni_ccc_n;
extern const uint32_t kvr_uni_decomp_cp[];
extern const size_t kvr_uni_decomp_cp_n;
extern const uint32_t kvr_uni_decomp_at[];
extern const size_t kvr_uni_decomp_at_n;
extern const uint32_t kvr_uni_decomp_pool[];
extern const size_t kvr_uni_decomp_pool_n;
extern const uint32_t kvr_uni_comp[][3];
extern const size_t kvr_uni_comp_n;

bool kvr_uni_is_letter(uint32_t cp);
bool kvr_uni_is_number(uint32_t cp);
/** Unicode White_Space (what Oniguruma's \s matches). */
bool kvr_uni_is_space(uint32_t cp);

enum { KVR_UTF8_OK = 0, KVR_UTF8_INVALID = 1, KVR_UTF8_TRUNCATED = 2 };

/** Scans one UTF-8 sequence at s[0..n) (n >= 1).  Returns its length and sets
 *  *state_p: KVR_UTF8_OK (*cp_p the code point); KVR_UTF8_INVALID (the length
 *  is the "maximal subpart" that one U+FFFD replaces, as TextDecoder and
 *  Rust's from_utf8_lossy do); KVR_UTF8_TRUNCATED (s ends inside a sequence
 *  that is valid so far; the length is n). */
size_t kvr_utf8_scan(const unsigned char *s, size_t n, uint32_t *cp_p, int *state_p);
/** One character or one invalid byte: returns 1-4; an invalid byte gives
 *  *cp_p = 0x8000FFFD (not a character). */
size_t kvr_utf8_next(const unsigned char *s, size_t n, uint32_t *cp_p);
/** Writes cp as UTF-8 into out (4 bytes room); returns the length. */
size_t kvr_utf8_put(uint32_t cp, char *out);

/** NFC of s[0..n) into a malloc'd buffer (*out_p, *out_len_p).  Invalid UTF-8
 *  bytes are kept as they are.  Returns false when out of memory. */
bool kvr_uni_nfc(const char *s, size_t n, char **out_p, size_t *out_len_p);

#endif
