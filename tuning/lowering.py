"""The project's TIR pipeline: TVM's default one, then the passes that schedules ask for.

One barrier per K tile (`rewrite_single_barrier`):

A cp.async pipeline whose loads come first in the loop body (`software_pipeline` with
async_loads) comes out of TVM 0.27 as

    __syncthreads(); loads of tile k+s-1; commit; wait for tile k; __syncthreads(); compute tile k

Tile k+s-1 goes into tile k-1's buffer: the first barrier keeps its loads from overwriting that
tile while a slower warp still reads it; the second makes tile k visible to every thread.
CUTLASS's multistage loop needs one barrier per tile:

    wait for tile k; __syncthreads(); loads of tile k+s-1; commit; compute tile k

There the one barrier does both jobs: every thread has finished tile k-1 before it, and tile k
is complete after it. The wait allows one group fewer in flight, because this iteration's loads
are not committed yet, so it waits for the same tile as before. `rewrite_single_barrier` turns
the first form into the second in every loop annotated with SINGLE_BARRIER.

Waiting for wgmma (`wait_for_wgmma`): wgmma.mma_async writes its accumulators after the
instruction has issued, so a loop that reads them (v7's store of C) must first wait for every
group in flight (`wgmma.wait_group 0`). The schedule annotates that loop with WAIT_FOR_WGMMA,
and this pass puts the wait in front of it.

Overlapping kernels (`launch_waiting_kernels_early`): a kernel that calls `griddepcontrol.wait`
is launched with programmatic dependent launch (Hopper), so it may start before the kernel
ahead of it in the stream has finished. TVM 0.27 launches a kernel that way when its launch
tags say so; this pass adds the tag.

Zero-filling copies in one instruction (`zero_fill_in_one_copy`): on ragged shapes, TVM 0.27
guards each cp.async that may read past a row with a predicate, as `@p cp.async` and, for the
false case, `@!p st.shared` of zeroes. ptxas issues the pair as two instructions and pads each
with three dead `@!PT LDS`: in v5t's K loop at 4095^3 float32, 64 issue slots per 1024 FMAs.
This pass gives each such copy of 4 or 8 bytes PTX's own zero fill instead (`cp.async ...,
src-size`, the size 0 where the predicate is false: nothing is read, the destination is
zeroed), one instruction (`LDGSTS ..., !P`), as CUTLASS's predicated copies are. Copies of 16
bytes keep TVM's pair: they are a quarter as many, and zero-filled they ran slower in nt and
faster in nn (reports/notes/h100-shapes.md, "Ragged copies in one instruction").
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm.script import tirx as T
from tvm.tirx import stmt as S

from schedules.common import SINGLE_BARRIER, WAIT_FOR_WGMMA, cuda_call

PIPELINE = "explorer"  # the name tvm.compile knows this pipeline by


def find(root, kind, outermost: bool = False) -> list:
    """The nodes of type `kind` (a statement or expression class) in `root` (a statement, a
    function or a whole module), each before the nodes inside it; with outermost, only those
    that are not inside another one. tvm_ffi's structural walk follows every field of every
    kind of node, so no kind of statement is passed over: the passes here and build.py look at
    the IR through this, and rewrite_single_barrier maps with the same walk."""
    found = []

    def visit(node):
        found.append(node)
        return tvm_ffi.WalkResult.SKIP if outermost else tvm_ffi.WalkResult.ADVANCE

    tvm_ffi.structural_walk(root, (kind, visit), order="pre")
    return found


def _call_to(stmt, op_name: str):
    """The call `stmt` evaluates, if it is one to the op `op_name`; else None."""
    if (isinstance(stmt, S.Evaluate) and isinstance(stmt.value, tvm.ir.Call)
            and stmt.value.op.name == op_name):
        return stmt.value
    return None


def _is_barrier(stmt) -> bool:
    return _call_to(stmt, "tirx.tvm_storage_sync") is not None


def _scope(stmt, key: str):
    """`stmt` if it is the attribute scope `key`, else None."""
    return stmt if isinstance(stmt, S.AttrStmt) and stmt.attr_key == key else None


def _after_bindings(seq: list, start: int) -> int:
    """The index of the first statement of `seq` from `start` on that is not a Bind."""
    while start < len(seq) and isinstance(seq[start], S.Bind):
        start += 1
    return start


def _unannotated(loop: S.For, key: str, body) -> S.For:
    """`loop` with `body`, and without the annotation `key` that asked a pass for it."""
    annotations = {k: v for k, v in loop.annotations.items() if k != key}
    return S.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                 annotations, loop.step)


def _single_barrier(loop: S.For) -> S.For:
    """`loop` itself, or, if it is annotated with SINGLE_BARRIER, rewritten (see the module
    docstring) and without the annotation. Raises if TVM lowered an annotated loop into anything
    but the expected shape: a loop that asked for one barrier never silently keeps two."""
    if SINGLE_BARRIER not in loop.annotations:
        return loop
    seq = list(loop.body.seq) if isinstance(loop.body, S.SeqStmt) else []
    # Bindings of common subexpressions, the commit scope (the loads), maybe more bindings, the
    # wait scope.
    at_commit = _after_bindings(seq, 0)
    at_wait = _after_bindings(seq, at_commit + 1)
    commit = _scope(seq[at_commit], "async_commit_queue_scope") if at_commit < len(seq) else None
    wait = _scope(seq[at_wait], "async_wait_queue_scope") if at_wait < len(seq) else None
    inflight = wait and _scope(wait.body, "async_wait_inflight_count")
    loads = list(commit.body.seq) if commit and isinstance(commit.body, S.SeqStmt) else []
    compute = list(inflight.body.seq) if inflight and isinstance(inflight.body, S.SeqStmt) else []
    first_barrier = next((i for i, stmt in enumerate(loads) if _is_barrier(stmt)), None)
    if first_barrier is None or not compute or not _is_barrier(compute[0]):
        raise RuntimeError(f"{SINGLE_BARRIER}: loop {loop.loop_var} is not a cp.async pipeline "
                           "with its loads first, as TVM lowers one")
    del loads[first_barrier]
    wait_then_barrier = S.AttrStmt(
        wait.node, wait.attr_key, wait.value,
        S.AttrStmt(inflight.node, inflight.attr_key, inflight.value - 1, compute[0]))
    commit = S.AttrStmt(commit.node, commit.attr_key, commit.value,
                        loads[0] if len(loads) == 1 else S.SeqStmt(loads))
    body = S.SeqStmt([*seq[:at_commit], wait_then_barrier, commit, *seq[at_commit + 1:at_wait],
                      *compute[1:], *seq[at_wait + 1:]])
    return _unannotated(loop, SINGLE_BARRIER, body)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="RewriteSingleBarrier")
def rewrite_single_barrier(func, _mod, _ctx):
    """Every loop annotated with SINGLE_BARRIER: one barrier per iteration instead of two. A
    walk over the statements, inner loops first, not a search of the printed script: this runs
    in every build."""
    body = tvm_ffi.structural_map(func.body, (S.For, _single_barrier), order="post")
    return func if body.same_as(func.body) else func.with_body(body)


def _wait_for_wgmma(loop: S.For):
    """`loop` itself, or, if it is annotated with WAIT_FOR_WGMMA, the loop without the
    annotation after a wait for every wgmma group in flight."""
    if WAIT_FOR_WGMMA not in loop.annotations:
        return loop
    return S.SeqStmt([S.Evaluate(T.ptx.wgmma.wait_group.sync.aligned(0)),
                      _unannotated(loop, WAIT_FOR_WGMMA, loop.body)])


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="WaitForWgmma")
def wait_for_wgmma(func, _mod, _ctx):
    """Every loop annotated with WAIT_FOR_WGMMA: `wgmma.wait_group 0` before it."""
    body = tvm_ffi.structural_map(func.body, (S.For, _wait_for_wgmma), order="post")
    return func if body.same_as(func.body) else func.with_body(body)


PDL_TAG = "tirx.use_programtic_dependent_launch"  # sic: TVM 0.27's spelling
DYNAMIC_SHARED_TAG = "tirx.use_dyn_shared_memory"  # TVM wants it last among the launch tags


def _waits_for_predecessor(func) -> bool:
    """Whether the kernel calls `griddepcontrol.wait` anywhere."""
    calls = (_call_to(stmt, "tirx.ptx.griddepcontrol") for stmt in find(func.body, S.Evaluate))
    return any(call is not None and call.args[0].value == "wait" for call in calls)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="LaunchWaitingKernelsEarly")
def launch_waiting_kernels_early(func, _mod, _ctx):
    """A device kernel that calls `griddepcontrol.wait` before it touches what the kernel before
    it writes is launched with programmatic dependent launch: it may start while that kernel
    still runs, and the wait holds it back only where it must."""
    tags = func.attrs.get("tirx.kernel_launch_params") if func.attrs else None
    if tags is None or PDL_TAG in tags or not _waits_for_predecessor(func):
        return func
    tags = [str(t) for t in tags]
    at = tags.index(DYNAMIC_SHARED_TAG) if DYNAMIC_SHARED_TAG in tags else len(tags)
    return func.with_attr("tirx.kernel_launch_params", tags[:at] + [PDL_TAG] + tags[at:])


ASYNC_COPY = "tirx.s_tir.cp_async_raw"  # what InjectPTXAsyncCopy lowers a pipelined copy to


def _element_bytes(pointer) -> int:
    """The bytes of an element `pointer` (a handle of a typed buffer) points to, as TVM's
    codegen of ASYNC_COPY scales its offsets (1 for an untyped one)."""
    element = getattr(getattr(pointer, "ty", None), "element_type", None)
    return tvm.DataType(str(element.dtype)).bits // 8 if hasattr(element, "dtype") else 1


ZERO_FILLED_COPY_BYTES = (4, 8)  # the copies `zero_fill_in_one_copy` rewrites (not 16)
ZERO_FILLING_COPY = "cp_async_zero_fill"  # its helpers' names: this, then _bytes_dst_src


def zero_filling_copy(size: int, dst_bytes: int, src_bytes: int) -> tuple[str, str]:
    """The CUDA helper (name, source) of a `size`-byte cp.async (4 or 8: `.ca`, as TVM's own
    copies of those sizes) between buffers of `dst_bytes`- and `src_bytes`-byte elements, at
    element offsets, that reads nothing and zeroes its destination where `predicate` is 0
    (PTX's src-size operand)."""
    name = f"{ZERO_FILLING_COPY}_{size}_{dst_bytes}_{src_bytes}"
    return name, f"""
__forceinline__ __device__ void {name}(void* dst, int dst_off, void* src, int src_off,
                                       int predicate) {{
  unsigned int dst_addr = __cvta_generic_to_shared((uint8_t*)dst + dst_off * {dst_bytes});
  const uint8_t* src_p = (const uint8_t*)src + src_off * {src_bytes};
  asm volatile("cp.async.ca.shared.global [%0], [%1], {size}, %2;"
               :: "r"(dst_addr), "l"(src_p), "r"(predicate ? {size} : 0));
}}
"""


def _zero_filling(stmt):
    """`stmt` itself, or, if it is a predicated async copy of ZERO_FILLED_COPY_BYTES, the same
    copy zero-filling in one instruction (`zero_filling_copy`)."""
    call = _call_to(stmt, ASYNC_COPY)
    if call is None or len(call.args) != 6:  # (dst, dst_off, src, src_off, size[, predicate])
        return stmt
    dst, dst_off, src, src_off, size, predicate = call.args
    if int(size) not in ZERO_FILLED_COPY_BYTES:
        return stmt
    helper = zero_filling_copy(int(size), _element_bytes(dst), _element_bytes(src))
    return S.Evaluate(cuda_call(helper, dst, dst_off, src, src_off, predicate))


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="ZeroFillInOneCopy")
def zero_fill_in_one_copy(func, _mod, _ctx):
    """Every predicated async copy of 4 or 8 bytes: one zero-filling cp.async (see the module
    docstring)."""
    body = tvm_ffi.structural_map(func.body, (S.Evaluate, _zero_filling), order="post")
    return func if body.same_as(func.body) else func.with_body(body)


def _pipeline():
    default, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("default")
    return (tvm.transform.Sequential([default, rewrite_single_barrier, wait_for_wgmma,
                                      launch_waiting_kernels_early, zero_fill_in_one_copy]),
            finalize_host, finalize_device)


tvm.tirx.compilation_pipeline.register_tir_pipeline(PIPELINE, _pipeline)
