#!/usr/bin/env bash
# Self-check of the embedding oracle embed_ref.py against bitnet.cpp's own converter and an
# independent Hugging Face-manner forward pass (embed_hf.py). Writes nothing in the repository.
#
#   REF=<the build folder of llama-tiny.sh> MIRROR=<folder with microsoft+BitNet/repo> \
#     testdata/golden/make/embed_selfcheck.sh [WORKDIR]      (default /tmp/embed-ref)
#
# Needs: the microsoft/BitNet mirror (the converter), bitnet.cpp's gguf-py, and a Python with
# torch, transformers, safetensors, tokenizers (the converter's); the oracle itself runs on any
# python3 with numpy.
#  1. embed_hf.py build: tiny qwen3 / gemma3_text checkpoints (ternary projections x scale)
#  2. embed_convert.py: the converter, --outtype i2_s and f32
#  3. decode-check, then vectors compared (cosine, max|d|):
#     hf --bitlinear none   vs oracle on f32  (--kv f32 --gelu exact)      name map, Gemma +1
#     hf --bitlinear weight vs oracle on i2_s (--no-act-quant, same)       I2_S codes and scale
#     oracle on i2_s        vs oracle on f32 --ternarize-float             must be identical
#     hf --bitlinear full   vs oracle on i2_s (defaults)                   the trained model
#     oracle on i2_s        vs oracle on f32 (defaults)                    f32 file = raw scales
#     oracle on i2_s        vs oracle on i2_s --no-act-quant               what int8 activations do
#     gemma3 with a 3-token sliding window: hf vs oracle (--swa 3)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-/tmp/embed-ref}
MIRROR=${MIRROR:?set MIRROR to the folder holding microsoft+BitNet/repo}
REF=${REF:?set REF as for llama-tiny.sh}
mirror=$MIRROR/microsoft+BitNet/repo
ggufpy=$REF/bitnet.cpp/3rdparty/llama.cpp/gguf-py
vpy=$REF/convert-venv/bin/python
mkdir -p "$work"
conv=$work/convert-bitnet-embedding-to-gguf.py
git -C "$mirror" show HEAD:utils/convert-bitnet-embedding-to-gguf.py > "$conv"
echo "converter: microsoft/BitNet $(git -C "$mirror" rev-parse HEAD)"
ref() { python3 "$here/embed_ref.py" "$@"; }
hf() { python3 "$here/embed_hf.py" "$@"; }
cmp() { ref compare "$work/out/$1/$2" "$work/out/$1/$3" | tail -1; }
for a in qwen3 gemma3; do
  rm -rf "$work/hf-$a" "$work/out/$a"
  "$vpy" "$here/embed_hf.py" build "$work/hf-$a" --arch $a | head -1
  for t in i2_s f32; do
    PYTHONPATH=$ggufpy "$vpy" "$here/embed_convert.py" "$conv" "$work/hf-$a" --outtype $t \
      --outfile "$work/$a-$t.gguf" > "$work/convert-$a-$t.log" 2>&1 \
      || { tail -20 "$work/convert-$a-$t.log"; exit 1; }
  done
  ls -l "$work/$a-i2_s.gguf" "$work/$a-f32.gguf" | awk '{print $5, $NF}'
  ref decode-check "$work/$a-i2_s.gguf" "$work/$a-f32.gguf" | tail -1
  P=$work/hf-$a/prompts.json
  o=$work/out/$a
  hf batch "$work/hf-$a" "$P" "$o/hf-none" --bitlinear none > /dev/null
  hf batch "$work/hf-$a" "$P" "$o/hf-weight" --bitlinear weight > /dev/null
  hf batch "$work/hf-$a" "$P" "$o/hf-full" --bitlinear full > /dev/null
  ref batch "$work/$a-f32.gguf" "$P" "$o/ref-f32-x" --kv f32 --gelu exact > /dev/null
  ref batch "$work/$a-i2_s.gguf" "$P" "$o/ref-i2s-noaq-x" --no-act-quant --kv f32 --gelu exact > /dev/null
  ref batch "$work/$a-i2_s.gguf" "$P" "$o/ref-i2s" > /dev/null
  ref batch "$work/$a-i2_s.gguf" "$P" "$o/ref-i2s-noaq" --no-act-quant > /dev/null
  ref batch "$work/$a-f32.gguf" "$P" "$o/ref-f32" > /dev/null
  ref batch "$work/$a-f32.gguf" "$P" "$o/ref-f32-tern" --ternarize-float > /dev/null
  cmp $a hf-none ref-f32-x
  cmp $a hf-weight ref-i2s-noaq-x
  cmp $a ref-i2s ref-f32-tern
  cmp $a hf-full ref-i2s
  cmp $a ref-i2s ref-f32
  cmp $a ref-i2s ref-i2s-noaq
done
a=gemma3
o=$work/out/$a
hf batch "$work/hf-$a" "$work/hf-$a/prompts.json" "$o/hf-none-swa3" --bitlinear none --swa 3 > /dev/null
ref batch "$work/$a-f32.gguf" "$work/hf-$a/prompts.json" "$o/ref-f32-x-swa3" --kv f32 --gelu exact --swa 3 > /dev/null
cmp $a hf-none-swa3 ref-f32-x-swa3
cmp $a ref-f32-x ref-f32-x-swa3
