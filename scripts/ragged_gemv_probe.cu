// Ragged-K GEMV probe (issue 21): where rowalign's time goes on a K that is not whole 16-byte
// vectors, and whether other ways of walking a row close the gap to the aligned neighbour.
// Plain CUDA, fp16, one timing harness for all: an L2 flush (a 256 MB read) before each
// launch, CUDA events, the median of 200; every kernel checked against a float64 reference.
//   aligned        blockreduce's walk (128 threads a row) on K+1, K-7 and K+9 (whole vectors)
//   rowalign       rowalign's walk as the schedule makes it, with its CUDA helpers
//   +wrap          ceil(K/8) vectors a row: vector 0 also takes the row's last one (their bytes
//                  do not overlap), so 4095 takes 512 vectors (4 steps of 128), not 513
//   wrap+hoist     every step's loads first, unconditional, then the arithmetic (+constshift:
//                  the row's shift a template constant, dispatched once per block)
//   peel           the helpers only on a row's first and last vectors, the rest plain
//   ldg32          x's window from five 4-byte loads and funnel shifts instead of word selects
//   const          the row's shift a template constant (one switch per block)
//   grouped        2 rows 8 apart per thread (one shift): each x window serves both
//   bulk           the row's vectors in shared memory by one cp.async.bulk at the block's start
//   xstage         R rows of one shift per block, x's window at that shift staged in shared memory
//                  once (zeros outside x, the last vector folded into vector 0); run by `x` alone
//   hoistb         rowalign (+wrap) with every step's vector of B loaded first, unconditionally,
//                  then the masks, x's windows and sums; run by `h` alone, with 128 and 256 threads,
//                  beside unpredicated (no `v < NV`: steps past the row reload its last vector,
//                  masked to zero), wrapfirst (+wrap's tail loaded first by every thread) and
//                  xhoist (xstage with B's loads issued before x is staged)
//   shflb          B shifted to x's alignment by warp shuffles, x read in aligned vectors; run by
//                  `s` alone, beside the plain walk (blockreduce's loop on a ragged row's vectors,
//                  no shift, no masks: the memory pattern alone, its sums wrong) and constshift (the
//                  row's shift a template constant, dispatched once per block)
//   pxstage        xstage made persistent: each block stages x at its rows' shift once, then
//                  walks many rows of that shift; run by `P` alone
//   TVM ...        the kernels TVM builds for rowalign and for the aligned neighbour's best rung
// Written by scripts/ragged_gemv_probe.py, which supplies rowalign_helpers.cuh and tvm_kernels.cuh
// and copies gemv_probe_harness.cuh beside it.
#include "rowalign_helpers.cuh"
#include "gemv_probe_harness.cuh"
#include <utility>
__device__ __forceinline__ uint4 or4(uint4 a, uint4 b) { return make_uint4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w); }


// y of the R rows row0 + 8 j from their threads' partial sums acc[j] (one block of TPR threads).
template <int TPR, int R>
__device__ __forceinline__ void store_rows_8_apart(float (&acc)[R], half* __restrict__ y, int row0) {
#pragma unroll
  for (int j = 0; j < R; ++j) {
    float t = row_sum<TPR, 1>(acc[j]);
    if (threadIdx.x == 0) y[row0 + 8 * j] = __float2half(t);
    if (TPR > 32) __syncthreads();
  }
}

// The vectors a row of K halves walks from the 16-byte boundary at or before its start: rowalign's
// ceil((K + 8 - gcd(K, 8)) / 8), or with `wrap`, ceil(K / 8) (the row's last vector folded into
// vector 0).
__host__ __device__ constexpr int gcd8(int K) { return K % 8 == 0 ? 8 : K % 4 == 0 ? 4 : K % 2 == 0 ? 2 : 1; }
__host__ __device__ constexpr int walk_vectors(int K, bool wrap) { return wrap ? (K + 7) / 8 : (K + 8 - gcd8(K) + 7) / 8; }

// Vector v of the row that starts `shift` elements into B's vector `first`, its neighbours'
// bytes zeroed (clamped into B: `last` is B's last vector).
template <int K>
__device__ __forceinline__ uint4 row_vector(const uint4* __restrict__ bv, long first, long last, int shift, int v) {
  return rowalign_keep(bv[min(first + v, last)], (shift - 8 * v) * 2, (shift + K - 8 * v) * 2);
}
// x's 16 bytes under vector v of such a row (zeros outside x).
template <int K>
__device__ __forceinline__ uint4 x_window(const half* __restrict__ x, int shift, int v) {
  return rowalign_x_window<uint4>(x, 0, 2 * K, 16 * v - 2 * shift);
}

// x's window at the rows' shift for each of their NV vectors, into shared memory (xs), zeros
// outside x, with the window of vector NV folded into vector 0 where `wrap`: xstage's staging.
template <int K, int TPR>
__device__ __forceinline__ void stage_x_windows(uint4* xs, const half* __restrict__ x, int shift, bool wrap) {
  constexpr int NV = (K + 7) / 8;
  for (int v = threadIdx.x; v < NV; v += TPR) {
    uint4 w = x_window<K>(x, shift, v);
    if (v == 0 && wrap) w = or4(w, x_window<K>(x, shift, NV));
    xs[v] = w;
  }
}

// Aligned K: blockreduce / allreduce.
template <int K, int TPR, int ROWS>
__global__ void __launch_bounds__(TPR * ROWS) aligned(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y) {
  constexpr int NV = K / 8, STEPS = (NV + TPR - 1) / TPR;
  int row = blockIdx.x * ROWS + threadIdx.y;
  const uint4* b = reinterpret_cast<const uint4*>(B + (size_t)row * K);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) acc += dot8(xv[v], b[v]);
  }
  acc = row_sum<TPR, ROWS>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}

