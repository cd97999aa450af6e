//! Tidy: inside every crate of the workspace, the top-level modules import each other without a
//! cycle, so each can be read, changed and tested from the bottom up. An edge is a path that
//! names another top-level module — `crate::m`, or `super::m` / `super::super::m` from inside a
//! file — outside comments and outside test-only modules (tests may use anything above what they
//! test). Cycles once tied the packed matmul's kernels to their dispatcher,
//! `flash_tile` to `flash_tile_wide`, and the server's grammar, structured-output and state
//! modules together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file that counts: comment lines dropped, and every `#[cfg(test)]` module's
/// block (from its `mod … {` line to the brace that closes it).
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.contains("mod ") && next.trim_end().ends_with('{'))
        {
            let mut depth = 0i64;
            for inner in lines.by_ref() {
                depth += inner.matches('{').count() as i64 - inner.matches('}').count() as i64;
                if depth <= 0 {
                    break;
                }
            }
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Modules the crate root declares only for tests (`#[cfg(test)] mod tests;`).
fn test_only_modules(src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for root in ["lib.rs", "main.rs"] {
        let Ok(text) = std::fs::read_to_string(src.join(root)) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            if pair[0] == "#[cfg(test)]" {
                if let Some(name) = pair[1]
                    .strip_prefix("mod ")
                    .and_then(|r| r.strip_suffix(';'))
                {
                    out.insert(name.to_string());
                }
            }
        }
    }
    out
}

/// Names after `prefix` followed by any number of `super::`.
fn named_after(code: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for part in code.split(prefix).skip(1) {
        let mut rest = part;
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

/// Top-level module of `src/` → the top-level modules its files name.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |path: &Path| -> String {
        let rel = path
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let first = rel.split('/').next().unwrap();
        first.trim_end_matches(".rs").to_string()
    };
    let test_only = test_only_modules(src);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f))
        .filter(|m| !test_only.contains(m))
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let module = module_of(file);
        if module == "lib" || module == "main" || test_only.contains(&module) {
            continue;
        }
        let code = code(&std::fs::read_to_string(file).unwrap());
        let deps = graph.entry(module.clone()).or_default();
        let names = named_after(&code, "crate::")
            .into_iter()
            .chain(named_after(&code, "super::"));
        for name in names {
            if name != module && modules.contains(&name) && name != "lib" {
                deps.insert(name);
            }
        }
    }
    graph
}

/// The modules left on cycles (empty when there is none): Kahn's algorithm.
fn on_cycles(graph: &Graph) -> Graph {
    let mut left = graph.clone();
    loop {
        let ready: Vec<String> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(m, _)| m.clone())
            .collect();
        if ready.is_empty() {
            return left;
        }
        for m in ready {
            left.remove(&m);
        }
    }
}

#[test]
fn no_crate_has_an_import_cycle_among_its_modules() {
    let crates = workspace().join("crates");
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let cycles = on_cycles(&graph(&src));
        assert!(
            cycles.is_empty(),
            "{}: import cycle among {cycles:?}",
            src.display()
        );
        checked += 1;
    }
    assert_eq!(checked, 14, "every crate of the workspace is checked");
}

#[test]
fn the_cycle_detector_finds_a_cycle_through_super_paths() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::X;\n").unwrap();
    std::fs::create_dir(src.join("b")).unwrap();
    // `b::inner`'s `super::super` is the crate root.
    std::fs::write(src.join("b/inner.rs"), "use super::super::c::Y;\n").unwrap();
    // A doc comment and a test module name modules without making edges.
    std::fs::write(
        src.join("c.rs"),
        "//! See [`crate::b`].\n#[cfg(test)]\nmod tests {\n    use crate::b::X;\n}\n",
    )
    .unwrap();
    let g = graph(src);
    assert!(on_cycles(&g).is_empty(), "{g:?}");
    std::fs::write(src.join("c.rs"), "use crate::a::Z;\n").unwrap();
    let g = graph(src);
    assert_eq!(
        on_cycles(&g).keys().cloned().collect::<Vec<_>>(),
        ["a", "b", "c"],
        "{g:?}"
    );
}
