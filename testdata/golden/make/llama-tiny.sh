#!/usr/bin/env bash
# Remakes testdata/golden/llama-tiny, falcon3-tiny and 1bitllm-tiny with bitnet.cpp itself (see
# ../README.md, "llama-tiny/", "falcon3-tiny/" and "1bitllm-tiny/").
#
#   REF=<build folder outside the repository> MIRROR=<fetched repositories> \
#     testdata/golden/make/llama-tiny.sh
#
# 1. ../../shared/tools/build_refs.sh bitnet lays out bitnet.cpp 404980e with its llama.cpp
#    fork (the release the tiny goldens came from) under $REF/bitnet.cpp.
# 2. That tree is built again as bitnet.cpp's setup_env.py builds it (clang, BITNET_X86_TL2=ON)
#    for x86 AVX2 + FMA + F16C only (GGML_NATIVE off), the build the tiny goldens came from, as
#    shared libraries, and dump_logits.cpp is linked against it. The compiler matters: gcc
#    contracts `x * s + 0x1.8p23` in the activation quantizer's rounding into one FMA, which
#    rounds some ties differently (clang does not contract across statements).
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
tools=${TOOLS:-$root/../shared/tools}

REF=$REF MIRROR=$MIRROR "$tools/build_refs.sh" bitnet
src=$REF/bitnet.cpp
b=$src/build-avx2
command -v clang++ >/dev/null || { apt-get update -qq && apt-get install -y -qq clang >/dev/null; }
if [[ ! -f $b/CMakeCache.txt ]]; then
  cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DGGML_NATIVE=OFF -DGGML_AVX=ON \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DBITNET_X86_TL2=ON \
    -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=ON >"$b.configure.log" 2>&1
fi
cmake --build "$b" -j "${JOBS:-2}" --target llama llama-quantize >"$b.log" 2>&1
ll=$src/3rdparty/llama.cpp
libs=$(dirname "$(find "$b" -name 'libllama.so' | head -1)")
gglibs=$(dirname "$(find "$b" -name 'libggml.so' | head -1)")
clang++ -O2 -std=c++17 "$here/dump_logits.cpp" -I"$ll/include" -I"$ll/ggml/include" \
  -L"$libs" -L"$gglibs" -lllama -lggml -Wl,-rpath,"$libs:$gglibs" -o "$b/dump_logits"

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
