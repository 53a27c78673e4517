"""GPU tier (`pytest -m gpu`, on the GPU machine): every rung and baseline computes the right
answer on random inputs, ragged shapes included; the harness and the runner work end to end."""

import json
import re

import pytest

import runner
import schedules
from schedules import ScheduleNotApplicable, Workload, gemm
from schedules.workloads import FP8
from tests.test_schedules import (FP8_GEMMS, ONLY_K_RAGGED_CAST, REFUSED, SKINNY_WORKLOADS,
                                  skinny_refusal)
from tuning import build, explore, measure, metaschedule, records

pytestmark = pytest.mark.gpu

WORKLOADS = [
    Workload("gemm", (1024, 512, 2048)),  # the seed blog's problem
    Workload("gemm", (1023, 511, 2047)),  # not a multiple of any tile
    Workload("gemm", (257, 129, 65)),  # odd K and N: v5..v5t load single elements
    Workload("gemm", (257, 129, 66), "float16", layout="nt"),  # rows of whole pairs
    Workload("gemm", (200, 136, 264), "float16", "float16", "nt"),
    Workload("gemm", (200, 136, 264), "bfloat16", layout="nt"),
    Workload("gemm", (128, 128, 128), "bfloat16", layout="nt"),  # the nt-bf16 tutorial's case
    Workload("gemm", (256, 384, 512), "float16"),  # whole tensor-core tiles, nn
    Workload("gemm", (384, 256, 256), "bfloat16"),
    Workload("gemm", (256, 256, 768), "float16", layout="nt"),
    Workload("gemm", (1, 1, 1), "float16"),  # less than one of any tile or vector
    Workload("gemm", (1000, 136, 200), "bfloat16", layout="nt"),  # ragged M, whole vectors
    Workload("gemm", (17, 250, 66), "float16"),  # a decode-sized M, 4-byte rows
    Workload("gemm", (256, 256, 100), "float16"),  # only K ragged: no padded C to copy out
    ONLY_K_RAGGED_CAST,  # ... and a cast that reads the accumulators straight
    *FP8_GEMMS,  # scaled per tensor (whole tiles; ragged M and N; rows TMA cannot load), by rows
    Workload("gemv", (1024, 1024), "float16"),  # the TileLang seed's problem
    Workload("gemv", (1001, 1000), "float16"),  # ragged rows and K steps
    Workload("gemv", (999, 1001), "float16"),  # odd K: single-element loads
    Workload("gemv", (1000, 2000), "float32"),
    Workload("gemv", (1, 1), "float16"),
    Workload("gemv", (257, 4094), "bfloat16"),  # K = 6 (mod 8): 4-byte vectors
    Workload("gemv", (31, 1001), "float32"),
    Workload("batched_gemv", (3, 1001, 1000), "float16"),
    Workload("batched_gemv", (3, 5, 4095), "float16"),
    Workload("batched_gemv", (4, 7168, 2048), "float16"),  # a batched seed shape
    # nvfp4: the batched seed's three shapes, then odd L and N with K an odd number of 16s
    Workload("batched_gemv", (1, 7168, 16384), "nvfp4"),
    Workload("batched_gemv", (8, 4096, 7168), "nvfp4"),
    Workload("batched_gemv", (4, 7168, 2048), "nvfp4"),
    Workload("batched_gemv", (3, 1001, 1008), "nvfp4"),
    Workload("gemv", (33, 48), "nvfp4"),
]
REFUSED = {**REFUSED, **{("skinny", wl.label()): skinny_refusal(wl) for wl in WORKLOADS
                        if wl.op == "gemm"}}  # none of these: skinny's own cases are below
CASES = [(e.name, wl) for wl in WORKLOADS for e in schedules.entries(wl.op) if not e.baseline and e.takes(wl)]
# dlight is TVM's; it is checked wherever it builds (it fails inside TVM on ragged batched GEMV,
# which the runner reports as a build failure).
CASES += [("dlight", wl) for wl in WORKLOADS if wl.label() != "batched_gemv 3x1001x1000 float16 nt"]


@pytest.fixture(scope="module")
def target():
    return build.cuda_target(measure.device_facts()["arch"])


def check(wl, run, inputs, tolerance):
    out = run()
    err = measure.relative_error(out, measure.reference(wl, inputs))
    assert err <= tolerance, f"relative error {err:.3g} > {tolerance:g}"
    return err


def check_module(wl, mod, target, seed, calls=1):
    """Build a scheduled module and check it on random inputs (`seed`) into a poisoned output,
    `calls` times into that same output."""
    inputs = measure.random_inputs(wl, seed)
    run = measure.tvm_runner(build.build(mod, target), wl, inputs, measure.poisoned_output(wl))
    for _ in range(calls):
        check(wl, run, inputs, measure.tolerance(wl))


@pytest.mark.parametrize("name, wl", CASES, ids=[f"{n}-{wl.label().replace(' ', '-')}" for n, wl in CASES])
def test_schedule_is_correct_on_random_inputs(name, wl, target):
    reason = REFUSED.get((name, wl.label()))
    if reason:
        with pytest.raises(ScheduleNotApplicable, match=re.escape(reason)):
            schedules.get(wl.op, name).apply(wl, target)
        return
    mod = schedules.get(wl.op, name).apply(wl, target)
    executable = build.build(mod, target)
    for seed in (1, 2):  # fresh inputs, fresh poison: the same function on any input
        inputs = measure.random_inputs(wl, seed)
        out = measure.poisoned_output(wl)
        check(wl, measure.tvm_runner(executable, wl, inputs, out), inputs, measure.tolerance(wl))


@pytest.mark.parametrize("k_slices", [2, 3, 4])
@pytest.mark.parametrize("wl", [WORKLOADS[0], WORKLOADS[5], Workload("gemm", (200, 136, 256), "float16", "float16", "nt"),
                                Workload("gemm", (200, 130, 256), "float16", "float16", "nt"),
                                Workload("gemm", (257, 129, 65)), Workload("gemm", (100, 60, 72), "float16", "float16", "nt")],
                         ids=lambda wl: wl.label())