// rowalign today: walk ceil((K + 8 - gcd(K, 8)) / 8) vectors from the boundary at or before the row.
// WRAP: walk ceil(K / 8) vectors; vector 0 also takes the row's last vector (its bytes fall
// where vector 0's bytes are the previous row's).
// At most 32 registers (a full SM's blocks): with 39, +wrap's occupancy fell to 75% and it lost.
template <int K, int TPR, int ROWS, bool WRAP>
__global__ void __launch_bounds__(TPR * ROWS, 2048 / (TPR * ROWS)) rowalign(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = walk_vectors(K, WRAP), STEPS = (NV + TPR - 1) / TPR;
  int row = blockIdx.x * ROWS + threadIdx.y;
  long first = (long)row * K / 8;
  int shift = (int)((long)row * K % 8);
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) {
      uint4 b = row_vector<K>(bv, first, last, shift, v);
      uint4 w = x_window<K>(x, shift, v);
      if (WRAP && v == 0) {
        b = or4(b, row_vector<K>(bv, first, last, shift, NV));
        w = or4(w, x_window<K>(x, shift, NV));
      }
      acc += dot8(w, b);
    }
  }
  acc = row_sum<TPR, ROWS>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}

// rowalign (WRAP: +wrap) with every step's vector of B loaded first, unconditionally (clamped
// into B), and only then the masks, x's windows and the sums: a thread's loads of B all in flight
// at once, where a load under `v < NV` waits for the steps before it.
template <int K, int TPR, bool WRAP>
__global__ void __launch_bounds__(TPR) hoistb(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = walk_vectors(K, WRAP), STEPS = (NV + TPR - 1) / TPR;
  int row = blockIdx.x;
  long first = (long)row * K / 8;
  int shift = (int)((long)row * K % 8);
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  uint4 braw[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) braw[s] = bv[min(first + s * TPR + threadIdx.x, last)];
  uint4 tail = WRAP ? bv[min(first + NV, last)] : make_uint4(0, 0, 0, 0);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) {
      uint4 b = rowalign_keep(braw[s], (shift - 8 * v) * 2, (shift + K - 8 * v) * 2);
      uint4 w = x_window<K>(x, shift, v);
      if (WRAP && v == 0) {
        b = or4(b, rowalign_keep(tail, (shift - 8 * NV) * 2, (shift + K - 8 * NV) * 2));
        w = or4(w, x_window<K>(x, shift, NV));
      }
      acc += dot8(w, b);
    }
  }
  acc = row_sum<TPR, 1>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}
// rowalign with no predicate: a step past the row's last vector loads that vector again (one
// address for the warp) and x's window under it, and its bytes, all past the row, are masked to
// zero; so the last, partial step's loads wait for nothing.
template <int K, int TPR>
__global__ void __launch_bounds__(TPR, 2048 / TPR) unpredicated(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = walk_vectors(K, false), STEPS = (NV + TPR - 1) / TPR;
  int row = blockIdx.x;
  long first = (long)row * K / 8;
  int shift = (int)((long)row * K % 8);
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    uint4 b = rowalign_keep(bv[min(first + min(v, NV - 1), last)], (shift - 8 * v) * 2, (shift + K - 8 * v) * 2);
    acc += dot8(x_window<K>(x, shift, min(v, NV - 1)), b);
  }
  acc = row_sum<TPR, 1>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}

// rowalign+wrap with the row's last vector of B and its x window loaded by every thread at the
// start (one address for the whole row), where +wrap loads them in thread 0 after its step 0:
// a load that only one warp waits for, at the end of its walk.
template <int K, int TPR>
__global__ void __launch_bounds__(TPR, 2048 / TPR) wrapfirst(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = (K + 7) / 8, STEPS = (NV + TPR - 1) / TPR;
  int row = blockIdx.x;
  long first = (long)row * K / 8;
  int shift = (int)((long)row * K % 8);
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  uint4 tail_b = row_vector<K>(bv, first, last, shift, NV);
  uint4 tail_w = x_window<K>(x, shift, NV);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) {
      uint4 b = row_vector<K>(bv, first, last, shift, v);
      uint4 w = x_window<K>(x, shift, v);
      acc += dot8(w, b);
    }
  }
  if (threadIdx.x == 0) acc += dot8(tail_w, tail_b);
  acc = row_sum<TPR, 1>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}


// xstage with the loads of B first: R rows 8 apart (one shift) per block, every step's vector of
// each row loaded unconditionally (clamped into B) before x's window at the rows' shift is staged
// in shared memory, so the staging and its barrier run while B's loads are in flight. Every row
// walks ceil(K / 8) vectors (the last one folded into vector 0, as in xstage).
template <int K, int TPR, int R>
__global__ void __launch_bounds__(TPR) xhoist(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = (K + 7) / 8, STEPS = (NV + TPR - 1) / TPR;
  extern __shared__ uint4 xs[];
  int row0 = (blockIdx.x / 8) * 8 * R + blockIdx.x % 8;  // rows row0 + 8 j
  int shift = (int)((long)row0 * K % 8);
  bool wrap = shift + K > 8 * NV;  // the row's bytes reach vector NV
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  uint4 braw[R][STEPS], tail[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    long first = (long)(row0 + 8 * j) * K / 8;
#pragma unroll
    for (int s = 0; s < STEPS; ++s) braw[j][s] = bv[min(first + s * TPR + threadIdx.x, last)];
    tail[j] = bv[min(first + NV, last)];
  }
  stage_x_windows<K, TPR>(xs, x, shift, wrap);
  __syncthreads();
  float acc[R];
#pragma unroll
  for (int j = 0; j < R; ++j) acc[j] = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    uint4 w = xs[min(v, NV - 1)];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      uint4 b = braw[j][s];
      if (v == 0) {
        b = rowalign_keep(b, 2 * shift, 16);
        if (wrap) b = or4(b, rowalign_keep(tail[j], 0, 2 * (shift + K - 8 * NV)));
      } else if (v == NV - 1 && !wrap) {
        b = rowalign_keep(b, 0, 2 * (shift + K - 8 * v));
      }
      float d = dot8(w, b);
      acc[j] += (NV % TPR == 0 || v < NV) ? d : 0.f;
    }
  }
  store_rows_8_apart<TPR, R>(acc, y, row0);
}


