//! Branch-free math that the compiler can vectorize.

/// `e^x` to about 2 ulp for normal results; 0 below −87.3, +inf above 88.7.
/// Written without calls so loops over it vectorize.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23: round to nearest
    let xc = x.clamp(-87.3, 88.7);
    let kt = xc * LOG2E + MAGIC; // round(x·log2 e) in the low mantissa bits
    let k = kt - MAGIC;
    let r = xc - k * LN2_HI - k * LN2_LO;
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // 2^k from the integer in kt's mantissa (no float→int conversion, which
    // would not vectorize): kt.bits − MAGIC.bits = k.
    let ki = (kt.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let scale = f32::from_bits((ki.wrapping_add(127) as u32) << 23);
    let v = p * scale;
    if x < -87.3 {
        0.0
    } else if x > 88.7 {
        f32::INFINITY
    } else {
        v
    }
}

/// `ln(1 + y)` for `y` in [0, 1], to a few ulp: `2·atanh(s)` with
/// `s = y / (2 + y)` ≤ 1/3, its odd series to s¹⁵ (the next term is below
/// 2⁻²⁹). Written without calls so loops over it vectorize.
#[inline(always)]
pub fn log1p_unit(y: f32) -> f32 {
    let s = y / (2.0 + y);
    let z = s * s;
    let p = 1.0 / 15.0;
    let p = p * z + 1.0 / 13.0;
    let p = p * z + 1.0 / 11.0;
    let p = p * z + 1.0 / 9.0;
    let p = p * z + 1.0 / 7.0;
    let p = p * z + 1.0 / 5.0;
    let p = p * z + 1.0 / 3.0;
    let p = p * z + 1.0;
    2.0 * s * p
}

/// `ln(1 + e^x)` as torch's softplus computes it (`x` itself above 20),
/// as `max(x, 0) + ln(1 + e^−|x|)` with [`exp_fast`] and [`log1p_unit`]:
/// vectorizes, where libm's `log1pf(expf(x))` is two calls per element.
#[inline(always)]
pub fn softplus_fast(x: f32) -> f32 {
    let l = x.max(0.0) + log1p_unit(exp_fast(-x.abs()));
    if x > 20.0 {
        x
    } else {
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log1p_and_softplus_accuracy() {
        let mut y = 0.0f32;
        while y <= 1.0 {
            let e = (y as f64).ln_1p();
            let a = log1p_unit(y) as f64;
            assert!(
                (a - e).abs() <= 3e-7 * e.max(1e-30),
                "log1p({y}) = {a} vs {e}"
            );
            y += 0.000_731;
        }
        assert_eq!(log1p_unit(0.0), 0.0);
        let mut x = -100.0f32;
        while x < 100.0 {
            let xf = x as f64;
            let e = if xf > 20.0 { xf } else { xf.exp().ln_1p() };
            let a = softplus_fast(x) as f64;
            if e > 1e-37 {
                assert!(((a - e) / e).abs() < 1e-6, "softplus({x}) = {a} vs {e}");
            }
            x += 0.0173;
        }
        assert_eq!(softplus_fast(30.0), 30.0);
        assert!(softplus_fast(f32::NAN).is_nan());
    }

    #[test]
    fn exp_accuracy() {
        let mut x = -90.0f32;
        while x < 89.0 {
            let e = (x as f64).exp();
            let a = exp_fast(x) as f64;
            if e > 1e-37 && e < 1e38 {
                assert!(((a - e) / e).abs() < 5e-7, "exp({x}) = {a} vs {e}");
            }
            x += 0.0137;
        }
        assert_eq!(exp_fast(-100.0), 0.0);
        assert_eq!(exp_fast(0.0), 1.0);
        assert!(exp_fast(f32::NAN).is_nan() || exp_fast(f32::NAN) == 0.0);
    }
}
