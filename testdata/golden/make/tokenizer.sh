#!/usr/bin/env bash
# Remakes testdata/golden/tokenizer/falcon3-cases.json, chat-formats.json, spm-vocab.gguf and
# spm-cases.json.
#
# falcon3-cases.json: every text of cases.json tokenized by
# bitnet.cpp's llama-tokenize (the build of llama-tiny.sh) with the LLaMA-3 vocabulary named
# `tokenizer.ggml.pre = falcon3` (set_pre.py): Falcon3's pre-tokenizer over LLaMA-3's merges;
# then two texts of backticks, digits and symbols, where Falcon3's split differs most.
# spm-vocab.gguf: a SentencePiece vocabulary (tokenizer model `llama`, as 1bitLLM's LLaMA-2
# vocabulary) derived from the tiny model's by spm_vocab.py (its docstring says how);
# spm-cases.json: the texts of falcon3-cases.json tokenized by llama-tokenize with it (BOS added,
# special-token text parsed), and three texts of spaces and specials.
# spm-default-bos.json: a text tokenized by llama-tokenize (no --no-bos) with spm-vocab.gguf less
# its tokenizer.ggml.add_bos_token key (drop_key.py): whether a SentencePiece vocabulary that does
# not say gets BOS.
#
# chat-formats.json: dump_chat.cpp, linked against the same build: llama_chat_apply_template's
# prompts for the `llama3` and `falcon3` formats, with and without the assistant's opening.
#   REF=<the build folder of llama-tiny.sh> testdata/golden/make/tokenizer.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tok=$here/../tokenizer
src=${REF:?set REF as for llama-tiny.sh}/bitnet.cpp
b=$src/build-avx2
bin=$b/bin/llama-tokenize
cmake --build "$b" -j "${JOBS:-2}" --target llama-tokenize >"$b.tokenize.log" 2>&1
ll=$src/3rdparty/llama.cpp
libs=$(dirname "$(find "$b" -name 'libllama.so' | head -1)")
gglibs=$(dirname "$(find "$b" -name 'libggml.so' | head -1)")
clang++ -O2 -std=c++17 "$here/dump_chat.cpp" -I"$ll/include" -I"$ll/ggml/include" \
  -L"$libs" -L"$gglibs" -lllama -lggml -Wl,-rpath,"$libs:$gglibs" -o "$b/dump_chat"
"$b/dump_chat" >"$tok/chat-formats.json"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$here/set_pre.py" "$tok/llama3-vocab.gguf" "$tmp/vocab.gguf" falcon3
python3 - "$bin" "$tmp" "$tok/cases.json" "$tok/falcon3-cases.json" <<'PY'
import json, subprocess, sys
bin_, tmp, src, dst = sys.argv[1:5]
out = []
extra = ["Run `make -j4` then ```rust\nlet x = 42;\n``` (v2.0.1-beta, 2024)",
         "$5+$10=$15 <a|b> ^~ 3.14159e-10 x^2 ~= 1,000,000"]
for case in json.load(open(src)) + [{"text": t} for t in extra]:
    path = f"{tmp}/text.txt"
    open(path, "w", encoding="utf-8", newline="").write(case["text"])
    r = subprocess.run([bin_, "-m", f"{tmp}/vocab.gguf", "-f", path, "--ids", "--no-bos",
                        "--log-disable"], capture_output=True, text=True, check=True)
    ids = json.loads(r.stdout.strip().splitlines()[-1]) if case["text"] else []
    out.append({"text": case["text"], "bitnetcpp_falcon3_ids": ids})
json.dump(out, open(dst, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
open(dst, "a").write("\n")
PY
tools=${TOOLS:-$here/../../../../shared/tools}
python3 "$here/spm_vocab.py" "$src/3rdparty/llama.cpp/gguf-py" "$tools" \
  "$here/../tiny/bitnet-tiny-i2_s.gguf" "$tok/spm-vocab.gguf"
python3 - "$bin" "$tmp" "$tok/falcon3-cases.json" "$tok/spm-vocab.gguf" "$tok/spm-cases.json" <<'PY'
import json, subprocess, sys
bin_, tmp, src, vocab, dst = sys.argv[1:6]
texts = [c["text"] for c in json.load(open(src))]
texts += ["  two leading spaces", "trailing  ", "<s>after a special</s> and\ttab", "x"]
out = []
for text in texts:
    path = f"{tmp}/text.txt"
    open(path, "w", encoding="utf-8", newline="").write(text)
    r = subprocess.run([bin_, "-m", vocab, "-f", path, "--ids", "--log-disable"],
                       capture_output=True, text=True, check=True)
    out.append({"text": text, "bitnetcpp_ids": json.loads(r.stdout.strip().splitlines()[-1])})
json.dump(out, open(dst, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
open(dst, "a").write("\n")
PY
python3 "$here/drop_key.py" "$tok/spm-vocab.gguf" "$tmp/nobos.gguf" tokenizer.ggml.add_bos_token
printf 'Hello world' >"$tmp/text.txt"
ids=$("$bin" -m "$tmp/nobos.gguf" -f "$tmp/text.txt" --ids --log-disable | tail -1)
printf '{"vocab": "spm-vocab.gguf without tokenizer.ggml.add_bos_token", "text": "Hello world", "bitnetcpp_ids": %s}\n' \
  "$ids" >"$tok/spm-default-bos.json"
echo "wrote $tok/falcon3-cases.json, chat-formats.json, spm-vocab.gguf, spm-cases.json and spm-default-bos.json"
