#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/): small valid inputs of each format,
so the fuzzers start from the readers' accepting paths instead of having to discover the formats.
Deterministic; the written files are committed. Run from anywhere: python3 fuzz/seeds.py
"""
import json
import os
import shutil
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def crc(b):
    return "%08x" % (zlib.crc32(b) & 0xFFFFFFFF)


# ---- config: the shipped configs that load on their own (no files they name must exist) ----
for name in ["tiny-llama.toml", "tiny-gpt2.toml", "tiny-moe.toml", "tiny-normformer.toml",
             "llama3.1-8b.toml", "gpt-22b.toml", "quickstart.toml"]:
    with open(os.path.join(ROOT, "configs", name), "rb") as f:
        put("config", name, f.read())
put("config", "outer.toml", """[model]
arch = "llama"
vocab_size = 256
d_model = 32
n_layers = 1
n_heads = 2
max_seq_len = 16
[train]
batch_size = 2
seq_len = 16
steps = 4
[outer]
server = "127.0.0.1:1"
mode = "async"
inner_steps = 2
lr = 0.7
lease_s = 5.5
[plan]
mesh = { data = 2, model = 1 }
tactics = [ { kind = "fsdp", axis = "data" }, { kind = "shard", pattern = "lm_head.weight", dim = 0, axis = "model" } ]
[passes]
bucket = "block"
recompute = "selective_op"
""")


# ---- safetensors: F32, BF16 and I32 tensors, with and without Loom's checksums ----
def safetensors(tensors, checksums):
    """tensors: [(name, dtype, shape, raw bytes)]"""
    header, data, meta = {}, b"", {}
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
        if checksums:
            meta["loom.crc32." + name] = crc(raw)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


f32 = struct.pack("<6f", 1.0, -2.5, 0.0, 3.25, 1e-3, -7.0)
i32 = struct.pack("<3i", 0, 7, -1)
bf16 = struct.pack("<4H", 0x3F80, 0xC020, 0x0000, 0x7F7F)
put("safetensors", "loom.safetensors",
    safetensors([("w", "F32", [2, 3], f32), ("idx", "I32", [3], i32), ("h", "BF16", [4], bf16)],
                True))
put("safetensors", "foreign.safetensors",
    safetensors([("a.weight", "F32", [6], f32), ("b", "BF16", [2, 2], bf16)], False))
put("safetensors", "scalar.safetensors", safetensors([("s", "F32", [], f32[:4])], True))


# ---- token shards: u16 and i32 ----
def shard(tokens, vocab):
    wide = vocab > 65535
    body = struct.pack("<%d%s" % (len(tokens), "i" if wide else "H"), *tokens)
    return b"LOOMTOK1" + struct.pack("<IIQII", 1, 2 if wide else 1, len(tokens), vocab, 0) + body


put("token_shard", "u16.tok", shard([7, 1, 300, 0, 511], 512))
put("token_shard", "i32.tok", shard([70000, 3, 99999], 100000))
put("token_shard", "empty.tok", shard([], 2))


# ---- checkpoint_state: state.json, NUL, config.toml (as save_checkpoint writes them) ----
def state(step, config, extra):
    st = dict(extra, format=1, step=step, config_crc32=crc(config.encode()))
    st["crc32"] = crc(json.dumps(st, sort_keys=True, separators=(",", ":")).encode())
    return json.dumps(st, indent=2, sort_keys=True) + "\n"


config = '[model]\narch = "llama"\n'
put("checkpoint_state", "state", state(5, config, {"tokens_seen": 640}) + "\0" + config)
put("checkpoint_state", "no_checksums", '{"format": 1, "step": 5}\n')


# ---- ir_text: the golden IR files (those without annotations) ----
src = os.path.join(ROOT, "tests", "ir_text")
for name in sorted(os.listdir(src)):
    if name.endswith(".ir") and os.path.getsize(os.path.join(src, name)) < 4096:
        with open(os.path.join(src, name), "rb") as f:
            put("ir_text", name, f.read())


# ---- outer_requests: protobuf encoded by hand (proto3 wire format) ----
def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 1:
        return key + struct.pack("<d", payload)
    return key + varint(len(payload)) + payload  # wire 2


def spec(name, shape):
    return field(1, 2, name.encode()) + field(2, 2, b"".join(varint(d) for d in shape))


def join(model, key=b"", fragments=0, paths=0, path=0):
    return (field(1, 2, b"island") + b"".join(field(2, 2, spec(n, s)) for n, s in model) +
            (field(3, 2, key) if key else b"") + (field(4, 0, fragments) if fragments else b"") +
            (field(5, 0, paths) if paths else b"") + (field(6, 0, path) if path else b""))


def chunk(name, offset, values, bf16=False):
    if bf16:
        data = b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:]
                        for v in values)
    else:
        data = struct.pack("<%df" % len(values), *values)
    return (field(1, 2, name.encode()) + (field(2, 0, offset) if offset else b"") +
            (field(3, 0, 1) if bf16 else b"") + field(4, 2, data))


def qchunk(name, offset, values, bits):
    """outer.proto's INT8 (bits 8) or INT4 (bits 4) chunk: f32 scales per 64, then the values."""
    top = 127 if bits == 8 else 7
    scales, q = b"", []
    for b in range(0, len(values), 64):
        block = values[b:b + 64]
        amax = max(abs(v) for v in block)
        scales += struct.pack("<f", amax / top)
        q += [max(-top, min(top, round(v * top / amax))) if amax else 0 for v in block]
    if bits == 8:
        data = bytes(v & 0xFF for v in q)
    else:
        q += [0] * (len(q) % 2)
        data = bytes((q[i] & 0xF) | ((q[i + 1] & 0xF) << 4) for i in range(0, len(q), 2))
    return (field(1, 2, name.encode()) + (field(2, 0, offset) if offset else b"") +
            field(3, 0, 2 if bits == 8 else 3) + field(4, 2, scales + data) +
            field(5, 0, len(values)))


