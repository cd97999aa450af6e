//! Retention for clients that name no session: each finished request is placed in an inferred
//! conversation ([`Conversations`]) and its blocks are retained for that conversation — one
//! retention per conversation, replaced turn by turn — until the conversation's learned return
//! time ([`ReturnModel`]) has passed. The server and `cache-sim` both run exactly this.
//!
//! Retention stays the cache's soft bias under its cap (`max_retained_fraction`, per-tenant
//! retained quotas): when the cap is reached, a new turn's blocks are refused rather than
//! displacing conversations already retained (first come, kept for the whole TTL — under
//! pressure that serves some conversations fully instead of thrashing all of them). With
//! `displace` on (off by default: measured mixed, docs/history/benchmarks-log.md), a new turn
//! instead displaces the retained conversations worth less than it
//! ([`ReturnModel::retention_value`]: the chance to be continued at its depth, fading as the gap
//! grows past the learned gaps, over the mean wait for that return), least worth first. Named
//! sessions and `cache_control` take precedence: [`InferredRetainer::make_room`] releases inferred
//! conversations, oldest retention first, when an explicit retention needs the room.
//!
//! Owns the conversation index, the return model and the list of retentions it holds; never
//! evicts, never reads a clock.

use std::collections::{BTreeSet, HashMap};

use crate::conversation::{ConversationConfig, Conversations, FinishedRequest, Turn, TurnKind};
use crate::error::RetainError;
use crate::ids::{ConversationId, SeqId, SessionId, TenantId, Tick};
use crate::key::BlockKey;
use crate::return_model::{ReturnModel, ReturnModelConfig};
use crate::KvCache;

/// Session ids of inferred conversations carry these bits (named sessions and tool pauses are
/// hashes; a collision needs 62 equal bits).
const INFERRED_SESSION_BITS: u64 = 0b11 << 62;

/// The inferred-conversation policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct InferredConfig {
    pub conversations: ConversationConfig,
    pub return_model: ReturnModelConfig,
    /// Whether a new turn displaces retained conversations worth less than it (else it is
    /// refused when the cap is reached).
    pub displace: bool,
}

/// What [`InferredRetainer::on_finish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InferredTurn {
    pub turn: Turn,
    pub session: SessionId,
    pub ttl_ms: u64,
    pub retained_blocks: u32,
    pub refused_blocks: u32,
}

/// Counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InferredCounters {
    pub turns: u64,
    pub continuations: u64,
    pub branches: u64,
    /// Inferred retentions released early to make room for named sessions or breakpoints.
    pub released_for_explicit: u64,
    /// Inferred retentions released early for a turn worth more (`displace`).
    pub displaced: u64,
}

/// The policy (see the module docs).
#[derive(Debug)]
pub struct InferredRetainer {
    index: Conversations,
    returns: ReturnModel,
    displace: bool,
    /// Retentions held, by the tick they were made (oldest first), and the reverse map (with
    /// the turn's index).
    held: BTreeSet<(Tick, ConversationId)>,
    held_at: HashMap<ConversationId, (Tick, u32)>,
    counters: InferredCounters,
}

/// The session that holds an inferred conversation's retention.
pub fn inferred_session(conversation: ConversationId) -> SessionId {
    SessionId(conversation.0 | INFERRED_SESSION_BITS)
}

impl InferredRetainer {
    pub fn new(config: InferredConfig) -> InferredRetainer {
        InferredRetainer {
            index: Conversations::new(config.conversations),
            returns: ReturnModel::new(config.return_model),
            displace: config.displace,
            held: BTreeSet::new(),
            held_at: HashMap::new(),
            counters: InferredCounters::default(),
        }
    }

    /// Places a finished request in its conversation (the return model learns from it)
    /// without retaining anything.
    pub fn place(&mut self, req: FinishedRequest<'_>) -> Turn {
        let turn = self.index.observe(req);
        self.counters.turns += 1;
        self.returns.observe_turn(turn.index);
        match turn.kind {
            TurnKind::Continue { gap_ms } => {
                self.returns.observe_gap(gap_ms);
                self.counters.continuations += 1;
            }
            TurnKind::Branch { .. } => self.counters.branches += 1,
            TurnKind::Start => {}
        }
        turn
    }

