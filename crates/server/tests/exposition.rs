//! `/metrics` is valid Prometheus text exposition (what `promtool check metrics` and a scraper
//! require), checked by a strict parser over the output of a server with a RAM tier, the
//! adaptive eviction policy and traffic that exercises hits, misses and evictions.

mod common;

use std::collections::{BTreeMap, HashSet};

use common::{call, chat};
use engine::{Engine, EngineConfig, EngineCore};
use server::{AppState, ServerSettings};

/// One sample line: metric name, labels, value.
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses `name{a="x",b="y"} value`, with `\\`, `\"` and `\n` escapes in label values.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| format!("no value: {line}"))?;
    let name = &line[..name_end];
    if !is_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest
                .find('=')
                .ok_or_else(|| format!("bad labels: {line}"))?;
            let label = &rest[..eq];
            if !is_name(label) || label.contains(':') {
                return Err(format!("bad label name {label:?} in {line}"));
            }
            let mut chars = rest[eq + 1..].char_indices();
            if chars.next().map(|c| c.1) != Some('"') {
                return Err(format!("unquoted label value in {line}"));
            }
            let mut value = String::new();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next().map(|c| c.1) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => return Err(format!("bad escape {other:?} in {line}")),
                    },
                    '"' => {
                        end = Some(eq + 1 + i + 1);
                        break;
                    }
                    '\n' => return Err(format!("raw newline in {line}")),
                    c => value.push(c),
                }
            }
            let end = end.ok_or_else(|| format!("unterminated label value in {line}"))?;
            labels.push((label.to_string(), value));
            rest = &rest[end..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let value = rest
        .strip_prefix(' ')
        .ok_or_else(|| format!("no space before the value: {line}"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse::<f64>()
            .map_err(|e| format!("bad value {v:?} ({e}) in {line}"))?,
    };
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Checks the whole exposition; returns the number of families.
fn check_exposition(text: &str) -> Result<usize, String> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helps = HashSet::new();
    let mut seen_series = HashSet::new();
    // Histogram family → label set (without `le`) → (le, cumulative count) in order.
    let mut buckets: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<(String, String), f64> = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if !helps.insert(name.to_string()) {
                return Err(format!("HELP twice for {name}"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (name, kind) = (it.next().unwrap_or_default(), it.next().unwrap_or_default());
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(format!("bad type {kind:?} for {name}"));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(format!("TYPE twice for {name}"));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let s = parse_sample(line)?;
        let (family, kind) = types
            .iter()
            .filter(|(f, _)| {
                s.name == **f
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|suffix| s.name == format!("{f}{suffix}"))
            })
            .max_by_key(|(f, _)| f.len())
            .ok_or_else(|| format!("sample before its TYPE: {line}"))?;
        if !helps.contains(family) {
            return Err(format!("no HELP for {family}"));
        }
        let mut label_names: Vec<&str> = s.labels.iter().map(|(n, _)| n.as_str()).collect();
        label_names.sort_unstable();
        if label_names.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("repeated label in {line}"));
        }
        let series = format!("{}{:?}", s.name, s.labels);
        if !seen_series.insert(series) {
            return Err(format!("duplicate series: {line}"));
        }
        match kind.as_str() {
            "counter" => {
                if !family.ends_with("_total") || s.name != *family {
                    return Err(format!("counter {family} must be named *_total: {line}"));
                }
                if s.value < 0.0 || !s.value.is_finite() {
                    return Err(format!("counter below zero or not finite: {line}"));
                }
            }
            "histogram" => {
                let others: String = s
                    .labels
                    .iter()
                    .filter(|(n, _)| n != "le")
                    .map(|(n, v)| format!("{n}={v},"))
                    .collect();
                let key = (family.clone(), others);
                if s.name.ends_with("_bucket") {
                    let le = s
                        .labels
                        .iter()
                        .find(|(n, _)| n == "le")
                        .ok_or_else(|| format!("bucket without le: {line}"))?;
                    let le: f64 = match le.1.as_str() {
                        "+Inf" => f64::INFINITY,
                        v => v.parse().map_err(|_| format!("bad le in {line}"))?,
                    };
                    buckets.entry(key).or_default().push((le, s.value));
                } else if s.name.ends_with("_count") {
                    counts.insert(key, s.value);
                } else if !s.name.ends_with("_sum") {
                    return Err(format!(
                        "histogram sample {} is not _bucket/_sum/_count",
                        s.name
                    ));
                }
            }
            _ => {}
        }
    }
    for (key, bs) in &buckets {
        if bs.windows(2).any(|w| w[1].0 <= w[0].0 || w[1].1 < w[0].1) {
            return Err(format!("{key:?}: buckets not increasing in le and count"));
        }
        let last = bs.last().expect("non-empty");
        if last.0 != f64::INFINITY {
            return Err(format!("{key:?}: no +Inf bucket"));
        }
        if counts.get(key) != Some(&last.1) {
            return Err(format!("{key:?}: _count differs from the +Inf bucket"));
        }
    }
    Ok(types.len())
}

