#!/usr/bin/env python3
"""What a Mooncake trace reveals online about a conversation's next turn (issue #49).

For each request, the conversation it continues is inferred as the server infers it: the latest
earlier request whose whole-block prefix (two blocks or more, so the system block every request
shares does not join them) is a prefix of this one. Prints, for the inferred turns:
  - how often a turn is continued at all, by turn depth, output length and input length: the
    features an online policy has when it must decide whether to keep a turn's blocks;
  - the gap to the next turn by depth, and by the previous gap: what a learned return time sees;
  - the block reads any policy can hit, and the share on turns that are never continued.
No policy is simulated here (`agentkv cache-sim` does that); this shows the information a policy
has, which bounds what a policy without hints can do.

    scripts/bench/mooncake_continuation.py TRACE.jsonl
"""
import collections
import json
import sys


def main(path):
    reqs = [json.loads(line) for line in open(path)]
    owner, parent = {}, [None] * len(reqs)
    for i, r in enumerate(reqs):
        h = r["hash_ids"]
        for k in range(len(h), 1, -1):
            j = owner.get(tuple(h[:k]))
            if j is not None:
                parent[i] = j
                break
        full = r["input_length"] // 512
        for k in range(2, full + 1):
            owner[tuple(h[:k])] = i
    depth, nchild = [0] * len(reqs), [0] * len(reqs)
    for i, p in enumerate(parent):
        if p is not None:
            depth[i] = depth[p] + 1
            nchild[p] += 1
    cont = [c > 0 for c in nchild]
    print(f"trace: {path.split('/')[-1]}: {len(reqs)} requests over {reqs[-1]['timestamp'] / 1000:.0f} s; "
          f"{sum(p is None for p in parent)} start a conversation, {sum(cont)} turns are continued "
          f"({100 * sum(cont) / len(reqs):.1f}%)")

    def table(name, key):
        by = collections.defaultdict(lambda: [0, 0])
        for i, r in enumerate(reqs):
            b = key(i, r)
            by[b][0] += 1
            by[b][1] += cont[i]
        print(f"\nP(continued) by {name}:")
        for b, (n, c) in sorted(by.items()):
            print(f"  {b:>12}  {n:6d} turns  {100 * c / n:5.1f}%")

    table("turn depth (0 = first turn; 8 = 8 or more)", lambda i, r: min(depth[i], 8))
    table("output length (tokens, up to)", lambda i, r: 2 ** min(r["output_length"].bit_length(), 11))
    table("input length (tokens, up to)", lambda i, r: 2 ** r["input_length"].bit_length())

    def quantiles(xs):
        xs = sorted(xs)
        return " ".join(f"{xs[int(q * len(xs))]:6.0f}" for q in (0.1, 0.25, 0.5, 0.75, 0.9))

    gap = lambda i: (reqs[i]["timestamp"] - reqs[parent[i]]["timestamp"]) / 1000
    print("\ngap to the next turn (s), quantiles 10/25/50/75/90%, by the depth of the turn continued:")
    by = collections.defaultdict(list)
    for i, p in enumerate(parent):
        if p is not None:
            by[min(depth[p], 3)].append(gap(i))
    for d, xs in sorted(by.items()):
        print(f"  depth {d}{'+' if d == 3 else ' '}  {len(xs):5d} gaps  {quantiles(xs)}")
    print("by the previous gap of the same conversation (s, up to):")
    by = collections.defaultdict(list)
    for i, p in enumerate(parent):
        if p is not None and parent[p] is not None:
            by[2 ** int(gap(p)).bit_length()].append(gap(i))
    for b, xs in sorted(by.items()):
        if len(xs) >= 20:
            print(f"  {b:6d}  {len(xs):5d} gaps  {quantiles(xs)}")

    seen, hit_any, on_last = set(), 0, 0
    total = sum(len(r["hash_ids"]) for r in reqs)
    for i, r in enumerate(reqs):
        h = r["hash_ids"]
        k = 0
        while k < len(h) and h[k] in seen:
            k += 1
        hit_any += k
        seen.update(h)
    new_on_never = sum(len(r["hash_ids"]) - (len(reqs[parent[i]]["hash_ids"]) if parent[i] is not None else 1)
                       for i, r in enumerate(reqs) if not cont[i])
    print(f"\nblock reads: {total}; at most {100 * hit_any / total:.1f}% can ever hit (an infinite pool); "
          f"blocks first written by turns that are never continued: {new_on_never} "
          f"({100 * new_on_never / total:.1f}% of reads): a policy that cannot tell those turns "
          f"apart keeps them as long as the others")


if __name__ == "__main__":
    main(sys.argv[1])
