"""The GEMV ladder (y = B x, B row-major N x K), for one matrix or L of them in one launch.

The rungs follow `../shared/seeds/gemv-tilelang-tutorial.txt` and the batched write-up
(`batched-gemv-nvfp4-writeup.txt`): one thread per row; K split across the threads of a block
with the partials combined through shared memory; 16-byte loads; a warp-shuffle all-reduce; and
several rows per warp so every slice of x that a thread loads serves them all. Batched GEMV
binds the batch to blockIdx.y, so all L products run in a single launch. A GEMM of a few rows
(`skinny`, in the GEMM ladder) is a GEMV of each of them at once.

Loop names: bx/by blocks, tn the row threads, tk the K threads, ko the serial K steps, ki the
K elements a thread handles per step, r the rows a thread accumulates at once.
"""

from __future__ import annotations

import math

from tvm.s_tir import Schedule
from tvm.script import tirx as T

from .common import (bind_threads, cooperative_fetch, cuda_call, require_grid_y,
                     software_pipeline, widest_vector, write_back_at)
from . import fp4, heuristics
from .errors import ScheduleNotApplicable
from .registry import schedule
from .workloads import DENSE_DTYPES, DTYPE_BYTES, FP8, X_VALUES, Workload

VECTOR_BYTES = 16  # one 128-bit load per thread


def vector_width(wl: Workload) -> int:
    """Elements of B in one 16-byte load: 4 floats, 8 halves, 32 nvfp4 codes."""
    if wl.is_nvfp4:
        return VECTOR_BYTES * fp4.PER_BYTE
    return VECTOR_BYTES // DTYPE_BYTES[wl.dtype]


def _place_x_values(sch: Schedule, wl: Workload, at=None) -> None:
    """nvfp4: decode the vector's values inside the multiply-add (at=None), or once per
    iteration of loop `at` into registers, for every row below it to use."""
    if not wl.is_nvfp4:
        return
    values = sch.get_sblock(X_VALUES)
    if at is None:
        sch.compute_inline(values)
        return
    sch.compute_at(values, at)
    sch.set_scope(values, 0, "local")


def _read_index(sch: Schedule, block, buffer: str) -> int:
    """Which of `block`'s reads is of `buffer` (the operand number cache_read takes)."""
    return [r.source.name for r in sch.get(block).reads].index(buffer)


def _bind_batch(sch: Schedule, wl: Workload, batch_loops: list) -> None:
    """Batched GEMV: every (matrix, vector) pair is a blockIdx.y of the same launch."""
    for loop in batch_loops:
        require_grid_y(wl.op, "L", wl.dims["L"])
        sch.bind(loop, "blockIdx.y")


def _gemv_loops(sch: Schedule, wl: Workload):
    block = sch.get_sblock(wl.reduction_block)
    *batch, n, k = sch.get_loops(block)
    if wl.op == "gemv" and batch:  # the row-aligned definition's unit batch loop
        n = sch.fuse(*batch, n)
        batch = []
    return block, batch, n, k