def test_v5k_is_correct(wl, k_slices, target):
    """K in slices whose float32 partials a second kernel sums 4 outputs at a time (and casts,
    for float16 C); tiles that overhang M and N, rows that end in part of a vector, and K that
    is not whole slices (the last slice shorter, or empty)."""
    check_module(wl, schedules.get("gemm", "v5k").apply(wl, target, k_slices=k_slices), target, 5)


@pytest.mark.parametrize("single_barrier", [True, False])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("wl", [WORKLOADS[0], Workload("gemm", (200, 136, 256)),
                                Workload("gemm", (256, 128, 8192), layout="nt")],
                         ids=lambda wl: wl.label())
def test_v5p_pipelines_are_correct(wl, stages, single_barrier, target):
    """v5p's cp.async pipelines, double and triple buffered, with one barrier per K tile and
    with TVM's two; tiles that overhang M and N; a long K (256 tiles of 32)."""
    mod = schedules.get("gemm", "v5p").apply(wl, target, stages=stages, single_barrier=single_barrier)
    check_module(wl, mod, target, 7, calls=2)


@pytest.mark.parametrize("knobs", [{}, {"rows_per_thread": 4, "tile_k": 16},
                                   {"reduce_threads": 128, "rows_per_block": 2, "rows_per_thread": 1},
                                   {"reduce_threads": 64, "tile_k": 32, "rows_per_block": 8}])
@pytest.mark.parametrize("wl", [*SKINNY_WORKLOADS, Workload("gemm", (8, 1001, 4096), "float16", "float16", "nt"),
                                Workload("gemm", (2, 4096, 1024), "bfloat16", "float32", "nt"),
                                Workload("gemm", (16, 250, 66), "float16", "float16", "nt")],
                         ids=lambda wl: wl.label())
def test_skinny_is_correct(wl, knobs, target):
    """A few rows of A, each a GEMV of W: ragged N and K (single elements, 8-byte vectors),
    16-bit and float32 C, several rows of W a thread, K threads over several warps."""
    check_module(wl, schedules.get("gemm", "skinny").apply(wl, target, **knobs), target, 3)


@pytest.mark.parametrize("knobs", [{}, {"k_slices": 8}, {"block_m": 64, "block_n": 128, "thread_m": 16,
                                    "thread_n": 8, "k_slices": 4, "fragment_stages": 1, "stages": 3}])
@pytest.mark.parametrize("wl", [WORKLOADS[0], Workload("gemm", (200, 136, 256)), Workload("gemm", (200, 136, 256), layout="nt")],
                         ids=lambda wl: wl.label())
def test_v5t_is_correct(wl, knobs, target):
    """A transposed in shared memory, the fragment pipeline, split K; tiles that overhang M and
    N, and B in both layouts."""
    check_module(wl, schedules.get("gemm", "v5t").apply(wl, target, **knobs), target, 6)


@pytest.mark.parametrize("wl, picked", [
    (Workload("gemm", (1900, 2050, 72)), gemm.V5T_SQUARE),  # 255 tiles of 128x128: 97% of 264
    (Workload("gemm", (1900, 2050, 72), layout="nt"), {**gemm.V5T_SQUARE, "single_barrier": False}),
    (Workload("gemm", (1100, 2100, 301), layout="nt"), gemm.V5T_NARROW)],  # 153: 58%; ragged K
    ids=lambda x: x.label() if isinstance(x, Workload) else "")
def test_v5t_square_and_narrow_tiles_are_correct(wl, picked, target):
    """v5t's tiles where C has a 128x128 tile for every SM (cuBLAS's, K tiles of 8, and the
    narrow ones), picked by its heuristic, over ragged M, N and K, in both layouts."""
    entry = schedules.get("gemm", "v5t")
    assert picked.items() <= entry.defaults_for(wl).items()
    check_module(wl, entry.apply(wl, target), target, 6)


@pytest.mark.parametrize("name, knobs", [
    ("v5k", {"k_slices": 2}), ("v5k", {"block_m": 64, "block_n": 64, "thread_n": 8, "k_slices": 4}),
    ("v5k", {"k_slices": 4, "overlap_zeroing": False}), ("v5t", {"block_n": 128, "k_slices": 8})],
    ids=lambda x: x if isinstance(x, str) else ",".join(f"{k}={v}" for k, v in x.items()))
@pytest.mark.parametrize("wl", [WORKLOADS[0], Workload("gemm", (256, 384, 1024), layout="nt"),
                                Workload("gemm", (256, 384, 1024), "float16")],
                         ids=lambda wl: wl.label())
def test_atomic_sum_is_correct_call_after_call(name, wl, knobs, target):
    """Slices added into C with red.global.add: C is zeroed by the function itself, so a second
    call into the same output gives the same answer, not twice it; with the main kernel
    overlapping the zeroing (the default) or after it."""
    try:
        mod = schedules.get("gemm", name).apply(wl, target, atomic_sum=True, **knobs)
    except ScheduleNotApplicable as e:
        assert name == "v5t" and wl.dtype != "float32", str(e)
        return
    check_module(wl, mod, target, 9, calls=2)


@pytest.mark.parametrize("wl, knobs", [
    (Workload("gemm", (256, 512, 384), "float16"), {}),
    (Workload("gemm", (256, 512, 384), "bfloat16", layout="nt"), {}),
    (Workload("gemm", (256, 512, 384), "float16"), {"block_m": 64, "block_n": 128, "stages": 3}),
    (Workload("gemm", (256, 512, 384), "bfloat16", layout="nt"), {"block_m": 256, "block_n": 64, "stages": 3}),
    (Workload("gemm", (256, 512, 384), "bfloat16"), {"block_n": 128, "chunk_k": 128, "stages": 3}),
    (Workload("gemm", (128, 256, 128), "float16", layout="nt"), {}),  # 2 chunks, fewer than the stages
    (Workload("gemm", (1000, 300, 200), "bfloat16", layout="nt"), {"block_n": 128}),  # padded tiles
    (Workload("gemm", (70, 130, 1000), "float16"), {"block_m": 64, "block_n": 64, "stages": 3}),
], ids=lambda x: x.label() if isinstance(x, Workload) else ",".join(f"{k}={v}" for k, v in x.items()) or "defaults")
def test_v7_is_correct(wl, knobs, target):
    """wgmma from swizzled tiles: both B layouts, one to four warpgroups per block, n from 64
    to 256, K chunks of one and two swizzled rows, a K loop shorter than the pipeline."""
    check_module(wl, schedules.get("gemm", "v7").apply(wl, target, **knobs), target, 8)


