// The per-token row stages of the forward pass on f32 activations `[rows, dim]`: embedding
// gather, RMS norm, RoPE rotation, residual and bias adds, gated activations, softcap, the rows
// whose logits are wanted, and greedy argmax. Each kernel reads and writes whole rows; none
// depends on which other rows share the launch.

// out[r, :] = table[ids[r], :] * scale. Grid: rows; block: any multiple of 32.
extern "C" __global__ void embed_rows_f32(const float* table, const int* ids, float* out, int dim,
                                          float scale) {
    const float* src = table + (size_t)ids[blockIdx.x] * dim;
    float* dst = out + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i] * scale;
}

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * (w + w_offset). Grid: rows; block: a
// multiple of 32. `w_offset` is 1 for Gemma's stored `w - 1` weights, else 0.
extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y, int dim,
                                        float eps, float w_offset) {
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* yr = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = akv_block_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * (w[i] + w_offset);
}

// Rotates the first `rot_dims` of each head of x `[rows, heads, head_dim]` in place by the
// row's angles `cos_sin[row, rot_dims / 2, 2]` (cos, sin; computed on the host by the model's
// own RoPE, scaling included). `neox`: pairs (i, i + rot_dims/2), else (2i, 2i + 1).
// Grid: rows * heads; block: a multiple of 32.
extern "C" __global__ void rope_f32(float* x, const float* cos_sin, int heads, int head_dim,
                                    int rot_dims, int neox) {
    const int row = blockIdx.x / heads;
    float* h = x + (size_t)blockIdx.x * head_dim;
    const float* cs = cos_sin + (size_t)row * rot_dims;
    const int half = rot_dims / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float x0 = h[a], x1 = h[b];
        h[a] = x0 * c - x1 * s;
        h[b] = x0 * s + x1 * c;
    }
}

// x[i] += y[i] for i < n. Grid-stride.
extern "C" __global__ void add_f32(float* x, const float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += y[i];
}

// x[r, i] += b[i]. Grid-stride over rows * dim.
extern "C" __global__ void add_bias_f32(float* x, const float* b, int rows, int dim) {
    const int n = rows * dim;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += b[i % dim];
}

// out[i] = silu(gate[i]) * up[i]. Grid-stride.
extern "C" __global__ void swiglu_f32(const float* gate, const float* up, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// out[i] = gelu_tanh(gate[i]) * up[i] (GELU's tanh approximation, as Gemma's FFN). Grid-stride.
extern "C" __global__ void geglu_f32(const float* gate, const float* up, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float g = gate[i];
        const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        out[i] = 0.5f * g * (1.0f + tanhf(inner)) * up[i];
    }
}

// x[i] = cap * tanh(x[i] / cap). Grid-stride.
extern "C" __global__ void softcap_f32(float* x, int n, float cap) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

// out[r, :] = x[rows[r], :]. Grid: output rows; block: a multiple of 32.
extern "C" __global__ void gather_rows_f32(const float* x, const int* rows, float* out, int dim) {
    const float* src = x + (size_t)rows[blockIdx.x] * dim;
    float* dst = out + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

// out[r] = the first index of the largest of logits[r, :] (NaN never wins). Grid: rows;
// block: a multiple of 32, at most 1024.
extern "C" __global__ void argmax_rows_f32(const float* logits, int vocab, int* out) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float v = AKV_NEG_INF;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (x > v) { v = x; idx = i; }
    }
    for (int o = AKV_WARP / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
    }
    const int lane = threadIdx.x % AKV_WARP, warp = threadIdx.x / AKV_WARP;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int warps = (blockDim.x + AKV_WARP - 1) / AKV_WARP;
        for (int w = 1; w < warps; ++w)
            if (best_v[w] > v || (best_v[w] == v && best_i[w] < idx)) { v = best_v[w]; idx = best_i[w]; }
        out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}

