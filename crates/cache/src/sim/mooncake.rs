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