def _thread_per_row(sch: Schedule, wl: Workload, rows_per_block: int, one_launch: bool) -> None:
    """One thread per output row, walking all of K serially into a register accumulator; the
    batch on blockIdx.y (one_launch), or a host loop launching the kernel once per batch."""
    _place_x_values(sch, wl)
    block, batch, n, k = _gemv_loops(sch, wl)
    # Step 1. Rows: blocks of rows_per_block threads, one row each.
    bx, tn = sch.split(n, [None, rows_per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tn, "threadIdx.x")
    if one_launch:
        _bind_batch(sch, wl, batch)
    # Step 2. Accumulate in a register, write y once.
    write_back_at(sch, wl, tn)
    sch.decompose_reduction(block, k)


@schedule("batched_gemv", "launches")
def launches(sch: Schedule, wl: Workload, rows_per_block: int = 128) -> None:
    """One launch per (matrix, vector) pair, the batched seed's V0 (its loop of one
    `_scaled_mm` per batch): naive's kernel for one pair, launched L times by the host.

    IR: the batch loop stays outside the kernel, serial: the host function loops over L and the
    kernel takes the batch as an argument (an `int` in its CUDA signature)."""
    _thread_per_row(sch, wl, rows_per_block, one_launch=False)


@schedule("gemv", "naive")
@schedule("batched_gemv", "naive")
def naive(sch: Schedule, wl: Workload, rows_per_block: int = 128) -> None:
    """One thread per output row, walking all of K serially into a register accumulator; all
    batches in one launch (the batched seed's V1).

    IR: blockIdx.x = N/rows_per_block, blockIdx.y = L, threadIdx.x = rows_per_block, one
    serial K loop."""
    _thread_per_row(sch, wl, rows_per_block, one_launch=True)


def _k_slices(sch: Schedule, k, reduce_threads: int, tile_k: int, width: int) -> list:
    """Split K into serial steps of reduce_threads threads times tile_k elements, each thread's
    tile_k read `width` elements at a time; returns the loops [steps, (pieces,) tk, ki].
    A thread takes its tile_k consecutively when it reads them at once (one vector, or splitk's
    scalar loop); in several vectors, the K threads' vectors lie side by side, so that each
    warp load reads consecutive addresses: K is split [steps, tile_k // width, reduce_threads,
    width]."""
    if width == tile_k:
        return sch.split(k, [None, reduce_threads, tile_k])
    return sch.split(k, [None, tile_k // width, reduce_threads, width])


def _k_across_threads(
    sch: Schedule,
    wl: Workload,
    *,
    rows_per_block: int,
    reduce_threads: int,
    tile_k: int | None,
    vector_loads: bool,
    warp_reduce: bool,
    rows_per_thread: int = 1,
    row_aligned: bool = False,
    shared_stages: int = 0,
) -> None:
    """K split across the threads of a block (TileLang's "split-K" GEMV, whose names the rungs
    keep), the schedule that the rungs after naive share; each rung turns one more knob on.

    Every thread owns `rows_per_thread` rows and, for each of them, a register partial sum
    over its slice of K: `tile_k` elements per step at stride reduce_threads*tile_k. A GEMM of
    few rows (skinny, nt) is a GEMV of each row of A: every thread keeps a partial sum per row
    of A too, and a step's vectors of A's rows serve all of its rows of B.
    A cross-thread reduction (tvm_thread_allreduce) then combines the `reduce_threads` partials.
    With `warp_reduce` the K threads are threadIdx.x, consecutive lanes of one warp, and TVM
    lowers the reduction to warp shuffles; otherwise they are threadIdx.y (rows on threadIdx.x,
    the seed's layout) and TVM reduces through a shared-memory tree with barriers.
    With `vector_loads` each step's B and x slices come in as vectors: 16-byte ones when rows of
    K are whole 16-byte vectors, otherwise the widest ones they are made of (down to single
    elements on odd K), so that every vector starts on a boundary of its own width. tile_k stays
    in elements: a thread has as many bytes in flight per step, in more, narrower loads.
    With `row_aligned` (the schedule of `row_aligned_gemv` on a ragged K), B and x come in
    16-byte vectors, through rowalign's CUDA helpers.
    With `shared_stages` (nvfp4), each step's codes and scales of the block's rows are staged in
    shared memory by all its threads, and x decoded there once for the block
    (`_stage_in_shared`).
    tile_k=None means one 16-byte vector of the input dtype (8 halves, 4 floats)."""
    if not vector_loads:
        _place_x_values(sch, wl)
    vector = vector_width(wl)
    tile_k = tile_k or vector
    if vector_loads and tile_k % vector:
        raise ScheduleNotApplicable(f"tile_k={tile_k} is not whole 16-byte vectors of {wl.dtype}")
    width = vector if row_aligned else widest_vector(vector, wl.dims["K"]) if vector_loads \
        else tile_k
    row_tag, k_tag = ("threadIdx.y", "threadIdx.x") if warp_reduce else ("threadIdx.x", "threadIdx.y")
    block, batch, n, k = _gemv_loops(sch, wl)
    a_rows = batch if wl.op == "gemm" else []  # skinny: A's rows, kept by every thread
    batch = [] if a_rows else batch
    if a_rows:
        sch.reorder(n, *a_rows)
    # Step 1. Rows: blocks of rows_per_block row threads, each with rows_per_thread rows.
    sch.split(n, [None, rows_per_block, rows_per_thread])
    # Step 2. K: serial steps of reduce_threads threads times tile_k elements, in vectors of
    # `width`; a ragged last step is predicated.
    tk = _k_slices(sch, k, reduce_threads, tile_k, width)[-2]
    # Step 3. rfactor: each K thread keeps its own partial sums in registers.
    partial = sch.rfactor(tk, factor_axis=0)
    loops = sch.get_loops(partial)
    bx, tn, r = loops[len(batch) : len(batch) + 3]
    a_row = loops[len(batch) + 3 : len(batch) + 3 + len(a_rows)]
    *steps, tk, ki = loops[len(batch) + 3 + len(a_rows) :]  # ko, then vector pieces (if several)
    sch.reorder(bx, tn, tk, *steps, r, *a_row, ki)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tn, row_tag)
    sch.bind(tk, k_tag)
    _bind_batch(sch, wl, loops[: len(batch)])
    sch.set_scope(partial, 0, "local")
    # Step 4. Where each step's B and x come from (see `_step_operands`).
    _step_operands(sch, wl, partial, steps, ki, width, row_aligned=row_aligned,
                   shared_stages=shared_stages, vector_loads=vector_loads,
                   threads=(rows_per_block, reduce_threads))
    # Step 5. The cross-thread reduction of the partials, in the same kernel.
    sch.reverse_compute_at(block, bx, preserve_unit_loops=True)
    # K threads, (unit batch or A's rows), rows
    tk_sum, *middle, rows = sch.get_loops(block)[len(batch) + 1 :]
    tn_sum, r_sum = sch.split(rows, [rows_per_block, rows_per_thread])
    sch.reorder(tn_sum, r_sum, *(middle if a_rows else []), tk_sum)
    sch.bind(tn_sum, row_tag)
    sch.bind(tk_sum, k_tag)
    write_back_at(sch, wl, r_sum)
    sch.decompose_reduction(partial, steps[0])


def _step_operands(sch: Schedule, wl: Workload, partial, steps: list, ki, width: int, *,
                   row_aligned: bool, shared_stages: int, vector_loads: bool,
                   threads: tuple[int, int]) -> None:
    """_k_across_threads' step 4: how each K step (each vector piece of it, `steps[-1]`) gets
    its B and x: row_aligned's 16-byte vectors in registers; nvfp4's codes, scales and decoded
    x staged in shared memory by the block's `threads` (rows, K threads); nvfp4's x decoded
    once for all rows and a vector of each row's codes; or one vector load of x for all rows
    and one per row of B. Without vector_loads, nothing: the loads stay in the sum."""
    if row_aligned:
        # Per step (per vector piece), a row's vector of B and the window of x it
        # multiplies, each 16 bytes in registers.
        for name in (ROW_VECTORS, X_WINDOWS):
            sch.compute_at(sch.get_sblock(name), steps[-1])
            sch.set_scope(sch.get_sblock(name), 0, "local")
    elif shared_stages:
        # Per step, the block's codes and scales, and x decoded, in shared memory.
        _stage_in_shared(sch, partial, steps[0], threads, width // fp4.PER_BYTE, shared_stages)
    elif vector_loads and wl.is_nvfp4:
        # Per step (per vector piece), x decoded once for all the rows; one load of each
        # row's codes (16 bytes: 32 codes; 8 bytes where K is an odd number of 16s).
        _place_x_values(sch, wl, steps[-1])
        codes = sch.cache_read(partial, _read_index(sch, partial, "B"), "local")
        sch.compute_at(codes, steps[-1])
        _, lanes = sch.split(sch.get_loops(codes)[-1], [None, width // fp4.PER_BYTE])
        sch.vectorize(lanes)
        sch.unroll(ki)  # the decoded x in registers, indexed by constants
    elif vector_loads:
        # Per step (per vector piece), one load of x, reused by all rows; one per row of B
        # (on odd K, single elements: nothing to vectorize).
        for operand in (0, 1):  # x, then B
            tile = sch.cache_read(partial, operand, "local")
            sch.compute_at(tile, steps[-1])
            if width > 1:
                _, lanes = sch.split(sch.get_loops(tile)[-1], [None, width])
                sch.vectorize(lanes)


def _stage_in_shared(sch: Schedule, partial, step, threads: tuple[int, int], vector_bytes: int,
                     stages: int) -> None:
    """nvfp4: per iteration of `step`, all the block's `threads` copy the codes (in
    `vector_bytes` vectors) and scales of its rows into shared memory, and decode x's values
    there once for all of them (the batched seed's V6 with V6_2_1's conversion on the way in).
    With `stages` > 1, the copies of the next stages - 1 steps are cp.async loads issued while
    this one computes (its V7); x's decode stays with the step that uses it."""
    for name, vector in (("B", vector_bytes), ("B_scale", 1)):
        cooperative_fetch(sch, partial, _read_index(sch, partial, name), step, threads, vector)
    values = sch.get_sblock(X_VALUES)
    sch.set_scope(values, 0, "shared")  # first: compute_at then covers the whole block's threads
    sch.compute_at(values, step)
    bind_threads(sch, sch.get_loops(values)[-1], threads)
    software_pipeline(sch, step, stages, computes=2, async_loads=True)  # the decode, the sum


@schedule("gemv", "splitk", brings=("occupancy_pct", +1))
@schedule("batched_gemv", "splitk", brings=("occupancy_pct", +1))
def splitk(sch: Schedule, wl: Workload, rows_per_block: int = 2, reduce_threads: int = 32,
           tile_k: int | None = None) -> None:
    """K split across the threads of a block; partials combined through shared memory (the
    batched seed's V2, whose threads take 32 elements of K each: tile_k=32 for nvfp4).

    Where naive gives a row one thread, splitk gives it reduce_threads, so many more warps are
    in flight to hide DRAM's latency (the counter it brings: occupancy up).

    IR: threadIdx.x = rows (the seed's layout), threadIdx.y = K threads, each summing tile_k
    scalar loads per step; a shared-memory tree (red_buf, __syncthreads) adds the partials."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
            tile_k=tile_k, vector_loads=False, warp_reduce=False)


@schedule("gemv", "splitk_vec", brings=("global_load_requests", -1))
@schedule("batched_gemv", "splitk_vec", brings=("global_load_requests", -1))
def splitk_vec(sch: Schedule, wl: Workload, rows_per_block: int = 2, reduce_threads: int = 32,
               tile_k: int | None = None) -> None:
    """splitk + each thread reads its K slice of B and x as one 16-byte vector (uint4).

    One load instruction brings 8 halves instead of one, so the global load requests fall by
    about 8x (the counter it brings).

    IR: local B and x tiles filled by a vectorized loop; `uint4` loads in the CUDA source.
    On K that is not whole 16-byte vectors (8 halves, 4 floats), the slice comes in the widest
    vectors that rows of K are made of (half2 on K = 2 mod 4 halves, single elements on odd K)."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
            tile_k=tile_k, vector_loads=True, warp_reduce=False)


@schedule("gemv", "allreduce", brings=("inst_executed", -1))
@schedule("batched_gemv", "allreduce", brings=("inst_executed", -1))
def allreduce(sch: Schedule, wl: Workload, rows_per_block: int = 4, reduce_threads: int = 32,
              tile_k: int | None = None) -> None:
    """splitk_vec with the K threads on threadIdx.x: one warp per row, reduced by shuffles
    (the batched seed's V3).

    The shuffles take fewer instructions than the shared-memory tree and its barriers (the
    counter it brings: inst_executed down), which shows where the reduction is a fair part
    of the work (a short GEMV), not on a long K.

    IR: tvm_thread_allreduce over threadIdx.x; __shfl_down_sync in the CUDA source, and the
    warp's 32 loads of 16 bytes are 512 contiguous bytes of a row."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
            tile_k=tile_k, vector_loads=True, warp_reduce=True)


ROWS_SPACE = {"rows_per_block": [1, 2, 4, 8], "reduce_threads": [32, 64, 128, 256],
              "tile_k": [8, 16, 32], "rows_per_thread": [1, 2, 4]}


def k_threads(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """multirow: as many K threads as have a tile_k slice of K each (one 16-byte vector by
    default), rounded up to a power of two, at most a warp. Short K thus gets fewer K threads,
    and a warp then holds 32 / reduce_threads rows' threads, rows_per_thread rows each: more
    rows per warp. K of a warp's step or more (256 halves, 128 floats): the defaults."""
    tile_k = knobs["tile_k"] or vector_width(wl)
    slices = -(-wl.dims["K"] // tile_k)
    return {"reduce_threads": min(heuristics.WARP, 1 << (slices - 1).bit_length())}


@schedule("gemv", "multirow", space=ROWS_SPACE, heuristic=k_threads,
          brings=("global_load_requests", -1))
@schedule("batched_gemv", "multirow", space=ROWS_SPACE, heuristic=k_threads,
          brings=("global_load_requests", -1))
def multirow(sch: Schedule, wl: Workload, rows_per_block: int = 8, reduce_threads: int = 32,
             tile_k: int | None = None, rows_per_thread: int = 4) -> None:
    """allreduce + each warp computes rows_per_thread rows, so each loaded x vector serves
    them all (the batched seed's V4: 4 rows per warp, 8 warps per block), a thread's rows
    consecutive (its V5). On nvfp4, x is decoded once per step for all the rows.

    x is loaded once for rows_per_thread rows (the counter it brings: global load requests
    down), but a block then covers rows_per_block * rows_per_thread rows, so a GEMV has that
    many times fewer warps, which can leave the SMs short of them (occupancy).

    IR: rows_per_thread register accumulators per thread; one x load per K step, then one
    B load per row; rows_per_thread warp all-reduces at the end."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
            tile_k=tile_k, vector_loads=True, warp_reduce=True, rows_per_thread=rows_per_thread)


@schedule("gemv", "blockreduce", brings=("occupancy_pct", +1))
@schedule("batched_gemv", "blockreduce", brings=("occupancy_pct", +1))
def blockreduce(sch: Schedule, wl: Workload, rows_per_block: int = 1, reduce_threads: int = 128,
                tile_k: int | None = None) -> None:
    """allreduce with the K threads of several warps on each row: a block streams 2 KB of a
    row per step, and the all-reduce becomes warp shuffles, then one exchange across warps.

    Four warps on a row where multirow put four rows on a warp: a GEMV has many more warps in
    flight (the counter it brings: occupancy up).

    IR: threadIdx.x = reduce_threads (> 32); the CUDA has __shfl_down_sync plus a small shared
    red_buf for the partials of the warps."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
            tile_k=tile_k, vector_loads=True, warp_reduce=True)


SKINNY_ROWS = 16  # skinny's most rows of A: a thread keeps a sum per row of A and of B


def refuse_skinny(wl: Workload, **knobs) -> None:
    """What skinny does not take, past its dtypes: rows of A past SKINNY_ROWS, B stored K x N
    (nn), fp8's block scales (it scales each sum once, after K: per tensor or per row)."""
    if wl.dims["M"] > SKINNY_ROWS:
        raise ScheduleNotApplicable(f"skinny takes at most {SKINNY_ROWS} rows of A (each thread "
                                    f"keeps a sum for each), not M = {wl.dims['M']}")
    if wl.layout != "nt":
        raise ScheduleNotApplicable("skinny reads B's rows of K as a GEMV does: layout nt, not "
                                    f"{wl.layout}")
    if wl.block_scaled:
        raise ScheduleNotApplicable("skinny scales each sum once, after K (fp8 scales per tensor "
                                    "or per row), not per 128-K block")


SKINNY_SPACE = {"rows_per_block": [2, 4, 8], "reduce_threads": [32, 64, 128],
                "tile_k": [None, 16, 32], "rows_per_thread": [1, 2, 4]}
WARPS_PER_SM = 16  # skinny's warps in flight per SM, enough loads of W to cover DRAM's latency
MOST_SUMS = 32  # skinny's sums a thread keeps (rows of A x rows of W) in registers: at 64, nvcc
# put them on the stack (16 rows of A by 4 of W, built here)


def skinny_threads(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """skinny: W's rows per thread, then K threads per row, so that the GEMM has WARPS_PER_SM
    warps for every SM where its shape allows, and each thread at most MOST_SUMS sums: one
    row a thread where N is short, then more K threads on a row (to 128, as blockreduce) while
    K gives each a vector a step."""
    rows, threads = max(space["rows_per_thread"]), min(space["reduce_threads"])
    warps = lambda: -(-wl.dims["N"] // rows) * threads // heuristics.WARP  # noqa: E731
    while rows > min(space["rows_per_thread"]) and (warps() < WARPS_PER_SM * sms
                                                    or rows * wl.dims["M"] > MOST_SUMS):
        rows //= 2
    steps = wl.dims["K"] // (knobs["tile_k"] or vector_width(wl))
    while warps() < WARPS_PER_SM * sms and 2 * threads in space["reduce_threads"] \
            and steps >= 2 * threads:
        threads *= 2
    return {"rows_per_thread": rows, "reduce_threads": threads}


@schedule("gemm", "skinny", dtypes=(*DENSE_DTYPES, FP8), refuse=refuse_skinny, space=SKINNY_SPACE,
          heuristic=skinny_threads, brings=("dram_pct", +1))
def skinny(sch: Schedule, wl: Workload, rows_per_block: int = 4, reduce_threads: int = 32,
           tile_k: int | None = None, rows_per_thread: int = 2) -> None:
    """multirow for a GEMM of a few rows (M <= 16, nt: y = x W^T for a few tokens, as a
    decode step at a small batch runs its layers): a GEMV of each row of A at once, so that W
    streams from memory once for all of them, where tensor-core tiles of 64 rows and more
    would leave most of their rows empty.

    W read once at the memory's speed, where cuBLAS's small-M kernels stop short of it (the
    counter it brings: DRAM throughput, dram_pct, up).

    IR: the GEMV's K threads on a warp (shuffle all-reduce), M x rows_per_thread register
    sums per thread; per K step one 16-byte vector of each row of A and of each of the
    thread's rows of W."""
    refuse_skinny(wl)
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
                      tile_k=tile_k, vector_loads=True, warp_reduce=True,
                      rows_per_thread=rows_per_thread)


ROW_VECTORS = "B_vectors"  # the block of row_aligned_gemv that reads B in 16-byte vectors
X_WINDOWS = "x_windows"  # ... and the one that gives each of them x at the row's shift

ROW_ALIGNED = r"""
// rowalign's CUDA helpers, on 16-byte vectors held as uint4 (float4 for float32: V).
// Only a row's first and last vectors take the slow paths (masks, loads word by word); the
// rest are whole-vector loads and register moves. The module gets this source once per
// helper called: the guard keeps one copy.
#ifndef ROWALIGN_HELPERS
#define ROWALIGN_HELPERS
template <typename To, typename From>
__host__ __device__ __forceinline__ To rowalign_as(From value) {
  return *reinterpret_cast<To*>(&value);
}
// `value` with its bytes outside [from, to) zeroed: a row's bytes in one vector of B.
template <typename V>
__host__ __device__ __forceinline__ V rowalign_keep(V value, int from, int to) {
  if (from <= 0 && to >= 16) return value;
  uint4 v = rowalign_as<uint4>(value);
  unsigned w[4] = {v.x, v.y, v.z, v.w};
  for (int i = 0; i < 4; ++i) {
    int low = from - 4 * i, high = to - 4 * i;  // the bytes of word i to keep: [low, high)
    unsigned below = low <= 0 ? 0u : low >= 4 ? ~0u : (1u << (8 * low)) - 1u;
    unsigned upto = high <= 0 ? 0u : high >= 4 ? ~0u : (1u << (8 * high)) - 1u;
    w[i] &= upto & ~below;
  }
  return rowalign_as<V>(make_uint4(w[0], w[1], w[2], w[3]));
}
// Word `at` / 4 of x (at: a multiple of 4) with its bytes outside [from, to) zero (from and to
// even: whole 2-byte elements).
__host__ __device__ __forceinline__ unsigned rowalign_x_word(const void* x, int from, int to, int at) {
  if (at >= from && at + 4 <= to) return static_cast<const unsigned*>(x)[at / 4];
  const unsigned short* halves = static_cast<const unsigned short*>(x);
  unsigned low = at >= from && at + 2 <= to ? halves[at / 2] : 0u;
  unsigned high = at + 2 >= from && at + 4 <= to ? halves[at / 2 + 1] : 0u;
  return low | high << 16;
}
// 16-byte vector u of x with its bytes outside [from, to) zero.
__host__ __device__ __forceinline__ uint4 rowalign_x_vector(const void* x, int from, int to, int u) {
  if (16 * u >= from && 16 * u + 16 <= to) return static_cast<const uint4*>(x)[u];
  return make_uint4(rowalign_x_word(x, from, to, 16 * u), rowalign_x_word(x, from, to, 16 * u + 4),
                    rowalign_x_word(x, from, to, 16 * u + 8), rowalign_x_word(x, from, to, 16 * u + 12));
}
// Bits `bits` (0..31) onwards of the 64-bit pair (high:low).
__host__ __device__ __forceinline__ unsigned rowalign_funnel(unsigned low, unsigned high, int bits) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(low, high, bits);
#else
  return (unsigned)(((((unsigned long long)high) << 32) | low) >> bits);
#endif
}
// The 16 bytes of x from byte `pos` (any alignment, negative too), zeros outside [from, to):
// two aligned vector loads shifted in registers. Along a row of B, pos moves by 16 bytes a
// vector, so the shift is the row's: the selects below do not diverge.
template <typename V>
__host__ __device__ __forceinline__ V rowalign_x_window(const void* x, int from, int to, int pos) {
  int u = pos >> 4, shift = pos & 15;  // the vector that holds pos (floored), pos's byte in it
  uint4 low, high;
  if (16 * u >= from && 16 * u + 32 <= to) {
    low = static_cast<const uint4*>(x)[u];
    high = static_cast<const uint4*>(x)[u + 1];
  } else {
    low = rowalign_x_vector(x, from, to, u);
    high = rowalign_x_vector(x, from, to, u + 1);
  }
  if (shift == 0) return rowalign_as<V>(low);
  unsigned w[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
  int first = shift / 4, bits = 8 * (shift % 4);  // the first word: 0..3
  unsigned a[6], b[5];
  for (int i = 0; i < 6; ++i) a[i] = (first & 2) ? w[i + 2] : w[i];
  for (int i = 0; i < 5; ++i) b[i] = (first & 1) ? a[i + 1] : a[i];
  return rowalign_as<V>(make_uint4(
      rowalign_funnel(b[0], b[1], bits), rowalign_funnel(b[1], b[2], bits),
      rowalign_funnel(b[2], b[3], bits), rowalign_funnel(b[3], b[4], bits)));
}
#endif
"""


def is_ragged(wl: Workload) -> bool:
    """Whether rows of K are not whole 16-byte vectors (so that rows start off their boundaries)."""
    return wl.dims["K"] % vector_width(wl) != 0


def row_aligned_gemv(wl: Workload, **knobs):
    """The workload's GEMV (rowalign's knobs do not change it), with each row of B walked in the
    16-byte vectors of B's storage: from the vector boundary at or before the row's first
    element to the one after its last, and x in 16-byte vectors too. On K of whole vectors,
    where every row starts on a boundary, it is the workload's own definition.
    Every vector load of B is aligned whatever K is (B's base is 16-byte aligned); the bytes
    of the neighbouring rows that a row's first and last vectors hold are zeroed. A vector that
    would start past B's last one (a row that ends on a boundary, at the end of B) is clamped
    to it: all its bytes are zeroed, and no load leaves the vectors that hold B.
    Each of those vectors multiplies the 16 bytes of x at the row's shift: two aligned vectors
    of x funnel-shifted in registers, zeros outside x's row. The zeroing and the shift are
    CUDA helpers (`ROW_ALIGNED`), so this definition is CUDA's.

    Rows start on boundaries `gcd(K, vector)` apart, so a row's walk is at most
    `vector - gcd(K, vector)` elements longer than K."""
    if not is_ragged(wl):
        return wl.prim_func()
    vector = vector_width(wl)
    size = DTYPE_BYTES[wl.dtype]
    dims = wl.dims
    L, N, K = dims.get("L", 1), dims["N"], dims["K"]
    steps = -(-(K + vector - math.gcd(K, vector)) // vector)
    last_vector = (L * N * K - 1) // vector
    b_shape, x_shape, y_shape = wl.buffer_shapes().values()
    at = (lambda batch, i: (batch, i)) if "L" in dims else (lambda batch, i: (i,))
    dtype, out_dtype, has_cast = wl.dtype, wl.out_dtype, wl.has_cast
    vector_type = "float4" if dtype == "float32" else "uint4"
    vector_dtype = f"{dtype}x{vector}"  # a helper's result: one 16-byte vector
    # how many elements row (vb, vn) starts past its first vector
    shift_of = lambda vb, vn: (vb * N + vn) * K % vector  # noqa: E731
    keep = ("rowalign_keep", ROW_ALIGNED)
    window = (f"rowalign_x_window<{vector_type}>", ROW_ALIGNED)

    @T.prim_func(s_tir=True)
    def main(B: T.Buffer(b_shape, dtype), x: T.Buffer(x_shape, dtype),
             y: T.Buffer(y_shape, out_dtype)):
        T.func_attr({"tirx.noalias": True})
        B_flat = T.decl_buffer((L * N * K,), dtype, data=B.data)
        vectors = T.sblock_alloc_buffer((L, N, steps, vector), dtype)
        windows = T.sblock_alloc_buffer((L, N, steps, vector), dtype)
        acc = T.sblock_alloc_buffer(y_shape, "float32") if has_cast else y
        # One vector per block: `ve` (extent 1) is there so compute_at can place it.
        for b, n, s, e in T.grid(L, N, steps, 1):
            with T.sblock(ROW_VECTORS):
                vb, vn, vs, ve = T.axis.remap("SSSS", [b, n, s, e])
                shift = T.meta_var(shift_of(vb, vn))
                start = T.meta_var(T.min((vb * N + vn) * K // vector + vs, last_vector) * vector)
                vectors[vb, vn, vs, ve * vector : ve * vector + vector] = cuda_call(
                    keep, B_flat[T.Ramp(start, 1, vector)], (shift - vs * vector) * size,
                    (shift + K - vs * vector) * size, return_type=vector_dtype)
        for b, n, s, e in T.grid(L, N, steps, 1):
            with T.sblock(X_WINDOWS):
                vb, vn, vs, ve = T.axis.remap("SSSS", [b, n, s, e])
                shift = T.meta_var(shift_of(vb, vn))
                T.reads(x[at(vb, slice(0, K))])
                T.writes(windows[vb, vn, vs, ve * vector : ve * vector + vector])
                windows[vb, vn, vs, ve * vector : ve * vector + vector] = cuda_call(
                    window, x.data, vb * K * size, (vb + 1) * K * size,
                    vb * K * size + (vs * vector - shift) * size, return_type=vector_dtype)
        for b, n, k in T.grid(L, N, steps * vector):
            with T.sblock(wl.reduction_block):
                vb, vn, vk = T.axis.remap("SSR", [b, n, k])
                with T.init():
                    acc[at(vb, vn)] = T.float32(0)
                acc[at(vb, vn)] = acc[at(vb, vn)] + (
                    T.Cast("float32", windows[vb, vn, vk // vector, vk % vector])
                    * T.Cast("float32", vectors[vb, vn, vk // vector, vk % vector]))
        if has_cast:
            for b, n in T.grid(L, N):
                with T.sblock(wl.output):
                    vb, vn = T.axis.remap("SS", [b, n])
                    y[at(vb, vn)] = T.Cast(out_dtype, acc[at(vb, vn)])

    return main


@schedule("gemv", "rowalign", compute=row_aligned_gemv, dtypes=DENSE_DTYPES)
@schedule("batched_gemv", "rowalign", compute=row_aligned_gemv, dtypes=DENSE_DTYPES)
def rowalign(sch: Schedule, wl: Workload, rows_per_block: int = 1, reduce_threads: int = 128,
             tile_k: int | None = None) -> None:
    """blockreduce with 16-byte loads of B and x on any K: each row is read from the 16-byte
    boundary at or before its first element (`row_aligned_gemv`), its neighbours' bytes
    zeroed, and x comes in aligned vectors shifted in registers to the row's start. On K of
    whole vectors it is blockreduce.

    IR: per K step, a local B vector `rowalign_keep(*(uint4*)(B_flat + min(first + step, last)
    * 8), ...)` and a local x vector `rowalign_x_window<uint4>(x, ...)`: on odd K too."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
                      tile_k=tile_k, vector_loads=True, warp_reduce=True,
                      row_aligned=is_ragged(wl))


@schedule("gemv", "staged", dtypes=(fp4.NAME,))
@schedule("batched_gemv", "staged", dtypes=(fp4.NAME,))
def staged(sch: Schedule, wl: Workload, rows_per_block: int = 8, reduce_threads: int = 32,
           rows_per_thread: int = 4) -> None:
    """multirow on nvfp4 with each step's codes and scales of the block's rows staged in shared
    memory by all its threads, and x decoded there once for the whole block (the batched seed's
    V6, with V6_2_1's conversion on the way in).

    IR: B_shared (uint8) and B_scale_shared (e4m3) filled by cooperative vector copies, the
    x_value block in shared memory, two __syncthreads per step."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
                      tile_k=None, vector_loads=True, warp_reduce=True,
                      rows_per_thread=rows_per_thread, shared_stages=1)


@schedule("gemv", "pipelined", dtypes=(fp4.NAME,))
@schedule("batched_gemv", "pipelined", dtypes=(fp4.NAME,))
def pipelined(sch: Schedule, wl: Workload, rows_per_block: int = 8, reduce_threads: int = 32,
              rows_per_thread: int = 4, stages: int = 2) -> None:
    """staged with double-buffered loads: the next step's codes and scales come by cp.async
    into a second shared buffer while this step computes (the batched seed's V7 and V7_2;
    stages=5 is its V7_3 ring).

    IR: software_pipeline annotations on the K step; cp.async with commit/wait groups in the
    CUDA, shared buffers `stages` deep."""
    _k_across_threads(sch, wl, rows_per_block=rows_per_block, reduce_threads=reduce_threads,
                      tile_k=None, vector_loads=True, warp_reduce=True,
                      rows_per_thread=rows_per_thread, shared_stages=stages)
