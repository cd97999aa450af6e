"""Tiny random-weight GGUF files for the architectures that no real model on PyPI covers, and
llama.cpp's greedy tokens and logprobs on them: the outside reference of
tests/reference_archs.rs.

`write DIR` writes DIR/<name>.gguf for every fixture below with llama.cpp's own GGUF writer
(`gguf-py` from the llama.cpp tree; numpy needed): a SentencePiece vocabulary of 320 tokens (ASCII
bytes), Q8_0 attention matrices and embeddings, Q4_0 FFN matrices (llama3, qwen3: llama.cpp
repacks those on AVX2 CPUs, another float order) or Q5_0 gate/up and Q4_1 down ones (the others),
f32 norms, biases and RoPE factors, weights drawn from a fixed seed per fixture.

`reference URL NAME` asks a llama-server serving DIR/NAME.gguf for greedy tokens with top-5
logprobs after token-id prompts of 6 to 400 tokens (fixed per fixture), and prints one line per
prompt in greedy.jsonl's format (`id` = NAME/prompt). Run by hand, as for gen_gemma3_reference.py,
against llama-server with the CPU backend built for AVX2 (see gen_heldout_reference.py):

    export PYTHONPATH=$LLAMA_CPP/gguf-py
    python3 gen_arch_fixtures.py write arch
    for n in llama3 mistral qwen2 qwen3 phi3 llama-linear qwen2-yarn phi3-longrope gemma3-linear; do
      LD_LIBRARY_PATH=build-avx2/bin:build/bin build/bin/llama-server -m arch/$n.gguf \
          -c 1024 -t 2 -np 1 --port 8092 & sleep 3
      python3 gen_arch_fixtures.py reference http://127.0.0.1:8092 $n >> arch_greedy.jsonl
      kill %1; wait
    done
"""

import json
import sys
from llama_server_ref import greedy_reference

import numpy as np

# Normal pieces, ASCII apart from SentencePiece's word mark: every token decodes to whole UTF-8
# characters (llama-server reports no probabilities for a token that leaves an incomplete one).
VOCAB_EXTRA = ["\u2581"] + [f"\u2581{c}" for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"] + [
    ("\u2581" if i % 2 else "") + a + b for i, (a, b) in enumerate(
        (a, b) for a in "etaoinshrdlu" for b in "etaoinshrdlucm")
][:136]
# Control tokens, the 128 ASCII bytes (byte fallback) and the pieces: 320.
VOCAB = 3 + 128 + len(VOCAB_EXTRA)

