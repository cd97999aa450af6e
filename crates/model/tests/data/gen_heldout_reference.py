"""Writes heldout_greedy.jsonl: llama.cpp's greedy tokens and top-5 logprobs for the default model
(SmolLM2-135M-Instruct Q4_1) on 52 held-out prompts that no kernel or test was tuned on: short
and long, single- and multi-turn chat (the model's ChatML), tool-call-shaped turns, non-English
text and code. Raw prompts: chat turns are written out in ChatML here, so the prompt text is
exactly what both implementations tokenise.

Run by hand against a llama-server built from the `llama-cpp-python` source package (f16 KV,
flash attention auto = on for the CPU, one slot so every prompt is prefilled alone), with the
CPU backend built for AVX2 (no AVX-512) like the one that wrote the shared references
(greedy.jsonl): the AVX-512 build sums attention in another order, which alone moves logprobs by
0.04 on average (docs/history/benchmarks-log.md, "Held-out fidelity"). On an AVX-512 machine:
    cmake -S . -B build-avx2 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
        -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF && cmake --build build-avx2 --target ggml-cpu
    LD_LIBRARY_PATH=build-avx2/bin:build/bin build/bin/llama-server \
        -m models/SmolLM2-135M-Instruct.Q4_1.gguf -c 4096 -t 2 -np 1 --port 8092 &
    python3 gen_heldout_reference.py http://127.0.0.1:8092 > heldout_greedy.jsonl
Fields as in greedy.jsonl: id, prompt (= prompt_text), prompt_ids (special tokens parsed, no BOS
added: SmolLM2 does not ask for one), greedy_ids, greedy_text, top_logprobs (chosen id + logprob
and the top 5), stable_len (tokens before the first top-2 gap below 0.1 nats)."""

import json
import sys
from llama_server_ref import greedy_reference, post

SYS = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def chat(*turns, system=SYS):
    out = system
    for role, text in turns:
        out += f"<|im_start|>{role}\n{text}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


TOOLS = (
    "<|im_start|>system\nYou can call tools. Reply with a JSON object "
    '{"name": ..., "arguments": {...}} to call one.\nTools:\n'
    '- get_weather(city: string, unit: "c" | "f")\n- search_docs(query: string, limit: int)\n'
    "- run_sql(query: string)<|im_end|>\n"
)
LONG_DOC = (
    "The logging module defines functions and classes which implement a flexible event logging "
    "system for applications and libraries. The key benefit of having the logging API provided by "
    "a standard library module is that all Python modules can participate in logging, so your "
    "application log can include your own messages integrated with messages from third-party "
    "modules. Loggers expose the interface that application code directly uses. Handlers send the "
    "log records created by loggers to the appropriate destination. Filters provide a finer grained "
    "facility for determining which log records to output. Formatters specify the layout of log "
    "records in the final output. "
)
CODE_RUST = (
    "fn merge(a: &[i32], b: &[i32]) -> Vec<i32> {\n    let (mut i, mut j) = (0, 0);\n"
    "    let mut out = Vec::with_capacity(a.len() + b.len());\n    while i < a.len() && j < b.len() {\n"
)
CODE_PY = (
    "import json\n\n\ndef load_config(path):\n    \"\"\"Read a JSON config file and return a dict with defaults filled in.\"\"\"\n"
    "    with open(path) as f:\n"
)

