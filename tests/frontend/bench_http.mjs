// bench_http.mjs - closed-loop HTTP load on kvrail-frontend, the same shape
// as `kvrail-loadgen --mode closed`: C workers, each sending a streamed
// /v1/completions (token-id prompt, greedy, ignore_eos, max_tokens M) as
// soon as its previous one ended, over keep-alive connections.  TTFT is
// send -> first SSE event, e2e send -> [DONE]; output tokens from the usage
// chunk.  Prints one JSON object like loadgen's --summary-json.
//   node bench_http.mjs URL MODEL CONCURRENCY REQUESTS PROMPT_LEN OUTPUT_LEN VOCAB SEED WARMUP
import http from 'node:http';

const [url, model, conc, nreq, plen, olen, vocab, seed, warmup] = process.argv.slice(2);
const C = +conc, N = +nreq, P = +plen, O = +olen, V = +vocab, W = +warmup;
const agent = new http.Agent({ keepAlive: true, maxSockets: C });
const u = new URL(url + '/v1/completions');
let s = BigInt(+seed) || 1n;
function rnd() { // xorshift64
  s ^= (s << 13n) & 0xffffffffffffffffn; s ^= s >> 7n; s ^= (s << 17n) & 0xffffffffffffffffn;
  return Number(s % 1000000007n);
}

function one() {
  const prompt = Array.from({ length: P }, () => 4 + (rnd() % (V - 4)));
  const body = JSON.stringify({ model, prompt, max_tokens: O, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true } });
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    let tFirst = 0n, buf = '', tokens = 0;
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) } }, (res) => {
      if (res.statusCode !== 200) { reject(new Error('HTTP ' + res.statusCode)); res.resume(); return; }
      res.setEncoding('utf8');
      res.on('data', (d) => {
        if (!tFirst) tFirst = process.hrtime.bigint();
        buf += d;
      });
      res.on('end', () => {
        const t1 = process.hrtime.bigint();
        for (const ev of buf.split('\n\n')) {
          if (!ev.startsWith('data: {')) continue;
          const j = JSON.parse(ev.slice(6));
          if (j.usage) tokens = j.usage.completion_tokens;
        }
        resolve({ ttft: Number(tFirst - t0) / 1e6, e2e: Number(t1 - t0) / 1e6, tokens });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

const results = [];
// warm-up, left out: W requests, C at a time (so the frontend's pool of router
// clients and the keep-alive connections are at their steady-state size)
for (let i = 0; i < W; i += C) await Promise.all(Array.from({ length: C }, one));
let sent = 0;
async function worker() {
  while (sent < N) {
    sent++;
    results.push(await one());
  }
}
const tw = process.hrtime.bigint();
await Promise.all(Array.from({ length: C }, worker));
const wall = Number(process.hrtime.bigint() - tw) / 1e9;
const pct = (a, p) => { const b = [...a].sort((x, y) => x - y); return b[Math.min(b.length - 1, Math.floor(p * b.length))]; };
const ttft = results.map((r) => r.ttft), e2e = results.map((r) => r.e2e);
const toks = results.reduce((a, r) => a + r.tokens, 0);
console.log(JSON.stringify({ requests: results.length, wall_s: wall, out_tok_per_s: toks / wall,
  ttft_ms: { p50: pct(ttft, 0.5), p99: pct(ttft, 0.99) }, e2e_ms: { p50: pct(e2e, 0.5), p99: pct(e2e, 0.99) } }));
agent.destroy();
