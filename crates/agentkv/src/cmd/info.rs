//! `agentkv info`: what a GGUF model file is (any architecture `model` supports:
//! `model::config::SUPPORTED_ARCHS`).

use anyhow::Result;

use super::common::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let m = args.model.load()?;
    let c = m.config();
    let g = m.gguf();
    let mut types = std::collections::BTreeMap::<&str, usize>::new();
    for t in g.tensors() {
        *types.entry(t.ty.name()).or_default() += 1;
    }
    let weight_bytes = m.weights().total_bytes();
    let kv_f16 = c.kv_elems_per_token() * 2;
    println!("file            {}", m.path().display());
    println!("gguf version    {}", g.version());
    println!(
        "name            {}",
        g.metadata().get_str("general.name").unwrap_or("?")
    );
    println!("architecture    {}", c.arch.name());
    println!("layers          {}", c.num_layers);
    println!("hidden          {}", c.hidden_size);
    println!(
        "heads           {} query / {} KV, head dim {}",
        c.num_heads, c.num_kv_heads, c.head_dim
    );
    println!("ffn             {}", c.ffn_size);
    println!("vocab           {}", c.vocab_size);
    println!("context         {}", c.context_length);
    let scaling = c.rope_scaling.describe();
    println!(
        "rope            base {}, dims {}, {:?}{}{}{}",
        c.rope_base,
        c.rope_dim,
        c.rope_style,
        if m.weights().rope_freqs.is_some() {
            ", per-dimension frequency factors (rope_freqs)"
        } else {
            ""
        },
        match &m.weights().rope_long_short {
            Some(_) if c.context_length > c.rope_orig_context => format!(
                ", long per-dimension factors (context {} > original {})",
                c.context_length, c.rope_orig_context
            ),
            Some(_) => format!(
                ", short per-dimension factors (context {} ≤ original {})",
                c.context_length, c.rope_orig_context
            ),
            None => String::new(),
        },
        match (scaling.is_empty(), c.sliding_window.is_some()) {
            (true, _) => String::new(),
            (false, false) => format!(", {scaling}"),
            (false, true) => format!(", {scaling} on the global layers"),
        }
    );
    let l0 = &m.weights().layers[0];
    let mut features = vec![match c.ffn_act {
        model::config::FfnAct::Silu => "SwiGLU FFN".to_string(),
        model::config::FfnAct::GeluTanh => "GeGLU (tanh) FFN".to_string(),
    }];
    if l0.bq.is_some() {
        features.push("QKV biases".into());
    }
    if l0.q_norm.is_some() {
        features.push("QK-norm".into());
    }
    if l0.post_attn_norm.is_some() {
        features.push("post-attention and post-FFN norms".into());
    }
    if let Some(s) = c.embed_scale {
        features.push(format!("embeddings scaled by {s:.3}"));
    }
    if let Some(cap) = c.final_logit_softcap {
        features.push(format!("final logits soft-capped at {cap}"));
    }
    features.push(format!(
        "attention scale {:.5}{}",
        c.attn_scale,
        if c.scale_queries {
            " (on the queries)"
        } else {
            ""
        }
    ));
    println!("layout          {}", features.join(", "));
    match &c.sliding_window {
        Some(sw) => println!(
            "attention       {} of {} layers sliding-window ({} positions, rope base {}), the rest global",
            sw.num_local(),
            c.num_layers,
            sw.size,
            sw.rope_base
        ),
        None => println!("attention       global in every layer"),
    }
    println!("tensors         {} ({:?})", g.tensors().len(), types);
    println!("weights         {:.1} MB", weight_bytes as f64 / 1e6);
    println!(
        "tokenizer       {} (pre {}), {} tokens, bos {:?}, eos {:?}, add_bos {}",
        m.tokenizer().kind(),
        m.tokenizer().pre(),
        m.tokenizer().vocab_size(),
        m.tokenizer().bos_id(),
        m.tokenizer().eos_id(),
        m.tokenizer().add_bos()
    );
    println!(
        "chat template   {}",
        if m.frontend().chat_template.is_some() {
            "present"
        } else {
            "absent (fallback used)"
        }
    );
    println!(
        "KV bytes/token  {} (f16), {} (f32) = 2 x {} layers x {} KV heads x {} dims x bytes",
        kv_f16,
        kv_f16 * 2,
        c.num_layers,
        c.num_kv_heads,
        c.head_dim
    );
    println!(
        "KV at context   {:.1} MB (f16, {} tokens)",
        (kv_f16 * c.context_length) as f64 / 1e6,
        c.context_length
    );
    if let Some(sw) = &c.sliding_window {
        let per_layer = kv_f16 / c.num_layers;
        let bounded = per_layer
            * ((c.num_layers - sw.num_local()) * c.context_length
                + sw.num_local() * sw.size.min(c.context_length));
        println!(
            "                {:.1} MB if local layers held only their window (agentkv keeps all layers' K/V)",
            bounded as f64 / 1e6
        );
    }
    Ok(())
}
