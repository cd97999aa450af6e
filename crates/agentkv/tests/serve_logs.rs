//! Logs of the real `agentkv serve` (issue #13, operability): JSON lines on stderr with
//! `--log-format json`, a start-up summary that names the KV codec as configured (the old banner
//! said "f32" for every codec but f16), and one line per request with tenant, token counts,
//! TTFT, duration and status.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CONFIG: &str = r#"
server: {model_name: logged}
kv_cache_config: {max_size: 16MiB, quantization: int8, replacement_policy: lru}
tenants: [{name: alpha, api_keys: ["ka"]}]
model: {threads: 2}
"#;

fn lines_matching(
    log: &Mutex<Vec<serde_json::Value>>,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|v| pred(v))
        .cloned()
        .collect()
}

#[test]
fn json_logs_have_a_summary_and_one_line_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(CONFIG.as_bytes())
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentkv"))
        .args(["serve", "--port", "0", "--log-format", "json", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let non_json = Arc::new(Mutex::new(Vec::new()));
    let (l, n) = (Arc::clone(&log), Arc::clone(&non_json));
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) => l.lock().unwrap().push(v),
                Err(_) => n.lock().unwrap().push(line),
            }
        }
    });
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("listening on http://")
        .unwrap()
        .to_string();
    let server = common::Server { child, addr };

    let body = r#"{"model":"logged","max_tokens":3,"temperature":0,
        "messages":[{"role":"user","content":"Say hi."}]}"#;
    let (status, _) = common::http(&server.addr, "POST", "/v1/chat/completions", "ka", body);
    assert_eq!(status, 200);
    let (status, _) = common::http(&server.addr, "POST", "/v1/chat/completions", "nope", body);
    assert_eq!(status, 401);

    let deadline = Instant::now() + Duration::from_secs(10);
    let requests = loop {
        let r = lines_matching(&log, |v| v["target"] == "agentkv::request");
        if r.len() >= 2 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let summary = lines_matching(&log, |v| v["message"] == "agentkv serving");
    assert_eq!(summary.len(), 1, "{:?}", log.lock().unwrap());
    let s = &summary[0];
    // The configured codec by its canonical name (int8 = int8 with groups of 64).
    assert_eq!(s["kv_codec"], "int8-g64", "{s}");
    assert_eq!(s["served_name"], "logged", "{s}");
    assert_eq!(s["threads"], 2, "{s}");
    assert_eq!(s["tiers"], "none", "{s}");
    assert!(s["pool_blocks"].as_u64().unwrap() > 0, "{s}");
    assert!(s["policy"].as_str().unwrap().contains("Lru"), "{s}");
    assert_eq!(s["listen"], format!("http://{}", server.addr), "{s}");

    assert_eq!(requests.len(), 2, "{requests:?}");
    let ok = requests.iter().find(|v| v["status"] == 200).unwrap();
    assert_eq!(ok["tenant"], "alpha", "{ok}");
    assert_eq!(ok["path"], "/v1/chat/completions", "{ok}");
    assert!(ok["prompt_tokens"].as_u64().unwrap() > 0, "{ok}");
    assert_eq!(ok["cached_tokens"], 0, "{ok}");
    assert_eq!(ok["generated_tokens"], 3, "{ok}");
    assert_eq!(ok["outcome"], "length", "{ok}");
    assert!(ok["ttft_ms"].as_f64().unwrap() > 0.0, "{ok}");
    assert!(
        ok["duration_ms"].as_f64().unwrap() >= ok["ttft_ms"].as_f64().unwrap(),
        "{ok}"
    );
    let denied = requests.iter().find(|v| v["status"] == 401).unwrap();
    assert_eq!(denied["tenant"], "-", "{denied}");
    // Nothing but JSON on stderr (the warm-up bar only draws on a terminal).
    assert!(
        non_json.lock().unwrap().is_empty(),
        "{:?}",
        non_json.lock().unwrap()
    );
}
