//! The scheduler without a model: exact plans for scripted steps (golden), and a seeded random
//! run against a naive model of the K/V contents.
//!
//! The harness stands in for the executor and the commit: "executing" a plan writes each
//! planned token into a naive K/V memory (`block → [token per slot]`) through the block tables,
//! and a sequence whose pending tokens are all computed checks that its table reads back its
//! own tokens, then "samples" a token that depends only on the sequence so far (so every
//! request's output is the same however it was scheduled).

use std::collections::HashMap;
use std::time::Duration;

use cache::{BlockId, CacheConfig, KvCache, Namespace, NamespaceKey, TenantId, Tick};
use rand::{Rng, SeedableRng};

use super::*;
use crate::loader::Loaded;
use crate::plan::StepPlan;
use crate::request::{EventReceiver, RequestId, RequestSpec};
use crate::sequence::{SeqKey, Sequence};
use crate::step_budget::StepBudget;
use crate::tier_events::TierEvents;
use crate::tiering::{TierExtension, TierMatch};

const VOCAB: u32 = 1000;

fn ns(tenant: u32) -> NamespaceKey {
    Namespace {
        model_fingerprint: [7; 32],
        codec_id: "f16".into(),
        codec_version: 1,
        kv_settings: Vec::new(),
        tenant: TenantId(tenant),
        tenant_salt: Vec::new(),
        adapter_id: None,
    }
    .key()
}

/// A scripted tier: the lookup result each request gets when admission asks.
#[derive(Default)]
struct ScriptedTier {
    results: HashMap<SeqKey, Loaded>,
    pending: Vec<SeqKey>,
    asked: Vec<SeqKey>,
}

impl TierMatch for ScriptedTier {
    fn begin_step(&mut self) {}

    fn extend_match(&mut self, id: SeqKey) -> TierExtension {
        self.asked.push(id);
        if self.pending.contains(&id) {
            return TierExtension::Pending;
        }
        match self.results.remove(&id) {
            Some(l) => TierExtension::Ready(l),
            None => TierExtension::None,
        }
    }

    fn put_back(&mut self, id: SeqKey, loaded: Loaded) {
        self.results.insert(id, loaded);
    }
}

struct Sim {
    sched: Scheduler,
    cache: KvCache,
    seqs: HashMap<SeqKey, Sequence>,
    events: TierEvents,
    tier: Option<ScriptedTier>,
    /// The naive K/V memory: the token written at each slot of each block.
    kv: HashMap<BlockId, Vec<Option<u32>>>,
    block_size: usize,
    tick: u64,
    next_id: u64,
    receivers: Vec<EventReceiver>,
    /// Finished requests and their generated tokens.
    finished: HashMap<SeqKey, Vec<u32>>,
}

fn config(block_size: usize, max_batch_tokens: usize, max_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_tokens,
        max_seqs,
        block_size,
        prefix_caching: true,
        budget: StepBudget {
            target: None,
            min_prefill_tokens: 0,
        },
    }
}

impl Sim {
    fn new(num_blocks: u32, cfg: SchedulerConfig) -> Sim {
        let mut cc = CacheConfig::new(num_blocks);
        cc.block_size = cfg.block_size as u32;
        Sim {
            sched: Scheduler::new(cfg),
            cache: KvCache::new(cc).unwrap(),
            seqs: HashMap::new(),
            events: TierEvents::default(),
            tier: None,
            kv: HashMap::new(),
            block_size: cfg.block_size,
            tick: 0,
            next_id: 0,
            receivers: Vec::new(),
            finished: HashMap::new(),
        }
    }

    fn submit(&mut self, prompt: Vec<u32>, max_tokens: usize) -> SeqKey {
        self.submit_at(prompt, max_tokens, 0)
    }

    fn submit_at(&mut self, prompt: Vec<u32>, max_tokens: usize, priority: i32) -> SeqKey {
        self.next_id += 1;
        let id = SeqKey(RequestId(self.next_id), 0);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.receivers.push(rx);
        let spec = RequestSpec {
            priority,
            ..RequestSpec::greedy(prompt, max_tokens)
        };
        self.seqs.insert(id, Sequence::new(spec, ns(0), tx));
        self.sched.enqueue(id, priority);
        id
    }

