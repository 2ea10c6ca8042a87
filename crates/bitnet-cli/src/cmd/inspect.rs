//! `bitnet inspect FILE [--json] [--system]`

use std::path::PathBuf;

use std::io::Write;

use anyhow::{bail, Result};
use bitnet_gguf::{Array, GgmlType, GgufFile, Value};
use serde_json::json;

use super::common::{human_bytes, open_gguf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GGUF file.
    file: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Print the CPU features and the kernel tier chosen at run time.
    #[arg(long)]
    system: bool,
}

/// How many array elements a summary shows.
const ARRAY_PREVIEW: usize = 6;

fn scalar_str(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let short: String = s.chars().take(80).collect();
            if short.len() < s.len() {
                format!("{short:?}...")
            } else {
                format!("{s:?}")
            }
        }
        Value::Array(a) => array_str(a),
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => format!("{x:e}"),
        Value::F64(x) => format!("{x:e}"),
        Value::Bool(x) => x.to_string(),
    }
}

fn preview<T: std::fmt::Debug>(ty: &str, v: &[T]) -> String {
    let items: Vec<String> = v
        .iter()
        .take(ARRAY_PREVIEW)
        .map(|x| format!("{x:?}"))
        .collect();
    let more = if v.len() > ARRAY_PREVIEW { ", ..." } else { "" };
    format!("arr[{ty},{}] = [{}{more}]", v.len(), items.join(", "))
}

fn array_str(a: &Array) -> String {
    match a {
        Array::U8(v) => preview("u8", v),
        Array::I8(v) => preview("i8", v),
        Array::U16(v) => preview("u16", v),
        Array::I16(v) => preview("i16", v),
        Array::U32(v) => preview("u32", v),
        Array::I32(v) => preview("i32", v),
        Array::U64(v) => preview("u64", v),
        Array::I64(v) => preview("i64", v),
        Array::F32(v) => preview("f32", v),
        Array::F64(v) => preview("f64", v),
        Array::Bool(v) => preview("bool", v),
        Array::String(v) => preview("str", v),
        Array::Array(v) => format!("arr[arr,{}]", v.len()),
    }
}

fn system_report() -> String {
    let mut r = bitnet_kernels::isa_report();
    let adapters = bitnet_gpu::adapters();
    if adapters.is_empty() {
        r.push_str("\ngpu: no adapter found (Vulkan, Metal or DX12)");
    }
    for a in adapters {
        r.push_str(&format!(
            "\ngpu {}: {} ({}, {}; {}), max buffer {}, max storage binding {}, workgroup \
             storage {} B, {} invocations{}{}",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            human_bytes(a.max_buffer_size),
            human_bytes(a.max_storage_binding),
            a.max_workgroup_storage,
            a.max_invocations,
            if a.shader_f16 { ", shader-f16" } else { "" },
            if a.subgroups { ", subgroups" } else { "" },
        ));
    }
    r
}

/// Bytes to run the model: mapped tensor data plus an f16 KV cache at the training context.
fn memory_estimate(f: &GgufFile) -> Option<(u64, u64)> {
    let weights: u64 = f
        .tensors()
        .iter()
        .map(|t| t.nbytes().unwrap_or(t.available))
        .sum();
    // The model's own validated config: a file it would refuse gets no estimate.
    let rows = f
        .tensor("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied());
    let c = bitnet_model::Config::from_metadata(f.metadata(), rows).ok()?;
    let kv = c
        .kv_cache_bytes(c.n_ctx_train, bitnet_model::KvType::F16)
        .ok()?;
    Some((weights, kv))
}

pub fn run(a: Args) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if a.system {
        writeln!(out, "{}", system_report())?;
        if a.file.is_none() {
            return Ok(());
        }
    }
    let Some(path) = a.file else {
        bail!("no file given (bitnet inspect FILE)")
    };
    let f = open_gguf(&path, false)?;
    let md = f.metadata();
    if a.json {
        let kv: Vec<_> = md
            .iter()
            .map(|(k, v)| json!({"key": k, "type": v.type_name(), "value": scalar_str(v)}))
            .collect();
        let tensors: Vec<_> = f
            .tensors()
            .iter()
            .map(|t| {
                json!({"name": t.name, "type": t.ggml_type.name(), "type_id": t.type_id, "dims": t.dims,
                       "bytes": t.nbytes(), "offset": t.offset, "available": t.available})
            })
            .collect();
        let mem = memory_estimate(&f);
        let doc = json!({
            "file": path.display().to_string(), "version": f.version(), "alignment": f.alignment(),
            "data_offset": f.data_offset(), "file_size": f.file_size(), "architecture": f.architecture(),
            "metadata": kv, "tensors": tensors,
            "memory": mem.map(|(w, kv)| json!({"weights_bytes": w, "kv_cache_f16_bytes": kv})),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return check_types(&f);
    }
    writeln!(
        out,
        "{}: GGUF v{}, {} KV pairs, {} tensors, alignment {}, data at byte {}, {} bytes",
        path.display(),
        f.version(),
        md.len(),
        f.tensors().len(),
        f.alignment(),
        f.data_offset(),
        f.file_size()
    )?;
    writeln!(
        out,
        "architecture: {}",
        f.architecture().unwrap_or("(none)")
    )?;
    writeln!(out, "\n{:>3}  {:<48} {:<5} value", "#", "key", "type")?;
    for (i, (k, v)) in md.iter().enumerate() {
        writeln!(
            out,
            "{i:>3}  {k:<48} {:<5} {}",
            v.type_name(),
            scalar_str(v)
        )?;
    }
    if !f.tensors().is_empty() {
        writeln!(
            out,
            "\n{:>4}  {:<32} {:<8} {:<18} {:>12} {:>12} {:>12}",
            "#", "name", "type", "ne", "bytes", "offset", "available"
        )?;
        for (i, t) in f.tensors().iter().enumerate() {
            let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
            let bytes = t
                .nbytes()
                .map_or_else(|| "?".to_string(), |b| b.to_string());
            writeln!(
                out,
                "{i:>4}  {:<32} {:<8} {:<18} {bytes:>12} {:>12} {:>12}",
                t.name,
                t.ggml_type.to_string(),
                format!("[{}]", dims.join(", ")),
                t.offset,
                t.available
            )?;
        }
        let mut by_type: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
        for t in f.tensors() {
            let e = by_type.entry(t.ggml_type.name()).or_default();
            e.0 += 1;
            e.1 += t.nbytes().unwrap_or(t.available);
        }
        let summary: Vec<String> = by_type
            .iter()
            .map(|(k, (n, b))| format!("{k}: {n} tensors / {b} bytes"))
            .collect();
        writeln!(out, "\ntypes: {}", summary.join(", "))?;
    }
    if let Some((w, kv)) = memory_estimate(&f) {
        writeln!(
            out,
            "memory to run: weights {} (memory-mapped) + KV cache {} (f16, full context) = {}",
            human_bytes(w),
            human_bytes(kv),
            human_bytes(w + kv)
        )?;
    }
    out.flush()?;
    check_types(&f)
}

/// A tensor whose type id the reader does not know makes the file unusable: everything else
/// has been shown, and the command fails with the first such tensor.
fn check_types(f: &GgufFile) -> Result<()> {
    let unknown = f
        .tensors()
        .iter()
        .enumerate()
        .find_map(|(i, t)| match t.ggml_type {
            GgmlType::Unknown(id) => Some((i, &t.name, id)),
            _ => None,
        });
    if let Some((i, name, id)) = unknown {
        bail!("tensor #{i} {name:?} has ggml type id {id}, which this reader does not know");
    }
    Ok(())
}
