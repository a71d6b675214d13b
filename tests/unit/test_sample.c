/*
 * test_sample.c - the sampler: greedy is argmax, same seed same tokens,
 * top-k / top-p / min-p restrict the support to what they must, the
 * repetition penalty's arithmetic, the empirical distribution matches
 * softmax, logprobs are raw log-softmax, hand-over between nodes
 * (add_generated) continues the same stream, invalid params are rejected;
 * logit bias, frequency and presence penalties (generated tokens only, by
 * count), and the top-N logprobs equal to the sampled token's bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvr_sample.h"
#include "kvr_test.h"

static struct kvr_sample_params params(float t, int32_t k, float p, float minp, float pen,
                                       uint64_t seed)
{
    struct kvr_sample_params sp;
    kvr_sample_params_default(&sp);
    sp.temperature = t;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = minp;
    sp.repetition_penalty = pen;
    sp.seed = seed;
    return sp;
}

static int32_t draw(const struct kvr_sample_params *sp, const float *logits, int32_t n)
{
    kvr_sampler_t *s;
    KVR_CHECK_STATUS(kvr_sampler_create(sp, n, &s, NULL, 0), KVR_OK);
    int32_t tok;
    KVR_CHECK_STATUS(kvr_sampler_sample(s, logits, &tok, NULL), KVR_OK);
    kvr_sampler_destroy(s);
    return tok;
}

/* the support observed over many steps of one sampler */
static void support(const struct kvr_sample_params *sp, const float *logits, int32_t n, int steps,
                    int *count)
{
    kvr_sampler_t *s;
    KVR_CHECK_STATUS(kvr_sampler_create(sp, n, &s, NULL, 0), KVR_OK);
    memset(count, 0, sizeof(int) * (size_t)n);
    for (int i = 0; i < steps; i++) {
        int32_t tok;
        KVR_CHECK_STATUS(kvr_sampler_sample(s, logits, &tok, NULL), KVR_OK);
        KVR_CHECK(tok >= 0 && tok < n);
        count[tok]++;
    }
    kvr_sampler_destroy(s);
}

static void test_invalid(void)
{
    char err[256];
    struct kvr_sample_params bads[] = {
        params(-0.5f, 0, 1, 0, 1, 0), params(NAN, 0, 1, 0, 1, 0),      params(1, -1, 1, 0, 1, 0),
        params(1, 0, 0.0f, 0, 1, 0),  params(1, 0, 1.5f, 0, 1, 0),     params(1, 0, -0.1f, 0, 1, 0),
        params(1, 0, 1, -0.1f, 1, 0), params(1, 0, 1, 1.1f, 1, 0),     params(1, 0, 1, 0, 0.0f, 0),
        params(1, 0, 1, 0, -1.0f, 0), params(1, 0, 1, 0, INFINITY, 0),
    };
    const char *names[] = {"temperature",
                           "temperature",
                           "top_k",
                           "top_p",
                           "top_p",
                           "top_p",
                           "min_p",
                           "min_p",
                           "repetition_penalty",
                           "repetition_penalty",
                           "repetition_penalty"};
    for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
        err[0] = 0;
        KVR_CHECK_STATUS(kvr_sample_params_validate(&bads[i], err, sizeof(err)), KVR_ERR_INVALID);
        KVR_CHECK(strstr(err, names[i]) != NULL);
        kvr_sampler_t *s = NULL;
        KVR_CHECK_STATUS(kvr_sampler_create(&bads[i], 10, &s, err, sizeof(err)), KVR_ERR_INVALID);
        KVR_CHECK(s == NULL);
    }
    struct kvr_sample_params ok = params(0.7f, 40, 0.9f, 0.05f, 1.1f, 42);
    KVR_CHECK_STATUS(kvr_sample_params_validate(&ok, err, sizeof(err)), KVR_OK);
    kvr_sampler_t *s = NULL;
    KVR_CHECK_STATUS(kvr_sampler_create(&ok, 0, &s, err, sizeof(err)), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "vocab_size") != NULL);
    /* all -inf / NaN logits: a clear error, not a crash */
    float dead[4] = {-INFINITY, NAN, -INFINITY, NAN};
    KVR_CHECK_STATUS(kvr_sampler_create(&ok, 4, &s, NULL, 0), KVR_OK);
    int32_t tok;
    KVR_CHECK_STATUS(kvr_sampler_sample(s, dead, &tok, NULL), KVR_ERR_INVALID);
    kvr_sampler_destroy(s);
}