@pytest.mark.parametrize("wl, knobs", [
    (Workload("gemm", (4096, 4096, 4096), "float16", "float16", "nt"), {}),  # 16-bit C (SETTLE)
    (Workload("gemm", (1000, 1000, 1000), "bfloat16", "bfloat16", "nn"), {}),
    (Workload("gemm", (2048, 2048, 520), "float16"), {"block_n": 128}),  # 256 tiles: 2 per CTA
    (Workload("gemm", (300, 520, 136), "bfloat16", layout="nt"), {"block_m": 256, "block_n": 128}),
    (Workload("gemm", (300, 520, 136), "float16", "float16"), {"block_m": 64, "block_n": 256}),
    (Workload("gemm", (16, 6144, 4096), "bfloat16", layout="nt"), {}),  # 64-row tiles split along N
    (Workload("gemm", (1, 512, 64), "float16", "float16", "nn"), {"block_m": 64, "block_n": 128}),
    (Workload("gemm", (1000, 1000, 1000), "float16", layout="nt"), {"stages": 2, "group_m": 1}),
    (Workload("gemm", (1000, 1000, 1000), "float16", layout="nt"), {"group_m": 16, "block_n": 192}),
    (Workload("gemm", (128, 4096, 4096), "bfloat16", layout="nt"), {}),  # split K: 64x128 tiles in 2
    (Workload("gemm", (16, 6144, 4096), "bfloat16", "bfloat16", "nt"), {"split_k": 8}),
    (Workload("gemm", (100, 304, 1000), "float16", "float16"), {"block_m": 64, "split_k": 3}),
    (Workload("gemm", (300, 520, 136), "bfloat16"), {"block_n": 128, "split_k": 3, "stages": 2}),
    (Workload("gemm", (1024, 2048, 520), "float16", layout="nt"), {"block_n": 128, "split_k": 3}),
    (Workload("gemm", (77, 301, 136), "bfloat16", "bfloat16", "nt"), {"split_k": 2}),  # odd N
    (Workload("gemm", (100, 302, 136), "float16", "float16", "nt"), {}),  # 16-bit C, N % 4 == 2
    # split_tail: 160 tiles = 132 whole + 28 in 4 uneven slices; 162 = 132 + 30 in 3, 16-bit C
    (Workload("gemm", (1000, 2560, 520), "bfloat16", layout="nt"),
     {"block_n": 128, "split_k": 4, "split_tail": True}),
    (Workload("gemm", (1100, 4608, 1024), "float16", "float16", "nt"), {"split_k": 3, "split_tail": True}),
    # fp8: its scales applied once, after split K's sum; both consumer splits; every C dtype
    (Workload("gemm", (1000, 1000, 1008), FP8, "float32"), {}),  # split K (the heuristic's)
    (Workload("gemm", (300, 520, 256), FP8), {"block_m": 256, "block_n": 128, "promote_k": None}),
    (Workload("gemm", (16, 6144, 4096), FP8, "float16"), {"split_k": 8}),
    (Workload("gemm", (1100, 4608, 1024), FP8), {"split_k": 3, "split_tail": True}),
    (Workload("gemm", (100, 302, 272), FP8, "float16"), {}),  # 16-bit C, N % 4 == 2
    (Workload("gemm", (77, 301, 144), FP8, "float32"), {"block_m": 64, "stages": 2}),  # odd N
    (Workload("gemm", (256, 512, 16384), FP8, "float32"), {}),  # the accumulator's drift over K
    # nt: block_n in 16-column steps (one wave of 256x144 tiles: the heuristic's)
    (Workload("gemm", (1000, 4608, 3584), "bfloat16", layout="nt"), {}),
    (Workload("gemm", (300, 520, 136), "float16", "float16", "nt"), {"block_m": 256, "block_n": 176}),
    (Workload("gemm", (100, 302, 272), "bfloat16", "bfloat16", "nt"), {"block_m": 128, "block_n": 80}),
    (Workload("gemm", (77, 301, 144), FP8), {"block_m": 64, "block_n": 96, "split_k": 2}),
    # tma_store: C through shared boxes by TMA, clipped at C's edges; boxes of 128-, 64- and
    # 32-byte rows; one box per tile (the two boxes' turns run on from tile to tile)
    (Workload("gemm", (1000, 1000, 1000), "bfloat16", layout="nt"), {"tma_store": True}),
    (Workload("gemm", (2000, 2000, 520), "float16", "float16"), {"block_n": 128, "tma_store": True}),
    (Workload("gemm", (300, 520, 136), "bfloat16", "bfloat16", "nt"),
     {"block_m": 128, "block_n": 80, "tma_store": True}),
    (Workload("gemm", (300, 520, 136), "float16", layout="nt"),
     {"block_m": 128, "block_n": 80, "tma_store": True}),
    (Workload("gemm", (300, 1000, 136), "bfloat16", "bfloat16", "nt"),
     {"block_m": 64, "block_n": 64, "tma_store": True}),
    (Workload("gemm", (1000, 520, 272), "float16", layout="nt"),
     {"block_m": 256, "block_n": 176, "stages": 2, "tma_store": True}),
    (Workload("gemm", (1000, 2560, 520), "bfloat16", layout="nt"),
     {"block_n": 128, "split_k": 4, "split_tail": True, "tma_store": True}),
    (Workload("gemm", (16, 6144, 4096), FP8, "float16"), {"split_k": 8, "tma_store": True}),
    # clusters of 2 CTAs sharing A by multicast: ragged M and N, a CTA whose tile lies wholly
    # past N (its B zero-filled), 64-, 128- and 256-row tiles, nn, several tiles per CTA, fp8
    (Workload("gemm", (1000, 1000, 1000), "bfloat16", layout="nt"), {"cluster_n": 2}),
    (Workload("gemm", (300, 768, 136), "bfloat16", "bfloat16", "nt"), {"cluster_n": 2}),
    (Workload("gemm", (100, 1000, 272), "float16", "float16", "nt"),
     {"block_m": 64, "block_n": 128, "cluster_n": 2}),
    (Workload("gemm", (1000, 1000, 520), "float16", layout="nt"),
     {"block_m": 256, "block_n": 128, "cluster_n": 2}),
    (Workload("gemm", (2048, 2048, 520), "float16", "float16"),
     {"block_n": 128, "cluster_n": 2, "tma_store": True}),
    (Workload("gemm", (1000, 1024, 1008), FP8), {"split_k": 1, "cluster_n": 2, "tma_store": True}),
    # or stacked along M, sharing B in halves (nt) or in every other 64-column box (nn)
    (Workload("gemm", (1000, 1000, 1000), "float16", "float16", "nt"), {"cluster_m": 2}),
    (Workload("gemm", (300, 520, 136), "bfloat16", "bfloat16", "nt"), {"block_n": 128, "cluster_m": 2}),
    (Workload("gemm", (100, 1000, 272), "float16", "float16", "nt"),
     {"block_m": 64, "block_n": 128, "cluster_m": 2}),
    (Workload("gemm", (2048, 2048, 520), "float16"), {"cluster_m": 2, "tma_store": True}),
    (Workload("gemm", (1000, 1024, 1008), FP8, "float16"), {"split_k": 1, "cluster_m": 2}),
    # pingpong: each consumer whole tiles in turn; a CTA of one unit (consumer 1 idle), of two,
    # of an odd count; 128x128, 128x192 and 64x256 tiles, ragged edges, K shorter than the
    # ring (one K block), TMA's or the registers' stores of C, fp8
    (Workload("gemm", (1000, 1000, 1000), "bfloat16", layout="nt"), {"block_n": 128, "pingpong": True}),
    (Workload("gemm", (2000, 2000, 520), "float16", "float16"),
     {"block_n": 128, "tma_store": True, "pingpong": True}),
    (Workload("gemm", (1500, 3000, 1000), "bfloat16", "bfloat16", "nt"),
     {"block_n": 192, "tma_store": False, "pingpong": True}),
    (Workload("gemm", (1000, 2560, 520), "float16", layout="nt"),
     {"block_m": 64, "block_n": 256, "pingpong": True}),
    (Workload("gemm", (3000, 2000, 64), "float16", "float16"),
     {"block_n": 128, "stages": 4, "tma_store": True, "pingpong": True}),
    (Workload("gemm", (4100, 2048, 1024), FP8, "float16"),
     {"block_n": 128, "pingpong": True, "promote_k": None}),
    (Workload("gemm", (2000, 2000, 1000), "bfloat16", "bfloat16", "nt"),
     {"block_n": 128, "cluster_m": 2, "pingpong": True}),
    (Workload("gemm", (2000, 1504, 520), "float16", layout="nn"),
     {"block_n": 128, "cluster_n": 2, "tma_store": True, "pingpong": True}),
    # promote_k (fp8): every K block promoted, or every other with an odd count left for the
    # tail; split K's uneven slices; 64-row tiles; 128x192 tiles (96 sums a thread)
    (Workload("gemm", (256, 512, 16384), FP8, "float32"), {"block_n": 128, "promote_k": 128}),
    (Workload("gemm", (1100, 4608, 1024), FP8),
     {"block_n": 128, "split_k": 3, "split_tail": True, "promote_k": 256}),
    (Workload("gemm", (77, 301, 144), FP8, "float32"), {"block_m": 64, "promote_k": 256}),
    (Workload("gemm", (1000, 2000, 3000), FP8, "float16"), {"block_n": 192, "promote_k": 128}),
    # promote_overlap: whole runs; runs and the blocks after them, split K's slices of 2 and 3
    # blocks; 64-row tiles; rowwise scales
    (Workload("gemm", (256, 512, 16384), FP8, "float32"),
     {"block_n": 128, "promote_k": 128, "promote_overlap": 4}),
    (Workload("gemm", (1100, 4608, 1024), FP8),
     {"block_n": 128, "split_k": 3, "split_tail": True, "promote_k": 128, "promote_overlap": 2}),
    (Workload("gemm", (77, 301, 1168), FP8, "float32"),
     {"block_m": 64, "block_n": 256, "promote_k": 128, "promote_overlap": 4}),
    (Workload("gemm", (1000, 2000, 3000), FP8, "bfloat16", "nt", "row"),
     {"block_n": 128, "promote_k": 128, "promote_overlap": 8}),
    # promote_halves: a K block's halves of the columns promoted under each other's wgmmas:
    # runs and a shorter run after them, ragged M, N and K, split K's slices (runs of one),
    # rowwise and block scales, 64-row tiles, a float32 C
    (Workload("gemm", (1000, 4608, 1152), FP8),
     {"block_n": 144, "promote_k": 128, "promote_overlap": 4, "promote_halves": True}),
    (Workload("gemm", (1100, 900, 1040), FP8, "float32"),
     {"block_n": 160, "split_k": 3, "split_tail": True, "promote_k": 128,
      "promote_overlap": 2, "promote_halves": True}),
    (Workload("gemm", (300, 2000, 3000), FP8, "bfloat16", "nt", "row"),
     {"block_n": 192, "split_k": 1, "promote_k": 128, "promote_overlap": 4,
      "promote_halves": True}),
    (Workload("gemm", (1000, 2000, 1792), FP8, "bfloat16", "nt", "block"),
     {"block_n": 160, "split_k": 1, "promote_k": 128, "promote_overlap": 4,
      "promote_halves": True}),
    (Workload("gemm", (77, 301, 1168), FP8, "float16"),
     {"block_m": 64, "block_n": 256, "promote_k": 128, "promote_overlap": 4,
      "promote_halves": True}),
    # the runs the heuristic picks (registered_run): two of 6 and 2 blocks after them (K =
    # 1792); one of 7 (K = 896), block-scaled
    (Workload("gemm", (1000, 2000, 1792), FP8),
     {"block_n": 128, "promote_k": 128, "promote_overlap": 6}),
    (Workload("gemm", (1000, 2000, 896), FP8, "bfloat16", "nt", "block"), {}),
    # rows TMA cannot load, staged into padded rows first: A and B (K = 4095, 16-bit C), B
    # alone (nn, N odd), fp8 with K not a multiple of 16, split K, a decode batch, pingpong
    (Workload("gemm", (2000, 3000, 4095), "bfloat16", "bfloat16", "nt"), {}),
    (Workload("gemm", (1000, 1001, 1024), "float16", "float16", "nn"), {}),
    (Workload("gemm", (300, 777, 1000), FP8, "bfloat16"), {}),
    (Workload("gemm", (16, 4096, 4095), "float16", "float16", "nt"), {"split_k": 4}),
    (Workload("gemm", (1000, 1000, 999), "bfloat16", layout="nt"),
     {"block_n": 128, "pingpong": True}),
    # fp8's scales by rows: promoted (the default) and fast, split K, a decode batch, tma_store
    (Workload("gemm", (1000, 2000, 3000), FP8, "bfloat16", "nt", "row"), {}),
    (Workload("gemm", (1100, 4608, 1024), FP8, "float16", "nt", "row"),
     {"promote_k": None, "split_k": 3, "split_tail": True, "tma_store": True}),
    (Workload("gemm", (16, 6144, 4096), FP8, "bfloat16", "nt", "row"), {}),
    # swap_ab: C^T = B A^T, C stored transposed: columns cut to a few tokens (8-column steps)
    # and ragged; float32 and 16-bit C; split K; rows staged (K = 4095, rows of B N = 1001);
    # fp8 per tensor and rowwise (its scales swapped too); the consumers splitting block_n
    (Workload("gemm", (300, 1000, 1000), "bfloat16", "bfloat16", "nt"),
     {"swap_ab": True, "tma_store": False, "block_n": 152}),
    (Workload("gemm", (7, 5120, 520), "float16", "float16", "nt"),
     {"swap_ab": True, "tma_store": False, "block_n": 8, "split_k": 3}),
    (Workload("gemm", (300, 1001, 4095), "bfloat16", "float32", "nt"),
     {"swap_ab": True, "tma_store": False, "block_n": 104}),
    (Workload("gemm", (77, 301, 1168), FP8, "float32"),
     {"swap_ab": True, "tma_store": False, "block_m": 64, "block_n": 48}),
    (Workload("gemm", (300, 2000, 1000), FP8, "bfloat16", "nt", "row"),
     {"swap_ab": True, "tma_store": False, "block_n": 152, "split_k": 2}),
    # ... the heuristic's swapped tiles (256x152 here), pingpong, clusters along N, split_tail
    (Workload("gemm", (300, 28672, 1024), "bfloat16", "bfloat16", "nt"), {"swap_ab": True}),
    (Workload("gemm", (700, 2000, 1000), "float16", "float16", "nt"),
     {"swap_ab": True, "tma_store": False, "block_n": 176, "pingpong": True}),
    (Workload("gemm", (300, 1000, 1000), "bfloat16", "float32", "nt"),
     {"swap_ab": True, "tma_store": False, "block_n": 152, "split_k": 1, "cluster_n": 2}),
    (Workload("gemm", (300, 9000, 2048), "bfloat16", "bfloat16", "nt"),
     {"swap_ab": True, "tma_store": False, "block_n": 152, "split_k": 2, "split_tail": True}),
    # best's whole-K tile (a ring of 16 stages holding all of K; ragged M, N and K) and narrow
    # tile (64x64, K split, fp8's promotions overlapped)
    (Workload("gemm", (37, 1000, 1000), "bfloat16", "bfloat16", "nt"),
     {"swap_ab": True, "block_m": 64, "block_n": 16, "split_k": 1, "stages": 16}),
    (Workload("gemm", (48, 2048, 2000), FP8, "bfloat16", "nt"),
     {"swap_ab": True, "block_m": 64, "block_n": 16, "split_k": 1, "stages": 16}),
    (Workload("gemm", (48, 2048, 2048), FP8, "bfloat16", "nt"), {"block_n": 64}),
    # best's filling tiles: widths outside the space, in whole 16-column steps (ragged M and N;
    # 64x96 with tma_store's narrower boxes; fp8's promotions overlapped on 64x224, and rowwise
    # on 128x112)
    (Workload("gemm", (700, 2000, 1000), "bfloat16", "bfloat16", "nt"),
     {"block_m": 128, "block_n": 240, "split_k": 1}),
    (Workload("gemm", (300, 2000, 1000), "bfloat16", "float32", "nt"),
     {"block_m": 64, "block_n": 96, "split_k": 1, "tma_store": True}),
    (Workload("gemm", (300, 5000, 2048), FP8, "bfloat16", "nt"),
     {"block_m": 64, "block_n": 224, "split_k": 1}),
    (Workload("gemm", (700, 2000, 1024), FP8, "bfloat16", "nt", "row"),
     {"block_m": 128, "block_n": 112, "split_k": 1}),
    # fp8's default of 64x128 tiles whole where 128-row ones would split a short K
    # (`short_k_tile`; ragged N, and K staged)
    (Workload("gemm", (300, 2000, 1000), FP8, "bfloat16", "nt"), {}),
], ids=lambda x: x.label() if isinstance(x, Workload) else ",".join(f"{k}={v}" for k, v in x.items()) or "defaults")
def test_v8_is_correct(wl, knobs, target):
    """TMA, mbarrier ring and warp specialization: both B layouts, 16-bit C, the consumers
    splitting the tile along M (block_m 128, 256) and along N (block_m 64), several tiles per
    CTA, the ring shorter and longer than the K loop, every raster, ragged M, N and K, split K
    (uneven slices, 16-bit C, units of one tile on several CTAs and several tiles per CTA; or
    only the last wave's tiles, split_tail), fp8 with its scales, C stored by TMA (tma_store),
    clusters of 2 CTAs sharing A's or B's loads (cluster_n, cluster_m), ping-pong consumers
    taking turns at whole tiles (pingpong), fp8's sums promoted into float32 (promote_k), rows
    TMA cannot load (staged into padded rows, after a barrier of the grid), the swapped product
    (swap_ab), and a second call into the same output (split K's arrival counters rearmed by
    the first)."""
    check_module(wl, schedules.get("gemm", "v8").apply(wl, target, **knobs), target, 10, calls=2)


