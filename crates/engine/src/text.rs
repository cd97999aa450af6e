//! Incremental detokenisation with stop strings for one request.
//!
//! Owns the bytes generated so far: text is released only once it is whole UTF-8 and cannot be
//! the beginning of a stop string; when a stop string appears, the text before it is released and
//! the request stops. Never sees the model or the scheduler.

/// Per-request text state.
#[derive(Debug, Default)]
pub struct TextTracker {
    stops: Vec<String>,
    pending_bytes: Vec<u8>,
    text: String,
    released: usize,
}

/// What one pushed token produced.
#[derive(Debug, PartialEq, Eq)]
pub struct Pushed {
    /// Newly released text.
    pub text: String,
    /// A stop string matched (the text before it has been released).
    pub stopped: bool,
}

impl TextTracker {
    pub fn new(stops: Vec<String>) -> Self {
        TextTracker {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Default::default()
        }
    }

    /// Adds the bytes of one token.
    pub fn push(&mut self, bytes: &[u8]) -> Pushed {
        self.pending_bytes.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending_bytes) {
            Ok(_) => self.pending_bytes.len(),
            Err(e) if e.error_len().is_some() => {
                // Invalid (not merely incomplete) bytes: replace them rather than stall forever.
                let s = String::from_utf8_lossy(&self.pending_bytes).into_owned();
                self.pending_bytes.clear();
                self.text.push_str(&s);
                return self.release();
            }
            Err(e) => e.valid_up_to(),
        };
        let s = std::str::from_utf8(&self.pending_bytes[..valid]).expect("validated prefix");
        self.text.push_str(s);
        self.pending_bytes.drain(..valid);
        self.release()
    }

    /// Releases whatever is held back (end of generation).
    pub fn finish(&mut self) -> String {
        if !self.pending_bytes.is_empty() {
            let s = String::from_utf8_lossy(&self.pending_bytes).into_owned();
            self.text.push_str(&s);
            self.pending_bytes.clear();
        }
        let out = self.text[self.released..].to_string();
        self.released = self.text.len();
        out
    }

    fn release(&mut self) -> Pushed {
        // Search from a little before the released point: a stop string may straddle it.
        let max_stop = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut from = self.released.saturating_sub(max_stop);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(at) = first_match {
            let at = at.max(self.released);
            let out = self.text[self.released..at].to_string();
            self.released = self.text.len();
            return Pushed {
                text: out,
                stopped: true,
            };
        }
        let hold = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.text[self.released..], s))
            .max()
            .unwrap_or(0);
        let end = self.text.len() - hold;
        let out = self.text[self.released..end].to_string();
        self.released = end;
        Pushed {
            text: out,
            stopped: false,
        }
    }
}

/// Length of the longest proper prefix of `stop` that `text` ends with (on char boundaries).
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let mut t = TextTracker::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let r = t.push(p);
            out.push(r.text);
            if r.stopped {
                return (out, true, String::new());
            }
        }
        let tail = t.finish();
        (out, false, tail)
    }

    #[test]
    fn utf8_split_across_tokens_is_held_back() {
        let euro = "€".as_bytes();
        let (out, stopped, tail) = run(&[], &[b"a", &euro[..1], &euro[1..], b"b"]);
        assert_eq!(out, vec!["a", "", "€", "b"]);
        assert!(!stopped);
        assert_eq!(tail, "");
    }

    #[test]
    fn stop_string_across_tokens_stops_and_is_not_released() {
        let (out, stopped, _) = run(&["STOP"], &[b"hello ", b"ST", b"OP", b"more"]);
        assert_eq!(out.concat(), "hello ");
        assert!(stopped);
    }

    #[test]
    fn partial_stop_prefix_is_released_when_it_diverges() {
        let (out, stopped, tail) = run(&["STOP"], &[b"a ST", b"ART"]);
        assert!(!stopped);
        assert_eq!(out, vec!["a ", "START"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, stopped, _) = run(&["cd", "b"], &[b"abcd"]);
        assert_eq!(out, vec!["a"]);
        assert!(stopped);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let (out, _, _) = run(&[], &[b"\xff", b"x"]);
        assert_eq!(out.concat(), "\u{fffd}x");
    }
}
