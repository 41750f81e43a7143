//! What a recurrent state is stored in: f32 (the default, exact) or bf16
//! (half the bytes; the kernels compute in f32, widening bf16 → f32 when
//! they read and rounding to nearest even when they write).
//!
//! bf16 is the upper half of an f32: widening is a 16-bit shift; rounding
//! adds `0x7FFF` plus the lowest kept bit (ties go to even) and drops the
//! low half. NaNs stay NaNs (quieted: the rounding bias could otherwise
//! carry a NaN's low payload into an infinity), ±inf stay, finite values
//! beyond the largest bf16 round to ±inf as round-to-nearest-even does.
//! The row conversions are branch-free loops, so that the kernels compiled
//! per SIMD level (`multiversion!`) convert 8 or 16 values at a time (with
//! AVX2: `vpmovzxwd` + `vpslld` to widen; `vpsrld`, `vpaddd`, a compare, a
//! blend and `vpackusdw` to round).

use half::bf16;
use std::fmt;
use std::str::FromStr;

/// The element type of a recurrent (SSM / delta-rule) state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StateType {
    /// 4 bytes per value; bit for bit what the f32 kernels compute.
    #[default]
    F32,
    /// 2 bytes per value: computed in f32, stored rounded to bf16.
    Bf16,
}

impl StateType {
    pub const ALL: [StateType; 2] = [StateType::F32, StateType::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            StateType::F32 => "f32",
            StateType::Bf16 => "bf16",
        }
    }

    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            StateType::F32 => 4,
            StateType::Bf16 => 2,
        }
    }

    /// The byte that stands for this type in files (session files).
    pub fn code(self) -> u8 {
        match self {
            StateType::F32 => 0,
            StateType::Bf16 => 1,
        }
    }

    pub fn from_code(c: u8) -> Option<StateType> {
        StateType::ALL.into_iter().find(|t| t.code() == c)
    }
}

impl fmt::Display for StateType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A state type name that is not one of [`StateType::ALL`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown state type {0:?} (allowed: f32, bf16)")]
pub struct UnknownStateType(pub String);

impl FromStr for StateType {
    type Err = UnknownStateType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let l = s.trim().to_ascii_lowercase();
        StateType::ALL
            .into_iter()
            .find(|t| t.name() == l)
            .ok_or_else(|| UnknownStateType(s.to_string()))
    }
}

/// `x` rounded to the nearest bf16, ties to even; NaN stays NaN.
#[inline(always)]
pub fn round_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet = ((b >> 16) as u16) | 0x0040;
    bf16::from_bits(if nan { quiet } else { rounded })
}

/// `x` widened to f32 (exact).
#[inline(always)]
pub fn widen_bf16(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// `dst = src` widened (`dst.len() == src.len()`); a plain loop, which the
/// compiler vectorizes 8 or 16 lanes wide at each SIMD level.
#[inline(always)]
pub fn widen_row(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = widen_bf16(s);
    }
}

/// `dst = src` rounded to bf16 (see [`round_bf16`]), vectorized likewise.
#[inline(always)]
pub fn round_row(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "round: lengths differ");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = round_bf16(s);
    }
}

/// Rounds every value of `x` to the nearest bf16 in place (kept as f32):
/// what storing and reloading a bf16 state does.
#[inline(always)]
pub fn round_through_bf16(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = widen_bf16(round_bf16(*v));
    }
}

crate::multiversion!(fn widen_mv(src: &[bf16], dst: &mut [f32]) => widen_row);
crate::multiversion!(fn round_mv(src: &[f32], dst: &mut [bf16]) => round_row);

/// A recurrent state of either type, to update.
pub enum StateMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

/// A recurrent state of either type, to read.
#[derive(Clone, Copy)]
pub enum StateRef<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

