#!/usr/bin/env python3
"""loom report turns a synthetic run directory into one self-contained HTML page (4 inline SVG plots,
the summary, the escaped config), tolerates a torn last metrics line, rejects a missing run dir, and
renders around lines that are not metrics (malformed, a non-numeric loss, a number JSON cannot hold),
saying how many it skipped and naming the first one's path:line.

    report_test.py LOOM_BINARY SOURCE_DIR

Uses only the standard library.
"""
import html.parser
import json
import math
import os
import re
import subprocess
import sys
import tempfile

LOOM, SRC = sys.argv[1], sys.argv[2]
failures = 0


def check(name, ok, detail=""):
    global failures
    print("%-4s %s%s" % ("ok" if ok else "FAIL", name, ("  " + detail) if detail and not ok else ""))
    if not ok:
        failures += 1


def loom(*args):
    return subprocess.run([LOOM, "report"] + list(args), capture_output=True, text=True, timeout=60)


def write_run(d, steps=300, eval_every=50, tail=""):
    """A run dir like loom train's: decaying loss, warmup + cosine lr, val_loss every eval_every."""
    os.makedirs(d, exist_ok=True)
    lines = []
    for s in range(1, steps + 1):
        lr = 1e-3 * min(1.0, s / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps)))
        m = {"step": s, "loss": 1.5 + 4.0 * math.exp(-s / 60) + 0.05 * math.sin(s * 1.7),
             "lr": lr, "grad_norm": 0.5 + 2.0 * math.exp(-s / 30) + (3.0 if s == 123 else 0.0),
             "tokens_per_s": 12000 + 500 * math.sin(s / 7)}
        if s % eval_every == 0 or s == 1 or s == steps:
            m["val_loss"] = 1.6 + 4.0 * math.exp(-s / 60)
        lines.append(json.dumps(m))
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n" + tail)
    with open(os.path.join(d, "config.toml"), "w") as f:
        f.write('# tiny <test> & "friends"\n[model]\narch = "llama"\n[data]\npath = "a<b>&c.txt"\n')
    return lines


