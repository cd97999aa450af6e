//! Streaming a reply that may hold tool calls as OpenAI does: text as `content` deltas as soon as
//! the reply is known to be text, a call's first delta (index, id, name) as soon as its name is
//! complete, then its arguments piece by piece. The reply's syntax (generic JSON or a template
//! family's) decides: the text is held only while it could still begin either way. At the end the
//! whole reply is parsed again (`tools::parse_reply_in`) and whatever the pieces did not carry yet
//! is sent, so the concatenated deltas equal the non-streamed message.

use crate::tool_families::{self, Family};
use crate::tools::{parse_reply_in, partial_text, Reply, ReplySyntax};

/// One piece of a streamed reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    /// The first delta of call `index`; `id` when the model wrote it (else the server's).
    CallStart {
        index: usize,
        id: Option<String>,
        name: String,
    },
    /// More of call `index`'s arguments text.
    Args {
        index: usize,
        text: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Undecided,
    /// Plain text (a family's text answer).
    Text,
    /// The generic mode's `{"response": "…"}`: the string's text so far.
    GenericText,
    /// The generic mode's structured answer: sent whole at the end.
    Held,
    Calls,
}

/// The streaming state of one choice.
pub struct ReplyStream {
    syntax: ReplySyntax,
    buf: String,
    mode: Mode,
    content_sent: String,
    /// Per call: (first delta sent, arguments text sent).
    calls_sent: Vec<(bool, String)>,
}

/// A call as far as the text goes.
#[derive(Debug, PartialEq, Eq)]
struct PartialCall<'a> {
    name: String,
    args: &'a str,
    args_done: bool,
    id: Option<String>,
}

impl ReplyStream {
    pub fn new(syntax: ReplySyntax) -> ReplyStream {
        ReplyStream {
            syntax,
            buf: String::new(),
            mode: Mode::Undecided,
            content_sent: String::new(),
            calls_sent: Vec::new(),
        }
    }

    /// Adds generated text; returns the pieces it releases.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        if self.mode == Mode::Undecided {
            self.mode = self.decide();
        }
        match self.mode {
            Mode::Undecided | Mode::Held => Vec::new(),
            Mode::Text => {
                let text = self.buf.clone();
                self.content_to(&text)
            }
            Mode::GenericText => match partial_text(&self.buf) {
                Some(t) => self.content_to(&t),
                None => Vec::new(),
            },
            Mode::Calls => {
                let mistral = self.syntax == ReplySyntax::Family(Family::Mistral);
                let key = match self.syntax {
                    ReplySyntax::Family(f) => f.arguments_key(),
                    ReplySyntax::Generic => "arguments",
                };
                let buf = std::mem::take(&mut self.buf);
                let calls = scan_calls(&buf, key, mistral);
                let mut out = Vec::new();
                for (index, c) in calls.iter().enumerate() {
                    // Mistral's id follows the arguments: the call goes out once it is known.
                    if mistral && c.id.is_none() {
                        break;
                    }
                    out.extend(self.call_to(index, c.id.clone(), &c.name, c.args));
                }
                self.buf = buf;
                out
            }
        }
    }

    /// The rest of the reply once generation ended with `reason` (the engine's finish reason
    /// name): the pieces not sent yet, and the reply's finish reason (`tool_calls` for calls).
    pub fn finish(&mut self, reason: &str) -> (Vec<Piece>, String) {
        match parse_reply_in(self.syntax, &self.buf) {
            Reply::Calls(calls) => {
                let mut out = Vec::new();
                for (index, c) in calls.iter().enumerate() {
                    out.extend(self.call_to(index, c.id.clone(), &c.name, &c.arguments));
                }
                (out, "tool_calls".to_string())
            }
            Reply::Text(t) => (self.content_to(&t), reason.to_string()),
            // The complete calls (already sent, or sent now); the cut one went out as far as
            // it was written, as a stream must.
            Reply::Cut(calls) => {
                let mut out = Vec::new();
                for (index, c) in calls.iter().enumerate() {
                    out.extend(self.call_to(index, c.id.clone(), &c.name, &c.arguments));
                }
                (out, reason.to_string())
            }
            Reply::Unparsed if self.mode == Mode::Calls => (Vec::new(), reason.to_string()),
            Reply::Unparsed => {
                let text = match self.syntax {
                    ReplySyntax::Generic => partial_text(&self.buf),
                    ReplySyntax::Family(_) => None,
                }
                .unwrap_or_else(|| self.buf.clone());
                (self.content_to(&text), reason.to_string())
            }
        }
    }

    fn decide(&self) -> Mode {
        match self.syntax {
            ReplySyntax::Family(f) => match tool_families::starts_call(f, &self.buf) {
                None => Mode::Undecided,
                Some(true) => Mode::Calls,
                Some(false) => Mode::Text,
            },
            ReplySyntax::Generic => {
                let modes = [
                    ("{\"tool_call\": ", Mode::Calls),
                    ("{\"tool_calls\": ", Mode::Calls),
                    ("{\"response\": \"", Mode::GenericText),
                    ("{\"response\": ", Mode::Held),
                ];
                let longer = |p: &str| p.len() > self.buf.len() && p.starts_with(&self.buf);
                if modes.iter().any(|(p, _)| longer(p)) {
                    return Mode::Undecided;
                }
                match modes.iter().find(|(p, _)| self.buf.starts_with(p)) {
                    Some((_, mode)) => *mode,
                    // Not the grammar's JSON (a stop string, say): the end decides.
                    None => Mode::Held,
                }
            }
        }
    }

    /// Content up to `text` (which extends what was sent; otherwise nothing more is sent).
    fn content_to(&mut self, text: &str) -> Vec<Piece> {
        match text.strip_prefix(self.content_sent.as_str()) {
            Some(rest) if !rest.is_empty() => {
                self.content_sent.push_str(rest);
                vec![Piece::Content(rest.to_string())]
            }
            _ => Vec::new(),
        }
    }

    /// Call `index` up to `args`.
    fn call_to(&mut self, index: usize, id: Option<String>, name: &str, args: &str) -> Vec<Piece> {
        if self.calls_sent.len() <= index {
            self.calls_sent.resize(index + 1, (false, String::new()));
        }
        let mut out = Vec::new();
        let sent = &mut self.calls_sent[index];
        if !sent.0 {
            sent.0 = true;
            out.push(Piece::CallStart {
                index,
                id,
                name: name.to_string(),
            });
        }
        if let Some(rest) = args.strip_prefix(sent.1.as_str()) {
            if !rest.is_empty() {
                sent.1.push_str(rest);
                out.push(Piece::Args {
                    index,
                    text: rest.to_string(),
                });
            }
        }
        out
    }
}

