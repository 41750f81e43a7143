//! Exact rollback, forks and their independence, for every architecture
//! (the llama.cpp-converted fixtures, the Gated DeltaNet hybrids, LFM2,
//! LFM2-MoE, LFM3, Kimi-Linear, Bailing-Hybrid, Zamba2 and Qwen4-Exp):
//! (prefill n → truncate to p → decode m) equals (prefill p → decode m)
//! within 1e-6 relative, at random positions.

use coil::engine::{Engine, EngineOptions};
use coil::memory::{CheckpointPolicy, SequenceMemory};
use coil::models::LogitRows;
use std::path::PathBuf;

mod common;

use common::{assert_close, llama_cpp_fixture, tool_fixture, ARCHS};
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

/// Gated DeltaNet hybrids (tools/make_fixtures_qwen35.py), beside the
/// llama.cpp fixtures of `ARCHS`.
const GATED_DELTA: [&str; 4] = [
    "qwen35_tiny",
    "qwen35moe_tiny",
    "qwen3next_tiny",
    "qwen4exp_tiny",
];

/// LFM2 / LFM2-MoE (tools/make_fixtures_lfm2.py) and LFM3, with its
/// sliding-window layers (tools/make_fixtures_lfm3.py).
const LFM2: [&str; 4] = ["lfm2_small", "lfm2moe_small", "lfm3_tiny", "lfm3_plain"];

/// Kimi-Linear and Bailing-Hybrid: KDA and MLA (tools/make_fixtures_kimi.py,
/// tools/make_fixtures_bailing.py).
const KDA: [&str; 3] = [
    "kimi_linear_tiny",
    "kimi_linear_qlora",
    "bailing_hybrid_tiny",
];

/// Zamba2: Mamba-2 beside the attention cells of each use of a shared
/// block (tools/make_fixtures_zamba2.py).
const ZAMBA2: [&str; 2] = ["zamba2_tiny", "zamba2_plain"];

fn all_archs() -> impl Iterator<Item = &'static str> {
    ARCHS
        .into_iter()
        .chain(GATED_DELTA)
        .chain(LFM2)
        .chain(KDA)
        .chain(ZAMBA2)
}

