"""v8's heuristic: the knobs it picks for a shape (registered as the rung's `heuristic`, called
as `heuristic(wl, sms, knobs, space)`; see schedules/heuristics.py for the contract). What each
rule was measured against is in reports/notes/h100-v8.md ("The heuristic's rules")."""

from __future__ import annotations

from ..errors import ScheduleNotApplicable
from ..heuristics import MIN_SLICE_TILES, tile_count
from ..tensorcore import HOPPER_SHARED_BYTES, MMA, WARPGROUP
from ..workloads import DTYPE_BYTES, FP8, Workload
from .geometry import (BLOCK_N_STEP, MOST_ACCUMULATORS, MOST_OVERLAP, MOST_SPLIT_OVERLAP,
                       ROW_BYTES, arena_bytes, box_bytes, consumer_accumulators, consumer_tile,
                       k_block_elements, staged_operands, widest_fitting, workload_k_blocks)
from .knobs import Knobs
from .refusals import (c_rows_take_tma, kernel_workload, promoted_sets, refuse, tile_refusal,
                       workload_refusal)

TMA_NARROW_COST = 0.57  # a wave of 128-wide tiles against one of 256-wide (1.0): 1.14 / 2
TMA_TIE = 0.05  # v8 keeps its default width unless 128-wide tiles cost this much less
TALL_M = 256  # v8's rows of a tile where they cost no more than 128-row ones (`tall_tiles`)
TALL_TIE = 0.02  # ... or this much more: a larger tile does more per byte it loads
FEW_UNITS = 2 / 3  # v8's 64-row tiles: below this share of the SMs with a unit, try wider ones
DECODE_WIDTHS = (128, 160, 192)  # ... the widths whose halves are whole 16-column pieces (nt)
ONE_ROW_WIDTH = 64  # a decode batch of one row of 64-row tiles: this width where it splits K
# fewer ways for as many units (reports/notes/h100-v8.md, "The heuristic's rules")
ONE_ROW_MOST_BLOCKS = 48  # ... and each of its units keeps at most this many K blocks
SWAP_ROWS = (128, 256)  # swap_ab: the tiles' rows `cut_tiles` weighs (64-row ones lost there)
SWAP_WIDEST = 256  # ... the widest column of tiles it cuts M into
SWAP_NARROWEST = 64  # ... the narrowest, where more columns than the fewest are weighed
# ... and the rows of the tiles of `split_cut_tile`, which best weighs (256-row ones, their K
# split twice as many ways for as many units, ran slower: reports/notes/h100-shapes.md,
# "Swapped tiles of the widest cut")
SPLIT_CUT_ROWS = 128
SWAP_ONE_CONSUMER_NARROWEST = 56  # `swapped_one_consumer_tile`'s narrowest cut of the tokens:
# 56 won at 200x2048x2048; 24-48 lost on each of the six shapes that sweep measured them on
# (H200, 2026-11-30, reports/notes/h100-shapes.md)
SWAP_MOST_TOKENS = 16  # swap_ab unasked where M is at most this many rows of A (decode batches)
SWAP_WEIGHED_ROWS = 512  # best weighs v8 swapped beside its default up to this many rows of A
MEDIUM_ROWS = 64  # past this many rows of A, MEDIUM_TILES are worth measuring beside the default
WAVE_ROWS = (64, 128)  # `wave_tile`: the tiles' rows it weighs
WAVE_WIDTHS = (64, 256)  # ... and their least and most columns
MEDIUM_TILES = ((64, 256), (128, 192))  # unsplit tiles that, beside the default, lifted the
# H100's wide-bf16 sweeps at M = 300-2500 most (2026-11-26; reports/notes/h100-shapes.md): a
# portfolio's (the linear layer's, `best`'s), not the rule's, which no one rule set could pick
# TILE_TIMES_US's times per K block of 128- and 256-row tiles fit 0.18 us + 1.24e-5 us per
# element of the tile (least squares): a tile's fixed cost is worth about this many elements
TILE_FIXED_ELEMENTS = 14_600
CLUSTER_WAVES = 8  # v8: 128x256 tiles in clusters of 2 where they take this many waves or more
CLUSTER_PADDING = 1.125  # ... and their rows of tiles, padded to whole pairs, this many times more
# block-scaled fp8: unsplit tiles in clusters of 2 along N (cuBLAS's block-scaled kernel's 1x2)
# where they take CLUSTER_WAVES waves or more and K has this many blocks or more
# (reports/notes/h100-v8.md, "Block scales in clusters of 2 along N")
PAIRED_K_BLOCKS = 48
# The ring's stages: an unsplit tile of one wgmma's rows takes up to LONG_RING stages (more of
# its K blocks in flight), other tiles up to SHORT_RING; a ring filling shared memory lost on
# both (reports/notes/h100-shapes.md, "Deeper rings for 64-row tiles")
LONG_RING = 8
SHORT_RING = 6
TMA_STORE_STAGES = {2: 3, 1: 4}  # tma_store: where its boxes leave room for so many stages,
# by the bytes of an input element (fp8 lost a stage's worth)
# 16-bit inputs: each tile shape's time, in microseconds on an H100, per K block of 128 bytes
# and per tile (its prologue and epilogue), fitted to unsplit tiles over the wide-bf16 suite's
# shapes at M = 48 to 2500 (reports/notes/h100-shapes.md, "Medium M"); SPLIT_US a split
# tile's extra (its partials through the workspace), the value that chose best on those runs.
TILE_TIMES_US = {(128, 128): (0.3741, 3.22), (128, 160): (0.4238, 4.63),
                 (128, 192): (0.4868, 4.32), (128, 256): (0.6320, 5.46),
                 (64, 192): (0.3959, 2.64), (64, 256): (0.3770, 3.45), (256, 192): (0.7719, 7.38)}
