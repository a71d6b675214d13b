/*
 * test_chat.c - the chat template interpreter without the npm / Python
 * oracles (tests/tokenizer/chat_oracle.mjs compares it with both): known
 * renderings worked out by hand (whitespace control, trim_blocks /
 * lstrip_blocks, loop.*, namespace, macros, filters, slices), bad templates
 * and runaway ones end in errors that name the line and the construct, and
 * kvr_chat_template_load picks a template by name from a list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_chat.h"
#include "kvr_json.h"
#include "kvr_test.h"

static kvr_json_doc_t *msgs_doc;

static const kvr_json_t *msgs(const char *json)
{
    char err[256];
    kvr_json_free(msgs_doc);
    msgs_doc = NULL;
    KVR_CHECK_STATUS(kvr_json_parse(json, strlen(json), &msgs_doc, err, sizeof(err)), KVR_OK);
    return kvr_json_root(msgs_doc);
}

static void expect(const char *tmpl, const char *messages, bool agp, const char *want)
{
    struct kvr_chat_options o = {
        .add_generation_prompt = agp, .bos_token = "<s>", .eos_token = "</s>"};
    char *out = NULL, err[512] = "";
    size_t len = 0;
    kvr_status_t st =
        kvr_chat_render(tmpl, strlen(tmpl), msgs(messages), &o, &out, &len, err, sizeof(err));
    if (st != KVR_OK || len != strlen(want) || memcmp(out, want, len)) {
        fprintf(stderr, "template %s\n  got  %s (%s)\n  want %s\n", tmpl, out ? out : "(null)", err,
                want);
        exit(1);
    }
    free(out);
}

static void expect_fail(const char *tmpl, kvr_status_t want_st, const char *needle)
{
    struct kvr_chat_options o = {.max_steps = 100000, .max_output = 1 << 20};
    char *out = NULL, err[512] = "";
    kvr_status_t st = kvr_chat_render(tmpl, strlen(tmpl), msgs("[{\"role\": \"user\"}]"), &o, &out,
                                      NULL, err, sizeof(err));
    if (st != want_st || !strstr(err, needle)) {
        fprintf(stderr, "template %.80s\n  got %s \"%s\"\n  want %s mentioning \"%s\"\n", tmpl,
                kvr_status_name(st), err, kvr_status_name(want_st), needle);
        exit(1);
    }
}

static void test_render(void)
{
    const char *two = "[{\"role\": \"system\", \"content\": \"Be brief.\"},"
                      " {\"role\": \"user\", \"content\": \"  Hi  \"}]";
    expect("{% for m in messages %}[{{ m.role }}:{{ m.content | trim }}]{% endfor %}", two, false,
           "[system:Be brief.][user:Hi]");
    /* trim_blocks drops the newline after a block tag; lstrip_blocks the
     * indentation before one; "-" strips all whitespace on its side */
    expect("{% if true %}\n  yes\n{% endif %}\n  {% if false %}no{% endif %}end", two, false,
           "  yes\nend");
    expect("a  {{- ' b ' -}}  c\n{#- comment #}\nd", two, false, "a b cd");
    expect("{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}"
           "{% endfor %}",
           two, false, "1/2,2/2");
    expect("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + "
           "m.content|length %}{% endfor %}{{ ns.n }}",
           two, false, "15");
    expect("{% set x = 1 %}{% for m in messages %}{% set x = 2 %}{% endfor %}{{ x }}", two, false,
           "1"); /* set in a loop does not leak (why templates use namespace) */
    expect("{% macro tag(name, body='-') %}<{{ name }}>{{ body }}{% endmacro %}{{ tag('a') }}"
           "{{ tag('b', body='x') }}",
           two, false, "<a>-<b>x");
    expect("{{ messages[-1].content.strip().upper() }}|{{ 'a,b,,c'.split(',') | length }}|"
           "{{ 'abc'[::-1] }}|{{ [1, 2, 3][1:] }}|{{ {'k': [1, 'x']} | tojson }}",
           two, false, "HI|4|cba|[2, 3]|{\"k\": [1, \"x\"]}");
    expect("{{ bos_token }}{% if add_generation_prompt %}GO{% endif %}{{ eos_token }}", two, true,
           "<s>GO</s>");
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 'x' ~ 1 }} {{ 3 "
           "is odd }} {{ none is none }} {{ 'b' in 'abc' }} {{ 1.0 }}",
           two, false, "3 -4 1 1024 0.25 x1 True True True 1.0");
    expect("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}", two, false,
           "a=1;b=2;");
    expect("{% for m in messages if m.role == 'user' %}{{ m.role }}{% else %}none{% endfor %}", two,
           false, "user");
    expect("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}", two,
           false, "012");
    expect("{% set parts = [{'type': 'text', 'text': 'a'}, {'type': 'image'}] %}"
           "{{ parts | selectattr('type', 'equalto', 'text') | map(attribute='text') | join }}",
           two, false, "a");
}

