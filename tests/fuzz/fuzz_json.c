/*
 * fuzz_json.c - fuzz target over common/json.c: parses the input and walks
 * the whole tree, reading every number as an integer and a double (the
 * float-to-int conversion of a number outside int64 was undefined
 * behaviour), every string, and every member by its key.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t walk(const kvr_json_t *v, int depth)
{
    size_t n = 1;
    switch (v->type) {
    case KVR_JSON_NUMBER:
        /* a number outside int64 saturates (the cast was undefined; on
         * x86-64 it gave INT64_MIN for 1e300): checked here so the plain
         * driver catches it without UBSan too */
        if (!v->is_int && v->num >= 9223372036854775808.0 && v->i64 != INT64_MAX)
            abort();
        if (!v->is_int && v->num < -9223372036854775808.0 && v->i64 != INT64_MIN)
            abort();
        n += (size_t)(v->i64 & 1) + (v->num > 0);
        break;
    case KVR_JSON_STRING:
        n += strlen(v->str) <= v->len;
        break;
    case KVR_JSON_ARRAY:
        for (size_t i = 0; i < v->n; i++)
            n += walk(kvr_json_at(v, i), depth + 1);
        break;
    case KVR_JSON_OBJECT:
        for (size_t i = 0; i < v->n; i++) {
            bool ok = true;
            n += (size_t)kvr_json_get_int(v, v->keys[i], 0, &ok) & 1;
            n += kvr_json_get_num(v, v->keys[i], 0, &ok) > 0;
            n += kvr_json_get(v, v->keys[i]) != NULL;
            n += walk(v->items[i], depth + 1);
        }
        break;
    default:
        break;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvr_json_doc_t *doc = NULL;
    char err[256];
    if (kvr_json_parse((const char *)data, size, &doc, err, sizeof(err)) != 0)
        return 0;
    volatile size_t n = walk(kvr_json_root(doc), 0);
    (void)n;
    kvr_json_free(doc);
    return 0;
}