def test_v8_promoted_fp8_errs_like_scaled_mms_default_not_its_fast_accumulation(target):
    """fp8 at K = 16384, each output's error scaled by sqrt(K) rms(A) rms(B) (the issue's
    measure): v8's default for fp8 (promote_k=128), and with promote_overlap, at most 1.2x the
    largest error of torch._scaled_mm's default (float32 promotion), and below v8's fast
    accumulation (wgmma's own sums)."""
    import torch

    wl = Workload("gemm", (512, 1024, 16384), FP8, "float32", "nt")
    inputs = measure.random_inputs(wl, 3)
    reference = measure.reference(wl, inputs)
    a, b, scale_a, scale_b = inputs[:4]

    def worst(out) -> float:
        return measure.largest_scaled_error(wl, inputs, reference, out)

    def v8(**knobs) -> float:
        mod = schedules.get("gemm", "v8").apply(wl, target, block_n=128, **knobs)
        run = measure.tvm_runner(build.build(mod, target), wl, inputs, measure.poisoned_output(wl))
        return worst(run())

    default = worst(torch._scaled_mm(a, b.T, scale_a, scale_b, out_dtype=torch.float32))
    promoted, fast = v8(), v8(promote_k=None)  # the default promotes
    overlapped = v8(promote_k=128, promote_overlap=4)
    assert max(promoted, overlapped) <= 1.2 * default, (promoted, overlapped, default)
    assert max(promoted, overlapped) < fast, (promoted, overlapped, fast)


