#!/usr/bin/env bash
# Remakes testdata/golden/embed/tokenize-cases.json: texts tokenized by upstream llama.cpp's
# llama_tokenize (0c1e570, built by ../shared/tools/build_refs.sh llama; dump_tokens.cpp is
# linked against its libllama and calls it as llama-embedding does) with the vocabularies of
# the two embedding files bitnet.cpp's converter wrote (qwen3-converted.gguf: GPT-2
# byte-level BPE, pre-tokenizer `qwen2`; gemma3-converted.gguf: SentencePiece, no space
# prefix, byte fallback).
# Each file is first copied without its tensors (vocab_only.py: only the vocabulary is loaded,
# and upstream has no I2_S type); the qwen3 copy gets eos_token_id 380
# (`<|endoftext|>`, what the converter's hard-coded 151643 names in Qwen3's own vocabulary),
# since 151643 lies outside this 383-token vocabulary. A third vocabulary, `llama3-qwen2`, is
# ../tokenizer/llama3-vocab.gguf named `tokenizer.ggml.pre = qwen2` (set_pre.py): Qwen 2/3's
# pre-tokenizer over LLaMA-3's 128,256 tokens and 280,147 merges, where the pieces merge far
# (its architecture named `llama` in the copy: upstream has no `bitnet-b1.58`).
# Per text and vocabulary: `plain` (add_special false: nothing added) and, for the two embedding
# files, `special` (add_special true, as llama-embedding tokenizes: gemma3 BOS, qwen3 EOS);
# special-token text parsed in both.
#   REF=<the build folder of build_refs.sh> testdata/golden/make/embed-tokenize.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
emb=$here/../embed
ll=${REF:?set REF to the build folder of build_refs.sh}/llama.cpp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
libs=$(dirname "$(find "$ll/build" -name 'libllama.so' | head -1)")
bin=$tmp/dump_tokens
g++ -O2 -std=c++17 "$here/dump_tokens.cpp" -I"$ll/include" -I"$ll/ggml/include" \
  -L"$libs" -lllama -lggml -Wl,-rpath,"$libs" -o "$bin"
python3 "$here/vocab_only.py" "$emb/qwen3-converted.gguf" "$tmp/qwen3.gguf" \
  tokenizer.ggml.eos_token_id=380
python3 "$here/vocab_only.py" "$emb/gemma3-converted.gguf" "$tmp/gemma3.gguf"
python3 "$here/vocab_only.py" "$here/../tokenizer/llama3-vocab.gguf" "$tmp/llama3.gguf" \
  --arch llama
python3 "$here/set_pre.py" "$tmp/llama3.gguf" "$tmp/llama3-qwen2.gguf" qwen2
python3 - "$bin" "$tmp" "$here/../tokenizer/falcon3-cases.json" "$emb/qwen3-tiny.json" \
  "$emb/tokenize-cases.json" <<'PY'
import json, subprocess, sys
bin_, tmp, cases, prompts, dst = sys.argv[1:6]
texts = [c["text"] for c in json.load(open(cases))]
texts += [p["text"] for p in json.load(open(prompts))["prompts"]]
texts += [
    "I'M SURE YOU'LL LIKE IT'S DONE, we'd've",
    "abc123def 4567 x1y22z333",
    "a\n\n b\r\n  c \n",
    "  \t  ",
    "<|endoftext|>query<|im_start|>user\nhi<|im_end|>",
    "<bos>text<eos> and <pad>",
    "ﬁne ﬂow Ⅻ ｆｕｌｌ　width",
    "x",
]
texts = [t for t in texts if t]
out = []
for text in texts:
    path = f"{tmp}/text.txt"
    open(path, "w", encoding="utf-8", newline="").write(text)
    row = {"text": text}
    for name in ("qwen3", "gemma3", "llama3-qwen2"):
        for mode, add in (("plain", "0"), ("special", "1")):
            if name == "llama3-qwen2" and mode == "special":
                continue
            r = subprocess.run([bin_, f"{tmp}/{name}.gguf", path, add],
                               capture_output=True, text=True, check=True)
            row[f"{name}_{mode}"] = json.loads(r.stdout)
    out.append(row)
json.dump(out, open(dst, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
open(dst, "a").write("\n")
PY
echo "wrote $emb/tokenize-cases.json"
