"""What the tests of the rungs v4..v8 read off a lowered kernel instead of its CUDA text
(issue 50): the calls it makes (PTX intrinsics by op, whose string arguments say the form, e.g.
a wgmma's shape and types; the CUDA helpers it calls by name), in program order, its loops
and their extents, its buffers and their scopes, its parameters. A test then names what must
be there, how often and in which order, and a renamed variable or a reformatted line of the
generated CUDA cannot break it, nor a substring that happens to occur elsewhere satisfy it.
"""

from __future__ import annotations

import tvm
import tvm.sym
from tvm.tirx import stmt as S

from tuning import lowering

FUNC_CALL = "tirx.cuda.func_call"  # a CUDA helper of the kernel's own (register_helper & co.)


def kernel(lowered: tvm.IRModule):
    """The one kernel of a lowered module."""
    (only,) = [fn for _, fn in lowered.functions_items()]
    return only


def name(call) -> str:
    """A call's name: the helper's for a CUDA helper (`v8_settle`), else its op's without
    `tirx.` (`ptx.wgmma_f16_ss`, `cuda.mbarrier_wait`)."""
    op = call.op.name
    if op == FUNC_CALL:
        return call.args[0].value
    return op.removeprefix("tirx.")


def calls(root, *names: str) -> list:
    """The calls in `root` in program order (a call before the calls in its arguments); only
    those named one of `names` where given."""
    found = lowering.find(root, tvm.ir.Call)
    return [c for c in found if isinstance(c.op, tvm.ir.Op) and (not names or name(c) in names)]


def words(call) -> tuple[str, ...]:
    """A call's string arguments (a PTX intrinsic's modifiers: `m64n256k16`, `f32`, `bf16` ...),
    without the helper's own name and source."""
    if call.op.name == FUNC_CALL:
        return ()
    return tuple(a.value for a in call.args if isinstance(a, tvm.ir.StringImm))


def ints(call) -> tuple[int, ...]:
    """A call's integer constant arguments (setmaxnreg's count, a wait_group's depth)."""
    return tuple(int(a.value) for a in call.args if isinstance(a, tvm.tirx.IntImm))


def count(root, call_name: str, *wanted: str) -> int:
    """How many calls named `call_name` in `root` have every word of `wanted`."""
    return sum(set(wanted) <= set(words(c)) for c in calls(root, call_name))


def called(call_name: str, *wanted: str):
    """A test of a node: a call named `call_name` with every word of `wanted`."""
    return lambda node: (isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op)
                         and name(node) == call_name and set(wanted) <= set(words(node)))


def events(root) -> list:
    """The calls, stores, ifs and loops of `root` in program order (each before what it holds),
    for tests of what comes before what."""
    return lowering.find(root, (tvm.ir.Call, S.BufferStore, S.IfThenElse, S.For))


def at(root, test) -> list[int]:
    """Where in events(root) the nodes that pass `test` stand."""
    return [i for i, node in enumerate(events(root)) if test(node)]


def thread_extents(root) -> dict:
    """The launch's thread tags (blockIdx.x, threadIdx.x, clusterCtaIdx.x ...) -> extent."""
    return {a.node.var.name if hasattr(a.node, "var") else str(a.node): int(a.value)
            for a in lowering.find(root, S.AttrStmt) if a.attr_key == "thread_extent"}


def loops(root) -> list[tuple[str, int]]:
    """Every loop of `root` as (its variable's name, its extent), outer before inner."""
    return [(f.loop_var.name, int(f.extent) if isinstance(f.extent, tvm.tirx.IntImm)
             else f.extent) for f in lowering.find(root, S.For)]


def loop(root, var: str):
    """The loops of `root` over a variable named `var`."""
    return [f for f in lowering.find(root, S.For) if f.loop_var.name == var]


def buffers(root) -> dict[str, tuple[str, tuple, str]]:
    """The buffers `root` allocates: name -> (scope, shape, dtype)."""
    found = {}
    for alloc in lowering.find(root, S.AllocBuffer):
        buf = alloc.buffer
        found[buf.name] = (buf.scope(), tuple(int(d) for d in buf.shape), str(buf.dtype))
    return found


def params(lowered: tvm.IRModule) -> list[str]:
    """The kernel's parameters by name."""
    return [p.name for p in kernel(lowered).params]


def stores_to(root, buffer_name: str) -> list:
    """The stores of `root` into the buffer named `buffer_name`."""
    return [s for s in lowering.find(root, S.BufferStore) if s.buffer.name == buffer_name]


def pointer(arg) -> str | None:
    """The name of the buffer data a call's argument points into (`buffer_data(A_shared_dyn)`
    or a `tvm_access_ptr` into it), else None."""
    if isinstance(arg, tvm.ir.Call) and isinstance(arg.op, tvm.ir.Op):
        if arg.op.name == "tirx.buffer_data":
            return arg.args[0].name
        if arg.op.name == "tirx.tvm_access_ptr":
            return pointer(arg.args[1])
    return None


def pointers(call) -> tuple[str, ...]:
    """The buffers' data a call points into, in argument order (an ldmatrix's destination
    `A_shared_dyn_warp`, then its source `A_shared_dyn`; a cp.async's destination, then its
    source)."""
    return tuple(p for p in map(pointer, call.args) if p is not None)


