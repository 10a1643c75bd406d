"""safetensors for the CLI tests, standard library only (the layout: an 8-byte little-endian header
length, the JSON header padded to 8 bytes, then the tensors back to back)."""
import json
import struct


def read_safetensors(path):
    """path -> dict name -> (dtype, shape, raw bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    return {k: (e["dtype"], e["shape"], body[e["data_offsets"][0]:e["data_offsets"][1]])
            for k, e in header.items() if k != "__metadata__"}


def floats(raw):
    """The f32 values of a tensor's raw bytes."""
    return struct.unpack("<%df" % (len(raw) // 4), raw)


def write_tokens(path, rows):
    """rows: list of equal-length int lists -> "tokens" I32 [B, T+1]."""
    blob = b"".join(struct.pack("<%di" % len(r), *r) for r in rows)
    header = {"tokens": {"dtype": "I32", "shape": [len(rows), len(rows[0])],
                         "data_offsets": [0, len(blob)]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)
