/*
 * render.c - `kvrail cluster render`: writes a concrete cluster file from a
 * template cluster file and a list of hosts (what a scheduler allocated).
 *
 *   kvrail cluster render --template FILE (--hosts H1,H2,... | --hosts-file F)
 *                         [--prefill N] [--decode M] [--model DIR] [-o OUT]
 *
 * The template is itself a valid cluster file (it runs as it is with `kvrail
 * up`); it is checked with kvr_cluster_load() first.  The output is the
 * template's YAML document with every key kept as written (copied node by
 * node with libyaml, so keys this file does not know survive) except:
 *   - router.client / router.node: the host part of tcp://HOST:PORT becomes
 *     the router's host; router.client_bind / node_bind are added as
 *     tcp://0.0.0.0:PORT unless the template gives them;
 *   - model: --model, else the template's path made absolute against the
 *     template's directory (the output may be written elsewhere);
 *   - nodes: with --prefill / --decode, N prefill nodes prefill0.. and M
 *     decode nodes decode0.. are generated, each a copy of the template's
 *     first node of that role (its name and host replaced); the router node
 *     is the template's router node.  Without them the template's nodes are
 *     kept.  Hosts: a host written `$K` is the K-th host of the list (from
 *     0); a node without a host or on localhost gets one: the router the
 *     first host, the other nodes the hosts in turn (node i of the
 *     prefill-then-decode order on host i mod H); any other host is kept.
 * The result is parsed again with kvr_cluster_parse() before it is written,
 * so a rendered file always loads.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "kvr_cluster.h"
#include "kvr_cmd.h"

#define RENDER_MAX_HOSTS 4096
#define RENDER_MAX_NODES 4096

struct render {
    yaml_document_t in, out;
    char **hosts;
    size_t n_hosts;
    size_t next_host; /* round-robin over hosts for worker nodes */
    char err[512];
};

static const char render_usage[] =
    "usage: kvrail cluster render --template FILE (--hosts H1,H2,... | --hosts-file FILE)\n"
    "                             [--prefill N] [--decode M] [--model DIR] [-o OUT]\n";

static const char *scalar_of(yaml_document_t *d, const yaml_node_t *n)
{
    (void)d;
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int add_str(yaml_document_t *d, const char *s)
{
    return yaml_document_add_scalar(d, NULL, (yaml_char_t *)s, (int)strlen(s),
                                    YAML_ANY_SCALAR_STYLE);
}

static int copy_node(struct render *r, int id, const char *const *skip);

/* Appends deep copies of the pairs of input mapping n to output mapping m,
 * leaving out the keys in skip (NULL-terminated, may be NULL). */
static bool copy_pairs(struct render *r, const yaml_node_t *n, int m, const char *const *skip)
{
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar_of(&r->in, yaml_document_get_node(&r->in, p->key));
        bool skipped = false;
        for (const char *const *s = skip; s && *s && k; s++)
            skipped |= !strcmp(*s, k);
        if (skipped)
            continue;
        int kc = copy_node(r, p->key, NULL), vc = copy_node(r, p->value, NULL);
        if (!kc || !vc || !yaml_document_append_mapping_pair(&r->out, m, kc, vc))
            return false;
    }
    return true;
}

/* Deep copy of node id from in to out; skip (may be NULL) names mapping keys
 * to leave out.  Returns the new id, 0 on failure. */
static int copy_node(struct render *r, int id, const char *const *skip)
{
    yaml_node_t *n = yaml_document_get_node(&r->in, id);
    if (!n)
        return 0;
    switch (n->type) {
    case YAML_SCALAR_NODE:
        return yaml_document_add_scalar(&r->out, NULL, n->data.scalar.value,
                                        (int)n->data.scalar.length, n->data.scalar.style);
    case YAML_SEQUENCE_NODE: {
        int s = yaml_document_add_sequence(&r->out, NULL, YAML_BLOCK_SEQUENCE_STYLE);
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             s && it < n->data.sequence.items.top; it++) {
            int c = copy_node(r, *it, NULL);
            if (!c || !yaml_document_append_sequence_item(&r->out, s, c))
                return 0;
        }
        return s;
    }
    case YAML_MAPPING_NODE: {
        int m = yaml_document_add_mapping(&r->out, NULL, YAML_BLOCK_MAPPING_STYLE);
        return m && copy_pairs(r, n, m, skip) ? m : 0;
    }
    default:
        return 0;
    }
}

