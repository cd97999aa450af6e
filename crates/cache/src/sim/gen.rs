//! Synthetic agent traces, deterministic per seed. Token ids are random in the default model's
//! vocabulary; what matters for a prefix cache is which prompts share which prefixes, and that is
//! shaped after the workloads in the articles:
//!
//! - `React` (HotpotQA-like): a per-tenant system prompt of 1000–2000 tokens; each task asks a
//!   question (30–120 tokens) and makes 8–12 calls, each call = the previous call + the model's
//!   output (30–150 tokens) + a tool observation (100–1500 tokens); 1–8 s tool pauses.
//! - `Webshop`: a per-tenant system prompt of 800–1200 tokens, an instruction (40–100), 5–10 steps
//!   whose observations are long pages (800–2000 tokens); 2–10 s page loads.
//! - `Swarm`: every agent of a tenant shares one system prompt (1500–2000 tokens) and one of four
//!   sub-agent role prompts (200–600); agents of a tenant work on the same task at the same time
//!   (a shared task brief of 200–500 tokens), each making 3–6 calls that append its own output
//!   (50–200) and observation (100–400).
//!
//! Agents are spread over `min(3, agents)` tenants round-robin; each runs its tasks one after
//! another; calls of all agents are merged by time (ties: agent, then call order).

use super::rng::SplitMix64;
use super::trace::TraceCall;

/// Which workload shape to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    React,
    Webshop,
    Swarm,
}

/// Generator parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParams {
    pub kind: TraceKind,
    pub agents: u32,
    /// Tasks per agent.
    pub tasks: u32,
    pub seed: u64,
}

const NUM_ROLES: usize = 4;

struct TenantPrompts {
    system: Vec<u32>,
    roles: Vec<Vec<u32>>,
}

