"""The nvfp4 GEMV's last rungs, written whole as TIRx kernels: the batched seed's final kernel on
Hopper, where the e2m1 decode is bit operations on pairs of values (schedules/fp4.py) and the
multiply-adds are f16x2 FMAs (bitdecode), and past the seed, the same kernel with an integer
decode: a byte table looked up by `prmt` and int8 dot products by `dp4a` (dp4a).

The rungs before them are the GEMV ladder's schedules (schedules/gemv.py), which take nvfp4 as
they take float16, and its nvfp4 rungs staged and pipelined: the seed's V0 to V7. What these
kernels add cannot come from a schedule of the reference definition, which decodes one element
at a time into float32: here a 32-bit word of codes becomes four f16x2 registers with two
shifts and two masks each, and a block of 16 products is summed with eight `fma.rn.f16x2`; or
it becomes four int8x4 registers by four `prmt`, summed by four `dp4a`.

The kernel (`paired_gemv`, its numbers in a PairedPlan): one CTA per `warps // splits * rows`
rows of one batch, each warp `rows` consecutive rows (the seed's V5 layout), each lane `depth`
chunks of `chunk_words(K)` words of every row per step, the lanes of `splits` warps side by side
along K (the seed's V2 split, inside a CTA); a warp all-reduce (shuffles) ends each row, and with
splits, a sum over the splits' partials in shared memory. Splitting K makes more, shorter CTAs:
a short-N GEMV ends in a finer last wave.

x is decoded once per CTA (the seed's V6_2_1), a slab of at most SLAB_CHUNKS chunks at a time,
into shared memory: its decoded words, laid out so that the lanes' 16-byte reads of one chunk
each fall in distinct banks, and each block's scale as a float times the decode's unit. The
warps then spend their integer pipe on B alone.

Loads run a step ahead of the arithmetic, in two register buffers: step g + 1's codes and scales
(every row, every chunk: rows * depth 16-byte loads per lane) are issued before step g is
decoded and summed, and step 0's before x's decode. A GEMV is bound by how many bytes are in
flight, and a warp whose loads waited for its own arithmetic would leave the memory idle for a
whole latency per step. A chunk's scales (one per 16 codes) come as one 16-bit load and one
`cvt.rn.f16x2.e4m3x2`. A Decode says how x's words are decoded and how a block of B's is summed
against them (F16X2 or DP4A_DECODE).

Exactness, f16x2. x's codes are decoded and multiplied by 2^14 (fp4.UNIT_HALF2), so its f16x2
hold the codes' values; B's codes are left in units of 2^-14. A product is then a multiple of
2^-16 (0.25 * 2^-14) of at most 36 * 2^-14, and one lane's sum of the 8 products of a 16-element
block is at most 288 * 2^-14 < 2^-5, where fp16 still has steps of 2^-16 or finer: every product
and partial sum is exact. The block's two lanes are then added in float32 and multiplied by the
two scales and 2^14 (all exact in float32) into the float32 accumulator.

Exactness, dp4a. Twice each value is an integer of at most 12 in magnitude, so a block's 16
doubled products sum to at most 16 * 144 in an int32, exactly; converted to float32 (exact below
2^24) and multiplied by the two e4m3 scales and 1/4, a product of at most 4 + 4 + 12 significant
bits, exact in float32, into the accumulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

from tvm.s_tir import Schedule
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder

from . import fp4
from .common import TIRX_KERNEL, cuda_call, require_sm
from .errors import ScheduleNotApplicable
from .registry import schedule
from .workloads import Workload

WORD_CODES = 8  # codes in one 32-bit word
WARP = 32
PAIRS = 4  # f16x2 registers per word of codes
SLAB_CHUNKS = 512  # chunks of x decoded into shared memory at a time (32 KB of f16x2 at most)

HFMA2 = ("fp4_hfma2", "__forceinline__ __device__ unsigned fp4_hfma2(unsigned a, unsigned b, "
         "unsigned c) {\n  unsigned d;\n  asm(\"fma.rn.f16x2 %0, %1, %2, %3;\" : \"=r\"(d) : "
         "\"r\"(a), \"r\"(b), \"r\"(c));\n  return d;\n}\n")
HMUL2 = ("fp4_hmul2", "__forceinline__ __device__ unsigned fp4_hmul2(unsigned a, unsigned b) {\n"
         "  unsigned d;\n  asm(\"mul.rn.f16x2 %0, %1, %2;\" : \"=r\"(d) : \"r\"(a), \"r\"(b));\n"
         "  return d;\n}\n")
HALVES_SUM = ("fp4_halves_sum", "__forceinline__ __device__ float fp4_halves_sum(unsigned h) {\n"
              "  __half2 v = *reinterpret_cast<__half2*>(&h);\n"
              "  return __low2float(v) + __high2float(v);\n}\n")
HALF = ("fp4_half", "__forceinline__ __device__ float fp4_half(unsigned h, int high) {\n"
        "  __half2 v = *reinterpret_cast<__half2*>(&h);\n"
        "  return high ? __high2float(v) : __low2float(v);\n}\n")
PRMT = ("fp4_prmt", "__forceinline__ __device__ unsigned fp4_prmt(unsigned lo, unsigned hi, "
        "unsigned sel) {\n  unsigned d;\n  asm(\"prmt.b32 %0, %1, %2, %3;\" : \"=r\"(d) : "
        "\"r\"(lo), \"r\"(hi), \"r\"(sel));\n  return d;\n}\n")
DP4A = ("fp4_dp4a", "__forceinline__ __device__ int fp4_dp4a(unsigned a, unsigned b, int c) {\n"
        "  return __dp4a((int)a, (int)b, c);\n}\n")
E4M3X2 = ("fp4_e4m3x2", "__forceinline__ __device__ unsigned fp4_e4m3x2(unsigned short v) {\n"
          "  unsigned d;\n  asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(d) : \"h\"(v));\n"
          "  return d;\n}\n")


_call = partial(cuda_call, return_type="uint32")  # the helpers above return 32-bit words
u32 = lambda v: T.uint32(v)  # noqa: E731


@T.inline
def add_f16x2_block(acc, r, scale, h, bw, w0, xh, x0):
    """acc[r] += scale * the block of B's words bw[w0], bw[w0 + 1] dotted with x's f16x2 pairs
    xh[x0:x0 + 8]: each word split into four f16x2 pairs (two shifts, two masks each) and summed
    with eight `fma.rn.f16x2` into h[0], whose two halves are then added in float32."""
    h[0] = u32(0)
    for i in T.unroll(2):
        for p in T.unroll(PAIRS):
            h[0] = _call(HFMA2, fp4.pair_expr(bw[w0 + i], p), xh[x0 + i * PAIRS + p], h[0])
    acc[r] = acc[r] + _call(HALVES_SUM, h[0], return_type="float") * scale


def magnitude_bytes_expr(word, half, negative: bool):
    """`fp4.magnitude_bytes` as a uint32 TIR expression: one `prmt` of the table, selected by
    the word's codes shifted down by `half` (a loop variable may be given), signs flipped for
    the negative codes."""
    codes = T.shift_right(word, u32(16) * T.Cast("uint32", half))
    if negative:
        codes = T.bitwise_xor(codes, u32(fp4.CODE_SIGNS))
    return _call(PRMT, u32(fp4.MAGNITUDE_TABLE[0]), u32(fp4.MAGNITUDE_TABLE[1]), codes)


def signed_bytes_expr(word, half):
    """`fp4.signed_bytes` as a uint32 TIR expression: x's codes as four int8s, twice their
    values."""
    bias = u32(fp4.BYTE_BIAS)
    negated = T.bitwise_xor(bias - magnitude_bytes_expr(word, half, True), bias)
    return T.bitwise_or(magnitude_bytes_expr(word, half, False), negated)


@T.inline
def add_dp4a_block(acc, r, scale, h, bw, w0, xh, x0):
    """acc[r] += scale * the block of B's words bw[w0], bw[w0 + 1] dotted with x's int8s
    xh[x0:x0 + 4]: per half word, the positive codes' doubled magnitudes (one `prmt`) dotted
    into h[0] and the negative codes' into h[1] (one `dp4a` each); h[0] - h[1] is the block's
    sum, times 4, an exact int32."""
    h[0] = 0
    h[1] = 0
    for i in T.unroll(2):
        for half in T.unroll(2):
            h[0] = _call(DP4A, magnitude_bytes_expr(bw[w0 + i], half, False),
                         xh[x0 + i * 2 + half], h[0], return_type="int32")
            h[1] = _call(DP4A, magnitude_bytes_expr(bw[w0 + i], half, True),
                         xh[x0 + i * 2 + half], h[1], return_type="int32")
    acc[r] = acc[r] + T.Cast("float32", h[0] - h[1]) * scale


@dataclass(frozen=True)
class Decode:
    """How a kernel turns words of codes into a block's sum of products: x's words decoded
    once per CTA (`x_per_word` uint32 per word of 8 codes, its block scales stored times
    `x_unit`), B's in the loop by `add_block` with `scratch` registers."""
    x_per_word: int
    x_word: Callable  # (x's word, which of its x_per_word) -> that decoded uint32
    x_unit: float
    add_block: Callable
    scratch: tuple[int, str]


