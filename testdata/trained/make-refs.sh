#!/usr/bin/env bash
# Remakes testdata/trained's GGUF and references with bitnet.cpp itself, from the checkpoint in
# testdata/trained/hf (see README.md):
#
#   REF=<build folder outside the repository> MIRROR=<fetched repositories> \
#     testdata/trained/make-refs.sh
#
# 1. ../golden/make/build-avx2.sh: bitnet.cpp 404980e with its llama.cpp fork, built as the
#    goldens' build (x86 AVX2 + FMA + F16C, clang), with dump_logits linked against it.
# 2. bitnet.cpp's converter for a BitNetForCausalLM checkpoint, run as its
#    utils/convert-helper-bitnet.py runs it: preprocess-huggingface-bitnet.py (ternarizes
#    model.safetensors), convert-ms-to-gguf-bitnet.py --vocab-type bpe --outtype f32
#    --concurrency 1, then llama-quantize F32 I2_S I2_S 1. The result is kjv-i2_s.gguf.
# 3. Ten prompts from the held-out text (refs/pNN.txt: the first ten held-out chapters, each cut
#    at the last space before its 100th byte).
# 4. dump_logits (1 thread, context 512): refs/pNN.tokens.json (the prompt's ids and 64 greedy
#    ids, no stop at EOS), refs/pNN.logits.f32 (the last prompt position) and, for p01 and p02,
#    refs/pNN.step_logits.f32 (the logits each greedy token was chosen from).
# 5. llama-cli, greedy (--temp 0 --top-k 1), 64 tokens, 1 thread: refs/pNN.cli.txt, the text
#    it prints after the prompt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
REF=${REF:?set REF to a folder outside every repository}
MIRROR=${MIRROR:?set MIRROR to the folder with the fetched repositories}
. "$root/testdata/golden/make/build-avx2.sh"
. "$root/testdata/golden/make/convert-venv.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 2. the converter, on a copy (the preprocessing step rewrites model.safetensors in place) in a
#    folder named as this one: the converter names the model after the checkpoint's parent folder
hf=$tmp/trained/hf
mkdir -p "$tmp/trained"
cp -r "$here/hf" "$hf"
mv "$hf/model.safetensors" "$hf/model.safetensors.backup"
py() { PYTHONPATH=$ll/gguf-py:$src/utils "$venv/bin/python" "$@"; }
py "$src/utils/preprocess-huggingface-bitnet.py" --input "$hf/model.safetensors.backup" \
  --output "$hf/model.safetensors" >"$tmp/preprocess.log" 2>&1 ||
  { tail -20 "$tmp/preprocess.log"; exit 1; }
rm "$hf/model.safetensors.backup"
py "$src/utils/convert-ms-to-gguf-bitnet.py" "$hf" --vocab-type bpe --outtype f32 \
  --concurrency 1 --outfile "$tmp/f32.gguf" >"$tmp/convert.log" 2>&1 ||
  { tail -20 "$tmp/convert.log"; exit 1; }
"$b/bin/llama-quantize" "$tmp/f32.gguf" "$here/kjv-i2_s.gguf" I2_S 1 >"$tmp/quantize.log" 2>&1 ||
  { tail -20 "$tmp/quantize.log"; exit 1; }

# 3-5. prompts and what bitnet.cpp makes of them
mkdir -p "$here/refs"
python3 - "$here/heldout.txt" "$here/refs" <<'PY'
import sys
# heldout.txt: each chapter is "Book N", a blank line, its verses, and a blank line before the
# next chapter, so splitting at blank lines alternates titles and verses
parts = open(sys.argv[1], encoding="utf-8").read().split("\n\n")
for i in range(10):
    chapter = parts[2 * i] + "\n\n" + parts[2 * i + 1]
    prompt = chapter[: chapter.rindex(" ", 0, 100)]
    with open(f"{sys.argv[2]}/p{i + 1:02d}.txt", "w", encoding="utf-8") as f:
        f.write(prompt)
PY
for i in $(seq -w 1 10); do
  p=$here/refs/p$i
  "$b/dump_logits" "$here/kjv-i2_s.gguf" "$p.txt" "$p" 64 1 2>"$tmp/dump.log" ||
    { tail -20 "$tmp/dump.log"; exit 1; }
  # every step's logits are kept for the first two prompts only (1 MiB each)
  rm "$p.all_logits.f32"
  [[ $i == 01 || $i == 02 ]] || rm "$p.step_logits.f32"
  "$b/bin/llama-cli" -m "$here/kjv-i2_s.gguf" -f "$p.txt" -n 64 --temp 0 --top-k 1 -t 1 -c 512 \
    -s 1 --no-warmup --no-display-prompt --simple-io </dev/null >"$p.cli.txt" 2>"$tmp/cli.log" ||
    { tail -20 "$tmp/cli.log"; exit 1; }
done
(cd "$here" && find . -type f ! -name SHA256SUMS ! -name '*.md' ! -name '*.py' ! -name '*.sh' | sort | xargs sha256sum > SHA256SUMS)
echo "wrote $here/kjv-i2_s.gguf and $here/refs"
