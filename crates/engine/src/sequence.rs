//! Per-request state inside the engine: tokens so far, where its K/V lives, its sampler, its text
//! and its event sink. No scheduling decisions here.

use std::time::Instant;

use cache::{NamespaceKey, PrefixMiss, SeqId};
use model::Sampler;

use crate::request::{EngineEvent, EventSender, RequestId, RequestSpec};
use crate::text::TextTracker;

/// One choice of one request: requests with `n > 1` fork into choices `1..n` after the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SeqKey(pub RequestId, pub u32);

pub(crate) struct Sequence {
    pub spec: RequestSpec,
    pub ns: NamespaceKey,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub num_generated: usize,
    /// The cache's block table while the request holds KV (running); `None` while waiting.
    pub cache_seq: Option<SeqId>,
    /// Tokens whose K/V are written (meaningful while `cache_seq` is set).
    pub num_computed: usize,
    pub sampler: Sampler,
    pub text: TextTracker,
    pub sink: EventSender,
    pub arrival: Instant,
    pub admitted_at: Option<Instant>,
    pub first_token_at: Option<Instant>,
    /// Cached prompt tokens at first admission (what `usage.cached_tokens` reports).
    pub cached_tokens: Option<usize>,
    /// Why the cached prefix ended where it did at first admission (`None`: it covered every
    /// full prompt block, or caching is off).
    pub cache_miss: Option<PrefixMiss>,
    pub num_preemptions: u32,
}

impl Sequence {
    pub fn new(spec: RequestSpec, ns: NamespaceKey, sink: EventSender) -> Self {
        Sequence {
            tokens: spec.prompt.clone(),
            sampler: Sampler::new(spec.sampling.clone()),
            text: TextTracker::new(spec.stop_strings.clone()),
            spec,
            ns,
            num_generated: 0,
            cache_seq: None,
            num_computed: 0,
            sink,
            arrival: Instant::now(),
            admitted_at: None,
            first_token_at: None,
            cached_tokens: None,
            cache_miss: None,
            num_preemptions: 0,
        }
    }

    /// Tokens whose K/V still has to be computed.
    pub fn num_pending(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Its reader has fallen [`crate::request::STALL_TOKENS`] behind (never without a reader).
    pub fn is_stalled(&self) -> bool {
        self.spec.reader.as_ref().is_some_and(|r| r.is_stalled())
    }

    /// A decode step: exactly the last sampled token is pending.
    pub fn is_decoding(&self) -> bool {
        self.num_generated > 0 && self.num_pending() == 1
    }

    /// Sends an event; `false` when the receiver is gone (the caller disconnected).
    pub fn send(&self, ev: EngineEvent) -> bool {
        self.sink.send(ev).is_ok()
    }
}
