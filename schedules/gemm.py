"""The GEMM ladder, one schedule per rung, in ladder order.

naive..v3 are the seed blog's schedules (`../shared/seeds/gemm-tvm-blog-naive-to-v3.md`)
rewritten for TensorIR with the seed's tile sizes as defaults: the same launch dimensions, the
same shared tiles and the same K split. Loop names follow the seed: i/x is the row axis (M),
j/y the column axis (N), k the reduction. Shapes that are not multiples of a tile get
predicated tails from `split`.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .common import cast_epilogue_at, require_grid_y
from .registry import schedule
from .workloads import Workload


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


@schedule("gemm", "v1")
def v1(sch: Schedule, wl: Workload, threads: int = 32) -> None:
    """Tiling + 1D threads: `threads` consecutive rows of a column share one block.

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


@schedule("gemm", "v2")
def v2(sch: Schedule, wl: Workload, tile_x: int = 32, tile_y: int = 32) -> None:
    """Tiling + 2D threads: a tile_x x tile_y tile of C per block, one thread per element.

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


@schedule("gemm", "v3")
def v3(sch: Schedule, wl: Workload, tile_x: int = 16, tile_y: int = 16, tile_k: int = 8) -> None:
    """v2 + shared memory: per K tile, the block stages A and B tiles in shared memory,
    loaded cooperatively by all its threads.

    IR: shared A (tile_x*tile_k) and B (tile_k*tile_y) buffers, K split into K/tile_k outer
    steps with __syncthreads around each load."""
    require_grid_y("v3", "N/tile_y", -(-wl.dims["N"] // tile_y))
    C = sch.get_sblock(wl.reduction_block)
    x, y, k = sch.get_loops(C)
    # Step 1. v2's 2D tiling and thread binding, plus the K split.
    xo, xi = sch.split(x, [None, tile_x])
    yo, yi = sch.split(y, [None, tile_y])
    ko, ki = sch.split(k, [None, tile_k])
    sch.reorder(xo, yo, xi, yi, ko, ki)
    sch.bind(xo, "blockIdx.x")
    sch.bind(yo, "blockIdx.y")
    sch.bind(xi, "threadIdx.x")
    sch.bind(yi, "threadIdx.y")
    # Step 2. Stage the A and B tiles of each K step in shared memory.
    for operand in (0, 1):
        tile = sch.cache_read(C, operand, "shared")
        sch.compute_at(tile, ko)
        # Step 3. Every thread of the block loads part of the tile (the seed's nparts split).
        rows, cols = sch.get_loops(tile)[-2:]
        tx, _ = sch.split(rows, [tile_x, None])
        ty, _ = sch.split(cols, [tile_y, None])
        sch.bind(tx, "threadIdx.x")
        sch.bind(ty, "threadIdx.y")
    cast_epilogue_at(sch, wl, yi)
    sch.decompose_reduction(C, ko)
