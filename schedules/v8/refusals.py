"""What v8 cannot take: workloads of other types, and knobs outside its tile shapes,
registers, shared memory, clusters, split K's workspace or TMA's rows of C. Each check returns
its one-line reason, or None; `refuse` raises the first as ScheduleNotApplicable. With swap_ab
the checks judge the product the kernel computes, C^T = B A^T (`kernel_workload`)."""

from __future__ import annotations

import dataclasses

from .. import heuristics
from ..errors import ScheduleNotApplicable
from ..tensorcore import HOPPER_SHARED_BYTES
from ..workloads import DTYPE_BYTES, FP8, FP8_BLOCK, Workload
from .geometry import (ATOM_ROWS, BLOCK_N_STEP, ELEMENT_BYTES, MOST_ACCUMULATORS, MOST_OVERLAP,
                       MOST_PARTIAL_BYTES, MOST_SPLIT_OVERLAP, ROW_BYTES, TMA_STRIDE_BYTES,
                       any_m_partial_bytes, arena_bytes, consumer_accumulators, consumer_tile,
                       column_steps, k_block_count, k_block_elements, partial_bytes, split_tiles,
                       staged_operands, widest_fitting)
from .knobs import Knobs


def workload_refusal(wl: Workload) -> str | None:
    """Why v8 cannot take the workload whatever its knobs, in one line (None where it can):
    inputs other than 16-bit floats and fp8."""
    if wl.dtype not in ELEMENT_BYTES:
        return f"v8 multiplies float16, bfloat16 or {FP8} on tensor cores, not {wl.dtype}"
    return None


def kernel_workload(wl: Workload, swap_ab: bool) -> Workload:
    """The product v8's kernel computes for wl: wl itself, or with swap_ab C^T = B A^T, the
    workload of N x M x K (nt: B's rows are its A, A's rows its B)."""
    if not swap_ab:
        return wl
    M, N, K = wl.shape
    return dataclasses.replace(wl, shape=(N, M, K))


def swap_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """swap_ab: nt only (both operands K-major, so each can be wgmma's A), C stored from
    registers (its tiles go out transposed: no tma_store), scales per tensor or per row."""
    if not knobs.swap_ab:
        return None
    needs = ([f"layout nt, not {wl.layout}"] * (wl.layout != "nt")
             + ["tma_store=False, not True"] * knobs.tma_store
             + [f"scales per tensor or per row, not {wl.scales}"] * wl.block_scaled)
    return (f"v8's swap_ab multiplies C^T = B A^T, B's rows on the tile's rows, and stores C "
            f"transposed from registers: it needs {'; '.join(needs)}") if needs else None


def c_rows_take_tma(wl: Workload) -> bool:
    """Whether TMA can store C (tma_store): its rows whole multiples of TMA_STRIDE_BYTES."""
    return wl.dims["N"] * DTYPE_BYTES[wl.out_dtype] % TMA_STRIDE_BYTES == 0


def _tile_shape_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """block_m must be whole wgmma heights for two consumers, and each consumer's columns whole
    pieces of the layout's BLOCK_N_STEP."""
    block_m, block_n = knobs.block_m, knobs.block_n
    if block_m not in (64, 128, 256):
        return (f"v8 splits block_m among two consumer warpgroups in 64-row wgmmas, or gives "
                f"both 64 rows: block_m={block_m} is not 64, 128 or 256")
    wg_n = consumer_tile(block_m, block_n, knobs.pingpong)[1]
    columns, why = BLOCK_N_STEP[column_steps(wl.layout, knobs.swap_ab)]
    if block_n % columns or block_n > 256 or wg_n % columns:
        return (f"v8 gives each consumer's wgmma a multiple of {columns} columns ({why}), at "
                f"most 256: block_n={block_n} with block_m={block_m} does not split so")
    return None


def _register_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """A consumer thread keeps at most MOST_ACCUMULATORS accumulators."""
    block_m, block_n, pingpong = knobs.block_m, knobs.block_n, knobs.pingpong
    accumulators = consumer_accumulators(block_m, block_n, pingpong)
    if accumulators <= MOST_ACCUMULATORS:
        return None
    whole = " (pingpong: each consumer takes the whole tile)" if pingpong else ""
    steps = column_steps(wl.layout, knobs.swap_ab)
    columns = BLOCK_N_STEP[steps][0]
    widest = widest_fitting(block_m, steps, pingpong, range(columns, 257, columns))
    return (f"v8's {block_m}x{block_n} tile gives each consumer thread {accumulators} "
            f"accumulators{whole}; at most {MOST_ACCUMULATORS} fit (block_n={widest} does)")