@pytest.mark.parametrize("name, knobs", [("bitdecode", {"warps": 2, "rows": 1}), ("bitdecode", {"warps": 8, "rows": 8}),
                                         ("bitdecode", {"warps": 4, "rows": 4, "depth": 2}),
                                         ("bitdecode", {"warps": 8, "rows": 2, "splits": 4}),
                                         ("bitdecode", {"warps": 4, "depth": 1, "splits": 2}), ("pipelined", {"stages": 3}),
                                         ("dp4a", {}), ("dp4a", {"warps": 4, "rows": 4, "depth": 4}),
                                         ("dp4a", {"warps": 8, "rows": 2, "depth": 1, "splits": 4})],
                         ids=lambda x: x if isinstance(x, str) else ",".join(f"{k}={v}" for k, v in x.items()) or "defaults")
@pytest.mark.parametrize("wl", [Workload("batched_gemv", (3, 1001, 1008), "nvfp4"),
                                Workload("batched_gemv", (2, 9, 4144), "nvfp4"),
                                Workload("gemv", (37, 17664), "nvfp4"), Workload("gemv", (5, 8784), "nvfp4")],
                         ids=lambda wl: wl.label())
def test_nvfp4_knobs_are_correct(wl, name, knobs, target):
    """bitdecode's and dp4a's warps, rows, depth and splits and pipelined's deeper ring, away
    from their defaults (and dp4a at its own): rows that overhang M, K that is not whole 16-byte
    words per lane, x in two slabs of shared memory (the second one short; 16- and 8-byte
    chunks), two calls into one output."""
    check_module(wl, schedules.get(wl.op, name).apply(wl, target, **knobs), target, 11, calls=2)


