//! What a caller asks of the engine and what it gets back: [`RequestSpec`] in, a stream of
//! [`EngineEvent`]s out. Plain data; no scheduling here.

use std::time::Duration;

use cache::TenantId;
use model::SamplingParams;

/// Where a request's events go. Unbounded so the engine never blocks on a slow client; a
/// dropped receiver cancels the request at its next token.
pub type EventSender = tokio::sync::mpsc::UnboundedSender<EngineEvent>;
/// The receiving end of a request's events (`recv().await`, or `blocking_recv()` off-runtime).
pub type EventReceiver = tokio::sync::mpsc::UnboundedReceiver<EngineEvent>;

/// Engine-assigned request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// One generation request over already-tokenised input.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// End-of-turn tokens are suppressed until this many tokens were generated.
    pub min_tokens: usize,
    /// Extra token ids that end generation (reported, like end-of-turn).
    pub stop_token_ids: Vec<u32>,
    /// Generation ends when the text contains one of these; the match is not returned.
    pub stop_strings: Vec<String>,
    /// Keep generating past end-of-turn tokens.
    pub ignore_eos: bool,
    /// Tenant whose cache namespace the request reads and fills.
    pub tenant: TenantId,
    /// Server-side salt of the tenant (plus any request salt that narrows sharing).
    pub cache_salt: Vec<u8>,
    /// Number of choices: the prompt is computed once, then forked (its blocks shared).
    pub n: usize,
    /// Keep this request's KV after it finishes (an agent waiting on a tool call).
    pub retention: Option<Retention>,
    /// `cache_control` breakpoints inside the prompt: each retains the prompt's prefix up to it.
    pub breakpoints: Vec<Breakpoint>,
    /// Scheduling priority, vLLM's convention: lower is more important (default 0), within
    /// [`MIN_PRIORITY`, `MAX_PRIORITY`]. Waiting requests are admitted by (priority, arrival);
    /// a decode out of blocks preempts the least important running request (the newest among
    /// equals). Retention made for the request should carry [`retention_rank`] of it.
    pub priority: i32,
    /// How far the request's reader is (`None`: not tracked, always decoded). A request whose
    /// reader is [`STALL_TOKENS`] or more tokens behind is not decoded, is the first to be
    /// preempted and is not readmitted until its reader catches up: a client that stops
    /// reading a stream stops holding compute, slots and blocks others wait for.
    pub reader: Option<std::sync::Arc<ReadProgress>>,
}

/// Tokens a request's reader may fall behind before the request stalls. The server's own
/// buffers (hyper's, the socket's) hold a few dozen more events before it stops reading, so a
/// reading client is never this far behind; a stalled request resumes when its reader catches
/// up.
pub const STALL_TOKENS: u64 = 32;

/// Tokens sent to a request's event channel and taken off it by its reader.
#[derive(Debug, Default)]
pub struct ReadProgress {
    sent: std::sync::atomic::AtomicU64,
    read: std::sync::atomic::AtomicU64,
}

impl ReadProgress {
    /// The engine sent one more token event.
    pub fn note_sent(&self) {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The reader took one token event off the channel.
    pub fn note_read(&self) {
        self.read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Token events sent and not yet read.
    pub fn behind(&self) -> u64 {
        let read = self.read.load(std::sync::atomic::Ordering::Relaxed);
        let sent = self.sent.load(std::sync::atomic::Ordering::Relaxed);
        sent.saturating_sub(read)
    }

    /// The reader is [`STALL_TOKENS`] or more behind.
    pub fn is_stalled(&self) -> bool {
        self.behind() >= STALL_TOKENS
    }
}

/// Most important request priority.
pub const MIN_PRIORITY: i32 = -63;
/// Least important request priority.
pub const MAX_PRIORITY: i32 = 63;

/// The cache's retention rank (`Retention::priority`: higher survives longer among retained
/// blocks) for a request of `priority` (vLLM's convention, clamped to
/// [`MIN_PRIORITY`, `MAX_PRIORITY`]); `explicit` (a `cache_control` breakpoint) ranks just above
/// implicit retention (a session key, a tool pause) of the same priority. In 2..=255.
pub fn retention_rank(priority: i32, explicit: bool) -> u8 {
    let importance = 64 - priority.clamp(MIN_PRIORITY, MAX_PRIORITY); // 1..=127
    (importance * 2 + i32::from(explicit)) as u8
}

/// The request priority a retention rank was made from ([`retention_rank`]'s inverse).
pub fn priority_of_rank(rank: u8) -> i32 {
    64 - i32::from(rank / 2)
}

/// A breakpoint inside the prompt: its prefix of `prefix_tokens` tokens (whole blocks of it) is
/// retained like a session's blocks (the session is usually named by the prefix itself, so a
/// later call with the same prefix refreshes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breakpoint {
    pub retention: Retention,
    pub prefix_tokens: usize,
}

/// Soft retention of a finished request's blocks for its agent session: they are passed over by
/// eviction while other candidates exist, until `ttl` elapses (capped by the cache's retained
/// budget, so allocation always succeeds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    pub session: cache::SessionId,
    pub ttl: std::time::Duration,
    /// Higher survives longer among retained blocks: [`retention_rank`] of the request's
    /// priority.
    pub priority: u8,
}

