// Shared by every kernel: the per-call parameters, rewritten before each submission.
struct Step {
    // token rows in this call
    n_tok: u32,
    // position of the first row (the cache already holds 0..pos0)
    pos0: u32,
    // first row whose logits are wanted, and how many
    out_first: u32,
    out_rows: u32,
}
