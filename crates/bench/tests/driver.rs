//! The driver against the in-test server: error accounting, measured timings bounded below by the
//! injected latency, usage and cached-fraction aggregation, compare mode, trace and replay, and
//! the written report.

mod common;

use std::time::Duration;

use bench::client::{http_client, Target};
use bench::corpus::Corpus;
use bench::driver::{run, CallOutcome, DriverConfig, RunOutput, TaskPlan};
use bench::report::{aggregate, write_all};
use bench::workload::{generate, WorkloadConfig, WorkloadKind};
use common::{Fault, ServerConfig};

fn workload_cfg(agents: u32, tasks: u32, steps: u32) -> WorkloadConfig {
    WorkloadConfig {
        kind: WorkloadKind::React,
        num_agents: agents,
        tasks_per_agent: tasks,
        steps_per_task: Some(steps),
        tool_latency_ms: None,
        seed: 3,
        observation_tokens: None,
        output_tokens: None,
        system_tokens: None,
    }
}

fn target(name: &str, url: &str) -> Target {
    Target {
        name: name.into(),
        base_url: url.into(),
        model: "test-model".into(),
        api_key: None,
    }
}

async fn drive(targets: Vec<Target>, wl: &WorkloadConfig) -> RunOutput {
    let w = generate(wl, &Corpus::builtin()).unwrap();
    let plans = w
        .agents
        .into_iter()
        .map(|ts| ts.into_iter().map(TaskPlan::Scripted).collect())
        .collect();
    let cfg = DriverConfig {
        targets,
        temperature: 0.0,
        seed: Some(1),
        request_timeout: Duration::from_secs(30),
        max_duration: None,
        progress: false,
        session_keys: false,
        system_breakpoint: false,
    };
    run(http_client().unwrap(), cfg, plans).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_counted_and_later_calls_skipped() {
    let srv = common::start(ServerConfig {
        fault_at_step: |s| {
            if s == 2 {
                Fault::Status503
            } else {
                Fault::None
            }
        },
        ..Default::default()
    })
    .await;
    let targets = vec![target("a", &srv.url)];
    let wl = workload_cfg(3, 2, 5);
    let out = drive(targets.clone(), &wl).await;
    assert_eq!(out.calls.len(), 6 * 5);
    // Steps 0, 1 succeed, step 2 fails, steps 3, 4 are never sent.
    assert_eq!(srv.received.lock().unwrap().len(), 6 * 3);
    let r = aggregate("agent".into(), Some(wl), &targets, out);
    let t = &r.targets[0];
    assert_eq!((t.calls_ok, t.calls_failed, t.calls_skipped), (12, 6, 12));
    assert_eq!(t.errors.get("http_status_503"), Some(&6));
    assert_eq!((t.tasks_ok, t.tasks_failed), (0, 6));
    assert!(t.task_latency_s.is_none());
    assert_eq!(t.e2e_s.unwrap().count, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_streams_are_classified() {
    let srv = common::start(ServerConfig {
        fault_at_step: |s| match s {
            1 => Fault::Truncate,
            2 => Fault::Garbage,
            _ => Fault::None,
        },
        ..Default::default()
    })
    .await;
    // Task steps 0 ok, 1 truncated. A one-step task never reaches step 1.
    let targets = vec![target("a", &format!("{}/v1/", srv.url))];
    let out = drive(targets.clone(), &workload_cfg(2, 1, 3)).await;
    let r = aggregate("agent".into(), None, &targets, out);
    let t = &r.targets[0];
    assert_eq!(t.errors.get("truncated"), Some(&2), "{:?}", t.errors);
    assert_eq!((t.calls_ok, t.calls_failed, t.calls_skipped), (2, 2, 2));

    let srv2 = common::start(ServerConfig {
        fault_at_step: |s| if s == 1 { Fault::Garbage } else { Fault::None },
        ..Default::default()
    })
    .await;
    let targets2 = vec![target("b", &srv2.url)];
    let out = drive(targets2.clone(), &workload_cfg(1, 1, 2)).await;
    let r = aggregate("agent".into(), None, &targets2, out);
    assert_eq!(r.targets[0].errors.get("bad_chunk"), Some(&1));

    // Nothing listens on this port once the listener is dropped.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let targets3 = vec![target("dead", &url)];
    let out = drive(targets3.clone(), &workload_cfg(1, 1, 2)).await;
    let r = aggregate("agent".into(), None, &targets3, out);
    assert_eq!(r.targets[0].errors.get("connect"), Some(&1));
    assert_eq!(r.targets[0].calls_skipped, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_usage_and_cached_fraction() {
    let srv = common::start(ServerConfig {
        ttft_ms: |s| 10 + 10 * s as u64,
        gap_ms: 5,
        answer_chunks: 3,
        ..Default::default()
    })
    .await;
    let targets = vec![target("a", &srv.url)];
    let out = drive(targets.clone(), &workload_cfg(2, 2, 4)).await;
    for c in &out.calls {
        let CallOutcome::Ok(m) = &c.outcome else {
            panic!("call failed: {:?}", c.outcome)
        };
        let ttft = m.ttft_s.unwrap();
        // Lower bounds only: the server waits at least this long.
        assert!(
            ttft >= (10 + 10 * c.step) as f64 / 1000.0,
            "ttft {ttft} at step {}",
            c.step
        );
        assert!(m.e2e_s >= ttft);
        assert_eq!(m.content_chunks, 3);
        assert_eq!(m.inter_token_s.len(), 2);
        assert!(m.inter_token_s.iter().all(|&g| g >= 0.004), "{m:?}");
        assert_eq!(m.text, format!("s{0}w0 s{0}w1 s{0}w2 ", c.step));
        assert_eq!(m.usage.as_ref().unwrap().completion_tokens, 3);
    }
    // The answer is appended to the next prompt: step s sees the answers of steps < s.
    let received = srv.received.lock().unwrap().clone();
    assert!(received.iter().any(|r| r
        .messages
        .iter()
        .any(|m| m.content.as_deref() == Some("s2w0 s2w1 s2w2 "))));
    let r = aggregate("agent".into(), None, &targets, out);
    let t = &r.targets[0];
    assert_eq!(t.calls_ok, 16);
    assert_eq!(t.generated_tokens, 48);
    assert_eq!(t.cached_fraction, Some(0.5));
    // 4 tasks of 4 calls: each task's first call is uncached, the other three diverged.
    assert_eq!(
        t.cache_misses,
        [("diverged".to_string(), 12), ("uncached".to_string(), 4)].into()
    );
    let table = bench::report::table::render(&r);
    assert!(table.contains("cache misses d / e / u"), "{table}");
    assert!(table.contains("12 / 0 / 4"), "{table}");
    // prompt tokens = 100 × messages; step s has 2 + 2s messages; 4 tasks.
    assert_eq!(t.prompt_tokens, 4 * 100 * (2 + 4 + 6 + 8));
    assert_eq!(t.ttft_s.unwrap().count, 16);
    assert_eq!(t.inter_token_s.unwrap().count, 32);
    assert_eq!(t.task_latency_s.unwrap().count, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_alternates_and_reports_not_reported() {
    let a = common::start(ServerConfig::default()).await;
    let b = common::start(ServerConfig {
        report_cached: false,
        ..Default::default()
    })
    .await;
    let targets = vec![target("with-cache", &a.url), target("no-report", &b.url)];
    let wl = workload_cfg(2, 2, 3);
    let out = drive(targets.clone(), &wl).await;
    assert_eq!(out.trace.len(), 2 * 4 * 3);
    // Per task and step, the first target sent to rotates: (step + task) % 2.
    for agent in 0..2 {
        for task in 0..2u32 {
            for step in 0..3u32 {
                let first = out
                    .trace
                    .iter()
                    .filter(|e| e.agent == agent && e.task == task && e.step == step)
                    .min_by(|x, y| x.t.total_cmp(&y.t))
                    .unwrap();
                assert_eq!(first.target, ((step + task) % 2) as usize);
            }
        }
    }
    // Same script for both: the first call of every task has identical messages.
    let (ra, rb) = (
        a.received.lock().unwrap().clone(),
        b.received.lock().unwrap().clone(),
    );
    assert_eq!(ra.len(), 12);
    assert_eq!(rb.len(), 12);
    let firsts = |v: &[api::ChatCompletionRequest]| {
        let mut f: Vec<String> = v
            .iter()
            .filter(|r| r.messages.len() == 2)
            .map(|r| serde_json::to_string(&r.messages).unwrap())
            .collect();
        f.sort();
        f
    };
    assert_eq!(firsts(&ra), firsts(&rb));
    let r = aggregate("agent".into(), Some(wl), &targets, out);
    assert_eq!(r.targets[0].cached_fraction, Some(0.5));
    assert_eq!(r.targets[1].cached_fraction, None);
    assert_eq!(r.targets[1].calls_with_usage, 12);
    assert!(r.ratios.contains_key("e2e_p95"));
    let table = bench::report::table::render(&r);
    assert!(table.contains("not reported"), "{table}");
    assert!(table.contains("no-report / with-cache"), "{table}");

    let dir = tempfile::tempdir().unwrap();
    let files = write_all(dir.path(), &r).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert_eq!(html.matches("<svg").count(), 5);
    assert!(!html.contains("<script") && !html.contains("src="));
    let back: bench::report::BenchResults =
        serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    assert_eq!(back.calls.len(), r.calls.len());
    assert_eq!(back.targets[1].calls_with_usage, 12);
    assert_eq!(back.targets[0].cached_fraction, Some(0.5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_round_trips_and_replays_exact_requests() {
    let srv = common::start(ServerConfig::default()).await;
    let targets = vec![target("a", &srv.url)];
    let out = drive(targets.clone(), &workload_cfg(2, 2, 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.jsonl");
    bench::trace::write_trace(&path, &out.trace).unwrap();
    let entries = bench::trace::read_trace(&path).unwrap();
    assert_eq!(entries, out.trace);
    let sent: Vec<_> = srv.received.lock().unwrap().drain(..).collect();

    let plans = bench::replay::plans_from_trace(&entries, 0);
    assert_eq!(plans.len(), 2);
    let cfg = DriverConfig {
        targets: vec![target("a", &srv.url)],
        temperature: 0.0,
        seed: None,
        request_timeout: Duration::from_secs(30),
        max_duration: None,
        progress: false,
        session_keys: false,
        system_breakpoint: false,
    };
    let replay = run(http_client().unwrap(), cfg, plans).await;
    assert_eq!(replay.calls.len(), 12);
    let mut again: Vec<String> = srv
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    let mut orig: Vec<String> = sent
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    again.sort();
    orig.sort();
    assert_eq!(again, orig);
}

#[test]
fn percentiles_of_known_latencies() {
    use bench::client::CallMetrics;
    use bench::driver::{CallRecord, TaskRecord};
    // 100 calls with e2e 1..=100 ms and TTFT half of it, one failure, one task.
    let mut calls: Vec<CallRecord> = (1..=100)
        .map(|i| CallRecord {
            target: 0,
            agent: 0,
            task: 0,
            step: i - 1,
            t_start_s: f64::from(i),
            prompt_chars: 10,
            outcome: CallOutcome::Ok(CallMetrics {
                ttft_s: Some(f64::from(i) / 2000.0),
                inter_token_s: vec![0.001; 2],
                e2e_s: f64::from(i) / 1000.0,
                content_chunks: 3,
                usage: None,
                finish_reason: None,
                text: String::new(),
            }),
        })
        .collect();
    calls.push(CallRecord {
        outcome: CallOutcome::Error(bench::client::CallError {
            kind: bench::client::CallErrorKind::Timeout,
            status: None,
            message: "t".into(),
            after_s: 9.0,
        }),
        ..calls[0].clone()
    });
    let out = RunOutput {
        wall_s: 50.0,
        calls,
        tasks: vec![TaskRecord {
            target: 0,
            agent: 0,
            task: 0,
            ok: false,
            cut_by_time_limit: false,
            latency_s: 1.0,
        }],
        trace: Vec::new(),
    };
    let r = aggregate("synthetic".into(), None, &[target("a", "http://x")], out);
    let t = &r.targets[0];
    let e2e = t.e2e_s.unwrap();
    assert_eq!(e2e.count, 100);
    assert!((e2e.p50 - 0.0505).abs() < 1e-12);
    assert!((e2e.p95 - 0.09505).abs() < 1e-12);
    assert!((e2e.p99 - 0.09901).abs() < 1e-12);
    assert!((e2e.mean - 0.0505).abs() < 1e-12);
    assert!((t.ttft_s.unwrap().p95 - 0.047525).abs() < 1e-12);
    assert_eq!(t.errors.get("timeout"), Some(&1));
    assert_eq!((t.calls_ok, t.calls_failed), (100, 1));
    // No usage: tokens counted from content chunks, cached tokens "not reported".
    assert_eq!(t.generated_tokens, 300);
    assert!((t.calls_per_s - 2.0).abs() < 1e-12);
    assert_eq!(t.cached_fraction, None);
    assert_eq!(t.calls_with_usage, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_stops_new_calls_without_counting_failures() {
    let srv = common::start(ServerConfig {
        ttft_ms: |_| 400,
        ..Default::default()
    })
    .await;
    let w = generate(&workload_cfg(1, 2, 3), &Corpus::builtin()).unwrap();
    let plans = w
        .agents
        .into_iter()
        .map(|ts| ts.into_iter().map(TaskPlan::Scripted).collect())
        .collect();
    let targets = vec![target("a", &srv.url)];
    let cfg = DriverConfig {
        targets: targets.clone(),
        temperature: 0.0,
        seed: None,
        request_timeout: Duration::from_secs(30),
        max_duration: Some(Duration::from_millis(200)),
        progress: false,
        session_keys: false,
        system_breakpoint: false,
    };
    let out = run(http_client().unwrap(), cfg, plans).await;
    // The first call starts at once and finishes after the limit; nothing else is sent.
    assert_eq!(srv.received.lock().unwrap().len(), 1);
    let r = aggregate("agent".into(), None, &targets, out);
    let t = &r.targets[0];
    assert_eq!((t.calls_ok, t.calls_failed, t.calls_not_run), (1, 0, 5));
    assert_eq!((t.tasks_ok, t.tasks_failed, t.tasks_cut), (0, 0, 2));
}
