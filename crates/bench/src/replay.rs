//! Turns a saved trace back into driver tasks: the requests of one target, grouped by session in
//! step order, each task keeping its recorded tool delays. Never changes a request's messages.

use std::collections::BTreeMap;

use crate::driver::{FixedTask, TaskPlan};
use crate::trace::TraceEntry;

/// Tasks per agent (ascending agent id) from the entries sent to `target` in the original run.
pub fn plans_from_trace(entries: &[TraceEntry], target: usize) -> Vec<Vec<TaskPlan>> {
    let mut by_agent: BTreeMap<u32, BTreeMap<u32, FixedTask>> = BTreeMap::new();
    let mut sorted: Vec<&TraceEntry> = entries.iter().filter(|e| e.target == target).collect();
    sorted.sort_by_key(|e| (e.agent, e.task, e.step));
    for e in sorted {
        let task = by_agent
            .entry(e.agent)
            .or_default()
            .entry(e.task)
            .or_insert_with(|| FixedTask {
                agent: e.agent,
                task: e.task,
                tenant: e.tenant.clone(),
                session: e.session.clone(),
                calls: Vec::new(),
            });
        task.calls.push((e.delay_before_ms, e.request.clone()));
    }
    by_agent
        .into_values()
        .map(|tasks| tasks.into_values().map(TaskPlan::Fixed).collect())
        .collect()
}
