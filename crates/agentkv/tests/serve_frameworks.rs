//! End to end: agent frameworks' tool loops against the real `agentkv serve` binary and default
//! model — a `langchain-openai` `bind_tools` loop and the OpenAI Agents SDK `Runner` over both the
//! Responses API and chat completions (`crates/server/tests/e2e_frameworks.py`). Fails when
//! python3 is missing; the script skips a framework, saying so, only when its package cannot be
//! imported (CI installs both).

mod common;

use std::io::Write;
use std::process::Command;

const CONFIG: &str = r#"
server:
  model_name: agentkv-e2e
kv_cache_config:
  max_size: 64MiB
model:
  threads: 2
"#;

#[test]
fn framework_tool_loops_reach_the_second_call_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let server = common::start(&cfg);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../server/tests/e2e_frameworks.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://{}", server.addr))
        .output()
        .expect("python3 is required (CI installs it with langchain-openai and openai-agents)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "e2e_frameworks.py failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("ALL FRAMEWORK CHECKS PASSED"), "{stdout}");
    println!("{stdout}");
}
