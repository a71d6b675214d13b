/*
 * test_json.c - common/json.c: values, escapes, strictness, error positions,
 * typed getters, escaping, files.
 */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvr_json.h"
#include "kvr_test.h"

static kvr_json_doc_t *parse_ok(const char *s)
{
    kvr_json_doc_t *d = NULL;
    char err[256];
    kvr_status_t st = kvr_json_parse(s, strlen(s), &d, err, sizeof(err));
    if (st != KVR_OK)
        fprintf(stderr, "unexpected failure on %s: %s\n", s, err);
    KVR_CHECK_STATUS(st, KVR_OK);
    KVR_CHECK(d != NULL);
    return d;
}

/* Must fail; the error must contain want (if non-NULL). */
static void parse_bad(const char *s, size_t len, const char *want)
{
    kvr_json_doc_t *d = NULL;
    char err[256];
    kvr_status_t st = kvr_json_parse(s, len, &d, err, sizeof(err));
    if (st == KVR_OK)
        fprintf(stderr, "accepted invalid JSON: %.*s\n", (int)len, s);
    KVR_CHECK_STATUS(st, KVR_ERR_INVALID);
    KVR_CHECK(d == NULL);
    KVR_CHECK(strstr(err, "line ") != NULL);
    if (want && !strstr(err, want)) {
        fprintf(stderr, "error for %.*s is '%s', want '%s'\n", (int)len, s, err, want);
        exit(1);
    }
}

static void test_values(void)
{
    kvr_json_doc_t *d = parse_ok(" {\"a\": 1, \"b\": [true, false, null], \"c\": -12.5e1,"
                                 " \"d\": \"x\\u00e9\\ud83d\\ude00\\n\\\"\", \"big\": "
                                 "123456789012345678901234567890, \"i\": -9007199254740993,"
                                 " \"e\": {}, \"f\": [], \"a\": 2}\n");
    const kvr_json_t *r = kvr_json_root(d);
    KVR_CHECK(r->type == KVR_JSON_OBJECT);
    KVR_CHECK_EQ(r->n, 9);
    KVR_CHECK(strcmp(r->keys[1], "b") == 0); /* file order */
    bool ok = true;
    KVR_CHECK_EQ(kvr_json_get_int(r, "a", 0, &ok), 1); /* first match */
    KVR_CHECK(ok);
    const kvr_json_t *b = kvr_json_get(r, "b");
    KVR_CHECK(b && b->type == KVR_JSON_ARRAY && b->n == 3);
    KVR_CHECK(kvr_json_at(b, 0)->type == KVR_JSON_BOOL && kvr_json_at(b, 0)->b);
    KVR_CHECK(!kvr_json_at(b, 1)->b);
    KVR_CHECK(kvr_json_at(b, 2)->type == KVR_JSON_NULL);
    KVR_CHECK(kvr_json_at(b, 3) == NULL);
    KVR_CHECK(kvr_json_get_num(r, "c", 0, &ok) == -125.0);
    KVR_CHECK(!kvr_json_get(r, "c")->is_int);
    const char *dstr = kvr_json_get_str(r, "d", NULL, &ok);
    KVR_CHECK(dstr && strcmp(dstr, "x\xc3\xa9\xf0\x9f\x98\x80\n\"") == 0);
    KVR_CHECK_EQ(kvr_json_get(r, "d")->len, 9);
    const kvr_json_t *big = kvr_json_get(r, "big");
    KVR_CHECK(!big->is_int && big->num > 1.2e29);
    KVR_CHECK(kvr_json_get(r, "i")->is_int);
    KVR_CHECK(kvr_json_get(r, "i")->i64 == -9007199254740993LL); /* exact, not via double */
    KVR_CHECK_EQ(kvr_json_get(r, "e")->n, 0);
    KVR_CHECK(kvr_json_get(r, "e")->type == KVR_JSON_OBJECT);
    KVR_CHECK(kvr_json_get(r, "f")->type == KVR_JSON_ARRAY);
    /* defaults and type mismatches */
    ok = true;
    KVR_CHECK_EQ(kvr_json_get_int(r, "missing", 7, &ok), 7);
    KVR_CHECK(ok);
    KVR_CHECK_EQ(kvr_json_get_int(r, "d", 7, &ok), 7);
    KVR_CHECK(!ok);
    ok = true;
    KVR_CHECK_EQ(kvr_json_get_int(r, "c", 7, &ok), 7); /* not an integer */
    KVR_CHECK(!ok);
    ok = true;
    KVR_CHECK(kvr_json_get_bool(r, "a", true, &ok) && !ok);
    KVR_CHECK(kvr_json_get(b, "x") == NULL); /* not an object */
    kvr_json_free(d);

    /* NUL inside a string, scalars at the root */
    d = parse_ok("\"a\\u0000b\"");
    KVR_CHECK_EQ(kvr_json_root(d)->len, 3);
    KVR_CHECK(kvr_json_root(d)->str[1] == '\0');
    kvr_json_free(d);
    d = parse_ok("0");
    KVR_CHECK(kvr_json_root(d)->is_int && kvr_json_root(d)->i64 == 0);
    kvr_json_free(d);
    d = parse_ok("\xef\xbb\xbf[1]");
    kvr_json_free(d);
}

