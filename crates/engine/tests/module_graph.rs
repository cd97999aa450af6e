//! Tidy: the engine's modules import each other without a cycle (`crate::x` paths in each
//! source file), so each can be read, changed and tested from the bottom up. A cycle once tied
//! `core`, `tiering`, `config`, `snapshot` and `loader` together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module (first path component under `src/`) → the modules its files name as `crate::m`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let module = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            if module == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let deps = graph.entry(module.clone()).or_default();
            for part in text.split("crate::").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d));
    }
    graph
}

#[test]
fn engine_modules_import_each_other_without_a_cycle() {
    let graph = graph();
    assert!(graph.contains_key("scheduler") && graph.contains_key("core"));
    let mut left = graph.clone();
    while !left.is_empty() {
        let ready: Vec<String> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(m, _)| m.clone())
            .collect();
        assert!(!ready.is_empty(), "import cycle among {left:?}");
        for m in ready {
            left.remove(&m);
        }
    }
}

#[test]
fn the_scheduler_never_reaches_the_model_or_the_kv_bytes() {
    let graph = graph();
    let scheduler = &graph["scheduler"];
    for forbidden in ["core", "paged_kv", "actor"] {
        assert!(
            !scheduler.contains(forbidden),
            "scheduler imports {forbidden}"
        );
    }
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scheduler.rs"))
            .unwrap();
    assert!(
        !text.contains("model::"),
        "the scheduler names the model crate"
    );
}
