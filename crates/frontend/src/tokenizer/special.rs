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
        self.partition_where(text, |_, _, user_defined| parse_special || user_defined)
    }

    /// Splits `text` at the occurrences of special-token texts that `accept(start, end,
    /// is_user_defined)` allows (byte range of the occurrence in `text`); a refused occurrence
    /// stays text, and a later occurrence overlapping it may still match.
    pub(crate) fn partition_where(
        &self,
        text: &str,
        accept: impl Fn(usize, usize, bool) -> bool,
    ) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let mut next = Vec::new();
        for (id, pat, user_defined) in &self.tokens {
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
                let mut search = s;
                while let Some(i) = text[search..e].find(pat.as_str()) {
                    let at = search + i;
                    if accept(at, at + pat.len(), *user_defined) {
                        if at > cur {
                            next.push(Fragment::Text(cur, at));
                        }
                        next.push(Fragment::Token(*id));
                        cur = at + pat.len();
                        search = cur;
                    } else {
                        // Step over one character: `pat` is non-empty and starts at a boundary.
                        search = at + text[at..].chars().next().map_or(1, char::len_utf8);
                    }
                }
                if cur < e {
                    next.push(Fragment::Text(cur, e));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    /// Whether `text` contains the text of any special token (control, unknown or user-defined).
    pub(crate) fn find_in(&self, text: &str) -> Option<u32> {
        self.tokens
            .iter()
            .find(|(_, pat, _)| text.contains(pat.as_str()))
            .map(|(id, _, _)| *id)
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

    #[test]
    fn refused_occurrences_stay_text_and_overlaps_still_match() {
        let m = SpecialMatcher::new(vec![(0, "<a>".into(), false), (1, "aa".into(), false)]);
        // "<a>" in [0, 3) refused, the one in [3, 6) accepted.
        assert_eq!(
            m.partition_where("<a><a>", |s, _, _| s >= 3),
            vec![Fragment::Text(0, 3), Fragment::Token(0)]
        );
        // "aaa": the match at 0 refused, the overlapping one at 1 accepted.
        assert_eq!(
            m.partition_where("aaa", |s, _, _| s == 1),
            vec![Fragment::Text(0, 1), Fragment::Token(1)]
        );
        assert_eq!(m.find_in("x<a>"), Some(0));
        assert_eq!(m.find_in("plain"), None);
    }
}
