//! Flags and helpers shared by the subcommands that run a model.

use anyhow::{bail, Context, Result};
use coil::engine::dry::{DryBreakers, DryParams, DEFAULT_BREAKERS};
use coil::engine::sampling::{Mirostat, SamplingParams};
use coil::engine::{Engine, EngineOptions, WeightMemory};
use coil::memory::{CacheType, CheckpointPolicy, StateType};
use std::path::{Path, PathBuf};

/// The bundled demo model (tools/train_demo.py, models/README.md), the
/// default of `--model`.
pub const DEFAULT_MODEL: &str = "models/shakespeare-hybrid-q8_0.gguf";

/// `--model` as given, except that the default (the bundled demo model) is
/// looked for relative to the current directory, then relative to the
/// repository the executable was built in (`../../models` from
/// `target/release/coil`).
pub fn resolve_model(model: &Path) -> Result<PathBuf> {
    if model != Path::new(DEFAULT_MODEL) || model.exists() {
        return Ok(model.to_path_buf());
    }
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("../..").join(DEFAULT_MODEL)));
    if let Some(p) = &beside_exe {
        if p.exists() {
            return Ok(p.clone());
        }
    }
    let cwd = std::env::current_dir()
        .map(|d| d.join(DEFAULT_MODEL))
        .unwrap_or_else(|_| PathBuf::from(DEFAULT_MODEL));
    bail!(
        "no model given (-m FILE.gguf) and the bundled demo model is not at {} nor at {}",
        cwd.display(),
        beside_exe.map_or_else(
            || "(executable path unknown)".to_string(),
            |p| p.display().to_string()
        )
    )
}

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model file. Default: the bundled demo model (looked for in
    /// the current directory, then beside the `coil` executable's repository).
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Worker threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size: the most tokens a sequence may hold. Default: the
    /// model's trained context (`{arch}.context_length`), lowered (with a
    /// message) to what the memory holds; 0: the trained context as it is.
    #[arg(
        short = 'c',
        long = "ctx-size",
        visible_alias = "ctx",
        value_name = "N"
    )]
    pub ctx: Option<usize>,
    /// The least context the command needs (set by the command, not a flag).
    #[arg(skip)]
    pub ctx_min: usize,
    /// Tokens between recurrent-state checkpoints (for rollback; 0 = only
    /// at the end of each prompt or generation step). Prompts run in
    /// micro-batches that end at these positions, so the default equals the
    /// micro-batch size (512): a rollback replays at most 511 tokens.
    #[arg(long = "checkpoint-interval", default_value_t = 512)]
    pub checkpoint_interval: usize,
    /// Memory for checkpoints per sequence, in MiB; over it they are thinned
    /// out (spaced further apart), never dropped entirely.
    #[arg(long = "checkpoint-budget", default_value_t = 256)]
    pub checkpoint_budget_mib: usize,
    /// Also checkpoint after every generated token, so stepping back a few
    /// tokens (regenerate, speculative decoding) replays nothing; costs a
    /// copy of the recurrent state per token. `coil serve` always does.
    #[arg(long = "checkpoint-every-token")]
    pub checkpoint_every_token: bool,
    /// With checkpoints during generation (`coil serve`, `coil chat`,
    /// `--checkpoint-every-token`): one every N generated tokens (default:
    /// 1; `coil serve` and `coil chat`: 4). A conversation resuming between two processes
    /// the < N tokens past the earlier one again; each checkpoint costs
    /// decode speed (the state moves to another buffer instead of being
    /// updated in place).
    #[arg(long = "checkpoint-spacing", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub checkpoint_spacing: Option<u32>,
    /// How the recurrent (SSM / delta-rule) state is stored: f32 (exact) or
    /// bf16 (half the memory and state traffic per token, computed in f32;
    /// logits move slightly). The conv windows stay f32.
    #[arg(long = "state-type", value_name = "TYPE", default_value = "f32",
          value_parser = parse_state_type)]
    pub state_type: StateType,
    /// How attention K/V cells are stored: f32 (exact) or f16 (half the
    /// memory per token; attention computed in f32).
    #[arg(long = "cache-type", value_name = "TYPE", default_value = "f32",
          value_parser = parse_cache_type)]
    pub cache_type: CacheType,
    /// Keep the weights in a memory map of the file (pages of the page
    /// cache, shared with other processes and evictable) instead of reading
    /// them into this process's memory in transparent huge pages — the
    /// default where the system has them (Linux, `transparent_hugepage`
    /// not `never`) and the file takes at most 60% of the available
    /// memory: fewer TLB misses, decode up to ~15% faster.
    #[arg(long = "mmap")]
    pub mmap: bool,
}

