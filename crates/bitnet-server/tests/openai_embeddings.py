"""Drive a running bitnet server's /v1/embeddings with the official `openai` client; print JSON.

Usage: python3 openai_embeddings.py PORT
The Rust test (embeddings.rs) starts the server, runs this and checks the output.
"""

import json
import sys

import openai

port = sys.argv[1]
client = openai.OpenAI(
    base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60
)
TEXTS = ["query: What is BitNet?", "Paris", "Grüße aus Köln"]
out = {"openai_version": openai.__version__}
# The client asks for base64 unless told otherwise, and decodes it.
r = client.embeddings.create(model="tiny", input=TEXTS)
out["default"] = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
out["usage"] = r.usage.prompt_tokens
r = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
out["float"] = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
r = client.embeddings.create(model="tiny", input=TEXTS[0], dimensions=32)
out["dimensions"] = len(r.data[0].embedding)
try:
    client.embeddings.create(model="tiny", input=[])
except openai.BadRequestError as e:
    out["error"] = [e.status_code, e.body.get("param") if isinstance(e.body, dict) else None]
print(json.dumps(out))
