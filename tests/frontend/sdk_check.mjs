// sdk_check.mjs - drives kvrail-frontend with the official OpenAI Node SDK
// (npm `openai`) and checks every answer against the reference that
// test_frontend.py computed with `kvrail run` (greedy, same prompt):
//   node sdk_check.mjs SPEC.json
// SPEC: {base_url, model, context_len, prompt: [ids], prompt2: [ids],
//        max_tokens, ref: {texts: [...], logprobs: [...], finish}, ref2_text,
//        stop, stop_expect, have_chat}
// Prints one "ok ..." line per check; exits 1 with the first failure.
import fs from 'node:fs';
import OpenAI from 'openai';

const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const client = new OpenAI({ baseURL: spec.base_url, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const model = spec.model;
const refText = spec.ref.texts.join('');
const nref = spec.ref.texts.length;

function check(cond, what, detail) {
  if (!cond) {
    console.error(`FAIL: ${what}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`);
    process.exit(1);
  }
}

function ok(what) {
  console.log(`ok ${what}`);
}

async function expectError(params, status, what, param, create = (p) => client.completions.create(p)) {
  try {
    await create(params);
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: an APIError`, String(e));
    check(e.status === status, `${what}: status ${status}`, { status: e.status, msg: e.message });
    check(typeof e.error?.message === 'string' && e.error.message.length > 10,
      `${what}: error.message says what was wrong`, e.error);
    if (param) {
      check(e.param === param, `${what}: error.param names ${param}`, e.error);
      check(e.error.message.includes(param), `${what}: message names ${param}`, e.error.message);
    }
    check(e.type && typeof e.type === 'string', `${what}: error.type`, e.error);
    ok(`${what} -> ${status} ${e.error.message}`);
    return;
  }
  check(false, `${what}: no error`);
}

async function streamed(params) {
  const chunks = [];
  for await (const c of await client.completions.create({ ...params, stream: true })) chunks.push(c);
  return chunks;
}

// ---- models ----
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, 'models: the served model', models.data);
if (spec.context_len)
  check(models.data[0].context_length === spec.context_len, 'models: context length', models.data[0]);
ok(`models.list: ${model}, context ${models.data[0].context_length}`);

// ---- greedy completion == kvrail run, token for token ----
const base = { model, prompt: spec.prompt, max_tokens: spec.max_tokens, temperature: 0 };
const r = await client.completions.create({ ...base, logprobs: 0 });
check(r.object === 'text_completion' && r.choices.length === 1, 'completion shape', r);
const c0 = r.choices[0];
check(c0.text === refText, 'completion text == kvrail run', { got: c0.text, want: refText });
check(JSON.stringify(c0.logprobs.tokens) === JSON.stringify(spec.ref.texts),
  'logprobs.tokens == kvrail run token texts', { got: c0.logprobs.tokens, want: spec.ref.texts });
for (let i = 0; i < nref; i++)
  check(c0.logprobs.token_logprobs[i] === spec.ref.logprobs[i],
    `token_logprobs[${i}] == kvrail run`, [c0.logprobs.token_logprobs[i], spec.ref.logprobs[i]]);
check(c0.finish_reason === spec.ref.finish, 'finish_reason', [c0.finish_reason, spec.ref.finish]);
check(r.usage.prompt_tokens === spec.prompt.length, 'usage.prompt_tokens', r.usage);
check(r.usage.completion_tokens === nref, 'usage.completion_tokens', r.usage);
check(r.usage.total_tokens === spec.prompt.length + nref, 'usage.total_tokens', r.usage);
check(typeof r.usage.prompt_tokens_details?.cached_tokens === 'number', 'usage cached_tokens', r.usage);
ok(`completion: ${nref} tokens equal kvrail run, finish ${c0.finish_reason}, usage ${JSON.stringify(r.usage)}`);

// ---- every sampling parameter and top-N logprobs == kvrail run with the same flags ----
{
  const sp = spec.sampling, sr = spec.sampling_ref, want = sr.texts.join('');
  const params = { model, prompt: spec.prompt, max_tokens: sr.texts.length, ignore_eos: true,
    temperature: sp.temperature, top_p: sp.top_p, min_p: sp.min_p, seed: sp.seed,
    presence_penalty: sp.presence_penalty, frequency_penalty: sp.frequency_penalty,
    logit_bias: sp.logit_bias, logprobs: sp.top_logprobs };
  const r = await client.completions.create(params);
  const lp = r.choices[0].logprobs;
  check(r.choices[0].text === want, 'sampled completion == kvrail run (same seed and params)',
    { got: r.choices[0].text, want });
  check(lp.top_logprobs.length === sr.texts.length, 'top_logprobs: one dict per token', lp);
  for (let i = 0; i < sr.texts.length; i++) {
    check(lp.token_logprobs[i] === sr.logprobs[i], `sampled token_logprobs[${i}]`,
      [lp.token_logprobs[i], sr.logprobs[i]]);
    const vals = Object.values(lp.top_logprobs[i]).sort((a, b) => b - a);
    // the 3 best (keys may merge when two alternatives decode to the same text) and the sampled
    check(vals.length >= 1 && vals.length <= sp.top_logprobs + 1, `top_logprobs[${i}] size`, lp.top_logprobs[i]);
    check(vals[0] === sr.top[i][0], `top_logprobs[${i}] best == kvrail run`, [vals, sr.top[i]]);
    for (const v of vals)
      check(sr.top[i].concat([sr.logprobs[i]]).some((w) => v === w),
        `top_logprobs[${i}] values are kvrail run's`, [vals, sr.top[i]]);
  }
  const chunks = await streamed(params);
  const text = chunks.map((c) => c.choices[0]?.text ?? '').join('');
  check(text === want, 'sampled completion streamed == kvrail run', { got: text, want });
  const tops = chunks.flatMap((c) => c.choices[0]?.logprobs?.top_logprobs ?? []);
  check(tops.length === sr.texts.length, 'streamed top_logprobs: one per token', tops.length);
  ok(`sampling (seed, temperature, top_p, min_p, presence/frequency, logit_bias) + logprobs ${sp.top_logprobs}: ` +
    `${sr.texts.length} tokens equal kvrail run, streamed too`);
}

// ---- no temperature given: generation_config.json's (0, greedy) ----
{
  const d = await client.completions.create({ model, prompt: spec.prompt, max_tokens: spec.max_tokens });
  check(d.choices[0].text === refText, 'default temperature from generation_config.json (greedy)',
    { got: d.choices[0].text, want: refText });
  ok('sampling defaults from generation_config.json');
}

// ---- streaming: the same text, then a usage chunk ----
{
  const chunks = await streamed({ ...base, stream_options: { include_usage: true } });
  const withChoices = chunks.filter((c) => c.choices.length);
  const text = withChoices.map((c) => c.choices[0].text).join('');
  check(text === refText, 'streamed text == kvrail run', { got: text, want: refText });
  const fin = withChoices.filter((c) => c.choices[0].finish_reason);
  check(fin.length === 1 && fin[0] === withChoices[withChoices.length - 1], 'one finish chunk, last', fin);
  check(fin[0].choices[0].finish_reason === spec.ref.finish, 'streamed finish_reason', fin[0].choices[0]);
  const last = chunks[chunks.length - 1];
  check(last.choices.length === 0 && last.usage && last.usage.completion_tokens === nref &&
    last.usage.prompt_tokens === spec.prompt.length, 'stream ends with the usage chunk', last);
  const noUsage = await streamed(base);
  check(noUsage.every((c) => !c.usage), 'no usage chunk unless asked', noUsage.at(-1));
  ok(`stream: ${withChoices.length} chunks, text equal, usage chunk ${JSON.stringify(last.usage)}`);
}

// ---- stop strings: cut before the stop text, finish "stop" ----
for (const stop of [spec.stop, ['\u0001never-generated', spec.stop]]) {
  const s = await client.completions.create({ ...base, stop });
  check(s.choices[0].text === spec.stop_expect, `stop ${JSON.stringify(stop)}: text cut before it`,
    { got: s.choices[0].text, want: spec.stop_expect });
  check(s.choices[0].finish_reason === 'stop', 'stop: finish_reason stop', s.choices[0]);
  const chunks = await streamed({ ...base, stop });
  const text = chunks.map((c) => c.choices[0]?.text ?? '').join('');
  check(text === spec.stop_expect, `stop ${JSON.stringify(stop)} streamed: text cut before it`,
    { got: text, want: spec.stop_expect });
  check(chunks.at(-1).choices[0].finish_reason === 'stop', 'stop streamed: finish stop', chunks.at(-1));
}
ok(`stop ${JSON.stringify(spec.stop)}: ${JSON.stringify(spec.stop_expect)} (streamed and not)`);
{
  const stop = spec.split_stop, want = spec.split_stop_expect;
  const s = await client.completions.create({ ...base, stop, logprobs: 0 });
  check(s.choices[0].text === want && s.choices[0].finish_reason === 'stop',
    `stop across two tokens ${JSON.stringify(stop)}`, { got: s.choices[0], want });
  check(s.choices[0].logprobs.tokens.join('') === want, 'stop across tokens: logprobs tokens cut too',
    s.choices[0].logprobs.tokens);
  const chunks = await streamed({ ...base, stop });
  const text = chunks.map((c) => c.choices[0]?.text ?? '').join('');
  check(text === want, `stop across two tokens streamed (held back)`, { got: text, want });
  ok(`stop across two tokens ${JSON.stringify(stop)}: ${JSON.stringify(want)} (streamed and not)`);
}

// ---- max_tokens -> finish_reason length ----
{
  const s = await client.completions.create({ ...base, max_tokens: 3, logprobs: 0 });
  check(s.choices[0].finish_reason === 'length' && s.usage.completion_tokens === 3,
    'max_tokens 3: finish length, 3 tokens', s);
  check(s.choices[0].logprobs.tokens.slice(0, 2).join('') === spec.ref.texts.slice(0, 2).join(''),
    'max_tokens 3: the same first tokens', s.choices[0].logprobs.tokens);
  ok('max_tokens 3: finish_reason length');
}

// ---- several prompts, n, seed reproducibility ----
{
  const s = await client.completions.create({ ...base, prompt: [spec.prompt, spec.prompt2] });
  check(s.choices.length === 2 && s.choices[0].index === 0 && s.choices[1].index === 1,
    'two prompts: two choices in order', s.choices);
  check(s.choices[0].text === refText && s.choices[1].text === spec.ref2_text,
    'two prompts: each equals kvrail run', s.choices);
  check(s.usage.prompt_tokens === spec.prompt.length + spec.prompt2.length, 'two prompts: usage', s.usage);
  const p = { model, prompt: spec.prompt, max_tokens: 8, temperature: 1.0, seed: 1234, n: 3 };
  const a = await client.completions.create(p);
  const b = await client.completions.create(p);
  check(a.choices.length === 3 && a.choices.map((c) => c.index).join() === '0,1,2', 'n=3: three choices', a);
  check(JSON.stringify(a.choices.map((c) => c.text)) === JSON.stringify(b.choices.map((c) => c.text)),
    'n=3 with a seed: reproducible', [a.choices, b.choices]);
  check(new Set(a.choices.map((c) => c.text)).size > 1, 'n=3: the samples differ (seed + j)', a.choices);
  check(a.usage.completion_tokens >= 3 && a.usage.completion_tokens <= 24 &&
    a.usage.completion_tokens === b.usage.completion_tokens && a.usage.prompt_tokens === spec.prompt.length,
    'n=3: usage (3..24 tokens, the same both times, the prompt once)', [a.usage, b.usage]);
  const chunks = await streamed(p);
  for (let i = 0; i < 3; i++) {
    const t = chunks.filter((c) => c.choices[0]?.index === i).map((c) => c.choices[0].text).join('');
    check(t === a.choices[i].text, `n=3 streamed: choice ${i} equals the non-streamed one`, [t, a.choices[i].text]);
  }
  ok('prompt lists, n=3 with seed: reproducible, streamed equal');
}

// ---- errors: OpenAI's shape, the parameter named ----
await expectError({ ...base, max_tokens: -1 }, 400, 'negative max_tokens', 'max_tokens');
await expectError({ ...base, temperature: 'hot' }, 400, 'temperature not a number', 'temperature');
await expectError({ ...base, presence_penalty: 2.5 }, 400, 'presence_penalty out of range', 'presence_penalty');
await expectError({ ...base, frequency_penalty: -3 }, 400, 'frequency_penalty out of range', 'frequency_penalty');
await expectError({ ...base, min_p: 1.5 }, 400, 'min_p out of range', 'min_p');
await expectError({ ...base, logprobs: 21 }, 400, 'logprobs above 20', 'logprobs');
await expectError({ ...base, logit_bias: { abc: 1 } }, 400, 'logit_bias key not a token id', 'logit_bias');
await expectError({ ...base, logit_bias: { 5: 101 } }, 400, 'logit_bias value out of range', 'logit_bias');
await expectError({ ...base, logit_bias: { 99999999: 1 } }, 400, 'logit_bias token outside the vocabulary');
await expectError({ ...base, frobnicate: true }, 400, 'unknown field', 'frobnicate');
await expectError({ ...base, model: 'no-such-model' }, 404, 'unknown model', 'model');
await expectError({ ...base, prompt: [1, 2, 'x'] }, 400, 'mixed prompt list', 'prompt');
if (spec.context_len)
  await expectError({ ...base, prompt: new Array(spec.context_len + 5).fill(1) }, 400, 'prompt too long');
const chatCreate = (p) => client.chat.completions.create(p);
if (!spec.have_chat) {
  await expectError({ model, messages: [{ role: 'user', content: 'hi' }] }, 501, 'chat without a template renderer',
    'messages', chatCreate);
} else {
  const ch = spec.chat, want = ch.texts.join('');
  const p = { model, messages: ch.messages, max_tokens: ch.max_tokens, temperature: 0 };
  const r = await client.chat.completions.create({ ...p, logprobs: true });
  check(r.object === 'chat.completion' && r.choices[0].message.role === 'assistant', 'chat shape', r);
  check(r.choices[0].message.content === want, 'chat content == kvrail run on the rendered prompt',
    { got: r.choices[0].message.content, want });
  check(JSON.stringify(r.choices[0].logprobs.content.map((t) => t.token)) === JSON.stringify(ch.texts),
    'chat logprobs.content tokens', r.choices[0].logprobs);
  check(r.usage.prompt_tokens === ch.prompt_tokens && r.usage.completion_tokens === ch.texts.length,
    'chat usage', [r.usage, ch.prompt_tokens]);
  const chunks = [];
  for await (const c of await client.chat.completions.create({ ...p, stream: true,
    stream_options: { include_usage: true } })) chunks.push(c);
  const deltas = chunks.filter((c) => c.choices.length);
  check(deltas.every((c) => c.object === 'chat.completion.chunk'), 'chat chunk objects', deltas[0]);
  check(deltas[0].choices[0].delta.role === 'assistant', 'first delta carries the role', deltas[0]);
  check(deltas.map((c) => c.choices[0].delta.content ?? '').join('') === want, 'streamed chat content', deltas);
  check(deltas.at(-1).choices[0].finish_reason === (ch.texts.length === ch.max_tokens ? 'length' : 'stop'),
    'streamed chat finish', deltas.at(-1));
  check(chunks.at(-1).usage?.prompt_tokens === ch.prompt_tokens, 'streamed chat usage', chunks.at(-1));
  await expectError({ model, messages: [] }, 400, 'chat: empty messages', 'messages', chatCreate);
  await expectError({ ...p, top_logprobs: 2 }, 400, 'chat: top_logprobs without logprobs', 'top_logprobs', chatCreate);
  const t2 = await client.chat.completions.create({ ...p, logprobs: true, top_logprobs: 2 });
  const content = t2.choices[0].logprobs.content;
  check(content.length === ch.texts.length && content.every((t) => t.top_logprobs.length === 2 &&
    t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && Array.isArray(t.top_logprobs[0].bytes)),
  'chat top_logprobs: two alternatives per token, best first, with bytes', content[0]);
  check(content.every((t) => Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6),
    'chat top_logprobs: greedy token is the best alternative', content);
  ok(`chat: ${ch.texts.length} tokens equal kvrail run on the rendered template, streamed too`);
}
console.log('sdk_check: all passed');
