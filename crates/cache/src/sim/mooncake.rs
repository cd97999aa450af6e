//! Mooncake's trace format (FAST'25 release, `kvcache-ai/Mooncake`, `FAST25-release/traces/`):
//! one request per line, `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, the
//! remapped hashes of the prompt's 512-token prefix blocks (equal ids: reusable prefix blocks;
//! the last one usually covers a partial block). No tokens, tenants or sessions.
//!
//! Replayed with one simulator token per trace block (block size 1): a request's "tokens" are its
//! hash ids, so hit rates are in trace blocks, the pool is counted in trace blocks, and the
//! simulator's rule that a lookup leaves the last token to compute leaves the last (partial)
//! block uncached, as a server does. Owns the type and the conversion; never reads files.

use serde::{Deserialize, Serialize};

use super::trace::TraceCall;

/// Tokens per block behind Mooncake's hash ids.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// One line of a Mooncake trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MooncakeRequest {
    /// Arrival, ms from the trace start.
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
}

/// A hash id too large for the simulator's token type.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("request {request}: hash id {id} does not fit in 32 bits")]
pub struct HashIdTooLarge {
    pub request: usize,
    pub id: u64,
}

/// The requests as simulator calls: one tenant, no session, one token per trace block.
pub fn mooncake_calls(requests: &[MooncakeRequest]) -> Result<Vec<TraceCall>, HashIdTooLarge> {
    requests
        .iter()
        .enumerate()
        .map(|(request, r)| {
            let tokens = r
                .hash_ids
                .iter()
                .map(|&id| u32::try_from(id).map_err(|_| HashIdTooLarge { request, id }))
                .collect::<Result<Vec<u32>, _>>()?;
            Ok(TraceCall {
                t: r.timestamp as f64 / 1000.0,
                session: String::new(),
                tenant: String::new(),
                tokens,
            })
        })
        .collect()
}

/// A request's prompt as token ids for a live server whose blocks hold `block_tokens` tokens:
/// each hash id becomes one block of ids drawn from a generator seeded by the id (equal ids,
/// equal blocks; ids in `[1000, 40000)`, ordinary tokens of any common vocabulary), the last
/// one cut to the request's partial last block at the same proportion (at least one token).
pub fn mooncake_prompt(request: &MooncakeRequest, block_tokens: usize) -> Vec<u32> {
    let n = request.hash_ids.len();
    let trace_block = u64::from(MOONCAKE_BLOCK_TOKENS);
    let last_len = request
        .input_length
        .saturating_sub(trace_block * n.saturating_sub(1) as u64)
        .clamp(1, trace_block);
    let mut out = Vec::with_capacity(n * block_tokens);
    for (i, &id) in request.hash_ids.iter().enumerate() {
        let len = if i + 1 == n {
            ((last_len * block_tokens as u64).div_ceil(trace_block) as usize).max(1)
        } else {
            block_tokens
        };
        let mut rng = super::rng::SplitMix64::new(id ^ 0x6d6f_6f6e_6361_6b65);
        out.extend((0..len).map(|_| rng.range(1000, 40000) as u32));
    }
    out
}
