#!/usr/bin/env bash
# Remakes testdata/golden/embed/: the vectors of two synthetic embedding models shaped as
# bitnet.cpp's converter (utils/convert-bitnet-embedding-to-gguf.py) writes bitnet-embedding-0.6b
# (`qwen3`) and -270m (`gemma3`), computed by the numpy oracle make/embed_ref.py. bitnet.cpp
# runs those models on a llama.cpp fork that cannot be fetched, so the oracle is written from
# its guide and converter (see its header) and shares no code with the engine.
#
#   BITNET=target/release/bitnet testdata/golden/make/embed.sh
#
# For each model: `bitnet synth` writes the file (the arguments and the file's SHA-256 go into
# MODEL.json, so a test notices a changed generator), `bitnet tokenize` turns each prompt
# into the ids the oracle and the tests feed (EOS appended where the file asks, as the engine
# does; the ids are inputs, not checked), and embed_ref.py writes MODEL.NAME.embd.f32 (the
# L2-normalized vector, little-endian f32) for each, and with --variant exact (bitnet.cpp's float
# paths: its kernels' roundings and accumulation orders) MODEL.NAME.exact.embd.f32.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
bitnet=${BITNET:-$root/target/release/bitnet}
[[ -x $bitnet ]] || (cd "$root" && cargo build --release -p bitnet-cli)
out=$root/testdata/golden/embed
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A args=(
  [qwen3-tiny]="--preset tiny --arch qwen3 --n-head 4 --n-head-kv 2 --head-dim 128 --seed 7"
  [gemma3-tiny]="--preset tiny --arch gemma3 --n-head 2 --n-head-kv 1 --head-dim 256 --seed 7"
)
for m in qwen3-tiny gemma3-tiny; do
  # shellcheck disable=SC2086
  "$bitnet" synth ${args[$m]} --quiet -o "$tmp/$m.gguf"
  BITNET="$bitnet" python3 - "$tmp/$m.gguf" "$m" "${args[$m]}" "$tmp/$m.prompts.json" \
    "$out/$m.json" <<'PY'
import hashlib, json, os, subprocess, sys
gguf, name, args, prompts_path, meta_path = sys.argv[1:]
texts = {
    "query": "query: What is BitNet?",
    "word": "Paris",
    "unicode": "Grüße aus Köln — 東京とソウル, ½ ≠ 0.5 ✓",
    "passage": (
        "BitNet b1.58 is a 1-bit large language model: every weight of its linear layers is "
        "-1, 0 or +1, and its activations are 8-bit integers. An embedding model built on it "
        "maps a text to one vector; texts with similar meanings get vectors that point the "
        "same way, which is what retrieval, clustering and semantic search compare. "
        "This passage is long enough to span several dozen tokens."
    ),
}
md = json.loads(subprocess.run([os.environ["BITNET"], "inspect", gguf, "--json"],
                               check=True, capture_output=True, text=True).stdout)
kv = {e["key"]: e["value"] for e in md["metadata"]}  # values as printed
add_eos = kv.get("tokenizer.ggml.add_eos_token") == "true"
eos = int(kv["tokenizer.ggml.eos_token_id"])
prompts = []
for key, text in texts.items():
    r = subprocess.run([os.environ["BITNET"], "tokenize", "-m", gguf, "--json", text],
                       check=True, capture_output=True, text=True)
    ids = json.loads(r.stdout)["ids"]
    if add_eos:
        ids.append(eos)
    prompts.append({"name": key, "text": text, "ids": ids})
json.dump(prompts, open(prompts_path, "w"))
sha = hashlib.sha256(open(gguf, "rb").read()).hexdigest()
json.dump({"synth_args": args, "file_sha256": sha, "prompts": prompts},
          open(meta_path, "w"), indent=1, ensure_ascii=False)
PY
  python3 "$here/embed_ref.py" batch "$tmp/$m.gguf" "$tmp/$m.prompts.json" "$tmp/$m.out"
  for f in "$tmp/$m.out"/*.embd.f32; do
    cp "$f" "$out/$m.$(basename "$f")"
  done
  python3 "$here/embed_ref.py" batch "$tmp/$m.gguf" "$tmp/$m.prompts.json" "$tmp/$m.exact" \
    --variant exact
  for f in "$tmp/$m.exact"/*.embd.f32; do
    cp "$f" "$out/$m.$(basename "$f" .embd.f32).exact.embd.f32"
  done
done
echo "wrote $out"