NAN_CASE = Workload("batched_gemv", (2, 40, 1024), "nvfp4")


@pytest.mark.parametrize("name", [e.name for e in schedules.entries(NAN_CASE.op) if not e.baseline and e.takes(NAN_CASE)])
def test_nan_scales_reach_the_output_and_nothing_else(name, target):
    """A NaN e4m3 scale (S.1111.111) in one of B's blocks makes that row NaN, in x's makes every
    row NaN, and leaves the other rows right: no kernel traps, none hides a NaN."""
    torch = pytest.importorskip("torch")
    wl = NAN_CASE
    executable = build.build(schedules.get(wl.op, name).apply(wl, target), target)
    inputs = measure.random_inputs(wl, 13)
    inputs[1].view(torch.uint8)[0, 5, 3] = 0x7F  # B's scale, batch 0 row 5
    inputs[3].view(torch.uint8)[1, 7] = 0xFF  # x's scale in batch 1 (negative NaN)
    out = measure.tvm_runner(executable, wl, inputs, measure.poisoned_output(wl))().to(torch.float64)
    nan = torch.isnan(out)
    assert nan[0, 5] and int(nan[0].sum()) == 1 and bool(nan[1].all())
    reference = measure.reference(wl, inputs)
    assert measure.relative_error(out[0][~nan[0]], reference[0][~nan[0]]) <= measure.tolerance(wl)


@pytest.mark.parametrize("wl", [Workload("gemv", (9, 13), "float16"), Workload("batched_gemv", (2, 5, 11), "bfloat16"),
                                Workload("gemv", (7, 6), "float32")], ids=lambda wl: wl.label())