impl StateRef<'_> {
    pub fn len(&self) -> usize {
        match self {
            StateRef::F32(s) => s.len(),
            StateRef::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn state_type(&self) -> StateType {
        match self {
            StateRef::F32(_) => StateType::F32,
            StateRef::Bf16(_) => StateType::Bf16,
        }
    }

    /// Writes the values as f32 into `dst` (same length).
    pub fn widen_into(&self, dst: &mut [f32]) {
        match self {
            StateRef::F32(s) => dst.copy_from_slice(s),
            StateRef::Bf16(s) => widen_mv(s, dst),
        }
    }
}

impl<'a> StateMut<'a> {
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn state_type(&self) -> StateType {
        self.as_ref().state_type()
    }

    pub fn as_ref(&self) -> StateRef<'_> {
        match self {
            StateMut::F32(s) => StateRef::F32(s),
            StateMut::Bf16(s) => StateRef::Bf16(s),
        }
    }

    /// A shorter-lived `StateMut` of the same values.
    pub fn reborrow(&mut self) -> StateMut<'_> {
        match self {
            StateMut::F32(s) => StateMut::F32(s),
            StateMut::Bf16(s) => StateMut::Bf16(s),
        }
    }

    /// Overwrites every value from `src` (same length), rounding when an
    /// f32 source goes into bf16.
    pub fn copy_from(&mut self, src: StateRef) {
        assert_eq!(self.len(), src.len(), "state copy: lengths differ");
        match (self, src) {
            (StateMut::F32(d), s) => s.widen_into(d),
            (StateMut::Bf16(d), StateRef::Bf16(s)) => d.copy_from_slice(s),
            (StateMut::Bf16(d), StateRef::F32(s)) => round_mv(s, d),
        }
    }

    /// Runs `f` on the state as f32, started from `from` when given (the
    /// state moving off another buffer): in place for f32; for bf16 on a
    /// widened copy that is rounded back afterwards (one rounding per call:
    /// the chunked prefill scans, whose intermediate states are never
    /// stored).
    pub fn with_f32<R>(&mut self, from: Option<StateRef>, f: impl FnOnce(&mut [f32]) -> R) -> R {
        match self {
            StateMut::F32(d) => {
                if let Some(src) = from {
                    src.widen_into(d);
                }
                f(d)
            }
            StateMut::Bf16(d) => {
                let mut wide = crate::scratch::Scratch::dirty(d.len());
                match from {
                    Some(src) => src.widen_into(&mut wide),
                    None => widen_mv(d, &mut wide),
                }
                let r = f(&mut wide);
                round_mv(&wide, d);
                r
            }
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// The element types the scan kernels take a state in (f32, bf16). The
/// kernels are generic over it: f32 runs the f32 code unchanged, bf16 the
/// same arithmetic on rows widened to f32 and rounded back when stored.
pub trait StateElem: sealed::Sealed + Copy + Send + Sync + 'static {
    const TYPE: StateType;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// `x` as stored (rounded to nearest even for bf16).
    fn from_f32(x: f32) -> Self;
    /// The slice viewed as this type, when it is of this type.
    fn of_mut<'a>(s: StateMut<'a>) -> Option<&'a mut [Self]>;
    fn of_ref<'a>(s: StateRef<'a>) -> Option<&'a [Self]>;
    /// Row `r` as f32: itself, or widened into `work` (as long as `r`).
    #[doc(hidden)]
    fn read_row<'a>(r: &'a [Self], work: &'a mut [f32]) -> &'a [f32];
    /// `f` on row `r` as f32, stored back (rounded for bf16; `work` as
    /// long as `r`).
    #[doc(hidden)]
    fn update_row(r: &mut [Self], work: &mut [f32], f: impl FnOnce(&mut [f32]));
}