// WRAP + every step's loads first, unconditional (B clamped into B, x into its whole vectors);
// the edges (vector 0, a partial last vector) redone by the helpers afterwards.
template <int K, int TPR, int ROWS, int SHIFT>
__device__ __forceinline__ float hoisted_row(const half* __restrict__ B, const half* __restrict__ x, long last, int row, int shift_rt) {
  constexpr int NV = (K + 7) / 8, STEPS = (NV + TPR - 1) / TPR, XV = (2 * K) / 16;  // x's whole vectors
  const int shift = SHIFT >= 0 ? SHIFT : shift_rt;
  long first = (long)row * K / 8;
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  uint4 braw[STEPS], xlo[STEPS], xhi[STEPS];
  int off = shift > 0 ? 1 : 0;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    braw[s] = bv[min(first + v, last)];
    int u = v - off;
    xlo[s] = xv[max(0, min(u, XV - 1))];
    xhi[s] = xv[max(0, min(u + 1, XV - 1))];
  }
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) {
      uint4 b, w;
      if (v == 0 || v >= NV - 1) {
        b = rowalign_keep(braw[s], (shift - 8 * v) * 2, (shift + K - 8 * v) * 2);
        w = x_window<K>(x, shift, v);
        if (v == 0) {
          b = or4(b, row_vector<K>(bv, first, last, shift, NV));
          w = or4(w, x_window<K>(x, shift, NV));
        }
      } else {
        b = braw[s];
        if (shift == 0) {
          w = xlo[s];
        } else {  // bytes 16 - 2 * shift of lo onwards, then hi
          unsigned wd[8] = {xlo[s].x, xlo[s].y, xlo[s].z, xlo[s].w, xhi[s].x, xhi[s].y, xhi[s].z, xhi[s].w};
          int byte = 16 - 2 * shift, first_w = byte / 4, bits = 8 * (byte % 4);
          unsigned a[6], c[5];
#pragma unroll
          for (int i = 0; i < 6; ++i) a[i] = (first_w & 2) ? wd[i + 2] : wd[i];
#pragma unroll
          for (int i = 0; i < 5; ++i) c[i] = (first_w & 1) ? a[i + 1] : a[i];
          w = make_uint4(__funnelshift_r(c[0], c[1], bits), __funnelshift_r(c[1], c[2], bits),
                         __funnelshift_r(c[2], c[3], bits), __funnelshift_r(c[3], c[4], bits));
        }
      }
      acc += dot8(w, b);
    }
  }
  return acc;
}

template <int K, int TPR, int ROWS, bool CONST>
__global__ void __launch_bounds__(TPR * ROWS) hoisted(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  int row = blockIdx.x * ROWS + threadIdx.y;
  int shift = (int)((long)row * K % 8);
  float acc;
  if (!CONST) acc = hoisted_row<K, TPR, ROWS, -1>(B, x, last, row, shift);
  else switch (shift) {
    case 0: acc = hoisted_row<K, TPR, ROWS, 0>(B, x, last, row, 0); break;
    case 1: acc = hoisted_row<K, TPR, ROWS, 1>(B, x, last, row, 1); break;
    case 2: acc = hoisted_row<K, TPR, ROWS, 2>(B, x, last, row, 2); break;
    case 3: acc = hoisted_row<K, TPR, ROWS, 3>(B, x, last, row, 3); break;
    case 4: acc = hoisted_row<K, TPR, ROWS, 4>(B, x, last, row, 4); break;
    case 5: acc = hoisted_row<K, TPR, ROWS, 5>(B, x, last, row, 5); break;
    case 6: acc = hoisted_row<K, TPR, ROWS, 6>(B, x, last, row, 6); break;
    default: acc = hoisted_row<K, TPR, ROWS, 7>(B, x, last, row, 7); break;
  }
  acc = row_sum<TPR, ROWS>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}



// B shifted to x's alignment (probe `s`): thread u of a row takes x's aligned vector u (its
// columns 8u..8u+7) and the row's B elements under it, which straddle B's aligned vectors
// first + u and first + u + 1 at the row's shift. A thread loads vector first + u; the next one
// comes from lane + 1 by shuffle, lane 31's by one broadcast load of the next warp's first
// vector. So B and x are read in aligned 16-byte vectors, ceil(K / 8) of them a row (no fifth
// step), every load unconditional and issued before any arithmetic; only a partial last x vector
// is fixed up (its columns past K zeroed), in one lane.
// What a shflb kernel leaves out, for timing: NO_FIXUPS and SHIFT_ZERO (the shift 0 at compile
// time) give wrong sums; CONST_SHIFT dispatches once per block to the row's shift as a
// compile-time constant (shflb_row's SHIFT >= 0).
enum ShflbMode { FULL, NO_FIXUPS, SHIFT_ZERO, CONST_SHIFT };
template <int K, int TPR, int CH, ShflbMode MODE, int SHIFT>
__device__ __forceinline__ float shflb_row(const half* __restrict__ B, const half* __restrict__ x, int row, int shift_rt) {
  constexpr int NX = (K + 7) / 8, XV = K / 8, STEPS = (NX + TPR - 1) / TPR;
  int lane = threadIdx.x % 32;
  long first = (long)row * K / 8;
  int shift = MODE == SHIFT_ZERO ? 0 : SHIFT >= 0 ? SHIFT : shift_rt;
  int nb = (shift + K + 7) / 8;  // B vectors the row touches
  const uint4* bv = reinterpret_cast<const uint4*>(B) + first;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  int q = shift >> 1, bits = 16 * (shift & 1);
  float acc = 0.f;
#pragma unroll
  for (int s0 = 0; s0 < STEPS; s0 += CH) {  // CH steps' loads at a time (registers)
    uint4 b[CH], bn[CH], xw[CH];
#pragma unroll
    for (int s = 0; s < CH && s0 + s < STEPS; ++s) {
      int u = (s0 + s) * TPR + threadIdx.x;
      b[s] = bv[min(u, nb - 1)];
      bn[s] = bv[min(u - lane + 32, nb - 1)];  // the next warp's first vector: lane 31's neighbour
      xw[s] = xv[min(u, XV - 1)];
      if (MODE != NO_FIXUPS && K % 8 != 0 && u == NX - 1) {  // x's partial last vector, element by element, zeros past K
        half h[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) h[j] = j < K % 8 ? x[8 * XV + j] : __float2half(0.f);
        xw[s] = *reinterpret_cast<uint4*>(h);
      }
    }
#pragma unroll
    for (int s = 0; s < CH && s0 + s < STEPS; ++s) {
      int u = (s0 + s) * TPR + threadIdx.x;
      unsigned w[8] = {b[s].x, b[s].y, b[s].z, b[s].w};
      w[4] = __shfl_down_sync(0xffffffffu, b[s].x, 1); w[5] = __shfl_down_sync(0xffffffffu, b[s].y, 1);
      w[6] = __shfl_down_sync(0xffffffffu, b[s].z, 1); w[7] = __shfl_down_sync(0xffffffffu, b[s].w, 1);
      if (lane == 31) { w[4] = bn[s].x; w[5] = bn[s].y; w[6] = bn[s].z; w[7] = bn[s].w; }
      unsigned a[6], c[5];
#pragma unroll
      for (int i = 0; i < 6; ++i) a[i] = (q & 2) ? w[i + 2] : w[i];
#pragma unroll
      for (int i = 0; i < 5; ++i) c[i] = (q & 1) ? a[i + 1] : a[i];
      uint4 bw = make_uint4(__funnelshift_r(c[0], c[1], bits), __funnelshift_r(c[1], c[2], bits),
                            __funnelshift_r(c[2], c[3], bits), __funnelshift_r(c[3], c[4], bits));
      uint4 xs = xw[s];
      if (MODE != NO_FIXUPS && K % 8 != 0 && u == NX - 1) bw = rowalign_keep(bw, 0, 2 * (K % 8));  // B past K zeroed
      float d = dot8(xs, bw);
      acc += (NX % TPR == 0 || u < NX) ? d : 0.f;
    }
  }
  return acc;
}

