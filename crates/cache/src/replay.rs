//! One request's bookkeeping as the engine does it, without K/V: look up the prompt's cached
//! prefix, allocate the rest, publish every full block written. Shared by the simulator and the
//! policy duel's shadow caches; never frees the sequence (the caller retains, then frees).

use crate::error::SeqError;
use crate::ids::{SeqId, Tick};
use crate::key::NamespaceKey;
use crate::KvCache;

/// Looks `prompt` up in `ns`, then computes and publishes `tokens` (the prompt and the generated
/// tokens written; the prompt alone when shorter than the cached prefix). Returns the cached
/// prompt tokens and the still-allocated sequence; on failure the sequence is freed.
pub(crate) fn compute(
    cache: &mut KvCache,
    ns: &NamespaceKey,
    prompt: &[u32],
    tokens: &[u32],
    now: Tick,
) -> Result<(usize, SeqId), SeqError> {
    let m = cache.lookup(ns, prompt, now);
    let cached = m.num_cached_tokens();
    let seq = cache.create_sequence(m)?;
    let tokens = if tokens.len() < cached {
        prompt
    } else {
        tokens
    };
    let written = cache
        .append_tokens(seq, &tokens[cached..], now)
        .and_then(|_| cache.mark_written(seq, tokens.len(), now));
    match written {
        Ok(_) => Ok((cached, seq)),
        Err(e) => {
            let _ = cache.free(seq, now);
            Err(e)
        }
    }
}
