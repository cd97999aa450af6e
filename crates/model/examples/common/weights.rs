//! Weights for the streaming examples (`packed_stream`, `team_stream`) and the kernel bench:
//! the default model's layer shapes, and random GGUF-encoded weights — random quant bytes with
//! every block's `d` set to 0.01 (and Q4_1's `m` to −0.05), so sums stay finite. Measures only;
//! never used by the product.

use gguf::GgmlType;
use rand::{Rng, SeedableRng};

/// One layer of SmolLM2-135M as `(rows, row_len)`: q, k, v, o, gate, up (576 in), down (1536 in).
#[allow(dead_code)] // the bench uses only the generator
pub const LAYER_SHAPES: [(usize, usize); 7] = [
    (576, 576),
    (192, 576),
    (192, 576),
    (576, 576),
    (1536, 576),
    (1536, 576),
    (576, 1536),
];

/// `num_rows` rows of `row_len` elements of `ty`, from `seed`.
pub fn random_weights(ty: GgmlType, num_rows: usize, row_len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let row_bytes = ty.row_bytes(row_len).expect("whole blocks");
    let mut data: Vec<u8> = (0..num_rows * row_bytes).map(|_| rng.gen()).collect();
    let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    let m = half::f16::from_f32(-0.05).to_bits().to_le_bytes();
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        blk[0..2].copy_from_slice(&d);
        if ty == GgmlType::Q4_1 {
            blk[2..4].copy_from_slice(&m);
        }
    }
    data
}
