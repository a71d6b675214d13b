/*
 * tokenizer_unicode.h - private to the tokenizer: the Unicode primitives
 * (tokenizer_text.c): UTF-8 stepping, the \p{L} / \p{N} / \s tests of the
 * hand-written pre-tokenizer matchers, and normalization (NFC, NFD, NFKC,
 * NFKD), all on libutf8proc's tables.
 */
#ifndef KVR_TOKENIZER_UNICODE_H
#define KVR_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

bool kvr_uni_is_letter(uint32_t cp);
bool kvr_uni_is_number(uint32_t cp);
/** Unicode White_Space (what Oniguruma's \s matches). */
bool kvr_uni_is_space(uint32_t cp);
/** The Unicode version of the tables (utf8proc's). */
const char *kvr_uni_version(void);

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

enum kvr_uni_form { KVR_UNI_NFC, KVR_UNI_NFD, KVR_UNI_NFKC, KVR_UNI_NFKD };

/** The normal form of s[0..n) into a malloc'd, NUL-terminated buffer
 *  (*out_p, *out_len_p).  Invalid UTF-8 bytes are kept as they are (each one
 *  ends the run of text normalized together).  Text in which no code point
 *  can change under the form (ASCII, or every code point outside the form's
 *  quick-check set) is copied without calling utf8proc.  Returns false when
 *  out of memory. */
bool kvr_uni_normalize(enum kvr_uni_form form, const char *s, size_t n, char **out_p,
                       size_t *out_len_p);
/** True when some code point of s[0..n) may change under the form (the
 *  quick check that decides between the copy and utf8proc). */
bool kvr_uni_may_change(enum kvr_uni_form form, const char *s, size_t n);

#endif
