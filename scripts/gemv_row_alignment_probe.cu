// Does the alignment of B's rows to 32-byte sectors or 128-byte lines cost a GEMV (issue 21)?
// blockreduce's walk (128 threads a row, 16-byte vectors) on K = 4096 rows, with B starting `off`
// halves past an aligned allocation, and on row strides that are not whole lines; then K = 4088
// and 4104 (a partial last step) with every load unconditional, the predicate on the product.
// Plain CUDA, the runner's method: a 256 MB read before each launch, CUDA events, the median of
// 200. Timing only (B and x hold one repeated value). On the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o probe scripts/gemv_row_alignment_probe.cu && ./probe
// (the harness: gemv_probe_harness.cuh, beside it)
#include "gemv_probe_harness.cuh"
// y[row] = the sum of acc over the block's TPR threads
template <int TPR>
__device__ __forceinline__ void store_row_sum(float acc, half* __restrict__ y, int row) {
  acc = row_sum<TPR, 1>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}
// rows of K elements, STRIDE elements apart (STRIDE >= K, a multiple of 8)
template <int K, int STRIDE, int TPR>
__global__ void __launch_bounds__(TPR) walk(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y) {
  constexpr int NV = K / 8, STEPS = (NV + TPR - 1) / TPR;
  int row = blockIdx.x;
  const uint4* b = reinterpret_cast<const uint4*>(B + (size_t)row * STRIDE);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) { int v = s * TPR + threadIdx.x; if (NV % TPR == 0 || v < NV) acc += dot8(xv[v], b[v]); }
  store_row_sum<TPR>(acc, y, row);
}
// walk with every load unconditional (clamped), the predicate applied to the product
template <int K, int TPR>
__global__ void __launch_bounds__(TPR) walk_uncond(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y) {
  constexpr int NV = K / 8, STEPS = (NV + TPR - 1) / TPR;
  int row = blockIdx.x;
  const uint4* b = reinterpret_cast<const uint4*>(B + (size_t)row * K);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  uint4 bs[STEPS], xs[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) { int v = min(s * TPR + (int)threadIdx.x, NV - 1); bs[s] = b[v]; xs[s] = xv[v]; }
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) { float d = dot8(xs[s], bs[s]); acc += (s * TPR + (int)threadIdx.x < NV) ? d : 0.f; }
  store_row_sum<TPR>(acc, y, row);
}
Ctx g_ctx;
half *B, *X, *Y;
template <int K, int STRIDE> void run(int N, int off, const char* what) {
  float us = time_us(g_ctx, [&] { walk<K, STRIDE, 128><<<N, 128>>>(B + off, X, Y); });
  printf("N=%d K=%d stride=%d off=%2d halves (%3d B): %-34s %7.2f us\n", N, K, STRIDE, off, off * 2, what, us);
}
int main() {
  g_ctx = make_ctx();
  size_t nb = (size_t)4096 * 4200 + 256;
  CK(cudaMalloc(&B, nb * 2)); CK(cudaMemset(B, 0x11, nb * 2)); CK(cudaMalloc(&X, 8192 * 2)); CK(cudaMemset(X, 0x11, 8192 * 2)); CK(cudaMalloc(&Y, 8192 * 2));
  for (int round = 0; round < 2; ++round) {
    run<4096, 4096>(4096, 0, "rows on 128 B lines");
    run<4096, 4096>(4096, 8, "rows 16 B past a sector");
    run<4096, 4096>(4096, 16, "rows on sectors, 32 B past a line");
    run<4096, 4096>(4096, 32, "rows on sectors, 64 B past a line");
    run<4088, 4088>(4096, 0, "K-7: every other row off a sector");
    run<4088, 4096>(4096, 0, "K-7 read, rows on lines");
    run<4096, 4104>(4096, 0, "stride +16 B: every other row off");
    run<4096, 4112>(4096, 0, "stride +32 B: rows on sectors");
    run<4096, 4160>(4096, 0, "stride +128 B: rows on lines");
    { float us = time_us(g_ctx, [&] { walk_uncond<4088, 128><<<4096, 128>>>(B, X, Y); });
      printf("N=4096 K=4088 unconditional loads, predicate on the product:     %7.2f us\n", us); }
    { float us = time_us(g_ctx, [&] { walk_uncond<4104, 128><<<4096, 128>>>(B, X, Y); });
      printf("N=4096 K=4104 unconditional loads, predicate on the product:     %7.2f us\n", us); }
    run<4104, 4104>(4096, 0, "K+9 (5 steps)");
  }
  return 0;
}
