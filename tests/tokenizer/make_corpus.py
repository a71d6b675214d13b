#!/usr/bin/env python3
"""make_corpus.py - writes corpus.json, the strings the tokenizer oracle test
encodes with every tokenizer: Unicode scripts (CJK, accents precomposed and
decomposed, RTL), emoji with ZWJ sequences, whitespace runs, tabs/newlines,
digits, code, special tokens.  Rerun after editing; the output is committed."""
import json
import os

C = [
    "",
    " ",
    "Hello world",
    "Hello, World! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "It's we're they've I'm you'll he'd can't won't",
    "IT'S WE'RE THEY'VE I'M YOU'LL HE'D",
    "'s 'tis rock'n'roll ''quoted'' it’s curly",
    "  two leading spaces",
    "trailing spaces   ",
    "    ",
    "a  b   c    d",
    "\n",
    "\n\n\n",
    "\t\t",
    "\r\n",
    " \n \n  \n",
    "line one\nline two\r\nline three\n\n\tindented\n",
    "tabs\tbetween\twords\t",
    "mixed \t \n  \r\n whitespace \u00a0nbsp \u3000ideographic \u2003em",
    "1234567890",
    "3.14159265358979",
    "1,000,000 and 12:34:56 and 2026-12-01",
    "x1y22z333w4444",
    "\u0663\u0664\u0665 arabic-indic, \u00b2\u00b3 superscripts, \u216b roman",
    "na\u00efve caf\u00e9 \u2014 r\u00e9sum\u00e9, \u00fcber Stra\u00dfe, se\u00f1or",
    "e\u0301 a\u0308 o\u0302 decomposed accents",
    "a\u0308\u0301 and a\u0301\u0308 ordering, \u212b angstrom, \u1100\u1161 jamo",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u5b57\u7b26\u3002",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6211\u4eec\u5728\u5317\u4eac\u3002",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0438 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u044f\u0437\u044b\u043a",
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u05de\u05d9\u05de\u05d9\u05df \u05dc\u05e9\u05de\u05d0\u05dc",
    "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "mixed \u200fRTL\u200e marks: abc \u05d0\u05d1\u05d2 123",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0939\u093f\u0928\u094d\u0926\u0940 \u09ac\u09be\u0982\u09b2\u09be",
    "emoji \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "flags \U0001f1e9\U0001f1ea\U0001f1ef\U0001f1f5 keycap 1\ufe0f\u20e3 heart \u2764\ufe0f rainbow \U0001f3f3\ufe0f\u200d\U0001f308",
    "\U0001f600\U0001f603\U0001f604\U0001f601\U0001f606",
    "\U0001f9d1\u200d\U0001f4bb coder \U0001f469\U0001f3fe\u200d\U0001f52c scientist",
    "def square(x):\n    return x ** 2  # comment\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (size_t i = 0; i < n; i++) { a[i] += b[i] * c; }",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"x\": \"y\"}}",
    "<div class=\"main\"><p>Hello &amp; goodbye</p></div>",
    "$ ls -la /usr/lib | grep -E '^d' && echo \"done\" >> log.txt",
    "regex: ^[a-zA-Z_][a-zA-Z0-9_]*$ and \\d{3}-\\d{4}",
    "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((())) [[]] {{}}",
    "path/to/file.txt C:\\Windows\\System32 https://example.com/a?b=c&d=e#f",
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>",
    "<s> hello </s> and <s>world</s>",
    "text<|endoftext|>more text <|endoftext|> end",
    "<unk> <|reserved_special_token_5|> <think>reason</think>",
    "a" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "\u0001\u007f control",
    "UPPER lower MiXeD cAsE",
    "The year 1984 had 365 days; pi is 3.14 and e is 2.718.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.",
]

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.json")
with open(out, "w", encoding="utf-8") as f:
    json.dump(C, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"{out}: {len(C)} strings")