static void test_greedy(void)
{
    enum { N = 5000 };
    static float lg[N];
    uint64_t x = 12345;
    for (int round = 0; round < 20; round++) {
        int32_t arg = 0;
        for (int i = 0; i < N; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = (float)((x >> 40) % 100000) / 1000.0f - 50.0f;
            if (lg[i] > lg[arg])
                arg = i;
        }
        struct kvr_sample_params g = params(0, 0, 1, 0, 1, (uint64_t)round);
        KVR_CHECK_EQ(draw(&g, lg, N), arg);
        /* filters do not change greedy */
        struct kvr_sample_params gf = params(0, 5, 0.5f, 0.3f, 1, 7);
        KVR_CHECK_EQ(draw(&gf, lg, N), arg);
        /* top_k = 1 with temperature is greedy too */
        struct kvr_sample_params k1 = params(1.3f, 1, 1, 0, 1, (uint64_t)round);
        KVR_CHECK_EQ(draw(&k1, lg, N), arg);
    }
    /* ties: the lowest id */
    float tie[4] = {1, 3, 3, 2};
    struct kvr_sample_params g = params(0, 0, 1, 0, 1, 0);
    KVR_CHECK_EQ(draw(&g, tie, 4), 1);
}

static void test_seed(void)
{
    enum { N = 1000, STEPS = 64 };
    static float lg[N];
    for (int i = 0; i < N; i++)
        lg[i] = sinf((float)i * 0.37f) * 3.0f;
    struct kvr_sample_params sp = params(1.0f, 0, 0.95f, 0, 1, 1234);
    int32_t a[STEPS], b[STEPS], c[STEPS];
    kvr_sampler_t *sa, *sb, *sc;
    sp.seed = 1234;
    KVR_CHECK_STATUS(kvr_sampler_create(&sp, N, &sa, NULL, 0), KVR_OK);
    KVR_CHECK_STATUS(kvr_sampler_create(&sp, N, &sb, NULL, 0), KVR_OK);
    sp.seed = 1235;
    KVR_CHECK_STATUS(kvr_sampler_create(&sp, N, &sc, NULL, 0), KVR_OK);
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        KVR_CHECK_STATUS(kvr_sampler_sample(sa, lg, &a[i], NULL), KVR_OK);
        KVR_CHECK_STATUS(kvr_sampler_sample(sb, lg, &b[i], NULL), KVR_OK);
        KVR_CHECK_STATUS(kvr_sampler_sample(sc, lg, &c[i], NULL), KVR_OK);
        KVR_CHECK_EQ(a[i], b[i]);
        differ += a[i] != c[i];
    }
    KVR_CHECK(differ > STEPS / 2);
    KVR_CHECK_EQ(kvr_sampler_step(sa), STEPS);
    /* hand-over: a second sampler told about the first 5 generated tokens
     * continues with exactly the same tokens */
    sp.seed = 1234;
    kvr_sampler_t *sd;
    KVR_CHECK_STATUS(kvr_sampler_create(&sp, N, &sd, NULL, 0), KVR_OK);
    kvr_sampler_add_generated(sd, a, 5);
    for (int i = 5; i < STEPS; i++) {
        int32_t t;
        KVR_CHECK_STATUS(kvr_sampler_sample(sd, lg, &t, NULL), KVR_OK);
        KVR_CHECK_EQ(t, a[i]);
    }
    kvr_sampler_destroy(sa);
    kvr_sampler_destroy(sb);
    kvr_sampler_destroy(sc);
    kvr_sampler_destroy(sd);
}