# name: architecture and shape. `key_length` differs from hidden / heads where set.
FIXTURES = {
    # Llama 3: interleaved RoPE, GQA 4:1, RoPE frequency factors (`rope_freqs.weight`).
    "llama3": dict(arch="llama", hidden=128, heads=2, kv_heads=1, ffn=256, layers=2,
                   rope_base=500000.0, rope_freqs=True, tied=True, ffn_q4_0=True),
    # Mistral Nemo's shape: a llama file whose head size (key_length) is not hidden / heads.
    "mistral": dict(arch="llama", hidden=128, heads=4, kv_heads=2, key_length=64, ffn=256,
                    layers=2, rope_base=1000000.0, tied=False),
    # Qwen 2 / 2.5: Q/K/V biases, NEOX RoPE, a separate output matrix.
    "qwen2": dict(arch="qwen2", hidden=128, heads=2, kv_heads=1, ffn=256, layers=2,
                  rope_base=1000000.0, biases=True, tied=False),
    # Qwen 3: QK-norm, head size 64 with hidden 128 and 4 heads (q width 256), tied output.
    "qwen3": dict(arch="qwen3", hidden=128, heads=4, kv_heads=2, key_length=64, ffn=256,
                  layers=2, rope_base=1000000.0, qk_norm=True, tied=True, ffn_q4_0=True),
    # Phi 3: fused QKV and gate/up matrices, head size 96, no GQA, queries scaled first.
    "phi3": dict(arch="phi3", hidden=192, heads=2, kv_heads=2, ffn=256, layers=2,
                 rope_base=10000.0, fused=True, tied=False),
    # RoPE scaling: linear (factor 2), YaRN (Qwen 2.5's long-context setting: factor 4 over an
    # original context of 128), and Phi 3 128K's longrope (per-pair long / short factors, the
    # long ones as the served context of 1024 exceeds the original 256, and its magnitude).
    "llama-linear": dict(arch="llama", hidden=128, heads=2, kv_heads=1, ffn=256, layers=2,
                         rope_base=10000.0, tied=True, scaling=("linear", 2.0, None)),
    "qwen2-yarn": dict(arch="qwen2", hidden=128, heads=2, kv_heads=1, ffn=256, layers=2,
                       rope_base=10000.0, biases=True, tied=False, scaling=("yarn", 4.0, 128)),
    "phi3-longrope": dict(arch="phi3", hidden=192, heads=2, kv_heads=2, ffn=256, layers=2,
                          rope_base=10000.0, fused=True, tied=False, longrope=256),
    # Gemma 3 4B's RoPE: linear factor 8 on the global layers only; a sliding-window layer
    # (window 32, its own base) then a global one.
    "gemma3-linear": dict(arch="gemma3", hidden=128, heads=2, kv_heads=1, key_length=64,
                          ffn=256, layers=2, rope_base=1000000.0, qk_norm=True, tied=True,
                          gemma=True, scaling=("linear", 8.0, None)),
}
PROMPT_LENS = [6, 40, 90, 200, 400]
N_PREDICT = 16
CONTEXT = 1024