    /// A request whose reader's progress the test moves by hand.
    fn submit_read(
        &mut self,
        prompt: Vec<u32>,
        max_tokens: usize,
        reader: std::sync::Arc<crate::request::ReadProgress>,
    ) -> SeqKey {
        let id = self.submit(prompt, max_tokens);
        self.seqs.get_mut(&id).unwrap().spec.reader = Some(reader);
        id
    }

    fn schedule(&mut self) -> StepPlan {
        self.tick += 1;
        let plan = self
            .sched
            .schedule(&mut SchedContext {
                cache: &mut self.cache,
                seqs: &mut self.seqs,
                tiers: self.tier.as_mut().map(|t| t as &mut dyn TierMatch),
                events: &mut self.events,
                tick: Tick(self.tick),
            })
            .unwrap();
        self.cache.check_invariants().unwrap();
        plan
    }

    /// Schedules, "executes" and commits one step; returns the plan.
    fn step(&mut self) -> StepPlan {
        let was_running = self.sched.running.clone();
        let plan = self.schedule();
        // Decodes of requests that were running come first (a preempted request re-admitted
        // with all but its last token cached is an admission, wherever it lands).
        let decodes: Vec<bool> = plan
            .work
            .iter()
            .map(|w| was_running.contains(&w.id) && self.seqs[&w.id].is_decoding())
            .collect();
        assert!(
            decodes.windows(2).all(|d| d[0] || !d[1]),
            "decodes come first: {decodes:?}"
        );
        let bs = self.block_size;
        for load in &plan.tier_loads {
            for (b, p) in load.blocks.iter().zip(&load.payloads) {
                let toks = p.iter().map(|&t| Some(t as u32)).collect();
                self.kv.insert(*b, toks);
            }
        }
        for w in &plan.work {
            let s = &self.seqs[&w.id];
            assert_eq!(
                w.start, s.num_computed,
                "a chunk starts where the last ended"
            );
            let table = self.cache.block_table(s.cache_seq.unwrap()).unwrap();
            for p in w.start..w.start + w.len {
                let block = self.kv.entry(table[p / bs]).or_insert(vec![None; bs]);
                block[p % bs] = Some(s.tokens[p]);
            }
        }
        for w in &plan.work {
            let s = self.seqs.get_mut(&w.id).unwrap();
            s.num_computed = w.start + w.len;
            let cs = s.cache_seq.unwrap();
            self.cache
                .mark_written(cs, s.num_computed, Tick(self.tick))
                .unwrap();
            if s.num_computed < s.tokens.len() {
                continue;
            }
            // The naive model: the table reads back the sequence's own tokens.
            let table = self.cache.block_table(cs).unwrap();
            for (p, &t) in s.tokens.iter().enumerate() {
                assert_eq!(
                    self.kv[&table[p / bs]][p % bs],
                    Some(t),
                    "{:?} position {p}",
                    w.id
                );
            }
            let next = s.tokens.iter().fold(17u32, |h, &t| h.wrapping_mul(31) ^ t) % VOCAB;
            s.tokens.push(next);
            s.num_generated += 1;
            if s.num_generated >= s.spec.max_tokens {
                self.finish(w.id);
            }
        }
        self.cache.check_invariants().unwrap();
        plan
    }

    fn cancel(&mut self, id: SeqKey) {
        let mut s = self.seqs.remove(&id).unwrap();
        if let Some(cs) = s.cache_seq.take() {
            self.cache.free(cs, Tick(self.tick)).unwrap();
        }
        self.sched.remove(id);
    }

    fn finish(&mut self, id: SeqKey) {
        let mut s = self.seqs.remove(&id).unwrap();
        if let Some(cs) = s.cache_seq.take() {
            self.cache.free(cs, Tick(self.tick)).unwrap();
        }
        self.sched.remove(id);
        let generated = s.tokens[s.spec.prompt.len()..].to_vec();
        self.finished.insert(id, generated);
    }

    fn run_to_end(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            if !self.sched.has_work() {
                return;
            }
            self.step();
        }
        panic!("requests still queued after {max_steps} steps");
    }
}

/// `(request, start, len)` of each planned chunk, in batch order.
fn chunks(plan: &StepPlan) -> Vec<(u64, usize, usize)> {
    plan.work
        .iter()
        .map(|w| (w.id.0 .0, w.start, w.len))
        .collect()
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (seed * 100 + i) % VOCAB).collect()
}

