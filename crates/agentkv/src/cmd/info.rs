//! `agentkv info`: what a GGUF model file is.

use anyhow::Result;

use super::common::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let m = args.model.load()?;
    let c = &m.config;
    let g = m.gguf();
    let mut types = std::collections::BTreeMap::<&str, usize>::new();
    for t in g.tensors() {
        *types.entry(t.ty.name()).or_default() += 1;
    }
    let weight_bytes = m.weights.total_bytes();
    let kv_f16 = c.kv_elems_per_token() * 2;
    println!("file            {}", m.path.display());
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
    println!(
        "rope            base {}, dims {}, {:?}",
        c.rope_base, c.rope_dim, c.rope_style
    );
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
        if m.frontend.chat_template.is_some() {
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
    Ok(())
}
