//! `coil inspect FILE.gguf [--json] [--kernels [--batched]]`.

use anyhow::{Context, Result};
use coil::memory::CheckpointPolicy;
use coil::models::LayerPlan;
use coil_gguf::{GgmlType, GgufFile, Value};
use serde_json::{json, Map};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to inspect (any part of a split model: every part is
    /// read).
    file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// How many elements of long arrays to show.
    #[arg(long, default_value_t = 8)]
    max_items: usize,
    /// Print, per weight matrix, which kernel multiplies it at 1, 4, 9, 64
    /// and 512 tokens on this machine (its SIMD level, `COIL_SIMD` and the
    /// other kernel settings of the environment), instead of the file's
    /// contents.
    #[arg(long)]
    kernels: bool,
    /// With --kernels: as an engine that decodes several sequences at once
    /// (`coil serve`, `bench --parallel`) runs them; else as one sequence
    /// at a time (`coil run`, `chat`, `bench`).
    #[arg(long, requires = "kernels")]
    batched: bool,
}

/// The token counts `--kernels` shows.
const KERNEL_TOKENS: [usize; 5] = [1, 4, 9, 64, 512];

pub fn run(a: Args) -> Result<()> {
    if a.kernels {
        return kernels(&a);
    }
    let file =
        Arc::new(GgufFile::open(&a.file).with_context(|| format!("reading {}", a.file.display()))?);
    // A vocabulary-only file or an unknown architecture has no plan; that is
    // shown, not an error.
    let plan = LayerPlan::from_gguf(&file);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&file, &plan, a.max_items))?
        );
    } else {
        print_text(&a, &file, &plan);
    }
    Ok(())
}