template <int K, int TPR, int CH, ShflbMode MODE = FULL, int ROWS = 1>
__global__ void __launch_bounds__(TPR * ROWS) shflb(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y) {
  int row = blockIdx.x * ROWS + threadIdx.y;
  int shift = (int)((long)row * K % 8);
  float acc;
  if (MODE != CONST_SHIFT) acc = shflb_row<K, TPR, CH, MODE, -1>(B, x, row, shift);
  else switch (shift) {
    case 0: acc = shflb_row<K, TPR, CH, FULL, 0>(B, x, row, 0); break;
    case 1: acc = shflb_row<K, TPR, CH, FULL, 1>(B, x, row, 1); break;
    case 2: acc = shflb_row<K, TPR, CH, FULL, 2>(B, x, row, 2); break;
    case 3: acc = shflb_row<K, TPR, CH, FULL, 3>(B, x, row, 3); break;
    case 4: acc = shflb_row<K, TPR, CH, FULL, 4>(B, x, row, 4); break;
    case 5: acc = shflb_row<K, TPR, CH, FULL, 5>(B, x, row, 5); break;
    case 6: acc = shflb_row<K, TPR, CH, FULL, 6>(B, x, row, 6); break;
    default: acc = shflb_row<K, TPR, CH, FULL, 7>(B, x, row, 7); break;
  }
  acc = row_sum<TPR, ROWS>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}


// xstage made persistent (probe `P`): the rows of one shift (row mod P, P = 8 / gcd(K, 8)) go to
// bpc blocks, each of which stages x's window at that shift in shared memory once and then walks
// its rows (every P * bpc-th) with blockreduce's loop: B's vectors, CH steps' loads first and
// unconditional, against the staged vectors. The row's last vector is folded into vector 0 as in
// xstage, so a row walks ceil(K / 8) vectors.
template <int K, int TPR, int CH>
__global__ void __launch_bounds__(TPR) pxstage(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last, int n, int bpc) {
  constexpr int P = 8 / gcd8(K);  // rows of one shift: row mod P
  constexpr int NV = (K + 7) / 8, STEPS = (NV + TPR - 1) / TPR;
  extern __shared__ uint4 xs[];
  int cls = blockIdx.x % P;
  int shift = cls * K % 8;
  bool wrap = shift + K > 8 * NV;  // the row's bytes reach vector NV
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  stage_x_windows<K, TPR>(xs, x, shift, wrap);
  __syncthreads();
  for (int row = cls + P * (blockIdx.x / P); row < n; row += P * bpc) {
    long first = (long)row * K / 8;
    float acc = 0.f;
#pragma unroll
    for (int s0 = 0; s0 < STEPS; s0 += CH) {
      uint4 b[CH];
#pragma unroll
      for (int s = 0; s < CH && s0 + s < STEPS; ++s) b[s] = bv[min(first + (s0 + s) * TPR + threadIdx.x, last)];
      uint4 tail = (s0 == 0 && wrap) ? bv[min(first + NV, last)] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int s = 0; s < CH && s0 + s < STEPS; ++s) {
        int v = (s0 + s) * TPR + threadIdx.x;
        uint4 bb = b[s];
        if (s0 + s == 0 && v == 0) {
          bb = rowalign_keep(bb, 2 * shift, 16);
          if (wrap) bb = or4(bb, rowalign_keep(tail, 0, 2 * (shift + K - 8 * NV)));
        } else if (v == NV - 1 && !wrap) {
          bb = rowalign_keep(bb, 0, 2 * (shift + K - 8 * v));
        }
        float d = dot8(xs[min(v, NV - 1)], bb);
        acc += (NV % TPR == 0 || v < NV) ? d : 0.f;
      }
    }
    acc = row_sum<TPR, 1>(acc);
    if (threadIdx.x == 0) y[row] = __float2half(acc);
    __syncthreads();  // row_sum's shared partials are reused by the next row
  }
}

// R rows 8 apart per thread (one shift for all of them): each x window serves R rows.
template <int K, int TPR, int R, bool WRAP>
__global__ void __launch_bounds__(TPR) grouped(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = walk_vectors(K, WRAP), STEPS = (NV + TPR - 1) / TPR;
  int row0 = (blockIdx.x / 8) * 8 * R + blockIdx.x % 8;  // rows row0 + 8 j
  int shift = (int)((long)row0 * K % 8);
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  float acc[R];
#pragma unroll
  for (int j = 0; j < R; ++j) acc[j] = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) {
      uint4 w = x_window<K>(x, shift, v);
      if (WRAP && v == 0) w = or4(w, x_window<K>(x, shift, NV));
#pragma unroll
      for (int j = 0; j < R; ++j) {
        long first = (long)(row0 + 8 * j) * K / 8;
        uint4 b = row_vector<K>(bv, first, last, shift, v);
        if (WRAP && v == 0) b = or4(b, row_vector<K>(bv, first, last, shift, NV));
        acc[j] += dot8(w, b);
      }
    }
  }
  store_rows_8_apart<TPR, R>(acc, y, row0);
}