def tile_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """Why v8 cannot take knobs' tile for wl (its split among the consumers, a thread's
    accumulators), in one line; None where it can."""
    return _tile_shape_refusal(wl, knobs) or _register_refusal(wl, knobs)


def _block_scales_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """Block-scaled fp8: each K block's sums are multiplied by their scales as they are
    promoted into float32, so they must be promoted once per scale block (promote_k =
    FP8_BLOCK); B comes N x K (nt), as every fp8 workload has it."""
    if not wl.block_scaled or (knobs.promote_k == FP8_BLOCK and wl.layout == "nt"):
        return None
    promote_k = "none" if knobs.promote_k is None else knobs.promote_k
    return (f"v8 multiplies each {FP8_BLOCK}-element K block's sums by its block scales as it "
            f"promotes them into float32: block scales need promote_k={FP8_BLOCK} and layout "
            f"nt, not promote_k={promote_k}, layout {wl.layout}")


def _promotion_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """promote_k: fp8 only (16-bit wgmma keeps float32 sums), whole K blocks, and a second set
    of accumulators (the float32 sums) within MOST_ACCUMULATORS."""
    promote_k = knobs.promote_k
    if promote_k is None:
        return None
    block_k = k_block_elements(wl.dtype)
    if wl.dtype != FP8:
        return _fp8_only(wl, "v8 promotes fp8 wgmma's sums into float32 (promote_k)",
                         "promote_k", promote_k)
    if promote_k % block_k:
        return (f"v8 promotes after whole K blocks of {block_k} {wl.dtype} elements: "
                f"promote_k={promote_k} is not a positive multiple of {block_k}")
    accumulators = consumer_accumulators(knobs.block_m, knobs.block_n, knobs.pingpong)
    sets = promoted_sets(knobs.promote_overlap, knobs.promote_halves)
    if sets * accumulators > MOST_ACCUMULATORS:
        kept = "two sets of wgmma's sums" if sets == 3 else "wgmma's sums"
        return (f"v8 with promote_k keeps {kept} and the float32 sums, {sets} x {accumulators} "
                f"registers a consumer thread for a {knobs.block_m}x{knobs.block_n} tile; at "
                f"most {MOST_ACCUMULATORS} fit (promote_k=none, or a narrower block_n)")
    return None


def _fp8_only(wl: Workload, what: str, knob: str, value) -> str:
    """Why `knob`, one of fp8's promotions (`what` v8 does with it), cannot take a 16-bit
    workload: its wgmma accumulates in float32 already, so the knob must be none."""
    return (f"{what}; {wl.dtype} wgmma accumulates in float32 already: {knob} must be none, "
            f"not {value}")


def promoted_sets(promote_overlap: int | None, halves: bool = False) -> int:
    """The sets of accumulators a consumer thread keeps with promote_k: wgmma's sums and the
    float32 sums, and with promote_overlap (not by halves) a second set of wgmma's sums."""
    return 2 if promote_overlap is None or halves else 3


def _overlap_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """promote_overlap: runs of 2 to MOST_OVERLAP K blocks (MOST_SPLIT_OVERLAP where K is
    split), each promoted (promote_k of one K block) while the next block multiplies into the
    other set of accumulators; two consumers on one tile (not pingpong)."""
    overlap = knobs.promote_overlap
    if overlap is None:
        return None
    block_k = k_block_elements(wl.dtype)
    if wl.dtype != FP8:
        return _fp8_only(wl, "v8's promote_overlap overlaps fp8's promotions (promote_k)",
                         "promote_overlap", overlap)
    if not 2 <= overlap <= MOST_OVERLAP:
        return (f"v8's promote_overlap is the K blocks multiplied in turn between waits for the "
                f"tensor cores: none (off) or 2 to {MOST_OVERLAP}, not {overlap}")
    if knobs.promote_k != block_k:
        return (f"v8's promote_overlap promotes each K block's sums while the next block "
                f"multiplies: it needs promote_k={block_k} (one K block), not "
                f"promote_k={'none' if knobs.promote_k is None else knobs.promote_k}")
    if knobs.split_k > 1 and overlap > MOST_SPLIT_OVERLAP:
        return (f"v8's promote_overlap runs of more than {MOST_SPLIT_OVERLAP} K blocks, where "
                f"K is split (the blocks' count known only at the call), spill registers in "
                f"ptxas: promote_overlap={overlap} with split_k={knobs.split_k}")
    if knobs.pingpong:
        return ("v8's promote_overlap keeps a third set of accumulators, for which pingpong's "
                "consumers (each a whole tile) have no registers left: ptxas spills them "
                "(pingpong=False)")
    return None


