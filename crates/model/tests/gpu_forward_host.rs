//! The device forward pass (`GpuForward`) over `HostOps` — each CUDA kernel's definition
//! computed on the CPU — against the CPU backend, on every llama.cpp-written architecture
//! fixture and on SmolLM2-135M: what a GPU run of `agentkv gpu-check --model` measures, here
//! with the kernels' definitions instead of the kernels (issue #47, must-have 4).

use std::path::{Path, PathBuf};

use cuda::ops::HostOps;
use gguf::{dequantize_row, GgmlType, GgufFile, GgufWriter};
use model::{compare_with_cpu, Comparison, CpuSteps, GpuForward, Model, Numerics};

fn text_prompts(model: &Model, texts: &[&str]) -> Vec<Vec<u32>> {
    texts
        .iter()
        .map(|t| model.frontend().tokenizer.encode(t, true, false).unwrap())
        .collect()
}

const TEXTS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Thought: I need to look up the weather in Paris.\nAction: get_weather\nObservation:",
    "Once upon a time, in a small village by the sea, there lived",
];

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    names.sort();
    assert!(names.len() >= 9, "{names:?}");
    names
}

/// `path` with every tensor dequantized to f32: the CPU then multiplies in f32 as the device
/// does (a quantized matrix makes the CPU round the activations to 8 bits first), so the two
/// differ only in summation order and any other difference is the orchestration's.
fn f32_copy(path: &Path, dir: &Path) -> PathBuf {
    let file = GgufFile::open(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        w.add_metadata(k, v.clone());
    }
    for t in file.tensors() {
        let mut data = vec![0f32; t.num_elems() as usize];
        dequantize_row(t.ty, file.tensor_data(t), &mut data).unwrap();
        w.add_tensor_f32(&t.name, &t.dims, &data, GgmlType::F32)
            .unwrap();
    }
    let out = dir.join(path.file_name().unwrap());
    w.write_to(&out).unwrap();
    out
}

fn compare(path: &Path, steps: usize) -> Comparison {
    let model = Model::load(path).unwrap();
    let prompts = text_prompts(&model, TEXTS);
    let mut device = GpuForward::new(std::sync::Arc::new(HostOps), &model, 1, 256, 16).unwrap();
    let cmp = compare_with_cpu(&model, &mut device, &prompts, steps, 2).unwrap();
    eprintln!("{}: {cmp}", path.display());
    cmp
}

#[test]
fn every_architecture_follows_the_cpu_in_f32() {
    let dir = tempfile::tempdir().unwrap();
    for path in fixtures() {
        let cmp = compare(&f32_copy(&path, dir.path()), 16);
        assert!(
            cmp.greedy_equal_steps.iter().all(|&s| s == 16) && cmp.max_abs_dlogprob < 5e-3,
            "{}: {cmp}",
            path.display()
        );
    }
}

#[test]
fn every_quantized_architecture_fixture_stays_near_the_cpu() {
    // Random tiny models: near-ties make greedy flips from the CPU's 8-bit activations
    // frequent, so only the log-probabilities are bounded here.
    for path in fixtures() {
        let cmp = compare(&path, 16);
        assert!(cmp.mean_abs_dlogprob < 0.05, "{}: {cmp}", path.display());
    }
}

#[test]
fn smollm2_in_f32_follows_the_cpu() {
    // The real model with its weights dequantized: only summation orders differ.
    let dir = tempfile::tempdir().unwrap();
    let cmp = compare(&f32_copy(&model::default_model_path(), dir.path()), 16);
    assert!(
        cmp.greedy_equal_steps.iter().all(|&s| s == 16) && cmp.max_abs_dlogprob < 1e-2,
        "{cmp}"
    );
}

#[test]
fn smollm2_stays_as_near_the_cpu_as_llama_servers_arithmetic_does() {
    // With 8-bit activations, a float-order difference anywhere flips some rounded values:
    // the CPU in llama-server's arithmetic drifts from the engine's by as much. The device
    // pass must stay within that yardstick.
    let model = Model::load(&model::default_model_path()).unwrap();
    let prompts = text_prompts(&model, TEXTS);
    let mut device = GpuForward::new(std::sync::Arc::new(HostOps), &model, 1, 256, 16).unwrap();
    let cmp = compare_with_cpu(&model, &mut device, &prompts, 32, 2).unwrap();
    let mut llama = CpuSteps::new(&model, Numerics::LlamaServer { threads: 2 }, 2, 256).unwrap();
    let yardstick = compare_with_cpu(&model, &mut llama, &prompts, 32, 2).unwrap();
    eprintln!("SmolLM2-135M device: {cmp}\nSmolLM2-135M llama-server arithmetic: {yardstick}");
    assert!(
        cmp.mean_abs_dlogprob <= 1.5 * yardstick.mean_abs_dlogprob + 0.005,
        "device {cmp} against {yardstick}"
    );
}
