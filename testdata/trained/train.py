#!/usr/bin/env python3
"""Train the small BitNet b1.58 model of testdata/trained from scratch, on the CPU.

    apt-get install -y bible-kjv bible-kjv-text   # the corpus (public domain text)
    pip install torch tokenizers safetensors      # PyTorch's CPU build is enough
    python3 testdata/trained/train.py --out /tmp/kjv-model

What it does, in order (every random choice seeded; PyTorch does not promise bit-identical
CPU training across versions or thread counts, so a rerun is close, not necessarily identical):
1. Corpus: the King James Bible as Debian's `bible-kjv-text` ships it, read through its `bible`
   program, one document per chapter ("Book N", a blank line, one verse a line, no verse
   numbers). Every 25th chapter (index % 25 == 12) is held out and never trained on; the held-out
   text is written to `heldout.txt`.
2. Vocabulary: a byte-level BPE of 4,096 ids (4,094 merges and bytes, plus `<|begin_of_text|>`
   and `<|end_of_text|>`) trained with Hugging Face `tokenizers` on the training chapters. Its
   pre-tokenizer is llama.cpp's default split (the four regexes llama.cpp applies to a BPE
   vocabulary without `tokenizer.ggml.pre`), so the text is cut the same way when the model is
   trained, when bitnet.cpp runs it and when bitnet-rs runs it.
3. Model: the `bitnet-b1.58` architecture of BitNet b1.58 2B-4T (`BitNetForCausalLM`): RMSNorm
   before attention and FFN, sub-norms before `o_proj` and `down_proj`, NEOX RoPE (base 500,000),
   GQA, ReLU² gated FFN, tied embedding, no biases. Every projection is a BitLinear trained with
   quantization-aware training as the BitNet b1.58 papers describe it: absmean ternary weights
   and per-token absmax int8 activations in the forward pass, straight-through gradients.
   One choice of ours: each projection's scale β is its absmean rounded to the nearest power of
   two (the ternary codes use the absmean itself). A power-of-two β is exact under every
   converter's arithmetic (a mean, its reciprocal, the reciprocal of that), which is what lets
   two converters write byte-identical files from this checkpoint.
4. Export (`hf/`): `config.json`, `model.safetensors` (bf16 master weights), `tokenizer.json`,
   `tokenizer_config.json`. A projection's master weights are rewritten so that absmean
   ternarization gives back exactly the trained codes and β: |w| = c·β with c = 0 where the
   code is 0 (or 1/4 to make the total come out), and c ∈ {1, 2, 3} where it is ±1, chosen so
   that mean|w| = β exactly. Every such value is exact in bf16 and every partial sum exact in
   f32, so mean, codes and β come out the same in any order of summation.
5. Evaluation: held-out perplexity of the exported model (read back from `hf/` and ternarized
   again) and of a unigram model of the training tokens (add-one smoothing; their counts go to
   `unigram.json`) on the same tokens.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
# llama.cpp's split for a BPE vocabulary that names no pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_DEFAULT):
# applied one after another, each cutting every piece into matches and the text between them.
DEFAULT_SPLIT = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
]


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- corpus
def read_chapters():
    """[(title, [verse, ...])] in canonical order, from the `bible` program."""
    out = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], capture_output=True, text=True,
                         check=True).stdout
    chapters = []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:
            if not chapters:
                raise SystemExit(f"verse before any chapter title: {line!r}")
            chapters[-1][1].append(m.group(2).strip())
        else:
            chapters.append((line.strip(), []))
    if len(chapters) != 1189:
        raise SystemExit(f"expected the 1,189 chapters of the KJV, read {len(chapters)}")
    return chapters


def chapter_text(title, verses):
    return title + "\n\n" + "\n".join(verses) + "\n"


# ---------------------------------------------------------------- tokenizer
def train_tokenizer(texts, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in DEFAULT_SPLIT]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 2, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([BOS, EOS])
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos)])
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"vocabulary came out at {tok.get_vocab_size()} ids, not {vocab_size}")
    return tok


# ---------------------------------------------------------------- model
def pow2(x):
    return torch.exp2(torch.round(torch.log2(x)))


def weight_codes(w):
    """Absmean ternarization: codes in {-1, 0, 1}, the absmean, and β (a power of two)."""
    m = w.abs().mean().clamp(min=1e-5)
    codes = torch.clamp(torch.round(w / m), -1, 1)
    return codes, m, pow2(m)


def act_quant(x):
    """Per-token absmax int8, as bitnet.cpp quantizes activations (127 / max |x|)."""
    s = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return torch.clamp(torch.round(x * s), -128, 127) / s


class BitLinear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_out, n_in))
        torch.nn.init.normal_(self.weight, std=n_in ** -0.5)

    def forward(self, x):
        w = self.weight
        codes, _, beta = weight_codes(w.detach())
        wq = w + (codes * beta - w).detach()
        xq = x + (act_quant(x) - x).detach()
        return F.linear(xq, wq)


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(n_ctx, head_dim, base):
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope_neox(x, cos, sin):
    # x: [B, H, T, D]; rotate the two halves (Hugging Face's rotate_half).
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[: x.shape[2]], sin[: x.shape[2]]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class Block(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        eps = cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(d, eps)
        self.q_proj = BitLinear(d, self.nh * hd)
        self.k_proj = BitLinear(d, self.nkv * hd)
        self.v_proj = BitLinear(d, self.nkv * hd)
        self.attn_sub_norm = RMSNorm(self.nh * hd, eps)
        self.o_proj = BitLinear(self.nh * hd, d)
        self.post_attention_layernorm = RMSNorm(d, eps)
        ff = cfg["intermediate_size"]
        self.gate_proj = BitLinear(d, ff)
        self.up_proj = BitLinear(d, ff)
        self.ffn_sub_norm = RMSNorm(ff, eps)
        self.down_proj = BitLinear(ff, d)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = rope_neox(q, cos, sin), rope_neox(k, cos, sin)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, self.nh * self.hd)
        x = x + self.o_proj(self.attn_sub_norm(a))
        h = self.post_attention_layernorm(x)
        g = F.relu(self.gate_proj(h))
        x = x + self.down_proj(self.ffn_sub_norm(g * g * self.up_proj(h)))
        return x


class Model(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = torch.nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        torch.nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = torch.nn.ModuleList([Block(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        cos, sin = rope_tables(cfg["max_position_embeddings"], cfg["head_dim"], cfg["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return F.linear(self.norm(x), self.embed_tokens.weight)


# ---------------------------------------------------------------- export
PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def master_weights(codes, beta):
    """bf16 weights whose absmean ternarization is exactly (codes, beta): see the module doc."""
    flat = codes.flatten()
    n = flat.numel()
    nz = flat != 0
    nnz = int(nz.sum())
    if nnz == 0:
        raise SystemExit("a projection came out all zero")
    # units of beta/4: the total must be 4n. Non-zeros start at 4 (c = 1), zeros at 0.
    units = torch.where(nz, torch.full_like(flat, 4.0), torch.zeros_like(flat))
    rest = 4 * n - 4 * nnz
    if rest < 0:
        # more than every weight's share: impossible with c >= 1 (nnz <= n), kept as a guard
        raise SystemExit("absmean construction failed")
    nz_idx = torch.nonzero(nz).flatten()
    z_idx = torch.nonzero(~nz).flatten()
    # raise non-zeros to c = 2, then 3 (4 units each), then zeros to 1/4 (1 unit each)
    for step_idx, add in ((nz_idx, 4.0), (nz_idx, 4.0), (z_idx, 1.0)):
        k = min(len(step_idx), int(rest // add))
        units[step_idx[:k]] += add
        rest -= int(k * add)
    if rest != 0:
        raise SystemExit(f"absmean construction left {rest} units over")
    w = units * 0.25 * beta * flat.sign().where(nz, torch.ones_like(flat))
    return w.view(codes.shape).to(torch.bfloat16)


def export(model, tok, cfg, out):
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    tensors = {"model.embed_tokens.weight": model.embed_tokens.weight.detach().to(torch.bfloat16),
               "model.norm.weight": model.norm.weight.detach().to(torch.bfloat16)}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        for name in PROJ:
            w = getattr(layer, name.split(".")[1]).weight.detach()
            codes, _, beta = weight_codes(w)
            tensors[p + name + ".weight"] = master_weights(codes, float(beta))
        for name, norm in (("input_layernorm", layer.input_layernorm),
                           ("post_attention_layernorm", layer.post_attention_layernorm),
                           ("self_attn.attn_sub_norm", layer.attn_sub_norm),
                           ("mlp.ffn_sub_norm", layer.ffn_sub_norm)):
            tensors[p + name + ".weight"] = norm.weight.detach().to(torch.bfloat16)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    hf = {k: v for k, v in cfg.items() if k != "head_dim"}
    hf.update({"architectures": ["BitNetForCausalLM"], "model_type": "bitnet", "hidden_act": "relu2",
               "tie_word_embeddings": True, "torch_dtype": "bfloat16",
               "bos_token_id": tok.token_to_id(BOS), "eos_token_id": tok.token_to_id(EOS)})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(sorted(hf.items())), f, indent=2)
        f.write("\n")
    tok.save(os.path.join(out, "tokenizer.json"))
    write_tokenizer_config(cfg, out)


def write_tokenizer_config(cfg, out):
    # No `add_bos_token`: as in LLaMA-3's files, the tokenizer's post-processor adds BOS (and
    # bitnet.cpp's converter for this architecture writes the key itself, failing on a second).
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS,
                   "model_max_length": cfg["max_position_embeddings"],
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
        f.write("\n")


def load_exported(cfg, out):
    """A Model whose weights are the exported checkpoint, ternarized again by absmean."""
    from safetensors.torch import load_file

    t = load_file(os.path.join(out, "model.safetensors"))
    m = Model(cfg)
    with torch.no_grad():
        m.embed_tokens.weight.copy_(t["model.embed_tokens.weight"].float())
        m.norm.weight.copy_(t["model.norm.weight"].float())
        for i, layer in enumerate(m.layers):
            p = f"model.layers.{i}."
            for name in PROJ:
                w = t[p + name + ".weight"].float()
                # the plain b1.58 rule gives β = mean|w|: a power of two here
                beta = w.abs().mean().clamp(min=1e-5)
                if float(beta) != float(pow2(beta)):
                    raise SystemExit(f"{p}{name}: exported absmean {float(beta)} is not a power of two")
                # BitLinear ternarizes what it holds: the master weights themselves, whose
                # absmean is β (a power of two) and whose codes are the trained ones
                getattr(layer, name.split(".")[1]).weight.copy_(w)
            layer.input_layernorm.weight.copy_(t[p + "input_layernorm.weight"].float())
            layer.post_attention_layernorm.weight.copy_(t[p + "post_attention_layernorm.weight"].float())
            layer.attn_sub_norm.weight.copy_(t[p + "self_attn.attn_sub_norm.weight"].float())
            layer.ffn_sub_norm.weight.copy_(t[p + "mlp.ffn_sub_norm.weight"].float())
    return m


# ---------------------------------------------------------------- evaluation
def heldout_windows(docs, n_ctx):
    """Each held-out chapter as BOS + its tokens, cut into windows of at most n_ctx ids; each
    window after the first starts again with BOS (the context a user's prompt starts with)."""
    for ids in docs:
        for pos in range(0, len(ids), n_ctx - 1):
            yield ids[pos: pos + n_ctx - 1]


@torch.no_grad()
def perplexity(model, docs, bos, n_ctx):
    nll, count = 0.0, 0
    model.eval()
    for chunk in heldout_windows(docs, n_ctx):
        ids = torch.tensor([[bos] + chunk])
        logits = model(ids)[0, :-1].double()
        tgt = ids[0, 1:]
        nll += float(F.cross_entropy(logits, tgt, reduction="sum"))
        count += len(chunk)
    return math.exp(nll / count), count


def unigram_counts(train_stream, vocab):
    """How often each id occurs in the training tokens (EOS between chapters included)."""
    return torch.bincount(torch.tensor(train_stream), minlength=vocab).tolist()


def unigram_perplexity(train_stream, docs, vocab):
    counts = torch.tensor(unigram_counts(train_stream, vocab)).double() + 1.0
    logp = torch.log(counts / counts.sum())
    ids = torch.tensor([t for d in docs for t in d])
    return math.exp(float(-logp[ids].mean()))


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for hf/, heldout.txt and train.log.json")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--ctx", type=int, default=256, help="training sequence length")
    ap.add_argument("--n-ctx", type=int, default=512, help="max_position_embeddings")
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1958)
    args = ap.parse_args()

    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    chapters = read_chapters()
    train_docs = [chapter_text(*c) for i, c in enumerate(chapters) if i % 25 != 12]
    held_docs = [chapter_text(*c) for i, c in enumerate(chapters) if i % 25 == 12]
    with open(os.path.join(args.out, "heldout.txt"), "w") as f:
        f.write("\n".join(held_docs))
    log(f"corpus: {len(train_docs)} training chapters ({sum(map(len, train_docs))} bytes), "
        f"{len(held_docs)} held out ({sum(map(len, held_docs))} bytes)")

    tok = train_tokenizer(train_docs, args.vocab)
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    enc = lambda text: tok.encode(text, add_special_tokens=False).ids
    stream = []
    for d in train_docs:
        stream += enc(d) + [eos]
    held = [enc(d) for d in held_docs]
    with open(os.path.join(args.out, "unigram.json"), "w") as f:
        json.dump({"smoothing": "add-one", "counts": unigram_counts(stream, args.vocab)}, f)
        f.write("\n")
    log(f"tokens: {len(stream)} training, {sum(map(len, held))} held out, vocabulary {args.vocab}")

    cfg = {"vocab_size": args.vocab, "hidden_size": args.hidden, "intermediate_size": args.ffn,
           "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
           "num_key_value_heads": args.kv_heads, "head_dim": args.hidden // args.heads,
           "max_position_embeddings": args.n_ctx, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}
    model = Model(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warm = max(1, args.steps // 20)

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        frac = (step - warm) / max(1, args.steps - warm)
        return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    data = torch.tensor(stream)
    gen = torch.Generator().manual_seed(args.seed)
    curve = []
    t_train = time.time()
    model.train()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, len(stream) - args.ctx, (args.batch,), generator=gen)
        win = torch.stack([data[s: s + args.ctx] for s in starts.tolist()])
        ids = torch.cat([torch.full((args.batch, 1), bos), win], dim=1)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t_train
            curve.append({"step": step, "loss": round(float(loss.detach()), 4), "seconds": round(el)})
            log(f"step {step:5d}  loss {float(loss.detach()):.4f}  lr {lr_at(step):.2e}  {el:7.0f} s  "
                f"{(step + 1) * args.batch * args.ctx / max(el, 1e-9):.0f} tok/s")
    train_s = time.time() - t_train

    # The checkpoint stores the embedding and the norms in bf16: round them in the model too, so
    # that the comparison below checks the export and nothing else.
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if not name.endswith("_proj.weight"):
                prm.copy_(prm.to(torch.bfloat16).float())
    export(model, tok, cfg, os.path.join(args.out, "hf"))
    exported = load_exported(cfg, os.path.join(args.out, "hf"))
    with torch.no_grad():
        model.eval()
        probe = torch.tensor([[bos] + held[0][: args.ctx - 1]])
        gap = float((model(probe) - exported(probe)).abs().max())
    log(f"exported checkpoint against the trained model: max |logit difference| {gap:.2e}")
    if gap > 1e-3:
        raise SystemExit("the exported checkpoint does not compute the trained model")
    ppl, n = perplexity(exported, held, bos, args.n_ctx)
    uni = unigram_perplexity(stream, held, args.vocab)
    log(f"held-out perplexity {ppl:.3f} over {n} tokens; unigram {uni:.3f}; ratio {ppl / uni:.4f}")
    summary = {"args": vars(args), "config": cfg, "train_tokens": len(stream),
               "heldout_tokens": n, "heldout_ppl": ppl, "unigram_ppl": uni,
               "train_seconds": round(train_s), "total_seconds": round(time.time() - t0),
               "torch": torch.__version__, "threads": args.threads, "curve": curve}
    with open(os.path.join(args.out, "train.log.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    log(f"done in {time.time() - t0:.0f} s (training {train_s:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
