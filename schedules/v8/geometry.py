"""v8's tile, box and arena arithmetic: how many bytes, K blocks, accumulators and partials a
tile shape takes. Plain integers, shared by the refusals, the heuristic and the plan (whose
tile counts are symbolic in v8 for any M).

Shared layout. A TMA box whose inner extent is 128 bytes, loaded with the 128-byte swizzle,
lands as rows of 128 bytes with the 16-byte chunk c of row r at chunk c ^ (r % 8): v7's
swizzled atoms (8 rows x 128 bytes), so v7's wgmma descriptors apply unchanged. A stage holds
A's block_m x 64 box (K-major), then B's: one block_n x 64 box in nt (K-major), or block_n/64
boxes of 64 N x 64 K in nn (MN-major, read with wgmma's transpose bit).
"""

from __future__ import annotations

from tvm.script import tirx as T

from .. import heuristics
from ..tensorcore import WARPGROUP
from ..workloads import DTYPE_BYTES, FP8, Workload

ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, FP8: 1}
ROW_BYTES = 128  # one swizzled row: a box's inner extent, and the K of a stage
ATOM = 1024  # bytes of one swizzle atom: 8 rows of 128 bytes
ATOM_ROWS = ATOM // ROW_BYTES  # ... its rows
CONSUMERS = 2  # consumer warpgroups
THREADS = (1 + CONSUMERS) * WARPGROUP * 32  # a producer warpgroup and the consumers
CONSUMER_THREADS = CONSUMERS * WARPGROUP * 32
MOST_ACCUMULATORS = 192  # fp32 accumulators a consumer thread keeps within its 232 registers
MOST_OVERLAP = 8  # promote_overlap's longest run of K blocks (ptxas spills longer ones)
MOST_SPLIT_OVERLAP = 4  # ... where K is split: the blocks' count is known only at the call
TMA_STRIDE_BYTES = 16  # TMA takes global row strides in whole multiples of this
MOST_PARTIAL_BYTES = 256 << 20  # split K's float32 partials: the most its workspace may hold

# The TMA-store epilogue (tma_store): each consumer warpgroup writes its part of C into
# shared boxes of BOX_ROWS rows (one m64 wgmma's) and box_bytes(...) bytes per row, two boxes
# in turn, and one of its threads sends each box to C with a TMA store that runs on while
# the consumers go on to the next tile. A box's rows are swizzled as TMA swizzles them
# (SWIZZLE: its span is the row's bytes), so the stores of a warp spread over the banks.
BOX_ROWS = 64
STORE_BOXES = 4  # two per consumer warpgroup
SWIZZLE = {128: 3, 64: 2, 32: 1}  # CUtensorMapSwizzle of rows of so many bytes

# The columns a consumer's share of block_n comes in, by layout (or "swapped": swap_ab's), and why
BLOCK_N_STEP = {"nn": (64, "B in 64-column boxes"), "nt": (16, "C stored 16 at a time"),
                "swapped": (8, "wgmma's n8, C stored transposed one element at a time")}


def column_steps(layout: str, swap_ab: bool) -> str:
    """The BLOCK_N_STEP entry of a kernel in `layout`, or swap_ab's."""
    return "swapped" if swap_ab else layout


