//! Prints measured round-trip errors of every codec on synthetic K/V-like rows (head_dim 64):
//! Gaussian values with a few large "outlier" channels, as post-RoPE keys have. Columns:
//! relative RMS error `‖x − x̂‖/‖x‖`, worst element error in units of the row's amax, and the
//! relative error of the score `|q·x̂ − q·x| / (‖q‖‖x‖)`. Deterministic (fixed seed).
//! `cargo run -p quant --release --example error_stats`.

use quant::{decode_row, dot_row, encode_row_to_vec, KvCodecKind};
use rand::{Rng, SeedableRng};

const HEAD_DIM: usize = 64;
const NUM_ROWS: usize = 20_000;

fn gaussian(rng: &mut impl Rng) -> f32 {
    let (u1, u2) = (rng.gen_range(1e-7f64..1.0), rng.gen_range(0.0f64..1.0));
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

fn main() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let outliers = [3usize, 17, 40, 41];
    let rows: Vec<Vec<f32>> = (0..NUM_ROWS)
        .map(|_| {
            (0..HEAD_DIM)
                .map(|c| {
                    let g = gaussian(&mut rng);
                    if outliers.contains(&c) {
                        8.0 * g + 6.0
                    } else {
                        g
                    }
                })
                .collect()
        })
        .collect();
    let q: Vec<f32> = (0..HEAD_DIM).map(|_| gaussian(&mut rng)).collect();
    let q_norm = q.iter().map(|v| v * v).sum::<f32>().sqrt();
    println!("codec       bytes/row  rel_rms    max_err/amax  score_err");
    for kind in [
        KvCodecKind::F32,
        KvCodecKind::F16,
        KvCodecKind::Bf16,
        KvCodecKind::Fp8E4m3,
        KvCodecKind::Int8 { group: 64 },
        KvCodecKind::Int8 { group: 32 },
        KvCodecKind::Int4 { group: 64 },
        KvCodecKind::Int4 { group: 32 },
        KvCodecKind::Int8Hadamard { group: 64 },
        KvCodecKind::Int4Hadamard { group: 64 },
        KvCodecKind::Int4Hadamard { group: 32 },
    ] {
        let (mut err2, mut norm2, mut worst, mut score_err) = (0f64, 0f64, 0f64, 0f64);
        let mut xh = vec![0f32; HEAD_DIM];
        for x in &rows {
            let bytes = encode_row_to_vec(kind, x).expect("valid shape");
            decode_row(kind, &bytes, &mut xh).expect("valid shape");
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in x.iter().zip(&xh) {
                let e = f64::from(a - b);
                err2 += e * e;
                norm2 += f64::from(*a) * f64::from(*a);
                worst = worst.max(e.abs() / f64::from(amax));
            }
            let exact: f64 = q.iter().zip(x).map(|(a, b)| f64::from(a * b)).sum();
            let x_norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
            let got = f64::from(dot_row(kind, &q, &bytes));
            score_err += (got - exact).abs() / f64::from(q_norm * x_norm);
        }
        println!(
            "{:<11} {:>9}  {:<9.3e}  {:<12.3e}  {:.3e}",
            kind.id(),
            kind.bytes_per_row(HEAD_DIM),
            (err2 / norm2).sqrt(),
            worst,
            score_err / NUM_ROWS as f64
        );
    }
}
