#!/usr/bin/env python3
"""Where a server's step time went: reads a log of `agentkv serve` run with
`RUST_LOG=agentkv::step=trace,info AGENTKV_LOG_FORMAT=json` (one JSON line per forward step:
rows, decodes, prefill tokens, deepest position, microseconds) and prints the time in
prefill-only, mixed (prefill chunk beside decodes) and decode-only steps, the decode-only
steps' median time by batch size and the mixed steps' cost per prefill token.

    scripts/bench/step_mix.py LOG [LOG ...]
"""
import collections
import json
import statistics
import sys

for path in sys.argv[1:]:
    steps = []
    for line in open(path):
        if line.startswith("{") and '"agentkv::step"' in line:
            steps.append(json.loads(line))
    if not steps:
        print(f"{path}: no step lines (was the server run with RUST_LOG=agentkv::step=trace?)")
        continue
    total = sum(s["took_us"] for s in steps) / 1e6
    print(f"{path}: {len(steps)} steps, {total:.1f} s of forward steps")
    kinds = collections.defaultdict(lambda: [0, 0.0, 0, 0])
    for s in steps:
        kind = ("decode-only" if s["prefill_tokens"] == 0
                else "prefill-only" if s["decodes"] == 0 else "mixed")
        k = kinds[kind]
        k[0] += 1
        k[1] += s["took_us"] / 1e6
        k[2] += s["prefill_tokens"]
        k[3] += s["decodes"]
    for kind, (n, secs, pre, dec) in sorted(kinds.items()):
        print(f"  {kind:13} {n:5} steps {secs:6.1f} s  prefill tokens {pre:6}  decode tokens {dec:5}")
    by_batch = collections.defaultdict(list)
    for s in steps:
        if s["prefill_tokens"] == 0:
            by_batch[s["decodes"]].append(s["took_us"] / 1e3)
    for b in sorted(by_batch):
        v = by_batch[b]
        print(f"  decode-only, {b:2} decodes: {len(v):4} steps, median {statistics.median(v):6.1f} ms")
    mixed = [s for s in steps if s["prefill_tokens"] > 0 and s["decodes"] > 0]
    if mixed:
        per = sum(s["took_us"] for s in mixed) / sum(s["prefill_tokens"] for s in mixed) / 1e3
        print(f"  mixed: median {statistics.median(s['prefill_tokens'] for s in mixed)} prefill tokens "
              f"a step, {statistics.median(s['took_us'] / 1e3 for s in mixed):.1f} ms; "
              f"{per:.2f} ms a prefill token (the step's decodes included)")
