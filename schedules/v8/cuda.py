"""v8's CUDA and PTX: the instructions TVM 0.27's T.ptx names, and the small inline CUDA
helpers (name, source) for what it cannot express: accumulator fences, cluster multicast and
arrival, whole-sector stores of C, the staging of tma_store's boxes and split K's workspace,
and the staging of rows TMA cannot load.
Also the expressions the kernel builds its shared addresses, descriptors and tensor maps from.
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder

from ..tensorcore import SHORT, WARPGROUP
from ..workloads import FP8
from .geometry import SWIZZLE

PTX_TYPE = {**SHORT, FP8: "e4m3"}
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232  # setmaxnreg: 128*40 + 256*232 <= 65536
L2_PROMOTION_256B = 3  # CUtensorMapL2promotion
TMA_LOAD = T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"]
TMA_STORE = T.ptx["cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"]
SPLIT_BARRIER = 1  # named barrier of the 256 consumer threads (0 is __syncthreads')
BOX_BARRIER = 2  # and 3: named barriers of consumer warpgroup 1 and 2 alone (tma_store)
TURN_BARRIER = 4  # and 5: pingpong's turns of consumer warpgroup 1 and 2 (both count)


# -- accumulator fences ------------------------------------------------------------------------
# TVM 0.27's T.cuda.wgmma.noop_barrier cannot fence a local buffer's element: its codegen
# (tvm/backend/cuda/cpp/asm.py) reads `reg.dtype`, which a BufferLoad lacks (AttributeError), and
# its helper takes the register by value, so it would fence a copy. The fences are therefore
# CUDA helpers of their own (`register_helper`), called with the register by reference:
#
# FENCE_OPERAND, CUTLASS's warpgroup_fence_operand: an empty asm that reads and writes the
#   register, so the compiler keeps its reads and writes on their side of the wgmma calls.
# SETTLE: after the last wgmma.wait_group 0 of a tile, each accumulator passes through an
#   `add.f32 x, x, +0` before the epilogue reads it. Without it ptxas (CUDA 13.0) hoists the
#   epilogue's float -> 16-bit conversions (F2FP.PACK_AB) above the final WARPGROUP.DEPBAR, so
#   they read accumulators that the last K block's wgmmas have not yet written (16-bit C off by
#   about sqrt(64/K) on an H100); the adds stay below it and the conversions read the adds.
#   x + 0 is x for every x but -0, which becomes +0.
def register_helper(name: str, body: str) -> tuple[str, str]:
    """A CUDA helper (name, source) whose `body` reads and writes the float `reg` in place."""
    return name, f"\n__forceinline__ __device__ void {name}(float& reg) {{\n  {body}\n}}\n"


FENCE_OPERAND = register_helper("v8_fence_operand", 'asm volatile("" : "+f"(reg) :: "memory");')
SETTLE = register_helper("v8_settle",
                         'asm volatile("add.f32 %0, %0, 0f00000000;" : "+f"(reg) :: "memory");')


# Clusters (cluster_n = 2 or cluster_m = 2): the two CTAs of a cluster take two tiles side by
# side along N (they share A's box) or along M (they share B's). Each loads half of the shared
# box (nn's B: every other 64-column box), and TMA multicasts it into the same stage of both
# CTAs (the same shared offset), completing its bytes on the `full` barrier at that offset in
# each: cuBLAS's clusters of 2, which read the shared operand from L2 half as often. A stage is
# then free only when both CTAs' consumers are done with it: one thread per consumer warpgroup
# and CTA of the cluster arrives at that CTA's `empty` barrier (FREE_STAGE, CUTLASS's
# predicated ClusterBarrier::arrive; mapa: the barrier at the same offset in CTA `rank`; a
# predicate, not a branch: a branch in the K loop cost 30% of v8's speed), and before a CTA
# ends its producer waits until every stage is freed, so that no arrival comes to a CTA that
# has gone. Without clusters one thread per warpgroup frees the stage in its own CTA
# (FREE_OWN_STAGE: the same predicate, no mapa).
TMA_LOAD_MULTICAST = ("v8_tma_load_multicast", """
__forceinline__ __device__ void v8_tma_load_multicast(unsigned dst, unsigned long long map,
                                                      int c0, int c1,
                                                      void* bar, unsigned short ctas) {
  unsigned barrier = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(barrier), "h"(ctas) : "memory");
}
""")
FREE_STAGE = ("v8_free_stage", """
__forceinline__ __device__ void v8_free_stage(void* bar, unsigned rank, bool signals) {
  unsigned local = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("{ .reg .pred p; .reg .b32 remote; setp.ne.b32 p, %2, 0; "
               "@p mapa.shared::cluster.u32 remote, %0, %1; "
               "@p mbarrier.arrive.shared::cluster.b64 _, [remote]; }"
               :: "r"(local), "r"(rank), "r"((unsigned)signals) : "memory");
}
""")
FREE_OWN_STAGE = ("v8_free_own_stage", """
__forceinline__ __device__ void v8_free_own_stage(void* bar, bool signals) {
  unsigned local = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %1, 0; "
               "@p mbarrier.arrive.shared::cta.b64 _, [%0]; }"
               :: "r"(local), "r"((unsigned)signals) : "memory");
}
""")
# The warpgroup a thread is in, read from lane 0 of its warp (CUTLASS's canonical_warp_group_idx):
# the same value, but one ptxas knows every lane of the warp shares, so what the consumers derive
# from it (their ring positions, stages, wgmma descriptors) lives in uniform registers. Derived
# from threadIdx alone, each wgmma's descriptors were built in ordinary registers and moved
# across (R2UR) before every wgmma.
WARPGROUP_OF_WARP = ("v8_warpgroup_of_warp", f"""
__forceinline__ __device__ int v8_warpgroup_of_warp(int thread) {{
  return __shfl_sync(0xffffffffu, thread / {WARPGROUP * 32}, 0);
}}
""")
CLUSTER_SYNC = ("v8_cluster_sync", """
__forceinline__ __device__ void v8_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
""")


# The epilogue stores whole 32-byte sectors of C per row and warp store, where C's rows allow:
# PAIR_STORE: float32 C, N even: a thread's two neighbouring columns (a wgmma fragment's e = 0,
#   1) in one 8-byte store; the 4 threads of a row then write 32 contiguous bytes. Two scalar
#   stores each half-filled every sector (ncu, 4096^3: 50% excess sectors).
# QUAD_STORE: 16-bit C, N a multiple of 4: a pair is only 4 bytes, so the two threads of a
#   row that hold neighbouring pairs swap one (a shuffle), each then holding 4 columns, stored
#   in 8 bytes: the even thread of the two gets its partner's pair of block n8 next to its own,
#   the odd one its partner's pair of block n8 + 1; the row's 4 threads again write 32 bytes.
# Both convert as a scalar cast would (round to nearest even).
PAIR_STORE = ("v8_store_pair", "\n__forceinline__ __device__ void v8_store_pair(void* p, float a, "
              "float b) {\n  *reinterpret_cast<float2*>(p) = make_float2(a, b);\n}\n")
TO_PAIR = {"float16": "__floats2half2_rn", "bfloat16": "__floats2bfloat162_rn"}
QUAD_STORE = """  auto low = {convert}(a0, a1), high = {convert}(b0, b1);
  unsigned mine = *reinterpret_cast<unsigned*>(odd ? &low : &high);
  unsigned theirs = __shfl_xor_sync(0xffffffffu, mine, 1);
  unsigned kept = *reinterpret_cast<unsigned*>(odd ? &high : &low);
  if (ok) *reinterpret_cast<uint2*>(p) = odd ? make_uint2(theirs, kept) : make_uint2(kept, theirs);"""


def quad_store(out_dtype: str) -> tuple[str, str]:
    """QUAD_STORE for a 16-bit C, as a CUDA helper (name, source) taking (&C[r, c], odd, the
    thread's pair of block n8, its pair of block n8 + 1, ok). Every lane of the warp calls it
    (the shuffle), `ok` or not; the store happens where `ok`."""
    name = f"v8_store_quad_{out_dtype}"
    return name, (f"\n__forceinline__ __device__ void {name}(void* p, int odd, float a0, float a1, "
                  f"float b0, float b1, bool ok) {{\n"
                  f"{QUAD_STORE.format(convert=TO_PAIR[out_dtype])}\n}}\n")


def stage_pair(out_dtype: str) -> tuple[str, str]:
    """A CUDA helper (name, source) that writes a thread's two neighbouring columns of C,
    converted to out_dtype, at 32-bit shared address `addr`: 8 bytes of float32, or a 4-byte
    16-bit pair (converted as a scalar cast would)."""
    name = f"v8_stage_pair_{out_dtype}"
    header = {"float16": "#include <cuda_fp16.h>\n", "bfloat16": "#include <cuda_bf16.h>\n"}
    if out_dtype == "float32":
        body = 'asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(addr), "f"(a), "f"(b) : "memory");'
    else:  # the kernel itself may name no 16-bit type, so the helper brings its header
        body = (f"auto pair = {TO_PAIR[out_dtype]}(a, b);\n  unsigned bits = *reinterpret_cast"
                '<unsigned*>(&pair);\n  asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), '
                '"r"(bits) : "memory");')
    return name, (f"\n{header.get(out_dtype, '')}__forceinline__ __device__ void {name}("
                  f"unsigned addr, float a, float b) {{\n  {body}\n}}\n")


# Rows TMA cannot load (strides not whole 16 bytes, e.g. bf16 K = 4095) are staged: at the
# kernel's start every CTA copies its share of such an operand into a workspace of rows padded
# with zeros to whole 16-byte multiples (STAGE_ROWS: each thread builds one 16-byte chunk of a
# padded row from single-element loads, since a source row may start at any element, and
# stores it whole), then GRID_SYNC waits for every CTA's share before any TMA load. The grid
# is persistent, one CTA per SM, so every CTA is resident and the barrier cannot deadlock.
# GRID_SYNC counts the CTAs in on a counter that the last one sets back to zero before it
# bumps a generation word the others spin on, so each launch finds the counter at zero (two
# launches of one kernel must not run at once, as with split K). Its proxy fences order the
# copies' generic stores before the TMA (async proxy) loads that read them.
STAGE_ROWS = """
__forceinline__ __device__ void v8_stage_rows_{bits}(const void* source, void* staged,
                                                   long long rows, int cols, int padded) {{
  typedef unsigned {element} E;
  constexpr int per_chunk = 16 / sizeof(E);
  const E* from = static_cast<const E*>(source);
  long long chunks = rows * (padded / per_chunk);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < chunks;
       i += (long long)gridDim.x * blockDim.x) {{
    long long row = i / (padded / per_chunk);
    int col = (int)(i % (padded / per_chunk)) * per_chunk;
    union {{ uint4 chunk; E e[per_chunk]; }} out;
#pragma unroll
    for (int j = 0; j < per_chunk; ++j) out.e[j] = col + j < cols ? from[row * cols + col + j] : E(0);
    reinterpret_cast<uint4*>(staged)[i] = out.chunk;
  }}
}}
"""
GRID_SYNC = ("v8_grid_sync", """
#ifndef V8_GRID_SYNC
#define V8_GRID_SYNC
__device__ unsigned v8_grid_arrivals;
__device__ volatile unsigned v8_grid_generation;
#endif
__forceinline__ __device__ void v8_grid_sync() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned generation = v8_grid_generation;
    __threadfence();
    if (atomicAdd(&v8_grid_arrivals, 1u) == gridDim.x - 1) {
      v8_grid_arrivals = 0u;
      __threadfence();
      atomicAdd((unsigned*)&v8_grid_generation, 1u);
    } else {
      while (v8_grid_generation == generation) __nanosleep(64);
    }
    __threadfence();
  }
  __syncthreads();
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
""")


def stage_rows(element_bytes: int) -> tuple[str, str]:
    """STAGE_ROWS for elements of `element_bytes` bytes, as a CUDA helper (name, source) taking
    (source, workspace, rows, cols, padded cols)."""
    bits = 8 * element_bytes
    element = {1: "char", 2: "short"}[element_bytes]
    return f"v8_stage_rows_{bits}", STAGE_ROWS.format(bits=bits, element=element)


def swizzled(offset, span: int):
    """Where byte `offset` of a box with rows of `span` bytes lands in shared memory under
    TMA's swizzle of that span: its 16-byte chunk number xor-ed with bits 7 and up of the
    offset (as many bits as the span has chunks, less one: 3 for 128 bytes)."""
    return T.bitwise_xor(offset, T.shift_left(
        T.bitwise_and(T.shift_right(offset, 7), span // 16 - 1), 4))


def split_k_helpers(tag: str, float4s: int, tiles: int) -> dict:
    """CUDA helpers (name, source) of split K, keyed by role (`arrive` returns the count before
    it, an unsigned; the others nothing). The workspace
    is file-scope device memory of the kernel's module, sized for its workload: `float4s`
    float4s of partial tiles, and one arrival counter per output tile, zero when the module
    loads and set back to zero by the last slice of its tile, so the next launch finds it zero
    (two launches of one kernel must therefore not run at the same time). Partials go to and
    come from L2 (st.cg / ld.cg): the slices of a tile run on different SMs. Each thread fences
    its partials (__threadfence) before the count, and the last slice's after it."""
    declare = (f"#ifndef V8_SPLIT_K_{tag}\n#define V8_SPLIT_K_{tag}\n"
               f"__device__ float4 v8_partials_{tag}[{float4s}];\n"
               f"__device__ unsigned v8_arrivals_{tag}[{tiles}];\n#endif\n")
    four = "float& a, float& b, float& c, float& d"
    bodies = {
        "stash": ("void", f"(int i, {four}) {{ __stcg(&v8_partials_{tag}[i], "
                          "make_float4(a, b, c, d)); }"),
        "gather": ("void", f"(int i, {four}) {{ float4 v = __ldcg(&v8_partials_{tag}[i]); "
                           "a += v.x; b += v.y; c += v.z; d += v.w; }"),
        "arrive": ("unsigned", f"(int tile) {{ return atomicAdd(&v8_arrivals_{tag}[tile], 1u); }}"),
        "rearm": ("void", f"(int tile) {{ v8_arrivals_{tag}[tile] = 0u; }}"),
    }
    return {role: (f"v8_{role}_{tag}",
                   f"{declare}__forceinline__ __device__ {returns} v8_{role}_{tag}{body}\n")
            for role, (returns, body) in bodies.items()}


