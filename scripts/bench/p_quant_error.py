#!/usr/bin/env python3
"""How far attention's output moves when the softmax weights `p` of `p·V` are kept in 8 bits
instead of bf16 (issue #48: could `p·V` run on int8 dot products, `vpdpbusd`?).

One attention row over `n` positions with scores ~ N(0, sigma^2), optionally an attention sink
(position 0's score raised by SINK, as real models' first token), V ~ N(0, 1) with 64 dims; the
online softmax over 32-position tiles as agentkv's tile step runs it. Compared with the exact
f64 result, relative L2 error of the output (mean of TRIALS rows) for:
  bf16   - weights rounded to bf16 (what the bf16-pair step uses today);
  u8-fix - weights exp(s - m) <= 1 (the maximum raised exactly) quantised at the fixed scale
           1/255: no per-tile maximum to find, what would make `p·V` on `vpdpbusd` pay;
  u8-tile- weights quantised against the tile's own largest weight (a horizontal maximum and
           a division per row and tile: the cost that made the int8 prototype no faster).

    python3 scripts/bench/p_quant_error.py [TRIALS]      (needs numpy)
"""
import sys

import numpy as np


def bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def tiled(s, v, quant):
    acc, l, m = np.zeros(v.shape[1]), 0.0, -np.inf
    for t in range(0, len(s), 32):
        st = s[t:t + 32]
        big = max(m, st.max())
        if big > m:
            f = np.exp(m - big) if m > -np.inf else 0.0
            acc, l, m = acc * f, l * f, big
        w = quant(np.exp(st - m))
        acc, l = acc + w @ v[t:t + 32], l + w.sum()
    return acc / l


QUANTS = {
    "bf16": bf16,
    "u8-fix": lambda w: np.round(w * 255) / 255,
    "u8-tile": lambda w: np.round(w / w.max() * 255) / 255 * w.max(),
}


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rng = np.random.default_rng(0)
    print(f"relative L2 error of one attention row's output against f64, mean of {trials} rows")
    print(f"{'sink':>5} {'sigma':>5} {'n':>5}  " + "  ".join(f"{k:>9}" for k in QUANTS))
    for sink in (0.0, 8.0):
        for sigma in (1.0, 2.0, 4.0):
            for n in (512, 4096):
                errs = {k: [] for k in QUANTS}
                for _ in range(trials):
                    s = rng.normal(0, sigma, n)
                    s[0] += sink
                    v = rng.normal(0, 1, (n, 64))
                    p = np.exp(s - s.max())
                    ref = p @ v / p.sum()
                    for k, q in QUANTS.items():
                        out = tiled(s, v, q)
                        errs[k].append(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                print(f"{sink:5.1f} {sigma:5.1f} {n:5d}  "
                      + "  ".join(f"{np.mean(errs[k]):9.2e}" for k in QUANTS))


if __name__ == "__main__":
    main()