impl RequestSpec {
    /// A greedy request with defaults for everything else, reporting each token's logprob
    /// (callers that build their own `sampling`, as the server does, decide that themselves).
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        RequestSpec {
            prompt,
            sampling: SamplingParams {
                logprobs: true,
                ..SamplingParams::default()
            },
            max_tokens,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            ignore_eos: false,
            tenant: TenantId::default(),
            cache_salt: Vec::new(),
            n: 1,
            retention: None,
            breakpoints: Vec::new(),
            priority: 0,
            reader: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_ranks_order_by_priority_then_explicitness_and_invert() {
        let mut last = None;
        for p in (MIN_PRIORITY..=MAX_PRIORITY).rev() {
            for explicit in [false, true] {
                let r = retention_rank(p, explicit);
                assert!(last.is_none_or(|l| r > l), "{p} {explicit}");
                assert_eq!(priority_of_rank(r), p);
                last = Some(r);
            }
        }
        assert_eq!(retention_rank(0, false), 128);
        assert_eq!(retention_rank(-1000, true), 255);
        assert_eq!(retention_rank(1000, false), 2);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-turn token, stop token id or stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// The caller cancelled.
    Cancelled,
}

/// Token accounting of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache at first admission.
    pub cached_tokens: usize,
    /// Why the cached prefix ended where it did (first admission; `None` when every full prompt
    /// block was cached, or caching is off).
    pub cache_miss: Option<cache::PrefixMiss>,
    /// Tokens (whole blocks) this request newly retained for its session and breakpoints:
    /// retained now and not held by their previous retention. 0 without
    /// [`RequestSpec::retention`] or [`RequestSpec::breakpoints`].
    pub retained_tokens: usize,
}

/// A session's retention as the engine reports it (`GET /v1/sessions/{id}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Retained tokens (whole blocks) in the active pool.
    pub tokens: usize,
    pub blocks: u32,
    /// Time until the retention ends.
    pub ttl_left: Duration,
    pub priority: u8,
    /// Where the blocks the session retained but lost to eviction since are now.
    pub evicted: EvictedBlocks,
}

/// A session's retained blocks that were evicted from the active pool, by where they are now
/// (each block counted once, in the first place holding it: the pool, then the tiers in lookup
/// order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvictedBlocks {
    /// Cached in the active pool again (loaded back or recomputed by a request), unretained.
    pub in_pool: u32,
    /// Held by a storage tier: blocks per tier, in lookup order.
    pub in_tiers: Vec<(tier::TierKind, u32)>,
    /// Held nowhere (no tiers, not demoted, or dropped by the tier); for a released session
    /// (`DELETE`) every evicted block not in the pool is counted here, unlocated.
    pub lost: u32,
}

impl EvictedBlocks {
    /// Evicted blocks in all.
    pub fn total(&self) -> u32 {
        self.in_pool + self.in_tiers.iter().map(|(_, n)| n).sum::<u32>() + self.lost
    }
}

/// A session found by [`crate::EngineCore::session`]: what the active pool says, plus the tier
/// keys of its evicted blocks still to be located ([`crate::EngineCore::locate_session`]).
#[derive(Debug, Clone)]
pub struct SessionQuery {
    pub info: SessionInfo,
    pub(crate) to_locate: Vec<tier::TierKey>,
}

#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// Arrival to first token.
    pub ttft: Duration,
    /// Arrival to admission.
    pub queue: Duration,
    /// Arrival to finish.
    pub total: Duration,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Which choice (0..n) this token belongs to.
    pub choice: u32,
    pub id: u32,
    /// Text this token completes (may be empty while a UTF-8 character or a possible stop string
    /// is incomplete).
    pub text: String,
    pub logprob: f32,
    pub top_logprobs: Vec<(u32, f32)>,
}

#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// The request got KV blocks; `cached_tokens` of its prompt were reused.
    Admitted {
        cached_tokens: usize,
    },
    Token(TokenEvent),
    /// Text released at the end (held back until then: an incomplete character or stop prefix).
    Text {
        choice: u32,
        text: String,
    },
    /// One choice ended; a request with `n` choices sends `n` of these. `usage.completion_tokens`
    /// counts this choice only.
    Finished {
        choice: u32,
        reason: FinishReason,
        usage: Usage,
        timings: Timings,
        num_preemptions: u32,
    },
    Error(crate::EngineError),
}
