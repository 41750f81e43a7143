//! The context size when `-c` / `--ctx-size` is not given: the model's
//! trained context (`{arch}.context_length`), as llama.cpp takes it,
//! lowered to what the machine's memory holds.

/// Context used when the file names none.
pub const FALLBACK_CTX: usize = 4096;
/// Share of the available memory the attention cells may grow to.
pub const FIT_FRACTION: f64 = 0.8;
/// A lowered context is a multiple of this (the attention cells' page).
const STEP: usize = 256;

/// The context chosen and, where it was lowered, why.
#[derive(Debug, PartialEq)]
pub struct Fit {
    pub n_ctx: usize,
    pub lowered: Option<String>,
}

/// The trained context `trained` (0: unknown, [`FALLBACK_CTX`]) fitted to
/// `available` bytes of memory, where every token of context takes
/// `bytes_per_token` bytes of attention cells (all sequences together; 0
/// for a model without attention, whose memory does not grow with the
/// context); never below `at_least`. `key` names the metadata key read.
pub fn fit(
    trained: usize,
    key: &str,
    bytes_per_token: u64,
    available: Option<u64>,
    at_least: usize,
) -> Fit {
    let want = if trained == 0 { FALLBACK_CTX } else { trained }.max(at_least);
    let (Some(avail), true) = (available, bytes_per_token > 0) else {
        return Fit {
            n_ctx: want,
            lowered: None,
        };
    };
    let budget = (avail as f64 * FIT_FRACTION) as u64;
    let fits = (budget / bytes_per_token) as usize;
    if want <= fits {
        return Fit {
            n_ctx: want,
            lowered: None,
        };
    }
    let n_ctx = (fits / STEP * STEP).max(STEP).min(want).max(at_least);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let from = match trained {
        0 => format!("{want} tokens ({key} is missing; the default)"),
        t => format!("the model's trained context of {t} tokens ({key})"),
    };
    Fit {
        n_ctx,
        lowered: Some(format!(
            "context lowered to {n_ctx} tokens from {from}: its attention cells would grow to {:.1} GiB \
             ({bytes_per_token} bytes per token over all sequences) and {:.1} GiB of memory is available, \
             {:.0}% of which they may take; -c / --ctx-size sets the context",
            gib(bytes_per_token.saturating_mul(want as u64)),
            gib(avail),
            FIT_FRACTION * 100.0
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trained_context_is_kept_where_it_fits() {
        let f = fit(32768, "k", 1000, Some(1 << 40), 0);
        assert_eq!(
            f,
            Fit {
                n_ctx: 32768,
                lowered: None
            }
        );
        // No attention: the memory does not grow with the context.
        assert_eq!(fit(1 << 20, "k", 0, Some(1 << 20), 0).n_ctx, 1 << 20);
        // Memory unknown.
        assert_eq!(fit(1 << 20, "k", 1 << 20, None, 0).n_ctx, 1 << 20);
        assert_eq!(fit(0, "k", 1, Some(1 << 40), 0).n_ctx, FALLBACK_CTX);
        assert_eq!(fit(100, "k", 1, Some(1 << 40), 5000).n_ctx, 5000);
    }

    #[test]
    fn a_context_beyond_the_memory_is_lowered_with_the_reason() {
        // 262144 tokens × 128 KiB = 32 GiB; 10 GiB available → 8 GiB → 65536.
        let f = fit(
            262144,
            "qwen35.context_length",
            128 << 10,
            Some(10 << 30),
            0,
        );
        assert_eq!(f.n_ctx, 65536);
        let why = f.lowered.unwrap();
        assert!(
            why.contains("262144") && why.contains("qwen35.context_length"),
            "{why}"
        );
        assert!(
            why.contains("32.0 GiB") && why.contains("10.0 GiB") && why.contains("--ctx-size"),
            "{why}"
        );
        // Never below what the command needs, nor below one page.
        assert_eq!(fit(262144, "k", 1 << 30, Some(1 << 30), 1000).n_ctx, 1000);
        assert_eq!(fit(262144, "k", 1 << 30, Some(1 << 30), 0).n_ctx, 256);
    }
}
