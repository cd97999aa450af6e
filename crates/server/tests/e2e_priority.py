"""Priority preemption through the official `openai` client (unchanged), end to end.

Usage: e2e_priority.py BASE_URL. The server must run the config written by
crates/agentkv/tests/serve_priority.rs: one running request at a time
(`limits.max_running_requests: 1`), no tenants.

Checks, with vLLM's convention (lower `priority` is more important):
1. A more important request that arrives while a less important one is decoding preempts it:
   it finishes first, and `agentkv_preemptions_total` goes up.
2. The preempted request's stream resumes where it stopped: its text equals the same request
   run alone (greedy), so the preemption (a recompute) is invisible in the output.
3. Control: at equal priorities the second request waits for the first (FIFO, no preemption).
Exits non-zero with a message on the first failed check.
"""
import re
import sys
import threading
import time
import urllib.request

import openai

BASE = sys.argv[1]
CLIENT = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=300)
LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
SHORT = [{"role": "user", "content": "Name three primary colours."}]
# Long enough that the low-priority stream is still decoding when the other request arrives.
LONG_TOKENS = 64
SHORT_TOKENS = 8


def check(ok, what):
    if not ok:
        print("FAILED:", what)
        sys.exit(1)
    print("ok:", what)


def preemptions():
    with urllib.request.urlopen(BASE + "/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(r"^agentkv_preemptions_total(?:\{[^}]*\})? (\d+)", text, re.M)
    check(m is not None, "agentkv_preemptions_total is exported")
    return int(m.group(1))


def alone(messages, max_tokens):
    r = CLIENT.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                       temperature=0, extra_body={"ignore_eos": True})
    return r.choices[0].message.content


def race(long_priority, short_priority):
    """Streams LONG at long_priority; once it has produced text, sends SHORT at short_priority.
    Returns (long text, short text, time LONG ended, time SHORT ended)."""
    first_chunk = threading.Event()
    out = {}

    def long_call():
        parts = []
        stream = CLIENT.chat.completions.create(
            model="m", messages=LONG, max_tokens=LONG_TOKENS, temperature=0, stream=True,
            extra_body={"ignore_eos": True, "priority": long_priority})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                first_chunk.set()
        out["long"] = "".join(parts)
        out["long_end"] = time.monotonic()
        first_chunk.set()

    t = threading.Thread(target=long_call)
    t.start()
    check(first_chunk.wait(120), "the long request starts streaming")
    r = CLIENT.chat.completions.create(
        model="m", messages=SHORT, max_tokens=SHORT_TOKENS, temperature=0,
        extra_body={"ignore_eos": True, "priority": short_priority})
    short_end = time.monotonic()
    t.join(300)
    check(not t.is_alive(), "the long request finishes")
    return out["long"], r.choices[0].message.content, out["long_end"], short_end


long_ref = alone(LONG, LONG_TOKENS)
short_ref = alone(SHORT, SHORT_TOKENS)

before = preemptions()
long_text, short_text, long_end, short_end = race(long_priority=10, short_priority=-10)
after = preemptions()
check(short_end < long_end, "the more important request finished while the other waited")
check(after >= before + 1, f"the running request was preempted ({before} -> {after})")
check(short_text == short_ref, "the important request's output equals its output alone")
check(long_text == long_ref, "the preempted stream resumes: its text equals the request alone")

before = preemptions()
long_text, short_text, long_end, short_end = race(long_priority=0, short_priority=0)
check(preemptions() == before, "equal priorities never preempt")
check(long_end <= short_end, "at equal priority the second request waits for the first")
check((long_text, short_text) == (long_ref, short_ref), "outputs unchanged without preemption")

print("ALL PRIORITY CHECKS PASSED")
