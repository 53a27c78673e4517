"""v8's plan: every quantity the kernel is written from, derived once from (workload, knobs,
SMs, most_m) once the refusals have passed them, so that the kernel's pieces read names, not
arithmetic. M may be symbolic (v8 for any M): then the counts that depend on it are PrimExprs
computed at each call, and `most_m` sizes split K's workspace. With swap_ab the plan is that of
the product the kernel computes, C^T = B A^T (`swapped`): its M, N, A and B are the workload's
N, M, B and A, and only the kernel's parameters and C's stores say otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder

from .. import heuristics
from ..errors import ScheduleNotApplicable
from ..tensorcore import WARPGROUP
from ..workloads import DTYPE_BYTES, FP8, FP8_BLOCK, Workload, fp8_blocks
from .cuda import PTX_TYPE, split_k_helpers, tensor_map
from .geometry import (BOX_ROWS, CONSUMERS, CONSUMER_THREADS, ELEMENT_BYTES, ROW_BYTES,
                       any_m_split_tiles, arena_bytes, box_bytes, consumer_tile, k_block_count,
                       k_block_elements, split_tiles, staged_operands, tma_columns)
from .knobs import Knobs
from .refusals import ANY_M_CHECKS, CHECKS, kernel_workload, refuse


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The kernel's shape, tiles, units of work, launch, ring, boxes and tensor maps. `split_k`
    is the split the kernel makes (1 where split_tail finds no partial last wave), `whole` the
    tiles multiplied whole before the split ones, a unit one (tile, K slice) of a CTA's walk."""

    M: object  # int, or the symbolic size of v8 for any M
    N: int
    K: int
    dtype: str
    layout: str
    out_dtype: str
    scales: str | None  # fp8: per "tensor", per "row" of A and of B, or per "block" of 128 K
    swapped: bool  # swap_ab: M, N, A and B are the workload's N, M, B and A
    knobs: Knobs
    sms: int
    most_m: int | None
    open_ended: bool  # any M past most_m too (split K's workspace for a last wave of any M)
    bias: bool  # a bias of C's dtype, one a column, added to the sums before C is stored
    # the multiply: a consumer's part of the tile and its wgmmas
    element_bytes: int
    block_k: int
    nt: bool
    wg_m: int
    wg_n: int
    step_m: int
    step_n: int
    m_wgmmas: int
    k_step: int
    per_wgmma: int
    accumulators: int
    promote_blocks: int  # fp8: K blocks between promotions into float32 (0: fast accumulation)
    # the tiles, units and launch
    cluster: int
    tiles_m: object
    tiles_n: int
    k_blocks: int
    tiles: object
    whole: object
    split_k: int
    turns: int
    splits_every_tile: bool
    units: object
    clusters: object
    grid: object
    units_per_cta: object
    # shared memory, boxes and tensor maps
    a_bytes: int
    b_bytes: int
    stage_bytes: int
    ring_bytes: int
    out_bytes: int
    span: int
    box_cols: int
    first_box: int
    a_rows: int
    b_rows: int
    # the operands staged into rows TMA can load ("A", "B"), and the columns of the rows it loads
    staged: tuple[str, ...]
    a_cols: int
    b_cols: int
    # split K's workspace
    quads: int
    most_tiles: object
    tag: str

    @classmethod
    def build(cls, wl: Workload, knobs: Knobs, sms: int, most_m: int | None = None,
              open_ended: bool = False, bias: bool = False) -> "Plan":
        """The plan for wl and knobs on `sms` SMs; with most_m (wl's M), for any M up to most_m
        rows (M symbolic), or with open_ended as well for any M past it (split K then only
        with split_tail); with bias, a bias added to each column of C. Refused first as v8
        refuses them (ScheduleNotApplicable), and for any M also where split K's workspace for
        any M would be too large, promote_overlap's runs too long, or by halves with block
        scales split in a last wave alone (ANY_M_CHECKS)."""
        refuse(wl, knobs, CHECKS if most_m is None else CHECKS + ANY_M_CHECKS)
        if open_ended and knobs.split_k > 1 and not knobs.split_tail:
            raise ScheduleNotApplicable(
                f"v8 for M past {wl.dims['M']} splits K only with split_tail (its workspace "
                f"then holds a last wave's tiles); split_k={knobs.split_k} splits every tile")
        wl = kernel_workload(wl, knobs.swap_ab)
        _, N, K = wl.shape
        M = wl.dims["M"] if most_m is None else tirx.Var("M", "int32")
        shape = {"M": M, "N": N, "K": K, "dtype": wl.dtype, "layout": wl.layout,
                 "out_dtype": wl.out_dtype, "scales": wl.scales, "swapped": knobs.swap_ab,
                 "knobs": knobs, "sms": sms, "most_m": most_m, "open_ended": open_ended,
                 "bias": bias}
        multiply = _multiply(wl.dtype, wl.layout, knobs)
        walk = _walk(M, N, K, multiply["element_bytes"], knobs, sms)
        memory = _memory(wl.out_dtype, knobs)
        workspace = _workspace(wl, shape, walk, multiply["accumulators"] // 4)
        return cls(**shape, **multiply, **walk, **memory, **_staging(wl), **workspace)

    # -- derived where the kernel's script needs them ------------------------------------------
    @property
    def promotes(self) -> bool:
        """Whether wgmma's sums are promoted into float32 sums (promote_k)."""
        return self.promote_blocks > 0

    @property
    def overlaps(self) -> bool:
        """Whether each K block's sums are promoted while the next block multiplies into a
        second set of accumulators (promote_overlap)."""
        return self.knobs.promote_overlap is not None

    @property
    def halves(self) -> bool:
        """Whether an overlapped run promotes each K block's sums by halves of the consumer's
        columns, each under the other half's wgmmas (promote_halves), not under the next block's."""
        return self.overlaps and self.knobs.promote_halves

    @property
    def accumulator_sets(self) -> int:
        """The sets of wgmma accumulators a consumer thread keeps: two where K blocks take turns
        (promote_overlap, not by halves), else one."""
        return 2 if self.overlaps and not self.halves else 1

    @property
    def wgmma_n(self) -> int:
        """The columns of one wgmma: the consumer's, or by halves half of them."""
        return self.wg_n // 2 if self.halves else self.wg_n

    @property
    def wgmma(self):
        """The consumer's wgmma instruction: m64, wgmma_n columns, k16 (16-bit) or k32 (fp8)."""
        ptx = PTX_TYPE[self.dtype]
        return T.ptx[f"wgmma.mma_async.sync.aligned.m64n{self.wgmma_n}k{self.k_step}"
                     f".f32.{ptx}.{ptx}"]

    @property
    def transpose(self) -> tuple:
        """wgmma's transpose operands: none for fp8, B's transposed in nn."""
        return () if self.dtype == FP8 else (0, 0 if self.nt else 1)

    @property
    def every_cta(self):
        """A multicast's CTA mask: the whole cluster."""
        return T.uint16((1 << self.cluster) - 1)

    @property
    def tma_dtype(self) -> str:
        """The element type TMA moves: fp8 as bytes."""
        return "uint8" if self.dtype == FP8 else self.dtype

    @property
    def rowwise(self) -> bool:
        """fp8 with a scale per row of A and of B, applied to the accumulators after the sum."""
        return self.scales == "row"

    @property
    def block_scaled(self) -> bool:
        """fp8 with A's scales per row per FP8_BLOCK of K and B's per FP8_BLOCK^2 block, applied
        to each K block's sums as they are promoted (promote_k = FP8_BLOCK: one per K block)."""
        return self.scales == "block"

    @property
    def scale_blocks(self) -> tuple:
        """"block" scales: the blocks of N and of K that B_scale has (the last may be shorter)."""
        return fp8_blocks(self.N), fp8_blocks(self.K)

    @property
    def b_scale_blocks(self) -> int:
        """"block" scales: the most FP8_BLOCK-column blocks of B's scales that a consumer's wg_n
        columns can touch, their first column a multiple of 8 (its last 8-column group may
        start FP8_BLOCK - 8 into a block)."""
        return (self.wg_n + FP8_BLOCK - 8 - 1) // FP8_BLOCK + 1

    @property
    def scale_shapes(self) -> tuple:
        """fp8's A_scale and B_scale: one element each, or (rowwise) one per row of A and B, or
        (block) one per row of A per K block and one per 128-row block of B per K block."""
        if self.rowwise:
            return (self.M,), (self.N,)
        if self.block_scaled:
            n_blocks, k_blocks = self.scale_blocks
            return (self.M, k_blocks), (n_blocks, k_blocks)
        return (1,), (1,)

    @property
    def b_shape(self) -> tuple:
        return (self.N, self.K) if self.nt else (self.K, self.N)

    @property
    def param_shapes(self) -> dict:
        """The shapes of the kernel's parameters A, B, A_scale, B_scale, Bias and C, the
        workload's: swapped, A is the plan's B, A_scale its B_scale, and C its C transposed
        (Bias: one a column of the workload's C)."""
        (a_scale, b_scale), c = self.scale_shapes, (self.M, self.N)
        if self.swapped:
            return {"A": self.b_shape, "B": (self.M, self.K), "A_scale": b_scale,
                    "B_scale": a_scale, "Bias": (self.M,), "C": c[::-1]}
        return {"A": (self.M, self.K), "B": self.b_shape, "A_scale": a_scale,
                "B_scale": b_scale, "Bias": (self.N,), "C": c}

    @property
    def a_map(self) -> list:
        """A's tensor map: this CTA's rows of the box (a cluster_n pair shares it) by 64 K."""
        return tensor_map(self.M, self.a_cols, self.a_rows, self.block_k, self.element_bytes)

    @property
    def b_map(self) -> list:
        """B's tensor map: rows of the box as A's (nt), or 64-column boxes of block_k rows."""
        if self.nt:
            return tensor_map(self.N, self.b_cols, self.b_rows, self.block_k, self.element_bytes)
        return tensor_map(self.K, self.b_cols, self.block_k, 64, self.element_bytes)

    def staging(self, operand: str) -> tuple | None:
        """(rows, cols, padded cols) of `operand` ("A" or "B") where it is staged, else None."""
        if operand not in self.staged:
            return None
        if operand == "A":
            return self.M, self.K, self.a_cols
        rows, cols = (self.N, self.K) if self.nt else (self.K, self.N)
        return rows, cols, self.b_cols

    @property
    def c_map(self) -> list:
        """C's tensor map (tma_store): boxes of BOX_ROWS rows of one swizzle span."""
        return tensor_map(self.M, self.N, BOX_ROWS, self.box_cols, self.out_bytes)

    @property
    def helpers(self) -> dict:
        """Split K's CUDA helpers, their workspace sized for the plan's most split tiles."""
        return split_k_helpers(self.tag, self.most_tiles * self.split_k * self.quads
                               * CONSUMER_THREADS, self.most_tiles)

    @property
    def epilogue(self) -> str:
        """How the consumers store C: through tma_store's "boxes", in "quads" of columns (16-bit
        C whose N is a multiple of 4), or straight from "registers" (swapped: C's columns are
        the plan's rows)."""
        if self.knobs.tma_store:
            return "boxes"
        quads = self.out_dtype != "float32" and self.N % 4 == 0 and not self.swapped
        return "quads" if quads else "registers"

    @property
    def b_leading(self) -> int:
        """B's leading byte offset in wgmma's descriptor (nn: bytes between 64-column boxes)."""
        return 16 if self.nt else self.block_k * ROW_BYTES

    # -- the walk, as expressions the kernel's script calls -----------------------------------
    def consumer_rows(self, consumer):
        """The first row of the tile that the consumer multiplies."""
        return consumer * self.step_m

    def consumer_cols(self, consumer):
        """The first column of the tile that the consumer multiplies."""
        return consumer * self.step_n

    def first_unit(self, consumer):
        """The consumer's first unit of the CTA (j): with pingpong, consumer 1 takes the odd
        ones."""
        return consumer if self.knobs.pingpong else 0

    def frees(self, thread):
        """Whether a consumer thread frees a stage: its warpgroup's thread r, in the CTA of rank
        r (the free's predicate, so the K loop does not branch around wgmma)."""
        return thread % (WARPGROUP * 32) < self.cluster

    def a_offset(self, consumer):
        """Bytes from a stage's start to consumer's first A rows."""
        return self.consumer_rows(consumer) * ROW_BYTES

    def a_step(self, mi, ks):
        """Bytes from a consumer's first A rows to those of its wgmma mi at k step ks (a
        constant: the kernel adds it to the rows' descriptor)."""
        return mi * 64 * ROW_BYTES + ks * self.k_step * self.element_bytes

    def b_offset(self, consumer):
        """Bytes from a stage's start to consumer's first B columns."""
        cols = self.consumer_cols(consumer)
        return self.a_bytes + cols * ROW_BYTES if self.nt \
            else self.a_bytes + cols // 64 * self.block_k * ROW_BYTES

    def b_step(self, ks, half: int = 0):
        """Bytes from a consumer's first B columns to k step ks (a constant, as `a_step`); by
        halves (nt only: fp8), to those of the consumer's `half` of its columns."""
        return ks * self.k_step * (self.element_bytes if self.nt else ROW_BYTES) \
            + half * self.wgmma_n * ROW_BYTES

    def origin(self, tile, rank):
        """(first row, first column) of the CTA's tile: CTA `rank` of its cluster's tiles."""
        knobs = self.knobs
        m0, n0 = tile_origin(tile, self.tiles_m, self.tiles_n, knobs.group_m,
                             (knobs.block_m * knobs.cluster_m, knobs.block_n * knobs.cluster_n))
        return (m0 + (rank * knobs.block_m if knobs.cluster_m > 1 else 0),
                n0 + (rank * knobs.block_n if knobs.cluster_n > 1 else 0))

    def unit_origin(self, tile, rank):
        """origin(tile, rank) where a unit uses it: bound once per unit where M is symbolic (its
        tile walk divides by sizes known at the call), inlined where M is a number (the walk is
        then shifts and masks that fold away)."""
        if isinstance(self.M, int):
            return self.origin(tile, rank)
        return tuple(IRBuilder.name(name, T.bind(value))
                     for name, value in zip(("m0", "n0"), self.origin(tile, rank)))

    def cluster_rank(self):
        """The CTA's rank in its cluster (a cluster launch where it has more than one)."""
        return T.cta_id_in_cluster([self.cluster]) if self.cluster > 1 else 0

    def unit_of(self, cta, j):
        """The CTA's j-th unit: its cluster's (a cluster's CTAs are `cluster` in a row)."""
        return (cta // self.cluster if self.cluster > 1 else cta) + j * self.clusters

    def tile_of(self, unit):
        """The output tile of a unit: the first `whole` units are whole tiles, then each tile
        comes in split_k slices."""
        if self.splits_every_tile:
            return unit // self.split_k
        return T.Select(unit < self.whole, unit, self.whole + (unit - self.whole) // self.split_k)

    def is_split(self, unit):
        """Whether the unit is a slice of its tile (python True where every unit is)."""
        return True if self.splits_every_tile else unit >= self.whole

    def k_range(self, unit):
        """(first K block, K blocks) of the unit: a slice's K blocks dealt evenly."""
        piece = (unit - self.whole) % self.split_k
        first = piece * self.k_blocks // self.split_k
        count = (piece + 1) * self.k_blocks // self.split_k - first
        if self.splits_every_tile:
            return first, count
        return (T.Select(unit < self.whole, 0, first),
                T.Select(unit < self.whole, self.k_blocks, count))

    def stores_c(self, unit, arrived):
        """Whether this CTA stores the unit's tile: a whole tile's, or the last slice's."""
        last = arrived[0] == self.split_k - 1
        return last if self.splits_every_tile else T.Or(unit < self.whole, last)

    def partial(self, unit, quad, thread):
        """Index of a consumer thread's float4 `quad` of the (split) unit's partial tile: the
        threads' float4s side by side, so that a warp's stores are contiguous."""
        return ((unit - self.whole) * self.quads + quad) * CONSUMER_THREADS + thread


def tile_origin(tile, tiles_m, tiles_n, group_m: int, block: tuple[int, int]):
    """(first row, first column) of output tile number `tile` in the grouped raster of tiles of
    `block` (rows, columns): tiles go down group_m rows of tiles, then across, group by group
    (Triton's order), so that the CTAs working at one time share tiles of A and B in L2."""
    group = tile // (group_m * tiles_n)
    first_m = group * group_m
    rows = T.min(tiles_m - first_m, group_m)
    within = tile % (group_m * tiles_n)
    return (first_m + within % rows) * block[0], within // rows * block[1]


def _multiply(dtype: str, layout: str, knobs: Knobs) -> dict:
    """A consumer's part of the tile, its m64 wgmmas per k step and its accumulators."""
    element_bytes = ELEMENT_BYTES[dtype]
    wg_m, wg_n, step_m, step_n = consumer_tile(knobs.block_m, knobs.block_n, knobs.pingpong)
    m_wgmmas = wg_m // 64  # m64 wgmmas of one consumer per k step
    per_wgmma = wg_n // 2  # accumulators of one m64 wgmma per thread
    return {"element_bytes": element_bytes, "block_k": k_block_elements(dtype),
            "nt": layout == "nt", "wg_m": wg_m, "wg_n": wg_n, "step_m": step_m,
            "step_n": step_n, "m_wgmmas": m_wgmmas, "k_step": 32 // element_bytes,
            "per_wgmma": per_wgmma, "accumulators": m_wgmmas * per_wgmma,
            "promote_blocks": (knobs.promote_k or 0) * element_bytes // ROW_BYTES}


def _ceil_div(count, size):
    """count // size rounded up, written (count + size - 1) // size: for a symbolic count (v8
    for any M), -(-count // size) lowers to divisions by a negative number that CUDA's codegen
    binds to one variable twice ("Let cannot bind the same var to two different values")."""
    return (count + size - 1) // size


def _walk(M, N: int, K: int, element_bytes: int, knobs: Knobs, sms: int) -> dict:
    """The tiles (a cluster's tiles count as one), the units of work they make (whole tiles
    first, then split_k slices of the split ones) and the persistent grid that walks them."""
    cluster = knobs.cluster_m * knobs.cluster_n
    tiles_m = _ceil_div(M, knobs.block_m * knobs.cluster_m)
    tiles_n = _ceil_div(N, knobs.block_n * knobs.cluster_n)
    tiles = tiles_m * tiles_n
    split_k = knobs.split_k
    # tiles multiplied whole, first (split_tail: those before the last, partial wave, or all)
    whole = tiles - split_tiles(tiles, knobs.split_tail, sms, split_k) if knobs.split_tail else 0
    if knobs.split_tail and isinstance(whole, int) and whole == tiles:
        whole, split_k = 0, 1  # no partial last wave: nothing to split
    units = whole + (tiles - whole) * split_k
    clusters = min(sms // cluster, units) if isinstance(units, int) else T.min(sms // cluster,
                                                                                units)
    return {"cluster": cluster, "tiles_m": tiles_m, "tiles_n": tiles_n,
            "k_blocks": k_block_count(K, element_bytes), "tiles": tiles, "whole": whole,
            "split_k": split_k, "turns": CONSUMERS if knobs.pingpong else 1,
            # (symbolic M: whether every tile is split is known only at the call)
            "splits_every_tile": isinstance(whole, int) and whole == 0, "units": units,
            "clusters": clusters, "grid": clusters * cluster,
            "units_per_cta": _ceil_div(units, clusters)}


def _memory(out_dtype: str, knobs: Knobs) -> dict:
    """Bytes of a stage's A and B boxes, the ring, and tma_store's boxes of C after it."""
    block_m, block_n = knobs.block_m, knobs.block_n
    a_bytes, b_bytes = block_m * ROW_BYTES, block_n * ROW_BYTES
    out_bytes = DTYPE_BYTES[out_dtype]
    # tma_store: a box row's bytes, and columns (0 without boxes)
    span = box_bytes(block_m, block_n, out_dtype) if knobs.tma_store else 0
    return {"a_bytes": a_bytes, "b_bytes": b_bytes, "stage_bytes": a_bytes + b_bytes,
            "ring_bytes": arena_bytes(block_m, block_n, knobs.stages, knobs.tma_store),
            "out_bytes": out_bytes, "span": span, "box_cols": span // out_bytes,
            # from the ring's start: the boxes after the stages
            "first_box": knobs.stages * (a_bytes + b_bytes),
            # the rows of A's and B's (nt) boxes that each CTA of a cluster loads
            "a_rows": block_m // knobs.cluster_n, "b_rows": block_n // knobs.cluster_m}


def _staging(wl: Workload) -> dict:
    """The operands whose rows are staged (`staged_operands`), and the columns of the rows that
    TMA loads: padded to whole 16-byte multiples where staged."""
    element_bytes = ELEMENT_BYTES[wl.dtype]
    staged = staged_operands(wl)
    b_cols = wl.dims["K"] if wl.layout == "nt" else wl.dims["N"]
    return {"staged": staged,
            "a_cols": tma_columns(wl.dims["K"], element_bytes) if "A" in staged else wl.dims["K"],
            "b_cols": tma_columns(b_cols, element_bytes) if "B" in staged else b_cols}


def _workspace(wl: Workload, shape: dict, walk: dict, quads: int) -> dict:
    """Split K's workspace, for the most tiles split: those of M (symbolic M: of wl's, the most
    rows, counted as the refusals count them, heuristics.tile_count; with split_tail those of a
    last wave of them, or where M is open-ended of any M's, fewer than the SMs), and its tag."""
    M, N, K, knobs = shape["M"], shape["N"], shape["K"], shape["knobs"]
    block = f"{knobs.block_m}x{knobs.block_n}x{walk['split_k']}{'_swapped' * knobs.swap_ab}"
    if isinstance(M, int):
        most_tiles = walk["tiles"] - walk["whole"]
        tag = f"{M}x{N}x{K}_{block}_{walk['whole']}"
    else:
        most_tiles = any_m_split_tiles(heuristics.tile_count(wl, knobs.block_m, knobs.block_n),
                                       knobs.split_tail, shape["open_ended"], shape["sms"])
        tag = f"{shape['most_m']}x{N}x{K}_{block}_{'open' if shape['open_ended'] else 'any'}"
    return {"quads": quads, "most_tiles": most_tiles, "tag": tag}
