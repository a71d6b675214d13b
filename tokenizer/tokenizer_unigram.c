/*
 * tokenizer_unigram.c - the Unigram model (sentencepiece unigram): each
 * word is cut into the vocabulary pieces with the highest total score
 * (Viterbi over the lattice of pieces that match at each byte).
 *
 * As Hugging Face's tokenizers does it: a position no single-character piece
 * covers gets an unknown node of one character scored min_score - 10;
 * among equal scores the path found first wins (pieces are tried by start
 * position, then length); consecutive unknowns fuse into one, which
 * byte_fallback spells as <0xXX> tokens when all its bytes have one, else
 * unk_id.  Pieces are looked up in the piece map for every length up to the
 * longest piece, so a word costs O(bytes x longest piece).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

kvr_status_t kvr_tok_unigram_word(const kvr_tokenizer_t *t, struct ids *out, const char *w,
                                  size_t n)
{
    if (n == 0)
        return KVR_OK;
    double *best = malloc((n + 1) * sizeof(double));
    int32_t *from = malloc((n + 1) * sizeof(int32_t)); /* start of the last piece */
    int32_t *id = malloc((n + 1) * sizeof(int32_t));   /* its id, -1 unknown */
    int32_t *path = malloc((n + 1) * sizeof(int32_t));
    kvr_status_t st = KVR_OK;
    if (!best || !from || !id || !path) {
        st = KVR_ERR_NO_MEMORY;
        goto out;
    }
    for (size_t i = 0; i <= n; i++) {
        best[i] = -INFINITY;
        from[i] = -1;
    }
    best[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (best[i] == -INFINITY)
            continue;
        uint32_t cp;
        size_t cl = kvr_utf8_next((const unsigned char *)w + i, n - i, &cp);
        bool single = false;
        size_t maxl = n - i < t->uni_max_len ? n - i : t->uni_max_len;
        for (size_t l = 1; l <= maxl; l++) {
            int32_t p = kvr_tok_strmap_get(&t->pieces, w + i, l);
            if (p < 0 || p >= t->uni_n || !isfinite(t->uni_score[p]))
                continue;
            if (l == cl)
                single = true;
            double s = best[i] + t->uni_score[p];
            if (s > best[i + l]) {
                best[i + l] = s;
                from[i + l] = (int32_t)i;
                id[i + l] = p;
            }
        }
        if (!single) {
            double s = best[i] + t->uni_unk_score;
            if (s > best[i + cl]) {
                best[i + cl] = s;
                from[i + cl] = (int32_t)i;
                id[i + cl] = -1;
            }
        }
    }
    /* back from the end; the path in reverse */
    size_t np = 0;
    for (int32_t e = (int32_t)n; e > 0; e = from[e])
        path[np++] = e;
    for (size_t k = np; k-- > 0;) {
        int32_t e = path[k], s = from[e];
        if (id[e] >= 0) {
            if (!kvr_tok_ids_put(out, id[e])) {
                st = KVR_ERR_NO_MEMORY;
                goto out;
            }
            continue;
        }
        /* an unknown run: fuse the following unknowns into it */
        while (k > 0 && id[path[k - 1]] < 0)
            e = path[--k];
        bool bytes = t->byte_fallback;
        for (int32_t b = s; bytes && b < e; b++)
            bytes = t->byte_id[(unsigned char)w[b]] >= 0;
        if (bytes) {
            for (int32_t b = s; b < e; b++)
                if (!kvr_tok_ids_put(out, t->byte_id[(unsigned char)w[b]])) {
                    st = KVR_ERR_NO_MEMORY;
                    goto out;
                }
        } else if (t->unk_id < 0) {
            st = KVR_ERR_INVALID; /* the loader refuses a Unigram model without unk_id */
            goto out;
        } else if (!kvr_tok_ids_put(out, t->unk_id)) {
            st = KVR_ERR_NO_MEMORY;
            goto out;
        }
    }
out:
    free(best);
    free(from);
    free(id);
    free(path);
    return st;
}