    /// A request of `req.tenant` finished with its blocks in `seq` (still allocated): place it
    /// and retain the sequence's published blocks for its conversation with `priority`; forget
    /// the retentions that ended in the cache meanwhile.
    pub fn on_finish(
        &mut self,
        cache: &mut KvCache,
        req: FinishedRequest<'_>,
        seq: SeqId,
        priority: u8,
    ) -> Result<InferredTurn, RetainError> {
        let turn = self.place(req);
        let ttl_ms = self.returns.ttl_ms();
        let session = inferred_session(turn.conversation);
        let until = Tick(req.now.0.saturating_add(ttl_ms));
        self.forget(turn.conversation);
        let mut out = cache.retain_session(session, seq, until, priority, req.now)?;
        if out.refused_blocks > 0 && self.displace {
            let p = self.returns.retention_value(turn.index, 0);
            if self.displace_below(cache, p, out.refused_blocks, req.now) > 0 {
                out = cache.retain_session(session, seq, until, priority, req.now)?;
            }
        }
        if out.retained_blocks > 0 {
            self.held.insert((req.now, turn.conversation));
            self.held_at
                .insert(turn.conversation, (req.now, turn.index));
        } else {
            let _ = cache.release_session(session);
        }
        self.prune(cache);
        Ok(InferredTurn {
            turn,
            session,
            ttl_ms,
            retained_blocks: out.retained_blocks,
            refused_blocks: out.refused_blocks,
        })
    }

    fn forget(&mut self, conversation: ConversationId) {
        if let Some((at, _)) = self.held_at.remove(&conversation) {
            self.held.remove(&(at, conversation));
        }
    }

    /// Releases held retentions worth less than `p` at `now` (per block and millisecond), least first,
    /// until the cache's retention cap has room for `blocks` more. Returns how many.
    fn displace_below(&mut self, cache: &mut KvCache, p: f64, blocks: u32, now: Tick) -> usize {
        self.prune(cache);
        let mut ranked: Vec<(f64, Tick, ConversationId)> = (self.held_at.iter())
            .map(|(&c, &(at, index))| {
                let elapsed = now.0.saturating_sub(at.0);
                (self.returns.retention_value(index, elapsed), at, c)
            })
            .filter(|&(q, _, _)| q < p)
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut released = 0;
        for (_, _, c) in ranked {
            if cache.retention_headroom() >= blocks {
                break;
            }
            self.forget(c);
            if cache.release_session(inferred_session(c)).is_ok() {
                released += 1;
            }
        }
        self.counters.displaced += released as u64;
        released
    }

    /// The conversation whose registered end is the deepest on `prompt_chain` (a tool pause
    /// retains under its session), if any.
    pub fn conversation_of(
        &self,
        tenant: TenantId,
        prompt_chain: &[BlockKey],
    ) -> Option<ConversationId> {
        self.index.lookup(tenant, prompt_chain).map(|(c, _)| c)
    }

    /// Releases inferred retentions, oldest first, until the cache's retention cap has room
    /// for `blocks` more (or none is left). Returns how many were released.
    pub fn make_room(&mut self, cache: &mut KvCache, blocks: u32) -> usize {
        let mut released = 0;
        while cache.retention_headroom() < blocks {
            let Some((_, conversation)) = self.held.pop_first() else {
                break;
            };
            self.held_at.remove(&conversation);
            if cache
                .release_session(inferred_session(conversation))
                .is_ok()
            {
                released += 1;
            }
        }
        self.counters.released_for_explicit += released as u64;
        released
    }

    /// Drops the records of retentions that ended in the cache (expired or released there).
    pub fn prune(&mut self, cache: &KvCache) {
        let gone: Vec<(Tick, ConversationId)> = (self.held.iter())
            .filter(|(_, c)| cache.session(inferred_session(*c)).is_none())
            .copied()
            .collect();
        for (at, c) in gone {
            self.held.remove(&(at, c));
            self.held_at.remove(&c);
        }
    }

    /// The TTL a turn finishing now would get (ms).
    pub fn ttl_ms(&self) -> u64 {
        self.returns.ttl_ms()
    }

    /// The bonus reuse-aware LRU should give blocks read twice: the learned return time, 0
    /// (plain LRU) until enough returns were seen to learn it.
    pub fn reuse_bonus_ms(&self) -> u64 {
        self.returns.learned_ttl_ms().unwrap_or(0)
    }

    pub fn counters(&self) -> InferredCounters {
        self.counters
    }

    /// Conversations currently known to the index.
    pub fn num_conversations(&self) -> usize {
        self.index.num_conversations()
    }

    /// The index's invariants, and that every held retention is recorded both ways.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.index.check_invariants()?;
        if self.held.len() != self.held_at.len()
            || !(self.held.iter()).all(|(at, c)| self.held_at.get(c).map(|h| h.0) == Some(*at))
        {
            return Err("inferred retentions recorded inconsistently".into());
        }
        Ok(())
    }
}
