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
