"""Generates the committed GGUF test vectors with the python `gguf` package (0.19.0).

Run from the repository root:  python3 crates/gguf/tests/data/gguf/gen_vectors.py
Tests never run this; they read the files it wrote:

- quant_vectors.gguf: written by gguf.GGUFWriter. Metadata of every GGUF value type (including
  nested arrays), and for each of the 11 supported ggml types T:
    "<T>.quant"    [512] stored as T  (gguf.quants.quantize of "<T>.input" where the package can
                                      quantize T; random bytes with valid f16 scales for K-quants)
    "<T>.expected" [512] F32          gguf.quants.dequantize of the quant bytes
    "<T>.input"    [512] F32          the quantizer input (legacy types, F16, BF16 only)
- model_rows.gguf: rows of the default model dequantized by gguf.quants.dequantize, as F32
  tensors named "<tensor>#<row>" (GGUF dims [row_len]).
"""
import os
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

HERE = os.path.dirname(os.path.abspath(__file__))
N = 512
rng = np.random.default_rng(20240611)

QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_TYPES = [T.Q4_K, T.Q5_K, T.Q6_K]


def random_k_blocks(ty, n_blocks):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[ty]
    b = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    def f16s(lo, hi):
        v = rng.uniform(lo, hi, size=n_blocks).astype(np.float16)
        return v.view(np.uint8).reshape(n_blocks, 2)
    if ty in (T.Q4_K, T.Q5_K):
        b[:, 0:2] = f16s(-0.05, 0.05)   # d
        b[:, 2:4] = f16s(-0.02, 0.02)   # dmin
    else:  # Q6_K: d is the last two bytes
        b[:, 208:210] = f16s(-0.01, 0.01)
    return b.reshape(-1)


def quant_vectors():
    w = gguf.GGUFWriter(os.path.join(HERE, "quant_vectors.gguf"), arch="test")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 1.5)
    w.add_float64("t.f64", -2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.arr_str", ["a", "", "ccc"])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, -1.0])
    w.add_array("t.arr_nested", [[1, 2], [3]])
    for ty in QUANTIZABLE + K_TYPES:
        name = ty.name
        if ty in QUANTIZABLE:
            x = (rng.standard_normal(N) * rng.uniform(0.01, 2.0)).astype(np.float32)
            x[rng.integers(0, N, 8)] = 0.0
            q = gguf.quants.quantize(x, ty)
            qb = q.view(np.uint8).reshape(-1)
            w.add_tensor(f"{name}.input", x)
        else:
            qb = random_k_blocks(ty, N // 256)
        expected = gguf.quants.dequantize(qb, ty).astype(np.float32).reshape(-1)
        assert expected.shape == (N,) and np.isfinite(expected).all()
        w.add_tensor(f"{name}.quant", qb, raw_dtype=ty)
        w.add_tensor(f"{name}.expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def model_rows():
    r = gguf.GGUFReader(os.path.join(HERE, "../../../../../models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    tensors = {t.name: t for t in r.tensors}
    picks = [("token_embd.weight", [0, 1, 12345, 49151]),
             ("blk.0.attn_q.weight", [0, 1, 575]),
             ("blk.0.ffn_down.weight", [0, 575]),
             ("blk.29.attn_norm.weight", [0])]
    w = gguf.GGUFWriter(os.path.join(HERE, "model_rows.gguf"), arch="test")
    for name, rows in picks:
        t = tensors[name]
        data = np.asarray(t.data)  # [rows, row_bytes] (quantized) or [rows, row_len]
        data = data.reshape(-1, data.shape[-1])
        for row in rows:
            v = gguf.quants.dequantize(data[row], t.tensor_type).astype(np.float32).reshape(-1)
            w.add_tensor(f"{name}#{row}", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    quant_vectors()
    model_rows()
