"""Writes gemma3_greedy.jsonl: llama.cpp's tokenisation, greedy tokens and top-5 logprobs for
Gemma 3 270M (models/gemma-3-270m-q4_k_m.gguf) on raw-text prompts (a base model: no template).

Run by hand against a llama-server built from the `llama-cpp-python` source package (f16 KV,
flash attention auto = on for the CPU):
    llama-server -m models/gemma-3-270m-q4_k_m.gguf -c 2048 -t 2 --port 8091 &
    python3 gen_gemma3_reference.py http://127.0.0.1:8091 > gemma3_greedy.jsonl
Fields as in greedy.jsonl (the SmolLM2 reference): id, prompt, prompt_text, prompt_ids
(BOS added, as the GGUF asks), greedy_ids, greedy_text, top_logprobs (chosen id + logprob and the
top 5), stable_len (tokens before the first top-2 gap below 0.1 nats)."""

import json
import sys
import urllib.request

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


def post(base, path, body):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def main():
    base = sys.argv[1]
    for pid, text in PROMPTS:
        ids = post(base, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
        out = post(
            base,
            "/completion",
            {
                "prompt": ids,
                "n_predict": N_PREDICT,
                "temperature": 0,
                "top_k": 1,
                "samplers": ["top_k"],
                "n_probs": 5,
                "cache_prompt": False,
                "ignore_eos": False,
            },
        )
        probs = out["completion_probabilities"]
        greedy = [p["id"] for p in probs]
        top = [
            {
                "id": p["id"],
                "logprob": p["logprob"],
                "top": [{"id": c["id"], "logprob": c["logprob"]} for c in p["top_logprobs"]],
            }
            for p in probs
        ]
        stable = 0
        for p in top:
            if len(p["top"]) > 1 and p["top"][0]["logprob"] - p["top"][1]["logprob"] < 0.1:
                break
            stable += 1
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
