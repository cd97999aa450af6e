"""Regenerates kernels_dequant.json: random blocks of every weight type the kernels decode, with
their dequantisation by the `gguf` Python package (llama.cpp's numpy reference). Tests read the
JSON only; run this by hand: `python3 gen_kernels_dequant.py > kernels_dequant.json`."""
import json
import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES, quants

rng = np.random.default_rng(1234)
# (type, byte offsets of f16 scale fields to overwrite with sane values)
TYPES = [
    (T.Q4_0, [0]), (T.Q4_1, [0, 2]), (T.Q5_0, [0]), (T.Q5_1, [0, 2]), (T.Q8_0, [0]),
    (T.Q4_K, [0, 2]), (T.Q5_K, [0, 2]), (T.Q6_K, [208]),
]
out = []
for ty, scale_offsets in TYPES:
    block_elems, block_bytes = GGML_QUANT_SIZES[ty]
    num_blocks = 512 // block_elems if block_elems == 32 else 2
    raw = rng.integers(0, 256, size=(num_blocks, block_bytes), dtype=np.uint8)
    for b in range(num_blocks):
        for off in scale_offsets:
            v = np.array([rng.uniform(-0.05, 0.05)], dtype=np.float16)
            raw[b, off:off + 2] = v.view(np.uint8)
    values = quants.dequantize(raw.reshape(-1), ty).reshape(-1).astype(np.float32)
    out.append({
        "type": ty.name,
        "bytes_hex": raw.tobytes().hex(),
        "values": [float(x) for x in values],
    })
print(json.dumps(out))