impl StateElem for f32 {
    const TYPE: StateType = StateType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    fn of_mut<'a>(s: StateMut<'a>) -> Option<&'a mut [f32]> {
        match s {
            StateMut::F32(s) => Some(s),
            StateMut::Bf16(_) => None,
        }
    }
    fn of_ref<'a>(s: StateRef<'a>) -> Option<&'a [f32]> {
        match s {
            StateRef::F32(s) => Some(s),
            StateRef::Bf16(_) => None,
        }
    }
    #[inline(always)]
    fn read_row<'a>(r: &'a [f32], _work: &'a mut [f32]) -> &'a [f32] {
        r
    }
    #[inline(always)]
    fn update_row(r: &mut [f32], _work: &mut [f32], f: impl FnOnce(&mut [f32])) {
        f(r)
    }
}

impl StateElem for bf16 {
    const TYPE: StateType = StateType::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        widen_bf16(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        round_bf16(x)
    }
    fn of_mut<'a>(s: StateMut<'a>) -> Option<&'a mut [bf16]> {
        match s {
            StateMut::Bf16(s) => Some(s),
            StateMut::F32(_) => None,
        }
    }
    fn of_ref<'a>(s: StateRef<'a>) -> Option<&'a [bf16]> {
        match s {
            StateRef::Bf16(s) => Some(s),
            StateRef::F32(_) => None,
        }
    }
    #[inline(always)]
    fn read_row<'a>(r: &'a [bf16], work: &'a mut [f32]) -> &'a [f32] {
        widen_row(r, work);
        work
    }
    #[inline(always)]
    fn update_row(r: &mut [bf16], work: &mut [f32], f: impl FnOnce(&mut [f32])) {
        widen_row(r, work);
        f(work);
        round_row(work, r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{available_levels, level_scope};
    use crate::testutil::Rng;

    fn b(bits: u16) -> bf16 {
        bf16::from_bits(bits)
    }

    #[test]
    fn rounds_to_nearest_even() {
        // Exactly representable values pass unchanged.
        for x in [0.0f32, -0.0, 1.0, -2.5, 65280.0, f32::MIN_POSITIVE] {
            assert_eq!(widen_bf16(round_bf16(x)), x, "{x}");
        }
        // Ties: the low half 0x8000 goes to the even neighbour.
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8000)), b(0x3f80)); // even stays
        assert_eq!(round_bf16(f32::from_bits(0x3f81_8000)), b(0x3f82)); // odd rounds up
        assert_eq!(round_bf16(f32::from_bits(0xbf81_8000)), b(0xbf82)); // sign kept
                                                                        // Off ties: nearest.
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8001)), b(0x3f81));
        assert_eq!(round_bf16(f32::from_bits(0x3f80_7fff)), b(0x3f80));
        // Carry into the exponent.
        assert_eq!(round_bf16(f32::from_bits(0x3fff_ffff)), b(0x4000));
        // Subnormals round like any value.
        assert_eq!(round_bf16(f32::from_bits(0x0000_8000)), b(0x0000));
        assert_eq!(round_bf16(f32::from_bits(0x0001_8000)), b(0x0002));
    }

    #[test]
    fn keeps_nan_and_infinities() {
        assert_eq!(round_bf16(f32::INFINITY), bf16::INFINITY);
        assert_eq!(round_bf16(f32::NEG_INFINITY), bf16::NEG_INFINITY);
        // The largest finite f32 is past the largest bf16: RNE gives inf.
        assert_eq!(round_bf16(f32::MAX), bf16::INFINITY);
        assert_eq!(round_bf16(f32::MIN), bf16::NEG_INFINITY);
        // NaNs whose payload lies only in the dropped half, which the
        // rounding bias alone would turn into an infinity.
        for bits in [
            0x7f80_0001u32,
            0xff80_0001,
            0x7fc0_0000,
            0x7f80_ffff,
            0xffff_ffff,
        ] {
            let r = round_bf16(f32::from_bits(bits));
            assert!(r.is_nan(), "{bits:08x} -> {:04x}", r.to_bits());
            assert_eq!(r.to_bits() >> 15, (bits >> 31) as u16, "sign of {bits:08x}");
        }
        assert!(widen_bf16(b(0x7fc1)).is_nan());
        assert_eq!(widen_bf16(bf16::INFINITY), f32::INFINITY);
    }

    /// Every bf16 widens exactly and rounds back to itself; random f32
    /// round as the `half` crate rounds (to nearest even).
    #[test]
    fn round_trip_and_agreement_with_half() {
        for bits in 0..=u16::MAX {
            let x = b(bits);
            let w = widen_bf16(x);
            if x.is_nan() {
                assert!(w.is_nan() && round_bf16(w).is_nan());
            } else {
                assert_eq!(w, x.to_f32(), "{bits:04x}");
                assert_eq!(round_bf16(w), x, "{bits:04x}");
            }
        }
        let mut rng = Rng::new(5);
        for _ in 0..200_000 {
            let x = f32::from_bits(rng.next_u64() as u32);
            let want = bf16::from_f32(x);
            let got = round_bf16(x);
            if x.is_nan() {
                assert!(got.is_nan());
            } else {
                assert_eq!(got, want, "{:08x}", x.to_bits());
            }
        }
    }

    /// The slice conversions (16 at a time, compiled per SIMD level) give
    /// the scalar results at every level, tails included.
    #[test]
    fn rows_match_scalar_at_every_level() {
        let mut rng = Rng::new(6);
        let mut xs: Vec<f32> = (0..1000)
            .map(|i| match i % 7 {
                0 => f32::from_bits(rng.next_u64() as u32),
                1 => f32::from_bits(0x3f80_8000 + ((i as u32 & 3) << 16)),
                _ => rng.f32() * 100.0,
            })
            .collect();
        xs[3] = f32::NAN;
        xs[5] = f32::from_bits(0x7f80_0001);
        xs[9] = f32::INFINITY;
        for level in available_levels() {
            let _cap = level_scope(Some(level));
            for len in [0, 1, 15, 16, 17, 100, 1000] {
                let mut r = vec![bf16::ZERO; len];
                round_mv(&xs[..len], &mut r);
                for (g, &x) in r.iter().zip(&xs) {
                    assert_eq!(g.to_bits(), round_bf16(x).to_bits(), "{level:?} {x}");
                }
                let mut w = vec![0f32; len];
                widen_mv(&r, &mut w);
                for (g, &x) in w.iter().zip(&r) {
                    assert_eq!(g.to_bits(), widen_bf16(x).to_bits());
                }
                let mut t = xs[..len].to_vec();
                round_through_bf16(&mut t);
                assert_eq!(
                    t.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    w.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn with_f32_rounds_once_and_moves_from_a_source() {
        let src: Vec<f32> = (0..40).map(|i| 1.0 + i as f32 / 1024.0).collect();
        let mut st = vec![bf16::ZERO; 40];
        let mut s = StateMut::Bf16(&mut st);
        s.with_f32(Some(StateRef::F32(&src)), |w| {
            assert_eq!(w, &src[..], "the source as it is, unrounded");
            w.iter_mut().for_each(|v| *v += 1.0 / 4096.0);
        });
        for (g, x) in st.iter().zip(&src) {
            assert_eq!(*g, round_bf16(x + 1.0 / 4096.0));
        }
        let mut f = vec![0f32; 40];
        StateMut::F32(&mut f).copy_from(StateRef::Bf16(&st));
        assert_eq!(f[7], widen_bf16(st[7]));
    }

    #[test]
    fn parses_names_and_lists_the_allowed_ones() {
        assert_eq!("bf16".parse(), Ok(StateType::Bf16));
        assert_eq!(" F32 ".parse(), Ok(StateType::F32));
        let e = "f8".parse::<StateType>().unwrap_err().to_string();
        assert!(e.contains("\"f8\"") && e.contains("f32, bf16"), "{e}");
        for t in StateType::ALL {
            assert_eq!(StateType::from_code(t.code()), Some(t));
        }
        assert_eq!(StateType::from_code(9), None);
    }
}
