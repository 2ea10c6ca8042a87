#!/usr/bin/env python3
"""Aggregate generation throughput of a running `bitnet serve` with K concurrent streams.

Usage: bench_client.py PORT STREAMS [MAX_TOKENS] [ROUNDS]

Each stream is a streaming /v1/completions request (greedy, distinct short prompt).
Reported: generated tokens / (last stream end - first token of the first stream), i.e.
decode throughput with prefill mostly excluded, plus the server's own /metrics gauge.
Standard library only.
"""

import http.client
import json
import sys
import threading
import time


def stream(port, i, max_tokens, out):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({
        "prompt": f"Stream {i}: once upon a time",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    first, tokens = None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("choices") and first is None:
            first = time.perf_counter()
        if v.get("usage"):
            tokens = v["usage"]["completion_tokens"]
    out[i] = (t0, first, time.perf_counter(), tokens)


def main():
    port, k = int(sys.argv[1]), int(sys.argv[2])
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    for rnd in range(rounds):
        out = {}
        ts = [threading.Thread(target=stream, args=(port, i + 100 * rnd, max_tokens, out))
              for i in range(k)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        first = min(v[1] for v in out.values())
        end = max(v[2] for v in out.values())
        total = sum(v[3] for v in out.values())
        per = [v[3] / (v[2] - v[1]) for v in out.values()]
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("GET", "/metrics")
        gauge = [l for l in c.getresponse().read().decode().splitlines()
                 if l.startswith("bitnet_generation_tokens_per_second ")]
        print(f"round {rnd}: {k} streams, {total} tokens in {end - first:.2f} s -> "
              f"aggregate {total / (end - first):.2f} tok/s; per stream "
              f"{min(per):.2f}..{max(per):.2f} tok/s; server gauge {gauge[0].split()[1]}")


if __name__ == "__main__":
    main()