def tma_columns(extent: int, element_bytes: int) -> int:
    """The columns of a row TMA can load: `extent` rounded up to whole TMA_STRIDE_BYTES."""
    per_chunk = TMA_STRIDE_BYTES // element_bytes
    return -(-extent // per_chunk) * per_chunk


def staged_operands(wl: Workload) -> tuple[str, ...]:
    """The operands whose rows TMA cannot load in place, their strides not whole
    TMA_STRIDE_BYTES: A (rows of K), B (rows of K in nt, of N in nn). v8 copies them into
    rows of `tma_columns` first (STAGE_ROWS in schedules/v8/cuda.py)."""
    element_bytes = ELEMENT_BYTES[wl.dtype]
    row_of = {"A": wl.dims["K"], "B": wl.dims["K"] if wl.layout == "nt" else wl.dims["N"]}
    return tuple(operand for operand, extent in row_of.items()
                 if extent * element_bytes % TMA_STRIDE_BYTES)


def k_block_elements(dtype: str) -> int:
    """The K elements of one K block: one swizzled row (ROW_BYTES) of `dtype`."""
    return ROW_BYTES // ELEMENT_BYTES[dtype]


def k_block_count(K, element_bytes: int):
    """The K blocks of one swizzled row each (ROW_BYTES) that K makes, the last one ragged."""
    return -(-K * element_bytes // ROW_BYTES)


def workload_k_blocks(wl: Workload) -> int:
    """The K blocks (`k_block_count`) of wl's K in its input dtype."""
    return k_block_count(wl.dims["K"], DTYPE_BYTES[wl.dtype])


def arena_bytes(block_m: int, block_n: int, stages: int, tma_store: bool = False) -> int:
    """Dynamic shared memory of the ring: `stages` stages of A's and B's 128-byte rows, plus
    one swizzle atom of room to round the ring's start up to an atom; with tma_store, then
    the boxes of C on their way out (STORE_BOXES of at most BOX_ROWS x ROW_BYTES)."""
    boxes = STORE_BOXES * BOX_ROWS * ROW_BYTES if tma_store else 0
    return stages * (block_m + block_n) * ROW_BYTES + ATOM + boxes


def consumer_tile(block_m: int, block_n: int, pingpong: bool = False) -> tuple[int, int, int, int]:
    """(rows, columns) of the block tile that each consumer warpgroup multiplies, and (rows,
    columns) from one consumer's part to the next's: the whole tile for each with pingpong
    (the consumers take turns at whole tiles); else halves of block_m when it holds two
    wgmma heights (64 rows each), or (block_m 64) halves of block_n."""
    if pingpong:
        return block_m, block_n, 0, 0
    if block_m >= 2 * WARPGROUP * 16:
        return block_m // 2, block_n, block_m // 2, 0
    return block_m, block_n // 2, 0, block_n // 2


def box_bytes(block_m: int, block_n: int, out_dtype: str, pingpong: bool = False) -> int:
    """Bytes per row of the boxes in which a consumer's columns of C go out: the widest
    swizzle span that divides them (whole 16-column pieces: 32 bytes always does); 0 where
    none does (a swapped tile's 8 columns, which go out from registers)."""
    columns = consumer_tile(block_m, block_n, pingpong)[1] * DTYPE_BYTES[out_dtype]
    return next((span for span in sorted(SWIZZLE, reverse=True) if columns % span == 0), 0)


def consumer_accumulators(block_m: int, block_n: int, pingpong: bool = False) -> int:
    """The float32 accumulators each consumer thread keeps for a block_m x block_n tile: half
    its columns per 64 rows (one m64 wgmma's fragment)."""
    wg_m, wg_n, _, _ = consumer_tile(block_m, block_n, pingpong)
    return wg_m // 64 * wg_n // 2


def widest_fitting(block_m: int, layout: str, pingpong: bool, widths) -> int | None:
    """The widest of `widths` that is a whole number of the layout's BLOCK_N_STEP (a key of
    it: `column_steps`) and whose block_m-row tile fits each consumer's MOST_ACCUMULATORS (None
    where none is)."""
    step = BLOCK_N_STEP[layout][0]
    return max((n for n in widths if n % step == 0
                and consumer_accumulators(block_m, n, pingpong) <= MOST_ACCUMULATORS),
               default=None)


def split_tiles(tiles, split_tail: bool, sms: int, split_k: int):
    """How many of the tiles are split in K: all, or with split_tail those of the last, partial
    wave where their split_k slices take at most one wave of the SMs, else none (the rest are
    multiplied whole, first). Slices that take several rounds ran slower than the tiles whole
    (reports/notes/h100-shapes.md). `tiles` may be symbolic (v8 for any M): the choice is then
    made at each call."""
    if not split_tail:
        return tiles
    last = tiles % sms
    if isinstance(last, int):
        return last if last * split_k <= sms else 0
    return T.Select(last * split_k <= sms, last, 0)


def any_m_split_tiles(tiles: int, split_tail: bool, open_ended: bool, sms: int) -> int:
    """The most tiles that v8 for any M up to the M of `tiles` splits in K: all of them, or
    with split_tail those of a last wave (fewer than the SMs), of those tiles or, open-ended
    (any M past it too), of any M's."""
    if not split_tail:
        return tiles
    return sms - 1 if open_ended else min(tiles, sms - 1)


def partial_bytes(tiles: int, split_k: int, block_m: int, block_n: int) -> int:
    """Bytes of split K's workspace: one float32 partial tile per (tile, K slice)."""
    return tiles * split_k * block_m * block_n * 4


def any_m_partial_bytes(wl: Workload, block_m: int, block_n: int, split_k: int,
                        split_tail: bool, open_ended: bool = False) -> int:
    """Bytes of split K's workspace in v8 for any M up to wl's: the partials of every tile of
    wl's M, or with split_tail of a last wave of them (fewer tiles than the SMs); open-ended
    (any M past wl's too), of a last wave of any M's tiles."""
    if split_k == 1:
        return 0
    tiles = any_m_split_tiles(heuristics.tile_count(wl, block_m, block_n), split_tail,
                              open_ended, heuristics.H100_SMS)
    return partial_bytes(tiles, split_k, block_m, block_n)