static void test_strict(void)
{
#define BAD(s, w) parse_bad(s, sizeof(s) - 1, w)
    BAD("", "end of input");
    BAD("   ", "end of input");
    BAD("[1,]", "trailing comma");
    BAD("{\"a\":1,}", "trailing comma");
    BAD("{\"a\" 1}", "expected ':'");
    BAD("{a:1}", "string key");
    BAD("[01]", "leading zero");
    BAD("[1.]", "after '.'");
    BAD("[1e]", "exponent");
    BAD("[-]", "digit");
    BAD("[NaN]", "expected a value");
    BAD("[Infinity]", "expected a value");
    BAD("[tru]", "expected a value");
    BAD("[1] x", "after the end");
    BAD("[1 2]", "expected ',' or ']'");
    BAD("\"abc", "unterminated");
    BAD("\"a\tb\"", "control character");
    BAD("\"\\x\"", "invalid escape");
    BAD("\"\\u12g4\"", "hex digit");
    BAD("\"\\ud800\"", "surrogate");
    BAD("\"\\udc00\"", "lone low surrogate");
    BAD("\"\xff\"", "UTF-8");
    BAD("\"\xc0\xaf\"", "UTF-8");     /* overlong */
    BAD("\"\xed\xa0\x80\"", "UTF-8"); /* encoded surrogate */
    BAD("// c\n1", NULL);
    BAD("[1] /* c */", NULL);
    BAD("'a'", NULL);
    BAD("[1,\n 2,\n x]", "line 3 col 2");
    parse_bad("[1, \0]", 6, "byte 0x00");
#undef BAD
    /* depth limit: 512 ok, 513 refused */
    char *deep = malloc(2 * 513 + 1);
    for (int i = 0; i < 512; i++) {
        deep[i] = '[';
        deep[512 + i] = ']';
    }
    deep[1024] = '\0';
    kvr_json_free(parse_ok(deep));
    for (int i = 0; i < 513; i++) {
        deep[i] = '[';
        deep[513 + i] = ']';
    }
    parse_bad(deep, 1026, "nesting deeper");
    free(deep);
}

static void test_large(void)
{
    /* many members: exercises the child stack and arena chunking */
    size_t cap = 4 << 20, o = 0;
    char *s = malloc(cap);
    o += (size_t)sprintf(s + o, "{");
    for (int i = 0; i < 50000; i++)
        o += (size_t)sprintf(s + o, "%s\"tok%d\": [%d, \"v%d\"]", i ? "," : "", i, i, i);
    o += (size_t)sprintf(s + o, "}");
    kvr_json_doc_t *d = parse_ok(s);
    const kvr_json_t *r = kvr_json_root(d);
    KVR_CHECK_EQ(r->n, 50000);
    KVR_CHECK_EQ(kvr_json_at(kvr_json_get(r, "tok49999"), 0)->i64, 49999);
    KVR_CHECK(strcmp(kvr_json_at(kvr_json_get(r, "tok123"), 1)->str, "v123") == 0);
    kvr_json_free(d);
    free(s);
}

static void test_escape(void)
{
    char buf[64];
    size_t n = kvr_json_escape(buf, sizeof(buf), "a\"b\\c\n\x01\xc3\xa9", 9);
    KVR_CHECK(strcmp(buf, "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"") == 0);
    KVR_CHECK_EQ(n, strlen(buf));
    /* invalid UTF-8 becomes U+FFFD so the output stays valid JSON */
    n = kvr_json_escape(buf, sizeof(buf), "x\xe2\x82", 3);
    KVR_CHECK(strcmp(buf, "\"x\\ufffd\\ufffd\"") == 0);
    /* truncation: returns the needed length, output NUL-terminated */
    char small[4];
    n = kvr_json_escape(small, sizeof(small), "abcdef", 6);
    KVR_CHECK_EQ(n, 8);
    KVR_CHECK(strcmp(small, "\"ab") == 0);
    /* round trip */
    const char *raw = "tab\there \"q\" \\ \x7f end";
    n = kvr_json_escape(buf, sizeof(buf), raw, strlen(raw));
    kvr_json_doc_t *d = parse_ok(buf);
    KVR_CHECK(strcmp(kvr_json_root(d)->str, raw) == 0);
    kvr_json_free(d);
}

static void test_file(void)
{
    char path[] = "/tmp/kvr_test_json_XXXXXX";
    int fd = mkstemp(path);
    KVR_CHECK(fd >= 0);
    const char *s = "{\"x\": [1,\n2,]}";
    KVR_CHECK(write(fd, s, strlen(s)) == (ssize_t)strlen(s));
    close(fd);
    kvr_json_doc_t *d = NULL;
    char err[512];
    KVR_CHECK_STATUS(kvr_json_parse_file(path, &d, err, sizeof(err)), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, path) && strstr(err, "line 2"));
    unlink(path);
    KVR_CHECK_STATUS(kvr_json_parse_file(path, &d, err, sizeof(err)), KVR_ERR_NOT_FOUND);
    KVR_CHECK(strstr(err, path) != NULL);
}

int main(void)
{
    test_values();
    test_strict();
    test_large();
    test_escape();
    test_file();
    printf("json: ok\n");
    return 0;
}
