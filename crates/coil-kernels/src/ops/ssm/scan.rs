//! Selective-scan recurrences (Mamba-1, Mamba-2), token by token, computed
//! in f32 on a state stored in f32 or bf16 ([`ScanState`]): one source for
//! both, compiled per state type and SIMD level.
//!
//! `dt` is passed already activated (`softplus(dt + bias)`, clamped by the
//! caller to the model's time-step limits) and `a` already as `A = −exp(A_log)`
//! (how GGUF stores it).

use super::dims::{Mamba2Dims, ScanInputs};
use crate::multiversion;
use crate::ops::state_elem::{round_row, widen_row, StateElem, StateMut, StateRef, StateType};
use crate::ops::state_rows::{can_stream, fence, prefetch_rows_ahead};
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use crate::simd::math::exp_fast;
use half::bf16;

/// One Mamba-2 head over `n_tokens` tokens. With `from`, the first token
/// reads the head's state from there and writes it to `state` (moving a
/// state to a new buffer in the same pass that updates it). The state's
/// element type decides how a row is read and stored ([`ScanState`]): f32
/// in place, bf16 widened into `work` (or fused in registers) and rounded
/// back after every token.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn m2_head<S: ScanState>(
    dims: &Mamba2Dims,
    h: usize,
    from: Option<&[S]>,
    state: &mut [S],
    x: &[f32],
    ldx: usize,
    b: &[f32],
    c: &[f32],
    ldbc: usize,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
    rows_at: S::Rows,
    work: &mut [f32],
) {
    let (hn, p_dim, n) = (dims.n_head, dims.head_dim, dims.d_state);
    let g = h / (hn / dims.n_group);
    for t in 0..n_tokens {
        let dth = dt[t * hn + h];
        let da = exp_fast(dth * a[h]);
        let bt = &b[t * ldbc + g * n..t * ldbc + (g + 1) * n];
        let ct = &c[t * ldbc + g * n..t * ldbc + (g + 1) * n];
        let dh = d.map_or(0.0, |d| d[h]);
        let src = if t == 0 { from } else { None };
        // One token moving the state to a new buffer: stream the new rows
        // there (no read of the uncached destination; see `moving.rs`).
        let stream = src.is_some() && n_tokens == 1 && S::can_stream(rows_at, state, n);
        // the rows this pass reads, in memory order (the heads' rows follow
        // each other): prefetched ahead as the dot kernels stream weights
        let rows = src.unwrap_or(state).as_ptr();
        for p in 0..p_dim {
            prefetch_rows_ahead(rows.wrapping_add(p * n) as *const f32, S::words(n));
            let xv = x[t * ldx + h * p_dim + p];
            let xdt = xv * dth;
            let s = &mut state[p * n..(p + 1) * n];
            let f = src.map(|f| &f[p * n..(p + 1) * n]);
            if let Some(sum) = S::fused_row(rows_at, s, f, bt, ct, da, xdt, stream) {
                let yv = sum + 0f32 + dh * xv;
                // SAFETY: (t, h, p) belongs to this head only.
                unsafe { *y.add((t * hn + h) * p_dim + p) = yv };
                continue;
            }
            // update and output in one pass over the state row
            let row = S::load_row(s, f, work);
            let mut acc = [0f32; 16];
            let mut sc = row.chunks_exact_mut(16);
            let (mut bc, mut cc) = (bt.chunks_exact(16), ct.chunks_exact(16));
            for ((s16, b16), c16) in (&mut sc).zip(&mut bc).zip(&mut cc) {
                for i in 0..16 {
                    let v = s16[i] * da + xdt * b16[i];
                    s16[i] = v;
                    acc[i] += v * c16[i];
                }
            }
            let mut tail = 0f32;
            for ((sv, &bv), &cv) in sc
                .into_remainder()
                .iter_mut()
                .zip(bc.remainder())
                .zip(cc.remainder())
            {
                *sv = *sv * da + xdt * bv;
                tail += *sv * cv;
            }
            S::store_row(work, s);
            let yv = acc.iter().sum::<f32>() + tail + dh * xv;
            // SAFETY: (t, h, p) belongs to this head only.
            unsafe { *y.add((t * hn + h) * p_dim + p) = yv };
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn m2_heads<S: ScanState>(
    dims: &Mamba2Dims,
    h0: usize,
    h1: usize,
    from: Option<&[S]>,
    state: *mut S,
    x: &[f32],
    ldx: usize,
    b: &[f32],
    c: &[f32],
    ldbc: usize,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
) {
    let hs = dims.head_dim * dims.d_state;
    let rows_at = S::rows(dims.d_state);
    let mut work = vec![0f32; S::work_len(rows_at, dims.d_state)];
    for h in h0..h1 {
        // SAFETY: head h owns state[h*hs..(h+1)*hs].
        let st = unsafe { std::slice::from_raw_parts_mut(state.add(h * hs), hs) };
        // A source in another buffer is copied row by row (512 B) just
        // before each row is updated, so the update finds it in L1.
        let f = from.map(|f| &f[h * hs..(h + 1) * hs]);
        #[cfg(target_arch = "x86_64")]
        if n_tokens > 1 && super::tokens::usable(dims) {
            if let Some((st, f)) = S::as_f32(st, f) {
                // SAFETY: `usable` checked AVX2; (·, h, ·) of y is this head's.
                unsafe {
                    super::tokens::head(dims, h, f, st, x, ldx, b, c, ldbc, dt, a, d, y, n_tokens)
                };
                continue;
            }
        }
        m2_head(
            dims, h, f, st, x, ldx, b, c, ldbc, dt, a, d, y, n_tokens, rows_at, &mut work,
        );
    }
    if from.is_some() {
        // Streamed stores (see `moving.rs`) are ordered before the hand-back.
        fence();
    }
}

// x, B and C are separate arguments here, not one `ScanInputs`: references
// inside a struct carry no no-alias guarantee into the compiled level, and
// without it the state update is not vectorized (decode 2× slower).
multiversion!(pub(crate) fn m2_heads_mv<S: ScanState>(
    dims: &Mamba2Dims, h0: usize, h1: usize, from: Option<&[S]>, state: *mut S, x: &[f32],
    ldx: usize, b: &[f32], c: &[f32], ldbc: usize, dt: &[f32], a: &[f32], d: Option<&[f32]>, y: *mut f32, n_tokens: usize
) => m2_heads);

/// Mamba-2 sequential scan over `n_tokens` tokens:
/// `S_h ← exp(dt_h·A_h)·S_h + dt_h·x_h ⊗ B_g`, `y_h = S_h·C_g + D_h·x_h`.
///
/// * `state`: `[n_head, head_dim, d_state]`, updated in place
/// * `x`: `[n_tokens, n_head, head_dim]`; `dt`: `[n_tokens, n_head]` (activated)
/// * `a`: `[n_head]` (= −exp(A_log)); `d`: `[n_head]` or `None`
/// * `b`, `c`: `[n_tokens, n_group, d_state]`; `y`: `[n_tokens, n_head, head_dim]`
#[allow(clippy::too_many_arguments)]
pub fn mamba2_scan(
    pool: &ThreadPool,
    dims: Mamba2Dims,
    state: &mut [f32],
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    y: &mut [f32],
    n_tokens: usize,
) {
    let inputs = ScanInputs::dense(&dims, x, b, c, n_tokens);
    mamba2_scan_from(pool, dims, None, state, inputs, dt, a, d, y, n_tokens)
}

/// [`mamba2_scan`] starting from the state in `from` (`[H, P, N]`) instead
/// of `state`'s own contents; the result goes to `state` as usual. Moving a
/// state to a new buffer this way (each head copied just before it is
/// updated, in parallel) costs about what the in-place update costs. x, B
/// and C come as [`ScanInputs`] rows. The state is f32 or bf16 (see
/// [`ScanState`]).
#[allow(clippy::too_many_arguments)]
pub fn mamba2_scan_from<S: ScanState>(
    pool: &ThreadPool,
    dims: Mamba2Dims,
    from: Option<&[S]>,
    state: &mut [S],
    inputs: ScanInputs,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: &mut [f32],
    n_tokens: usize,
) {
    let (hn, p) = (dims.n_head, dims.head_dim);
    dims.check_heads(a, d);
    dims.check_state(state.len(), from.map(|f| f.len()));
    inputs.check(&dims, n_tokens);
    assert_eq!(y.len(), n_tokens * hn * p);
    assert_eq!(dt.len(), n_tokens * hn);
    let sp = SendPtr(state.as_mut_ptr());
    let yp = SendPtr(y.as_mut_ptr());
    let grain = (hn / (pool.n_threads() * 4)).max(1);
    pool.parallel_for(hn, grain, |hr, _| {
        m2_heads_mv(
            &dims,
            hr.start,
            hr.end,
            from,
            sp.get(),
            inputs.x,
            inputs.ldx,
            inputs.b,
            inputs.c,
            inputs.ldbc,
            dt,
            a,
            d,
            yp.get(),
            n_tokens,
        );
    });
}

/// [`mamba2_scan_from`] on a state of either stored type (`from`, when
/// given, of the same type as `state`).
#[allow(clippy::too_many_arguments)]
pub fn mamba2_scan_from_state(
    pool: &ThreadPool,
    dims: Mamba2Dims,
    from: Option<StateRef>,
    state: StateMut,
    inputs: ScanInputs,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: &mut [f32],
    n_tokens: usize,
) {
    match state {
        StateMut::F32(s) => {
            let f = from.map(|f| f32::of_ref(f).expect("mamba2: source of another type"));
            mamba2_scan_from(pool, dims, f, s, inputs, dt, a, d, y, n_tokens)
        }
        StateMut::Bf16(s) => {
            let f = from.map(|f| bf16::of_ref(f).expect("mamba2: source of another type"));
            mamba2_scan_from(pool, dims, f, s, inputs, dt, a, d, y, n_tokens)
        }
    }
}

/// Mamba-1 over channels `d0..d1` (at most [`M1_CHUNK`]): the state slice is
/// transposed to `[d_state][channels]` so every inner loop runs along
/// channels (contiguous, vectorizable), then transposed back.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn m1_channels<S: StateElem>(
    d0: usize,
    d1: usize,
    d_inner: usize,
    n: usize,
    state: *mut S,
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
) {
    let len = d1 - d0;
    let mut ht = vec![0f32; n * len]; // [n][len]
    let mut at = vec![0f32; n * len];
    // SAFETY: channels d0..d1 own state[d0*n..d1*n].
    let st = unsafe { std::slice::from_raw_parts_mut(state.add(d0 * n), len * n) };
    for i in 0..len {
        for k in 0..n {
            ht[k * len + i] = st[i * n + k].to_f32();
            at[k * len + i] = a[(d0 + i) * n + k];
        }
    }
    let mut xdt = vec![0f32; len];
    let mut yacc = vec![0f32; len];
    for t in 0..n_tokens {
        let dtv = &dt[t * d_inner + d0..t * d_inner + d1];
        let xv = &x[t * d_inner + d0..t * d_inner + d1];
        for i in 0..len {
            xdt[i] = xv[i] * dtv[i];
            yacc[i] = d.map_or(0.0, |d| d[d0 + i]) * xv[i];
        }
        for k in 0..n {
            let (bk, ck) = (b[t * n + k], c[t * n + k]);
            let hrow = &mut ht[k * len..(k + 1) * len];
            let arow = &at[k * len..(k + 1) * len];
            for ((((h, &av), &dv), &xd), ya) in hrow
                .iter_mut()
                .zip(arow)
                .zip(dtv)
                .zip(&xdt)
                .zip(yacc.iter_mut())
            {
                let hv = exp_fast(dv * av) * *h + xd * bk;
                *h = hv;
                *ya += hv * ck;
            }
        }
        // SAFETY: y[t, d0..d1] belongs to this chunk only.
        let yo = unsafe { std::slice::from_raw_parts_mut(y.add(t * d_inner + d0), len) };
        yo.copy_from_slice(&yacc);
        // A state stored rounded is rounded after every token (as decoding
        // one token per call does); the last rounding is the store below.
        if S::TYPE != StateType::F32 && t + 1 < n_tokens {
            crate::ops::state_elem::round_through_bf16(&mut ht);
        }
    }
    for i in 0..len {
        for k in 0..n {
            st[i * n + k] = S::from_f32(ht[k * len + i]);
        }
    }
}

/// Channels per Mamba-1 work chunk (keeps the transposed state in L1).
const M1_CHUNK: usize = 256;

multiversion!(pub(crate) fn m1_channels_mv<S: ScanState>(
    d0: usize, d1: usize, d_inner: usize, n: usize, state: *mut S, x: &[f32], dt: &[f32],
    a: &[f32], b: &[f32], c: &[f32], d: Option<&[f32]>, y: *mut f32, n_tokens: usize
) => m1_channels);

/// The state types the Mamba scans take (f32, bf16): how the one head loop
/// reads, updates and stores a state row of each. f32 rows are updated in
/// place; bf16 rows are widened to f32, updated with the same arithmetic
/// in the same order and rounded back to bf16 (nearest even) when stored,
/// after every token — so that a token's result does not depend on how
/// many tokens share the call. At AVX2 a bf16 row is widened, updated and
/// rounded in registers (`bf16.rs`).
pub trait ScanState: StateElem {
    /// What the row update may use at the current SIMD level, chosen once
    /// per call.
    #[doc(hidden)]
    type Rows: Copy;
    #[doc(hidden)]
    fn rows(n: usize) -> Self::Rows;
    /// f32 values of the work row the portable update needs (0: the row is
    /// updated where it lies).
    #[doc(hidden)]
    fn work_len(rows: Self::Rows, n: usize) -> usize;
    /// f32 words a row of `n` values spans (what to prefetch).
    #[doc(hidden)]
    fn words(n: usize) -> usize;
    /// Whether a one-token pass that moves the state may write its rows
    /// into `state` with streaming stores.
    #[doc(hidden)]
    fn can_stream(rows: Self::Rows, state: &[Self], n: usize) -> bool;
    /// The row update in registers, where this type has one for the case:
    /// `dst = src·da + xdt·b` (src: `dst` itself when `None`), returning
    /// `Σ dst·c` unrounded; `None` when the portable update is to run.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn fused_row(
        rows: Self::Rows,
        dst: &mut [Self],
        src: Option<&[Self]>,
        b: &[f32],
        c: &[f32],
        da: f32,
        xdt: f32,
        stream: bool,
    ) -> Option<f32>;
    /// The row as f32 values to update, started from `src` when given:
    /// `dst` itself (f32), or `work` widened from it.
    #[doc(hidden)]
    fn load_row<'a>(
        dst: &'a mut [Self],
        src: Option<&[Self]>,
        work: &'a mut [f32],
    ) -> &'a mut [f32];
    /// Stores the updated row ([`ScanState::load_row`]'s) in `dst`, where
    /// it is not there already (rounded for bf16).
    #[doc(hidden)]
    fn store_row(work: &[f32], dst: &mut [Self]);
    /// The head's state as f32, for kernels that exist for f32 only
    /// (`tokens.rs`); `None` for other types.
    #[doc(hidden)]
    #[allow(clippy::type_complexity)]
    fn as_f32<'a>(
        state: &'a mut [Self],
        from: Option<&'a [Self]>,
    ) -> Option<(&'a mut [f32], Option<&'a [f32]>)>;
}

