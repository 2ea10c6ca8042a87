#!/usr/bin/env python3
"""Dev check of embed_ref.py --variant exact: each float path it ported from the generative
oracle shared/tools/bitnet_ref.py (--variant exact, bit-identical to bitnet.cpp's logits) is run
beside bitnet_ref.py's own function on the same random inputs and must agree bit for bit.
Not a CI test: it needs bitnet_ref.py (the shared tools' copy beside the checkout, ../shared/tools/bitnet_ref.py, or $BITNET_REF).

  python3 testdata/golden/make/embed_ref_selftest.py [--seed N]

Checked bit for bit against bitnet_ref.py:
  * rms_norm (rows of n_embd, and per head: [T, H, head_dim] against bitnet_ref on [T*H, head_dim])
  * int8 activation quant and the ternary projection, on random codes and on the I2_S tensors of
    testdata/golden/embed/*-converted.gguf decoded by each oracle's own reader
  * ggml_v_expf, ggml_vec_dot_f16, tinyBLAS F16 x F32, soft_max (kq_scale 1/sqrtf(128) directly;
    1/sqrtf(64) and 1.0 -- the embedding graphs' other scales -- on inputs where the products agree)
  * RoPE: the libm tables and the FMA rotation (n_rot = head_dim; n_rot < head_dim on the rotated
    part, the rest passed through)
  * attention for several (n_head, n_head_kv, head_dim, pos0, n), one-row and multi-row batches,
    against bitnet_ref's Model.attention (kq_scale 1/sqrtf(128) there, so that scale here).
    One query head with >= 2 rows: embed_ref takes K.Q by tinyBLAS with Q in f32, which
    bitnet_ref.py does not model (its models have many heads): there embed_ref forced to the
    vec_dot path must equal bitnet_ref's attention, and its own path must equal bitnet_ref's
    tinyblas_f16_f32 / softmax_exact composed the same way.
Checked against a plain re-statement (no bitnet_ref counterpart): SiLU (v_expf groups of 8, libm
tail), vec_dot_f16's f64 leftover past the last chunk of 32.
"""
import argparse
import importlib.util
import os
import pathlib
import sys
import types

import numpy as np

F16, F32, F64 = np.float16, np.float32, np.float64
HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "embed")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


er = load("embed_ref", os.path.join(HERE, "embed_ref.py"))
br = load("bitnet_ref", os.environ.get("BITNET_REF", str(pathlib.Path(__file__).resolve().parents[4] / "shared" / "tools" / "bitnet_ref.py")))

N_OK = 0
N_FAIL = 0


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype == F32 or b.dtype == F32:
        a32, b32 = np.asarray(a, F32), np.asarray(b, F32)
        return bool(np.array_equal(a32.view(np.uint32), b32.view(np.uint32)))
    return bool(np.array_equal(a, b))


def ndiff(a, b):
    a32, b32 = np.asarray(a, F32), np.asarray(b, F32)
    return int(np.count_nonzero(a32.view(np.uint32) != b32.view(np.uint32)))


def check(what, a, b):
    global N_OK, N_FAIL
    ok = same(a, b)
    if ok:
        N_OK += 1
    else:
        N_FAIL += 1
    n = np.asarray(a).size
    print(f"  {'ok  ' if ok else 'FAIL'} {what}: {n} values bit-identical" if ok else
          f"  FAIL {what}: {ndiff(a, b) if np.shape(a) == np.shape(b) else 'shape'} of {n} differ")


def rnd(rng, shape, scale=1.0):
    """f32 values over several magnitudes (log-uniform scale per element, random sign)."""
    mag = np.exp(rng.uniform(-4, 2, size=shape)) * scale
    return (rng.standard_normal(shape) * mag).astype(F32)


def f16v(rng, shape, scale=1.0):
    return rnd(rng, shape, scale).astype(F16)


