//! Incremental server-sent-events decoder: bytes in, complete event `data` payloads out. Handles
//! `\n`, `\r\n` and `\r` line ends, multi-line data, comments and chunk boundaries anywhere
//! (including inside a UTF-8 character). Knows nothing about OpenAI's JSON.

/// Feed it the body's byte chunks in order with [`SseDecoder::push`].
#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    data: Option<String>,
    last_was_cr: bool,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes `bytes`; returns the data of every event completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            match b {
                b'\n' if self.last_was_cr => self.last_was_cr = false,
                b'\n' | b'\r' => {
                    self.last_was_cr = b == b'\r';
                    let line = std::mem::take(&mut self.pending);
                    self.line(&String::from_utf8_lossy(&line), &mut events);
                }
                _ => {
                    self.last_was_cr = false;
                    self.pending.push(b);
                }
            }
        }
        events
    }

    /// Flushes an event left unterminated when the body ended.
    pub fn finish(&mut self) -> Option<String> {
        let mut events = Vec::new();
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.line(&String::from_utf8_lossy(&line), &mut events);
        }
        self.line("", &mut events);
        events.pop()
    }

    fn line(&mut self, line: &str, events: &mut Vec<String>) {
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                events.push(d);
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_arbitrary_chunks() {
        let body =
            "data: {\"a\":1}\n\n: comment\r\ndata: x\r\ndata: é\r\n\r\nevent: e\ndata:[DONE]\n\n";
        let want = vec!["{\"a\":1}".to_string(), "x\né".into(), "[DONE]".into()];
        for chunk in 1..body.len() {
            let mut d = SseDecoder::new();
            let mut got = Vec::new();
            for part in body.as_bytes().chunks(chunk) {
                got.extend(d.push(part));
            }
            assert_eq!(got, want, "chunk size {chunk}");
            assert_eq!(d.finish(), None);
        }
    }

    #[test]
    fn unterminated_event_is_flushed() {
        let mut d = SseDecoder::new();
        assert!(d.push(b"data: tail").is_empty());
        assert_eq!(d.finish().as_deref(), Some("tail"));
    }
}