SPLIT_US = 10.0
TIMED_WAVES = 2  # ... the estimate picks v8's tiles where 128x256 ones take at most this many
# waves (the medium M it was fitted on), and where clusters would pad their rows of tiles
WGMMA_M = WARPGROUP * MMA  # one wgmma's rows: a decode batch's tile
PROMOTE_K = 128  # fp8: K elements between promotions of wgmma's sums into float32 (DeepGEMM's)
# fp8's promotions overlapped in runs longer than K split takes: a wave of a split plan's units
# costs this many waves of whole tiles (its runs of MOST_SPLIT_OVERLAP blocks each end in a wait)
PROMOTED_SPLIT_COST = 1.15
# fp8's overlapped promotions on whole K where ptxas keeps their sets of accumulators in
# registers (nvcc's spill counts over K blocks, runs, tiles and scale forms:
# notebook/logs/cpu-nvcc-fp8-overlap-runs-2026-11-27.log)
LONE_RUN = 7  # all of K's blocks in one run: at most this many (7 spill a few dozen bytes, yet
# ran faster than three runs of 2 on the H100: notebook/logs/h100-sweep-fp8-runs-2026-11-27.log)
SHORT_TILE_RUN = 6  # runs on 64-row tiles: at most this long
# fp8's promoted sums past decode batches: v8's tile where it takes fewer rounds of the SMs than
# 128-row ones (`short_wide_tile`; read off the H100's wide-fp8 and llm-fp8 runs,
# reports/notes/h100-shapes.md, "64-row tiles for fp8 where they take fewer rounds")
SHORT_WIDE_TILE = (64, 256)
# ... and where K is short and the 128-row tiles would split it: 64x128 tiles whole, in one
# round, on K of at most SHORT_K_BLOCKS blocks (`short_k_tile`; measured on an H200 up to 16
# blocks only: reports/notes/h100-shapes.md, "64x128 tiles whole for fp8 where 128-row tiles
# would split a short K")
SHORT_K_TILE, SHORT_K_BLOCKS = (64, 128), 16
RUN_TAILS = {6: 2}  # blocks left over after whole runs of this length: at most so many
SHORT_TILE_TAILS = {6: 0}  # ... on 64-row tiles
# fp8's promotions by halves of the columns (promote_halves), two sets of accumulators where
# overlapped blocks keep three: 128-row tiles (64-row ones ran slower so) of these columns
# (128-wide tiles keep their third set, which ran faster) (reports/notes/h100-shapes.md,
# "fp8's promotions by halves of the columns")
HALVES_ROWS, HALVES_WIDTHS = 128, (144, 192)
# ... runs longer than HALVES_WIDE_RUN blocks only on consumers of at most
# HALVES_LONG_RUN_COLUMNS columns, leaving at most HALVES_WIDE_TAIL blocks over past them, and
# wider ones only on K of more than LONE_RUN blocks (nvcc's spill counts:
# notebook/logs/cpu-nvcc-fp8-halves-runs-2026-11-28.log)
HALVES_LONG_RUN_COLUMNS, HALVES_WIDE_RUN, HALVES_WIDE_TAIL = 160, 4, 2


def split_plan(wl: Workload, sms: int, block_m: int, block_n: int,
               splits: list[int]) -> tuple[float, int, bool]:
    """(waves of block_m x block_n tiles, split_k, split_tail): K split into the most of
    `splits` that keep the units within one wave (each slice at least MIN_SLICE_TILES K
    blocks); where the tiles take more than a wave, only those of a last, partial wave,
    counted as 1/split_k of a wave. v8 is persistent: a second wave would walk behind the
    first. Waves of 128-wide tiles count TMA_NARROW_COST of a 256-wide one (a 128-wide wgmma
    does less per byte it reads)."""
    k_blocks = workload_k_blocks(wl)
    tiles = tile_count(wl, block_m, block_n)
    full, tail = divmod(tiles, sms) if tiles > sms else (0, tiles)
    slices = max([s for s in splits if tail * s <= sms and k_blocks >= s * MIN_SLICE_TILES],
                 default=1) if tail else 1
    waves = full + (1 / slices if tail else 0)
    return waves * (TMA_NARROW_COST if block_n == 128 else 1), slices, bool(full) and slices > 1


def tail_split_pays(wl: Workload, sms: int, tile: tuple[int, int], split_k: int,
                    overlap: int | None) -> bool:
    """Whether splitting the K of a last, partial wave's tiles in split_k (split_tail) takes
    less time than leaving them whole, where fp8's promotions run overlapped longer than K split
    takes (`overlap` past MOST_SPLIT_OVERLAP): the split plan's waves (the whole ones and
    1/split_k) at PROMOTED_SPLIT_COST each, against one more whole wave. Elsewhere it pays."""
    if overlap is None or overlap <= MOST_SPLIT_OVERLAP:
        return True
    full = tile_count(wl, *tile) // sms
    return (full + 1 / split_k) * PROMOTED_SPLIT_COST < full + 1


def paying_split_plan(wl: Workload, sms: int, tile: tuple[int, int], space: dict,
                      overlap: int | None) -> tuple[float, int, bool]:
    """`split_plan`'s (waves, split_k, split_tail) for the tile, its last wave left whole where
    the space leaves split_tail to the heuristic and splitting it does not pay
    (`tail_split_pays`)."""
    waves, split_k, split_tail = split_plan(wl, sms, *tile, space["split_k"])
    if split_tail and False in space["split_tail"] \
            and not tail_split_pays(wl, sms, tile, split_k, overlap):
        return waves, 1, False
    return waves, split_k, split_tail


def units(wl: Workload, sms: int, block_m: int, block_n: int, splits: list[int]) -> int:
    """The split plan's units of work: its tiles, times its K slices where the tiles fit a
    wave."""
    tiles = tile_count(wl, block_m, block_n)
    return tiles if tiles > sms else tiles * split_plan(wl, sms, block_m, block_n, splits)[1]