def test_rowalign_keeps_its_neighbours_nans_out(wl, target):
    """rowalign reads whole 16-byte vectors that hold parts of the rows beside each row: with
    every element of the odd rows NaN, the odd rows come out NaN and every even row right."""
    torch = pytest.importorskip("torch")
    executable = build.build(schedules.get(wl.op, "rowalign").apply(wl, target), target)
    inputs = measure.random_inputs(wl, 17)
    inputs[0][..., 1::2, :] = float("nan")
    out = measure.tvm_runner(executable, wl, inputs, measure.poisoned_output(wl))().to(torch.float64)
    assert bool(torch.isnan(out[..., 1::2]).all()) and not bool(torch.isnan(out[..., ::2]).any())
    reference = measure.reference(wl, inputs)[..., ::2]
    assert measure.relative_error(out[..., ::2], reference) <= measure.tolerance(wl)


def test_metaschedule_split_k_candidates_are_correct(target):
    """The first split-K candidates a MetaSchedule search would measure: partial sums over K
    slices, then the kernel that adds them."""
    from tests.test_tuning import split_k_candidates

    wl = Workload("gemm", (256, 128, 512))
    mods = split_k_candidates(wl, target)
    assert mods, "the first batch holds no split-K candidate"
    for mod in mods[:4]:
        check_module(wl, mod, target, 7)


@pytest.mark.parametrize("wl", [WORKLOADS[i] for i in (0, 2, 5, 6, 8, 12)], ids=lambda wl: wl.label())
def test_cublas_baselines_are_correct(wl):
    inputs = measure.random_inputs(wl, 3)
    check(wl, measure.cublas_runner(wl, inputs), inputs, measure.tolerance(wl))
    if wl.dtype == "float32" and wl.op == "gemm":
        err = check(wl, measure.cublas_runner(wl, inputs, tf32=True), inputs, measure.TOLERANCE["tf32"])
        assert err > measure.TOLERANCE["float32"]  # TF32 really was on: fp32 precision is lost


@pytest.mark.parametrize("wl", [Workload("gemm", (256, 384, 512), FP8),
                                Workload("gemm", (1000, 144, 208), FP8, "float32"),
                                Workload("gemm", (1000, 144, 208), FP8, scales="row")],
                         ids=lambda wl: wl.label())
def test_scaled_mm_baselines_are_correct(wl):
    """torch._scaled_mm with and without fast accumulation, per tensor and rowwise: the scales
    applied, within fp8's tolerance."""
    inputs = measure.random_inputs(wl, 4)
    for fast_accum in (False, True):
        check(wl, measure.cublas_runner(wl, inputs, fast_accum=fast_accum), inputs,
              measure.tolerance(wl))


@pytest.mark.parametrize("wl", [
    Workload("gemm", (256, 384, 512), "bfloat16"),  # cuBLAS's own float32 epilogue
    Workload("gemm", (200, 136, 264), "float16", "float16", "nt"),
    Workload("gemv", (1001, 1000), "float16", "float32"),
    Workload("batched_gemv", (3, 1001, 1000), "bfloat16", "float32"),
    Workload("gemm", (128, 64, 96), "float32", "bfloat16"),  # no such call: a cast after it
    Workload("gemm", (128, 64, 96), FP8, "float16"),  # _scaled_mm writes it
], ids=lambda wl: wl.label())
def test_cublas_writes_the_workloads_output_dtype(wl):
    inputs = measure.random_inputs(wl, 5)
    run = measure.cublas_runner(wl, inputs)
    assert run().dtype == measure.torch_dtype(wl.out_dtype)
    check(wl, run, inputs, measure.tolerance(wl))
    result = measure.check_and_time(wl, run, inputs, measure.tolerance(wl), "write", 20.0)
    assert result["status"] == "ok" and "256 MB write" in result["timing"].method


def test_a_kernel_writing_another_dtype_is_not_compared():
    wl = Workload("gemm", (64, 64, 64), "float16")  # float32 out
    inputs = measure.random_inputs(wl, 0)
    half = lambda: inputs[0] @ inputs[1]  # noqa: E731  (writes float16)
    result = measure.check_and_time(wl, half, inputs, measure.tolerance(wl), "read")
    assert result["status"] == "failed" and "not float32" in result["error"]


@pytest.mark.parametrize("flush", ["read", "write", "none"])
def test_every_flush_times_and_says_which_it_was(flush):
    timing = measure.time_kernel(lambda: None, flush=flush, budget_ms=20.0)
    assert timing.median_ms >= 0 and measure.FLUSHES[flush] in timing.method


def test_a_launch_slower_than_the_cutoff_gets_a_short_timing():
    """A search candidate far slower than the best so far: CUTOFF_SAMPLES samples, not the
    budget's; under the cutoff, the budget's (10 at least)."""
    torch = pytest.importorskip("torch")
    slow = lambda: torch.cuda._sleep(2_000_000)  # noqa: E731  (about 1 ms of GPU time)
    cut = measure.time_kernel(slow, budget_ms=300.0, cutoff_ms=0.01)
    kept = measure.time_kernel(slow, budget_ms=300.0, cutoff_ms=1000.0)
    assert cut.samples == measure.CUTOFF_SAMPLES and kept.samples >= 10


def test_unwritten_output_fails_the_check(target):
    wl = Workload("gemv", (256, 256), "float16")
    inputs = measure.random_inputs(wl, 0)
    out = measure.poisoned_output(wl)
    assert measure.relative_error(out, measure.reference(wl, inputs)) == float("inf")


def test_timing_harness_orders_its_statistics_and_measures_bandwidth():
    gbps, timing = measure.copy_bandwidth_gbps(1 << 28)
    assert 0 < timing.min_ms <= timing.median_ms <= timing.max_ms and timing.samples >= 10
    assert 500 < gbps < 20000  # an HBM GPU, counting bytes read plus written