static bool add_pair(struct render *r, int map, const char *k, const char *v)
{
    int kc = add_str(&r->out, k), vc = add_str(&r->out, v);
    return kc && vc && yaml_document_append_mapping_pair(&r->out, map, kc, vc);
}

/* The value of key k in mapping map of the input document, or NULL. */
static yaml_node_t *map_get(struct render *r, const yaml_node_t *map, const char *k)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        const char *s = scalar_of(&r->in, yaml_document_get_node(&r->in, p->key));
        if (s && !strcmp(s, k))
            return yaml_document_get_node(&r->in, p->value);
    }
    return NULL;
}

static bool is_localhost(const char *h)
{
    return !h || !strcmp(h, "localhost") || !strcmp(h, "127.0.0.1") || !strcmp(h, "::1");
}

/* The host a node gets: see the file comment. */
static const char *place(struct render *r, const char *tmpl_host, bool router)
{
    if (tmpl_host && tmpl_host[0] == '$') {
        char *end;
        errno = 0;
        unsigned long k = strtoul(tmpl_host + 1, &end, 10);
        if (errno || *end || end == tmpl_host + 1 || k >= r->n_hosts) {
            snprintf(r->err, sizeof(r->err),
                     "host '%s' does not name one of the %zu hosts ($0..$%zu)", tmpl_host,
                     r->n_hosts, r->n_hosts - 1);
            return NULL;
        }
        return r->hosts[k];
    }
    if (!is_localhost(tmpl_host))
        return tmpl_host;
    if (router)
        return r->hosts[0];
    return r->hosts[r->next_host++ % r->n_hosts];
}

/* One node of the output: a copy of the template node proto without name
 * and host, then name and host. */
static bool emit_node(struct render *r, int seq, const yaml_node_t *proto, const char *name,
                      const char *role)
{
    static const char *const skip[] = {"name", "host", NULL};
    const char *th = scalar_of(&r->in, map_get(r, proto, "host"));
    const char *host = place(r, th, !strcmp(role, "router"));
    if (!host)
        return false;
    int m = yaml_document_add_mapping(&r->out, NULL, YAML_BLOCK_MAPPING_STYLE);
    if (!m || !add_pair(r, m, "name", name) || !add_pair(r, m, "host", host))
        return false;
    if (proto) {
        if (!copy_pairs(r, proto, m, skip))
            return false;
    } else if (!add_pair(r, m, "role", role)) {
        return false;
    }
    return yaml_document_append_sequence_item(&r->out, seq, m);
}

static int find_role(struct render *r, const yaml_node_t *nodes, const char *role)
{
    for (yaml_node_item_t *it = nodes->data.sequence.items.start;
         it < nodes->data.sequence.items.top; it++) {
        const char *s = scalar_of(&r->in, map_get(r, yaml_document_get_node(&r->in, *it), "role"));
        if (s && !strcmp(s, role))
            return *it;
    }
    return 0;
}

