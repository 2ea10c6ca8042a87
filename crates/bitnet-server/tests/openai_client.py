"""Drive a running bitnet server with the official `openai` client; print results as JSON.

Usage: python3 openai_client.py PORT API_KEY
The Rust test (openai_client.rs) starts the server, runs this and checks the output.
"""

import json
import sys

import openai

port, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(
    base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60
)
out = {"openai_version": openai.__version__}

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name three colors."},
]
PROMPT = "The quick brown fox"
COMMON = dict(model="tiny", max_tokens=24, temperature=0.9, seed=1234)


def usage(u):
    return None if u is None else {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


# Chat, whole.
r = client.chat.completions.create(messages=MESSAGES, **COMMON)
out["chat"] = {
    "text": r.choices[0].message.content,
    "role": r.choices[0].message.role,
    "finish": r.choices[0].finish_reason,
    "usage": usage(r.usage),
    "object": r.object,
}

# Chat, streamed, with usage.
text, finish, u, roles = "", None, None, []
for ch in client.chat.completions.create(
    messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **COMMON
):
    if ch.choices:
        d = ch.choices[0].delta
        if d.role:
            roles.append(d.role)
        text += d.content or ""
        finish = ch.choices[0].finish_reason or finish
    if ch.usage:
        u = usage(ch.usage)
out["chat_stream"] = {"text": text, "finish": finish, "usage": u, "roles": roles}

# Completion, whole and streamed.
r = client.completions.create(prompt=PROMPT, **COMMON)
out["completion"] = {
    "text": r.choices[0].text,
    "finish": r.choices[0].finish_reason,
    "usage": usage(r.usage),
}
text, finish, u = "", None, None
for ch in client.completions.create(
    prompt=PROMPT, stream=True, stream_options={"include_usage": True}, **COMMON
):
    if ch.choices:
        text += ch.choices[0].text
        finish = ch.choices[0].finish_reason or finish
    if ch.usage:
        u = usage(ch.usage)
out["completion_stream"] = {"text": text, "finish": finish, "usage": u}

# max_completion_tokens and a stop reason of "length".
r = client.chat.completions.create(
    model="tiny", messages=MESSAGES, max_completion_tokens=5, temperature=0
)
out["short"] = {"finish": r.choices[0].finish_reason, "usage": usage(r.usage)}

out["models"] = [m.id for m in client.models.list().data]

# Log-probabilities: sampling with every filter off, so the distribution drawn from is
# the softmax of the logits at temperature 0.7 (the Rust side checks the values).
LP = dict(model="tiny", max_tokens=8, temperature=0.7, top_p=1, seed=99,
          extra_body={"top_k": 0, "min_p": 0})


def entries(content):
    return [
        {"token": c.token, "logprob": c.logprob, "bytes": c.bytes,
         "top": [[t.bytes, t.logprob] for t in c.top_logprobs]}
        for c in content or []
    ]


r = client.chat.completions.create(messages=MESSAGES, logprobs=True, top_logprobs=3, **LP)
out["chat_logprobs"] = {"text": r.choices[0].message.content,
                        "entries": entries(r.choices[0].logprobs.content)}
got = []
for ch in client.chat.completions.create(
    messages=MESSAGES, logprobs=True, top_logprobs=3, stream=True, **LP
):
    if ch.choices and ch.choices[0].logprobs:
        got += entries(ch.choices[0].logprobs.content)
out["chat_logprobs_stream"] = got
r = client.completions.create(prompt=PROMPT, logprobs=2, **LP)
lp = r.choices[0].logprobs
out["completion_logprobs"] = {
    "text": r.choices[0].text, "tokens": lp.tokens, "token_logprobs": lp.token_logprobs,
    "top_logprobs": lp.top_logprobs, "text_offset": lp.text_offset,
}

# Structured output: the client's own parse() with a Pydantic model (it sends the model's
# JSON schema as response_format json_schema, strict, and parses the reply into the model).
from typing import Literal

import pydantic


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = pydantic.Field(ge=0, le=30)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    pets: list[Pet] = pydantic.Field(max_length=2)
    married: bool


parsed = []
for seed in range(3):
    r = client.chat.completions.parse(
        model="tiny", messages=MESSAGES, response_format=Person, temperature=1.0, seed=seed,
        max_tokens=200,
    )
    m = r.choices[0].message
    parsed.append({
        "finish": r.choices[0].finish_reason,
        "content": m.content,
        "parsed": m.parsed.model_dump() if m.parsed is not None else None,
        "is_person": isinstance(m.parsed, Person),
    })
out["parse"] = parsed
try:
    client.chat.completions.create(
        model="tiny", messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
    )
except openai.BadRequestError as e:
    errors_rf = [e.status_code, e.body.get("param") if isinstance(e.body, dict) else None]
else:
    errors_rf = None

# Tool calls: the reply is held to calls whose arguments match the tool's schema; the same
# seed streamed gives the same calls, assembled from delta.tool_calls fragments.
import jsonschema

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
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather forecast of a city.",
        "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now."}},
]
SCHEMAS = {"get_weather": WEATHER,
           "get_time": {"type": "object", "properties": {}, "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(calls):
    """Each call's name is a tool's and its arguments validate against its schema."""
    for c in calls:
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
    return True


tools_out = []
for seed, choice in [(1, "required"), (2, "required"),
                     (3, {"type": "function", "function": {"name": "get_weather"}})]:
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice=choice,
              parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=200)
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    calls = [{"id": c.id, "type": c.type, "name": c.function.name,
              "arguments": c.function.arguments} for c in (m.tool_calls or [])]
    streamed = {}
    finish_stream = None
    for ch in client.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            e = streamed.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                e["id"] = tc.id
            if tc.function and tc.function.name:
                e["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                e["arguments"] += tc.function.arguments
        if ch.choices[0].finish_reason:
            finish_stream = ch.choices[0].finish_reason
    # The follow-up: the calls and a result go back; the reply completes.
    follow = client.chat.completions.create(
        model="tiny", tools=TOOLS, temperature=1.0, seed=seed, max_tokens=16,
        messages=ASK + [m.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c["id"], "content": '{"temperature": 21}'}
            for c in calls],
    )
    tools_out.append({
        "finish": r.choices[0].finish_reason,
        "content": m.content,
        "calls": calls,
        "valid": check_calls(calls),
        "stream_finish": finish_stream,
        "stream_calls": [streamed[i] for i in sorted(streamed)],
        "follow_finish": follow.choices[0].finish_reason,
        "follow_prompt_tokens": follow.usage.prompt_tokens,
        "ask_prompt_tokens": r.usage.prompt_tokens,
    })
out["tools"] = tools_out

# Errors surface as the client's typed exceptions.
errors = {}
try:
    client.chat.completions.create(model="tiny", messages=MESSAGES, n=2)
except openai.BadRequestError as e:
    errors["n"] = [e.status_code, e.body.get("param") if isinstance(e.body, dict) else None]
try:
    client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=5)
except openai.BadRequestError as e:
    errors["temperature"] = [e.status_code, e.body.get("param") if isinstance(e.body, dict) else None]
try:
    openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0
    ).models.list()
except openai.AuthenticationError as e:
    errors["auth"] = [e.status_code, None]
errors["response_format"] = errors_rf
try:
    client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
except openai.BadRequestError as e:
    errors["tool_choice"] = [e.status_code, e.body.get("param") if isinstance(e.body, dict) else None]
out["errors"] = errors

print(json.dumps(out))
