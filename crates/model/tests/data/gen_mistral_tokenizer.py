"""Mistral 7B v0.3's real SentencePiece tokenizer (32768 tokens with [INST], [TOOL_CALLS], …; from
the `mistral_common` 1.12.0 wheel on PyPI, Apache-2.0: mistral_common/data/
mistral_instruct_tokenizer_240323.model.v3) and llama.cpp's tokenisation of a set of texts with
it: the outside reference of tests/tokenizer_mistral.rs.

`write MODEL DIR` writes DIR/mistral-v3-vocab.gguf (the vocabulary only, as llama.cpp's
conversion writes it: pieces, scores, token types, BOS/EOS/UNK, add_bos, add_space_prefix) and
DIR/mistral-v3-tiny.gguf (the same with a one-layer random llama model around it, for
llama-server; not kept). `reference URL` prints, for every text below, llama-server's token ids
(`/tokenize`, with and without BOS, with and without parsing special tokens) and its
`/detokenize` of them, one JSON line each. Run by hand:

    pip install sentencepiece protobuf numpy; export PYTHONPATH=$LLAMA_CPP/gguf-py
    python3 gen_mistral_tokenizer.py write mistral_instruct_tokenizer_240323.model.v3 .
    build/bin/llama-server -m mistral-v3-tiny.gguf -c 256 -t 2 --port 8093 &
    python3 gen_mistral_tokenizer.py reference http://127.0.0.1:8093 > mistral_tokenize.jsonl

tekken_tokenize.jsonl is the same reference for Mistral NeMo's Tekken vocabulary, served from
`scripts/tekken_vocab.py tekken-tiny.gguf --tiny` (same texts, same command).
"""

import json
import sys

TEXTS = [
    "",
    " ",
    "  ",
    "\n",
    "Hello world",
    " Hello world",
    "Hello  world,   three   spaces",
    "Hello\nworld\n\nnew paragraph\n",
    "\ttabbed\tline\r\nwindows line end",
    "The quick brown fox jumps over the lazy dog.",
    "What's the weather like in Paris today? It's 21°C.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '{"name": "get_weather", "arguments": {"city": "Madrid", "unit": "celsius"}}',
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "1234567890 3.14159 -42 1e-9 0x1F",
    "Café naïve résumé coöperate façade",
    "北京是中国的首都，也是最大的城市之一。",
    "日本の首都は東京です。",
    "서울은 한국의 수도입니다.",
    "Москва — столица России.",
    "مرحبا بالعالم",
    "Emoji: 🙂🚀👩‍💻 and symbols ∑∫√∞ ≠ ≤",
    "Rare bytes: \u0001\u0002 \u00a0non-breaking\u2009thin space",
    "[INST] What is 2+2? [/INST]",
    "[INST]What is 2+2?[/INST] 4</s>",
    "<s>[INST] Hi [/INST]",
    "[AVAILABLE_TOOLS] [{\"type\": \"function\"}][/AVAILABLE_TOOLS][INST] weather? [/INST]",
    "[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}]</s>",
    "[TOOL_RESULTS] {\"content\": 22} [/TOOL_RESULTS]",
    "unknown [NOT_A_TOKEN] brackets [INST",
    "a" * 200,
    "ab " * 50,
    "URLs: https://example.com/path?q=1&r=2#frag and mail@example.org",
    "Mixed-CASE wordsLikeThis and snake_case_names and kebab-case-names",
    "    indented code\n        more indented\n",
    "Ünïcödé ÅÄÖ åäö ß ẞ ǅ ﬁ ligature",
    "ÉCOLE École HELLOworld helloWORLD McDonald's iPhone XMLHttpRequest",
    "ΑΘΗΝΑ Αθήνα МосКВА ПРИВЕТмир",
    "paths/like/this/\n/and/that\r\n// comment\n",
    "  \n  x\t\n\ty \u3000 wide\u3000space\u0085next",
    "e.g. U.S.A. 3rd 2nd 100km 12:30 v1.2.3",
    "a.\n/b x\n\n/y path.\n/to/file.rs:\n/usr/bin",
    "helloWorld fooBar getHTTPResponse JSONParser camelCaseVariableName",
    "1234567 + 89 = 1234656; 3.14/2\n/",
]


def write(model_path, out_dir):
    import numpy as np
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as mp
    import gguf
    from gguf import GGMLQuantizationType as Q

    sp = spm.SentencePieceProcessor(model_file=model_path)
    proto = mp.ModelProto()
    proto.ParseFromString(open(model_path, "rb").read())
    n = sp.vocab_size()
    tokens, scores, types = [], [], []
    for i in range(n):  # as llama.cpp's convert_hf_to_gguf `_create_vocab_sentencepiece`
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        t = gguf.TokenType.NORMAL
        if sp.is_unknown(i):
            t = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            t = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            t = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            t = gguf.TokenType.BYTE
        types.append(t)

    def vocab(w):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)

    def arch(w, hidden):
        w.add_block_count(1)
        w.add_context_length(256)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(hidden)
        w.add_head_count(1)
        w.add_head_count_kv(1)
        w.add_rope_freq_base(1000000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(n)

    w = gguf.GGUFWriter(f"{out_dir}/mistral-v3-vocab.gguf", "llama")
    w.add_name("agentkv test fixture")
    arch(w, 64)
    vocab(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    rng = np.random.default_rng(3)
    hidden = 64
    w = gguf.GGUFWriter(f"{out_dir}/mistral-v3-tiny.gguf", "llama")
    w.add_name("agentkv test fixture")
    arch(w, hidden)
    vocab(w)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    w.add_tensor("token_embd.weight", gguf.quants.quantize(mat(n, hidden), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for name in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]:
        w.add_tensor(f"blk.0.{name}.weight", mat(hidden, hidden))
    for name in ["attn_norm", "ffn_norm"]:
        w.add_tensor(f"blk.0.{name}.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(base):
    from llama_server_ref import post

    for text in TEXTS:
        for add_special in (True, False):
            for parse_special in (True, False):
                ids = post(base, "/tokenize", {"content": text, "add_special": add_special,
                                               "parse_special": parse_special})["tokens"]
                back = post(base, "/detokenize", {"tokens": ids})["content"]
                print(json.dumps({"text": text, "add_special": add_special,
                                  "parse_special": parse_special, "ids": ids,
                                  "detokenized": back}, ensure_ascii=False))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "reference":
        reference(sys.argv[2])
    else:
        sys.exit(__doc__)