def arrival_word(split_k: int):
    """Split K's shared word `arrived` (how many slices of the tile arrived before this CTA's),
    allocated only where K is split: called inside the kernel's script."""
    if split_k == 1:
        return None
    return IRBuilder.name("arrived", T.alloc_buffer((1,), "uint32", scope="shared"))


def descriptor_base(address, leading_bytes: int):
    """The low 32 bits of wgmma's shared-memory matrix descriptor (PTX ISA 9.7.15.5.1) of a
    128-byte-swizzled operand at 32-bit shared `address`: address >> 4 in bits 0-13, the
    leading byte offset >> 4 in bits 16-29 (v7's encoding). `descriptor_at` makes whole
    descriptors from it."""
    start = T.bitwise_and(T.shift_right(address, T.uint32(4)), T.uint32(0x3FFF))
    return T.bitwise_or(start, T.uint32((leading_bytes >> 4) << 16))


def descriptor_at(base, offset_bytes, stride_bytes: int):
    """wgmma's descriptor of the operand `offset_bytes` (a multiple of 16) past the address of
    `descriptor_base`'s `base`: its address field plus offset_bytes >> 4, as CUTLASS's descriptor
    iterator adds them (no carry out of the field: shared addresses stay under 2^18 bytes),
    with the stride byte offset >> 4 in bits 32-45 and swizzle mode 1 (128 bytes) in bits
    62-63. A K block's wgmmas so take one base and an add each."""
    low = base + T.Cast("uint32", T.shift_right(offset_bytes, 4))
    return T.bitwise_or(T.Cast("uint64", low), T.uint64((stride_bytes >> 4) << 32 | 1 << 62))


def tensor_map(rows, cols: int, box_rows: int, box_cols: int, element_bytes: int) -> list:
    """runtime.cuTensorMapEncodeTiled's arguments after the pointer for a row-major
    [rows, cols] tensor in boxes of box_rows x box_cols (cols innermost), swizzled over the
    box's row bytes (128, 64 or 32): global dims, row stride in bytes, box dims, element
    strides, interleave none, swizzle, L2 promotion, out-of-bounds fill none (zeros)."""
    return [cols, rows, cols * element_bytes, box_cols, box_rows, 1, 1,
            0, SWIZZLE[box_cols * element_bytes], L2_PROMOTION_256B, 0]
