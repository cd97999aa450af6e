//! `agentkv gpu-check`: starts the CUDA runtime on GPU 0 (driver, NVRTC, cuBLAS, every kernel
//! compiled for the device) and runs the kernel-level device check (`cuda::selfcheck`) and the
//! kernel timings (`cuda::timing`); with `--model`, also runs each model's forward pass on the
//! GPU against the CPU backend (`model::compare_with_cpu`: greedy tokens and log-probabilities
//! over 20 prompts, beside the CPU in llama-server's arithmetic as the yardstick of how far two
//! correct float orders drift on that model; the GPU passes within 1.5× of it) and times its
//! prefill and decode. Prints one line each and exits non-zero
//! where there is no GPU or a check fails. What `scripts/gpu/check.sh` runs on a GPU machine.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cuda::ops::CudaOps;
use model::{compare_with_cpu, CpuSteps, GpuForward, Model, Numerics};

#[derive(clap::Args, Debug)]
pub struct GpuCheckArgs {
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// GGUF models whose forward pass to compare with the CPU's (repeatable).
    #[arg(long)]
    pub model: Vec<PathBuf>,
    /// Also a random-weight model of SmolLM2-135M's exact shape and types, built in memory
    /// (`model::synthetic`): the real shapes where the real file cannot be carried.
    #[arg(long)]
    pub synthetic_smollm2: bool,
    /// Greedy decode steps per prompt in the model comparison.
    #[arg(long, default_value_t = 64)]
    pub steps: usize,
    /// CPU threads of the reference forward pass.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
}

/// The comparison's prompts: agent-loop, code, prose and question shapes.
const PROMPTS: [&str; 20] = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Thought: I need to look up the weather in Paris.\nAction: get_weather\nObservation:",
    "Once upon a time, in a small village by the sea, there lived",
    "You are a helpful assistant. Answer briefly.\nUser: What is 17 times 3?\nAssistant:",
    "{\"name\": \"search\", \"arguments\": {\"query\":",
    "SELECT name, email FROM users WHERE",
    "The three laws of thermodynamics are",
    "Translate to French: Good morning, how are you?\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n",
    "Q: Why is the sky blue?\nA:",
    "Step 1: Read the file.\nStep 2:",
    "import numpy as np\n\ndef softmax(x):\n",
    "Dear team, I am writing to let you know that",
    "The mitochondria is the powerhouse of",
    "List three prime numbers greater than 100:",
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nResult:",
    "In 1969, the Apollo 11 mission",
    "A haiku about autumn:\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
];

pub fn run(args: GpuCheckArgs) -> Result<()> {
    let started = Instant::now();
    let cuda::Cuda { gpu, cublas, nvrtc } =
        cuda::Cuda::start().context("starting the CUDA runtime")?;
    println!("device: {}", gpu.info());
    println!(
        "nvrtc: {} (version {}.{}); kernels compiled for {} in {:.0} ms",
        nvrtc.0,
        nvrtc.1 .0,
        nvrtc.1 .1,
        gpu.info().arch(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let ops = std::sync::Arc::new(CudaOps::new(gpu, cublas));
    let results = cuda::selfcheck::run_all(&ops, args.seed).context("running the device checks")?;
    for r in &results {
        println!("{r}");
    }
    for t in cuda::timing::run_all(&ops).context("timing the kernels")? {
        println!("timing {t}");
    }
    let mut failed = results.iter().filter(|r| !r.passed).count();
    println!("{} kernel checks, {failed} failed", results.len());
    let mut models: Vec<(String, Model)> = Vec::new();
    for path in &args.model {
        let model = Model::load(path).with_context(|| format!("loading {}", path.display()))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        models.push((name.into_owned(), model));
    }
    if args.synthetic_smollm2 {
        let spec = model::synthetic::SyntheticSpec::smollm2_135m();
        let model = model::synthetic::synthetic_model(&spec).context("the synthetic SmolLM2")?;
        models.push(("synthetic SmolLM2-135M shape".into(), model));
    }
    for (name, model) in &models {
        let mut device = GpuForward::new(ops.clone(), model, 1, 1024, 16)
            .with_context(|| format!("{name} on the GPU"))?;
        let prompts: Vec<Vec<u32>> = PROMPTS
            .iter()
            .map(|p| model.frontend().tokenizer.encode(p, true, false))
            .collect::<Result<_, _>>()?;
        let cmp = compare_with_cpu(model, &mut device, &prompts, args.steps, args.threads)?;
        // The yardstick: the CPU in llama-server's arithmetic against the engine's.
        let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + args.steps + 1;
        let numerics = Numerics::LlamaServer {
            threads: args.threads,
        };
        let mut llama = CpuSteps::new(model, numerics, args.threads, capacity)?;
        let yardstick = compare_with_cpu(model, &mut llama, &prompts, args.steps, args.threads)?;
        let ok = cmp.mean_abs_dlogprob <= 1.5 * yardstick.mean_abs_dlogprob + 0.005;
        println!(
            "model {name}: GPU vs CPU: {cmp}  {}",
            if ok { "ok" } else { "FAILED" }
        );
        println!("model {name}: CPU llama-server arithmetic vs CPU (the yardstick): {yardstick}");
        failed += usize::from(!ok);
        let (prefill, decode) = speed(&mut device, model.config().vocab_size)?;
        println!("model {name}: prefill 512 tokens {prefill:.0} tok/s; decode batch 1 {decode:.0} tok/s (no CUDA graphs)");
    }
    if failed > 0 {
        bail!("{failed} device checks failed");
    }
    Ok(())
}

/// Prefill of 512 tokens and 64 decode steps of one sequence, tokens per second.
fn speed(device: &mut GpuForward<CudaOps>, vocab: usize) -> Result<(f64, f64)> {
    device.clear_slot(0);
    let tokens: Vec<u32> = (0..512u32).map(|i| (i * 7919) % vocab as u32).collect();
    let positions: Vec<u32> = (0..512).collect();
    let t = Instant::now();
    device.forward(&tokens, &positions, &[0; 512], &[511])?;
    let prefill = 512.0 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for step in 0..64u32 {
        device.forward(&[step % vocab as u32], &[512 + step], &[0], &[0])?;
    }
    let decode = 64.0 / t.elapsed().as_secs_f64();
    device.clear_slot(0);
    Ok((prefill, decode))
}