/// The calls in `buf` as far as they are written: each is a JSON object `{"name": "…", "<key>":
/// {…}` (then `, "id": "…"` with `with_id`), in the grammar's compact spelling; a call shows up
/// once its name is complete.
fn scan_calls<'a>(buf: &'a str, key: &str, with_id: bool) -> Vec<PartialCall<'a>> {
    const NAME: &str = "{\"name\": \"";
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(at) = buf[pos..].find(NAME) {
        let name_start = pos + at + NAME.len() - 1;
        let Some(name_end) = string_end(buf, name_start) else {
            break;
        };
        let Ok(name) = serde_json::from_str::<String>(&buf[name_start..name_end]) else {
            break;
        };
        let sep = format!(", \"{key}\": ");
        let after = &buf[name_end..];
        if !after.starts_with(&sep) {
            break;
        }
        let args_start = name_end + sep.len();
        let (args_end, args_done) = value_end(buf, args_start);
        let mut call = PartialCall {
            name,
            args: &buf[args_start..args_end],
            args_done,
            id: None,
        };
        pos = args_end;
        if args_done && with_id {
            const ID: &str = ", \"id\": ";
            if let Some(id_at) = buf[pos..].strip_prefix(ID).map(|_| pos + ID.len()) {
                if let Some(id_end) = string_end(buf, id_at) {
                    call.id = serde_json::from_str::<String>(&buf[id_at..id_end]).ok();
                    pos = id_end;
                }
            }
        }
        let done = call.args_done;
        out.push(call);
        if !done {
            break;
        }
    }
    out
}

/// The end (exclusive) of the JSON string starting with the quote at `start`, if it is closed.
fn string_end(buf: &str, start: usize) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in buf[start + 1..].char_indices() {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => return Some(start + 1 + i + 1),
            _ => {}
        }
    }
    None
}

