// Prepended to every kernel source (NVRTC compiles each source alone, with no include path):
// f16 conversions through PTX (no cuda_fp16.h needed) and warp/block reductions.
// Every kernel here is launched with a block size that is a multiple of 32, at most 1024.

#define AKV_WARP 32

__device__ __forceinline__ float akv_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short akv_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float akv_warp_sum(float v) {
    for (int o = AKV_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float akv_warp_max(float v) {
    for (int o = AKV_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum of `v` over the whole block, returned to every thread. `scratch` holds 32 floats.
__device__ __forceinline__ float akv_block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % AKV_WARP;
    const int warp = threadIdx.x / AKV_WARP;
    const int warps = (blockDim.x + AKV_WARP - 1) / AKV_WARP;
    v = akv_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = lane < warps ? scratch[lane] : 0.0f;
    return akv_warp_sum(total);
}

#define AKV_NEG_INF __int_as_float(0xff800000)
