//! End to end: agent frameworks' tool loops against the real `agentkv serve` binary and default
//! model — a `langchain-openai` `bind_tools` loop and the OpenAI Agents SDK `Runner` over both the
//! Responses API and chat completions (`crates/server/tests/e2e_frameworks.py`). Fails, saying to
//! run `scripts/test.sh` (which makes `.venv-tests` with the pinned packages), when the
//! interpreter (`$AGENTKV_PYTHON`, `.venv-tests`, else python3) cannot import them.

mod common;

use std::io::Write;

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
    let stdout = common::run_python_client(
        "e2e_frameworks.py",
        &format!("http://{}", server.addr),
        "ALL FRAMEWORK CHECKS PASSED",
        &["openai", "langchain_openai", "agents"],
    );
    println!("{stdout}");
}
