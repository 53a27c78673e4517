"""Shape-aware default knobs: the rule by which each tunable rung picks its knobs for a shape.

A heuristic is registered with its rung (`@schedule(..., heuristic=heuristics.split_k)`) and
called as `heuristic(wl, sms, knobs, space) -> dict`: `knobs` are the rung's signature defaults
with the knobs the user set over them, `space` its declared knob space with each knob the user
set narrowed to that one value (so that what it picks fits what the user set: v5k's K split
is counted on the user's block_m). It returns the knobs it picks for `wl`, only ever knobs of
the space, so a template search's configurations (every knob of the space) are never changed
by it. `ScheduleEntry.defaults_for(wl)` puts it together: the user's knobs, then the
heuristic's picks, then the signature's defaults.

This module holds the tile arithmetic that several rungs share and imports no rung; a rule that
needs its rung's own constants lives with its rung (v5t's in gemm.py, v6's and v7's in
tensorcore.py, multirow's in gemv.py, v8's in v8/heuristic.py).

`sms` is the number of SMs that the output tiles are counted against. TVM 0.27's CUDA target
declares none (`target.ListTargetKindOptionsFromName("cuda")` has no such option), so the rungs
are given the H100's (H100_SMS), the GPU this project measures on.

On the workloads that the committed reports' rungs were measured on with the signature's
defaults (MEASURED), those defaults stand: a rerun there measures the kernels the committed rows
name. fp8 is not among them: its default became v8's promoted sums (v8/heuristic.py) after
those rows, and the precision a user gets by default does not depend on the shape.
"""

from __future__ import annotations

from .workloads import DTYPE_BYTES, FP8, PRESETS, Workload

H100_SMS = 132  # streaming multiprocessors of an H100 SXM (80 GB HBM3)
H100_L2_BYTES = 50 * 1024 * 1024  # its L2 cache
MIN_SLICE_TILES = 4  # K tiles each K slice keeps at least: a shorter slice is mostly prologue
SPLIT_SLICE_TILES = 3  # v5k, v5t: K tiles (of tile_k) each K slice keeps at least
WARP = 32  # threads of a warp: multirow's most K threads

# The ladder reports' GEMMs (reports/h100-gemm-ladder.md) besides the seeds' presets.
MEASURED = ({(wl.op, wl.shape) for wl in PRESETS.values()}
            | {("gemm", (4096, 4096, 4096)), ("gemm", (128, 128, 128))})


def measured(wl: Workload) -> bool:
    """Whether `wl` has the shape of a committed report's rows (fp8 aside): there the defaults
    stand."""
    return (wl.op, wl.shape) in MEASURED and wl.dtype != FP8


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


def padded_work(wl: Workload, block_m: int, block_n: int) -> int:
    """Outputs that a tiling of C computes, those past C's edges included."""
    return tile_count(wl, block_m, block_n) * block_m * block_n


def split_k(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v5k, v5t: where the default tile's tiles cannot give every SM one, the tile and K split
    together. K in the most slices of the space whose float32 partials (slices x M x N) fit half
    the L2, for the sum to read them from there, each slice at least SPLIT_SLICE_TILES K tiles
    long (at least 1 slice, or 2 with atomic_sum: it adds the slices' partials): an SM holds
    several of these small blocks at once, so more blocks than SMs cost little. Then, of the
    space's tiles that keep at least half the default's threads and pad C least (a few rows of
    M in a 64-row tile are mostly wasted work), the largest whose blocks (tiles x slices) give
    every SM one (the most reuse; on a tie, the wider along N), or, where none does, the one
    with the most tiles. Where the default tile's tiles fill the SMs, the defaults."""
    if tile_count(wl, knobs["block_m"], knobs["block_n"]) >= sms:
        return {}
    k_tiles = -(-wl.dims["K"] // knobs["tile_k"])
    partials = wl.dims["M"] * wl.dims["N"] * DTYPE_BYTES["float32"]
    fewest = 2 if knobs["atomic_sum"] else 1
    slices = max([s for s in space["k_slices"] if s >= fewest
                  and (s == 1 or s * partials <= H100_L2_BYTES // 2)
                  and k_tiles >= s * SPLIT_SLICE_TILES], default=fewest)
    work = {tile: padded_work(wl, *tile) for tile in _register_tile_options(knobs, space)}
    least = min(work.values())
    tiles = {tile: tile_count(wl, *tile) for tile, padded in work.items() if padded == least}
    filling = [tile for tile, count in tiles.items() if count * slices >= sms]
    tile = max(filling, key=lambda t: (t[0] * t[1], t[1])) if filling else max(tiles, key=tiles.get)
    return {"block_m": tile[0], "block_n": tile[1], "k_slices": slices}