// f32 → f16 (round to nearest even) and back, for K/V rows moved as f16. Grid-stride.
extern "C" __global__ void f32_to_f16(const float* x, unsigned short* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = akv_f32_to_f16(x[i]);
}

extern "C" __global__ void f16_to_f32(const unsigned short* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = akv_f16_to_f32(x[i]);
}

// y = x with each block of 32 rounded as the CPU rounds activations for 8-bit block dot
// products (ggml's Q8_0 / Q8_1): q = rint(x · 127 / amax), y = f16(amax / 127) · q. n is a
// multiple of 32. Grid-stride, one warp per block.
extern "C" __global__ void round_q8_32_f32(const float* x, float* y, int n) {
    const int lane = threadIdx.x % AKV_WARP;
    const int warps = gridDim.x * blockDim.x / AKV_WARP;
    for (int b = (blockIdx.x * blockDim.x + threadIdx.x) / AKV_WARP; b * 32 < n; b += warps) {
        const float v = x[b * 32 + lane];
        const float amax = akv_warp_max(fabsf(v));
        const float d = akv_f16_to_f32(akv_f32_to_f16(amax / 127.0f));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b * 32 + lane] = d * rintf(v * id);
    }
}

// y = x with each block of 256 rounded as the CPU rounds activations for K-quant dot products
// (ggml's Q8_K): max = the first element of largest magnitude, iscale = -127 / max,
// q = clamp(rint(iscale · x), -128, 127), y = q / iscale. n is a multiple of 256.
// Grid-stride, one warp per block (8 elements a lane).
extern "C" __global__ void round_q8k_f32(const float* x, float* y, int n) {
    const int lane = threadIdx.x % AKV_WARP;
    const int warps = gridDim.x * blockDim.x / AKV_WARP;
    for (int b = (blockIdx.x * blockDim.x + threadIdx.x) / AKV_WARP; b * 256 < n; b += warps) {
        const float* xb = x + (size_t)b * 256;
        float v[8];
        float amax = 0.0f;
        for (int j = 0; j < 8; ++j) {
            v[j] = xb[lane * 8 + j];
            amax = fmaxf(amax, fabsf(v[j]));
        }
        amax = akv_warp_max(amax);
        int first = 256;
        for (int j = 7; j >= 0; --j)
            if (fabsf(v[j]) == amax) first = lane * 8 + j;
        for (int o = AKV_WARP / 2; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
        const bool zero = amax == 0.0f || !isfinite(amax);
        const float mx = zero ? 1.0f : xb[first];
        const float iscale = -127.0f / mx;
        for (int j = 0; j < 8; ++j) {
            const float q = fminf(127.0f, fmaxf(-128.0f, rintf(iscale * v[j])));
            y[(size_t)b * 256 + lane * 8 + j] = zero ? 0.0f : q * (1.0f / iscale);
        }
    }
}

// For each block of 32 of x (rounded as in round_q8_32_f32): c = f16(d · Σq) − f16(d) · Σq with
// d = amax / 127 — what the CPU's zero-point weight types (Q4_1, Q5_1) multiply their block
// minimum by, beyond f16(d) · Σq. n is a multiple of 32; c has n / 32 entries. Grid-stride,
// one warp per block.
extern "C" __global__ void q8_sum_correction_f32(const float* x, float* c, int n) {
    const int lane = threadIdx.x % AKV_WARP;
    const int warps = gridDim.x * blockDim.x / AKV_WARP;
    for (int b = (blockIdx.x * blockDim.x + threadIdx.x) / AKV_WARP; b * 32 < n; b += warps) {
        const float v = x[b * 32 + lane];
        const float amax = akv_warp_max(fabsf(v));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const float sum = akv_warp_sum(rintf(v * id));
        const float d = amax / 127.0f;
        if (lane == 0)
            c[b] = akv_f16_to_f32(akv_f32_to_f16(d * sum)) - akv_f16_to_f32(akv_f32_to_f16(d)) * sum;
    }
}