// R rows 8 apart (one shift) per block: x's window at that shift staged once in shared memory,
// zeros outside x, and the row's last vector folded into vector 0 where the row spans one more
// vector than ceil(K / 8), so every row walks ceil(K / 8) vectors. The walk itself is aligned's:
// B's vector and a shared vector, masks only on a row's first and last vectors.
template <int K, int TPR, int R, int UNROLL>
__global__ void __launch_bounds__(TPR) xstage(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = (K + 7) / 8, STEPS = (NV + TPR - 1) / TPR;
  extern __shared__ uint4 xs[];
  int row0 = (blockIdx.x / 8) * 8 * R + blockIdx.x % 8;  // rows row0 + 8 j
  int shift = (int)((long)row0 * K % 8);
  bool wrap = shift + K > 8 * NV;  // the row's bytes reach vector NV
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  stage_x_windows<K, TPR>(xs, x, shift, wrap);
  __syncthreads();
  float acc[R];
#pragma unroll
  for (int j = 0; j < R; ++j) acc[j] = 0.f;
#pragma unroll UNROLL
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) {
      uint4 w = xs[v];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        long first = (long)(row0 + 8 * j) * K / 8;
        uint4 b = bv[first + v];
        if (v == 0) {
          b = rowalign_keep(b, 2 * shift, 16);
          if (wrap) b = or4(b, rowalign_keep(bv[min(first + NV, last)], 0, 2 * (shift + K - 8 * NV)));
        } else if (v == NV - 1 && !wrap) {
          b = rowalign_keep(b, 0, 2 * (shift + K - 8 * v));
        }
        acc[j] += dot8(w, b);
      }
    }
  }
  store_rows_8_apart<TPR, R>(acc, y, row0);
}

// x's 16 bytes from byte pos (even, inside x): XMODE 0: two aligned vectors and word selects;
// XMODE 1: five 4-byte loads and funnel shifts. B (byte offset of pos in its vector) is
// compile-time when CB >= 0.
template <int XMODE, int CB>
__device__ __forceinline__ uint4 window_fast(const half* __restrict__ x, int pos) {
  if (XMODE == 0) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    int u = pos >> 4, b = CB >= 0 ? CB : (pos & 15);
    uint4 lo = xv[u];
    if (b == 0) return lo;
    uint4 hi = xv[u + 1];
    unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    int fw = b / 4, bits = 8 * (b % 4);
    unsigned a[6], c[5];
#pragma unroll
    for (int i = 0; i < 6; ++i) a[i] = (fw & 2) ? w[i + 2] : w[i];
#pragma unroll
    for (int i = 0; i < 5; ++i) c[i] = (fw & 1) ? a[i + 1] : a[i];
    return make_uint4(__funnelshift_r(c[0], c[1], bits), __funnelshift_r(c[1], c[2], bits),
                      __funnelshift_r(c[2], c[3], bits), __funnelshift_r(c[3], c[4], bits));
  } else {
    const unsigned* xw = reinterpret_cast<const unsigned*>(x) + (pos >> 2);
    int bits = 8 * (CB >= 0 ? (CB & 3) : (pos & 3));
    unsigned w0 = xw[0], w1 = xw[1], w2 = xw[2], w3 = xw[3];
    if (bits == 0) return make_uint4(w0, w1, w2, w3);
    unsigned w4 = xw[4];
    return make_uint4(__funnelshift_r(w0, w1, bits), __funnelshift_r(w1, w2, bits),
                      __funnelshift_r(w2, w3, bits), __funnelshift_r(w3, w4, bits));
  }
}

template <int K, int TPR, int SHIFT, int XMODE, bool PEEL>
__device__ __forceinline__ float walk(const half* __restrict__ B, const half* __restrict__ x, long last, int row, int shift_rt) {
  constexpr int NV = walk_vectors(K, false), STEPS = (NV + TPR - 1) / TPR;
  constexpr int CB = SHIFT >= 0 ? (16 - 2 * SHIFT) & 15 : -1;
  const int shift = SHIFT >= 0 ? SHIFT : shift_rt;
  long first = (long)row * K / 8;
  const uint4* bv = reinterpret_cast<const uint4*>(B);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if (NV % TPR == 0 || v < NV) {
      uint4 b, w;
      bool edge = !PEEL || ((s == 0 || s >= STEPS - 2) && (v == 0 || v >= NV - 1));
      if (edge) {
        b = row_vector<K>(bv, first, last, shift, v);
        w = x_window<K>(x, shift, v);
      } else {
        b = bv[first + v];
        w = window_fast<XMODE, CB>(x, 16 * v - 2 * shift);
      }
      acc += dot8(w, b);
    }
  }
  return acc;
}

template <int K, int TPR, bool CONST, int XMODE, bool PEEL>
__global__ void __launch_bounds__(TPR) walker(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  int row = blockIdx.x;
  int shift = (int)((long)row * K % 8);
  float acc;
  if (!CONST) acc = walk<K, TPR, -1, XMODE, PEEL>(B, x, last, row, shift);
  else switch (shift) {
    case 0: acc = walk<K, TPR, 0, XMODE, PEEL>(B, x, last, row, 0); break;
    case 1: acc = walk<K, TPR, 1, XMODE, PEEL>(B, x, last, row, 1); break;
    case 2: acc = walk<K, TPR, 2, XMODE, PEEL>(B, x, last, row, 2); break;
    case 3: acc = walk<K, TPR, 3, XMODE, PEEL>(B, x, last, row, 3); break;
    case 4: acc = walk<K, TPR, 4, XMODE, PEEL>(B, x, last, row, 4); break;
    case 5: acc = walk<K, TPR, 5, XMODE, PEEL>(B, x, last, row, 5); break;
    case 6: acc = walk<K, TPR, 6, XMODE, PEEL>(B, x, last, row, 6); break;
    default: acc = walk<K, TPR, 7, XMODE, PEEL>(B, x, last, row, 7); break;
  }
  acc = row_sum<TPR, 1>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}


// The row's 16-byte vectors (from the boundary at or before it) in shared memory by one bulk copy
// (cp.async.bulk, an mbarrier counting its bytes), issued by one thread at the block's start:
// all of a block's DRAM requests leave at once, whatever the arithmetic costs. x as rowalign.
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

