// The linear layers' product y[rows, out] = x[rows, in] · w[out, in]ᵀ (row-major f32) in a fixed
// order of operations: every output element is one chain of fused multiply-adds over k = 0, 1,
// …, in − 1, whatever the number of rows, the tile the row falls in or the device — so a row's
// result never depends on the batch it is computed in (the engine's batch invariance; cuBLAS
// picks its algorithm and split by shape and gives no such promise).
//
// Tiles of 64 rows × 64 outputs per block of 256 threads (16 × 16, each 4 × 4 outputs), k in
// steps of 16 through shared memory. Grid: (⌈out / 64⌉, ⌈rows / 64⌉).

#define LIN_TILE 64
#define LIN_K 16

extern "C" __global__ void linear_f32(const float* x, const float* w, float* y, int rows,
                                      int in_dim, int out_dim) {
    __shared__ float xs[LIN_K][LIN_TILE + 1];
    __shared__ float ws[LIN_K][LIN_TILE + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * LIN_TILE, out0 = blockIdx.x * LIN_TILE;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < in_dim; k0 += LIN_K) {
        // 64 × 16 elements of x and of w, 4 per thread, k fastest (coalesced along k).
        for (int e = threadIdx.x; e < LIN_TILE * LIN_K; e += blockDim.x) {
            const int r = e / LIN_K, kk = e % LIN_K;
            const int k = k0 + kk;
            const int gr = row0 + r, go = out0 + r;
            xs[kk][r] = (gr < rows && k < in_dim) ? x[(size_t)gr * in_dim + k] : 0.0f;
            ws[kk][r] = (go < out_dim && k < in_dim) ? w[(size_t)go * in_dim + k] : 0.0f;
        }
        __syncthreads();
        const int kend = min(LIN_K, in_dim - k0);
        for (int kk = 0; kk < kend; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + ty + 16 * i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int o = out0 + tx + 16 * j;
            if (o < out_dim) y[(size_t)r * out_dim + o] = acc[i][j];
        }
    }
}