impl ScanState for f32 {
    type Rows = ();
    #[inline(always)]
    fn rows(_: usize) {}
    #[inline(always)]
    fn work_len(_: (), _: usize) -> usize {
        0
    }
    #[inline(always)]
    fn words(n: usize) -> usize {
        n
    }
    #[inline(always)]
    fn can_stream(_: (), state: &[f32], n: usize) -> bool {
        can_stream(state, n)
    }
    #[inline(always)]
    fn fused_row(
        _: (),
        dst: &mut [f32],
        src: Option<&[f32]>,
        b: &[f32],
        c: &[f32],
        da: f32,
        xdt: f32,
        stream: bool,
    ) -> Option<f32> {
        match (stream, src) {
            // SAFETY: `can_stream` checked AVX2, the row length and alignment.
            (true, Some(f)) => Some(unsafe { super::moving::move_row(dst, f, b, c, da, xdt) }),
            _ => None,
        }
    }
    #[inline(always)]
    fn load_row<'a>(dst: &'a mut [f32], src: Option<&[f32]>, _: &'a mut [f32]) -> &'a mut [f32] {
        if let Some(s) = src {
            dst.copy_from_slice(s);
        }
        dst
    }
    #[inline(always)]
    fn store_row(_: &[f32], _: &mut [f32]) {}
    #[inline(always)]
    fn as_f32<'a>(
        state: &'a mut [f32],
        from: Option<&'a [f32]>,
    ) -> Option<(&'a mut [f32], Option<&'a [f32]>)> {
        Some((state, from))
    }
}