PROMPTS = [
    # short chat
    ("c-hello", chat(("user", "Hi!"))),
    ("c-sky", chat(("user", "Why is the sky blue? One sentence."))),
    ("c-2plus2", chat(("user", "What is 2 + 2?"))),
    ("c-poem", chat(("user", "Write a two-line poem about rain."))),
    ("c-synonym", chat(("user", "Give me a synonym for 'happy'."))),
    ("c-translate", chat(("user", "Translate 'good morning' into Spanish."))),
    ("c-list", chat(("user", "List three fruits that are red."))),
    ("c-define", chat(("user", "Define photosynthesis briefly."))),
    ("c-advice", chat(("user", "How can I sleep better? Give one tip."))),
    ("c-nosys", chat(("user", "Name a planet with rings."), system="")),
    # multi-turn chat
    ("m-name", chat(("user", "My name is Ada."), ("assistant", "Nice to meet you, Ada!"), ("user", "What is my name?"))),
    ("m-math", chat(("user", "What is 7 times 6?"), ("assistant", "7 times 6 is 42."), ("user", "And divided by 2?"))),
    ("m-recipe", chat(("user", "I want to bake bread."), ("assistant", "Great! Do you have flour, water, yeast and salt?"), ("user", "Yes, all of them. What is the first step?"))),
    ("m-travel", chat(("user", "I am visiting Paris next week."), ("assistant", "Wonderful! Paris has many museums and cafes."), ("user", "Which museum should I see first?"))),
    ("m-code", chat(("user", "How do I reverse a list in Python?"), ("assistant", "Use my_list.reverse() or my_list[::-1]."), ("user", "Which one makes a copy?"))),
    ("m-three", chat(("user", "Let's play a word game."), ("assistant", "Sure! Say a word."), ("user", "Apple."), ("assistant", "Elephant."), ("user", "Tiger."))),
    ("m-support", chat(("user", "My laptop will not turn on."), ("assistant", "Is it plugged in and is the charging light on?"), ("user", "The light is on but the screen stays black."))),
    ("m-story", chat(("user", "Start a story about a dragon."), ("assistant", "Once upon a time, a small dragon named Ember lived in a cave."), ("user", "Continue the story."))),
    # tool-call-shaped
    ("t-weather", TOOLS + "<|im_start|>user\nWhat's the weather in Oslo in celsius?<|im_end|>\n<|im_start|>assistant\n"),
    ("t-search", TOOLS + "<|im_start|>user\nFind the docs about asyncio timeouts, 3 results.<|im_end|>\n<|im_start|>assistant\n"),
    ("t-sql", TOOLS + "<|im_start|>user\nHow many users signed up in 2024? Use the database.<|im_end|>\n<|im_start|>assistant\n"),
    ("t-result", TOOLS + "<|im_start|>user\nWeather in Rome?<|im_end|>\n<|im_start|>assistant\n"
     '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}<|im_end|>\n'
     '<|im_start|>tool\n{"temp": 21, "sky": "sunny"}<|im_end|>\n<|im_start|>assistant\n'),
    ("t-json-open", TOOLS + "<|im_start|>user\nWeather in Lima in fahrenheit.<|im_end|>\n<|im_start|>assistant\n{\"name\": \""),
    ("t-args", TOOLS + "<|im_start|>user\nSearch docs for 'pathlib glob'.<|im_end|>\n<|im_start|>assistant\n{\"name\": \"search_docs\", \"arguments\": {"),
    ("t-react", chat(("user", "Thought: I need the population of Japan.\nAction: search\nAction Input: population of Japan\nObservation: about 124 million (2024)\nThought:"))),
    ("t-two-calls", TOOLS + "<|im_start|>user\nCompare the weather in Paris and Berlin.<|im_end|>\n<|im_start|>assistant\n"
     '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}<|im_end|>\n'
     '<|im_start|>tool\n{"temp": 14}<|im_end|>\n<|im_start|>assistant\n'),
    # non-English
    ("n-fr", chat(("user", "Quelle est la capitale de l'Italie ?"))),
    ("n-de", chat(("user", "Wie viele Tage hat eine Woche?"))),
    ("n-es", chat(("user", "¿Cuál es el río más largo del mundo?"))),
    ("n-it", "La pizza margherita è fatta con"),
    ("n-pt", "O Brasil é o maior país da América do Sul e"),
    ("n-zh", "北京是中国的首都，也是"),
    ("n-ja", "日本の首都は東京です。東京は"),
    ("n-ru", "Москва — столица России и"),
    # code
    ("k-rust", CODE_RUST),
    ("k-py", CODE_PY),
    ("k-sql", "-- Top five customers by total order value\nSELECT c.name, SUM(o.total) AS spent\nFROM customers c\nJOIN orders o ON"),
    ("k-js", "function debounce(fn, ms) {\n  let timer;\n  return function (...args) {\n"),
    ("k-bash", "#!/bin/bash\n# Back up every .conf file under /etc into a dated tarball\nset -euo pipefail\n"),
    ("k-c", "#include <stdio.h>\n\nint main(void) {\n    int sum = 0;\n    for (int i = 1; i <= 10; i++) {\n"),
    ("k-html", "<!DOCTYPE html>\n<html>\n<head>\n  <title>My page</title>\n</head>\n<body>\n"),
    ("k-chat", chat(("user", "Write a Python function that checks whether a string is a palindrome."))),
    # raw text, short
    ("r-capital", "The capital of Canada is"),
    ("r-count", "One, two, three, four,"),
    ("r-quote", "To be, or not to be:"),
    # long (beyond 64 tokens: llama.cpp prefills them with its tiled kernel; one beyond 256)
    ("l-doc-q", chat(("user", LONG_DOC + "\n\nWhat do handlers do?"))),
    ("l-doc-sum", chat(("user", "Summarise in one sentence:\n" + LONG_DOC))),
    ("l-doc-raw", LONG_DOC + "A logger is"),
    ("l-doc-x3", chat(("user", (LONG_DOC * 3) + "\nWhich class decides the layout of a record?"))),
    ("l-multi", chat(("user", "I am writing a web service in Rust."), ("assistant", "Great choice! Which framework are you using?"),
                     ("user", "axum, with tokio. I need to add request logging."), ("assistant", "You can use tower-http's TraceLayer."),
                     ("user", "How do I add it to my router? Show the line of code."))),
    ("l-code", "Below is a Python module.\n\n" + CODE_PY + "        data = json.load(f)\n    return data\n\n\ndef save_config(path, cfg):\n"),
    ("l-tools", TOOLS + "<|im_start|>user\nI am planning a trip. First check the weather in Madrid in celsius, then find docs about packing lists.<|im_end|>\n<|im_start|>assistant\n"),
]
N_PREDICT = 32


def main():
    base = sys.argv[1]
    assert len(PROMPTS) >= 50 and len({p for p, _ in PROMPTS}) == len(PROMPTS)
    for pid, text in PROMPTS:
        ids = post(base, "/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
        greedy, top, stable = greedy_reference(base, ids, N_PREDICT, digits=5)
        greedy_text = post(base, "/detokenize", {"tokens": greedy})["content"]
        print(json.dumps({"id": pid, "prompt": text, "prompt_text": text, "prompt_ids": ids,
                          "greedy_ids": greedy, "greedy_text": greedy_text, "top_logprobs": top,
                          "stable_len": stable}, ensure_ascii=False))


if __name__ == "__main__":
    main()
