//! The English text workloads are made of: `data/corpus.txt` (Python standard-library docstrings,
//! PSF licence) embedded in the binary, cut into paragraphs, and sampled deterministically from a
//! caller's RNG. Never generates filler text; never tokenises (token counts are estimates).

use rand::Rng;

const CORPUS: &str = include_str!("../data/corpus.txt");

/// Characters per token assumed by [`estimate_tokens`]: BPE vocabularies average ≈ 4 characters
/// of English per token. The server's `usage` gives the true counts.
pub const CHARS_PER_TOKEN: usize = 4;

/// Approximate token count of `text`.
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(CHARS_PER_TOKEN)
}

/// The embedded corpus, split into non-empty paragraphs.
#[derive(Clone, Debug)]
pub struct Corpus {
    paragraphs: Vec<&'static str>,
}

impl Default for Corpus {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Corpus {
    /// The corpus compiled into the crate.
    pub fn builtin() -> Self {
        let paragraphs: Vec<&'static str> = CORPUS
            .split("\n\n")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        // The file is committed and non-empty; an empty corpus would be a packaging bug.
        assert!(!paragraphs.is_empty(), "data/corpus.txt is empty");
        Corpus { paragraphs }
    }

    pub fn num_paragraphs(&self) -> usize {
        self.paragraphs.len()
    }

    /// Total size of the corpus text in bytes.
    pub fn num_bytes(&self) -> usize {
        self.paragraphs.iter().map(|p| p.len()).sum()
    }

    /// Consecutive paragraphs from a random start, cut at a word boundary to about
    /// `approx_tokens` tokens (never empty).
    pub fn passage<R: Rng>(&self, rng: &mut R, approx_tokens: usize) -> String {
        let target_chars = approx_tokens.max(1) * CHARS_PER_TOKEN;
        let mut i = rng.gen_range(0..self.paragraphs.len());
        let mut out = String::with_capacity(target_chars + 64);
        while out.len() < target_chars {
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(self.paragraphs[i]);
            i = (i + 1) % self.paragraphs.len();
        }
        cut_at_word(&mut out, target_chars);
        out
    }

    /// The first sentence of a random paragraph (at most ~200 characters, cut at a word).
    pub fn sentence<R: Rng>(&self, rng: &mut R) -> String {
        let p = self.paragraphs[rng.gen_range(0..self.paragraphs.len())];
        let end = p.find(". ").map_or(p.len(), |e| e + 1);
        let mut s = p[..end].to_string();
        cut_at_word(&mut s, 200);
        s
    }
}

/// Truncates `s` to at most `max_bytes` bytes at the last space before the limit (or at a char
/// boundary when the text has no space there).
fn cut_at_word(s: &mut String, max_bytes: usize) {
    if s.len() <= max_bytes {
        return;
    }
    let mut end = max_bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    if let Some(space) = s[..end].rfind(char::is_whitespace) {
        if space > 0 {
            end = space;
        }
    }
    s.truncate(end);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn passages_are_sized_and_deterministic() {
        let c = Corpus::builtin();
        assert!(c.num_paragraphs() > 500);
        let mut a = ChaCha8Rng::seed_from_u64(7);
        let mut b = ChaCha8Rng::seed_from_u64(7);
        for n in [1, 50, 400, 3000] {
            let pa = c.passage(&mut a, n);
            assert_eq!(pa, c.passage(&mut b, n));
            let est = estimate_tokens(&pa);
            assert!(est <= n && est * 10 >= n * 8, "asked {n}, got ≈{est}");
        }
    }

    #[test]
    fn cut_respects_char_boundaries() {
        let mut s = "héllo wörld ünïcode".to_string();
        cut_at_word(&mut s, 9);
        assert_eq!(s, "héllo");
        let mut t = "ééééé".to_string();
        cut_at_word(&mut t, 3);
        assert_eq!(t, "é");
    }
}
