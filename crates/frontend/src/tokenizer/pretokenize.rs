//! Pre-tokenisation for byte-level BPE: splits text into words before merging, reproducing
//! llama.cpp's per-`tokenizer.ggml.pre` regex pipelines (its hand-written GPT-2 and Llama-3/Qwen2
//! splitters, and the simple category-run regexes) without a regex engine. Never touches the
//! vocabulary.
//!
//! Stages run in sequence like llama.cpp's `regex_exprs`: each stage re-splits every chunk left
//! by the previous one, and both the matched parts and the gaps between them become chunks.

use super::unicode::{flags, Flags};
use super::TokenizerError;
use std::ops::Range;

/// One splitting stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// `\p{N}`: every number codepoint becomes its own chunk.
    EachNumber,
    /// `\p{N}+`: runs of number codepoints.
    NumberRuns,
    /// `[0-9][0-9][0-9]`: non-overlapping ASCII digit triples, leftmost first.
    AsciiDigitTriples,
    /// `[\p{P}\$\+<=>\^~\|]+`: runs of punctuation and those ASCII symbols.
    PunctRuns,
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// (Llama 3 with `max_digits` 3, Qwen2 with 1).
    Llama3 { max_digits: usize },
    /// Mistral's Tekken (Nemo, Pixtral), as llama.cpp runs it through `std::regex` over its
    /// "collapsed" text (every non-ASCII codepoint one byte for its class):
    /// `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Tekken,
}

/// The pre-tokenizer of one `tokenizer.ggml.pre` value.
#[derive(Clone, Debug)]
pub(crate) struct PreTokenizer {
    stages: Vec<Stage>,
    /// llama.cpp's `ignore_merges`: a word that is itself a token skips BPE merging.
    pub(crate) ignore_merges: bool,
}

impl PreTokenizer {
    /// The pipeline llama.cpp uses for `pre` (an empty name means llama.cpp's "default").
    pub(crate) fn from_name(pre: &str) -> Result<Self, TokenizerError> {
        use Stage::*;
        let (stages, ignore_merges) = match pre {
            "" | "default" => (vec![PunctRuns, Gpt2, NumberRuns, AsciiDigitTriples], false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => (vec![Llama3 { max_digits: 3 }], true),
            "dbrx" | "smaug-bpe" | "chatglm-bpe" => (vec![Llama3 { max_digits: 3 }], false),
            "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" | "hunyuan" | "grok-2" => {
                (vec![Llama3 { max_digits: 1 }], false)
            }
            "tekken" => (vec![Tekken], true),
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling"
            | "jina-es" | "jina-de" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de"
            | "jina-v2-code" | "roberta-bpe" | "gigachat" => (vec![Gpt2], false),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => (vec![EachNumber, Gpt2], false),
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        };
        Ok(Self {
            stages,
            ignore_merges,
        })
    }

    /// Appends the byte ranges of the words of `text` to `words`, in order, covering all of it.
    pub(crate) fn split(&self, text: &str, words: &mut Vec<Range<usize>>) {
        if text.is_empty() {
            return;
        }
        let cps: Vec<Cp> = text
            .char_indices()
            .map(|(i, c)| Cp {
                byte: i,
                c,
                f: flags(c),
            })
            .collect();
        // Chunk lengths in codepoints, like llama.cpp's `bpe_offsets`.
        let mut chunks = vec![cps.len()];
        let mut next = Vec::with_capacity(cps.len() / 3 + 1);
        for &stage in &self.stages {
            next.clear();
            let mut start = 0;
            for &len in &chunks {
                let end = start + len;
                split_chunk(stage, &cps, start, end, &mut next);
                start = end;
            }
            std::mem::swap(&mut chunks, &mut next);
        }
        let mut start = 0;
        for len in chunks {
            let end = start + len;
            let b0 = cps[start].byte;
            let b1 = if end < cps.len() {
                cps[end].byte
            } else {
                text.len()
            };
            words.push(b0..b1);
            start = end;
        }
    }
}

/// One codepoint with its byte offset and classes.
#[derive(Clone, Copy)]
struct Cp {
    byte: usize,
    c: char,
    f: Flags,
}

/// Codepoint accessors bounded to one chunk; positions past its end read as "nothing".
struct Chunk<'a> {
    cps: &'a [Cp],
    end: usize,
}

const OUT: char = '\u{10FFFF}';