static void test_filters(void)
{
    /* probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1 */
    float lg[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int count[4];
    struct kvr_sample_params all = params(1, 0, 1, 0, 1, 9);
    support(&all, lg, 4, 4000, count);
    for (int i = 0; i < 4; i++)
        KVR_CHECK(count[i] > 0);
    /* empirical frequencies match softmax (4000 draws: sd < 0.008) */
    KVR_CHECK(fabs(count[0] / 4000.0 - 0.5) < 0.04);
    KVR_CHECK(fabs(count[1] / 4000.0 - 0.3) < 0.04);
    KVR_CHECK(fabs(count[3] / 4000.0 - 0.05) < 0.02);

    struct kvr_sample_params k2 = params(1, 2, 1, 0, 1, 9);
    support(&k2, lg, 4, 2000, count);
    KVR_CHECK(count[0] > 0 && count[1] > 0 && count[2] == 0 && count[3] == 0);
    /* renormalized over the two: 0.5/0.8 = 0.625 */
    KVR_CHECK(fabs(count[0] / 2000.0 - 0.625) < 0.05);

    struct kvr_sample_params p75 = params(1, 0, 0.75f, 0, 1, 9);
    support(&p75, lg, 4, 2000, count);
    KVR_CHECK(count[0] > 0 && count[1] > 0 && count[2] == 0 && count[3] == 0);
    struct kvr_sample_params p85 = params(1, 0, 0.85f, 0, 1, 9);
    support(&p85, lg, 4, 2000, count);
    KVR_CHECK(count[2] > 0 && count[3] == 0);
    struct kvr_sample_params p40 = params(1, 0, 0.4f, 0, 1, 9);
    support(&p40, lg, 4, 500, count);
    KVR_CHECK(count[0] == 500);

    /* min_p 0.2: keep p >= 0.1 -> {0, 1, 2} */
    struct kvr_sample_params m2 = params(1, 0, 1, 0.2f, 1, 9);
    support(&m2, lg, 4, 2000, count);
    KVR_CHECK(count[0] > 0 && count[1] > 0 && count[2] > 0 && count[3] == 0);
    struct kvr_sample_params m7 = params(1, 0, 1, 0.7f, 1, 9);
    support(&m7, lg, 4, 500, count);
    KVR_CHECK(count[0] == 500);

    /* temperature sharpens: at 0.1, token 0 (p^10 normalised ~ 0.994) */
    struct kvr_sample_params cold = params(0.1f, 0, 1, 0, 1, 9);
    support(&cold, lg, 4, 1000, count);
    KVR_CHECK(count[0] > 970);

    /* a large flat-ish vocabulary: the nucleus found without a full sort
     * equals the brute-force one */
    enum { N = 50000 };
    static float big[N];
    static int bc[N];
    for (int i = 0; i < N; i++)
        big[i] = (float)((i * 7919) % N) / (float)N * 4.0f; /* a permutation of a ramp */
    struct kvr_sample_params pb = params(1, 0, 0.5f, 0, 1, 3);
    support(&pb, big, N, 200, bc);
    /* brute force: sort probabilities descending, nucleus = smallest prefix >= 0.5 */
    double tot = 0;
    for (int i = 0; i < N; i++)
        tot += exp(big[i] - 4.0);
    /* big is the ramp 4*j/N at j = (i*7919)%N; cumulate from the top */
    double cum = 0;
    int j = N - 1;
    for (; j >= 0; j--) {
        cum += exp(4.0 * j / N - 4.0) / tot;
        if (cum >= 0.5)
            break;
    }
    float thresh = 4.0f * (float)j / (float)N;
    int outside = 0, inside = 0;
    for (int i = 0; i < N; i++) {
        if (big[i] < thresh - 1e-6f)
            outside += bc[i];
        else
            inside += bc[i];
    }
    KVR_CHECK_EQ(outside, 0);
    KVR_CHECK_EQ(inside, 200);

    /* top-k over the large vocabulary (the one-pass heap): exactly the 5
     * best logits appear; ties at the boundary go to the lower id */
    for (int i = 0; i < N; i++)
        big[i] = (float)((i * 7919) % 1000) / 250.0f; /* 50 copies of each value */
    struct kvr_sample_params k5 = params(1, 5, 1, 0, 1, 11);
    support(&k5, big, N, 200, bc);
    int seen_k = 0;
    for (int i = 0; i < N; i++) {
        if (!bc[i])
            continue;
        seen_k++;
        /* value 999/250 is the maximum; its 50 copies tie: the 5 lowest ids */
        KVR_CHECK((i * 7919) % 1000 == 999);
    }
    KVR_CHECK_EQ(seen_k, 5);
    int first5 = 0;
    for (int i = 0; i < N && first5 < 5; i++) {
        if ((i * 7919) % 1000 == 999) {
            KVR_CHECK(bc[i] > 0);
            first5++;
        }
    }
}

static void test_penalty_logprob(void)
{
    /* [2.0, -1.0, 1.5] with penalty 2 over seen {0, 1} -> [1.0, -2.0, 1.5] */
    float lg[3] = {2.0f, -1.0f, 1.5f};
    struct kvr_sample_params g = params(0, 0, 1, 0, 2.0f, 0);
    kvr_sampler_t *s;
    KVR_CHECK_STATUS(kvr_sampler_create(&g, 3, &s, NULL, 0), KVR_OK);
    int32_t prompt[2] = {0, 1};
    kvr_sampler_add_prompt(s, prompt, 2);
    int32_t tok;
    float lp;
    KVR_CHECK_STATUS(kvr_sampler_sample(s, lg, &tok, &lp), KVR_OK);
    KVR_CHECK_EQ(tok, 2);
    /* logprob is of the raw logits */
    double z = exp(2.0) + exp(-1.0) + exp(1.5);
    KVR_CHECK(fabs(lp - (1.5 - log(z))) < 1e-5);
    /* now 2 is seen too: [1.0, -2.0, 0.75] -> 0 */
    KVR_CHECK_STATUS(kvr_sampler_sample(s, lg, &tok, &lp), KVR_OK);
    KVR_CHECK_EQ(tok, 0);
    KVR_CHECK(fabs(lp - (2.0 - log(z))) < 1e-5);
    kvr_sampler_destroy(s);
    /* penalty < 1 encourages: token 1 (seen) -1 * 0.1 = -0.1 > others scaled? */
    float lg2[3] = {0.5f, -1.0f, 0.4f};
    struct kvr_sample_params enc = params(0, 0, 1, 0, 0.1f, 0);
    KVR_CHECK_STATUS(kvr_sampler_create(&enc, 3, &s, NULL, 0), KVR_OK);
    int32_t p1[1] = {2};
    kvr_sampler_add_prompt(s, p1, 1); /* 0.4 / 0.1 = 4.0 */
    KVR_CHECK_STATUS(kvr_sampler_sample(s, lg2, &tok, NULL), KVR_OK);
    KVR_CHECK_EQ(tok, 2);
    kvr_sampler_destroy(s);
    KVR_CHECK(fabs(kvr_sample_logprob(lg, 3, 0) - (2.0 - log(z))) < 1e-5);
    KVR_CHECK(kvr_sample_logprob(lg, 3, 3) == -INFINITY);
}

static void test_bias_penalties(void)
{
    char err[256];
    kvr_sampler_t *s;
    int32_t tok;
    float lp;
    /* logit bias: +3 on token 2 makes it the argmax; -100 bans the argmax */
    float lg[4] = {2.0f, 1.0f, 0.5f, -1.0f};
    struct kvr_logit_bias b1[2] = {{2, 3.0f}, {0, -100.0f}};
    struct kvr_sample_params g = params(0, 0, 1, 0, 1, 0);
    g.logit_bias = b1;
    g.n_logit_bias = 2;
    KVR_CHECK_STATUS(kvr_sampler_create(&g, 4, &s, err, sizeof err), KVR_OK);
    b1[0].bias = -100.0f; /* the sampler took its own copy */
    KVR_CHECK_STATUS(kvr_sampler_sample(s, lg, &tok, &lp), KVR_OK);
    KVR_CHECK_EQ(tok, 2);
    KVR_CHECK(lp == kvr_sample_logprob(lg, 4, 2)); /* raw logits */
    kvr_sampler_destroy(s);
    /* sampled with a temperature, the banned token never comes */
    struct kvr_logit_bias ban[1] = {{0, -100.0f}};
    struct kvr_sample_params t = params(1.0f, 0, 1, 0, 1, 7);
    t.logit_bias = ban;
    t.n_logit_bias = 1;
    int count[4];
    support(&t, lg, 4, 2000, count);
    KVR_CHECK_EQ(count[0], 0);
    KVR_CHECK(count[1] > 0 && count[2] > 0);
    /* a token outside the vocabulary, twice the same token, out of range */
    struct kvr_logit_bias b2[2] = {{4, 1.0f}, {1, 1.0f}};
    g.logit_bias = b2;
    KVR_CHECK_STATUS(kvr_sampler_create(&g, 4, &s, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "vocabulary") != NULL);
    b2[0].token = 1;
    KVR_CHECK_STATUS(kvr_sample_params_validate(&g, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "twice") != NULL);
    b2[0].token = 0;
    b2[0].bias = 100.5f;
    KVR_CHECK_STATUS(kvr_sample_params_validate(&g, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "logit_bias") != NULL);
    struct kvr_sample_params pp = params(0, 0, 1, 0, 1, 0);
    pp.presence_penalty = 2.5f;
    KVR_CHECK_STATUS(kvr_sample_params_validate(&pp, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "presence_penalty") != NULL);
    pp.presence_penalty = 0;
    pp.frequency_penalty = NAN;
    KVR_CHECK_STATUS(kvr_sample_params_validate(&pp, err, sizeof err), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "frequency_penalty") != NULL);

    /* frequency penalty: greedy over [3.0, 2.5, 0.0] with frequency 0.3.
     * Token 0 wins until its count c gives 3 - 0.3c < 2.5 (c = 2), then 1
     * until 2.5 - 0.3c' < 3 - 0.6 ... the exact sequence: */
    float f3[3] = {3.0f, 2.5f, 0.0f};
    struct kvr_sample_params fp = params(0, 0, 1, 0, 1, 0);
    fp.frequency_penalty = 0.3f;
    KVR_CHECK_STATUS(kvr_sampler_create(&fp, 3, &s, err, sizeof err), KVR_OK);
    int32_t prompt[3] = {0, 0, 0}; /* prompt tokens are not counted */
    kvr_sampler_add_prompt(s, prompt, 3);
    int32_t want[6] = {0, 0, 1, 0, 1, 0};
    /* counts (0,1): 3.0|2.5 -> 0; 2.7|2.5 -> 0; 2.4|2.5 -> 1; 2.4|2.2 -> 0;
     * 2.1|2.2 -> 1; 2.1|1.9 -> 0 */
    for (int i = 0; i < 6; i++) {
        KVR_CHECK_STATUS(kvr_sampler_sample(s, f3, &tok, &lp), KVR_OK);
        KVR_CHECK_EQ(tok, want[i]);
    }
    kvr_sampler_destroy(s);
    /* presence penalty: once per distinct generated token, whatever the count */
    struct kvr_sample_params prp = params(0, 0, 1, 0, 1, 0);
    prp.presence_penalty = 0.4f;
    KVR_CHECK_STATUS(kvr_sampler_create(&prp, 3, &s, err, sizeof err), KVR_OK);
    int32_t want2[4] = {0, 0, 0, 0}; /* 3.0 - 0.4 = 2.6 > 2.5 forever */
    for (int i = 0; i < 4; i++) {
        KVR_CHECK_STATUS(kvr_sampler_sample(s, f3, &tok, &lp), KVR_OK);
        KVR_CHECK_EQ(tok, want2[i]);
    }
    kvr_sampler_destroy(s);
    prp.presence_penalty = 0.6f; /* 2.4 < 2.5: 0, then 1, then 0 (2.4 > 1.9) ... */
    KVR_CHECK_STATUS(kvr_sampler_create(&prp, 3, &s, err, sizeof err), KVR_OK);
    int32_t want3[4] = {0, 1, 0, 0};
    for (int i = 0; i < 4; i++) {
        KVR_CHECK_STATUS(kvr_sampler_sample(s, f3, &tok, &lp), KVR_OK);
        KVR_CHECK_EQ(tok, want3[i]);
    }
    kvr_sampler_destroy(s);
    /* a hand-over (add_generated) counts the tokens as generated */
    KVR_CHECK_STATUS(kvr_sampler_create(&fp, 3, &s, err, sizeof err), KVR_OK);
    int32_t gen[2] = {0, 0};
    kvr_sampler_add_generated(s, gen, 2);
    KVR_CHECK_STATUS(kvr_sampler_sample(s, f3, &tok, &lp), KVR_OK);
    KVR_CHECK_EQ(tok, 1); /* 3.0 - 0.6 < 2.5 */
    kvr_sampler_destroy(s);
    /* the same seed and penalties give the same stream */
    enum { N = 50, STEPS = 200 };
    float lgn[N];
    for (int i = 0; i < N; i++)
        lgn[i] = (float)((i * 37) % 11) * 0.3f;
    struct kvr_sample_params sp = params(0.9f, 0, 1, 0, 1.1f, 99);
    sp.frequency_penalty = 0.5f;
    sp.presence_penalty = -0.25f;
    sp.logit_bias = ban;
    sp.n_logit_bias = 1;
    kvr_sampler_t *sa, *sb;
    KVR_CHECK_STATUS(kvr_sampler_create(&sp, N, &sa, NULL, 0), KVR_OK);
    KVR_CHECK_STATUS(kvr_sampler_create(&sp, N, &sb, NULL, 0), KVR_OK);
    for (int i = 0; i < STEPS; i++) {
        int32_t ta, tb;
        KVR_CHECK_STATUS(kvr_sampler_sample(sa, lgn, &ta, NULL), KVR_OK);
        KVR_CHECK_STATUS(kvr_sampler_sample(sb, lgn, &tb, NULL), KVR_OK);
        KVR_CHECK_EQ(ta, tb);
        KVR_CHECK(ta != 0);
    }
    kvr_sampler_destroy(sa);
    kvr_sampler_destroy(sb);
}

