//! The one line the apps print at start: which SIMD level the kernels
//! run and which kernel choices that brings (it reads both [`crate::simd`]
//! and [`crate::matmul`], so it sits above them).

use crate::simd::{self, SimdLevel};

/// One line saying what runs, like llama.cpp's system-info line:
/// `simd: avx2 (cpu: avx2, no AVX-VNNI) | AVX2 = 1 | FMA = 1 | ... | AVX512F = 0 | ...`;
/// the `COIL_SIMD` cap is named when one is set, at the AVX2 level
/// whether its kernels use AVX-VNNI, and at AVX-512 whether BF16 weights
/// take bf16 products for prompts (AVX512_BF16 where they pay, see
/// [`crate::matmul::bf16_products`]) or stay exact with the measured rate ratio.
pub fn system_info() -> String {
    let mut s = format!(
        "simd: {} (cpu: {}",
        simd::level().name(),
        simd::cpu_level().name()
    );
    if let Some(v) = std::env::var("COIL_SIMD").ok().filter(|v| !v.is_empty()) {
        s.push_str(&format!(", COIL_SIMD={v}"));
    }
    if simd::level() == SimdLevel::Avx2 {
        s.push_str(if simd::avx_vnni() {
            ", with AVX-VNNI"
        } else {
            ", no AVX-VNNI"
        });
    }
    if simd::level() >= SimdLevel::Avx512 && crate::matmul::bf16_products() {
        s.push_str(", BF16 prompts in bf16 products");
    } else if let Some(r) = crate::matmul::bf16_product_ratio() {
        if simd::level() >= SimdLevel::Avx512 {
            s.push_str(&format!(
                ", BF16 prompts exact: vdpbf16ps at {r:.1}x the f32 rate here"
            ));
        }
    }
    if simd::level() >= SimdLevel::Avx512 && simd::split_512() {
        // kernel choices that differ there: Q6_K left in the file's layout,
        // the one-token rows-in-lanes kernels without software prefetches
        s.push_str(", 512-bit ops run as halves: Zen 4 kernel choices");
    }
    s.push(')');
    for (name, has) in simd::cpu_features() {
        s.push_str(&format!(" | {name} = {}", u8::from(has)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_info_names_level_and_features() {
        let info = system_info();
        assert!(
            info.starts_with(&format!("simd: {}", simd::level().name())),
            "{info}"
        );
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2");
            assert!(
                info.contains(&format!("AVX2 = {}", u8::from(avx2))),
                "{info}"
            );
            assert!(info.contains("AVX512F = "), "{info}");
        }
        // BF16 prompts in bf16 products are said exactly when they run.
        assert_eq!(
            info.contains("bf16 products"),
            simd::level() >= SimdLevel::Avx512 && crate::matmul::bf16_products(),
            "{info}"
        );
        // ... and exact BF16 prompts where the CPU's bf16 products were
        // measured and not taken
        assert_eq!(
            info.contains("BF16 prompts exact"),
            simd::level() >= SimdLevel::Avx512
                && !crate::matmul::bf16_products()
                && crate::matmul::bf16_product_ratio().is_some(),
            "{info}"
        );
    }
}
