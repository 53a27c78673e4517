"""The rungs' shape heuristics (schedules/heuristics.py) and `--schedule best`
(tuning/explore.py): the knobs they pick as data, that every pick applies, that the committed
reports' shapes keep the signature's defaults, and `best` on recorded timings."""

import glob
import json
import os
import random
import statistics

import pytest
import tvm

import schedules
from facts.record import Record, Timing
from schedules import Workload, gemv, heuristics, v8
from schedules.errors import RecordsError, ScheduleNotApplicable, WorkloadError
from schedules.v8.geometry import MOST_ACCUMULATORS, consumer_accumulators
from schedules.v8.heuristic import (halves_tile, registered_run, ring_stages,
                                    swapped_one_consumer_tile, tma_tiles)
from schedules.workloads import DENSE_DTYPES, FP8
from tuning import build, explore, measure, records
from tuning.explore import SearchResults, resolve, selection

MEDIUM = v8.MEDIUM_TILES
MEDIUM_NAMES = [f"v8:block_m={m},block_n={n},split_k=1" for m, n in MEDIUM]
NARROW_64 = "v8:block_n=64"  # best's narrow tiles: at most 64 rows (MEDIUM_ROWS), 64 wide,
SPLIT_128 = "v8:block_n=128"  # ... and 128 wide, where the default's width is not that one
NARROW_128 = "v8:block_m=64,block_n=128,split_k=1"  # ... and past them, up to 512
WHOLE_K = "v8:swap_ab=true,block_m=64,block_n=16,split_k=1,stages=16"  # best's whole-K tile
V5T_KNOBS, V5T_K = "block_m=128", "tile_k=8,stages=3,single_barrier"  # v5t's square, narrow
TVM = tvm.__version__


def halved(block_n: int) -> str:
    """best's fp8 tile promoted by halves of its columns (`halved_tile`), block_n wide."""
    return f"v8:block_m=128,block_n={block_n},split_k=1,promote_halves=true"


def one_consumer(block_n: int) -> str:
    """best's filling 64-row tile with pingpong (`one_consumer_tile`), block_n wide."""
    return f"v8:block_m=64,block_n={block_n},split_k=1,pingpong=true"


def swapped_one_consumer(block_n: int) -> str:
    """best's swapped 64-row tile with pingpong, the tokens cut block_n wide
    (`one_consumer_tile`'s swapped form)."""
    return f"v8:swap_ab=true,block_m=64,block_n={block_n},split_k=1,pingpong=true"


def split_cut(block_n: int) -> str:
    """best's swapped 128-row tile of the tokens' widest cut, block_n wide (`split_cut`)."""
    return f"v8:swap_ab=true,block_m=128,block_n={block_n}"


def gemm(shape, dtype="float32", layout="nn"):
    return Workload("gemm", shape, dtype, layout=layout)


