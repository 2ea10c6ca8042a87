"""The bitnet_rs package against the tiny golden model (testdata/golden/tiny).

Run after installing the wheel (.ci/run does this):
    python3 -m pytest crates/bitnet-python/tests
The CLI comparison runs `bitnet` from $BITNET_CLI, else target/{debug,release}/bitnet.
"""

import json
import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import bitnet_rs
from bitnet_rs import BitnetError, Model

ROOT = pathlib.Path(__file__).resolve().parents[3]
TINY = ROOT / "testdata" / "golden" / "tiny"
MODEL = TINY / "bitnet-tiny-i2_s.gguf"
PROMPTS = ["p1_english", "p2_unicode", "p3_digits_punct", "p4_code_ws"]


def golden(name):
    return json.loads((TINY / f"{name}.tokens.json").read_text())


def cli():
    env = os.environ.get("BITNET_CLI")
    candidates = [pathlib.Path(env)] if env else [
        ROOT / "target" / "debug" / "bitnet", ROOT / "target" / "release" / "bitnet"]
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(f"the bitnet CLI is not built (looked at {[str(c) for c in candidates]}); "
                "run `cargo build` or set BITNET_CLI")


@pytest.fixture(scope="module")
def fast():
    return Model(MODEL, n_threads=1)


@pytest.fixture(scope="module")
def exact():
    return Model(MODEL, n_threads=1, numerics="exact")


def test_version_and_shape(fast):
    assert bitnet_rs.__version__
    assert (fast.n_vocab, fast.n_ctx) == (4256, 512)


@pytest.mark.parametrize("name", PROMPTS)
def test_exact_logits_equal_the_golden_files(exact, name):
    ids = golden(name)["prompt_tokens"]
    last = exact.logits(ids)
    assert last.dtype == np.float32 and last.shape == (4256,)
    want = np.fromfile(TINY / f"{name}.logits.f32", dtype="<f4")
    assert last.tobytes() == want.tobytes()
    every = exact.logits(ids, all=True)
    assert every.shape == (len(ids), 4256)
    want_all = np.fromfile(TINY / f"{name}.all_logits.f32", dtype="<f4")
    assert every.tobytes() == want_all.tobytes()


@pytest.mark.parametrize("name", PROMPTS)
def test_exact_greedy_ids_equal_bitnet_cpp(exact, name):
    g = golden(name)
    want = g["generated_tokens"]
    got = exact.generate_tokens(g["prompt_tokens"], max_tokens=len(want), temperature=0)
    assert got == want


@pytest.mark.parametrize("prompt", ["Once upon a time", "def main():", "Ünïcödé — 東京"])
def test_greedy_text_equals_the_cli(fast, prompt):
    out = subprocess.run(
        [str(cli()), "run", "-m", str(MODEL), "-p", prompt, "-n", "24", "--temp", "0",
         "-t", "1", "--no-echo"],
        capture_output=True, check=True, timeout=120)
    cli_text = out.stdout.decode("utf-8")
    assert cli_text.endswith("\n")
    assert fast.generate(prompt, max_tokens=24, temperature=0) == cli_text[:-1]


def test_gpu_greedy_text_equals_the_cpu(fast):
    # CI runs this on Mesa's software Vulkan driver (lavapipe).
    gpu = Model(MODEL, n_threads=1, device="gpu", n_ctx=256)
    for prompt in ["Once upon a time", "def main():"]:
        assert gpu.generate(prompt, max_tokens=24, temperature=0) == \
            fast.generate(prompt, max_tokens=24, temperature=0)


def test_streaming_gives_the_same_text(fast):
    kw = dict(max_tokens=40, temperature=0.9, seed=7)
    whole = fast.generate("The quick brown fox", **kw)
    pieces = list(fast.generate("The quick brown fox", stream=True, **kw))
    assert len(pieces) > 1 and "".join(pieces) == whole
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    chat = fast.chat(msgs, max_tokens=20, temperature=0.9, seed=3)
    assert "".join(fast.chat(msgs, max_tokens=20, temperature=0.9, seed=3, stream=True)) == chat
    # Another seed gives another text.
    assert fast.generate("The quick brown fox", max_tokens=40, temperature=0.9, seed=8) != whole


