"""Hopper GEMM written whole as a TIRx kernel (v8): TMA loads into a ring of shared stages, one
mbarrier pair per stage, warp specialization and a persistent tile loop, wgmma as in v7.

No s_tir schedule primitive produces TMA, mbarriers or a warp-specialized kernel, so v8 is a
kernel template: `v8_kernel(wl, **knobs)` (the rung's `compute`) writes the whole kernel in TVM
0.27's TIRx (`T.device_entry`, `T.cta_id`, `T.ptx`), with the workload's buffers A, B and C, and
refuses what the template cannot take; the schedule function only checks the target's arch.
It is built with TVM's "tirx" pipeline (tuning/build.py tells such kernels by the TIRX_KERNEL
attribute they carry).

Shared layout. A TMA box whose inner extent is 128 bytes, loaded with the 128-byte swizzle,
lands as rows of 128 bytes with the 16-byte chunk c of row r at chunk c ^ (r % 8): v7's
swizzled atoms (8 rows x 128 bytes), so v7's wgmma descriptors apply unchanged. A stage holds
A's block_m x 64 box (K-major), then B's: one block_n x 64 box in nt (K-major), or block_n/64
boxes of 64 N x 64 K in nn (MN-major, read with wgmma's transpose bit).

Ragged M, N and K: TMA fills the parts of a box past the tensor's edge with zeros (and still
counts the whole box's bytes), so the main loop has no predicates; the epilogue guards its
stores, or (tma_store) sends C out in boxes that TMA clips at C's edges. What TMA cannot take
is a row stride that is not a whole number of 16 bytes: such workloads are refused (v7 takes
them).

fp8 (e4m3) inputs (workloads.FP8, layout nt only: fp8 wgmma has no transposed operands): k32
wgmmas on 128-element K blocks (the same 128-byte rows), loaded by TMA as bytes; the kernel
takes the two per-tensor scales after B and multiplies the float32 accumulators by their
product just before C is stored (after split K's sum).
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import Schedule
from tvm.script.ir_builder import IRBuilder
from tvm.script import tirx as T

from . import heuristics
from .common import TIRX_KERNEL, cuda_call, require_sm
from .errors import ScheduleNotApplicable
from .registry import schedule
from .tensorcore import HOPPER_SHARED_BYTES, SHORT, WARPGROUP
from .workloads import DTYPE_BYTES, FP8, FP8_SCALES, Workload

ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, FP8: 1}
PTX_TYPE = {**SHORT, FP8: "e4m3"}
ROW_BYTES = 128  # one swizzled row: a box's inner extent, and the K of a stage
ATOM = 1024  # bytes of one swizzle atom: 8 rows of 128 bytes
CONSUMERS = 2  # consumer warpgroups
THREADS = (1 + CONSUMERS) * WARPGROUP * 32  # a producer warpgroup and the consumers
CONSUMER_THREADS = CONSUMERS * WARPGROUP * 32
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232  # setmaxnreg: 128*40 + 256*232 <= 65536
MOST_ACCUMULATORS = 192  # fp32 accumulators a consumer thread keeps within its 232 registers
TMA_STRIDE_BYTES = 16  # TMA takes global row strides in whole multiples of this
L2_PROMOTION_256B = 3  # CUtensorMapL2promotion
TMA_LOAD = T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"]
TMA_STORE = T.ptx["cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"]

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
# has gone. Without clusters the same helper frees the stage, one thread per warpgroup.
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
CLUSTER_SYNC = ("v8_cluster_sync", """
__forceinline__ __device__ void v8_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
""")


MOST_PARTIAL_BYTES = 256 << 20  # split K's float32 partials: the most its workspace may hold
SPLIT_BARRIER = 1  # named barrier of the 256 consumer threads (0 is __syncthreads')
BOX_BARRIER = 2  # and 3: named barriers of consumer warpgroup 1 and 2 alone (tma_store)
TURN_BARRIER = 4  # and 5: pingpong's turns of consumer warpgroup 1 and 2 (both count)


def k_block_count(K: int, element_bytes: int) -> int:
    """The K blocks of one swizzled row each (ROW_BYTES) that K makes, the last one ragged."""
    return -(-K * element_bytes // ROW_BYTES)


def arena_bytes(block_m: int, block_n: int, stages: int, tma_store: bool = False) -> int:
    """Dynamic shared memory of the ring: `stages` stages of A's and B's 128-byte rows, plus
    one swizzle atom of room to round the ring's start up to an atom; with tma_store, then
    the boxes of C on their way out (STORE_BOXES of at most BOX_ROWS x ROW_BYTES)."""
    boxes = STORE_BOXES * BOX_ROWS * ROW_BYTES if tma_store else 0
    return stages * (block_m + block_n) * ROW_BYTES + ATOM + boxes


# The TMA-store epilogue (tma_store): each consumer warpgroup writes its part of C into
# shared boxes of BOX_ROWS rows (one m64 wgmma's) and box_bytes(...) bytes per row, two boxes
# in turn, and one of its threads sends each box to C with a TMA store that runs on while
# the consumers go on to the next tile. A box's rows are swizzled as TMA swizzles them
# (SWIZZLE: its span is the row's bytes), so the stores of a warp spread over the banks.
BOX_ROWS = 64
STORE_BOXES = 4  # two per consumer warpgroup
SWIZZLE = {128: 3, 64: 2, 32: 1}  # CUtensorMapSwizzle of rows of so many bytes


def box_bytes(block_m: int, block_n: int, out_dtype: str, pingpong: bool = False) -> int:
    """Bytes per row of the boxes in which a consumer's columns of C go out: the widest
    swizzle span that divides them (they are a multiple of 16 columns, so 32 bytes always
    does)."""
    columns = _consumer_tile(block_m, block_n, pingpong)[1] * DTYPE_BYTES[out_dtype]
    return next(span for span in sorted(SWIZZLE, reverse=True) if columns % span == 0)


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


def _swizzled(offset, span: int):
    """Where byte `offset` of a box with rows of `span` bytes lands in shared memory under
    TMA's swizzle of that span: its 16-byte chunk number xor-ed with bits 7 and up of the
    offset (as many bits as the span has chunks, less one: 3 for 128 bytes)."""
    return T.bitwise_xor(offset, T.shift_left(
        T.bitwise_and(T.shift_right(offset, 7), span // 16 - 1), 4))


def split_tiles(tiles: int, split_tail: bool, sms: int) -> int:
    """How many of the tiles are split in K: all, or with split_tail those of the last, partial
    wave (the rest are multiplied whole, first)."""
    return tiles % sms if split_tail else tiles


def partial_bytes(tiles: int, split_k: int, block_m: int, block_n: int) -> int:
    """Bytes of split K's workspace: one float32 partial tile per (tile, K slice)."""
    return tiles * split_k * block_m * block_n * 4


