//! `coil run -m MODEL -p PROMPT`: generate text, streamed to stdout, with
//! prompt and generation speed on stderr.

use super::common::{ConstraintArgs, ModelArgs, SamplingArgs, SpecArgs};
use anyhow::{bail, Context, Result};
use coil::engine::generate::{generate_constrained, GenerateOptions};
use coil::engine::sampling::Sampler;
use coil::memory::SequenceMemory;
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text (with --load-session: text to append to the saved
    /// sequence; may be omitted to just continue it).
    #[arg(
        short = 'p',
        long = "prompt",
        required_unless_present = "load_session",
        default_value = ""
    )]
    prompt: String,
    /// Save the sequence (prompt + generated tokens, with its state) to
    /// FILE at the end, to continue later without re-processing it.
    #[arg(long = "save-session", value_name = "FILE")]
    save_session: Option<std::path::PathBuf>,
    /// Continue a sequence saved with --save-session.
    #[arg(long = "load-session", value_name = "FILE")]
    load_session: Option<std::path::PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    constraint: ConstraintArgs,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Keep generating after an end-of-generation token.
    #[arg(long = "ignore-eos")]
    ignore_eos: bool,
    /// Tokens per micro-batch when processing the prompt.
    #[arg(long = "ubatch", default_value_t = 512)]
    ubatch: usize,
}

pub fn run(a: Args) -> Result<()> {
    if a.ubatch == 0 {
        bail!("--ubatch must be at least 1");
    }
    let mut spec = a.spec.params()?;
    if spec.is_some() && a.model.checkpoint_interval == 1 {
        // A verification never runs past a periodic checkpoint position.
        eprintln!("note: --spec has no effect with --checkpoint-interval 1; decoding plainly");
        spec = None;
    }

    let nextn = spec.is_some() && a.spec.nextn();
    let mut engine = a.model.load_with(1, a.ubatch, spec.is_some(), nextn)?;
    let mut speculator = match spec {
        Some(p) => Some(a.spec.speculator(p, &engine, &a.model)?),
        None => None,
    };
    let tokenizer = std::sync::Arc::new(
        Tokenizer::from_gguf(&engine.file)
            .with_context(|| format!("reading the tokenizer of {}", a.model.model.display()))?,
    );
    let mut constraint = a.constraint.compile(&tokenizer)?;
    let params = a.sampling.params(&tokenizer)?;
    let info = engine.model.info();
    eprintln!(
        "model: {} ({}), {} layers [{}], vocab {}, {} threads",
        a.model.model.display(),
        info.arch,
        info.plan.layers.len(),
        info.plan.pattern(),
        info.n_vocab,
        engine.pool.n_threads()
    );
    eprintln!("memory: {}", engine.mem.describe());
    eprintln!("weights: {}", engine.weights_where());
    eprintln!("system: {}", super::common::simd_info()?);
    let mut sampler = Sampler::new(params);
    let mut prompt = match &a.load_session {
        Some(path) => {
            engine
                .load_session(0, path)
                .with_context(|| format!("loading the session {}", path.display()))?;
            let held = engine.mem.seq_tokens(0)?.to_vec();
            eprintln!(
                "session: {} tokens loaded from {}",
                held.len(),
                path.display()
            );
            held.iter().for_each(|&t| sampler.accept(t));
            let mut more = tokenizer.encode(&a.prompt, false);
            if more.is_empty() {
                // Continue from the saved end: step back one token (an exact
                // rollback) so that its logits are computed again.
                let Some(&last) = held.last() else {
                    bail!("the session is empty and no --prompt was given");
                };
                engine.seq_truncate(0, held.len() - 1)?;
                more.push(last);
            }
            more
        }
        None => tokenizer.encode(&a.prompt, true),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let held = engine.mem.seq_len(0)?;
    let n_ctx = engine.opts.n_ctx;
    if held + prompt.len() + a.n_predict > n_ctx {
        bail!(
            "prompt ({} tokens, {} already held) + --n-predict {} exceed the context of {n_ctx} (raise -c / --ctx-size)",
            prompt.len(),
            held,
            a.n_predict,
        );
    }
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        stop: a.stop.clone(),
        stop_at_eos: !a.ignore_eos,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let _ = write!(out, "{}", a.prompt);
    let _ = out.flush();
    let stats = generate_constrained(
        &mut engine,
        &tokenizer,
        0,
        &std::mem::take(&mut prompt),
        &mut sampler,
        &opts,
        speculator.as_mut(),
        constraint.as_mut(),
        |text| {
            // A closed stdout (e.g. `| head`) ends generation quietly.
            write!(out, "{text}").and_then(|_| out.flush()).is_ok()
        },
    )?;
    let _ = writeln!(out);
    if let Some(path) = &a.save_session {
        // The last sampled token has not gone through the model yet.
        if let Some(&last) = stats.tokens.last() {
            engine.eval(0, &[last], LogitRows::None, 0)?;
        }
        engine
            .save_session(0, path)
            .with_context(|| format!("saving the session to {}", path.display()))?;
        eprintln!(
            "session: {} tokens saved to {}",
            engine.mem.seq_len(0)?,
            path.display()
        );
    }
    eprintln!(
        "\nprompt: {} tokens in {:.3} s ({:.2} tokens/s) | generation: {} tokens in {:.3} s ({:.2} tokens/s) | stop: {:?}",
        stats.n_prompt,
        stats.prompt_secs,
        stats.prompt_tps(),
        stats.n_gen,
        stats.gen_secs,
        stats.gen_tps(),
        stats.stop
    );
    if let Some(c) = &stats.spec {
        eprintln!("{}", super::common::spec_summary(c));
    }
    Ok(())
}
