"""Structured output through the Python package: 200 completions over 20 JSON schemas at
temperature 1.0, each seed different, on the tiny golden model (random weights: unconstrained,
it writes no JSON at all); every output must validate with the `jsonschema` package. Also
json_object, grammars, regular expressions, and the errors of bad ones."""

import json
import pathlib

import jsonschema
import pytest

from bitnet_rs import Model

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = ROOT / "testdata" / "golden" / "tiny" / "bitnet-tiny-i2_s.gguf"

S = {"type": "string", "maxLength": 8}

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0,
     "maximum": 150}}, "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
     "minItems": 2, "maxItems": 4},
    {"enum": ["red", "green", "blue"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green"]},
     "shade": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["color", "shade"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "boolean"}},
        "required": ["x", "y"], "additionalProperties": False}},
     "required": ["inner"], "additionalProperties": False},
    {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
    {"anyOf": [{"type": "integer", "minimum": 10, "maximum": 99}, {"type": "boolean"}]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 1000},
     "note": S}, "required": ["id"], "additionalProperties": False},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "integer", "minimum": -1000, "maximum": 1000},
    {"type": "object", "properties": {"point": {"type": "array", "prefixItems": [
        {"type": "integer", "minimum": 0, "maximum": 9},
        {"type": "integer", "minimum": 0, "maximum": 9}], "items": False}},
     "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "circle"},
     "r": {"type": "integer", "minimum": 1, "maximum": 100}},
     "required": ["kind", "r"], "additionalProperties": False},
    {"oneOf": [
        {"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"],
         "additionalProperties": False},
        {"type": "object", "properties": {"t": {"const": "b"}, "n": {"type": "integer",
         "minimum": 0, "maximum": 3}}, "required": ["t", "n"], "additionalProperties": False}]},
    {"type": "array", "items": {"type": "object", "properties": {"k": S, "v": {
        "type": "integer", "minimum": 0, "maximum": 9}}, "required": ["k", "v"],
        "additionalProperties": False}, "maxItems": 3},
    {"type": "object", "properties": {"email": {"type": "string",
     "pattern": "^[a-z]{1,6}@[a-z]{1,6}\\.com$"}}, "required": ["email"],
     "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 5},
     "b": {"type": "integer", "minimum": 0, "maximum": 5}},
     "required": ["a"], "additionalProperties": False},
    {"$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0,
     "maximum": 9}}, "required": ["v"], "additionalProperties": False}},
     "type": "object", "properties": {"left": {"$ref": "#/$defs/leaf"},
     "right": {"$ref": "#/$defs/leaf"}}, "required": ["left", "right"],
     "additionalProperties": False},
]


@pytest.fixture(scope="module")
def model():
    return Model(MODEL, n_threads=1)


def test_twenty_schemas_two_hundred_completions_all_validate(model):
    assert len(SCHEMAS) == 20
    done = 0
    for i, schema in enumerate(SCHEMAS):
        jsonschema.Draft202012Validator.check_schema(schema)
        for seed in range(10):
            text = model.generate("Answer in JSON:", max_tokens=300, temperature=1.0,
                                  seed=1000 * i + seed, json_schema=schema)
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                pytest.fail(f"schema {i}, seed {seed}: not JSON ({e}): {text!r}")
            jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
            done += 1
    assert done == 200


def test_unconstrained_output_is_not_json(model):
    text = model.generate("Answer in JSON:", max_tokens=40, temperature=1.0, seed=1)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_json_object_grammar_regex_and_chat(model):
    text = model.generate("x", max_tokens=400, temperature=1.0, seed=3, json_object=True)
    assert text.startswith("{")
    text = model.generate("x", max_tokens=20, temperature=1.0, seed=3,
                          grammar='start: "yes" | "no"')
    assert text in ("yes", "no")
    text = model.generate("x", max_tokens=20, temperature=1.0, seed=3, regex="[0-9]{4}")
    assert len(text) == 4 and text.isdigit()
    schema = SCHEMAS[1]
    reply = model.chat([{"role": "user", "content": "Who?"}], max_tokens=200, seed=5,
                       temperature=1.0, json_schema=json.dumps(schema))
    jsonschema.validate(json.loads(reply), schema)
    for rf in ({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
               {"type": "json_object", "schema": schema}):
        r = model.create_chat_completion([{"role": "user", "content": "Who?"}], max_tokens=200,
                                         seed=6, temperature=1.0, response_format=rf)
        jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)


@pytest.mark.parametrize("kwargs", [
    {"json_schema": {"type": "nope"}},
    {"json_schema": "{not json"},
    {"json_schema": {"type": "integer", "minimum": 3, "maximum": 1}},
    {"json_schema": {"type": "array", "uniqueItems": True}},  # a keyword llguidance lacks
    {"grammar": 'root ::= "a"'},
    {"grammar": "start: missing"},
    {"grammar": "start: A\nA: ~/[a-z]+/"},  # negated terminals: unbounded to compile
    {"regex": "(open"},
    {"json_object": True, "regex": "a"},
])
def test_bad_constraints_raise_value_error(model, kwargs):
    with pytest.raises(ValueError):
        model.generate("x", max_tokens=4, **kwargs)