/// How far the JSON value starting at `start` goes: (end, complete). Only objects and arrays
/// (the arguments) are scanned for their end; anything else ends the scan where it is.
fn value_end(buf: &str, start: usize) -> (usize, bool) {
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for (i, c) in buf[start..].char_indices() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return (start + i + 1, true);
                }
            }
            _ if depth == 0 => return (start + i, false),
            _ => {}
        }
    }
    (buf.len(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` bytes (on char boundaries) and returns all pieces.
    fn feed(syntax: ReplySyntax, text: &str, step: usize) -> (Vec<Piece>, String) {
        let mut s = ReplyStream::new(syntax);
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            out.extend(s.push(&text[i..j]));
            i = j;
        }
        let (rest, reason) = s.finish("stop");
        out.extend(rest);
        (out, reason)
    }

    /// (content, [(id, name, arguments)]) assembled from the pieces as a client does.
    fn assemble(pieces: &[Piece]) -> (String, Vec<(Option<String>, String, String)>) {
        let mut content = String::new();
        let mut calls: Vec<(Option<String>, String, String)> = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(t) => content.push_str(t),
                Piece::CallStart { index, id, name } => {
                    assert_eq!(*index, calls.len(), "calls start in order");
                    calls.push((id.clone(), name.clone(), String::new()));
                }
                Piece::Args { index, text } => calls[*index].2.push_str(text),
            }
        }
        (content, calls)
    }

    #[test]
    fn calls_stream_name_first_then_arguments_in_pieces_for_every_syntax() {
        let args = r#"{"city": "Paris", "opts": {"name": "x}", "n": [1, 2]}}"#;
        for (syntax, text) in [
            (
                ReplySyntax::Generic,
                format!(r#"{{"tool_calls": [{{"name": "get_weather", "arguments": {args}}}, {{"name": "f", "arguments": {{}}}}]}}"#),
            ),
            (
                ReplySyntax::Family(Family::Hermes),
                format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"f\", \"arguments\": {{}}}}\n</tool_call>"),
            ),
        ] {
            for step in [1, 3, 7, 1000] {
                let (pieces, reason) = feed(syntax, &text, step);
                assert_eq!(reason, "tool_calls");
                let (content, calls) = assemble(&pieces);
                assert_eq!(content, "");
                assert_eq!(
                    calls,
                    vec![
                        (None, "get_weather".to_string(), args.to_string()),
                        (None, "f".to_string(), "{}".to_string())
                    ],
                    "{syntax:?} step {step}"
                );
                if step == 1 {
                    // The name goes out before the arguments are complete.
                    let args_pieces = pieces
                        .iter()
                        .filter(|p| matches!(p, Piece::Args { index: 0, .. }))
                        .count();
                    assert!(args_pieces > 10, "{pieces:?}");
                }
            }
        }
        let text = format!(r#"{{"name": "get_weather", "parameters": {args}}}"#);
        let (pieces, reason) = feed(ReplySyntax::Family(Family::Llama3), &text, 2);
        assert_eq!(reason, "tool_calls");
        assert_eq!(
            assemble(&pieces).1,
            vec![(None, "get_weather".to_string(), args.to_string())]
        );
        // Mistral: each call once its id is written, with the model's id.
        let text =
            format!(r#"[{{"name": "get_weather", "arguments": {args}, "id": "abc123XYZ"}}]"#);
        let mut s = ReplyStream::new(ReplySyntax::Family(Family::Mistral));
        let cut = text.find("\"id\"").unwrap();
        assert!(s.push(&text[..cut]).is_empty());
        let pieces = s.push(&text[cut..]);
        assert_eq!(
            assemble(&pieces).1,
            vec![(
                Some("abc123XYZ".to_string()),
                "get_weather".to_string(),
                args.to_string()
            )]
        );
        assert_eq!(s.finish("stop"), (Vec::new(), "tool_calls".to_string()));
    }

    #[test]
    fn text_streams_as_content_once_it_cannot_be_a_call() {
        let mut s = ReplyStream::new(ReplySyntax::Family(Family::Hermes));
        assert!(s.push("<tool").is_empty(), "could still be a call");
        assert_eq!(s.push("s> are"), vec![Piece::Content("<tools> are".into())]);
        assert_eq!(s.push(" fun"), vec![Piece::Content(" fun".into())]);
        assert_eq!(s.finish("length"), (Vec::new(), "length".to_string()));
        // The generic mode's text answer: the string's text, unescaped, as it grows.
        let (pieces, reason) = feed(
            ReplySyntax::Generic,
            r#"{"response": "It is \"sunny\" \u00e9."}"#,
            1,
        );
        assert_eq!(reason, "stop");
        assert_eq!(assemble(&pieces).0, "It is \"sunny\" é.");
        assert!(pieces.len() > 5, "{pieces:?}");
        // A structured answer is sent whole at the end.
        let (pieces, _) = feed(ReplySyntax::Generic, r#"{"response": {"a": 1}}"#, 1);
        assert_eq!(pieces, vec![Piece::Content(r#"{"a": 1}"#.into())]);
        // A call cut by max_tokens: what was streamed stays, the reason is the engine's.
        let (pieces, reason) = feed(
            ReplySyntax::Family(Family::Hermes),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ",
            4,
        );
        assert_eq!(reason, "stop");
        assert_eq!(
            assemble(&pieces).1,
            vec![(None, "f".to_string(), "{\"a\": ".to_string())]
        );
    }
}