def test_runner_checks_times_and_records_on_the_gpu(tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    assert runner.main(["--schedule", "v3", "--no-ir", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "| v3 " in out and "| cublas " in out and "correct" in out
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    v3 = next(r for r in lines if r["schedule"] == "v3")
    assert v3["status"] == "ok" and v3["timing"]["median_ms"] > 0 and v3["rel_error"] < 1e-5
    assert v3["gpu"] and v3["tvm"] and v3["params"] == {"tile_x": 16, "tile_y": 16, "tile_k": 8}
    assert {r["schedule"] for r in lines} >= {"v3", "cublas", "cublas-tf32", "device-copy"}
    assert {r["flush"] for r in lines} == {"read"}


TRITON_GEMVS = [wl for wl in WORKLOADS if wl.label() in (
    "gemv 1024x1024 float16 nt", "gemv 1001x1000 float16 nt", "batched_gemv 3x1001x1000 float16 nt")]


@pytest.mark.parametrize("wl", TRITON_GEMVS, ids=lambda wl: wl.label())
def test_triton_seed_kernel_is_correct(wl):
    triton_gemv = pytest.importorskip("tuning.triton_gemv")
    inputs = measure.random_inputs(wl, 4)
    out = measure.poisoned_output(wl)
    check(wl, triton_gemv.runner(wl, inputs, out), inputs, measure.tolerance(wl))


@pytest.mark.parametrize("tuner", ["grid", "random", "xgb"])
def test_a_short_template_search_per_tuner(tmp_path, tuner):
    """Each tuner measures its trials on the GPU, records them, and its best runs like a rung."""
    trials_path, results = tmp_path / "at.jsonl", tmp_path / "results.jsonl"
    args = ["--shape", "256x128x256", "--tune", "autotvm:seed_template", "--tuner", tuner,
            "--trials", "10", "--records", str(trials_path), "--results", str(results), "--no-ir"]
    assert runner.main(args) == 0
    trials = records.load(str(trials_path)).records
    assert len(trials) == 10 and all(t["tuner"] == tuner for t in trials)
    assert any(t["status"] == "ok" for t in trials)
    kinds = {(r["kind"], r["schedule"]): r for r in records.load(str(results)).records}
    assert kinds[("tuned", "autotvm:seed_template")]["status"] == "ok"
    assert len(kinds[("search", "autotvm:seed_template")]["curve"]) == 10
    # resuming measures new configurations only
    assert runner.main(args[:-7] + ["--trials", "4", "--records", str(trials_path),
                                    "--results", str(results), "--no-ir"]) == 0
    again = records.load(str(trials_path)).records
    assert len(again) == 14 and len({json.dumps(t["config"], sort_keys=True) for t in again}) == 14


def test_a_short_metaschedule_search_runs_and_resumes(tmp_path):
    work_dir, results = tmp_path / "ms", tmp_path / "results.jsonl"
    args = ["--shape", "256x128x256", "--tune", "metaschedule", "--trials", "8",
            "--work-dir", str(work_dir), "--results", str(results), "--no-ir"]
    assert runner.main(args) == 0
    assert runner.main(args) == 0
    with open(work_dir / "database_tuning_record.json") as f:
        assert sum(1 for line in f if line.strip()) == 16
    tuned = [r for r in records.load(str(results)).records if r["kind"] == "tuned"]
    assert tuned and all(r["status"] == "ok" for r in tuned)
    assert (work_dir / metaschedule.BEST_TRACE).read_text().strip()


def test_the_targets_shared_memory_limit_is_the_gpus_own():
    """build.cuda_target's per-arch table against what the GPU itself reports."""
    import torch

    arch = measure.device_facts()["arch"]
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    assert build.cuda_target(arch).attrs["max_shared_memory_per_block"] == optin


@pytest.mark.parametrize("kilobytes", [64, 160])
def test_shared_tiles_over_48_kb_run_from_dynamic_shared_memory(kilobytes, target):
    """v3 with K steps long enough that its two float32 tiles take `kilobytes` KB: built into
    dynamic shared memory (static arrays stop at 48 KB), launched with that much, correct."""
    wl = WORKLOADS[0]
    mod = schedules.get("gemm", "v3").apply(wl, target, tile_x=32, tile_y=32,
                                            tile_k=kilobytes * 1024 // (2 * 32 * 4))
    assert "extern __shared__" in build.cuda_source(build.build(mod, target))
    check_module(wl, mod, target, 11)


def test_a_short_metaschedule_search_over_v8s_knob_space(tmp_path):
    """MetaSchedule over v8's knobs: candidates built, checked and timed; its best runs like
    a rung, and it is v8 with knobs from its space."""
    work_dir, results = tmp_path / "ms", tmp_path / "results.jsonl"
    wl = Workload("gemm", (512, 256, 512), "float16", layout="nt")
    assert runner.main(["--shape", "512x256x512", "--dtype", "float16", "--layout", "nt",
                        "--tune", "metaschedule", "--ms-space", "v8", "--trials", "8",
                        "--work-dir", str(work_dir), "--results", str(results), "--no-ir"]) == 0
    tuned = [r for r in records.load(str(results)).records if r["kind"] == "tuned"]
    assert tuned and all(r["status"] == "ok" for r in tuned)
    best = metaschedule.best_module(wl, build.cuda_target(measure.device_facts()["arch"]),
                                    str(work_dir))
    assert build.is_tirx_kernel(best)


@pytest.mark.parametrize("wl", [Workload("gemv", (1000, 1000), "float16"),
                                Workload("gemm", (48, 2048, 1024), "bfloat16", "bfloat16", "nt"),
                                Workload("gemm", (1100, 2100, 301), "float32", layout="nt")],
                         ids=Workload.label)
def test_best_measures_its_portfolio_here_and_the_next_best_reads_the_records(wl, tmp_path):
    """`best` on a workload no records know (a GEMV; GEMMs whose portfolios hold v8 with
    knobs, swapped, and v5t's other tile): its portfolio checked and timed on this GPU, the
    fastest correct entry chosen and recorded; the next `best` takes the same from the
    records."""
    found = explore.SearchResults(results=str(tmp_path / "results.jsonl"))
    said, again = [], []
    chosen = explore.resolve(wl, "best", found, said.append)
    assert chosen.name in explore.portfolio(wl) and "measured here" in said[-1], said
    assert explore.resolve(wl, "best", found, again.append).name == chosen.name
    assert "fastest correct of" in again[-1] and "measured here" not in again[-1], again
