//! Opens the real default model (memory-mapped) and checks its header and selected rows against
//! values extracted with the python `gguf` package (`tests/data/gguf/model_rows.gguf`).

use gguf::{dequantize_row, GgmlType, GgufFile};

fn open_default() -> GgufFile {
    let path = model::default_model_path();
    assert!(
        path.exists(),
        "default model missing at {} (put SmolLM2-135M-Instruct.Q4_1.gguf in models/ or set AGENTKV_MODEL)",
        path.display()
    );
    GgufFile::open(&path).expect("default model opens")
}

fn rows_file() -> GgufFile {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gguf/model_rows.gguf"
    );
    GgufFile::open(std::path::Path::new(path)).unwrap()
}

fn f32_data(file: &GgufFile, name: &str) -> Vec<f32> {
    let info = file
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(info.ty, GgmlType::F32);
    let mut out = vec![0f32; info.num_elems() as usize];
    dequantize_row(info.ty, file.tensor_data(info), &mut out).unwrap();
    out
}

#[test]
fn header_matches_the_known_model() {
    let f = open_default();
    assert_eq!(f.version(), 3);
    let m = f.metadata();
    assert_eq!(m.architecture(), Some("llama"));
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(m.get_u32("llama.block_count"), Some(30));
    assert_eq!(m.get_u32("llama.embedding_length"), Some(576));
    assert_eq!(m.get_u32("llama.attention.head_count_kv"), Some(3));
    assert_eq!(m.get_f32("llama.rope.freq_base"), Some(100000.0));
    assert_eq!(
        m.get_f32("llama.attention.layer_norm_rms_epsilon"),
        Some(1e-5)
    );
    assert_eq!(m.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
    let tokens = m.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        m.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(
        m.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert!(m
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));

    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (emb.ty, emb.dims.as_slice()),
        (GgmlType::Q8_0, &[576u64, 49152][..])
    );
    assert_eq!((emb.row_len(), emb.num_rows()), (576, 49152));
    assert_eq!(emb.num_bytes, 49152 * 18 * 34);
    let down = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(
        (down.ty, down.dims.as_slice()),
        (GgmlType::Q4_1, &[1536u64, 576][..])
    );

    let count = |ty| f.tensors().iter().filter(|t| t.ty == ty).count();
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::F32), 61);
    assert_eq!(count(GgmlType::Q8_0), 1);
    assert_eq!(
        f.file_bytes().len() as u64,
        std::fs::metadata(model::default_model_path())
            .unwrap()
            .len()
    );
}

#[test]
fn rows_match_python_gguf_dequantization() {
    let f = open_default();
    let rows = rows_file();
    assert_eq!(rows.tensors().len(), 10);
    for t in rows.tensors() {
        let (name, row) = t.name.split_once('#').unwrap();
        let row: usize = row.parse().unwrap();
        let expected = f32_data(&rows, &t.name);
        let info = f.tensor(name).unwrap();
        let row_bytes = info.row_bytes();
        let src = &f.tensor_data(info)[row * row_bytes..(row + 1) * row_bytes];
        let mut got = vec![0f32; info.row_len()];
        dequantize_row(info.ty, src, &mut got).unwrap();
        assert_eq!(got, expected, "{}", t.name);
    }
}

#[test]
fn every_tensor_dequantizes_to_finite_values() {
    let f = open_default();
    let mut total = 0u64;
    for info in f.tensors() {
        let data = f.tensor_data(info);
        assert_eq!(data.len(), info.num_bytes);
        let mut row = vec![0f32; info.row_len()];
        for src in data.chunks_exact(info.row_bytes()) {
            dequantize_row(info.ty, src, &mut row).unwrap();
            assert!(row.iter().all(|v| v.is_finite()), "{}", info.name);
        }
        total += info.num_elems();
    }
    // SmolLM2-135M: ~134.5M parameters (token_embd is tied, counted once).
    assert!((134_000_000..135_000_000).contains(&total), "{total}");
}
