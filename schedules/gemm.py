"""The GEMM ladder, one schedule per rung, in ladder order.

naive..v3 are the seed blog's schedules (`../shared/seeds/gemm-tvm-blog-naive-to-v3.md`)
rewritten for TensorIR with the seed's tile sizes as defaults: the same launch dimensions, the
same shared tiles and the same K split. v4 to v5t go past the seed on CUDA cores, one idea per
rung: v4 coalesced threads and register tiles, v5 16-byte vectors, v5p a cp.async pipeline, v5k
split K, v5t A transposed in shared memory; v6 and v7, on tensor cores, are in tensorcore.py.
The tiles of v5..v5k and of v6 come from knob sweeps on an H100
(notebook/logs/h100-gemm-sweep-*.log), v5t's from notebook/logs/h100-v5t-sweep-*.log and,
where C has a 128x128 tile for every SM, h200-sweep-fp32-k-tile-8-2026-11-28.log. Loop
names follow the seed: i/x is the row axis (M), j/y the column axis (N), k the reduction.
Shapes that are not multiples of a tile get predicated tails from `split` up to v3; from v4
on, the multiply is padded to whole tiles (common.pad_to_tiles), so only the loads (zero past
the edges) and the store carry a predicate, and the register tiles none: a predicate on every
multiply-add made the ragged register tiles spill (580 to 4328 bytes) and run 2 to 20 times
slower than the aligned ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.s_tir import Schedule, TensorIntrin
from tvm.script import tirx as T

from .common import (cast_epilogue_at, cooperative_fetch, inline_padding, operand_vector,
                     pad_to_tiles, require_grid_y, require_sm, software_pipeline,
                     transposed_fetch, widest_vector, write_back_at)
from . import heuristics
from .errors import ScheduleNotApplicable
from .registry import schedule
from .workloads import DTYPE_BYTES, Workload


@schedule("gemm", "naive")
def naive(sch: Schedule, wl: Workload) -> None:
    """One output element per block and one thread per block (the seed's baseline).

    IR: two blockIdx launches (y over rows, x over columns), no threadIdx, no shared memory."""
    require_grid_y("naive", "M", wl.dims["M"])
    C = sch.get_sblock(wl.reduction_block)
    i, j, k = sch.get_loops(C)
    # Step 1. Rows on blockIdx.y, columns on blockIdx.x (as the seed binds them).
    sch.bind(i, "blockIdx.y")
    sch.bind(j, "blockIdx.x")
    # Step 2. Zero the output once, before the serial K loop.
    cast_epilogue_at(sch, wl, j)
    sch.decompose_reduction(C, k)


@schedule("gemm", "v1", brings=("inst_executed", -1))
def v1(sch: Schedule, wl: Workload, threads: int = 32) -> None:
    """Tiling + 1D threads: `threads` consecutive rows of a column share one block.

    Where naive's warps each run one thread, v1's run 32, so the same work takes about 1/32
    of the warp instructions (the counter it brings: inst_executed down).

    IR: blockIdx.x = M/threads, threadIdx.x = threads, blockIdx.y = N."""
    require_grid_y("v1", "N", wl.dims["N"])
    C = sch.get_sblock(wl.reduction_block)
    x, y, k = sch.get_loops(C)
    # Step 1. Split the rows: outer part on blocks, inner part on threads.
    xo, xi = sch.split(x, [None, threads])
    sch.bind(xo, "blockIdx.x")
    sch.bind(xi, "threadIdx.x")
    # Step 2. Every column is its own blockIdx.y.
    sch.bind(y, "blockIdx.y")
    cast_epilogue_at(sch, wl, y)
    sch.decompose_reduction(C, k)


@schedule("gemm", "v2", brings=("l2_bytes", -1))
def v2(sch: Schedule, wl: Workload, tile_x: int = 32, tile_y: int = 32) -> None:
    """Tiling + 2D threads: a tile_x x tile_y tile of C per block, one thread per element.

    A block's tile_y warps read the same tile_x rows of A, so L1 serves all but the first and
    far fewer bytes come through L2 (the counter it brings: l2_bytes down). Each warp still
    issues a load per element of A and B: the loads, not the bytes, bound it.

    IR: blockIdx.x/y = M/tile_x, N/tile_y; threadIdx.x/y = tile_x, tile_y (1024 threads)."""
    require_grid_y("v2", "N/tile_y", -(-wl.dims["N"] // tile_y))
    C = sch.get_sblock(wl.reduction_block)
    x, y, k = sch.get_loops(C)
    # Step 1. Split both output axes; outer parts on blocks, inner parts on threads.
    xo, xi = sch.split(x, [None, tile_x])
    yo, yi = sch.split(y, [None, tile_y])
    sch.bind(xo, "blockIdx.x")
    sch.bind(xi, "threadIdx.x")
    sch.bind(yo, "blockIdx.y")
    sch.bind(yi, "threadIdx.y")
    cast_epilogue_at(sch, wl, yi)
    sch.decompose_reduction(C, k)


def _tile_with_k_split(sch: Schedule, C, tile_x: int, tile_y: int, tile_k: int):
    """v2's tiling (tile_x x tile_y threads per block, rows on x) with K split by tile_k under
    the threads. Returns the threadIdx.y loop and the outer K loop."""
    x, y, k = sch.get_loops(C)
    xo, xi = sch.split(x, [None, tile_x])
    yo, yi = sch.split(y, [None, tile_y])
    ko, ki = sch.split(k, [None, tile_k])
    sch.reorder(xo, yo, xi, yi, ko, ki)
    sch.bind(xo, "blockIdx.x")
    sch.bind(yo, "blockIdx.y")
    sch.bind(xi, "threadIdx.x")
    sch.bind(yi, "threadIdx.y")
    return yi, ko


@schedule("gemm", "v3", brings=("global_load_requests", -1))
def v3(sch: Schedule, wl: Workload, tile_x: int = 16, tile_y: int = 16, tile_k: int = 8) -> None:
    """v2 + shared memory: per K tile, the block stages A and B tiles in shared memory,
    loaded cooperatively by all its threads.

    Each element of a tile is loaded from global memory once per block instead of once per
    thread that reads it, so the global load requests fall by about the tile's width (the
    counter it brings); the threads then read shared memory.

    IR: shared A (tile_x*tile_k) and B (tile_k*tile_y) buffers, K split into K/tile_k outer
    steps with __syncthreads around each load."""
    require_grid_y("v3", "N/tile_y", -(-wl.dims["N"] // tile_y))
    C = sch.get_sblock(wl.reduction_block)
    # Step 1. v2's 2D tiling and thread binding, plus the K split.
    yi, ko = _tile_with_k_split(sch, C, tile_x, tile_y, tile_k)
    # Step 2. Stage the A and B tiles of each K step in shared memory.
    for operand in (0, 1):
        tile = sch.cache_read(C, operand, "shared")
        sch.compute_at(tile, ko, preserve_unit_loops=True)
        # Step 3. Every thread of the block loads part of the tile (the seed's nparts split).
        rows, cols = sch.get_loops(tile)[-2:]
        tx, _ = sch.split(rows, [tile_x, None])
        ty, _ = sch.split(cols, [tile_y, None])
        sch.bind(tx, "threadIdx.x")
        sch.bind(ty, "threadIdx.y")
    cast_epilogue_at(sch, wl, yi)
    sch.decompose_reduction(C, ko)


SEED_SPACE = {  # the seed blog's AutoTVM search space
    "tile_x": [8, 16, 32], "tile_y": [8, 16, 32], "tile_k": [8, 16],
    "vectorize": [False, True], "local_accumulator": [False, True], "shared_tiles": [False, True],
}


@schedule("gemm", "seed_template", template=True, space=SEED_SPACE)
def seed_template(sch: Schedule, wl: Workload, tile_x: int = 16, tile_y: int = 16, tile_k: int = 8,
                  vectorize: bool = False, local_accumulator: bool = False,
                  shared_tiles: bool = True) -> None:
    """The seed blog's AutoTVM template: v3's tiling (tile_x x tile_y threads, K in steps of
    tile_k) with its three choices as switches: shared-memory tiles (cache_read), a register
    accumulator (cache_write to local) and 4-wide vector loads into the shared tiles.

    IR: v2 plus the K split when all switches are off; with shared_tiles, v3's shared tiles
    (dealt out over the threads as a flat tile rather than by the seed's nparts split)."""
    require_grid_y("seed_template", "N/tile_y", -(-wl.dims["N"] // tile_y))
    if vectorize and not shared_tiles:
        raise ScheduleNotApplicable("vectorize applies to the shared-memory loads (shared_tiles)")
    if vectorize:
        _require_whole_vectors("seed_template", wl, 4)
    C = sch.get_sblock(wl.reduction_block)
    # Step 1. v3's 2D tiling and thread binding, with the K split.
    yi, ko = _tile_with_k_split(sch, C, tile_x, tile_y, tile_k)
    # Step 2. Accumulate in a register and write C once, or accumulate in C itself.
    if local_accumulator:
        write_back_at(sch, wl, yi)
    else:
        cast_epilogue_at(sch, wl, yi)
    # Step 3. Stage A and B per K step in shared memory, loaded by all threads.
    if shared_tiles:
        for operand in (0, 1):
            cooperative_fetch(sch, C, operand, ko, (tile_y, tile_x), 4 if vectorize else 1)
    sch.decompose_reduction(C, ko)


def _threads_of_register_tiles(name: str, block_m: int, block_n: int, thread_m: int,
                               thread_n: int) -> tuple[int, int]:
    """(threadIdx.y, threadIdx.x) of a block tile cut into thread_m x thread_n register tiles;
    refused unless the register tiles fit the block tile whole."""
    for block, thread, axis in ((block_m, thread_m, "m"), (block_n, thread_n, "n")):
        if block % thread:
            raise ScheduleNotApplicable(f"{name} cuts block_{axis}={block} into register tiles "
                                        f"of thread_{axis}={thread}: not a whole number of them")
    return block_m // thread_m, block_n // thread_n


def _require_whole_vectors(name: str, wl: Workload, vector: int) -> None:
    """16-byte loads need every row of A and B to start on a 16-byte boundary."""
    contiguous = {"K (the rows of A)": wl.dims["K"]}
    contiguous["N (the rows of B)" if wl.layout == "nn" else "K (the rows of B)"] = (
        wl.dims["N"] if wl.layout == "nn" else wl.dims["K"])
    for axis, extent in contiguous.items():
        if extent % vector:
            raise ScheduleNotApplicable(
                f"{name} loads 16-byte vectors: {axis}={extent} is not a multiple of {vector}")


def _tile_for_registers(sch: Schedule, wl: Workload, C, name: str, threads: tuple[int, int],
                        thread_m: int, thread_n: int, k_split: list[int], *, group_n: int = 0,
                        group_m: int = 0):
    """Block tiles on blockIdx, thread tiles on threadIdx (x along the contiguous N axis), and
    thread_m x thread_n register tiles innermost; K split by k_split, its loops between the
    threads and the register tile. With group_n < thread_n, a thread's columns are
    thread_n / group_n groups of group_n, one block row of threads apart (virtual threads);
    likewise its rows with group_m < thread_m. Returns the threadIdx.x loop and the K loops."""
    require_grid_y(name, "M/block_m", -(-wl.dims["M"] // (threads[0] * thread_m)))
    *k_slice, i, j, k = sch.get_loops(C)  # a K-sliced partial block (_slice_k) has a slice loop
    if k_slice:
        sch.bind(k_slice[0], "blockIdx.z")
    group_m, group_n = group_m or thread_m, group_n or thread_n
    by, vy, ty, ti = sch.split(i, [None, thread_m // group_m, threads[0], group_m])
    bx, vx, tx, tj = sch.split(j, [None, thread_n // group_n, threads[1], group_n])
    k_loops = sch.split(k, [None, *k_split])
    sch.reorder(by, bx, vy, vx, ty, tx, *k_loops, ti, tj)
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(vy, "vthread.y")
    sch.bind(vx, "vthread.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")  # the contiguous N axis: a warp touches consecutive columns
    return tx, k_loops


TILES = {"block_m": [32, 64, 128], "block_n": [32, 64, 128]}


@schedule("gemm", "v4", space={**TILES, "thread_m": [2, 4, 8], "thread_n": [2, 4, 8],
                               "tile_k": [8, 16, 32]})
def v4(sch: Schedule, wl: Workload, block_m: int = 64, block_n: int = 64, thread_m: int = 4,
       thread_n: int = 4, tile_k: int = 16) -> None:
    """v3 + coalesced threads and a register tile: threadIdx.x runs along N (contiguous in B and
    C), and each thread accumulates a thread_m x thread_n block of C in registers.

    IR: C_local = alloc_local((thread_m * thread_n,)); block (block_n/thread_n, block_m/thread_m)
    threads; shared A and B tiles of block_m*tile_k and tile_k*block_n per K step."""
    threads = _threads_of_register_tiles("v4", block_m, block_n, thread_m, thread_n)
    padded = pad_to_tiles(sch, wl, (block_m, block_n, tile_k))
    C = sch.get_sblock(wl.reduction_block)
    # Step 1. Block tile, thread tile, register tile; K in steps of tile_k.
    tx, (ko, _) = _tile_for_registers(sch, wl, C, "v4", threads, thread_m, thread_n, [tile_k])
    # Step 2. The register tile: accumulate in local memory, write C once per thread.
    write_back_at(sch, wl, tx)
    # Step 3. Shared A and B tiles per K step, loaded by all threads of the block.
    for operand in (0, 1):
        cooperative_fetch(sch, C, operand, ko, threads)
    if padded:
        inline_padding(sch, wl)
    sch.decompose_reduction(C, ko)


def _slice_k(sch: Schedule, wl: Workload, slices: int, tile_k: int, atomic_sum: bool):
    """Cut K into `slices` independent slices (rfactor) of whole K tiles each, the last ones
    shorter (or empty) where K is not that many tiles. Returns the partial-product block, its
    loops (slice, i, j, k) with the slice outermost.

    By default each slice's partial products go to a float32 buffer, and a second kernel sums
    the slices, 4 output elements per thread. With `atomic_sum`, the partials stay in registers
    and each thread adds its own into C with `red.global.add` (see _add_partials_atomically)."""
    C = sch.get_sblock(wl.reduction_block)
    slice_tiles = -(-wl.dims["K"] // (slices * tile_k))
    k_slice, _ = sch.split(sch.get_loops(C)[-1], [slices, slice_tiles * tile_k])
    partial = sch.rfactor(k_slice, 0)
    i, j, k_slice = sch.get_loops(partial)[:3]
    sch.reorder(k_slice, i, j)
    if atomic_sum:
        return partial
    # The sum over the slices: each thread sums a vector of 4 consecutive outputs, reading the
    # partials as 16-byte vectors; 256 threads per block.
    i, j, k_slice = sch.get_loops(C)
    j, lanes = sch.split(j, [None, 4])  # predicated lane by lane where N is not whole vectors
    bx, tx = sch.split(sch.fuse(i, j), [None, 256])
    sch.reorder(bx, tx, k_slice, lanes)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(lanes)
    write_back_at(sch, wl, tx, vector=4)
    return partial


def _require_atomic_adds(name: str, wl: Workload, slices: int, tiles: dict[str, int]) -> None:
    """What atomic_sum needs: slices to add, a float32 C, sm_90's vector atomics, and whole
    tiles (TVM 0.27 cannot tensorize the adds of a block that carries a predicate)."""
    if slices < 2:
        raise ScheduleNotApplicable(f"{name}: atomic_sum adds the K slices' partials; "
                                    f"set k_slices > 1")
    if wl.has_cast:
        raise ScheduleNotApplicable(f"{name} adds float32 partials into C atomically: it needs a "
                                    f"float32 output, not {wl.out_dtype}")
    require_sm(name, 90, "red.global.add.v4.f32 to add the partials")
    for axis, tile in tiles.items():
        if wl.dims[axis] % tile:
            raise ScheduleNotApplicable(f"{name}'s atomic adds take whole tiles: {axis}="
                                        f"{wl.dims[axis]} is not a multiple of {tile}")


def _add_partials_atomically(sch: Schedule, wl: Workload, partial, thread_loop,
                             overlap_zeroing: bool) -> None:
    """Split K's sum without a second pass over the partials: the sum over the slices moves
    under `thread_loop` of the partial-product kernel, so each thread adds its own registers
    into C, 4 columns per `red.global.add.v4.f32`. The slices' blocks add concurrently; C's
    zeroing, which must come first, becomes a kernel of its own ahead of them. Float addition
    in whatever order the slices arrive: the last bits of C can differ from run to run.

    With overlap_zeroing (Hopper's programmatic dependent launch), the two kernels overlap: the
    zeroing kernel's threads release the main kernel as they start
    (`griddepcontrol.launch_dependents`), the main kernel is launched to start early (by
    tuning/lowering.py, as every kernel that waits so), and it waits for the zeroes
    (`griddepcontrol.wait`) only before its adds. Its K loop runs while C is zeroed."""
    C = sch.get_sblock(wl.reduction_block)
    sch.reverse_compute_at(C, thread_loop)
    zero = sch.decompose_reduction(C, sch.get_loops(C)[0])  # above the slices: its own kernel
    sch.set_scope(partial, 0, "local")
    _, lanes = sch.split(sch.get_loops(zero)[-1], [None, 4])
    if overlap_zeroing:
        sch.tensorize(lanes, _zero_v4_f32_launching_dependents())
    else:
        sch.vectorize(lanes)  # zeroes by float4
    _, lanes = sch.split(sch.get_loops(C)[-1], [None, 4])  # C: the adds, without the zeroing
    sch.tensorize(lanes, _red_add_v4_f32(after_predecessor=overlap_zeroing))


def _zero_v4_f32_launching_dependents() -> str:
    """A tensor intrinsic, registered once: C[0:4] = 0 as one 16-byte store, after
    `griddepcontrol.launch_dependents`, which lets the kernel launched next start now (it must
    `griddepcontrol.wait` before it touches C)."""
    name = "zero_v4_f32_launching_dependents"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (4,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:4])
            for j in range(4):
                with T.sblock("zero"):
                    vj = T.axis.remap("S", [j])
                    C[vj] = T.float32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (4,), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:4])
            T.evaluate(T.ptx.griddepcontrol.launch_dependents())
            for j in T.vectorized(4):
                C[j] = T.float32(0)

    TensorIntrin.register(name, desc, impl)
    return name


def _red_add_v4_f32(after_predecessor: bool) -> str:
    """A tensor intrinsic, registered once per variant: C[0:4] += P[0:4] as one
    `red.global.add.v4.f32` (an atomic add of 4 consecutive float32, Hopper and later). With
    after_predecessor, first `griddepcontrol.wait`: until the kernel before has finished and
    its writes are visible (at once when it has)."""
    name = "red_add_v4_f32" + "_after_predecessor" * after_predecessor
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name

    @T.prim_func(s_tir=True)
    def desc(c: T.handle, p: T.handle) -> None:
        C = T.match_buffer(c, (4,), "float32", offset_factor=1)
        P = T.match_buffer(p, (4,), "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:4], P[0:4])
            T.writes(C[0:4])
            for j in range(4):
                with T.sblock("add"):
                    vj = T.axis.remap("S", [j])
                    C[vj] = C[vj] + P[vj]

    @T.prim_func(s_tir=True)
    def impl(c: T.handle, p: T.handle) -> None:
        C = T.match_buffer(c, (4,), "float32", offset_factor=1)
        P = T.match_buffer(p, (4,), "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:4], P[0:4])
            T.writes(C[0:4])
            if after_predecessor:
                T.evaluate(T.ptx.griddepcontrol.wait())
            T.evaluate(T.ptx.red.global_.add.v4.f32(C.access_ptr("w"), P[0], P[1], P[2], P[3]))

    TensorIntrin.register(name, desc, impl)
    return name


@dataclass(frozen=True, kw_only=True)
class RegisterTiles:
    """The settings of the register-tile schedule that v5, v5p, v5k and v5t share
    (_schedule_register_tiles); each rung turns one more group of them on."""

    block_m: int  # C tile of a block: block_m x block_n
    block_n: int
    thread_m: int  # C tile of a thread, in registers: thread_m x thread_n
    thread_n: int
    tile_k: int  # K elements per shared tile
    stages: int = 1  # v5p: shared K tiles in flight, filled by cp.async (1: no pipeline)
    single_barrier: bool = False  # v5p: one __syncthreads per K tile instead of two
    k_slices: int = 1  # v5k: blocks (blockIdx.z) that share a C tile, each over a K slice
    atomic_sum: bool = False  # v5k: slices add into C atomically instead of a sum kernel
    overlap_zeroing: bool = False  # v5k, atomic_sum: the K loop runs while C is zeroed
    transposed: bool = False  # v5t: the shared tiles of operands whose rows run along K (A's;
    # B's in nt) stored transposed, M- or N-contiguous, read along M or N
    fragment_stages: int = 1  # v5t: register fragments of K steps in flight


FP8_LANES = 4  # TVM 0.27's CUDA codegen makes fp8 vectors of 1, 2 or 4 lanes only (a zero-fill
# of 16 fails its check on ragged shapes)


def _schedule_register_tiles(sch: Schedule, wl: Workload, name: str, tiles: RegisterTiles) -> None:
    """The register-tile schedule of v5 and the rungs after it, as `tiles` sets it."""
    # Shared tiles and register fragments in 16-byte vectors (fp8: FP8_LANES); global rows of A
    # and B in the widest vectors they are made of (narrower on ragged K, or N in nn).
    vector = FP8_LANES if wl.is_fp8 else 16 // DTYPE_BYTES[wl.dtype]
    global_vector = operand_vector(wl, vector)
    thread_m, thread_n = tiles.thread_m, tiles.thread_n
    threads = _threads_of_register_tiles(name, tiles.block_m, tiles.block_n, thread_m, thread_n)
    # A thread's columns come in groups of one 16-byte B vector where B's shared rows run along
    # N (nn, or nt transposed); in nt they run along K, as A's do: B's fragments are then K
    # vectors like A's, and a thread's columns lie one row of threads apart, so that a warp's
    # vectors fall on distinct banks; but atomic_sum adds 4 adjacent columns at a time, so there
    # they stay in groups (B's reads then share banks).
    transposed_b = tiles.transposed and wl.layout == "nt"
    b_along_k = wl.layout == "nt" and not transposed_b
    group = 1 if b_along_k and not tiles.atomic_sum else min(thread_n, vector)
    group_m = min(thread_m, vector) if tiles.transposed else thread_m
    # A's fragments: 4 K steps (one 16-byte vector along K) at a time, or, transposed, one K step.
    k_split = [tiles.tile_k] if tiles.transposed else [tiles.tile_k // vector, vector]
    if tiles.atomic_sum:
        _require_atomic_adds(name, wl, tiles.k_slices, {"M": tiles.block_m, "N": tiles.block_n})
    sliced = tiles.k_slices > 1
    padded = pad_to_tiles(sch, wl, (tiles.block_m, tiles.block_n, tiles.tile_k))
    C = (_slice_k(sch, wl, tiles.k_slices, tiles.tile_k, tiles.atomic_sum) if sliced
         else sch.get_sblock(wl.reduction_block))
    # Step 1. v4's tiling, with the K step split again into fragment-wide slices, and a thread's
    # column groups a row of threads apart (B's vectors are read without bank conflicts).
    tx, (ko, k_step, *_) = _tile_for_registers(
        sch, wl, C, name, threads, thread_m, thread_n, k_split, group_n=group, group_m=group_m)
    # The register tile goes out in 16-byte float32 vectors (K slices' partials: never cast), or
    # is added into C atomically.
    if tiles.atomic_sum:  # k_slices > 1 here: _require_atomic_adds refused the rest
        _add_partials_atomically(sch, wl, C, tx, tiles.overlap_zeroing)
    else:
        c_vector = widest_vector(min(group, 4), wl.dims["N"])
        write_back_at(sch, wl, tx, C if sliced else None, c_vector)
    # Step 2. Shared tiles filled with global vectors (16-byte ones on aligned shapes), rows
    # padded against bank conflicts; or transposed, element by element.
    for operand, transposed in ((0, tiles.transposed), (1, transposed_b)):
        if transposed:
            transposed_fetch(sch, C, operand, ko, threads)
        else:
            cooperative_fetch(sch, C, operand, ko, threads, global_vector, "shared.dyn",
                              pad_to=vector)
    if padded:
        inline_padding(sch, wl)
    # Step 3. Register fragments read from shared memory as 16-byte vectors (A along K, or along
    # M when transposed; B along N in nn or transposed, along K in nt as A's), the K steps of a
    # tile unrolled so that the next fragments load during this step's FMAs.
    widths = (group_m if tiles.transposed else vector, vector if b_along_k else group)
    for operand, width in enumerate(widths):
        fragment = sch.cache_read(C, operand, "local")
        sch.compute_at(fragment, k_step)
        if width > 1:  # (a fragment of one element has no loop of its own)
            _, lanes = sch.split(sch.get_loops(fragment)[-1], [None, width])
            sch.vectorize(lanes)
    sch.unroll(k_step)
    # The fragments of K step s + fragment_stages - 1 load during step s.
    software_pipeline(sch, k_step, tiles.fragment_stages)
    sch.decompose_reduction(C, ko)
    # Step 4. Multi-buffering: load tile k + stages - 1 (asynchronously) while tile k is multiplied.
    # A pipelined fragment loop is three statements by then: prologue, body, epilogue.
    software_pipeline(sch, ko, tiles.stages, 3 if tiles.fragment_stages > 1 else 1,
                      async_loads=True, single_barrier=tiles.single_barrier)


V5_SPACE = {**TILES, "thread_m": [4, 8], "thread_n": [4, 8], "tile_k": [16, 32]}


@schedule("gemm", "v5", space=V5_SPACE, heuristic=heuristics.register_tiles)
def v5(sch: Schedule, wl: Workload, block_m: int = 64, block_n: int = 64, thread_m: int = 8,
       thread_n: int = 4, tile_k: int = 32) -> None:
    """v4 + 16-byte vectors: global tiles come into shared memory as 16-byte vectors (on
    ragged rows, the widest vectors the rows are made of, down to single elements), shared rows
    are padded so that those vectors are read without bank conflicts, each thread reads its A
    and B fragments as 16-byte vectors (its columns in 16-byte groups a row of threads apart:
    virtual threads), the K steps of a tile are unrolled, and C goes out in 16-byte vectors.

    IR: vectorized (Ramp) global->shared copies into shared.dyn rows padded by storage_align;
    A_local and B_local fragments filled by vectorized loops; vthread.x/y; an unrolled K step
    loop; still two __syncthreads per K tile and no cp.async."""
    _schedule_register_tiles(sch, wl, "v5", RegisterTiles(
        block_m=block_m, block_n=block_n, thread_m=thread_m, thread_n=thread_n, tile_k=tile_k))


V5P_SPACE = {**V5_SPACE, "stages": [1, 2, 3]}


@schedule("gemm", "v5p", space=V5P_SPACE, heuristic=heuristics.register_tiles)
def v5p(sch: Schedule, wl: Workload, *, block_m: int = 64, block_n: int = 64, thread_m: int = 8,
        thread_n: int = 4, tile_k: int = 32, stages: int = 2, single_barrier: bool = True) -> None:
    """v5 + a cp.async pipeline: the next stages - 1 K tiles load asynchronously, into shared
    buffers of their own, while this one is multiplied. With single_barrier, each K tile starts
    with one __syncthreads instead of two, in CUTLASS's order: wait for this tile, sync, then
    issue the next tile's loads (tuning/lowering.py).

    IR: `stages` shared buffers per operand, ptx_cp_async / commit_group / wait_group in the K
    loop (software_pipeline annotations); with single_barrier, one tvm_storage_sync in the K
    loop, after its wait."""
    _schedule_register_tiles(sch, wl, "v5p", RegisterTiles(
        block_m=block_m, block_n=block_n, thread_m=thread_m, thread_n=thread_n, tile_k=tile_k,
        stages=stages, single_barrier=single_barrier))


V5K_SPACE = {**V5P_SPACE, "k_slices": [1, 2, 4, 8], "atomic_sum": [False, True]}


@schedule("gemm", "v5k", space=V5K_SPACE, heuristic=heuristics.split_k)
def v5k(sch: Schedule, wl: Workload, *, block_m: int = 64, block_n: int = 64, thread_m: int = 8,
        thread_n: int = 4, tile_k: int = 32, stages: int = 2, single_barrier: bool = True,
        k_slices: int = 4, atomic_sum: bool = False, overlap_zeroing: bool = True) -> None:
    """v5p + split K: k_slices blocks (blockIdx.z) share each C tile, each over 1/k_slices of
    K, which gives a small C with a long K more blocks than the GPU has SMs. A second kernel
    sums their float32 partials; with atomic_sum, each block adds its partials into a zeroed C
    with `red.global.add` instead (sm_90 and later, float32 C), and with overlap_zeroing as
    well its K loop runs while C is zeroed, the zeroing kernel and the main kernel overlapping
    (programmatic dependent launch).

    IR: a C_rf buffer with the slice axis on blockIdx.z, and a second kernel that sums it; with
    atomic_sum, C_rf in `local`, a kernel that zeroes C first and T.ptx.red calls; with
    overlap_zeroing, T.ptx.griddepcontrol "launch_dependents" before the zeroes and "wait"
    before each add."""
    _schedule_register_tiles(sch, wl, "v5k", RegisterTiles(
        block_m=block_m, block_n=block_n, thread_m=thread_m, thread_n=thread_n, tile_k=tile_k,
        stages=stages, single_barrier=single_barrier, k_slices=k_slices, atomic_sum=atomic_sum,
        overlap_zeroing=overlap_zeroing))


# v5t's settings where C has a 128x128 tile for every SM. Square: those of cuBLAS's float32
# kernel on the H100 there (sm80_xmma_gemm_f32f32_..._tilesize128x128x8_stage3_warpsize2x2x1,
# notebook/logs/h200x4-cublas-kernels-wide-fp32-2026-11-27.log): 128 threads of 8x16 sums, K
# tiles of 8 in 3 stages (one barrier a K tile; `v5t_square` says where two). Narrow: the same
# 128 threads over half the columns, 8x8 sums each.
V5T_SQUARE = {"block_m": 128, "block_n": 128, "thread_m": 8, "thread_n": 16, "tile_k": 8,
              "stages": 3, "single_barrier": True}
V5T_NARROW = {**V5T_SQUARE, "block_n": 64, "thread_n": 8}
V5T_SQUARE_BLOCKS_PER_SM = 2  # square tiles' blocks an SM holds at once (205 registers each)
V5T_FULL_LAST_WAVE = 0.9  # the least share of their last wave's places the square tiles fill


def v5t_square_tiles_fill(wl: Workload, sms: int) -> bool:
    """Whether C's square (V5T_SQUARE) tiles give every SM one."""
    return heuristics.tile_count(wl, V5T_SQUARE["block_m"], V5T_SQUARE["block_n"]) >= sms


def v5t_square(wl: Workload) -> dict:
    """V5T_SQUARE as v5t runs it for `wl`: in nt (both operands' tiles transposed) with two
    barriers a K tile, which was faster there and slower in nn on an H200
    (notebook/logs/h200-ab-fp32-v5t-barriers-stages-2026-11-28.log)."""
    return {**V5T_SQUARE, "single_barrier": wl.layout != "nt"}


def v5t_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v5t: where C's square tiles give every SM one, those (`v5t_square`), unless they fill
    less than V5T_FULL_LAST_WAVE of their last wave's places (V5T_SQUARE_BLOCKS_PER_SM an SM):
    then V5T_NARROW, whose smaller blocks leave a shorter tail. Where C has fewer tiles, the
    signature's tiles with K split (`heuristics.split_k`)."""
    if not v5t_square_tiles_fill(wl, sms):
        return heuristics.split_k(wl, sms, knobs, space)
    tiles = heuristics.tile_count(wl, V5T_SQUARE["block_m"], V5T_SQUARE["block_n"])
    places = sms * V5T_SQUARE_BLOCKS_PER_SM
    last_wave_fill = tiles / (-(-tiles // places) * places)
    return v5t_square(wl) if last_wave_fill >= V5T_FULL_LAST_WAVE else dict(V5T_NARROW)


@schedule("gemm", "v5t", space={"block_m": [64, 128, 256], "block_n": [64, 128, 256],
                                "thread_m": [8, 16], "thread_n": [8, 16], "tile_k": [8, 16, 32],
                                "stages": [2, 3], "single_barrier": [True, False],
                                "k_slices": [1, 4, 8], "fragment_stages": [1, 2]},
          heuristic=v5t_tiles)
def v5t(sch: Schedule, wl: Workload, *, block_m: int = 128, block_n: int = 256, thread_m: int = 8,
        thread_n: int = 16, tile_k: int = 32, stages: int = 2, single_barrier: bool = True,
        k_slices: int = 1, atomic_sum: bool = False, overlap_zeroing: bool = True,
        fragment_stages: int = 2) -> None:
    """v5k + A's shared tile transposed and double-buffered fragments, as CUTLASS's SIMT
    kernels do: A's tile is stored M-contiguous ([k, m], filled by 4-byte cp.async), so a
    thread reads its rows of one K step as 16-byte vectors, like B's columns (in nt, whose rows
    of B run along K too, B's tile is stored N-contiguous the same way). A fragment is then
    thread_m + thread_n registers per K step instead of v5's 4 K steps at once, which leaves
    room for 128 outputs per thread (8x16: half the shared loads per FMA of v5's 8x4), and the
    K step loop is pipelined: step s + 1's fragments load during step s's FMAs (with
    fragment_stages=2). float32 only: cp.async copies no less than 4 bytes.

    IR: A_shared allocated [tile_k, block_m + 4] and written A_shared[k, m]; 4-byte
    ptx_cp_async for A (and B in nt), 16-byte for B in nn; a software pipeline on the K step
    loop too."""
    if wl.dtype != "float32":
        raise ScheduleNotApplicable(f"v5t copies A element by element with cp.async, which moves "
                                    f"4 bytes at least: float32 only, not {wl.dtype}")
    _schedule_register_tiles(sch, wl, "v5t", RegisterTiles(
        block_m=block_m, block_n=block_n, thread_m=thread_m, thread_n=thread_n, tile_k=tile_k,
        stages=stages, single_barrier=single_barrier, k_slices=k_slices, atomic_sum=atomic_sum,
        overlap_zeroing=overlap_zeroing, transposed=True, fragment_stages=fragment_stages))