fn fixture(arch: &str) -> (PathBuf, Vec<u32>) {
    if GATED_DELTA.contains(&arch)
        || LFM2.contains(&arch)
        || KDA.contains(&arch)
        || ZAMBA2.contains(&arch)
    {
        // 37 tokens: repeated to the 64 the tests index (no logits needed).
        let f = tool_fixture(arch);
        let tokens = f.tokens.iter().cycle().take(64).copied().collect();
        return (f.model, tokens);
    }
    let f = llama_cpp_fixture(arch);
    (f.model, f.tokens)
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
    for arch in all_archs() {
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
    for arch in all_archs() {
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
                every_call: false,
                call_spacing: 1,
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

fn tmpfile(name: &str) -> TempPath {
    TempPath::new("coil-session-test", name)
}

#[test]
fn save_load_continue_equals_continue() {
    for arch in all_archs() {
        let (path, tokens) = fixture(arch);
        let mut e = engine(&path, 8);
        e.eval(0, &tokens[..30], LogitRows::None, 0).unwrap();
        let file = tmpfile(&format!("{arch}.session"));
        e.save_session(0, &file).unwrap();
        let want = e.eval(0, &tokens[30..36], LogitRows::All, 0).unwrap();

        // Load into another engine, into another sequence slot.
        let mut e2 = engine(&path, 8);
        e2.eval(2, &tokens[..5], LogitRows::None, 0).unwrap();
        e2.load_session(1, &file).unwrap();
        assert_eq!(e2.mem.seq_tokens(1).unwrap(), &tokens[..30]);
        let got = e2.eval(1, &tokens[30..36], LogitRows::All, 0).unwrap();
        assert_close(&format!("{arch} save/load/continue"), &got, &want, 0.0);
        // Checkpoints came along: a rollback after loading is exact too.
        e2.seq_truncate(1, 17).unwrap();
        let got = e2.eval(1, &tokens[40..42], LogitRows::All, 0).unwrap();
        let mut fresh = engine(&path, 8);
        fresh.eval(0, &tokens[..17], LogitRows::None, 0).unwrap();
        let want = fresh.eval(0, &tokens[40..42], LogitRows::All, 0).unwrap();
        assert_close(&format!("{arch} rollback after load"), &got, &want, 1e-6);
        // Sequence 2 was not touched.
        assert_eq!(e2.mem.seq_tokens(2).unwrap(), &tokens[..5]);
    }
}

/// Loading a session and clearing the sequence, again and again, reuses
/// the state buffers it freed: the pool's free list and the buffers it had
/// to allocate stop growing after the first round (each loaded checkpoint
/// used to add a buffer to the list, up to the whole checkpoint budget).
#[test]
fn loading_sessions_again_and_again_reuses_state_buffers() {
    let (path, tokens) = fixture("qwen35_tiny");
    let mut e = engine(&path, 4);
    e.eval(0, &tokens[..30], LogitRows::None, 0).unwrap();
    let file = tmpfile("again.session");
    e.save_session(0, &file).unwrap();
    let n_cp = e
        .mem
        .recurrent
        .as_ref()
        .unwrap()
        .checkpoints(0)
        .unwrap()
        .len();
    assert!(n_cp >= 3, "{n_cp} checkpoints");
    let mut target = engine(&path, 4);
    let buffers = |t: &Engine| {
        let r = t.mem.recurrent.as_ref().unwrap();
        (r.free_buffers(), r.fresh_buffers())
    };
    let mut seen = Vec::new();
    for _ in 0..6 {
        target.load_session(0, &file).unwrap();
        target.seq_clear(0).unwrap();
        seen.push(buffers(&target));
    }
    assert!(
        seen[1..].iter().all(|&b| b == seen[1]),
        "free / fresh buffers per round: {seen:?}"
    );
}

#[test]
fn bad_session_files_fail_clearly_and_change_nothing() {
    let (path, tokens) = fixture("granitemoehybrid");
    let mut e = engine(&path, 8);
    e.eval(0, &tokens[..12], LogitRows::None, 0).unwrap();
    let file = tmpfile("good.session");
    e.save_session(0, &file).unwrap();
    let good = std::fs::read(&file).unwrap();

    let mut target = engine(&path, 8);
    target.eval(0, &tokens[20..23], LogitRows::None, 0).unwrap();
    let check_untouched = |t: &Engine| {
        assert_eq!(t.mem.seq_tokens(0).unwrap(), &tokens[20..23]);
    };
    let bad = tmpfile("bad.session");
    // Truncated anywhere.
    for cut in [0, 5, 27, 40, good.len() / 2, good.len() - 1] {
        std::fs::write(&bad, &good[..cut]).unwrap();
        let err = target.load_session(0, &bad).unwrap_err().to_string();
        assert!(
            err.contains("truncated") || err.contains("corrupted") || err.contains("magic"),
            "{cut}: {err}"
        );
        check_untouched(&target);
    }
    // A flipped byte in the payload.
    let mut c = good.clone();
    let mid = c.len() / 2;
    c[mid] ^= 0x40;
    std::fs::write(&bad, &c).unwrap();
    let err = target.load_session(0, &bad).unwrap_err().to_string();
    assert!(err.contains("checksum"), "{err}");
    check_untouched(&target);
    // Another model's session.
    let (other, otoks) = fixture("mamba2");
    let mut o = engine(&other, 8);
    o.eval(0, &otoks[..4], LogitRows::None, 0).unwrap();
    o.save_session(0, &bad).unwrap();
    let err = target.load_session(0, &bad).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
    check_untouched(&target);
    // Not a session at all; a missing file.
    std::fs::write(&bad, b"hello world, this is not a session file at all").unwrap();
    assert!(target
        .load_session(0, &bad)
        .unwrap_err()
        .to_string()
        .contains("magic"));
    assert!(target.load_session(0, &tmpfile("missing.session")).is_err());
    check_untouched(&target);
    // The good one still loads.
    target.load_session(0, &file).unwrap();
    assert_eq!(target.mem.seq_tokens(0).unwrap(), &tokens[..12]);
}

/// A fork shares its source's attention pages and recurrent state: the
/// memory grows by at most one page per attention layer (K and V) when
/// either side writes, and both continue (decode, truncate, decode) exactly
/// as sequences built from scratch.
#[test]
fn forks_share_kv_pages_and_continue_independently() {
    use coil::memory::pages::PAGE_LEN;
    for arch in ["granitemoehybrid", "jamba", "lfm2_small"] {
        let (path, _) = fixture(arch);
        let mut e = engine(&path, 64);
        let mut rng = Lcg(11);
        let n_vocab = e.n_vocab();
        let t: Vec<u32> = (0..700).map(|_| rng.below(n_vocab) as u32).collect();
        let kv_bytes = |e: &Engine| e.mem.kv.as_ref().unwrap().bytes();
        // K and V of one page in every attention layer.
        let page = e.mem.kv.as_ref().unwrap().bytes_per_token() * PAGE_LEN;
        e.eval(0, &t[..600], LogitRows::None, 0).unwrap();
        let before = kv_bytes(&e);
        assert!(before >= 600 * page / PAGE_LEN, "{arch}: {before}");
        e.seq_fork(0, 1).unwrap();
        assert_eq!(kv_bytes(&e), before, "{arch}: the fork copied cells");
        let kv = e.mem.kv.as_ref().unwrap();
        assert_eq!(kv.page_stats().shared_bytes, before);
        let rec = e.mem.recurrent.as_ref().unwrap();
        assert_eq!(
            rec.flat_state(0).unwrap().as_ptr(),
            rec.flat_state(1).unwrap().as_ptr(),
            "{arch}: the fork shares the recurrent state until written"
        );

        // Each side decodes different tokens; the fork's writes copy at most
        // the last page of each layer, the source's too.
        let b = e.eval(1, &t[600..605], LogitRows::All, 0).unwrap();
        assert!(kv_bytes(&e) <= before + page, "{arch}: {}", kv_bytes(&e));
        let a = e.eval(0, &t[610..615], LogitRows::All, 0).unwrap();
        assert!(
            kv_bytes(&e) <= before + 2 * page,
            "{arch}: {}",
            kv_bytes(&e)
        );

        let mut solo = engine(&path, 64);
        solo.eval(0, &t[..600], LogitRows::None, 0).unwrap();
        let want_b = solo.eval(0, &t[600..605], LogitRows::All, 0).unwrap();
        assert_close(&format!("{arch} fork decodes"), &b, &want_b, 1e-6);
        solo.seq_clear(0).unwrap();
        solo.eval(0, &t[..600], LogitRows::None, 0).unwrap();
        let want_a = solo.eval(0, &t[610..615], LogitRows::All, 0).unwrap();
        assert_close(&format!("{arch} source decodes"), &a, &want_a, 1e-6);

        // The fork goes back into a page it still shares with the source,
        // then writes there: a copy, and the source does not see it.
        e.seq_truncate(1, 300).unwrap();
        let b2 = e.eval(1, &t[620..624], LogitRows::All, 0).unwrap();
        let a2 = e.eval(0, &t[615..618], LogitRows::All, 0).unwrap();
        let want_a2 = solo.eval(0, &t[615..618], LogitRows::All, 0).unwrap();
        assert_close(
            &format!("{arch} source after the fork's rollback"),
            &a2,
            &want_a2,
            1e-6,
        );
        solo.seq_clear(0).unwrap();
        solo.eval(0, &t[..300], LogitRows::None, 0).unwrap();
        let want_b2 = solo.eval(0, &t[620..624], LogitRows::All, 0).unwrap();
        assert_close(
            &format!("{arch} fork after its rollback"),
            &b2,
            &want_b2,
            1e-6,
        );
        assert_eq!(e.mem.seq_len(0).unwrap(), 608);
        assert_eq!(e.mem.seq_len(1).unwrap(), 304);
    }
}

/// With a checkpoint per generated token (`--checkpoint-every-token`), stepping
/// back any number of generated tokens restores exactly (no replay), and a
/// fork taken mid-generation keeps its own history: checkpoints are
/// references to states that later passes move away from, never write.
#[test]
fn per_token_checkpoints_restore_exactly() {
    for arch in all_archs() {
        let (path, tokens) = fixture(arch);
        let opts = |every_call| EngineOptions {
            n_seq_max: 2,
            n_ubatch: 16,
            checkpoints: CheckpointPolicy {
                interval: 8,
                every_call,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut e = Engine::load(&path, opts(true)).unwrap();
        let mut fresh = Engine::load(&path, opts(false)).unwrap();
        let n = 13;
        e.eval(0, &tokens[..n], LogitRows::None, 0).unwrap();
        for (i, &t) in tokens[n..n + 6].iter().enumerate() {
            e.eval(0, &[t], LogitRows::Last, 0).unwrap();
            if i == 2 {
                e.seq_fork(0, 1).unwrap();
            }
        }
        // Back 1, then 2 more: both restored from per-token checkpoints.
        for p in [n + 5, n + 3] {
            let st = e.seq_truncate(0, p).unwrap();
            if e.mem.recurrent.is_some() {
                assert_eq!(st.replayed, 0, "{arch}: p={p} should need no replay");
            }
            let next = [tokens[p + 7]];
            let got = e.eval(0, &next, LogitRows::Last, 0).unwrap();
            // the same path without checkpoints: the prompt, then token by
            // token (a prompt of p tokens in one pass differs by rounding:
            // 1.2e-6 of the largest logit on qwen35_tiny at the AVX2 level)
            fresh.seq_clear(0).unwrap();
            fresh.eval(0, &tokens[..n], LogitRows::None, 0).unwrap();
            for &t in &tokens[n..p] {
                fresh.eval(0, &[t], LogitRows::Last, 0).unwrap();
            }
            let want = fresh.eval(0, &next, LogitRows::Last, 0).unwrap();
            assert_close(&format!("{arch} p={p}"), &got, &want, 1e-6);
            e.seq_truncate(0, p).unwrap();
        }
        // The fork (taken at n + 3) continues as if alone.
        let next = [tokens[n + 9]];
        let got = e.eval(1, &next, LogitRows::Last, 0).unwrap();
        fresh.seq_clear(0).unwrap();
        fresh.eval(0, &tokens[..n], LogitRows::None, 0).unwrap();
        for &t in &tokens[n..n + 3] {
            fresh.eval(0, &[t], LogitRows::Last, 0).unwrap();
        }
        let want = fresh.eval(0, &next, LogitRows::Last, 0).unwrap();
        assert_close(&format!("{arch} fork"), &got, &want, 1e-6);
    }
}

/// `call_spacing` (what `coil serve` uses, 4 by default): generated tokens
/// are checkpointed only where the length is a multiple of it (prompt ends
/// and periodic positions as always), and stepping back between two
/// replays the tokens past the earlier one, exactly.
#[test]
fn spaced_generation_checkpoints() {
    for arch in all_archs() {
        let (path, tokens) = fixture(arch);
        let opts = |every_call| EngineOptions {
            n_seq_max: 1,
            n_ubatch: 16,
            checkpoints: CheckpointPolicy {
                interval: 64,
                every_call,
                call_spacing: 4,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut e = Engine::load(&path, opts(true)).unwrap();
        let mut fresh = Engine::load(&path, opts(false)).unwrap();
        let n = 13;
        e.eval(0, &tokens[..n], LogitRows::None, 0).unwrap();
        for &t in &tokens[n..n + 10] {
            e.eval(0, &[t], LogitRows::Last, 0).unwrap();
        }
        let Some(r) = &e.mem.recurrent else { continue };
        let at: Vec<usize> = r.checkpoints(0).unwrap().iter().map(|c| c.pos).collect();
        assert_eq!(at, [13, 16, 20], "{arch}");
        // Back to 22: restored at 20, 2 tokens replayed.
        let p = n + 9;
        let st = e.seq_truncate(0, p).unwrap();
        assert_eq!(st.replayed, 2, "{arch}");
        let next = [tokens[p + 5]];
        let got = e.eval(0, &next, LogitRows::Last, 0).unwrap();
        fresh.eval(0, &tokens[..p], LogitRows::None, 0).unwrap();
        let want = fresh.eval(0, &next, LogitRows::Last, 0).unwrap();
        assert_close(&format!("{arch} p={p}"), &got, &want, 1e-4);
    }
}