fn parse_cache_type(s: &str) -> Result<CacheType, String> {
    s.parse()
        .map_err(|e: coil::memory::UnknownCacheType| e.to_string())
}

fn parse_state_type(s: &str) -> Result<StateType, String> {
    s.parse()
        .map_err(|e: coil_kernels::ops::state_elem::UnknownStateType| e.to_string())
}

/// Checks `COIL_SIMD` against this CPU (a level it lacks is an error, not
/// an illegal instruction later) and returns the system-info line to print:
/// the SIMD level the kernels use and the CPU features seen.
pub fn simd_info() -> Result<String> {
    coil_kernels::simd::check_env()?;
    Ok(coil_kernels::system_info())
}

impl ModelArgs {
    /// The engine for `n_seq_max` sequences; `batched`: generation runs
    /// several tokens per step (sequences decoding together, speculative
    /// verification, or prompts only), so the weights take the layout of
    /// the few-token kernels ([`EngineOptions::batched_layout`]).
    pub fn load(&self, n_seq_max: usize, n_ubatch: usize, batched: bool) -> Result<Engine> {
        self.load_with(n_seq_max, n_ubatch, batched, false)
    }

    /// [`ModelArgs::load`], the engine keeping the memory of the model's
    /// NextN / MTP block when `nextn` (`--spec mtp`; an error for a model
    /// without one).
    pub fn load_with(
        &self,
        n_seq_max: usize,
        n_ubatch: usize,
        batched: bool,
        nextn: bool,
    ) -> Result<Engine> {
        coil_kernels::simd::check_env()?;
        let threads = self
            .threads
            .unwrap_or_else(coil_kernels::ThreadPool::default_threads);
        if threads == 0 {
            bail!("--threads must be at least 1");
        }
        let opts = EngineOptions {
            n_threads: threads,
            n_seq_max,
            n_ctx: self
                .ctx
                .filter(|&c| c > 0)
                .unwrap_or(super::context::FALLBACK_CTX)
                .max(self.ctx_min),
            n_ubatch,
            checkpoints: CheckpointPolicy {
                interval: self.checkpoint_interval,
                budget_bytes: self.checkpoint_budget_mib.saturating_mul(1 << 20),
                every_call: self.checkpoint_every_token,
                call_spacing: self.checkpoint_spacing.unwrap_or(1) as usize,
                ..Default::default()
            },
            batched_layout: batched,
            nextn,
            weights: if self.mmap {
                WeightMemory::Mapped
            } else {
                WeightMemory::Auto
            },
        };
        let path = resolve_model(&self.model)?;
        let mut engine =
            Engine::load(&path, opts).with_context(|| format!("loading {}", path.display()))?;
        if self.state_type != StateType::F32 {
            engine.set_state_type(self.state_type);
        }
        if self.cache_type != CacheType::F32 {
            engine.set_cache_type(self.cache_type);
        }
        self.set_context(&mut engine)?;
        if self.checkpoint_every_token {
            reserve_state_buffers(&mut engine, n_seq_max);
        }
        Ok(engine)
    }
}

impl ModelArgs {
    /// Makes the context at least `n` tokens (a command that needs them).
    pub fn ctx_at_least(&mut self, n: usize) {
        self.ctx_min = self.ctx_min.max(n);
        if let Some(c) = self.ctx.as_mut().filter(|c| **c > 0) {
            *c = (*c).max(n);
        }
    }

