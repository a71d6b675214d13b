#!/usr/bin/env python3
"""chat_cli_test.py - `kvrail run --chat FILE` and `--message role:content`
render the model's chat template and generate from it.

    chat_cli_test.py KVRAIL KVRAIL_MKMODEL

A generated model gets a Llama-3-style chat_template in its
tokenizer_config.json; both forms of the option must print the same
rendered prompt (checked against the text the template must produce), encode
it with exactly one bos (the template's own: no second one from the
tokenizer), and generate; a message without "role:" and a template that
raises are clear errors (exit status 1, message on stderr)."""
import json
import os
import subprocess
import sys
import tempfile

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
            "{{ raise_exception('role ' + m.role + ' is not supported') }}{% endif %}"
            "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>"
            "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}: {p.stderr}")
    return p


def main():
    kvrail, mkmodel = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "m")
        run([mkmodel, "--out", model])
        cfgp = os.path.join(model, "tokenizer_config.json")
        cfg = json.load(open(cfgp))
        cfg["chat_template"] = TEMPLATE
        cfg["bos_token"] = "<|begin_of_text|>"
        json.dump(cfg, open(cfgp, "w"))
        msgs = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hello, world"}]
        want = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHello, world<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n")
        mfile = os.path.join(d, "messages.json")
        json.dump(msgs, open(mfile, "w"))
        outs = []
        for args in (["--chat", mfile], ["--message", "system:Be brief. ", "--message", "user:Hello, world"]):
            p = run([kvrail, "run", "--model", model, "--max-tokens", "3", "--json"] + args)
            lines = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
            if lines[0].get("chat_prompt") != want:
                sys.exit(f"FAIL: {args[0]}: rendered {lines[0]!r}, want {want!r}")
            toks = lines[1]["prompt_tokens"]
            bos = 256  # kvr_tokenizer_gen_bytelevel: id 256 is <|begin_of_text|>
            if toks[0] != bos or toks.count(bos) != 1:
                sys.exit(f"FAIL: {args[0]}: prompt tokens {toks[:8]}... must hold exactly one bos first")
            gen = [x["token_id"] for x in lines[2:] if "token_id" in x]
            if len(gen) != 3:
                sys.exit(f"FAIL: {args[0]}: generated {gen}, want 3 tokens")
            outs.append((toks, gen))
        if outs[0] != outs[1]:
            sys.exit("FAIL: --chat FILE and --message give different prompts or tokens")
        p = run([kvrail, "run", "--model", model, "--max-tokens", "1", "--message", "hello"], ok=False)
        if p.returncode != 1 or "role:content" not in p.stderr:
            sys.exit(f"FAIL: a message without a role: exit {p.returncode}, stderr {p.stderr!r}")
        p = run([kvrail, "run", "--model", model, "--max-tokens", "1", "--message", "tool:x"], ok=False)
        if p.returncode != 1 or "role tool is not supported" not in p.stderr:
            sys.exit(f"FAIL: raise_exception: exit {p.returncode}, stderr {p.stderr!r}")
    print("chat_cli: ok")


if __name__ == "__main__":
    main()