def seed_of(name):
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def write(dirname):
    import gguf
    from gguf import GGMLQuantizationType as Q

    for name, f in FIXTURES.items():
        rng = np.random.default_rng(seed_of(name))
        arch, hidden, heads, kvh = f["arch"], f["hidden"], f["heads"], f["kv_heads"]
        hd = f.get("key_length", hidden // heads)
        ffn, layers = f["ffn"], f["layers"]
        w = gguf.GGUFWriter(f"{dirname}/{name}.gguf", arch)
        # (A name with "phi3" in it makes llama.cpp look for Phi 3's own special tokens.)
        w.add_name("agentkv test fixture")
        w.add_block_count(layers)
        w.add_context_length(CONTEXT)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(kvh)
        if "key_length" in f:
            w.add_key_length(hd)
            w.add_value_length(hd)
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(f["rope_base"])
        w.add_layer_norm_rms_eps(1e-6)
        w.add_vocab_size(VOCAB)
        if "scaling" in f:
            kind, factor, orig = f["scaling"]
            w.add_rope_scaling_type({"linear": gguf.RopeScalingType.LINEAR,
                                     "yarn": gguf.RopeScalingType.YARN}[kind])
            w.add_rope_scaling_factor(factor)
            if orig is not None:
                w.add_rope_scaling_orig_ctx_len(orig)
        if f.get("gemma"):
            w.add_sliding_window(32)
            w.add_sliding_window_pattern(2)
            w.add_rope_freq_base_swa(10000.0)
        if "longrope" in f:
            # As llama.cpp's conversion writes Phi 3 128K: no type, the original context, the
            # magnitude sqrt(1 + ln(scale) / ln(original)).
            orig = f["longrope"]
            w.add_rope_scaling_orig_ctx_len(orig)
            scale = CONTEXT / orig
            w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(orig))))
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
        # SentencePiece byte vocabulary.
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(128)] + VOCAB_EXTRA
        types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        types += [gguf.TokenType.BYTE] * 128 + [gguf.TokenType.NORMAL] * len(VOCAB_EXTRA)
        scores = [0.0] * 131 + [-float(i) for i in range(len(VOCAB_EXTRA))]
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)

        def mat(rows, cols, scale=None):
            s = scale if scale is not None else 1.0 / np.sqrt(cols)
            return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

        def vec(n, centre=1.0, spread=0.1):
            return (centre + spread * rng.standard_normal(n)).astype(np.float32)

        def add_q(tname, data, qtype):
            w.add_tensor(tname, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

        add_q("token_embd.weight", mat(VOCAB, hidden, 0.25), Q.Q8_0)
        w.add_tensor("output_norm.weight", vec(hidden))
        if not f["tied"]:
            add_q("output.weight", mat(VOCAB, hidden, 0.25), Q.Q8_0)
        if "longrope" in f:
            w.add_tensor("rope_factors_long.weight",
                         rng.uniform(1.0, 4.0, hd // 2).astype(np.float32))
            w.add_tensor("rope_factors_short.weight",
                         rng.uniform(1.0, 1.5, hd // 2).astype(np.float32))
        if f.get("rope_freqs"):
            # Llama 3.1's shape of factors (1 for high frequencies, up to 8 for low ones),
            # with random factors in between so that every pair is scaled differently.
            ff = np.ones(hd // 2, dtype=np.float32)
            ff[hd // 4:] = rng.uniform(1.0, 8.0, hd // 2 - hd // 4).astype(np.float32)
            w.add_tensor("rope_freqs.weight", ff)
        for l in range(layers):
            b = f"blk.{l}."
            w.add_tensor(b + "attn_norm.weight", vec(hidden))
            w.add_tensor(b + "ffn_norm.weight", vec(hidden))
            q, k, v = mat(heads * hd, hidden), mat(kvh * hd, hidden), mat(kvh * hd, hidden)
            if f.get("fused"):
                add_q(b + "attn_qkv.weight", np.concatenate([q, k, v]), Q.Q8_0)
            else:
                add_q(b + "attn_q.weight", q, Q.Q8_0)
                add_q(b + "attn_k.weight", k, Q.Q8_0)
                add_q(b + "attn_v.weight", v, Q.Q8_0)
            if f.get("biases"):
                w.add_tensor(b + "attn_q.bias", vec(heads * hd, 0.0, 0.5))
                w.add_tensor(b + "attn_k.bias", vec(kvh * hd, 0.0, 0.5))
                w.add_tensor(b + "attn_v.bias", vec(kvh * hd, 0.0, 0.1))
            if f.get("qk_norm"):
                w.add_tensor(b + "attn_q_norm.weight", vec(hd))
                w.add_tensor(b + "attn_k_norm.weight", vec(hd))
            add_q(b + "attn_output.weight", mat(hidden, heads * hd), Q.Q8_0)
            if f.get("gemma"):
                w.add_tensor(b + "post_attention_norm.weight", vec(hidden))
                w.add_tensor(b + "post_ffw_norm.weight", vec(hidden))
            gate, up = mat(ffn, hidden), mat(ffn, hidden)
            gate_up_q, down_q = (Q.Q4_0, Q.Q4_0) if f.get("ffn_q4_0") else (Q.Q5_0, Q.Q4_1)
            if f.get("fused"):
                add_q(b + "ffn_up.weight", np.concatenate([gate, up]), gate_up_q)
            else:
                add_q(b + "ffn_gate.weight", gate, gate_up_q)
                add_q(b + "ffn_up.weight", up, gate_up_q)
            add_q(b + "ffn_down.weight", mat(hidden, ffn), down_q)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def prompts(name):
    rng = np.random.default_rng(seed_of(name) + 1)
    # BOS, then ids of byte and word tokens (not the control tokens).
    return [(f"p{n}", [1] + [int(t) for t in rng.integers(3, VOCAB, n - 1)]) for n in PROMPT_LENS]


def reference(base, name):
    for pid, ids in prompts(name):
        greedy, top, stable = greedy_reference(base, ids, N_PREDICT, ignore_eos=True)
        print(json.dumps({
            "id": f"{name}/{pid}",
            "prompt": None,
            "prompt_text": "",
            "prompt_ids": ids,
            "greedy_ids": greedy,
            "greedy_text": "",
            "top_logprobs": top,
            "stable_len": stable,
        }))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "reference":
        reference(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
