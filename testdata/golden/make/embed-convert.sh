#!/usr/bin/env bash
# Remakes testdata/golden/embed/{qwen3,gemma3}-converted.*: bitnet.cpp's own embedding converter
# (microsoft/BitNet utils/convert-bitnet-embedding-to-gguf.py, --outtype i2_s, run through
# embed_convert.py: the converter unchanged, its pre-tokenizer hash check answered for the
# synthetic vocabulary, and the two enum members its bundled gguf-py lacks) on tiny synthetic
# checkpoints of both shapes (embed_hf.py build: ternary projections times a scale, F16/F32
# norms, last-token pooling), and the oracle's vectors (embed_ref.py) for the prompts of ids
# embed_hf.py writes beside each checkpoint: NAME.embd.f32 (its default f32 variant) and
# NAME.exact.embd.f32 (--variant exact, bitnet.cpp's float paths). The tests run the converter's
# files as they are.
#
#   REF=<the build folder of llama-tiny.sh> MIRROR=<folder with microsoft+BitNet/repo> \
#     testdata/golden/make/embed-convert.sh
#
# The converter runs in the virtual environment of convert-env.sh. The synthetic vocabularies
# are small (a few hundred ids): the qwen3 file's EOS is the converter's hard-coded 151643,
# outside them, so the tests feed ids and load no tokenizer for it.
. "$(dirname "$0")/convert-env.sh"
MIRROR=${MIRROR:?set MIRROR to the folder holding microsoft+BitNet/repo}
conv=$tmp/convert-bitnet-embedding-to-gguf.py
git -C "$MIRROR/microsoft+BitNet/repo" show HEAD:utils/convert-bitnet-embedding-to-gguf.py >"$conv"
out=$root/testdata/golden/embed
mkdir -p "$out"
for a in qwen3 gemma3; do
  "$venv/bin/python" "$here/embed_hf.py" build "$tmp/hf-$a" --arch $a >/dev/null
  PYTHONPATH=$src/3rdparty/llama.cpp/gguf-py "$venv/bin/python" "$here/embed_convert.py" "$conv" \
    "$tmp/hf-$a" --outtype i2_s --outfile "$out/$a-converted.gguf" >"$tmp/convert.log" 2>&1 \
    || { tail -20 "$tmp/convert.log"; exit 1; }
  cp "$tmp/hf-$a/prompts.json" "$out/$a-converted.prompts.json"
  # The checkpoint itself, which `bitnet convert` must turn into the same file.
  rm -rf "$out/hf-$a"
  cp -r "$tmp/hf-$a" "$out/hf-$a"
  rm "$out/hf-$a/prompts.json"
  python3 "$here/embed_ref.py" batch "$out/$a-converted.gguf" "$out/$a-converted.prompts.json" \
    "$tmp/$a.out" >/dev/null
  for f in "$tmp/$a.out"/*.embd.f32; do
    cp "$f" "$out/$a-converted.$(basename "$f")"
  done
  python3 "$here/embed_ref.py" batch "$out/$a-converted.gguf" "$out/$a-converted.prompts.json" \
    "$tmp/$a.exact" --variant exact >/dev/null
  for f in "$tmp/$a.exact"/*.embd.f32; do
    cp "$f" "$out/$a-converted.$(basename "$f" .embd.f32).exact.embd.f32"
  done
done
echo "wrote $out"
