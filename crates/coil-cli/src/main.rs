//! `coil`: run, inspect and serve state-space and hybrid language models.

mod alloc;
mod cmd;

#[global_allocator]
static ALLOC: alloc::LineAligned = alloc::LineAligned;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "coil",
    version,
    about = "Inference for state-space (Mamba, Mamba-2) and hybrid SSM + attention models from GGUF files",
    long_about = None,
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF file: architecture, metadata, tensors, totals and the
    /// per-layer plan (attention / Mamba-1 / Mamba-2 / parallel; dense / MoE).
    Inspect(cmd::inspect::Args),
    /// Generate text from a prompt, streamed as it is produced; prompt and
    /// generation speed are printed on stderr at the end.
    Run(cmd::run::Args),
    /// Write the logits of every position of a token list to a float32 .npy
    /// file [n_tokens, n_vocab] (for checking coil against other engines).
    Logits(cmd::logits::Args),
    /// Measure prompt processing (pp) and generation (tg) speed in tokens/s,
    /// as llama.cpp's llama-bench does (random tokens, mean ± std over runs).
    Bench(cmd::bench::Args),
    /// Convert a Hugging Face checkpoint (safetensors) to GGUF, as llama.cpp's
    /// convert_hf_to_gguf.py does.
    Convert(cmd::convert::Args),
    /// Quantize a GGUF file with llama.cpp's per-tensor type mixtures.
    Quantize(cmd::quantize::Args),
    /// Collect an importance matrix (per-column activation statistics of
    /// every weight matrix over a calibration text) for `quantize
    /// --imatrix`, in llama-imatrix's file format.
    Imatrix(cmd::imatrix::Args),
    /// The perplexity of a text file, as llama.cpp's llama-perplexity
    /// computes it (non-overlapping windows of --ctx tokens, the second half
    /// of each scored).
    Perplexity(cmd::perplexity::Args),
    /// Serve the model over HTTP with OpenAI's API (/v1/completions,
    /// /v1/chat/completions, streaming), continuous batching and a prefix
    /// cache that never re-processes a conversation's history.
    Serve(cmd::serve::Args),
    /// Chat with the model in the terminal (its chat template, streamed
    /// replies, history kept in memory without re-processing).
    Chat(cmd::chat::Args),
}

/// llama.cpp's multi-letter short flags, as the long flags coil spells them
/// (clap's short flags are one letter).
const LLAMA_CPP_FLAGS: [(&str, &str); 2] = [("-np", "--parallel"), ("-md", "--model-draft")];

/// The command line with llama.cpp's multi-letter short flags spelt long
/// (`-md FILE` and `-md=FILE` alike).
fn llama_style_args() -> Vec<std::ffi::OsString> {
    std::env::args_os()
        .map(|a| {
            let Some(s) = a.to_str() else { return a };
            for (short, long) in LLAMA_CPP_FLAGS {
                if s == short {
                    return long.into();
                }
                if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}").into();
                }
            }
            a
        })
        .collect()
}

/// Output piped into a reader that stops early (`coil inspect FILE | head
/// -1`) ends the process quietly, as for other command-line tools, instead
/// of a panic on the failed write: SIGPIPE's default action. Not for the
/// server, whose closed client sockets must not end it.
fn end_quietly_on_closed_pipes() {
    #[cfg(unix)]
    // SAFETY: sets a signal disposition before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(llama_style_args());
    if !matches!(cli.command, Command::Serve(_)) {
        end_quietly_on_closed_pipes();
    }
    let result = match cli.command {
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Logits(a) => cmd::logits::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Quantize(a) => cmd::quantize::run(a),
        Command::Imatrix(a) => cmd::imatrix::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Chat(a) => cmd::chat::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
