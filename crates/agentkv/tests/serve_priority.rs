//! End to end: request priorities preempt through the real `agentkv serve` binary and the
//! official `openai` Python package (`crates/server/tests/e2e_priority.py`): with one running
//! request at a time, a more important request preempts a decoding stream, which then resumes
//! with the same text as alone. Fails (never skips) when the Python client is missing, saying to
//! run `scripts/test.sh`.

mod common;

use std::io::Write;

const CONFIG: &str = r#"
server:
  model_name: agentkv-priority
  model_aliases: [m]
limits:
  max_running_requests: 1
model:
  threads: 2
"#;

#[test]
fn a_more_important_request_preempts_a_decoding_stream_through_the_openai_client() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let server = common::start(&cfg);
    let stdout = common::run_python_client(
        "e2e_priority.py",
        &format!("http://{}", server.addr),
        "ALL PRIORITY CHECKS PASSED",
        &["openai"],
    );
    println!("{stdout}");
}
