//! The portable level: every format's reference dot products
//! ([`vecdot`], [`vecdot_iq`]) and decoding to f32 ([`dequant`]), plain Rust that any CPU
//! runs and every SIMD kernel is tested against.

pub mod dequant;
pub mod vecdot;
pub mod vecdot_iq;
