//! Exact rollback, forks and their independence, for every architecture:
//! (prefill n → truncate to p → decode m) equals (prefill p → decode m)
//! within 1e-6 relative, at random positions.

use coil::engine::{Engine, EngineOptions};
use coil::memory::{CheckpointPolicy, SequenceMemory};
use coil::models::LogitRows;
use std::path::PathBuf;

const ARCHS: [&str; 9] = [
    "mamba",
    "mamba2",
    "jamba",
    "bamba",
    "granitemoehybrid",
    "falcon_h1",
    "nemotron_h",
    "nemotron_h_moe",
    "llama",
];

fn fixture(arch: &str) -> (PathBuf, Vec<u32>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(arch);
    let t = std::fs::read_to_string(dir.join("tokens.json")).unwrap();
    let tokens = t
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|x| x.trim().parse().unwrap())
        .collect();
    (dir.join("model.f16.gguf"), tokens)
}

fn engine(path: &PathBuf, interval: usize) -> Engine {
    Engine::load(
        path,
        EngineOptions {
            n_seq_max: 4,
            n_ubatch: 16,
            checkpoints: CheckpointPolicy {
                interval,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= tol * max, "{what}: max |Δ| {diff} of {max}");
}

struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn truncate_then_decode_equals_prefill_then_decode() {
    let mut rng = Lcg(7);
    for arch in ARCHS {
        let (path, tokens) = fixture(arch);
        for interval in [8, 0] {
            let mut e = engine(&path, interval);
            let mut fresh = engine(&path, interval);
            for _ in 0..3 {
                let n = 20 + rng.below(20);
                let p = 1 + rng.below(n - 1);
                let m = 1 + rng.below(6);
                e.seq_clear(0).unwrap();
                e.eval(0, &tokens[..n], LogitRows::None, 0).unwrap();
                let st = e.seq_truncate(0, p).unwrap();
                assert_eq!(e.mem.seq_len(0).unwrap(), p);
                assert_eq!(e.mem.seq_tokens(0).unwrap(), &tokens[..p]);
                assert!(st.replayed <= p);
                if e.mem.recurrent.is_none() {
                    assert_eq!(st.replayed, 0, "{arch}: attention cells are simply cut");
                } else if interval == 0 {
                    assert_eq!(
                        st.replayed, p,
                        "{arch}: without checkpoints the replay starts at 0"
                    );
                }
                // Decode m tokens from the continuation (different ones from
                // those rolled back, to prove nothing of them is left).
                let cont: Vec<u32> = tokens[n..n + m].to_vec();
                let got = e.eval(0, &cont, LogitRows::All, 1).unwrap();
                fresh.seq_clear(0).unwrap();
                fresh.eval(0, &tokens[..p], LogitRows::None, 0).unwrap();
                let want = fresh.eval(0, &cont, LogitRows::All, 1).unwrap();
                assert_close(
                    &format!("{arch} n={n} p={p} m={m} k={interval}"),
                    &got,
                    &want,
                    1e-6,
                );
            }
        }
    }
}

#[test]
fn forks_diverge_independently_and_rollback_leaves_others_alone() {
    for arch in ARCHS {
        let (path, tokens) = fixture(arch);
        let mut e = engine(&path, 8);
        e.eval(0, &tokens[..20], LogitRows::None, 0).unwrap();
        e.seq_fork(0, 1).unwrap();
        // Diverge: seq 0 takes 20..26, seq 1 takes 30..36.
        let a = e.eval(0, &tokens[20..26], LogitRows::All, 0).unwrap();
        let b = e.eval(1, &tokens[30..36], LogitRows::All, 0).unwrap();
        let mut solo = engine(&path, 8);
        solo.eval(0, &tokens[..20], LogitRows::None, 0).unwrap();
        let want_a = solo.eval(0, &tokens[20..26], LogitRows::All, 0).unwrap();
        solo.seq_clear(0).unwrap();
        solo.eval(0, &tokens[..20], LogitRows::None, 0).unwrap();
        let want_b = solo.eval(0, &tokens[30..36], LogitRows::All, 0).unwrap();
        assert_close(&format!("{arch} fork a"), &a, &want_a, 1e-6);
        assert_close(&format!("{arch} fork b"), &b, &want_b, 1e-6);

        // Rolling seq 0 back does not disturb seq 1.
        e.seq_truncate(0, 3).unwrap();
        let b2 = e.eval(1, &tokens[36..38], LogitRows::All, 0).unwrap();
        let want_b2 = solo.eval(0, &tokens[36..38], LogitRows::All, 0).unwrap();
        assert_close(
            &format!("{arch} other sequence after rollback"),
            &b2,
            &want_b2,
            1e-6,
        );
        assert_eq!(e.mem.seq_len(1).unwrap(), 28);
    }
}

#[test]
fn checkpoints_cut_replays_and_respect_the_budget() {
    let (path, tokens) = fixture("mamba2");
    let mut e = engine(&path, 8);
    e.eval(0, &tokens[..45], LogitRows::None, 0).unwrap();
    let rec = e.mem.recurrent.as_ref().unwrap();
    let pos: Vec<usize> = rec.checkpoints(0).unwrap().iter().map(|c| c.pos).collect();
    assert_eq!(pos, vec![8, 16, 24, 32, 40, 45]);
    let st = e.seq_truncate(0, 30).unwrap();
    assert_eq!((st.from, st.to, st.replayed), (45, 30, 6));
    // Onto a checkpoint: nothing to replay, and the trait method works.
    assert_eq!(e.seq_truncate(0, 24).unwrap().replayed, 0);
    e.mem.seq_truncate(0, 16).unwrap();
    assert!(e.mem.seq_truncate(0, 15).is_err());

    // A budget of three checkpoints thins them but keeps rollback.
    let mut e = Engine::load(
        &path,
        EngineOptions {
            n_ubatch: 4,
            checkpoints: CheckpointPolicy {
                interval: 4,
                budget_bytes: 1,
                keep_recent: 1,
            },
            ..Default::default()
        },
    )
    .unwrap();
    e.eval(0, &tokens[..48], LogitRows::None, 0).unwrap();
    let n_cp = e
        .mem
        .recurrent
        .as_ref()
        .unwrap()
        .checkpoints(0)
        .unwrap()
        .len();
    assert!(n_cp <= 2, "{n_cp}");
    let st = e.seq_truncate(0, 10).unwrap();
    assert_eq!(st.to, 10);
}