def _split_k_helpers(tag: str, float4s: int, tiles: int) -> dict:
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


def _arrival_word(split_k: int):
    """Split K's shared word `arrived` (how many slices of the tile arrived before this CTA's),
    allocated only where K is split: called inside the kernel's script."""
    if split_k == 1:
        return None
    return IRBuilder.name("arrived", T.alloc_buffer((1,), "uint32", scope="shared"))


# -- the pieces of the kernel ------------------------------------------------------------------
def _descriptor(address, leading_bytes: int, stride_bytes: int):
    """wgmma's shared-memory matrix descriptor (PTX ISA 9.7.15.5.1) of a 128-byte-swizzled
    operand at 32-bit shared `address`: address >> 4 in bits 0-13, the leading and stride byte
    offsets >> 4 in bits 16-29 and 32-45, swizzle mode 1 (128 bytes) in bits 62-63. v7's
    encoding."""
    fields = (leading_bytes >> 4) << 16 | (stride_bytes >> 4) << 32 | 1 << 62
    start = T.bitwise_and(T.shift_right(address, T.uint32(4)), T.uint32(0x3FFF))
    return T.bitwise_or(T.Cast("uint64", start), T.uint64(fields))


def _tensor_map(rows: int, cols: int, box_rows: int, box_cols: int, element_bytes: int) -> list:
    """runtime.cuTensorMapEncodeTiled's arguments after the pointer for a row-major
    [rows, cols] tensor in boxes of box_rows x box_cols (cols innermost), swizzled over the
    box's row bytes (128, 64 or 32): global dims, row stride in bytes, box dims, element
    strides, interleave none, swizzle, L2 promotion, out-of-bounds fill none (zeros)."""
    return [cols, rows, cols * element_bytes, box_cols, box_rows, 1, 1,
            0, SWIZZLE[box_cols * element_bytes], L2_PROMOTION_256B, 0]


def _tile_origin(tile, tiles_m: int, tiles_n: int, group_m: int, block_m: int, block_n: int):
    """(first row, first column) of output tile number `tile` in the grouped raster: tiles go
    down group_m rows of tiles, then across, group by group (Triton's order), so that the CTAs
    working at one time share tiles of A and B in L2."""
    group = tile // (group_m * tiles_n)
    first_m = group * group_m
    rows = T.min(tiles_m - first_m, group_m)
    within = tile % (group_m * tiles_n)
    return (first_m + within % rows) * block_m, within // rows * block_n


def _consumer_tile(block_m: int, block_n: int, pingpong: bool = False) -> tuple[int, int, int, int]:
    """(rows, columns) of the block tile that each consumer warpgroup multiplies, and (rows,
    columns) from one consumer's part to the next's: the whole tile for each with pingpong
    (the consumers take turns at whole tiles); else halves of block_m when it holds two
    wgmma heights (64 rows each), or (block_m 64) halves of block_n."""
    if pingpong:
        return block_m, block_n, 0, 0
    if block_m >= 2 * WARPGROUP * 16:
        return block_m // 2, block_n, block_m // 2, 0
    return block_m, block_n // 2, 0, block_n // 2


# The columns a consumer's share of block_n comes in, by layout, and why
BLOCK_N_STEP = {"nn": (64, "B in 64-column boxes"), "nt": (16, "C stored 16 at a time")}


def consumer_accumulators(block_m: int, block_n: int, pingpong: bool = False) -> int:
    """The float32 accumulators each consumer thread keeps for a block_m x block_n tile: half
    its columns per 64 rows (one m64 wgmma's fragment)."""
    wg_m, wg_n, _, _ = _consumer_tile(block_m, block_n, pingpong)
    return wg_m // 64 * wg_n // 2


def widest_fitting(block_m: int, layout: str, pingpong: bool, widths) -> int | None:
    """The widest of `widths` that is a whole number of the layout's BLOCK_N_STEP and whose
    block_m-row tile fits each consumer's MOST_ACCUMULATORS (None where none is)."""
    step = BLOCK_N_STEP[layout][0]
    return max((n for n in widths if n % step == 0
                and consumer_accumulators(block_m, n, pingpong) <= MOST_ACCUMULATORS),
               default=None)


