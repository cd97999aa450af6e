//! The Prometheus text format's one rule both `/metrics` renderings (`metrics.rs` and
//! `metrics_compat.rs`) share: how a label value is escaped. Owns nothing else.

/// Escapes a label value (`\`, `"`, newline).
pub(crate) fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(super::escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }
}
