/*
 * kvr_json.h - a small strict JSON (RFC 8259) DOM parser, for config.json,
 * tokenizer.json, safetensors headers and test fixtures.
 *
 * kvr_json_parse() builds the whole tree in one allocation arena owned by the
 * returned document; kvr_json_free() releases it.  Strings are unescaped to
 * UTF-8 (\uXXXX surrogate pairs joined) and NUL-terminated; their byte length
 * is kept too (they may contain NUL).  Object members keep file order.
 * Errors give the byte offset, line and column and what was expected.
 */
#ifndef KVR_JSON_H
#define KVR_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

#include "kvr_status.h"

enum kvr_json_type {
    KVR_JSON_NULL,
    KVR_JSON_BOOL,
    KVR_JSON_NUMBER,
    KVR_JSON_STRING,
    KVR_JSON_ARRAY,
    KVR_JSON_OBJECT,
};

typedef struct kvr_json kvr_json_t; /* a value */
typedef struct kvr_json_doc kvr_json_doc_t;

struct kvr_json {
    enum kvr_json_type type;
    union {
        bool b;
        struct {
            double num;
            int64_t i64; /* exact when the literal was an integer that fits */
            bool is_int;
        };
        struct {
            const char *str; /* NUL-terminated UTF-8 */
            size_t len;
        };
        struct {
            size_t n;           /* array elements or object members */
            kvr_json_t **items; /* values */
            const char **keys;  /* objects only: NUL-terminated keys */
            size_t *key_lens;
        };
    };
};

/** Parses buf[0..len).  Nesting deeper than 512 is refused.
 *  @return KVR_OK; KVR_ERR_INVALID (syntax error, described in err);
 *          KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_json_parse(const char *buf, size_t len, kvr_json_doc_t **doc_p, char *err,
                            size_t err_len);
/** Reads and parses a file; err names the file. */
kvr_status_t kvr_json_parse_file(const char *path, kvr_json_doc_t **doc_p, char *err,
                                 size_t err_len);
void kvr_json_free(kvr_json_doc_t *doc);
const kvr_json_t *kvr_json_root(const kvr_json_doc_t *doc);

/** Member of an object by key (first match), NULL if absent or v not an object. */
const kvr_json_t *kvr_json_get(const kvr_json_t *v, const char *key);
/** Element i of an array, NULL if out of range. */
const kvr_json_t *kvr_json_at(const kvr_json_t *v, size_t i);

/* Typed getters with defaults: the default is returned when the key is
 * absent or JSON null; *ok (if non-NULL) is set false on a type mismatch. */
int64_t kvr_json_get_int(const kvr_json_t *obj, const char *key, int64_t def, bool *ok);
double kvr_json_get_num(const kvr_json_t *obj, const char *key, double def, bool *ok);
bool kvr_json_get_bool(const kvr_json_t *obj, const char *key, bool def, bool *ok);
const char *kvr_json_get_str(const kvr_json_t *obj, const char *key, const char *def, bool *ok);

/** Appends s as a JSON string literal (quotes, escapes) into buf; returns the
 *  length it needs (like snprintf). */
size_t kvr_json_escape(char *buf, size_t cap, const char *s, size_t len);

/** Writes s as a JSON string literal to f (any length). */
void kvr_json_fput_str(FILE *f, const char *s, size_t len);

#endif
