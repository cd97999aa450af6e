//! GBNF (llama.cpp's grammar format: `root ::= "a" [0-9]+ | other`) → llguidance's Lark-like
//! syntax, which this llguidance version reads natively (it has no GBNF reader). Text to text:
//! rules keep their structure (alternation, grouping, `*` `+` `?` and `{m,n}` repetition), string
//! literals become JSON-escaped Lark strings, character classes and `.` inline regexes, and rule
//! names are rewritten to Lark's lower-case rule names (`g-` + the name, `_` doubled and an
//! upper-case letter as `_` + its lower case, so distinct names stay distinct). `root` is the start rule.

/// Why a GBNF grammar could not be read (shown to the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GBNF at line {line}: {message}")]
pub struct GbnfError {
    pub line: usize,
    pub message: String,
}

/// True when `g` looks like GBNF (a line `name ::= …`) rather than Lark.
pub fn is_gbnf(g: &str) -> bool {
    g.lines().any(|l| {
        l.trim_start().split_once("::=").is_some_and(|(name, _)| {
            let name = name.trim();
            !name.is_empty() && name.chars().all(is_name_char)
        })
    })
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// The grammar in Lark syntax, starting at `root`.
pub fn to_lark(src: &str) -> Result<String, GbnfError> {
    let mut p = Parser {
        s: src.chars().collect(),
        pos: 0,
        refs: Vec::new(),
        depth: 0,
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    loop {
        p.space(true);
        if p.at_end() {
            break;
        }
        let name = p.name()?;
        p.space(false);
        if !p.eat_str("::=") {
            return Err(p.error("expected ::= after the rule name"));
        }
        p.space(true);
        let body = p.alternates(false)?;
        if rules.iter().any(|(n, _)| n == &name) {
            return Err(p.error(&format!("rule {name:?} is defined twice")));
        }
        rules.push((name, body));
        p.space(false);
        if !p.at_end() && p.peek() != Some('\n') && p.peek() != Some('\r') {
            return Err(p.error("unexpected character"));
        }
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err(GbnfError {
            line: 1,
            message: "no rule named root".into(),
        });
    }
    if let Some((name, line)) = p
        .refs
        .iter()
        .find(|(name, _)| !rules.iter().any(|(n, _)| n == name))
    {
        return Err(GbnfError {
            line: *line,
            message: format!("rule {name:?} is used but not defined"),
        });
    }
    let mut out = format!("start: {}\n", rule_name("root"));
    for (name, body) in &rules {
        out.push_str(&format!("{}: {body}\n", rule_name(name)));
    }
    Ok(out)
}

/// `Foo-bar_2` → `g-_foo-bar__2` (one-to-one: `_` doubled, an upper-case letter as `_` + it).
fn rule_name(gbnf: &str) -> String {
    let mut out = String::from("g-");
    for c in gbnf.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else if c == '_' {
            out.push_str("__");
        } else {
            out.push(c);
        }
    }
    out
}

struct Parser {
    s: Vec<char>,
    pos: usize,
    /// Rule names referenced, with their line.
    refs: Vec<(String, usize)>,
    /// How many groups `(` are open (at most [`MAX_GROUP_DEPTH`]: the reader recurses).
    depth: usize,
}

/// Deepest nesting of parenthesised groups a GBNF grammar may have (the reader recurses once
/// per group; a 17 KB `((((…` must be a 400, not a stack overflow).
pub const MAX_GROUP_DEPTH: usize = 64;

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn peek(&self) -> Option<char> {
        self.s.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn eat_str(&mut self, lit: &str) -> bool {
        let n = lit.chars().count();
        if self.s.len() >= self.pos + n
            && self.s[self.pos..self.pos + n]
                .iter()
                .copied()
                .eq(lit.chars())
        {
            self.pos += n;
            return true;
        }
        false
    }

    fn error(&self, message: &str) -> GbnfError {
        let line = 1 + self.s[..self.pos.min(self.s.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count();
        GbnfError {
            line,
            message: message.to_string(),
        }
    }

    /// Blanks and `#` comments; newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expected a rule name"));
        }
        Ok(self.s[start..self.pos].iter().collect())
    }

    fn alternates(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut items: Vec<String> = Vec::new();
        loop {
            let item = match self.peek() {
                Some('"') => {
                    self.pos += 1;
                    let mut text = String::new();
                    loop {
                        match self.bump() {
                            None => return Err(self.error("unterminated string")),
                            Some('"') => break,
                            Some('\\') => text.push(self.escape()?),
                            Some(c) => text.push(c),
                        }
                    }
                    lark_string(&text)
                }
                Some('[') => self.class()?,
                Some('.') => {
                    self.pos += 1;
                    "/(?s:.)/".to_string()
                }
                Some('(') => {
                    self.pos += 1;
                    self.depth += 1;
                    if self.depth > MAX_GROUP_DEPTH {
                        return Err(self
                            .error(&format!("groups nest deeper than {MAX_GROUP_DEPTH} levels")));
                    }
                    self.space(true);
                    let inner = self.alternates(true)?;
                    self.depth -= 1;
                    self.space(true);
                    if self.bump() != Some(')') {
                        return Err(self.error("expected )"));
                    }
                    format!("({inner})")
                }
                Some(c) if is_name_char(c) => {
                    let line = self.error("").line;
                    let name = self.name()?;
                    let lark = rule_name(&name);
                    self.refs.push((name, line));
                    lark
                }
                _ => break,
            };
            let item = item + &self.repetition()?;
            items.push(item);
            self.space(nested);
        }
        if items.is_empty() {
            return Ok("\"\"".into());
        }
        Ok(items.join(" "))
    }

    /// `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` (or nothing).
    fn repetition(&mut self) -> Result<String, GbnfError> {
        match self.peek() {
            Some(c @ ('*' | '+' | '?')) => {
                self.pos += 1;
                Ok(c.to_string())
            }
            Some('{') => {
                let start = self.pos;
                while self.peek().is_some_and(|c| c != '}') {
                    self.pos += 1;
                }
                if self.bump() != Some('}') {
                    return Err(self.error("unterminated {m,n}"));
                }
                let inner: String = self.s[start + 1..self.pos - 1]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                let (lo, hi) = match inner.split_once(',') {
                    Some((lo, hi)) => (lo, Some(hi)),
                    None => (inner.as_str(), None),
                };
                let num = |s: &str| s.parse::<u32>().ok();
                match (num(lo), hi) {
                    (Some(lo), None) => Ok(format!("{{{lo}}}")),
                    (Some(lo), Some("")) => Ok(format!("{{{lo},}}")),
                    (Some(lo), Some(hi)) if num(hi).is_some_and(|h| h >= lo) => {
                        Ok(format!("{{{lo},{hi}}}"))
                    }
                    _ => Err(self.error(&format!("bad repetition {{{inner}}}"))),
                }
            }
            _ => Ok(String::new()),
        }
    }

    /// After a backslash, in a string or class.
    fn escape(&mut self) -> Result<char, GbnfError> {
        let hex = |p: &mut Parser, n: usize| -> Result<char, GbnfError> {
            let mut v = 0u32;
            for _ in 0..n {
                let d = p
                    .bump()
                    .and_then(|c| c.to_digit(16))
                    .ok_or_else(|| p.error("bad hex escape"))?;
                v = v * 16 + d;
            }
            char::from_u32(v).ok_or_else(|| p.error("escape is not a character"))
        };
        match self.bump() {
            Some('n') => Ok('\n'),
            Some('r') => Ok('\r'),
            Some('t') => Ok('\t'),
            Some('x') => hex(self, 2),
            Some('u') => hex(self, 4),
            Some('U') => hex(self, 8),
            Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^' | '/' | '.')) => Ok(c),
            _ => Err(self.error("unknown escape")),
        }
    }

    /// `[a-z_]`, `[^"\\]` → an inline regex.
    fn class(&mut self) -> Result<String, GbnfError> {
        self.pos += 1; // '['
        let mut out = String::from("/[");
        if self.peek() == Some('^') {
            self.pos += 1;
            out.push('^');
        }
        let mut any = false;
        loop {
            let c = match self.bump() {
                None => return Err(self.error("unterminated character class")),
                Some(']') if any => break,
                Some('\\') => self.escape()?,
                Some(c) => c,
            };
            any = true;
            out.push_str(&class_char(c));
            if self.peek() == Some('-') && self.s.get(self.pos + 1) != Some(&']') {
                self.pos += 1;
                let hi = match self.bump() {
                    Some('\\') => self.escape()?,
                    Some(h) => h,
                    None => return Err(self.error("unterminated character class")),
                };
                if hi < c {
                    return Err(self.error("a range goes down"));
                }
                out.push('-');
                out.push_str(&class_char(hi));
            }
        }
        out.push_str("]/");
        Ok(out)
    }
}

/// A character inside a regex class: itself when alphanumeric, else `\x{…}`.
fn class_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\x{{{:x}}}", c as u32)
    }
}

