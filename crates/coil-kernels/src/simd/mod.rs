//! Runtime CPU-feature dispatch.
//!
//! Every kernel with SIMD code has a scalar version; [`level`] says which one
//! runs. [`force_level`] caps it (tests use it to check each path against the
//! reference; users can set `COIL_SIMD=scalar|avx2|avx512` in the environment).
//! [`check_env`] turns a `COIL_SIMD` that names no level, or a level this CPU
//! lacks, into an error (the apps call it before loading a model; the kernels
//! themselves never run above [`cpu_level`], whatever the environment says).
//! `crate::system_info` is the one line the apps print: level chosen and CPU
//! features seen.

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

    /// The level a `COIL_SIMD` value names (case-insensitive).
    pub fn parse(s: &str) -> Option<SimdLevel> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(SimdLevel::Scalar),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" => Some(SimdLevel::Avx512),
            _ => None,
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
    let mut lvl = cpu_level();
    // Never above the CPU: an unknown or too-high COIL_SIMD is reported by
    // `check_env`, and here only caps what exists.
    if let Some(cap) = std::env::var("COIL_SIMD")
        .ok()
        .and_then(|s| SimdLevel::parse(&s))
    {
        lvl = lvl.min(cap);
    }
    DETECTED.store(lvl as u8, Ordering::Relaxed);
    lvl
}

/// The best level this CPU supports, whatever `COIL_SIMD` says.
pub fn cpu_level() -> SimdLevel {
    detect()
}

/// A `COIL_SIMD` value the kernels cannot honour.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SimdEnvError {
    #[error("COIL_SIMD={0:?} names no SIMD level (use scalar, avx2 or avx512)")]
    Unknown(String),
    #[error(
        "COIL_SIMD={requested} needs CPU features this CPU lacks ({missing}); \
         its best level is {cpu} (unset COIL_SIMD or set COIL_SIMD={cpu})"
    )]
    Unsupported {
        requested: &'static str,
        cpu: &'static str,
        missing: String,
    },
}

/// Checks a `COIL_SIMD` value against a CPU's best level; `None` (unset) is
/// fine. Returns the level it asks for.
pub fn check_request(
    value: Option<&str>,
    cpu: SimdLevel,
) -> Result<Option<SimdLevel>, SimdEnvError> {
    let Some(value) = value else { return Ok(None) };
    let requested = SimdLevel::parse(value).ok_or_else(|| SimdEnvError::Unknown(value.into()))?;
    if requested > cpu {
        let missing = required_features(requested)
            .iter()
            .filter(|f| !cpu_features().iter().any(|(n, has)| n == *f && *has))
            .copied()
            .collect::<Vec<_>>();
        let missing = if missing.is_empty() {
            format!("{} features", requested.name())
        } else {
            missing.join(", ")
        };
        return Err(SimdEnvError::Unsupported {
            requested: requested.name(),
            cpu: cpu.name(),
            missing,
        });
    }
    Ok(Some(requested))
}

/// Checks the `COIL_SIMD` environment variable against this CPU: the level
/// the kernels will use, or an error naming what is wrong.
pub fn check_env() -> Result<SimdLevel, SimdEnvError> {
    let value = std::env::var("COIL_SIMD").ok();
    check_request(value.as_deref(), cpu_level())?;
    Ok(level())
}

/// The CPU features each level needs, as [`cpu_features`] names them.
fn required_features(l: SimdLevel) -> &'static [&'static str] {
    match l {
        SimdLevel::Scalar => &[],
        SimdLevel::Avx2 => &["AVX2", "FMA", "F16C"],
        SimdLevel::Avx512 => &[
            "AVX2",
            "FMA",
            "F16C",
            "BMI2",
            "AVX512F",
            "AVX512BW",
            "AVX512VL",
            "AVX512DQ",
            "AVX512_VNNI",
        ],
    }
}

/// The x86 features that matter to the kernels (or that users compare
/// engines by), with whether this CPU has them; empty off x86-64.
pub fn cpu_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            ("SSE3", is_x86_feature_detected!("sse3")),
            ("SSSE3", is_x86_feature_detected!("ssse3")),
            ("AVX", is_x86_feature_detected!("avx")),
            ("AVX2", is_x86_feature_detected!("avx2")),
            ("FMA", is_x86_feature_detected!("fma")),
            ("F16C", is_x86_feature_detected!("f16c")),
            ("BMI2", is_x86_feature_detected!("bmi2")),
            ("AVX_VNNI", is_x86_feature_detected!("avxvnni")),
            ("AVX512F", is_x86_feature_detected!("avx512f")),
            ("AVX512BW", is_x86_feature_detected!("avx512bw")),
            ("AVX512VL", is_x86_feature_detected!("avx512vl")),
            ("AVX512DQ", is_x86_feature_detected!("avx512dq")),
            ("AVX512_VNNI", is_x86_feature_detected!("avx512vnni")),
            ("AVX512_BF16", is_x86_feature_detected!("avx512bf16")),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    // Keep in step with `required_features`.
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

