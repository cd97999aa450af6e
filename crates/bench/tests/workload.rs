//! Workload generator: determinism per seed, calls per task, prompt growth, shared prompts.

use std::collections::BTreeSet;

use api::Role;
use bench::corpus::{estimate_tokens, Corpus};
use bench::workload::{generate, Shape, WorkloadConfig, WorkloadKind};

fn cfg(kind: WorkloadKind, seed: u64) -> WorkloadConfig {
    WorkloadConfig {
        kind,
        num_agents: 6,
        tasks_per_agent: 3,
        steps_per_task: None,
        tool_latency_ms: Some((200, 2000)),
        seed,
        observation_tokens: None,
        output_tokens: None,
        system_tokens: None,
    }
}

#[test]
fn same_seed_same_workload_other_seed_differs() {
    let c = Corpus::builtin();
    for kind in [
        WorkloadKind::React,
        WorkloadKind::Webshop,
        WorkloadKind::Swarm,
    ] {
        let a = generate(&cfg(kind, 1), &c).unwrap();
        assert_eq!(a, generate(&cfg(kind, 1), &c).unwrap());
        assert_ne!(a, generate(&cfg(kind, 2), &c).unwrap());
        // Adding agents leaves the existing agents' tasks unchanged.
        let mut more = cfg(kind, 1);
        more.num_agents = 9;
        assert_eq!(generate(&more, &c).unwrap().agents[..6], a.agents[..]);
    }
}

#[test]
fn react_shape() {
    let c = Corpus::builtin();
    let w = generate(&cfg(WorkloadKind::React, 5), &c).unwrap();
    assert_eq!(w.num_tasks(), 18);
    let systems: BTreeSet<&str> = w
        .agents
        .iter()
        .flatten()
        .map(|t| t.system_prompt.as_str())
        .collect();
    assert_eq!(systems.len(), 1, "react agents share one system prompt");
    let sys_tokens = estimate_tokens(systems.first().unwrap());
    assert!(
        (1000..=2200).contains(&sys_tokens),
        "system prompt ≈{sys_tokens} tokens"
    );
    for t in w.agents.iter().flatten() {
        assert!((8..=12).contains(&t.steps.len()));
        assert_eq!(t.steps[0].tool_latency_ms, 0);
        for (i, s) in t.steps.iter().enumerate() {
            assert!((30..=150).contains(&s.max_output_tokens));
            if i > 0 {
                assert!((200..=2000).contains(&s.tool_latency_ms));
            }
            match &s.observation {
                Some(o) => {
                    let n = estimate_tokens(o);
                    assert!((70..=1500).contains(&n), "observation ≈{n} tokens");
                    assert!(!o.to_lowercase().contains("lorem"));
                }
                None => assert_eq!(
                    i + 1,
                    t.steps.len(),
                    "only the last call has no observation"
                ),
            }
        }
    }
}

#[test]
fn prompts_grow_by_answer_and_observation() {
    let c = Corpus::builtin();
    let mut wc = cfg(WorkloadKind::Webshop, 9);
    wc.steps_per_task = Some(4);
    let w = generate(&wc, &c).unwrap();
    let t = &w.agents[2][1];
    assert_eq!(t.steps.len(), 4);
    let mut msgs = t.initial_messages();
    assert_eq!(msgs.len(), 2);
    for step in 0..4 {
        let before = msgs.clone();
        t.append_turn(&mut msgs, step, "Thought: ok. Action: click[Buy Now]");
        assert_eq!(&msgs[..before.len()], &before[..], "append only");
        let added = if step < 3 { 2 } else { 1 };
        assert_eq!(msgs.len(), before.len() + added);
        assert_eq!(msgs[before.len()].role, Role::Assistant);
        if step < 3 {
            let obs = msgs.last().unwrap().content.as_deref().unwrap();
            assert!(estimate_tokens(obs) >= 1000, "webshop pages are long");
        }
    }
}

#[test]
fn swarm_has_roles_and_tenants() {
    let c = Corpus::builtin();
    let w = generate(&cfg(WorkloadKind::Swarm, 4), &c).unwrap();
    let tasks: Vec<_> = w.agents.iter().flatten().collect();
    let systems: BTreeSet<&str> = tasks.iter().map(|t| t.system_prompt.as_str()).collect();
    assert_eq!(
        systems.len(),
        Shape::of(WorkloadKind::Swarm).num_roles as usize
    );
    // All role prompts share the same base prefix.
    let v: Vec<&str> = systems.iter().copied().collect();
    let common = v[0]
        .bytes()
        .zip(v[1].bytes())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(estimate_tokens(&v[0][..common]) >= 900);
    let tenants: BTreeSet<&str> = tasks.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(tenants.len(), 3);
}

#[test]
fn bad_configs_are_errors() {
    let c = Corpus::builtin();
    let mut z = cfg(WorkloadKind::React, 1);
    z.num_agents = 0;
    assert!(generate(&z, &c).is_err());
    let mut s = cfg(WorkloadKind::React, 1);
    s.steps_per_task = Some(0);
    assert!(generate(&s, &c).is_err());
    let mut l = cfg(WorkloadKind::React, 1);
    l.tool_latency_ms = Some((5, 1));
    assert!(generate(&l, &c).is_err());
}
