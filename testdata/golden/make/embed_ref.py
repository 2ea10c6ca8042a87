#!/usr/bin/env python3
"""Independent numpy reference ("oracle") for bitnet.cpp's ternary EMBEDDING models
(BitNet-Embeddings 0.6B on a Qwen3 backbone, 270M on a Gemma3 backbone).

Standalone: Python 3 + numpy, its own GGUF reader, nothing imported from the repository.

Sources (microsoft/BitNet, read from the mirror with `git show HEAD:PATH`):
  * docs/bitnet-embeddings-i2s-guide.md        the model: BitLinear = RMSNorm(x, norm_in) ->
                                                 int8 absmax activation quant -> ternary matmul;
                                                 last-token pooling + L2 normalisation;
                                                 Gemma3: sqrt(n_embd) embedding scale, post norms
  * utils/convert-bitnet-embedding-to-gguf.py  tensor names; +1 added to Gemma3's own norms
                                                 (not to *_norm_in); I2_S = n/4 packed bytes, then
                                                 ONE f32 scale (= mean|w| of the float tensor),
                                                 then 28 zero bytes (n/4 + 32 in all); metadata
  * the semantics of the (unavailable) C++ fork as the llama.cpp qwen3 / gemma3 graphs with a
    BitLinear in place of each projection, and the int8 activation quantisation of bitnet.cpp's
    I2_S matmul as established for the generative model (shared docs FORMATS.md section 1):
      m = max(1e-5, max|x|) (f64), s = f32(127/m), q = clamp(rint(f32(x*s)), -128, 127),
      T = sum((code-1)*q) exactly, y = f32(f32(T)/s) * beta.
  * ggml (bitnet.cpp's 3rdparty/llama.cpp/ggml/src/ggml.c and upstream ggml-cpu/vec.h) for
    rms_norm, soft_max, GELU (GGML_GELU_FP16 table) and SiLU.

Forward pass (positions 0..n-1, one batch, ids given; the oracle does not tokenize and adds no
BOS/EOS -- llama-embedding would add EOS for the qwen3 file (add_eos_token) and BOS for gemma3):
  x = token_embd[ids] (F16/F32 -> f32); gemma3: x = f32(x * sqrtf(n_embd))
  per layer:
    h = rms(x) * attn_norm
    q, k, v = BL_q(h), BL_k(h), BL_v(h)       BL_P(z) = P(rms(z) * P_norm_in)  (BitLinear)
    q = rms_per_head(q) * attn_q_norm; k likewise; NEOX RoPE (n_rot dims) at positions 0..n-1
    gemma3: q = f32(q * (1/sqrtf(head_dim))), softmax scale 1;  qwen3: softmax scale 1/sqrtf(head_dim)
    K, V rounded to f16 (the KV cache); causal softmax attention, GQA kv = h // (n_head/n_head_kv)
    o = BL_o(concat heads); gemma3: o = rms(o) * post_attention_norm;  x = x + o
    h = rms(x) * ffn_norm
    f = BL_down( act(BL_gate(h)) * BL_up(h) ), act = SiLU (qwen3) / GELU (gemma3)
    gemma3: f = rms(f) * post_ffw_norm;  x = x + f
  x = rms(x) * output_norm
  pool (file's pooling_type: 0 none, 1 mean, 2 cls = row 0, 3 last = row n-1), then L2 normalise
  as llama.cpp's common_embd_normalize(.., 2): f32 squares summed in f64, norm = f32(1/sqrt(sum)),
  out = f32(v * norm).
rms(z) = ggml_rms_norm: f32 squares summed sequentially in f64, mean = f32(sum/n),
scale = 1/sqrtf(mean + eps), f32(z*scale) then * weight (F16 weights are widened to f32).

Choices where the guide is silent (each with a switch where it matters):
  * Sliding window: only if the file has gemma3.attention.sliding_window (the converter never
    writes it): layers il with (il+1) % 6 != 0 see keys j with i - j < window (llama.cpp
    LLAMA_SWA_TYPE_STANDARD) and use RoPE base gemma3.rope.freq_base_swa if present, else 10000;
    other layers full causal with rope.freq_base. Without the key every layer is full causal
    with rope.freq_base. --swa N sets / overrides the window (0 = off).
  * GELU: ggml's GGML_GELU_FP16 path: x <= -10 -> 0, x >= 10 -> x, else x -> f16 (RNE) and the
    table value f16(gelu_f32(f16 value)), gelu_f32 = 0.5x(1+tanh(sqrt(2/pi) x (1+0.044715 x^2)))
    in f32 with tanh correctly rounded to f32. Checked against glibc tanhf: all 37376 table
    entries with |x| < 10 agree; contracting 1 + A*x*x to an FMA would change 1 entry (not
    emulated). --gelu exact: gelu_f32(x) directly, no table.
  * SiLU: default "ggml" = ggml_v_silu on AVX2+FMA: x / (1 + ggml_v_expf(-x)), the expf
    polynomial emulated lane-wise (n_ff is a multiple of 8, so no scalar tail); the silu result
    times up in f32 (swiglu). --silu plain: f32(x / (1 + expf(-x))) with expf correctly rounded.
    (An AVX512 build uses a different expf kernel; the two differ by ulps.)
  * Order of the Gemma Q scaling: after RoPE on Q, as llama.cpp's gemma3 graph (ggml_scale with
    1/sqrtf(head_dim); the converter does not write query_pre_attn_scalar, and
    query_pre_attn_scalar == head_dim for both released models).
  * K and V are rounded to f16 (llama.cpp's default f16 KV cache); --kv f32 keeps them f32.
    Q stays f32 by default; --q16 rounds Q to f16 before Q.K as bitnet.cpp's non-flash-attention
    path does for the generative model (a permuted Q is converted to the f16 vec_dot type).
    Softmax probabilities stay f32.
  * Dot products (Q.K, P.V, float weights, the ternary path without activation quant) are
    accumulated in f64 and rounded to f32 once: this is a reference, not a kernel emulation.
  * F16/F32 projection weights (converter --outtype f16/f32): a plain float matmul, no
    activation quantisation. --ternarize-float applies BitLinear's weight quant at load instead
    (codes = clip(rint(w * f32(1/mean|w|)), -1, 1), beta = mean|w|, exactly as the converter's
    quantize_to_i2_s, including numpy 1.x's f32 summation order for the mean -- see np1_sum_f32)
    and then runs the I2_S path; on a converter f32 file this must reproduce the i2_s file of the
    same checkpoint bit for bit when its F16 tensors are lossless.
  * --no-act-quant: ternary weights with a plain float matmul (to show what int8 activation
    quantisation does to the vectors).
  * Pooling none (--pooling none, or pooling_type 0): every row, each L2-normalised.

--variant exact (default --variant f32 = everything above): bitnet.cpp's float paths as the
generative oracle shared/tools/bitnet_ref.py --variant exact established them bit for bit
(x86 AVX2 + FMA + F16C, LLAMAFILE, 1 thread; code copied from it and adapted, see the section
"exact variant" below), applied to the embedding graphs:
  * the same as f32 (already bitnet.cpp's arithmetic): rms_norm (every norm: attn/ffn/output,
    each projection's *_norm_in, the per-head Q/K norms over rows of head_dim, Gemma's post-norms)
    then times the weight; int8 activation quant + exact ternary matmul; Gemma's embedding scale
    f32(x * sqrtf(n_embd)) and Q scale f32(q * (1/sqrtf(head_dim))) after RoPE; GELU through the
    f16 table; f32 residual adds; K and V rounded to f16 (the cache); pooling, L2 normalisation.
  * RoPE: ggml_rope_cache_init with glibc powf/cosf/sinf (ctypes) of the iterated f32 angle, the
    rotation FMA-contracted: fma(x0, c, -(x1*s)), fma(x0, s, x1*c), on the first n_rot dims
    (dim i pairs with i + n_rot/2), the rest passed through.
  * attention (n_kv = pos0 + n padded to a multiple of 32; padded keys/values are zero and masked
    with -inf): K.Q = ggml_vec_dot_f16 with Q rounded to f16 (the permuted Q is not contiguous and
    is converted to the f16 vec_dot type; past the last whole chunk of 32 the products are added in
    f64) -- except with ONE query head and >= 2 rows, where the permuted Q is contiguous and
    llamafile's tinyBLAS (F16 K x F32 Q) takes it with Q in f32 (when head_dim % 8 == 0);
    soft_max_ext: w = kq * kq_scale + mask (kq_scale = 1/sqrtf(head_dim) for qwen3, 1.0 for gemma3),
    ggml_v_expf(w - max), sums of 8-lane groups added in f64, p = e * f32(1/sum); P.V = tinyBLAS
    (F16 V x F32 P) for >= 2 rows, P rounded to f16 and ggml_vec_dot_f16 for one row.
  * SiLU: ggml_vec_silu_f32: whole groups of 8 from the row start x / (1 + ggml_v_expf(0 - x)),
    the ragged tail x / (1 + expf(-x)) with glibc's expf; times up in f32.
  It requires ternary projections with activation quant (I2_S, or --ternarize-float) and refuses
  --no-act-quant, --kv f32, --q16, --gelu exact and --silu plain (exact fixes those choices).

What the converter writes (and does not): {arch}.embedding_length, block_count,
feed_forward_length, attention.head_count(_kv), attention.key_length = value_length =
rope.dimension_count = head_dim, rope.freq_base, attention.layer_norm_rms_epsilon, pooling_type,
vocab_size, context_length, general.file_type (40 = i2_s); NOT query_pre_attn_scalar,
sliding_window, rope.freq_base_swa, an embedding-scale key, attention.causal or general.alignment.
In an i2_s file every non-projection tensor (token_embd and all norms) is F16; in an f32 file
everything is F32.

decode-check: every I2_S tensor's codes == clip(round(w/beta)) of the f32 file's tensor and ==
the converter's ternarisation, beta == the converter's f32 mean|w| bit for bit (and its distance
from the exact mean in ulps), no code 3, the 28 tail bytes reported; every F16 tensor == f16(f32
tensor); every F32 tensor bit-identical; same tensor set and shapes.

Usage:
  embed_ref.py embed MODEL.gguf --ids 1,2,3 [--out FILE.f32] [options]
  embed_ref.py batch MODEL.gguf PROMPTS.json OUTDIR [options]    PROMPTS: [{"name":..,"ids":[..]}]
  embed_ref.py decode-check MODEL_I2S.gguf MODEL_F32.gguf
  embed_ref.py compare DIR_A DIR_B         cosine / max|d| of every NAME.embd.f32 present in both
  embed_ref.py info MODEL.gguf             metadata and tensor table
options: --variant {f32,exact} --no-act-quant --gelu {table,exact} --silu {ggml,plain}
         --kv {f16,f32} --q16 --swa N --pooling {file,none,mean,cls,last} --ternarize-float
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

F16, F32, F64 = np.float16, np.float32, np.float64

try:        # glibc's cosf/sinf/powf/expf, the library bitnet.cpp calls (--variant exact)
    import ctypes
    import ctypes.util
    _libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for _fn in ("cosf", "sinf", "expf"):
        getattr(_libm, _fn).restype = ctypes.c_float
        getattr(_libm, _fn).argtypes = [ctypes.c_float]
    _libm.powf.restype = ctypes.c_float
    _libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
except (OSError, AttributeError):  # pragma: no cover
    _libm = None

# ----------------------------------------------------------------------------------------------
# GGUF reader (v2/v3, little-endian)
# ----------------------------------------------------------------------------------------------
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}
GGML_F32, GGML_F16, GGML_I2_S = 0, 1, 36
TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_I2_S: "I2_S"}


class GGUF:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        assert self.buf[:4] == b"GGUF", f"{path}: not a GGUF file"
        self.pos = 4
        self.version = self._rd("<I")
        n_tensors = self._rd("<Q")
        n_kv = self._rd("<Q")
        self.kv, self.kv_type = {}, {}
        for _ in range(n_kv):
            k = self._str()
            t = self._rd("<I")
            self.kv_type[k] = t
            self.kv[k] = self._val(t)
        align = int(self.kv.get("general.alignment", 32))
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._str()
            nd = self._rd("<I")
            ne = [self._rd("<Q") for _ in range(nd)]
            ty = self._rd("<I")
            off = self._rd("<Q")
            self.tensors[name] = {"ne": ne, "type": ty, "offset": off}
        self.data_start = (self.pos + align - 1) // align * align
        by_off = sorted(self.tensors, key=lambda n: self.tensors[n]["offset"])
        for i, n in enumerate(by_off):
            t = self.tensors[n]
            end = (self.tensors[by_off[i + 1]]["offset"] if i + 1 < len(by_off)
                   else len(self.buf) - self.data_start)
            t["n"] = int(np.prod(t["ne"], dtype=np.int64))
            t["nbytes"] = self._nbytes(t["type"], t["n"], n)
            t["available"] = end - t["offset"]
            assert t["nbytes"] <= t["available"] < t["nbytes"] + align, (n, t)

    @staticmethod
    def _nbytes(ty, n, name):
        if ty == GGML_F32:
            return 4 * n
        if ty == GGML_F16:
            return 2 * n
        if ty == GGML_I2_S:
            assert n % 128 == 0, f"{name}: I2_S with {n} elements (not a multiple of 128)"
            return n // 4 + 32
        raise ValueError(f"{name}: unsupported ggml type {ty}")

    def _rd(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def _str(self):
        n = self._rd("<Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _val(self, t):
        if t == 8:
            return self._str()
        if t == 9:
            et = self._rd("<I")
            n = self._rd("<Q")
            if et in _SCALAR and et != 7:
                dt = np.dtype(_SCALAR[et])
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos += n * dt.itemsize
                return arr
            return [self._val(et) for _ in range(n)]
        return self._rd(_SCALAR[t])

    def raw(self, name):
        t = self.tensors[name]
        a = self.data_start + t["offset"]
        return np.frombuffer(self.buf, dtype=np.uint8, count=t["nbytes"], offset=a)

    def floats(self, name):
        """F32 or F16 tensor -> flat f32 array."""
        t = self.tensors[name]
        if t["type"] == GGML_F32:
            return np.frombuffer(self.raw(name).tobytes(), dtype="<f4").astype(F32)
        if t["type"] == GGML_F16:
            return np.frombuffer(self.raw(name).tobytes(), dtype="<f2").astype(F32)
        raise ValueError(f"{name}: type {t['type']} is not F32/F16")


# ----------------------------------------------------------------------------------------------
# I2_S: 128-element blocks of 32 bytes; byte 32b+p holds elements p, p+32, p+64, p+96 in bits
# 7-6, 5-4, 3-2, 1-0; code 0/1/2 -> -1/0/+1 (3 never written: decoded as 0 and counted);
# one f32 scale at byte n/4.
# ----------------------------------------------------------------------------------------------
def i2s_decode(raw, n):
    """-> (codes uint8[n] in 0..3 in row-major element order, beta f32, tail bytes after beta)."""
    packed = np.asarray(raw[: n // 4], dtype=np.uint8).reshape(-1, 32)
    beta = np.frombuffer(bytes(raw[n // 4: n // 4 + 4]), dtype="<f4")[0]
    groups = [(packed >> 6) & 3, (packed >> 4) & 3, (packed >> 2) & 3, packed & 3]
    codes = np.stack(groups, axis=1).reshape(-1)          # [blocks, 4, 32] -> 128b + 32g + p
    return codes.astype(np.uint8), F32(beta), np.asarray(raw[n // 4 + 4:])


def i2s_code_scalar(raw, j):
    """The format's scalar formula, to spot-check the vectorised decode."""
    return (int(raw[32 * (j // 128) + (j % 128) % 32]) >> (6 - 2 * ((j % 128) // 32))) & 3


def i2s_encode(codes):
    c = np.asarray(codes, dtype=np.uint8).reshape(-1, 4, 32)
    return (c[:, 0] << 6 | c[:, 1] << 4 | c[:, 2] << 2 | c[:, 3]).astype(np.uint8).reshape(-1)


_TERNARY_LUT = np.array([-1, 0, 1, 0], dtype=np.int8)


def self_test_layout():
    c = np.arange(128) % 3          # worked example: bytes 0..3 = 24 49 92 24
    enc = i2s_encode(c)
    assert list(enc[:4]) == [0x24, 0x49, 0x92, 0x24]
    dec, _, _ = i2s_decode(np.concatenate([enc, np.zeros(32, np.uint8)]), 128)
    assert np.array_equal(dec, c)


def _pairwise_leaf_sums(X):
    """numpy's pairwise_sum on leaves of <= 128 elements (rows of X): 8 f32 accumulators, combined
    ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the n % 8 tail added in order."""
    m, n = X.shape
    if n < 8:
        res = np.zeros(m, F32)
        for i in range(n):
            res = (res + X[:, i]).astype(F32)
        return res
    r = X[:, :8].astype(F32)
    i = 8
    while i < n - (n % 8):
        r = (r + X[:, i:i + 8]).astype(F32)
        i += 8
    p = [(r[:, 2 * j] + r[:, 2 * j + 1]).astype(F32) for j in range(4)]
    res = (((p[0] + p[1]).astype(F32)) + ((p[2] + p[3]).astype(F32))).astype(F32)
    for k in range(i, n):
        res = (res + X[:, k]).astype(F32)
    return res


def np1_sum_f32(a):
    """np.add.reduce of a contiguous 1-D f32 array as numpy 1.x computes it (the converter's venv has
    numpy 1.26): start 0, the array in chunks of 8192 (the iterator's buffer size), each chunk summed
    pairwise (halves rounded down to a multiple of 8, leaves of <= 128 elements) and added to the
    running f32 total.  numpy 2.x does not chunk, and its f32 mean can differ in the last bit."""
    a = np.asarray(a, F32).reshape(-1)
    leaves = []

    def plan(lo, n):
        if n <= 128:
            leaves.append((lo, n))
            return ("leaf", len(leaves) - 1)
        n2 = n // 2
        n2 -= n2 % 8
        return ("node", plan(lo, n2), plan(lo + n2, n - n2))

    trees = [plan(s, min(8192, len(a) - s)) for s in range(0, len(a), 8192)]
    sums = np.zeros(len(leaves), F32)
    by_len = {}
    for k, (lo, n) in enumerate(leaves):
        by_len.setdefault(n, []).append(k)
    for n, ks in by_len.items():
        X = np.stack([a[leaves[k][0]: leaves[k][0] + n] for k in ks])
        sums[ks] = _pairwise_leaf_sums(X)

    def value(t):
        if t[0] == "leaf":
            return sums[t[1]]
        return F32(value(t[1]) + value(t[2]))

    total = F32(0)
    for t in trees:
        total = F32(total + value(t))
    return total


def ternarize(w):
    """The converter's quantize_to_i2_s (BitLinear weight_quant_minmax), without the packing:
    abs_mean = np.mean(|w|) in f32 as numpy 1.x computes it (f32(f32 pairwise sum / n)), clamped to
    >= 1e-5; codes = clip(rint(w * f32(1/abs_mean)), -1, 1)."""
    w = np.asarray(w, dtype=F32).reshape(-1)
    abs_mean = F32(float(np1_sum_f32(np.abs(w))) / w.size)
    abs_mean = max(abs_mean, F32(1e-5))
    # numpy 1.x (the converter's venv): 1.0 / f32 scalar is an f64 scalar, and array(f32) * f64 scalar
    # is computed in f32.  (Under numpy 2 the product would be f64; the codes differ only at ties.)
    inv = F32(1.0 / float(abs_mean))
    q = np.clip(np.round((w * inv).astype(F32)), -1, 1).astype(np.int8)
    return q, F32(abs_mean)


# ----------------------------------------------------------------------------------------------
# numerics
# ----------------------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    """ggml_rms_norm followed by ggml_mul(weight). x: [..., n] f32, normalised over the last axis."""
    x = np.asarray(x, dtype=F32)
    sq = (x * x).astype(F32)
    ssum = np.cumsum(sq.astype(F64), axis=-1)[..., -1]        # sequential f64 sum
    mean = (ssum / x.shape[-1]).astype(F32)                    # (float)(sum/n)
    scale = (F32(1.0) / np.sqrt((mean + F32(eps)).astype(F32))).astype(F32)
    y = (x * scale[..., None]).astype(F32)
    return (y * np.asarray(w, dtype=F32)).astype(F32)


def act_quant(x):
    """bitnet.cpp's per-row int8 activation quantisation. x: [T, K] f32 -> (q f64 ints, s f32[T])."""
    m = np.maximum(1e-5, np.max(np.abs(x), axis=1).astype(F64))
    s = (127.0 / m).astype(F32)
    q = np.clip(np.rint((x * s[:, None]).astype(F32)), -128, 127)
    return q.astype(F64), s


def fma32(a, b, c):
    return (np.asarray(a, F32).astype(F64) * np.asarray(b, F32).astype(F64)
            + np.asarray(c, F32).astype(F64)).astype(F32)


def v_expf(x):
    """ggml_v_expf (AVX2 + FMA), lane-wise."""
    x = np.asarray(x, F32)
    h = float.fromhex
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        r = F32(h("0x1.8p23"))
        z = fma32(x, F32(h("0x1.715476p+0")), r)
        n = (z - r).astype(F32)
        b = fma32(-n, F32(h("0x1.7f7d1cp-20")), fma32(-n, F32(h("0x1.62e4p-1")), x))
        e = (z.view(np.uint32) << np.uint32(23)).astype(np.uint32)
        k = (e + np.uint32(0x3F800000)).astype(np.uint32).view(F32)
        c = np.abs(n) > F32(126)
        u = (b * b).astype(F32)
        j = fma32(fma32(fma32(F32(h("0x1.0e4020p-7")), b, F32(h("0x1.573e2ep-5"))), u,
                        fma32(F32(h("0x1.555e66p-3")), b, F32(h("0x1.fffdb6p-2")))),
                  u, (F32(h("0x1.ffffecp-1")) * b).astype(F32))
        fast = fma32(j, k, k)
        if not np.any(c):
            return fast
        g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
        s1 = (g + np.uint32(0x7F000000)).astype(np.uint32).view(F32)
        s2 = (e - g).astype(np.uint32).view(F32)
        d = np.abs(n) > F32(192)
        slow = np.where(d, (s1 * s1).astype(F32), (fma32(s2, j, s2) * s1).astype(F32))
        return np.where(c, slow, fast).astype(F32)


def silu(x, mode):
    x = np.asarray(x, F32)
    if mode == "ggml":     # ggml_v_silu: x / (1 + ggml_v_expf(0 - x))
        return (x / (F32(1) + v_expf((F32(0) - x).astype(F32))).astype(F32)).astype(F32)
    e = np.exp(-x.astype(F64)).astype(F32)                      # expf, correctly rounded
    return (x / (F32(1) + e).astype(F32)).astype(F32)


_GELU_COEF_A = F32(0.044715)
_SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)


def gelu_f32(x):
    """ggml_gelu_f32: 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x))), f32 ops."""
    x = np.asarray(x, F32)
    inner = (F32(1) + ((_GELU_COEF_A * x).astype(F32) * x).astype(F32)).astype(F32)
    arg = ((_SQRT_2_OVER_PI * x).astype(F32) * inner).astype(F32)
    t = np.tanh(arg.astype(F64)).astype(F32)                    # tanhf, correctly rounded
    return ((F32(0.5) * x).astype(F32) * (F32(1) + t).astype(F32)).astype(F32)


_GELU_TABLE = None


def gelu_table():
    """ggml_table_gelu_f16[i] = f16(gelu_f32(f16 bits i as f32))."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        with np.errstate(invalid="ignore", over="ignore"):
            f = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(F16).astype(F32)
            _GELU_TABLE = gelu_f32(f).astype(F16)
    return _GELU_TABLE


def gelu(x, mode):
    x = np.asarray(x, F32)
    if mode == "exact":
        return gelu_f32(x)
    idx = x.astype(F16).view(np.uint16)                          # GGML_FP32_TO_FP16 (RNE)
    y = gelu_table()[idx].astype(F32)
    y = np.where(x <= F32(-10), F32(0), y)
    y = np.where(x >= F32(10), x, y)
    return y.astype(F32)


def rope_neox(x, positions, n_rot, base):
    """ggml_rope_ext, NEOX mode: theta_0 = pos, theta_{i+1} = theta_i * powf(base, -2/n_rot) in f32;
    within the first n_rot dims, dim i pairs with i + n_rot/2; dims >= n_rot pass through.
    x: [T, H, D] f32."""
    theta_scale = F32(np.power(F64(F32(base)), F64(F32(-2.0) / F32(n_rot))))
    half = n_rot // 2
    th = np.zeros((len(positions), half), dtype=F32)
    cur = np.asarray(positions, dtype=F32)
    for i in range(half):
        th[:, i] = cur
        cur = (cur * theta_scale).astype(F32)
    c = np.cos(th.astype(F64)).astype(F32)[:, None, :]
    s = np.sin(th.astype(F64)).astype(F32)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    o0 = ((x0 * c).astype(F32) - (x1 * s).astype(F32)).astype(F32)
    o1 = ((x0 * s).astype(F32) + (x1 * c).astype(F32)).astype(F32)
    return np.concatenate([o0, o1, x[..., n_rot:]], axis=-1).astype(F32)


def softmax_rows(w):
    """ggml soft_max on already scaled+masked f32 logits: expf(x - max), f64 sum, * f32(1/sum)."""
    mx = w.max(axis=1, keepdims=True)
    e = np.exp((w - mx).astype(F32).astype(F64)).astype(F32)
    ssum = np.sum(e.astype(F64), axis=1, keepdims=True)
    return (e * (1.0 / ssum).astype(F32)).astype(F32)


def l2_normalize(v):
    """common_embd_normalize(.., 2)."""
    v = np.asarray(v, F32)
    ssum = float(np.cumsum((v * v).astype(F32).astype(F64))[-1])
    ssum = math.sqrt(ssum)
    norm = F32(1.0 / ssum) if ssum > 0 else F32(0)
    return (v * norm).astype(F32)


# ----------------------------------------------------------------------------------------------
# exact variant: bitnet.cpp's CPU kernels bit for bit (x86 AVX2 + FMA + F16C, LLAMAFILE), copied
# from shared/tools/bitnet_ref.py --variant exact and adapted (head_dim / n_rot / kq_scale as
# parameters, leftovers past 32 in vec_dot_f16, one-head tinyBLAS K.Q, SiLU's libm tail).
# embed_ref_selftest.py checks each against bitnet_ref.py bit for bit.
# ----------------------------------------------------------------------------------------------
def _libm_required():
    if _libm is None:
        raise RuntimeError("--variant exact needs glibc's libm (ctypes) for cosf/sinf/powf/expf")


def libm_expf(x):
    """glibc expf, element-wise."""
    _libm_required()
    x = np.asarray(x, F32)
    return np.array([_libm.expf(float(v)) for v in x.reshape(-1)], dtype=F32).reshape(x.shape)


def silu_exact(x):
    """ggml_vec_silu_f32 (AVX2 + FMA) over the last axis: whole groups of 8 from the row start
    ggml_v_silu = x / (1 + ggml_v_expf(0 - x)); the ragged tail ggml_silu_f32 = x / (1.0f + expf(-x))
    with glibc expf."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    n8 = n - n % 8
    y = np.empty_like(x)
    xa = x[..., :n8]
    y[..., :n8] = (xa / (F32(1) + v_expf((F32(0) - xa).astype(F32))).astype(F32)).astype(F32)
    if n8 < n:
        xt = x[..., n8:]
        y[..., n8:] = (xt / (F32(1) + libm_expf((-xt).astype(F32))).astype(F32)).astype(F32)
    return y


def vec_dot_f16(X, Y):
    """ggml_vec_dot_f16 (AVX2/F16C): rows of X [M,n] . rows of Y [N,n] (values already f16) -> [M,N].
    4 accumulators x 8 lanes over whole chunks of 32, FMA (f16*f16 products are exact in f32), then
    GGML_F32x8_REDUCE: (a0+a2)+(a1+a3), lo+hi 128-bit halves, hadd, hadd; the sum is widened to
    f64 (ggml_float) and the products past the last whole chunk (f32, exact) added in order, then
    rounded to f32.  (bitnet_ref.py's version, plus the leftover loop it never needed.)"""
    X = np.asarray(X, F32)
    Y = np.asarray(Y, F32)
    n = X.shape[1]
    M, N = X.shape[0], Y.shape[0]
    npc = n - n % 32
    acc = np.zeros((M, N, 4, 8), F32)
    if npc:
        Xr = X[:, :npc].reshape(M, npc // 32, 4, 8)
        Yr = Y[:, :npc].reshape(N, npc // 32, 4, 8)
        for i in range(npc // 32):
            acc = (acc + (Xr[:, None, i] * Yr[None, :, i]).astype(F32)).astype(F32)
    a0 = (acc[..., 0, :] + acc[..., 2, :]).astype(F32)
    a1 = (acc[..., 1, :] + acc[..., 3, :]).astype(F32)
    a = (a0 + a1).astype(F32)
    t0 = (a[..., 0:4] + a[..., 4:8]).astype(F32)
    r = ((t0[..., 0] + t0[..., 1]).astype(F32) + (t0[..., 2] + t0[..., 3]).astype(F32)).astype(F32)
    if npc == n:
        return r
    s = r.astype(F64)
    for i in range(npc, n):
        s = s + (X[:, None, i] * Y[None, :, i]).astype(F32).astype(F64)
    return s.astype(F32)


def tinyblas_f16_f32(A, B, rows_per_chunk=8):
    """llamafile tinyBLAS<8, __m256, __m256, ggml_fp16_t, float, float> (AVX2+FMA):
    C[j, i] = hsum(8 lanes of fma(A[i, l..l+7], B[j, l..l+7], acc)) with A f16 values, B f32.
    hsum: t = lo+hi halves; (t0+t2)+(t1+t3). Returns [N, M]. (k % 8 == 0, else llamafile refuses.)"""
    A = np.asarray(A, F32)
    B = np.asarray(B, F32)
    M, k = A.shape
    N = B.shape[0]
    assert k % 8 == 0
    A64 = A.reshape(M, k // 8, 8).astype(F64)
    out = np.empty((N, M), F32)
    for j0 in range(0, N, rows_per_chunk):
        Bc = B[j0:j0 + rows_per_chunk].reshape(-1, k // 8, 8).astype(F64)
        acc = np.zeros((Bc.shape[0], M, 8), F64)
        for l in range(k // 8):
            acc = (acc + Bc[:, None, l, :] * A64[None, :, l, :]).astype(F32).astype(F64)
        acc = acc.astype(F32)
        t = (acc[..., 0:4] + acc[..., 4:8]).astype(F32)
        out[j0:j0 + Bc.shape[0]] = ((t[..., 0] + t[..., 2]).astype(F32)
                                    + (t[..., 1] + t[..., 3]).astype(F32)).astype(F32)
    return out


def softmax_exact(kq, mask, scale):
    """ggml_compute_forward_soft_max_f32: w = kq*scale + mask; e = ggml_v_expf(w - max);
    sum: per 8-lane group in f32 ((l+l4) then (a0+a2)+(a1+a3)), groups added into an f64;
    p = e * (float)(1.0/sum).  kq, mask: [T, P] with P a multiple of 8 (n_kv is padded to 32).
    scale: the graph's kq_scale (bitnet_ref.py: always 1/sqrtf(128))."""
    w = ((kq * F32(scale)).astype(F32) + mask).astype(F32)
    mx = w.max(axis=1, keepdims=True)
    e = v_expf((w - mx).astype(F32))
    T, P = e.shape
    assert P % 8 == 0
    er = e.reshape(T, P // 8, 8)
    t = (er[..., 4:8] + er[..., 0:4]).astype(F32)
    gsum = ((t[..., 0] + t[..., 2]).astype(F32) + (t[..., 1] + t[..., 3]).astype(F32)).astype(F32)
    ssum = np.cumsum(gsum.astype(F64), axis=1)[:, -1]          # sequential f64 accumulation
    inv = (1.0 / ssum).astype(F32)
    return (e * inv[:, None]).astype(F32)


def rope_tables_libm(positions, n_rot, base):
    """ggml_rope_cache_init with glibc powf/cosf/sinf: theta_scale = powf(base, -2.0f/n_rot),
    theta_0 = pos, theta_{i+1} = theta_i * theta_scale in f32. -> cos, sin [T, n_rot/2]."""
    _libm_required()
    theta_scale = F32(_libm.powf(float(F32(base)), float(F32(-2.0) / F32(n_rot))))
    cos = np.empty((len(positions), n_rot // 2), F32)
    sin = np.empty((len(positions), n_rot // 2), F32)
    for r, p in enumerate(positions):
        th = F32(p)
        for i in range(n_rot // 2):
            cos[r, i] = _libm.cosf(float(th))
            sin[r, i] = _libm.sinf(float(th))
            th = F32(th * theta_scale)
    return cos, sin


def apply_rope_fma(x, cos, sin):
    """NEOX rotation as clang -O3 -mfma contracts it (-ffp-contract=on, LHS product fused):
    x0*c - x1*s -> fma(x0, c, -(x1*s));  x0*s + x1*c -> fma(x0, s, x1*c).  x: [T, H, D] f32; the
    first n_rot = 2*cos.shape[1] dims rotate (dim i pairs with i + n_rot/2), dims >= n_rot pass."""
    n_rot = 2 * cos.shape[1]
    half = n_rot // 2
    c = cos[:, None, :]
    s = sin[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    o0 = fma32(x0, c, -(x1 * s).astype(F32))
    o1 = fma32(x0, s, (x1 * c).astype(F32))
    return np.concatenate([o0, o1, x[..., n_rot:]], axis=-1).astype(F32)


def attention_exact(q, k_all, v_all, pos0, n_head_kv, kq_scale, swa=0, kq_path="auto"):
    """bitnet.cpp's (non-flash) attention for n = T query rows at positions pos0.. over the cache.
    q: [T, H, D] f32 (roped, and for gemma3 already scaled); k_all, v_all: [pos0+T, Hkv, D] holding
    f16 values (the cache). Query head h reads KV head h // (H / Hkv).
    K.Q: Q rounded to f16 and ggml_vec_dot_f16 -- or, with one query head and >= 2 rows (the permuted
    Q is then contiguous and llamafile_sgemm takes it; it refuses n < 2 and k % 8 != 0), tinyBLAS
    with Q in f32.  kq_path: "auto" (that rule), "vec_dot" or "tinyblas" (forced, for the selftest).
    mask: causal (and sliding window swa > 0: qpos - j < swa), n_kv padded to 32 with -inf;
    softmax_exact with kq_scale; P.V: one row -> P rounded to f16, ggml_vec_dot_f16; >= 2 rows ->
    tinyBLAS F16 V x F32 P."""
    T, H, D = q.shape
    P = k_all.shape[0]
    assert P == pos0 + T and v_all.shape[0] == P
    assert H % n_head_kv == 0
    grp = H // n_head_kv
    Ppad = (P + 31) // 32 * 32
    qpos = pos0 + np.arange(T)[:, None]
    j = np.arange(Ppad)[None, :]
    allowed = (j <= qpos) & (j < P)
    if swa:
        allowed &= (qpos - j) < swa
    maskp = np.where(allowed, F32(0), F32(-np.inf)).astype(F32)
    if kq_path == "auto":
        kq_path = "tinyblas" if (H == 1 and T >= 2 and D % 8 == 0) else "vec_dot"
    out = np.empty((T, H, D), dtype=F32)
    for h in range(H):
        kvh = h // grp
        kh = np.zeros((Ppad, D), F32)
        kh[:P] = np.asarray(k_all[:, kvh, :], F32)
        vh = np.zeros((Ppad, D), F32)
        vh[:P] = np.asarray(v_all[:, kvh, :], F32)
        if kq_path == "tinyblas":                       # tinyBLAS F16(K) x F32(Q): Q stays f32
            kq = tinyblas_f16_f32(kh, q[:, h, :])
        else:                                           # Q -> f16, ggml_vec_dot_f16
            kq = vec_dot_f16(q[:, h, :].astype(F16).astype(F32), kh)
        p = softmax_exact(kq, maskp, kq_scale)
        if T == 1:   # llamafile_sgemm refuses n < 2: P -> f16, ggml_vec_dot_f16 over positions
            out[:, h, :] = vec_dot_f16(p.astype(F16).astype(F32), vh.T)
        else:        # tinyBLAS F16(V) x F32(P): P stays f32
            out[:, h, :] = tinyblas_f16_f32(vh.T, p)
    return out


# ----------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------
class Opts:
    def __init__(self, act_quant=True, gelu="table", silu="ggml", kv="f16", q16=False, swa=None,
                 pooling="file", ternarize_float=False, variant="f32"):
        self.variant = variant
        self.act_quant = act_quant
        self.gelu = gelu
        self.silu = silu
        self.kv = kv
        self.q16 = q16
        self.swa = swa
        self.pooling = pooling
        self.ternarize_float = ternarize_float


class Linear:
    """A projection [out, in]: ternary (I2_S, or a float tensor with --ternarize-float) or float."""

    def __init__(self, g, name, ternarize_float=False):
        t = g.tensors[name]
        self.name = name
        self.K, self.N = t["ne"]                 # ggml ne = (in, out)
        self.n_code3 = 0
        if t["type"] == GGML_I2_S:
            codes, beta, _ = i2s_decode(g.raw(name), t["n"])
            self.n_code3 = int(np.count_nonzero(codes == 3))
            self.codes = _TERNARY_LUT[codes].reshape(self.N, self.K)      # int8 [out, in]
            self.beta = beta
            self.kind = "I2_S"
        elif ternarize_float:
            q, beta = ternarize(g.floats(name))
            self.codes, self.beta, self.kind = q.reshape(self.N, self.K), beta, "ternarized " + TYPE_NAMES[t["type"]]
        else:
            self.w = g.floats(name).reshape(self.N, self.K)
            self.kind = TYPE_NAMES[t["type"]]
        assert self.K < (1 << 24) // 128, "|T| could exceed 2^24"

    @property
    def ternary(self):
        return hasattr(self, "codes")

    def __call__(self, x, quantize=True):
        x = np.asarray(x, dtype=F32)
        assert x.shape[1] == self.K, (self.name, x.shape, self.K)
        if not self.ternary:                                             # plain float matmul
            return (x.astype(F64) @ self.w.astype(F64).T).astype(F32)
        W = self.codes.astype(F64)
        if not quantize:
            return ((x.astype(F64) @ W.T).astype(F32) * self.beta).astype(F32)
        q, s = act_quant(x)
        T = q @ W.T                                                      # exact integers
        assert np.all(np.abs(T) < 2 ** 24)
        y = (T.astype(F32) / s[:, None]).astype(F32)
        return (y * self.beta).astype(F32)


PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
POOL_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last"}


class Model:
    def __init__(self, path, opts):
        g = GGUF(path)
        self.g, self.opts = g, opts
        kv = g.kv
        arch = kv["general.architecture"]
        assert arch in ("qwen3", "gemma3"), f"unsupported architecture {arch!r}"
        self.arch = arch
        p = arch + "."
        self.n_embd = int(kv[p + "embedding_length"])
        self.n_layer = int(kv[p + "block_count"])
        self.n_ff = int(kv[p + "feed_forward_length"])
        self.n_head = int(kv[p + "attention.head_count"])
        self.n_head_kv = int(kv[p + "attention.head_count_kv"])
        self.head_dim = int(kv.get(p + "attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(kv.get(p + "attention.value_length", self.head_dim))
        assert self.head_dim_v == self.head_dim, "key_length != value_length is not supported"
        self.n_rot = int(kv.get(p + "rope.dimension_count", self.head_dim))
        self.base = F32(kv.get(p + "rope.freq_base", 10000.0))
        self.base_swa = F32(kv.get(p + "rope.freq_base_swa", 10000.0))
        self.eps = F32(kv[p + "attention.layer_norm_rms_epsilon"])
        self.pooling_type = int(kv.get(p + "pooling_type", 0))
        swa = kv.get(p + "attention.sliding_window") if arch == "gemma3" else None
        if opts.swa is not None:
            swa = opts.swa
        self.swa = int(swa) if swa else 0
        emb = g.tensors["token_embd.weight"]
        assert emb["ne"][0] == self.n_embd
        self.n_vocab = emb["ne"][1]
        self.emb_type = TYPE_NAMES[emb["type"]]
        self.E = g.floats("token_embd.weight").reshape(self.n_vocab, self.n_embd)
        self.out_norm = g.floats("output_norm.weight")
        norms = ["attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm"] + [k + "_norm_in" for k in PROJ]
        if arch == "gemma3":
            norms += ["post_attention_norm", "post_ffw_norm"]
        self.layers = []
        self.n_code3 = 0
        D, H, Hkv = self.head_dim, self.n_head, self.n_head_kv
        want = {"attn_q": (self.n_embd, H * D), "attn_k": (self.n_embd, Hkv * D), "attn_v": (self.n_embd, Hkv * D),
                "attn_output": (H * D, self.n_embd), "ffn_gate": (self.n_embd, self.n_ff),
                "ffn_up": (self.n_embd, self.n_ff), "ffn_down": (self.n_ff, self.n_embd)}
        for il in range(self.n_layer):
            b = f"blk.{il}."
            L = {}
            for k in PROJ:
                L[k] = Linear(g, b + k + ".weight", opts.ternarize_float)
                assert (L[k].K, L[k].N) == want[k], (b + k, (L[k].K, L[k].N), want[k])
                self.n_code3 += L[k].n_code3
            for k in norms:
                L[k] = g.floats(b + k + ".weight")
            assert L["attn_q_norm"].shape == (D,) and L["attn_output_norm_in"].shape == (H * D,)
            assert L["ffn_down_norm_in"].shape == (self.n_ff,)
            self.layers.append(L)
        known = {"token_embd.weight", "output_norm.weight"} | {
            f"blk.{il}.{k}.weight" for il in range(self.n_layer) for k in list(PROJ) + norms}
        self.unused = sorted(set(g.tensors) - known)
        if opts.variant == "exact":
            bad = [k for k, v in (("--no-act-quant", not opts.act_quant), ("--kv f32", opts.kv != "f16"),
                                  ("--q16", opts.q16), ("--gelu exact", opts.gelu != "table"),
                                  ("--silu plain", opts.silu != "ggml")) if v]
            if bad:
                raise SystemExit(f"--variant exact fixes these choices itself: {', '.join(bad)}")
            if not all(L[k].ternary for L in self.layers for k in PROJ):
                raise SystemExit("--variant exact needs ternary projections (I2_S, or --ternarize-float)")
            _libm_required()

    def describe(self):
        L0 = self.layers[0]
        return (f"arch={self.arch} n_embd={self.n_embd} layers={self.n_layer} heads={self.n_head}/{self.n_head_kv} "
                f"head_dim={self.head_dim} n_rot={self.n_rot} n_ff={self.n_ff} vocab={self.n_vocab} "
                f"base={float(self.base):g} eps={float(self.eps):g} pooling={POOL_NAMES.get(self.pooling_type)} "
                f"swa={self.swa or 'none'} token_embd={self.emb_type} proj={L0['attn_q'].kind} "
                f"code3={self.n_code3} variant={self.opts.variant}" + (f" UNUSED TENSORS={self.unused}" if self.unused else ""))

    def bitlinear(self, L, k, x):
        """y = P(rms_norm(x) * P_norm_in)."""
        return L[k](rms_norm(x, L[k + "_norm_in"], self.eps), self.opts.act_quant)

    def layer_is_swa(self, il):
        return self.arch == "gemma3" and self.swa > 0 and (il + 1) % 6 != 0

    def kq_scale(self):
        if self.arch == "gemma3":
            return F32(1.0)                                     # Q was scaled after RoPE
        return F32(F32(1.0) / np.sqrt(F32(self.head_dim)))     # 1.0f/sqrtf(head_dim)

    def attention(self, q, k, v, swa):
        """q: [T, H, D], k/v: [T, Hkv, D] (already rounded as the cache stores them)."""
        o = self.opts
        T, H, D = q.shape
        grp = self.n_head // self.n_head_kv
        scale = self.kq_scale()
        if o.variant == "exact":
            return attention_exact(q, k, v, 0, self.n_head_kv, scale, self.swa if swa else 0)
        i = np.arange(T)[:, None]
        j = np.arange(T)[None, :]
        allowed = j <= i
        if swa:
            allowed &= (i - j) < self.swa
        mask = np.where(allowed, F32(0), F32(-np.inf)).astype(F32)
        out = np.empty((T, H, D), dtype=F32)
        for h in range(H):
            kvh = h // grp
            qh = q[:, h, :].astype(F16).astype(F32) if o.q16 else q[:, h, :]
            kq = (qh.astype(F64) @ k[:, kvh, :].astype(F64).T).astype(F32)
            w = ((kq * scale).astype(F32) + mask).astype(F32)
            p = softmax_rows(w)
            out[:, h, :] = (p.astype(F64) @ v[:, kvh, :].astype(F64)).astype(F32)
        return out

    def hidden(self, ids):
        """Final output_norm'd hidden states [T, n_embd]."""
        o = self.opts
        ids = np.asarray(ids, dtype=np.int64)
        assert ids.ndim == 1 and len(ids) > 0 and ids.min() >= 0 and ids.max() < self.n_vocab, "bad ids"
        T = len(ids)
        D, H, Hkv = self.head_dim, self.n_head, self.n_head_kv
        x = self.E[ids].astype(F32)
        if self.arch == "gemma3":
            x = (x * F32(np.sqrt(F32(self.n_embd)))).astype(F32)            # sqrtf(n_embd)
        pos = np.arange(T)
        exact = o.variant == "exact"
        tables = {}
        for il, L in enumerate(self.layers):
            swa = self.layer_is_swa(il)
            base = self.base_swa if swa else self.base
            if exact and float(base) not in tables:
                tables[float(base)] = rope_tables_libm(pos, self.n_rot, base)
            h = rms_norm(x, L["attn_norm"], self.eps)
            q = self.bitlinear(L, "attn_q", h).reshape(T, H, D)
            k = self.bitlinear(L, "attn_k", h).reshape(T, Hkv, D)
            v = self.bitlinear(L, "attn_v", h).reshape(T, Hkv, D)
            q = rms_norm(q, L["attn_q_norm"], self.eps)
            k = rms_norm(k, L["attn_k_norm"], self.eps)
            if exact:
                cos, sin = tables[float(base)]
                q = apply_rope_fma(q, cos, sin)
                k = apply_rope_fma(k, cos, sin)
            else:
                q = rope_neox(q, pos, self.n_rot, base)
                k = rope_neox(k, pos, self.n_rot, base)
            if self.arch == "gemma3":
                q = (q * F32(F32(1.0) / np.sqrt(F32(D)))).astype(F32)       # f_attention_scale
            if o.kv == "f16":
                k = k.astype(F16).astype(F32)
                v = v.astype(F16).astype(F32)
            att = self.attention(q, k, v, swa).reshape(T, H * D)
            a = self.bitlinear(L, "attn_output", att)
            if self.arch == "gemma3":
                a = rms_norm(a, L["post_attention_norm"], self.eps)
            x = (x + a).astype(F32)
            h = rms_norm(x, L["ffn_norm"], self.eps)
            gt = self.bitlinear(L, "ffn_gate", h)
            up = self.bitlinear(L, "ffn_up", h)
            if self.arch == "gemma3":
                act = gelu(gt, o.gelu)
            else:
                act = silu_exact(gt) if exact else silu(gt, o.silu)
            f = self.bitlinear(L, "ffn_down", (act * up).astype(F32))
            if self.arch == "gemma3":
                f = rms_norm(f, L["post_ffw_norm"], self.eps)
            x = (x + f).astype(F32)
        return rms_norm(x, self.out_norm, self.eps)

    def embed(self, ids):
        """Pooled, L2-normalised embedding (pooling none: every row, each normalised)."""
        hs = self.hidden(ids)
        pt = self.pooling_type if self.opts.pooling == "file" else \
            {v: k for k, v in POOL_NAMES.items()}[self.opts.pooling]
        if pt == 3:
            v = hs[-1]
        elif pt == 2:
            v = hs[0]
        elif pt == 1:   # ggml_mul_mat(x^T, 1/n column): sum of x * f32(1/n)
            v = np.sum((hs * F32(1.0 / len(ids))).astype(F32).astype(F64), axis=0).astype(F32)
        else:
            return np.stack([l2_normalize(r) for r in hs])
        return l2_normalize(v)


# ----------------------------------------------------------------------------------------------
# decode check
# ----------------------------------------------------------------------------------------------
def decode_check(qpath, srcpath):
    self_test_layout()
    gq, gs = GGUF(qpath), GGUF(srcpath)
    ok = True
    n_i2s = 0
    rng = np.random.default_rng(0)
    missing = sorted(set(gs.tensors) ^ set(gq.tensors))
    if missing:
        print(f"  tensor sets differ: {missing}")
        ok = False
    for name, t in gq.tensors.items():
        if name not in gs.tensors:
            continue
        s = gs.tensors[name]
        if s["ne"] != t["ne"]:
            print(f"  {name}: ne {t['ne']} vs {s['ne']}")
            ok = False
            continue
        ref = gs.floats(name)
        if t["type"] == GGML_I2_S:
            n_i2s += 1
            raw = gq.raw(name)
            codes, beta, tail = i2s_decode(raw, t["n"])
            for j in rng.integers(0, t["n"], 256):
                assert i2s_code_scalar(raw, int(j)) == codes[j]
            want_codes, want_beta = ternarize(ref)
            # the codes the stored scale gives: round(w / beta) clamped (converter: w * f32(1/beta))
            codes_b = np.clip(np.round((ref * F32(1.0 / float(beta))).astype(F32)), -1, 1)
            dec = (_TERNARY_LUT[codes].astype(F32) * beta).astype(F32)
            same = bool(np.array_equal(dec, (codes_b.astype(F32) * beta).astype(F32)))
            same_mine = bool(np.array_equal(_TERNARY_LUT[codes], want_codes))
            beta_same = bool(beta.view(np.uint32) == want_beta.view(np.uint32))
            exact = math.fsum(np.abs(ref).astype(F64)) / ref.size
            ulp = float(np.spacing(F32(exact)))
            beta_ulps = abs(float(beta) - exact) / ulp
            n3 = int(np.count_nonzero(codes == 3))
            ok &= same and same_mine and beta_same and n3 == 0
            print(f"  {name:30s} I2_S ne={t['ne']} beta={float(beta):.8g} ==np1.x mean|w|:{beta_same} "
                  f"(|beta - exact mean|w||={beta_ulps:.2f} ulp) zeros={np.mean(codes == 1):.3f} code3={n3} "
                  f"tail_nonzero={int(np.count_nonzero(tail))} decoded==clip(round(w/beta))*beta:{same} "
                  f"codes==ternarize(w):{same_mine} max|w-decoded|={float(np.max(np.abs(ref - dec))):.3g}")
        else:
            dec = gq.floats(name)
            if t["type"] == GGML_F16:
                same = bool(np.array_equal(dec, ref.astype(F16).astype(F32)))
                what = "== f16(src)"
            else:
                same = bool(np.array_equal(dec.view(np.uint32), ref.view(np.uint32)))
                what = "bit-exact"
            ok &= same
            if not same:
                print(f"  {name:30s} {TYPE_NAMES[t['type']]} NOT {what}")
    print(f"decode-check {os.path.basename(qpath)} vs {os.path.basename(srcpath)}: {n_i2s} I2_S tensors, "
          f"{len(gq.tensors) - n_i2s} others; all ok = {ok}")
    return ok


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def summary_line(name, ids, v):
    v = np.asarray(v, F32)
    flat = v.reshape(-1)
    return (f"{name}: n_tokens={len(ids)} dim={v.shape[-1]}{' rows=%d' % v.shape[0] if v.ndim == 2 else ''} "
            f"{'norm' if v.ndim == 1 else 'norm(all rows)'}={float(np.linalg.norm(flat.astype(F64))):.7f} first8=[" +
            ", ".join(f"{x:.7f}" for x in flat[:8]) + "]")


def compare_vecs(a, b):
    a, b = np.asarray(a, F64).reshape(-1), np.asarray(b, F64).reshape(-1)
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return cos, float(np.max(np.abs(a - b)))


def compare_dirs(da, db):
    names = sorted(f[: -len(".embd.f32")] for f in os.listdir(da) if f.endswith(".embd.f32")
                   and os.path.exists(os.path.join(db, f)))
    assert names, "no common NAME.embd.f32 files"
    worst_cos, worst_d = 1.0, 0.0
    for n in names:
        a = np.fromfile(os.path.join(da, n + ".embd.f32"), dtype="<f4")
        b = np.fromfile(os.path.join(db, n + ".embd.f32"), dtype="<f4")
        assert a.shape == b.shape, (n, a.shape, b.shape)
        cos, d = compare_vecs(a, b)
        worst_cos, worst_d = min(worst_cos, cos), max(worst_d, d)
        print(f"  {n:12s} cos={cos:.10f} 1-cos={1 - cos:.3e} max|d|={d:.3e}")
    print(f"compare {da} vs {db}: {len(names)} vectors, min cos={worst_cos:.10f} (1-cos={1 - worst_cos:.3e}), "
          f"max|d|={worst_d:.3e}")


def add_opts(p):
    p.add_argument("--variant", choices=["f32", "exact"], default="f32",
                   help="f32: the reference above; exact: bitnet.cpp's float paths (see the header)")
    p.add_argument("--no-act-quant", action="store_true", help="ternary weights, plain float matmul")
    p.add_argument("--gelu", choices=["table", "exact"], default="table")
    p.add_argument("--silu", choices=["ggml", "plain"], default="ggml")
    p.add_argument("--kv", choices=["f16", "f32"], default="f16")
    p.add_argument("--q16", action="store_true", help="round Q to f16 before Q.K")
    p.add_argument("--swa", type=int, default=None, help="set/override the gemma3 sliding window (0 = off)")
    p.add_argument("--pooling", choices=["file", "none", "mean", "cls", "last"], default="file")
    p.add_argument("--ternarize-float", action="store_true",
                   help="F16/F32 projections: BitLinear weight quant at load, then the I2_S path")


def opts_from(a):
    return Opts(act_quant=not a.no_act_quant, gelu=a.gelu, silu=a.silu, kv=a.kv, q16=a.q16, swa=a.swa,
                pooling=a.pooling, ternarize_float=a.ternarize_float, variant=a.variant)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("embed")
    e.add_argument("model")
    e.add_argument("--ids", required=True, help="comma-separated token ids")
    e.add_argument("--out", default=None, help="write the normalised vector as raw little-endian f32")
    add_opts(e)
    b = sub.add_parser("batch")
    b.add_argument("model")
    b.add_argument("prompts")
    b.add_argument("outdir")
    add_opts(b)
    d = sub.add_parser("decode-check")
    d.add_argument("i2s")
    d.add_argument("f32")
    c = sub.add_parser("compare")
    c.add_argument("dir_a")
    c.add_argument("dir_b")
    i = sub.add_parser("info")
    i.add_argument("model")
    a = ap.parse_args()

    if a.cmd == "decode-check":
        sys.exit(0 if decode_check(a.i2s, a.f32) else 1)
    if a.cmd == "compare":
        compare_dirs(a.dir_a, a.dir_b)
        return
    if a.cmd == "info":
        g = GGUF(a.model)
        for k, v in g.kv.items():
            if isinstance(v, (list, np.ndarray)) and len(v) > 8:
                v = f"[{len(v)} items: {list(v[:3])} ...]"
            print(f"  {k} = {v!r}")
        for n, t in g.tensors.items():
            print(f"  {n:36s} {TYPE_NAMES.get(t['type'], t['type'])} ne={t['ne']}")
        return
    model = Model(a.model, opts_from(a))
    print(model.describe())
    if a.cmd == "embed":
        ids = [int(x) for x in a.ids.split(",") if x.strip()]
        v = model.embed(ids)
        print(summary_line("embedding", ids, v))
        if a.out:
            v.astype("<f4").tofile(a.out)
        return
    prompts = json.load(open(a.prompts, encoding="utf-8"))
    os.makedirs(a.outdir, exist_ok=True)
    for pr in prompts:
        v = model.embed(pr["ids"])
        v.astype("<f4").tofile(os.path.join(a.outdir, pr["name"] + ".embd.f32"))
        print(summary_line(pr["name"], pr["ids"], v))


if __name__ == "__main__":
    main()
