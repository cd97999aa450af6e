//! Conversations inferred from prefix continuation, for clients that send no session id.
//!
//! A finished request registers the key of its last full *own* block — the last block of its
//! prompt and the last block of its prompt plus generated tokens, each only when the request
//! computed that block itself rather than finding it cached. A later request of the same tenant
//! whose prompt passes through such a key continues that request's conversation: the earlier
//! prompt (and, where the template reproduced them, its generated tokens) is a prefix of it.
//!
//! - **Continue**: the key belongs to the conversation's latest turn; the request becomes the
//!   latest turn (the gap since the latest turn is reported, for [`crate::ReturnModel`]).
//! - **Branch**: the key belongs to an earlier turn (history edited, an answer regenerated, a
//!   fork of one agent's context): a new conversation, its turn index carried on.
//! - **Start**: no key matches.
//!
//! The "own block" rule keeps a shared prefix from joining conversations: a request whose full
//! blocks were all cached already (a system prompt and a short question) registers nothing, so
//! every agent behind the same system prompt is not taken for one conversation. Keys are chained
//! from the namespace root (tenant and salt), and each entry also records its tenant, so two
//! tenants with the same prompt are never joined.
//!
//! Bounded: at most `max_ends_per_tenant` keys per tenant, oldest registration dropped first; a
//! conversation without keys is forgotten. Owns only this index; never touches blocks, retention
//! or a clock (times are [`Tick`]s in milliseconds, passed in).

use std::collections::{HashMap, VecDeque};

use crate::ids::{ConversationId, TenantId, Tick};
use crate::key::BlockKey;

/// Bounds of the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConversationConfig {
    /// Registered keys kept per tenant (two per request at most).
    pub max_ends_per_tenant: usize,
}

impl Default for ConversationConfig {
    fn default() -> Self {
        ConversationConfig {
            max_ends_per_tenant: 8192,
        }
    }
}

/// How a request relates to earlier ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnKind {
    /// No earlier request's own prefix is a prefix of this one.
    Start,
    /// Continues the conversation's latest turn, `gap_ms` after that turn finished.
    Continue { gap_ms: u64 },
    /// Continues an earlier turn of `from` (not its latest): a new conversation.
    Branch { from: ConversationId },
}

/// The inferred place of one finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turn {
    pub conversation: ConversationId,
    pub kind: TurnKind,
    /// Turns before this one along its history (0 for a start).
    pub index: u32,
}

/// What a finished request tells the index.
#[derive(Clone, Copy, Debug)]
pub struct FinishedRequest<'a> {
    pub tenant: TenantId,
    /// Keys of the request's full blocks, prompt then generated tokens, in chain order.
    pub chain: &'a [BlockKey],
    /// How many of `chain` are the prompt's.
    pub prompt_blocks: usize,
    /// Index in `chain` of the first block this request computed (the ones before were cached).
    pub first_own_block: usize,
    pub now: Tick,
}

#[derive(Clone, Copy, Debug)]
struct End {
    tenant: TenantId,
    conversation: ConversationId,
    /// Serial of the turn that registered it.
    turn: u64,
    /// Turn index of that turn.
    index: u32,
    /// Registration serial (the per-tenant bound drops the smallest).
    serial: u64,
}

#[derive(Clone, Copy, Debug)]
struct Conversation {
    tenant: TenantId,
    latest_turn: u64,
    latest_at: Tick,
    /// Keys registered for it.
    num_ends: usize,
}

/// The index of inferred conversations (see the module docs).
#[derive(Debug, Default)]
pub struct Conversations {
    config: ConversationConfig,
    ends: HashMap<BlockKey, End>,
    /// Registrations per tenant, oldest first; entries whose serial no longer matches are stale.
    order: HashMap<TenantId, VecDeque<(u64, BlockKey)>>,
    live_per_tenant: HashMap<TenantId, usize>,
    conversations: HashMap<ConversationId, Conversation>,
    next_conversation: u64,
    next_turn: u64,
    next_serial: u64,
}

impl Conversations {
    pub fn new(config: ConversationConfig) -> Conversations {
        Conversations {
            config,
            ..Conversations::default()
        }
    }

    /// The conversation whose registered key is the deepest on `prompt_chain` (same tenant), and
    /// whether that key is its latest turn's. Read-only.
    pub fn lookup(
        &self,
        tenant: TenantId,
        prompt_chain: &[BlockKey],
    ) -> Option<(ConversationId, bool)> {
        let end = self.deepest_end(tenant, prompt_chain)?;
        let latest = self
            .conversations
            .get(&end.conversation)
            .is_some_and(|c| c.latest_turn == end.turn);
        Some((end.conversation, latest))
    }

    fn deepest_end(&self, tenant: TenantId, prompt_chain: &[BlockKey]) -> Option<End> {
        prompt_chain
            .iter()
            .rev()
            .filter_map(|k| self.ends.get(k))
            .find(|e| e.tenant == tenant)
            .copied()
    }

