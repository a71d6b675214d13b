#!/usr/bin/env python3
"""test_run.py - `kvrail run` on a generated tiny model.

    test_run.py KVRAIL MKMODEL ENGINE_DUMP

Checks: --json line format (prompt_tokens first, then one object per token
with token_id, text, logprob); greedy tokens equal the engine's greedy
decode as engine_dump computes it (prefill all + decode steps); logprobs are
log-probabilities (<= 0); a seed reproduces a sampled run and another seed
changes it; --prompt text is encoded with bos first and the token texts
concatenate to what the plain-text mode prints; bad flags and models are
clear errors (exit 2 / 1), never crashes.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import sp_run, spawn  # noqa: E402  (own process groups, reaped on every exit path)


def run(kvrail, *args, check=True):
    r = sp_run([kvrail, "run"] + list(args), capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, KVR_LOG_LEVEL="warn"))
    if check and r.returncode != 0:
        raise AssertionError(f"kvrail run {args} failed ({r.returncode}): {r.stderr}")
    return r


def lines(out):
    return [json.loads(x) for x in out.strip().splitlines()]


def main():
    kvrail, mk, dump = sys.argv[1:4]
    with tempfile.TemporaryDirectory(prefix="kvr-run-") as tmp:
        m = os.path.join(tmp, "m")
        sp_run([mk, "--out", m, "--seed", "11"], check=True)
        prompt = [5, 17, 99, 3, 250, 42, 8, 64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        ptxt = ",".join(map(str, prompt))

        # greedy --json against engine_dump's greedy decode
        r = run(kvrail, "--model", m, "--prompt-tokens", ptxt, "--max-tokens", "24", "--json",
                "--ignore-eos")
        js = lines(r.stdout)
        assert js[0] == {"prompt_tokens": prompt}, js[0]
        assert js[-1] == {"finish_reason": "length", "usage": {
            "prompt_tokens": len(prompt), "completion_tokens": 24, "cached_tokens": 0}}, js[-1]
        gen = js[1:-1]
        assert len(gen) == 24, len(gen)
        for g in gen:
            assert set(g) == {"token_id", "text", "logprob"}, g
            assert isinstance(g["token_id"], int) and isinstance(g["text"], str)
            assert g["logprob"] <= 0.0
        out = os.path.join(tmp, "d")
        sp_run([dump, m, ptxt, "23", out], check=True,
                       env=dict(os.environ, KVR_LOG_LEVEL="warn"))
        with open(out + ".json") as f:
            ref = json.load(f)["tokens"][len(prompt):]
        # engine_dump feeds 23 decoded tokens and picks the 24th from the last row
        got = [g["token_id"] for g in gen]
        assert got[:23] == ref, f"greedy run {got} != engine greedy {ref}"
        print("greedy --json matches the engine's greedy decode:", got[:8], "...")

        # sampling: same seed same tokens, other seed other tokens
        a = run(kvrail, "--model", m, "--prompt-tokens", ptxt, "--max-tokens", "16", "--json",
                "--temperature", "1.0", "--seed", "5", "--ignore-eos").stdout
        b = run(kvrail, "--model", m, "--prompt-tokens", ptxt, "--max-tokens", "16", "--json",
                "--temperature", "1.0", "--seed", "5", "--ignore-eos").stdout
        c = run(kvrail, "--model", m, "--prompt-tokens", ptxt, "--max-tokens", "16", "--json",
                "--temperature", "1.0", "--seed", "6", "--ignore-eos").stdout
        assert a == b, "same seed, different output"
        assert a != c, "different seeds gave the same 16 sampled tokens"
        ta = [x["token_id"] for x in lines(a)[1:-1]]
        assert ta != got[:16], "temperature 1 sampled exactly the greedy tokens"
        r = run(kvrail, "--model", m, "--prompt-tokens", ptxt, "--max-tokens", "16", "--json",
                "--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "5")
        assert len(lines(r.stdout)) >= 2
        print("seeded sampling reproducible; seeds differ")

        # --prompt text: bos first; token texts concatenate to the plain output
        r = run(kvrail, "--model", m, "--prompt", "Hello, world! 123", "--max-tokens", "12",
                "--json", "--ignore-eos")
        js = lines(r.stdout)
        with open(os.path.join(m, "config.json")) as f:
            bos = json.load(f)["bos_token_id"]
        assert js[0]["prompt_tokens"][0] == bos, js[0]
        assert len(js[0]["prompt_tokens"]) > 2
        text = "".join(x["text"] for x in js[1:-1])
        plain = run(kvrail, "--model", m, "--prompt", "Hello, world! 123", "--max-tokens", "12",
                    "--ignore-eos").stdout
        assert plain == text + "\n", f"plain {plain!r} != json texts {text!r}"
        print("text prompt: bos first,", len(js[0]["prompt_tokens"]), "tokens; texts concatenate")

        # --max-tokens 0: the prompt line and the finish/usage line
        r = run(kvrail, "--model", m, "--prompt-tokens", "1,2", "--max-tokens", "0", "--json")
        assert lines(r.stdout) == [{"prompt_tokens": [1, 2]}, {"finish_reason": "length", "usage": {
            "prompt_tokens": 2, "completion_tokens": 0, "cached_tokens": 0}}], r.stdout

        # errors
        bad = [
            (["--model", m, "--prompt-tokens", "1,2", "--max-tokens", "3", "--temperature",
              "-1"], 2, "temperature"),
            (["--model", m, "--prompt-tokens", "1,x", "--max-tokens", "3"], 1, "prompt-tokens"),
            (["--model", m, "--prompt-tokens", "1,99999", "--max-tokens", "3"], 1,
             "vocabulary"),
            (["--model", m, "--prompt-tokens", "1", "--max-tokens", "100000"], 1, "context"),
            (["--model", os.path.join(tmp, "nope"), "--prompt-tokens", "1", "--max-tokens",
              "1"], 1, "config.json"),
            (["--model", m, "--max-tokens", "1"], 2, "--prompt"),
            (["--model", m, "--prompt-tokens", "1", "--max-tokens", "1", "--bogus"], 2, ""),
        ]
        for args, rc, want in bad:
            r = run(kvrail, *args, check=False)
            assert r.returncode == rc and want in r.stderr, \
                f"{args}: rc {r.returncode} (want {rc}), stderr {r.stderr!r} (want {want!r})"
        print("bad arguments: clear errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
