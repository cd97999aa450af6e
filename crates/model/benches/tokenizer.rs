//! Tokenizer and chat-template throughput on the real default model: encoding the 52 KB corpus
//! (reported as tokens/s), decoding it, and rendering a chat prompt with the GGUF's template.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use frontend::chat::{ChatMessage, ChatTemplate};
use frontend::tokenizer::{StreamDecoder, Tokenizer};
use gguf::GgufFile;
use std::hint::black_box;

fn load() -> (Tokenizer, ChatTemplate) {
    let path = model::default_model_path();
    let file = GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("default model at {}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(file.metadata()).expect("tokenizer");
    let tpl = ChatTemplate::from_gguf(file.metadata(), &tok)
        .expect("template")
        .expect("has template");
    (tok, tpl)
}

fn bench(c: &mut Criterion) {
    let (tok, tpl) = load();
    let corpus = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/corpus.txt"
    ))
    .unwrap();
    let ids = tok.encode(&corpus, false, false).unwrap();

    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("encode_corpus_52kb", |b| {
        b.iter(|| tok.encode(black_box(&corpus), false, false).unwrap())
    });
    g.bench_function("decode_corpus", |b| {
        b.iter(|| tok.decode(black_box(&ids), false).unwrap())
    });
    g.bench_function("stream_decode_corpus", |b| {
        b.iter(|| {
            let mut d = StreamDecoder::with_skip_special(&tok, false);
            let mut n = 0;
            for &id in &ids {
                n += d.push(id).len();
            }
            n
        })
    });
    g.finish();

    let messages = vec![
        ChatMessage::new(
            "system",
            "You are a research agent. Use Thought, Action and Observation steps.",
        ),
        ChatMessage::new("user", "Question: Which river flows through Paris?"),
        ChatMessage::new(
            "assistant",
            "Thought: I should search.\nAction: search[Paris river]",
        ),
        ChatMessage::new("user", "Observation: The Seine flows through Paris."),
    ];
    c.bench_function("chat_render_4_messages", |b| {
        b.iter(|| tpl.render(black_box(&messages), None, true).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