    /// Without `-c`: the model's trained context, lowered to the memory
    /// (said on stderr); `-c 0`: the trained context as it is.
    fn set_context(&self, engine: &mut Engine) -> Result<()> {
        let trained = engine.model.info().n_ctx_train;
        let key = format!("{}.context_length", engine.model.info().arch);
        let n_ctx = match self.ctx {
            Some(c) if c > 0 => return Ok(()),
            Some(_) if trained > 0 => trained.max(self.ctx_min),
            Some(_) => bail!("-c 0 asks for the trained context, but the model has no {key}"),
            None => {
                let per_token = engine
                    .mem
                    .kv
                    .as_ref()
                    .map_or(0, |k| (k.bytes_per_token() * engine.opts.n_seq_max) as u64);
                let mut available = coil_kernels::hugepages::mem_available();
                if !engine.file.is_read_into_memory() {
                    // Mapped weights stay in the page cache beside the cells.
                    available = available.map(|a| a.saturating_sub(engine.file.file_len()));
                }
                let f = super::context::fit(trained, &key, per_token, available, self.ctx_min);
                if let Some(why) = f.lowered {
                    eprintln!("{why}");
                }
                f.n_ctx
            }
        };
        if n_ctx != engine.opts.n_ctx {
            engine.set_context(n_ctx)?;
        }
        Ok(())
    }
}

/// With a checkpoint per generated token, `running` sequences' states move
/// through buffers taken from a reserve instead of fresh pages (see
/// `RecurrentMemory::reserve_buffers`); says on stderr what it reserved.
pub fn reserve_state_buffers(engine: &mut Engine, running: usize) {
    let n = coil_server::scheduler::state_buffers_wanted(engine, running);
    if let Some(r) = engine.mem.recurrent.as_mut() {
        let n = r.reserve_buffers(n);
        eprintln!(
            "memory: {n} state buffers reserved for the checkpoints taken during generation ({:.0} MiB; --checkpoint-budget bounds them)",
            (n * r.bytes_per_seq()) as f64 / (1 << 20) as f64
        );
    }
}

/// Sampling flags shared by `run` and `chat`.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Random seed (default: from the clock).
    #[arg(long = "seed", short = 's')]
    pub seed: Option<u64>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this total probability (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best one (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise repeating recent tokens (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract from the logit of every token already present.
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract per occurrence of a token already present.
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Locally typical sampling, parameter p (1 = off).
    #[arg(long = "typical", visible_alias = "typical-p", default_value_t = 1.0)]
    pub typical: f32,
    /// Top-n-σ: keep tokens within N standard deviations of the best
    /// logit (-1 = off).
    #[arg(long = "top-nsigma", visible_alias = "top-n-sigma", default_value_t = -1.0, allow_negative_numbers = true)]
    pub top_n_sigma: f32,
    /// XTC: the chance per token of excluding the top choices (0 = off).
    #[arg(long = "xtc-probability", default_value_t = 0.0)]
    pub xtc_probability: f32,
    /// XTC: how likely a token must be to be excluded (> 0.5 = off).
    #[arg(long = "xtc-threshold", default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// DRY repetition penalty multiplier (0 = off).
    #[arg(long = "dry-multiplier", default_value_t = 0.0)]
    pub dry_multiplier: f32,
    /// DRY penalty base: multiplier · base^(repeat length − allowed length).
    #[arg(long = "dry-base", default_value_t = 1.75)]
    pub dry_base: f32,
    /// DRY: repeats this long are not penalized.
    #[arg(long = "dry-allowed-length", default_value_t = 2)]
    pub dry_allowed_length: usize,
    /// DRY: how many recent tokens to scan for repeats (0 = off).
    #[arg(long = "dry-penalty-last-n", default_value_t = 64)]
    pub dry_penalty_last_n: usize,
    /// DRY sequence breaker (repeatable; replaces the defaults \n : " *;
    /// "none" for none).
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    pub dry_sequence_breaker: Vec<String>,
    /// Mirostat: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (replaces top-k,
    /// top-p, min-p, typical, XTC and the penalties).
    #[arg(long = "mirostat", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub mirostat: u8,
    /// Mirostat learning rate (eta).
    #[arg(long = "mirostat-lr", default_value_t = 0.1)]
    pub mirostat_lr: f32,
    /// Mirostat target entropy (tau).
    #[arg(long = "mirostat-ent", default_value_t = 5.0)]
    pub mirostat_ent: f32,
    /// Bias a token's logit: TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf
    /// (repeatable).
    #[arg(
        short = 'l',
        long = "logit-bias",
        value_name = "TOKEN_ID(+/-)BIAS",
        allow_hyphen_values = true
    )]
    pub logit_bias: Vec<String>,
}

