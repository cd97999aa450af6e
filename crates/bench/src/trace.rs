//! The request trace (`--save-trace`, `bench replay`): JSONL, one line per request actually sent,
//! `{"t", "session", "tenant", "agent", "task", "step", "target", "delay_before_ms", "request"}`.
//! `t`, `session` and `tenant` mean what they mean in `cache-sim` traces; `request` holds text
//! (chat messages), not token ids, so feeding `cache-sim` needs tokenisation
//! (`agentkv bench trace-to-sim`). Reads and writes files; never sends requests.

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;

use api::ChatCompletionRequest;
use serde::{Deserialize, Serialize};

use crate::BenchError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// Seconds from the start of the run to sending this request.
    pub t: f64,
    /// Conversation id, `a{agent}-t{task}`.
    pub session: String,
    pub tenant: String,
    pub agent: u32,
    pub task: u32,
    pub step: u32,
    /// Index of the target it was sent to (0 = `--url`, 1 = `--compare`).
    pub target: usize,
    /// Simulated tool time the agent waited before this call.
    pub delay_before_ms: u64,
    /// The request as built by the agent (the client adds `stream` and `stream_options`).
    pub request: ChatCompletionRequest,
}

/// Writes `entries` as JSONL, creating the parent directory if needed.
pub fn write_trace(path: &Path, entries: &[TraceEntry]) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    let file = std::fs::File::create(path).map_err(|e| BenchError::io(path, e))?;
    let mut w = BufWriter::new(file);
    for e in entries {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n").map_err(|e| BenchError::io(path, e))?;
    }
    w.flush().map_err(|e| BenchError::io(path, e))
}

pub fn read_trace(path: &Path) -> Result<Vec<TraceEntry>, BenchError> {
    let file = std::fs::File::open(path).map_err(|e| BenchError::io(path, e))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| BenchError::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let entry = serde_json::from_str(&line).map_err(|source| BenchError::TraceLine {
            path: path.to_path_buf(),
            line: n + 1,
            source,
        })?;
        out.push(entry);
    }
    Ok(out)
}