static bool emit_nodes(struct render *r, int root, const yaml_node_t *nodes, long n_prefill,
                       long n_decode)
{
    int seq = yaml_document_add_sequence(&r->out, NULL, YAML_BLOCK_SEQUENCE_STYLE);
    int kc = add_str(&r->out, "nodes");
    if (!seq || !kc || !yaml_document_append_mapping_pair(&r->out, root, kc, seq))
        return false;
    if (n_prefill < 0 && n_decode < 0) {
        for (yaml_node_item_t *it = nodes->data.sequence.items.start;
             it < nodes->data.sequence.items.top; it++) {
            yaml_node_t *nd = yaml_document_get_node(&r->in, *it);
            const char *name = scalar_of(&r->in, map_get(r, nd, "name"));
            const char *role = scalar_of(&r->in, map_get(r, nd, "role"));
            if (!name || !role || !emit_node(r, seq, nd, name, role))
                return false;
        }
        return true;
    }
    const char *roles[3] = {"router", "prefill", "decode"};
    long counts[3] = {1, n_prefill, n_decode};
    for (int k = 1; k < 3; k++)
        if (counts[k] < 0) { /* not given: as many as the template has */
            counts[k] = 0;
            for (yaml_node_item_t *it = nodes->data.sequence.items.start;
                 it < nodes->data.sequence.items.top; it++) {
                const char *s =
                    scalar_of(&r->in, map_get(r, yaml_document_get_node(&r->in, *it), "role"));
                counts[k] += s && !strcmp(s, roles[k]);
            }
        }
    for (int k = 0; k < 3; k++) {
        int pid = find_role(r, nodes, roles[k]);
        yaml_node_t *proto = pid ? yaml_document_get_node(&r->in, pid) : NULL;
        for (long i = 0; i < counts[k]; i++) {
            char name[KVR_CLUSTER_NAME_MAX];
            const char *tn = scalar_of(&r->in, map_get(r, proto, "name"));
            if (k == 0)
                snprintf(name, sizeof(name), "%s", tn ? tn : "router");
            else
                snprintf(name, sizeof(name), "%s%ld", roles[k], i);
            if (!emit_node(r, seq, proto, name, roles[k]))
                return false;
        }
    }
    return true;
}

/* tcp://HOST:PORT with HOST replaced; other schemes kept. */
static void rehost(const char *ep, const char *host, char *out, size_t cap, char *bind, size_t bcap)
{
    const char *colon = strrchr(ep, ':');
    if (strncmp(ep, "tcp://", 6) || !colon || colon < ep + 6) {
        snprintf(out, cap, "%s", ep);
        snprintf(bind, bcap, "%s", ep);
        return;
    }
    bool v6 = strchr(host, ':') != NULL;
    snprintf(out, cap, "tcp://%s%s%s%s", v6 ? "[" : "", host, v6 ? "]" : "", colon);
    snprintf(bind, bcap, "tcp://0.0.0.0%s", colon);
}

static bool emit_router(struct render *r, int root, const yaml_node_t *rt, const char *host)
{
    int m = yaml_document_add_mapping(&r->out, NULL, YAML_BLOCK_MAPPING_STYLE);
    int kc = add_str(&r->out, "router");
    if (!m || !kc || !yaml_document_append_mapping_pair(&r->out, root, kc, m))
        return false;
    bool have_bind[2] = {map_get(r, rt, "client_bind") != NULL,
                         map_get(r, rt, "node_bind") != NULL};
    for (yaml_node_pair_t *p = rt->data.mapping.pairs.start; p < rt->data.mapping.pairs.top; p++) {
        const char *k = scalar_of(&r->in, yaml_document_get_node(&r->in, p->key));
        const char *v = scalar_of(&r->in, yaml_document_get_node(&r->in, p->value));
        int which = k && !strcmp(k, "client") ? 0 : k && !strcmp(k, "node") ? 1 : -1;
        if (which < 0 || !v) {
            int a = copy_node(r, p->key, NULL), b = copy_node(r, p->value, NULL);
            if (!a || !b || !yaml_document_append_mapping_pair(&r->out, m, a, b))
                return false;
            continue;
        }
        char ep[KVR_CLUSTER_STR_MAX], bind[KVR_CLUSTER_STR_MAX];
        rehost(v, host, ep, sizeof(ep), bind, sizeof(bind));
        if (!add_pair(r, m, k, ep))
            return false;
        if (!have_bind[which] && !add_pair(r, m, which ? "node_bind" : "client_bind", bind))
            return false;
    }
    return true;
}

static int emit_writer(void *data, unsigned char *buf, size_t size)
{
    FILE *f = data;
    return fwrite(buf, 1, size, f) == size;
}