thread_local! {
    /// Cap set by [`level_scope`] on this thread (0 = none); the pool's
    /// workers take their caller's for the length of a job.
    static SCOPED: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// The level kernels use now: the detected level, capped by a
/// [`level_scope`] of the calling thread (or of the thread whose pool job it
/// runs), else by [`force_level`].
#[inline]
pub fn level() -> SimdLevel {
    let d = detected_level();
    let f = match SCOPED.with(std::cell::Cell::get) {
        0 => FORCED.load(Ordering::Relaxed),
        s => s,
    };
    match f {
        0 => d,
        f => d.min(SimdLevel::from_u8(f)),
    }
}

/// Restores the calling thread's previous cap when dropped.
#[must_use = "the cap lasts only while the guard lives"]
pub struct LevelScope {
    prev: u8,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for LevelScope {
    fn drop(&mut self) {
        SCOPED.with(|c| c.set(self.prev));
    }
}

/// Caps the level for the calling thread, and the pool jobs it starts,
/// until the guard is dropped (`None`: no cap of its own; [`force_level`]'s
/// applies). Tests use it to run each path without changing what other
/// threads of the process run.
pub fn level_scope(cap: Option<SimdLevel>) -> LevelScope {
    let prev = SCOPED.with(|c| c.replace(cap.map_or(0, |l| l as u8)));
    LevelScope {
        prev,
        _not_send: std::marker::PhantomData,
    }
}

/// The calling thread's [`level_scope`] cap, for the pool to hand on.
pub(crate) fn scoped_cap() -> Option<SimdLevel> {
    match SCOPED.with(std::cell::Cell::get) {
        0 => None,
        s => Some(SimdLevel::from_u8(s)),
    }
}

/// Whether the AVX2-level kernels may use AVX-VNNI (the 256-bit VEX
/// `vpdpwssd` / `vpdpbusd` of Intel client CPUs since Alder Lake): the CPU
/// has it and `COIL_AVX_VNNI=0` is not set (set it to compare against a
/// plain-AVX2 build of another engine, as `scripts/bench-vs-llamacpp.sh
/// --isa avx2` does). Results are the same either way (exact integer sums).
pub fn avx_vnni() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avxvnni")
                && std::env::var("COIL_AVX_VNNI").map_or(true, |v| v.trim() != "0")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the CPU runs 512-bit vector operations as two 256-bit halves
/// (AMD Zen 4: CPUID vendor "AuthenticAMD", family 0x19 — the one such
/// family with AVX-512; Zen 5, family 0x1A, has full-width units). Kernels
/// whose AVX-512 form is heavy in shifts, merges and stores per byte of
/// weights lose there to their plainer forms (see `matmul::repack`).
pub fn split_512() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let (vendor, family) = cpu_vendor_family();
            &vendor == b"AuthenticAMD" && family == 0x19
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The CPUID vendor string and display family (base family, plus the
/// extended family where the base is 0xF).
#[cfg(target_arch = "x86_64")]
pub fn cpu_vendor_family() -> ([u8; 12], u32) {
    use std::arch::x86_64::__cpuid;
    // (CPUID exists on every x86-64 CPU, leaves 0 and 1 always.)
    let (l0, l1) = (__cpuid(0), __cpuid(1));
    let mut vendor = [0u8; 12];
    vendor[..4].copy_from_slice(&l0.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&l0.edx.to_le_bytes());
    vendor[8..].copy_from_slice(&l0.ecx.to_le_bytes());
    let base = (l1.eax >> 8) & 0xf;
    let family = if base == 0xf {
        base + ((l1.eax >> 20) & 0xff)
    } else {
        base
    };
    (vendor, family)
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
/// for that level) or plain, by `level()`. With one type parameter
/// (`fn name<T: Bound>(..) => body`), each type gets its own compiled
/// levels of `body::<T>` (a state of f32 or bf16 elements: one source).
#[macro_export]
#[doc(hidden)]
macro_rules! multiversion {
    ($vis:vis fn $name:ident<$t:ident : $bound:path>($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:ident) => {
        $vis fn $name<$t: $bound>($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
                unsafe fn v512<$t: $bound>($($arg: $ty),*) $(-> $ret)? { $body::<$t>($($arg),*) }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn v256<$t: $bound>($($arg: $ty),*) $(-> $ret)? { $body::<$t>($($arg),*) }
                match $crate::simd::level() {
                    // SAFETY: level() only reports features the CPU has.
                    $crate::simd::SimdLevel::Avx512 => return unsafe { v512::<$t>($($arg),*) },
                    $crate::simd::SimdLevel::Avx2 => return unsafe { v256::<$t>($($arg),*) },
                    $crate::simd::SimdLevel::Scalar => {}
                }
            }
            $body::<$t>($($arg),*)
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_every_level() {
        for l in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
            assert_eq!(SimdLevel::parse(l.name()), Some(l));
        }
        assert_eq!(SimdLevel::parse(" AVX2 "), Some(SimdLevel::Avx2));
        assert_eq!(SimdLevel::parse("sse4"), None);
    }

    #[test]
    fn check_request_refuses_unknown_and_too_high_levels() {
        assert_eq!(check_request(None, SimdLevel::Avx2), Ok(None));
        assert_eq!(
            check_request(Some("avx2"), SimdLevel::Avx2),
            Ok(Some(SimdLevel::Avx2))
        );
        assert_eq!(
            check_request(Some("scalar"), SimdLevel::Avx512),
            Ok(Some(SimdLevel::Scalar))
        );
        assert_eq!(
            check_request(Some("avx-512"), SimdLevel::Avx512),
            Err(SimdEnvError::Unknown("avx-512".into()))
        );
        let e = check_request(Some("avx512"), SimdLevel::Avx2).unwrap_err();
        assert!(matches!(
            e,
            SimdEnvError::Unsupported {
                requested: "avx512",
                cpu: "avx2",
                ..
            }
        ));
        let msg = e.to_string();
        assert!(
            msg.contains("COIL_SIMD=avx512") && msg.contains("avx2"),
            "{msg}"
        );
        assert!(check_request(Some("avx2"), SimdLevel::Scalar).is_err());
    }

    #[test]
    fn required_features_are_reported() {
        // The level a CPU reports needs every feature `required_features`
        // lists for it.
        let feats = cpu_features();
        for f in required_features(cpu_level()) {
            assert!(
                feats.iter().any(|(n, has)| n == f && *has),
                "{f} in {feats:?}"
            );
        }
    }
}
