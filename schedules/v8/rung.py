"""The v8 rung: its registration, knobs and space, and the kernel template's entry points
(`v8_kernel` for the workload's M, `v8_kernel_any_m` for every M up to it), each refusing what
v8 cannot take, then writing the kernel from its plan."""

from __future__ import annotations

from tvm.s_tir import Schedule

from .. import heuristics
from ..common import require_sm
from ..registry import schedule
from ..workloads import FP8, Workload
from .geometry import BLOCK_N_STEP
from .heuristic import split_cut_tile, tma_tiles, wave_tile
from .kernel import warp_specialized_gemm
from .knobs import Knobs
from .plan import Plan
from .refusals import refuse


def v8_refusals(wl: Workload, group_m: int, **knobs) -> None:
    """What v8_kernel refuses, without building the kernel (group_m, the order of the tiles,
    takes any value)."""
    refuse(wl, Knobs(group_m=group_m, **knobs))


PROMOTE_K = [None, 128, 256]  # K elements between promotions of fp8's sums (None: no promotion)
# block_n: nt takes each (8 swapped only: a decode batch's column of tokens), nn those of whole
# boxes
BLOCK_N = [8, 16, 64, 128, 144, 160, 176, 192, 256]


def v8_narrowed(wl: Workload) -> dict:
    """The values of v8's knobs that a search of `wl` draws: on 16-bit inputs fp8's promotions
    none, by halves too (the others refused: _fp8_only, _halves_refusal); on fp8, promoted
    sums only, v8's default precision (_scaled_mm's default): fast accumulation (promote_k
    none, as _scaled_mm's use_fast_accum) is another precision, which a search must not trade
    for speed unasked; it runs by name, `v8:promote_k=none`. swap_ab only in nt without block
    scales (the others refused: swap_refusal); in nn, block_n in whole 64-column boxes of B
    (BLOCK_N_STEP)."""
    by_layout = {}
    if wl.layout != "nt" or wl.block_scaled:
        by_layout["swap_ab"] = [False]
    if wl.layout == "nn":
        by_layout["block_n"] = [n for n in BLOCK_N if n % BLOCK_N_STEP["nn"][0] == 0]
    if wl.dtype == FP8:
        return {"promote_k": [k for k in PROMOTE_K if k is not None], **by_layout}
    return {"promote_k": [None], "promote_overlap": [None], "promote_halves": [False],
            **by_layout}


def v8_widened(wl: Workload, defaults: dict) -> dict:
    """The widths beyond v8's space that a search of `wl` draws too: those of the tiles `best`
    weighs, the one filling the SMs best (`wave_tile`) and the swapped one of the tokens'
    widest cut (`split_cut_tile`), so that a search reaches them."""
    tiles = (wave_tile(wl, heuristics.H100_SMS, defaults),
             split_cut_tile(wl, heuristics.H100_SMS))
    widths = [tile[1] for tile in tiles if tile]
    return {"block_n": list(dict.fromkeys(widths))} if widths else {}


def v8_kernel(wl: Workload, *, bias: bool = False, **knobs):
    """The rung's PrimFunc: the template for the workload and knobs (refused as v8 refuses);
    with bias, a linear layer's, as `v8_kernel_any_m` takes it."""
    return warp_specialized_gemm(Plan.build(wl, Knobs(**knobs), heuristics.H100_SMS, bias=bias))


def v8_kernel_any_m(wl: Workload, *, open_ended: bool = False, bias: bool = False, **knobs):
    """v8's kernel for every M up to wl's: M is a size given at each call (A's rows), and wl's
    M the most a call may bring (it sizes split K's workspace: the tiles of wl's M, or with
    split_tail those of a last wave of them). open_ended: M may pass wl's too (a linear
    layer's last bucket): K split only with split_tail, its workspace then sized for a last
    wave of any M (fewer tiles than the SMs). bias: a linear layer's, one a column of C in C's
    dtype (a parameter before C), added in the epilogue. Refused as v8 refuses wl, where the
    workspace for any M would pass MOST_PARTIAL_BYTES, with promote_overlap's runs past
    MOST_SPLIT_OVERLAP (not by halves), and by halves with block scales split in a last wave
    alone (ANY_M_CHECKS)."""
    return warp_specialized_gemm(Plan.build(wl, Knobs(**knobs), heuristics.H100_SMS,
                                            most_m=wl.dims["M"], open_ended=open_ended,
                                            bias=bias))


@schedule("gemm", "v8", space={"block_m": [64, 128, 256], "block_n": BLOCK_N,
                               "stages": [3, 4, 5, 6, 8], "group_m": [1, 4, 8, 16],
                               "split_k": [1, 2, 3, 4, 6, 8], "split_tail": [False, True],
                               "tma_store": [False, True], "cluster_m": [1, 2], "cluster_n": [1, 2],
                               "pingpong": [False, True], "promote_k": PROMOTE_K,
                               "promote_overlap": [None, 2, 4, 6, 8],
                               "promote_halves": [False, True], "swap_ab": [False, True]},
          heuristic=tma_tiles, compute=v8_kernel, refuse=v8_refusals, narrow=v8_narrowed,
          widen=v8_widened,
          brings=("inst_executed", -1))
