//! The CUDA kernel sources agentkv compiles with NVRTC at start, and each kernel's parameter
//! list as this crate passes it ([`KernelDef`]): a launch whose arguments do not match the
//! declared kinds is refused before it reaches the driver, and a test holds every declaration
//! against the `extern "C" __global__` signature in the source.
//!
//! Owns the sources and the table. It never launches (that is [`crate::Gpu::launch`]).

use crate::error::CudaError;
use crate::nvrtc::Nvrtc;

/// Prepended to every source (NVRTC compiles each alone, without an include path).
pub const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

/// One CUDA source file.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    pub name: &'static str,
    pub text: &'static str,
}

pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "rows.cu",
        text: include_str!("../kernels/rows.cu"),
    },
    KernelSource {
        name: "attention.cu",
        text: include_str!("../kernels/attention.cu"),
    },
    KernelSource {
        name: "linear.cu",
        text: include_str!("../kernels/linear.cu"),
    },
];

/// The C type of one kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A device pointer (`float*`, `const int*`, `unsigned short*`, …).
    Ptr,
    I32,
    F32,
}

/// One kernel: its entry name, source file and parameters in order.
#[derive(Debug, Clone, Copy)]
pub struct KernelDef {
    pub name: &'static str,
    pub source: &'static str,
    pub params: &'static [ArgKind],
}

use ArgKind::{Ptr, F32, I32};

pub const KERNELS: &[KernelDef] = &[
    KernelDef {
        name: "embed_rows_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, Ptr, I32, F32],
    },
    KernelDef {
        name: "rms_norm_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, Ptr, I32, F32, F32],
    },
    KernelDef {
        name: "rope_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32, I32, I32, I32],
    },
    KernelDef {
        name: "add_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32],
    },
    KernelDef {
        name: "add_bias_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32, I32],
    },
    KernelDef {
        name: "swiglu_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, Ptr, I32],
    },
    KernelDef {
        name: "geglu_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, Ptr, I32],
    },
    KernelDef {
        name: "softcap_f32",
        source: "rows.cu",
        params: &[Ptr, I32, F32],
    },
    KernelDef {
        name: "gather_rows_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, Ptr, I32],
    },
    KernelDef {
        name: "argmax_rows_f32",
        source: "rows.cu",
        params: &[Ptr, I32, Ptr],
    },
    KernelDef {
        name: "f32_to_f16",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32],
    },
    KernelDef {
        name: "f16_to_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32],
    },
    KernelDef {
        name: "round_q8_32_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32],
    },
    KernelDef {
        name: "round_q8k_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32],
    },
    KernelDef {
        name: "q8_sum_correction_f32",
        source: "rows.cu",
        params: &[Ptr, Ptr, I32],
    },
    KernelDef {
        name: "linear_f32",
        source: "linear.cu",
        params: &[Ptr, Ptr, Ptr, I32, I32, I32],
    },
    KernelDef {
        name: "kv_write_f16",
        source: "attention.cu",
        params: &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I32, I32, I32],
    },
    KernelDef {
        name: "attention_paged_f16",
        source: "attention.cu",
        params: &[
            Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, I32, I32, I32, I32, I32, I32, I32, F32, F32,
        ],
    },
];

/// The definition of kernel `name`.
pub fn kernel(name: &str) -> Result<&'static KernelDef, CudaError> {
    KERNELS
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| CudaError::Invalid(format!("no kernel named {name}")))
}

/// The text NVRTC compiles for `source`: the prelude, then the file.
pub fn full_text(source: &KernelSource) -> String {
    format!("{PRELUDE}\n#line 1 \"{}\"\n{}", source.name, source.text)
}

/// Every source compiled to PTX for `arch` (`compute_80`, `compute_90`, …), in [`SOURCES`]
/// order.
pub fn compile_all(nvrtc: &Nvrtc, arch: &str) -> Result<Vec<(&'static str, String)>, CudaError> {
    SOURCES
        .iter()
        .map(|s| Ok((s.name, nvrtc.compile(s.name, &full_text(s), arch)?)))
        .collect()
}

/// The `extern "C" __global__` signatures of `text`: (name, parameter kinds), in source order.
pub fn parse_signatures(text: &str) -> Result<Vec<(String, Vec<ArgKind>)>, CudaError> {
    let mut out = Vec::new();
    for piece in text.split("extern \"C\" __global__ void ").skip(1) {
        let open = piece.find('(').ok_or_else(|| bad("no '('"))?;
        let close = piece.find(')').ok_or_else(|| bad("no ')'"))?;
        let name = piece[..open].trim().to_string();
        let mut kinds = Vec::new();
        for param in piece[open + 1..close].split(',') {
            let param = param.split_whitespace().collect::<Vec<_>>().join(" ");
            let kind = if param.contains('*') {
                Ptr
            } else if param.starts_with("int ") {
                I32
            } else if param.starts_with("float ") {
                F32
            } else {
                return Err(bad(&format!("{name}: parameter type of `{param}`")));
            };
            kinds.push(kind);
        }
        out.push((name, kinds));
    }
    Ok(out)
}

fn bad(what: &str) -> CudaError {
    CudaError::Invalid(format!("kernel source signature: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_kernel_matches_its_source_signature() {
        let mut seen = 0;
        for source in SOURCES {
            for (name, kinds) in parse_signatures(source.text).unwrap() {
                let def = kernel(&name).unwrap_or_else(|_| panic!("{name} is not declared"));
                assert_eq!(def.source, source.name, "{name}");
                assert_eq!(def.params, &kinds[..], "{name}'s parameters");
                seen += 1;
            }
        }
        assert_eq!(seen, KERNELS.len(), "a declared kernel has no source");
    }
}
