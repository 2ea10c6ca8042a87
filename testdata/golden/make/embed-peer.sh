#!/usr/bin/env bash
# Makes the FP16 benchmark peer of the embedding benches: a plain Qwen3-0.6B-shaped embedding
# model (the FP16 "teacher" shape bitnet.cpp's embedding guide compares against) with random
# weights, as one GGUF that upstream llama.cpp (llama-embedding, llama-bench -embd 1) runs.
# For speed only: the weights are random, the vocabulary a small synthetic one.
#
#   REF=<folder with bitnet.cpp, convert-venv and llama.cpp> MIRROR=<folder with
#     microsoft+BitNet/repo> OUT=/tmp/bench-embed/qwen3-0.6b-f16.gguf \
#     testdata/golden/make/embed-peer.sh
#
# 1. embed_hf.py build --arch qwen3 --shape 0.6b --no-norm-in --vocab-size 151936 --dtype f16:
#    architecture qwen3, hidden 1024, 28 layers, 16 query / 8 KV heads of head_dim 128,
#    intermediate 3072, vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, tied embeddings,
#    last-token pooling, and none of the per-projection BitLinear norms (*_norm_in), which
#    upstream llama.cpp's qwen3 graph does not know. Its ~380-id tokenizer fills the vocabulary
#    with the converter's [PAD{i}] ids except <|endoftext|> <|im_start|> <|im_end|> at Qwen's
#    151643..151645, so the converter's hard-coded EOS 151643 (appended to every input) exists.
# 2. bitnet.cpp's embedding converter (utils/convert-bitnet-embedding-to-gguf.py, through
#    embed_convert.py) with --outtype f32, then upstream llama.cpp's llama-quantize to F16:
#    2-D weights and token_embd F16, norms F32, the values of the f16 checkpoint exactly. Not the
#    converter's own --outtype f16: that writes the norms F16 too, and ggml's CPU backend has no
#    F32 x F16 multiply (binary_op: "unsupported types: dst: f32, src0: f32, src1: f16"), so
#    llama.cpp aborts on the first RMSNorm.
# llama-quantize comes from upstream llama.cpp ($REF/llama.cpp/build/bin, made by
# ../../../../shared/tools/build_refs.sh llama; LLAMA_BIN overrides): bitnet.cpp's own does not
# know the qwen3 architecture. Needs about 3.7 GB under TMPDIR and 4 GB of memory.
. "$(dirname "$0")/convert-env.sh"
MIRROR=${MIRROR:?set MIRROR to the folder holding microsoft+BitNet/repo}
OUT=${OUT:?set OUT to the GGUF file to write}
lbin=${LLAMA_BIN:-$REF/llama.cpp/build/bin}
[[ -x $lbin/llama-quantize ]] || {
  echo "no $lbin/llama-quantize: build upstream llama.cpp (shared/tools/build_refs.sh llama) or set LLAMA_BIN" >&2
  exit 1
}
conv=$tmp/convert-bitnet-embedding-to-gguf.py
git -C "$MIRROR/microsoft+BitNet/repo" show HEAD:utils/convert-bitnet-embedding-to-gguf.py >"$conv"
hf=$tmp/qwen3-0.6b-plain              # the converter names the model (general.name) after it
"$venv/bin/python" "$here/embed_hf.py" build "$hf" --arch qwen3 --shape 0.6b --no-norm-in \
  --vocab-size 151936 --dtype f16 >"$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log"; exit 1; }
head -1 "$tmp/build.log"
PYTHONPATH=$src/3rdparty/llama.cpp/gguf-py "$venv/bin/python" "$here/embed_convert.py" "$conv" \
  "$hf" --outtype f32 --outfile "$tmp/f32.gguf" >"$tmp/convert.log" 2>&1 \
  || { tail -20 "$tmp/convert.log"; exit 1; }
rm -rf "$hf"
mkdir -p "$(dirname "$OUT")"
"$lbin/llama-quantize" "$tmp/f32.gguf" "$OUT" F16 1 >"$tmp/quantize.log" 2>&1 \
  || { tail -20 "$tmp/quantize.log"; exit 1; }
grep -E 'model size|quant size' "$tmp/quantize.log" | sed 's/^.*: *//'
echo "wrote $OUT ($(stat -c %s "$OUT") bytes, sha256 $(sha256sum "$OUT" | cut -d' ' -f1))"