# f16x2: x's pairs times 2^14 undone; B's products in units of 2^-14, which x's scale undoes
F16X2 = Decode(PAIRS, lambda xw, p: _call(HMUL2, fp4.pair_expr(xw, p), u32(fp4.UNIT_HALF2)),
               1 / fp4.UNIT, add_f16x2_block, (1, "uint32"))
# dp4a: both sides doubled, so a block's integer sum is 4 times its value
DP4A_DECODE = Decode(2, signed_bytes_expr, 1 / 4, add_dp4a_block, (2, "int32"))


def chunk_words(K: int) -> int:
    """Words of codes a lane loads per row per chunk: 4 (16 bytes, 32 codes, two scale blocks)
    where rows are whole 16-byte vectors (K a multiple of 32), else 2 (8 bytes, one block)."""
    return 4 if K % 32 == 0 else 2


@dataclass(frozen=True, kw_only=True)
class PairedPlan:
    """Every number `paired_gemv`'s kernel is written from, derived once by `paired_plan`, so
    that its pieces read names, not arithmetic. A chunk is the `words` words of codes of one
    row that a lane loads at once (32 codes, or 16); a step, the `depth` chunks of each of the
    warp's `rows` rows that it loads at once into one register buffer; a slab, the chunks of x
    decoded into shared memory at a time."""

    # the workload
    L: int  # batches (1: a GEMV)
    N: int  # rows of B (per batch)
    out_dtype: str
    shapes: dict  # the buffers' shapes by name (Workload.buffer_shapes)
    # the knobs (warps: threads // 32)
    rows: int  # consecutive rows per warp
    depth: int  # chunks of each row per lane per step
    splits: int  # warps side by side along each row's K
    decode: Decode  # x's decode and a block's sum (F16X2 or DP4A_DECODE)
    # a row of B, and x
    words: int  # words of codes per chunk (chunk_words)
    chunks: int  # chunks per row
    blocks_per_chunk: int  # scale blocks (16 codes) per chunk: 2, or 1
    scale_unit: str  # a chunk's scales as one load: uint16 (two blocks), or uint8 (one)
    row_words: int  # words of codes per row
    row_scales: int  # scales per row
    row_units: int  # scale units per row
    x_per_chunk: int  # uint32 of decoded x per chunk
    # the steps
    slab: int  # chunks of x in shared memory at a time (at most SLAB_CHUNKS)
    width: int  # lanes side by side along K, over the splits
    steps: int  # per slab
    total_steps: int  # over every slab
    in_flight: int  # chunks of B per lane per step: one register buffer's
    # the CTAs
    threads: int  # per CTA
    row_warps: int  # warps with rows of their own
    rows_per_cta: int
    ctas_per_batch: int


