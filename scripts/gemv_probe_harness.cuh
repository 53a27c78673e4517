// The GEMV probes' harness (scripts/ragged_gemv_probe.cu, scripts/gemv_row_alignment_probe.cu):
// the runner's timing method in plain CUDA, an L2 flush (a 256 MB read) before each launch, CUDA
// events, the median of 200; fp16 dot products of 16-byte vectors and a row's sum over a block.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cuda_fp16.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  const __half2* ha = reinterpret_cast<const __half2*>(&a);
  const __half2* hb = reinterpret_cast<const __half2*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) { float2 fa = __half22float2(ha[i]), fb = __half22float2(hb[i]); s += fa.x * fb.x; s += fa.y * fb.y; }
  return s;
}

// Sum of acc over the TPR threads of a row (threadIdx.x), rows on threadIdx.y; returns in thread x=0.
template <int TPR, int ROWS>
__device__ __forceinline__ float row_sum(float acc) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (TPR == 32) return acc;
  __shared__ float part[ROWS][TPR / 32];
  if (threadIdx.x % 32 == 0) part[threadIdx.y][threadIdx.x / 32] = acc;
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < TPR / 32; ++w) s += part[threadIdx.y][w];
  }
  return s;
}

__global__ void flush_read(const float4* p, size_t n, float* sink) {
  float s = 0.f;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) { float4 v = p[i]; s += v.x + v.y + v.z + v.w; }
  if (s == 12345.f) *sink = s;
}

struct Ctx { float4* flush; size_t nflush; float* sink; };
static bool g_profile = false;

template <typename F>
float time_us(Ctx& c, F launch) {
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  if (g_profile) { flush_read<<<264, 1024>>>(c.flush, c.nflush, c.sink); launch(); CK(cudaDeviceSynchronize()); return 0.f; }
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < 200; ++i) {
    flush_read<<<264, 1024>>>(c.flush, c.nflush, c.sink);
    CK(cudaEventRecord(a)); launch(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1e3f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The flush buffer, allocated.
inline Ctx make_ctx() {
  Ctx c; c.nflush = (256u << 20) / 16;
  CK(cudaMalloc(&c.flush, c.nflush * 16)); CK(cudaMemset(c.flush, 0, c.nflush * 16)); CK(cudaMalloc(&c.sink, 4));
  return c;
}