    /// Places a finished request and registers its own ends.
    pub fn observe(&mut self, req: FinishedRequest<'_>) -> Turn {
        let prompt_blocks = req.prompt_blocks.min(req.chain.len());
        let parent = self.deepest_end(req.tenant, &req.chain[..prompt_blocks]);
        let serial = self.next_turn;
        self.next_turn += 1;
        let continued = parent.and_then(|end| {
            let c = self.conversations.get_mut(&end.conversation)?;
            (c.latest_turn == end.turn).then(|| {
                let gap_ms = req.now.0.saturating_sub(c.latest_at.0);
                c.latest_turn = serial;
                c.latest_at = req.now;
                (end, gap_ms)
            })
        });
        let turn = match (parent, continued) {
            (Some(end), Some((_, gap_ms))) => Turn {
                conversation: end.conversation,
                kind: TurnKind::Continue { gap_ms },
                index: end.index + 1,
            },
            (parent, _) => {
                let conversation = ConversationId(self.next_conversation);
                self.next_conversation += 1;
                self.conversations.insert(
                    conversation,
                    Conversation {
                        tenant: req.tenant,
                        latest_turn: serial,
                        latest_at: req.now,
                        num_ends: 0,
                    },
                );
                match parent {
                    Some(end) => Turn {
                        conversation,
                        kind: TurnKind::Branch {
                            from: end.conversation,
                        },
                        index: end.index + 1,
                    },
                    None => Turn {
                        conversation,
                        kind: TurnKind::Start,
                        index: 0,
                    },
                }
            }
        };
        let own = |i: usize| i >= req.first_own_block;
        if prompt_blocks > 0 && own(prompt_blocks - 1) {
            self.register(req.tenant, req.chain[prompt_blocks - 1], turn, serial);
        }
        if req.chain.len() > prompt_blocks && own(req.chain.len() - 1) {
            self.register(req.tenant, req.chain[req.chain.len() - 1], turn, serial);
        }
        if self
            .conversations
            .get(&turn.conversation)
            .is_some_and(|c| c.num_ends == 0 && c.latest_turn == serial)
            && !matches!(turn.kind, TurnKind::Continue { .. })
        {
            // Nothing of it can ever be continued: do not keep it.
            self.conversations.remove(&turn.conversation);
        }
        turn
    }

    fn register(&mut self, tenant: TenantId, key: BlockKey, turn: Turn, serial: u64) {
        let reg = self.next_serial;
        self.next_serial += 1;
        if let Some(c) = self.conversations.get_mut(&turn.conversation) {
            c.num_ends += 1;
        }
        *self.live_per_tenant.entry(tenant).or_default() += 1;
        let end = End {
            tenant,
            conversation: turn.conversation,
            turn: serial,
            index: turn.index,
            serial: reg,
        };
        if let Some(old) = self.ends.insert(key, end) {
            self.forget(old);
        }
        self.order.entry(tenant).or_default().push_back((reg, key));
        while self.live_per_tenant[&tenant] > self.config.max_ends_per_tenant {
            let Some((old, k)) = self.order.get_mut(&tenant).and_then(|o| o.pop_front()) else {
                break;
            };
            if self.ends.get(&k).is_some_and(|e| e.serial == old) {
                self.unregister(&k);
            }
        }
        // Stale registrations (overwritten keys) are dropped lazily; keep the queue bounded.
        let live = self.live_per_tenant[&tenant];
        let order = self.order.entry(tenant).or_default();
        if order.len() > 2 * live + 64 {
            let ends = &self.ends;
            order.retain(|(s, k)| ends.get(k).is_some_and(|e| e.serial == *s));
        }
    }

    fn unregister(&mut self, key: &BlockKey) {
        if let Some(old) = self.ends.remove(key) {
            self.forget(old);
        }
    }

    /// Takes a removed key off its tenant's and conversation's counts.
    fn forget(&mut self, old: End) {
        if let Some(n) = self.live_per_tenant.get_mut(&old.tenant) {
            *n -= 1;
        }
        if let Some(c) = self.conversations.get_mut(&old.conversation) {
            c.num_ends -= 1;
            if c.num_ends == 0 {
                self.conversations.remove(&old.conversation);
            }
        }
    }

    /// Conversations known (each with at least one registered key, or the one just placed).
    pub fn num_conversations(&self) -> usize {
        self.conversations.len()
    }

    /// Registered keys.
    pub fn num_ends(&self) -> usize {
        self.ends.len()
    }

    /// The index's invariants: every key's conversation is known and of the key's tenant; each
    /// conversation's key count matches; per-tenant counts match and stay within the bound;
    /// every live key is in its tenant's registration queue.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut per_conv: HashMap<ConversationId, usize> = HashMap::new();
        let mut per_tenant: HashMap<TenantId, usize> = HashMap::new();
        for (k, e) in &self.ends {
            let c = self
                .conversations
                .get(&e.conversation)
                .ok_or_else(|| format!("key of unknown conversation {:?}", e.conversation))?;
            if c.tenant != e.tenant {
                return Err(format!("{:?} joins tenants", e.conversation));
            }
            *per_conv.entry(e.conversation).or_default() += 1;
            *per_tenant.entry(e.tenant).or_default() += 1;
            let queued = self
                .order
                .get(&e.tenant)
                .is_some_and(|o| o.iter().any(|(s, q)| *s == e.serial && q == k));
            if !queued {
                return Err(format!("key of {:?} not in its tenant's queue", e.tenant));
            }
        }
        for (id, c) in &self.conversations {
            let n = per_conv.get(id).copied().unwrap_or(0);
            if n != c.num_ends {
                return Err(format!("{id:?} counts {} keys, has {n}", c.num_ends));
            }
        }
        for (t, n) in &self.live_per_tenant {
            if per_tenant.get(t).copied().unwrap_or(0) != *n {
                return Err(format!("tenant {t} counts {n} keys"));
            }
            if *n > self.config.max_ends_per_tenant {
                return Err(format!("tenant {t} holds {n} keys, over the bound"));
            }
        }
        Ok(())
    }
}
