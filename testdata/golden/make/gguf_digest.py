#!/usr/bin/env python3
"""A GGUF file's digest, to compare converters without keeping the file:
  gguf_digest.py FILE OUT.json [KEY=WHY[=PREFIX] ...]

Every metadata key with its GGUF type and value (an array: element type, length and the SHA-256
of its elements as the file stores them, a string as u64 length then bytes); every tensor with
its type id, shape and the SHA-256 of its data (I2_S: the packed codes and the f32 scale, not
the 28 bytes after the scale, which llama-quantize leaves uninitialized). KEY=WHY pairs name
keys whose value is known to differ from bitnet-rs's and why; they are written under
"known_differences" with the value as written, and left out of "kv". With PREFIX (a string
array), "sha256_prefix_removed" is the hash of the same strings with one leading PREFIX taken
off each that starts with it.
"""
import hashlib
import json
import struct
import sys

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}


class Reader:
    def __init__(self, b):
        self.b, self.pos = b, 0

    def rd(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0]

    def raw_str(self):
        n = self.rd("<Q")
        s = self.b[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, t, prefix=None):
        if t == 8:
            return {"str": self.raw_str().decode("utf-8")}
        if t == 9:
            et, n = self.rd("<I"), self.rd("<Q")
            h, hp = hashlib.sha256(), hashlib.sha256()
            for _ in range(n):
                if et == 8:
                    s = self.raw_str()
                    h.update(struct.pack("<Q", len(s)) + s)
                    if prefix is not None:
                        p = s[len(prefix):] if s.startswith(prefix) else s
                        hp.update(struct.pack("<Q", len(p)) + p)
                else:
                    sz = struct.calcsize(SCALAR[et])
                    h.update(self.b[self.pos:self.pos + sz])
                    self.pos += sz
            v = {"array": et, "n": n, "sha256": h.hexdigest()}
            if prefix is not None:
                v["sha256_prefix_removed"] = hp.hexdigest()
            return v
        v = self.rd(SCALAR[t])
        return {"bool": v} if t == 7 else {"num": v}


def main():
    src, dst = sys.argv[1], sys.argv[2]
    known = {}
    for a in sys.argv[3:]:
        key, why, *prefix = a.split("=", 2)
        known[key] = (why, prefix[0].encode() if prefix else None)
    b = open(src, "rb").read()
    r = Reader(b)
    assert r.rd("<I") == 0x46554747, "not a GGUF file"
    version, n_tensors, n_kv = r.rd("<I"), r.rd("<Q"), r.rd("<Q")
    kv, diffs = {}, {}
    for _ in range(n_kv):
        k = r.raw_str().decode()
        t = r.rd("<I")
        why, prefix = known.get(k, (None, None))
        v = dict(r.value(t, prefix), type=t)
        if why is not None:
            diffs[k] = {"as_written": v, "why": why}
        else:
            kv[k] = v
    align = kv.get("general.alignment", {}).get("num", 32)
    infos = []
    for _ in range(n_tensors):
        name = r.raw_str().decode()
        nd = r.rd("<I")
        ne = [r.rd("<Q") for _ in range(nd)]
        ty, off = r.rd("<I"), r.rd("<Q")
        infos.append((name, ne, ty, off))
    start = (r.pos + align - 1) // align * align
    tensors = {}
    for name, ne, ty, off in infos:
        n = 1
        for d in ne:
            n *= d
        size = {0: 4 * n, 1: 2 * n, 36: n // 4 + 4}[ty]
        data = b[start + off:start + off + size]
        tensors[name] = {"type": ty, "ne": ne, "sha256": hashlib.sha256(data).hexdigest()}
    out = {"version": version, "kv": dict(sorted(kv.items())),
           "tensors": dict(sorted(tensors.items())), "known_differences": diffs}
    with open(dst, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


main()
