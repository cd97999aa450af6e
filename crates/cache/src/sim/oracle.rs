//! The "sessions known" reference for traces that name none: conversations inferred over the
//! whole trace by the same rule as the server's ([`crate::Conversations`]; a block is a call's
//! own when no earlier call had it), written back as session names, so the named-session policy
//! can replay them — and, knowing each conversation's last call, release it there. That is
//! knowledge of the future: a reference to measure the online policy against, not a policy.

use std::collections::{HashMap, HashSet};

use super::trace::TraceCall;
use crate::conversation::{ConversationConfig, Conversations, FinishedRequest};
use crate::ids::{TenantId, Tick};
use crate::key::{chain_keys, BlockKey, Namespace};

/// `calls` with every session named by its inferred conversation (`c<id>`).
pub fn label_conversations(calls: &[TraceCall], block_size: u32) -> Vec<TraceCall> {
    let bs = block_size.max(1) as usize;
    let mut index = Conversations::new(ConversationConfig {
        max_ends_per_tenant: usize::MAX,
    });
    let mut tenants: HashMap<&str, (TenantId, crate::key::NamespaceKey)> = HashMap::new();
    let mut seen: HashSet<BlockKey> = HashSet::new();
    calls
        .iter()
        .map(|c| {
            let next = TenantId(tenants.len() as u32);
            let (tenant, ns) = *tenants
                .entry(c.tenant.as_str())
                .or_insert_with(|| (next, Namespace::for_tenant(next).key()));
            let full = c.tokens.len().saturating_sub(1) / bs;
            let chain = chain_keys(&ns, &c.tokens, bs, full);
            let first_own_block = chain.iter().take_while(|k| seen.contains(*k)).count();
            seen.extend(chain.iter().copied());
            let turn = index.observe(FinishedRequest {
                tenant,
                chain: &chain,
                prompt_blocks: full,
                first_own_block,
                now: Tick((c.t.max(0.0) * 1000.0) as u64),
            });
            TraceCall {
                session: format!("c{}", turn.conversation.0),
                ..c.clone()
            }
        })
        .collect()
}