def copies(root) -> list[tuple[int, bool]]:
    """The cp.async copies of `root` (`s_tir.cp_async_raw(dst, dst_offset, src, src_offset,
    bytes[, predicate])`, and the zero-filling helpers lowering.py makes of the guarded ones of
    4 and 8 bytes) as (bytes, whether a predicate guards it: where it is off, the destination is
    zero-filled instead)."""
    found = []
    for c in calls(root):
        if name(c) == "s_tir.cp_async_raw":
            found.append((int(c.args[4].value), len(c.args) > 5))
        elif name(c).startswith(lowering.ZERO_FILLING_COPY):
            found.append((int(name(c).split("_")[-3]), True))  # {ZERO_FILLING_COPY}_bytes_dst_src
    return found


def variables(root) -> set[str]:
    """The names of the variables in `root`, buffers' data among them (a buffer merged into
    the dynamic shared memory is gone from buffers() but its data keeps its name here)."""
    return {v.name for v in lowering.find(root, tvm.tirx.Var)}


def inside_ifs(root, kind) -> list:
    """The nodes of type `kind` in `root` that lie in the then-branch of an if (a guarded
    store, a predicated load)."""
    return [node for branch in lowering.find(root, S.IfThenElse)
            for node in lowering.find(branch.then_case, kind)]


def among(nodes, others) -> bool:
    """Whether every node of `nodes` is one of `others` (the same IR node, not an equal one)."""
    return all(any(n.same_as(o) for o in others) for n in nodes)


def lanes(store) -> int:
    """How many elements a store writes at once (4 for a float32x4 vector, 1 for a scalar)."""
    ty = str(getattr(store.value, "ty", None) or store.value.dtype)
    return int(ty.rsplit("x", 1)[1]) if "x" in ty else 1


def attrs(root, key: str) -> list:
    """The values of the attributes named `key` in `root` (`async_wait_inflight_count`: the
    cp.async groups a wait leaves in flight)."""
    return [a.value for a in lowering.find(root, S.AttrStmt) if a.attr_key == key]


def first_lane(index):
    """Where a vector index's first element lies (a Ramp's base, plus the value of a Broadcast
    added to it); a scalar index as it is."""
    if isinstance(index, tvm.tirx.Ramp):
        return index.base
    if isinstance(index, tvm.tirx.Broadcast):
        return index.value
    if isinstance(index, tvm.tirx.Add):
        return first_lane(index.a) + first_lane(index.b)
    return index


def distance(start, end) -> int:
    """How many elements `end` lies past `start`, two indices that differ by a constant."""
    return int(tvm.sym.Analyzer().simplify(end - start))


def kernels(lowered: tvm.IRModule) -> dict:
    """The kernels of a lowered module by name (`main_kernel`, `main_kernel_1` ...)."""
    return {str(fn.attrs["global_symbol"]): fn for _, fn in lowered.functions_items()}


def declared(root) -> dict[str, tuple]:
    """The buffers `root` declares over memory it does not allocate (a parameter's, say):
    name -> shape."""
    return {d.buffer.name: tuple(int(x) for x in d.buffer.shape)
            for d in lowering.find(root, S.DeclBuffer)}


def loads_from(root, buffer_name: str) -> list:
    """The loads of `root` from the buffer named `buffer_name`."""
    return [t for t in lowering.find(root, tvm.ir.TensorLoad) if t.source.name == buffer_name]


def depends_on(root, expr) -> set[str]:
    """The names of the variables and buffers that `expr` (an expression in `root`) reads, the
    variables that `root` binds seen through (`row = origin[0]`: row depends on origin)."""
    values = {bind.var: bind.value for bind in lowering.find(root, S.Bind)}
    seen, names, todo = set(), set(), [expr]
    while todo:
        node = todo.pop()
        for load in lowering.find(node, tvm.ir.TensorLoad):
            names.add(load.source.name)
        for var in lowering.find(node, tvm.tirx.Var):
            if var in values and var not in seen:
                seen.add(var)
                todo.append(values[var])
            elif var not in values:
                names.add(var.name)
    return names


def multipliers(root, var: str) -> set[int]:
    """The constants that the variable named `var` is multiplied by in `root`'s indices
    (`blockIdx_z * 704`: where a K slice starts)."""
    return {int(m.b) for m in lowering.find(root, tvm.tirx.Mul)
            if isinstance(m.a, tvm.tirx.Var) and m.a.name == var
            and isinstance(m.b, tvm.tirx.IntImm)}


def params_of(fn) -> list[str]:
    """A kernel's parameters by name (of one kernel of a module with several)."""
    return [p.name for p in fn.params]


def stride(root, index, var: str) -> int:
    """How many elements `index` (an index in `root`) moves on when the variable named `var`
    grows by one, the variables that `root` binds (`cse_v3 = threadIdx_x * 4`) seen through:
    4 for a thread that writes 4 consecutive columns, 1 for a loop along a row."""
    (moved,) = {v for v in lowering.find(root, tvm.tirx.Var) if v.name == var}

    def with_value(value):
        analyzer = tvm.sym.Analyzer()
        for bind in lowering.find(root, S.Bind):
            analyzer.bind(bind.var, bind.value)
        analyzer.bind(moved, value)
        return analyzer.simplify(index)

    return distance(with_value(0), with_value(1))
