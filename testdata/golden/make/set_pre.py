#!/usr/bin/env python3
"""Copy a vocab-only GGUF (no tensors) with `tokenizer.ggml.pre` set: set_pre.py IN OUT NAME."""
import struct
import sys

src, dst, name = sys.argv[1:4]
b = open(src, "rb").read()
assert b[:4] == b"GGUF"
version, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
assert n_tensors == 0, "only vocab-only files"
key = b"tokenizer.ggml.pre"
assert key not in b, "the file already names a pre-tokenizer"
val = name.encode()
kv = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", len(val)) + val
out = b[:4] + struct.pack("<IQQ", version, 0, n_kv + 1) + b[24:] + kv
open(dst, "wb").write(out)
