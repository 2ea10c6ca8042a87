"""BitNet b1.58 ternary language models, run by the bitnet-rs engine (pure Rust).

    from bitnet_rs import Model

    m = Model("ggml-model-i2_s.gguf")
    print(m.generate("The capital of France is", max_tokens=32))
    for piece in m.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="", flush=True)

Generation runs with the GIL released. A model holds one KV cache: calls on the same
model run one at a time, and a call whose prompt extends the previous one (a growing
chat) reuses what is cached.
"""

import json
import os
import time
import uuid

from typing import NamedTuple

from ._native import (BitnetError, NativeModel, Stream, ToolParser, peak_rss_bytes,
                      quantize_embedding as _quantize_embedding, tool_call_text, __version__)

__all__ = ["Model", "BitnetError", "QuantizedEmbedding", "quantize_embedding",
           "peak_rss_bytes", "__version__"]


class QuantizedEmbedding(NamedTuple):
    """An embedding at `bits` per value: `codes` (one int per value; 1 bit: 0 or 1, 1 where
    the value is above zero), `scale` (a value is about code * scale; 1 bit: +-scale) and
    `packed` (the codes `bits` at a time, two's complement, the first value in each byte's
    highest bits, as numpy's packbits)."""
    codes: list
    scale: float
    packed: bytes
    bits: int


def quantize_embedding(vector, bits):
    """`vector` (floats) quantized to `bits` = 8 or 4 (absmax), 2 (absmean ternary) or 1
    (the sign): a QuantizedEmbedding. ValueError for another width."""
    codes, scale, packed = _quantize_embedding([float(x) for x in vector], int(bits))
    return QuantizedEmbedding(codes, scale, packed, int(bits))

# llama.cpp's sampling defaults.
_DEFAULTS = dict(
    temperature=0.8,
    top_k=40,
    top_p=0.95,
    min_p=0.05,
    repeat_penalty=1.0,
    repeat_last_n=64,
    presence_penalty=0.0,
    frequency_penalty=0.0,
)


def _seed(seed):
    if seed is None:
        return int.from_bytes(os.urandom(8), "little")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed={seed!r}: must be an integer or None")
    # Negative seeds are seeds too: their 64-bit pattern.
    return seed & 0xFFFFFFFFFFFFFFFF


_CONSTRAINTS = {"json_schema", "json_object", "grammar", "regex"}


def _constraint(sampling):
    given = [k for k in ("json_schema", "json_object", "grammar", "regex")
             if sampling.get(k) not in (None, False)]
    if len(given) > 1:
        raise ValueError(f"give one of json_schema, json_object, grammar, regex, not {given}")
    if not given:
        return None
    k = given[0]
    v = sampling[k]
    if k == "json_schema":
        return ("json_schema", v if isinstance(v, str) else json.dumps(v))
    if k == "json_object":
        return ("json_object", "")
    if not isinstance(v, str):
        raise TypeError(f"{k} must be a string")
    return (k, v)


def _response_format(rf):
    if not isinstance(rf, dict):
        raise TypeError("response_format must be a dict")
    kind = rf.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": rf["schema"]} if rf.get("schema") is not None else {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or "schema" not in js:
            raise ValueError("response_format.json_schema must be a dict with a 'schema'")
        return {"json_schema": js["schema"]}
    raise ValueError(f"response_format type {kind!r}: expected text, json_object or json_schema")


def _stop_list(stop):
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    stop = list(stop)
    if not all(isinstance(s, str) for s in stop):
        raise ValueError("stop must be a string or a list of strings")
    return [s for s in stop if s]


def _messages(messages):
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # OpenAI's list of text parts
            parts = []
            for p in content:
                if isinstance(p, dict) and p.get("type") == "text":
                    parts.append(p.get("text", ""))
                elif isinstance(p, str):
                    parts.append(p)
                else:
                    raise ValueError(f"messages[{i}].content: only text parts are supported")
            content = "".join(parts)
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"messages[{i}] needs a string 'role' and 'content'")
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls:
            texts = []
            for j, c in enumerate(calls):
                f = c.get("function") if isinstance(c, dict) else None
                if not (isinstance(f, dict) and isinstance(f.get("name"), str)
                        and isinstance(f.get("arguments"), str)):
                    raise ValueError(f"messages[{i}].tool_calls[{j}] needs a function with "
                                     "a string 'name' and 'arguments'")
                texts.append(tool_call_text(f["name"], f["arguments"]))
            content = content + ("\n" if content else "") + "\n".join(texts)
        out.append((role, content))
    if not out:
        raise ValueError("messages is empty")
    return out


