//! `agentkv bench-constraint`: what constrained decoding costs per generated token at batch 1,
//! against the model's decode step. For each grammar (JSON object, a JSON Schema, the generic
//! tool-call schema, the Hermes tool-call Lark grammar) a valid reply is tokenised and replayed
//! through the constraint the sampler uses (`mask_logits` over the whole vocabulary, then
//! `accept`), timing every token; the decode step is timed as `bench-model` does (batch 1,
//! pseudo-random tokens). Never touches the engine or the server's HTTP side.

use std::time::Instant;

use anyhow::{anyhow, Result};
use model::{AttnArith, ForwardBatch, Scratch};
use model::{ConstraintSpec, SeqSlot};
use serde_json::json;
use server::grammar::Grammars;
use server::structured::OutputFormat;
use server::tool_families::{Family, FamilySyntax};

use super::common::ModelArgs;
use model::{Numerics, RowKind};

#[derive(clap::Args, Debug)]
pub struct BenchConstraintArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Replays of each reply (per-token times are pooled over all of them).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Decode steps timed for the comparison.
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
}

struct Case {
    name: &'static str,
    spec: ConstraintSpec,
    compile_ms: f64,
    reply: String,
}

fn tools_request(choice: &str) -> Result<api::ChatCompletionRequest> {
    Ok(serde_json::from_value(json!({
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tool_choice": choice,
        "tools": [
            {"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"]}}},
            {"type": "function", "function": {"name": "search",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 20}},
                    "required": ["query"]}}}
        ]
    }))?)
}

fn cases(g: &Grammars) -> Result<Vec<Case>> {
    let timed = |name: &'static str, reply: &str, f: &dyn Fn() -> Result<ConstraintSpec>| {
        let t0 = Instant::now();
        let spec = f()?;
        Ok::<Case, anyhow::Error>(Case {
            name,
            spec,
            compile_ms: t0.elapsed().as_secs_f64() * 1e3,
            reply: reply.to_string(),
        })
    };
    let err = |e: server::grammar::GrammarError| anyhow!("{e}");
    let person = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
        "required": ["name", "age", "email", "tags"], "additionalProperties": false});
    let generic = server::tools::plan(&tools_request("auto")?, None, None, 8)
        .map_err(|e| anyhow!("{e:?}"))?
        .ok_or_else(|| anyhow!("no plan"))?;
    let hermes = FamilySyntax::new(Family::Hermes);
    let hermes = server::tools::plan(&tools_request("auto")?, None, Some(hermes), 8)
        .map_err(|e| anyhow!("{e:?}"))?
        .and_then(|p| p.lark)
        .ok_or_else(|| anyhow!("no Hermes grammar"))?;
    Ok(vec![
        timed(
            "json_object",
            r#"{"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"], "notes": {"engine": "analytical"}}"#,
            &|| g.compile(&OutputFormat::Json(json!({"type": "object"}))).map_err(err),
        )?,
        timed(
            "json_schema",
            r#"{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["mathematics", "computing"]}"#,
            &|| g.compile(&OutputFormat::Json(person.clone())).map_err(err),
        )?,
        timed(
            "tools_generic",
            r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, {"name": "search", "arguments": {"query": "Paris museums open on Monday", "max_results": 5}}]}"#,
            &|| g.json_schema(&generic.schema).map_err(err),
        )?,
        timed(
            "tools_hermes",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Paris museums open on Monday\", \"max_results\": 5}}\n</tool_call>",
            &|| {
                g.compile(&OutputFormat::Lark(hermes.clone()))
                    .map_err(err)
            },
        )?,
    ])
}

