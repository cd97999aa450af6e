//! `int_row_drivers!`: the group loops of the integer codecs, written once and expanded in both
//! kernel modules (`scalar.rs`, `avx2.rs`) so each loop runs inside one instruction-set context.
//! Owns that macro only; it never chooses a kernel (`dispatch.rs` does).

/// Integer-row drivers over all groups (expanded in `scalar.rs` and `avx2.rs` so the group loop
/// runs inside one instruction-set context). `params` is the `(scale, offset)` header.
macro_rules! int_row_drivers {
    ($($tf:meta)?) => {
        /// `Σ_g scale_g·(q_g·codes_g) + offset_g·Σq_g`, groups in order, fused.
        $(#[$tf])?
        pub(crate) fn dot_int_row(
            q: &[f32],
            params: &[u8],
            codes: &[u8],
            group: usize,
            four_bit: bool,
            group_sums: Option<&[f32]>,
        ) -> f32 {
            let mut r = 0f32;
            for (g, qg) in q.chunks_exact(group).enumerate() {
                let q_dot_codes = if four_bit {
                    dot_u4(qg, &codes[g * group / 2..(g + 1) * group / 2])
                } else {
                    dot_u8(qg, &codes[g * group..(g + 1) * group])
                };
                let q_sum = match group_sums {
                    Some(sums) => sums[g],
                    None => sum(qg),
                };
                let (scale, offset) = $crate::layout::group_params(params, g);
                r = scale.mul_add(q_dot_codes, r);
                r = offset.mul_add(q_sum, r);
            }
            r
        }

        /// `acc += w·x̂` over all groups.
        $(#[$tf])?
        pub(crate) fn axpy_int_row(
            w: f32,
            params: &[u8],
            codes: &[u8],
            group: usize,
            four_bit: bool,
            acc: &mut [f32],
        ) {
            for (g, ag) in acc.chunks_exact_mut(group).enumerate() {
                let (scale, offset) = $crate::layout::group_params(params, g);
                if four_bit {
                    axpy_u4(w, scale, offset, &codes[g * group / 2..(g + 1) * group / 2], ag);
                } else {
                    axpy_u8(w, scale, offset, &codes[g * group..(g + 1) * group], ag);
                }
            }
        }

        /// `out = x̂` over all groups.
        $(#[$tf])?
        pub(crate) fn decode_int_row(
            params: &[u8],
            codes: &[u8],
            group: usize,
            four_bit: bool,
            out: &mut [f32],
        ) {
            for (g, og) in out.chunks_exact_mut(group).enumerate() {
                let (scale, offset) = $crate::layout::group_params(params, g);
                if four_bit {
                    decode_u4(scale, offset, &codes[g * group / 2..(g + 1) * group / 2], og);
                } else {
                    decode_u8(scale, offset, &codes[g * group..(g + 1) * group], og);
                }
            }
        }
    };
}

pub(crate) use int_row_drivers;
