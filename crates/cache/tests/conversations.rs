//! Conversation inference: golden cases (continuation, branch, edited history, shared system
//! prompt, tenants, generated tokens, the bound) and seeded random request streams against a
//! naive reference that rescans every earlier request.

use cache::key::{chain_keys, Namespace};
use cache::{
    BlockKey, ConversationConfig, ConversationId, Conversations, FinishedRequest, TenantId, Tick,
    Turn, TurnKind,
};

const BS: usize = 4;

fn keys(tenant: u32, tokens: &[u32]) -> Vec<BlockKey> {
    let ns = Namespace::for_tenant(TenantId(tenant)).key();
    chain_keys(&ns, tokens, BS, tokens.len() / BS)
}

/// Finishes a request whose prompt is `prompt` and output `output`; its first `cached` prompt
/// blocks were found cached.
fn finish(
    idx: &mut Conversations,
    tenant: u32,
    prompt: &[u32],
    output: &[u32],
    cached: usize,
    now_ms: u64,
) -> Turn {
    let all: Vec<u32> = prompt.iter().chain(output).copied().collect();
    let chain = keys(tenant, &all);
    let t = idx.observe(FinishedRequest {
        tenant: TenantId(tenant),
        chain: &chain,
        prompt_blocks: prompt.len() / BS,
        first_own_block: cached,
        now: Tick(now_ms),
    });
    idx.check_invariants().unwrap();
    t
}

