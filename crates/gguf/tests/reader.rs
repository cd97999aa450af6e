//! Reader behaviour on foreign, malformed and hostile files: a file written by the python
//! `gguf` package, one test per rejection rule, and fuzzing (every truncation, every header bit
//! flip, random corruptions) asserting `from_bytes` returns `Ok` or `Err` and never panics.

use gguf::{dequantize_row, GgmlType, GgufError, GgufFile, GgufWriter, MetaValue};
use proptest::prelude::*;

fn python_file() -> GgufFile {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gguf/quant_vectors.gguf"
    );
    GgufFile::open(std::path::Path::new(path)).unwrap()
}

#[test]
fn reads_every_value_type_written_by_python() {
    let f = python_file();
    let m = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(m.architecture(), Some("test"));
    let g = |k: &str| m.get(k).unwrap_or_else(|| panic!("{k}")).clone();
    assert_eq!(g("t.u8"), MetaValue::U8(200));
    assert_eq!(g("t.i8"), MetaValue::I8(-100));
    assert_eq!(g("t.u16"), MetaValue::U16(60000));
    assert_eq!(g("t.i16"), MetaValue::I16(-30000));
    assert_eq!(g("t.u32"), MetaValue::U32(4_000_000_000));
    assert_eq!(g("t.i32"), MetaValue::I32(-2_000_000_000));
    assert_eq!(g("t.u64"), MetaValue::U64((1 << 63) + 5));
    assert_eq!(g("t.i64"), MetaValue::I64(-(1 << 62)));
    assert_eq!(g("t.f32"), MetaValue::F32(1.5));
    assert_eq!(g("t.f64"), MetaValue::F64(-2.25));
    assert_eq!(g("t.bool"), MetaValue::Bool(true));
    assert_eq!(m.get_str("t.str"), Some("héllo ✓"));
    assert_eq!(m.get_str_array("t.arr_str"), Some(vec!["a", "", "ccc"]));
    assert_eq!(m.get_i32_array("t.arr_i32"), Some(vec![1, -2, 3]));
    assert_eq!(m.get_f32_array("t.arr_f32"), Some(vec![0.5, -1.0]));
    let nested = g("t.arr_nested");
    let outer = nested.as_array().unwrap();
    assert_eq!(outer.len(), 2);
    assert_eq!(outer[0].as_array().unwrap().len(), 2);
    assert_eq!(m.get_u32("t.i8"), None);
    assert_eq!(m.get_u64("t.u16"), Some(60000));
    let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
    assert_eq!(&keys[..3], ["general.architecture", "t.u8", "t.i8"]);
    assert_eq!(f.tensors().len(), 8 * 3 + 3 * 2);
    assert_eq!(f.tensor("Q6_K.quant").unwrap().ty, GgmlType::Q6K);
    assert!(f.tensor("nope").is_none());
}

/// Hand-assembles GGUF bytes.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, tensors: u64, kvs: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(tensors).u64(kvs);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s);
        self
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        dims.iter().for_each(|&d| {
            self.u64(d);
        });
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, total: usize) -> Vec<u8> {
        let mut v = self.0.clone();
        v.resize(total.max(v.len()), 0);
        v
    }
}

fn err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("malformed file accepted"),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

#[test]
fn rejects_bad_magic_and_versions() {
    let mut v = Raw::header(3, 0, 0).0;
    v[0] = b'X';
    assert!(matches!(err(v), GgufError::BadMagic { found } if &found == b"XGUF"));
    assert!(matches!(
        err(Raw::header(1, 0, 0).0),
        GgufError::UnsupportedVersion(1)
    ));
    assert!(matches!(
        err(Raw::header(4, 0, 0).0),
        GgufError::UnsupportedVersion(4)
    ));
    assert!(matches!(
        err(b"GG".to_vec()),
        GgufError::Truncated { what: "magic", .. }
    ));
    assert!(GgufFile::from_bytes(Raw::header(2, 0, 0).0).is_ok());
}

#[test]
fn rejects_absurd_counts_before_allocating() {
    let e = err(Raw::header(3, u64::MAX, 0).pad(64));
    assert!(
        matches!(
            e,
            GgufError::AbsurdCount {
                what: "tensor count",
                ..
            }
        ),
        "{e}"
    );
    let e = err(Raw::header(3, 0, 1 << 40).pad(64));
    assert!(matches!(e, GgufError::AbsurdCount { .. }), "{e}");
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX - 3);
    assert!(matches!(err(r.pad(64)), GgufError::AbsurdCount { .. }));
    // An array claiming 2^60 u32 elements.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9).u32(4).u64(1 << 60);
    assert!(matches!(
        err(r.pad(64)),
        GgufError::AbsurdCount {
            what: "array length",
            ..
        }
    ));
}