impl ScanState for bf16 {
    /// (the fused AVX2 row, its AVX-512 form)
    type Rows = (bool, bool);
    #[inline(always)]
    fn rows(n: usize) -> (bool, bool) {
        super::bf16::usable(n)
    }
    #[inline(always)]
    fn work_len((fused, _): (bool, bool), n: usize) -> usize {
        if fused {
            0
        } else {
            n
        }
    }
    #[inline(always)]
    fn words(n: usize) -> usize {
        n.div_ceil(2)
    }
    #[inline(always)]
    fn can_stream((fused, _): (bool, bool), state: &[bf16], _: usize) -> bool {
        (state.as_ptr() as usize).is_multiple_of(16) && fused
    }
    #[inline(always)]
    fn fused_row(
        (fused, wide): (bool, bool),
        dst: &mut [bf16],
        src: Option<&[bf16]>,
        b: &[f32],
        c: &[f32],
        da: f32,
        xdt: f32,
        stream: bool,
    ) -> Option<f32> {
        if !fused {
            return None;
        }
        let from_row = src.map_or(dst.as_ptr(), |f| f.as_ptr());
        // SAFETY: `fused` means AVX2 (AVX-512 with `wide`) and n a multiple
        // of 16; the source row holds n values (it may be `dst` itself:
        // each 16 values are read before they are written).
        Some(unsafe { super::bf16::row(wide, dst.as_mut_ptr(), from_row, b, c, da, xdt, stream) })
    }
    #[inline(always)]
    fn load_row<'a>(
        dst: &'a mut [bf16],
        src: Option<&[bf16]>,
        work: &'a mut [f32],
    ) -> &'a mut [f32] {
        widen_row(src.unwrap_or(dst), work);
        work
    }
    #[inline(always)]
    fn store_row(work: &[f32], dst: &mut [bf16]) {
        round_row(work, dst);
    }
    #[inline(always)]
    fn as_f32<'a>(
        _: &'a mut [bf16],
        _: Option<&'a [bf16]>,
    ) -> Option<(&'a mut [f32], Option<&'a [f32]>)> {
        None
    }
}