def test_rms_norm(rng):
    print("rms_norm (ggml_rms_norm then times the weight)")
    eps = F32(1e-6)
    for T, n in ((1, 128), (7, 256), (24, 64), (5, 100), (3, 1024)):
        x = rnd(rng, (T, n))
        w = (1 + 0.1 * rng.standard_normal(n)).astype(F16).astype(F32)   # F16 norm weights widened
        check(f"rows [{T},{n}]", er.rms_norm(x, w, eps), br.rmsnorm(x, w, eps, "ggml"))
    for T, H, D in ((6, 4, 64), (1, 2, 128), (9, 2, 256)):
        x = rnd(rng, (T, H, D))
        w = (1 + 0.1 * rng.standard_normal(D)).astype(F16).astype(F32)
        check(f"per head [{T},{H},{D}] vs [{T * H},{D}]", er.rms_norm(x, w, F32(1e-6)),
              br.rmsnorm(x.reshape(T * H, D), w, F32(1e-6), "ggml").reshape(T, H, D))


def make_linear(codes, beta, name="synthetic"):
    L = object.__new__(er.Linear)
    L.name = name
    L.N, L.K = codes.shape
    L.codes = codes.astype(np.int8)
    L.beta = F32(beta)
    L.n_code3 = 0
    L.kind = "I2_S"
    return L


def test_linear(rng):
    print("int8 activation quant + ternary matmul")
    for T, K, N in ((1, 128, 256), (10, 256, 128), (23, 128, 128), (4, 1024, 64)):
        x = rnd(rng, (T, K))
        x[0, :3] = 0                      # zeros and a row that is all zero (m clamps to 1e-5)
        if T > 2:
            x[1] = 0
        qa, sa = er.act_quant(x)
        qb, sb = br.act_quant(x, "spec")
        check(f"act_quant q [{T},{K}]", qa, qb)
        check(f"act_quant s [{T},{K}]", sa, sb)
        codes = rng.integers(-1, 2, size=(N, K))
        beta = F32(abs(rng.standard_normal()) * 0.05 + 1e-3)
        W = types.SimpleNamespace(w=codes.astype(F64), beta=beta)
        check(f"ternary matmul [{T},{K}]x[{N},{K}]", make_linear(codes, beta)(x, True), br.tlin(W, x, "spec"))
    for a in ("qwen3", "gemma3"):
        path = os.path.join(GOLDEN, f"{a}-converted.gguf")
        if not os.path.exists(path):
            print(f"  (skip {path}: missing)")
            continue
        ge, gb = er.GGUF(path), br.GGUF(path)
        for name in ("blk.0.attn_q.weight", "blk.1.attn_output.weight", "blk.0.ffn_down.weight"):
            Le = er.Linear(ge, name)
            Wb = br.Ternary(gb, name)
            x = rnd(rng, (9, Le.K))
            check(f"{a} {name} from the file (each oracle's I2_S reader)", Le(x, True), br.tlin(Wb, x, "spec"))


