/*
 * chat_config.c - finds a model's chat template in tokenizer_config.json:
 * "chat_template" as one string, or as a list of {"name", "template"} from
 * which one is chosen by name; bos_token / eos_token as strings or as
 * {"content": ...} objects.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvr_chat.h"

static char *dup_str(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static const kvr_json_t *token_str(const kvr_json_t *v)
{
    if (v && v->type == KVR_JSON_OBJECT)
        v = kvr_json_get(v, "content");
    return v && v->type == KVR_JSON_STRING ? v : NULL;
}

kvr_status_t kvr_chat_template_load(const char *path, const char *name, char **tmpl_p, char **bos_p,
                                    char **eos_p, char *err, size_t err_len)
{
    if (!path || !tmpl_p)
        return KVR_ERR_INVALID;
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof(file), "%s/tokenizer_config.json", path);
    else
        snprintf(file, sizeof(file), "%s", path);
    kvr_json_doc_t *doc = NULL;
    char jerr[512];
    kvr_status_t st = kvr_json_parse_file(file, &doc, jerr, sizeof(jerr));
    if (st != KVR_OK) {
        snprintf(err, err_len, "%s", jerr);
        return st == KVR_ERR_NOT_FOUND || st == KVR_ERR_NO_MEMORY ? st : KVR_ERR_INVALID;
    }
    const kvr_json_t *root = kvr_json_root(doc);
    const kvr_json_t *ct = kvr_json_get(root, "chat_template");
    const kvr_json_t *pick = NULL;
    st = KVR_OK;
    if (ct && ct->type == KVR_JSON_STRING) {
        pick = ct;
    } else if (ct && ct->type == KVR_JSON_ARRAY) {
        const char *want = name ? name : "default";
        char names[512] = "";
        for (size_t i = 0; i < ct->n; i++) {
            const char *nm = kvr_json_get_str(ct->items[i], "name", NULL, NULL);
            const kvr_json_t *tp = kvr_json_get(ct->items[i], "template");
            if (!nm || !tp || tp->type != KVR_JSON_STRING)
                continue;
            if (strlen(names) + strlen(nm) + 3 < sizeof(names))
                snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                         names[0] ? ", " : "", nm);
            if (!strcmp(nm, want) || (!name && ct->n == 1))
                pick = tp;
        }
        if (!pick) {
            snprintf(err, err_len, "%s: no chat template named \"%s\" (there are: %s)", file, want,
                     names);
            st = KVR_ERR_NOT_FOUND;
        }
    } else {
        snprintf(err, err_len, "%s: no \"chat_template\" (a string or a list of named templates)",
                 file);
        st = KVR_ERR_NOT_FOUND;
    }
    if (st == KVR_OK) {
        *tmpl_p = dup_str(pick->str, pick->len);
        const kvr_json_t *b = token_str(kvr_json_get(root, "bos_token"));
        const kvr_json_t *e = token_str(kvr_json_get(root, "eos_token"));
        if (bos_p)
            *bos_p = b ? dup_str(b->str, b->len) : NULL;
        if (eos_p)
            *eos_p = e ? dup_str(e->str, e->len) : NULL;
        if (!*tmpl_p || (bos_p && b && !*bos_p) || (eos_p && e && !*eos_p))
            st = KVR_ERR_NO_MEMORY;
    }
    kvr_json_free(doc);
    return st;
}