/// Mamba-1 sequential scan over `n_tokens` tokens:
/// `h ← exp(dt⊙A)⊙h + (dt·x)⊗B`, `y = h·C + D·x`.
///
/// * `state`: `[d_inner, d_state]`, updated in place
/// * `x`, `dt` (activated), `y`: `[n_tokens, d_inner]`
/// * `a`: `[d_inner, d_state]` (= −exp(A_log)); `d`: `[d_inner]` or `None`
/// * `b`, `c`: `[n_tokens, d_state]`
#[allow(clippy::too_many_arguments)]
pub fn mamba1_scan<S: ScanState>(
    pool: &ThreadPool,
    d_inner: usize,
    d_state: usize,
    state: &mut [S],
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    y: &mut [f32],
    n_tokens: usize,
) {
    let n = d_state;
    assert_eq!(
        state.len(),
        d_inner * n,
        "mamba1: state is not [d_inner, d_state]"
    );
    assert!(x.len() == n_tokens * d_inner && dt.len() == x.len() && y.len() == x.len());
    assert_eq!(a.len(), d_inner * n);
    assert!(b.len() == n_tokens * n && c.len() == b.len());
    if let Some(d) = d {
        assert_eq!(d.len(), d_inner);
    }
    let sp = SendPtr(state.as_mut_ptr());
    let yp = SendPtr(y.as_mut_ptr());
    let grain = (d_inner / (pool.n_threads() * 4))
        .clamp(16, M1_CHUNK)
        .next_multiple_of(16);
    pool.parallel_for(d_inner, grain, |r, _| {
        m1_channels_mv(
            r.start,
            r.end,
            d_inner,
            n,
            sp.get(),
            x,
            dt,
            a,
            b,
            c,
            d,
            yp.get(),
            n_tokens,
        );
    });
}