#[test]
fn rejects_bad_values() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(13).u32(0);
    assert!(matches!(
        err(r.pad(64)),
        GgufError::UnknownValueType { type_id: 13, .. }
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(8).str(&[0xC3, 0x28]);
    assert!(matches!(err(r.pad(64)), GgufError::InvalidUtf8 { .. }));
    let mut r = Raw::header(3, 0, 2);
    r.str(b"k").u32(0).0.push(1);
    r.str(b"k").u32(0).0.push(2);
    assert!(matches!(err(r.pad(64)), GgufError::DuplicateKey(k) if k == "k"));
    // Arrays nested 100 deep.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9);
    for _ in 0..100 {
        r.u32(9).u64(1);
    }
    assert!(matches!(err(r.pad(4096)), GgufError::NestingTooDeep { .. }));
    for bad in [
        MetaValue::U32(0),
        MetaValue::U32(24),
        MetaValue::String("32".into()),
    ] {
        let mut r = Raw::header(3, 0, 1);
        r.str(b"general.alignment").u32(bad.type_id());
        match bad {
            MetaValue::U32(a) => r.u32(a),
            _ => r.str(b"32"),
        };
        assert!(
            matches!(err(r.pad(64)), GgufError::BadAlignment(_)),
            "{bad:?}"
        );
    }
}

#[test]
fn rejects_bad_tensor_descriptors() {
    let one = |name: &str, dims: &[u64], ty: u32, offset: u64, file_len: usize| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor(name, dims, ty, offset);
        err(r.pad(file_len))
    };
    assert!(matches!(
        one("t", &[1, 1, 1, 1, 1], 0, 0, 256),
        GgufError::BadDims { .. }
    ));
    assert!(matches!(
        one("t", &[1 << 40, 1 << 40], 0, 0, 256),
        GgufError::BadDims { .. }
    ));
    assert!(matches!(
        one("t", &[33], 8, 0, 256),
        GgufError::BadDims { .. }
    ));
    assert!(matches!(
        one("t", &[32], 4, 0, 256),
        GgufError::UnsupportedTensorType { type_id: 4, .. }
    ));
    assert!(matches!(
        one("t", &[8], 0, 16, 256),
        GgufError::Misaligned { offset: 16, .. }
    ));
    // Header is 4+4+8+8 + (8+1+4+8+4+8) = 57 bytes → data at 64; 64 F32 need 256 bytes.
    assert!(matches!(
        one("t", &[64], 0, 0, 64 + 255),
        GgufError::TensorOutOfBounds { .. }
    ));
    assert!(matches!(
        one("t", &[8], 0, u64::MAX - 31, 4096),
        GgufError::TensorOutOfBounds { .. }
    ));
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[64], 0, 0);
    assert!(GgufFile::from_bytes(r.pad(64 + 256)).is_ok());
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], 0, 0).tensor("t", &[8], 0, 32);
    assert!(matches!(err(r.pad(256)), GgufError::DuplicateTensor(t) if t == "t"));
    let e = err(Raw::header(3, 1, 0).pad(32));
    assert!(
        matches!(
            e,
            GgufError::AbsurdCount {
                what: "tensor count",
                ..
            }
        ),
        "{e}"
    );
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, 0);
    let cut = r.0.len() - 4;
    let e = err(r.0[..cut].to_vec());
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                what: "tensor offset",
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        one("t", &[8, 0], 0, 0, 256),
        GgufError::BadDims { .. }
    ));
}

/// A small valid file with strings, arrays and a few tensor types.
fn sample() -> Vec<u8> {
    let vals: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
    GgufWriter::new()
        .metadata("general.architecture", MetaValue::String("llama".into()))
        .metadata("a.n", MetaValue::U32(7))
        .metadata(
            "a.toks",
            MetaValue::Array(vec![
                MetaValue::String("x".into()),
                MetaValue::String("yz".into()),
            ]),
        )
        .metadata(
            "a.nest",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I8(1)])]),
        )
        .tensor_f32("w.q8", &[32, 2], &vals[..64], GgmlType::Q8_0)
        .tensor_f32("w.q4k", &[256], &vals, GgmlType::Q4K)
        .tensor_f32("w.f32", &[4], &vals[..4], GgmlType::F32)
        .to_bytes()
        .unwrap()
}

/// Parses and, when accepted, touches every tensor's data, which must be in bounds.
fn exercise(bytes: Vec<u8>) -> bool {
    match GgufFile::from_bytes(bytes) {
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
        Ok(f) => {
            for t in f.tensors() {
                let data = f.tensor_data(t);
                assert_eq!(data.len(), t.num_bytes);
                let mut row = vec![0f32; t.row_len()];
                for src in data.chunks_exact(t.row_bytes()).take(4) {
                    dequantize_row(t.ty, src, &mut row).unwrap();
                }
            }
            true
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset as usize + t.num_bytes)
        .max()
        .unwrap();
    for len in 0..data_end {
        assert!(
            !exercise(bytes[..len].to_vec()),
            "prefix of {len} bytes accepted"
        );
    }
    assert!(exercise(bytes[..data_end].to_vec()));
}

#[test]
fn every_header_bit_flip_is_handled() {
    let bytes = sample();
    let header_len = GgufFile::from_bytes(bytes.clone()).unwrap().data_offset();
    let mut accepted = 0;
    for bit in 0..header_len * 8 {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        accepted += exercise(b) as usize;
    }
    // Some flips (inside string bytes, values, padding) leave a valid file; most must not.
    assert!(accepted > 0 && accepted < header_len * 8, "{accepted}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_corruption_never_panics(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..6),
        words in proptest::collection::vec((any::<prop::sample::Index>(), any::<u64>()), 0..3),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut b = sample();
        for (at, bit) in flips {
            let i = at.index(b.len());
            b[i] ^= 1 << bit;
        }
        for (at, word) in words {
            let i = at.index(b.len() - 8);
            b[i..i + 8].copy_from_slice(&word.to_le_bytes());
        }
        if do_cut {
            let len = cut.index(b.len());
            b.truncate(len);
        }
        exercise(b);
    }
}
