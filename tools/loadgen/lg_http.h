/*
 * lg_http.h - kvrail-loadgen's OpenAI mode (lg_http.c): the same load sent
 * to an OpenAI-compatible endpoint (kvrail-frontend, or any server that
 * speaks /v1/completions with streaming) instead of the router's protobuf
 * API, so the two can be compared on one cluster.
 *
 * Each request is POST /v1/completions {"model", "prompt": [token ids],
 * "max_tokens", the sampling parameters given ("temperature", "top_p",
 * "top_k", "min_p", "repetition_penalty", "presence_penalty",
 * "frequency_penalty"; greedy by default), "seed" (the request's, as the
 * protobuf path), "ignore_eos", "logprobs": 0, "stream": true,
 * "stream_options": {"include_usage": true}} on a
 * keep-alive connection (a pool: one per request in flight, reused when its
 * answer has ended); the SSE events are read as they come: an event's
 * tokens are counted by its logprobs.token_logprobs, the first one stamps
 * the TTFT, "data: [DONE]" ends the request, an error event or a non-200
 * status fails it with the server's message.  Everything is non-blocking
 * on one thread (poll), bounded per connection (a 1 MiB line at most).
 */
#ifndef KVR_LG_HTTP_H
#define KVR_LG_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lg_http;
struct req;

/** The sampling parameters every request carries (both paths). */
struct lg_sampling {
    double temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    uint32_t top_k; /* 0 = off */
};

/** What the caller does with an event of request r (loadgen.c). */
struct lg_http_sink {
    /* n tokens arrived now */
    void (*tokens)(struct req *r, uint32_t n, uint64_t now_ns);
    /* the request ended: status 0 ok, else a kvr_status_t with msg */
    void (*end)(struct req *r, int status, const char *msg, uint32_t prompt_tokens,
                uint32_t completion_tokens, uint32_t cached_tokens);
};

/** Parses url (http://HOST:PORT, a trailing /v1 allowed), resolves it and
 *  asks GET /v1/models once: the first model's id goes to model (unless
 *  model_in names one).  Fails fast with the cause (connection refused,
 *  not HTTP, not an OpenAI server) in err.  Returns NULL on failure. */
struct lg_http *lg_http_open(const char *url, const char *model_in, int max_conns,
                             const struct lg_http_sink *sink, char *err, size_t err_len);
void lg_http_close(struct lg_http *h);
/** The model id requests name. */
const char *lg_http_model(const struct lg_http *h);

/** Sends request r (index idx of the caller's array; ids, max_tokens, its
 *  sampling parameters and seed).
 *  @return 0; -1 with the reason in r's end callback already called. */
int lg_http_send(struct lg_http *h, struct req *r, int idx, const uint32_t *ids, uint32_t n_ids,
                 uint32_t max_tokens, const struct lg_sampling *sp, uint64_t seed, bool ignore_eos);
/** Waits up to timeout_ms for input on the connections in flight and
 *  handles what came (through the sink). */
void lg_http_poll(struct lg_http *h, int timeout_ms);
/** Abandons request r (its connection is closed: the server cancels it). */
void lg_http_drop(struct lg_http *h, struct req *r);

#endif
