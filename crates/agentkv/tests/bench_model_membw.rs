//! `agentkv bench-model --membw` on the default model: the report carries both bandwidth bounds
//! of a batch-1 decode — the streaming read of a large buffer (memory) and the same read of a
//! buffer the size of one decoded token's traffic (its working set, which a large last-level
//! cache may hold) — each consistent with the bytes a token reads, and what an empty call of the
//! thread pool costs. Speed itself is a benchmark, never asserted here.

use std::process::Command;

#[test]
fn membw_reports_the_memory_and_the_working_set_bounds() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentkv"))
        .args([
            "bench-model",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "4",
            "--reps",
            "1",
            "--threads",
            "2",
            "--membw",
            "--membw-mib",
            "8",
        ])
        .output()
        .expect("running agentkv bench-model");
    assert!(
        out.status.success(),
        "bench-model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 report");
    let report: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let m = &report["membw"];
    let num = |k: &str| {
        m[k].as_f64()
            .unwrap_or_else(|| panic!("membw.{k} missing: {m}"))
    };
    let mib = (1u64 << 20) as f64;
    let token_bytes = num("bytes_per_decoded_token");
    // 96.6 MB of weights and the K/V of the mean position (depth 0 + 4/2 = 2: three positions).
    assert_eq!(
        token_bytes,
        num("weight_bytes") + 3.0 * num("kv_bytes_per_position")
    );
    assert!(num("weight_bytes") > 90e6, "{m}");
    assert_eq!(num("buffer_bytes"), 8.0 * mib);
    // The working set is the token's traffic in whole MiB tasks.
    assert_eq!(
        num("working_set_buffer_bytes"),
        (token_bytes / mib).ceil() * mib
    );
    let decode = report["decode_tok_s"].as_f64().expect("decode_tok_s");
    for (read, bound, share) in [
        (
            "read_gb_s_best",
            "decode_bound_tok_s",
            "decode_share_of_bound",
        ),
        (
            "working_set_read_gb_s_best",
            "decode_working_set_bound_tok_s",
            "decode_share_of_working_set_bound",
        ),
    ] {
        let want = num(read) * 1e9 / token_bytes;
        assert!(want > 0.0 && want.is_finite(), "{read}: {m}");
        assert!((num(bound) - want).abs() <= 1e-9 * want, "{bound}: {m}");
        assert!((num(share) - decode / want).abs() <= 1e-9, "{share}: {m}");
    }
    assert!(num("working_set_read_gb_s_median") <= num("working_set_read_gb_s_best"));
    // The threads' hand-off: three rounds, their median reported beside them.
    let rounds: Vec<f64> = m["pool_call_ns_rounds"]
        .as_array()
        .unwrap_or_else(|| panic!("membw.pool_call_ns_rounds missing: {m}"))
        .iter()
        .map(|v| v.as_f64().expect("ns"))
        .collect();
    assert_eq!(rounds.len(), 3, "{m}");
    assert!(rounds.iter().all(|&n| n > 0.0 && n.is_finite()), "{m}");
    let mut sorted = rounds.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(num("pool_call_ns_median"), sorted[1]);
}
