#!/usr/bin/env bash
# Remakes testdata/golden/convert/llama-packed.json: bitnet.cpp's own converter run on a
# synthetic packed LlamaForCausalLM checkpoint (Llama3-8B-1.58's format: U8 weights, four
# ternary values per byte, a weight_scale each; LLaMA-3's tokenizer), then its llama-quantize
# to I2_S, as its setup_env.py does:
#   convert-hf-to-gguf-bitnet.py DIR --outtype f32;  llama-quantize F32 I2_S I2_S 1
# The JSON is gguf_digest.py's digest of the result (every key, every tensor's SHA-256);
# bitnet-convert/tests/convert.rs converts the same checkpoint and compares.
#
#   REF=<the build folder of llama-tiny.sh> testdata/golden/make/convert-llama.sh
#
# The converter runs in a virtual environment under $REF with the versions bitnet.cpp's
# requirements pin where PyPI still serves them (transformers >=4.46.3,<5, numpy ~1.26.4,
# sentencepiece ~0.2.0, protobuf <5) and the current torch (its pinned ~2.2.1 comes from
# PyTorch's own index; torch only unpacks and divides here).
#
# One known difference is recorded, not hidden: this converter writes each added token's text
# as tokenizer.decode(tokenizer.encode(text)), and LLaMA-3's tokenizer adds BOS when encoding,
# so every special token's text is written with "<|begin_of_text|>" in front (the bug that
# llama.cpp's converter fixed with add_special_tokens=False, PR 10883). The digest keeps the
# tokens as written and, beside them, the hash of the same list with that prefix taken off.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
REF=${REF:?set REF as for llama-tiny.sh}
src=$REF/bitnet.cpp
venv=$REF/convert-venv
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch 'transformers>=4.46.3,<5.0.0' 'numpy~=1.26.4' \
    'sentencepiece~=0.2.0' 'protobuf>=4.21.0,<5.0.0' safetensors
fi
bitnet=${BITNET:-$root/target/release/bitnet}
[[ -x $bitnet ]] || (cd "$root" && cargo build --release -p bitnet-cli)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bitnet" synth --hf packed --arch llama --preset tiny --seed 42 \
  --vocab "$root/testdata/golden/tokenizer/llama3-vocab.gguf" --quiet -o "$tmp/hf"
PYTHONPATH=$src/3rdparty/llama.cpp/gguf-py:$src/utils "$venv/bin/python" \
  "$src/utils/convert-hf-to-gguf-bitnet.py" "$tmp/hf" --outtype f32 --outfile "$tmp/f32.gguf" \
  >"$tmp/convert.log" 2>&1 || { tail -20 "$tmp/convert.log"; exit 1; }
"$src/build-avx2/bin/llama-quantize" "$tmp/f32.gguf" "$tmp/i2_s.gguf" I2_S 1 \
  >"$tmp/quantize.log" 2>&1 || { tail -20 "$tmp/quantize.log"; exit 1; }
out=$root/testdata/golden/convert/llama-packed.json
mkdir -p "$(dirname "$out")"
python3 "$here/gguf_digest.py" "$tmp/i2_s.gguf" "$out" \
  "tokenizer.ggml.tokens=each added token's text is written with the BOS text in front (the converter encodes it with BOS, then decodes; llama.cpp's converter fixed this in PR 10883)=<|begin_of_text|>"
echo "wrote $out"
