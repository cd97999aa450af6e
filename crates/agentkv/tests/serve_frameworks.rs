//! End to end: agent frameworks' tool loops against the real `agentkv serve` binary and default
//! model — a `langchain-openai` `bind_tools` loop and the OpenAI Agents SDK `Runner` over both the
//! Responses API and chat completions (`crates/server/tests/e2e_frameworks.py`), and six-call
//! loops in those two and smolagents (`crates/server/tests/e2e_six_calls.py`), and issue #45's
//! matrix of nested pydantic schemas and parallel calls (`e2e_frameworks_nested.py`: the Agents
//! SDK, pydantic-ai, LangGraph, smolagents). Fails, saying to
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

/// Runs `script` (in `crates/server/tests/`) against a fresh server; it must print `marker`.
fn run(script: &str, marker: &str, modules: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let server = common::start(&cfg);
    let stdout =
        common::run_python_client(script, &format!("http://{}", server.addr), marker, modules);
    println!("{stdout}");
}

#[test]
fn framework_tool_loops_reach_the_second_call_from_the_cache() {
    run(
        "e2e_frameworks.py",
        "ALL FRAMEWORK CHECKS PASSED",
        &["openai", "langchain_openai", "agents"],
    );
}

#[test]
fn six_call_tool_loops_run_from_the_cache() {
    run(
        "e2e_six_calls.py",
        "ALL SIX-CALL CHECKS PASSED",
        &["openai", "langchain_openai", "agents", "smolagents"],
    );
}

/// Issue #45's framework matrix: nested pydantic tools and outputs (Agents SDK on Responses and
/// chat, pydantic-ai), LangGraph with parallel calls allowed, smolagents to a final answer.
#[test]
fn frameworks_with_nested_schemas_and_parallel_calls() {
    run(
        "e2e_frameworks_nested.py",
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
}

/// instructor's `Iterable[...]` of a nested model (issue #45), from its own venv
/// (`$AGENTKV_INSTRUCTOR_PYTHON`, set by `scripts/test.sh`, else `.venv-instructor`).
#[test]
fn instructor_iterable_of_a_nested_model() {
    let py = std::env::var("AGENTKV_INSTRUCTOR_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| {
            format!(
                "{}/../../.venv-instructor/bin/python",
                env!("CARGO_MANIFEST_DIR")
            )
        });
    assert!(
        std::path::Path::new(&py).exists(),
        "no instructor interpreter at {py}: run scripts/test.sh (it makes .venv-instructor)"
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let server = common::start(&cfg);
    let script = format!(
        "{}/../server/tests/e2e_instructor.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = std::process::Command::new(&py)
        .arg(&script)
        .arg(format!("http://{}", server.addr))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ALL INSTRUCTOR CHECKS PASSED"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
}
