//! Tidy: the crate graph stated in ARCHITECTURE.md ("Crate graph" table) is the one the manifests
//! declare (normal `[dependencies]` on workspace crates; dev-dependencies are not part of the
//! design's direction), and it has no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Workspace crates each manifest's `[dependencies]` section names by `path = "../x"`.
fn from_manifests() -> Graph {
    let mut graph = Graph::new();
    let crates = std::fs::read_dir(workspace().join("crates")).unwrap();
    for entry in crates {
        let dir = entry.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut deps = BTreeSet::new();
        let mut in_deps = false;
        for line in manifest.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                in_deps = line == "[dependencies]";
                continue;
            }
            if !in_deps {
                continue;
            }
            if let Some(rest) = line.split("path = \"../").nth(1) {
                deps.insert(rest.split('"').next().unwrap().to_string());
            }
        }
        graph.insert(name, deps);
    }
    graph
}

/// The rows of the "Crate graph" table: `| crate | a, b, c |` (`—` for none).
fn from_architecture() -> Graph {
    let doc = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let table = doc
        .split("## Crate graph")
        .nth(1)
        .expect("ARCHITECTURE.md has a \"## Crate graph\" section");
    let mut graph = Graph::new();
    for line in table.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [krate, deps] = cells[..] else {
            panic!("two cells per row: {line}");
        };
        if krate == "crate" || krate.starts_with('-') {
            continue;
        }
        let deps: BTreeSet<String> = deps
            .split(',')
            .map(|d| d.trim().trim_matches('`').to_string())
            .filter(|d| !d.is_empty() && d != "—")
            .collect();
        graph.insert(krate.trim_matches('`').to_string(), deps);
    }
    graph
}

#[test]
fn architecture_states_the_crate_graph_of_the_manifests() {
    let manifests = from_manifests();
    assert_eq!(manifests.len(), 14, "{manifests:?}");
    assert_eq!(
        from_architecture(),
        manifests,
        "update the \"Crate graph\" table in ARCHITECTURE.md"
    );
}

#[test]
fn the_crate_graph_has_no_cycle() {
    let graph = from_manifests();
    // Kahn's algorithm: every crate is eventually free of unvisited dependencies.
    let mut left = graph.clone();
    while !left.is_empty() {
        let ready: Vec<String> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(k, _)| k.clone())
            .collect();
        assert!(!ready.is_empty(), "cycle among {:?}", left.keys());
        for k in ready {
            left.remove(&k);
        }
    }
}