class Checker(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1


with tempfile.TemporaryDirectory() as d:
    # a clean run: default output path, printed on stdout
    run = os.path.join(d, "run")
    lines = write_run(run)
    p = loom(run)
    out = os.path.join(run, "report.html")
    check("report exits 0", p.returncode == 0, p.stderr)
    check("prints the output path", p.stdout.strip() == out, repr(p.stdout))
    check("report.html exists, no .tmp left", os.path.isfile(out) and not os.path.exists(out + ".tmp"))
    page = open(out).read() if os.path.isfile(out) else ""
    c = Checker()
    try:
        c.feed(page)
        c.close()
        parsed = True
    except Exception as e:  # html.parser is lenient; anything raised here is a real problem
        parsed = False
        print("     parse error: %s" % e)
    check("parses as HTML", parsed)
    check("4 <svg> plots", page.count("<svg") == 4 and c.tags.get("svg") == 4,
          "found %d" % page.count("<svg"))
    check("series are polylines", c.tags.get("polyline", 0) >= 5, str(c.tags.get("polyline")))
    check("val points are markers", c.tags.get("circle", 0) >= 7, str(c.tags.get("circle")))
    final = json.loads(lines[-1])
    check("final train loss shown", "%.4f" % final["loss"] in page, "%.4f" % final["loss"])
    check("final val loss shown", "%.4f" % final["val_loss"] in page)
    check("config embedded, escaped",
          "# tiny &lt;test&gt; &amp; &quot;friends&quot;" in page and "a&lt;b&gt;&amp;c.txt" in page
          and "<test>" not in page)
    check("self-contained (no scripts, no external refs)",
          "<script" not in page and "src=" not in page and "href=" not in page)

    # a long run is downsampled to at most ~2000 points per polyline; --out elsewhere
    long_run = os.path.join(d, "long")
    write_run(long_run, steps=20000, eval_every=500)
    other = os.path.join(d, "elsewhere.html")
    p = loom(long_run, "--out", other)
    page = open(other).read() if p.returncode == 0 else ""
    counts = [len(seg.split('points="', 1)[1].split('"', 1)[0].split())
              for seg in page.split("<polyline")[1:]]
    check("--out FILE, long series downsampled",
          p.returncode == 0 and p.stdout.strip() == other and counts and max(counts) <= 2000,
          "rc=%d points per polyline %s %s" % (p.returncode, counts, p.stderr))
    # the grad-norm spike at step 123 (3.5; elsewhere <= 2.5) must survive: the top y tick is >= 3.5
    grad = page.split("<svg")[4] if page.count("<svg") == 4 else ""
    yticks = [float(t) for t in re.findall(r'text-anchor="end">([-0-9.]+)<', grad)]
    check("the grad-norm spike survives downsampling", yticks and max(yticks) >= 3.5, str(yticks))

    # a torn last line (a crash mid-write) is skipped silently
    torn = os.path.join(d, "torn")
    write_run(torn, tail='{"step": 301, "loss": 1.5')
    p = loom(torn)
    check("torn last line tolerated", p.returncode == 0, p.stderr)

    # extreme finite values (overflowing spans, denormals, flat series at the limits, a huge step)
    # render: every plot drawn, exit 0
    for i, vals in enumerate([[1e308, 5e-324, -1e308, 1.7976931348623157e308, 1e-300, 3.0],
                              [5e-324] * 3, [1e308] * 2, [1e-310, 2e-310, 3e-310], [0.0] * 3,
                              [1e-15, 1.0000000000001e-15]]):
        ext = os.path.join(d, "extreme%d" % i)
        os.makedirs(ext)
        with open(os.path.join(ext, "metrics.jsonl"), "w") as f:
            for j, v in enumerate(vals):
                f.write(json.dumps({"step": j + 1 if i else 2**62 + j, "loss": v, "lr": v,
                                    "grad_norm": v, "tokens_per_s": v, "val_loss": v}) + "\n")
        p = loom(ext)
        page = open(os.path.join(ext, "report.html")).read() if p.returncode == 0 else ""
        check("extreme values %s render" % vals[:3], p.returncode == 0 and page.count("<svg") == 4,
              p.stderr[-300:])

    # errors: exit 1 with the path (and line) in the message
    missing = os.path.join(d, "nope")
    p = loom(missing)
    check("missing run dir: exit 1, names it", p.returncode == 1 and missing in p.stderr, p.stderr)

    nometrics = os.path.join(d, "nometrics")
    os.makedirs(nometrics)
    p = loom(nometrics)
    check("missing metrics.jsonl: exit 1, names it",
          p.returncode == 1 and os.path.join(nometrics, "metrics.jsonl") in p.stderr, p.stderr)

    empty = os.path.join(d, "empty")
    os.makedirs(empty)
    open(os.path.join(empty, "metrics.jsonl"), "w").close()
    p = loom(empty)
    check("empty metrics.jsonl: exit 1, names it",
          p.returncode == 1 and os.path.join(empty, "metrics.jsonl") in p.stderr, p.stderr)

    bad = os.path.join(d, "bad")
    write_run(bad)
    path = os.path.join(bad, "metrics.jsonl")
    ls = open(path).read().split("\n")
    ls[41] = ls[41][: len(ls[41]) // 2]  # line 42 torn in the middle of the file
    open(path, "w").write("\n".join(ls))
    p = loom(bad)
    check("malformed middle line: skipped and counted, the report written",
          p.returncode == 0 and (path + ":42") in p.stderr and "skipped 1 line" in p.stderr
          and os.path.exists(os.path.join(bad, "report.html")), p.stderr)

    ls = open(path).read().split("\n")
    ls[41] = json.dumps({"step": 42, "loss": "high"})
    ls[50] = '{"step": 51, "loss": 1e400}'  # nlohmann throws out_of_range, not parse_error
    ls[60] = "[1, 2]"
    open(path, "w").write("\n".join(ls))
    os.remove(os.path.join(bad, "report.html"))
    p = loom(bad)
    check("a non-numeric loss, 1e400 and a non-object: 3 skipped, the first named, rendered",
          p.returncode == 0 and (path + ":42") in p.stderr and "skipped 3 lines" in p.stderr
          and os.path.exists(os.path.join(bad, "report.html")), p.stderr)

print("report: all ok" if not failures else "report: %d FAILED" % failures)
sys.exit(1 if failures else 0)
