//! Public ids of completions, responses and tool calls: 128 random-looking bits (a counter
//! hashed under a per-process random SipHash key), so an id reveals neither how many requests the
//! server has handled nor which came before another, and cannot be guessed from another id.
//! Never an engine id (those are sequential and stay internal).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// 32 hex digits, unique within the process.
pub fn public_id() -> String {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let key = KEY.get_or_init(RandomState::new);
    format!(
        "{:016x}{:016x}",
        key.hash_one((n, 0u8)),
        key.hash_one((n, 1u8))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_not_sequential() {
        let ids: Vec<String> = (0..1000).map(|_| public_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
        assert!(ids.iter().all(|i| i.len() == 32));
        // Consecutive ids share no long prefix (a counter would share all but the last digits).
        let shared = ids
            .windows(2)
            .filter(|w| {
                w[0].chars()
                    .zip(w[1].chars())
                    .take_while(|(a, b)| a == b)
                    .count()
                    >= 4
            })
            .count();
        assert!(shared < 5, "{shared}");
    }
}
