//! The default model's tokenizer and chat template, loaded once (`$AGENTKV_MODEL` or
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf`).

use std::sync::OnceLock;

pub fn frontend() -> &'static model::Frontend {
    static F: OnceLock<model::Frontend> = OnceLock::new();
    F.get_or_init(|| {
        let path = model::default_model_path();
        let file = model::gguf::GgufFile::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `agentkv fetch-model`)", path.display()));
        let tok = model::tokenizer::Tokenizer::from_gguf(file.metadata()).expect("tokenizer");
        let tpl = model::chat::ChatTemplate::from_gguf(file.metadata(), &tok).expect("template");
        model::Frontend::new(tok, tpl, 8192)
    })
}
