//! The kernel sources compile with NVRTC for the GPUs agentkv targets (Ampere, Hopper), with
//! no GPU present: NVRTC is a compiler only. Every kernel of the table is an entry of the PTX.
//!
//! Needs libnvrtc (`AGENTKV_LIBNVRTC` or the loader's path; `scripts/test.sh` installs NVIDIA's
//! `nvidia-cuda-nvrtc-cu12` wheel and sets `AGENTKV_REQUIRE_NVRTC=1`, so there a missing
//! NVRTC fails instead of skipping).

use cuda::kernels::{self, KERNELS, SOURCES};
use cuda::{CudaError, Nvrtc};

fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) if std::env::var("AGENTKV_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("AGENTKV_REQUIRE_NVRTC=1 but {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn every_kernel_compiles_for_ampere_and_hopper() {
    let Some(nvrtc) = nvrtc() else { return };
    let (major, minor) = nvrtc.version();
    assert!(major >= 11, "NVRTC {major}.{minor}");
    for arch in ["compute_80", "compute_90"] {
        let ptx = kernels::compile_all(&nvrtc, arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(ptx.len(), SOURCES.len());
        for def in KERNELS {
            let (_, text) = ptx.iter().find(|(s, _)| *s == def.source).unwrap();
            assert!(
                text.contains(&format!(".entry {}(", def.name)),
                "{arch}: no entry {} in the PTX of {}",
                def.name,
                def.source
            );
            let target = format!(".target sm_{}", &arch["compute_".len()..]);
            assert!(text.contains(&target), "{arch}: {target} missing");
        }
    }
}

#[test]
fn a_source_error_is_a_typed_error_with_the_compile_log() {
    let Some(nvrtc) = nvrtc() else { return };
    let err = nvrtc
        .compile(
            "broken.cu",
            "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
            "compute_90",
        )
        .unwrap_err();
    let CudaError::Compile {
        source_name, log, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(source_name, "broken.cu");
    assert!(log.contains("undefined_name"), "{log}");
}
