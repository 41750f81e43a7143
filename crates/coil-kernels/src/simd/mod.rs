//! Runtime CPU-feature dispatch.
//!
//! Every kernel with SIMD code has a scalar version; [`level`] says which one
//! runs. [`force_level`] caps it (tests use it to check each path against the
//! reference; users can set `COIL_SIMD=scalar|avx2|avx512` in the environment).

pub mod math;
pub(crate) mod tile;

use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction-set tier, ordered from least to most capable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable Rust, no `std::arch`.
    Scalar = 1,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2 = 2,
    /// x86-64 AVX-512 F/BW/VL/DQ with VNNI, BMI2 (plus everything in `Avx2`).
    Avx512 = 3,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    fn from_u8(v: u8) -> SimdLevel {
        match v {
            3 => SimdLevel::Avx512,
            2 => SimdLevel::Avx2,
            _ => SimdLevel::Scalar,
        }
    }
}

/// 0 = not yet detected.
static DETECTED: AtomicU8 = AtomicU8::new(0);
/// Cap set by [`force_level`]; 0 = none.
static FORCED: AtomicU8 = AtomicU8::new(0);

/// The best level this CPU supports (ignoring any cap).
pub fn detected_level() -> SimdLevel {
    let v = DETECTED.load(Ordering::Relaxed);
    if v != 0 {
        return SimdLevel::from_u8(v);
    }
    let mut lvl = detect();
    if let Ok(s) = std::env::var("COIL_SIMD") {
        let cap = match s.to_ascii_lowercase().as_str() {
            "scalar" => Some(SimdLevel::Scalar),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            _ => None,
        };
        if let Some(cap) = cap {
            lvl = lvl.min(cap);
        }
    }
    DETECTED.store(lvl as u8, Ordering::Relaxed);
    lvl
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("bmi2")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        SimdLevel::Avx512
    } else if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        SimdLevel::Avx2
    } else {
        SimdLevel::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SimdLevel {
    SimdLevel::Scalar
}

/// The level kernels use now: the detected level, capped by [`force_level`].
#[inline]
pub fn level() -> SimdLevel {
    let d = detected_level();
    match FORCED.load(Ordering::Relaxed) {
        0 => d,
        f => d.min(SimdLevel::from_u8(f)),
    }
}

/// Caps the level every kernel uses (process-wide); `None` removes the cap.
/// A cap above what the CPU supports has no effect.
pub fn force_level(cap: Option<SimdLevel>) {
    FORCED.store(cap.map_or(0, |l| l as u8), Ordering::Relaxed);
}

/// The levels this CPU can run, lowest first (for tests and benchmarks).
pub fn available_levels() -> Vec<SimdLevel> {
    let d = detected_level();
    [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|&l| l <= d)
        .collect()
}

/// Defines `$name` that runs the `#[inline(always)]` function `$body` with
/// its arguments compiled for AVX-512 or AVX2 (so the compiler vectorizes it
/// for that level) or plain, by `level()`.
#[macro_export]
#[doc(hidden)]
macro_rules! multiversion {
    ($vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:path) => {
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
                unsafe fn v512($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn v256($($arg: $ty),*) $(-> $ret)? { $body($($arg),*) }
                match $crate::simd::level() {
                    // SAFETY: level() only reports features the CPU has.
                    $crate::simd::SimdLevel::Avx512 => return unsafe { v512($($arg),*) },
                    $crate::simd::SimdLevel::Avx2 => return unsafe { v256($($arg),*) },
                    $crate::simd::SimdLevel::Scalar => {}
                }
            }
            $body($($arg),*)
        }
    };
}