def push(island, base, steps, chunks, fragment=0):
    header = field(1, 0, island) + (field(2, 0, base) if base else b"") + field(3, 0, steps) + \
        field(4, 1, 0.5) + (field(5, 0, fragment) if fragment else b"")
    msgs = [field(1, 2, header)] + [field(2, 2, c) for c in chunks]
    return b"".join(struct.pack("<H", len(m)) + m for m in msgs)


def call(kind, body):
    return bytes([kind]) + struct.pack("<H", len(body)) + body


model = [("a", [3]), ("b", [2, 2])]
grad = [chunk("a", 0, [0.1, -0.2, 0.3]), chunk("b", 0, [1.0, 0.0]), chunk("b", 2, [-1.0, 0.5])]
one_round = (call(0, join(model)) + call(1, field(1, 0, 1)) +
             call(2, push(1, 0, 4, grad)) + call(3, field(1, 0, 1)) + call(5, field(1, 0, 1)) +
             call(4, field(1, 0, 1)))
put("outer_requests", "sync_round", b"\x00" + one_round)
put("outer_requests", "async_bf16", b"\x01" + call(0, join(model)) + call(0, join(model)) +
    call(2, push(2, 0, 4, [chunk("a", 0, [0.5, 0.5, 0.5], True), chunk("b", 0, [1, 2, 3, 4], True)])) +
    call(2, push(1, 0, 8, grad)) + call(3, field(1, 0, 1) + field(2, 0, 1)))
put("outer_requests", "wrong_model", b"\x00" + call(0, join([("a", [4])])))
put("outer_requests", "async_int8_int4", b"\x01" + call(0, join(model)) + call(0, join(model)) +
    call(2, push(1, 0, 4, [qchunk("a", 0, [0.1, -0.2, 0.3], 8), qchunk("b", 0, [1, 2, 3, 4], 8)])) +
    call(2, push(2, 0, 4, [qchunk("a", 0, [0.5, -0.5, 0.25], 4), qchunk("b", 0, [1, -2, 3, 0], 4)])))
# an island restarted under its key mid-round: it gets its id back
put("outer_requests", "rejoin_key", b"\x00" + call(0, join(model, b"host:/runs/a")) +
    call(0, join(model, b"host:/runs/b")) + call(2, push(1, 0, 4, grad)) +
    call(0, join(model, b"host:/runs/b")) + call(2, push(2, 0, 4, grad)) + call(3, field(1, 0, 1)))

