//! End to end: the real `agentkv serve` binary on 127.0.0.1:0 with the real default model, driven
//! by the official `openai` Python package (`crates/server/tests/e2e_openai.py`). Fails (never
//! skips) when the interpreter (`$AGENTKV_PYTHON`, `.venv-tests`, else python3) or the package is
//! missing, saying to run `scripts/test.sh`, which makes that venv with pinned packages.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

const CONFIG: &str = r#"
server:
  model_name: agentkv-e2e
  model_aliases: [m]
  admin_api_keys: ["admin"]
kv_cache_config:
  max_size: 160MiB
  replacement_policy: segmented_lru
  warmup_prompts: [system]
  quantization: f16
prompts:
  system: {system: "You are a careful coding agent. Read files before editing them and run the tests."}
tenants:
  - {name: alpha, api_keys: ["ka"]}
  - {name: beta, api_keys: ["kb"]}
limits:
  max_requests: 3
  max_requests_per_tenant: 2
model:
  threads: 2
"#;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn openai_client_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentkv"))
        .args(["serve", "--port", "0", "--config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting agentkv serve");
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let stdout =
        common::run_python_client("e2e_openai.py", &base, "ALL E2E CHECKS PASSED", &["openai"]);
    println!("{stdout}");
    // Graceful shutdown: SIGTERM with nothing running exits cleanly and promptly.
    let mut server = server;
    let status = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(st) = server.0.try_wait().unwrap() {
            assert!(st.success(), "serve exited with {st}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not stop after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
