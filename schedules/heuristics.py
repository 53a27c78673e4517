"""Shape-aware default knobs: the rule by which each tunable rung picks its knobs for a shape.

A heuristic is registered with its rung (`@schedule(..., heuristic=heuristics.split_k)`) and
called as `heuristic(wl, sms, knobs, space) -> dict`: `knobs` are the rung's signature defaults
with the knobs the user set over them, `space` its declared knob space with each knob the user
set narrowed to that one value (so that what it picks fits what the user set: v5k's K split
is counted on the user's block_m). It returns the knobs it picks for `wl`, only ever knobs of
the space, so a template search's configurations (every knob of the space) are never changed
by it. `ScheduleEntry.defaults_for(wl)` puts it together: the user's knobs, then the
heuristic's picks, then the signature's defaults.

`sms` is the number of SMs that the output tiles are counted against. TVM 0.27's CUDA target
declares none (`target.ListTargetKindOptionsFromName("cuda")` has no such option), so the rungs
are given the H100's (H100_SMS), the GPU this project measures on.

On the workloads that the committed reports' rungs were measured on with the signature's
defaults (MEASURED), those defaults stand: a rerun there measures the kernels the committed rows
name.
"""

from __future__ import annotations

from .workloads import DTYPE_BYTES, PRESETS, Workload

H100_SMS = 132  # streaming multiprocessors of an H100 SXM (80 GB HBM3)
H100_L2_BYTES = 50 * 1024 * 1024  # its L2 cache
WAVES = 2  # blocks of a K-split GEMM: at most two waves of the SMs
MIN_SLICE_TILES = 4  # K tiles each K slice keeps at least: a shorter slice is mostly prologue
WARP = 32  # threads of a warp: multirow's most K threads

# The ladder reports' GEMMs (reports/h100-gemm-ladder.md) besides the seeds' presets.
MEASURED = ({(wl.op, wl.shape) for wl in PRESETS.values()}
            | {("gemm", (4096, 4096, 4096)), ("gemm", (128, 128, 128))})


def measured(wl: Workload) -> bool:
    """Whether `wl` has the shape of a committed report's rows: there the defaults stand."""
    return (wl.op, wl.shape) in MEASURED


