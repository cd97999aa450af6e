//! The default model's tokenizer and chat template, loaded once (`$AGENTKV_MODEL` or
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf`).

use std::sync::OnceLock;

pub fn frontend() -> &'static frontend::Frontend {
    static F: OnceLock<frontend::Frontend> = OnceLock::new();
    F.get_or_init(|| {
        let path = model::default_model_path();
        let file = gguf::GgufFile::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `agentkv fetch-model`)", path.display()));
        let tok = frontend::tokenizer::Tokenizer::from_gguf(file.metadata()).expect("tokenizer");
        let tpl = frontend::chat::ChatTemplate::from_gguf(file.metadata(), &tok).expect("template");
        frontend::Frontend::new(tok, tpl, 8192)
    })
}