static void test_top_logprobs(void)
{
    enum { N = 1000 };
    static float lg[N];
    for (int i = 0; i < N; i++)
        lg[i] = (float)((i * 7919) % 1009) * 0.01f;
    lg[17] = lg[23] = 50.0f; /* a tie: the lower id first */
    lg[5] = -INFINITY;
    lg[6] = NAN;
    int32_t ids[KVR_SAMPLE_MAX_TOP_LOGPROBS];
    float lps[KVR_SAMPLE_MAX_TOP_LOGPROBS];
    int32_t n = kvr_sample_top_logprobs(lg, N, 5, ids, lps);
    KVR_CHECK_EQ(n, 5);
    KVR_CHECK_EQ(ids[0], 17);
    KVR_CHECK_EQ(ids[1], 23);
    for (int i = 0; i < n; i++) {
        KVR_CHECK(lps[i] == kvr_sample_logprob(lg, N, ids[i])); /* bit for bit */
        if (i)
            KVR_CHECK(lps[i] <= lps[i - 1]);
    }
    /* the 5th best is really the 5th: nothing outside is better */
    for (int i = 0; i < N; i++) {
        bool in = false;
        for (int k = 0; k < n; k++)
            in |= ids[k] == i;
        if (!in && lg[i] == lg[i])
            KVR_CHECK(lg[i] < lg[ids[4]] || (lg[i] == lg[ids[4]] && i > ids[4]));
    }
    /* more than the most is clamped; fewer finite entries than asked */
    KVR_CHECK_EQ(kvr_sample_top_logprobs(lg, N, 100, ids, lps), KVR_SAMPLE_MAX_TOP_LOGPROBS);
    float few[4] = {-INFINITY, 1.0f, NAN, 0.0f};
    KVR_CHECK_EQ(kvr_sample_top_logprobs(few, 4, 3, ids, lps), 2);
    KVR_CHECK_EQ(ids[0], 1);
    KVR_CHECK_EQ(ids[1], 3);
    /* the greedy token is the first alternative, with the same logprob */
    kvr_sampler_t *s;
    struct kvr_sample_params g = params(0, 0, 1, 0, 1, 0);
    KVR_CHECK_STATUS(kvr_sampler_create(&g, N, &s, NULL, 0), KVR_OK);
    int32_t tok;
    float lp;
    KVR_CHECK_STATUS(kvr_sampler_sample(s, lg, &tok, &lp), KVR_OK);
    n = kvr_sample_top_logprobs(lg, N, 1, ids, lps);
    KVR_CHECK_EQ(n, 1);
    KVR_CHECK_EQ(tok, ids[0]);
    KVR_CHECK(lp == lps[0]);
    kvr_sampler_destroy(s);
}

int main(void)
{
    test_bias_penalties();
    test_top_logprobs();
    test_invalid();
    test_greedy();
    test_seed();
    test_filters();
    test_penalty_logprob();
    printf("sample: ok\n");
    return 0;
}