def tile_count(wl: Workload, block_m: int, block_n: int) -> int:
    """Block tiles of C (M x N), the edge tiles counted whole."""
    return -(-wl.dims["M"] // block_m) * -(-wl.dims["N"] // block_n)


def fit_tile(wl: Workload, sms: int, default: tuple[int, int],
             options: list[tuple[int, int]]) -> tuple[int, int]:
    """The tile rule. `default` (block_m, block_n) where its tiles of C give every SM one; else,
    of the smaller `options`, the one with the fewest tiles that still do (the most reuse), or,
    where none does, the one with the most; on a tie, the smaller tile (less of it past C's
    edges), then the wider along N (C's contiguous axis)."""
    if tile_count(wl, *default) >= sms:
        return default

    def rank(tile: tuple[int, int]) -> tuple:
        count = tile_count(wl, *tile)
        return count < sms, count if count >= sms else -count, tile[0] * tile[1], -tile[1]

    return min(options, key=rank)


def _register_tile_options(knobs: dict, space: dict) -> list[tuple[int, int]]:
    """The space's block tiles no larger than the default on either side that keep at least
    half its threads (thread_m x thread_n outputs each): fewer warps leave an SM idle."""

    def threads(m: int, n: int) -> int:
        return (m // knobs["thread_m"]) * (n // knobs["thread_n"])

    most = threads(knobs["block_m"], knobs["block_n"])
    return [(m, n) for m in space["block_m"] for n in space["block_n"]
            if m <= knobs["block_m"] and n <= knobs["block_n"] and 2 * threads(m, n) >= most]


def register_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v5, v5p: the tile rule (`fit_tile`) over the space's block tiles that keep at least half
    the default tile's threads."""
    default = (knobs["block_m"], knobs["block_n"])
    block_m, block_n = fit_tile(wl, sms, default, _register_tile_options(knobs, space))
    return {"block_m": block_m, "block_n": block_n}


def split_k(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v5k, v5t: where the default tile's tiles cannot give every SM one, first the tile rule
    (`register_tiles`), then K split into the most slices of the space that keep the blocks
    (tiles x slices) within WAVES waves, each slice at least MIN_SLICE_TILES K tiles long; at
    least 1 slice, or 2 with atomic_sum (it adds the slices' partials). Where they can, the
    defaults."""
    if tile_count(wl, knobs["block_m"], knobs["block_n"]) >= sms:
        return {}
    tile = register_tiles(wl, sms, knobs, space)
    tiles = tile_count(wl, tile["block_m"], tile["block_n"])
    k_tiles = -(-wl.dims["K"] // knobs["tile_k"])
    fewest = 2 if knobs["atomic_sum"] else 1
    fitting = [s for s in space["k_slices"]
               if s >= fewest and tiles * s <= WAVES * sms and k_tiles >= s * MIN_SLICE_TILES]
    return {**tile, "k_slices": max(fitting, default=fewest)}


def warp_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v6: the tile rule over the space's warp tiles (warp_tiles_m x warp_tiles_n tiles of
    16x16 per warp), the warps as they are."""
    from .tensorcore import MMA  # the module that registers v6: loaded by now

    def tile(tiles_m: int, tiles_n: int) -> tuple[int, int]:
        return knobs["warps_m"] * tiles_m * MMA, knobs["warps_n"] * tiles_n * MMA

    options = [tile(m, n) for m in space["warp_tiles_m"] for n in space["warp_tiles_n"]
               if m <= knobs["warp_tiles_m"] and n <= knobs["warp_tiles_n"]]
    block_m, block_n = fit_tile(wl, sms, tile(knobs["warp_tiles_m"], knobs["warp_tiles_n"]),
                                options)
    return {"warp_tiles_m": block_m // (knobs["warps_m"] * MMA),
            "warp_tiles_n": block_n // (knobs["warps_n"] * MMA)}


def wgmma_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v7: block_m 64 where M <= 64 (decode batches: one wgmma's M is 64, a taller tile would be
    padding); block_n 128 where 256-column tiles cannot give every SM one (each where the space
    holds that value); stages 4 unless four stages of shared tiles would not fit a Hopper block
    (then 3); blocks along M where B outgrows L2 (b_outgrows_l2)."""
    from .tensorcore import HOPPER_SHARED_BYTES, MMA, WARPGROUP  # v7's module: loaded by now

    wgmma_m = WARPGROUP * MMA
    short = wl.dims["M"] <= wgmma_m and wgmma_m in space["block_m"]
    block_m = wgmma_m if short else knobs["block_m"]
    few = tile_count(wl, block_m, knobs["block_n"]) < sms and 128 in space["block_n"]
    block_n = 128 if few else knobs["block_n"]
    stage_bytes = (block_m + block_n) * knobs["chunk_k"] * DTYPE_BYTES[wl.dtype]
    return {"block_m": block_m, "block_n": block_n,
            "stages": 4 if 4 * stage_bytes <= HOPPER_SHARED_BYTES else 3,
            "m_tiles_first": b_outgrows_l2(wl)}


def b_outgrows_l2(wl: Workload) -> bool:
    """Whether B is larger than L2 and A is smaller than B: then blocks launched along M
    (v7's m_tiles_first) read each B tile from DRAM once and re-read A from L2, where blocks
    along N would stream all of B again for every row of tiles (4096x28672x4096 bf16: 2.8 ms
    against cuBLAS's 1.3 ms, with 32 passes over a 235 MB B)."""
    a_bytes, b_bytes = (wl.dims[axis] * wl.dims["K"] * DTYPE_BYTES[wl.dtype] for axis in "MN")
    return b_bytes > H100_L2_BYTES and a_bytes < b_bytes


def k_threads(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """multirow: as many K threads as have a tile_k slice of K each (one 16-byte vector by
    default), rounded up to a power of two, at most a warp. Short K thus gets fewer K threads,
    and a warp then holds 32 / reduce_threads rows' threads, rows_per_thread rows each: more
    rows per warp. K of a warp's step or more (256 halves, 128 floats): the defaults."""
    from .gemv import vector_width  # the module that registers multirow: loaded by now

    tile_k = knobs["tile_k"] or vector_width(wl)
    slices = -(-wl.dims["K"] // tile_k)
    return {"reduce_threads": min(WARP, 1 << (slices - 1).bit_length())}