def paired_plan(wl: Workload, warps: int, rows: int, depth: int, splits: int,
                decode: Decode) -> PairedPlan:
    """The plan of `paired_gemv`'s kernel for wl and the knobs."""
    L, N, K = wl.dims.get("L", 1), wl.dims["N"], wl.dims["K"]
    words = chunk_words(K)
    chunks = K // (words * WORD_CODES)
    blocks_per_chunk = words * WORD_CODES // fp4.BLOCK
    slab = min(chunks, SLAB_CHUNKS)
    width = WARP * splits
    steps = -(-slab // (width * depth))
    row_warps = warps // splits
    return PairedPlan(
        L=L, N=N, out_dtype=wl.out_dtype, shapes=wl.buffer_shapes(), rows=rows, depth=depth,
        splits=splits, decode=decode, words=words, chunks=chunks,
        blocks_per_chunk=blocks_per_chunk,
        scale_unit="uint16" if blocks_per_chunk == 2 else "uint8",
        row_words=K // WORD_CODES, row_scales=K // fp4.BLOCK,
        row_units=K // fp4.BLOCK // blocks_per_chunk, x_per_chunk=words * decode.x_per_word,
        slab=slab, width=width, steps=steps, total_steps=-(-chunks // slab) * steps,
        in_flight=rows * depth, threads=warps * WARP, row_warps=row_warps,
        rows_per_cta=row_warps * rows, ctas_per_batch=-(-N // (row_warps * rows)))


class Inputs(NamedTuple):
    """The inputs as the kernel loads them: B's and x's codes as 32-bit words, B's scales in
    units of a chunk's (scale_unit), x's one by one."""

    B_words: object
    B_scales: object
    x_words: object
    x_scales: object


class Slab(NamedTuple):
    """x's slab in shared memory: its decoded words and its blocks' scales."""

    x_decoded: object
    x_block_scales: object


class Registers(NamedTuple):
    """A thread's registers: its rows' sums, a chunk of x's decoded words, the decode's scratch,
    and the two step buffers of B's codes and of their scales."""

    acc: object
    xh: object
    h: object
    bw: object
    bs: object


class Thread(NamedTuple):
    """Who a thread is: its index in the CTA, its batch, its split (which part of K), its lane
    along K over the splits, its CTA's first row, its warp's first row within the CTA, and so
    its warp's first row (cta_row + warp_row)."""

    tx: object
    batch: object
    split: object
    lane: object
    cta_row: object
    warp_row: object
    first_row: object


def split_partials(plan: PairedPlan):
    """With splits, the shared floats of each split's partial sum of each row of the CTA,
    allocated here (called inside the kernel's script); else None."""
    if plan.splits == 1:
        return None
    return IRBuilder.name("partials", T.alloc_buffer((plan.splits * plan.rows_per_cta,),
                                                     "float32", scope="shared"))


@T.macro
def load_step(plan, regs, inputs, me, g, buf):
    """Step g's codes and scales of every row and chunk into register buffer `buf`."""
    for u in T.unroll(plan.depth):
        local: T.let[T.int32] = (g % plan.steps * plan.depth + u) * plan.width + me.lane
        c: T.let[T.int32] = g // plan.steps * plan.slab + local
        if local < plan.slab and c < plan.chunks:
            for r in T.unroll(plan.rows):
                row: T.let[T.int32] = me.batch * plan.N + T.min(me.first_row + r, plan.N - 1)
                at: T.let[T.int32] = buf * plan.in_flight + r * plan.depth + u
                for i in T.vectorized(plan.words):
                    regs.bw[at * plan.words + i] = inputs.B_words[
                        row * plan.row_words + c * plan.words + i]
                regs.bs[at] = T.Cast("uint16", inputs.B_scales[row * plan.row_units + c])


@T.macro
def decode_x(plan, shared, inputs, me, part):
    """x's slab `part`, decoded by the whole CTA: a word (8 codes) per thread at a time;
    decoded word j of chunk c at (j // 4 * slab + c) * 4 + j % 4, block b's scale (times
    the decode's unit) at b * slab + c."""
    slab_words, slab_blocks = T.meta_var((plan.slab * plan.words,
                                          plan.slab * plan.blocks_per_chunk))
    for w in T.unroll(-(-slab_words // plan.threads)):  # every load issued before the decode
        word: T.let[T.int32] = w * plan.threads + me.tx
        if word < slab_words and part * plan.slab + word // plan.words < plan.chunks:
            xw: T.let[T.uint32] = inputs.x_words[
                me.batch * plan.row_words + part * plan.slab * plan.words + word]
            for p in T.unroll(plan.decode.x_per_word):
                j: T.let[T.int32] = word % plan.words * plan.decode.x_per_word + p
                shared.x_decoded[(j // 4 * plan.slab + word // plan.words) * 4 + j % 4] = (
                    plan.decode.x_word(xw, p))
    for b in range(-(-slab_blocks // plan.threads)):
        block: T.let[T.int32] = b * plan.threads + me.tx
        first: T.let[T.int32] = part * plan.slab * plan.blocks_per_chunk
        if block < slab_blocks and first + block < plan.row_scales:
            shared.x_block_scales[block % plan.blocks_per_chunk * plan.slab
                                  + block // plan.blocks_per_chunk] = (
                T.Cast("float32", inputs.x_scales[me.batch * plan.row_scales + first + block])
                * T.float32(plan.decode.x_unit))


@T.macro
def compute_step(plan, regs, shared, me, g, buf):
    """Step g from register buffer `buf`: per chunk, x's decoded words from shared memory,
    then each row's codes decoded and summed a block at a time, the block's sum scaled."""
    for u in T.unroll(plan.depth):
        local: T.let[T.int32] = (g % plan.steps * plan.depth + u) * plan.width + me.lane
        if local < plan.slab and g // plan.steps * plan.slab + local < plan.chunks:
            for q in T.unroll(plan.x_per_chunk // 4):
                for i in T.vectorized(4):
                    regs.xh[q * 4 + i] = shared.x_decoded[(q * plan.slab + local) * 4 + i]
            for r in T.unroll(plan.rows):
                at: T.let[T.int32] = buf * plan.in_flight + r * plan.depth + u
                scale_pair: T.let[T.uint32] = _call(E4M3X2, regs.bs[at])
                for blk in T.unroll(plan.blocks_per_chunk):
                    plan.decode.add_block(
                        regs.acc, r, _call(HALF, scale_pair, blk, return_type="float")
                        * shared.x_block_scales[blk * plan.slab + local], regs.h, regs.bw,
                        at * plan.words + blk * 2, regs.xh, blk * 2 * plan.decode.x_per_word)


@T.macro
def run_steps(plan, regs, shared, inputs, me):
    """Every step, two per iteration (one per register buffer): step g + 1's loads issued
    before step g's arithmetic (step 0's before the loop), and at a slab's first step, x's slab
    decoded into shared memory between two barriers."""
    load_step(plan, regs, inputs, me, 0, 0)
    for pair_of_steps in range(-(-plan.total_steps // 2)):
        for buf in T.unroll(2):
            g: T.let[T.int32] = pair_of_steps * 2 + buf
            if g < plan.total_steps:
                if g + 1 < plan.total_steps:  # the next step's loads fly during this one
                    load_step(plan, regs, inputs, me, g + 1, 1 - buf)
                if g % plan.steps == 0:  # a new slab of x
                    if g > 0:
                        T.tvm_storage_sync("shared")  # the previous slab's readers are done
                    decode_x(plan, shared, inputs, me, g // plan.steps)
                    T.tvm_storage_sync("shared")
                compute_step(plan, regs, shared, me, g, buf)


@T.macro
def reduce_rows(plan, acc, partials, y_flat, me):
    """Each row's sum over the warp's lanes (a warp all-reduce, by shuffles) stored in y, or
    with splits, stored as this warp's partial of the row."""
    for r in T.unroll(plan.rows):
        total: T.let[T.float32] = T.cuda.warp_reduce(acc[r], "sum")
        if plan.splits == 1:
            if me.lane == 0 and me.first_row + r < plan.N:
                y_flat[me.batch * plan.N + me.first_row + r] = T.Cast(plan.out_dtype, total)
        elif me.lane % WARP == 0:  # this warp's part of the row: a partial
            partials[me.split * plan.rows_per_cta + me.warp_row + r] = total


@T.macro
def sum_splits(plan, partials, y_flat, me):
    """With splits, after a barrier: a thread per row of the CTA sums the splits' partials of
    its row into y."""
    T.tvm_storage_sync("shared")
    if me.tx < plan.rows_per_cta and me.cta_row + me.tx < plan.N:
        total_of_splits = T.alloc_local((1,), "float32")
        total_of_splits[0] = T.float32(0)
        for part in T.unroll(plan.splits):
            total_of_splits[0] = total_of_splits[0] + partials[part * plan.rows_per_cta + me.tx]
        y_flat[me.batch * plan.N + me.cta_row + me.tx] = T.Cast(plan.out_dtype,
                                                                total_of_splits[0])


def paired_gemv(wl: Workload, warps: int, rows: int, depth: int, splits: int = 1,
                decode: Decode = F16X2):
    """y[l, n] = sum_k B[l, n, k] x[l, k] on nvfp4 codes and e4m3 scales (the workload's
    buffers), one TIRx kernel written from the plan of the knobs and `decode` (F16X2 or
    DP4A_DECODE): how it works, the module's docstring."""
    plan = paired_plan(wl, warps, rows, depth, splits, decode)

    @T.prim_func
    def main(B_handle: T.handle, B_scale_handle: T.handle, x_handle: T.handle,
             x_scale_handle: T.handle, y_handle: T.handle):
        T.func_attr({TIRX_KERNEL: True})
        L, N, out_dtype, shapes = T.meta_var((plan.L, plan.N, plan.out_dtype, plan.shapes))
        B = T.match_buffer(B_handle, shapes["B"], fp4.CODE_BYTES, align=16)
        B_scale = T.match_buffer(B_scale_handle, shapes["B_scale"], fp4.SCALE_DTYPE, align=2)
        x = T.match_buffer(x_handle, shapes["x"], fp4.CODE_BYTES, align=16)
        x_scale = T.match_buffer(x_scale_handle, shapes["x_scale"], fp4.SCALE_DTYPE)
        y = T.match_buffer(y_handle, shapes["y"], out_dtype)
        B_words = T.decl_buffer((L * N * plan.row_words,), "uint32", data=B.data)
        B_scales = T.decl_buffer((L * N * plan.row_units,), plan.scale_unit, data=B_scale.data)
        x_words = T.decl_buffer((L * plan.row_words,), "uint32", data=x.data)
        x_scales = T.decl_buffer((L * plan.row_scales,), fp4.SCALE_DTYPE, data=x_scale.data)
        y_flat = T.decl_buffer((L * N,), out_dtype, data=y.data)

        T.device_entry()
        cta = T.cta_id([L * plan.ctas_per_batch])
        tx = T.thread_id([plan.threads])
        x_decoded = T.alloc_buffer((plan.x_per_chunk * plan.slab,), "uint32", scope="shared",
                                   align=16)
        x_block_scales = T.alloc_buffer((plan.blocks_per_chunk * plan.slab,), "float32",
                                        scope="shared")
        partials = T.meta_var(split_partials(plan))
        batch: T.let[T.int32] = cta // plan.ctas_per_batch
        warp: T.let[T.int32] = tx // WARP
        split: T.let[T.int32] = warp // plan.row_warps  # which part of K
        lane: T.let[T.int32] = split * WARP + tx % WARP  # along K, over the splits
        cta_row: T.let[T.int32] = cta % plan.ctas_per_batch * plan.rows_per_cta
        warp_row: T.let[T.int32] = warp % plan.row_warps * plan.rows  # in the CTA
        first_row: T.let[T.int32] = cta_row + warp_row
        acc = T.alloc_local((plan.rows,), "float32")
        xh = T.alloc_local((plan.x_per_chunk,), "uint32")
        bw = T.alloc_local((2 * plan.in_flight * plan.words,), "uint32")  # two steps' codes
        bs = T.alloc_local((2 * plan.in_flight,), "uint16")  # and their scales
        h = T.alloc_local((plan.decode.scratch[0],), plan.decode.scratch[1])
        me = T.meta_var(Thread(tx, batch, split, lane, cta_row, warp_row, first_row))
        for r in T.unroll(plan.rows):
            acc[r] = T.float32(0)
        run_steps(plan, Registers(acc, xh, h, bw, bs), Slab(x_decoded, x_block_scales),
                  Inputs(B_words, B_scales, x_words, x_scales), me)
        reduce_rows(plan, acc, partials, y_flat, me)
        if plan.splits > 1:
            sum_splits(plan, partials, y_flat, me)

    return main


def _refuse_bad_warps(warps: int, splits: int) -> None:
    """Refuse more warps than a CUDA block holds, and warps that the splits do not divide."""
    if warps * WARP > 1024:
        raise ScheduleNotApplicable(f"bitdecode with {warps} warps would need {warps * WARP} "
                                    "threads per block; CUDA allows 1024")
    if splits < 1 or warps % splits:
        raise ScheduleNotApplicable(f"bitdecode splits K over groups of warps: splits={splits} "
                                    f"must divide warps={warps}")


def paired_rung(name: str, space: dict, decode: Decode):
    """Register the decorated function as rung `name` of the GEMV and the batched GEMV on
    nvfp4, built by `paired_gemv` with `decode` (the warps checked first), over `space`."""
    def kernel(wl: Workload, warps: int, rows: int, depth: int, splits: int = 1):
        _refuse_bad_warps(warps, splits)
        return paired_gemv(wl, warps, rows, depth, splits, decode)

    def register(fn):
        for op in ("gemv", "batched_gemv"):
            fn = schedule(op, name, space=space, compute=kernel, dtypes=(fp4.NAME,))(fn)
        return fn
    return register


BITDECODE_SPACE = {"warps": [2, 4, 8], "rows": [1, 2, 4, 8], "depth": [1, 2], "splits": [1, 2, 4]}
# dp4a's decode is cheaper, so more chunks in flight can pay: depth 4 too
DP4A_SPACE = BITDECODE_SPACE | {"depth": [1, 2, 4]}


@paired_rung("bitdecode", BITDECODE_SPACE, F16X2)
def bitdecode(sch: Schedule, wl: Workload, warps: int = 8, rows: int = 1, depth: int = 2,
              splits: int = 1) -> None:
    """The batched seed's final kernel on Hopper: nvfp4 decoded with bit operations, two values
    per 32-bit register, and multiplied with f16x2 FMAs (sm_90 has no e2m1 conversion).

    Each step, a lane loads `depth` chunks of 16 bytes (32 codes) of each of the warp's `rows`
    consecutive rows (V4/V5) with their scales, a step ahead of its arithmetic (V7's double
    buffering, in registers); then it splits each word into four f16x2 pairs with two shifts
    and two masks (schedules/fp4.py) and sums a 16-element block with eight `fma.rn.f16x2`
    against x's pairs, decoded once per CTA into shared memory (V6_2_1); the block's sum then
    takes both e4m3 scales in float32. With `splits`, 2 or 4 warps share each row along K
    (the seed's V2), their partials summed in shared memory. A TIRx kernel
    (schedules/nvfp4.py). The defaults (8 warps, 1 row, depth 2, no split) are within 5% of
    the H100 grid's best, re-timed in the same run, on each of the seed's three shapes.

    IR: a TIRx PrimFunc: uint4 loads of B's words into two register buffers, the next step's
    before this one's arithmetic; shift/and/or on uint32, fp4_hfma2 and fp4_hmul2 (inline
    `fma.rn.f16x2` / `mul.rn.f16x2`), 16-bit scale loads converted by `cvt.rn.f16x2.e4m3x2`;
    x's pairs in shared memory behind one __syncthreads per slab; a warp all-reduce per row."""
    require_sm("bitdecode", 89, "cvt.rn.f16x2.e4m3x2")  # the knobs: paired_rung


@paired_rung("dp4a", DP4A_SPACE, DP4A_DECODE)
def dp4a(sch: Schedule, wl: Workload, warps: int = 8, rows: int = 1, depth: int = 2,
         splits: int = 1) -> None:
    """Past the seed: bitdecode's kernel with an integer decode. Twice an e2m1 value is an
    integer, so a block's 16 products are summed exactly by `dp4a` (four int8 products into an
    int32) and scaled once in float32. A half word of B's codes becomes four int8 magnitudes by
    one `prmt` of an 8-byte table (the codes are its selector; a negative code's selector
    gives 0), and once more with the signs flipped for the negative codes, summed apart and
    subtracted: per word of 8 codes, 4 `prmt`, a shift and two xors, and 4 `dp4a`, where
    bitdecode's decode takes 16 shifts and masks (four pairs of two each) and 4 f16x2 FMAs.
    x is decoded once per CTA into signed int8s, half the shared memory of its f16x2 pairs.
    On the H100 it took the seed's three shapes from bitdecode's 30.9, 52.7 and 16.6 us to
    27.8, 49.3 and 15.6 us (defaults, 5 interleaved rounds).

    IR: as bitdecode's, with fp4_prmt (inline `prmt.b32`) and fp4_dp4a (`__dp4a`) in place of
    the shifts, masks and fp4_hfma2, and one int32-to-float conversion per block."""
    require_sm("dp4a", 89, "cvt.rn.f16x2.e4m3x2")  # the knobs: paired_rung
