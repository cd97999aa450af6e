//! The plain-text results table: one row per metric, one column per target, plus a ratio column
//! (target 2 / target 1) when two targets ran. Latencies in milliseconds.

use super::results::{BenchResults, TargetSummary};
use crate::stats::Summary;

/// One table row: label, per-target cells, ratio key.
type Row = (String, Vec<String>, Option<String>);

/// A rendered row: label, per-target cells, ratio (target 2 / target 1).
pub type TableRow = (String, Vec<String>, Option<f64>);

fn ms(x: f64) -> String {
    format!("{:.1}", x * 1000.0)
}

fn summary_rows(
    label: &str,
    key: &str,
    get: fn(&TargetSummary) -> Option<Summary>,
    t: &[TargetSummary],
) -> Vec<Row> {
    let cell = |f: fn(&Summary) -> f64| -> Vec<String> {
        t.iter()
            .map(|s| get(s).map_or_else(|| "-".to_string(), |x| ms(f(&x))))
            .collect()
    };
    vec![
        (
            format!("{label} mean (ms)"),
            cell(|s| s.mean),
            Some(format!("{key}_mean")),
        ),
        (
            format!("{label} p50 (ms)"),
            cell(|s| s.p50),
            Some(format!("{key}_p50")),
        ),
        (
            format!("{label} p95 (ms)"),
            cell(|s| s.p95),
            Some(format!("{key}_p95")),
        ),
        (
            format!("{label} p99 (ms)"),
            cell(|s| s.p99),
            Some(format!("{key}_p99")),
        ),
    ]
}

/// Rows of the table (shared with the HTML report).
pub fn rows(r: &BenchResults) -> (Vec<String>, Vec<TableRow>) {
    let t = &r.targets;
    let header = t.iter().map(|s| s.target.name.clone()).collect();
    let each = |f: &dyn Fn(&TargetSummary) -> String| t.iter().map(f).collect::<Vec<_>>();
    let mut rows: Vec<Row> = vec![
        ("calls ok".into(), each(&|s| s.calls_ok.to_string()), None),
        (
            "calls failed".into(),
            each(&|s| s.calls_failed.to_string()),
            None,
        ),
        (
            "calls skipped".into(),
            each(&|s| s.calls_skipped.to_string()),
            None,
        ),
        (
            "calls not run (time limit)".into(),
            each(&|s| s.calls_not_run.to_string()),
            None,
        ),
        (
            "tasks ok / failed / cut".into(),
            each(&|s| format!("{} / {} / {}", s.tasks_ok, s.tasks_failed, s.tasks_cut)),
            None,
        ),
    ];
    rows.extend(summary_rows("TTFT", "ttft", |s| s.ttft_s, t));
    rows.extend(summary_rows(
        "inter-token",
        "inter_token",
        |s| s.inter_token_s,
        t,
    ));
    rows.extend(summary_rows("call latency", "e2e", |s| s.e2e_s, t));
    rows.extend(summary_rows(
        "task latency",
        "task_latency",
        |s| s.task_latency_s,
        t,
    ));
    rows.extend([
        (
            "calls/s".into(),
            each(&|s| format!("{:.2}", s.calls_per_s)),
            Some("calls_per_s".into()),
        ),
        (
            "generated tok/s".into(),
            each(&|s| format!("{:.1}", s.generated_tokens_per_s)),
            Some("generated_tokens_per_s".into()),
        ),
        (
            "prompt tokens".into(),
            each(&|s| s.prompt_tokens.to_string()),
            None,
        ),
        (
            "cached fraction".into(),
            each(&|s| match s.cached_fraction {
                Some(f) => format!("{:.1}%", f * 100.0),
                None => "not reported".into(),
            }),
            None,
        ),
        (
            // agentkv's per-call miss reasons: diverged / evicted / uncached.
            "cache misses d / e / u".into(),
            each(&|s| {
                if s.cache_misses.is_empty() {
                    "—".into()
                } else {
                    let n = |r: &str| s.cache_misses.get(r).copied().unwrap_or(0);
                    format!("{} / {} / {}", n("diverged"), n("evicted"), n("uncached"))
                }
            }),
            None,
        ),
    ]);
    let rows = rows
        .into_iter()
        .map(|(label, cells, key)| {
            let ratio = key.and_then(|k| r.ratios.get(&k).copied());
            (label, cells, ratio)
        })
        .collect();
    (header, rows)
}

/// The table as aligned text, followed by the error breakdown.
pub fn render(r: &BenchResults) -> String {
    let (header, rows) = rows(r);
    let two = r.targets.len() == 2;
    let mut lines: Vec<Vec<String>> = Vec::new();
    let mut head = vec!["metric".to_string()];
    head.extend(header.iter().cloned());
    if two {
        head.push(format!("{} / {}", header[1], header[0]));
    }
    lines.push(head);
    for (label, cells, ratio) in rows {
        let mut line = vec![label];
        line.extend(cells);
        if two {
            line.push(ratio.map_or_else(String::new, |x| format!("{x:.2}×")));
        }
        lines.push(line);
    }
    let ncol = lines[0].len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let cells: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(c, s)| {
                let pad = widths[c] - s.chars().count();
                if c == 0 {
                    format!("{s}{}", " ".repeat(pad))
                } else {
                    format!("{}{s}", " ".repeat(pad))
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (ncol - 1)));
            out.push('\n');
        }
    }
    for s in &r.targets {
        for (kind, n) in &s.errors {
            out.push_str(&format!("errors[{}] {kind}: {n}\n", s.target.name));
        }
    }
    out
}