def v8(sch: Schedule, wl: Workload, *, block_m: int = 128, block_n: int = 256,
       stages: int = 4, group_m: int = 8, split_k: int = 1, split_tail: bool = False,
       tma_store: bool = True, cluster_m: int = 1, cluster_n: int = 1,
       pingpong: bool = False, promote_k: int | None = None,
       promote_overlap: int | None = None, promote_halves: bool = False,
       swap_ab: bool = False) -> None:
    """Hopper's TMA and warp specialization: v7's wgmma on the same swizzled tiles, but the
    tiles come by TMA (cp.async.bulk.tensor) into a ring of `stages` shared stages, each with a
    `full` and an `empty` mbarrier, and the kernel is persistent: one CTA per SM walks the
    block tiles in groups of group_m rows of tiles. A producer warpgroup (setmaxnreg.dec) issues
    the loads from one thread; two consumer warpgroups (setmaxnreg.inc) multiply, and store C
    (float32, float16 or bfloat16) straight from their accumulators while the producer already
    loads the next tile. split_k > 1 deals each tile's K blocks to that many CTAs, which add
    their float32 partials through a workspace (the last to finish stores C), so that few tiles
    (decode batches, M <= 128) still fill the SMs; with split_tail only the tiles of the last,
    partial wave are split, so that the SMs it would leave idle share its work, and only where
    their slices take one wave (v8 for any M decides at each call). tma_store:
    each consumer writes C into shared boxes of 64 rows, two in turn, that one of its threads
    sends by TMA (cp.async.bulk.tensor, global <- shared), so the global writes of a tile run
    on under the next tile's wgmmas; it needs C's rows in whole 16-byte multiples. cluster_m or
    cluster_n = 2: clusters of 2 CTAs on tiles side by side along M (sharing B) or N (sharing A),
    each loading half of the shared operand by a multicast TMA into both (whole tiles only: no
    split K). pingpong: each consumer multiplies whole tiles, every other one of the CTA's, the
    two taking turns at the tensor cores, so that one's epilogue runs under the other's wgmmas
    (a tile's accumulators must then fit one consumer: 128x128, 128x192, 64x256; no split K;
    on an H100 no faster than two consumers on one tile, reports/h100-v8.md). Ragged M, N, K:
    TMA zero-fills past the edges; rows it cannot load (not whole 16-byte multiples: K, and N
    for B in nn) the kernel first copies into zero-padded rows, behind a barrier of the grid.
    fp8 e4m3 inputs (nt) multiply in wgmma's e4m3 form, their per-tensor (or rowwise) scales
    applied to the accumulators before C is stored; block scales (a scale per row of A per
    128 K, per 128x128 block of B) multiply each K block's sums as promote_k=128 promotes
    them. fp8's wgmma keeps its sums in fewer bits than float32
    (torch._scaled_mm's use_fast_accum=True has the same numerics); promote_k adds them
    into float32 registers every promote_k K elements and starts wgmma's sums afresh, as
    DeepGEMM and cuBLAS's default do (twice the accumulator registers; the heuristic's
    default for fp8 is 128, none is the fast form). promote_overlap (promote_k of one K
    block; 2 to 8): runs of that many K blocks multiply into two sets of accumulators in turn,
    each block's sums promoted while the next block's wgmmas run, and the consumer waits for
    the tensor cores once a run (the blocks left after whole runs: one shorter run, or where
    K is split one at a time, waiting), where otherwise every promotion waits for them (three
    sets of registers: at most 64 accumulators a consumer, as 128x128 and 64x256 tiles give).
    promote_halves (with promote_overlap's runs): each K block's wgmmas in two halves of the
    consumer's columns, each half's sums promoted while the other half's wgmmas run, so two
    sets of registers (the accumulators and the sums) overlap the promotions of tiles up to
    128x192; not v8's default, but `best` weighs it (fp8 per tensor or row, past 64 rows).
    swap_ab (nt): the kernel multiplies C^T = B A^T, B's rows (a layer's weights) on the
    tile's rows and A's (its tokens) on the columns, which wgmma takes in any multiple of 8,
    so that a tile's columns can be cut to a few hundred tokens; C goes out transposed,
    one element at a time from registers (no tma_store, no block scales).
    A TIRx kernel (schedules/v8/), sm_90a only.

    Against v7: one thread issues a box's TMA load where v7's 256 threads each computed
    addresses and issued cp.async, so the kernel runs far fewer instructions (the counter it
    brings: inst_executed down), and the tensor pipe is busier.

    IR: a TIRx PrimFunc, not s_tir blocks: T.device_entry, T.cta_id / T.thread_id, shared.dyn
    arena with the ring rounded up to 1024 bytes, T.ptx mbarrier / cp.async.bulk.tensor /
    wgmma / setmaxnreg calls, tensor maps encoded by the host (runtime.cuTensorMapEncodeTiled)
    and passed as __grid_constant__ CUtensorMap."""
    require_sm("v8", 90, "TMA, mbarriers and wgmma (built for sm_90a)")  # the rest: v8_kernel
