"""Tool calls through the Python package's create_chat_completion, on the tiny golden model
(random weights): the reply is held to calls whose arguments validate against the tool's
schema (checked with the `jsonschema` package), streamed calls equal the whole reply's, a
follow-up with the tool's result completes, and bad tools are ValueErrors."""

import json
import pathlib

import jsonschema
import pytest

from bitnet_rs import Model

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = ROOT / "testdata" / "golden" / "tiny" / "bitnet-tiny-i2_s.gguf"

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather",
                                      "description": "The forecast of a city.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
SCHEMAS = {"get_weather": WEATHER,
           "get_time": {"type": "object", "properties": {}, "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model():
    assert MODEL.is_file(), f"golden model missing: {MODEL}"
    return Model(MODEL, n_threads=2, n_ctx=1024)


def streamed(chunks):
    calls, content, finish = {}, "", None
    for ch in chunks:
        c = ch["choices"][0]
        d = c["delta"]
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            e = calls.setdefault(tc["index"], {"name": None, "arguments": "", "id": None})
            if "id" in tc:
                e["id"] = tc["id"]
            if tc["function"].get("name"):
                e["name"] = tc["function"]["name"]
            e["arguments"] += tc["function"].get("arguments", "")
        finish = c["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("seed", range(8))
def test_required_calls_validate_and_stream_the_same(model, seed):
    choice = "required" if seed % 2 else {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, temperature=1.0,
              seed=seed, max_tokens=200)
    r = model.create_chat_completion(ASK, **kw)
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls", r
    m = c["message"]
    assert m["content"] is None, r
    assert len(m["tool_calls"]) == 1, r
    call = m["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    if seed % 2 == 0:
        assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        SCHEMAS[call["function"]["name"]])

    content, calls, finish = streamed(model.create_chat_completion(ASK, stream=True, **kw))
    assert content == "" and finish == "tool_calls"
    assert [(x["name"], x["arguments"]) for x in calls] == \
        [(call["function"]["name"], call["function"]["arguments"])]
    assert calls[0]["id"].startswith("call_")

    follow = model.create_chat_completion(
        ASK + [m, {"role": "tool", "tool_call_id": call["id"], "content": '{"temp": 21}'}],
        tools=TOOLS, temperature=1.0, seed=seed, max_tokens=12)
    assert follow["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    assert follow["usage"]["prompt_tokens"] > r["usage"]["prompt_tokens"]


def test_auto_gives_text_or_calls_and_none_gives_text(model):
    for seed in range(4):
        r = model.create_chat_completion(ASK, tools=TOOLS, temperature=1.0, seed=seed,
                                         max_tokens=24)
        m = r["choices"][0]["message"]
        if m.get("tool_calls"):
            assert not m["content"]
        else:
            assert not m["content"].startswith("<function="), m
        r = model.create_chat_completion(ASK, tools=TOOLS, tool_choice="none",
                                         temperature=1.0, seed=seed, max_tokens=8)
        assert "tool_calls" not in r["choices"][0]["message"]


def test_bad_tools_are_value_errors(model):
    bad = [
        dict(tools=[], tool_choice="required"),
        dict(tools=[{"type": "function", "function": {"name": "a b"}}]),
        dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
        dict(tools=TOOLS, tool_choice="sometimes"),
        dict(tool_choice="required"),
        dict(tools=[{"type": "function", "function": {"name": "f",
                                                      "parameters": {"type": "nope"}}}]),
        dict(tools=TOOLS, response_format={"type": "json_object"}),
        dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
            "minProperties": 3, "maxProperties": 1}}}], tool_choice="required"),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            model.create_chat_completion(ASK, max_tokens=4, **kw)