def warp_specialized_gemm(M: int, N: int, K: int, dtype: str, layout: str, out_dtype: str,
                          block_m: int, block_n: int, stages: int, group_m: int, split_k: int,
                          split_tail: bool, tma_store: bool, cluster_m: int, cluster_n: int,
                          pingpong: bool, sms: int, most_m: int | None = None):
    """C[M, N] = A[M, K] @ B (nn: B is K x N) or A @ B^T (nt: B is N x K), float32
    accumulation (fp8: times A_scale[0] * B_scale[0], its parameters after B), as a persistent
    warp-specialized TIRx kernel (CUTLASS's sm90 "cooperative" kernel): min(sms, units) CTAs of
    384 threads walk the units of work (a block tile and one of its `split_k` slices of K) in
    the grouped raster of the tiles.

    Warpgroup 0 is the producer: it gives registers back (setmaxnreg.dec) and one thread loads
    every K block of every unit of the CTA into the ring of `stages` stages with TMA, after
    waiting for the consumers to empty the stage (`empty` mbarrier). Warpgroups 1 and 2 are the
    consumers (setmaxnreg.inc): per K block each waits for the stage's bytes (`full` mbarrier,
    which TMA completes), multiplies its part of the tile with wgmma, and frees the stage of the
    K block before (whose wgmmas wait_group 1 has seen finish). The ring's position runs on
    from unit to unit, so the producer loads the next unit while the consumers store this one:
    straight from their accumulators, guarded at C's edges, or with tma_store through two
    shared boxes per consumer that TMA stores (clipped at C's edges) while the consumers go on
    to the next unit.

    Split K (split_k > 1): each slice's consumers put their partial tile in the workspace
    (`_split_k_helpers`) and count themselves in at the tile's arrival counter; the slice that
    arrives last adds the others' partials to its own and stores C. With split_tail, only the
    tiles of the last, partial wave are split (the units after the `whole` tiles): the SMs
    that wave would leave idle take slices of its tiles.

    Clusters (cluster_m or cluster_n = 2): a unit is a cluster's pair of tiles, side by side
    along M or N; the pair shares B's or A's loads by multicast (TMA_LOAD_MULTICAST), and a
    stage is free once both CTAs' consumers have freed it (FREE_STAGE).

    Ping-pong (pingpong, CUTLASS's sm90 "ping-pong" kernel; whole tiles: no split K): each
    consumer multiplies the whole block tile of every other unit of the CTA, consumer 0 the
    even ones, and its ring position skips the other's K blocks; a stage is then freed by one
    consumer (in each CTA of a cluster). The two take turns at the tensor cores
    (TURN_BARRIER: a consumer starts a unit's K loop once the other has issued the last
    wgmmas of the unit before), so each one's epilogue runs under the other's K loop. The
    turns also keep a consumer from waiting on a `full` barrier more than one phase ahead of
    its loads, which its parity could not tell apart.

    M may be a symbolic size (a tirx.Var, bound from A's shape at each call): the grid, the
    units and the tile walk are then computed from it on the host and in the kernel, and
    `most_m` (the most rows a call may bring) sizes split K's workspace; with split_tail, the
    tiles of the last wave are counted at the call, and the workspace holds at most a wave's."""
    element_bytes = ELEMENT_BYTES[dtype]
    block_k = ROW_BYTES // element_bytes
    nt = layout == "nt"
    wg_m, wg_n, step_m, step_n = _consumer_tile(block_m, block_n, pingpong)
    m_wgmmas = wg_m // 64  # m64 wgmmas of one consumer per k step
    k_step = 32 // element_bytes  # wgmma's K: k16 (16-bit), k32 (fp8)
    wgmma = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{wg_n}k{k_step}.f32."
                  f"{PTX_TYPE[dtype]}.{PTX_TYPE[dtype]}"]
    transpose = () if dtype == FP8 else (0, 0 if nt else 1)  # fp8 wgmma has no transpose operands
    per_wgmma = wg_n // 2  # accumulators of one m64 wgmma per thread
    accumulators = m_wgmmas * per_wgmma
    cluster = cluster_m * cluster_n  # CTAs of a cluster, whose tiles are one tile of the schedule
    every_cta = T.uint16((1 << cluster) - 1)  # a multicast's CTA mask: the whole cluster
    tiles_m, tiles_n = -(-M // (block_m * cluster_m)), -(-N // (block_n * cluster_n))
    k_blocks = k_block_count(K, element_bytes)
    tiles = tiles_m * tiles_n
    # tiles multiplied whole, first (split_tail: those before the last, partial wave)
    whole = tiles - split_tiles(tiles, split_tail, sms) if split_tail else 0
    turns = CONSUMERS if pingpong else 1  # consumers that take a CTA's units in turn
    if split_tail and isinstance(whole, int) and whole == tiles:
        whole, split_k = 0, 1  # no partial last wave: nothing to split
    splits_every_tile = isinstance(whole, int) and whole == 0  # (symbolic M: known at the call)
    units = whole + (tiles - whole) * split_k
    clusters = min(sms // cluster, units) if isinstance(units, int) else T.min(sms // cluster,
                                                                                units)
    grid = clusters * cluster
    units_per_cta = -(-units // clusters)
    a_bytes, b_bytes = block_m * ROW_BYTES, block_n * ROW_BYTES
    stage_bytes = a_bytes + b_bytes
    ring_bytes = arena_bytes(block_m, block_n, stages, tma_store)
    out_bytes = DTYPE_BYTES[out_dtype]
    span = box_bytes(block_m, block_n, out_dtype)  # tma_store: a box row's bytes, and columns
    box_cols = span // out_bytes
    first_box = stages * stage_bytes  # from the ring's start: the boxes after the stages
    tma_dtype = "uint8" if dtype == FP8 else dtype
    a_rows = block_m // cluster_n  # the rows of A's box that each CTA of a cluster loads
    b_rows = block_n // cluster_m  # and of B's (nt)
    a_map = _tensor_map(M, K, a_rows, block_k, element_bytes)
    b_map = _tensor_map(N, K, b_rows, block_k, element_bytes) if nt \
        else _tensor_map(K, N, block_k, 64, element_bytes)
    b_leading = 16 if nt else block_k * ROW_BYTES  # nn: bytes between 64-column boxes
    b_shape = (N, K) if nt else (K, N)
    c_map = _tensor_map(M, N, BOX_ROWS, box_cols, out_bytes)
    quads = accumulators // 4  # float4s of one consumer thread's partial tile
    # split K's workspace, for the most tiles split: those of M (symbolic M: of most_m rows, or
    # with split_tail those of a last wave, fewer than the SMs)
    if isinstance(M, int):
        most_tiles, tag = tiles - whole, f"{M}x{N}x{K}_{block_m}x{block_n}x{split_k}_{whole}"
    else:
        most_tiles = -(-most_m // (block_m * cluster_m)) * tiles_n
        most_tiles = min(most_tiles, sms - 1) if split_tail else most_tiles
        tag = f"{most_m}x{N}x{K}_{block_m}x{block_n}x{split_k}_any"
    helpers = _split_k_helpers(tag, most_tiles * split_k * quads * CONSUMER_THREADS, most_tiles)

    def consumer_rows(consumer):
        """The first row of the tile that the consumer multiplies."""
        return consumer * step_m

    def consumer_cols(consumer):
        """The first column of the tile that the consumer multiplies."""
        return consumer * step_n

    def first_unit(consumer):
        """The consumer's first unit of the CTA (j): with pingpong, consumer 1 takes the odd
        ones."""
        return consumer if pingpong else 0

    def frees(thread):
        """Whether a consumer thread frees a stage: its warpgroup's thread r, in the CTA of rank
        r (FREE_STAGE's predicate, so the K loop does not branch around wgmma)."""
        return thread % (WARPGROUP * 32) < cluster

    def leads(thread):
        """Whether a consumer thread is its warpgroup's first, which sends its boxes of C."""
        return thread % (WARPGROUP * 32) == 0

    def a_offset(consumer, mi, ks):
        """Bytes from a stage's start to consumer's A rows of wgmma mi at k step ks."""
        return (consumer_rows(consumer) + mi * 64) * ROW_BYTES + ks * k_step * element_bytes

    def b_offset(consumer, ks):
        """Bytes from a stage's start to consumer's B columns at k step ks."""
        cols = consumer_cols(consumer)
        if nt:
            return a_bytes + cols * ROW_BYTES + ks * k_step * element_bytes
        return a_bytes + cols // 64 * block_k * ROW_BYTES + ks * k_step * ROW_BYTES

    def origin(tile, rank):
        """(first row, first column) of the CTA's tile: CTA `rank` of its cluster's tiles."""
        m0, n0 = _tile_origin(tile, tiles_m, tiles_n, group_m, block_m * cluster_m,
                              block_n * cluster_n)
        return (m0 + (rank * block_m if cluster_m > 1 else 0),
                n0 + (rank * block_n if cluster_n > 1 else 0))

    def unit_origin(tile, rank):
        """origin(tile, rank) where a unit uses it: bound once per unit where M is symbolic (its
        tile walk divides by sizes known at the call), inlined where M is a number (the walk is
        then shifts and masks that fold away)."""
        if isinstance(M, int):
            return origin(tile, rank)
        return tuple(IRBuilder.name(name, T.bind(value))
                     for name, value in zip(("m0", "n0"), origin(tile, rank)))

    def part(rank, shares):
        """Which part of a box shared by `shares` CTAs (1: not shared) this CTA loads."""
        return rank if shares > 1 else 0

    def tma_load(shares, dst, tensor_map, c0, c1, barrier):
        """A TMA load into this CTA's stage, or, where `shares` CTAs of the cluster share the box
        (more than 1), a multicast into the stages of all of them."""
        if shares > 1:
            return cuda_call(TMA_LOAD_MULTICAST, dst, tensor_map, c0, c1, barrier, every_cta)
        return TMA_LOAD(dst, tensor_map, c0, c1, barrier)

    def cluster_rank():
        """The CTA's rank in its cluster (a cluster launch where it has more than one)."""
        return T.cta_id_in_cluster([cluster]) if cluster > 1 else 0

    def unit_of(cta, j):
        """The CTA's j-th unit: its cluster's (a cluster's CTAs are `cluster` in a row)."""
        return (cta // cluster if cluster > 1 else cta) + j * clusters

    def tile_of(unit):
        """The output tile of a unit: the first `whole` units are whole tiles, then each tile
        comes in split_k slices."""
        if splits_every_tile:
            return unit // split_k
        return T.Select(unit < whole, unit, whole + (unit - whole) // split_k)

    def is_split(unit):
        """Whether the unit is a slice of its tile (python True where every unit is)."""
        return True if splits_every_tile else unit >= whole

    def k_range(unit):
        """(first K block, K blocks) of the unit: a slice's K blocks dealt evenly."""
        piece = (unit - whole) % split_k
        first = piece * k_blocks // split_k
        count = (piece + 1) * k_blocks // split_k - first
        if splits_every_tile:
            return first, count
        return (T.Select(unit < whole, 0, first),
                T.Select(unit < whole, k_blocks, count))

    def stores_c(unit, arrived):
        """Whether this CTA stores the unit's tile: a whole tile's, or the last slice's."""
        last = arrived[0] == split_k - 1
        return last if splits_every_tile else T.Or(unit < whole, last)

    def partial(unit, quad, thread):
        """Index of a consumer thread's float4 `quad` of the (split) unit's partial tile: the
        threads' float4s side by side, so that a warp's stores are contiguous."""
        return ((unit - whole) * quads + quad) * CONSUMER_THREADS + thread

    @T.prim_func
    def main(A_handle: T.handle, B_handle: T.handle, A_scale_handle: T.handle,
             B_scale_handle: T.handle, C_handle: T.handle):
        T.func_attr({TIRX_KERNEL: True})
        A = T.match_buffer(A_handle, (M, K), dtype, align=16)
        B = T.match_buffer(B_handle, b_shape, dtype, align=16)
        A_scale = T.match_buffer(A_scale_handle, (1,), "float32")
        B_scale = T.match_buffer(B_scale_handle, (1,), "float32")
        C = T.match_buffer(C_handle, (M, N), out_dtype, align=16)
        A_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, tma_dtype, 2, A.data, *a_map)
        B_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, tma_dtype, 2, B.data, *b_map)
        C_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)  # encoded for tma_store
        if tma_store:
            T.call_packed("runtime.cuTensorMapEncodeTiled", C_map, out_dtype, 2, C.data, *c_map)

        T.device_entry()
        cta = T.cta_id([grid])
        rank = T.meta_var(cluster_rank())
        tx = T.thread_id([THREADS])
        arena = T.alloc_buffer((ring_bytes,), "uint8", scope="shared.dyn", align=ATOM)
        full = T.alloc_buffer((stages,), "uint64", scope="shared", align=8)
        empty = T.alloc_buffer((stages,), "uint64", scope="shared", align=8)
        arrived = T.meta_var(_arrival_word(split_k))
        ring: T.let[T.uint32] = T.bitwise_and(
            T.cuda.cvta_generic_to_shared(arena.data) + T.uint32(ATOM - 1),
            T.uint32(~(ATOM - 1) & 0xFFFFFFFF))
        if tx == 0:
            for s in T.unroll(stages):
                T.ptx.mbarrier.init.shared.b64(full.ptr_to([s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(empty.ptr_to([s]),
                                               T.uint32(CONSUMERS // turns * cluster))
            T.ptx.fence.mbarrier_init.release.cluster()
            T.ptx.fence.proxy.async_.shared__cta()
            T.ptx.prefetch.tensormap(T.address_of(A_map))
            T.ptx.prefetch.tensormap(T.address_of(B_map))
            if tma_store:
                T.ptx.prefetch.tensormap(T.address_of(C_map))
        if cluster > 1:  # the barriers of both CTAs initialised before either signals them
            cuda_call(CLUSTER_SYNC)
        else:
            T.cuda.cta_sync()

        if tx < WARPGROUP * 32:
            # producer: one thread loads every K block of the CTA's units
            T.ptx["setmaxnreg.dec.sync.aligned.u32"](PRODUCER_REGISTERS)
            if tx == 0:
                loaded = T.alloc_local((1,), "int32")  # K blocks loaded: the ring's position
                loaded[0] = 0
                for j in range(units_per_cta):
                    if unit_of(cta, j) < units:
                        tile: T.let[T.int32] = tile_of(unit_of(cta, j))
                        m0, n0 = T.meta_var(unit_origin(tile, rank))
                        first, count = T.meta_var(k_range(unit_of(cta, j)))
                        for kt in range(count):
                            s: T.let[T.int32] = (loaded[0] + kt) % stages
                            # the stage's previous K block freed (on a fresh barrier, parity 1
                            # counts as the phase before the first: it returns at once)
                            T.cuda.mbarrier_wait(empty.ptr_to([s]),
                                                 ((loaded[0] + kt) // stages + 1) % 2)
                            stage: T.let[T.uint32] = ring + T.Cast("uint32", s * stage_bytes)
                            T.ptx.mbarrier.arrive.expect_tx.shared.b64(full.ptr_to([s]),
                                                                     T.uint32(stage_bytes))
                            k0: T.let[T.int32] = (first + kt) * block_k
                            # A's rows (this CTA's part of them where the cluster shares A)
                            a_part = T.meta_var(part(rank, cluster_n))
                            tma_load(cluster_n,
                                     stage + T.Cast("uint32", a_part * (a_rows * ROW_BYTES)),
                                     T.address_of(A_map), k0, m0 + a_part * a_rows,
                                     full.ptr_to([s]))
                            b_part = T.meta_var(part(rank, cluster_m))
                            if nt:  # B's rows (or this CTA's part), as A's
                                tma_load(cluster_m, stage + T.Cast(
                                             "uint32", a_bytes + b_part * (b_rows * ROW_BYTES)),
                                         T.address_of(B_map), k0, n0 + b_part * b_rows,
                                         full.ptr_to([s]))
                            else:  # B's 64-column boxes (or every other one, from b_part on)
                                for box in T.unroll(block_n // 64 // cluster_m):
                                    tma_load(cluster_m, stage + T.Cast(
                                                 "uint32", a_bytes + (box * cluster_m + b_part)
                                                 * (block_k * ROW_BYTES)),
                                             T.address_of(B_map),
                                             n0 + (box * cluster_m + b_part) * 64, k0,
                                             full.ptr_to([s]))
                        loaded[0] = loaded[0] + count
                if cluster > 1:  # every stage freed by both CTAs' consumers before this ends
                    for i in range(stages):
                        T.cuda.mbarrier_wait(empty.ptr_to([(loaded[0] + i) % stages]),
                                             ((loaded[0] + i) // stages + 1) % 2)
        else:
            # consumers: warpgroups 1 and 2, each wg_m x wg_n of every tile (pingpong: all of
            # every other tile)
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](CONSUMER_REGISTERS)
            consumer: T.let[T.int32] = tx // (WARPGROUP * 32) - 1
            acc = T.alloc_local((accumulators,), "float32")
            used = T.alloc_local((1,), "int32")  # the ring's position: K blocks passed
            used[0] = first_unit(consumer) * k_blocks  # (pingpong: no split K, units alike)
            sent = T.alloc_local((1,), "int32")  # boxes of C sent (tma_store): whose turn
            sent[0] = 0
            thread: T.let[T.int32] = tx - WARPGROUP * 32
            warp: T.let[T.int32] = tx % (WARPGROUP * 32) // 32
            lane: T.let[T.int32] = tx % 32
            for turn in range(-(-units_per_cta // turns)):
                j: T.let[T.int32] = turn * turns + first_unit(consumer)
                if unit_of(cta, j) < units:
                    unit: T.let[T.int32] = unit_of(cta, j)
                    tile: T.let[T.int32] = tile_of(unit)
                    m0, n0 = T.meta_var(unit_origin(tile, rank))
                    _, count = T.meta_var(k_range(unit))
                    for i in T.unroll(accumulators):
                        acc[i] = T.float32(0)
                    if pingpong:
                        if j > 0:  # the other consumer has issued the unit before's wgmmas
                            T.ptx.bar.sync(T.uint32(TURN_BARRIER + consumer),
                                           T.uint32(CONSUMER_THREADS))
                    for kt in range(count):
                        s: T.let[T.int32] = (used[0] + kt) % stages
                        T.cuda.mbarrier_wait(full.ptr_to([s]), (used[0] + kt) // stages % 2)
                        stage: T.let[T.uint32] = ring + T.Cast("uint32", s * stage_bytes)
                        for i in T.unroll(accumulators):
                            cuda_call(FENCE_OPERAND, acc[i])
                        T.ptx.wgmma.fence.sync.aligned()
                        for ks in T.unroll(block_k // k_step):
                            for mi in T.unroll(m_wgmmas):
                                wgmma(*[acc[mi * per_wgmma + r] for r in range(per_wgmma)],
                                      _descriptor(stage + T.Cast("uint32", a_offset(consumer, mi, ks)),
                                                  16, ATOM),
                                      _descriptor(stage + T.Cast("uint32", b_offset(consumer, ks)),
                                                  b_leading, ATOM),
                                      T.bool(True), 1, 1, *transpose)
                        T.ptx.wgmma.commit_group.sync.aligned()
                        T.ptx.wgmma.wait_group.sync.aligned(1)
                        for i in T.unroll(accumulators):
                            cuda_call(FENCE_OPERAND, acc[i])
                        if kt > 0:  # the K block before's wgmmas are done: free its stage
                            cuda_call(FREE_STAGE,
                                      empty.ptr_to([(used[0] + kt + stages - 1) % stages]),
                                      thread % (WARPGROUP * 32), frees(thread))
                    if pingpong:  # the next unit's K loop may start: the other consumer's
                        if unit_of(cta, j + 1) < units:
                            T.ptx.bar.arrive(T.uint32(TURN_BARRIER + 1 - consumer),
                                             T.uint32(CONSUMER_THREADS))
                    T.ptx.wgmma.wait_group.sync.aligned(0)
                    for i in T.unroll(accumulators):
                        cuda_call(SETTLE, acc[i])
                    cuda_call(FREE_STAGE, empty.ptr_to([(used[0] + count - 1) % stages]),
                              thread % (WARPGROUP * 32), frees(thread))
                    used[0] = used[0] + count * turns  # pingpong: past the other's unit too
                    # thread t holds C[16 * warp + t % 32 / 4 + 8 h, 8 n8 + 2 (t % 4) + e]
                    # of each m64 wgmma's rows (wgmma's fragment, v7's _register_of)
                    first_row: T.let[T.int32] = m0 + consumer_rows(consumer) + warp * 16 + lane // 4
                    first_col: T.let[T.int32] = n0 + consumer_cols(consumer) + lane % 4 * 2
                    if split_k > 1:
                        if is_split(unit):
                            # this slice's partial tile out (rows past C's edge left out), then
                            # counted in at the tile's counter; the last slice adds the others'
                            for mi in T.unroll(m_wgmmas):
                                if first_row + mi * 64 < M:
                                    for n8 in T.unroll(wg_n // 8):
                                        cuda_call(helpers["stash"],
                                                  partial(unit, mi * wg_n // 8 + n8, thread),
                                                  *[acc[mi * per_wgmma + n8 * 4 + r] for r in range(4)])
                            T.cuda.thread_fence()  # the partials visible on the GPU before the count
                            T.ptx.bar.sync(T.uint32(SPLIT_BARRIER), T.uint32(CONSUMER_THREADS))
                            if thread == 0:
                                arrived[0] = cuda_call(helpers["arrive"], tile - whole,
                                                       return_type="uint32")
                            T.ptx.bar.sync(T.uint32(SPLIT_BARRIER), T.uint32(CONSUMER_THREADS))
                    if split_k == 1 or stores_c(unit, arrived):
                        if split_k > 1:
                            if is_split(unit):
                                T.cuda.thread_fence()
                                piece: T.let[T.int32] = (unit - whole) % split_k
                                for other in range(split_k):
                                    if other != piece:
                                        for mi in T.unroll(m_wgmmas):
                                            if first_row + mi * 64 < M:
                                                for n8 in T.unroll(wg_n // 8):
                                                    cuda_call(
                                                        helpers["gather"],
                                                        partial(unit - piece + other,
                                                                mi * wg_n // 8 + n8, thread),
                                                        *[acc[mi * per_wgmma + n8 * 4 + r] for r in range(4)])
                                if thread == 0:
                                    cuda_call(helpers["rearm"], tile - whole)
                        if dtype == FP8:
                            scale: T.let[T.float32] = A_scale[0] * B_scale[0]
                            for i in T.unroll(accumulators):
                                acc[i] = acc[i] * scale
                        if tma_store:
                            # box by box: wait until the box whose turn it is has gone out,
                            # fill it, and send it (the warpgroup's first thread)
                            for mi in T.unroll(m_wgmmas):
                                for box in T.unroll(wg_n // box_cols):
                                    slot: T.let[T.uint32] = ring + T.Cast(
                                        "uint32", first_box + (consumer * 2 + sent[0] % 2)
                                        * BOX_ROWS * ROW_BYTES)
                                    if leads(thread):
                                        T.ptx["cp.async.bulk.wait_group.read"](1)
                                    T.ptx.bar.sync(T.uint32(BOX_BARRIER + consumer),
                                                   T.uint32(WARPGROUP * 32))
                                    for n8 in T.unroll(box_cols // 8):
                                        for h in T.unroll(2):
                                            offset: T.let[T.int32] = \
                                                (warp * 16 + lane // 4 + h * 8) * span \
                                                + (n8 * 8 + lane % 4 * 2) * out_bytes
                                            first: T.let[T.int32] = mi * per_wgmma \
                                                + (box * box_cols // 8 + n8) * 4 + h * 2
                                            cuda_call(stage_pair(out_dtype),
                                                      slot + T.Cast("uint32", _swizzled(offset, span)),
                                                      acc[first], acc[first + 1])
                                    T.ptx.fence.proxy.async_.shared__cta()
                                    T.ptx.bar.sync(T.uint32(BOX_BARRIER + consumer),
                                                   T.uint32(WARPGROUP * 32))
                                    if leads(thread):
                                        TMA_STORE(T.address_of(C_map),
                                                  n0 + consumer_cols(consumer) + box * box_cols,
                                                  m0 + consumer_rows(consumer) + mi * 64,
                                                  slot)
                                        T.ptx["cp.async.bulk.commit_group"]()
                                    sent[0] = sent[0] + 1
                        elif out_dtype != "float32" and N % 4 == 0:
                            for mi in T.unroll(m_wgmmas):
                                for n16 in T.unroll(wg_n // 16):
                                    for h in T.unroll(2):
                                        row: T.let[T.int32] = first_row + mi * 64 + h * 8
                                        start: T.let[T.int32] = first_col + n16 * 16 + lane % 2 * 6
                                        low: T.let[T.int32] = mi * per_wgmma + n16 * 8 + h * 2
                                        cuda_call(quad_store(out_dtype), T.address_of(C[row, start]),
                                                  lane % 2, acc[low], acc[low + 1], acc[low + 4],
                                                  acc[low + 5], T.bool(row < M) and T.bool(start < N))
                        else:
                            for mi in T.unroll(m_wgmmas):
                                for n8 in T.unroll(wg_n // 8):
                                    for h in T.unroll(2):
                                        row: T.let[T.int32] = first_row + mi * 64 + h * 8
                                        col: T.let[T.int32] = first_col + n8 * 8
                                        first: T.let[T.int32] = mi * per_wgmma + n8 * 4 + h * 2
                                        if row < M:
                                            if out_dtype == "float32" and N % 2 == 0:
                                                if col < N:  # col is even: so is &C[row, col]
                                                    cuda_call(PAIR_STORE, T.address_of(C[row, col]),
                                                              acc[first], acc[first + 1])
                                            else:
                                                for e in T.unroll(2):
                                                    if col + e < N:
                                                        C[row, col + e] = T.Cast(out_dtype, acc[first + e])
            if tma_store:
                if leads(thread):  # the boxes read out before shared memory goes
                    T.ptx["cp.async.bulk.wait_group"](0)

    return main if dtype == FP8 else _without_params(main, FP8_SCALES)


def _without_params(func, names: tuple[str, ...]):
    """`func` without its buffer parameters `names` (which its body must not use): one script
    serves the workloads with and without fp8's scales."""
    return tirx.PrimFunc([p for p in func.params if p.name not in names], func.body,
                         func.ret_type, func.attrs)


# -- the rung ----------------------------------------------------------------------------------
def tma_refusal(wl: Workload) -> str | None:
    """Why v8 cannot take the workload whatever its knobs, in one line (None where it can):
    inputs other than 16-bit floats and fp8, or rows that TMA cannot load (not whole 16-byte
    multiples)."""
    if wl.dtype not in ELEMENT_BYTES:
        return f"v8 multiplies float16, bfloat16 or {FP8} on tensor cores, not {wl.dtype}"
    M, N, K = wl.shape
    element_bytes = ELEMENT_BYTES[wl.dtype]
    strides = [("A", "K", K)] + ([("B", "N", N)] if wl.layout == "nn" else [("B", "K", K)])
    for operand, axis, extent in strides:
        if extent * element_bytes % TMA_STRIDE_BYTES:
            return (f"v8 loads {operand} with TMA, which takes rows of whole 16-byte multiples: "
                    f"{axis}={extent} {wl.dtype} rows are {extent * element_bytes} bytes")
    return None


def c_rows_take_tma(wl: Workload) -> bool:
    """Whether TMA can store C (tma_store): its rows whole multiples of TMA_STRIDE_BYTES."""
    return wl.dims["N"] * DTYPE_BYTES[wl.out_dtype] % TMA_STRIDE_BYTES == 0


def _refuse_unless_tma_can_take(wl: Workload, block_m: int, block_n: int, stages: int,
                                split_k: int, split_tail: bool, tma_store: bool,
                                cluster_m: int, cluster_n: int, pingpong: bool) -> None:
    """Refuse what the template cannot take: `tma_refusal`'s workloads, and knobs outside its
    tile shapes, registers, shared memory, split K's workspace or TMA's rows of C."""
    refusal = tma_refusal(wl)
    if refusal:
        raise ScheduleNotApplicable(refusal)
    if block_m not in (64, 128, 256):
        raise ScheduleNotApplicable(f"v8 splits block_m among two consumer warpgroups in 64-row "
                                    f"wgmmas, or gives both 64 rows: block_m={block_m} is not "
                                    "64, 128 or 256")
    wg_n = _consumer_tile(block_m, block_n, pingpong)[1]
    columns, why = BLOCK_N_STEP[wl.layout]
    if block_n % columns or block_n > 256 or wg_n % columns:
        raise ScheduleNotApplicable(f"v8 gives each consumer's wgmma a multiple of {columns} "
                                    f"columns ({why}), at most 256: block_n={block_n} with "
                                    f"block_m={block_m} does not split so")
    accumulators = consumer_accumulators(block_m, block_n, pingpong)
    if accumulators > MOST_ACCUMULATORS:
        whole = " (pingpong: each consumer takes the whole tile)" if pingpong else ""
        widest = widest_fitting(block_m, wl.layout, pingpong, range(columns, 257, columns))
        raise ScheduleNotApplicable(f"v8's {block_m}x{block_n} tile gives each consumer thread "
                                    f"{accumulators} accumulators{whole}; at most "
                                    f"{MOST_ACCUMULATORS} fit (block_n={widest} does)")
    shared_bytes = arena_bytes(block_m, block_n, stages, tma_store)
    if stages < 2 or shared_bytes > HOPPER_SHARED_BYTES:
        boxes = " and the boxes of tma_store" if tma_store else ""
        raise ScheduleNotApplicable(f"v8 with {stages} stages of {block_m}x{block_n} tiles{boxes} "
                                    f"needs {shared_bytes} bytes of shared memory (at least 2 "
                                    f"stages, at most {HOPPER_SHARED_BYTES} bytes)")
    if tma_store and not c_rows_take_tma(wl):
        raise ScheduleNotApplicable(f"v8's tma_store stores C with TMA, which takes rows of whole "
                                    f"16-byte multiples: N={wl.dims['N']} {wl.out_dtype} rows are "
                                    f"{wl.dims['N'] * DTYPE_BYTES[wl.out_dtype]} bytes "
                                    "(tma_store=False stores them from registers)")
    K = wl.dims["K"]
    k_blocks = k_block_count(K, ELEMENT_BYTES[wl.dtype])
    if not 1 <= split_k <= k_blocks:
        raise ScheduleNotApplicable(f"v8 splits K={K} into 1 to {k_blocks} slices of whole "
                                    f"{ROW_BYTES}-byte K blocks, not split_k={split_k}")
    if {cluster_m, cluster_n} - {1, 2} or cluster_m * cluster_n > 2 or \
            (cluster_m * cluster_n > 1 and split_k > 1) or \
            (cluster_m > 1 and wl.layout == "nn" and block_n // 64 % cluster_m):
        raise ScheduleNotApplicable(f"v8's clusters are 2 CTAs whose whole tiles lie side by side "
                                    f"along N (cluster_n, sharing A) or M (cluster_m, sharing B in "
                                    f"halves; nn: 64-column boxes), or 1 CTA: not cluster_m="
                                    f"{cluster_m}, cluster_n={cluster_n} with split_k={split_k}, "
                                    f"block_n={block_n}")
    if pingpong and split_k > 1:
        raise ScheduleNotApplicable(f"v8's pingpong consumers take turns at whole tiles: not "
                                    f"with split_k={split_k}")
    if split_tail and split_k == 1:
        raise ScheduleNotApplicable("v8's split_tail splits the last wave's tiles into split_k "
                                    "slices: it needs split_k > 1")
    tiles = split_tiles(heuristics.tile_count(wl, block_m, block_n), split_tail,
                        heuristics.H100_SMS)
    workspace = partial_bytes(tiles, split_k, block_m, block_n) if split_k > 1 else 0
    if workspace > MOST_PARTIAL_BYTES:
        raise ScheduleNotApplicable(f"v8 with split_k={split_k} over {tiles} tiles of "
                                    f"{block_m}x{block_n} keeps {workspace >> 20} MB of partials; "
                                    f"at most {MOST_PARTIAL_BYTES >> 20} MB")


def v8_refusals(wl: Workload, group_m: int, **knobs) -> None:
    """What v8_kernel refuses, without building the kernel (group_m, the order of the tiles,
    takes any value)."""
    _refuse_unless_tma_can_take(wl, **knobs)


def v8_kernel(wl: Workload, block_m: int, block_n: int, stages: int, group_m: int,
              split_k: int, split_tail: bool, tma_store: bool, cluster_m: int, cluster_n: int,
              pingpong: bool):
    """The rung's PrimFunc: the template for the workload and knobs (refused as v8 refuses)."""
    _refuse_unless_tma_can_take(wl, block_m, block_n, stages, split_k, split_tail, tma_store,
                                cluster_m, cluster_n, pingpong)
    M, N, K = wl.shape
    return warp_specialized_gemm(M, N, K, wl.dtype, wl.layout, wl.out_dtype, block_m, block_n,
                                 stages, group_m, split_k, split_tail, tma_store, cluster_m,
                                 cluster_n, pingpong, heuristics.H100_SMS)


def any_m_partial_bytes(wl: Workload, block_m: int, block_n: int, split_k: int,
                       split_tail: bool) -> int:
    """Bytes of split K's workspace in v8 for any M up to wl's: the partials of every tile of
    wl's M, or with split_tail of a last wave's tiles (fewer than the SMs) whatever M is."""
    if split_k == 1:
        return 0
    tiles = heuristics.tile_count(wl, block_m, block_n)
    return partial_bytes(min(tiles, heuristics.H100_SMS - 1) if split_tail else tiles, split_k,
                         block_m, block_n)


def v8_kernel_any_m(wl: Workload, block_m: int, block_n: int, stages: int, group_m: int,
                    split_k: int, split_tail: bool, tma_store: bool, cluster_m: int,
                    cluster_n: int, pingpong: bool):
    """v8's kernel for every M up to wl's: M is a size given at each call (A's rows), and wl's
    M the most a call may bring where split_k > 1 without split_tail (it sizes split K's
    workspace; with split_tail any M fits). Refused as v8 refuses wl, and where the workspace
    for any M would pass MOST_PARTIAL_BYTES."""
    _refuse_unless_tma_can_take(wl, block_m, block_n, stages, split_k, split_tail, tma_store,
                                cluster_m, cluster_n, pingpong)
    workspace = any_m_partial_bytes(wl, block_m, block_n, split_k, split_tail)
    if workspace > MOST_PARTIAL_BYTES:
        raise ScheduleNotApplicable(f"v8 for any M with split_k={split_k} of {block_m}x{block_n} "
                                    f"tiles keeps {workspace >> 20} MB of partials; at most "
                                    f"{MOST_PARTIAL_BYTES >> 20} MB")
    _, N, K = wl.shape
    return warp_specialized_gemm(tirx.Var("M", "int32"), N, K, wl.dtype, wl.layout,
                                 wl.out_dtype, block_m, block_n, stages, group_m, split_k,
                                 split_tail, tma_store, cluster_m, cluster_n, pingpong,
                                 heuristics.H100_SMS, most_m=wl.dims["M"])


@schedule("gemm", "v8", space={"block_m": [64, 128, 256],
                               "block_n": [64, 128, 144, 160, 176, 192, 256],
                               "stages": [3, 4, 5, 6], "group_m": [1, 4, 8, 16],
                               "split_k": [1, 2, 3, 4, 6, 8], "split_tail": [False, True],
                               "tma_store": [False, True], "cluster_m": [1, 2], "cluster_n": [1, 2],
                               "pingpong": [False, True]},
          heuristic=heuristics.tma_tiles, compute=v8_kernel, refuse=v8_refusals)
def v8(sch: Schedule, wl: Workload, block_m: int = 128, block_n: int = 256, stages: int = 4,
       group_m: int = 8, split_k: int = 1, split_tail: bool = False,
       tma_store: bool = True, cluster_m: int = 1, cluster_n: int = 1,
       pingpong: bool = False) -> None:
    """Hopper's TMA and warp specialization: v7's wgmma on the same swizzled tiles, but the
    tiles come by TMA (cp.async.bulk.tensor) into a ring of `stages` shared stages, each with a
    `full` and an `empty` mbarrier, and the kernel is persistent: one CTA per SM walks the
    block tiles in groups of group_m rows of tiles. A producer warpgroup (setmaxnreg.dec) issues
    the loads from one thread; two consumer warpgroups (setmaxnreg.inc) multiply, and store C
    (float32, float16 or bfloat16) straight from their accumulators while the producer already
    loads the next tile. split_k > 1 deals each tile's K blocks to that many CTAs, which add
    their float32 partials through a workspace (the last to finish stores C), so that few tiles
    (decode batches, M <= 128) still fill the SMs; with split_tail only the tiles of the last,
    partial wave are split, so that the SMs it would leave idle share its work. tma_store:
    each consumer writes C into shared boxes of 64 rows, two in turn, that one of its threads
    sends by TMA (cp.async.bulk.tensor, global <- shared), so the global writes of a tile run
    on under the next tile's wgmmas; it needs C's rows in whole 16-byte multiples. cluster_m or
    cluster_n = 2: clusters of 2 CTAs on tiles side by side along M (sharing B) or N (sharing A),
    each loading half of the shared operand by a multicast TMA into both (whole tiles only: no
    split K). pingpong: each consumer multiplies whole tiles, every other one of the CTA's, the
    two taking turns at the tensor cores, so that one's epilogue runs under the other's wgmmas
    (a tile's accumulators must then fit one consumer: 128x128, 128x192, 64x256; no split K;
    on an H100 no faster than two consumers on one tile, reports/h100-v8.md). Ragged M, N, K:
    TMA zero-fills past the edges; rows must be whole 16-byte multiples (K, and N for B in nn).
    fp8 e4m3 inputs (nt) multiply in wgmma's e4m3 form, their per-tensor scales applied to the
    accumulators before C is stored. A TIRx kernel (schedules/hopper.py), sm_90a only.

    IR: a TIRx PrimFunc, not s_tir blocks: T.device_entry, T.cta_id / T.thread_id, shared.dyn
    arena with the ring rounded up to 1024 bytes, T.ptx mbarrier / cp.async.bulk.tensor /
    wgmma / setmaxnreg calls, tensor maps encoded by the host (runtime.cuTensorMapEncodeTiled)
    and passed as __grid_constant__ CUtensorMap."""
    require_sm("v8", 90, "TMA, mbarriers and wgmma (built for sm_90a)")  # the rest: v8_kernel