template <int K, int TPR>
__global__ void __launch_bounds__(TPR) bulk(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y, long last) {
  constexpr int NV = walk_vectors(K, false), STEPS = (NV + TPR - 1) / TPR;
  extern __shared__ uint4 row_vectors[];
  __shared__ alignas(8) unsigned long long bar;
  int row = blockIdx.x;
  long first = (long)row * K / 8;
  int shift = (int)((long)row * K % 8);
  int count = (int)(min(first + NV - 1, last) - first + 1);  // the vectors that hold the row
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(&bar)), "r"(count * 16) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_addr(row_vectors)), "l"(reinterpret_cast<const uint4*>(B) + first), "r"(count * 16), "r"(smem_addr(&bar)) : "memory");
  }
  __syncthreads();  // the barrier's init before anyone waits on it
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_addr(&bar)) : "memory");
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int v = s * TPR + threadIdx.x;
    if ((NV % TPR == 0 || v < NV) && v < count) {
      uint4 b = rowalign_keep(row_vectors[v], (shift - 8 * v) * 2, (shift + K - 8 * v) * 2);
      uint4 w = x_window<K>(x, shift, v);
      acc += dot8(w, b);
    }
  }
  acc = row_sum<TPR, 1>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}


template <int N, int K>
struct Problem {
  half *B, *x, *y; std::vector<double> ref; std::vector<half> hy;
  Problem() {
    size_t nb = (size_t)N * K;
    std::vector<half> hB(nb), hx(K);
    std::vector<float> fB(nb), fx(K);
    srand(1);
    for (size_t i = 0; i < nb; ++i) { hB[i] = __float2half((rand() / (float)RAND_MAX - 0.5f) * 2.f); fB[i] = __half2float(hB[i]); }
    for (int i = 0; i < K; ++i) { hx[i] = __float2half((rand() / (float)RAND_MAX - 0.5f) * 2.f); fx[i] = __half2float(hx[i]); }
    ref.assign(N, 0.0);
    for (int n = 0; n < N; ++n) { double s = 0; for (int k = 0; k < K; ++k) s += (double)fB[(size_t)n * K + k] * fx[k]; ref[n] = s; }
    CK(cudaMalloc(&B, nb * 2)); CK(cudaMalloc(&x, K * 2)); CK(cudaMalloc(&y, N * 2));
    CK(cudaMemcpy(B, hB.data(), nb * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(x, hx.data(), K * 2, cudaMemcpyHostToDevice));
    hy.resize(N);
  }
  double error() {
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy.data(), y, N * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int n = 0; n < N; ++n) { double d = __half2float(hy[n]) - ref[n]; num += d * d; den += ref[n] * ref[n]; }
    return std::sqrt(num / den);
  }
  long last() const { return ((long)N * K - 1) / 8; }
  // y poisoned, one launch checked against the float64 reference, then timed: (us, error).
  template <typename F>
  std::pair<float, double> measure(Ctx& c, F launch) {
    CK(cudaMemset(y, 0xff, N * 2)); launch(); double e = error();
    return {time_us(c, launch), e};
  }
};

template <int N, int K, int TPR, int ROWS>
void run_aligned(Ctx& c, const char* tag) {
  Problem<N, K> p;
  dim3 grid(N / ROWS), block(TPR, ROWS);
  auto [us, e] = p.measure(c, [&] { aligned<K, TPR, ROWS><<<grid, block>>>(p.B, p.x, p.y); });
  printf("%dx%d %-24s tpr=%3d rows=%d  %7.2f us  err %.1e\n", N, K, tag, TPR, ROWS, us, e);
}

template <int N, int K, int TPR, int ROWS>
void run_ragged(Ctx& c) {
  Problem<N, K> p;
  dim3 grid(N / ROWS), block(TPR, ROWS);
  long last = p.last();
#define ONE(tag, ...) { auto [us, e] = p.measure(c, [&] { __VA_ARGS__<<<grid, block>>>(p.B, p.x, p.y, last); }); \
    printf("%dx%d %-24s tpr=%3d rows=%d  %7.2f us  err %.1e\n", N, K, tag, TPR, ROWS, us, e); }
  ONE("rowalign", rowalign<K, TPR, ROWS, false>)
  ONE("rowalign+wrap", rowalign<K, TPR, ROWS, true>)
  ONE("hoistb", hoistb<K, TPR, false>)
  ONE("hoistb+wrap", hoistb<K, TPR, true>)
  { constexpr int NVB = (K + 7) / 8 + 1; CK(cudaFuncSetAttribute(bulk<K, TPR>, cudaFuncAttributeMaxDynamicSharedMemorySize, NVB * 16));
    auto launch = [&] { bulk<K, TPR><<<grid, block, NVB * 16>>>(p.B, p.x, p.y, last); };
    auto [us, e] = p.measure(c, launch);
    printf("%dx%d %-24s tpr=%3d rows=%d  %7.2f us  err %.1e\n", N, K, "bulk", TPR, ROWS, us, e); }
  ONE("wrap+hoist", hoisted<K, TPR, ROWS, false>)
  ONE("wrap+hoist+constshift", hoisted<K, TPR, ROWS, true>)
  ONE("peel", walker<K, TPR, false, 0, true>)
  ONE("peel+ldg32", walker<K, TPR, false, 1, true>)
  ONE("const", walker<K, TPR, true, 0, false>)
  ONE("const+peel", walker<K, TPR, true, 0, true>)
  ONE("const+peel+ldg32", walker<K, TPR, true, 1, true>)
#undef ONE
}

template <int N, int K, int TPR, int R>
void run_grouped(Ctx& c) {
  Problem<N, K> p;
  dim3 grid(N / R), block(TPR);
  long last = p.last();
#define ONE(tag, ...) { auto [us, e] = p.measure(c, [&] { __VA_ARGS__<<<grid, block>>>(p.B, p.x, p.y, last); }); \
    printf("%dx%d %-22s tpr=%3d R=%d     %7.2f us  err %.1e\n", N, K, tag, TPR, R, us, e); }
  ONE("grouped", grouped<K, TPR, R, false>)
  ONE("grouped+wrap", grouped<K, TPR, R, true>)
#undef ONE
}

