#!/usr/bin/env python3
"""Copy a vocab-only GGUF (no tensors) without one boolean key: drop_key.py IN OUT KEY."""
import struct
import sys

src, dst, name = sys.argv[1:4]
b = open(src, "rb").read()
assert b[:4] == b"GGUF"
version, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
assert n_tensors == 0, "only vocab-only files"
key = name.encode()
# A bool entry: u64 key length, the key, u32 type 7 (bool), one byte.
entry = struct.pack("<Q", len(key)) + key + struct.pack("<I", 7)
at = b.find(entry)
assert at > 0 and b.find(entry, at + 1) < 0, "the key must be a bool, present once"
out = b[:4] + struct.pack("<IQQ", version, 0, n_kv - 1) + b[24:at] + b[at + len(entry) + 1:]
open(dst, "wb").write(out)