/// `TOKEN_ID(+/-)BIAS` as llama.cpp's `--logit-bias` takes it.
pub fn parse_logit_bias(s: &str) -> Result<(u32, f32)> {
    let at = s
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == '+' || c == '-')
        .map(|(i, _)| i)
        .with_context(|| format!("--logit-bias {s:?}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1"))?;
    let (id, bias) = s.split_at(at);
    let id: u32 = id
        .parse()
        .with_context(|| format!("--logit-bias {s:?}: {id:?} is not a token id"))?;
    let bias: f32 = bias
        .parse()
        .with_context(|| format!("--logit-bias {s:?}: {bias:?} is not a number"))?;
    Ok((id, bias))
}

impl SamplingArgs {
    /// Checked sampling parameters (the seed from the clock when not
    /// given; DRY's sequence breakers looked up in `tok`'s vocabulary when
    /// DRY is on).
    pub fn params(&self, tok: &coil::tokenizer::Tokenizer) -> Result<SamplingParams> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        let params = SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            typical_p: self.typical,
            top_n_sigma: self.top_n_sigma,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            dry: DryParams {
                multiplier: self.dry_multiplier,
                base: self.dry_base,
                allowed_length: self.dry_allowed_length,
                penalty_last_n: self.dry_penalty_last_n,
                breakers: Default::default(),
            },
            mirostat: match self.mirostat {
                1 => Mirostat::V1,
                2 => Mirostat::V2,
                _ => Mirostat::Off,
            },
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            logit_bias: self
                .logit_bias
                .iter()
                .map(|s| parse_logit_bias(s))
                .collect::<Result<_>>()?,
            seed,
        };
        params.validate().map_err(anyhow::Error::msg)?;
        if let Some(&(t, _)) = params
            .logit_bias
            .iter()
            .find(|b| b.0 as usize >= tok.n_vocab())
        {
            bail!(
                "--logit-bias: token {t} is outside the vocabulary of {}",
                tok.n_vocab()
            );
        }
        let mut params = params;
        if params.dry.is_on() {
            let texts: Vec<String> = if self.dry_sequence_breaker.is_empty() {
                DEFAULT_BREAKERS.iter().map(|s| s.to_string()).collect()
            } else {
                self.dry_sequence_breaker
                    .iter()
                    .filter(|s| s.as_str() != "none")
                    .cloned()
                    .collect()
            };
            params.dry.breakers = std::sync::Arc::new(DryBreakers::new(tok, &texts));
        }
        Ok(params)
    }
}

/// Output constraint flags shared by `run` and `chat` (llama.cpp's names).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConstraintArgs {
    /// Constrain the output to a GBNF grammar (llama.cpp's syntax).
    #[arg(long = "grammar", value_name = "GBNF", conflicts_with_all = ["grammar_file", "json_schema", "json_schema_file"])]
    pub grammar: Option<String>,
    /// Constrain the output to the GBNF grammar in FILE.
    #[arg(long = "grammar-file", value_name = "FILE", conflicts_with_all = ["json_schema", "json_schema_file"])]
    pub grammar_file: Option<PathBuf>,
    /// Constrain the output to JSON valid against this JSON schema (`{}`:
    /// any JSON value).
    #[arg(
        short = 'j',
        long = "json-schema",
        value_name = "SCHEMA",
        conflicts_with = "json_schema_file"
    )]
    pub json_schema: Option<String>,
    /// Constrain the output to JSON valid against the JSON schema in FILE.
    #[arg(long = "json-schema-file", value_name = "FILE")]
    pub json_schema_file: Option<PathBuf>,
}