static void test_errors(void)
{
    expect_fail("{% if x %}open", KVR_ERR_INVALID, "line 1: {% if %} is never closed");
    expect_fail("a\nb\n{% include 'x' %}", KVR_ERR_UNSUPPORTED, "line 3: the {% include %}");
    expect_fail("{{ x | nosuchfilter }}", KVR_ERR_UNSUPPORTED, "\"nosuchfilter\" filter");
    expect_fail("{{ x is nosuchtest }}", KVR_ERR_UNSUPPORTED, "\"is nosuchtest\" test");
    expect_fail("{{ raise_exception('bad roles') }}", KVR_ERR_INVALID, "bad roles");
    expect_fail("{% for i in range(1000000000) %}{% endfor %}", KVR_ERR_OVERLOAD, "steps");
    expect_fail("{% set ns = namespace(i=0) %}{% for a in range(300) %}{% for b in range(300) "
                "%}{% set ns.i = ns.i + 1 %}{% endfor %}{% endfor %}",
                KVR_ERR_OVERLOAD, "steps");
    expect_fail("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", KVR_ERR_OVERLOAD,
                "deeper than 64");
    expect_fail("{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}", KVR_ERR_OVERLOAD,
                "max_output");
    char deep[4200];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof(deep), "{{ ");
    for (int i = 0; i < 2000; i++)
        deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 2000; i++)
        deep[n++] = ')';
    snprintf(deep + n, sizeof(deep) - n, " }}");
    expect_fail(deep, KVR_ERR_OVERLOAD, "nesting deeper than 128");
    expect_fail("{{ undefined_thing.attr }}", KVR_ERR_INVALID, "undefined");
    expect_fail("{{ 'a' + 1 }}", KVR_ERR_INVALID, "string and integer");
    expect_fail("{{ 'unclosed }}", KVR_ERR_INVALID, "never closed");
}

static void test_load(void)
{
    char dir[256];
    KVR_CHECK(kvr_test_mkdtemp(dir, sizeof dir, "kvr_test_chat"));
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    KVR_CHECK(f != NULL);
    fputs("{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\", \"chat_template\": ["
          "{\"name\": \"default\", \"template\": \"D\"}, {\"name\": \"tool_use\", "
          "\"template\": \"T\"}]}",
          f);
    fclose(f);
    char *t = NULL, *bos = NULL, *eos = NULL, err[512];
    KVR_CHECK_STATUS(kvr_chat_template_load(dir, NULL, &t, &bos, &eos, err, sizeof(err)), KVR_OK);
    KVR_CHECK(!strcmp(t, "D") && !strcmp(bos, "<s>") && !strcmp(eos, "</s>"));
    free(t);
    free(bos);
    free(eos);
    KVR_CHECK_STATUS(kvr_chat_template_load(path, "tool_use", &t, NULL, NULL, err, sizeof(err)),
                     KVR_OK);
    KVR_CHECK(!strcmp(t, "T"));
    free(t);
    KVR_CHECK_STATUS(kvr_chat_template_load(dir, "rag", &t, NULL, NULL, err, sizeof(err)),
                     KVR_ERR_NOT_FOUND);
    KVR_CHECK(strstr(err, "default, tool_use") != NULL);
    kvr_test_rmtree(dir);
}

int main(void)
{
    test_render();
    test_errors();
    test_load();
    kvr_json_free(msgs_doc);
    printf("chat: ok\n");
    return 0;
}