template <int N, int K>
void shape_pair(Ctx& c) {
  run_aligned<N, K + 1, 128, 1>(c, "aligned(blockreduce)");
  { Problem<N, K + 1> p; long last = p.last(); constexpr int NVB = (K + 1) / 8 + 1;
    CK(cudaFuncSetAttribute(bulk<K + 1, 128>, cudaFuncAttributeMaxDynamicSharedMemorySize, NVB * 16));
    auto launch = [&] { bulk<K + 1, 128><<<N, 128, NVB * 16>>>(p.B, p.x, p.y, last); };
    auto [us, e] = p.measure(c, launch);
    printf("%dx%d %-24s tpr=%3d rows=%d  %7.2f us  err %.1e\n", N, K + 1, "aligned, bulk", 128, 1, us, e); }
  run_aligned<N, K - 7, 128, 1>(c, "aligned K-7");
  run_aligned<N, K + 9, 128, 1>(c, "aligned K+9");
  run_ragged<N, K, 128, 1>(c);
  run_grouped<N, K, 128, 2>(c);

}

template <int N, int K, int TPR, int R>
void run_xhoist(Ctx& c, const char* tag) {
  Problem<N, K> p;
  long last = p.last();
  constexpr int bytes = (K + 7) / 8 * 16;
  auto kern = xhoist<K, TPR, R>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  auto launch = [&] { kern<<<N / R, TPR, bytes>>>(p.B, p.x, p.y, last); };
  auto [us, e] = p.measure(c, launch);
  printf("%dx%d %-24s tpr=%3d R=%d     %7.2f us  err %.1e\n", N, K, tag, TPR, R, us, e);
}

template <int N, int K>
void hoistb_pair(Ctx& c) {
  run_aligned<N, K + 1, 128, 1>(c, "aligned(blockreduce)");
  run_aligned<N, K - 7, 128, 1>(c, "aligned K-7");
  Problem<N, K> p;
  long last = p.last();
#define ONE(tag, ...) { auto [us, e] = p.measure(c, [&] { __VA_ARGS__<<<N, TPR>>>(p.B, p.x, p.y, last); }); \
    printf("%dx%d %-24s tpr=%3d        %7.2f us  err %.1e\n", N, K, tag, TPR, us, e); }
  { constexpr int TPR = 128; ONE("rowalign", rowalign<K, TPR, 1, false>) ONE("rowalign+wrap", rowalign<K, TPR, 1, true>)
    ONE("hoistb", hoistb<K, TPR, false>) ONE("hoistb+wrap", hoistb<K, TPR, true>) }
  { constexpr int TPR = 256; ONE("hoistb", hoistb<K, TPR, false>) ONE("hoistb+wrap", hoistb<K, TPR, true>) }
#undef ONE
  { Problem<N, K> p; long last = p.last();
#define ONE(tag, ...) { auto [us, e] = p.measure(c, [&] { __VA_ARGS__<<<N, TPR>>>(p.B, p.x, p.y, last); }); \
    printf("%dx%d %-24s tpr=%3d        %7.2f us  err %.1e\n", N, K, tag, TPR, us, e); }
    { constexpr int TPR = 128; ONE("unpredicated", unpredicated<K, TPR>) ONE("wrapfirst", wrapfirst<K, TPR>) }
    { constexpr int TPR = 256; ONE("wrapfirst", wrapfirst<K, TPR>) ONE("rowalign", rowalign<K, TPR, 1, false>) ONE("rowalign+wrap", rowalign<K, TPR, 1, true>) }
#undef ONE
  }
  run_xhoist<N, K + 1, 128, 1>(c, "xhoist aligned");
  run_xhoist<N, K + 1, 128, 2>(c, "xhoist aligned");
  run_xhoist<N, K, 128, 1>(c, "xhoist");
  run_xhoist<N, K, 128, 2>(c, "xhoist");
  run_xhoist<N, K, 128, 4>(c, "xhoist");
  run_xhoist<N, K, 256, 1>(c, "xhoist");
  run_xhoist<N, K, 256, 2>(c, "xhoist");
  run_xhoist<N, K, 64, 2>(c, "xhoist");
}


// blockreduce's walk on the ragged rows' aligned vectors (first = floor(row K / 8), ceil(K / 8) of
// them, no shift, no masks): the memory pattern alone; its sums are wrong.
template <int K, int TPR, int ROWS = 1>
__global__ void __launch_bounds__(TPR * ROWS) ragged_rows_plain(const half* __restrict__ B, const half* __restrict__ x, half* __restrict__ y) {
  constexpr int NX = (K + 7) / 8, XV = K / 8, STEPS = (NX + TPR - 1) / TPR;
  int row = blockIdx.x * ROWS + threadIdx.y;
  const uint4* bv = reinterpret_cast<const uint4*>(B) + (long)row * K / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    int u = s * TPR + threadIdx.x;
    if (NX % TPR == 0 || u < NX) acc += dot8(xv[min(u, XV - 1)], bv[u]);
  }
  acc = row_sum<TPR, ROWS>(acc);
  if (threadIdx.x == 0) y[row] = __float2half(acc);
}

template <int N, int K, int TPR, int CH, ShflbMode MODE = FULL, int ROWS = 1>
void run_shflb(Ctx& c, const char* tag) {
  Problem<N, K> p;
  auto launch = [&] { shflb<K, TPR, CH, MODE, ROWS><<<N / ROWS, dim3(TPR, ROWS)>>>(p.B, p.x, p.y); };
  auto [us, e] = p.measure(c, launch);
  printf("%dx%d %-24s tpr=%3d ch=%d r=%d %7.2f us  err %.1e\n", N, K, tag, TPR, CH, ROWS, us, e);
}

template <int N, int K, int TPR, int ROWS>
void run_plain(Ctx& c) {
  Problem<N, K> p;
  auto launch = [&] { ragged_rows_plain<K, TPR, ROWS><<<N / ROWS, dim3(TPR, ROWS)>>>(p.B, p.x, p.y); };
  launch(); float us = time_us(c, launch);
  printf("%dx%d %-24s tpr=%3d r=%d        %7.2f us  (sums wrong when ragged)\n", N, K, "plain walk", TPR, ROWS, us);
}

