"""Writes gemma3_greedy.jsonl: llama.cpp's tokenisation, greedy tokens and top-5 logprobs for
Gemma 3 270M (models/gemma-3-270m-q4_k_m.gguf) on raw-text prompts (a base model: no template).

Run by hand against a llama-server built from the `llama-cpp-python` source package (f16 KV,
flash attention auto = on for the CPU, one slot), with the CPU backend built for AVX2 (no
AVX-512) as for heldout_greedy.jsonl (see gen_heldout_reference.py for the cmake line): the
AVX-512 build sums attention in another order, and Gemma 3 amplifies that.
    LD_LIBRARY_PATH=build-avx2/bin:build/bin build/bin/llama-server \
        -m models/gemma-3-270m-q4_k_m.gguf -c 2048 -t 2 -np 1 --port 8091 &
    python3 gen_gemma3_reference.py http://127.0.0.1:8091 > gemma3_greedy.jsonl
Fields as in greedy.jsonl (the SmolLM2 reference): id, prompt, prompt_text, prompt_ids
(BOS added, as the GGUF asks), greedy_ids, greedy_text, top_logprobs (chosen id + logprob and the
top 5), stable_len (tokens before the first top-2 gap below 0.1 nats)."""

import json
import sys
from llama_server_ref import greedy_reference, post

PROMPTS = [
    ("capital", "The capital of France is"),
    ("python-def", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("list", "Three primary colours are red,"),
    ("json", '{"name": "Alice", "age": 30, "city": "'),
    ("math", "Question: What is 12 plus 30?\nAnswer:"),
    ("german", "Die Hauptstadt von Deutschland ist"),
    ("spaces", "Indented   text\twith  tabs\n\n  and  blank lines:"),
    ("turns", "<start_of_turn>user\nWrite a haiku about autumn.<end_of_turn>\n<start_of_turn>model\n"),
    ("unicode", "Emoji 🙂 and accents: café, naïve, 東京 is the capital of"),
    ("howto", "To make a cup of tea, first"),
    ("sql", "SELECT name, COUNT(*) FROM users WHERE"),
]
N_PREDICT = 24


def main():
    base = sys.argv[1]
    for pid, text in PROMPTS:
        ids = post(base, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
        greedy, top, stable = greedy_reference(base, ids, N_PREDICT)
        greedy_text = post(base, "/detokenize", {"tokens": greedy})["content"]
        print(
            json.dumps(
                {
                    "id": pid,
                    "prompt": text,
                    "prompt_text": text,
                    "prompt_ids": ids,
                    "greedy_ids": greedy,
                    "greedy_text": greedy_text,
                    "top_logprobs": top,
                    "stable_len": stable,
                },
                ensure_ascii=False,
            )
        )


if __name__ == "__main__":
    main()
