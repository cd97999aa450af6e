// Paged K/V on the GPU and attention over it. One layer's K (and V) pool is f16 rows ordered
// `[kv_heads, num_blocks, block_size, head_dim]` (the host pool's order, so a block moves
// between the tiers with the same bytes); a sequence's positions live in the blocks its row of
// `block_tables [num_tables, max_blocks]` names, position p at row p % block_size of block
// table[p / block_size].

#define AKV_MAX_HD_PER_LANE 8  // head_dim <= 256

// Writes the K and V rows of a step's tokens (`k`, `v`: `[tokens, kv_heads * head_dim]` f32,
// rounded to nearest even f16) at (dst_block[t], dst_row[t]). Grid: tokens; block: a multiple
// of 32.
extern "C" __global__ void kv_write_f16(const float* k, const float* v, unsigned short* k_pool,
                                        unsigned short* v_pool, const int* dst_block,
                                        const int* dst_row, int kv_heads, int head_dim,
                                        int num_blocks, int block_size) {
    const int t = blockIdx.x;
    const int kvd = kv_heads * head_dim;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        const int hh = i / head_dim, d = i % head_dim;
        const size_t at =
            (((size_t)hh * num_blocks + dst_block[t]) * block_size + dst_row[t]) * head_dim + d;
        k_pool[at] = akv_f32_to_f16(k[(size_t)t * kvd + i]);
        v_pool[at] = akv_f32_to_f16(v[(size_t)t * kvd + i]);
    }
}

// Causal grouped-query attention of each query row over its sequence's paged K/V: token t
// (query `q [tokens, heads, head_dim]` f32) of table row seq[t] at position pos[t] attends
// positions lo..=pos[t] (lo = pos[t] + 1 - window when window > 0, else 0), with scores
// scale * q·k, capped by softcap * tanh(s / softcap) when softcap > 0, softmax in f32. Query
// head h reads K/V head h / (heads / kv_heads). The step's own K/V must be written first.
// Grid: tokens * heads; block: a multiple of 32 (each warp takes every nwarps-th position,
// online softmax, then the warps merge); dynamic shared memory: nwarps * head_dim floats.
extern "C" __global__ void attention_paged_f16(const float* q, const unsigned short* k_pool,
                                               const unsigned short* v_pool,
                                               const int* block_tables, const int* seq,
                                               const int* pos, float* out, int heads,
                                               int kv_heads, int head_dim, int num_blocks,
                                               int block_size, int max_blocks, int window,
                                               float scale, float softcap) {
    extern __shared__ float merge_acc[];
    __shared__ float merge_m[32];
    __shared__ float merge_l[32];
    const int t = blockIdx.x / heads;
    const int h = blockIdx.x % heads;
    const int kvh = h / (heads / kv_heads);
    const int lane = threadIdx.x % AKV_WARP, warp = threadIdx.x / AKV_WARP;
    const int nwarps = blockDim.x / AKV_WARP;
    const float* qh = q + ((size_t)t * heads + h) * head_dim;

    float qr[AKV_MAX_HD_PER_LANE], acc[AKV_MAX_HD_PER_LANE];
#pragma unroll
    for (int j = 0; j < AKV_MAX_HD_PER_LANE; ++j) {
        const int d = lane + AKV_WARP * j;
        qr[j] = d < head_dim ? qh[d] * scale : 0.0f;
        acc[j] = 0.0f;
    }
    const int p_end = pos[t];
    const int p_lo = window > 0 ? max(0, p_end - window + 1) : 0;
    const int* table = block_tables + (size_t)seq[t] * max_blocks;
    const size_t head_base = (size_t)kvh * num_blocks * block_size * head_dim;
    float m = AKV_NEG_INF, l = 0.0f;
    for (int p = p_lo + warp; p <= p_end; p += nwarps) {
        const size_t row =
            head_base + ((size_t)table[p / block_size] * block_size + p % block_size) * head_dim;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < AKV_MAX_HD_PER_LANE; ++j) {
            const int d = lane + AKV_WARP * j;
            if (d < head_dim) s += qr[j] * akv_f16_to_f32(k_pool[row + d]);
        }
        s = akv_warp_sum(s);
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float w = expf(s - m_new);
        l = l * corr + w;
#pragma unroll
        for (int j = 0; j < AKV_MAX_HD_PER_LANE; ++j) {
            const int d = lane + AKV_WARP * j;
            const float vd = d < head_dim ? akv_f16_to_f32(v_pool[row + d]) : 0.0f;
            acc[j] = acc[j] * corr + w * vd;
        }
        m = m_new;
    }
    if (lane == 0) {
        merge_m[warp] = m;
        merge_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < AKV_MAX_HD_PER_LANE; ++j) {
        const int d = lane + AKV_WARP * j;
        if (d < head_dim) merge_acc[warp * head_dim + d] = acc[j];
    }
    __syncthreads();
    if (warp != 0) return;
    float big = AKV_NEG_INF;
    for (int w = 0; w < nwarps; ++w) big = fmaxf(big, merge_m[w]);
    float total = 0.0f;
    for (int w = 0; w < nwarps; ++w)
        if (merge_m[w] != AKV_NEG_INF) total += merge_l[w] * expf(merge_m[w] - big);
    float* oh = out + ((size_t)t * heads + h) * head_dim;
    for (int d = lane; d < head_dim; d += AKV_WARP) {
        float o = 0.0f;
        for (int w = 0; w < nwarps; ++w)
            if (merge_m[w] != AKV_NEG_INF) o += merge_acc[w * head_dim + d] * expf(merge_m[w] - big);
        oh[d] = total > 0.0f ? o / total : 0.0f;
    }
}
