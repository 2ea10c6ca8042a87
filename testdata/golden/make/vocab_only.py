#!/usr/bin/env python3
"""Copy a GGUF's metadata without its tensors (a vocab-only file, as llama.cpp loads one for
tokenizing), optionally with u32 keys set to new values and the architecture renamed
(`general.architecture` and the prefix of its keys, for an architecture upstream lacks):
    vocab_only.py IN OUT [KEY=U32 ...] [--arch NAME]
The other key/value entries are copied byte for byte; the tensor count, the tensor infos and
the data are dropped."""
import struct
import sys

src, dst = sys.argv[1:3]
args = sys.argv[3:]
arch = None
if "--arch" in args:
    i = args.index("--arch")
    arch = args[i + 1].encode()
    del args[i:i + 2]
sets = {k.encode(): int(v) for k, v in (a.split("=", 1) for a in args)}
b = bytearray(open(src, "rb").read())
assert b[:4] == b"GGUF"
version, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_value(t, at):
    if t in SIZES:
        return at + SIZES[t]
    if t == 8:  # string
        (n,) = struct.unpack_from("<Q", b, at)
        return at + 8 + n
    if t == 9:  # array
        et, n = struct.unpack_from("<IQ", b, at)
        at += 12
        for _ in range(n):
            at = skip_value(et, at)
        return at
    raise SystemExit(f"unknown GGUF value type {t}")


def string(s):
    return struct.pack("<Q", len(s)) + s


at = 24
old_arch = None
entries = []
for _ in range(n_kv):
    start = at
    (n,) = struct.unpack_from("<Q", b, at)
    key = bytes(b[at + 8:at + 8 + n])
    at += 8 + n
    (t,) = struct.unpack_from("<I", b, at)
    at += 4
    if key in sets:
        assert t == 4, f"{key!r} is not a u32"
        struct.pack_into("<I", b, at, sets.pop(key))
    end = skip_value(t, at)
    if key == b"general.architecture":
        old_arch = bytes(b[at + 8:end])
        if arch is not None:
            entries.append(string(key) + struct.pack("<I", 8) + string(arch))
            at = end
            continue
    if arch is not None and old_arch and key.startswith(old_arch + b"."):
        entries.append(string(arch + key[len(old_arch):]) + bytes(b[start + 8 + n:end]))
    else:
        entries.append(bytes(b[start:end]))
    at = end
assert not sets, f"keys not found: {list(sets)}"
out = b[:4] + struct.pack("<IQQ", version, 0, n_kv) + b"".join(entries)
open(dst, "wb").write(out)
