//! Checks the tokenizer and chat template of the real default model (SmolLM2, byte-level BPE,
//! pre-tokenizer `smollm`) against llama.cpp's reference in `tests/data/greedy.jsonl`, and
//! round-trips tricky text and the 52 KB corpus.

use frontend::chat::{ChatMessage, ChatTemplate};
use frontend::tokenizer::{StreamDecoder, Tokenizer};
use gguf::GgufFile;
use std::sync::OnceLock;

struct Fixture {
    tok: Tokenizer,
    template: ChatTemplate,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let path = model::default_model_path();
        let file = GgufFile::open(&path).unwrap_or_else(|e| {
            panic!("cannot open the default model at {}: {e}\nRun `cargo run -p agentkv -- fetch-model` first.", path.display())
        });
        let tok = Tokenizer::from_gguf(file.metadata()).expect("tokenizer builds");
        let template = ChatTemplate::from_gguf(file.metadata(), &tok).expect("template compiles").expect("file has a template");
        Fixture { tok, template }
    })
}

fn data(name: &str) -> String {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn references() -> Vec<serde_json::Value> {
    let refs: Vec<serde_json::Value> = data("greedy.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line parses"))
        .collect();
    assert_eq!(refs.len(), 10);
    refs
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("id list")
}

#[test]
fn metadata_of_the_default_model() {
    let t = &fixture().tok;
    assert_eq!(
        (t.kind(), t.pre(), t.vocab_size()),
        ("gpt2", "smollm", 49152)
    );
    assert_eq!(
        (t.bos_id(), t.eos_id(), t.add_bos()),
        (Some(1), Some(2), false)
    );
    assert_eq!(t.token_to_id("<|im_start|>"), Some(1));
    assert!(
        t.eot_ids().contains(&2) && t.eot_ids().contains(&0),
        "{:?}",
        t.eot_ids()
    );
    assert!(t.is_special(1) && !t.is_special(504));
    assert_eq!(t.token_bytes(504).unwrap(), b"The");
    assert_eq!(t.token_bytes(198).unwrap(), b"\n");
}

#[test]
fn chat_template_renders_reference_prompts() {
    let f = fixture();
    let mut checked = 0;
    for r in references() {
        let Some(messages) = r.get("messages") else {
            continue;
        };
        let messages: Vec<ChatMessage> = serde_json::from_value(messages.clone()).unwrap();
        let text = f.template.render(&messages, None, true).unwrap();
        assert_eq!(text, r["prompt_text"].as_str().unwrap(), "{}", r["id"]);
        checked += 1;
    }
    assert_eq!(checked, 8);
}

#[test]
fn encodes_reference_prompts_exactly() {
    let t = &fixture().tok;
    for r in references() {
        let text = r["prompt_text"].as_str().unwrap();
        let got = t.encode(text, true, true).unwrap();
        assert_eq!(got, ids(&r["prompt_ids"]), "{}", r["id"]);
        if let Some(prompt) = r.get("prompt") {
            assert_eq!(
                t.encode(prompt.as_str().unwrap(), false, false).unwrap(),
                ids(&r["prompt_ids"])
            );
        }
        assert_eq!(t.decode(&got, false).unwrap(), text);
    }
}

#[test]
fn decodes_reference_generations() {
    let t = &fixture().tok;
    for r in references() {
        let greedy = ids(&r["greedy_ids"]);
        let expected = r["greedy_text"].as_str().unwrap();
        assert_eq!(t.decode(&greedy, true).unwrap(), expected, "{}", r["id"]);
        let mut d = StreamDecoder::new(t);
        let mut streamed = String::new();
        for &id in &greedy {
            streamed.push_str(&d.push(id));
        }
        streamed.push_str(&d.finish());
        assert_eq!(streamed, expected, "{}", r["id"]);
    }
}

const TRICKY: &[&str] = &[
    "Hello, world! It's 2024-06-01 and I've 3.14159 reasons.",
    "  leading spaces,\ttabs\t\tand trailing   ",
    "\n\n\nnewlines\r\n\r\nwindows\n",
    "naïve café — « guillemets » ½ ² Ⅻ",
    "中文测试：你好，世界！日本語のテキスト。한국어",
    "emoji 😊👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "mixed123abc 0x1F600 1,000,000 1e-9",
    "code: fn main() { println!(\"{}\", x); }  // comment",
    "zero\u{200B}width\u{00A0}nbsp\u{3000}ideographic",
    "<|im_start|> written as text",
    "",
    " ",
];

#[test]
fn tricky_text_round_trips() {
    let t = &fixture().tok;
    for s in TRICKY {
        let ids = t.encode(s, false, false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), *s);
    }
    // Special tokens written in text stay text unless parse_special is set.
    let plain = t.encode("<|im_start|>", false, false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&1));
    assert_eq!(t.encode("<|im_start|>", false, true).unwrap(), [1]);
}

#[test]
fn corpus_round_trips() {
    let t = &fixture().tok;
    let corpus = data("corpus.txt");
    let ids = t.encode(&corpus, false, false).unwrap();
    assert!(
        ids.len() > 10_000 && ids.len() < corpus.len() / 2,
        "{} tokens",
        ids.len()
    );
    assert_eq!(t.decode(&ids, false).unwrap(), corpus);
}

#[test]
fn stream_decoder_never_splits_characters() {
    let t = &fixture().tok;
    for s in TRICKY {
        let ids = t.encode(s, false, false).unwrap();
        let mut d = StreamDecoder::with_skip_special(t, false);
        let mut out = String::new();
        for &id in &ids {
            let piece = d.push(id);
            assert!(
                !piece.contains('\u{FFFD}'),
                "partial character emitted for {s:?}"
            );
            out.push_str(&piece);
        }
        assert_eq!(d.pending_bytes(), 0);
        out.push_str(&d.finish());
        assert_eq!(out, *s);
    }
    // An emoji split across byte tokens is held back until complete.
    let ids = t.encode("😊", false, false).unwrap();
    assert!(ids.len() > 1, "expected byte-level pieces, got {ids:?}");
    let mut d = StreamDecoder::with_skip_special(t, false);
    assert_eq!(d.push(ids[0]), "");
    assert!(d.pending_bytes() > 0);
    let rest: String = ids[1..].iter().map(|&id| d.push(id)).collect();
    assert_eq!(rest, "😊");
    // A truncated character is flushed lossily, like decode.
    let mut d = StreamDecoder::with_skip_special(t, false);
    assert_eq!(d.push(ids[0]), "");
    assert_eq!(d.finish(), t.decode(&ids[..1], false).unwrap());
}

/// FNV-1a 64 over the little-endian bytes of `ids` (matches the Python that made the vectors).
fn fnv1a64(ids: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[test]
fn matches_hf_tokenizers_on_tricky_text_and_corpus() {
    let t = &fixture().tok;
    let v: serde_json::Value = serde_json::from_str(&data("tokenizer_hf_smollm2.json")).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        assert_eq!(
            t.encode(text, false, true).unwrap(),
            ids(&c["ids"]),
            "{text:?}"
        );
    }
    let corpus_ids = t.encode(&data("corpus.txt"), false, false).unwrap();
    assert_eq!(
        corpus_ids.len() as u64,
        v["corpus_num_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        format!("{:016x}", fnv1a64(&corpus_ids)),
        v["corpus_ids_fnv1a64"].as_str().unwrap()
    );
}
