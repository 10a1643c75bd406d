#!/usr/bin/env python3
"""Bad input to the loom CLI: each case must exit non-zero with a clear message naming the file and
the key or tensor, never crash (a signal) and never write a half output file.

    cli_errors_test.py LOOM_BINARY SOURCE_DIR

Uses only the standard library (it writes its own small safetensors files).
"""
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

LOOM, SRC = sys.argv[1], sys.argv[2]
failures = 0


def write_st(path, tensors):
    """tensors: {name: (dtype "F32"|"I32", shape, flat list)}"""
    header, blobs, off = {}, [], 0
    for name, (dt, shape, vals) in tensors.items():
        b = struct.pack("<%d%s" % (len(vals), "f" if dt == "F32" else "i"), *vals)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def run(name, args, expect_ok=False, must_contain=(), rc=1, timeout=120):
    """rc: the exit status expected of a failure (1: loom's errors; CLI11's parse errors have
    their own, all above 100). timeout: past it, a hang (subprocess raises)."""
    global failures
    p = subprocess.run([LOOM] + args, capture_output=True, text=True, timeout=timeout)
    msg = (p.stderr + p.stdout).strip()
    ok = (p.returncode == 0) if expect_ok else (p.returncode == rc)
    for s in must_contain:
        ok = ok and s in msg
    print("%-4s %-34s rc=%d  %s" % ("ok" if ok else "FAIL", name, p.returncode,
                                    msg.splitlines()[0] if msg else ""))
    if not ok:
        failures += 1
        print("     full output:\n     " + msg.replace("\n", "\n     "))
        if p.returncode < 0:
            print("     (killed by signal %d: a crash)" % -p.returncode)