template <int N, int K>
void shflb_pair(Ctx& c) {
  run_aligned<N, K + 1, 128, 1>(c, "aligned(blockreduce)");
  run_aligned<N, K + 1, 32, 4>(c, "aligned(allreduce)");
  run_plain<N, K, 128, 1>(c);
  run_plain<N, K, 32, 4>(c);
  run_shflb<N, K + 1, 128, 4>(c, "shflb aligned");
  run_shflb<N, K, 128, 1, NO_FIXUPS>(c, "shflb no fixups (wrong)");
  run_shflb<N, K, 128, 1, SHIFT_ZERO>(c, "shflb shift 0 (wrong)");
  run_shflb<N, K, 128, 1>(c, "shflb");
  run_shflb<N, K, 128, 2>(c, "shflb");
  run_shflb<N, K, 256, 2>(c, "shflb");
  run_shflb<N, K, 32, 4, FULL, 4>(c, "shflb");
  run_shflb<N, K, 128, 1, CONST_SHIFT>(c, "shflb constshift");
  run_shflb<N, K, 128, 2, CONST_SHIFT>(c, "shflb constshift");
  run_shflb<N, K, 256, 1, CONST_SHIFT>(c, "shflb constshift");
  run_shflb<N, K, 32, 2, CONST_SHIFT, 4>(c, "shflb constshift");
}

template <int N, int K, int TPR, int CH>
void run_pxstage(Ctx& c, int bpc, const char* tag) {
  Problem<N, K> p;
  long last = p.last();
  constexpr int P = 8 / gcd8(K);  // rows of one shift: row mod P
  constexpr int bytes = (K + 7) / 8 * 16;
  auto kern = pxstage<K, TPR, CH>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  auto launch = [&] { kern<<<P * bpc, TPR, bytes>>>(p.B, p.x, p.y, last, N, bpc); };
  auto [us, e] = p.measure(c, launch);
  printf("%dx%d %-24s tpr=%3d ch=%d bpc=%4d %7.2f us  err %.1e\n", N, K, tag, TPR, CH, bpc, us, e);
}

template <int N, int K>
void pxstage_pair(Ctx& c) {
  run_aligned<N, K + 1, 128, 1>(c, "aligned(blockreduce)");
  for (int bpc : {132 * 8, 132 * 16}) run_pxstage<N, K + 1, 128, 4>(c, bpc, "pxstage aligned");
  for (int bpc : {66, 132, 264}) run_pxstage<N, K, 128, 4>(c, bpc, "pxstage");
  for (int bpc : {132, 264}) run_pxstage<N, K, 128, 2>(c, bpc, "pxstage");
  for (int bpc : {132, 264}) run_pxstage<N, K, 256, 2>(c, bpc, "pxstage");
  run_shflb<N, K, 128, 1, CONST_SHIFT>(c, "shflb constshift");
}

template <int N, int K, int TPR, int R, int UNROLL>
void run_xstage(Ctx& c, const char* tag) {
  Problem<N, K> p;
  long last = p.last();
  constexpr int bytes = (K + 7) / 8 * 16;
  auto kern = xstage<K, TPR, R, UNROLL>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  auto launch = [&] { kern<<<N / R, TPR, bytes>>>(p.B, p.x, p.y, last); };
  auto [us, e] = p.measure(c, launch);
  printf("%dx%d %-24s tpr=%3d R=%d u=%d %7.2f us  err %.1e\n", N, K, tag, TPR, R, UNROLL, us, e);
}

template <int N, int K>
void xstage_pair(Ctx& c) {
  run_aligned<N, K + 1, 128, 1>(c, "aligned(blockreduce)");
  run_xstage<N, K + 1, 128, 1, 1>(c, "xstage aligned");
  run_xstage<N, K + 1, 128, 4, 1>(c, "xstage aligned");
  run_xstage<N, K, 128, 1, 1>(c, "xstage");
  run_xstage<N, K, 128, 1, 4>(c, "xstage");
  run_xstage<N, K, 128, 2, 1>(c, "xstage");
  run_xstage<N, K, 128, 2, 4>(c, "xstage");
  run_xstage<N, K, 128, 4, 1>(c, "xstage");
  run_xstage<N, K, 128, 4, 4>(c, "xstage");
  run_xstage<N, K, 256, 4, 1>(c, "xstage");
  run_xstage<N, K, 64, 2, 4>(c, "xstage");
  run_xstage<N, K, 128, 8, 1>(c, "xstage");
}

template <int N, int K>
void run_tvm(Ctx& c, void (*kern)(half*, half*, half*), dim3 grid, dim3 block, const char* tag) {
  Problem<N, K> p;
  auto [us, e] = p.measure(c, [&] { kern<<<grid, block>>>(p.B, p.x, p.y); });
  printf("%dx%d %-22s               %7.2f us  err %.1e\n", N, K, tag, us, e);
}

#include "tvm_kernels.cuh"  // the kernels and run_tvm_kernels(Ctx&, n, k)

// The four ragged shapes, each through PAIR's kernels and then TVM's.
#define EACH_SHAPE(PAIR) { \
    PAIR<4096, 4095>(c); run_tvm_kernels(c, 4096, 4095); PAIR<3584, 3583>(c); run_tvm_kernels(c, 3584, 3583); \
    PAIR<4096, 14335>(c); run_tvm_kernels(c, 4096, 14335); PAIR<3584, 18943>(c); run_tvm_kernels(c, 3584, 18943); }

int main(int argc, char** argv) {
  char mode = argc > 1 ? argv[1][0] : 0;
  g_profile = mode == 'p';  // "p": one launch of each kernel (for ncu), first shape only
  Ctx c = make_ctx();
  // One family of walks beside TVM's kernels only: "x" xstage, "h" hoistb, "s" shflb, "P" pxstage.
  if (mode == 'x') { EACH_SHAPE(xstage_pair) return 0; }
  if (mode == 'h') { EACH_SHAPE(hoistb_pair) return 0; }
  if (mode == 's') { EACH_SHAPE(shflb_pair) return 0; }
  if (mode == 'P') { EACH_SHAPE(pxstage_pair) return 0; }
  shape_pair<4096, 4095>(c);
  run_tvm_kernels(c, 4096, 4095);
  if (g_profile) return 0;
  shape_pair<3584, 3583>(c);
  run_tvm_kernels(c, 3584, 3583);
  shape_pair<4096, 14335>(c);
  run_tvm_kernels(c, 4096, 14335);
  shape_pair<3584, 18943>(c);
  run_tvm_kernels(c, 3584, 18943);
  return 0;
}
