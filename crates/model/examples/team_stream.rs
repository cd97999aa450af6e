//! Would a decode whose two threads each own a static half of every matrix's rows, and meet at a
//! spin barrier after each matrix instead of a pool call, stream the weights faster? The default
//! model's layer shapes (Q4_1, ~96 MiB, one token) streamed both ways in the same run, beside
//! the plain read of two threads: the pool's `matmul` per matrix, and two scoped threads that
//! each run their half-matrices on a one-thread pool, then (`MODE=0`, default) meet at the
//! barrier and copy the whole output as the next input (the hand-off a layer needs), or
//! (`MODE=1`) only meet, or (`MODE=2`) never meet (the threads' own streams, no
//! synchronisation: the bound of any static split). Prints GB/s of weights per pass (best of 6)
//! for 4 rounds. Measures only.
//!
//! `cargo run --release -p model --example team_stream` (`MODE=0|1|2`)
#[path = "common/weights.rs"]
mod weights;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use gguf::GgmlType;
use kernels::{matmul, Packed32, QMatrix, ThreadPool};
use rand::{Rng, SeedableRng};
use weights::{random_weights, LAYER_SHAPES};

struct Mat {
    data: Vec<u8>,
    p: Packed32,
    rows: usize,
    cols: usize,
}

fn mk(ty: GgmlType, r: usize, c: usize, seed: u64) -> Mat {
    let data = random_weights(ty, r, c, seed);
    let p = Packed32::pack(ty, r, c, &data).expect("pack");
    Mat {
        data,
        p,
        rows: r,
        cols: c,
    }
}

fn run(pool: &ThreadPool, ty: GgmlType, m: &Mat, x: &[f32], y: &mut [f32]) {
    let w = QMatrix {
        ty,
        num_rows: m.rows,
        row_len: m.cols,
        data: &m.data,
        packed: Some(&m.p),
    };
    matmul(pool, &w, &x[..m.cols], 1, &mut y[..m.rows]).expect("matmul");
}

struct Barrier {
    count: AtomicU32,
    sense: AtomicU32,
}
impl Barrier {
    fn wait(&self, local: &mut u32) {
        *local ^= 1;
        if self.count.fetch_add(1, Ordering::AcqRel) == 1 {
            self.count.store(0, Ordering::Relaxed);
            self.sense.store(*local, Ordering::Release);
        } else {
            while self.sense.load(Ordering::Acquire) != *local {
                std::hint::spin_loop();
            }
        }
    }
}

fn main() {
    let shapes = LAYER_SHAPES;
    let ty = GgmlType::Q4_1;
    let mut full = Vec::new();
    let mut halves: [Vec<Mat>; 2] = [Vec::new(), Vec::new()];
    let (mut total, mut seed) = (0usize, 0u64);
    while total < 96 << 20 {
        for &(r, c) in &shapes {
            seed += 1;
            let m = mk(ty, r, c, seed);
            total += m.data.len();
            full.push(m);
            halves[0].push(mk(ty, r / 2, c, seed * 1000));
            halves[1].push(mk(ty, r / 2, c, seed * 1000 + 1));
        }
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(99);
    let x: Vec<f32> = (0..1536).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let pool = ThreadPool::new(2);
    let mode: u32 = std::env::var("MODE").map_or(0, |v| v.parse().unwrap());
    for round in 0..4 {
        let bw = model::measure_read_bandwidth(&pool, 256 << 20, 4);
        let mut y = vec![0f32; 1536];
        let mut best = f64::MAX;
        for _ in 0..6 {
            let t = Instant::now();
            for m in &full {
                run(&pool, ty, m, &x, &mut y);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let pool_gbs = total as f64 / best / 1e9;
        // Team: two scoped threads, static halves, barrier + hand-off after each matrix.
        let out: Vec<std::sync::Mutex<Vec<f32>>> = (0..2)
            .map(|_| std::sync::Mutex::new(vec![0f32; 1536]))
            .collect();
        let shared_y: Vec<AtomicU32> = (0..1536).map(|_| AtomicU32::new(0)).collect();
        let mut team_best = f64::MAX;
        for _ in 0..6 {
            let barrier = Barrier {
                count: AtomicU32::new(0),
                sense: AtomicU32::new(0),
            };
            let t = Instant::now();
            std::thread::scope(|s| {
                for rank in 0..2 {
                    let (barrier, halves, x, shared_y, out) =
                        (&barrier, &halves, &x, &shared_y, &out);
                    s.spawn(move || {
                        let one = ThreadPool::new(1);
                        let mut local = 0u32;
                        let mut xin = x.clone();
                        let mut yl = out[rank].lock().unwrap();
                        barrier.wait(&mut local);
                        for m in &halves[rank] {
                            run(&one, ty, m, &xin, &mut yl);
                            let off = rank * m.rows;
                            for (i, v) in yl[..m.rows].iter().enumerate() {
                                shared_y[off + i].store(v.to_bits(), Ordering::Relaxed);
                            }
                            if mode == 2 {
                                continue;
                            }
                            barrier.wait(&mut local);
                            if mode == 1 {
                                continue;
                            }
                            let n = (2 * m.rows).min(xin.len());
                            for (i, v) in xin[..n].iter_mut().enumerate() {
                                *v = f32::from_bits(shared_y[i].load(Ordering::Relaxed))
                                    .clamp(-1.0, 1.0);
                            }
                        }
                    });
                }
            });
            team_best = team_best.min(t.elapsed().as_secs_f64());
        }
        let team_gbs = total as f64 / team_best / 1e9;
        println!("round {round}: plain read 2 threads {:.1} GB/s; pool matmul {pool_gbs:.1} GB/s ({:.2} us/call); team halves+barrier {team_gbs:.1} GB/s ({:.2} us/matrix)",
            bw.best() / 1e9, best * 1e6 / full.len() as f64, team_best * 1e6 / full.len() as f64);
    }
}
