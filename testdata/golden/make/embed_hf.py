#!/usr/bin/env python3
"""Tiny synthetic BitNet-Embeddings Hugging Face checkpoints, and a straight-from-safetensors numpy
forward pass "in the Hugging Face manner", to check embed_ref.py (the GGUF oracle) against.

  embed_hf.py build OUTDIR --arch qwen3|gemma3 [--seed N]
                [--shape tiny|0.6b] [--no-norm-in] [--vocab-size N] [--dtype f32|f16]
      (needs tokenizers, safetensors and transformers: the converter's virtual environment of convert-env.sh)
      writes config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json
      (+ vocab.json / merges.txt for qwen3), modules.json, 1_Pooling/config.json (last token)
      and prompts.json (a few id sequences, lengths 1..23).
      Without the four options the files are those of the tiny shapes below, unchanged. The
      options make benchmark peers (embed-peer.sh), e.g. a plain Qwen3-0.6B-shaped FP16 model:
        --shape 0.6b    qwen3 only: hidden 1024, 28 layers, 16 heads / 8 kv heads, head_dim 128,
                        intermediate 3072 (Qwen3-0.6B / Qwen3-Embedding-0.6B); implies
                        --vocab-size 151936 and --dtype f16 unless given
        --no-norm-in    leave out the per-projection BitLinear norms (*_proj.norm.weight, which
                        the converter names *_norm_in): a plain Qwen3/Gemma3 checkpoint whose
                        GGUF upstream llama.cpp loads
        --vocab-size N  config.json vocab_size (the embedding's rows; default: the tokenizer's
                        size); ids the small tokenizer lacks become the converter's [PAD{i}]. For
                        qwen3 with N > 151645 the specials <|endoftext|> <|im_start|> <|im_end|>
                        take Qwen's real ids 151643..151645 (in tokenizer.json's model vocabulary
                        too, since the tokenizers library renumbers added tokens otherwise), so the
                        converter's hard-coded EOS 151643 is <|endoftext|>
        --dtype f16     store the weights as float16 (same values, rounded; default f32)
  embed_hf.py forward HFDIR --ids 1,2,3 [--bitlinear none|weight|full] [--swa N] [--out F.f32]
  embed_hf.py batch HFDIR PROMPTS.json OUTDIR [--bitlinear ..] [--swa N]
      (numpy only, own safetensors reader)

Shapes (as the brief asks):
  qwen3:        hidden 128, 2 layers, 4 heads / 2 kv heads, head_dim 64, intermediate 256,
                rope_theta 1e6, rms_norm_eps 1e-6, SiLU, tensor names without "model."
  gemma3_text:  hidden 128, 2 layers, 2 heads / 1 kv head, head_dim 128, query_pre_attn_scalar 128,
                intermediate 256, rope_theta = rope_local_base_freq = 10000, rms_norm_eps 1e-6,
                sliding_window 512 (pattern 6: both layers "sliding"), gelu_pytorch_tanh, names
                with "model." (the converter strips it)
Weights (float32 storage, random, seeded):
  * projections: codes in {-1,0,+1} (a third each) times one random f32 scale per tensor. The
    converter's I2_S keeps the codes exactly, but stores beta = mean|w| = scale * (non-zero
    fraction), which is what HF BitLinear's weight_quant uses too; a float (f32/f16) GGUF keeps the
    raw scale. So "I2_S is lossless" holds for the codes and for BitLinear's effective weights.
  * embeddings, norm_in weights, Qwen3 norms: f16-representable values; Gemma3's own norms are
    multiples of 2^-10 so that 1+w is f16-representable. Hence the F16 tensors of the i2_s GGUF are
    lossless too, and an i2_s file must equal the f32 file run with --ternarize-float bit for bit.
Vocabularies (trained with the tokenizers library on a fixed corpus, deterministic):
  * qwen3: byte-level BPE with Qwen2's split regex and NFC, ~380 ids, added <|endoftext|>,
    <|im_start|>, <|im_end|> at the end (tokenizer_config: bos null, eos <|im_end|>, pad
    <|endoftext|>; config.json bos_token_id = <|endoftext|>, eos_token_id = <|im_end|>, as Qwen3).
    The converter hard-codes EOS 151643, which this small vocabulary does not have (a real-size
    vocabulary would need a 151,936 x 128 embedding, 78 MB as f32, to hold it).
  * gemma3: SentencePiece-style BPE: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, <0x00>..<0xFF>
    5..260, then pieces with U+2581 for spaces, byte fallback; add_bos_token true, add_eos false.

The HF-manner forward (f32 numpy, BLAS matmuls), after transformers' Qwen3 / Gemma3 modelling code
and the guide's BitLinear:
  BitLinear(x) = (act_quant(RMSNorm(x) * norm.weight)) @ weight_quant(W).T with
    weight_quant(W) = clip(round(W / mean|W|), -1, 1) * mean|W|    (scale = 1/mean|W|, q / scale)
    act_quant(x)   = clip(round(x * 127/max|x|), -128, 127) / (127/max|x|)   per token
  --bitlinear none: plain x @ W.T (no quantisation: what a float GGUF computes)
              weight: weight_quant only;  full: both (default, the trained model)
  Qwen3RMSNorm: w * x/sqrt(mean(x^2)+eps); Gemma3RMSNorm: (1 + w) * x/sqrt(mean(x^2)+eps);
  RoPE with rotate_half and inv_freq = 1/base^(2i/d) in f32; eager attention (softmax in f32),
  GQA via repeat_kv; Gemma3: embeddings * sqrt(hidden), post-attention / post-feedforward norms,
  scaling query_pre_attn_scalar^-0.5, sliding-window mask q - kv < window on sliding layers with
  rope_local_base_freq; last-token pooling, then x / max(||x||, 1e-12).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

F16, F32, F64 = np.float16, np.float32, np.float64

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "query: What is BitNet? BitNet is a family of ternary language models.",
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "Embeddings map a text to a vector; similar texts get similar vectors.",
    "Retrieval, clustering, classification and semantic similarity all use embeddings.",
    "Weights are ternary: minus one, zero or plus one, with one scale per tensor.",
    "Activations are quantized to eight bits per token with an absmax scale.",
    "In 2024 and 2025 the models were trained on 1000000 text pairs; 3.14 is pi.",
    "Hello world! Hello again, world. How are you? I'm fine, thanks; we've been well.",
    "Über naïve café résumé — ünïcödé text, and some more words for the tokenizer.",
    "She said: \"the last token is pooled\", and then the vector is normalised.",
] * 3


# ----------------------------------------------------------------------------------------------
# shapes
# ----------------------------------------------------------------------------------------------
SHAPES = {  # --shape: config.json entries over the tiny defaults of config_for
    "0.6b": {"qwen3": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                       "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072}},
}
SHAPE_VOCAB = {"0.6b": 151936}   # --shape's default --vocab-size
QWEN_SPECIAL_BASE = 151643       # <|endoftext|> in Qwen2/Qwen3 (the converter's hard-coded EOS)


def config_for(arch, vocab_size, special):
    if arch == "qwen3":
        return {"architectures": ["Qwen3Model"], "model_type": "qwen3", "hidden_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                "intermediate_size": 256, "hidden_act": "silu", "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                "vocab_size": vocab_size, "max_position_embeddings": 32768, "tie_word_embeddings": True,
                "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
                "bos_token_id": special["<|endoftext|>"], "eos_token_id": special["<|im_end|>"],
                "torch_dtype": "float32"}
    return {"architectures": ["Gemma3TextModel"], "model_type": "gemma3_text", "hidden_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
            "query_pre_attn_scalar": 128, "intermediate_size": 256, "hidden_activation": "gelu_pytorch_tanh",
            "rope_theta": 10000.0, "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-6,
            "sliding_window": 512, "sliding_window_pattern": 6,
            "layer_types": ["sliding_attention", "sliding_attention"],
            "vocab_size": vocab_size, "max_position_embeddings": 32768, "tie_word_embeddings": True,
            "attention_bias": False, "attn_logit_softcapping": None, "final_logit_softcapping": None,
            "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "float32"}


def make_weights(cfg, rng, norm_in=True):
    gemma = cfg["model_type"] == "gemma3_text"
    E, L, H, Hkv, D, FF = (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                           cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"])
    V = cfg["vocab_size"]

    def f16r(x):
        return np.asarray(x, F32).astype(F16).astype(F32)

    def tern(out, inn):
        codes = rng.integers(-1, 2, size=(out, inn)).astype(F32)
        scale = F32(rng.uniform(0.02, 0.06))
        return (codes * scale).astype(F32)

    def std_norm(n):           # BitLinear / Qwen3 RMSNorm weight, around 1
        return f16r(1.0 + 0.1 * rng.standard_normal(n))

    def native_norm(n):        # Gemma3RMSNorm weight (offset from 1), 1 + w exact in f16
        return f16r(np.round(0.1 * rng.standard_normal(n) * 1024) / 1024) if gemma else std_norm(n)

    pfx = "model." if gemma else ""
    w = {pfx + "embed_tokens.weight": f16r(0.5 * rng.standard_normal((V, E)))}
    for i in range(L):
        p = f"{pfx}layers.{i}."
        w[p + "input_layernorm.weight"] = native_norm(E)
        w[p + "post_attention_layernorm.weight"] = native_norm(E)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = native_norm(E)
            w[p + "post_feedforward_layernorm.weight"] = native_norm(E)
        for name, (o, n) in {"q_proj": (H * D, E), "k_proj": (Hkv * D, E), "v_proj": (Hkv * D, E),
                             "o_proj": (E, H * D)}.items():
            w[p + f"self_attn.{name}.weight"] = tern(o, n)
            if norm_in:
                w[p + f"self_attn.{name}.norm.weight"] = std_norm(n)
        w[p + "self_attn.q_norm.weight"] = native_norm(D)
        w[p + "self_attn.k_norm.weight"] = native_norm(D)
        for name, (o, n) in {"gate_proj": (FF, E), "up_proj": (FF, E), "down_proj": (E, FF)}.items():
            w[p + f"mlp.{name}.weight"] = tern(o, n)
            if norm_in:
                w[p + f"mlp.{name}.norm.weight"] = std_norm(n)
    w[pfx + "norm.weight"] = native_norm(E)
    return w


# ----------------------------------------------------------------------------------------------
# tokenizers
# ----------------------------------------------------------------------------------------------
def build_qwen_tokenizer(outdir, special_base=None):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=380, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tok.train_from_iterator(CORPUS, trainer)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    j = json.loads(tok.to_str())
    if special_base is not None:
        # Qwen's ids for the specials. The tokenizers library gives an added token the id of the
        # same string in the model's vocabulary, else renumbers it after the vocabulary, so the
        # specials go into both (vocab.json keeps the trained pieces only, as Qwen's does)
        trained = dict(j["model"]["vocab"])
        for n, s in enumerate(specials):
            j["model"]["vocab"][s] = special_base + n
        for t in j["added_tokens"]:
            t["id"] = special_base + specials.index(t["content"])
        tok = Tokenizer.from_str(json.dumps(j))
        assert [tok.token_to_id(s) for s in specials] == [special_base + n for n in range(len(specials))]
        # written from the JSON: tok.save would warn about the id gap, listing every missing id
        with open(os.path.join(outdir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, indent=2, ensure_ascii=False)
        j["model"]["vocab"] = trained
    else:
        tok.save(os.path.join(outdir, "tokenizer.json"))
    json.dump({k: v for k, v in j["model"]["vocab"].items()}, open(os.path.join(outdir, "vocab.json"), "w"),
              ensure_ascii=False)
    with open(os.path.join(outdir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in j["model"]["merges"]:
            f.write((" ".join(m) if isinstance(m, list) else m) + "\n")
    ids = {s: tok.token_to_id(s) for s in specials}
    added = {str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for s in specials}
    json.dump({"tokenizer_class": "Qwen2Tokenizer", "add_prefix_space": False, "bos_token": None,
               "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
               "errors": "replace", "model_max_length": 32768, "clean_up_tokenization_spaces": False,
               "added_tokens_decoder": added},
              open(os.path.join(outdir, "tokenizer_config.json"), "w"), indent=1)
    return tok.get_vocab_size(), ids


def build_gemma_tokenizer(outdir):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    byte_toks = [f"<0x{i:02X}>" for i in range(256)]
    # train on Metaspace-split words (U+2581 starts each word after the first), then rebuild the
    # model so that the byte tokens are ordinary vocabulary entries (BYTE), not added tokens
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    alphabet = sorted(set("".join(CORPUS).replace(" ", "\u2581")))
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials + byte_toks, initial_alphabet=alphabet,
                                  show_progress=False, limit_alphabet=len(alphabet))
    t.train_from_iterator(CORPUS, trainer)
    j = json.loads(t.to_str())
    vocab = j["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in j["model"]["merges"]]
    assert [vocab[s] for s in specials] == [0, 1, 2, 3, 4] and vocab["<0x00>"] == 5 and vocab["<0xFF>"] == 260
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(os.path.join(outdir, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, s in enumerate(specials)}
    json.dump({"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
               "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
               "model_max_length": 32768, "spaces_between_special_tokens": False,
               "clean_up_tokenization_spaces": False, "added_tokens_decoder": added},
              open(os.path.join(outdir, "tokenizer_config.json"), "w"), indent=1)
    return tok.get_vocab_size(), {s: i for i, s in enumerate(specials)}


def build(outdir, arch, seed, shape="tiny", norm_in=True, vocab_size=None, dtype=None):
    from safetensors.numpy import save_file
    if shape != "tiny" and arch not in SHAPES[shape]:
        sys.exit(f"--shape {shape}: only for {', '.join(SHAPES[shape])}")
    if vocab_size is None:
        vocab_size = SHAPE_VOCAB.get(shape)
    if dtype is None:
        dtype = "f32" if shape == "tiny" else "f16"
    os.makedirs(os.path.join(outdir, "1_Pooling"), exist_ok=True)
    if arch == "qwen3":
        big = vocab_size is not None and vocab_size > QWEN_SPECIAL_BASE + 2
        V, special = build_qwen_tokenizer(outdir, QWEN_SPECIAL_BASE if big else None)
    else:
        V, special = build_gemma_tokenizer(outdir)
    # random prompt ids: the tokenizer's ids 0..V-1, or below the specials when they sit apart
    rand_hi = V if max(special.values()) < V else min(special.values())
    cfg = config_for(arch, V, special)
    if shape != "tiny":
        cfg.update(SHAPES[shape][arch])
    if vocab_size is not None:
        if vocab_size <= max(special.values()) or vocab_size < V:
            sys.exit(f"--vocab-size {vocab_size}: the tokenizer has {V} ids up to {max(special.values())}")
        cfg["vocab_size"] = vocab_size
    if dtype != "f32":
        cfg["torch_dtype"] = {"f16": "float16"}[dtype]
    json.dump(cfg, open(os.path.join(outdir, "config.json"), "w"), indent=1)
    w = make_weights(cfg, np.random.default_rng(seed), norm_in)
    if dtype != "f32":
        for k in list(w):
            w[k] = w[k].astype({"f16": F16}[dtype])
    save_file(w, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
    json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
              open(os.path.join(outdir, "modules.json"), "w"), indent=1)
    json.dump({"word_embedding_dimension": cfg["hidden_size"], "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
               "pooling_mode_lasttoken": True, "include_prompt": True},
              open(os.path.join(outdir, "1_Pooling", "config.json"), "w"), indent=1)
    # the converter needs this to work
    from transformers import AutoTokenizer
    tk = AutoTokenizer.from_pretrained(outdir)
    texts = ["query: What is BitNet?", "Hello world!", "The quick brown fox jumps over the lazy dog.",
             "Über naïve café", "3.14 is pi; 2025"]
    prompts = [{"name": "p_single", "ids": [int(tk("hello", add_special_tokens=False)["input_ids"][0])]}]
    for n, s in enumerate(texts):
        prompts.append({"name": f"p{n}", "ids": [int(i) for i in tk(s)["input_ids"]]})
    rng = np.random.default_rng(seed + 1)
    prompts.append({"name": "p_rand23", "ids": [int(i) for i in rng.integers(0, rand_hi, 23)]})
    json.dump(prompts, open(os.path.join(outdir, "prompts.json"), "w"), indent=1)
    print(f"{outdir}: {arch} vocab={V} specials={special} tokenizer={type(tk).__name__} "
          f"tensors={len(w)} params={sum(x.size for x in w.values())}")
    for p in prompts:
        print(f"  {p['name']}: {p['ids']}")


# ----------------------------------------------------------------------------------------------
# numpy forward, Hugging Face manner
# ----------------------------------------------------------------------------------------------
def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack_from("<Q", b, 0)[0]
    hdr = json.loads(b[8:8 + n])
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        a, e = info["data_offsets"]
        raw = b[8 + n + a: 8 + n + e]
        if info["dtype"] == "F32":
            x = np.frombuffer(raw, dtype="<f4")
        elif info["dtype"] == "BF16":
            x = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(F32)
        elif info["dtype"] == "F16":
            x = np.frombuffer(raw, dtype="<f2").astype(F32)
        else:
            raise ValueError(f"{name}: dtype {info['dtype']}")
        name = name[len("model."):] if name.startswith("model.") else name
        out[name] = x.astype(F32).reshape(info["shape"])
    return out


class HFModel:
    def __init__(self, d, bitlinear="full", swa=None):
        self.cfg = cfg = json.load(open(os.path.join(d, "config.json")))
        self.w = read_safetensors(os.path.join(d, "model.safetensors"))
        self.gemma = cfg["model_type"] == "gemma3_text"
        assert self.gemma or cfg["model_type"] == "qwen3"
        self.mode = bitlinear
        self.E, self.L = cfg["hidden_size"], cfg["num_hidden_layers"]
        self.H, self.Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.D = cfg.get("head_dim", self.E // self.H)
        self.eps = cfg["rms_norm_eps"]
        self.window = cfg.get("sliding_window") if swa is None else swa
        if self.gemma:
            pat = cfg.get("sliding_window_pattern", 6)
            self.layer_types = cfg.get("layer_types") or [
                "sliding_attention" if (i + 1) % pat else "full_attention" for i in range(self.L)]
            self.scaling = F32(cfg["query_pre_attn_scalar"] ** -0.5)
        else:
            self.layer_types = ["full_attention"] * self.L
            self.scaling = F32(self.D ** -0.5)

    def rms(self, x, w, gemma_style):
        x = x.astype(F32)
        var = np.mean((x * x).astype(F32), axis=-1, keepdims=True, dtype=F32)
        y = (x * (F32(1) / np.sqrt(var + F32(self.eps))).astype(F32)).astype(F32)
        return (y * ((F32(1) + w) if gemma_style else w)).astype(F32)

    def bitlinear(self, x, key):
        if key + ".norm.weight" in self.w:                         # absent: build --no-norm-in
            x = self.rms(x, self.w[key + ".norm.weight"], False)  # BitLinear's own (standard) RMSNorm
        W = self.w[key + ".weight"]
        if self.mode in ("weight", "full"):
            s = F32(1) / max(F32(np.mean(np.abs(W), dtype=F32)), F32(1e-5))
            W = (np.clip(np.round(W * s), -1, 1) / s).astype(F32)
        if self.mode == "full":
            s = (F32(127) / np.maximum(np.max(np.abs(x), axis=-1, keepdims=True), F32(1e-5))).astype(F32)
            x = (np.clip(np.round(x * s), -128, 127) / s).astype(F32)
        return (x @ W.T).astype(F32)

    def rope(self, x, pos, base):
        d = x.shape[-1]
        inv_freq = (F32(1) / (F32(base) ** (np.arange(0, d, 2).astype(F32) / F32(d)))).astype(F32)
        freqs = (pos.astype(F32)[:, None] * inv_freq[None, :]).astype(F32)
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb).astype(F32)[:, None, :], np.sin(emb).astype(F32)[:, None, :]
        rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
        return (x * cos + rot * sin).astype(F32)

    def forward(self, ids):
        ids = np.asarray(ids)
        T = len(ids)
        x = self.w["embed_tokens.weight"][ids].astype(F32)
        if self.gemma:
            x = (x * F32(self.E ** 0.5)).astype(F32)
        pos = np.arange(T)
        g = self.gemma
        for i in range(self.L):
            p = f"layers.{i}."
            sliding = self.layer_types[i] == "sliding_attention"
            base = self.cfg.get("rope_local_base_freq", 10000.0) if (g and sliding) else self.cfg["rope_theta"]
            res = x
            h = self.rms(x, self.w[p + "input_layernorm.weight"], g)
            q = self.bitlinear(h, p + "self_attn.q_proj").reshape(T, self.H, self.D)
            k = self.bitlinear(h, p + "self_attn.k_proj").reshape(T, self.Hkv, self.D)
            v = self.bitlinear(h, p + "self_attn.v_proj").reshape(T, self.Hkv, self.D)
            q = self.rms(q, self.w[p + "self_attn.q_norm.weight"], g)
            k = self.rms(k, self.w[p + "self_attn.k_norm.weight"], g)
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            qi, kj = np.arange(T)[:, None], np.arange(T)[None, :]
            allowed = kj <= qi
            if g and sliding and self.window:
                allowed &= kj > qi - self.window
            mask = np.where(allowed, F32(0), np.finfo(F32).min).astype(F32)
            rep = self.H // self.Hkv
            att = np.empty((T, self.H, self.D), F32)
            for hh in range(self.H):
                s = ((q[:, hh] @ k[:, hh // rep].T) * self.scaling + mask).astype(F32)
                s = np.exp(s - s.max(axis=-1, keepdims=True)).astype(F32)
                pr = (s / s.sum(axis=-1, keepdims=True, dtype=F32)).astype(F32)
                att[:, hh] = pr @ v[:, hh // rep]
            o = self.bitlinear(att.reshape(T, self.H * self.D), p + "self_attn.o_proj")
            if g:
                o = self.rms(o, self.w[p + "post_attention_layernorm.weight"], True)
            x = (res + o).astype(F32)
            res = x
            h = self.rms(x, self.w[p + ("pre_feedforward_layernorm.weight" if g else "post_attention_layernorm.weight")], g)
            gt = self.bitlinear(h, p + "mlp.gate_proj")
            up = self.bitlinear(h, p + "mlp.up_proj")
            if g:   # gelu_pytorch_tanh
                a = (F32(0.5) * gt * (F32(1) + np.tanh(F32(np.sqrt(2 / np.pi)) * (gt + F32(0.044715) * gt ** 3)))).astype(F32)
            else:   # silu
                a = (gt / (F32(1) + np.exp(-gt))).astype(F32)
            f = self.bitlinear((a * up).astype(F32), p + "mlp.down_proj")
            if g:
                f = self.rms(f, self.w[p + "post_feedforward_layernorm.weight"], True)
            x = (res + f).astype(F32)
        return self.rms(x, self.w["norm.weight"], g)

    def embed(self, ids):
        v = self.forward(ids)[-1]                     # last-token pooling
        return (v / max(np.linalg.norm(v), F32(1e-12))).astype(F32)


def summary(name, ids, v):
    return (f"{name}: n_tokens={len(ids)} dim={v.shape[-1]} norm={float(np.linalg.norm(v.astype(F64))):.7f} "
            f"first8=[" + ", ".join(f"{x:.7f}" for x in v[:8]) + "]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("outdir")
    b.add_argument("--arch", choices=["qwen3", "gemma3"], required=True)
    b.add_argument("--seed", type=int, default=1234)
    b.add_argument("--shape", choices=["tiny"] + sorted(SHAPES), default="tiny")
    b.add_argument("--no-norm-in", dest="norm_in", action="store_false",
                   help="leave out the per-projection BitLinear norms (*_proj.norm.weight)")
    b.add_argument("--vocab-size", type=int, default=None, help="config.json vocab_size (embedding rows)")
    b.add_argument("--dtype", choices=["f32", "f16"], default=None,
                   help="safetensors storage (default f32; f16 with --shape 0.6b)")
    for name in ("forward", "batch"):
        p = sub.add_parser(name)
        p.add_argument("hfdir")
        if name == "forward":
            p.add_argument("--ids", required=True)
            p.add_argument("--out", default=None)
        else:
            p.add_argument("prompts")
            p.add_argument("outdir")
        p.add_argument("--bitlinear", choices=["none", "weight", "full"], default="full")
        p.add_argument("--swa", type=int, default=None, help="override the config's sliding_window (0 = off)")
    a = ap.parse_args()
    if a.cmd == "build":
        build(a.outdir, a.arch, a.seed, a.shape, a.norm_in, a.vocab_size, a.dtype)
        return
    m = HFModel(a.hfdir, a.bitlinear, a.swa)
    if a.cmd == "forward":
        ids = [int(x) for x in a.ids.split(",") if x.strip()]
        v = m.embed(ids)
        print(summary("embedding", ids, v))
        if a.out:
            v.astype("<f4").tofile(a.out)
        return
    os.makedirs(a.outdir, exist_ok=True)
    for pr in json.load(open(a.prompts, encoding="utf-8")):
        v = m.embed(pr["ids"])
        v.astype("<f4").tofile(os.path.join(a.outdir, pr["name"] + ".embd.f32"))
        print(summary(pr["name"], pr["ids"], v))


if __name__ == "__main__":
    sys.exit(main())
