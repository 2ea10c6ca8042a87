"""Model.embed / Model.create_embedding on an embedding model: the file bitnet.cpp's own
embedding converter writes (testdata/golden/embed/gemma3-converted.gguf), against the numpy
oracle's vectors kept beside it, and against `bitnet embed`.

Run after installing the wheel (.ci/run does this):
    python3 -m pytest crates/bitnet-python/tests
"""

import json
import pathlib
import subprocess

import numpy as np
import pytest

from bitnet_rs import Model
from test_bitnet import cli

ROOT = pathlib.Path(__file__).resolve().parents[3]
EMBED = ROOT / "testdata" / "golden" / "embed"
MODEL = EMBED / "gemma3-converted.gguf"


@pytest.fixture(scope="module")
def model():
    return Model(MODEL, n_threads=1)


def prompts():
    return json.loads((EMBED / "gemma3-converted.prompts.json").read_text())


def cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def test_vectors_match_the_oracle(model):
    ps = prompts()
    vecs = model.embed([p["ids"] for p in ps])
    assert len(vecs) == len(ps)
    for p, v in zip(ps, vecs):
        want = np.fromfile(EMBED / f"gemma3-converted.{p['name']}.embd.f32", dtype="<f4")
        assert len(v) == len(want)
        assert cosine(v, want) >= 0.9999, p["name"]
        assert abs(np.linalg.norm(v) - 1.0) < 1e-5


def test_shapes_options_and_the_cli(model):
    one = model.embed("hello world")
    assert isinstance(one, list) and isinstance(one[0], float)
    two = model.embed(["hello world", "bonjour"])
    assert two[0] == one
    ids = prompts()[1]["ids"]
    assert model.embed(ids) == model.embed([ids])[0]
    raw, count = model.embed("hello world", normalize=False, return_count=True)
    assert count == len(model.tokenize("hello world", add_bos=True, special=True))
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    np.testing.assert_allclose(np.asarray(raw) / np.linalg.norm(raw), one, atol=1e-6)
    rows = model.embed("hello world", pooling="none", normalize=False)
    assert len(rows) == count and rows[-1] == raw
    mean = model.embed("hello world", pooling="mean")
    assert cosine(mean, one) < 0.9999
    r = model.create_embedding(["hello world", "bonjour"])
    assert r["object"] == "list" and [d["index"] for d in r["data"]] == [0, 1]
    assert r["data"][0]["embedding"] == one
    assert r["usage"]["prompt_tokens"] == r["usage"]["total_tokens"] > 0
    out = subprocess.run([str(cli()), "embed", "-m", str(MODEL), "-t", "1", "hello world"],
                         check=True, capture_output=True, text=True).stdout
    np.testing.assert_allclose([float(x) for x in out.split()], one, rtol=0, atol=1e-7)


def test_bad_inputs(model):
    for bad in ([], [""], [[]], [[10**6]], [3.5], ["a", None]):
        with pytest.raises(ValueError):
            model.embed(bad)
    with pytest.raises(ValueError):
        model.embed("a", pooling="max")
    with pytest.raises(ValueError):
        model.embed(["a", "b"], pooling="none")


def np_quantize(v, bits):
    """The documented scheme (docs/MODEL.md, "Embedding quantization") in numpy float32:
    (codes, scale, packed)."""
    v = np.asarray(v, np.float32)
    mean_abs = np.float32(np.abs(v).sum(dtype=np.float32) / np.float32(len(v)))
    if bits in (8, 4):
        m = np.float32(127 if bits == 8 else 7)
        mx = np.float32(np.abs(v).max())
        codes = np.clip(np.round(v * (m / mx)), -m, m).astype(np.int8)
        scale = mx / m
    elif bits == 2:
        codes = np.clip(np.round(v / mean_abs), -1, 1).astype(np.int8)
        scale = mean_abs
    else:
        codes = (v > 0).astype(np.int8)
        scale = mean_abs
    # Two's complement fields, first value in the highest bits: numpy's packbits over the
    # bits of each code, most significant first.
    fields = (codes.astype(np.uint8)[:, None] >> np.arange(bits - 1, -1, -1)) & 1
    packed = np.packbits(fields.reshape(-1)).tobytes()
    return codes.tolist(), float(scale), packed


@pytest.mark.parametrize("bits", [8, 4, 2, 1])
def test_quantized_embeddings_follow_the_documented_scheme(model, bits):
    from bitnet_rs import QuantizedEmbedding, quantize_embedding

    texts = ["hello world", "bonjour", "a longer passage about ternary weights"]
    vecs = model.embed(texts)
    qs = model.embed(texts, bits=bits)
    assert len(qs) == 3
    for v, q in zip(vecs, qs):
        assert isinstance(q, QuantizedEmbedding) and q.bits == bits
        codes, scale, packed = np_quantize(v, bits)
        assert q.codes == codes
        assert q.scale == pytest.approx(scale, rel=1e-6)
        assert q.packed == packed
        assert quantize_embedding(v, bits) == q
        # The codes keep the vector's direction: cosine of code * scale with the vector.
        deq = np.asarray(q.codes, np.float64) if bits > 1 else 2.0 * np.asarray(q.codes) - 1
        floor = {8: 0.9999, 4: 0.98, 2: 0.8, 1: 0.7}[bits]
        assert cosine(deq, v) >= floor, (bits, cosine(deq, v))
    single = model.embed("hello world", bits=bits)
    assert single == qs[0]
    with pytest.raises(ValueError):
        model.embed("hello world", bits=3)
    with pytest.raises(ValueError):
        quantize_embedding([0.5, 1.0], 16)
