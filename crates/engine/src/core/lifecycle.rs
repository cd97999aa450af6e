//! The end of a step for each request: forking `n > 1` choices, sampling and emitting a token,
//! stop handling, and finishing a request (retention, usage and timings). Never schedules and
//! never runs the model.

use std::collections::HashSet;
use std::time::Instant;

use cache::Tick;

use super::EngineCore;

/// Retention rank of inferred conversations (`crate::request::retention_rank` gives named
/// retention 2 and up).
const INFERRED_RANK: u8 = 0;
use crate::error::{internal, EngineError};
use crate::request::{EngineEvent, FinishReason, Retention, Timings, TokenEvent, Usage};
use crate::sequence::{SeqKey, Sequence};

impl EngineCore {
    /// Forks choices `1..n` of a request whose prompt was just computed: they share its blocks
    /// (the partial last block is copied) and sample from the same logits with their own seeds.
    pub(super) fn fork_choices(&mut self, key: SeqKey, logits: &[f32]) -> Result<(), EngineError> {
        let tick = Tick(self.tick);
        let parent = &self.seqs[&key];
        let n = parent.spec.n;
        let cs = parent.cache_seq.expect("sampling sequences hold blocks");
        let mut children = Vec::new();
        for choice in 1..n as u32 {
            let fork = self.cache.fork(cs, tick).map_err(internal)?;
            if let Some(copy) = fork.copy {
                self.kv
                    .writer(&mut self.cache, self.tiers.as_mut())
                    .copy_block(copy.src, copy.dst, copy.num_tokens)
                    .map_err(internal)?;
            }
            let parent = &self.seqs[&key];
            let mut spec = parent.spec.clone();
            spec.sampling.seed = spec.sampling.seed.map(|s| s.wrapping_add(choice as u64));
            let mut child = Sequence::new(spec, parent.ns, parent.sink.clone());
            child.cache_seq = Some(fork.child);
            child.num_computed = parent.num_computed;
            child.arrival = parent.arrival;
            child.admitted_at = parent.admitted_at;
            child.cached_tokens = parent.cached_tokens;
            child.cache_miss = parent.cache_miss;
            children.push(SeqKey(key.0, choice));
            self.seqs.insert(SeqKey(key.0, choice), child);
        }
        self.scheduler.insert_forks(key, &children);
        for c in children {
            let mut l = logits.to_vec();
            self.sample_and_emit(c, &mut l);
        }
        Ok(())
    }

    pub(super) fn sample_and_emit(&mut self, id: SeqKey, logits: &mut [f32]) {
        let eot: Vec<u32> = self.backend.frontend().tokenizer.eot_ids().to_vec();
        let s = self.seqs.get_mut(&id).expect("exists");
        if s.num_generated < s.spec.min_tokens {
            for &t in eot.iter().chain(&s.spec.stop_token_ids) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let prompt_len = s.spec.prompt.len();
        let tok = match s.sampler.sample(logits, &s.tokens[..prompt_len]) {
            Ok(tok) => tok,
            Err(reason) => {
                // Never a token the constraint did not allow: the request ends with the error.
                let err = EngineError::ConstraintDeadEnd {
                    generated_tokens: s.num_generated,
                    reason,
                };
                let _ = s.send(EngineEvent::Error(err));
                self.stats.constraint_dead_ends += 1;
                self.finish(id, FinishReason::Cancelled);
                return;
            }
        };
        s.sampler.observe(tok.id);
        s.tokens.push(tok.id);
        s.num_generated += 1;
        if s.first_token_at.is_none() {
            s.first_token_at = Some(Instant::now());
        }
        let is_stop_id = (!s.spec.ignore_eos && eot.contains(&tok.id))
            || s.spec.stop_token_ids.contains(&tok.id);
        let mut stopped = is_stop_id;
        let mut text = String::new();
        if !is_stop_id && !self.backend.frontend().tokenizer.is_special(tok.id) {
            let bytes = self
                .backend
                .frontend()
                .tokenizer
                .token_bytes(tok.id)
                .unwrap_or_default();
            let pushed = s.text.push(&bytes);
            text = pushed.text;
            stopped |= pushed.stopped;
        }
        if let Some(r) = &s.spec.reader {
            r.note_sent();
        }
        let alive = s.send(EngineEvent::Token(TokenEvent {
            choice: id.1,
            id: tok.id,
            text,
            logprob: tok.logprob,
            top_logprobs: tok.top,
        }));
        let at_length =
            s.num_generated >= s.spec.max_tokens || s.tokens.len() >= self.shape.context_length;
        if !alive {
            self.finish(id, FinishReason::Cancelled);
        } else if stopped {
            self.finish(id, FinishReason::Stop);
        } else if at_length {
            self.finish(id, FinishReason::Length);
        }
    }

    /// Ends every request with `err` (after an internal failure), freeing their blocks.
    pub fn fail_all(&mut self, err: EngineError) {
        let ids: Vec<SeqKey> = self.seqs.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.seqs.get(&id) {
                let _ = s.send(EngineEvent::Error(err.clone()));
            }
            self.finish(id, FinishReason::Cancelled);
        }
    }