#[test]
fn decodes_first_then_running_prefills_then_fifo_admissions() {
    let mut sim = Sim::new(64, config(4, 8, 8));
    sim.submit(prompt(1, 10), 3); // 1
    sim.submit(prompt(2, 5), 2); // 2
    sim.submit(prompt(3, 3), 2); // 3
    let golden: [&[(u64, usize, usize)]; 5] = [
        &[(1, 0, 8)],
        // 1 finishes its prompt; 2 and 3 are admitted with what the token budget leaves.
        &[(1, 8, 2), (2, 0, 5), (3, 0, 1)],
        &[(1, 10, 1), (2, 5, 1), (3, 1, 2)],
        // 2 finished after its second token; 3 decodes.
        &[(1, 11, 1), (3, 3, 1)],
        &[],
    ];
    for (step, want) in golden.iter().enumerate() {
        let plan = sim.step();
        assert_eq!(chunks(&plan), *want, "step {step}");
    }
    assert!(!sim.sched.has_work());
    assert_eq!(sim.finished.len(), 3);
}

#[test]
fn first_admissions_are_reported_once() {
    let mut sim = Sim::new(64, config(4, 4, 8));
    let a = sim.submit(prompt(1, 6), 1);
    assert_eq!(sim.step().first_admissions, vec![a]);
    assert!(sim.step().first_admissions.is_empty(), "second chunk");
}

#[test]
fn max_seqs_caps_the_batch_and_the_running_set() {
    let mut sim = Sim::new(64, config(4, 64, 2));
    for i in 0..3 {
        sim.submit(prompt(i, 4), 2);
    }
    assert_eq!(chunks(&sim.step()), [(1, 0, 4), (2, 0, 4)]);
    assert_eq!(chunks(&sim.step()), [(1, 4, 1), (2, 4, 1)]);
    // 1 and 2 finished: 3 runs.
    assert_eq!(chunks(&sim.step()), [(3, 0, 4)]);
}

#[test]
fn a_decode_without_a_block_preempts_the_newest_request() {
    // 4 blocks of 2 tokens: two requests of 3 prompt tokens each hold 2 blocks; both decodes
    // need a third block at position 4.
    let mut sim = Sim::new(4, config(2, 16, 4));
    sim.submit(prompt(1, 3), 4); // 1
    sim.submit(prompt(2, 3), 4); // 2
    assert_eq!(chunks(&sim.step()), [(1, 0, 3), (2, 0, 3)]);
    let plan = sim.step(); // decodes at position 3 fit the second blocks
    assert_eq!(chunks(&plan), [(1, 3, 1), (2, 3, 1)]);
    let plan = sim.step();
    // Request 1's decode at position 4 needs a block: 2 (the newest) is preempted; 2 is not
    // re-admitted in the same step because its prompt blocks were just freed into the cache and
    // the pool has no room for its 3 tokens plus its generated one.
    assert_eq!(plan.preempted, vec![SeqKey(RequestId(2), 0)]);
    assert_eq!(chunks(&plan)[0], (1, 4, 1));
    assert_eq!(sim.seqs[&SeqKey(RequestId(2), 0)].num_preemptions, 1);
    sim.run_to_end(50);
    assert_eq!(sim.finished.len(), 2);
}

#[test]
fn a_decode_without_a_block_preempts_the_least_important_request_first() {
    // As above, but the older request is the less important one (vLLM's convention: a higher
    // value): it is preempted, not the newest.
    let mut sim = Sim::new(4, config(2, 16, 4));
    sim.submit_at(prompt(1, 3), 4, 5); // 1
    assert_eq!(chunks(&sim.step()), [(1, 0, 3)]);
    sim.submit_at(prompt(2, 3), 4, 0); // 2, the newest
    assert_eq!(chunks(&sim.step()), [(1, 3, 1), (2, 0, 3)]);
    // 1's decode at position 4 needs a third block: 1 itself goes, 2 decodes.
    let plan = sim.step();
    assert_eq!(plan.preempted, vec![SeqKey(RequestId(1), 0)]);
    assert_eq!(chunks(&plan)[0], (2, 3, 1));
    sim.run_to_end(50);
    assert_eq!(sim.finished.len(), 2);
}

