#!/usr/bin/env python3
"""chat_oracle.py - renders chat template cases with Python's Jinja2 (Debian
python3-jinja2), configured as Hugging Face transformers does it:
ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls,
tojson without HTML escaping, raise_exception and strftime_now globals.

    chat_oracle.py CASES.json OUT.json

Writes [{"ok": true, "text": ...} | {"ok": false, "error": ...}] in order.
Exits 77 when jinja2 is not installed."""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: python3-jinja2 not installed (tools/install-deps.sh --test)")
    sys.exit(77)


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.fromtimestamp(1700000000).strftime(fmt)


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    out = []
    for c in cases:
        try:
            t = env.from_string(c["template"])
            kw = dict(c.get("extra") or {})
            if c.get("tools") is not None:
                kw["tools"] = c["tools"]
            text = t.render(messages=c["messages"], add_generation_prompt=c["add_generation_prompt"],
                            bos_token=c["bos_token"], eos_token=c["eos_token"], **kw)
            out.append({"ok": True, "text": text})
        except Exception as e:  # every failure is a result to compare
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main()