static bool read_hosts(struct render *r, const char *list, const char *file)
{
    char *text = NULL;
    if (file) {
        FILE *f = fopen(file, "r");
        if (!f) {
            snprintf(r->err, sizeof(r->err), "--hosts-file %s: %s", file, strerror(errno));
            return false;
        }
        size_t cap = 0, len = 0;
        char buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof(buf), f)) > 0) {
            if (len + got + 1 > cap) {
                cap = (len + got + 1) * 2;
                char *t = realloc(text, cap);
                if (!t) {
                    free(text);
                    fclose(f);
                    return false;
                }
                text = t;
            }
            memcpy(text + len, buf, got);
            len += got;
        }
        fclose(f);
        if (!text)
            text = strdup("");
        else
            text[len] = 0;
    } else {
        text = strdup(list);
    }
    if (!text)
        return false;
    r->hosts = calloc(RENDER_MAX_HOSTS, sizeof(char *));
    if (!r->hosts) {
        free(text);
        return false;
    }
    for (char *save = NULL, *h = strtok_r(text, ", \t\r\n", &save); h;
         h = strtok_r(NULL, ", \t\r\n", &save)) {
        if (r->n_hosts == RENDER_MAX_HOSTS) {
            snprintf(r->err, sizeof(r->err), "more than %d hosts", RENDER_MAX_HOSTS);
            free(text);
            return false;
        }
        for (const char *p = h; *p; p++)
            if (!isalnum((unsigned char)*p) && !strchr("-._:[]", *p)) {
                snprintf(r->err, sizeof(r->err),
                         "host '%s' has a character other than letters, "
                         "digits, - . _ : [ ]",
                         h);
                free(text);
                return false;
            }
        r->hosts[r->n_hosts] = strdup(h);
        if (!r->hosts[r->n_hosts++]) {
            free(text);
            return false;
        }
    }
    free(text);
    if (!r->n_hosts) {
        snprintf(r->err, sizeof(r->err), "the host list is empty");
        return false;
    }
    return true;
}

static long parse_count(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 0 || v > RENDER_MAX_NODES) {
        fprintf(stderr, "kvrail cluster render: %s '%s' is not a count (0..%d)\n", opt, s,
                RENDER_MAX_NODES);
        return -2;
    }
    return v;
}