impl Chunk<'_> {
    fn c(&self, pos: usize) -> char {
        if pos < self.end {
            self.cps[pos].c
        } else {
            OUT
        }
    }
    fn f(&self, pos: usize) -> Flags {
        if pos < self.end {
            self.cps[pos].f
        } else {
            Flags::default()
        }
    }
}

/// Splits `cps[ini..end]` into chunk lengths appended to `out`.
fn split_chunk(stage: Stage, cps: &[Cp], ini: usize, end: usize, out: &mut Vec<usize>) {
    let ch = Chunk { cps, end };
    match stage {
        Stage::Gpt2 => split_gpt2(&ch, ini, out),
        Stage::Llama3 { max_digits } => split_llama3(&ch, ini, max_digits, out),
        Stage::Tekken => split_matches(ini, end, out, |p| tekken_match(&ch, p)),
        Stage::EachNumber => split_matches(ini, end, out, |p| usize::from(ch.f(p).is_number())),
        Stage::NumberRuns => split_matches(ini, end, out, |p| {
            let mut q = p;
            while ch.f(q).is_number() {
                q += 1;
            }
            q - p
        }),
        Stage::PunctRuns => split_matches(ini, end, out, |p| {
            let mut q = p;
            while ch.f(q).is_punct()
                || matches!(ch.c(q), '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
            {
                q += 1;
            }
            q - p
        }),
        Stage::AsciiDigitTriples => split_matches(ini, end, out, |p| {
            if (0..3).all(|k| ch.c(p + k).is_ascii_digit()) {
                3
            } else {
                0
            }
        }),
    }
}

/// Length of the Tekken match at `i` (0: none), alternative by alternative in `std::regex`'s
/// order (the first that matches wins; greedy quantifiers, backtracking where the rest needs it),
/// with the classes of llama.cpp's collapsed text: a non-ASCII letter is both "not a-z" and "not
/// A-Z", any other non-ASCII codepoint is whitespace, a number or neither.
fn tekken_match(ch: &Chunk<'_>, i: usize) -> usize {
    let defined = |p: usize| ch.f(p).is_defined();
    let ws = |p: usize| ch.f(p).is_whitespace();
    let letter = |p: usize| !ws(p) && ch.f(p).is_letter();
    let number = |p: usize| !ws(p) && ch.f(p).is_number();
    let upperish = |p: usize| letter(p) && !ch.c(p).is_ascii_lowercase();
    let lowerish = |p: usize| letter(p) && !ch.c(p).is_ascii_uppercase();
    let nl = |p: usize| matches!(ch.c(p), '\r' | '\n');
    let prefix = |p: usize| defined(p) && !nl(p) && !letter(p) && !number(p);
    let other = |p: usize| defined(p) && !ws(p) && !letter(p) && !number(p);
    let run = |mut p: usize, pred: &dyn Fn(usize) -> bool| {
        while pred(p) {
            p += 1;
        }
        p
    };
    // `U*L+` and `U+L*` from `j`: the end of the match, if any.
    let upper_then_lower = |j: usize| {
        let upper_end = run(j, &upperish);
        (j..=upper_end)
            .rev()
            .find(|&m| lowerish(m))
            .map(|m| run(m, &lowerish))
    };
    let upper_run_then_lower = |j: usize| {
        let upper_end = run(j, &upperish);
        (upper_end > j).then(|| run(upper_end, &lowerish))
    };
    for letters in [
        &upper_then_lower as &dyn Fn(usize) -> Option<usize>,
        &upper_run_then_lower,
    ] {
        if prefix(i) {
            if let Some(e) = letters(i + 1) {
                return e - i;
            }
        }
        if let Some(e) = letters(i) {
            return e - i;
        }
    }
    if number(i) {
        return 1;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    for start in [i + 1, i] {
        if (start == i || ch.c(i) == ' ') && other(start) {
            let e = run(start, &other);
            return run(e, &|p| nl(p) || ch.c(p) == '/') - i;
        }
    }
    let ws_end = run(i, &ws);
    // `\s*[\r\n]+`: through the last line break of the whitespace run.
    if let Some(m) = (i..ws_end).rev().find(|&m| nl(m)) {
        return m + 1 - i;
    }
    // `\s+(?!\S)`, then `\s+`.
    if ws_end > i && !defined(ws_end) {
        return ws_end - i;
    }
    if ws_end > i + 1 {
        return ws_end - 1 - i;
    }
    ws_end - i
}

/// Generic "regex split": scans left to right, `match_len(pos)` > 0 is a match starting at
/// `pos`; matches and the gaps between them become chunks.
fn split_matches(ini: usize, end: usize, out: &mut Vec<usize>, match_len: impl Fn(usize) -> usize) {
    let mut gap_start = ini;
    let mut pos = ini;
    while pos < end {
        let n = match_len(pos);
        if n == 0 {
            pos += 1;
            continue;
        }
        if pos > gap_start {
            out.push(pos - gap_start);
        }
        out.push(n);
        pos += n;
        gap_start = pos;
    }
    if end > gap_start {
        out.push(end - gap_start);
    }
}

/// Emits the chunk `[*prev_end, end)` (if non-empty); returns its length.
fn add(out: &mut Vec<usize>, prev_end: &mut usize, end: usize) -> usize {
    let len = end - *prev_end;
    if len > 0 {
        out.push(len);
    }
    *prev_end = end;
    len
}

fn contraction_len(ch: &Chunk<'_>, pos: usize, case_insensitive: bool) -> usize {
    if ch.c(pos) != '\'' || pos + 1 >= ch.end {
        return 0;
    }
    let lower = |c: char| {
        if case_insensitive {
            c.to_ascii_lowercase()
        } else {
            c
        }
    };
    let n1 = lower(ch.c(pos + 1));
    if matches!(n1, 's' | 't' | 'm' | 'd') {
        return 2;
    }
    if pos + 2 < ch.end {
        let n2 = lower(ch.c(pos + 2));
        if matches!((n1, n2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
            return 3;
        }
    }
    0
}

fn is_other(f: Flags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.is_defined()
}

fn split_gpt2(ch: &Chunk<'_>, ini: usize, out: &mut Vec<usize>) {
    let mut prev_end = ini;
    let mut pos = ini;
    while pos < ch.end {
        let cpt = ch.c(pos);
        let fl = ch.f(pos);
        let n = contraction_len(ch, pos, false);
        if n > 0 {
            pos += add(out, &mut prev_end, pos + n);
            continue;
        }
        let mut f2 = if cpt == ' ' { ch.f(pos + 1) } else { fl };
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
        let class: Option<fn(Flags) -> bool> = if f2.is_letter() {
            Some(Flags::is_letter)
        } else if f2.is_number() {
            Some(Flags::is_number)
        } else if is_other(f2) {
            Some(is_other)
        } else {
            None
        };
        if let Some(class) = class {
            pos += usize::from(cpt == ' ');
            while class(f2) {
                pos += 1;
                f2 = ch.f(pos);
            }
            add(out, &mut prev_end, pos);
            continue;
        }
        let mut num_ws = 0;
        while ch.f(pos + num_ws).is_whitespace() {
            num_ws += 1;
        }
        // `\s+(?!\S)`: leave the last whitespace to prefix the next word.
        if num_ws > 1 && ch.c(pos + num_ws) != OUT {
            pos += num_ws - 1;
            add(out, &mut prev_end, pos);
            continue;
        }
        if num_ws > 0 {
            pos += num_ws;
            add(out, &mut prev_end, pos);
            continue;
        }
        pos += 1;
        add(out, &mut prev_end, pos);
    }
}

fn split_llama3(ch: &Chunk<'_>, ini: usize, max_digits: usize, out: &mut Vec<usize>) {
    let mut prev_end = ini;
    let mut pos = ini;
    while pos < ch.end {
        let cpt = ch.c(pos);
        let fl = ch.f(pos);
        let n = contraction_len(ch, pos, true);
        if n > 0 {
            pos += add(out, &mut prev_end, pos + n);
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(cpt == '\r' || cpt == '\n' || fl.is_number())
            && (fl.is_letter() || ch.f(pos + 1).is_letter())
        {
            pos += 1;
            while ch.f(pos).is_letter() {
                pos += 1;
            }
            add(out, &mut prev_end, pos);
            continue;
        }
        // `\p{N}{1,max_digits}`
        if fl.is_number() {
            let mut group_start = pos;
            while ch.f(pos).is_number() {
                pos += 1;
                if pos - group_start >= max_digits {
                    add(out, &mut prev_end, pos);
                    group_start = pos;
                }
            }
            add(out, &mut prev_end, pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let mut f2 = if cpt == ' ' { ch.f(pos + 1) } else { fl };
        if !(f2.is_whitespace() || f2.is_letter() || f2.is_number()) && fl.is_defined() {
            pos += usize::from(cpt == ' ');
            while is_other(f2) {
                pos += 1;
                f2 = ch.f(pos);
            }
            while matches!(ch.c(pos), '\r' | '\n') {
                pos += 1;
            }
            add(out, &mut prev_end, pos);
            continue;
        }
        let mut num_ws = 0;
        let mut last_end_rn = 0;
        while ch.f(pos + num_ws).is_whitespace() {
            if matches!(ch.c(pos + num_ws), '\r' | '\n') {
                last_end_rn = pos + num_ws + 1;
            }
            num_ws += 1;
        }
        // `\s*[\r\n]+`
        if last_end_rn > 0 {
            pos = last_end_rn;
            add(out, &mut prev_end, pos);
            continue;
        }
        if num_ws > 1 && ch.c(pos + num_ws) != OUT {
            pos += num_ws - 1;
            add(out, &mut prev_end, pos);
            continue;
        }
        if num_ws > 0 {
            pos += num_ws;
            add(out, &mut prev_end, pos);
            continue;
        }
        pos += 1;
        add(out, &mut prev_end, pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::from_name(pre).unwrap();
        let mut r = Vec::new();
        p.split(text, &mut r);
        let joined: String = r.iter().map(|w| &text[w.clone()]).collect();
        assert_eq!(joined, text, "split must cover the text");
        r.into_iter().map(|w| text[w].to_string()).collect()
    }

    #[test]
    fn gpt2_regex_semantics() {
        assert_eq!(
            words("gpt-2", "Hello world's  end!!\n\n x"),
            ["Hello", " world", "'s", " ", " end", "!!", "\n\n", " x"]
        );
        assert_eq!(words("gpt-2", "a   "), ["a", "   "]);
        assert_eq!(words("gpt-2", "abc 123 ,."), ["abc", " 123", " ,."]);
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(
            words("smollm", "in 2024, x1"),
            ["in", " ", "2", "0", "2", "4", ",", " x", "1"]
        );
    }

    /// Golden: Tekken's case split (an uppercase run then lowercase letters, non-ASCII letters
    /// on both sides), single digits, `/` kept after line breaks, whitespace as in Llama 3.
    #[test]
    fn tekken_regex_semantics() {
        assert_eq!(
            words("tekken", "helloWORLD HELLOworld"),
            ["hello", "WORLD", " HELLOworld"]
        );
        assert_eq!(words("tekken", "ÉCOLE École"), ["É", "COLE", " École"]);
        assert_eq!(
            words("tekken", "XMLHttpRequest 42"),
            ["XMLHttp", "Request", " ", "4", "2"]
        );
        assert_eq!(words("tekken", "a.\n/b"), ["a", ".\n/", "b"]);
        assert_eq!(
            words("tekken", "x  \n\n  y\t"),
            ["x", "  \n\n", " ", " y", "\t"]
        );
        assert_eq!(words("tekken", "it's"), ["it", "'s"]);
    }

    #[test]
    fn llama3_and_qwen2_digits_and_newlines() {
        assert_eq!(
            words("llama-bpe", "12345 ok\n\n  Hi"),
            ["123", "45", " ok", "\n\n", " ", " Hi"]
        );
        assert_eq!(words("qwen2", "123"), ["1", "2", "3"]);
        assert_eq!(
            words("llama-bpe", "I'M (x)\r\n"),
            ["I", "'M", " (", "x", ")\r\n"]
        );
    }

    /// Word splits of HF `tokenizers` (oniguruma running the original regexes) on tricky text.
    #[test]
    fn matches_hf_regex_splits() {
        let data: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/data/pretokenize_hf.json")).unwrap();
        let cases = data["cases"].as_array().unwrap();
        assert!(cases.len() >= 40);
        for c in cases {
            let (pre, text) = (c["pre"].as_str().unwrap(), c["text"].as_str().unwrap());
            let expected: Vec<String> = serde_json::from_value(c["words"].clone()).unwrap();
            assert_eq!(words(pre, text), expected, "{pre} {text:?}");
        }
    }

    #[test]
    fn default_pipeline_and_unknown_name() {
        assert_eq!(
            words("default", "a+b 1234"),
            ["a", "+", "b", " ", "123", "4"]
        );
        assert!(matches!(
            PreTokenizer::from_name("no-such-pre"),
            Err(TokenizerError::UnsupportedPreTokenizer(_))
        ));
    }
}