def test_kernels(rng):
    print("ggml_v_expf, vec_dot_f16, tinyBLAS, soft_max")
    x = np.concatenate([rng.uniform(-100, 0, 4000), rng.uniform(-0.5, 0.5, 2000), rng.uniform(0, 88, 1000),
                        rng.uniform(-200, 200, 1000),
                        [0, -0.0, -87.3, -88.7, 88.7, 89, -104, -150, 150, 192.5, -np.inf, 1e-30]]).astype(F32)
    with np.errstate(all="ignore"):
        check("v_expf", er.v_expf(x), br.v_expf(x))
    for M, N, n in ((1, 64, 128), (10, 32, 64), (3, 96, 256), (32, 1, 96)):
        X = f16v(rng, (M, n)).astype(F32)
        Y = f16v(rng, (N, n)).astype(F32)
        check(f"vec_dot_f16 [{M},{n}].[{N},{n}]", er.vec_dot_f16(X, Y), br.vec_dot_f16(X, Y))
    for M, N, k in ((64, 10, 128), (32, 3, 64), (128, 24, 32), (96, 9, 256)):
        A = f16v(rng, (M, k)).astype(F32)
        B = rnd(rng, (N, k))
        check(f"tinyBLAS F16[{M},{k}] x F32[{N},{k}]", er.tinyblas_f16_f32(A, B), br.tinyblas_f16_f32(A, B))
    s128 = F32(F32(1.0) / np.sqrt(F32(128.0)))
    for T, P in ((1, 32), (10, 32), (24, 64), (3, 96)):
        kq = rnd(rng, (T, P), 4.0)
        mask = np.where(np.arange(P)[None, :] <= (P // 2 + np.arange(T))[:, None] % P, F32(0),
                        F32(-np.inf)).astype(F32)
        mask[:, 0] = 0
        check(f"soft_max [{T},{P}] kq_scale 1/sqrtf(128)", er.softmax_exact(kq, mask, s128),
              br.softmax_exact(kq, mask))
        w = (kq * s128).astype(F32)       # gemma3 (kq_scale 1.0): f32(w * 1) == f32(kq * s128)
        check(f"soft_max [{T},{P}] kq_scale 1.0", er.softmax_exact(w, mask, F32(1.0)), br.softmax_exact(kq, mask))
        kq8 = (w * F32(8)).astype(F32)    # head_dim 64 (kq_scale 1/sqrtf(64) = 1/8): f32(kq8/8) == w
        check(f"soft_max [{T},{P}] kq_scale 1/sqrtf(64)",
              er.softmax_exact(kq8, mask, F32(F32(1.0) / np.sqrt(F32(64.0)))), br.softmax_exact(kq, mask))


def test_rope(rng):
    print("RoPE (glibc powf/cosf/sinf tables, FMA-contracted NEOX rotation)")
    for pos, n_rot, base in ((np.arange(24), 64, 1e6), (np.arange(26), 128, 1e4), (np.arange(40, 47), 256, 1e4),
                             (np.arange(3), 128, 5e5), (np.array([1000]), 64, 1e6)):
        ce, se = er.rope_tables_libm(pos, n_rot, F32(base))
        cb, sb = br.rope_tables_libm(pos, n_rot, F32(base))
        check(f"tables cos pos {pos[0]}..{pos[-1]} n_rot {n_rot} base {base:g}", ce, cb)
        check(f"tables sin pos {pos[0]}..{pos[-1]} n_rot {n_rot} base {base:g}", se, sb)
        for H in (1, 4):
            x = rnd(rng, (len(pos), H, n_rot))
            check(f"rotate [{len(pos)},{H},{n_rot}]", er.apply_rope_fma(x, ce, se), br.apply_rope_fma(x, cb, sb))
    pos = np.arange(12)
    ce, se = er.rope_tables_libm(pos, 64, F32(1e6))
    cb, sb = br.rope_tables_libm(pos, 64, F32(1e6))
    x = rnd(rng, (12, 2, 128))
    y = er.apply_rope_fma(x, ce, se)
    check("n_rot 64 < head_dim 128: rotated dims", y[..., :64], br.apply_rope_fma(x[..., :64].copy(), cb, sb))
    check("n_rot 64 < head_dim 128: dims past n_rot pass through", y[..., 64:], x[..., 64:])


def br_attention(H, Hkv, q, k16, v16, pos0):
    m = object.__new__(br.Model)
    m.opts = br.Opts("exact")
    m.n_head, m.n_head_kv = H, Hkv
    return m.attention(q, k16, v16, pos0)


def br_attention_one_head_tinyblas(q, k16, v16, pos0):
    """bitnet_ref's primitives composed as ggml runs one query head with >= 2 rows: K.Q by
    tinyBLAS with Q in f32, soft_max, P.V by tinyBLAS with P in f32."""
    T, H, D = q.shape
    assert H == 1 and T >= 2
    P = k16.shape[0]
    Ppad = (P + 31) // 32 * 32
    mask = np.full((T, Ppad), -np.inf, F32)
    mask[:, :P] = np.where(np.arange(P)[None, :] <= (pos0 + np.arange(T))[:, None], 0.0, -np.inf)
    kh = np.zeros((Ppad, D), F32)
    kh[:P] = k16[:, 0].astype(F32)
    vh = np.zeros((Ppad, D), F32)
    vh[:P] = v16[:, 0].astype(F32)
    p = br.softmax_exact(br.tinyblas_f16_f32(kh, q[:, 0]), mask)
    return br.tinyblas_f16_f32(vh.T, p)[:, None, :]


def test_attention(rng):
    print("attention (f16 cache, K.Q, mask padded to 32, soft_max, P.V; kq_scale 1/sqrtf(128))")
    s128 = F32(F32(1.0) / np.sqrt(F32(128.0)))
    cases = [  # (n_head, n_head_kv, head_dim, pos0, n)
        (4, 2, 64, 0, 10), (4, 2, 64, 0, 1), (4, 2, 64, 37, 1), (2, 1, 128, 0, 26), (2, 1, 128, 0, 1),
        (2, 1, 128, 5, 7), (8, 8, 128, 0, 33), (16, 4, 128, 0, 3), (4, 1, 256, 0, 40), (2, 2, 96, 0, 5),
        (20, 5, 128, 60, 4),
        (1, 1, 128, 0, 1), (1, 1, 64, 30, 1),                      # one head, one row: vec_dot path
        (1, 1, 128, 0, 12), (1, 1, 64, 3, 2), (1, 1, 256, 0, 33),  # one head, several rows: tinyBLAS K.Q
    ]
    for H, Hkv, D, pos0, n in cases:
        P = pos0 + n
        q = rnd(rng, (n, H, D), 2.0)
        k16 = f16v(rng, (P, Hkv, D))
        v16 = f16v(rng, (P, Hkv, D))
        k32, v32 = k16.astype(F32), v16.astype(F32)
        tag = f"H={H} Hkv={Hkv} D={D} pos0={pos0} n={n}"
        ref = br_attention(H, Hkv, q, k16, v16, pos0)
        mine = er.attention_exact(q, k32, v32, pos0, Hkv, s128)
        if H == 1 and n >= 2:
            forced = er.attention_exact(q, k32, v32, pos0, Hkv, s128, kq_path="vec_dot")
            check(f"{tag} (vec_dot K.Q forced) vs bitnet_ref attention", forced, ref)
            check(f"{tag} (tinyBLAS K.Q, Q f32) vs bitnet_ref tinyBLAS+soft_max composed", mine,
                  br_attention_one_head_tinyblas(q, k16, v16, pos0))
            print(f"       (tinyBLAS K.Q differs from bitnet_ref's f16-Q path in {ndiff(mine, ref)} of {ref.size})")
        else:
            check(f"{tag} vs bitnet_ref attention", mine, ref)


def test_silu_and_leftovers(rng):
    print("no bitnet_ref counterpart: SiLU groups of 8 + libm tail, vec_dot_f16 leftovers")
    for T, n in ((3, 256), (2, 13), (4, 7), (1, 1030)):
        x = rnd(rng, (T, n), 4.0)
        x[0, :4] = [0, -0.0, 30, -90][: min(4, n)]
        n8 = n - n % 8
        want = np.empty_like(x)
        with np.errstate(all="ignore"):
            want[:, :n8] = (x[:, :n8] / (F32(1) + br.v_expf((F32(0) - x[:, :n8]).astype(F32))).astype(F32))
        for i in range(T):
            for j in range(n8, n):
                want[i, j] = F32(x[i, j] / F32(F32(1) + F32(br._libm.expf(float(-x[i, j])))))
        check(f"silu [{T},{n}]", er.silu_exact(x), want)
    for n in (7, 40, 80, 100):
        X = f16v(rng, (2, n)).astype(F32)
        Y = f16v(rng, (3, n)).astype(F32)
        want = np.empty((2, 3), F32)
        np_ = n - n % 32
        for a in range(2):
            for b in range(3):
                acc = np.zeros((4, 8), F32)
                for c in range(0, np_, 32):
                    for r in range(4):
                        for l in range(8):
                            acc[r, l] = F32(acc[r, l] + F32(X[a, c + 8 * r + l] * Y[b, c + 8 * r + l]))
                s8 = [F32(F32(acc[0, l] + acc[2, l]) + F32(acc[1, l] + acc[3, l])) for l in range(8)]
                t = [F32(s8[l] + s8[l + 4]) for l in range(4)]
                s = float(F32(F32(t[0] + t[1]) + F32(t[2] + t[3])))
                for i in range(np_, n):
                    s += float(F32(X[a, i] * Y[b, i]))
                want[a, b] = F32(s)
        check(f"vec_dot_f16 n={n} (f64 leftover)", er.vec_dot_f16(X, Y), want)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    test_rms_norm(rng)
    test_linear(rng)
    test_kernels(rng)
    test_rope(rng)
    test_attention(rng)
    test_silu_and_leftovers(rng)
    print(f"{N_OK} checks bit-identical, {N_FAIL} failed")
    sys.exit(1 if N_FAIL else 0)


if __name__ == "__main__":
    main()
