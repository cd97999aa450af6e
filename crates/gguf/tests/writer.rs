//! Writer round trips: every metadata value type and several tensor types survive
//! write → read (from bytes and memory-mapped from a file) unchanged.

use gguf::{dequantize_row, quantize_row, GgmlType, GgufFile, GgufWriter, MetaValue};

fn every_type_metadata() -> Vec<(&'static str, MetaValue)> {
    use MetaValue::*;
    vec![
        ("general.architecture", String("llama".into())),
        ("t.u8", U8(255)),
        ("t.i8", I8(-128)),
        ("t.u16", U16(65535)),
        ("t.i16", I16(-32768)),
        ("t.u32", U32(u32::MAX)),
        ("t.i32", I32(i32::MIN)),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f32", F32(-0.125)),
        ("t.f64", F64(1e300)),
        ("t.bool", Bool(true)),
        ("t.false", Bool(false)),
        ("t.str", String("ünïcode ✓".into())),
        ("t.empty_str", String(std::string::String::new())),
        (
            "t.arr_str",
            Array(vec![String("a".into()), String("bc".into())]),
        ),
        ("t.arr_f32", Array(vec![F32(1.0), F32(-2.5)])),
        ("t.arr_i64", Array(vec![I64(-1), I64(1 << 40)])),
        ("t.arr_bool", Array(vec![Bool(true), Bool(false)])),
        ("t.arr_empty", Array(vec![])),
        (
            "t.arr_nested",
            Array(vec![Array(vec![U16(1), U16(2)]), Array(vec![U16(3)])]),
        ),
    ]
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * scale)
        .collect()
}

/// (name, dims, type, f32 data) of one test tensor.
type Spec = (&'static str, Vec<u64>, GgmlType, Vec<f32>);

fn build() -> (GgufWriter, Vec<Spec>) {
    let tensors = vec![
        ("norm", vec![64], GgmlType::F32, ramp(64, 0.01)),
        ("a.f16", vec![32, 3], GgmlType::F16, ramp(96, 0.02)),
        ("a.bf16", vec![32, 2], GgmlType::BF16, ramp(64, 0.03)),
        ("a.q4_0", vec![64, 3], GgmlType::Q4_0, ramp(192, 0.04)),
        ("a.q4_1", vec![32, 5], GgmlType::Q4_1, ramp(160, 0.05)),
        ("a.q5_0", vec![32, 1, 2], GgmlType::Q5_0, ramp(64, 0.06)),
        ("a.q5_1", vec![32], GgmlType::Q5_1, ramp(32, 0.07)),
        ("a.q8_0", vec![96, 2], GgmlType::Q8_0, ramp(192, 0.08)),
        ("a.q4_k", vec![256, 2], GgmlType::Q4K, ramp(512, 0.09)),
        ("a.q5_k", vec![256], GgmlType::Q5K, ramp(256, 0.1)),
        (
            "a.q6_k",
            vec![512, 1, 1, 2],
            GgmlType::Q6K,
            ramp(1024, 0.11),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in every_type_metadata() {
        w = w.metadata(k, v);
    }
    for (name, dims, ty, data) in &tensors {
        w = w.tensor_f32(*name, dims, data, *ty);
    }
    (w, tensors)
}

fn check(file: &GgufFile, tensors: &[Spec]) {
    assert_eq!(file.version(), 3);
    let got: Vec<(&str, &MetaValue)> = file.metadata().iter().collect();
    let want = every_type_metadata();
    assert_eq!(got.len(), want.len());
    for ((gk, gv), (wk, wv)) in got.iter().zip(&want) {
        assert_eq!((*gk, *gv), (*wk, wv));
    }
    assert_eq!(file.tensors().len(), tensors.len());
    for (info, (name, dims, ty, data)) in file.tensors().iter().zip(tensors) {
        assert_eq!(
            (info.name.as_str(), &info.dims, info.ty),
            (*name, dims, *ty)
        );
        assert_eq!(info.offset % file.alignment(), 0);
        assert_eq!((file.data_offset() as u64) % file.alignment(), 0);
        // The stored bytes are exactly what the quantizer produces, row by row.
        let mut expected = Vec::new();
        for row in data.chunks(dims[0] as usize) {
            quantize_row(*ty, row, &mut expected).unwrap();
        }
        assert_eq!(file.tensor_data(info), expected.as_slice(), "{name}");
        let mut back = vec![0f32; data.len()];
        dequantize_row(*ty, file.tensor_data(info), &mut back).unwrap();
        let amax = data.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (x, y) in data.iter().zip(&back) {
            assert!((x - y).abs() <= 0.13 * amax, "{name}: {x} vs {y}");
        }
    }
}

#[test]
fn round_trip_from_bytes() {
    let (w, tensors) = build();
    let bytes = w.to_bytes().unwrap();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    check(&file, &tensors);
    assert_eq!(file.file_bytes(), bytes.as_slice());
    assert_eq!(file.metadata().architecture(), Some("llama"));
    assert_eq!(file.metadata().get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(file.metadata().get_u32("t.u64"), None);
}

#[test]
fn round_trip_through_a_memory_mapped_file() {
    let (w, tensors) = build();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    w.write_to(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    check(&file, &tensors);
    assert_eq!(file.file_bytes(), std::fs::read(&path).unwrap().as_slice());
}

#[test]
fn custom_alignment_and_version_2() {
    let w = GgufWriter::new()
        .version(2)
        .metadata("general.alignment", MetaValue::U32(64))
        .tensor_f32("x", &[32], &ramp(32, 1.0), GgmlType::Q8_0)
        .tensor_f32("y", &[8], &ramp(8, 1.0), GgmlType::F32);
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!((file.version(), file.alignment()), (2, 64));
    assert_eq!(file.data_offset() % 64, 0);
    assert_eq!(file.tensor("y").unwrap().offset, 64);
}

#[test]
fn writer_reports_bad_input() {
    let bad = [
        GgufWriter::new().tensor_f32("x", &[33], &[0.0; 33], GgmlType::Q8_0),
        GgufWriter::new().tensor_f32("x", &[32], &[0.0; 31], GgmlType::F32),
        GgufWriter::new()
            .tensor_f32("x", &[1], &[0.0], GgmlType::F32)
            .tensor_f32("x", &[1], &[0.0], GgmlType::F32),
        GgufWriter::new()
            .metadata("k", MetaValue::U8(1))
            .metadata("k", MetaValue::U8(2)),
        GgufWriter::new().metadata(
            "k",
            MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)]),
        ),
        GgufWriter::new().metadata("general.alignment", MetaValue::U32(24)),
        GgufWriter::new().version(1),
        GgufWriter::new().tensor_raw("x", &[32], GgmlType::Q4_0, vec![0; 17]),
    ];
    for (i, w) in bad.iter().enumerate() {
        let err = w.to_bytes().expect_err(&format!("case {i} should fail"));
        assert!(!err.to_string().is_empty());
    }
}
