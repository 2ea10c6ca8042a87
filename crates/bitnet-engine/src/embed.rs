//! Embeddings: one vector per input, as llama.cpp's `llama-embedding` and `/v1/embeddings`
//! compute them — the output-normed hidden states pooled (the file's `pooling_type`: last
//! token for bitnet.cpp's embedding models) and L2-normalized.

use bitnet_model::{numerics, Exec, Outputs, Pooling, Seq};

use crate::{Engine, EngineError, Result};

/// How [`Engine::embed`] reduces and scales each input's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmbedOptions {
    /// The pooling; `None`: the file's `pooling_type`, else the last position (a causal
    /// model's summary of its input).
    pub pooling: Option<Pooling>,
    /// Leave the vectors as pooled (llama.cpp's `--embd-normalize -1`); otherwise each is
    /// L2-normalized (its default, 2).
    pub raw: bool,
}

/// [`Engine::embed_tokens`] with a tokenizer of its own (a server's handlers hold one).
pub fn embed_tokens(tok: &bitnet_tokenizer::Tokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = tok.encode(text, tok.add_bos(), true)?;
    if tok.add_eos() {
        if let Some(eos) = tok.eos() {
            ids.push(eos);
        }
    }
    Ok(ids)
}

impl Engine {
    /// The pooling [`Engine::embed`] uses with `opts`.
    pub fn pooling(&self, opts: &EmbedOptions) -> Pooling {
        opts.pooling
            .or(self.config().pooling)
            .unwrap_or(Pooling::Last)
    }

    /// The tokens of one input as an embedding reads it: BOS where the vocabulary adds it,
    /// special-token text parsed, EOS appended where the file asks (`add_eos_token`: the
    /// last-token pooling of Qwen 3's embedding model reads it).
    pub fn embed_tokens(&self, text: &str) -> Result<Vec<u32>> {
        embed_tokens(&self.tokenizer, text)
    }

    /// One vector per input (for [`Pooling::None`], `n_embd` values per position, one after
    /// another). Inputs run whole, each over a cache of its own, several in one forward pass
    /// while their tokens fit a prefill batch (`n_batch`; a longer input runs alone). They run
    /// on the CPU, also for an engine that generates on a GPU (its weights are on the host
    /// too; a model streamed onto a GPU has none there: [`EngineError::WeightsOnDevice`]).
    pub fn embed(&self, inputs: &[Vec<u32>], opts: &EmbedOptions) -> Result<Vec<Vec<f32>>> {
        let model = self.model()?;
        let c = self.config();
        for ids in inputs {
            if ids.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if ids.len() > c.n_ctx_train {
                return Err(EngineError::ContextFull {
                    n_past: ids.len(),
                    n_ctx: c.n_ctx_train,
                });
            }
        }
        let pooling = self.pooling(opts);
        let mut out = Vec::with_capacity(inputs.len());
        let mut start = 0;
        while start < inputs.len() {
            // A group of inputs whose tokens fit one prefill batch (at least one input).
            let mut end = start + 1;
            let mut total = inputs[start].len();
            while end < inputs.len() && total + inputs[end].len() <= self.opts.n_batch {
                total += inputs[end].len();
                end += 1;
            }
            let group = &inputs[start..end];
            let mut caches = group
                .iter()
                .map(|ids| model.new_cache(ids.len(), self.opts.kv_type, self.opts.kv_budget_bytes))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let mut seqs: Vec<Seq<'_>> = group
                .iter()
                .zip(caches.iter_mut())
                .map(|(ids, cache)| Seq {
                    tokens: ids,
                    cache,
                    outputs: Outputs::None,
                })
                .collect();
            let mut scratch = self.scratch();
            let mut exec = Exec {
                backend: self.backend(),
                numerics: self.opts.numerics,
                trace: None,
                scratch: Some(&mut scratch),
            };
            let vectors = model.embed_seqs(&mut seqs, pooling, &mut exec)?;
            for v in vectors {
                out.push(if opts.raw {
                    v
                } else {
                    v.chunks(c.n_embd)
                        .flat_map(numerics::l2_normalized)
                        .collect()
                });
            }
            start = end;
        }
        Ok(out)
    }
}