def _halves_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """promote_halves: fp8 only, with promote_overlap's runs (whose refusals apply), each
    consumer's columns in two halves of whole 8-column groups (wgmma's N)."""
    if not knobs.promote_halves:
        return None
    if wl.dtype != FP8:
        return (f"v8's promote_halves promotes fp8's sums by halves of the columns; {wl.dtype} "
                f"wgmma accumulates in float32 already: promote_halves=false")
    if knobs.promote_overlap is None:
        return ("v8's promote_halves promotes the K blocks of promote_overlap's runs by halves "
                "of the columns: it needs promote_overlap (2 to "
                f"{MOST_OVERLAP}), not promote_overlap=none")
    columns = consumer_tile(knobs.block_m, knobs.block_n, knobs.pingpong)[1]
    if columns % 16:
        return (f"v8's promote_halves multiplies each consumer's {columns} columns in two "
                f"wgmmas of whole 8-column groups: block_n={knobs.block_n} leaves halves of "
                f"{columns / 2:g}")
    return None


def _shared_memory_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """The ring (at least 2 stages) and tma_store's boxes fit a Hopper block's shared memory,
    and tma_store's C has rows TMA can store."""
    shared_bytes = arena_bytes(knobs.block_m, knobs.block_n, knobs.stages, knobs.tma_store)
    if knobs.stages < 2 or shared_bytes > HOPPER_SHARED_BYTES:
        boxes = " and the boxes of tma_store" if knobs.tma_store else ""
        return (f"v8 with {knobs.stages} stages of {knobs.block_m}x{knobs.block_n} tiles{boxes} "
                f"needs {shared_bytes} bytes of shared memory (at least 2 stages, at most "
                f"{HOPPER_SHARED_BYTES} bytes)")
    if knobs.tma_store and not c_rows_take_tma(wl):
        return (f"v8's tma_store stores C with TMA, which takes rows of whole 16-byte "
                f"multiples: N={wl.dims['N']} {wl.out_dtype} rows are "
                f"{wl.dims['N'] * DTYPE_BYTES[wl.out_dtype]} bytes (tma_store=False stores them "
                "from registers)")
    return None


def _split_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """split_k whole K blocks each; clusters and pingpong take whole tiles; split_tail needs a
    split."""
    K, split_k = wl.dims["K"], knobs.split_k
    k_blocks = k_block_count(K, ELEMENT_BYTES[wl.dtype])
    if not 1 <= split_k <= k_blocks:
        return (f"v8 splits K={K} into 1 to {k_blocks} slices of whole {ROW_BYTES}-byte K "
                f"blocks, not split_k={split_k}")
    cluster_m, cluster_n = knobs.cluster_m, knobs.cluster_n
    halves = knobs.block_n // 64 % cluster_m if wl.layout == "nn" else \
        knobs.block_n // cluster_m % ATOM_ROWS
    if {cluster_m, cluster_n} - {1, 2} or cluster_m * cluster_n > 2 or \
            (cluster_m * cluster_n > 1 and split_k > 1) or (cluster_m > 1 and halves):
        return (f"v8's clusters are 2 CTAs whose whole tiles lie side by side along N "
                f"(cluster_n, sharing A) or M (cluster_m, sharing B in halves of whole "
                f"{ATOM_ROWS}-row swizzle atoms; nn: 64-column boxes), or 1 CTA: not "
                f"cluster_m={cluster_m}, cluster_n={cluster_n} with split_k={split_k}, "
                f"block_n={knobs.block_n}")
    if knobs.pingpong and split_k > 1:
        return f"v8's pingpong consumers take turns at whole tiles: not with split_k={split_k}"
    if knobs.split_tail and split_k == 1:
        return ("v8's split_tail splits the last wave's tiles into split_k slices: it needs "
                "split_k > 1")
    return None


