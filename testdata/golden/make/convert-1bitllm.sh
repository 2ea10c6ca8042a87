#!/usr/bin/env bash
# Remakes testdata/golden/convert/1bitllm-f16.json: bitnet.cpp's own converter run on a
# synthetic 1bitLLM checkpoint (bitnet_b1_58's format: BitnetForCausalLM, f16 master weights
# that the converter ternarizes with its absmean rule, sub-norms `inner_attn_ln` and
# `ffn_layernorm`, a tied head, a SentencePiece tokenizer.model), then its llama-quantize to
# I2_S, as its setup_env.py does:
#   convert-hf-to-gguf-bitnet.py DIR --outtype f32;  llama-quantize F32 I2_S I2_S 1
# The JSON is gguf_digest.py's digest of the result (every key, every tensor's SHA-256);
# bitnet-convert/tests/convert.rs converts the same checkpoint and compares.
#
#   REF=<the build folder of llama-tiny.sh> testdata/golden/make/convert-1bitllm.sh
#
# The converter runs in the virtual environment of convert-env.sh; sentencepiece reads the
# tokenizer.model.
. "$(dirname "$0")/convert-env.sh"
"$bitnet" synth --hf f16 --arch bitnet --preset tiny --n-head 4 --n-head-kv 4 --n-ff 768 \
  --seed 42 --vocab "$root/testdata/golden/tokenizer/spm-vocab.gguf" --quiet -o "$tmp/hf"
convert_and_quantize "$tmp/hf"
out=$root/testdata/golden/convert/1bitllm-f16.json
mkdir -p "$(dirname "$out")"
python3 "$here/gguf_digest.py" "$tmp/i2_s.gguf" "$out"
echo "wrote $out"
# The fork's logits of that file for one prompt (dump_logits of llama-tiny.sh: 1 thread,
# context 512, F16 KV cache): the converted file must also run as bitnet.cpp runs it.
b=$src/build-avx2
[[ -x $b/dump_logits ]] || { echo "run llama-tiny.sh first (it builds dump_logits)"; exit 1; }
cp "$root/testdata/golden/tiny/p1_english.txt" "$tmp/p1_english.txt"
"$b/dump_logits" "$tmp/i2_s.gguf" "$tmp/p1_english.txt" "$tmp/p1_english" 32 1 \
  2>"$tmp/dump.log" || { tail -20 "$tmp/dump.log"; exit 1; }
stem=$root/testdata/golden/convert/1bitllm-f16.p1_english
cp "$tmp/p1_english.tokens.json" "$stem.tokens.json"
cp "$tmp/p1_english.logits.f32" "$stem.logits.f32"
echo "wrote $stem.tokens.json, $stem.logits.f32"