def tile_widths(wl: Workload, sms: int, block_m: int, knobs: dict, space: dict) -> int:
    """block_n: 128 with 64-row tiles, or where its split plan takes less time than the
    default width's by TMA_TIE; then, for 16-bit nt decode batches whose 128-wide tiles give
    fewer than FEW_UNITS of the SMs a unit, the width of DECODE_WIDTHS whose split tiles give
    the most SMs one (the narrowest of equals); then ONE_ROW_WIDTH where `one_row_narrows`."""
    splits = space["split_k"]
    narrow = 128 in space["block_n"] and (
        block_m == WGMMA_M or split_plan(wl, sms, block_m, 128, splits)[0]
        < (1 - TMA_TIE) * split_plan(wl, sms, block_m, knobs["block_n"], splits)[0])
    block_n = 128 if narrow else knobs["block_n"]
    if block_m == WGMMA_M and wl.layout == "nt" and DTYPE_BYTES[wl.dtype] == 2 \
            and units(wl, sms, block_m, block_n, splits) < FEW_UNITS * sms:
        widths = [n for n in DECODE_WIDTHS if n in space["block_n"]] or [block_n]
        block_n = max(widths, key=lambda n: (min(units(wl, sms, block_m, n, splits), sms), -n))
    if block_m == WGMMA_M and one_row_narrows(wl, sms, block_n, knobs, space):
        block_n = ONE_ROW_WIDTH
    return block_n