/// A Lark string literal (JSON escapes; DEL escaped too, which Lark strings do not take raw).
fn lark_string(text: &str) -> String {
    serde_json::Value::from(text)
        .to_string()
        .replace('\u{7f}', "\\u007f")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_rules_terminals_and_repetition() {
        let g = r#"
# a comment
root ::= greeting ws Name-list   # trailing comment
greeting ::= "hi\n" | "h\"o"
Name-list ::=
    ( [A-Z] [a-z]{1,8} ) ("," [ \t]? [A-Z] [a-z]*)* .?
ws ::= [^\x00-\x1f"\\]+ | "\u00e9"{2,}
"#;
        assert!(is_gbnf(g));
        assert_eq!(
            to_lark(g).unwrap(),
            "start: g-root\n\
             g-root: g-greeting g-ws g-_name-list\n\
             g-greeting: \"hi\\n\" | \"h\\\"o\"\n\
             g-_name-list: (/[A-Z]/ /[a-z]/{1,8}) (\",\" /[\\x{20}\\x{9}]/? /[A-Z]/ /[a-z]/*)* /(?s:.)/?\n\
             g-ws: /[^\\x{0}-\\x{1f}\\x{22}\\x{5c}]/+ | \"é\"{2,}\n"
        );
        assert!(!is_gbnf("start: \"a\" | b\nb: /x/"));
    }

    #[test]
    fn errors_name_the_line() {
        for (g, line) in [
            ("root ::= \"a", 1),
            ("root ::= a\nb ::= [a-", 2),
            ("root ::= (a", 1),
            ("root ::= a{3,1}", 1),
            ("start ::= \"a\"", 1),
            ("root ::= \"a\"\nroot ::= \"b\"", 2),
            ("root = \"a\"", 1),
            ("root ::= \"a\"\n  | b", 2),
        ] {
            let e = to_lark(g).unwrap_err();
            assert_eq!(e.line, line, "{g}: {e}");
        }
    }

    #[test]
    fn deep_groups_are_an_error_not_a_stack_overflow() {
        let ok = format!(
            "root ::= {}\"a\"{}",
            "(".repeat(MAX_GROUP_DEPTH),
            ")".repeat(MAX_GROUP_DEPTH)
        );
        assert!(to_lark(&ok).is_ok());
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(20_000), ")".repeat(20_000));
        let e = to_lark(&deep).unwrap_err();
        assert!(e.message.contains("nest deeper"), "{e}");
    }
}
