//! GGUF metadata: typed values and the insertion-ordered key/value table.
//!
//! Owns [`MetaValue`] (one value of any GGUF value type, arrays nested to any depth), the on-disk
//! value type ids, and [`Metadata`] with its typed, conversion-checked getters. It never parses
//! bytes (see `reader.rs`) and never serialises them (see `writer.rs`).

use std::collections::HashMap;

/// One GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// Elements of one type (the writer enforces this; the reader gets it from the file).
    Array(Vec<MetaValue>),
}

/// On-disk GGUF value type ids (`enum gguf_type`).
pub(crate) mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl MetaValue {
    /// The on-disk value type id of this value.
    pub fn type_id(&self) -> u32 {
        use value_type as t;
        match self {
            Self::U8(_) => t::U8,
            Self::I8(_) => t::I8,
            Self::U16(_) => t::U16,
            Self::I16(_) => t::I16,
            Self::U32(_) => t::U32,
            Self::I32(_) => t::I32,
            Self::U64(_) => t::U64,
            Self::I64(_) => t::I64,
            Self::F32(_) => t::F32,
            Self::F64(_) => t::F64,
            Self::Bool(_) => t::BOOL,
            Self::String(_) => t::STRING,
            Self::Array(_) => t::ARRAY,
        }
    }

    /// The value as a signed 128-bit integer when it is any integer type.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as `f32` when it is `F32` or `F64` (the latter rounded).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Self::F32(v) => Some(v),
            Self::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The string when the value is a `String`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements when the value is an `Array`.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The key/value table of a GGUF file, in file order, with O(1) lookup by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `key`; returns `false` (and changes nothing) when the key is already present.
    pub fn insert(&mut self, key: String, value: MetaValue) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// A `String` value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any integer value that is non-negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        u64::try_from(self.get(key)?.as_i128()?).ok()
    }

    /// Any integer value that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        u32::try_from(self.get(key)?.as_i128()?).ok()
    }

    /// An `F32` or `F64` value.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// A `Bool` value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            MetaValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array whose elements are all strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_str)
            .collect()
    }

    /// An array whose elements are all integers that fit in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| i32::try_from(v.as_i128()?).ok())
            .collect()
    }

    /// An array whose elements are all `F32` or `F64`.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(MetaValue::as_f32)
            .collect()
    }

    /// `general.architecture` (e.g. `llama`).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Metadata {
        let mut m = Metadata::new();
        assert!(m.insert("a.u8".into(), MetaValue::U8(7)));
        assert!(m.insert("a.neg".into(), MetaValue::I64(-3)));
        assert!(m.insert("a.big".into(), MetaValue::U64(1 << 40)));
        assert!(m.insert("a.f64".into(), MetaValue::F64(0.5)));
        assert!(m.insert(
            "a.ints".into(),
            MetaValue::Array(vec![MetaValue::U32(1), MetaValue::I8(-2)])
        ));
        assert!(m.insert(
            "a.toobig".into(),
            MetaValue::Array(vec![MetaValue::U32(u32::MAX)])
        ));
        m
    }

    #[test]
    fn integer_getters_convert_only_when_the_value_fits() {
        let m = table();
        assert_eq!(m.get_u32("a.u8"), Some(7));
        assert_eq!(m.get_u64("a.u8"), Some(7));
        assert_eq!(m.get_u64("a.neg"), None);
        assert_eq!(m.get_u32("a.big"), None);
        assert_eq!(m.get_u64("a.big"), Some(1 << 40));
        assert_eq!(m.get_f32("a.f64"), Some(0.5));
        assert_eq!(m.get_f32("a.u8"), None);
        assert_eq!(m.get_i32_array("a.ints"), Some(vec![1, -2]));
        assert_eq!(m.get_i32_array("a.toobig"), None);
        assert_eq!(m.get_str_array("a.ints"), None);
        assert_eq!(m.get("missing"), None);
    }

    #[test]
    fn insert_rejects_duplicates_and_keeps_order() {
        let mut m = table();
        assert!(!m.insert("a.u8".into(), MetaValue::U8(9)));
        assert_eq!(m.get_u32("a.u8"), Some(7));
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys[0], "a.u8");
        assert_eq!(keys.len(), 6);
    }
}
