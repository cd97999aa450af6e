//! `agentkv info` names each file's RoPE setting (issue #15: `info` knows every supported
//! architecture): YaRN, Phi 3 128K's longrope factors and Gemma 3's global-only linear scaling,
//! on the tiny llama.cpp-written fixtures of the model crate's `reference_archs` test.

use std::path::PathBuf;
use std::process::Command;

fn rope_line(fixture: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data/arch")
        .join(format!("{fixture}.gguf"));
    let out = Command::new(env!("CARGO_BIN_EXE_agentkv"))
        .args(["info", "--model"])
        .arg(&path)
        .output()
        .expect("running agentkv info");
    assert!(
        out.status.success(),
        "info failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .find(|l| l.starts_with("rope "))
        .unwrap_or_else(|| panic!("{fixture}: no rope line"))
        .to_string()
}

#[test]
fn info_names_the_rope_scaling_of_each_file() {
    let yarn = rope_line("qwen2-yarn");
    assert!(yarn.contains("YaRN ×4"), "{yarn}");
    let longrope = rope_line("phi3-longrope");
    assert!(
        longrope.contains("long per-dimension factors (context 1024 > original 256)")
            && longrope.contains("magnitude 1.1180"),
        "{longrope}"
    );
    let gemma = rope_line("gemma3-linear");
    assert!(gemma.contains("linear ×8 on the global layers"), "{gemma}");
    let plain = rope_line("qwen2");
    assert!(plain.ends_with("Neox"), "nothing scaled: {plain}");
}