# streaming: two fragments; both islands push fragment 1 (its round closes), then one pushes
# fragment 0 int4; awaits and pulls name a fragment
layered = [("layers.0.a", [3]), ("layers.1.b", [2, 2])]
put("outer_requests", "fragments", b"\x30" + call(0, join(layered, fragments=2)) +
    call(0, join(layered, fragments=2)) + call(0, join(layered)) +
    call(2, push(1, 0, 4, [chunk("layers.1.b", 0, [1.0, 0.0, -1.0, 0.5])], 1)) +
    call(2, push(2, 0, 4, [qchunk("layers.1.b", 0, [1, -2, 3, 0], 4)], 1)) +
    call(3, field(1, 0, 1) + field(4, 0, 1)) +
    call(2, push(1, 0, 4, [qchunk("layers.0.a", 0, [0.1, -0.2, 0.3], 4)], 0)) +
    call(3, field(1, 0, 2) + field(4, 0, 0)) +
    call(5, field(1, 0, 1) + field(2, 0, 1) + field(4, 0, 1)) +  # the update from version 0
    call(5, field(1, 0, 1) + field(2, 0, 5)))

# DiPaCo, modules [1, 2]: islands on paths 0 and 1 (and one on a path that does not exist) push
# their paths (the model's names); awaits and pulls of a member's path
put("outer_requests", "dipaco", b"\x40" + call(0, join(layered, paths=2)) +
    call(0, join(layered, paths=2, path=1)) + call(0, join(layered, paths=2, path=2)) +
    call(0, join(layered)) +
    call(2, push(1, 0, 4, [chunk("layers.0.a", 0, [0.1, -0.2, 0.3]),
                           chunk("layers.1.b", 0, [1.0, 0.0, -1.0, 0.5])])) +
    call(2, push(2, 0, 4, [chunk("layers.0.a", 0, [0.5, 0.5, 0.5]),
                           chunk("layers.1.b", 0, [1, 2, 3, 4])])) +
    call(3, field(1, 0, 1)) + call(5, field(1, 0, 2)) + call(5, field(1, 0, 1)))

# ---- cluster: the shipped cluster files without a profile, and one with a small profile ----
for name in ["h100-sxm.toml", "two-hosts.toml", "mi300x.toml", "h200.toml"]:
    with open(os.path.join(ROOT, "clusters", name), "rb") as f:
        put("cluster", name, f.read())
with open(os.path.join(ROOT, "clusters", "two-hosts.toml")) as f:
    two_hosts = f.read().replace("size = 0\nbandwidth = 1.25e+08", "size = 4\nbandwidth = 1.25e+08")
    put("cluster", "profiled.toml", two_hosts + """
[[level]]
name = "wan"
size = 0
bandwidth = 1e7
latency = 1e-3
comm_beside_compute = 1.5
compute_beside_comm = 1.2
comm_thread_slowdown = 1.1
""" + """
[profile]
threads = 1
matmul = [[0, 0, 1, 64, 64, 64, "f32", 1e-5], [0, 1, 2, 8, 8, 8, "bf16", 2e-6]]
[profile.ops]
add = [["f32", 1e6, 0, 1e-4]]
[profile.comm]
all_reduce = [[2, 65536, 7e-5], [4, 1048576, 1e-3]]
""")

# ---- calibrate_import: bench/gpu/torch_kernels.py's JSON, a GEMM and a streaming kernel ----
put("calibrate_import", "timed.json", json.dumps({
    "device": "NVIDIA H100", "torch": "2.5.1",
    "kernels": [
        {"op": "matmul", "dtype": "bf16", "seconds": 1.5e-4,
         "gemm": {"ta": 0, "tb": 1, "m": 4096, "n": 4096, "k": 4096, "batch": 1}},
        {"op": "rmsnorm", "dtype": "bf16", "bytes": 33554432, "flops": 0, "seconds": 2e-5},
        {"op": "attention", "dtype": "bf16", "bytes": 1e6, "flops": 1e12, "seconds": 2e-3}]}))

