#!/usr/bin/env python3
"""A SentencePiece-style (llama.cpp `llama` tokenizer model) vocabulary-only GGUF, derived from
a byte-level BPE vocabulary:
  spm_vocab.py GGUF_PY_DIR SHARED_TOOLS_DIR BPE_VOCAB.gguf OUT.gguf
(bitnet.cpp's gguf-py writes the file; the shared tools' GGUF reader reads the source).

Ids: 0 <unk> (UNKNOWN), 1 <s>, 2 </s> (CONTROL), 3..258 <0x00>..<0xFF> (BYTE), then every
NORMAL token of the BPE vocabulary whose bytes are valid UTF-8 without control characters, with
spaces written as U+2581, in the BPE vocabulary's order, score = -(its position): earlier BPE
merges score higher, as SentencePiece's scores rank pieces. Pieces that appear twice are kept
once. The LLaMA-2 layout of 1bitLLM's checkpoints (add_bos, no add_eos, add_space_prefix).
"""
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
import bitnet_ref  # noqa: E402
import gguf  # noqa: E402

src, dst = sys.argv[3], sys.argv[4]
r = bitnet_ref.GGUF(src)
tokens = list(r.kv["tokenizer.ggml.tokens"])
types = [int(t) for t in r.kv["tokenizer.ggml.token_type"]]

# GPT-2's byte-level alphabet, inverted.
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
    list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
unbyte = {chr(c): b for b, c in zip(bs, cs)}

pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
ptypes = [2, 3, 3] + [6] * 256
scores = [0.0, 0.0, 0.0] + [0.0] * 256
seen = set(pieces)
for pos, (t, ty) in enumerate(zip(tokens, types)):
    if ty != 1:
        continue
    try:
        text = bytes(unbyte[c] for c in t).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        continue
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        continue
    piece = text.replace(" ", "\u2581")
    if piece in seen:
        continue
    seen.add(piece)
    pieces.append(piece)
    ptypes.append(1)
    scores.append(-float(pos))

w = gguf.GGUFWriter(dst, "llama")
w.add_tokenizer_model("llama")
w.add_token_list(pieces)
w.add_token_scores(scores)
w.add_token_types(ptypes)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)
w.add_add_bos_token(True)
w.add_add_eos_token(False)
w.add_add_space_prefix(True)
w.write_header_to_file()
w.write_kv_data_to_file()
w.close()
print(f"{dst}: {len(pieces)} pieces")
