"""v8's kernel in TVM 0.27's TIRx, composed of named pieces (T.macro, each expanded in place
where the kernel calls it, so the kernel is one PrimFunc): the set-up, the producer, the
consumer's K loop, split K's stash and gather of partial tiles, fp8's scales (after the sum,
or per K block as its sums are promoted), and the three
epilogues (tma_store's boxes, quad stores of 16-bit C, stores from registers). Each piece reads
the plan (schedules/v8/plan.py) for every number; where a feature is off, its piece is simply
not called, or expands to nothing.

The kernel (`warp_specialized_gemm`):

Warpgroup 0 is the producer (`produce`): it gives registers back (setmaxnreg.dec) and one
thread loads every K block of every unit of the CTA into the ring of `stages` stages with
TMA, after waiting for the consumers to empty the stage (`empty` mbarrier). Warpgroups 1 and
2 are the consumers (`consume`, setmaxnreg.inc): per K block each waits for the stage's
bytes (`full` mbarrier, which TMA completes), multiplies its part of the tile with wgmma,
and frees the stage of the K block before (`k_loop`). The ring's position runs on from unit
to unit, so the producer loads the next unit while the consumers store this one: straight
from their accumulators, guarded at C's edges, or with tma_store through two shared boxes
per consumer that TMA stores (clipped at C's edges) while the consumers go on to the next
unit (EPILOGUES).

Split K (split_k > 1): each slice's consumers put their partial tile in the workspace
(`stash_partials`) and count themselves in at the tile's arrival counter; the slice that
arrives last adds the others' partials to its own (`gather_partials`) and stores C. With
split_tail, only the tiles of the last, partial wave are split (the units after the
`whole` tiles): the SMs that wave would leave idle take slices of its tiles.

Clusters (cluster_m or cluster_n = 2): a unit is a cluster's pair of tiles, side by side
along M or N; the pair shares B's or A's loads by multicast (TMA_LOAD_MULTICAST), and a
stage is free once both CTAs' consumers have freed it (FREE_STAGE).

Ping-pong (pingpong, CUTLASS's sm90 "ping-pong" kernel; whole tiles: no split K): each
consumer multiplies the whole block tile of every other unit of the CTA, consumer 0 the
even ones, and its ring position skips the other's K blocks; a stage is then freed by one
consumer (in each CTA of a cluster). The two take turns at the tensor cores
(TURN_BARRIER: a consumer starts a unit's K loop once the other has issued the last
wgmmas of the unit before), so each one's epilogue runs under the other's K loop. The
turns also keep a consumer from waiting on a `full` barrier more than one phase ahead of
its loads, which its parity could not tell apart.

Rows TMA cannot load (plan.staged: strides not whole 16 bytes): the host allocates a
workspace of padded rows for each such operand and encodes its tensor map over that; every
CTA first copies its share of the rows into it (`stage_operand`) and waits for the whole grid
(GRID_SYNC) before its warpgroups take their roles.

M may be a symbolic size (plan.most_m set): the grid, the units and the tile walk are then
computed from it on the host and in the kernel, and most_m sizes split K's workspace.

Swapped (plan.swapped, swap_ab): the plan is C^T = B A^T's; the kernel takes the workload's
parameters and multiplies B as the plan's A, and A as its B (scales likewise), and its
registers' epilogue stores each element at C[column, row].
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder

from ..common import TIRX_KERNEL, cuda_call
from ..tensorcore import WARPGROUP
from ..workloads import FP8, FP8_BLOCK, FP8_SCALES
from .cuda import (BOX_BARRIER, CLUSTER_SYNC, CONSUMER_REGISTERS, FENCE_OPERAND, FREE_OWN_STAGE,
                   FREE_STAGE, GRID_SYNC, PAIR_STORE, PRODUCER_REGISTERS, SETTLE, SPLIT_BARRIER,
                   TMA_LOAD, TMA_LOAD_MULTICAST, TMA_STORE, TURN_BARRIER, WARPGROUP_OF_WARP,
                   arrival_word, descriptor_at, descriptor_base, quad_store, stage_pair,
                   stage_rows, swizzled)
from .geometry import ATOM, BOX_ROWS, CONSUMER_THREADS, CONSUMERS, ROW_BYTES, THREADS
from .plan import Plan


class Shared(NamedTuple):
    """The CTA's shared state: the ring's 32-bit address, its `full` and `empty` mbarriers, and
    split K's arrival word (None without split K)."""

    ring: object
    full: object
    empty: object
    arrived: object


class Maps(NamedTuple):
    """The tensor maps of A, B and C (C's encoded only with tma_store)."""

    A: object
    B: object
    C: object


class Operands(NamedTuple):
    """The buffers the consumers read or write besides the ring: C, fp8's scales and the
    bias."""

    C: object
    A_scale: object
    B_scale: object
    Bias: object


class Consumer(NamedTuple):
    """A consumer thread: its warpgroup (0 or 1), its thread among the consumers, warp and lane
    within the warpgroup, its accumulators, its ring position at the start of its unit (`used`:
    K blocks passed) and within it (`ring`: the stage the next K block is in and its `full`
    barrier's parity, stepped a block at a time so that the K loop divides by no stage count),
    tma_store's count of boxes sent, (promote_k) the float32 sums the accumulators are promoted
    into, (block scales) the K block's scales of its rows and of its columns' blocks
    (`block_scale_registers`)."""

    consumer: object
    thread: object
    warp: object
    lane: object
    acc: object
    used: object
    ring: object
    sent: object
    sums: object
    factors: object


class BlockScales(NamedTuple):
    """Block-scaled fp8: where a consumer's K loop reads each K block's scales: A_scale and
    B_scale, the thread's first row of C (wgmma's fragment), the first column of the
    consumer's part of the tile (a multiple of 8) and the unit's first K block. It has a
    unit's first_row and first_col, so `pair_at` places its rows and 8-column groups."""

    A_scale: object
    B_scale: object
    first_row: object
    first_col: object
    first_block: object


class Unit(NamedTuple):
    """The consumer's unit of work: its number, output tile, the CTA's tile origin and the
    thread's first row and column of C in wgmma's fragment."""

    unit: object
    tile: object
    m0: object
    n0: object
    first_row: object
    first_col: object


