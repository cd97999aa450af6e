//! A bounds-checked little-endian byte cursor for parsing GGUF headers.
//!
//! Owns primitive reads (integers, floats, length-prefixed strings) that fail with
//! [`GgufError::Truncated`] instead of panicking, and the "can the rest of the file hold this
//! many items" check that guards every header-sized allocation. It never interprets GGUF
//! structure (see `reader.rs`).

use super::error::GgufError;

/// A read position over a byte slice.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    /// Current byte offset from the start of the file.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current position.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes, advancing past them.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub fn f32(&mut self, what: &'static str) -> Result<f32, GgufError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
    pub fn f64(&mut self, what: &'static str) -> Result<f64, GgufError> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_item_bytes` each can fit in the remaining
    /// bytes, and returns the count as `usize`. Call before allocating anything sized by `count`.
    pub fn check_count(
        &self,
        count: u64,
        min_item_bytes: usize,
        what: &'static str,
    ) -> Result<usize, GgufError> {
        let fits = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(min_item_bytes))
            .is_some_and(|need| need <= self.remaining());
        if fits {
            Ok(count as usize)
        } else {
            Err(GgufError::AbsurdCount { what, count })
        }
    }

    /// A GGUF string: `u64` byte length then UTF-8 bytes.
    pub fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let len = self.check_count(len, 1, what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| GgufError::InvalidUtf8 { offset })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_reports_truncation() {
        let bytes = [1u8, 0, 0, 0, 2, 0];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u32("a").unwrap(), 1);
        assert!(matches!(
            c.u32("b"),
            Err(GgufError::Truncated {
                what: "b",
                offset: 4
            })
        ));
        assert_eq!(c.u16("c").unwrap(), 2);
        assert_eq!(c.remaining(), 0);
    }

    #[test]
    fn absurd_string_length_is_rejected_before_allocation() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"abc");
        let mut c = Cursor::new(&bytes);
        assert!(matches!(
            c.string("s"),
            Err(GgufError::AbsurdCount {
                count: u64::MAX,
                ..
            })
        ));
        assert!(c.check_count(4, 1, "x").is_err());
        let c = Cursor::new(&bytes[8..]);
        assert_eq!(c.check_count(3, 1, "x").unwrap(), 3);
        assert!(c.check_count(2, 2, "x").is_err());
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let mut bytes = 2u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0xff, 0xfe]);
        assert!(matches!(
            Cursor::new(&bytes).string("s"),
            Err(GgufError::InvalidUtf8 { offset: 8 })
        ));
    }
}
