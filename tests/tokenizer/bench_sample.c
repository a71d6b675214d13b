/*
 * bench_sample.c - time per sampled token over a 128256-entry vocabulary
 * (Llama 3's) for the sampler's parameter mixes: best of 3 runs of 50 draws
 * each, from random logits with a flat-ish distribution (the worst case for
 * top-p: a large nucleus).  No peer tool: absolute figures only.
 *   bench_sample [VOCAB]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvr_sample.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int v = argc > 1 ? atoi(argv[1]) : 128256;
    if (v < 1) {
        fprintf(stderr, "bench_sample: bad vocabulary size\n");
        return 1;
    }
    float *lg = malloc((size_t)v * sizeof(float));
    if (!lg)
        return 1;
    unsigned x = 1;
    for (int i = 0; i < v; i++) {
        x = x * 1103515245u + 12345u;
        lg[i] = (float)((x >> 8) % 10000) / 1000.0f - 5.0f;
    }
    static const struct {
        const char *name;
        float t;
        int k;
        float p, mp, rp;
    } cfg[] = {
        {"greedy", 0, 0, 1, 0, 1},
        {"greedy, repetition_penalty 1.1", 0, 0, 1, 0, 1.1f},
        {"temperature 0.8", 0.8f, 0, 1, 0, 1},
        {"temperature 0.8, top_k 40", 0.8f, 40, 1, 0, 1},
        {"temperature 0.8, top_p 0.9", 0.8f, 0, 0.9f, 0, 1},
        {"t 0.8, top_k 50, top_p 0.9, min_p 0.05, penalty 1.1", 0.8f, 50, 0.9f, 0.05f, 1.1f},
    };
    printf("| params (vocab %d) | ms / token |\n| --- | --- |\n", v);
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        struct kvr_sample_params p;
        kvr_sample_params_default(&p);
        p.temperature = cfg[c].t;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].p;
        p.min_p = cfg[c].mp;
        p.repetition_penalty = cfg[c].rp;
        p.seed = 1;
        kvr_sampler_t *s;
        if (kvr_sampler_create(&p, v, &s, NULL, 0) != KVR_OK)
            return 1;
        int32_t prompt[100];
        for (int i = 0; i < 100; i++)
            prompt[i] = (int32_t)((i * 977) % v);
        kvr_sampler_add_prompt(s, prompt, 100);
        double best = 1e9;
        for (int r = 0; r < 3; r++) {
            double t0 = now();
            for (int i = 0; i < 50; i++) {
                int32_t tok;
                float lp;
                kvr_sampler_sample(s, lg, &tok, &lp);
            }
            double dt = (now() - t0) / 50;
            best = dt < best ? dt : best;
        }
        printf("| %s | %.3f |\n", cfg[c].name, best * 1e3);
        kvr_sampler_destroy(s);
    }
    free(lg);
    return 0;
}
