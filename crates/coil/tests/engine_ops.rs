//! The engine's memory contract under random runs of operations (prompts
//! and decode steps of several sequences in one batch, rollbacks, forks,
//! clears, sessions; see tests/support/engine_ops.rs), on every
//! architecture's fixture, with checkpoint spacings, budgets and
//! micro-batch sizes drawn per run. The `engine_ops` fuzz target runs the
//! same check on bytes of its own.

use std::path::PathBuf;

#[path = "../../../tests/support/engine_ops.rs"]
mod engine_ops;
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;

fn fixtures() -> Vec<(&'static str, PathBuf)> {
    engine_ops::fixtures(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"))
}

/// `n` pseudo-random bytes from `seed`.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

#[test]
fn random_runs_of_operations_keep_every_sequence_exact() {
    let dir = temp_path::TempPath::dir("coil-engine-ops", "sessions");
    let (mut refused, mut replayed) = (0, 0);
    for (i, (arch, model)) in fixtures().into_iter().enumerate() {
        for seed in 0..3u64 {
            let b = bytes(seed * 31 + i as u64, 400);
            match engine_ops::run(&model, &b, &dir) {
                Ok(st) => {
                    eprintln!("{arch} seed {seed}: {st:?}");
                    assert!(st.compared >= 20, "{arch} seed {seed}: {st:?}");
                    refused += st.refused;
                    replayed += st.replayed;
                }
                Err(e) => panic!("{arch}, seed {seed}: {e}"),
            }
        }
    }
    // the runs reached refusals past the context and replaying rollbacks
    assert!(
        refused > 0 && replayed > 0,
        "{refused} refused, {replayed} replayed"
    );
}

/// The same on 100 seeds per fixture (about a minute on 2 cores; run by
/// hand: `cargo test --release -p coil --test engine_ops -- --ignored`).
#[test]
#[ignore]
fn many_random_runs_keep_every_sequence_exact() {
    let dir = temp_path::TempPath::dir("coil-engine-ops-many", "sessions");
    for (i, (arch, model)) in fixtures().into_iter().enumerate() {
        for seed in 0..100u64 {
            let b = bytes(1000 + seed * 31 + i as u64, 400);
            if let Err(e) = engine_ops::run(&model, &b, &dir) {
                panic!("{arch}, seed {seed}: {e}");
            }
        }
    }
}
