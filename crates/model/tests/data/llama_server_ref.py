"""What the reference generators (gen_heldout_reference.py, gen_gemma3_reference.py,
gen_arch_fixtures.py) ask a running llama-server: greedy tokens with their top-5 logprobs after a
token-id prompt, in the fields of greedy.jsonl."""

import json
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def greedy_reference(base, ids, n_predict, ignore_eos=False, digits=None):
    """(greedy ids, per-position {"id", "logprob", "top"}, stable length) for the prompt `ids`.

    llama-server reports no probabilities for a token that leaves the text ending in an
    incomplete UTF-8 character (e.g. the first byte token of a CJK or Cyrillic character);
    `tokens` has every generated id. Such positions get "logprob": None and no candidates, and do
    not end the stable prefix (their token is known, their gap is not). The stable prefix ends at
    the first top-2 gap below 0.1 nats. `digits` rounds the logprobs when set."""
    out = post(base, "/completion", {
        "prompt": ids, "n_predict": n_predict, "temperature": 0, "top_k": 1,
        "samplers": ["top_k"], "n_probs": 5, "cache_prompt": False, "ignore_eos": ignore_eos,
        "return_tokens": True,
    })
    rnd = (lambda x: round(x, digits)) if digits is not None else (lambda x: x)
    greedy = out["tokens"]
    probs = out["completion_probabilities"]
    top, j = [], 0
    for tok in greedy:
        if j < len(probs) and probs[j]["id"] == tok:
            p = probs[j]
            j += 1
            top.append({"id": tok, "logprob": rnd(p["logprob"]),
                        "top": [{"id": c["id"], "logprob": rnd(c["logprob"])}
                                for c in p["top_logprobs"]]})
        else:
            top.append({"id": tok, "logprob": None, "top": []})
    assert j == len(probs), "probabilities do not align with the tokens"
    stable = 0
    for p in top:
        if len(p["top"]) > 1 and p["top"][0]["logprob"] - p["top"][1]["logprob"] < 0.1:
            break
        stable += 1
    return greedy, top, stable
