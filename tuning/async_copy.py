"""A MetaSchedule postprocessor that refuses the pipelined copies TVM 0.27 lowers wrongly.

Inside a software pipeline with async stages, TVM's InjectPTXAsyncCopy turns a copy from global
into shared memory of 4, 8 or 16 bytes (a vector whose index is a Ramp, maybe predicated) into
one cp.async of those bytes from the address of its first element. It does not check that the
Ramp's stride is 1, or that the first element is aligned to the vector's bytes. TVM's own CUDA
rules sample such copies: a K tile of one element makes A's shared tile one column, which
cooperative fetch vectorizes down its rows. The kernel then reads the wrong elements, or stops
with a misaligned-address fault that also ends every later launch of the process's CUDA context.
(The copies here are cache reads, which index the shared buffer as the global one, so only the
global side is judged.)
"""

from __future__ import annotations

import random

import tvm
from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.stmt import SBlockRealize

ASYNC_STAGES = "software_pipeline_async_stages"  # the loop annotation that makes copies cp.async
SAMPLES = 8  # points of the loops around a copy at which an unproven vector is evaluated
CP_ASYNC_BYTES = (4, 8, 16)  # the copies the pass makes cp.async of


@derived_object
class RefuseBrokenAsyncCopies(ms.postproc.PyPostproc):
    """Refuse a schedule (the search then never builds it) with a pipelined global-to-shared
    copy whose vectors are not consecutive, aligned elements of global memory."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch) -> bool:
        return not any(broken_async_copies(func) for func in sch.mod.functions.values()
                       if isinstance(func, tirx.PrimFunc))

    def clone(self):
        return RefuseBrokenAsyncCopies()


def broken_async_copies(func: tirx.PrimFunc) -> list[str]:
    """The names of func's blocks, inside a loop with async pipeline stages, whose vectors
    from global into shared memory the pass makes one cp.async of though their elements are
    not consecutive or the first is not aligned to the vector (_copies_whole_vectors)."""
    broken = []

    def walk(node, loops: list, in_async: bool):
        if isinstance(node, tirx.For):
            walk(node.body, [*loops, node], in_async or ASYNC_STAGES in node.annotations)
        elif isinstance(node, tirx.SeqStmt):
            for stmt in node.seq:
                walk(stmt, loops, in_async)
        elif isinstance(node, SBlockRealize):
            if in_async and not _copies_whole_vectors(node, loops):
                broken.append(node.block.name_hint)
            walk(node.block.body, loops, in_async)
        elif isinstance(node, tirx.IfThenElse):
            walk(node.then_case, loops, in_async)
            if node.else_case is not None:
                walk(node.else_case, loops, in_async)
        elif hasattr(node, "body"):
            walk(node.body, loops, in_async)

    walk(func.body, [], False)
    return broken


def _copies_whole_vectors(realize, loops: list) -> bool:
    """Whether the block, if it is a copy the pass turns into cp.async (a vector of 4, 8 or 16
    bytes from global memory into shared memory, maybe predicated: if_then_else(c, load, 0)),
    reads consecutive elements, the first aligned to the vector (any other block: True). A
    vector whose elements are not equally spaced is no Ramp, which the pass leaves as it is,
    and one spaced 0 apart is a broadcast: both are copied element by element, correctly.
    Proved where the offset simplifies to a linear function of the lane; otherwise judged at
    SAMPLES points of the other loops (their first and last values, and random ones), as the
    simplifier cannot always see through the fused loops' divisions; an offset that cannot be
    evaluated there is refused."""
    store = realize.block.body
    load = _copied(store) if isinstance(store, tirx.BufferStore) else None
    vectors = [loop for loop in loops if loop.kind == tirx.ForKind.VECTORIZED]
    if load is None or not vectors or not store.buffer.scope().startswith("shared"):
        return True
    lane, others = vectors[-1], [loop for loop in loops if loop is not vectors[-1]]
    if not all(isinstance(n, tirx.IntImm) for loop in loops for n in (loop.min, loop.extent)):
        return True  # a dynamic loop: DisallowDynamicLoop refuses it first
    lanes = int(lane.extent)
    if lanes == 1 or lanes * tvm.DataType(load.source.dtype).bits // 8 not in CP_ASYNC_BYTES \
            or any(int(loop.extent) < 1 for loop in others):
        return True  # one element, a size cp.async does not take, or a copy that never runs
    (offset,) = load.source.offset_of(list(load.indices))  # by strides, from elem_offset
    bindings = dict(zip((iv.var for iv in realize.block.iter_vars), realize.iter_values))
    proved = _linear_in_lane(offset, lane, others, bindings)
    if proved is not None:
        return proved
    steps, aligned = set(), True
    for point in _points(others):
        values = [_evaluate(offset, {**point, lane.loop_var: int(lane.min) + n}, bindings)
                  for n in range(lanes)]
        if None in values:
            return False  # an offset of sizes not known here: nothing proves it whole
        gaps = {b - a for a, b in zip(values, values[1:])}
        if len(gaps) > 1:
            return True  # not equally spaced here, so no Ramp anywhere
        steps |= gaps
        aligned = aligned and values[0] % lanes == 0
    return len(steps) > 1 or steps == {0} or steps == {1} and aligned


def _copied(store):
    """The global load a store into shared memory copies, as the pass finds it: the store's
    value, or the load of a predicated one (if_then_else(c, load, 0)); None for anything
    else."""
    value = store.value
    if isinstance(value, tvm.ir.Call) and getattr(value.op, "name", "").endswith("if_then_else") \
            and len(value.args) == 3:
        value = value.args[1]
    if isinstance(value, tvm.ir.TensorLoad) and value.source.scope() == "global":
        return value
    return None


def _linear_in_lane(offset, lane, others: list, bindings: dict) -> bool | None:
    """Whether a vector whose offset is proved linear in the lane is copied right: spaced 0
    apart (a broadcast) or 1 apart with its first element aligned; False for any other step;
    None where the offset is not proved linear, or its first element not proved aligned."""
    analyzer = _bound({loop.loop_var: tvm.ir.Range.from_min_extent(loop.min, loop.extent)
                       for loop in [*others, lane]}, bindings)
    coefficients = tvm.sym.detect_linear_equation(analyzer.simplify(offset), [lane.loop_var])
    if not coefficients or not isinstance(step := analyzer.simplify(coefficients[0]), tirx.IntImm):
        return None
    if int(step) == 0:
        return True  # a broadcast
    if int(step) != 1:
        return False
    base, lanes = analyzer.modular_set(coefficients[1] + lane.min), int(lane.extent)
    return base.coeff % lanes == 0 and base.base % lanes == 0 or None


def _points(loops: list) -> list[dict]:
    """SAMPLES assignments of the loops' variables: all first values, all last, then random
    ones (seeded: the same schedule is judged the same each time)."""
    pick = random.Random(0)
    ranges = [(loop.loop_var, int(loop.min), int(loop.min) + int(loop.extent) - 1) for loop in loops]
    return ([{var: low for var, low, _ in ranges}, {var: high for var, _, high in ranges}]
            + [{var: pick.randint(low, high) for var, low, high in ranges}
               for _ in range(SAMPLES - 2)])


def _evaluate(offset, point: dict, bindings: dict) -> int | None:
    """The offset at one point of the loops (the block's variables bound to their values), or
    None where it depends on more than the loops (a symbolic size)."""
    value = _bound(point, bindings).simplify(offset)
    return int(value) if isinstance(value, tirx.IntImm) else None


def _bound(*bindings: dict) -> tvm.sym.Analyzer:
    """An analyzer with each variable of `bindings` bound, in order, to its range or value."""
    analyzer = tvm.sym.Analyzer()
    for found in bindings:
        for var, value in found.items():
            analyzer.bind(var, value)
    return analyzer
