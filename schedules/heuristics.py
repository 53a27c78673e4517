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
TMA_NARROW_COST = 0.57  # v8: a wave of 128-wide tiles against one of 256-wide (1.0): 1.14 / 2
TMA_TIE = 0.05  # v8 keeps its default width unless 128-wide tiles cost this much less
TALL_M = 256  # v8's rows of a tile where they cost no more than 128-row ones (`tma_tiles`)
TALL_TIE = 0.02  # ... or this much more: a larger tile does more per byte it loads
FEW_UNITS = 2 / 3  # v8's 64-row tiles: below this share of the SMs with a unit, try wider ones
DECODE_WIDTHS = (128, 160, 192)  # ... the widths whose halves are whole 16-column pieces (nt)
CLUSTER_WAVES = 8  # v8: 128x256 tiles in clusters of 2 where they take this many waves or more
TMA_STORE_STAGES = {2: 3, 1: 4}  # v8's tma_store: where its boxes leave room for so many
# stages, by the bytes of an input element (fp8 lost a stage's worth: see `tma_tiles`)

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


def tma_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v8, measured on an H100 (reports/logs/h100-v8-tiles-2026-11-23.log):
    - block_m 64 where M <= 64 (decode batches: a taller tile would be zeros), and where
      M <= 128 and 128x128 tiles cannot give every SM one (128x4096x4096: 88% of cuBLAS with
      64x128 tiles in 2 K slices, 80% with 128x128 in 4);
    - block_n 128 with 64-row tiles; else 128 rather than the default 256 where its waves of
      tiles (`plan`, split K counted) take less time, by TMA_TIE at least, counting a wave of
      128-wide tiles as 0.57 of a 256-wide one (TMA_NARROW_COST: a 128-wide wgmma does less
      per byte it reads; measured 1.14x for 256 tiles of 128x128 against 128 of 128x256).
      Unsplit, 1000x4608x3584 ran 144 tiles of 128x256 in 2 waves at 60% of cuBLAS, 288 of
      128x128 in 3 at 72%; 1000x4096x4096 128 of 128x256 in one wave at 97%, 256 of 128x128
      at 86%.
    - 16-bit inputs, nt: 64-row tiles wider than 128 columns where 128-wide ones, split as
      below, give fewer than FEW_UNITS of the SMs a unit: the width of DECODE_WIDTHS whose
      tiles, split so, give the most SMs one (the narrowest of equals). 128x4608x3584
      bf16 ran 72 tiles of 64x128 unsplit at 80.8% of cuBLAS, 58 of 64x160 in 2 K slices
      (116 units) at 84.0%; where 128-wide tiles already fill 96 SMs or more, wider ones in
      more slices were no faster (128x6144x4096: 93.7% against 90.5% with 64x192 in 2 slices),
      and fp8 lost (128x4608x3584: 89.4% -> 82.2%)
      (reports/logs/h100-v8-decode-widths-2026-11-24.log);
    - 256-row tiles (nt) where the 128-row tiles take more than a wave and 256-row ones cost
      no more (TALL_TIE): block_n from 144 to 192 (a multiple of 16; 192 keeps the
      accumulators within a thread's registers; 256x128 is no larger than 128x256),
      unsplit, costed as their rounds of tiles (tiles / sms, rounded up) times their area,
      against the 128-row plan's waves (`plan`, in waves of 128x256 tiles). A split last
      wave costs more than its share, and a larger tile does more per byte: 1000x4608x3584
      took 0.068 ms with 128x256 tiles and the last 12 in 8 K slices (1.125 waves by
      `plan`), 0.052 ms (96.9% of cuBLAS, which runs 256x144 tiles) with one wave of 256x144
      (reports/logs/h100-v8-tile-widths-2026-11-24.log);
      4096x6144x4096 went from 92.0% to 100.6% with 256x192 tiles (4 rounds, against 6 of
      128x256: the same area), 4096x28672x4096 from 95.5% to 99.6% with 256x160 (1.2% more
      area by the count), while 4096^3 lost 3 points with 256x192 (12% more area)
      (reports/logs/h100-v8-tall-tiles-4096-2026-11-24.log);
    - tma_store (C out through shared boxes by TMA, overlapped with the next tile) where a
      CTA walks more than one unit, C's rows are whole 16-byte multiples, the boxes' rows
      are 128 bytes and the boxes fit beside TMA_STORE_STAGES stages (else the register
      stores: a CTA's one unit leaves nothing to overlap, narrower boxes take more barriers
      and stores per tile). Measured in interleaved rounds against cuBLAS
      (reports/logs/h100-v8-tma-store-2026-11-24.log): 4096^3 with float32 C 94-96% -> 97-98%,
      8192^3 fp16 nn 95.7% -> 97.8%, fp8 4096^3 102.2% -> 105.5%; 16-bit C at 4096^3 level;
      16-bit 256-row tiles whose boxes leave 3 stages of 4: 128-byte boxes level or better
      (4096x6144x4096 256x192 99.2% -> 101.3%, 4096x28672x4096 256x160 97.2% -> 99.3%),
      256x144's 64- and 32-byte ones lost (4096x4608x3584 94.6% -> 90.8% with float32 C,
      98.6% -> 92.1% with bf16 C; 8192^3 level); fp8 lost a stage's worth (8192^3 256x144
      104.4% -> 101.4%); decode batches, one unit per SM, lost 1.5-3 points
      (128x4096x4096 89.0% -> 87.5%);
    - the most stages of the space whose ring (and tma_store's boxes) fits a Hopper block's
      shared memory;
    - K split into the most slices of the space that keep the units within one wave of the
      SMs (v8 is persistent: a second wave would walk behind the first): every tile's K where
      the tiles fit one wave, else (split_tail) the K of the tiles of the last, partial wave,
      so the SMs it would leave idle share them.
    - 128x256 tiles in clusters of 2 along M (cluster_m: B's box shared by TMA multicast,
      cuBLAS's clusters) where those tiles take CLUSTER_WAVES waves of the SMs or more, in
      place of the 256-row ones: in interleaved rounds against cuBLAS
      (reports/logs/h100-v8-cluster-m-many-waves-2026-11-24.log) 8192^3 fp16 nn 97.8% ->
      100.9%, bf16 nt 98.1% -> 101.3%, fp16 nt with fp16 C 99.3% -> 100.3%, 4096x37888x3584
      bf16 96.9% -> 101.3%, 4096x28672x4096 98.7% -> 99.4%, fp8 8192^3 104.7% -> 105.2%; at
      4096^3 (3.9 waves) clusters were level, 2 points either way (reports/h100-v8.md,
      "Clusters of two CTAs"), and cluster_n lost everywhere: no clusters there. Where the
      user asks for a cluster, K is not split (clusters take whole tiles).
    - pingpong (each consumer a whole tile, in turns) only where the user or a search asks for
      it, and then whole tiles (no split K), neither clusters nor tall tiles of its own, the widest
      block_n whose tile fits one consumer's accumulators: 128x192 ran at 91-105% of cuBLAS
      where 128x128 ran at 78-95%, and neither beat the default two consumers on one tile on
      any of seven workloads (reports/logs/h100-v8-pingpong-2026-11-25.log).
    Each knob only where the space holds the value. Nothing for a workload that v8 refuses
    whatever its knobs (`tma_refusal`: float32 inputs, rows TMA cannot load): the rung's
    refusal says why, and the rules above count bytes of v8's dtypes only."""
    from .hopper import (MOST_ACCUMULATORS, ROW_BYTES, arena_bytes,  # v8's: loaded by now
                         box_bytes, c_rows_take_tma, consumer_accumulators, k_block_count,
                         tma_refusal, widest_fitting)
    from .tensorcore import HOPPER_SHARED_BYTES, MMA, WARPGROUP

    if tma_refusal(wl):
        return {}
    if 1 not in space["cluster_m"] or 1 not in space["cluster_n"]:  # clusters: whole tiles
        space = {**space, "split_k": [1], "split_tail": [False]}
    pingpong = False not in space["pingpong"]  # only where asked for: it measured no faster
    if pingpong:  # whole tiles
        space = {**space, "split_k": [1], "split_tail": [False]}
    wgmma_m = WARPGROUP * MMA
    decode = wl.dims["M"] <= wgmma_m or (wl.dims["M"] <= 2 * wgmma_m
                                         and tile_count(wl, 2 * wgmma_m, 128) < sms)
    block_m = wgmma_m if decode and wgmma_m in space["block_m"] else knobs["block_m"]

    k_blocks = k_block_count(wl.dims["K"], DTYPE_BYTES[wl.dtype])

    def plan(block_n: int) -> tuple[float, int, bool]:
        """(waves of block_m x block_n tiles, split_k, split_tail): K split while the units
        stay within one wave (each slice at least MIN_SLICE_TILES K blocks); where the tiles
        take more than a wave, only those of a last, partial wave, counted as 1/split_k of a
        wave. Waves of 128-wide tiles count TMA_NARROW_COST of a 256-wide one."""
        tiles = tile_count(wl, block_m, block_n)
        full, tail = divmod(tiles, sms) if tiles > sms else (0, tiles)
        slices = max([s for s in space["split_k"]
                      if tail * s <= sms and k_blocks >= s * MIN_SLICE_TILES], default=1) \
            if tail else 1
        waves = full + (1 / slices if tail else 0)
        return (waves * (TMA_NARROW_COST if block_n == 128 else 1), slices,
                bool(full) and slices > 1)

    narrow = 128 in space["block_n"] and (
        block_m == wgmma_m or plan(128)[0] < (1 - TMA_TIE) * plan(knobs["block_n"])[0])
    block_n = 128 if narrow else knobs["block_n"]

    def units(n: int) -> int:
        """The plan's units of work with block_n n: its tiles, times its K slices where the
        tiles fit a wave."""
        tiles = tile_count(wl, block_m, n)
        return tiles if tiles > sms else tiles * plan(n)[1]

    if block_m == wgmma_m and wl.layout == "nt" and DTYPE_BYTES[wl.dtype] == 2 \
            and units(block_n) < FEW_UNITS * sms:
        widths = [n for n in DECODE_WIDTHS if n in space["block_n"]] or [block_n]
        block_n = max(widths, key=lambda n: (min(units(n), sms), -n))
    waves, split_k, split_tail = plan(block_n)

    def tall_tiles() -> int | None:
        """The block_n (144 to 192, a multiple of 16) whose TALL_M-row tiles, unsplit, cost
        least: their rounds (tiles / sms, rounded up) times their area, in waves of 128x256
        tiles; the narrowest of the cheapest, where that is within TALL_TIE of the plan's
        `waves`."""
        if decode or wl.layout != "nt" or TALL_M not in space["block_m"] \
                or tile_count(wl, block_m, block_n) <= sms:
            return None
        cost = {n: -(-tile_count(wl, TALL_M, n) // sms) * TALL_M * n / (128 * 256)
                for n in space["block_n"] if n % 16 == 0 and n > 128
                and consumer_accumulators(TALL_M, n) <= MOST_ACCUMULATORS}
        cheapest = min(cost.values(), default=None)
        if cheapest is None or cheapest > (1 + TALL_TIE) * waves:
            return None
        return min(n for n, c in cost.items() if c == cheapest)

    clustered = (not decode and not pingpong and tile_count(wl, 128, 256) >= CLUSTER_WAVES * sms
                 and 2 in space["cluster_m"] and 128 in space["block_m"]
                 and 256 in space["block_n"] and 1 in space["split_k"])
    if clustered:
        block_m, block_n, split_k, split_tail = 128, 256, 1, False
    elif pingpong:  # the widest whole tile one consumer holds (nn: whole 64-column boxes)
        block_n = widest_fitting(block_m, wl.layout, True, space["block_n"]) or knobs["block_n"]
    elif tall := tall_tiles():
        block_m, block_n, split_k, split_tail = TALL_M, tall, 1, False

    def fitting(boxes: bool) -> list[int]:
        return [s for s in space["stages"]
                if arena_bytes(block_m, block_n, s, boxes) <= HOPPER_SHARED_BYTES]

    tma_store = (True in space["tma_store"] and tile_count(wl, block_m, block_n) > sms
                 and c_rows_take_tma(wl)
                 and box_bytes(block_m, block_n, wl.out_dtype, pingpong) == ROW_BYTES
                 and max(fitting(True), default=0) >= TMA_STORE_STAGES[DTYPE_BYTES[wl.dtype]]) \
        or False not in space["tma_store"]
    return {"block_m": block_m, "block_n": block_n,
            "stages": max(fitting(tma_store), default=knobs["stages"]),
            "tma_store": tma_store,
            "split_k": split_k if split_k in space["split_k"] else knobs["split_k"],
            "split_tail": split_tail if split_tail in space["split_tail"] else knobs["split_tail"],
            **({"cluster_m": 2} if clustered else {})}


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
