//! What one request's output constraint (JSON Schema, regex, choices, Lark or GBNF grammar,
//! tool-call grammar) may cost to compile, and the thread it is compiled on. Every limit is a
//! constant here, documented in docs/security.md; anything over one is refused before the
//! compiler runs, as a 400 naming the limit (`constraint_too_large`).
//!
//! The compiler (llguidance) recurses along chains of rules and `$ref`s, so a 1,000-rule chain
//! overflowed a 2 MiB runtime thread and aborted the process. Compiles run on a thread of their
//! own with [`COMPILE_STACK_BYTES`] of stack — address space only; pages are touched as deep as a
//! compile goes — which the source-size limit keeps out of reach; a panic there is caught and
//! logged under an error id, and a compile that outlives [`COMPILE_TIMEOUT`] is abandoned with a
//! 400. Also holds the two types the constraint modules share: [`OutputFormat`] (what the output
//! must be) and [`GrammarError`] (why it cannot be compiled). Never compiles anything itself
//! (`grammar.rs` does).

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use llguidance::api::ParserLimits;
use serde_json::Value;

/// Largest constraint source: a schema's compact JSON text, a regex, a grammar, or all choices
/// together (OpenAI allows structured-output schemas of about 120,000 characters).
pub const MAX_SOURCE_BYTES: usize = 128 * 1024;

/// Most options of a choice constraint (`guided_choice`, `structured_outputs.choice`).
pub const MAX_CHOICES: usize = 1_000;

/// Largest product of nested counted repetitions in a regex (`a{1000}{1000}` is 1,000,000): the
/// lexer expands them, and a million took over a second per token before failing. RE2 caps a
/// single count at 1,000.
pub const MAX_REPETITION: u64 = 10_000;

/// Stack of a compile thread: the deepest chain that fits in [`MAX_SOURCE_BYTES`] needs a small
/// fraction of it (measured: a 5,000-rule chain, ~80 KiB of Lark).
pub const COMPILE_STACK_BYTES: usize = 256 * 1024 * 1024;

/// Longest a compile may take before the request gets a 400 (the thread is left to finish; the
/// compiler's own fuel limits below end it).
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(2);

/// llguidance's own limits, for compiling and for each token's mask. Its defaults, except
/// fewer lexer states (each costs 1–2 KB: 250,000 of them were half a gigabyte per request) and
/// short errors (an error is shown to the client; it need not repeat their grammar).
pub fn parser_limits() -> ParserLimits {
    ParserLimits {
        max_lexer_states: 50_000,
        max_grammar_size: 200_000,
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// JSON matching the schema (`{"type": "object"}` for `json_object`).
    Json(Value),
    /// A string matching the regular expression (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark-like syntax.
    Lark(String),
}

/// Why a grammar could not be compiled.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum GrammarError {
    /// The client's constraint is not valid, or can produce no output (shown to the client).
    #[error("{0}")]
    Invalid(String),
    /// The constraint is over one of the compile limits (shown to the client, naming it).
    #[error(transparent)]
    Limit(#[from] LimitExceeded),
    /// The compiler itself failed (a panic): `detail` is for the log, never for the client.
    #[error("the grammar compiler failed: {detail}")]
    Failed { detail: String },
}

/// Which limit a constraint is over (the message names it and the constraint's size).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error("the constraint is {bytes} bytes; at most {MAX_SOURCE_BYTES} are allowed")]
    SourceBytes { bytes: usize },
    #[error("{count} choices; at most {MAX_CHOICES} are allowed")]
    Choices { count: usize },
    #[error("the constraint took longer than {COMPILE_TIMEOUT:?} to compile")]
    CompileTime,
    #[error(
        "nested counted repetitions expand to {size} copies; at most {MAX_REPETITION} are allowed"
    )]
    Repetition { size: u64 },
}

/// The cheap checks, before anything is compiled.
pub fn check(format: &OutputFormat) -> Result<(), LimitExceeded> {
    let bytes = match format {
        OutputFormat::Json(schema) => serde_json::to_string(schema).map_or(0, |s| s.len()),
        OutputFormat::Regex(rx) => {
            let size = repetition_size(rx);
            if size > MAX_REPETITION {
                return Err(LimitExceeded::Repetition { size });
            }
            rx.len()
        }
        OutputFormat::Lark(g) => g.len(),
        OutputFormat::Choice(choices) => {
            if choices.len() > MAX_CHOICES {
                return Err(LimitExceeded::Choices {
                    count: choices.len(),
                });
            }
            choices.iter().map(|c| c.len() + 4).sum()
        }
    };
    if bytes > MAX_SOURCE_BYTES {
        return Err(LimitExceeded::SourceBytes { bytes });
    }
    Ok(())
}

