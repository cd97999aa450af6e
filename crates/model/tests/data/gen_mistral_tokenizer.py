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
from pathlib import Path

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
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as mp
    import gguf

    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "scripts"))
    from tekken_vocab import write_vocab_gguf

    sp = spm.SentencePieceProcessor(model_file=model_path)
    proto = mp.ModelProto()
    proto.ParseFromString(open(model_path, "rb").read())
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):  # as llama.cpp's `_create_vocab_sentencepiece`
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
    vocab = {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores,
             "types": types, "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(),
             "add_space_prefix": proto.normalizer_spec.add_dummy_prefix}
    write_vocab_gguf(f"{out_dir}/mistral-v3-vocab.gguf", vocab, tiny=False)
    write_vocab_gguf(f"{out_dir}/mistral-v3-tiny.gguf", vocab, tiny=True)


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
