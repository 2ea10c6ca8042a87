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
# The converter runs in the virtual environment of convert-env.sh.
#
# One known difference is recorded, not hidden: this converter writes each added token's text
# as tokenizer.decode(tokenizer.encode(text)), and LLaMA-3's tokenizer adds BOS when encoding,
# so every special token's text is written with "<|begin_of_text|>" in front (the bug that
# llama.cpp's converter fixed with add_special_tokens=False, PR 10883). The digest keeps the
# tokens as written and, beside them, the hash of the same list with that prefix taken off.
. "$(dirname "$0")/convert-env.sh"
"$bitnet" synth --hf packed --arch llama --preset tiny --seed 42 \
  --vocab "$root/testdata/golden/tokenizer/llama3-vocab.gguf" --quiet -o "$tmp/hf"
convert_and_quantize "$tmp/hf"
out=$root/testdata/golden/convert/llama-packed.json
mkdir -p "$(dirname "$out")"
python3 "$here/gguf_digest.py" "$tmp/i2_s.gguf" "$out" \
  "tokenizer.ggml.tokens=each added token's text is written with the BOS text in front (the converter encodes it with BOS, then decodes; llama.cpp's converter fixed this in PR 10883)=<|begin_of_text|>"
echo "wrote $out"