impl ConstraintArgs {
    /// The constraint the flags ask for, read and checked (`None`: free
    /// text).
    pub fn spec(&self) -> Result<Option<coil::engine::constraint::ConstraintSpec>> {
        use coil::engine::constraint::ConstraintSpec;
        let read = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let schema = |text: &str, what: &str| -> Result<ConstraintSpec> {
            let v =
                serde_json::from_str(text).with_context(|| format!("{what} is not valid JSON"))?;
            Ok(ConstraintSpec::JsonSchema(v))
        };
        Ok(if let Some(g) = &self.grammar {
            Some(ConstraintSpec::Gbnf(g.clone()))
        } else if let Some(p) = &self.grammar_file {
            Some(ConstraintSpec::Gbnf(read(p)?))
        } else if let Some(s) = &self.json_schema {
            Some(schema(s, "--json-schema")?)
        } else if let Some(p) = &self.json_schema_file {
            Some(schema(&read(p)?, &p.display().to_string())?)
        } else {
            None
        })
    }

    /// The compiled constraint for `tokenizer` (an error names what is
    /// wrong: the schema's path, the grammar's line and column).
    pub fn compile(
        &self,
        tokenizer: &std::sync::Arc<coil::tokenizer::Tokenizer>,
    ) -> Result<Option<coil::engine::constraint::Constraint>> {
        let Some(spec) = self.spec()? else {
            return Ok(None);
        };
        let what = match spec {
            coil::engine::constraint::ConstraintSpec::Gbnf(_) => "the grammar",
            _ => "the JSON schema",
        };
        let cs = coil::engine::constraint::Constraints::new(tokenizer.clone())?;
        let c = cs
            .compile(&spec)
            .with_context(|| format!("{what} cannot constrain the output"))?;
        Ok(Some(c))
    }
}

/// What drafts speculative decoding (`--spec`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// Prompt lookup: the continuation of the last n tokens' earlier
    /// occurrence in the prompt or the text generated so far.
    Ngram,
    /// The model's own multi-token-prediction (NextN / MTP) layers
    /// (Qwen3.5 / Qwen3.6, Qwen3-Next, Nemotron-3 files that carry them).
    Mtp,
    /// A smaller model with the same vocabulary (`--model-draft`).
    Draft,
}

/// Speculative decoding flags shared by `run`, `chat`, `serve` and `bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: draft tokens (`ngram`: looked up in the prompt
    /// and the text so far; `mtp`: the model's own MTP layers; `draft`: a
    /// smaller model, --model-draft) and verify them in one pass. The
    /// output is the same as without it.
    #[arg(long = "spec", value_enum, value_name = "KIND")]
    pub spec: Option<SpecKind>,
    /// Most draft tokens per verification, adapted down as drafts fail
    /// (default: 8 with ngram, 3 with mtp and a draft model).
    #[arg(long = "draft-max", value_name = "K")]
    pub draft_max: Option<usize>,
    /// Longest n-gram looked up (the shortest is 2).
    #[arg(long = "ngram", value_name = "N", default_value_t = 4)]
    pub ngram: usize,
    /// A draft model (`-md`): a smaller model with the same vocabulary
    /// whose greedy continuation is verified (implies `--spec draft`).
    #[arg(long = "model-draft", value_name = "FILE")]
    pub model_draft: Option<std::path::PathBuf>,
}

impl SpecArgs {
    /// What drafts (`--model-draft` alone means a draft model).
    pub fn kind(&self) -> Result<Option<SpecKind>> {
        match (self.spec, &self.model_draft) {
            (None, Some(_)) | (Some(SpecKind::Draft), Some(_)) => Ok(Some(SpecKind::Draft)),
            (Some(SpecKind::Draft), None) => bail!("--spec draft needs --model-draft FILE"),
            (Some(k), Some(_)) => bail!(
                "--model-draft drafts by itself: it does not go with --spec {}",
                if k == SpecKind::Mtp { "mtp" } else { "ngram" }
            ),
            (k, None) => Ok(k),
        }
    }