/// Per-token times (µs) of writing `reply` under the constraint `reps` times. Each step masks
/// the logits, then takes the longest allowed token that continues the reply (as a model that
/// wants this reply would; a fixed tokenisation may split where the grammar does not allow), and
/// finally the end-of-turn token.
fn replay(model: &model::Model, case: &Case, reps: usize) -> Result<(Vec<f64>, usize)> {
    let tok = model.tokenizer();
    let vocab = model.config().vocab_size;
    let pieces: Vec<Vec<u8>> = (0..vocab as u32)
        .map(|id| {
            if tok.is_special(id) {
                Vec::new()
            } else {
                tok.token_bytes(id).unwrap_or_default()
            }
        })
        .collect();
    let eot = tok.eot_ids().first().copied().unwrap_or(0);
    let reply = case.reply.as_bytes();
    let mut logits = vec![0.0f32; vocab];
    let mut times = Vec::new();
    let mut tokens = 0;
    for _ in 0..reps.max(1) {
        let mut c = case.spec.0.start();
        let mut at = 0;
        tokens = 0;
        loop {
            logits.iter_mut().for_each(|l| *l = 0.0);
            let t0 = Instant::now();
            c.mask_logits(&mut logits)?;
            let masked = t0.elapsed();
            let rest = &reply[at..];
            let next = if rest.is_empty() {
                (logits[eot as usize] != f32::NEG_INFINITY).then_some(eot)
            } else {
                (0..vocab)
                    .filter(|&id| {
                        logits[id] != f32::NEG_INFINITY
                            && !pieces[id].is_empty()
                            && rest.starts_with(&pieces[id])
                    })
                    .max_by_key(|&id| pieces[id].len())
                    .map(|id| id as u32)
            };
            let Some(id) = next else {
                return Err(anyhow!(
                    "{}: the grammar allows no token that continues its sample reply at {:?}",
                    case.name,
                    String::from_utf8_lossy(rest)
                ));
            };
            let t1 = Instant::now();
            c.accept(id);
            times.push((masked + t1.elapsed()).as_secs_f64() * 1e6);
            tokens += 1;
            if id == eot {
                break;
            }
            at += pieces[id as usize].len();
        }
    }
    Ok((times, tokens))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn run(args: BenchConstraintArgs) -> Result<()> {
    let model = std::sync::Arc::new(args.model.load()?);
    let pool = args.model.pool();
    // The decode step at batch 1, as bench-model times it.
    let vocab = model.config().vocab_size as u32;
    let mut kv = model.contiguous_kv(1, args.gen_tokens + 1, quant::KvCodecs::F16)?;
    let mut scratch = Scratch::default();
    let mut steps = Vec::with_capacity(args.gen_tokens);
    let mut tok = 1u32;
    for pos in 0..args.gen_tokens {
        let batch = ForwardBatch {
            tokens: &[tok],
            positions: &[pos as u32],
            slots: &[SeqSlot(0)],
            logits_for: &[0],
            numerics: Numerics::Explicit {
                attention: AttnArith::invariant(),
                matmul: model::MatmulArith::Invariant,
            },
            rows: &RowKind::by_step(&[SeqSlot(0)]),
        };
        let t0 = Instant::now();
        let logits = model.forward(&pool, &batch, &mut kv, &mut scratch)?;
        steps.push(t0.elapsed().as_secs_f64() * 1e6);
        tok = model::sampler::argmax(&logits) % vocab;
    }
    steps.sort_by(f64::total_cmp);
    let step_us = percentile(&steps, 0.5);

    let t0 = Instant::now();
    let grammars = Grammars::new(model.frontend().clone()).map_err(|e| anyhow!("{e}"))?;
    let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut rows = Vec::new();
    eprintln!(
        "decode step (batch 1, {} threads): {:.0} µs median; grammar setup (token trie): {setup_ms:.0} ms",
        pool.num_threads(),
        step_us
    );
    for case in cases(&grammars)? {
        let (mut t, tokens) = replay(&model, &case, args.reps)?;
        let mean = t.iter().sum::<f64>() / t.len() as f64;
        t.sort_by(f64::total_cmp);
        let (p50, p99, max) = (percentile(&t, 0.5), percentile(&t, 0.99), t[t.len() - 1]);
        eprintln!(
            "{:14} {tokens:3} tokens, compile {:6.2} ms; per token: mean {mean:6.1} µs, p50 {p50:6.1}, p99 {p99:7.1}, max {max:7.1} = {:.2}% of a decode step (mean)",
            case.name,
            case.compile_ms,
            100.0 * mean / step_us
        );
        rows.push(json!({"grammar": case.name, "compile_ms": case.compile_ms,
            "tokens": tokens, "mean_us": mean, "p50_us": p50, "p99_us": p99,
            "max_us": max, "share_of_decode_step": mean / step_us}));
    }
    println!(
        "{}",
        json!({"threads": pool.num_threads(), "decode_step_us": step_us,
               "grammar_setup_ms": setup_ms, "grammars": rows})
    );
    Ok(())
}
