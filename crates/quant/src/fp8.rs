//! Scalar conversions between f32 and FP8 E4M3 ("e4m3fn": 1 sign, 4 exponent bits with bias 7,
//! 3 mantissa bits, no infinities, largest finite ±448).
//!
//! Owns the rounding (nearest, ties to even, saturating at ±448) and the decode table. The
//! encoder never produces the NaN codes `0x7F`/`0xFF`; if such a byte is decoded anyway it reads
//! as ±480 (the same value the AVX2 path computes), never NaN. It never scales: the row scale is
//! applied by the callers.

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Code of +448.
const MAX_CODE: u8 = 0x7E;

const fn decode_const(code: u8) -> f32 {
    let e = ((code >> 3) & 0x0F) as i32;
    let m = (code & 0x07) as f32;
    let magnitude = if e == 0 {
        m * (1.0 / 512.0)
    } else {
        (1.0 + m / 8.0) * f32::from_bits(((e - 7 + 127) as u32) << 23)
    };
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

const fn build_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode_const(i as u8);
        i += 1;
    }
    t
}

/// Value of every E4M3 code (unscaled).
pub static E4M3_TABLE: [f32; 256] = build_table();

/// Decodes one code (unscaled).
#[inline(always)]
pub fn e4m3_to_f32(code: u8) -> f32 {
    E4M3_TABLE[code as usize]
}

/// Encodes `y` with round-to-nearest-even, saturating to ±448. NaN encodes as +0.
pub fn f32_to_e4m3(y: f32) -> u8 {
    if y.is_nan() {
        return 0;
    }
    let sign = if y.is_sign_negative() { 0x80u8 } else { 0 };
    let a = y.abs();
    let magnitude = if a >= E4M3_MAX {
        MAX_CODE
    } else if a < 1.0 / 64.0 {
        // Subnormal range (step 2^-9); 8·2^-9 = 2^-6 is code 0x08, the smallest normal, so the
        // rounded multiple is the code itself.
        (a * 512.0).round_ties_even() as u8
    } else {
        // Normal: keep 3 of the 23 mantissa bits with round-to-nearest-even on the dropped 20;
        // a carry moves into the exponent as it should.
        let bits = a.to_bits();
        let rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20;
        let code = rounded - ((127 - 7) << 3);
        (code as u8).min(MAX_CODE)
    };
    sign | magnitude
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn table_matches_the_f16_bit_trick_used_by_avx2() {
        for code in 0..=255u8 {
            let bits = ((u16::from(code) & 0x80) << 8) | ((u16::from(code) & 0x7F) << 7);
            let via_f16 = f16::from_bits(bits).to_f32() * 256.0;
            assert_eq!(
                e4m3_to_f32(code).to_bits(),
                via_f16.to_bits(),
                "code {code:#x}"
            );
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
    }

    #[test]
    fn encode_is_nearest_even_and_exact_on_every_code() {
        for code in 0..=255u8 {
            if code & 0x7F == 0x7F {
                continue;
            }
            let v = e4m3_to_f32(code);
            assert_eq!(f32_to_e4m3(v), code, "exact value {v}");
        }
        // Nearest: compare with a brute-force search over all finite codes.
        let finite: Vec<u8> = (0..=255u8).filter(|c| c & 0x7F != 0x7F).collect();
        let mut y = -500.0f32;
        while y < 500.0 {
            let got = e4m3_to_f32(f32_to_e4m3(y));
            let best = finite
                .iter()
                .map(|&c| (e4m3_to_f32(c) - y.clamp(-448.0, 448.0)).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((got - y.clamp(-448.0, 448.0)).abs(), best, "y={y}");
            y += 0.0137;
        }
        // Ties go to even mantissas: 1 + 1/16 lies between 1 (m=0) and 1.125 (m=1).
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.1875), 0x3A);
        assert_eq!(f32_to_e4m3(f32::NAN), 0);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
        assert_eq!(f32_to_e4m3(1e-30), 0);
    }
}