#[test]
fn waiting_requests_are_admitted_by_priority_then_arrival() {
    // One sequence at a time: the admission order is the queue order.
    let mut sim = Sim::new(64, config(4, 64, 1));
    sim.submit_at(prompt(1, 3), 1, 0); // 1
    sim.submit_at(prompt(2, 3), 1, 3); // 2
    sim.submit_at(prompt(3, 3), 1, -2); // 3
    sim.submit_at(prompt(4, 3), 1, 0); // 4
    sim.submit_at(prompt(5, 3), 1, -2); // 5
    let mut order = Vec::new();
    for _ in 0..20 {
        for (id, _, _) in chunks(&sim.step()) {
            if !order.contains(&id) {
                order.push(id);
            }
        }
    }
    assert_eq!(order, [3, 5, 1, 4, 2]);
    assert_eq!(sim.finished.len(), 5);
}

#[test]
fn a_more_important_request_waiting_for_a_slot_preempts_a_less_important_one() {
    // One slot: 1 (priority 5) runs; 2 (priority -1) arrives, waits one step, then takes the
    // slot from 1, which is recomputed after 2 finishes.
    let mut sim = Sim::new(64, config(4, 64, 1));
    sim.submit_at(prompt(1, 3), 6, 5); // 1
    assert_eq!(chunks(&sim.step()), [(1, 0, 3)]);
    sim.submit_at(prompt(2, 3), 2, -1); // 2
    assert_eq!(chunks(&sim.step()), [(1, 3, 1)]);
    let plan = sim.step();
    assert_eq!(plan.preempted, vec![SeqKey(RequestId(1), 0)]);
    assert_eq!(chunks(&plan), [(2, 0, 3)]);
    assert_eq!(chunks(&sim.step()), [(2, 3, 1)]);
    // 2 finished: 1 comes back, its prompt and first token from the cache (2 full blocks of
    // 4 are published; the last token of what it had is recomputed).
    let plan = sim.step();
    assert_eq!(chunks(&plan), [(1, 4, 1)]);
    assert_eq!(sim.seqs[&SeqKey(RequestId(1), 0)].num_preemptions, 1);
    sim.run_to_end(50);
    assert_eq!(sim.finished.len(), 2);
    assert_eq!(
        sim.finished[&SeqKey(RequestId(1), 0)],
        alone(&prompt(1, 3), 6),
        "a preempted request's output does not change"
    );
}

#[test]
fn a_request_whose_reader_stalled_stops_decoding_gives_its_slot_away_and_resumes() {
    use crate::request::{ReadProgress, STALL_TOKENS};
    // One slot. 1's client stops reading after its first token; 2 (equal priority) arrives.
    let mut sim = Sim::new(64, config(4, 64, 1));
    let reader = std::sync::Arc::new(ReadProgress::default());
    let one = sim.submit_read(prompt(1, 3), 6, reader.clone());
    assert_eq!(chunks(&sim.step()), [(1, 0, 3)]);
    assert_eq!(chunks(&sim.step()), [(1, 3, 1)]);
    (0..STALL_TOKENS).for_each(|_| reader.note_sent());
    sim.submit(prompt(2, 3), 2); // 2
                                 // 1 is not decoded; nothing else can run, so the stalled request is preempted at once.
    let plan = sim.step();
    assert_eq!(chunks(&plan), []);
    assert_eq!(plan.preempted, vec![one]);
    assert_eq!(chunks(&sim.step()), [(2, 0, 3)]);
    assert_eq!(chunks(&sim.step()), [(2, 3, 1)]);
    // 2 finished; 1 waits for its reader without computing.
    for _ in 0..3 {
        assert_eq!(chunks(&sim.step()), []);
    }
    assert!(sim.sched.has_work());
    (0..STALL_TOKENS).for_each(|_| reader.note_read());
    sim.run_to_end(50);
    assert_eq!(
        sim.finished[&one],
        alone(&prompt(1, 3), 6),
        "a stalled request's output does not change"
    );
}

#[test]
fn equal_priorities_never_preempt_for_a_slot() {
    let mut sim = Sim::new(64, config(4, 64, 1));
    sim.submit_at(prompt(1, 3), 4, 0); // 1
    assert_eq!(chunks(&sim.step()), [(1, 0, 3)]);
    sim.submit_at(prompt(2, 3), 2, 0); // 2
    for pos in 3..6 {
        let plan = sim.step();
        assert!(plan.preempted.is_empty());
        assert_eq!(chunks(&plan), [(1, pos, 1)]);
    }
    assert_eq!(chunks(&sim.step()), [(2, 0, 3)]);
}