    /// Whether the engine must keep the MTP block's memory.
    pub fn nextn(&self) -> bool {
        self.spec == Some(SpecKind::Mtp)
    }

    /// The checked settings, or `None` without speculation (a notice when
    /// draft flags were given without it).
    pub fn params(&self) -> Result<Option<coil::engine::draft::SpecParams>> {
        use coil::engine::draft::SpecKind as Lib;
        let kind = self.kind()?;
        let default_k = match kind {
            Some(SpecKind::Ngram) | None => 8,
            Some(SpecKind::Mtp | SpecKind::Draft) => 3,
        };
        let p =
            coil::engine::draft::SpecParams::new(self.draft_max.unwrap_or(default_k), self.ngram)
                .map_err(anyhow::Error::msg)?;
        match kind {
            Some(SpecKind::Ngram) => Ok(Some(p)),
            Some(SpecKind::Mtp) => Ok(Some(p.with_kind(Lib::Nextn))),
            Some(SpecKind::Draft) => Ok(Some(p.with_kind(Lib::Model))),
            None => {
                if self.draft_max.is_some() || self.ngram != 4 {
                    eprintln!("note: --draft-max / --ngram have no effect without --spec");
                }
                Ok(None)
            }
        }
    }

    /// The draft model for `engine` (`--model-draft`), loaded as `margs`
    /// loads the target, with as many sequences, and checked against it
    /// (vocabulary, context); `None` without one.
    pub fn draft_model(
        &self,
        engine: &Engine,
        margs: &ModelArgs,
    ) -> Result<Option<coil::engine::speculative::DraftModel>> {
        let Some(path) = &self.model_draft else {
            return Ok(None);
        };
        let mut dargs = margs.clone();
        dargs.model = path.clone();
        dargs.checkpoint_every_token = false;
        dargs.ctx_at_least(engine.mem.n_ctx());
        let draft = dargs
            .load(engine.opts.n_seq_max, 512, true)
            .with_context(|| format!("loading the draft model {}", path.display()))?;
        let dm = coil::engine::speculative::DraftModel::new(draft, engine)
            .with_context(|| format!("the draft model {}", path.display()))?;
        eprintln!(
            "draft model: {} ({}), {} layers",
            path.display(),
            dm.engine.model.info().arch,
            dm.engine.model.info().plan.layers.len()
        );
        Ok(Some(dm))
    }

    /// The speculator for `engine` (loaded with [`SpecArgs::nextn`]) of
    /// checked settings; a draft model is loaded here
    /// ([`SpecArgs::draft_model`]).
    pub fn speculator(
        &self,
        p: coil::engine::draft::SpecParams,
        engine: &Engine,
        margs: &ModelArgs,
    ) -> Result<coil::engine::speculative::Speculator> {
        use coil::engine::speculative::{DraftSource, Speculator};
        Ok(match self.kind()? {
            Some(SpecKind::Draft) => match self.draft_model(engine, margs)? {
                Some(dm) => Speculator::with_source(DraftSource::Model(Box::new(dm)), p.draft_max),
                None => bail!("--spec draft needs --model-draft FILE"),
            },
            Some(SpecKind::Mtp) => Speculator::with_source(DraftSource::Nextn, p.draft_max),
            _ => ngram_speculator(p),
        })
    }
}

/// The speculator of checked settings: n-gram drafts, adaptive length.
pub fn ngram_speculator(
    p: coil::engine::draft::SpecParams,
) -> coil::engine::speculative::Speculator {
    coil::engine::speculative::Speculator::new(
        Box::new(coil::engine::draft::NgramDrafter::new(p.ngram_max)),
        p.draft_max,
    )
}

/// The line a run prints about speculation.
pub fn spec_summary(c: &coil::engine::speculative::SpecCounts) -> String {
    format!(
        "speculative: {} drafted, {} accepted ({:.1}%) in {} verifications{}",
        c.drafted,
        c.accepted,
        100.0 * c.acceptance(),
        c.verifications,
        if c.replayed > 0 {
            format!(", {} tokens replayed", c.replayed)
        } else {
            String::new()
        }
    )
}