def leads(thread):
    """Whether a consumer thread is its warpgroup's first, which sends its boxes of C."""
    return thread % (WARPGROUP * 32) == 0


def part(rank, shares: int):
    """Which part of a box shared by `shares` CTAs (1: not shared) this CTA loads."""
    return rank if shares > 1 else 0


def tma_load(plan: Plan, shares: int, dst, tensor_map, coords: tuple, barrier):
    """A TMA load into this CTA's stage at box coordinates `coords`, or, where `shares` CTAs of
    the cluster share the box (more than 1), a multicast into the stages of all of them."""
    if shares > 1:
        return cuda_call(TMA_LOAD_MULTICAST, dst, tensor_map, *coords, barrier, plan.every_cta)
    return TMA_LOAD(dst, tensor_map, *coords, barrier)


@T.macro
def stage_operand(plan, operand: str, source, staged):
    """Rows TMA cannot load: this CTA's share of `operand`'s rows copied from `source` into the
    workspace `staged`, zero-padded to rows it can (STAGE_ROWS); every thread of the CTA."""
    cuda_call(stage_rows(plan.element_bytes), source.data, staged.data, *plan.staging(operand))


@T.macro
def set_up(plan, tx, shared, maps):
    """Thread 0 initialises the ring's barriers (an `empty` one counts a freeing thread per
    consumer that multiplies a unit, in each CTA of the cluster) and prefetches the tensor maps;
    then the CTA (or the cluster) syncs, so no barrier is signalled before it is set."""
    if tx == 0:
        for s in T.unroll(plan.knobs.stages):
            T.ptx.mbarrier.init.shared.b64(shared.full.ptr_to([s]), T.uint32(1))
            T.ptx.mbarrier.init.shared.b64(shared.empty.ptr_to([s]),
                                           T.uint32(CONSUMERS // plan.turns * plan.cluster))
        T.ptx.fence.mbarrier_init.release.cluster()
        T.ptx.fence.proxy.async_.shared__cta()
        T.ptx.prefetch.tensormap(T.address_of(maps.A))
        T.ptx.prefetch.tensormap(T.address_of(maps.B))
        if plan.knobs.tma_store:
            T.ptx.prefetch.tensormap(T.address_of(maps.C))
    if plan.cluster > 1:  # the barriers of both CTAs initialised before either signals them
        cuda_call(CLUSTER_SYNC)
    else:
        T.cuda.cta_sync()


@T.macro
def load_stage(plan, rank, maps, shared, s, stage, k0, origin):
    """The producer's TMA loads of one K block (from element k0) of the tile at `origin` into
    stage s: A's rows, then B's (nt: rows as A's; nn: 64-column boxes), each only this CTA's
    part where the cluster shares the box."""
    a_part = T.meta_var(part(rank, plan.knobs.cluster_n))
    tma_load(plan, plan.knobs.cluster_n,
             stage + T.Cast("uint32", a_part * (plan.a_rows * ROW_BYTES)),
             T.address_of(maps.A), (k0, origin[0] + a_part * plan.a_rows),
             shared.full.ptr_to([s]))
    b_part = T.meta_var(part(rank, plan.knobs.cluster_m))
    if plan.nt:  # B's rows (or this CTA's part), as A's
        tma_load(plan, plan.knobs.cluster_m,
                 stage + T.Cast("uint32", plan.a_bytes + b_part * (plan.b_rows * ROW_BYTES)),
                 T.address_of(maps.B), (k0, origin[1] + b_part * plan.b_rows),
                 shared.full.ptr_to([s]))
    else:  # B's 64-column boxes (or every other one, from b_part on)
        for box in T.unroll(plan.knobs.block_n // 64 // plan.knobs.cluster_m):
            tma_load(plan, plan.knobs.cluster_m,
                     stage + T.Cast("uint32", plan.a_bytes + (box * plan.knobs.cluster_m + b_part)
                                    * (plan.block_k * ROW_BYTES)),
                     T.address_of(maps.B),
                     (origin[1] + (box * plan.knobs.cluster_m + b_part) * 64, k0),
                     shared.full.ptr_to([s]))


@T.macro
def step_ring(plan, ring, s):
    """The ring position (`ring`: the next stage and the parity its barrier is waited on with)
    stepped past stage s: the next stage, and past the last one the first, its barriers a phase
    on. The producer and each consumer keep one, so no K block divides by the stage count."""
    last = T.meta_var(s == plan.knobs.stages - 1)
    ring[0] = T.Select(last, 0, s + 1)
    ring[1] = T.Select(last, 1 - ring[1], ring[1])


@T.macro
def produce(plan, cta, rank, tx, shared, maps):
    """The producer warpgroup: it gives registers back, and its first thread loads every K block
    of the CTA's units into the ring, each stage once its consumers have freed it; with
    clusters it then waits until both CTAs' consumers freed every stage."""
    stages = T.meta_var(plan.knobs.stages)
    T.ptx["setmaxnreg.dec.sync.aligned.u32"](PRODUCER_REGISTERS)
    if tx == 0:
        ring = T.alloc_local((2,), "int32")  # the next K block's stage, its empty barrier's parity
        ring[0] = 0
        ring[1] = 1  # on a fresh barrier, parity 1 counts as the phase before the first
        for j in range(plan.units_per_cta):
            if plan.unit_of(cta, j) < plan.units:
                tile: T.let[T.int32] = plan.tile_of(plan.unit_of(cta, j))
                m0, n0 = T.meta_var(plan.unit_origin(tile, rank))
                first, count = T.meta_var(plan.k_range(plan.unit_of(cta, j)))
                for kt in range(count):
                    s: T.let[T.int32] = ring[0]
                    # the stage's previous K block freed by the consumers
                    T.cuda.mbarrier_wait(shared.empty.ptr_to([s]), ring[1])
                    step_ring(plan, ring, s)
                    stage: T.let[T.uint32] = shared.ring + T.Cast("uint32", s * plan.stage_bytes)
                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(shared.full.ptr_to([s]),
                                                             T.uint32(plan.stage_bytes))
                    k0: T.let[T.int32] = (first + kt) * plan.block_k
                    load_stage(plan, rank, maps, shared, s, stage, k0, (m0, n0))
        if plan.cluster > 1:  # every stage freed by both CTAs' consumers before this ends
            for i in range(stages):
                at: T.let[T.int32] = ring[0]
                T.cuda.mbarrier_wait(shared.empty.ptr_to([at]), ring[1])
                step_ring(plan, ring, at)


def float32_sums(plan, acc):
    """promote_k: the float32 sums a consumer thread promotes its accumulators into, allocated
    here; else none to allocate (the accumulators stand in, unused)."""
    if not plan.promotes:
        return acc
    return IRBuilder.name("sums", T.alloc_local((plan.accumulators,), "float32"))


def adds_to_sums(plan, kt, ks):
    """wgmma's scale-d: whether k step ks of K block kt adds to the accumulators (always, but
    at the first step after a promotion, where it starts them afresh)."""
    if not plan.promotes:
        return T.bool(True)
    return T.Or(ks > 0, kt % plan.promote_blocks != 0)


def pair_at(plan, at, mi, n8, h) -> tuple:
    """Where a consumer thread's pair of neighbouring accumulators in wgmma mi, 8-column block
    n8 and half h (rows +0 or +8) lie in wgmma's fragment: (C's row, C's first column, the
    first's index in the accumulators)."""
    return (at.first_row + mi * 64 + h * 8, at.first_col + n8 * 8,
            mi * plan.per_wgmma + n8 * 4 + h * 2)


def first_row_of(plan, me, m0):
    """The consumer thread's first row of C in its tile at row m0: thread t holds
    C[16 * warp + t % 32 / 4 + 8 h, 8 n8 + 2 (t % 4) + e] of each m64 wgmma's rows (wgmma's
    fragment, v7's _register_of)."""
    return m0 + plan.consumer_rows(me.consumer) + me.warp * 16 + me.lane // 4


def block_scale_count(plan) -> int:
    """Block scales: a consumer thread's scales of one K block: those of its 2 x m_wgmmas rows
    (A_scale), then those of the b_scale_blocks blocks of 128 columns that its part of the tile
    may touch (B_scale)."""
    return 2 * plan.m_wgmmas + plan.b_scale_blocks


def block_scale_registers(plan):
    """Block scales: a consumer thread's registers for the scales of one K block, two where
    runs overlap (a block's and the next's, `block_scale_count` each), allocated here; else
    None."""
    if not plan.block_scaled:
        return None
    return IRBuilder.name("factors", T.alloc_local(
        (block_scale_count(plan) * (2 if plan.overlaps else 1),), "float32"))


def origin_register(plan):
    """Where M is symbolic (v8 for any M): a consumer thread's registers for its first row and
    column of the unit, that the epilogue indexes C, the bias, rowwise scales and split K's
    row checks from, allocated here; else None. Set once a unit, so that neither TVM (which
    substitutes a bound value into its uses) nor nvcc recomputes the row and column, the tile
    walk's divisions by runtime sizes among them, at each element (in split K's epilogue at
    few rows, that code had outgrown the instruction cache). Where M is a number the walk
    folds into shifts and masks, and TVM, seeing the row and column, proves most of C's edge
    checks away."""
    if isinstance(plan.M, int):
        return None
    return IRBuilder.name("origin", T.alloc_local((2,), "int32"))


def block_scales(plan, operands, me, m0, n0, first_block):
    """Block scales: where the consumer's K loop over a unit (whose tile starts at m0, n0 and
    whose K blocks at first_block) reads them (BlockScales); else None."""
    if not plan.block_scaled:
        return None
    return BlockScales(operands.A_scale, operands.B_scale, first_row_of(plan, me, m0),
                       n0 + plan.consumer_cols(me.consumer), first_block)


@T.macro
def load_block_scales(plan, me, scales, kb, acc_set):
    """Block scales: K block kb's scales of the thread's rows (indices clamped at C's last row,
    where nothing is stored) and of the blocks of B's rows that its part of the tile may
    touch (clamped at the last block), into the registers of accumulator set acc_set, before
    the K block's wgmmas, so that the loads are done by the time its sums are promoted."""
    first = T.meta_var(acc_set * block_scale_count(plan))
    for mi in T.unroll(plan.m_wgmmas):
        for h in T.unroll(2):
            row = T.meta_var(pair_at(plan, scales, mi, 0, h)[0])
            me.factors[first + mi * 2 + h] = scales.A_scale[T.min(row, plan.M - 1), kb]
    for j in T.unroll(plan.b_scale_blocks):
        me.factors[first + 2 * plan.m_wgmmas + j] = scales.B_scale[
            T.min(scales.first_col // FP8_BLOCK + j, plan.scale_blocks[0] - 1), kb]


def column_block_scale(plan, me, scales, n8, first):
    """Block scales: the loaded B scale of 8-column group n8's block (its j-th from the
    consumer's first), among the scales from register `first` on, picked by selects, which
    keep the registers registers."""
    b_scales = [me.factors[first + 2 * plan.m_wgmmas + j] for j in range(plan.b_scale_blocks)]
    j = pair_at(plan, scales, 0, n8, 0)[1] // FP8_BLOCK - scales.first_col // FP8_BLOCK
    picked = b_scales[-1]
    for block in reversed(range(plan.b_scale_blocks - 1)):
        picked = T.Select(j == block, b_scales[block], picked)
    return picked


@T.macro
def add_scaled_sums(plan, me, scales, acc_set, base, columns):
    """Block scales: each accumulator from `base` on of the 8-column groups `columns` (a
    range), times its row's A scale and its column block's B scale (those of scale set
    acc_set), added into its float32 sum (DeepGEMM's promotion)."""
    first_scale = T.meta_var(acc_set * block_scale_count(plan))
    for n8 in T.unroll(columns.start, columns.stop):
        b_scale: T.let[T.float32] = column_block_scale(plan, me, scales, n8, first_scale)
        for mi in T.unroll(plan.m_wgmmas):
            for h in T.unroll(2):
                first = T.meta_var(pair_at(plan, scales, mi, n8, h)[2])
                for e in T.unroll(2):
                    me.sums[first + e] = me.sums[first + e] + me.acc[base + first + e] * (
                        me.factors[first_scale + mi * 2 + h] * b_scale)


@T.macro
def add_to_sums(plan, me, scales, acc_set):
    """The accumulators of set acc_set (their wgmmas done) added into the float32 sums (block
    scales: times their scales; the set's next K block's first wgmma starts them afresh)."""
    if scales is None:
        for i in T.unroll(plan.accumulators):
            me.sums[i] = me.sums[i] + me.acc[acc_set * plan.accumulators + i]
    else:
        add_scaled_sums(plan, me, scales, acc_set, acc_set * plan.accumulators,
                        range(plan.wg_n // 8))


def half_accumulator(plan, half: int, mi, r):
    """promote_halves: the index of accumulator r (of per_wgmma / 2) of wgmma mi's `half` of
    the consumer's columns (wgmma's fragment: 4 a thread per 8-column group, side by side)."""
    return mi * plan.per_wgmma + half * (plan.per_wgmma // 2) + r


@T.macro
def add_half_to_sums(plan, me, scales, acc_set, half):
    """promote_halves: the accumulators of the consumer's `half` of its columns (their wgmmas
    done) fenced and added into the float32 sums (block scales: times those of scale set
    acc_set); the half's next wgmmas start them afresh."""
    groups = T.meta_var(plan.wgmma_n // 8)
    for mi in T.unroll(plan.m_wgmmas):
        for r in T.unroll(plan.per_wgmma // 2):
            cuda_call(FENCE_OPERAND, me.acc[half_accumulator(plan, half, mi, r)])
    if scales is None:
        for mi in T.unroll(plan.m_wgmmas):
            for r in T.unroll(plan.per_wgmma // 2):
                i = T.meta_var(half_accumulator(plan, half, mi, r))
                me.sums[i] = me.sums[i] + me.acc[i]
    else:
        add_scaled_sums(plan, me, scales, acc_set, 0, range(half * groups, (half + 1) * groups))


@T.macro
def promote(plan, me, scales):
    """promote_k: wait for every wgmma in flight, then add the accumulators into the float32
    sums (`add_to_sums`)."""
    T.ptx.wgmma.wait_group.sync.aligned(0)
    for i in T.unroll(plan.accumulators):
        cuda_call(FENCE_OPERAND, me.acc[i])
    add_to_sums(plan, me, scales, 0)


def stage_before(plan, s):
    """The ring's stage before stage s."""
    return T.Select(s == 0, plan.knobs.stages - 1, s - 1)


@T.macro
def free_stage(plan, me, shared, s):
    """Stage s freed for the producer (or, in a cluster, for the producers of every CTA)."""
    if plan.cluster > 1:
        cuda_call(FREE_STAGE, shared.empty.ptr_to([s]), me.thread % (WARPGROUP * 32),
                  plan.frees(me.thread))
    else:
        cuda_call(FREE_OWN_STAGE, shared.empty.ptr_to([s]), plan.frees(me.thread))


@T.macro
def free_stage_before(plan, me, shared, kt, s):
    """Where K block kt (in stage s) has one before it (whose wgmmas are done), free that
    block's stage."""
    if kt > 0:
        free_stage(plan, me, shared, stage_before(plan, s))


@T.macro
def multiply_block(plan, me, bases, accumulators, half, scale_d):
    """One K block's wgmmas of the consumer's part of the tile, as one commit group: the
    accumulators (`accumulators`: the first's index in each m64 wgmma's and how many) fenced,
    then each k step's wgmmas into them from the block's A and B descriptor bases (`bases`),
    B's columns those of the consumer's `half` (0: the first, or all of them), wgmma's
    scale-d `scale_d(ks)` at k step ks (false: the sums start afresh)."""
    (first, count), acc = T.meta_var((accumulators, me.acc))
    for mi in T.unroll(plan.m_wgmmas):
        for r in T.unroll(count):
            cuda_call(FENCE_OPERAND, acc[first + mi * plan.per_wgmma + r])
    T.ptx.wgmma.fence.sync.aligned()
    for ks in T.unroll(plan.block_k // plan.k_step):
        for mi in T.unroll(plan.m_wgmmas):
            plan.wgmma(*[acc[first + mi * plan.per_wgmma + r] for r in range(count)],
                       descriptor_at(bases[0], plan.a_step(mi, ks), ATOM),
                       descriptor_at(bases[1], plan.b_step(ks, half), ATOM),
                       scale_d(ks), 1, 1, *plan.transpose)
    T.ptx.wgmma.commit_group.sync.aligned()


def after_first_step(ks):
    """promote_halves' scale-d: each K block's halves start their sums afresh (every block's
    are promoted), so only its first k step does not add to them."""
    return ks > 0


@T.macro
def multiply_half(plan, me, bases, half):
    """promote_halves: the consumer's `half` of its columns of one K block (`bases`: its A and
    B descriptor bases) multiplied into that half's accumulators, afresh, as one commit
    group."""
    n = T.meta_var(plan.per_wgmma // 2)
    multiply_block(plan, me, bases, (half * n, n), half, after_first_step)


@T.macro
def multiply_by_halves(plan, me, shared, block, scales, acc_set, promotion, bases):
    """promote_halves: `block`'s part of `k_block` (K block kt, in stage s) once the stage is
    in (`bases`: its A and B descriptor bases): multiply its first half of the columns; where
    it follows a block of the run (promotion "previous"), wait for that block's second half
    and promote it under this first half's wgmmas; free the stage before; multiply the second
    half, then wait for the first and promote it under the second's. Block scales: in scale
    set acc_set (the block before's, still to be applied, are in the other)."""
    kt, s = T.meta_var(block)
    multiply_half(plan, me, bases, 0)
    if promotion == "previous":
        T.ptx.wgmma.wait_group.sync.aligned(1)
        add_half_to_sums(plan, me, scales, 1 - acc_set, 1)
    free_stage_before(plan, me, shared, kt, s)
    multiply_half(plan, me, bases, 1)
    T.ptx.wgmma.wait_group.sync.aligned(1)
    add_half_to_sums(plan, me, scales, acc_set, 0)


@T.macro
def k_block(plan, me, shared, kt, scales, acc_set, promotion):
    """K block kt of the consumer's K loop: wait for its stage's bytes (the ring position's,
    which it steps past that stage: one call per K block, in order), multiply its part of the
    tile with wgmma into accumulator set acc_set, and free the stage of the K block before
    (whose wgmmas wait_group 1 has seen finish). promote_k: wgmma's sums are added into the
    float32 sums once they are done, and the next block's first wgmma starts them afresh (its
    scale-d predicate false); `promotion` says when: "wait" every promote_blocks K blocks,
    waiting for the wgmmas (promote); in an overlapped run (`overlapped_run`), "none" for its
    first block and "previous" for the others: the block before's sums (the other set) are
    added while this block's wgmmas run; by halves (promote_halves), `multiply_by_halves`.
    Block scales (`scales`, else None): each K block's are loaded first, into its set's
    registers, and applied as it is promoted."""
    acc, base = T.meta_var((me.acc, acc_set * plan.accumulators))
    if scales is not None:
        load_block_scales(plan, me, scales, scales.first_block + kt, acc_set)
    s: T.let[T.int32] = me.ring[0]
    T.cuda.mbarrier_wait(shared.full.ptr_to([s]), me.ring[1])
    step_ring(plan, me.ring, s)
    stage: T.let[T.uint32] = shared.ring + T.Cast("uint32", s * plan.stage_bytes)
    a_base: T.let[T.uint32] = descriptor_base(
        stage + T.Cast("uint32", plan.a_offset(me.consumer)), 16)
    b_base: T.let[T.uint32] = descriptor_base(
        stage + T.Cast("uint32", plan.b_offset(me.consumer)), plan.b_leading)
    if plan.halves:
        multiply_by_halves(plan, me, shared, (kt, s), scales, acc_set, promotion,
                           (a_base, b_base))
    else:
        multiply_block(plan, me, (a_base, b_base), (base, plan.per_wgmma), 0,
                       functools.partial(adds_to_sums, plan, kt))
        T.ptx.wgmma.wait_group.sync.aligned(1)
        if promotion == "previous":  # the block before's wgmmas are done: promote its set
            for i in T.unroll(plan.accumulators):
                cuda_call(FENCE_OPERAND, acc[(1 - acc_set) * plan.accumulators + i])
            add_to_sums(plan, me, scales, 1 - acc_set)
        elif promotion == "wait":
            for i in T.unroll(plan.accumulators):
                cuda_call(FENCE_OPERAND, acc[i])
            if plan.promotes:
                if (kt + 1) % plan.promote_blocks == 0:
                    promote(plan, me, scales)
        free_stage_before(plan, me, shared, kt, s)


@T.macro
def overlapped_run(plan, me, shared, first, length, scales):
    """promote_overlap: a run of `length` K blocks from `first`, taking the two sets of
    accumulators in turn, each promoted under the next one's wgmmas (by halves: each block's
    halves under each other's, `multiply_by_halves`); then a wait for every wgmma and the last
    block's set (by halves: its second half) promoted. Runs are whole and end in that wait:
    ptxas tells which wgmmas are done only along one path, so reading a set across the loop's
    back edge, or past an `if` around a block, would serialize every wgmma."""
    k_block(plan, me, shared, first, scales, 0, "none")
    for b in T.unroll(1, length):
        k_block(plan, me, shared, first + b, scales, b % 2, "previous")
    T.ptx.wgmma.wait_group.sync.aligned(0)
    if plan.halves:
        add_half_to_sums(plan, me, scales, (length - 1) % 2, 1)
    else:
        for i in T.unroll(plan.accumulators):
            cuda_call(FENCE_OPERAND, me.acc[(length - 1) % 2 * plan.accumulators + i])
        add_to_sums(plan, me, scales, (length - 1) % 2)


@T.macro
def k_loop(plan, me, shared, count, scales):
    """The consumer's K loop over its unit's `count` K blocks (`k_block`); with
    promote_overlap, in whole runs of that many blocks (`overlapped_run`), then the blocks
    left: as one shorter run where their count is known as the kernel is built, else (K
    split: known at the call) one at a time, promoted as promote_k promotes (by halves: runs
    of one) (ptxas spills registers for runs of a count known only at the call)."""
    if plan.overlaps:
        run = T.meta_var(plan.knobs.promote_overlap)
        for kr in range(count // run):
            overlapped_run(plan, me, shared, kr * run, run, scales)
        left = T.meta_var(count % run)
        if isinstance(left, tirx.IntImm) and left.value > (0 if plan.halves else 1):
            overlapped_run(plan, me, shared, count - left, left.value, scales)
        else:
            for kt in range(count - left, count):
                if plan.halves:
                    overlapped_run(plan, me, shared, kt, 1, scales)
                else:
                    k_block(plan, me, shared, kt, scales, 0, "wait")
    else:
        for kt in range(count):
            k_block(plan, me, shared, kt, scales, 0, "wait")


@T.macro
def multiply(plan, me, shared, cta, j, count, scales):
    """The consumer's unit j: accumulators zeroed, the ring position's stage and parity set
    from the K blocks passed, the K loop (block scales: `scales`, read per K block; else None)
    (pingpong: in its turn, then the
    other consumer's turn given), the last wgmmas waited for and settled (promote_k: the last
    K blocks' promoted, and the sums taken as the accumulators), the last stage freed and the
    ring position moved past the unit (pingpong: past the other's unit too)."""
    acc, used = T.meta_var((me.acc, me.used))
    for i in T.unroll(plan.accumulators * plan.accumulator_sets):
        acc[i] = T.float32(0)
    if plan.promotes:
        for i in T.unroll(plan.accumulators):
            me.sums[i] = T.float32(0)
    me.ring[0] = used[0] % plan.knobs.stages
    me.ring[1] = used[0] // plan.knobs.stages % 2
    if plan.knobs.pingpong:
        if j > 0:  # the other consumer has issued the unit before's wgmmas
            T.ptx.bar.sync(T.uint32(TURN_BARRIER + me.consumer), T.uint32(CONSUMER_THREADS))
    k_loop(plan, me, shared, count, scales)
    if plan.knobs.pingpong:  # the next unit's K loop may start: the other consumer's
        if plan.unit_of(cta, j + 1) < plan.units:
            T.ptx.bar.arrive(T.uint32(TURN_BARRIER + 1 - me.consumer), T.uint32(CONSUMER_THREADS))
    T.ptx.wgmma.wait_group.sync.aligned(0)
    for i in T.unroll(plan.accumulators * plan.accumulator_sets):
        cuda_call(SETTLE, acc[i])
    if plan.promotes:
        if count % plan.promote_blocks != 0:  # the blocks since the last promotion
            for i in T.unroll(plan.accumulators):
                me.sums[i] = me.sums[i] + acc[i]
        for i in T.unroll(plan.accumulators):
            acc[i] = me.sums[i]
    free_stage(plan, me, shared, stage_before(plan, me.ring[0]))
    used[0] = used[0] + count * plan.turns


@T.macro
def stash_partials(plan, me, at, shared):
    """Split K: this slice's partial tile out to the workspace (rows past C's edge left out),
    then counted in at the tile's counter by one thread, which reads how many came before."""
    arrived = T.meta_var(shared.arrived)
    for mi in T.unroll(plan.m_wgmmas):
        if at.first_row + mi * 64 < plan.M:
            for n8 in T.unroll(plan.wg_n // 8):
                cuda_call(plan.helpers["stash"],
                          plan.partial(at.unit, mi * plan.wg_n // 8 + n8, me.thread),
                          *[me.acc[mi * plan.per_wgmma + n8 * 4 + r] for r in range(4)])
    T.cuda.thread_fence()  # the partials visible on the GPU before the count
    T.ptx.bar.sync(T.uint32(SPLIT_BARRIER), T.uint32(CONSUMER_THREADS))
    if me.thread == 0:
        arrived[0] = cuda_call(plan.helpers["arrive"], at.tile - plan.whole, return_type="uint32")
    T.ptx.bar.sync(T.uint32(SPLIT_BARRIER), T.uint32(CONSUMER_THREADS))


@T.macro
def gather_partials(plan, me, at):
    """Split K, in the slice that arrived last: the other slices' partials added to its own,
    and the tile's counter set back to zero for the next launch."""
    T.cuda.thread_fence()
    piece: T.let[T.int32] = (at.unit - plan.whole) % plan.split_k
    for other in range(plan.split_k):
        if other != piece:
            for mi in T.unroll(plan.m_wgmmas):
                if at.first_row + mi * 64 < plan.M:
                    for n8 in T.unroll(plan.wg_n // 8):
                        cuda_call(plan.helpers["gather"],
                                  plan.partial(at.unit - piece + other,
                                               mi * plan.wg_n // 8 + n8, me.thread),
                                  *[me.acc[mi * plan.per_wgmma + n8 * 4 + r] for r in range(4)])
    if me.thread == 0:
        cuda_call(plan.helpers["rearm"], at.tile - plan.whole)


@T.macro
def scale_accumulators(plan, me, at, operands):
    """fp8 scaled per tensor or by rows: the accumulators times the product of the two
    per-tensor scales, or (rowwise) each times its row's A_scale and its column's B_scale
    (indices clamped at C's edges, where nothing is stored)."""
    acc = T.meta_var(me.acc)
    if plan.rowwise:
        for n8 in T.unroll(plan.wg_n // 8):
            for e in T.unroll(2):
                b_scale: T.let[T.float32] = operands.B_scale[
                    T.min(pair_at(plan, at, 0, n8, 0)[1] + e, plan.N - 1)]
                for mi in T.unroll(plan.m_wgmmas):
                    for h in T.unroll(2):
                        row, _, first = T.meta_var(pair_at(plan, at, mi, n8, h))
                        acc[first + e] = acc[first + e] * (
                            operands.A_scale[T.min(row, plan.M - 1)] * b_scale)
    else:
        scale: T.let[T.float32] = operands.A_scale[0] * operands.B_scale[0]
        for i in T.unroll(plan.accumulators):
            acc[i] = acc[i] * scale


def with_bias(plan, operands, value, column):
    """An accumulator's value as C takes it: plus the bias of its column of the workload's C
    (`column`; swapped, the plan's row), where the plan has one (index clamped at C's edge,
    where nothing is stored), as F.linear adds it, after fp8's scales; read as each value is
    stored, so that no pass over the accumulators holds them."""
    if not plan.bias:
        return value
    (columns,) = plan.param_shapes["Bias"]
    return value + T.Cast("float32", operands.Bias[T.min(column, columns - 1)])


@T.macro
def fill_box(plan, me, at, operands, mi, box, slot):
    """tma_store: the thread's columns of box `box` of wgmma mi (`with_bias`), converted to
    C's dtype, into the shared box at `slot`, swizzled as TMA reads it."""
    for n8 in T.unroll(plan.box_cols // 8):
        for h in T.unroll(2):
            offset: T.let[T.int32] = \
                (me.warp * 16 + me.lane // 4 + h * 8) * plan.span \
                + (n8 * 8 + me.lane % 4 * 2) * plan.out_bytes
            first: T.let[T.int32] = mi * plan.per_wgmma \
                + (box * plan.box_cols // 8 + n8) * 4 + h * 2
            past = T.meta_var((box * plan.box_cols // 8 + n8) * 8)  # the thread's first column
            cuda_call(stage_pair(plan.out_dtype),
                      slot + T.Cast("uint32", swizzled(offset, plan.span)),
                      with_bias(plan, operands, me.acc[first], at.first_col + past),
                      with_bias(plan, operands, me.acc[first + 1], at.first_col + past + 1))


@T.macro
def store_boxes(plan, me, at, operands, maps, shared):
    """tma_store's epilogue, box by box: wait until the box whose turn it is has gone out, fill
    it, and send it by a TMA store (the warpgroup's first thread), which runs on while the
    consumers go on to the next unit."""
    sent = T.meta_var(me.sent)
    for mi in T.unroll(plan.m_wgmmas):
        for box in T.unroll(plan.wg_n // plan.box_cols):
            slot: T.let[T.uint32] = shared.ring + T.Cast(
                "uint32", plan.first_box + (me.consumer * 2 + sent[0] % 2)
                * BOX_ROWS * ROW_BYTES)
            if leads(me.thread):
                T.ptx["cp.async.bulk.wait_group.read"](1)
            T.ptx.bar.sync(T.uint32(BOX_BARRIER + me.consumer), T.uint32(WARPGROUP * 32))
            fill_box(plan, me, at, operands, mi, box, slot)
            T.ptx.fence.proxy.async_.shared__cta()
            T.ptx.bar.sync(T.uint32(BOX_BARRIER + me.consumer), T.uint32(WARPGROUP * 32))
            if leads(me.thread):
                TMA_STORE(T.address_of(maps.C),
                          at.n0 + plan.consumer_cols(me.consumer) + box * plan.box_cols,
                          at.m0 + plan.consumer_rows(me.consumer) + mi * 64,
                          slot)
                T.ptx["cp.async.bulk.commit_group"]()
            sent[0] = sent[0] + 1


@T.macro
def store_quads(plan, me, at, operands, maps, shared):
    """16-bit C, N a multiple of 4: each pair of threads of a row swaps a pair of columns, so
    each stores 4 columns in 8 bytes (QUAD_STORE), guarded at C's edges."""
    C = T.meta_var(operands.C)
    for mi in T.unroll(plan.m_wgmmas):
        for n16 in T.unroll(plan.wg_n // 16):
            for h in T.unroll(2):
                row: T.let[T.int32] = at.first_row + mi * 64 + h * 8
                start: T.let[T.int32] = at.first_col + n16 * 16 + me.lane % 2 * 6
                low: T.let[T.int32] = mi * plan.per_wgmma + n16 * 8 + h * 2
                past = T.meta_var(n16 * 16)  # acc[low]'s column past the thread's first
                cuda_call(quad_store(plan.out_dtype), T.address_of(C[row, start]), me.lane % 2,
                          *[with_bias(plan, operands, me.acc[low + i],
                                      at.first_col + past + i + i // 4 * 4)
                            for i in (0, 1, 4, 5)],
                          T.bool(row < plan.M) and T.bool(start < plan.N))


@T.macro
def store_from_registers(plan, me, at, operands, maps, shared):
    """C straight from the accumulators, guarded at C's edges: float32 pairs in 8 bytes where
    N is even (PAIR_STORE), else one element at a time (swapped: each at C[col, row])."""
    C, acc = T.meta_var((operands.C, me.acc))
    for mi in T.unroll(plan.m_wgmmas):
        for n8 in T.unroll(plan.wg_n // 8):
            for h in T.unroll(2):
                pair = T.meta_var(pair_at(plan, at, mi, n8, h))
                row: T.let[T.int32] = pair[0]
                col: T.let[T.int32] = pair[1]
                first: T.let[T.int32] = pair[2]
                if row < plan.M:
                    if not plan.swapped and plan.out_dtype == "float32" and plan.N % 2 == 0:
                        if col < plan.N:  # col is even: so is &C[row, col]
                            cuda_call(PAIR_STORE, T.address_of(C[row, col]),
                                      with_bias(plan, operands, acc[first], at.first_col + n8 * 8),
                                      with_bias(plan, operands, acc[first + 1],
                                                at.first_col + n8 * 8 + 1))
                    else:
                        for e in T.unroll(2):
                            if col + e < plan.N:
                                if plan.swapped:
                                    C[col + e, row] = T.Cast(plan.out_dtype, with_bias(
                                        plan, operands, acc[first + e], row))
                                else:
                                    C[row, col + e] = T.Cast(plan.out_dtype, with_bias(
                                        plan, operands, acc[first + e], at.first_col + n8 * 8 + e))


# The epilogues by Plan.epilogue's name: each takes the same arguments (whether it reads them
# or not), so that the plan picks one and the kernel calls it without a branch of its own.
EPILOGUES = {"boxes": store_boxes, "quads": store_quads, "registers": store_from_registers}


@T.macro
def finish_unit(plan, me, at, operands, maps, shared):
    """After the K loop: split K's partials out and counted in; then, where this CTA stores
    the tile (a whole tile, or the last slice), the others' partials added, fp8's scales
    applied (block scales were, in the K loop), and the plan's epilogue (which adds the bias
    as it stores C, `with_bias`)."""
    if plan.split_k > 1:
        if plan.is_split(at.unit):
            stash_partials(plan, me, at, shared)
    if plan.split_k == 1 or plan.stores_c(at.unit, shared.arrived):
        if plan.split_k > 1:
            if plan.is_split(at.unit):
                gather_partials(plan, me, at)
        if plan.dtype == FP8 and not plan.block_scaled:
            scale_accumulators(plan, me, at, operands)
        store = T.meta_var(EPILOGUES[plan.epilogue])
        store(plan, me, at, operands, maps, shared)


@T.macro
def consume(plan, operands, cta, rank, tx, shared, maps):
    """A consumer warpgroup (1 or 2): it takes registers (setmaxnreg.inc), then multiplies its
    part of every unit of the CTA (pingpong: all of every other unit) and finishes it; with
    tma_store, its boxes read out before the CTA's shared memory goes."""
    # Step 1. Registers, accumulators, the ring position and who this thread is.
    T.ptx["setmaxnreg.inc.sync.aligned.u32"](CONSUMER_REGISTERS)
    consumer: T.let[T.int32] = cuda_call(WARPGROUP_OF_WARP, tx, return_type="int32") - 1
    acc = T.alloc_local((plan.accumulators * plan.accumulator_sets,), "float32")
    sums = T.meta_var(float32_sums(plan, acc))
    factors = T.meta_var(block_scale_registers(plan))
    used = T.alloc_local((1,), "int32")  # the ring's position: K blocks passed before a unit
    used[0] = plan.first_unit(consumer) * plan.k_blocks  # (pingpong: no split K, units alike)
    ring = T.alloc_local((2,), "int32")  # the next K block's stage, its full barrier's parity
    sent = T.alloc_local((1,), "int32")  # boxes of C sent (tma_store): whose turn
    sent[0] = 0
    thread: T.let[T.int32] = tx - WARPGROUP * 32
    warp: T.let[T.int32] = tx % (WARPGROUP * 32) // 32
    lane: T.let[T.int32] = tx % 32
    origin = T.meta_var(origin_register(plan))
    me = T.meta_var(Consumer(consumer, thread, warp, lane, acc, used, ring, sent, sums,
                             factors))
    # Step 2. Each unit of the CTA in turn: multiply it, then finish it.
    for turn in range(-(-plan.units_per_cta // plan.turns)):
        j: T.let[T.int32] = turn * plan.turns + plan.first_unit(consumer)
        if plan.unit_of(cta, j) < plan.units:
            unit: T.let[T.int32] = plan.unit_of(cta, j)
            tile: T.let[T.int32] = plan.tile_of(unit)
            m0, n0 = T.meta_var(plan.unit_origin(tile, rank))
            first, count = T.meta_var(plan.k_range(unit))
            multiply(plan, me, shared, cta, j, count,
                     block_scales(plan, operands, me, m0, n0, first))
            row = T.meta_var(first_row_of(plan, me, m0))  # and column: wgmma's fragment
            col = T.meta_var(n0 + plan.consumer_cols(consumer) + lane % 4 * 2)
            if origin is None:
                first_row: T.let[T.int32] = row
                first_col: T.let[T.int32] = col
                finish_unit(plan, me, Unit(unit, tile, m0, n0, first_row, first_col), operands,
                            maps, shared)
            else:
                origin[0] = row
                origin[1] = col
                finish_unit(plan, me, Unit(unit, tile, m0, n0, origin[0], origin[1]), operands,
                            maps, shared)
    # Step 3. The last boxes of C read out (tma_store) before shared memory goes.
    if plan.knobs.tma_store:
        if leads(thread):
            T.ptx["cp.async.bulk.wait_group"](0)


def warp_specialized_gemm(plan: Plan):
    """C[M, N] = A[M, K] @ B (nn: B is K x N) or A @ B^T (nt: B is N x K), float32
    accumulation (fp8: times A_scale[0] * B_scale[0], its parameters after B, or rowwise
    A_scale[m] * B_scale[n], or each 128-K block's sums times A_scale[m, kb] *
    B_scale[n / 128, kb] as they are promoted), plus Bias[n] where the plan has a bias (its
    parameter before C), as a persistent warp-specialized TIRx kernel (CUTLASS's sm90
    "cooperative" kernel): min(sms, units) CTAs of 384 threads walk the units of work (a
    block tile and one of its `split_k` slices of K) in the grouped raster of the tiles.
    How its warpgroups, split K, clusters, ping-pong, staged rows and M taken at each call
    work together: the module's docstring."""

    staged_a, staged_b = "A" in plan.staged, "B" in plan.staged

    @T.prim_func
    def main(A_handle: T.handle, B_handle: T.handle, A_scale_handle: T.handle,
             B_scale_handle: T.handle, Bias_handle: T.handle, C_handle: T.handle):
        T.func_attr({TIRX_KERNEL: True})
        shapes = T.meta_var(plan.param_shapes)
        A = T.match_buffer(A_handle, shapes["A"], plan.dtype, align=16)
        B = T.match_buffer(B_handle, shapes["B"], plan.dtype, align=16)
        A_scale = T.match_buffer(A_scale_handle, shapes["A_scale"], "float32")
        B_scale = T.match_buffer(B_scale_handle, shapes["B_scale"], "float32")
        Bias = T.match_buffer(Bias_handle, shapes["Bias"], plan.out_dtype)
        C = T.match_buffer(C_handle, shapes["C"], plan.out_dtype, align=16)
        # the operands as the plan multiplies them (swapped: B's rows are the tile's rows)
        a_in, b_in, a_scale, b_scale = T.meta_var(
            (B, A, B_scale, A_scale) if plan.swapped else (A, B, A_scale, B_scale))
        if staged_a:  # the workspaces of staged rows, which TMA loads instead
            A_rows = T.alloc_buffer((plan.M, plan.a_cols), plan.dtype, scope="global")
        if staged_b:
            B_rows = T.alloc_buffer((plan.staging("B")[0], plan.b_cols), plan.dtype,
                                    scope="global")
        a_loaded = T.meta_var(A_rows if staged_a else a_in)
        b_loaded = T.meta_var(B_rows if staged_b else b_in)
        A_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", A_map, plan.tma_dtype, 2,
                      a_loaded.data, *plan.a_map)
        B_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", B_map, plan.tma_dtype, 2,
                      b_loaded.data, *plan.b_map)
        C_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)  # encoded for tma_store
        if plan.knobs.tma_store:
            T.call_packed("runtime.cuTensorMapEncodeTiled", C_map, plan.out_dtype, 2, C.data,
                          *plan.c_map)

        T.device_entry()
        # one CTA an SM: without it ptxas ignores setmaxnreg (C7508) where the kernel needs
        # fewer registers than the launch allows
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1})
        cta = T.cta_id([plan.grid])
        rank = T.meta_var(plan.cluster_rank())
        tx = T.thread_id([THREADS])
        if staged_a:
            stage_operand(plan, "A", a_in, A_rows)
        if staged_b:
            stage_operand(plan, "B", b_in, B_rows)
        if staged_a or staged_b:  # every CTA's share staged before any TMA load
            cuda_call(GRID_SYNC)
        arena = T.alloc_buffer((plan.ring_bytes,), "uint8", scope="shared.dyn", align=ATOM)
        full = T.alloc_buffer((plan.knobs.stages,), "uint64", scope="shared", align=8)
        empty = T.alloc_buffer((plan.knobs.stages,), "uint64", scope="shared", align=8)
        arrived = T.meta_var(arrival_word(plan.split_k))
        ring: T.let[T.uint32] = T.bitwise_and(
            T.cuda.cvta_generic_to_shared(arena.data) + T.uint32(ATOM - 1),
            T.uint32(~(ATOM - 1) & 0xFFFFFFFF))
        shared = T.meta_var(Shared(ring, full, empty, arrived))
        maps = T.meta_var(Maps(A_map, B_map, C_map))
        set_up(plan, tx, shared, maps)
        if tx < WARPGROUP * 32:
            produce(plan, cta, rank, tx, shared, maps)
        else:
            consume(plan, Operands(C, a_scale, b_scale, Bias), cta, rank, tx, shared, maps)

    unused = (() if plan.dtype == FP8 else FP8_SCALES) + (() if plan.bias else ("Bias",))
    return without_params(main, unused) if unused else main


def without_params(func, names: tuple[str, ...]):
    """`func` without its buffer parameters `names` (which its body must not use): one script
    serves the workloads with and without fp8's scales."""
    return tirx.PrimFunc([p for p in func.params if p.name not in names], func.body,
                         func.ret_type, func.attrs)