fn seq(from: u32, n: u32) -> Vec<u32> {
    (from..from + n).collect()
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

#[test]
fn a_continuation_joins_the_conversation_and_reports_the_gap() {
    let mut idx = Conversations::default();
    let system = seq(0, 8); // two blocks
    let a = cat(&[&system, &seq(100, 9)]);
    let t1 = finish(&mut idx, 1, &a, &seq(200, 6), 0, 1_000);
    assert_eq!(t1.kind, TurnKind::Start);
    assert_eq!(t1.index, 0);
    // Turn 2 = turn 1's prompt + its reply + a tool result; its prompt blocks were cached.
    let b = cat(&[&a, &seq(200, 6), &seq(300, 7)]);
    let t2 = finish(&mut idx, 1, &b, &seq(400, 3), a.len() / BS, 31_000);
    assert_eq!(t2.conversation, t1.conversation);
    assert_eq!(t2.kind, TurnKind::Continue { gap_ms: 30_000 });
    assert_eq!(t2.index, 1);
    let c = cat(&[&b, &seq(400, 3), &seq(500, 9)]);
    let t3 = finish(&mut idx, 1, &c, &[], b.len() / BS, 41_000);
    assert_eq!(
        (t3.conversation, t3.kind, t3.index),
        (t1.conversation, TurnKind::Continue { gap_ms: 10_000 }, 2)
    );
}

#[test]
fn the_reply_reproduced_in_the_next_prompt_is_matched_too() {
    let mut idx = Conversations::default();
    // The prompt alone has no own full block past the system prompt; the reply does.
    let system = seq(0, 8);
    // Someone else's request computed the system prompt (and its own question).
    let other = finish(&mut idx, 1, &cat(&[&system, &seq(800, 8)]), &[], 0, 0);
    let a = system.clone();
    let t1 = finish(&mut idx, 1, &cat(&[&a, &[9, 9]]), &seq(50, 12), 2, 10);
    assert_eq!(t1.kind, TurnKind::Start);
    assert_ne!(t1.conversation, other.conversation);
    let b = cat(&[&a, &[9, 9], &seq(50, 12), &seq(70, 5)]);
    let t2 = finish(&mut idx, 1, &b, &[], 2, 20);
    assert_eq!(t2.conversation, t1.conversation);
    assert!(matches!(t2.kind, TurnKind::Continue { .. }));
}

#[test]
fn a_second_request_from_the_same_turn_branches() {
    let mut idx = Conversations::default();
    let a = seq(0, 12);
    let t1 = finish(&mut idx, 1, &a, &[], 0, 0);
    let b = cat(&[&a, &seq(100, 8)]);
    let t2 = finish(&mut idx, 1, &b, &[], 3, 10);
    assert_eq!(t2.conversation, t1.conversation);
    // A regenerated / forked turn 2: continues turn 1, which is no longer the latest.
    let b2 = cat(&[&a, &seq(900, 8)]);
    let t3 = finish(&mut idx, 1, &b2, &[], 3, 20);
    assert_ne!(t3.conversation, t1.conversation);
    assert_eq!(
        t3.kind,
        TurnKind::Branch {
            from: t1.conversation
        }
    );
    assert_eq!(t3.index, 1);
    // Both lines go on independently.
    let c = cat(&[&b, &seq(200, 8)]);
    assert_eq!(
        finish(&mut idx, 1, &c, &[], 5, 30).conversation,
        t1.conversation
    );
    let c2 = cat(&[&b2, &seq(300, 8)]);
    assert_eq!(
        finish(&mut idx, 1, &c2, &[], 5, 40).conversation,
        t3.conversation
    );
}

#[test]
fn edited_history_branches_from_the_last_turn_it_still_contains() {
    let mut idx = Conversations::default();
    let a = seq(0, 8);
    let t1 = finish(&mut idx, 1, &a, &[], 0, 0);
    let b = cat(&[&a, &seq(100, 8)]);
    finish(&mut idx, 1, &b, &[], 2, 10);
    let c = cat(&[&b, &seq(200, 8)]);
    finish(&mut idx, 1, &c, &[], 4, 20);
    // The client rewrote turn 2's message: the prompt keeps turn 1 and diverges after it.
    let edited = cat(&[&a, &seq(150, 8), &seq(200, 8), &seq(300, 4)]);
    let t = finish(&mut idx, 1, &edited, &[], 2, 30);
    assert_eq!(
        t.kind,
        TurnKind::Branch {
            from: t1.conversation
        }
    );
    assert_eq!(t.index, 1);
    // History rewritten from the first block: a new conversation.
    let fresh = cat(&[&[7777], &a[1..], &seq(100, 8)]);
    assert_eq!(
        finish(&mut idx, 1, &fresh, &[], 0, 40).kind,
        TurnKind::Start
    );
}

#[test]
fn a_shared_system_prompt_joins_no_one() {
    let mut idx = Conversations::default();
    let system = seq(0, 16);
    // Agent 1's first call computes the system prompt and its question.
    let a1 = cat(&[&system, &seq(100, 8)]);
    let t1 = finish(&mut idx, 1, &a1, &[], 0, 0);
    // Agent 2's call finds the system prompt cached and adds a short question: it owns no full
    // block, so it registers nothing ...
    let a2 = cat(&[&system, &[5, 5]]);
    let t2 = finish(&mut idx, 1, &a2, &[], 4, 10);
    assert_eq!(t2.kind, TurnKind::Start);
    // ... and agent 3, behind the same system prompt, is not taken for agent 2's next turn.
    let a3 = cat(&[&system, &seq(300, 8)]);
    let t3 = finish(&mut idx, 1, &a3, &[], 4, 20);
    assert_eq!(t3.kind, TurnKind::Start);
    assert_ne!(t3.conversation, t1.conversation);
    // Agent 1's own turn 2 still finds its conversation.
    let b1 = cat(&[&a1, &seq(400, 8)]);
    assert_eq!(
        finish(&mut idx, 1, &b1, &[], 6, 30).conversation,
        t1.conversation
    );
}

#[test]
fn two_tenants_with_the_same_prompts_are_never_joined() {
    let mut idx = Conversations::default();
    let a = seq(0, 12);
    let b = cat(&[&a, &seq(100, 8)]);
    let t1 = finish(&mut idx, 1, &a, &[], 0, 0);
    let u1 = finish(&mut idx, 2, &a, &[], 0, 1);
    assert_ne!(t1.conversation, u1.conversation);
    let t2 = finish(&mut idx, 2, &b, &[], 3, 2);
    assert_eq!(
        t2.conversation, u1.conversation,
        "tenant 2 continues its own"
    );
    // Even with identical keys (a namespace shared by mistake), the tenant check holds.
    let chain = keys(1, &b);
    let t = idx.observe(FinishedRequest {
        tenant: TenantId(3),
        chain: &chain,
        prompt_blocks: chain.len(),
        first_own_block: chain.len(),
        now: Tick(3),
    });
    assert_eq!(t.kind, TurnKind::Start);
    idx.check_invariants().unwrap();
}

#[test]
fn the_index_is_bounded_per_tenant_and_forgets_old_conversations() {
    let mut idx = Conversations::new(ConversationConfig {
        max_ends_per_tenant: 4,
    });
    let mut first = None;
    for i in 0..10u32 {
        let t = finish(&mut idx, 1, &seq(1000 * i, 8), &[], 0, u64::from(i));
        first.get_or_insert(t.conversation);
    }
    finish(&mut idx, 2, &seq(0, 8), &[], 0, 11);
    assert_eq!(idx.num_ends(), 5, "4 for tenant 1, 1 for tenant 2");
    assert_eq!(idx.num_conversations(), 5);
    // The oldest conversation was forgotten: its next turn starts a new one.
    let t = finish(&mut idx, 1, &seq(0, 12), &[], 2, 12);
    assert_eq!(t.kind, TurnKind::Start);
    assert_ne!(Some(t.conversation), first);
}

// ---- seeded random streams against a naive reference ----

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every finished request, rescanned for each new one.
#[derive(Default)]
struct Naive {
    /// (key, tenant, conversation, turn serial, turn index) in registration order.
    ends: Vec<(BlockKey, u32, ConversationId, u64, u32)>,
    latest: std::collections::HashMap<ConversationId, (u64, u64)>,
    next_conversation: u64,
    next_turn: u64,
}

impl Naive {
    fn observe(
        &mut self,
        tenant: u32,
        chain: &[BlockKey],
        prompt: usize,
        own: usize,
        now: u64,
    ) -> Turn {
        // The newest registration of each key wins.
        let find = |k: &BlockKey| self.ends.iter().rev().find(|e| e.0 == *k).copied();
        let parent = chain[..prompt]
            .iter()
            .rev()
            .filter_map(find)
            .find(|e| e.1 == tenant);
        let serial = self.next_turn;
        self.next_turn += 1;
        let turn = match parent {
            Some(e) if self.latest.get(&e.2).is_some_and(|l| l.0 == e.3) => {
                let gap_ms = now.saturating_sub(self.latest[&e.2].1);
                self.latest.insert(e.2, (serial, now));
                Turn {
                    conversation: e.2,
                    kind: TurnKind::Continue { gap_ms },
                    index: e.4 + 1,
                }
            }
            other => {
                let c = ConversationId(self.next_conversation);
                self.next_conversation += 1;
                self.latest.insert(c, (serial, now));
                match other {
                    Some(e) => Turn {
                        conversation: c,
                        kind: TurnKind::Branch { from: e.2 },
                        index: e.4 + 1,
                    },
                    None => Turn {
                        conversation: c,
                        kind: TurnKind::Start,
                        index: 0,
                    },
                }
            }
        };
        if prompt > own {
            self.ends.push((
                chain[prompt - 1],
                tenant,
                turn.conversation,
                serial,
                turn.index,
            ));
        }
        if chain.len() > prompt && chain.len() > own {
            self.ends.push((
                chain[chain.len() - 1],
                tenant,
                turn.conversation,
                serial,
                turn.index,
            ));
        }
        turn
    }
}

#[test]
fn seeded_streams_match_the_naive_reference() {
    let mut kinds = [0u32; 3];
    for seed in 0..20u64 {
        let mut rng = Rng(seed);
        let mut idx = Conversations::default();
        let mut naive = Naive::default();
        let mut seen: std::collections::HashSet<BlockKey> = Default::default();
        // Earlier requests' full token sequences (prompt + output), per tenant.
        let mut past: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut fresh = 10_000u32;
        for step in 0..300u64 {
            let tenant = rng.below(3) as u32;
            let mine: Vec<&Vec<u32>> = past
                .iter()
                .filter(|p| p.0 == tenant)
                .map(|p| &p.1)
                .collect();
            let mut prompt: Vec<u32> = match rng.below(5) {
                // continue (or branch from) an earlier request of the tenant
                0..=2 if !mine.is_empty() => mine[rng.below(mine.len() as u64) as usize].clone(),
                // a shared system prompt
                3 => (0..8).collect(),
                _ => Vec::new(),
            };
            if rng.below(4) == 0 && prompt.len() > 4 {
                // an edit: cut somewhere
                let cut = rng.below(prompt.len() as u64) as usize;
                prompt.truncate(cut);
            }
            for _ in 0..1 + rng.below(10) {
                prompt.push(fresh);
                fresh += 1;
            }
            let output: Vec<u32> = (0..rng.below(9))
                .map(|_| {
                    fresh += 1;
                    fresh
                })
                .collect();
            let all: Vec<u32> = prompt.iter().chain(&output).copied().collect();
            let chain = keys(tenant, &all);
            let prompt_blocks = prompt.len() / BS;
            let own = chain.iter().take_while(|k| seen.contains(*k)).count();
            seen.extend(chain.iter().copied());
            let got = idx.observe(FinishedRequest {
                tenant: TenantId(tenant),
                chain: &chain,
                prompt_blocks,
                first_own_block: own,
                now: Tick(step * 7),
            });
            let want = naive.observe(tenant, &chain, prompt_blocks, own, step * 7);
            assert_eq!(got, want, "seed {seed} step {step}");
            kinds[match got.kind {
                TurnKind::Start => 0,
                TurnKind::Continue { .. } => 1,
                TurnKind::Branch { .. } => 2,
            }] += 1;
            idx.check_invariants().unwrap();
            past.push((tenant, all));
        }
    }
    // The streams exercise every kind of turn.
    assert!(kinds.iter().all(|n| *n > 200), "{kinds:?}");
}