fn shape(dims: &[u64]) -> String {
    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", d.join(", "))
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Totals per tensor type: (count, elements, bytes).
fn totals(file: &GgufFile) -> BTreeMap<GgmlType, (u64, u64, u64)> {
    let mut by_type = BTreeMap::new();
    for t in file.tensors() {
        let e = by_type.entry(t.ty).or_insert((0, 0, 0));
        e.0 += 1;
        e.1 += t.n_elements;
        e.2 += t.n_bytes;
    }
    by_type
}

fn print_text(
    a: &Args,
    file: &Arc<GgufFile>,
    plan: &Result<LayerPlan, coil::models::plan::PlanError>,
) {
    println!(
        "{}: GGUF v{}, {}, alignment {}, data at byte {}",
        a.file.display(),
        file.version(),
        human_bytes(file.file_len()),
        file.alignment(),
        file.data_offset()
    );
    if file.is_split() {
        println!("split model: {} parts", file.parts().len());
        for (i, p) in file.parts().iter().enumerate() {
            let path = p
                .path
                .as_deref()
                .map_or_else(String::new, |p| p.display().to_string());
            println!(
                "  part {}: {path}, {}, {} tensors",
                i + 1,
                human_bytes(p.len),
                p.n_tensors
            );
        }
    }
    println!(
        "architecture: {}",
        file.architecture()
            .unwrap_or("(none: general.architecture missing)")
    );
    println!("\nmetadata ({} keys):", file.metadata().len());
    for (k, v) in file.metadata().iter() {
        let ty = match v {
            Value::Array(t, _) => format!("[{}]", t.name()),
            other => other.value_type().name().to_string(),
        };
        println!("  {k:<48} {ty:<9} {}", v.summary(a.max_items));
    }
    println!("\ntensors ({}):", file.tensors().len());
    println!(
        "  {:<40} {:<8} {:<22} {:>12}",
        "name", "type", "shape (ne0 first)", "bytes"
    );
    for t in file.tensors() {
        println!(
            "  {:<40} {:<8} {:<22} {:>12}",
            t.name,
            t.ty.name(),
            shape(&t.dims),
            t.n_bytes
        );
    }
    let by_type = totals(file);
    let n_elem: u64 = by_type.values().map(|v| v.1).sum();
    let n_bytes: u64 = by_type.values().map(|v| v.2).sum();
    println!(
        "\ntotals: {} tensors, {} parameters, {} of tensor data",
        file.tensors().len(),
        n_elem,
        human_bytes(n_bytes)
    );
    for (ty, (n, e, b)) in &by_type {
        println!(
            "  {:<8} {n:>5} tensors {e:>14} elements {:>12}",
            ty.name(),
            human_bytes(*b)
        );
    }
    println!();
    match plan {
        _ if file.tensors().is_empty() => {
            println!("layer plan: none (no tensors: a vocabulary-only file)")
        }
        Ok(p) => {
            print!("{p}");
            println!("\n{}", memory_summary(file));
        }
        Err(e) => println!("layer plan: none ({e})"),
    }
}

/// What running the model costs in memory, and what rollback costs: the
/// defaults of `coil run` (one sequence, context 4096, checkpoint policy).
fn memory_summary(file: &Arc<GgufFile>) -> String {
    let model = match coil::models::load(file.clone()) {
        Ok(m) => m,
        Err(e) => return format!("memory: the model does not load: {e}"),
    };
    let mem = model.new_memory(1, 4096);
    let mut out = format!("memory: {}", mem.describe());
    out.push_str(&per_kind(&model.info().plan, &mem, &sliding_layers(file)));
    out.push_str(&past_the_trunk(file, &model.info().plan, &mem));
    if let Some(r) = &mem.recurrent {
        let p = CheckpointPolicy::default();
        let per = r.bytes_per_seq();
        let n = (p.budget_bytes / per.max(1)).max(2);
        out.push_str(&format!(
            "\nrollback checkpoints: one every {} tokens and at the end of each prompt \
             (of each generated token too under `coil serve`), {:.2} MiB each; \
             budget {} MiB per sequence = {} checkpoints (beyond that they are spaced further apart); \
             a rollback replays at most {} tokens while {} × {} tokens fit the budget \
             (--checkpoint-interval, --checkpoint-budget)",
            p.interval,
            per as f64 / (1024.0 * 1024.0),
            p.budget_bytes >> 20,
            n,
            p.interval.saturating_sub(1),
            n,
            p.interval
        ));
    }
    out
}

/// The sliding-window attention layers (`{arch}.attention.sliding_window_pattern`)
/// and their window (`{arch}.attention.sliding_window`), if the file has them.
fn sliding_layers(file: &GgufFile) -> Option<(Vec<bool>, u64)> {
    let md = file.metadata();
    let arch = md.get_str("general.architecture")?;
    let window = md
        .get(&format!("{arch}.attention.sliding_window"))?
        .as_u64()?;
    match md.get(&format!("{arch}.attention.sliding_window_pattern"))? {
        Value::Array(_, items) => Some((
            items
                .iter()
                .map(|v| matches!(v, Value::Bool(true)))
                .collect(),
            window,
        )),
        _ => None,
    }
}

/// The memory of each kind of mixer, per sequence: the recurrent state of
/// its layers (SSM / delta-rule state and conv tail) and the attention
/// cells per token (K and V rows, or MLA's compressed latent row alone);
/// sliding-window attention layers apart.
fn per_kind(
    plan: &LayerPlan,
    mem: &coil::memory::Memory,
    sliding: &Option<(Vec<bool>, u64)>,
) -> String {
    // kind → (layers, state elements, conv elements, cell bytes per token, latent)
    let mut kinds: BTreeMap<&str, (usize, usize, usize, usize, bool)> = BTreeMap::new();
    let is_sliding = |l: usize| {
        sliding
            .as_ref()
            .is_some_and(|(p, _)| p.get(l).copied().unwrap_or(false))
    };
    for (l, kind) in plan.layers.iter().enumerate() {
        let name = match is_sliding(l) {
            true => "sliding-window attention",
            false => kind.mixer.name(),
        };
        let e = kinds.entry(name).or_default();
        e.0 += 1;
        if let Some(sh) = mem.recurrent.as_ref().and_then(|r| r.shapes()[l]) {
            e.1 += sh.ssm;
            e.2 += sh.conv;
        }
        if let Some(k) = &mem.kv {
            e.3 += k.layer_bytes_per_token(l);
            e.4 |= kind.mixer.name() == "mla";
        }
    }
    let kib = |b: usize| b as f64 / 1024.0;
    let mut out = String::new();
    for (name, (n, ssm, conv, per_tok, latent)) in kinds {
        let mut parts = Vec::new();
        if ssm + conv > 0 {
            parts.push(format!(
                "state {:.1} KiB per sequence ({ssm} state + {conv} conv-tail f32 values)",
                kib(4 * (ssm + conv))
            ));
        }
        if per_tok > 0 {
            parts.push(format!(
                "{per_tok} bytes of {} per token ({:.1} MiB at 4096 tokens)",
                if latent {
                    "compressed latent cells"
                } else {
                    "K/V cells"
                },
                (per_tok * 4096) as f64 / (1024.0 * 1024.0)
            ));
        }
        if let (Some((_, w)), "sliding-window attention") = (sliding, name) {
            parts.push(format!(
                "a query reads the last {w} tokens' cells (every cell is kept: rollback and \
                 prefix resumes need the older ones)"
            ));
        }
        if !parts.is_empty() {
            out.push_str(&format!("\n  {name}: {n} layer(s), {}", parts.join(", ")));
        }
    }
    out
}

/// The memory some architectures keep in layers past the layer plan's:
/// Qwen4-Exp's per-layer n-gram embedding state (its dilated conv's inputs
/// and the last tokens) and its indexed attention layers' raw indexer keys.
fn past_the_trunk(file: &GgufFile, plan: &LayerPlan, mem: &coil::memory::Memory) -> String {
    let n = plan.layers.len();
    let rec = mem.recurrent.as_ref().map_or(0, |r| {
        r.shapes()
            .iter()
            .skip(n)
            .flatten()
            .map(|s| s.ssm + s.conv)
            .sum::<usize>()
    });
    let kv = mem.kv.as_ref().map_or(0, |k| {
        (n..k.n_layer())
            .map(|l| k.layer_bytes_per_token(l))
            .sum::<usize>()
    });
    let qwen4 = file.architecture() == Some("qwen4exp");
    let md = file.metadata();
    let key = |k: &str| md.get(&format!("qwen4exp.{k}")).and_then(Value::as_u64);
    let mut out = String::new();
    if rec > 0 {
        let what = match qwen4 {
            true => "n-gram embedding (PLE)",
            false => "state past the layer plan",
        };
        out.push_str(&format!(
            "\n  {what}: state {:.1} KiB per sequence ({rec} f32 values: its conv inputs and last tokens)",
            rec as f64 * 4.0 / 1024.0
        ));
    }
    if kv > 0 {
        let what = match qwen4 {
            true => "indexer keys",
            false => "cells past the layer plan",
        };
        out.push_str(&format!(
            "\n  {what}: {kv} bytes per token ({:.1} MiB at 4096 tokens)",
            (kv * 4096) as f64 / (1024.0 * 1024.0)
        ));
        if let (true, Some(top_k)) = (qwen4, key("attention.indexer.top_k")) {
            out.push_str(&format!(
                "; an indexed attention layer's query reads the cells of its top {top_k} tokens' \
                 blocks and of its own incomplete block (every cell is kept)"
            ));
        }
    }
    out
}

fn value_json(v: &Value, max_items: usize) -> serde_json::Value {
    match v {
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(t, items) => {
            let shown: Vec<_> = items
                .iter()
                .take(max_items)
                .map(|x| value_json(x, max_items))
                .collect();
            json!({ "type": t.name(), "len": items.len(), "head": shown })
        }
        other => match other.as_int() {
            Some(i) if i >= i64::MIN as i128 && i <= i64::MAX as i128 => json!(i as i64),
            Some(i) => json!(i as u64),
            None => json!(other.to_string()),
        },
    }
}

fn to_json(
    file: &GgufFile,
    plan: &Result<LayerPlan, coil::models::plan::PlanError>,
    max_items: usize,
) -> serde_json::Value {
    let mut meta = Map::new();
    for (k, v) in file.metadata().iter() {
        meta.insert(k.to_string(), value_json(v, max_items));
    }
    let tensors: Vec<_> = file
        .tensors()
        .iter()
        .map(|t| json!({ "name": t.name, "type": t.ty.name(), "shape": t.dims, "bytes": t.n_bytes, "offset": t.offset, "part": t.part }))
        .collect();
    let by_type: Map<String, serde_json::Value> = totals(file)
        .into_iter()
        .map(|(ty, (n, e, b))| {
            (
                ty.name().to_string(),
                json!({ "tensors": n, "elements": e, "bytes": b }),
            )
        })
        .collect();
    let plan_json = match plan {
        Ok(p) => json!({
            "pattern": p.pattern(),
            "layers": p.layers.iter().map(|l| json!({ "mixer": l.mixer.name(), "ffn": l.ffn.name() })).collect::<Vec<_>>(),
        }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    json!({
        "version": file.version(),
        "file_bytes": file.file_len(),
        "alignment": file.alignment(),
        "data_offset": file.data_offset(),
        "parts": file.parts().iter().map(|p| json!({
            "path": p.path.as_ref().map(|p| p.display().to_string()),
            "bytes": p.len,
            "data_offset": p.data_offset,
            "tensors": p.n_tensors,
        })).collect::<Vec<_>>(),
        "architecture": file.architecture(),
        "metadata": meta,
        "tensors": tensors,
        "totals": {
            "tensors": file.tensors().len(),
            "elements": file.tensors().iter().map(|t| t.n_elements).sum::<u64>(),
            "bytes": file.tensors().iter().map(|t| t.n_bytes).sum::<u64>(),
            "by_type": by_type,
        },
        "layer_plan": plan_json,
    })
}

/// Whether the tensor `name` of `dims` is a weight matrix that models
/// multiply activations by (not a norm's or convolution's weights, not
/// `ssm_a` / `ssm_d`, which are 2-D in the file too).
fn is_matrix(name: &str, dims: &[u64]) -> bool {
    dims.len() >= 2 && name.ends_with(".weight") && !name.contains("norm") && !name.contains("conv")
}

/// One matrix of `--kernels`: what runs it per token count of
/// [`KERNEL_TOKENS`].
struct KernelRow {
    name: String,
    ty: GgmlType,
    layout: &'static str,
    rows: usize,
    cols: usize,
    names: Vec<String>,
}

/// `--kernels`: the file's matrices in the layout the engine's loader gives
/// them here (the AVX-512 level repacks some in memory), and for each the
/// kernel that `coil_kernels::matmul::plan` picks per token count.
fn kernels(a: &Args) -> Result<()> {
    coil_kernels::simd::check_env()?;
    let mut file = GgufFile::open_prefaulted_private(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    // as `Engine::load` does: a single-stream engine keeps Q6_K in the
    // file's layout
    coil::models::weights::repack_for_kernels_where(&mut file, |ty| {
        a.batched || ty != GgmlType::Q6_K
    });
    // `Engine::from_file`: a pool runs one sequence at a time unless it
    // decodes several
    let single = !a.batched;
    let level = coil_kernels::simd::level();
    let rows: Vec<KernelRow> = file
        .tensors()
        .iter()
        .filter(|t| is_matrix(&t.name, &t.dims) && coil_kernels::matmul::supported(t.ty))
        .map(|t| {
            // a 3-D tensor is a stack of experts: one product per expert
            let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
            let layout = if file.is_rewritten(t) {
                coil_kernels::Layout::Lanes16
            } else {
                coil_kernels::Layout::Rows
            };
            let names = KERNEL_TOKENS
                .iter()
                .map(|&n| {
                    coil_kernels::matmul::plan::kernel_name(t.ty, layout, rows, cols, n, single)
                })
                .collect();
            let lay = match layout {
                coil_kernels::Layout::Rows => "rows",
                coil_kernels::Layout::Lanes16 => "lanes16",
            };
            KernelRow {
                name: t.name.clone(),
                ty: t.ty,
                layout: lay,
                rows,
                cols,
                names,
            }
        })
        .collect();
    let mode = if single {
        "one sequence at a time"
    } else {
        "several sequences at once"
    };
    if a.json {
        let list: Vec<_> = rows
            .iter()
            .map(|k| {
                let KernelRow {
                    name,
                    ty,
                    layout: lay,
                    rows: r,
                    cols: c,
                    names,
                } = k;
                let by: Map<String, serde_json::Value> = KERNEL_TOKENS
                    .iter()
                    .zip(names)
                    .map(|(n, k)| (n.to_string(), json!(k)))
                    .collect();
                json!({ "name": name, "type": ty.name(), "layout": lay, "rows": r, "cols": c, "kernels": by })
            })
            .collect();
        let out = json!({ "simd": level.name(), "streams": mode, "tokens": KERNEL_TOKENS, "tensors": list });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "kernels at the {} level, {mode} (columns: tokens per product)",
        level.name()
    );
    print!(
        "  {:<36} {:<7} {:<7} {:>13}",
        "name", "type", "layout", "rows x cols"
    );
    for n in KERNEL_TOKENS {
        print!("  {:<20}", n);
    }
    println!();
    for k in &rows {
        let KernelRow {
            name,
            ty,
            layout: lay,
            rows: r,
            cols: c,
            names,
        } = k;
        print!(
            "  {name:<36} {:<7} {lay:<7} {:>13}",
            ty.name(),
            format!("{r} x {c}")
        );
        for k in names {
            print!("  {k:<20}");
        }
        println!();
    }
    Ok(())
}
