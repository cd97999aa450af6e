//! Special-token partitioning: before BPE, cuts the text at occurrences of control /
//! user-defined / unknown token texts, like llama.cpp's `tokenizer_st_partition` (longest token
//! text first, each one applied to all remaining text fragments). Never runs BPE.

/// A piece of the input after partitioning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Byte range of plain text still to be tokenised.
    Text(usize, usize),
    /// A special token matched literally in the text.
    Token(u32),
}

/// The special tokens of a vocabulary, longest text first.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialMatcher {
    /// `(id, text, is_user_defined)`.
    tokens: Vec<(u32, String, bool)>,
}

impl SpecialMatcher {
    /// `tokens`: `(id, text, is_user_defined)` for every control, user-defined and unknown token.
    pub(crate) fn new(mut tokens: Vec<(u32, String, bool)>) -> Self {
        tokens.retain(|(_, t, _)| !t.is_empty());
        tokens.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        Self { tokens }
    }

    /// Splits `text`; with `parse_special == false` only user-defined tokens are matched (as in
    /// llama.cpp and HF tokenizers).
    pub(crate) fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let mut next = Vec::new();
        for (id, pat, user_defined) in &self.tokens {
            if !parse_special && !user_defined {
                continue;
            }
            // Cheap reject: most texts contain no special token at all.
            if !frags
                .iter()
                .any(|f| matches!(*f, Fragment::Text(s, e) if text[s..e].contains(pat.as_str())))
            {
                continue;
            }
            next.clear();
            for &f in &frags {
                let Fragment::Text(s, e) = f else {
                    next.push(f);
                    continue;
                };
                let mut cur = s;
                while let Some(i) = text[cur..e].find(pat.as_str()) {
                    if i > 0 {
                        next.push(Fragment::Text(cur, cur + i));
                    }
                    next.push(Fragment::Token(*id));
                    cur += i + pat.len();
                }
                if cur < e {
                    next.push(Fragment::Text(cur, e));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_first_and_user_defined_always() {
        let m = SpecialMatcher::new(vec![
            (0, "<a>".into(), false),
            (1, "<a><b>".into(), false),
            (2, "@@".into(), true),
        ]);
        let t = "x<a><b>y<a>@@";
        assert_eq!(
            m.partition(t, true),
            vec![
                Fragment::Text(0, 1),
                Fragment::Token(1),
                Fragment::Text(7, 8),
                Fragment::Token(0),
                Fragment::Token(2),
            ]
        );
        assert_eq!(
            m.partition(t, false),
            vec![Fragment::Text(0, 11), Fragment::Token(2)]
        );
        assert!(m.partition("", true).is_empty());
    }
}