def one_row_narrows(wl: Workload, sms: int, block_n: int, knobs: dict, space: dict) -> bool:
    """Whether a decode batch of one row of 64-row tiles (M at most 64) takes ONE_ROW_WIDTH-wide
    tiles instead of block_n-wide ones: where the space holds that width, v8 takes it, its tiles
    fit one wave, its split plan gives the SMs at least as many units as block_n's, and each
    unit keeps at most ONE_ROW_MOST_BLOCKS K blocks. K is then split fewer ways, and the slice
    that finishes a tile last reads fewer partials back; where a unit's K is long, that saving
    is small beside what a narrower wgmma loses per byte it reads."""
    tiles = tile_count(wl, WGMMA_M, ONE_ROW_WIDTH)
    if wl.dims["M"] > WGMMA_M or ONE_ROW_WIDTH not in space["block_n"] or tiles > sms \
            or not tile_takes(wl, knobs, WGMMA_M, ONE_ROW_WIDTH):
        return False
    split_k = split_plan(wl, sms, WGMMA_M, ONE_ROW_WIDTH, space["split_k"])[1]
    blocks = -(-workload_k_blocks(wl) // split_k)
    return tiles * split_k >= units(wl, sms, WGMMA_M, block_n, space["split_k"]) \
        and blocks <= ONE_ROW_MOST_BLOCKS


def tall_tiles(wl: Workload, sms: int, space: dict, waves: float) -> int | None:
    """The block_n (above 128, a multiple of 16, its accumulators within a thread's) whose
    TALL_M-row tiles, unsplit, cost least: their rounds (tiles / sms, rounded up) times their
    area, in waves of 128x256 tiles; the narrowest of the cheapest, where that is within
    TALL_TIE of the 128-row plan's `waves` (None where not)."""
    cost = {n: -(-tile_count(wl, TALL_M, n) // sms) * TALL_M * n / (128 * 256)
            for n in space["block_n"] if n % 16 == 0 and n > 128
            and consumer_accumulators(TALL_M, n) <= MOST_ACCUMULATORS}
    cheapest = min(cost.values(), default=None)
    if cheapest is None or cheapest > (1 + TALL_TIE) * waves:
        return None
    return min(n for n, c in cost.items() if c == cheapest)


def tile_takes(wl: Workload, knobs: dict, block_m: int, block_n: int) -> bool:
    """Whether the heuristic may give wl block_m x block_n tiles (two consumers, not pingpong):
    where v8's `tile_refusal` takes them, and 256-row tiles in nt only (as `tall_tiles` takes
    them)."""
    tile = Knobs(**{**knobs, "block_m": block_m, "block_n": block_n, "pingpong": False})
    return tile_refusal(wl, tile) is None and (block_m < TALL_M or wl.layout == "nt")


def timed_tile_us(wl: Workload, sms: int, block_m: int, block_n: int, split_k: int = 1) -> float:
    """The estimated time of v8 on wl with block_m x block_n tiles whose K is split in
    split_k (every tile): the rounds of units on the SMs, each unit's K blocks at the tile's
    TILE_TIMES_US per block, plus its time per tile (and SPLIT_US where split)."""
    per_block, per_tile = TILE_TIMES_US[(block_m, block_n)]
    blocks = -(-workload_k_blocks(wl) // split_k)
    rounds = -(-tile_count(wl, block_m, block_n) * split_k // sms)
    return rounds * (blocks * per_block + per_tile + (SPLIT_US if split_k > 1 else 0))


def timed_tiles(wl: Workload, sms: int, knobs: dict, space: dict,
                split: tuple[int, int, int, bool]):
    """(block_m, block_n, split_k): of the unsplit TILE_TIMES_US tiles the space holds and v8
    takes (`tile_takes`), and the split plan `split` (block_m, block_n, split_k, split_tail)
    where it splits every tile of a timed shape, the one of least `timed_tile_us`."""
    plans = [(m, n, 1) for m, n in TILE_TIMES_US if m in space["block_m"]
             and n in space["block_n"] and 1 in space["split_k"] and tile_takes(wl, knobs, m, n)]
    block_m, block_n, split_k, split_tail = split
    if split_k > 1 and not split_tail and (block_m, block_n) in TILE_TIMES_US:
        plans.append((block_m, block_n, split_k))
    return min(plans, key=lambda plan: timed_tile_us(wl, sms, *plan), default=None)


def promoted_overlap(wl: Workload, block_m: int, knobs: dict, space: dict,
                     promote_k: int | None, pingpong: bool) -> int | None:
    """promote_overlap: the user's or a search's where the space holds one value; else, where
    each K block is promoted (promote_k of one block) by two consumers on a tile of one of the
    space's widths that leaves room for the sets of accumulators the runs keep (a third set;
    by halves, promote_halves, none more), the run ptxas keeps in registers
    (`registered_run`; the split plan and `halved_run` may shorten it); else None."""
    if len(space["promote_overlap"]) == 1:
        return knobs["promote_overlap"]
    one_block = promote_k == k_block_elements(wl.dtype)
    sets = promoted_sets(MOST_OVERLAP, knobs["promote_halves"])
    room = any(sets * consumer_accumulators(block_m, n) <= MOST_ACCUMULATORS
               for n in space["block_n"])
    return registered_run(wl, block_m, space) if one_block and room and not pingpong else None


def halved_run(wl: Workload, overlap: int | None, tile: tuple[int, int], knobs: dict,
               space: dict) -> int | None:
    """The run `overlap` on `tile`, but by halves (promote_halves), where the consumer has more
    than HALVES_LONG_RUN_COLUMNS columns, the longest of the space's runs of at most
    HALVES_WIDE_RUN blocks that leaves at most HALVES_WIDE_TAIL of wl's K blocks over (ptxas
    spills longer runs there, and a run of 3 after runs of 4), unless the user or a search
    holds one."""
    if not knobs["promote_halves"] or overlap is None or len(space["promote_overlap"]) == 1 \
            or consumer_tile(*tile)[1] <= HALVES_LONG_RUN_COLUMNS:
        return overlap
    count = workload_k_blocks(wl)
    return max((run for run in space["promote_overlap"] if run and run <= HALVES_WIDE_RUN
                and count % run <= HALVES_WIDE_TAIL), default=None)


def short_tile_takes(wl: Workload, knobs: dict, space: dict, tile: tuple[int, int]) -> bool:
    """Whether fp8's promoted sums may take 64-row `tile` whole in place of 128-row tiles: the
    space holds it whole, v8 takes it (`tile_takes`), and the scales are not per block (ptxas
    spills their scale registers on such tiles, up to 184 bytes on 64x256)."""
    block_m, block_n = tile
    return not wl.block_scaled and block_m in space["block_m"] and block_n in space["block_n"] \
        and 1 in space["split_k"] and tile_takes(wl, knobs, block_m, block_n)


def short_wide_tile(wl: Workload, sms: int, tile: tuple[int, int]) -> bool:
    """Whether SHORT_WIDE_TILE's tiles, whole, take fewer rounds of tiles on the SMs than
    `tile` (128 rows) whole, on K of more than LONE_RUN blocks: rows cut in 64s pad M less
    (300 rows take 5 rows of 64-row tiles, or 3 of 128-row ones that hold 384)."""
    rounds = {shape: -(-tile_count(wl, *shape) // sms) for shape in (SHORT_WIDE_TILE, tile)}
    return workload_k_blocks(wl) > LONE_RUN \
        and rounds[SHORT_WIDE_TILE] < rounds[tile]


def short_k_tile(wl: Workload, sms: int, plan: tuple[int, int]) -> bool:
    """Whether SHORT_K_TILE's tiles, whole, replace a `plan` (block_m, split_k) of 128-row tiles
    that splits K (every tile's: `short_tiles` passes no split_tail), where K has at most
    SHORT_K_BLOCKS blocks and those tiles take one round of the SMs: a short K's slices cost
    more in partials than 64-row tiles lose per byte."""
    return plan[0] == 128 and plan[1] > 1 and tile_count(wl, *SHORT_K_TILE) <= sms \
        and workload_k_blocks(wl) <= SHORT_K_BLOCKS


def short_tiles(wl: Workload, sms: int, knobs: dict, space: dict, plan: tuple,
                promote_k: int) -> tuple | None:
    """fp8's promoted sums past decode batches: (64-row tile, its overlapped run,
    `promoted_overlap`), whole, in place of the `plan`'s 128-row tiles (block_m, block_n,
    split_k, split_tail): SHORT_WIDE_TILE where it takes fewer rounds (`short_wide_tile`),
    else SHORT_K_TILE where the plan splits every tile's short K (`short_k_tile`), each where
    `short_tile_takes` it; else None."""
    block_m, block_n, split_k, split_tail = plan
    if short_tile_takes(wl, knobs, space, SHORT_WIDE_TILE) \
            and short_wide_tile(wl, sms, (block_m, block_n)):
        tile = SHORT_WIDE_TILE
    elif not split_tail and short_tile_takes(wl, knobs, space, SHORT_K_TILE) \
            and short_k_tile(wl, sms, (block_m, split_k)):
        tile = SHORT_K_TILE
    else:
        return None
    run = promoted_overlap(wl, tile[0], knobs, space, promote_k, False)
    return (tile, run) if run else None


def promoted_tiles(wl: Workload, sms: int, knobs: dict, space: dict, plan: tuple,
                   promote_k: int) -> tuple | None:
    """fp8's promoted sums past decode batches: (tile, its overlapped run, `promoted_overlap`),
    whole, in place of the `plan`'s tiles: by halves, where the user or a search asks for them,
    `halves_tile`'s; else `short_tiles`' 64-row ones; None where neither takes wl."""
    if not knobs["promote_halves"]:
        return short_tiles(wl, sms, knobs, space, plan, promote_k)
    tile = halves_tile(wl, sms, knobs, space)
    return (tile, promoted_overlap(wl, tile[0], knobs, space, promote_k, False)) if tile else None


def pairs_pad(tiles: int) -> bool:
    """Whether `tiles` tiles along one dimension, padded to whole pairs of them (clusters of
    2), are more than CLUSTER_PADDING times as many (3 rows of tiles: 4)."""
    return tiles + tiles % 2 > CLUSTER_PADDING * tiles


def many_wave_clusters(wl: Workload, sms: int, knobs: dict, space: dict,
                       plan: tuple[int, int, int]) -> dict:
    """The clusters of 2 CTAs for a plan (block_m, block_n, split_k) past decode batches and
    pingpong, none where rows are staged (`staged_operands`): {"cluster_m": 2} (128x256 tiles
    side by side along M, B's box shared by TMA multicast) where those tiles take
    CLUSTER_WAVES waves or more and their 128-row rows do not pad (`pairs_pad`); else
    {"cluster_n": 2} for block-scaled fp8's plan where `paired_tiles`; else {}."""
    if staged_operands(wl):
        return {}
    if not pairs_pad(-(-wl.dims["M"] // 128)) and tile_count(wl, 128, 256) >= CLUSTER_WAVES * sms \
            and 2 in space["cluster_m"] and 128 in space["block_m"] \
            and 256 in space["block_n"] and 1 in space["split_k"]:
        return {"cluster_m": 2}
    return {"cluster_n": 2} if paired_tiles(wl, sms, knobs, space, plan) else {}


def paired_tiles(wl: Workload, sms: int, knobs: dict, space: dict,
                 plan: tuple[int, int, int]) -> bool:
    """Whether block-scaled fp8's `plan` (block_m, block_n, split_k) runs in clusters of 2 along
    N, the pair's A box loaded once by TMA multicast: where the plan leaves K whole, its tiles
    take CLUSTER_WAVES waves or more, K has at least PAIRED_K_BLOCKS blocks, the space holds
    the pair, its columns of tiles do not pad (`pairs_pad`), and v8 takes the tile. Over many
    tiles of a long K the pair's halved reads of A outweigh what the cluster costs a tile; on
    fewer or shorter ones they did not, and a split K's slices are refused clusters."""
    block_m, block_n, split_k = plan
    return wl.block_scaled and split_k == 1 and 2 in space["cluster_n"] \
        and 1 in space["cluster_m"] and tile_count(wl, block_m, block_n) >= CLUSTER_WAVES * sms \
        and not pairs_pad(-(-wl.dims["N"] // block_n)) \
        and workload_k_blocks(wl) >= PAIRED_K_BLOCKS \
        and tile_takes(wl, knobs, block_m, block_n)


def registered_run(wl: Workload, block_m: int, space: dict) -> int | None:
    """The longest of the space's promote_overlap runs that ptxas keeps in registers over wl's
    K blocks, whole: all of them as one run where they are at most LONE_RUN (SHORT_TILE_RUN on
    64-row tiles); else at least two whole runs (one run and the blocks left over become one
    stretch of straight code, which spills), leaving at most RUN_TAILS's blocks over; on 64-row
    tiles at most SHORT_TILE_RUN blocks long, leaving at most SHORT_TILE_TAILS's over. None
    where no run fits."""
    count = workload_k_blocks(wl)
    runs = [run for run in space["promote_overlap"] if run]
    short = block_m <= WGMMA_M
    if count <= (SHORT_TILE_RUN if short else LONE_RUN):
        return max(runs, default=None)
    tails = SHORT_TILE_TAILS if short else RUN_TAILS
    return max((run for run in runs if count // run >= 2 and count % run <= tails.get(run, run)
                and (not short or run <= SHORT_TILE_RUN)), default=None)


def long_runs_asked(space: dict) -> bool:
    """Whether the user or a search names promote_overlap runs longer than v8 takes where K is
    split (MOST_SPLIT_OVERLAP): their tiles are then whole."""
    (run, *others) = space["promote_overlap"]
    return not others and run is not None and run > MOST_SPLIT_OVERLAP


def short_overlap(overlap: int | None, space: dict) -> int | None:
    """promote_overlap where K is split or M is given at each call (v8 for any M): at most
    MOST_SPLIT_OVERLAP (v8 refuses longer runs there), the longest of the space's that fits."""
    if overlap is None or overlap <= MOST_SPLIT_OVERLAP:
        return overlap
    return max((run for run in space["promote_overlap"] if run and run <= MOST_SPLIT_OVERLAP),
               default=None)


def promoted_widths(block_m: int, layout: str, space: dict, knobs: dict,
                    overlap: int | None) -> tuple[dict, dict]:
    """The space's widths, and the default width (the widest of them), whose block_m-row tiles
    leave room for promote_k's float32 sums (and, with the run `overlap` not by halves,
    promote_overlap's second set of wgmma's): the sets of accumulators (`promoted_sets`)
    within a thread's MOST_ACCUMULATORS."""
    sets = promoted_sets(overlap, knobs["promote_halves"])
    widths = [n for n in space["block_n"]
              if sets * consumer_accumulators(block_m, n) <= MOST_ACCUMULATORS]
    widest = widest_fitting(block_m, layout, False, widths) or knobs["block_n"]
    return {**space, "block_n": widths}, {**knobs, "block_n": widest}


def fitting_stages(block_m: int, block_n: int, space: dict, boxes: bool) -> list[int]:
    """The space's stages whose ring (and with `boxes`, tma_store's boxes) fits a Hopper
    block's shared memory."""
    return [s for s in space["stages"]
            if arena_bytes(block_m, block_n, s, boxes) <= HOPPER_SHARED_BYTES]


def ring_stages(tile: tuple[int, int], split_k: int, space: dict, boxes: bool) -> int | None:
    """The most stages that fit (`fitting_stages`) up to LONG_RING for an unsplit tile of one
    wgmma's rows, up to SHORT_RING for others; None where none fits (or where the space holds
    only more: then the least that fits)."""
    fitting = fitting_stages(*tile, space, boxes)
    most = LONG_RING if tile[0] == WGMMA_M and split_k == 1 else SHORT_RING
    return max((s for s in fitting if s <= most), default=min(fitting, default=None))


def takes_tma_store(wl: Workload, sms: int, tile: tuple[int, int], space: dict,
                    pingpong: bool) -> bool:
    """tma_store where the space must have it, or where a CTA walks more than one tile (its
    stores then run under the next one), C's rows take TMA, the boxes' rows are 128 bytes
    (narrower boxes take more barriers and stores per tile) and the boxes fit beside
    TMA_STORE_STAGES stages."""
    return (True in space["tma_store"] and tile_count(wl, *tile) > sms and c_rows_take_tma(wl)
            and box_bytes(*tile, wl.out_dtype, pingpong) == ROW_BYTES
            and max(fitting_stages(*tile, space, True), default=0)
            >= TMA_STORE_STAGES[DTYPE_BYTES[wl.dtype]]) or False not in space["tma_store"]


def promotion(wl: Workload, knobs: dict, space: dict) -> int | None:
    """promote_k: the user's or a search's where the space holds one value; else, on fp8,
    PROMOTE_K (the precision of torch._scaled_mm's default); else None."""
    if len(space["promote_k"]) == 1:
        return knobs["promote_k"]
    return PROMOTE_K if wl.dtype == FP8 and PROMOTE_K in space["promote_k"] else None


def cut_tiles(product: Workload, sms: int, knobs: dict, space: dict) -> tuple[int, int] | None:
    """swap_ab's tile of the product C^T = B A^T (its N the workload's M, the tokens): of the
    space's SWAP_ROWS (or the user's block_m; 128 rows with promote_k, as tma_tiles takes no tall
    tiles then) and, for the fewest columns of tiles of at most SWAP_WIDEST and up to two more
    (of at least SWAP_NARROWEST), M's share rounded up to 8 (cuBLAS's nvjet tiles, in or out of
    the space, which a search draws from), the tile v8 takes (with promote_k's float32 sums, and
    the user's promote_overlap's second set, beside its accumulators) whose rounds of tiles on
    the SMs cost least, each its area plus TILE_FIXED_ELEMENTS; then the largest. None where
    v8 takes none, or where the user asks for pingpong (its consumers take whole tiles:
    tma_tiles' own rule)."""
    if False not in space["pingpong"]:
        return None
    promoted = promotion(product, knobs, space)
    heights = space["block_m"] if len(space["block_m"]) == 1 else \
        [m for m in SWAP_ROWS if m in space["block_m"] and not (promoted and m == TALL_M)]
    cuts = cut_widths(product.dims["N"])
    fewest = min(cuts)
    widths = {n for columns, n in cuts.items() if columns == fewest or n >= SWAP_NARROWEST}
    overlap = knobs["promote_overlap"] if len(space["promote_overlap"]) == 1 else None
    sets = promoted_sets(overlap) if promoted else 1
    return cheapest_tile(product, sms, knobs, (heights, sorted(widths)), sets)


def cut_width(tokens: int, columns: int) -> int:
    """The width of each of `columns` columns of tiles that swap_ab cuts `tokens` (the
    workload's M) into: their share, rounded up to 8 (wgmma's n8)."""
    return -(-tokens // (columns * 8)) * 8


def cut_widths(tokens: int) -> dict[int, int]:
    """swap_ab's columns of tiles that `tokens` are cut into, the fewest of at most SWAP_WIDEST
    and up to two more: {columns: `cut_width`} (cuBLAS's nvjet tiles: 300 tokens in two of 152
    or three of 104)."""
    fewest = -(-tokens // SWAP_WIDEST)
    return {columns: cut_width(tokens, columns) for columns in range(fewest, fewest + 3)}


def split_cut_tile(wl: Workload, sms: int) -> tuple[int, int] | None:
    """swap_ab's SPLIT_CUT_ROWS-row tile of the fewest, widest columns of wl's tokens
    (`cut_widths`), where those tiles are fewer than the SMs, so that the rule splits their K
    to fill them: each consumer then runs the widest wgmma the tokens allow. `cut_tiles` costs
    its tiles' rounds unsplit, and so takes narrower ones that fill the SMs whole. For 16-bit
    inputs in nt past MEDIUM_ROWS rows of A, up to SWAP_WEIGHED_ROWS (fp8's swapped tiles
    promote their sums without overlap); None elsewhere, or where the tiles fill the SMs
    unsplit."""
    if DTYPE_BYTES[wl.dtype] != 2 or wl.layout != "nt" \
            or not MEDIUM_ROWS < wl.dims["M"] <= SWAP_WEIGHED_ROWS:
        return None
    product = kernel_workload(wl, True)
    cuts = cut_widths(product.dims["N"])
    tile = (SPLIT_CUT_ROWS, cuts[min(cuts)])
    return tile if tile_count(product, *tile) < sms else None


def cheapest_tile(wl: Workload, sms: int, knobs: dict, shapes: tuple, sets: int):
    """Of the tiles of `shapes` (its rows by its columns) that v8 takes and whose `sets` sets
    of accumulators fit a consumer thread, the one whose rounds on the SMs, unsplit, cost
    least: the rounds (the tiles over the SMs, rounded up) times the tile's area plus
    TILE_FIXED_ELEMENTS; of equals the larger tile (it does more per byte it loads), then the
    first. None where v8 takes none."""
    heights, widths = shapes

    def cost(tile):
        m, n = tile
        return -(-tile_count(wl, m, n) // sms) * (m * n + TILE_FIXED_ELEMENTS), -m * n

    tiles = [(m, n) for m in heights for n in widths if tile_takes(wl, knobs, m, n)
             and sets * consumer_accumulators(m, n) <= MOST_ACCUMULATORS]
    return min(tiles, key=cost, default=None)


def wave_tile(wl: Workload, sms: int, knobs: dict) -> tuple[int, int] | None:
    """The unsplit tile that fills the SMs best (`cheapest_tile`): of WAVE_ROWS rows, a whole
    number of the layout's BLOCK_N_STEP columns from WAVE_WIDTHS' least to its most, the tile
    v8 takes (fp8: with the three sets of accumulators its overlapped promotions keep). Such
    tiles need not be the space's widths: cuBLAS's at medium M are cut so (700x2048x8192 bf16:
    128 of 88x128). None at MEDIUM_ROWS rows of A or fewer (the narrow tiles' rows), where v8
    takes none, or where the best takes more than TIMED_WAVES rounds (there a tile's work per
    byte counts for more than the last round's idle SMs)."""
    if wl.dims["M"] <= MEDIUM_ROWS:
        return None
    widths = range(WAVE_WIDTHS[0], WAVE_WIDTHS[1] + 1, BLOCK_N_STEP[wl.layout][0])
    sets = promoted_sets(MOST_OVERLAP) if wl.dtype == FP8 else 1
    best = cheapest_tile(wl, sms, knobs, (WAVE_ROWS, widths), sets)
    return best if best and tile_count(wl, *best) <= TIMED_WAVES * sms else None


def one_consumer_tile(wl: Workload, sms: int, knobs: dict) -> tuple[int, int] | None:
    """16-bit inputs: `wave_tile` where it is one wgmma tall and its tiles take one round of
    the SMs, for pingpong: each CTA's tile multiplied by one consumer at the tile's whole
    width, where two consumers would split its columns into wgmmas half as wide (in two
    rounds, a CTA's two consumers would share the tensor cores in the last; on fp8 it
    measured slower). None elsewhere."""
    tile = wave_tile(wl, sms, knobs) if DTYPE_BYTES[wl.dtype] == 2 else None
    return tile if tile and tile[0] == WGMMA_M and tile_count(wl, *tile) <= sms else None


def swapped_one_consumer_tile(wl: Workload, sms: int) -> tuple[int, int] | None:
    """`one_consumer_tile`'s swapped form (16-bit inputs, nt, past MEDIUM_ROWS rows of A): a
    wgmma's rows of B (the layer's) by the narrowest cut of the tokens, in whole 8s and at
    least SWAP_ONE_CONSUMER_NARROWEST wide, that one round of the SMs takes (cuBLAS's 64x80
    tiles at 300x2048x2048), so that each CTA's tile is as narrow as the SMs allow. None
    where even a cut of SWAP_WIDEST would take more than one round."""
    tokens = wl.dims["M"]
    if DTYPE_BYTES[wl.dtype] != 2 or wl.layout != "nt" or tokens <= MEDIUM_ROWS:
        return None
    row_tiles = tile_count(kernel_workload(wl, True), WGMMA_M, tokens)
    cuts = [cut_width(tokens, columns) for columns in range(1, sms // row_tiles + 1)]
    width = min((w for w in cuts if w >= SWAP_ONE_CONSUMER_NARROWEST), default=None)
    return (WGMMA_M, width) if width and width <= SWAP_WIDEST else None


def halves_tile(wl: Workload, sms: int, knobs: dict,
                space: dict | None = None) -> tuple[int, int] | None:
    """fp8's promoted sums by halves (promote_halves), past MEDIUM_ROWS rows of A, scales per
    tensor or per row (block scales ran slower so): the HALVES_ROWS-row tile of HALVES_WIDTHS'
    columns (whole BLOCK_N_STEPs; on K of at most LONE_RUN blocks at most
    HALVES_LONG_RUN_COLUMNS; with a `space`, only its rows and columns) whose rounds on the
    SMs, unsplit, cost least (`cheapest_tile`, with its two sets of accumulators); None
    elsewhere or where v8 takes none."""
    if wl.dtype != FP8 or wl.block_scaled or wl.dims["M"] <= MEDIUM_ROWS:
        return None
    short_k = workload_k_blocks(wl) <= LONE_RUN
    most = HALVES_LONG_RUN_COLUMNS if short_k else HALVES_WIDTHS[1]
    widths = range(HALVES_WIDTHS[0], most + 1, BLOCK_N_STEP[wl.layout][0])
    shapes = ((HALVES_ROWS,), widths) if space is None else \
        ([m for m in (HALVES_ROWS,) if m in space["block_m"]],
         [n for n in widths if n in space["block_n"]])
    return cheapest_tile(wl, sms, {**knobs, "promote_halves": True}, shapes,
                         promoted_sets(MOST_OVERLAP, True))


def swapped_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """swap_ab (asked for, or `swap_choice`'s unasked): the knobs tma_tiles picks for the
    product the kernel computes (C^T = B A^T: `kernel_workload`), on the tile `cut_tiles`
    cuts to M where the user names no width, C stored from registers; fp8's promotions not
    overlapped unless asked for (ptxas spills some cut widths' runs)."""
    product = kernel_workload(wl, True)
    narrowed = {**space, "swap_ab": [False], "tma_store": [False]}
    if len(space["promote_overlap"]) > 1:  # runs of 8 on 72-104 columns spill in ptxas
        narrowed["promote_overlap"] = [None]
    tile = cut_tiles(product, sms, knobs, space) if len(space["block_n"]) > 1 else None
    if tile:
        narrowed.update(block_m=[tile[0]], block_n=[tile[1]])
        knobs = {**knobs, "block_m": tile[0], "block_n": tile[1]}
    return {**tma_tiles(product, sms, knobs, narrowed), "swap_ab": True}


def swap_choice(wl: Workload, sms: int, knobs: dict, space: dict) -> dict | None:
    """`swapped_tiles`' knobs where the user or a search asks for swap_ab; unasked, for a
    decode batch (at most SWAP_MOST_TOKENS rows of A) where the space holds the swap, the
    width is left to the heuristic, `cut_tiles` cuts a tile to M, and v8 takes the swapped
    knobs with every knob the user or a search holds; else None. A few tokens fill one narrow
    column of tiles (8 or 16 wide) where unswapped they fill 64 rows of wgmma's, mostly
    padding."""
    if False not in space["swap_ab"]:
        return swapped_tiles(wl, sms, knobs, space)
    if wl.dims["M"] > SWAP_MOST_TOKENS or True not in space["swap_ab"] \
            or len(space["block_n"]) == 1:
        return None
    knobs = {**knobs, "swap_ab": True}
    if not cut_tiles(kernel_workload(wl, True), sms, knobs, space):
        return None
    swapped = swapped_tiles(wl, sms, knobs, space)
    held = {knob: values[0] for knob, values in space.items() if len(values) == 1}
    try:
        refuse(wl, Knobs(**{**knobs, **swapped, **held}))
    except ScheduleNotApplicable:
        return None
    return swapped


def kept_split(split_k: int, knobs: dict, space: dict) -> int:
    """The rules' split of K where the space holds it, else the user's; where the user asks for
    split_tail and no rule splits, the least of the space's splits (split_tail needs one)."""
    if split_k == 1 and False not in space["split_tail"]:
        split_k = min((s for s in space["split_k"] if s > 1), default=1)
    return split_k if split_k in space["split_k"] else knobs["split_k"]


def decode_batch(wl: Workload, sms: int) -> bool:
    """Whether wl is a decode batch, which v8 gives one wgmma's rows a tile: at most that many
    rows of A, or at most twice as many where 128x128 tiles cannot give every SM one."""
    return wl.dims["M"] <= WGMMA_M or (wl.dims["M"] <= 2 * WGMMA_M
                                       and tile_count(wl, 2 * WGMMA_M, 128) < sms)


def tma_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v8's knobs for wl:
    - block_m 64 for decode batches (`decode_batch`); block_n as `tile_widths` picks it;
    - K split as `split_plan` splits it (every tile's K where the tiles fit one wave, else
      split_tail: only the last, partial wave's, where that pays: `tail_split_pays`);
    - clusters of 2 (`many_wave_clusters`): 128x256 tiles along M where they take many waves,
      or block-scaled fp8's unsplit tiles along N on many waves of a long K; else
      256-row tiles (`tall_tiles`, nt) where the 128-row ones take more than a wave and the
      256-row ones cost no more; else, past decode batches: for 16-bit inputs whose 128x256
      tiles take at most TIMED_WAVES waves (or that clusters would pad), the tiles (and split
      plan) of least estimated time (`timed_tiles`); for fp8's promoted sums, 64-row tiles
      where they take fewer rounds or spare a short K its split (`promoted_tiles`);
    - pingpong only where the user or a search asks for it, then the widest whole tile that
      one consumer holds (no split K, clusters or tall tiles of its own); swap_ab where asked
      for, or unasked for decode batches (`swap_choice`), then these rules on the
      product the kernel computes, on tiles cut to M (`swapped_tiles`);
    - tma_store as `takes_tma_store` decides, and the ring's stages as `ring_stages` counts them;
    - fp8: wgmma's sums promoted into float32 every PROMOTE_K K elements (`promotion`:
      torch._scaled_mm's default's precision; promote_k=none is fast accumulation), each K
      block's under the next one's wgmmas in runs ptxas keeps in registers
      (`promoted_overlap`), on widths whose sets of accumulators fit (`promoted_widths`);
      by halves of the columns where asked (promote_halves: `promoted_tiles`, `halved_run`).
    K is not split where the user asks for a cluster or pingpong (whole tiles), and is where
    they ask for split_tail (the space's least split if no rule splits). Each knob only where
    the space holds it, but swap_ab's widths cut to M; nothing where v8 refuses wl whatever
    its knobs (`workload_refusal`: its refusal says why)."""
    if workload_refusal(wl):
        return {}
    swapped = swap_choice(wl, sms, knobs, space)
    if swapped:
        return swapped
    pingpong = False not in space["pingpong"]  # only where asked for: it measured no faster
    if 1 not in space["cluster_m"] or 1 not in space["cluster_n"] or pingpong \
            or long_runs_asked(space):  # whole tiles
        space = {**space, "split_k": [1], "split_tail": [False]}
    promote_k = promotion(wl, knobs, space)
    # Step 1. Decode batches: one wgmma's rows.
    decode = decode_batch(wl, sms)
    block_m = WGMMA_M if decode and WGMMA_M in space["block_m"] else knobs["block_m"]
    overlap = promoted_overlap(wl, block_m, knobs, space, promote_k, pingpong)
    whole_space = space
    if promote_k:
        space, knobs = promoted_widths(block_m, wl.layout, space, knobs, overlap)
    # Step 2. The width, and K split to fill the SMs.
    block_n = tile_widths(wl, sms, block_m, knobs, space)
    waves, split_k, split_tail = paying_split_plan(wl, sms, (block_m, block_n), space, overlap)
    # Step 3. Clusters where the tiles take many waves or block scales a long K; else
    # pingpong's, tall or timed tiles.
    wide_tiles = tile_count(wl, 128, 256)
    clusters = {} if decode or pingpong else \
        many_wave_clusters(wl, sms, knobs, space, (block_m, block_n, split_k))
    tall = None if decode or promote_k or wl.layout != "nt" or TALL_M not in space["block_m"] \
        or tile_count(wl, block_m, block_n) <= sms else tall_tiles(wl, sms, space, waves)
    timed = timed_tiles(wl, sms, knobs, space, (block_m, block_n, split_k, split_tail)) \
        if not decode and not promote_k and DTYPE_BYTES[wl.dtype] == 2 \
        and (wide_tiles <= TIMED_WAVES * sms
             or pairs_pad(-(-wl.dims["M"] // 128)) and wide_tiles >= CLUSTER_WAVES * sms) \
        else None
    if "cluster_m" in clusters:
        block_m, block_n, split_k, split_tail = 128, 256, 1, False
    elif pingpong:  # the widest whole tile one consumer holds (nn: whole 64-column boxes)
        block_n = widest_fitting(block_m, wl.layout, True, space["block_n"]) or knobs["block_n"]
    elif tall:
        block_m, block_n, split_k, split_tail = TALL_M, tall, 1, False
    elif timed:
        (block_m, block_n, split_k), split_tail = timed, False
    elif promoted := promote_k and not decode and not pingpong and promoted_tiles(
            wl, sms, knobs, whole_space, (block_m, block_n, split_k, split_tail), promote_k):
        ((block_m, block_n), overlap), split_k, split_tail = promoted, 1, False
    overlap = halved_run(wl, overlap, (block_m, block_n), knobs, space)
    # Step 4. C's way out, and the ring's stages.
    tma_store = takes_tma_store(wl, sms, (block_m, block_n), space, pingpong)
    split_k = kept_split(split_k, knobs, space)
    return {"block_m": block_m, "block_n": block_n,
            "stages": ring_stages((block_m, block_n), split_k, space, tma_store)
            or knobs["stages"],
            "tma_store": tma_store, "split_k": split_k, "promote_k": promote_k,
            "split_tail": split_tail if split_tail in space["split_tail"] else knobs["split_tail"],
            "promote_overlap": short_overlap(overlap, space) if split_k > 1 else overlap,
            **clusters}