/// [`mamba1_scan`] on a state of either stored type.
#[allow(clippy::too_many_arguments)]
pub fn mamba1_scan_state(
    pool: &ThreadPool,
    d_inner: usize,
    d_state: usize,
    state: StateMut,
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    y: &mut [f32],
    n_tokens: usize,
) {
    match state {
        StateMut::F32(s) => mamba1_scan(pool, d_inner, d_state, s, x, dt, a, b, c, d, y, n_tokens),
        StateMut::Bf16(s) => mamba1_scan(pool, d_inner, d_state, s, x, dt, a, b, c, d, y, n_tokens),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::state_elem::{round_bf16, widen_bf16};
    use crate::testutil::Rng;

    /// A random Mamba-2 case: `t` tokens' x, dt, B, C, the heads' A and D,
    /// and a start state.
    struct M2Case {
        dims: Mamba2Dims,
        x: Vec<f32>,
        dt: Vec<f32>,
        a: Vec<f32>,
        b: Vec<f32>,
        c: Vec<f32>,
        dd: Vec<f32>,
        s0: Vec<f32>,
    }

    impl M2Case {
        fn random(rng: &mut Rng, (hn, p, g, n, t): (usize, usize, usize, usize, usize)) -> Self {
            let dims = Mamba2Dims {
                n_head: hn,
                head_dim: p,
                n_group: g,
                d_state: n,
            };
            M2Case {
                dims,
                x: rng.vec(t * hn * p),
                dt: rng.vec(t * hn).iter().map(|v| v.abs() * 0.5).collect(),
                a: rng.vec(hn).iter().map(|v| -v.abs() - 0.1).collect(),
                b: rng.vec(t * g * n),
                c: rng.vec(t * g * n),
                dd: rng.vec(hn),
                s0: rng.vec(hn * p * n),
            }
        }

        /// Tokens `t0..t0 + nt`: x, dt, B, C.
        fn tokens(&self, t0: usize, nt: usize) -> (&[f32], &[f32], &[f32], &[f32]) {
            let d = &self.dims;
            let (wx, wbc) = (d.n_head * d.head_dim, d.n_group * d.d_state);
            let (r, rbc) = (t0 * wx..(t0 + nt) * wx, t0 * wbc..(t0 + nt) * wbc);
            let dt = &self.dt[t0 * d.n_head..(t0 + nt) * d.n_head];
            (&self.x[r], dt, &self.b[rbc.clone()], &self.c[rbc])
        }

        /// [`mamba2_scan_from`] over tokens `t0..t0 + nt`: their outputs.
        fn scan<S: ScanState>(
            &self,
            pool: &ThreadPool,
            from: Option<&[S]>,
            state: &mut [S],
            t0: usize,
            nt: usize,
        ) -> Vec<f32> {
            let (x, dt, b, c) = self.tokens(t0, nt);
            let inputs = ScanInputs::dense(&self.dims, x, b, c, nt);
            let mut y = vec![0f32; x.len()];
            let (a, d) = (&self.a, Some(&self.dd[..]));
            mamba2_scan_from(pool, self.dims, from, state, inputs, dt, a, d, &mut y, nt);
            y
        }

        /// The recurrence in f64 over all `t` tokens: the state and outputs.
        fn naive(&self, t: usize) -> (Vec<f64>, Vec<f64>) {
            let Mamba2Dims {
                n_head: hn,
                head_dim: p,
                n_group: g,
                d_state: n,
            } = self.dims;
            let (x, dt, a, b, c) = (&self.x, &self.dt, &self.a, &self.b, &self.c);
            let mut s: Vec<f64> = self.s0.iter().map(|v| *v as f64).collect();
            let mut want = vec![0f64; t * hn * p];
            for ti in 0..t {
                for h in 0..hn {
                    let gi = h / (hn / g);
                    let dtv = dt[ti * hn + h] as f64;
                    let da = (dtv * a[h] as f64).exp();
                    for pi in 0..p {
                        let xv = x[(ti * hn + h) * p + pi] as f64;
                        let mut acc = 0f64;
                        for ni in 0..n {
                            let si = &mut s[(h * p + pi) * n + ni];
                            *si = *si * da + dtv * xv * b[(ti * g + gi) * n + ni] as f64;
                            acc += *si * c[(ti * g + gi) * n + ni] as f64;
                        }
                        want[(ti * hn + h) * p + pi] = acc + self.dd[h] as f64 * xv;
                    }
                }
            }
            (s, want)
        }
    }

    /// A random Mamba-1 case: `t` tokens' x, dt, B, C, the channels' A and
    /// D, and a start state.
    struct M1Case {
        di: usize,
        n: usize,
        x: Vec<f32>,
        dt: Vec<f32>,
        a: Vec<f32>,
        b: Vec<f32>,
        c: Vec<f32>,
        dd: Vec<f32>,
        s0: Vec<f32>,
    }

    impl M1Case {
        fn random(rng: &mut Rng, (di, n, t): (usize, usize, usize)) -> Self {
            M1Case {
                di,
                n,
                x: rng.vec(t * di),
                dt: rng.vec(t * di).iter().map(|v| v.abs()).collect(),
                a: rng.vec(di * n).iter().map(|v| -v.abs() * 3.0).collect(),
                b: rng.vec(t * n),
                c: rng.vec(t * n),
                dd: rng.vec(di),
                s0: rng.vec(di * n),
            }
        }

        /// Tokens `t0..t0 + nt`: x, dt, B, C.
        fn tokens(&self, t0: usize, nt: usize) -> (&[f32], &[f32], &[f32], &[f32]) {
            let (r, rbc) = (
                t0 * self.di..(t0 + nt) * self.di,
                t0 * self.n..(t0 + nt) * self.n,
            );
            (
                &self.x[r.clone()],
                &self.dt[r],
                &self.b[rbc.clone()],
                &self.c[rbc],
            )
        }

        /// [`mamba1_scan`] over tokens `t0..t0 + nt`: their outputs.
        fn scan<S: ScanState>(
            &self,
            pool: &ThreadPool,
            state: &mut [S],
            t0: usize,
            nt: usize,
        ) -> Vec<f32> {
            let (x, dt, b, c) = self.tokens(t0, nt);
            let mut y = vec![0f32; x.len()];
            let (a, d) = (&self.a, Some(&self.dd[..]));
            mamba1_scan(pool, self.di, self.n, state, x, dt, a, b, c, d, &mut y, nt);
            y
        }
    }

    #[test]
    pub(crate) fn mamba2_matches_naive_and_steps() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(11);
        // The last two: one token, rows of whole 16-lane steps (the state
        // moving to a new buffer with streaming stores, `moving.rs`).
        for &shape in &[
            (4, 3, 2, 5, 7),
            (6, 16, 3, 32, 3),
            (2, 8, 1, 17, 1),
            (4, 8, 2, 32, 1),
            (2, 4, 1, 128, 1),
        ] {
            let (hn, p, g, n, t) = shape;
            let cs = M2Case::random(&mut rng, shape);
            let (dims, s0, a, dd) = (cs.dims, &cs.s0, &cs.a, Some(&cs.dd[..]));
            let (s, want) = cs.naive(t);
            let mut st = s0.clone();
            let mut y = vec![0f32; t * hn * p];
            let (x, dt, b, c) = cs.tokens(0, t);
            mamba2_scan(&pool, dims, &mut st, x, dt, a, b, c, dd, &mut y, t);
            for (a, e) in y.iter().zip(&want) {
                assert!((*a as f64 - e).abs() < 1e-4, "{a} vs {e}");
            }
            for (a, e) in st.iter().zip(&s) {
                assert!((*a as f64 - e).abs() < 1e-4);
            }
            // Starting from another buffer, with x, B and C read in place
            // from rows [x | B | C | 1 other] (as the conv's output): the
            // same, bit for bit, and the source is left alone.
            let (wx, wbc) = (hn * p, g * n);
            let ld = wx + 2 * wbc + 1;
            let mut rows = vec![f32::NAN; t * ld];
            for ti in 0..t {
                let r = &mut rows[ti * ld..(ti + 1) * ld];
                let (x, _, b, c) = cs.tokens(ti, 1);
                r[..wx].copy_from_slice(x);
                r[wx..wx + wbc].copy_from_slice(b);
                r[wx + wbc..wx + 2 * wbc].copy_from_slice(c);
            }
            let inputs = ScanInputs {
                x: &rows,
                ldx: ld,
                b: &rows[wx..],
                c: &rows[wx + wbc..],
                ldbc: ld,
            };
            let mut st3 = vec![f32::NAN; s0.len()];
            let mut y3 = vec![0f32; t * hn * p];
            let from = Some(&s0[..]);
            mamba2_scan_from(&pool, dims, from, &mut st3, inputs, dt, a, dd, &mut y3, t);
            assert_eq!(st3, st);
            assert_eq!(y3, y);
            let mut st2 = s0.clone();
            for ti in 0..t {
                let mut yy = vec![0f32; hn * p];
                let (x, dt, b, c) = cs.tokens(ti, 1);
                mamba2_scan(&pool, dims, &mut st2, x, dt, a, b, c, dd, &mut yy, 1);
                assert_eq!(yy[..], y[ti * hn * p..(ti + 1) * hn * p]);
            }
            assert_eq!(st, st2);
        }
    }

    #[test]
    pub(crate) fn mamba1_matches_naive() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(12);
        for &shape in &[(40, 16, 5), (7, 3, 2), (33, 17, 1)] {
            let (di, n, t) = shape;
            let cs = M1Case::random(&mut rng, shape);
            let (x, dt, a, b, c, dd) = (&cs.x, &cs.dt, &cs.a, &cs.b, &cs.c, &cs.dd);
            let mut s: Vec<f64> = cs.s0.iter().map(|v| *v as f64).collect();
            let mut want = vec![0f64; t * di];
            for ti in 0..t {
                for ch in 0..di {
                    let dtv = dt[ti * di + ch] as f64;
                    let xv = x[ti * di + ch] as f64;
                    let mut acc = 0f64;
                    for ni in 0..n {
                        let si = &mut s[ch * n + ni];
                        *si = (dtv * a[ch * n + ni] as f64).exp() * *si
                            + dtv * xv * b[ti * n + ni] as f64;
                        acc += *si * c[ti * n + ni] as f64;
                    }
                    want[ti * di + ch] = acc + dd[ch] as f64 * xv;
                }
            }
            let mut st = cs.s0.clone();
            let y = cs.scan(&pool, &mut st, 0, t);
            for (a, e) in y.iter().zip(&want) {
                assert!((*a as f64 - e).abs() < 1e-4, "{a} vs {e}");
            }
            let mut st2 = cs.s0.clone();
            let mut y1 = vec![0f32; di];
            for ti in 0..t {
                let (x, dt, b, c) = cs.tokens(ti, 1);
                let dd = Some(&dd[..]);
                mamba1_scan(&pool, di, n, &mut st2, x, dt, a, b, c, dd, &mut y1, 1);
                assert_eq!(y1[..], y[ti * di..(ti + 1) * di]);
            }
        }
    }

    /// A bf16 state gives, token after token, exactly what the f32 kernel
    /// gives from the same (widened) state with its result rounded to bf16
    /// after each token: the same rounded state bit for bit, the same
    /// outputs up to the order of their last sum — whether the tokens come
    /// in one call or one per call (those two bit for bit alike), in place
    /// or moving off another buffer.
    #[test]
    pub(crate) fn mamba2_bf16_is_the_f32_update_rounded_per_token() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(31);
        for &shape in &[(4, 3, 2, 5, 4), (6, 16, 3, 32, 3), (4, 8, 2, 64, 1)] {
            let t = shape.4;
            let cs = M2Case::random(&mut rng, shape);
            let dims = cs.dims;
            let s0: Vec<bf16> = cs.s0.iter().map(|&v| round_bf16(v)).collect();
            // Reference: the f32 kernel one token at a time, rounding the
            // state in between.
            let mut sf: Vec<f32> = s0.iter().map(|&v| widen_bf16(v)).collect();
            let mut want_y = Vec::new();
            for ti in 0..t {
                want_y.extend(cs.scan(&pool, None, &mut sf, ti, 1));
                sf.iter_mut().for_each(|v| *v = widen_bf16(round_bf16(*v)));
            }
            let want_s: Vec<bf16> = sf.iter().map(|&v| round_bf16(v)).collect();
            // All tokens in one call, in place.
            let mut st = s0.clone();
            let y = cs.scan(&pool, None, &mut st, 0, t);
            assert_eq!(st, want_s, "{dims:?}");
            close(&y, &want_y, &format!("{dims:?}"));
            // One token per call, the first moving off the start state.
            let mut st2 = vec![bf16::NAN; s0.len()];
            let mut y2 = Vec::new();
            for ti in 0..t {
                let from = (ti == 0).then_some(&s0[..]);
                y2.extend(cs.scan(&pool, from, &mut st2, ti, 1));
            }
            assert_eq!(st2, want_s, "{dims:?} moving");
            // One call or one token per call: the same bits.
            assert_eq!(y2, y, "{dims:?} moving");
        }
    }

    /// `got` equals `want` up to the order of a 16-lane sum.
    fn close(got: &[f32], want: &[f32], what: &str) {
        let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6 * max.max(1.0), "{what}: {g} vs {w}");
        }
    }

    /// Mamba-1 with a bf16 state: the f32 scan rounded after every token.
    #[test]
    pub(crate) fn mamba1_bf16_is_the_f32_update_rounded_per_token() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(32);
        for &shape in &[(40, 16, 5), (7, 3, 2), (300, 16, 3)] {
            let t = shape.2;
            let cs = M1Case::random(&mut rng, shape);
            let s0: Vec<bf16> = cs.s0.iter().map(|&v| round_bf16(v)).collect();
            let mut sf: Vec<f32> = s0.iter().map(|&v| widen_bf16(v)).collect();
            let mut want_y = Vec::new();
            for ti in 0..t {
                want_y.extend(cs.scan(&pool, &mut sf, ti, 1));
                sf.iter_mut().for_each(|v| *v = widen_bf16(round_bf16(*v)));
            }
            let mut st = s0.clone();
            let y = cs.scan(&pool, &mut st, 0, t);
            let got: Vec<f32> = st.iter().map(|&v| widen_bf16(v)).collect();
            assert_eq!(got, sf);
            assert_eq!(y, want_y);
        }
    }

    /// Several tokens in one call (`tokens.rs` at AVX2) leave the state and give the
    /// outputs of one token per call, bit for bit, starting in place or
    /// from another buffer.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tokens_in_one_call_equal_one_at_a_time_bit_for_bit() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(5);
        for &shape in &[(3, 5, 1, 64, 9), (4, 3, 2, 128, 2), (2, 4, 2, 192, 17)] {
            let t = shape.4;
            let cs = M2Case::random(&mut rng, shape);
            let (dims, s0) = (cs.dims, &cs.s0);
            if !super::super::tokens::usable(&dims) {
                return;
            }
            for from in [false, true] {
                let start = || {
                    if from {
                        vec![f32::NAN; s0.len()]
                    } else {
                        s0.clone()
                    }
                };
                let mut st = start();
                let y = cs.scan(&pool, from.then_some(&s0[..]), &mut st, 0, t);
                let mut st1 = start();
                let mut y1 = Vec::new();
                for k in 0..t {
                    let src = (from && k == 0).then_some(&s0[..]);
                    y1.extend(cs.scan(&pool, src, &mut st1, k, 1));
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&y1), "outputs, dims {dims:?}, from {from}");
                assert_eq!(bits(&st), bits(&st1), "state, dims {dims:?}, from {from}");
            }
        }
    }
}