class Model:
    """A loaded GGUF model.

    Args:
        path: the GGUF file (for instance microsoft/bitnet-b1.58-2B-4T-gguf's
            ggml-model-i2_s.gguf).
        n_threads: threads (default: the physical cores).
        n_ctx: context positions (default: the training context, at most 4096).
        numerics: "fast" (default) or "exact" (bitnet.cpp's float paths, bit for bit).
        kv_cache: "f16" (default), "f32", "q8_0" or "q4_0".
        lm_head: "f16" (the file's own head, default), "q8_0", "q6_k", "q4_0" or "approx"
            (exact logits only for the best clusters of the vocabulary; see the README).
        device: "cpu" (default) or "auto"; "gpu" is refused (this build has no GPU
            backend).
        ram_budget: a RAM limit for the process, in bytes (the low-memory mode: weights
            streamed from the mapped file; the KV type and context, when not given, fitted
            to it). `n_ctx` then reports the context chosen.
        in_memory: read the file into RAM instead of memory-mapping it.
        screen_head: build a Q8_0 screen of the LM head at load, so that greedy and top-k
            generation (top_k at most 64, no penalty) computes only the logits that can
            decide each token: the same tokens, a faster decode where memory bounds it,
            about half the head's size in RAM (fast numerics, the file's head).

    Raises:
        ValueError: an option out of range or a combination that cannot run.
        BitnetError: the file cannot be opened or is not a model this engine runs.
    """

    def __init__(self, path, *, n_threads=None, n_ctx=None, numerics="fast",
                 kv_cache=None, lm_head="f16", device="cpu", ram_budget=None,
                 in_memory=False, screen_head=False):
        self.path = os.fspath(path)
        self._m = NativeModel(self.path, n_threads, n_ctx, numerics, kv_cache, lm_head,
                              device, ram_budget, in_memory, screen_head)

    @property
    def n_vocab(self):
        return self._m.n_vocab

    @property
    def n_ctx(self):
        return self._m.n_ctx

    # -- tokens ------------------------------------------------------------------
    def tokenize(self, text, add_bos=True, special=False):
        """Token ids of `text` (bytes are decoded as UTF-8)."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return self._m.tokenize(text, add_bos, special)

    def detokenize(self, ids):
        """The text of `ids` (invalid UTF-8 becomes U+FFFD)."""
        return self._m.detokenize(list(ids))

    def logits(self, ids, all=False):
        """Logits after `ids` as a NumPy float32 array: the last position (shape
        (n_vocab,)), or with all=True every position (shape (len(ids), n_vocab))."""
        return self._m.logits(list(ids), all)

    # -- embeddings --------------------------------------------------------------
    def embed(self, input, normalize=True, pooling=None, return_count=False, bits=None):
        """Embeddings, as llama-cpp-python's `Llama.embed`: for one text (or one list of
        token ids) a list of floats, for a list of them a list of lists. The vector is the
        file's pooling (last token for bitnet.cpp's embedding models; or `pooling`: "mean",
        "cls", "last", or "none" for one vector per position of a single input),
        L2-normalized unless `normalize=False`. `return_count=True` also returns the number
        of tokens read. `bits` (8, 4, 2 or 1) gives each vector as a QuantizedEmbedding
        (see `quantize_embedding`)."""
        if bits is not None and bits not in (8, 4, 2, 1):
            raise ValueError(f"bits={bits!r}: embedding quantization takes 8, 4, 2 or 1")
        single = isinstance(input, (str, bytes, bytearray)) or (
            isinstance(input, (list, tuple)) and len(input) > 0
            and all(isinstance(t, int) for t in input))
        items = [input] if single else list(input)
        items = [bytes(t).decode("utf-8") if isinstance(t, (bytes, bytearray)) else
                 (list(t) if isinstance(t, tuple) else t) for t in items]
        rows, count = self._m.embed(items, normalize, pooling)
        out = rows.tolist()
        if bits is not None:
            out = [quantize_embedding(v, bits) for v in out]
        if single and pooling != "none":
            out = out[0]
        return (out, count) if return_count else out

    def create_embedding(self, input, model=None):
        """The OpenAI embeddings response for `input` (a string or a list of strings or of
        token-id lists), as llama-cpp-python's `Llama.create_embedding` returns it."""
        single = isinstance(input, str) or (
            isinstance(input, (list, tuple)) and len(input) > 0
            and all(isinstance(t, int) for t in input))
        vecs, count = self.embed([input] if single else input, return_count=True)
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v}
                     for i, v in enumerate(vecs)],
            "model": model or os.path.basename(self.path),
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }

    # -- generation --------------------------------------------------------------
    def _start(self, prompt_ids, max_tokens, sampling, constraint=None):
        if constraint is None:
            constraint = _constraint(sampling)
        unknown = set(sampling) - set(_DEFAULTS) - {"seed", "stop"} - _CONSTRAINTS
        if unknown:
            raise TypeError(f"unknown sampling argument(s): {', '.join(sorted(unknown))}")
        p = dict(_DEFAULTS)
        p.update({k: v for k, v in sampling.items() if k in _DEFAULTS and v is not None})
        if max_tokens is None:
            max_tokens = self.n_ctx - len(prompt_ids)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens!r}: must be a positive integer")
        return self._m.start(
            list(prompt_ids), max_tokens, float(p["temperature"]), int(p["top_k"]),
            float(p["top_p"]), float(p["min_p"]), float(p["repeat_penalty"]),
            int(p["repeat_last_n"]), float(p["presence_penalty"]),
            float(p["frequency_penalty"]), _seed(sampling.get("seed")),
            _stop_list(sampling.get("stop")), constraint)

    def generate_stream(self, prompt, max_tokens=128, **sampling):
        """The raw stream: an iterator of text pieces whose `tokens`, `finish_reason` and
        `stats` are filled in once it is exhausted. `prompt` is text or token ids."""
        ids = prompt if isinstance(prompt, (list, tuple)) else self.tokenize(prompt)
        return self._start(ids, max_tokens, sampling)

    def generate(self, prompt, max_tokens=128, stream=False, **sampling):
        """Continue `prompt` (text after BOS, or a list of token ids).

        Sampling: temperature (0 = greedy), top_k, top_p, min_p, repeat_penalty,
        repeat_last_n, presence_penalty, frequency_penalty, seed (None: a fresh one),
        stop (strings that end the text, never included).

        Structured output (at most one): json_schema (a dict, or its JSON text): the text
        is JSON matching it; json_object=True: one JSON object; grammar (llguidance's Lark
        syntax, `start: ...`); regex: the whole text matches it. A schema or grammar that
        does not compile raises ValueError.

        Returns the text, or with stream=True an iterator of text pieces.
        """
        s = self.generate_stream(prompt, max_tokens, **sampling)
        return s if stream else "".join(s)

    def generate_tokens(self, prompt, max_tokens=128, **sampling):
        """The ids of the tokens sampled after `prompt` (the end-of-generation token
        included when it ends the reply)."""
        s = self.generate_stream(prompt, max_tokens, **sampling)
        for _ in s:
            pass
        return s.tokens

    def chat(self, messages, max_tokens=None, stream=False, **sampling):
        """Reply to `messages` ([{"role": "system"|"user"|"assistant", "content": ...}])
        in the model's chat format. Returns the reply, or with stream=True an iterator
        of pieces."""
        ids = self._m.chat_tokens(_messages(messages))
        s = self._start(ids, max_tokens, sampling)
        return s if stream else "".join(s)

    def create_chat_completion(self, messages, max_tokens=None, stream=False, model=None,
                               response_format=None, tools=None, tool_choice=None,
                               parallel_tool_calls=None, **sampling):
        """OpenAI's chat completion: a `chat.completion` dict, or with stream=True an
        iterator of `chat.completion.chunk` dicts (as llama-cpp-python returns).

        `response_format`: {"type": "json_object"} (llama-cpp-python's "schema" beside it
        makes it a schema) or OpenAI's {"type": "json_schema", "json_schema": {"schema": ...}}.

        `tools` ([{"type": "function", "function": {"name", "description", "parameters"}}]),
        `tool_choice` ("auto", "none", "required" or {"type": "function", "function":
        {"name": ...}}) and `parallel_tool_calls` as OpenAI defines them: the reply is text
        or calls whose arguments match the function's parameters, returned as
        `message.tool_calls` (streamed as `delta.tool_calls`) with finish_reason
        "tool_calls". Messages may carry an assistant's `tool_calls` and `tool` results.
        """
        if response_format is not None:
            sampling.update(_response_format(response_format))
        msgs = _messages(messages)
        parser = None
        constraint = None
        if tools is not None:
            ids, grammar = self._m.chat_tokens_tools(
                msgs, json.dumps(tools),
                None if tool_choice is None else json.dumps(tool_choice), parallel_tool_calls)
            if grammar is not None:
                if _constraint(sampling) is not None:
                    raise ValueError("tools cannot be combined with response_format, "
                                     "json_schema, json_object, grammar or regex "
                                     "(unless tool_choice is 'none')")
                # The engine builds the calls' grammar again from the tools themselves.
                constraint = ("tools", json.dumps({
                    "tools": tools, "tool_choice": tool_choice,
                    "parallel_tool_calls": parallel_tool_calls}))
                parser = ToolParser()
        elif tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice needs tools")
        else:
            ids = self._m.chat_tokens(msgs)
        s = self._start(ids, max_tokens, sampling, constraint)
        meta = {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "created": int(time.time()),
            "model": model or os.path.basename(self.path),
        }
        if stream:
            return self._chunks(s, meta, parser)
        text = "".join(s)
        message = {"role": "assistant", "content": text}
        finish = s.finish_reason
        if parser is not None:
            content, calls = _split(parser.push(text) + parser.finish())
            message["content"] = content if content or not calls else None
            if calls:
                message["tool_calls"] = calls
                if finish == "stop":
                    finish = "tool_calls"
        return {
            **meta,
            "object": "chat.completion",
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }],
            "usage": _usage(s),
        }

    @staticmethod
    def _chunks(s, meta, parser=None):
        def chunk(delta, finish):
            return {**meta, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}]}

        def deltas(events):
            for e in events:
                if e[0] == "content":
                    yield {"content": e[1]}
                elif e[0] == "call":
                    yield {"tool_calls": [{"index": e[1], "id": _call_id(), "type": "function",
                                           "function": {"name": e[2], "arguments": ""}}]}
                else:
                    yield {"tool_calls": [{"index": e[1], "function": {"arguments": e[2]}}]}

        yield chunk({"role": "assistant", "content": ""}, None)
        calls = False
        try:
            for piece in s:
                if parser is None:
                    yield chunk({"content": piece}, None)
                    continue
                for d in deltas(parser.push(piece)):
                    calls = calls or "tool_calls" in d
                    yield chunk(d, None)
            if parser is not None:
                for d in deltas(parser.finish()):
                    calls = calls or "tool_calls" in d
                    yield chunk(d, None)
        finally:
            s.close()
        finish = s.finish_reason
        if calls and finish == "stop":
            finish = "tool_calls"
        last = chunk({}, finish)
        last["usage"] = _usage(s)
        yield last


def _call_id():
    return "call_" + uuid.uuid4().hex[:24]


def _split(events):
    """A reply's parser events as its text and OpenAI tool_calls."""
    content, calls = [], []
    for e in events:
        if e[0] == "content":
            content.append(e[1])
        elif e[0] == "call":
            calls.append({"id": _call_id(), "type": "function",
                          "function": {"name": e[2], "arguments": ""}})
        else:
            calls[e[1]]["function"]["arguments"] += e[2]
    return "".join(content), calls


def _usage(s):
    prompt, cached, completion, _, _ = s.stats
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}
