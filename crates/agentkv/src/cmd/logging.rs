//! Logging for every subcommand: `tracing` to stderr, filtered like `RUST_LOG` (default `info`;
//! e.g. `RUST_LOG=agentkv::request=warn,info`), as text or one JSON object per line
//! (`--log-format json` on `serve`, or `AGENTKV_LOG_FORMAT=json`).

use anyhow::{bail, Result};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (fields flattened), for log shippers.
    Json,
}

/// Installs the global subscriber. `format` wins over `AGENTKV_LOG_FORMAT`; a bad `RUST_LOG` or
/// format is an error naming it.
pub fn init(format: Option<LogFormat>) -> Result<()> {
    let format = match format {
        Some(f) => f,
        None => match std::env::var("AGENTKV_LOG_FORMAT").ok().as_deref() {
            None | Some("") | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => bail!("AGENTKV_LOG_FORMAT={other:?}: use text or json"),
        },
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.is_empty() => {
            EnvFilter::try_new(&s).map_err(|e| anyhow::anyhow!("RUST_LOG={s:?}: {e}"))?
        }
        _ => EnvFilter::new("info"),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // Already installed (tests calling twice): keep the first.
    let _ = result;
    Ok(())
}
