#!/usr/bin/env python3
"""Loom's tokenizer.json reader (src/loom/tokenizer/hf_tokenizer.h) gives the same ids as the
`tokenizers` library on every line, and on the whole text, of every book of the default corpus and
of a few lines of other scripts and Unicode spaces, with two byte-level BPE tokenizers: SmolLM2's
(GPT-2's layout) and one in Llama 3's layout trained here by `tokenizers`; and decode(encode(x)) == x
for each (tokenize_tool checks).

    hf_tokenizer_test.py TOKENIZE_TOOL SOURCE_DIR

SmolLM2's directory is made by bench/smollm2.py under the peer venv (cached beside the venv), the
corpus by scripts/fetch_corpus.sh. The `tokenizers` half runs under the venv's python. Labelled
peer; a missing venv fails the test, never skips.
"""
import json
import os
import shutil
import sys
import tempfile

from peer_env import VENV_PYTHON, corpus_dir, require_venv, run, smollm2_dir

TOOL, SRC = sys.argv[1], sys.argv[2]

# tokenizers takes Unicode strings: a line that is not UTF-8 (one book has a Latin-1 byte) has no
# reference encoding (None), and neither has the whole book then; Loom's round trip still covers it.
TOKENIZERS_HALF = r"""
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], "rb").read()
lines = data.split(b"\n")
if data.endswith(b"\n"):
    lines.pop()
def text(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return None
whole = text(data)
out = {"whole": None if whole is None else tok.encode(whole, add_special_tokens=False).ids,
       "lines": [None if text(l) is None else tok.encode(text(l), add_special_tokens=False).ids
                 for l in lines]}
print(json.dumps(out))
"""


require_venv()
SMOLLM2 = smollm2_dir(SRC)
corpus = corpus_dir(SRC)

# Beyond English: Unicode spaces and line separators, combining marks, other scripts and digits,
# emoji, CRLF, contractions in upper case (the regex's are lower case only).
MULTILINGUAL = ["Hello\u00a0world  \u3000全角スペース", "مرحبا بالعالم ١٢٣ ٤٥", "naïve café ﬁne e\u0301",
                "emoji 😀👍🏽 done", "tabs\t\tand\r\nwindows\r\n", "numbers ²³ ½ Ⅻ 12345",
                "  leading and trailing  ", "Ελληνικά русский 한국어", "a\u2028b\u2029c\u0085d",
                "zero\u200bwidth", "x'S y'LL z'Re it's", "— “quotes” ‘single’ …"]
tmp = tempfile.mkdtemp()
with open(os.path.join(tmp, "multilingual.txt"), "w", encoding="utf-8", newline="") as f:
    f.write("\n".join(MULTILINGUAL) + "\n")

# The other byte-level family, Llama 3's (and Qwen 2's) layout: pre_tokenizer Sequence[Split(its
# regex, Isolated), ByteLevel without regex], BPE with ignore_merges. No such model is packaged, so
# `tokenizers` trains one here (3000 pieces, two books) in exactly that layout.
LLAMA3_STYLE = r"""
import sys
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
       r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(PAT), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train(sys.argv[2:], trainers.BpeTrainer(
    vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    special_tokens=["<|begin_of_text|>", "<|end_of_text|>"], show_progress=False))
tok.save(sys.argv[1])
"""
llama3 = os.path.join(tmp, "llama3-style.json")
run([VENV_PYTHON, "-c", LLAMA3_STYLE, llama3, os.path.join(corpus, "carroll-alice.txt"),
     os.path.join(corpus, "austen-emma.txt")])

failures, n_lines, n_tokens, n_unchecked = 0, 0, 0, 0
texts = [os.path.join(corpus, f) for f in sorted(os.listdir(corpus)) if f.endswith(".txt")]
for name, tokenizer in [("SmolLM2", os.path.join(SMOLLM2, "tokenizer.json")),
                        ("Llama-3-style", llama3)]:
    for path in texts + [os.path.join(tmp, "multilingual.txt")]:
        book = name + " " + os.path.basename(path)
        theirs = json.loads(run([VENV_PYTHON, "-c", TOKENIZERS_HALF, tokenizer, path]))
        whole = [json.loads(l) for l in run([TOOL, tokenizer, path, "whole"]).splitlines()][0]
        lines = [json.loads(l) for l in run([TOOL, tokenizer, path, "lines"]).splitlines()]
        bad = [i for i, (a, b) in enumerate(zip(lines, theirs["lines"])) if b is not None and a != b]
        not_utf8 = sum(b is None for b in theirs["lines"])
        n_unchecked += not_utf8
        ok = (theirs["whole"] is None or whole == theirs["whole"]) and not bad and \
            len(lines) == len(theirs["lines"])
        n_lines += len(lines)
        n_tokens += len(whole)
        print("%-4s %s: %d tokens whole%s, %d lines%s%s" % (
            "ok" if ok else "FAIL", book, len(whole),
            "" if theirs["whole"] is not None else " (not UTF-8: round trip only)", len(lines),
            " (%d not UTF-8: round trip only)" % not_utf8 if not_utf8 else "",
            "" if ok else " (whole %s; %d lines differ, first %s: loom %s, tokenizers %s)" % (
                "equal" if whole == theirs["whole"] else "differs", len(bad), bad[:1] and bad[0] + 1,
                bad[:1] and lines[bad[0]][:20], bad[:1] and theirs["lines"][bad[0]][:20])))
        failures += not ok

shutil.rmtree(tmp)
print("hf_tokenizer: %d lines (%d not UTF-8, round trip only), %d tokens: %s" % (
    n_lines, n_unchecked, n_tokens, "all ok" if not failures else "%d texts FAILED" % failures))
sys.exit(1 if failures else 0)
