//! `coil chat -m MODEL`: an interactive chat in the terminal, on the
//! server's engine (chat template, streaming, prefix cache): each turn
//! processes only its new tokens, the history stays in memory.
//! Commands: `/reset` forgets the conversation, `/exit` (or end of input)
//! quits.

use super::common::{ConstraintArgs, ModelArgs, SamplingArgs};
use anyhow::{anyhow, bail, Context, Result};
use coil::engine::sampling::SamplingParams;
use coil::tokenizer::Tokenizer;
use coil_server::request::{chat_prompt, message_ends};
use coil_server::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig};
use coil_server::template::{ChatTemplate, TemplateVars};
use serde_json::{json, Value};
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// A system message that opens the conversation.
    #[arg(long = "system")]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n_predict: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Constrains every reply (a fresh constraint per reply).
    #[command(flatten)]
    constraint: ConstraintArgs,
    #[command(flatten)]
    spec: super::common::SpecArgs,
    /// Also stop a reply when this text appears (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Tokens per micro-batch when processing a prompt.
    #[arg(long = "ubatch", default_value_t = 512)]
    ubatch: usize,
    /// A Jinja chat template file to use in place of the model's own
    /// (`tokenizer.chat_template`).
    #[arg(
        long = "chat-template-file",
        visible_alias = "chat-template",
        value_name = "FILE"
    )]
    chat_template: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    if a.ubatch == 0 {
        bail!("--ubatch must be at least 1");
    }
    let spec = a.spec.params()?;
    // One slot for the reply being generated, one keeping the conversation.
    let engine = a
        .model
        .load_with(2, a.ubatch, spec.is_some(), a.spec.nextn())?;
    let draft = match spec {
        Some(_) => a.spec.draft_model(&engine, &a.model)?,
        None => None,
    };
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(&engine.file)
            .with_context(|| format!("reading the tokenizer of {}", a.model.model.display()))?,
    );
    let params = a.sampling.params(&tokenizer)?;
    let template = match &a.chat_template {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the chat template {}", path.display()))?;
            ChatTemplate::new(Some(&text), &tokenizer)
                .with_context(|| format!("the chat template {}", path.display()))?
        }
        None => ChatTemplate::from_gguf(&engine.file, &tokenizer)?,
    };
    let constraint = a.constraint.compile(&tokenizer)?;
    let info = engine.model.info();
    eprintln!(
        "model: {} ({}), {} layers [{}]; chat template: {}",
        a.model.model.display(),
        info.arch,
        info.plan.layers.len(),
        info.plan.pattern(),
        if a.chat_template.is_some() {
            "--chat-template-file"
        } else if template.from_model {
            "the model's"
        } else {
            "ChatML (the model has none)"
        }
    );
    let mut cfg = SchedulerConfig {
        parallel: 1,
        spec,
        ..Default::default()
    };
    if let Some(n) = a.model.checkpoint_spacing {
        cfg.checkpoint_spacing = n as usize;
    }
    let (sched, _engine_thread) =
        Scheduler::start_with_draft(engine, draft, tokenizer.clone(), cfg)?;
    let n_ctx = sched.n_ctx;

    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        eprintln!("type a message and press Enter; /reset forgets the conversation, /exit or Ctrl-D quits");
    }
    let opening: Vec<Value> = a
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    let mut messages = opening.clone();
    let no_vars = TemplateVars::default();
    let stdout = std::io::stdout();
    let mut input = stdin.lock();
    let mut line = String::new();
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        line.clear();
        if input
            .read_line(&mut line)
            .context("reading standard input")?
            == 0
        {
            break;
        }
        let text = line.trim_end_matches(['\n', '\r']);
        match text.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = opening.clone();
                eprintln!("[conversation reset]");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": text}));
        let prompt = chat_prompt(&template, &tokenizer, &messages, &no_vars)
            .map_err(|e| anyhow!("{}", e.message))?;
        if prompt.len() >= n_ctx {
            messages.pop();
            eprintln!(
                "[the conversation ({} tokens) no longer fits the context of {n_ctx}: /reset, or raise --ctx]",
                prompt.len()
            );
            continue;
        }
        let mut stops = a.stop.clone();
        stops.extend(template.extra_stops.iter().cloned());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let max_tokens = a.n_predict.min(n_ctx - prompt.len());
        let marks = message_ends(&template, &tokenizer, &messages, &no_vars, &prompt);
        let req = GenRequest {
            prompt,
            marks,
            params: SamplingParams {
                seed: params.seed.wrapping_add(messages.len() as u64),
                ..params.clone()
            },
            max_tokens,
            stop: stops,
            stop_at_eos: true,
            n: 1,
            logprobs: None,
            constraint: constraint.clone(),
            events: tx,
        };
        if !sched.submit(req) {
            bail!("the engine stopped");
        }
        let t0 = Instant::now();
        let mut reply = String::new();
        let mut out = stdout.lock();
        loop {
            match rx.blocking_recv() {
                Some(Event::Text { text: t, .. }) => {
                    reply.push_str(&t);
                    let _ = write!(out, "{t}");
                    let _ = out.flush();
                }
                Some(Event::Done { usage, .. }) => {
                    let _ = writeln!(out);
                    let _ = out.flush();
                    let secs = t0.elapsed().as_secs_f64();
                    eprintln!(
                        "[prompt {} tokens: {} cached, {} processed | reply {} tokens in {:.2} s, {:.1} tokens/s]",
                        usage.prompt_tokens,
                        usage.cached_tokens,
                        usage.prompt_tokens - usage.cached_tokens,
                        usage.completion_tokens,
                        secs,
                        if secs > 0.0 { usage.completion_tokens as f64 / secs } else { 0.0 }
                    );
                    break;
                }
                Some(Event::Error(m)) => bail!("{m}"),
                None => bail!("the engine stopped"),
            }
        }
        messages.push(json!({"role": "assistant", "content": reply}));
    }
    Ok(())
}