# rung, workload, the knobs its heuristic changes (every other knob: the signature's default)
CHOICES = [
    # 1024x512 in 64x64 tiles is 128 tiles for 132 SMs: 32x64 gives 256 (64 threads each)
    ("v5", gemm((1024, 512, 2000)), {"block_m": 32}),
    ("v5", gemm((3000, 1000, 2000)), {}),  # 752 tiles fill the SMs
    # M=16: 96 tiles of 64x64; 64x32 gives 192 (32x32 would halve the block's threads)
    ("v5p", gemm((16, 6144, 4096), "bfloat16", "nt"), {"block_n": 32}),
    # 128 tiles of 64x64, short of 132: K in 8 slices (16 MB of partials, within half the
    # L2), 1024 blocks of the default tile (no tile pads C)
    ("v5k", gemm((1024, 512, 2000)), {"k_slices": 8}),
    ("v5k", gemm((512, 512, 2048)), {"k_slices": 8}),  # 64 tiles x 8 slices = 512 blocks
    # no tile pads C; even in 8 slices (as far as the space goes) no tile's blocks fill the
    # SMs: the one with the most tiles, 8 of 32x64 (wider along N than 64x32)
    ("v5k", gemm((64, 256, 65536)), {"block_m": 32, "k_slices": 8}),
    ("v5k", gemm((1, 1, 1)), {"block_m": 32, "k_slices": 1}),  # one K tile: nothing to split
    # 7 rows: 32x64 tiles pad least (25 rows of 32, not 57 of 64); 80 x 8 slices
    ("v5k", gemm((7, 5120, 1280), layout="nt"), {"block_m": 32, "k_slices": 8}),
    ("v5k", gemm((3000, 1000, 2000)), {}),
    ("v5t", gemm((1024, 512, 2000)), {"block_m": 64, "k_slices": 8}),  # 32 tiles x 8 = 256 blocks
    ("v5t", gemm((16, 6144, 4096)), {"block_m": 64, "k_slices": 8}),  # 24 tiles x 8 = 192
    # C's 128x128 tiles give every SM one: cuBLAS's tiles (V5T_SQUARE) where they fill 90% of
    # their last wave's 264 places (2 an SM), else 128x64 (V5T_NARROW)
    ("v5t", gemm((1000, 4096, 4096)), {"block_n": 128, "tile_k": 8, "stages": 3}),  # 256: 97%
    ("v5t", gemm((4096, 1024, 4096), layout="nt"),  # in nt with two barriers a K tile
     {"block_n": 128, "tile_k": 8, "stages": 3, "single_barrier": False}),
    ("v5t", gemm((4096, 768, 3072), layout="nt"),  # 192 tiles: 73% of one wave
     {"block_n": 64, "thread_n": 8, "tile_k": 8, "stages": 3}),
    ("v5t", gemm((2500, 3840, 1280), layout="nt"),  # 600 tiles: 76% of the third wave's places
     {"block_n": 64, "thread_n": 8, "tile_k": 8, "stages": 3}),
    ("v5t", gemm((4096, 3840, 1280), layout="nt"),
     {"block_n": 128, "tile_k": 8, "stages": 3, "single_barrier": False}),
    ("v6", gemm((16, 6144, 4096), "bfloat16", "nt"), {"warp_tiles_m": 1, "warp_tiles_n": 1}),
    ("v6", gemm((1024, 512, 2000), "float16"), {"warp_tiles_m": 1, "warp_tiles_n": 2}),
    ("v6", gemm((3000, 1000, 2000), "float16"), {}),
    ("v7", gemm((16, 6144, 4096), "bfloat16", "nt"), {"block_m": 64, "block_n": 128}),  # decode
    ("v7", gemm((1000, 4096, 4096), "float16"), {"block_n": 128}),  # 128 -> 256 tiles
    ("v7", gemm((8192, 8192, 1024), "float16"), {}),
    # v8: 64-row tiles split along N for decode (M <= 64, or M <= 128 with few 128-row tiles;
    # at most SWAP_MOST_TOKENS rows swapped, as test_v8_swaps_decode_batches_unasked checks),
    # 128 columns where their waves take less time, then as many stages as fit up to 6 (6 of
    # 128x128; 4 of 128x256, the default), up to 8 on unsplit 64-row tiles (`ring_stages`),
    # then K split while the units stay within one wave;
    # tma_store (the default) only where a CTA walks more than one unit
    ("v8", gemm((128, 4096, 4096), "bfloat16", "nt"),  # 64 tiles x 2 (not 4: 256 units)
     {"block_m": 64, "block_n": 128, "stages": 6, "split_k": 2, "tma_store": False}),
    # one row of tiles (M <= 64): 64 wide where they fit a wave and give as many units, K split
    # fewer ways (ONE_ROW_WIDTH): 48 of 64x64 in 2 slices, not 24 of 64x128 in 4; 64 of
    # 64x64 (4 K blocks: too short to split) for 32 of 64x128
    ("v8", gemm((48, 3072, 2048), "bfloat16", "nt"),
     {"block_m": 64, "block_n": 64, "stages": 6, "split_k": 2, "tma_store": False}),
    ("v8", gemm((32, 4096, 256), "bfloat16", "nt"),
     {"block_m": 64, "block_n": 64, "stages": 8, "tma_store": False}),
    # ... not where a unit would keep more than ONE_ROW_MOST_BLOCKS K blocks: 96 of 64x64 whole
    # would keep 64 each; 48 of 64x128 in 2 slices keep 32
    ("v8", gemm((32, 6144, 4096), "bfloat16", "nt"),
     {"block_m": 64, "block_n": 128, "stages": 6, "split_k": 2, "tma_store": False}),
    # ... where they give fewer units, 64x128 split: 36 tiles in 3 slices against 72 of 64x64
    # whole at 48x4608x3584, 40 in 3 against 80 at 48x5120x5120
    ("v8", gemm((48, 4608, 3584), "bfloat16", "nt"),
     {"block_m": 64, "block_n": 128, "stages": 6, "split_k": 3, "tma_store": False}),
    ("v8", gemm((48, 5120, 5120), "bfloat16", "nt"),
     {"block_m": 64, "block_n": 128, "stages": 6, "split_k": 3, "tma_store": False}),
    # 112 tiles of 128x256: not decode, but one unit per CTA
    ("v8", gemm((128, 28672, 4096), "bfloat16", "nt"), {"tma_store": False}),
    # 72 tiles of 64x128, too many to split in 2: 55% of the SMs; 58 of 64x160 in 2 slices give
    # 116 a unit. Not for fp8 (slower so), nor nn (64-column boxes), nor where 128-wide tiles
    # already reach 2/3 of the SMs (96 tiles of 64x128 at 128x6144x4096)
    ("v8", gemm((128, 4608, 3584), "bfloat16", "nt"),
     {"block_m": 64, "block_n": 160, "stages": 6, "split_k": 2, "tma_store": False}),
    ("v8", gemm((128, 4608, 3584), FP8, "nt"),  # (fp8's runs on 64-row tiles: 4, see below)
     {"block_m": 64, "block_n": 128, "stages": 8, "tma_store": False, "promote_k": 128,
      "promote_overlap": 4}),
    ("v8", gemm((128, 4608, 3584), "bfloat16", "nn"),
     {"block_m": 64, "block_n": 128, "stages": 8, "tma_store": False}),
    ("v8", gemm((128, 6144, 4096), "float16", "nt"),
     {"block_m": 64, "block_n": 128, "stages": 8, "tma_store": False}),
    # 144 tiles of 128x256, 1.1 waves: nt takes one wave of 128 tiles of 256x144 (no more
    # area: 1.125 x 128 = 144 wide); nn (no 256-row tiles) the least estimated time of the
    # timed tiles: 192 of 128x192, 2 rounds of 56 K blocks
    ("v8", gemm((1000, 4608, 3584), "bfloat16", "nn"), {"block_n": 192}),
    ("v8", gemm((1000, 4608, 3584), "bfloat16", "nt"),
     {"block_m": 256, "block_n": 144, "tma_store": False}),
    # 192 tiles of 128x256: 60 past a wave, in 2 slices (1.5 waves); 128 of 256x192 are one
    ("v8", gemm((1000, 6144, 4096), "bfloat16", "nt"),
     {"block_m": 256, "block_n": 192, "tma_store": False}),
    # 448 tiles of 128x256 in 3.5 waves; 256x160 tiles are 3 rounds of 1.25: 7% more, kept
    ("v8", gemm((1000, 14336, 4096), "bfloat16", "nt"), {"split_k": 2, "split_tail": True}),
    # 768 tiles of 128x256, 6 rounds; 512 of 256x192, 4 rounds of 1.5: the same, and larger;
    # tma_store's boxes (128-byte rows of float32 C) leave room for 3 stages
    ("v8", gemm((4096, 6144, 4096), "bfloat16", "nt"),
     {"block_m": 256, "block_n": 192, "stages": 3}),
    # 27 waves of 128x256 tiles (8 or more): those, in clusters of 2 along M, in place of the
    # 256x160 ones that cost no more; fp8 and nn too; 6.8 waves (1000 x 28672) are not enough
    ("v8", gemm((4096, 28672, 4096), "bfloat16", "nt"), {"cluster_m": 2}),
    # (fp8 promotes its sums by default, each K block's under the next one's wgmmas in runs of
    # 8, or 4 where K is split: tiles of at most 128x128, no clusters; see below). 7168 tiles
    # are 54.3 waves: the last one's split (54.33 waves at PROMOTED_SPLIT_COST) costs more than
    # a 55th whole one, so K is not split and the runs stay 8 long
    ("v8", gemm((4096, 28672, 4096), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    # 320 tiles are 2.4 waves: the last one's 56 split in 2 (2.5 waves at 1.15) take less than a
    # third whole one
    ("v8", gemm((2500, 2048, 8192), FP8, "nt"),
     {"block_n": 128, "stages": 6, "split_k": 2, "split_tail": True, "promote_k": 128,
      "promote_overlap": 4}),
    # the runs ptxas keeps in registers on whole K (`registered_run`): 12 K blocks in two runs
    # of 6, 8 in two of 4 (a run of 8, or of 6 and the blocks left over, spill), 7 in one, a
    # 64-row tile's 40 in runs of 4
    ("v8", gemm((4096, 24576, 1536), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 6}),
    ("v8", gemm((4096, 4096, 1024), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 4}),
    ("v8", gemm((2500, 9728, 896), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    ("v8", gemm((48, 27648, 5120), FP8, "nt"),
     {"block_m": 64, "block_n": 128, "stages": 8, "promote_k": 128, "promote_overlap": 4}),
    # fp8's promoted sums at medium M: 300 rows take 3 rows of 128-row tiles (384 rows) or 5 of
    # 64-row ones (320): 560 tiles of 64x256 are 5 rounds against 672 of 128x128's 6, so v8 takes
    # them whole (`short_wide_tile`); at 700 rows, 132 against 144 (one round against two). Not
    # where they take as many rounds (2500 rows), nor on K of 7 blocks (a lone run), nor with
    # block scales (whose registers spill on 64x256 tiles)
    ("v8", gemm((300, 28672, 5120), FP8, "nt"),
     {"block_m": 64, "promote_k": 128, "promote_overlap": 4}),
    ("v8", Workload("gemm", (300, 28672, 5120), FP8, None, "nt", "block"),
     {"block_n": 128, "stages": 6, "split_k": 8, "split_tail": True, "promote_k": 128,
      "promote_overlap": 4}),
    ("v8", gemm((700, 3072, 2048), FP8, "nt"),
     {"block_m": 64, "stages": 5, "tma_store": False, "promote_k": 128, "promote_overlap": 4}),
    ("v8", gemm((2500, 5120, 5120), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    ("v8", gemm((700, 151936, 896), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    # ... and 64x128 tiles whole where 128-row tiles would split a short K: 300x2048x2048's 48
    # tiles of 128x128 in two slices each, or 80 of 64x128 whole, in one round both
    # (`short_k_tile`); not on K of 64 blocks, nor with block scales
    ("v8", gemm((300, 2048, 2048), FP8, "nt"),
     {"block_m": 64, "block_n": 128, "stages": 8, "tma_store": False, "promote_k": 128,
      "promote_overlap": 4}),
    ("v8", gemm((300, 2048, 8192), FP8, "nt"),
     {"block_n": 128, "stages": 6, "split_k": 2, "tma_store": False, "promote_k": 128,
      "promote_overlap": 4}),
    ("v8", Workload("gemm", (300, 2048, 2048), FP8, None, "nt", "block"),
     {"block_n": 128, "stages": 6, "split_k": 2, "tma_store": False, "promote_k": 128,
      "promote_overlap": 4}),
    # block scales on K of 48 blocks or more, unsplit: 128x128 tiles in clusters of 2 along N
    # (`paired_tiles`), A's box shared; not on K of 32 blocks, nor where K is split (the last
    # wave's tiles at 4096x2112x7168), nor tensorwise; 9 columns of tiles pad to 10 (1.11x), 5
    # would to 6 (1.2x)
    ("v8", Workload("gemm", (4096, 7168, 6144), FP8, None, "nt", "block"),
     {"block_n": 128, "stages": 6, "cluster_n": 2, "promote_k": 128, "promote_overlap": 8}),
    ("v8", Workload("gemm", (4096, 7168, 4096), FP8, None, "nt", "block"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    ("v8", Workload("gemm", (4096, 2112, 7168), FP8, None, "nt", "block"),
     {"block_n": 128, "stages": 6, "split_k": 8, "split_tail": True, "promote_k": 128,
      "promote_overlap": 4}),
    ("v8", gemm((4096, 7168, 16384), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    ("v8", Workload("gemm", (16384, 1152, 8192), FP8, None, "nt", "block"),
     {"block_n": 128, "stages": 6, "cluster_n": 2, "promote_k": 128, "promote_overlap": 8}),
    ("v8", Workload("gemm", (16384, 640, 8192), FP8, None, "nt", "block"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    ("v8", gemm((8192, 8192, 1024), "float16"), {"cluster_m": 2}),
    # ... but not where rows are staged (K = 4095): its grid's barrier needs no clusters
    ("v8", gemm((4096, 28672, 4095), "bfloat16", "nt"),
     {"block_m": 256, "block_n": 160, "stages": 3}),
    ("v8", gemm((1000, 28672, 4096), "bfloat16", "nt"),
     {"block_m": 256, "block_n": 176, "tma_store": False}),
    # the register stores where a stage would go for fp8, where boxes of 144 float32 columns
    # would have 64-byte rows, and where C's rows are not whole 16-byte multiples
    ("v8", gemm((4096, 6144, 4096), FP8, "nt"),
     {"block_n": 128, "stages": 6, "promote_k": 128, "promote_overlap": 8}),
    ("v8", gemm((4096, 4608, 3584), "bfloat16", "nt"),
     {"block_m": 256, "block_n": 144, "tma_store": False}),
    ("v8", gemm((4096, 4094, 4096), "float16", "nt"), {"tma_store": False}),
    # 4 waves of 128x256; 256x144 and 256x192 cost 4.5: 12% more, kept (and nn keeps its boxes)
    ("v8", gemm((4096, 4096, 4096), "bfloat16", "nt"), {}),
    ("v8", gemm((4096, 6144, 4096), "bfloat16", "nn"), {}),
    ("v8", gemm((1000, 4096, 4096), "float16"), {"tma_store": False}),  # 128 tiles: one wave
    ("v8", gemm((4096, 3584, 3584), "bfloat16", "nt"),  # 448 tiles: 3 waves, 52 in 2 slices
     {"split_k": 2, "split_tail": True}),
    ("v8", gemm((1000, 3584, 18944), "bfloat16", "nt"),  # 112 tiles: no split fills more
     {"tma_store": False}),
    # 148 tiles of 128x256, 296 of 64x256: 2 or 3 rounds; 237 of 128x160 take 2 rounds of
    # less time each (timed_tiles)
    ("v8", gemm((128, 37888, 3584), "bfloat16", "nt"), {"block_n": 160, "stages": 5}),
    # medium M: 144 tiles of 128x128, the 12 past a wave in 8 K slices, before; 132 of 64x256
    # whole are one round of 48 K blocks at about 128x128's time per block (timed_tiles)
    ("v8", Workload("gemm", (700, 3072, 3072), "bfloat16", "bfloat16", "nt"),
     {"block_m": 64, "stages": 5, "tma_store": False}),
    # 3 rows of 128-row tiles would pad to 4 in clusters of 2: no clusters, timed tiles
    ("v8", Workload("gemm", (300, 131072, 5120), "bfloat16", "bfloat16", "nt"), {"block_m": 64}),
    ("multirow", Workload("gemv", (4096, 64), "float16"), {"reduce_threads": 8}),
    ("multirow", Workload("gemv", (4096, 65), "float16"), {"reduce_threads": 16}),
    ("multirow", Workload("gemv", (300, 7), "float32"), {"reduce_threads": 2}),
    ("multirow", Workload("batched_gemv", (4, 128, 100), "bfloat16"), {"reduce_threads": 16}),
    ("multirow", Workload("gemv", (4096, 256), "float16"), {}),  # a warp's step of K
    # skinny: 2 rows of W a thread at N = 5120 (2,560 warps, 16 an SM or more); 4 on a vocabulary
    # of rows; 1 where N is short, then K threads on several warps while K gives each a vector
    ("skinny", Workload("gemm", (7, 5120, 5120), "bfloat16", "bfloat16", "nt"), {}),
    ("skinny", Workload("gemm", (4, 128256, 2048), "bfloat16", "bfloat16", "nt"),
     {"rows_per_thread": 4}),
    ("skinny", Workload("gemm", (16, 128256, 2048), "bfloat16", "bfloat16", "nt"), {}),  # 32 sums
    ("skinny", Workload("gemm", (8, 1024, 4096), "float16", "float16", "nt"),
     {"rows_per_thread": 1, "reduce_threads": 128}),
    ("skinny", Workload("gemm", (2, 896, 896), "bfloat16", "bfloat16", "nt"),
     {"rows_per_thread": 1, "reduce_threads": 64}),  # 112 vectors of K: 64 threads take 2 steps
]


def changed(entry, wl, chosen=None) -> dict:
    return {k: v for k, v in entry.defaults_for(wl, chosen).items() if v != entry.defaults[k]}


@pytest.mark.parametrize("shape", [(4096, 28672, 4096), (4096, 6144, 4096), (2048, 10240, 8192),
                                   (32, 6144, 4096), (4096, 4096, 4096)])
def test_fp8_promotes_by_default_in_tiles_that_hold_both_sums(shape):
    """fp8: promote_k=128 wherever the user leaves it to the heuristic (4096^3 too, whose
    other rungs keep their defaults), each K block's promotion under the next one's wgmmas
    (runs of 8; of 4 where K is split, and on these shapes' 64-row tiles), on a tile whose
    three sets of sums fit a thread;
    asked for none, the fast form's tiles (clusters and 256-row tiles included)."""
    v8, wl = schedules.get("gemm", "v8"), gemm(shape, FP8, "nt")
    knobs = v8.defaults_for(wl)
    assert knobs["promote_k"] == 128
    assert knobs["promote_overlap"] == (8 if knobs["split_k"] == 1 and knobs["block_m"] > 64 else 4)
    assert 3 * consumer_accumulators(knobs["block_m"], knobs["block_n"]) <= MOST_ACCUMULATORS
    v8.apply(wl, build.cuda_target())  # not refused
    fast = {(4096, 28672, 4096): {"cluster_m": 2},
            (4096, 6144, 4096): {"block_m": 256, "block_n": 192, "tma_store": False}}
    if shape in fast:
        assert changed(v8, wl, {"promote_k": None}) == fast[shape]


@pytest.mark.parametrize("K, block_m, run", [
    (768, 128, 8), (896, 128, 8),  # 6 and 7 K blocks: one run of all of them (on 64-row
    (768, 64, 8), (896, 64, 2),  # tiles at most 6: a lone 7 spilled up to 508 bytes on 64x256)
    (1024, 128, 4), (1000, 128, 4),  # 8 (ragged too): two whole runs
    (1536, 128, 6), (1792, 128, 6),  # 12, 14: two runs of 6 and at most 2 left over
    (1920, 128, 4),  # 15: runs of 6 would leave 3 over
    (2048, 128, 8), (2944, 128, 8),  # 16, 23: runs of 8, whatever is left over
    (4096, 64, 4), (5120, 64, 4),  # 64-row tiles: runs of 4, or 6 with none
    (1536, 64, 6), (3072, 64, 6),  # left over
])
def test_fp8_overlapped_runs_are_those_ptxas_keeps_in_registers(K, block_m, run):
    """registered_run: the longest run of the space's that leaves at least two whole runs
    (else all of K in one, where it is short), as the local nvcc's spill counts and the H100's
    sweeps showed."""
    space = schedules.get("gemm", "v8").space
    assert registered_run(gemm((4096, 4096, K), FP8, "nt"), block_m, space) == run
    narrowed = {**space, "promote_overlap": [None, 2, 4, 8]}
    assert registered_run(gemm((4096, 4096, K), FP8, "nt"), block_m, narrowed) == \
        (4 if run == 6 else run)


@pytest.mark.parametrize("shape, asked, tile, run", [
    # 128 rows wide as two sets of sums fit (96 a thread); runs of at most 4 on 192 columns
    ((2048, 10240, 8192), {}, (128, 192), 4),
    # ... and of 2 where runs of 4 would leave 3 blocks over (23 K blocks)
    ((2926, 16112, 2944), {}, (128, 192), 2),
    # ... on 144-160 columns the runs `registered_run` gives (38 K blocks: 8)
    ((2500, 896, 4864), {"block_n": 160, "split_k": 1}, (128, 160), 8),
    # ... and where the user holds a run, that one
    ((2500, 896, 4864), {"block_n": 192, "split_k": 1, "promote_overlap": 8}, (128, 192), 8),
])
def test_fp8_promoted_by_halves_takes_tiles_of_two_sets_and_runs_ptxas_keeps(shape, asked,
                                                                           tile, run):
    """promote_halves asked for: the widest tile whose two sets of accumulators (wgmma's and
    the float32 sums) fit a consumer thread, in runs of the space's, at most HALVES_WIDE_RUN
    blocks and leaving at most HALVES_WIDE_TAIL over where a consumer has more than
    HALVES_LONG_RUN_COLUMNS columns (ptxas spilled others there), and v8 takes what it
    picks."""
    v8, wl = schedules.get("gemm", "v8"), gemm(shape, FP8, "nt")
    knobs = v8.defaults_for(wl, {**asked, "promote_halves": True})
    assert (knobs["block_m"], knobs["block_n"], knobs["promote_overlap"]) == (*tile, run)
    assert knobs["promote_halves"] and knobs["promote_k"] == 128
    v8.apply(wl, build.cuda_target(), **knobs)


@pytest.mark.parametrize("wl, tile", [
    (gemm((2500, 896, 4864), FP8, "nt"), (128, 160)),  # 6 columns of tiles, one round
    (gemm((1000, 4608, 3584), FP8, "nt"), (128, 144)),  # 256 tiles: two rounds
    (gemm((2048, 10240, 8192), FP8, "nt"), (128, 192)),
    (Workload("gemm", (1000, 4608, 3584), FP8, None, "nt", "row"), (128, 144)),
    (gemm((700, 9728, 896), FP8, "nt"), (128, 160)),  # 7 K blocks: at most 160 columns
    (gemm((64, 4608, 3584), FP8, "nt"), None),  # MEDIUM_ROWS rows or fewer
    (Workload("gemm", (1000, 4608, 3584), FP8, None, "nt", "block"), None),  # block scales
    (gemm((1000, 4608, 3584), "bfloat16", "nt"), None),
])
def test_fp8s_tile_by_halves_is_the_one_whose_rounds_cost_least(wl, tile):
    """halves_tile: past MEDIUM_ROWS rows, per-tensor or rowwise fp8, the 128-row tile of
    144-192 columns (at most 160 on K of LONE_RUN blocks or fewer) whose rounds on the SMs
    cost least; none for block scales, 16-bit inputs or few rows."""
    assert halves_tile(wl, heuristics.H100_SMS, schedules.get("gemm", "v8").defaults) == tile


def test_fp8_split_tail_asked_for_keeps_the_plans_split():
    """Where fp8's overlapped promotions leave the last wave whole (tail_split_pays), a user or
    search asking for split_tail still gets the split plan's slices, with runs of 4."""
    v8, wl = schedules.get("gemm", "v8"), gemm((4096, 28672, 4096), FP8, "nt")
    assert v8.defaults_for(wl)["split_k"] == 1
    asked = v8.defaults_for(wl, {"split_tail": True})
    assert (asked["split_k"], asked["promote_overlap"]) == (3, 4)


@pytest.mark.parametrize("rung, wl, expected", CHOICES,
                         ids=[f"{r}-{wl.label()}" for r, wl, _ in CHOICES])
def test_the_heuristics_pick_these_knobs(rung, wl, expected):
    assert changed(schedules.get(wl.op, rung), wl) == expected


# The committed reports' rungs ran with the signature's defaults on these workloads.
COMMITTED = [gemm((1024, 512, 2048)), gemm((4096, 4096, 4096)),
             gemm((4096, 4096, 4096), "float16"), gemm((4096, 4096, 4096), "bfloat16"),
             gemm((4096, 4096, 4096), "bfloat16", "nt"), gemm((128, 128, 128), "bfloat16", "nt"),
             Workload("gemv", (7168, 16384), "float16"), Workload("gemv", (1024, 1024), "float16"),
             Workload("batched_gemv", (1, 7168, 16384), "float16"),
             Workload("batched_gemv", (8, 4096, 7168), "float16"),
             Workload("batched_gemv", (4, 7168, 2048), "float16")]
TUNED = [(op, e) for op in ("gemm", "gemv", "batched_gemv") for e in schedules.entries(op)
         if e.heuristic]


def test_every_tunable_rung_has_a_heuristic():
    assert sorted({(op, e.name) for op, e in TUNED}) == [
        ("batched_gemv", "multirow"), ("gemm", "skinny"), ("gemm", "v5"), ("gemm", "v5k"),
        ("gemm", "v5p"), ("gemm", "v5t"), ("gemm", "v6"), ("gemm", "v7"), ("gemm", "v8"),
        ("gemv", "multirow")]


@pytest.mark.parametrize("wl", COMMITTED, ids=Workload.label)
def test_the_committed_shapes_keep_the_signature_defaults(wl):
    for op, entry in TUNED:
        if op == wl.op:
            assert entry.defaults_for(wl) == entry.defaults, entry.name


def test_the_committed_gemv_shapes_need_no_exception_but_v5t_on_the_seed_would():
    """The GEMV rule gives the defaults there by itself; v5t's, on the seed GEMM's 16 tiles of
    128x256, would take 64x256 tiles and split K 8 ways (its search's best splits K 8 ways too:
    0.39 ms with the defaults, 0.062 tuned), which is why the committed shapes are kept as
    measured."""
    for wl in COMMITTED[6:]:
        entry = schedules.get(wl.op, "multirow")
        assert gemv.k_threads(wl, heuristics.H100_SMS, entry.defaults, entry.space) == {
            "reduce_threads": 32}
    v5t = schedules.get("gemm", "v5t")
    assert heuristics.split_k(gemm((1024, 512, 2048)), heuristics.H100_SMS, v5t.defaults,
                              v5t.space) == {"block_m": 64, "block_n": 256, "k_slices": 8}


def test_fewer_sms_need_fewer_tiles():
    v5 = schedules.get("gemm", "v5")
    wl = gemm((1024, 512, 2000))
    assert heuristics.register_tiles(wl, 132, v5.defaults, v5.space)["block_m"] == 32
    assert heuristics.register_tiles(wl, 128, v5.defaults, v5.space) == {"block_m": 64,
                                                                        "block_n": 64}


def test_knobs_set_by_the_user_win_and_the_heuristic_fills_the_rest():
    v5k, wl = schedules.get("gemm", "v5k"), gemm((1024, 512, 2000))
    # 2 slices of 128 tiles of 64x64 fill the SMs: the default tile stays
    assert changed(v5k, wl, {"k_slices": 2}) == {"k_slices": 2}
    # in one slice, 128 tiles of 64x64 fall short of 132 SMs: 256 of 32x64 do not
    assert changed(v5k, wl, {"k_slices": 1}) == {"block_m": 32, "k_slices": 1}
    # what the heuristic picks fits the user's knobs: 128-row tiles, 64 of 128x64 in 8 slices
    assert changed(v5k, wl, {"block_m": 128}) == {"block_m": 128, "k_slices": 8}
    # atomic_sum adds the slices' partials: at least 2 of them, though 2 K tiles are too few
    assert changed(v5k, gemm((64, 256, 64)), {"atomic_sum": True}) == {
        "block_m": 32, "k_slices": 2, "atomic_sum": True}
    named = resolve(wl, "v5k:k_slices=2", SearchResults())
    assert named.params == v5k.defaults_for(wl, {"k_slices": 2})
    v7 = schedules.get("gemm", "v7")
    assert changed(v7, gemm((16, 6144, 4096), "float16"), {"block_m": 128}) == {"block_n": 128}
    # four stages of 128 K: 64x128 tiles fit a Hopper block's shared memory, 128x256 do not
    assert v7.defaults_for(gemm((16, 4096, 4096), "float16"), {"chunk_k": 128})["stages"] == 4
    assert v7.defaults_for(gemm((8192, 8192, 4096), "float16"), {"chunk_k": 128})["stages"] == 3
    # v8 takes clusters on many waves of tiles only where the user left it the knobs they need
    v8, many_waves = schedules.get("gemm", "v8"), gemm((8192, 8192, 1024), "float16")
    assert changed(v8, many_waves) == {"cluster_m": 2}
    for knobs in ({"cluster_m": 1}, {"block_m": 256, "block_n": 128}, {"split_k": 2}):
        assert "cluster_m" not in changed(v8, many_waves, knobs)
    # v8's clusters take whole tiles: asked for one, the decode batch is not split in K
    decode = gemm((128, 4096, 4096), "bfloat16", "nt")
    assert changed(v8, decode)["split_k"] == 2
    for cluster in ({"cluster_m": 2}, {"cluster_n": 2}):
        assert changed(v8, decode, cluster) == {"block_m": 64, "block_n": 128, "stages": 8,
                                                "tma_store": False, **cluster}
    # pingpong only where asked for, and then whole tiles, unclustered, as wide as one
    # consumer's accumulators allow: 128x192 (nn too: three 64-column boxes), 64x256 (decode)
    assert "pingpong" not in changed(v8, many_waves)
    assert changed(v8, many_waves, {"pingpong": True}) == {"block_n": 192, "pingpong": True}
    assert changed(v8, decode, {"pingpong": True}) == {"block_m": 64, "stages": 5,
                                                       "tma_store": False, "pingpong": True}
    tall = gemm((4096, 6144, 4096), "bfloat16", "nt")  # 256x192 tiles, unasked
    assert changed(v8, tall, {"pingpong": True}) == {"block_n": 192, "pingpong": True}



def test_v8s_ring_is_deeper_on_unsplit_64_row_tiles_only():
    """ring_stages: the most stages that fit, up to 8 on an unsplit tile of one wgmma's rows and
    up to 6 on the rest (split 64-row tiles, 128 rows and more); a space holding only deeper
    rings keeps the least of them that fits (best's whole-K tile asks for 16)."""
    space = schedules.get("gemm", "v8").space
    assert ring_stages((64, 128), 1, space, False) == 8
    assert ring_stages((64, 128), 2, space, False) == 6
    assert ring_stages((128, 128), 1, space, False) == 6
    assert ring_stages((64, 256), 1, space, False) == 5  # 40 KB stages: 6 would not fit
    assert ring_stages((128, 256), 1, space, True) == 4
    assert ring_stages((64, 16), 1, {**space, "stages": [16]}, False) == 16
    assert ring_stages((256, 256), 1, {**space, "stages": [8]}, False) is None

GRID = [(1, 1, 1), (16, 6144, 4096), (1000, 4096, 4096), (3000, 1000, 2000), (257, 129, 65)]
DTYPES = {"v5t": ["float32"], "v6": ["float16"], "v7": ["bfloat16"]}
APPLIED = [(rung, gemm(shape, dtype, layout)) for rung in ("v5", "v5p", "v5k", "v5t", "v6", "v7")
           for shape in GRID for dtype in DTYPES.get(rung, ["float32", "bfloat16"])
           for layout in ("nn", "nt")]
APPLIED += [("v8", gemm(shape, "bfloat16", layout)) for shape in GRID[1:4] for layout in ("nn", "nt")]
APPLIED += [("multirow", Workload(op, shape, dtype)) for dtype in ("float16", "float32")
            for op, shape in (("gemv", (1, 1)), ("gemv", (4096, 64)), ("gemv", (129, 257)),
                              ("batched_gemv", (4, 128, 100)), ("gemv", (7168, 16384)))]


@pytest.mark.parametrize("rung, wl", APPLIED, ids=[f"{r}-{wl.label()}" for r, wl in APPLIED])
def test_every_heuristic_choice_applies(rung, wl, target):
    entry = schedules.get(wl.op, rung)
    picked = entry.heuristic(wl, heuristics.H100_SMS, entry.defaults, entry.space)
    assert set(picked) <= set(entry.space)  # a search's configurations override all of them
    entry.apply(wl, target)


_DRAWN = random.Random(49)
SWAPPED = [Workload("gemm", (m, n, k), dtype, out, "nt")
           for m, n, k in ((1, 4096, 4096), (7, 5120, 520), (300, 28672, 5120), (700, 1001, 4095),
                           (2500, 896, 896))
           + tuple(tuple(_DRAWN.randint(1, 20000) for _ in range(3)) for _ in range(10))
           for dtype, out in (("bfloat16", "bfloat16"), (FP8, "float32"))]


@pytest.mark.parametrize("wl", SWAPPED, ids=Workload.label)
def test_v8_asked_to_swap_picks_knobs_it_takes_and_stores_c_from_registers(wl, target):
    """`--schedule v8:swap_ab=true`: the heuristic picks the rest for the product the kernel
    computes (C^T = B A^T), never tma_store (the transposed tile goes out from registers),
    and v8 takes what it picked."""
    v8 = schedules.get("gemm", "v8")
    knobs = v8.defaults_for(wl, {"swap_ab": True})
    assert knobs["swap_ab"] and not knobs["tma_store"]
    v8.apply(wl, target, swap_ab=True)


@pytest.mark.parametrize("wl, asked, swapped", [
    (Workload("gemm", (16, 4096, 4096), "bfloat16", "bfloat16", "nt"), {}, True),
    (Workload("gemm", (1, 131072, 5120), "float16", "float32", "nt"), {}, True),
    (Workload("gemm", (7, 6144, 4096), FP8, "bfloat16", "nt", "row"), {}, True),
    (Workload("gemm", (3, 1001, 4095), "bfloat16", "bfloat16", "nt"), {}, True),
    (Workload("gemm", (17, 4096, 4096), "bfloat16", "bfloat16", "nt"), {}, False),
    (Workload("gemm", (16, 4096, 4096), "float16", "float16", "nn"), {}, False),
    (Workload("gemm", (7, 6144, 4096), FP8, "bfloat16", "nt", "block"), {}, False),
    (Workload("gemm", (16, 4096, 4096), "bfloat16", "bfloat16", "nt"), {"swap_ab": False}, False),
    (Workload("gemm", (16, 4096, 4096), "bfloat16", "bfloat16", "nt"), {"tma_store": True}, False),
    (Workload("gemm", (16, 4096, 4096), "bfloat16", "bfloat16", "nt"), {"block_n": 64}, False),
    (Workload("gemm", (7, 28672, 5120), "bfloat16", "bfloat16", "nt"), {"block_m": 64}, False),
    (Workload("gemm", (7, 28672, 5120), "bfloat16", "bfloat16", "nt"), {"stages": 4}, True),
], ids=str)
def test_v8_swaps_decode_batches_unasked_where_it_takes_the_swap(wl, asked, swapped, target):
    """At most SWAP_MOST_TOKENS rows of A in nt, the heuristic swaps unasked (the tokens on a
    narrow column of tiles, 8 or 16 wide: in v8's space, so a search measures this first), as
    `v8:swap_ab=true` would pick; not past it, not in nn, not with block scales, not where the
    user holds a knob the swap refuses (tma_store) or holds swap_ab=False, and not where the
    user holds the width or a tile no narrow column fits (64 rows at 8 columns): the swap would
    put their width on the tokens. Whatever it picks, v8 takes."""
    v8 = schedules.get("gemm", "v8")
    picked = v8.defaults_for(wl, asked)
    assert picked["swap_ab"] is swapped
    if swapped:
        assert picked == v8.defaults_for(wl, {**asked, "swap_ab": True})
        assert picked["block_n"] <= 16 and v8.own_choice(wl, asked) == picked
    v8.apply(wl, target, **asked)


@pytest.mark.parametrize("shape, tile", [
    ((300, 5120, 5120), (128, 104)), ((300, 28672, 5120), (256, 152)),
    ((700, 5120, 5120), (128, 240)), ((700, 16384, 2048), (256, 176)),
    ((7, 5120, 5120), (128, 8)), ((48, 5120, 5120), (128, 48))])
def test_v8_swapped_cuts_its_tiles_columns_to_m(shape, tile):
    """swap_ab's tiles: the tokens cut into columns of M's share in steps of 8, the count of
    columns and the tiles' rows as `cut_tiles` costs them. On each of these shapes the rule
    picks the tile that was fastest of those the first H200 run tried
    (notebook/logs/h200x4-v8-swap-ab-first-2026-11-27.log), which the rule was read off."""
    v8, wl = schedules.get("gemm", "v8"), Workload("gemm", shape, "bfloat16", "bfloat16", "nt")
    knobs = v8.defaults_for(wl, {"swap_ab": True})
    assert (knobs["block_m"], knobs["block_n"]) == tile


@pytest.mark.parametrize("wl, knobs", [
    (Workload("gemm", (64, 28672, 4096), FP8, "bfloat16", "nt"), {}),
    (Workload("gemm", (300, 13020, 4096), FP8, "bfloat16", "nt", "row"), {"promote_overlap": 8}),
    (Workload("gemm", (700, 5120, 4095), "bfloat16", "bfloat16", "nt"), {"pingpong": True}),
    (Workload("gemm", (300, 28672, 5120), "bfloat16", "bfloat16", "nt"), {"pingpong": True}),
    (Workload("gemm", (48, 9512, 4096), "bfloat16", "bfloat16", "nt"), {"split_tail": True}),
], ids=lambda x: x.label() if isinstance(x, Workload) else str(x))
def test_v8_swapped_with_other_knobs_asked_picks_tiles_it_takes(wl, knobs, target):
    """swap_ab beside knobs that bound the tile: promoted fp8 sums (128-row tiles, as unswapped:
    256 rows spill), promote_overlap's third set, pingpong's whole tiles, split_tail (a split
    even where no rule splits); v8 takes what the heuristic picks."""
    v8 = schedules.get("gemm", "v8")
    asked = {"swap_ab": True, **knobs}
    picked = v8.defaults_for(wl, asked)
    assert picked["block_m"] == 128 or knobs.get("pingpong")
    v8.apply(wl, target, **asked)


def test_a_rung_named_alone_runs_and_records_its_heuristic_knobs(target):
    v5k, wl = schedules.get("gemm", "v5k"), gemm((512, 512, 2048))
    mod = v5k.apply(wl, target)
    tvm.ir.assert_structural_equal(mod, v5k.apply(wl, target, **v5k.defaults_for(wl)))
    with pytest.raises(ValueError):
        tvm.ir.assert_structural_equal(mod, v5k.apply(wl, target, **v5k.defaults))
    ran = {s.name: s for s in selection(wl, "all", SearchResults())}
    assert ran["v5k"].params == v5k.defaults_for(wl) != v5k.defaults
    assert resolve(wl, "v5k", SearchResults()).params == ran["v5k"].params
    assert ran["v3"].params == schedules.get("gemm", "v3").defaults  # no heuristic


@pytest.mark.parametrize("wl, reason", [
    (gemm((3000, 1000, 2000)),  # the fp32-ragged suite's shape behind a KeyError in tma_tiles
     "v8 multiplies float16, bfloat16 or float8_e4m3fn on tensor cores, not float32"),
])
def test_a_workload_v8_refuses_gets_no_picks_and_one_line_saying_why(wl, reason, target):
    """`--schedule all` resolves every rung's knobs before it builds any: v8's heuristic picks
    nothing for a workload v8 takes with no knobs, and v8 refuses it in one line."""
    v8 = schedules.get("gemm", "v8")
    assert tma_tiles(wl, heuristics.H100_SMS, v8.defaults, v8.space) == {}
    ran = {s.name: s for s in selection(wl, "all", SearchResults())}
    assert ran["v8"].params == v8.defaults
    with pytest.raises(schedules.ScheduleNotApplicable) as refused:
        ran["v8"].apply(wl, target)
    assert str(refused.value) == reason



def random_workloads(seed: int = 49, shapes: int = 20) -> list[tuple[tuple, list[tuple]]]:
    """`shapes` random (M, N, K), each from 1 to 20000 (seeded), with the workloads' arguments
    that each gives: gemm in every input dtype (nn and nt; fp8 nt), with a random output dtype;
    gemv (N x K) and batched_gemv (L x N x K, L up to 64) in every dense dtype, and in nvfp4
    with K rounded up to its whole scale blocks of 16."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(shapes):
        M, N, K = (rng.randint(1, 20000) for _ in range(3))
        args = [("gemm", (M, N, K), dtype, rng.choice(DENSE_DTYPES), layout)
                for dtype in (*DENSE_DTYPES, FP8)
                for layout in (("nt",) if dtype == FP8 else ("nn", "nt"))]
        L = rng.randint(1, 64)
        for dtype, k in [*((d, K) for d in DENSE_DTYPES), ("nvfp4", -(-K // 16) * 16)]:
            args += [("gemv", (N, k), dtype), ("batched_gemv", (L, N, k), dtype)]
        drawn.append(((M, N, K), args))
    return drawn


def resolve_all(wl: Workload) -> None:
    """What `--schedule all` and `--schedule best` work out for `wl` before they build anything:
    best's rule, every rung's knobs (its heuristic's picks), each rung's refusal check where it
    has one, and the setting a search of its space measures first."""
    explore.rule(wl)
    for chosen in selection(wl, "all", SearchResults()):
        entry = schedules.get(wl.op, chosen.name)
        if entry.space:
            entry.own_choice(wl)
        if entry.refuse:
            try:
                entry.refuse(wl, **chosen.params)
            except ScheduleNotApplicable:
                pass


RANDOM = random_workloads()


@pytest.mark.parametrize("shape, args", RANDOM, ids=["x".join(map(str, s)) for s, _ in RANDOM])
def test_random_shapes_resolve_without_an_exception_other_than_a_refusal(shape, args):
    """No traceback on any shape (issue 49): a workload that cannot exist is a WorkloadError
    (one line), a rung that cannot take it a ScheduleNotApplicable; nothing else is raised.
    v8's heuristic once hit a KeyError on float32 GEMMs here."""
    resolved = 0
    for arg in args:
        try:
            wl = Workload(*arg)
        except WorkloadError:
            continue  # too large for int32 indices: refused in one line
        resolve_all(wl)
        resolved += 1
    assert resolved, f"no workload of {shape} could exist"


def test_v8s_heuristic_takes_any_partial_setting_of_its_space_without_a_traceback():
    """What a search asks v8 for each setting it proposes: the heuristic fills in the knobs a
    draw of v8's space leaves open, and v8's refusal says yes or no in one line. On 600 seeded
    draws of any subset of knobs (the swap's 8-column widths among them, on tiles that take no
    tma_store), over every input form, nothing else is raised."""
    rng = random.Random(71)
    v8 = schedules.get("gemm", "v8")
    forms = [("bfloat16", "bfloat16", "nt", None), ("float16", "float32", "nn", None),
             (FP8, "bfloat16", "nt", None), (FP8, "bfloat16", "nt", "row"),
             (FP8, "bfloat16", "nt", "block")]
    refused = 0
    for _ in range(600):
        shape = (rng.choice([1, 3, 8, 16, 17, 48, 333, 1000, 4096]), rng.randint(1, 30000),
                 rng.randint(1, 16384))
        wl = Workload("gemm", shape, *rng.choice(forms))
        knobs = rng.sample(sorted(v8.space), rng.randint(0, len(v8.space)))
        config = {knob: rng.choice(v8.space[knob]) for knob in knobs}
        try:
            v8.refuse(wl, **v8.defaults_for(wl, config))
        except ScheduleNotApplicable:
            refused += 1
    assert 0 < refused < 600


def test_v8s_heuristic_picks_only_settings_v8_takes_on_random_shapes():
    """v8's own choice (its rules, the timed tiles included) passes its refusals on 400 seeded
    random 16-bit and fp8 GEMMs, M drawn as decode batches, medium M or anything to 20000, N
    and K as anything or a real layer's: a pick v8 refused would fail every default run."""
    rng = random.Random(60)
    entry = schedules.get("gemm", "v8")
    checked = 0
    for _ in range(400):
        M = rng.choice([rng.randint(1, 64), rng.randint(65, 1500), rng.randint(1, 20000)])
        N, K = (rng.choice([rng.randint(1, 20000), rng.choice([896, 2048, 5120, 14336, 128256])])
                for _ in range(2))
        dtype = rng.choice(["float16", "bfloat16", FP8])
        layout = "nt" if dtype == FP8 else rng.choice(["nn", "nt"])
        try:
            wl = Workload("gemm", (M, N, K), dtype, rng.choice([None, "float32"]), layout)
        except WorkloadError:
            continue
        entry.refuse(wl, **entry.defaults_for(wl))  # raises ScheduleNotApplicable if refused
        checked += 1
    assert checked > 350


def test_short_k_multirow_reduces_within_groups_of_lanes(compiled):
    """K=64 halves: 8 K threads, 4 rows' threads to a warp; the all-reduce shuffles within
    groups of 8 lanes."""
    _, source, summary = compiled("multirow", Workload("gemv", (4096, 64), "float16"))
    assert "__launch_bounds__(64)" in source
    assert "__shfl_down_sync(mask_ptr[0], red_buf0_ptr[0], 4, 32)" in source
    assert "red_buf0_ptr[0], 8, 32)" not in source


# -- --schedule best ---------------------------------------------------------------------------

SHAPE = (256, 256, 256)
WL = gemm(SHAPE)
GPU, OTHER_GPU = "GPU A", "GPU B"


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def trial(template, config, ms, status="ok", shape=SHAPE, device=GPU, version=TVM):
    return {"search": "autotvm", "op": "gemm", "shape": list(shape), "dtype": "float32",
            "out_dtype": "float32", "layout": "nn", "schedule": template, "device": device,
            "tvm": version, "tuner": "grid", "seed": 0, "config": config, "status": status,
            "time_ms": ms, "error": None}


def run(schedule, ms, kind="rung", params=None, status="ok", gpu=GPU, version=TVM,
        flush="read", shape=SHAPE):
    return {"op": "gemm", "shape": list(shape), "dtype": "float32", "out_dtype": "float32",
            "layout": "nn", "schedule": schedule, "kind": kind, "params": params or {},
            "gpu": gpu, "driver": "-", "tvm": version, "flush": flush, "status": status,
            "run_id": "run", "date": "2026-01-01T00:00:00+00:00",
            "timing": {"median_ms": ms, "min_ms": ms, "max_ms": ms}}


V5K = {"block_m": 32, "block_n": 64, "k_slices": 2}
V5P = {**schedules.get("gemm", "v5p").defaults, "block_m": 32}


@pytest.fixture
def here_no_gpu(monkeypatch):
    """`best` on recorded timings alone, as on a machine without a GPU."""
    monkeypatch.setattr(measure, "gpu_present", lambda: False)


@pytest.fixture
def recorded(tmp_path):
    """Template trials and run results of WL: the correct ones on GPU A with this TVM, and
    faster ones that `best` must not take (failed, another GPU, TVM or shape, a baseline, a
    warm-L2 time, a MetaSchedule best without its work dir, knobs the rung no longer has)."""
    trials = write(tmp_path / "at.jsonl", [
        trial("v5k", V5K, 0.050), trial("v5k", {**V5K, "k_slices": 4}, 0.001, status="wrong"),
        trial("v5k", {**V5K, "k_slices": 8}, 0.001, device=OTHER_GPU),
        trial("v5k", {**V5K, "k_slices": 8}, 0.001, version="0.26.0"),
        trial("v5k", {**V5K, "k_slices": 8}, 0.001, shape=(256, 256, 512))])
    results = write(tmp_path / "results.jsonl", [
        run("v5p", 0.040, params=V5P),
        run("cublas", 0.001, kind="baseline"), run("v4", 0.001, status="failed"),
        run("v5", 0.001, gpu=OTHER_GPU), run("v5", 0.001, version="0.26.0"),
        run("v5", 0.001, flush="none"), run("v5", 0.001, shape=(256, 256, 512)),
        run("metaschedule", 0.001, kind="tuned", params={"work_dir": "ms"}),
        run("v5", 0.001, params={"split_k": 4})])
    return SearchResults(records=trials, results=results)


def ask_best(found, device=None):
    said = []
    chosen = resolve(WL, "best", SearchResults(None, found.records, device, found.results),
                     said.append)
    assert len(said) == 1
    return chosen, said[0]


def test_best_is_the_fastest_correct_record_of_this_gpu_and_tvm(here_no_gpu, recorded, target):
    chosen, said = ask_best(recorded, GPU)
    assert (chosen.name, chosen.kind, chosen.params) == ("v5p", "rung", V5P)
    assert said == (f"best: v5p (fastest correct of 2 records measured on {GPU}, TVM {TVM}, in "
                    f"{recorded.records} and {recorded.results}: 0.040 ms)")
    chosen.apply(WL, target)  # the kernel the record measured, rebuilt from its params


def test_best_takes_a_template_search_best_when_it_is_faster(here_no_gpu, recorded, tmp_path):
    faster = SearchResults(records=write(tmp_path / "more.jsonl",
                                         [trial("v5k", V5K, 0.050), trial("v5", {}, 0.030)]),
                           results=recorded.results)
    chosen, said = ask_best(faster, GPU)
    assert (chosen.name, chosen.params) == ("autotvm:v5", {})
    assert said.startswith("best: autotvm:v5 (fastest correct of 3 records") and "0.030 ms" in said


def test_best_never_takes_fast_accumulation_on_fp8_unasked(here_no_gpu, tmp_path):
    """A run of `v8:promote_k=none` (fast accumulation, another precision) is faster than v8's
    promoted default: `best` takes the default, as a search of v8 on fp8 would."""
    wl = Workload("gemm", SHAPE, "float8_e4m3fn", layout="nt")
    v8 = schedules.get("gemm", "v8")
    fp8 = {**wl.record_key(), "schema": 2}
    results = write(tmp_path / "results.jsonl", [
        {**run("v8", 0.040, params=v8.defaults_for(wl)), **fp8},
        {**run("v8:promote_k=none", 0.030, params=v8.defaults_for(wl, {"promote_k": None})),
         **fp8},
        {**run("autotvm:v8:promote_k=none", 0.020, kind="tuned",
               params=v8.defaults_for(wl, {"promote_k": None})), **fp8}])
    said = []
    chosen = resolve(wl, "best", SearchResults(None, write(tmp_path / "at.jsonl", []), GPU,
                                               results), said.append)
    assert chosen.name == "v8" and chosen.params["promote_k"] == 128, said


def test_best_without_a_device_takes_the_records_only_gpu(here_no_gpu, recorded, tmp_path):
    only = SearchResults(records=write(tmp_path / "one.jsonl", [trial("v5k", V5K, 0.050)]))
    chosen, said = ask_best(only)
    assert chosen.name == "autotvm:v5k" and f"measured on {GPU}," in said
    with pytest.raises(RecordsError, match=f"measured on {GPU}, {OTHER_GPU}: say whose"):
        ask_best(recorded)


def test_best_falls_back_on_the_rule_with_the_reason(here_no_gpu, recorded):
    chosen, said = ask_best(recorded, "GPU C")
    assert (chosen.name, chosen.params) == ("v5k", schedules.get("gemm", "v5k").defaults_for(WL))
    assert said == (f"best: v5k (no GPU here, and no records of this workload on GPU C with TVM "
                    f"{TVM} in {recorded.records} and {recorded.results}; rule: float32 GEMM "
                    f"whose 2 v5t tiles cannot fill half the 132 SMs -> v5k (split K))")


def test_best_on_a_gpu_measures_its_portfolio_where_no_records_know_the_workload(
        monkeypatch, tmp_path):
    """With a GPU and no records of the workload, `best` checks and times the portfolio's
    rungs here (recorded in --results, where the next `best` finds them) and takes the fastest
    correct one; a failed or slower rung, or cuBLAS, is not taken. One rung (v8 on a 16-bit
    GEMM in nn of at most 64 rows) is not measured: the rule names it."""
    wl = Workload("gemv", (1000, 1000), "float16")
    results = tmp_path / "results.jsonl"
    times = {"rowalign": 0.030, "blockreduce": 0.020, "multirow": 0.001, "allreduce": 0.025}
    asked = []

    def fake_explore(wl_, chosen, settings, say=print, warn=print, extra_records=None):
        asked.append((settings.results, [c.name for c in chosen]))
        ran = [Record(kind="rung", schedule=c.name, status="failed" if c.name == "multirow"
                      else "ok", timing=Timing(*[times[c.name]] * 3)) for c in chosen]
        return ran + [Record(kind="baseline", schedule="cublas", status="ok",
                             timing=Timing(0.0001, 0.0001, 0.0001))]

    monkeypatch.setattr(measure, "gpu_present", lambda: True)
    monkeypatch.setattr(measure, "device_facts", lambda: {"gpu": "GPU A", "arch": "sm_90"})
    monkeypatch.setattr(explore, "explore", fake_explore)
    said = []
    chosen = resolve(wl, "best", SearchResults(results=str(results)), said.append)
    assert chosen.name == "blockreduce"
    assert asked == [(str(results), ["rowalign", "blockreduce", "multirow", "allreduce"])]
    assert said == [f"best: blockreduce (measured here, no records knowing this workload: the "
                    f"fastest correct of rowalign, blockreduce, allreduce, 0.020 ms; recorded in "
                    f"{results})"]
    said.clear()
    v8 = resolve(gemm((48, 256, 256), "bfloat16", "nn"), "best", SearchResults(), said.append)
    assert v8.name == "v8" and len(asked) == 1 and said[0].startswith("best: v8 (no records")


def test_best_reads_the_committed_search_records_by_default(here_no_gpu):
    said = []
    chosen = resolve(gemm((1024, 512, 2048)), "best", SearchResults(), said.append)
    assert chosen.name == "autotvm:v5k" and chosen.params["k_slices"] == 4
    assert "reports/tuning/autotvm-h100.jsonl: 0.058 ms)" in said[0]


RULES = [(gemm((4096, 4096, 4096), "bfloat16", "nt"), "v8"),
         (gemm((4096, 4096, 4095), "bfloat16", "nt"), "v8"),  # rows staged for TMA
         (Workload("gemm", (4096, 4096, 4096), "float16", "float16"), "v8"),
         (Workload("gemm", (4096, 4096, 4095), "float16", "float16"), "v8"),
         (gemm((16, 6144, 4096), "bfloat16", "nt"), "v8"),
         (gemm((16, 6144, 4095), "bfloat16", "nt"), "v8"),
         (gemm((4096, 4096, 4096)), "v5t"), (gemm((1024, 512, 2048)), "v5k"),
         (gemm((4096, 1024, 4096), "float32", "nt"), "v5p"),  # v5t only in nn
         (gemm((128, 50257, 768)), "v5p"),  # too short a K for v5t
         (gemm((3000, 1000, 2000)), "v5p"),  # 96 tiles: over half the SMs
         (gemm((77, 3072, 768), "float32", "nt"), "v5k"),
         (Workload("gemv", (7168, 16384), "float16"), "blockreduce"),
         (Workload("gemv", (4096, 1024), "float16"), "blockreduce"),
         (Workload("gemv", (4096, 1000), "float16"), "blockreduce"),
         (Workload("gemv", (4608, 3584), "bfloat16"), "allreduce"),  # 3.5 steps of blockreduce
         (Workload("gemv", (3584, 18944), "float16"), "blockreduce"),  # 18.5: the last one short
         (Workload("batched_gemv", (8, 4096, 3584), "float16"), "allreduce"),
         (Workload("gemv", (4096, 4095), "bfloat16"), "rowalign"),  # rows not 16-byte vectors
         (Workload("gemv", (4096, 128), "float16"), "multirow"),  # under a vector per lane
         (Workload("batched_gemv", (8, 4096, 512), "float32"), "blockreduce")]


@pytest.mark.parametrize("wl, rung", RULES, ids=[wl.label() for wl, _ in RULES])
def test_the_rule_of_best(wl, rung):
    assert explore.rule(wl)[0] == rung


@pytest.mark.parametrize("wl, weighed", [
    (Workload("gemm", (7, 5120, 5120), "bfloat16", "bfloat16", "nt"), ["v8", "skinny"]),
    (Workload("gemm", (16, 333, 1000), "float32", layout="nt"), ["v5t", "v5k", "v5p", "v5", "skinny"]),
    (Workload("gemm", (7, 5120, 5120), "float16"), ["v8"]),  # nn
    (Workload("gemm", (7, 5120, 5120), FP8, layout="nt"), ["v8", "skinny"]),
    # skinny scales each sum once, after K: not per block
    (Workload("gemm", (7, 5120, 5120), FP8, layout="nt", scales="block"), ["v8"]),
    # past the 16 rows v8 swaps unasked, up to 512: v8 swapped and narrow tiles weighed beside
    # its default (at most 64 rows, those of 64 and 128 columns it does not pick itself)
    (Workload("gemm", (17, 5120, 5120), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_64]),
    # past 64 rows, v8's MEDIUM_TILES unsplit too, where v8 takes them; the narrow tile 128
    # wide, where it is not the default's own choice (it is at 128x14336x4096); and the tile
    # that fills the SMs best, unsplit, where it takes at most two rounds: 128 of 64x224 here
    (Workload("gemm", (128, 14336, 4096), FP8, "bfloat16", "nt", "row"),  # fp8: halved_tile
     ["v8", "v8:swap_ab=true", *MEDIUM_NAMES, "v8:block_m=64,block_n=224,split_k=1",
      halved(144)]),
    # (16-bit: and with pingpong, one consumer a tile, where it takes one round)
    (Workload("gemm", (700, 2048, 8192), "bfloat16", "bfloat16", "nt"),  # 121 of 64x192
     ["v8", *MEDIUM_NAMES, "v8:block_m=64,block_n=192,split_k=1", one_consumer(192)]),
    # 80 of 64x128 (nn: whole 64-column boxes), the narrow tile already, so only its pingpong
    (Workload("gemm", (300, 2048, 2048), "float16", "float16", "nn"),
     ["v8", NARROW_128, *MEDIUM_NAMES, one_consumer(128)]),
    (Workload("gemm", (512, 28672, 5120), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, *MEDIUM_NAMES]),
    (Workload("gemm", (513, 14336, 4096), "bfloat16", "bfloat16", "nt"), ["v8", *MEDIUM_NAMES]),
    (Workload("gemm", (64, 14336, 4096), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_64]),
    (Workload("gemm", (4096, 4096, 4096), "float16", "float16", "nn"), ["v8", *MEDIUM_NAMES]),
    (Workload("gemm", (48, 5120, 5120), "float16", "float16", "nn"), ["v8"]),
    # up to 64 rows, the whole-K tile where its ring of 16 stages holds all of K's blocks and
    # its tiles fit a wave: K = 896 in 16 bits (14 blocks), 2048 in fp8 (16), not 2048 in 16
    # bits (32), nor 9728 rows of B (152 x 3 tiles), nor past 64 rows
    (Workload("gemm", (48, 896, 896), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", SPLIT_128, WHOLE_K]),
    (Workload("gemm", (48, 2048, 2048), FP8, "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", SPLIT_128, WHOLE_K]),
    (Workload("gemm", (48, 2048, 2048), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", SPLIT_128]),
    (Workload("gemm", (48, 9728, 896), "bfloat16", "bfloat16", "nt"),  # the default 160 wide
     ["v8", "v8:swap_ab=true", NARROW_64, SPLIT_128]),
    (Workload("gemm", (65, 896, 896), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, *MEDIUM_NAMES, "v8:block_m=64,block_n=64,split_k=1",
      one_consumer(64), swapped_one_consumer(72)]),
    # 16-bit past 64 rows, up to 512: v8 swapped on 128-row tiles of the widest cut of the
    # tokens (300 in two columns of 152), K split to fill the SMs, where those tiles are fewer
    # than the SMs (18 x 2 here, not 224 x 2 at 300x28672x5120); not on fp8
    (Workload("gemm", (300, 2304, 9216), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", split_cut(152), NARROW_128, *MEDIUM_NAMES,
      "v8:block_m=64,block_n=96,split_k=1", one_consumer(96), swapped_one_consumer(104)]),
    (Workload("gemm", (300, 2304, 9216), FP8, "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, *MEDIUM_NAMES, "v8:block_m=64,block_n=96,split_k=1",
      halved(144)]),
    (Workload("gemm", (300, 28672, 5120), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, *MEDIUM_NAMES]),
    # ... nor where the rule leaves that tile's K whole (16 x 2 tiles of 128x256, K of 8 blocks),
    # nor where it is the swapped default's own choice (65 tokens: one column of 72, K in 2)
    (Workload("gemm", (500, 2048, 512), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, *MEDIUM_NAMES, one_consumer(128),
      swapped_one_consumer(128)]),
    (Workload("gemm", (65, 256, 512), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, *MEDIUM_NAMES, "v8:block_m=64,block_n=64,split_k=1",
      one_consumer(64), swapped_one_consumer(72)]),
    # the filling 64-row tile in two rounds (252 of 64x256, the medium tile): no pingpong
    (Workload("gemm", (398, 9216, 4096), "bfloat16", "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, *MEDIUM_NAMES]),
    (Workload("gemm", (48, 7168, 4096), FP8, "bfloat16", "nt", "block"), ["v8", SPLIT_128]),
    # fp8 where v8 takes 64x256 tiles for fewer rounds: those are its default, and the 128-row
    # tiles they replaced are weighed instead (`replaced_rows`); not where v8 keeps 128 rows
    (Workload("gemm", (300, 28672, 5120), FP8, "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", NARROW_128, MEDIUM_NAMES[1], halved(176), "v8:block_m=128"]),
    (Workload("gemm", (2500, 5120, 5120), FP8, "bfloat16", "nt"),
     ["v8", *MEDIUM_NAMES, halved(160)]),
    # ... and where it takes 64x128 tiles whole on a short K (best's narrow 64x128 tile is
    # then the default's own, not weighed twice)
    (Workload("gemm", (300, 2048, 2048), FP8, "bfloat16", "nt"),
     ["v8", "v8:swap_ab=true", *MEDIUM_NAMES, "v8:block_m=64,block_n=96,split_k=1",
      halved(144), "v8:block_m=128"]),
    # block scales past 64 rows: v8's tiles paired along N where its default leaves them alone,
    # alone where it pairs them (`other_pairing`); not at 48 rows
    (Workload("gemm", (4096, 7168, 16384), FP8, "bfloat16", "nt", "block"),
     ["v8", *MEDIUM_NAMES, "v8:cluster_n=1"]),
    (Workload("gemm", (1000, 7168, 16384), FP8, "bfloat16", "nt", "block"),
     ["v8", *MEDIUM_NAMES, "v8:cluster_n=2"]),
    (Workload("gemm", (48, 768, 3072), "float32", layout="nt"), ["v5t", "v5k", "v5p", "v5"]),
    # float32: v5t's square tiles where its default takes the narrow ones, and the reverse,
    # where C's square tiles give every SM one (`other_register_tile`); at 4096^3 (the ladder
    # report's shape, where v5t keeps its signature's tiles) both
    # (square in nt with two barriers a K tile)
    (Workload("gemm", (4096, 768, 3072), "float32", layout="nt"),
     ["v5t", "v5k", "v5p", "v5",
      f"v5t:{V5T_KNOBS},block_n=128,thread_m=8,thread_n=16,{V5T_K}=false"]),
    (Workload("gemm", (4096, 1024, 4096), "float32", layout="nt"),
     ["v5t", "v5k", "v5p", "v5", f"v5t:{V5T_KNOBS},block_n=64,thread_m=8,thread_n=8,{V5T_K}=true"]),
    (Workload("gemm", (4096, 4096, 4096), "float32"),
     ["v5t", "v5k", "v5p", "v5",
      f"v5t:{V5T_KNOBS},block_n=128,thread_m=8,thread_n=16,{V5T_K}=true",
      f"v5t:{V5T_KNOBS},block_n=64,thread_m=8,thread_n=8,{V5T_K}=true"]),
    # ... and in nn, v5t's signature tiles where they fill the SMs (its default there before)
    (Workload("gemm", (2048, 8192, 2048), "float32"),
     ["v5t", "v5k", "v5p", "v5", f"v5t:{V5T_KNOBS},block_n=64,thread_m=8,thread_n=8,{V5T_K}=true",
      "v5t:block_m=128,block_n=256,thread_m=8,thread_n=16,tile_k=32,stages=2,single_barrier=true"]),
    (Workload("gemm", (1000, 1000, 1000), "float32"), ["v5t", "v5k", "v5p", "v5"]),  # 64 tiles
], ids=lambda item: item.label() if isinstance(item, Workload) else "")
def test_best_weighs_skinny_swapped_v8_and_v8s_other_tiles_where_they_take_them(wl, weighed):
    assert explore.portfolio(wl) == weighed


@pytest.mark.parametrize("shape, dtype, layout, tile", [
    ((300, 2048, 2048), "bfloat16", "nt", (64, 80)),  # cuBLAS's: 32 x 4 columns of 80
    ((200, 2048, 2048), "float16", "nt", (64, 56)),  # 32 x 4 columns of 56
    ((300, 896, 4864), "bfloat16", "nt", (64, 56)),  # 14 x 6 of 56, not 9 of 40: too narrow
    ((300, 2304, 2048), "bfloat16", "nt", (64, 104)),  # 36 x 3: 4 would take 144 CTAs
    ((300, 16384, 2048), "bfloat16", "nt", None),  # 256 rows of tiles: more than one round
    ((600, 4224, 2048), "bfloat16", "nt", None),  # 66 x 2 columns of 304: wider than 256
    ((64, 2048, 2048), "bfloat16", "nt", None),  # up to MEDIUM_ROWS: the narrow tiles' rows
    ((300, 2048, 2048), "bfloat16", "nn", None),  # swap_ab is nt only
    ((300, 2048, 2048), FP8, "nt", None),  # 16-bit only, as the unswapped form
], ids=str)
def test_the_swapped_one_consumer_tile_cuts_the_tokens_as_narrow_as_one_round_allows(
        shape, dtype, layout, tile):
    wl = Workload("gemm", shape, dtype, layout=layout)
    assert swapped_one_consumer_tile(wl, heuristics.H100_SMS) == tile


def test_best_weighs_the_swapped_one_consumer_tile_only_where_it_weighs_the_swap():
    """Past SWAP_WEIGHED_ROWS rows the heuristic still gives the swapped tile; best leaves it."""
    wl = Workload("gemm", (600, 2048, 2048), "bfloat16", "bfloat16", "nt")
    assert swapped_one_consumer_tile(wl, heuristics.H100_SMS) == (64, 152)
    assert explore.one_consumer_tile(wl) and \
        not any("swap_ab=true" in name for name in explore.one_consumer_tile(wl))


@pytest.mark.parametrize("wl, left_out", [
    (Workload("gemm", (700, 4096, 4096), "bfloat16", "bfloat16", "nt"), (128, 192)),
    (Workload("gemm", (700, 3072, 3072), "bfloat16", "bfloat16", "nt"), (64, 256)),
], ids=lambda item: item.label() if isinstance(item, Workload) else str(item))
def test_best_weighs_no_medium_tile_that_is_the_defaults_own_choice(wl, left_out):
    """Where v8's heuristic already picks an unsplit MEDIUM_TILES shape, measuring it again
    would only cost: that setting is left out of the portfolio, the other one kept."""
    default = schedules.get("gemm", "v8").defaults_for(wl)
    assert (default["block_m"], default["block_n"], default["split_k"]) == (*left_out, 1)
    assert explore.medium_tiles(wl) == [
        f"v8:block_m={m},block_n={n},split_k=1" for m, n in MEDIUM if (m, n) != left_out]


def test_best_takes_a_portfolio_entry_with_knobs_where_it_measured_fastest(monkeypatch):
    """Where v8 swapped measures faster than v8's default, best runs it under its name, with
    the swap among its knobs."""
    wl = Workload("gemm", (48, 5120, 5120), "bfloat16", "bfloat16", "nt")
    times = {"v8": 0.030, "v8:swap_ab=true": 0.020, NARROW_64: 0.025}

    def fake_explore(wl_, chosen, settings, say=print, warn=print, extra_records=None):
        return [Record(kind=c.kind, schedule=c.name, status="ok",
                       timing=Timing(*[times[c.name]] * 3)) for c in chosen]

    monkeypatch.setattr(measure, "gpu_present", lambda: True)
    monkeypatch.setattr(measure, "device_facts", lambda: {"gpu": "GPU A", "arch": "sm_90"})
    monkeypatch.setattr(explore, "explore", fake_explore)
    said = []
    chosen = resolve(wl, "best", SearchResults(), said.append)
    assert chosen.name == "v8:swap_ab=true" and chosen.params["swap_ab"] is True
    assert f"fastest correct of v8, v8:swap_ab=true, {NARROW_64}" in said[-1]


def test_best_builds_its_portfolio_entries_with_their_knobs():
    """A portfolio entry with knobs runs as that rung with them, under that name."""
    wl = Workload("gemm", (48, 5120, 5120), "bfloat16", "bfloat16", "nt")
    swapped = explore._portfolio_schedule(wl, explore.SWAPPED_V8)
    assert swapped.name == "v8:swap_ab=true" and swapped.params["swap_ab"]
    assert explore._portfolio_schedule(wl, "v8").params["swap_ab"] is False


REPORTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports")


def _committed_latest(op: str, rungs: tuple[str, ...]) -> dict:
    """The latest committed run (reports/*.jsonl and *.jsonl.gz, read-flushed) of each of
    `op`'s workloads whose every rung of `rungs` was timed in it: {workload: {rung: median ms}}."""
    runs: dict = {}
    for path in glob.glob(os.path.join(REPORTS, "*.jsonl*")):
        for where, r, error in records.lines(path):
            assert error is None, (where, error)
            if r.get("op") == op and r.get("kind") == "rung" and r.get("status") == "ok" \
                    and r.get("flush") == "read" and r.get("schedule") in rungs:
                wl = Workload(op, tuple(r["shape"]), r["dtype"], layout=r.get("layout") or "nn")
                day = runs.setdefault(wl, {}).setdefault(r["run_id"][:11], {})
                day[r["schedule"]] = r["timing"]["median_ms"]
    latest = {wl: days[max(days)] for wl, days in runs.items()}
    return {wl: times for wl, times in latest.items() if set(times) == set(rungs)}


def test_the_rules_gemv_rung_is_within_3_percent_of_the_fastest_on_the_committed_gemvs():
    """The no-cliffs issue's goal for best's rule, on every committed GEMV run of the four
    rungs it chooses from."""
    latest = _committed_latest("gemv", ("blockreduce", "allreduce", "multirow", "rowalign"))
    assert len(latest) >= 20
    for wl, times in latest.items():
        assert times[explore.rule(wl)[0]] <= 1.03 * min(times.values()), (wl.label(), times)


def test_the_rules_float32_rung_is_near_the_portfolios_fastest_on_the_committed_shapes():
    """What the rule was read off (reports/notes/h100-shapes.md, "best's rule on float32"): at
    most 1% over the fastest of the four on average, and at most 3 shapes 3% or more behind."""
    latest = _committed_latest("gemm", ("v5", "v5p", "v5k", "v5t"))
    ratios = [times[explore.rule(wl)[0]] / min(times.values()) for wl, times in latest.items()
              if wl.dtype == "float32"]
    assert len(ratios) >= 50
    assert statistics.geometric_mean(ratios) <= 1.01 and sum(r > 1.03 for r in ratios) <= 3


def test_a_rung_named_alone_hints_at_its_tuned_configurations(recorded):
    said = []
    chosen = resolve(WL, "v5k", recorded, said.append)
    assert chosen.params == schedules.get("gemm", "v5k").defaults_for(WL)  # still the heuristic's
    assert said == [f"hint: {recorded.records} holds tuned configurations of v5k for "
                    f"{WL.label()}: --schedule autotvm:v5k runs the best of them (v5k alone runs "
                    "its shape heuristic's knobs)"]
    for name, found in (("v5p", recorded), ("v5k", SearchResults(results=recorded.results)),
                        ("v5k:k_slices=2", recorded)):
        said.clear()
        resolve(WL, name, found, said.append)
        assert said == [], name


def test_the_command_line_says_what_best_picked_and_builds_it(here_no_gpu, capsys, tmp_path):
    import runner

    code = runner.main(["--schedule", "best", "--no-ir", "--op", "gemv", "--shape", "4096x64",
                        "--results", str(tmp_path / "r.jsonl")])
    out, err = capsys.readouterr()
    assert code == 0
    assert err.startswith("best: multirow (no GPU here, and no records of this workload on any GPU "
                          "with TVM ")
    assert err.endswith("a 16-byte vector per lane of a warp (512) -> multirow (K threads "
                        "fitted to K))\n")
    assert "multirow: built: grid (x,y,z) 128x1x1, block (x,y,z) 8x8x1" in out  # 8 K threads