    pub(super) fn finish(&mut self, id: SeqKey, reason: FinishReason) {
        let Some(mut s) = self.seqs.remove(&id) else {
            return;
        };
        if let Some(t) = self.tiers.as_mut() {
            t.forget_request(id);
        }
        let mut retained_tokens = 0;
        if let Some(cs) = s.cache_seq.take() {
            let tick = Tick(self.tick);
            if reason != FinishReason::Cancelled {
                // Keep this agent's KV through its tool call: soft, budget-capped retention of
                // the whole sequence (a session) and of the prefixes up to its breakpoints.
                let bs = self.cfg.block_size;
                let holders: Vec<(&Retention, usize)> = (s.spec.retention.iter())
                    .map(|r| (r, usize::MAX))
                    .chain(
                        s.spec
                            .breakpoints
                            .iter()
                            .map(|b| (&b.retention, b.prefix_tokens / bs)),
                    )
                    .collect();
                let held = |cache: &cache::KvCache| -> HashSet<cache::BlockId> {
                    (holders.iter())
                        .flat_map(|(r, _)| cache.session_blocks(r.session).iter().copied())
                        .collect()
                };
                let before = held(&self.cache);
                if let (Some(inferred), false) = (self.inferred.as_mut(), holders.is_empty()) {
                    // Named sessions and breakpoints take precedence over inferred ones.
                    let need = self.cache.num_published_blocks(cs).unwrap_or(0) as u32;
                    let n = inferred.make_room(&mut self.cache, need);
                    self.stats.inferred_released_for_explicit += n as u64;
                }
                for (r, max_blocks) in &holders {
                    let until = Tick(self.tick + r.ttl.as_millis() as u64);
                    if let Ok(out) = self.cache.retain_session_prefix(
                        r.session,
                        cs,
                        *max_blocks,
                        until,
                        r.priority,
                        tick,
                    ) {
                        self.stats.retained_blocks += out.retained_blocks as u64;
                    }
                }
                retained_tokens = held(&self.cache).difference(&before).count() * bs;
                if holders.is_empty() && id.1 == 0 {
                    // Not reported as `retained_tokens`: that is what a named retention added.
                    self.retain_inferred(&s, cs, tick);
                }
            }
            let _ = self.cache.free(cs, tick);
        }
        self.scheduler.remove(id);
        if reason == FinishReason::Cancelled {
            self.stats.cancelled += 1;
            return;
        }
        self.stats.finished += 1;
        let tail = s.text.finish();
        // Sent after the step's snapshot is published (`EngineCore::step`).
        if !tail.is_empty() && reason != FinishReason::Stop {
            let text = EngineEvent::Text {
                choice: id.1,
                text: tail,
            };
            self.outbox.push((s.sink.clone(), text));
        }
        let now = Instant::now();
        let timings = Timings {
            ttft: s
                .first_token_at
                .map_or_else(Default::default, |t| t - s.arrival),
            queue: s
                .admitted_at
                .map_or_else(Default::default, |t| t - s.arrival),
            total: now - s.arrival,
        };
        let usage = Usage {
            prompt_tokens: s.spec.prompt.len(),
            completion_tokens: s.num_generated,
            cached_tokens: s.cached_tokens.unwrap_or(0),
            cache_miss: s.cache_miss,
            retained_tokens,
        };
        let finished = EngineEvent::Finished {
            choice: id.1,
            reason,
            usage,
            timings,
            num_preemptions: s.num_preemptions,
        };
        self.outbox.push((s.sink, finished));
    }

    /// A request that named no session finished: place it in its inferred conversation and
    /// retain its blocks for the conversation's learned return time.
    fn retain_inferred(&mut self, s: &Sequence, cs: cache::SeqId, tick: Tick) {
        let Some(inferred) = self.inferred.as_mut() else {
            return;
        };
        let bs = self.cfg.block_size;
        let published = self.cache.num_published_blocks(cs).unwrap_or(0);
        let chain: Vec<cache::BlockKey> = (self.cache.block_table(cs).unwrap_or(&[]).iter())
            .take(published)
            .map_while(|b| self.cache.block_key(*b))
            .collect();
        let req = cache::FinishedRequest {
            tenant: s.spec.tenant,
            chain: &chain,
            prompt_blocks: s.spec.prompt.len() / bs,
            first_own_block: s.cached_tokens.unwrap_or(0) / bs,
            now: tick,
        };
        // The lowest session rank: an inferred conversation yields to every named session,
        // breakpoint and tool pause, whatever their priority (among inferred ones, the most
        // recently retained goes first, as for sessions of one rank).
        let rank = INFERRED_RANK;
        let choice = self.duel.as_ref().map_or(
            cache::PolicyChoice {
                retain: true,
                reuse_bonus: true,
            },
            |d| d.choice(),
        );
        let bonus_ms = inferred.reuse_bonus_ms();
        self.cache
            .set_reuse_bonus(if choice.reuse_bonus { bonus_ms } else { 0 });
        let turn = if choice.retain {
            let Ok(placed) = inferred.on_finish(&mut self.cache, req, cs, rank) else {
                return;
            };
            self.stats.retained_blocks += u64::from(placed.retained_blocks);
            placed.turn
        } else {
            self.stats.inferred_unretained += 1;
            inferred.place(req)
        };
        self.stats.inferred_turns += 1;
        match turn.kind {
            cache::TurnKind::Continue { .. } => self.stats.inferred_continuations += 1,
            cache::TurnKind::Branch { .. } => self.stats.inferred_branches += 1,
            cache::TurnKind::Start => {}
        }
        self.stats.inferred_ttl_ms = inferred.ttl_ms();
        self.stats.reuse_bonus_ms = if choice.reuse_bonus { bonus_ms } else { 0 };
        let ns = self.namespace_for(s.spec.tenant, &s.spec.cache_salt, s.spec.prompt.len());
        if let Some(duel) = self.duel.as_mut() {
            let prompt = &s.spec.prompt;
            let upto = (published * bs).max(prompt.len()).min(s.tokens.len());
            let tokens = if upto >= prompt.len() {
                &s.tokens[..upto]
            } else {
                prompt
            };
            duel.observe(s.spec.tenant, &ns, prompt, tokens, rank, bonus_ms, tick);
        }
    }
}