#[test]
fn a_more_important_request_waiting_for_blocks_preempts_a_less_important_one() {
    // 4 blocks of 2 tokens: 1 (priority 3) holds 3 of them; 2 (priority 0) needs 2.
    let mut sim = Sim::new(4, config(2, 16, 4));
    sim.submit_at(prompt(1, 5), 4, 3); // 1
    assert_eq!(chunks(&sim.step()), [(1, 0, 5)]);
    sim.submit_at(prompt(2, 3), 1, 0); // 2
                                       // No blocks for 2 in this step: 1 decodes, 2 is noted as blocked.
    let plan = sim.step();
    assert_eq!(chunks(&plan), [(1, 5, 1)]);
    assert!(plan.preempted.is_empty());
    let plan = sim.step();
    assert_eq!(plan.preempted, vec![SeqKey(RequestId(1), 0)]);
    assert_eq!(chunks(&plan)[0], (2, 0, 3));
    sim.run_to_end(50);
    assert_eq!(sim.finished.len(), 2);
    assert_eq!(
        sim.finished[&SeqKey(RequestId(1), 0)],
        alone(&prompt(1, 5), 4)
    );
}

#[test]
fn a_prompt_sharing_a_block_with_one_in_flight_waits_and_then_hits_the_cache() {
    let mut sim = Sim::new(64, config(4, 5, 8));
    let shared = prompt(5, 8);
    let mut b = shared.clone();
    b.extend([900, 901]);
    sim.submit(shared.iter().copied().chain([800]).collect(), 2); // 1: 9 tokens
    sim.submit(b, 2); // 2: 10 tokens, 8 shared (2 blocks)
    assert_eq!(chunks(&sim.step()), [(1, 0, 5)]);
    // One token of budget is left, but 2 waits: its second block is being computed by 1.
    assert_eq!(chunks(&sim.step()), [(1, 5, 4)]);
    // Both shared blocks are published: 2 starts after them.
    assert_eq!(chunks(&sim.step()), [(1, 9, 1), (2, 8, 2)]);
    assert_eq!(sim.seqs[&SeqKey(RequestId(2), 0)].cached_tokens, Some(8));
}

#[test]
fn tier_results_become_loads_and_missing_lookups_become_prefetch_requests() {
    let mut sim = Sim::new(64, config(4, 64, 8));
    sim.tier = Some(ScriptedTier::default());
    let p = prompt(9, 13); // 3 full blocks can come from a tier (the last token never does)
    let a = sim.submit(p.clone(), 1);
    // No lookup result yet: admission asks for one and defers the request.
    let plan = sim.step();
    assert!(plan.work.is_empty());
    assert_eq!(
        plan.prefetches,
        vec![PrefetchStart {
            id: a,
            first_block: 0,
            max_blocks: 3,
            refetch: false
        }]
    );
    // The lookup is in flight.
    sim.tier.as_mut().unwrap().pending.push(a);
    assert!(sim.step().work.is_empty());
    // It found the first two blocks: they are loaded, the rest is computed.
    let t = sim.tier.as_mut().unwrap();
    t.pending.clear();
    let payloads: Vec<Vec<u8>> = p[..8]
        .chunks(4)
        .map(|c| c.iter().map(|&x| x as u8).collect())
        .collect();
    t.results.insert(
        a,
        Loaded {
            first_block: 0,
            payloads,
        },
    );
    let plan = sim.schedule();
    assert_eq!(chunks(&plan), [(1, 8, 5)]);
    assert_eq!(plan.tier_loads.len(), 1);
    assert_eq!(plan.tier_loads[0].id, a);
    assert_eq!(plan.tier_loads[0].blocks.len(), 2);
    assert_eq!(sim.seqs[&a].cached_tokens, Some(8));
    assert_eq!(plan.first_admissions, vec![a]);
}

#[test]
fn a_stale_tier_result_is_looked_up_again_from_where_the_pool_ends() {
    let mut sim = Sim::new(64, config(4, 64, 8));
    sim.tier = Some(ScriptedTier::default());
    // The pool holds nothing; a result starting at block 1 cannot continue the match.
    let a = sim.submit(prompt(3, 9), 1);
    sim.tier.as_mut().unwrap().results.insert(
        a,
        Loaded {
            first_block: 1,
            payloads: vec![vec![0; 4]],
        },
    );
    let plan = sim.step();
    assert!(plan.work.is_empty());
    assert_eq!(
        plan.prefetches,
        vec![PrefetchStart {
            id: a,
            first_block: 0,
            max_blocks: 2,
            refetch: true
        }]
    );
}

