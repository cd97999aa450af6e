//! Any bytes as a GGUF file: `from_bytes` returns Ok or Err, never panics or over-allocates;
//! for a file it accepts, every tensor's data slice and the tokenizer built from its metadata
//! are in bounds too.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = gguf::GgufFile::from_bytes(data.to_vec()) {
        for t in f.tensors() {
            let _ = f.tensor_data(t);
        }
        if let Ok(tok) = frontend::tokenizer::Tokenizer::from_gguf(f.metadata()) {
            let _ = frontend::chat::ChatTemplate::from_gguf(f.metadata(), &tok);
        }
    }
});