with tempfile.TemporaryDirectory() as d:
    good = os.path.join(SRC, "configs", "tiny-llama.toml")
    text = open(good).read()

    def cfg(name, body):
        path = os.path.join(d, name)
        open(path, "w").write(body)
        return path

    bench = ["bench", "--steps", "1", "--warmup", "0"]
    run("malformed toml", bench + [cfg("bad.toml", "[model\narch = 1\n")], must_contain=["bad.toml:1"])
    # special files: refused before anything waits on them (a FIFO's open would block forever)
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    for key in ["model.norm_eps=inf", "model.rope_theta=nan", "optim.eps=inf", "optim.lr=-inf"]:
        run("non-finite " + key.split("=")[0], bench + [good, "--set", key],
            must_contain=[key.split("=")[0].split(".")[1], "must be a finite number"])
    run("min_lr above lr", bench + [good, "--set", "train.min_lr=1.0"],
        must_contain=["min_lr", "at most [optim] lr"])
    run("negative grad_clip", bench + [good, "--set", "optim.grad_clip=-1.0"],
        must_contain=["grad_clip", "must be >= 0"])
    run("config is a FIFO", bench + [fifo], must_contain=["fifo", "not a regular file (a FIFO)"])

    sock_path = os.path.join(d, "sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(sock_path)
    run("config is a socket", bench + [sock_path], must_contain=["not a regular file (a socket)"])
    sock.close()
    os.symlink("loop_b", os.path.join(d, "loop_a"))
    os.symlink("loop_a", os.path.join(d, "loop_b"))
    run("data path is a symlink loop", ["train", good, "--run-dir", os.path.join(d, "run_loop"),
                                        "--set", "data.path=" + os.path.join(d, "loop_a")],
        must_contain=["loop_a: cannot read it: Too many levels of symbolic links"])
    run("config is a directory", bench + [d], must_contain=["not a regular file (a directory)"])
    run("cluster file is a FIFO", ["plan", good, "--cluster", fifo],
        must_contain=["not a regular file (a FIFO)"])

    run("unknown key", bench + [cfg("typo.toml", text.replace("d_model", "dmodel"))],
        must_contain=["typo.toml", "dmodel", "did you mean 'd_model'"])
    run("unknown section", bench + [cfg("sec.toml", text + "\n[modle]\nx = 1\n")],
        must_contain=["sec.toml", "[modle]"])
    run("missing arch", bench + [cfg("noarch.toml", text.replace('arch = "llama"', ""))],
        must_contain=["noarch.toml", "arch"])
    run("wrong type", bench + [cfg("type.toml", text.replace("d_model = 64", 'd_model = "64"'))],
        must_contain=["type.toml", "d_model", "integer"])
    run("inconsistent heads", bench + [cfg("heads.toml", text.replace("n_heads = 4", "n_heads = 5"))],
        must_contain=["heads.toml", "n_heads"])
    run("bad --set", bench + [good, "--set", "model.d_model"], must_contain=["--set"])
    run("unknown --set key", bench + [good, "--set", "optim.lrr=1"], must_contain=["lrr", "'lr'"])
    run("missing config", bench + [os.path.join(d, "nope.toml")], must_contain=["nope.toml"])

    # weights and tokens for the tiny llama: V=256, C=64, 2 layers, 4 heads, 2 kv heads, ffn 176
    C, V, F, L = 64, 256, 176, 2
    shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
    for l in range(L):
        p = "model.layers.%d." % l
        shapes.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                       p + "self_attn.q_proj.weight": [C, C], p + "self_attn.k_proj.weight": [32, C],
                       p + "self_attn.v_proj.weight": [32, C], p + "self_attn.o_proj.weight": [C, C],
                       p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                       p + "mlp.down_proj.weight": [C, F]})

    def weights(name, drop=None, reshape=None, extra=None):
        t = {}
        for n, s in shapes.items():
            if n == drop:
                continue
            if n == reshape:
                s = [s[0] + 1] + s[1:]
            count = 1
            for x in s:
                count *= x
            t[n] = ("F32", s, [0.01 * ((i * 7) % 13 - 6) for i in range(count)])
        if extra:
            t[extra] = ("F32", [2], [0.0, 0.0])
        path = os.path.join(d, name)
        write_st(path, t)
        return path

    w = weights("w.safetensors")
    toks = os.path.join(d, "tokens.safetensors")
    write_st(toks, {"tokens": ("I32", [2, 9], [(i * 31) % V for i in range(18)])})
    out = os.path.join(d, "out.safetensors")
    step = ["step", "--config", good, "--tokens", toks, "--out", out]
    run("step works", step + ["--weights", w], expect_ok=True, must_contain=["loss"])
    # an output that is an input, or a FIFO (the rename would replace it): refused, both untouched
    w_bytes = open(w, "rb").read()
    run("step: --out is --weights", ["step", "--config", good, "--tokens", toks, "--weights", w,
                                     "--out", w],
        must_contain=["--out " + w + " is the file --weights reads", "destroy"])
    run("step: --out is a FIFO", ["step", "--config", good, "--tokens", toks, "--weights", w,
                                  "--out", fifo],
        must_contain=["--out " + fifo + ": not a regular file (a FIFO)"])
    run("bench: --kernels-out is a FIFO", bench + [good, "--kernels-out", fifo],
        must_contain=["--kernels-out " + fifo + ": not a regular file (a FIFO)"])
    ok = open(w, "rb").read() == w_bytes and stat.S_ISFIFO(os.stat(fifo).st_mode)
    print("%-4s %-34s" % ("ok" if ok else "FAIL", "  ... the weights and the FIFO untouched"))
    failures += 0 if ok else 1
    # non-finite weights: refused naming the tensor and index (training on them says only "nan")
    for bad_value, word in [(float("nan"), "nan"), (float("inf"), "inf")]:
        t = {}
        for n, sh in shapes.items():
            count = 1
            for x in sh:
                count *= x
            vals = [0.01] * count
            if n == "model.norm.weight":
                vals[3] = bad_value
            t[n] = ("F32", sh, vals)
        nonfinite = os.path.join(d, "nonfinite.safetensors")
        write_st(nonfinite, t)
        run("weights: %s in a tensor" % word, step + ["--weights", nonfinite],
            must_contain=["nonfinite.safetensors", "'model.norm.weight'", word, "index 3"])
    if not os.path.exists(out):
        print("FAIL step wrote no output")
        failures += 1
    os.remove(out)
    # loom step reads only [model]: a config of [model] alone, with a max_seq_len below [train]
    # seq_len's default, takes B and T from the tokens (T = 8 here)
    model_only = cfg("model_only.toml", text[:text.index("[train]")].replace("max_seq_len = 64",
                                                                            "max_seq_len = 16"))
    run("step: [model] only", ["step", "--config", model_only, "--tokens", toks, "--out", out,
                               "--weights", w], expect_ok=True, must_contain=["loss"])
    if os.path.exists(out):
        os.remove(out)
    # elsewhere, an error about a value the user never wrote says it is the default
    run("bench: a default seq_len", bench + [model_only],
        must_contain=["model_only.toml", "[train] seq_len", "default", "hint:"])
    run("weights: missing tensor",
        step + ["--weights", weights("w1.safetensors", drop="lm_head.weight")],
        must_contain=["w1.safetensors", "lm_head.weight"])
    run("weights: wrong shape",
        step + ["--weights", weights("w2.safetensors", reshape="model.layers.1.mlp.up_proj.weight")],
        must_contain=["w2.safetensors", "model.layers.1.mlp.up_proj.weight", "[177,64]"])
    run("weights: unexpected tensor",
        step + ["--weights", weights("w3.safetensors", extra="model.layers.7.foo")],
        must_contain=["w3.safetensors", "model.layers.7.foo"])
    trunc = os.path.join(d, "trunc.safetensors")
    data = open(w, "rb").read()
    open(trunc, "wb").write(data[: len(data) - 100])
    run("weights: truncated file", step + ["--weights", trunc], must_contain=["trunc.safetensors"])
    open(trunc, "wb").write(data[:5])
    run("weights: 5-byte file", step + ["--weights", trunc], must_contain=["trunc.safetensors"])
    run("weights: missing file", step + ["--weights", os.path.join(d, "none.safetensors")],
        must_contain=["none.safetensors"])
    run("weights: a FIFO", step + ["--weights", fifo], must_contain=["fifo: not a regular file"])
    bad_toks = os.path.join(d, "oov.safetensors")
    write_st(bad_toks, {"tokens": ("I32", [2, 9], [5] * 17 + [256])})
    run("tokens: out of vocabulary",
        ["step", "--config", good, "--weights", w, "--tokens", bad_toks, "--out", out],
        must_contain=["oov.safetensors", "256", "vocabulary"])
    write_st(bad_toks, {"ids": ("I32", [2, 9], [5] * 18)})
    run("tokens: wrong tensor name",
        ["step", "--config", good, "--weights", w, "--tokens", bad_toks, "--out", out],
        must_contain=["oov.safetensors", "tokens"])
    write_st(bad_toks, {"tokens": ("F32", [2, 9], [5.0] * 18)})
    run("tokens: wrong dtype",
        ["step", "--config", good, "--weights", w, "--tokens", bad_toks, "--out", out],
        must_contain=["oov.safetensors", "i32"])
    write_st(bad_toks, {"tokens": ("I32", [1, 66], [5] * 66)})
    run("tokens: longer than max_seq_len",
        ["step", "--config", good, "--weights", w, "--tokens", bad_toks, "--out", out],
        must_contain=["oov.safetensors", "max_seq_len"])
    write_st(bad_toks, {"tokens": ("I32", [0, 9], [])})
    run("tokens: no rows (a NaN loss of nothing)",
        ["step", "--config", good, "--weights", w, "--tokens", bad_toks, "--out", out],
        must_contain=["oov.safetensors", "1 <= B"])
    tr = ["train", good, "--run-dir", os.path.join(d, "run")]
    run("train: no data path", tr, must_contain=["[data] path"])
    run("train: missing data", tr + ["--set", "data.path=" + os.path.join(d, "nodata")],
        must_contain=["nodata"])
    tiny_text = cfg("tiny.txt", "too short")
    run("train: too little data", tr + ["--set", "data.path=" + tiny_text],
        must_contain=["tiny.txt", "too few"])
    text_file = cfg("text.txt", "hello world, this is some text. " * 200)
    run("train: vocab too small", tr + ["--set", "data.path=" + text_file, "--set", "model.vocab_size=100"],
        must_contain=["vocab_size"])
    # sizes that would overflow or cannot fit: a range naming the key, or the estimated memory,
    # before anything is allocated (once std::length_error, SIGSEGV, SIGFPE or a hang)
    sized = ["train", good, "--set", "data.path=" + text_file, "--set", "train.steps=1"]
    huge = str(2 ** 62)
    for key, value, want in [
            ("model.d_model", huge, ["[model] d_model", "must be in [1, 2^20]"]),
            ("model.n_layers", "1000000000", ["[model] n_layers", "must be in [1, 1024]"]),
            ("model.max_seq_len", huge, ["[model] max_seq_len", "must be in"]),
            ("model.ffn_hidden", huge, ["[model] ffn_hidden", "must be in"]),
            ("train.batch_size", huge, ["[train] batch_size", "must be in [1, 2^20]"]),
            ("train.grad_accum", huge, ["[train] grad_accum", "must be in"]),
            ("train.eval_batches", huge, ["[train] eval_batches", "must be in"]),
            ("train.steps", huge, ["[train] steps", "must be in"]),
            ("outer.inner_steps", str(2 ** 32), ["[outer] inner_steps", "must be in"]),
            ("plan.mesh", "{data=4294967296,model=4294967296}", ["[plan] mesh", "multiply past"]),
            ("outer.lease_s", "1e10", ["[outer] lease_s", "must be in (0, 86400]"]),
            ("outer.retry_s", "1e10", ["[outer] retry_s", "must be in [0, 86400]"]),
            ("outer.lr", "1e30", ["[outer] lr", "must be in (0, 1000]"]),
            ("model.d_model", "1048576", ["tiny-llama.toml", "parameters need", "GB", "d_model = 1048576"]),
            # with a 65,536-token vocabulary: 17 TB of logits, more than any machine's memory
            ("train.batch_size", "1048576", ["tiny-llama.toml", "a training step needs at least",
                                             "batch_size = 1048576", "GB"])]:
        more = ["--set", "model.vocab_size=65536"] if key == "train.batch_size" else []
        run("sizes: %s = %s" % (key, value[:12]),
            sized + more + ["--run-dir", os.path.join(d, "sz" + key + value[:12]),
                            "--set", "%s=%s" % (key, value)],
            must_contain=want)
    run("sizes: gpt2's positions too many", ["train", os.path.join(SRC, "configs", "tiny-gpt2.toml"),
                                             "--run-dir", os.path.join(d, "sz2"), "--set",
                                             "data.path=" + text_file, "--set",
                                             "model.max_seq_len=16777216", "--set", "model.d_model=4096",
                                             "--set", "model.n_heads=32"],
        must_contain=["tiny-gpt2.toml", "parameters need"])
    run("train: runs", tr + ["--set", "data.path=" + text_file, "--set", "train.steps=3"],
        expect_ok=True, must_contain=["trained to step 3"])
    run("train: existing run needs --resume", tr + ["--set", "data.path=" + text_file],
        must_contain=["--resume auto"])
    run("train: resume of a finished run", tr + ["--set", "data.path=" + text_file,
                                                 "--set", "train.steps=3", "--resume", "auto"],
        expect_ok=True, must_contain=["already trained"])
    # loom data prepare and training on its token shards
    prep = ["data", "prepare", "--vocab-size", "300", "--out"]
    run("data: missing input", prep + [os.path.join(d, "tok"), "--input", os.path.join(d, "nope.txt")],
        must_contain=["nope.txt"])
    empty = cfg("empty.txt", "")
    run("data: empty input", prep + [os.path.join(d, "tok"), "--input", empty],
        must_contain=["empty.txt", "empty"])
    words = "the model trains on text and tokens of loom weave a thread through every shard".split()
    prose = "".join(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 9)) + "\n"
                    for i in range(3000))
    prose_file = cfg("prose.txt", prose)
    tokdir = os.path.join(d, "tok")
    run("data: prepare bpe", prep + [tokdir, "--input", prose_file], expect_ok=True,
        must_contain=["vocab 300"])
    run("train: vocab mismatch", ["train", good, "--run-dir", os.path.join(d, "run_v"),
                                  "--set", "data.path=" + tokdir],
        must_contain=[os.path.join(tokdir, "meta.json"), "300", "256", "does not match"])
    # a prepared directory's meta.json read field by field; its tokenizer must be there

    tok_bad = os.path.join(d, "tok_bad")
    shutil.copytree(tokdir, tok_bad)
    meta_bad = json.load(open(os.path.join(tok_bad, "meta.json")))
    meta_bad["vocab_size"] = "x"
    json.dump(meta_bad, open(os.path.join(tok_bad, "meta.json"), "w"))
    tr_bad = ["train", good, "--run-dir", os.path.join(d, "run_bad"), "--set",
              "model.vocab_size=300", "--set", "data.path=" + tok_bad]
    run("train: meta.json vocab_size a string", tr_bad,
        must_contain=["meta.json: \"vocab_size\" = \"x\": expected a whole number"])
    meta_bad["vocab_size"] = 300
    json.dump(meta_bad, open(os.path.join(tok_bad, "meta.json"), "w"))
    os.remove(os.path.join(tok_bad, "tokenizer.model"))
    run("train: prepared data without its tokenizer", tr_bad,
        must_contain=["tokenizer (tokenizer.model) is missing"])
    run("train: a token shard as text", ["train", good, "--run-dir", os.path.join(d, "run_bad"),
                                         "--set", "data.path=" + os.path.join(tokdir, "train.bin")],
        must_contain=["train.bin: a token shard, not text"])
    split_dir = os.path.join(d, "split")
    os.makedirs(split_dir)
    open(os.path.join(split_dir, "a.txt"), "w").write(prose)
    open(os.path.join(split_dir, "b.txt"), "w").write("")
    run("train: an empty held-out file", ["train", good, "--run-dir", os.path.join(d, "run_bad"),
                                          "--set", "data.path=" + split_dir],
        must_contain=["0 validation bytes are too few", "b.txt"])
    run("train: on token shards", ["train", good, "--run-dir", os.path.join(d, "run_t"),
                                   "--set", "data.path=" + tokdir, "--set", "model.vocab_size=300",
                                   "--set", "train.steps=2"],
        expect_ok=True, must_contain=["trained to step 2"])
    run("sample: with the run's tokenizer", ["sample", os.path.join(d, "run_t"), "--prompt", "the",
                                             "--max-tokens", "5"],
        expect_ok=True, must_contain=["the"])
    run("sample: in bf16", ["sample", os.path.join(d, "run_t"), "--prompt", "the",
                            "--max-tokens", "5", "--dtype", "bf16"],
        expect_ok=True, must_contain=["the"])
    run("sample: --dtype f16", ["sample", os.path.join(d, "run_t"), "--dtype", "f16"],
        must_contain=["--dtype", "f16"], rc=105)
    run("sample: --seed past int64", ["sample", os.path.join(d, "run_t"), "--seed",
                                      "18446744073709551616"],
        must_contain=["--seed: must be a whole number in [0, 2^63-1]"], rc=105)
    run("sample: --context past max_seq_len", ["sample", os.path.join(d, "run_t"), "--context",
                                                "100000"],
        must_contain=["--context 100000: more than the model's max_seq_len"])
    run("sample: --path of a run without paths", ["sample", os.path.join(d, "run_t"), "--path",
                                                  "1"],
        must_contain=["is not a DiPaCo run"])
    run_metrics = os.path.join(d, "run_t", "metrics.jsonl")
    run("report: --out is the run's metrics", ["report", os.path.join(d, "run_t"), "--out",
                                               run_metrics],
        must_contain=["--out " + run_metrics + " is the file run_dir reads"])
    hf_blocked = os.path.join(d, "hf_blocked")
    os.makedirs(os.path.join(hf_blocked, "config.json"))
    run("export: config.json is a directory", ["export", os.path.join(d, "run_t"), "--hf",
                                               hf_blocked],
        must_contain=["config.json: not a regular file (a directory)"])
    ok = os.listdir(hf_blocked) == ["config.json"]
    print("%-4s %-34s" % ("ok" if ok else "FAIL", "  ... and nothing written"))
    failures += 0 if ok else 1
    train_bin = os.path.join(tokdir, "train.bin")
    blob = open(train_bin, "rb").read()
    # a shard truncated under a running loom train: an error naming it, not SIGBUS
    live_run = os.path.join(d, "run_live")
    live = subprocess.Popen([LOOM, "train", good, "--run-dir", live_run, "--set",
                             "data.path=" + tokdir, "--set", "model.vocab_size=300", "--set",
                             "train.steps=1000000", "--set", "checkpoint.every=1000000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive"))
    live_metrics = os.path.join(live_run, "metrics.jsonl")
    deadline = time.time() + 60
    while time.time() < deadline and live.poll() is None and not (
            os.path.exists(live_metrics) and os.path.getsize(live_metrics) > 0):
        time.sleep(0.01)
    os.truncate(train_bin, 32 + 2 * 64)
    try:
        _, err = live.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        live.kill()
        _, err = live.communicate()
    # caught by the shard's size check ("truncated or extended while open") or by a read that
    # finds the bytes gone ("no longer there (the file was truncated while open)"), whichever
    # comes first
    ok = live.returncode == 1 and train_bin in err and "truncated" in err and "while open" in err
    print("%-4s %-34s rc=%d  %s" % ("ok" if ok else "FAIL", "train: shard truncated mid-run",
                                    live.returncode, (err.strip().splitlines() or [""])[0]))
    if not ok:
        failures += 1
        print("     " + err[-1000:])
    open(train_bin, "wb").write(blob)
    open(train_bin, "wb").write(blob[: len(blob) - 7])
    run("train: truncated train.bin", ["train", good, "--run-dir", os.path.join(d, "run_x"),
                                       "--set", "data.path=" + tokdir, "--set", "model.vocab_size=300"],
        must_contain=[train_bin, "truncated", "expected %d bytes" % len(blob)])
    bad_model = os.path.join(d, "run_t", "tokenizer.model")
    open(bad_model, "wb").write(b"not a model")
    run("sample: broken tokenizer", ["sample", os.path.join(d, "run_t")], must_contain=[bad_model])
    run("data: missing --tokenizer", ["data", "prepare", "--input", prose_file, "--out",
                                      os.path.join(d, "tok2"), "--tokenizer",
                                      os.path.join(d, "nope.json")],
        must_contain=[os.path.join(d, "nope.json"), "no such file"])
    bad_json = cfg("tokenizer.json", '{"model": {"type": "WordPiece"}}')
    run("data: unsupported tokenizer.json", ["data", "prepare", "--input", prose_file, "--out",
                                             os.path.join(d, "tok3"), "--tokenizer", bad_json],
        must_contain=[bad_json, "pre_tokenizer"])

    # a Hugging Face model directory: its config.json decides [model]; what Loom cannot build is
    # named by its field
    hf = os.path.join(d, "hf")
    os.makedirs(hf)
    hf_config = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
                 "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "max_position_embeddings": 64,
                 "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    json.dump(hf_config, open(os.path.join(hf, "config.json"), "w"))
    init_cfg = cfg("init.toml", '[model]\ninit = "%s"\n[train]\nbatch_size = 2\nseq_len = 16\n'
                   '[optim]\nlr = 1e-3\n' % hf)
    run("init: unsupported config.json field", bench + [init_cfg],
        must_contain=[os.path.join(hf, "config.json"), "rope_scaling", "no rope scaling"])
    run("sample: unsupported config.json field", ["sample", hf],
        must_contain=[os.path.join(hf, "config.json"), "rope_scaling"])
    del hf_config["rope_scaling"]
    json.dump(hf_config, open(os.path.join(hf, "config.json"), "w"))
    run("init: a key that disagrees", bench + [init_cfg, "--set", "model.n_layers=3"],
        must_contain=["init.toml: [model] n_layers = 3 disagrees with", "config.json"])
    json.dump(dict(hf_config, vocab_size=300), open(os.path.join(hf, "config.json"), "w"))
    run("sample: a model without tokenizer.json", ["sample", hf],
        must_contain=[hf, "no tokenizer.json"])
    gguf = cfg("model.gguf", "GGUF")
    run("sample: a .gguf file", ["sample", gguf], must_contain=[gguf, "GGUF file", "gguf_file="])
    json.dump(hf_config, open(os.path.join(hf, "config.json"), "w"))
    # a pretrained model with its own tokenizer trains only on data that tokenizer made
    open(os.path.join(hf, "tokenizer.json"), "w").write('{"model": {"type": "BPE"}}')
    run("init: raw text for a tokenizer's model", ["train", init_cfg, "--run-dir",
                                                   os.path.join(d, "r_tok"), "--set",
                                                   "data.path=" + prose_file],
        must_contain=[prose_file, "read as byte ids", "loom data prepare", "--tokenizer " + hf])
    open(train_bin, "wb").write(blob)  # whole again: the data above, prepared with SentencePiece
    run("init: data of another tokenizer", ["train", init_cfg, "--run-dir", os.path.join(d, "r_tok2"),
                                            "--set", "data.path=" + tokdir],
        must_contain=[tokdir, "prepared with another tokenizer", "--tokenizer " + hf])
    os.remove(os.path.join(hf, "tokenizer.json"))
    run("init: directory without weights", ["train", init_cfg, "--run-dir", os.path.join(d, "r_hf"),
                                            "--set", "data.path=" + prose_file],
        must_contain=[hf, "neither model.safetensors nor model.safetensors.index.json"])

    # the outer sync service: bad [outer] settings and launcher flags fail before anything starts
    run("outer: bad mode", bench + [good, "--set", "outer.mode=fast"],
        must_contain=["[outer] mode", "\"sync\" or \"async\""])
    run("outer: bad momentum", bench + [good, "--set", "outer.momentum=1.5"],
        must_contain=["[outer] momentum", "[0, 1)"])
    run("outer: bad compress", bench + [good, "--set", "outer.compress=int2"],
        must_contain=["[outer] compress"])
    # integer flags: bounds as the config writes them, the value as given (CLI11's own check
    # printed its bound in 300 digits, and a number past int64 as "Could not convert")
    for flag, val in [("--steps", "0"), ("--steps", "99999999999999999999999"), ("--warmup", "-1")]:
        run("bench: %s %s" % (flag, val[:12]), ["bench", good, flag, val],
            must_contain=[flag + ": must be a whole number in [", "got " + val], rc=105)
    # loom config says what training would: a tactic's axis, a pipeline's micro-batches
    run("config: a tactic's axis not in the mesh",
        ["config", good, "--set", "plan.mesh={data=2}", "--set",
         'plan.tactics=[{kind="data",axis="nope"}]'],
        must_contain=["[plan] tactics: tactics[0] (data): axis 'nope' is not in the mesh"])
    run("config: microbatches past 2^20",
        ["config", good, "--set", "plan.mesh={pipe=2}", "--set",
         'plan.tactics=[{kind="pipeline",axis="pipe",microbatches=9223372036854775807}]'],
        must_contain=["microbatches = 9223372036854775807: at most 2^20"])
    run("outer: islands x steps past 2^53", bench + [good, "--set", "outer.mode=async", "--set",
                                                     "outer.islands=65536", "--set",
                                                     "train.steps=1099511627776"],
        must_contain=["[outer] islands", "2^53"])
    run("outer: islands out of range", bench + [good, "--set", "outer.islands=4611686018427387904"],
        must_contain=["[outer] islands", "[0, 2^16], got 4611686018427387904"])
    run("islands: bad --slow", ["islands", good, "--islands", "2", "--run-dir", os.path.join(d, "isl"),
                                "--slow", "5=3"], must_contain=["--slow 5=3", "0 <= I < 2"])
    run("islands: no data", ["islands", good, "--islands", "2", "--run-dir", os.path.join(d, "isl2")],
        must_contain=["[data] path is not set"])
    run("islands: --islands against outer.islands",
        ["islands", good, "--islands", "2", "--run-dir", os.path.join(d, "isl3"), "--set",
         "outer.islands=5", "--set", "data.path=" + text_file],
        must_contain=["--islands 2: [outer] islands = 5"])
    # an island that fails at once (its run dir's lock file is a symbolic link) ends the run at
    # once: the other island is stopped, not left waiting out the first round's 60 s start barrier
    # (the timeout is a hang check, a minute short of it)
    os.makedirs(os.path.join(d, "isl4", "island_1"))
    os.symlink("nowhere", os.path.join(d, "isl4", "island_1", ".lock"))
    run("islands: one fails, all stop", ["islands", good, "--islands", "2", "--run-dir",
                                         os.path.join(d, "isl4"), "--set", "data.path=" + text_file,
                                         "--set", "train.steps=6", "--set", "outer.inner_steps=3"],
        must_contain=["island 1 (exit 1)", "is a symbolic link", "1 of 2 islands failed"],
        timeout=50)
    if os.path.exists(os.path.join(d, "isl")):
        print("FAIL a refused loom islands left %s behind" % os.path.join(d, "isl"))
        failures += 1

    if os.path.exists(out):
        print("FAIL a failed step left %s behind" % out)
        failures += 1

print("cli errors: all cases behaved" if not failures else "cli errors: %d FAILED" % failures)
sys.exit(1 if failures else 0)