# ---- router: DiPaCo's router.safetensors (centroids (paths, dim) and its metadata) ----
def router(centroids, dim, meta):
    raw = struct.pack("<%df" % len(centroids), *centroids)
    header = {"centroids": {"dtype": "F32", "shape": [len(centroids) // dim, dim],
                            "data_offsets": [0, len(raw)]},
              "__metadata__": {"loom_router": json.dumps(meta)}}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + raw


put("router", "two_paths.safetensors",
    router([0.5, 0.25, 0.25, 0.0, 0.0, 0.1, 0.2, 0.7], 4, {"format": 1, "prefix": 8, "k": 2}))
put("router", "one_path.safetensors", router([1.0, 0.0], 2, {"format": 1, "prefix": 1}))

# ---- tokenizer_json: a byte-level BPE tokenizer.json (256 byte pieces, merges, an added token) ----
def byte_chars():
    """GPT-2's byte -> character map: printable Latin-1 bytes are themselves, the rest U+0100 on."""
    table, nxt = [], 256
    for i in range(256):
        if 33 <= i <= 126 or 161 <= i <= 172 or i >= 174:
            table.append(chr(i))
        else:
            table.append(chr(nxt))
            nxt += 1
    return table


BYTE_CHAR = byte_chars()
vocab = {BYTE_CHAR[b]: b for b in range(256)}
sp = BYTE_CHAR[ord(" ")]
vocab.update({"th": 256, "the": 257, sp + "the": 258, "lo": 259})
put("tokenizer_json", "bpe.json", json.dumps({
    "version": "1.0",
    "added_tokens": [{"id": 260, "content": "<|endoftext|>", "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
              "merges": [["t", "h"], ["th", "e"], [sp, "the"], "l o"]}}, ensure_ascii=False))

# ---- hf_config: transformers' config.json for a Llama and a GPT-2 ----
put("hf_config", "llama.json", json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
    "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "float32"}))
put("hf_config", "gpt2.json", json.dumps({
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 256, "n_embd": 64,
    "n_layer": 2, "n_head": 4, "n_positions": 128, "layer_norm_epsilon": 1e-5,
    "torch_dtype": "float32"}))

# ---- hf_index: model.safetensors.index.json over the shard the target writes beside it ----
put("hf_index", "index.json", json.dumps({
    "metadata": {"total_size": 16},
    "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "b": "model-00001-of-00002.safetensors"}}))
put("hf_index", "missing_shard.json", json.dumps({
    "metadata": {"total_size": 16},
    "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}}))

# ---- sharded_index: a sharded checkpoint's index.json over the two rank files the target writes ----
def sharded_tensor(shape, sharding, ranks):
    return {"dtype": "f32", "shape": shape, "grid": shape, "sharding": sharding, "ranks": ranks}


put("sharded_index", "index.json", json.dumps({
    "format": "loom.sharded-checkpoint.1", "mesh": [["data", 2]],
    "model": {"w": sharded_tensor([4], "{data}", [0, 1]), "b": sharded_tensor([2], "{_}", [0])},
    "optimizer": {"adam.m.w": sharded_tensor([4], "{data}", [0, 1])}}, indent=1))
put("sharded_index", "reshaped.json", json.dumps({
    "format": "loom.sharded-checkpoint.1", "mesh": [["data", 2]],
    "model": {"w": dict(sharded_tensor([2, 2], "{data}", [0, 1]), grid=[4]),
              "b": sharded_tensor([2], "{_}", [0])},
    "optimizer": {"adam.m.w": sharded_tensor([4], "{data}", [0, 1])}}))
put("sharded_index", "missing_rank.json", json.dumps({
    "format": "loom.sharded-checkpoint.1", "mesh": [["data", 4]],
    "model": {"w": sharded_tensor([8], "{data}", [0, 1, 2, 3])}, "optimizer": {}}))

# ---- metrics: lines as loom train writes them, MoE fields, a torn last line ----
lines = []
for step in range(1, 9):
    m = {"step": step, "loss": 5.5 - 0.3 * step, "lr": 1e-3 * min(1, step / 4),
         "grad_norm": 1.5 / step, "tokens_per_s": 1000.0 + step}
    if step % 4 == 0:
        m["val_loss"] = 5.6 - 0.3 * step
    lines.append(json.dumps(m))
put("metrics", "run.jsonl", "\n".join(lines) + "\n")
put("metrics", "moe.jsonl", "\n".join(json.dumps(
    {"step": s, "loss": 4.0, "ce_loss": 3.9, "moe_tokens_max": 40 + s, "moe_tokens_mean": 32,
     "moe_dropped": s % 3, "tokens_per_s": None}) for s in range(1, 5)) + "\n{\"step\": 5, \"lo")
put("metrics", "extremes.jsonl", '{"step": 1, "loss": 1e308}\n{"step": 2, "loss": -1e308}\n'
    '{"step": 3, "loss": 5e-324, "lr": 0}\nnot json\n{"step": "x", "loss": 1}\n')