#[test]
fn a_step_time_target_caps_prefill_beside_decodes_but_never_below_the_floor() {
    let mut cfg = config(4, 64, 8);
    cfg.budget = StepBudget {
        target: Some(Duration::from_millis(10)),
        min_prefill_tokens: 4,
    };
    let mut sim = Sim::new(256, cfg);
    // Teach the cost model: 1 ms per token.
    for n in [1usize, 2, 4, 8, 16, 32, 48, 64, 3, 5, 7, 9] {
        let plan = StepPlan {
            work: vec![crate::plan::Work {
                id: SeqKey(RequestId(999), 0),
                start: 0,
                len: n,
            }],
            ..StepPlan::default()
        };
        sim.sched.observe(&plan, Duration::from_millis(n as u64));
    }
    sim.submit(prompt(1, 2), 8); // 1: decodes from step 2 on
    assert_eq!(chunks(&sim.step()), [(1, 0, 2)]);
    sim.submit(prompt(2, 60), 1); // 2: a long prompt arrives
    let plan = sim.step();
    let w = chunks(&plan);
    assert_eq!(w[0], (1, 2, 1), "the decode comes first");
    let (_, start, len) = w[1];
    assert_eq!(start, 0);
    assert!(
        (4..=10).contains(&len),
        "the chunk fits about 10 ms beside the decode, got {len}"
    );
}

/// Seeded random submissions and cancellations over small pools (so preemption, eviction and
/// prefix sharing all happen) against the naive K/V model; every request completes with the
/// output it would have alone.
#[test]
fn random_workloads_match_the_naive_model() {
    let mut preemptions = 0;
    for seed in 0..40u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let bs = [2usize, 4][rng.gen_range(0..2)];
        let max_batch = rng.gen_range(4..24);
        let max_seqs = rng.gen_range(1..6);
        let num_blocks = rng.gen_range(12..40) as u32;
        let mut sim = Sim::new(num_blocks, config(bs, max_batch, max_seqs));
        let mut expected: HashMap<SeqKey, Vec<u32>> = HashMap::new();
        let mut cancelled = 0;
        for step in 0..400 {
            if step < 200 && rng.gen_bool(0.3) {
                // Prompts over a 3-token alphabet share prefixes often.
                let len = rng.gen_range(1..(num_blocks as usize * bs / 3).max(2));
                let p: Vec<u32> = (0..len).map(|_| rng.gen_range(0..3)).collect();
                let max_tokens = rng.gen_range(1..6);
                // Mixed priorities exercise preemption for priority as well.
                let priority = rng.gen_range(-1..2);
                let want = alone(&p, max_tokens);
                expected.insert(sim.submit_at(p, max_tokens, priority), want);
            }
            if rng.gen_bool(0.03) {
                let mut live: Vec<SeqKey> = sim.seqs.keys().copied().collect();
                live.sort();
                if !live.is_empty() {
                    let id = live[rng.gen_range(0..live.len())];
                    sim.cancel(id);
                    expected.remove(&id);
                    cancelled += 1;
                }
            }
            if sim.sched.has_work() {
                let plan = sim.step();
                preemptions += plan.preempted.len();
                assert!(plan.num_tokens() <= max_batch, "seed {seed}");
                assert!(plan.work.len() <= max_seqs, "seed {seed}");
            }
        }
        sim.run_to_end(2000);
        assert_eq!(
            sim.finished, expected,
            "seed {seed} ({cancelled} cancelled)"
        );
        assert_eq!(sim.cache.usage().in_use, 0, "seed {seed}: all blocks freed");
    }
    assert!(preemptions > 0, "the seeds exercise preemption");
}

/// The output of a request run alone under the naive model.
fn alone(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut toks = prompt.to_vec();
    for _ in 0..max_tokens {
        let next = toks.iter().fold(17u32, |h, &t| h.wrapping_mul(31) ^ t) % VOCAB;
        toks.push(next);
    }
    toks[prompt.len()..].to_vec()
}
