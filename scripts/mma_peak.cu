// The most this GPU's tensor cores give through `mma.sync.m16n8k16` - the instruction TVM's
// tensor-core intrinsics (and so v6) issue - and its CUDA cores through FFMA: every warp runs
// independent chains of the instruction on registers only, with no memory traffic at all.
// No GEMM kernel built on these instructions can run faster than this.
//   nvcc -O3 -arch=sm_90a -o mma_peak scripts/mma_peak.cu && ./mma_peak
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e = (call);                                                           \
    if (e != cudaSuccess) {                                                           \
      printf("error: %s: %s\n", #call, cudaGetErrorString(e));                        \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

// CHAINS independent m16n8k16 multiply-accumulates per iteration: 4096 flops each per warp.
template <int CHAINS, bool BF16>
__global__ void mma_chains(float* out, int iters) {
  unsigned a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u ^ (threadIdx.x & i);  // ~1.0 in f16 and bf16
  for (int i = 0; i < 2; ++i) b[i] = 0x3c003c00u ^ (threadIdx.x & (i + 2));
  float d[CHAINS][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if (BF16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
      else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
  }
  float sum = 0.f;
  for (int c = 0; c < CHAINS; ++c) sum += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// CHAINS independent FFMA chains per thread: 2 flops each per thread.
template <int CHAINS>
__global__ void ffma_chains(float* out, int iters) {
  float x[CHAINS];
  for (int c = 0; c < CHAINS; ++c) x[c] = threadIdx.x * 1e-3f + c;
  const float m = 0.999f, s = 1e-4f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) x[c] = fmaf(x[c], m, s);
  }
  float sum = 0.f;
  for (int c = 0; c < CHAINS; ++c) sum += x[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// Best TFLOP/s over 5 launches of `kernel` on `blocks` x `threads`.
template <typename Kernel>
static float best_tflops(Kernel kernel, int blocks, int threads, int iters, double flops_per_iter_thread,
                         float* out) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  kernel<<<blocks, threads>>>(out, iters);  // warm-up
  float best = 0.f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(start);
    kernel<<<blocks, threads>>>(out, iters);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, start, stop);
    double tflops = flops_per_iter_thread * iters * blocks * threads / (ms * 1e-3) / 1e12;
    if (tflops > best) best = (float)tflops;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int sms = prop.multiProcessorCount;
  printf("device: %s, %d SMs\n", prop.name, sms);
  float* out;
  CHECK(cudaMalloc(&out, sizeof(float) * sms * 16 * 1024));
  const int iters = 1 << 16;
  for (int warps : {4, 8, 16}) {  // warps per SM (one block per SM)
    int threads = 32 * warps;
    // Per thread per iteration: CHAINS x 4096 / 32 flops.
    printf("mma.sync m16n8k16 f16->f32, %2d warps/SM, 4 chains: %6.1f TFLOP/s\n", warps,
           best_tflops(mma_chains<4, false>, sms, threads, iters / 4, 4 * 128.0, out));
    printf("mma.sync m16n8k16 f16->f32, %2d warps/SM, 8 chains: %6.1f TFLOP/s\n", warps,
           best_tflops(mma_chains<8, false>, sms, threads, iters / 4, 8 * 128.0, out));
    printf("mma.sync m16n8k16 bf16->f32, %2d warps/SM, 8 chains: %6.1f TFLOP/s\n", warps,
           best_tflops(mma_chains<8, true>, sms, threads, iters / 4, 8 * 128.0, out));
    printf("ffma f32, %2d warps/SM, 8 chains: %6.1f TFLOP/s\n", warps,
           best_tflops(ffma_chains<8>, sms, threads, iters, 8 * 2.0, out));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaFree(out));
  return 0;
}
