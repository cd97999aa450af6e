//! End to end: agent frameworks' tool loops against the real `agentkv serve` binary and default
//! model — a `langchain-openai` `bind_tools` loop and the OpenAI Agents SDK `Runner` over both the
//! Responses API and chat completions (`crates/server/tests/e2e_frameworks.py`), and six-call
//! loops in those two and smolagents (`crates/server/tests/e2e_six_calls.py`). Fails, saying to
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

/// Six-call tool loops (LangChain, the Agents SDK, smolagents' `ToolCallingAgent`) on the default
/// model: six valid calls each carrying the earlier results, each prompt from the cache; whether
/// the 135M model then ends the loop by itself is printed, not asserted
/// (`crates/server/tests/e2e_six_calls.py`).
#[test]
fn six_call_tool_loops_run_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let server = common::start(&cfg);
    let stdout = common::run_python_client(
        "e2e_six_calls.py",
        &format!("http://{}", server.addr),
        "ALL SIX-CALL CHECKS PASSED",
        &["openai", "langchain_openai", "agents", "smolagents"],
    );
    println!("{stdout}");
}

/// Issue #45's framework matrix: nested pydantic tools and outputs (Agents SDK on Responses and
/// chat, pydantic-ai), LangGraph with parallel calls allowed, smolagents to a final answer.
#[test]
fn frameworks_with_nested_schemas_and_parallel_calls() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let server = common::start(&cfg);
    let stdout = common::run_python_client(
        "e2e_frameworks_nested.py",
        &format!("http://{}", server.addr),
        "ALL NESTED FRAMEWORK CHECKS PASSED",
        &[
            "openai",
            "agents",
            "pydantic_ai",
            "langchain_openai",
            "langgraph",
            "smolagents",
        ],
    );
    println!("{stdout}");
}