def _staging_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """Rows TMA cannot load are staged before a grid-wide barrier, which needs every CTA of the
    grid resident at once: one CTA per SM, not clusters (whose pairs of SMs may not all be
    free at once)."""
    staged = staged_operands(wl)
    if not staged or knobs.cluster_m * knobs.cluster_n == 1:
        return None
    rows = " and ".join(staged)
    return (f"v8 copies {rows}'s rows, which TMA cannot load ({wl.dtype}, K={wl.dims['K']}, "
            f"N={wl.dims['N']}, {wl.layout}: not whole {TMA_STRIDE_BYTES}-byte multiples), "
            f"before a barrier of the whole grid, which clusters cannot promise: cluster_m and "
            f"cluster_n must be 1, not {knobs.cluster_m} and {knobs.cluster_n}")


def _workspace_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """Split K's partials for wl's tiles fit MOST_PARTIAL_BYTES."""
    block_m, block_n, split_k = knobs.block_m, knobs.block_n, knobs.split_k
    tiles = split_tiles(heuristics.tile_count(wl, block_m, block_n), knobs.split_tail,
                        heuristics.H100_SMS, split_k)
    workspace = partial_bytes(tiles, split_k, block_m, block_n) if split_k > 1 else 0
    if workspace > MOST_PARTIAL_BYTES:
        return (f"v8 with split_k={split_k} over {tiles} tiles of {block_m}x{block_n} keeps "
                f"{workspace >> 20} MB of partials; at most {MOST_PARTIAL_BYTES >> 20} MB")
    return None


def any_m_workspace_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """v8 for any M up to wl's: its workspace (any_m_partial_bytes) fits MOST_PARTIAL_BYTES."""
    workspace = any_m_partial_bytes(wl, knobs.block_m, knobs.block_n, knobs.split_k,
                                    knobs.split_tail)
    if workspace > MOST_PARTIAL_BYTES:
        return (f"v8 for any M with split_k={knobs.split_k} of {knobs.block_m}x{knobs.block_n} "
                f"tiles keeps {workspace >> 20} MB of partials; at most "
                f"{MOST_PARTIAL_BYTES >> 20} MB")
    return None


def any_m_overlap_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """v8 for any M up to wl's: promote_overlap in runs of at most MOST_SPLIT_OVERLAP K blocks,
    as where K is split (its tile walk's counts, computed from M at each call, take registers
    that longer runs' third set of accumulators needs: ptxas spills them), or by halves
    (promote_halves: two sets) in runs of any length; with block scales by halves not on split
    tiles of the last wave alone (split_tail: that kernel did not finish its GPU check)."""
    overlap = knobs.promote_overlap
    if knobs.promote_halves and knobs.split_tail and wl.block_scaled:
        return ("v8 for any M with block scales overlaps its promotions by halves with K split "
                "on every tile (split_tail=False, for a bounded M) or none (split_k=1), not in "
                "a last wave alone (that kernel did not finish on a GPU): split_tail=True")
    if overlap is None or knobs.promote_halves or overlap <= MOST_SPLIT_OVERLAP:
        return None
    return (f"v8 for any M keeps its tile walk's counts in registers, where promote_overlap's "
            f"runs of more than {MOST_SPLIT_OVERLAP} K blocks spill: promote_overlap="
            f"{overlap} (or promote_halves)")


def any_m_swap_refusal(wl: Workload, knobs: Knobs) -> str | None:
    """v8 for any M up to wl's: M on the tile's rows, where its walk takes M at each call (not
    swap_ab, which puts M on the columns)."""
    if not knobs.swap_ab:
        return None
    return "v8 for any M walks M on the tile's rows: swap_ab=False, not True"


# v8 for any M's, besides CHECKS
ANY_M_CHECKS = (any_m_workspace_refusal, any_m_overlap_refusal, any_m_swap_refusal)

CHECKS = (_tile_shape_refusal, _register_refusal, _block_scales_refusal, _promotion_refusal,
          _shared_memory_refusal, _split_refusal, _overlap_refusal, _halves_refusal,
          _staging_refusal, _workspace_refusal)


def refuse(wl: Workload, knobs: Knobs, checks=CHECKS) -> None:
    """Raise ScheduleNotApplicable with the first reason why v8 cannot take wl with `knobs`:
    `workload_refusal`'s, `swap_refusal`'s, then each of `checks` in turn on the product the
    kernel computes (`kernel_workload`), which the reason then names where it is swapped."""
    product = kernel_workload(wl, knobs.swap_ab)
    reason = workload_refusal(wl) or swap_refusal(wl, knobs)
    if not reason:
        reason = next(filter(None, (check(product, knobs) for check in checks)), None)
        if reason and knobs.swap_ab:
            reason += f" (swap_ab: of C^T = B A^T, {'x'.join(map(str, product.shape))})"
    if reason:
        raise ScheduleNotApplicable(reason)