/// Generate a trace. Deterministic: the same parameters give the same calls.
pub fn generate(params: TraceParams) -> Vec<TraceCall> {
    let num_tenants = params.agents.clamp(1, 3) as usize;
    let mut rng = SplitMix64::new(params.seed ^ 0x5EED_CAFE_F00D_0001);
    let prompts: Vec<TenantPrompts> = (0..num_tenants)
        .map(|_| {
            let system_len = match params.kind {
                TraceKind::React => rng.range(1000, 2000),
                TraceKind::Webshop => rng.range(800, 1200),
                TraceKind::Swarm => rng.range(1500, 2000),
            } as usize;
            let system = rng.tokens(system_len);
            let roles = (0..NUM_ROLES)
                .map(|_| {
                    let len = rng.range(200, 600) as usize;
                    rng.tokens(len)
                })
                .collect();
            TenantPrompts { system, roles }
        })
        .collect();
    // Swarm task briefs, shared by the agents of a tenant: [tenant][task].
    let briefs: Vec<Vec<Vec<u32>>> = (0..num_tenants)
        .map(|_| {
            (0..params.tasks)
                .map(|_| {
                    let len = rng.range(200, 500) as usize;
                    rng.tokens(len)
                })
                .collect()
        })
        .collect();

    // (t, agent, order, call)
    let mut calls: Vec<(f64, u32, u32, TraceCall)> = Vec::new();
    for agent in 0..params.agents {
        let tenant = agent as usize % num_tenants;
        let mut arng =
            SplitMix64::new(params.seed.wrapping_mul(0x100_0000_01B3) ^ u64::from(agent) << 32);
        let mut t = arng.unit() * 5.0;
        let mut order = 0u32;
        for task in 0..params.tasks {
            let session = format!("tenant{tenant}-agent{agent}-task{task}");
            let (mut prompt, num_calls, output_len, obs_len, pause) = match params.kind {
                TraceKind::React => {
                    let mut p = prompts[tenant].system.clone();
                    let q = arng.range(30, 120) as usize;
                    p.extend(arng.tokens(q));
                    (p, arng.range(8, 12), (30, 150), (100, 1500), (1.0, 8.0))
                }
                TraceKind::Webshop => {
                    let mut p = prompts[tenant].system.clone();
                    let q = arng.range(40, 100) as usize;
                    p.extend(arng.tokens(q));
                    (p, arng.range(5, 10), (20, 80), (800, 2000), (2.0, 10.0))
                }
                TraceKind::Swarm => {
                    let mut p = prompts[tenant].system.clone();
                    p.extend_from_slice(&prompts[tenant].roles[agent as usize % NUM_ROLES]);
                    p.extend_from_slice(&briefs[tenant][task as usize]);
                    (p, arng.range(3, 6), (50, 200), (100, 400), (0.5, 4.0))
                }
            };
            for _ in 0..num_calls {
                calls.push((
                    t,
                    agent,
                    order,
                    TraceCall {
                        t,
                        session: session.clone(),
                        tenant: format!("tenant{tenant}"),
                        tokens: prompt.clone(),
                    },
                ));
                order += 1;
                let out = arng.range(output_len.0, output_len.1) as usize;
                let obs = arng.range(obs_len.0, obs_len.1) as usize;
                prompt.extend(arng.tokens(out + obs));
                // Model time grows with the prompt; then the tool pause.
                t += 0.3 + prompt.len() as f64 * 2e-4 + pause.0 + arng.unit() * (pause.1 - pause.0);
            }
        }
    }
    calls.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    calls.into_iter().map(|c| c.3).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kind: TraceKind, seed: u64) -> TraceParams {
        TraceParams {
            kind,
            agents: 4,
            tasks: 2,
            seed,
        }
    }

    #[test]
    fn deterministic_per_seed_and_seed_sensitive() {
        for kind in [TraceKind::React, TraceKind::Webshop, TraceKind::Swarm] {
            assert_eq!(generate(params(kind, 7)), generate(params(kind, 7)));
            assert_ne!(generate(params(kind, 7)), generate(params(kind, 8)));
        }
    }

    #[test]
    fn react_shape_each_call_extends_the_previous_one() {
        let trace = generate(params(TraceKind::React, 1));
        let mut by_session: std::collections::BTreeMap<&str, Vec<&TraceCall>> = Default::default();
        for c in &trace {
            by_session.entry(&c.session).or_default().push(c);
        }
        assert_eq!(by_session.len(), 8);
        for calls in by_session.values() {
            assert!((8..=12).contains(&calls.len()));
            assert!((1030..=2120).contains(&calls[0].tokens.len()));
            for w in calls.windows(2) {
                assert!(w[1].tokens.starts_with(&w[0].tokens));
                let grown = w[1].tokens.len() - w[0].tokens.len();
                assert!((130..=1650).contains(&grown), "{grown}");
                assert!(w[1].t > w[0].t);
            }
        }
        assert!(trace.windows(2).all(|w| w[0].t <= w[1].t));
        let tenants: std::collections::BTreeSet<_> = trace.iter().map(|c| &c.tenant).collect();
        assert_eq!(tenants.len(), 3);
    }

    #[test]
    fn swarm_agents_of_a_tenant_share_system_role_and_brief() {
        let trace = generate(TraceParams {
            kind: TraceKind::Swarm,
            agents: 9,
            tasks: 1,
            seed: 3,
        });
        let first = |s: &str| {
            trace
                .iter()
                .find(|c| c.session == s)
                .unwrap()
                .tokens
                .clone()
        };
        // Agents 0 and 3 share tenant 0; agent 4 (role 0) shares the role with agent 0.
        let a0 = first("tenant0-agent0-task0");
        let a3 = first("tenant0-agent3-task0");
        let common = a0.iter().zip(&a3).take_while(|(x, y)| x == y).count();
        assert!((1500..=2000).contains(&common), "{common}");
        let a4 = first("tenant1-agent4-task0");
        assert_ne!(
            a0[..100],
            a4[..100],
            "different tenants have different system prompts"
        );
    }
}