static int render_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"template", required_argument, NULL, 't'},
        {"hosts", required_argument, NULL, 'H'},
        {"hosts-file", required_argument, NULL, 'F'},
        {"prefill", required_argument, NULL, 'p'},
        {"decode", required_argument, NULL, 'd'},
        {"model", required_argument, NULL, 'm'},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tmpl = NULL, *hosts = NULL, *hosts_file = NULL, *model = NULL, *outp = NULL;
    long n_prefill = -1, n_decode = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:H:F:p:d:m:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            tmpl = optarg;
            break;
        case 'H':
            hosts = optarg;
            break;
        case 'F':
            hosts_file = optarg;
            break;
        case 'p':
            if ((n_prefill = parse_count("--prefill", optarg)) < -1)
                return 2;
            break;
        case 'd':
            if ((n_decode = parse_count("--decode", optarg)) < -1)
                return 2;
            break;
        case 'm':
            model = optarg;
            break;
        case 'o':
            outp = optarg;
            break;
        case 'h':
            fputs(render_usage, stdout);
            return 0;
        default:
            fputs(render_usage, stderr);
            return 2;
        }
    }
    if (optind != argc || !tmpl || !hosts == !hosts_file) {
        fputs(render_usage, stderr);
        return 2;
    }
    if (n_decode == 0) {
        fprintf(stderr, "kvrail cluster render: --decode 0: a cluster needs a decode node\n");
        return 2;
    }
    char err[1024];
    kvr_cluster_t *tc = NULL;
    if (kvr_cluster_load(tmpl, &tc, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail cluster render: the template does not load: %s\n", err);
        return 1;
    }
    char model_abs[PATH_MAX];
    if (!model) {
        if (!realpath(tc->model_dir, model_abs))
            snprintf(model_abs, sizeof(model_abs), "%s", tc->model_dir);
        model = model_abs;
    }
    kvr_cluster_free(tc);

    struct render r;
    memset(&r, 0, sizeof(r));
    int rc = 1;
    FILE *in = fopen(tmpl, "rb");
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    bool have_in = false, have_out = false;
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = NULL;
    if (!in) {
        fprintf(stderr, "kvrail cluster render: %s: %s\n", tmpl, strerror(errno));
        goto done;
    }
    yaml_parser_set_input_file(&parser, in);
    if (!yaml_parser_load(&parser, &r.in)) {
        fprintf(stderr, "kvrail cluster render: %s: %s\n", tmpl, parser.problem);
        goto done;
    }
    have_in = true;
    if (!read_hosts(&r, hosts, hosts_file)) {
        fprintf(stderr, "kvrail cluster render: %s\n", r.err[0] ? r.err : "out of memory");
        goto done;
    }
    if (!yaml_document_initialize(&r.out, NULL, NULL, NULL, 0, 0))
        goto done;
    have_out = true;
    yaml_node_t *root = yaml_document_get_root_node(&r.in);
    yaml_node_t *nodes = map_get(&r, root, "nodes");
    int oroot = yaml_document_add_mapping(&r.out, NULL, YAML_BLOCK_MAPPING_STYLE);
    /* the router's host first: it goes into router.client / router.node */
    int rid = find_role(&r, nodes, "router");
    const char *router_host = place(
        &r, rid ? scalar_of(&r.in, map_get(&r, yaml_document_get_node(&r.in, rid), "host")) : NULL,
        true);
    if (!router_host) {
        fprintf(stderr, "kvrail cluster render: router: %s\n", r.err);
        goto done;
    }
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        const char *k = scalar_of(&r.in, yaml_document_get_node(&r.in, p->key));
        bool ok;
        if (k && !strcmp(k, "router"))
            ok = emit_router(&r, oroot, yaml_document_get_node(&r.in, p->value), router_host);
        else if (k && !strcmp(k, "nodes"))
            ok = emit_nodes(&r, oroot, nodes, n_prefill, n_decode);
        else if (k && !strcmp(k, "model"))
            ok = add_pair(&r, oroot, "model", model);
        else {
            int a = copy_node(&r, p->key, NULL), b = copy_node(&r, p->value, NULL);
            ok = a && b && yaml_document_append_mapping_pair(&r.out, oroot, a, b);
        }
        if (!ok) {
            fprintf(stderr, "kvrail cluster render: %s\n", r.err[0] ? r.err : "out of memory");
            goto done;
        }
    }
    /* emit into memory, check it loads, then write it out */
    mem = open_memstream(&text, &text_len);
    if (!mem)
        goto done;
    fprintf(mem, "# rendered by kvrail cluster render from %s\n", tmpl);
    yaml_emitter_t em;
    yaml_emitter_initialize(&em);
    yaml_emitter_set_output(&em, emit_writer, mem);
    yaml_emitter_set_width(&em, 100);
    bool emitted =
        yaml_emitter_open(&em) && yaml_emitter_dump(&em, &r.out) && yaml_emitter_close(&em);
    have_out = false; /* yaml_emitter_dump deletes the document */
    yaml_emitter_delete(&em);
    fclose(mem);
    mem = NULL;
    if (!emitted) {
        fprintf(stderr, "kvrail cluster render: cannot write YAML\n");
        goto done;
    }
    kvr_cluster_t *check = NULL;
    if (kvr_cluster_parse(text, text_len, outp ? outp : "(stdout)", &check, err, sizeof(err)) !=
        KVR_OK) {
        fprintf(stderr, "kvrail cluster render: the rendered file does not load: %s\n", err);
        goto done;
    }
    kvr_cluster_free(check);
    FILE *of = outp ? fopen(outp, "w") : stdout;
    if (!of) {
        fprintf(stderr, "kvrail cluster render: -o %s: %s\n", outp, strerror(errno));
        goto done;
    }
    bool wrote = fwrite(text, 1, text_len, of) == text_len;
    if ((outp ? fclose(of) : fflush(of)) != 0 || !wrote) {
        fprintf(stderr, "kvrail cluster render: writing %s: %s\n", outp ? outp : "stdout",
                strerror(errno));
        goto done;
    }
    rc = 0;
done:
    if (mem)
        fclose(mem);
    free(text);
    if (have_out)
        yaml_document_delete(&r.out);
    if (have_in)
        yaml_document_delete(&r.in);
    yaml_parser_delete(&parser);
    if (in)
        fclose(in);
    for (size_t i = 0; i < r.n_hosts; i++)
        free(r.hosts[i]);
    free(r.hosts);
    return rc;
}

/* kvrail cluster render ARGS (the dispatch lives in cluster.c) */
int kvr_cmd_cluster_render(int argc, char **argv)
{
    return render_main(argc, argv);
}