def test_create_chat_completion_shapes(fast):
    msgs = [{"role": "user", "content": "Name three colors."}]
    r = fast.create_chat_completion(msgs, max_tokens=12, temperature=0.7, seed=5)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    choice = r["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    u = r["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens"] == len(fast._m.chat_tokens([("user", "Name three colors.")]))
    chunks = list(fast.create_chat_completion(msgs, max_tokens=12, temperature=0.7, seed=5,
                                              stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == u["completion_tokens"]


def test_tokenize_round_trip(fast):
    for text in ["Hello world", "Ünïcödé — 東京 🙂", "  spaces\tand\nlines"]:
        ids = fast.tokenize(text, add_bos=False)
        assert fast.detokenize(ids) == text
        assert fast.tokenize(text)[0] == 4000
    assert fast.tokenize(b"Hello") == fast.tokenize("Hello")
    assert 4009 in fast.tokenize("<|eot_id|>", special=True)
    assert 4009 not in fast.tokenize("<|eot_id|>")
    for name in PROMPTS[:1]:
        g = golden(name)
        text = (TINY / f"{name}.txt").read_text()
        assert fast.tokenize(text) == g["prompt_tokens"]


def test_stop_strings_and_early_close(fast):
    full = fast.generate("Once upon a time", max_tokens=40, temperature=0)
    stop = full[len(full) // 2:][:3]
    cut = fast.generate("Once upon a time", max_tokens=40, temperature=0, stop=stop)
    assert full.startswith(cut) and stop not in cut and len(cut) < len(full)
    s = fast.generate_stream("Once upon a time", max_tokens=200, temperature=0)
    next(s)
    s.close()
    rest = list(s)
    assert s.finish_reason == "cancelled" and len(rest) < 199


def test_generation_runs_beside_other_threads(fast):
    # Two threads generating on two models at once both finish with their own text.
    other = Model(MODEL, n_threads=1)
    out = {}

    def run(key, m):
        out[key] = m.generate("Once upon a time", max_tokens=30, temperature=0)

    threads = [threading.Thread(target=run, args=(k, m)) for k, m in (("a", fast), ("b", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out["a"] == out["b"] != ""


@pytest.mark.parametrize("kwargs, exc, word", [
    (dict(device="gpu", numerics="exact"), ValueError, "GPU backend does not run exact"),
    (dict(device="tpu"), ValueError, "device"),
    (dict(ram_budget=1 << 20), BitnetError, "too small"),
    (dict(ram_budget=1 << 30, in_memory=True), ValueError, "in-memory"),
    (dict(numerics="fastest"), ValueError, "numerics"),
    (dict(kv_cache="q2"), ValueError, "kv_cache"),
    (dict(lm_head="bf16"), ValueError, "lm_head"),
    (dict(n_threads=0), ValueError, "n_threads"),
    (dict(n_ctx=0), ValueError, "n_ctx"),
    (dict(numerics="exact", kv_cache="q8_0"), ValueError, "f16"),
    (dict(numerics="exact", kv_cache="q4_0"), ValueError, "f16"),
    (dict(screen_head=True, numerics="exact"), ValueError, "screened LM head"),
    (dict(screen_head=True, lm_head="q8_0"), ValueError, "screened LM head"),
])
def test_bad_model_arguments_raise(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        Model(MODEL, **kwargs)


def test_the_screened_head_generates_the_same_tokens(fast):
    m = Model(MODEL, n_threads=1, screen_head=True)
    for prompt in ["Once upon a time", "def main():"]:
        for kw in [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=3),
                   dict(temperature=0.9, top_k=0, seed=4)]:
            assert m.generate_tokens(prompt, max_tokens=24, **kw) == \
                fast.generate_tokens(prompt, max_tokens=24, **kw)
    # Every logit as before.
    ids = golden("p1_english")["prompt_tokens"]
    assert m.logits(ids).tobytes() == fast.logits(ids).tobytes()


def test_ram_budget_runs_the_low_memory_mode_with_the_same_logits(fast):
    m = Model(MODEL, n_threads=1, ram_budget=1 << 30, n_ctx=256)
    assert m.n_ctx == 256
    ids = golden("p1_english")["prompt_tokens"]
    assert m.logits(ids).tobytes() == fast.logits(ids).tobytes()
    greedy = dict(max_tokens=12, temperature=0)
    assert m.generate("Once upon a time", **greedy) == fast.generate("Once upon a time", **greedy)


def test_bad_files_raise(tmp_path):
    with pytest.raises(BitnetError, match="nonexistent"):
        Model(tmp_path / "nonexistent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(BitnetError):
        Model(junk)


def test_bad_call_arguments_raise(fast):
    with pytest.raises(ValueError, match="top_p"):
        fast.generate("hi", top_p=2.0)
    with pytest.raises(ValueError, match="max_tokens"):
        fast.generate("hi", max_tokens=0)
    with pytest.raises(TypeError, match="bogus"):
        fast.generate("hi", bogus=1)
    with pytest.raises(ValueError):
        fast.generate("hi", seed="x")
    with pytest.raises(ValueError, match="empty"):
        fast.logits([])
    with pytest.raises(ValueError, match="n_vocab"):
        fast.logits([1, 99999])
    with pytest.raises(ValueError):
        fast.detokenize([99999])
    with pytest.raises(ValueError, match="context"):
        fast.generate(list(range(600)))
    with pytest.raises(ValueError, match="role"):
        fast.chat([{"role": "function", "content": "x"}])
    with pytest.raises(ValueError, match="empty"):
        fast.chat([])
    with pytest.raises(ValueError):
        fast.chat(["hi"])
    with pytest.raises(ValueError, match="stop"):
        fast.generate("hi", stop=[1])