#[test]
fn the_checker_rejects_what_prometheus_rejects() {
    let ok = "# HELP a_total x\n# TYPE a_total counter\na_total{t=\"q\\\"\"} 3\n";
    assert_eq!(check_exposition(ok), Ok(1));
    for bad in [
        "a_total 1\n",                                                  // no TYPE
        "# HELP a x\n# TYPE a counter\na 1\n",                          // counter without _total
        "# HELP a_total x\n# TYPE a_total counter\na_total{t=q} 1\n",   // unquoted
        "# HELP a_total x\n# TYPE a_total counter\na_total 1\na_total 2\n", // duplicate
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
        "# HELP g x\n# TYPE g gauge\ng one\n",
    ] {
        assert!(check_exposition(bad).is_err(), "accepted: {bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_valid_prometheus_exposition() {
    let cfg = EngineConfig {
        num_blocks: 24,
        threads: 2,
        policy: cache::EvictionPolicy::ADAPTIVE_SEGMENTED_LRU,
        tiers: engine::TieringConfig {
            stores: vec![tier::TierConfig::Ram {
                max_size: tier::ByteSize(64 << 20),
                compression: Default::default(),
                codec: None,
            }],
            ..Default::default()
        },
        ..EngineConfig::default()
    };
    let engine = Engine::start(EngineCore::new(common::model(), cfg).expect("engine"));
    let frontend = common::model().frontend().clone();
    let state = AppState::new(engine.handle(), frontend, ServerSettings::default()).unwrap();
    let r = server::router(state);
    // Hits, misses, evictions and a tier: every family has samples.
    let long = "Plan the refactor: list the modules, their callers and the tests that cover them.";
    for i in 0..4 {
        let reply = call(
            &r,
            "POST",
            "/v1/chat/completions",
            None,
            &chat(&format!("{i} {long} {long}"), 3),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &chat(&format!("0 {long} {long}"), 3),
    )
    .await;
    let text = call(&r, "GET", "/metrics", None, "").await.body;
    let families = check_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(families > 40, "{families} families");
    assert!(text.contains("agentkv_tier_hit_tokens_total{tier=\"0\",kind=\"ram\"}"));
    check_vllm_names(&text);
}

/// The value of the one sample of `name` (any labels), parsed by the strict parser.
fn value_of(text: &str, name: &str) -> (Vec<(String, String)>, f64) {
    let mut found = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| parse_sample(l).unwrap())
        .filter(|s| s.name == name);
    let s = found
        .next()
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    assert!(found.next().is_none(), "{name} twice");
    (s.labels, s.value)
}

/// The series routers and the Gateway API Inference Extension scrape under vLLM's and SGLang's
/// names agree with ours and carry `model_name` like vLLM's.
fn check_vllm_names(text: &str) {
    let label = |labels: &[(String, String)], k: &str| {
        labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    for (theirs, ours) in [
        ("vllm:num_requests_waiting", "agentkv_requests_waiting"),
        ("vllm:num_requests_running", "agentkv_requests_running"),
        ("sglang:num_queue_reqs", "agentkv_requests_waiting"),
        ("sglang:num_running_reqs", "agentkv_requests_running"),
        (
            "vllm:prefix_cache_hits_total",
            "agentkv_prefix_cache_hit_tokens_total",
        ),
        ("vllm:prompt_tokens_total", "agentkv_prompt_tokens_total"),
        (
            "vllm:generation_tokens_total",
            "agentkv_generation_tokens_total",
        ),
    ] {
        let (labels, v) = value_of(text, theirs);
        assert_eq!(label(&labels, "model_name"), "agentkv", "{theirs}");
        assert_eq!(v, value_of(text, ours).1, "{theirs} vs {ours}");
    }
    let hits = value_of(text, "vllm:prefix_cache_hits_total").1;
    let queries = value_of(text, "vllm:prefix_cache_queries_total").1;
    assert!(hits > 0.0 && queries > hits, "{hits} / {queries}");
    let misses = value_of(text, "agentkv_prefix_cache_miss_tokens_total").1;
    assert_eq!(queries, hits + misses);
    let usage = value_of(text, "vllm:kv_cache_usage_perc").1;
    assert!((0.0..=1.0).contains(&usage), "{usage}");
    assert_eq!(usage, value_of(text, "vllm:gpu_cache_usage_perc").1);
    assert_eq!(usage, value_of(text, "sglang:token_usage").1);
    let (info, one) = value_of(text, "vllm:cache_config_info");
    assert_eq!(one, 1.0);
    assert_eq!(label(&info, "block_size"), "16");
    assert_eq!(label(&info, "num_gpu_blocks"), "24");
    let rate = value_of(text, "sglang:cache_hit_rate").1;
    assert!((rate - hits / queries).abs() < 1e-9, "{rate}");
}
