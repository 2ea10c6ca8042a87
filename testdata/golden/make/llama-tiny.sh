#!/usr/bin/env bash
# Remakes testdata/golden/llama-tiny, falcon3-tiny and 1bitllm-tiny with bitnet.cpp itself (see
# ../README.md, "llama-tiny/", "falcon3-tiny/" and "1bitllm-tiny/").
#
#   REF=<build folder outside the repository> MIRROR=<fetched repositories> \
#     testdata/golden/make/llama-tiny.sh
#
# 1-2. build-avx2.sh: bitnet.cpp 404980e with its llama.cpp fork (the release the tiny goldens
#    came from), built as its setup_env.py builds it for x86 AVX2 + FMA + F16C only, the build
#    the tiny goldens came from, with dump_logits.cpp linked against it.
# 3. `bitnet synth --arch llama --layout f32` writes each model as bitnet.cpp's converter
#    writes a Llama checkpoint with `--outtype f32` (projections β·{−1, 0, +1} in F32);
#    bitnet.cpp's llama-quantize turns it into I2_S as its setup_env.py does
#    (`llama-quantize F32 I2_S I2_S 1`: projections I2_S, embedding and LM head F16).
# 4. dump_logits writes each prompt's tokens and logits (1 thread, context 512, F16 KV cache).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
REF=${REF:?set REF to a folder outside every repository}
MIRROR=${MIRROR:?set MIRROR to the folder with the fetched repositories}
. "$here/build-avx2.sh"

bitnet=${BITNET:-$root/target/release/bitnet}
[[ -x $bitnet ]] || (cd "$root" && cargo build --release -p bitnet-cli)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# model NAME SYNTH-ARGS...: testdata/golden/NAME from `bitnet synth SYNTH-ARGS --layout f32`.
model() {
  local name=$1 out=$root/testdata/golden/$1
  shift
  "$bitnet" synth "$@" --layout f32 --quiet -o "$tmp/$name-f32.gguf"
  mkdir -p "$out"
  "$b/bin/llama-quantize" "$tmp/$name-f32.gguf" "$out/$name-i2_s.gguf" I2_S 1 \
    >"$tmp/quantize.log" 2>&1 || { cat "$tmp/quantize.log"; exit 1; }
  for p in p1_english p2_unicode p3_digits_punct p4_code_ws; do
    cp "$root/testdata/golden/tiny/$p.txt" "$out/$p.txt"
    "$b/dump_logits" "$out/$name-i2_s.gguf" "$out/$p.txt" "$out/$p" 32 1 2>"$tmp/$p.log" ||
      { tail -20 "$tmp/$p.log"; exit 1; }
  done
  echo "wrote $out"
}
model llama-tiny --arch llama --preset tiny --n-head 4 --n-head-kv 2 --n-ff 768
model falcon3-tiny --preset falcon3-1b --n-layer 2 --n-embd 256 --n-head 1 --n-head-kv 1 \
  --n-ff 768 --n-ctx 512
model 1bitllm-tiny --arch bitnet --preset tiny --n-head 4 --n-head-kv 4 --n-ff 768 \
  --vocab "$root/testdata/golden/tokenizer/spm-vocab.gguf"
