//! `agentkv gpu-check`: starts the CUDA runtime on GPU 0 (driver, NVRTC, cuBLAS, every kernel
//! compiled for the device) and runs the kernel-level device check (`cuda::selfcheck`) and the
//! kernel timings (`cuda::timing`), printing the device, the libraries and one line each. Exits non-zero where there is
//! no GPU or a check fails. What `scripts/gpu/check.sh` runs on a machine with a GPU.

use anyhow::{bail, Context, Result};

#[derive(clap::Args, Debug)]
pub struct GpuCheckArgs {
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

pub fn run(args: GpuCheckArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let mut cuda = cuda::Cuda::start().context("starting the CUDA runtime")?;
    println!("device: {}", cuda.gpu.info());
    println!(
        "nvrtc: {} (version {}.{}); kernels compiled for {} in {:.0} ms",
        cuda.nvrtc.0,
        cuda.nvrtc.1 .0,
        cuda.nvrtc.1 .1,
        cuda.gpu.info().arch(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let results = cuda::selfcheck::run_all(&cuda.gpu, &mut cuda.cublas, args.seed)
        .context("running the device checks")?;
    for r in &results {
        println!("{r}");
    }
    for t in cuda::timing::run_all(&cuda.gpu, &mut cuda.cublas).context("timing the kernels")? {
        println!("timing {t}");
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    println!("{} checks, {failed} failed", results.len());
    if failed > 0 {
        bail!("{failed} device checks failed");
    }
    Ok(())
}