/// The largest product of nested counted repetitions in `rx` (1 without any; 1 when `rx` does
/// not parse: the compiler then names the syntax error). Unbounded `*` and `+` count once.
fn repetition_size(rx: &str) -> u64 {
    use regex_syntax::hir::{Hir, HirKind};
    fn size(h: &Hir) -> u64 {
        match h.kind() {
            HirKind::Repetition(r) => {
                let count = u64::from(r.max.unwrap_or(r.min).max(1));
                count.saturating_mul(size(&r.sub))
            }
            HirKind::Capture(c) => size(&c.sub),
            HirKind::Concat(hs) | HirKind::Alternation(hs) => {
                hs.iter().map(size).max().unwrap_or(1)
            }
            _ => 1,
        }
    }
    regex_syntax::ParserBuilder::new()
        .build()
        .parse(rx)
        .map_or(1, |h| size(&h))
}

/// Runs `compile` on a thread with [`COMPILE_STACK_BYTES`] of stack and waits for it at most
/// [`COMPILE_TIMEOUT`]. Inside a multi-threaded Tokio runtime the wait is `block_in_place`, so
/// the runtime's other tasks move to other workers meanwhile. A panic becomes
/// [`GrammarError::Failed`] (a 500 whose body carries only an error id; the message goes to
/// the log).
pub fn isolated<T: Send + 'static>(
    compile: impl FnOnce() -> Result<T, GrammarError> + Send + 'static,
) -> Result<T, GrammarError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("agentkv-grammar".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(move || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(compile));
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        return Err(failed(&format!("cannot start a compile thread: {e}")));
    }
    let wait = || rx.recv_timeout(COMPILE_TIMEOUT);
    let received = match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    };
    match received {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(failed(&format!("grammar compiler panicked: {text}")))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(LimitExceeded::CompileTime.into()),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(failed("the compile thread ended without a result"))
        }
    }
}

/// The compiler's failure (for the log only: it becomes a 500 carrying an error id).
fn failed(detail: &str) -> GrammarError {
    GrammarError::Failed {
        detail: detail.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_counts_are_checked_before_compiling() {
        assert!(check(&OutputFormat::Regex("a".repeat(MAX_SOURCE_BYTES))).is_ok());
        assert_eq!(
            check(&OutputFormat::Lark("a".repeat(MAX_SOURCE_BYTES + 1))),
            Err(LimitExceeded::SourceBytes {
                bytes: MAX_SOURCE_BYTES + 1
            })
        );
        let many: Vec<String> = (0..MAX_CHOICES + 1).map(|i| i.to_string()).collect();
        assert_eq!(
            check(&OutputFormat::Choice(many)),
            Err(LimitExceeded::Choices {
                count: MAX_CHOICES + 1
            })
        );
        assert_eq!(
            check(&OutputFormat::Regex("a{1000}{1000}".into())),
            Err(LimitExceeded::Repetition { size: 1_000_000 })
        );
        assert_eq!(
            check(&OutputFormat::Regex("(x(ab){100}c){101}".into())),
            Err(LimitExceeded::Repetition { size: 10_100 })
        );
        assert!(check(&OutputFormat::Regex("[0-9]{1,100}(-[a-z]+)*".into())).is_ok());
        let long = vec!["x".repeat(MAX_SOURCE_BYTES / 2); 3];
        assert!(matches!(
            check(&OutputFormat::Choice(long)),
            Err(LimitExceeded::SourceBytes { .. })
        ));
    }

    #[test]
    fn a_panic_or_a_deep_recursion_in_a_compile_is_an_error_not_an_abort() {
        let r: Result<(), _> = isolated(|| panic!("boom at /build/path.rs"));
        match r {
            Err(GrammarError::Failed { detail }) => assert!(detail.contains("boom"), "{detail}"),
            other => panic!("{other:?}"),
        }
        // Deeper than a 2 MiB thread's stack holds.
        fn depth(n: u64) -> u64 {
            let pad = std::hint::black_box([n; 64]);
            if n == 0 {
                0
            } else {
                1 + depth(n - 1) + pad[3] - pad[5]
            }
        }
        assert_eq!(isolated(|| Ok(depth(100_000))).unwrap(), 100_000);
    }
}
