"""Small steps that several schedules share."""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from .errors import ScheduleNotApplicable
from .workloads import Workload

MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z
PORTABLE_SHARED_BYTES = 48 * 1024  # what every GPU gives a block, and static arrays at most
# Shared memory one block can opt into (dynamic shared memory above the portable 48 KB), by
# compute capability: CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability". The H100's own report (shared_memory_per_block_optin) is checked in the GPU tier.
SHARED_BYTES_PER_BLOCK = {75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024,
                          89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 103: 227 * 1024,
                          120: 99 * 1024, 121: 99 * 1024}
REGISTERS_PER_BLOCK = 64 * 1024  # the same on every GPU since Volta


def compute_capability(arch: str) -> int:
    """'sm_90a' -> 90."""
    return int(arch.removeprefix("sm_").rstrip("af") or 0)


def shared_bytes_per_block(arch: str) -> int:
    """The shared memory one block of an `arch` GPU can have (SHARED_BYTES_PER_BLOCK; the
    portable 48 KB for an arch not listed there)."""
    return SHARED_BYTES_PER_BLOCK.get(compute_capability(arch), PORTABLE_SHARED_BYTES)


def cuda_call(helper: tuple[str, str], *args, return_type: str = "void"):
    """A call, in a TIRx kernel, of a CUDA helper given as (name, source) on `args`: its source
    is emitted once per module, before the kernel."""
    name, source = helper
    return T.cuda.func_call(name, *args, source_code=source, return_type=return_type)


def cast_epilogue_at(sch: tvm.s_tir.Schedule, wl: Workload, loop, scope: str = "local") -> None:
    """Compute the output cast right after the accumulation, under `loop`, and keep the float32
    accumulator in `scope` (a register by default) instead of a global temporary."""
    if not wl.has_cast:
        return
    sch.reverse_compute_at(sch.get_sblock(wl.output), loop, preserve_unit_loops=True)
    sch.set_scope(sch.get_sblock(wl.reduction_block), 0, scope)


def write_back_at(sch: tvm.s_tir.Schedule, wl: Workload, loop, block=None, vector: int = 1) -> None:
    """Accumulate `block` (the workload's reduction by default) in registers and write its
    output once, under `loop`: cast if the workload's output needs it, otherwise copied out
    `vector` elements at a time."""
    if block is None and wl.has_cast:
        cast_epilogue_at(sch, wl, loop)
        return
    if block is None:
        block = sch.get_sblock(wl.reduction_block)
    # The reduction now accumulates into a local buffer; the returned block copies it out.
    copy_out = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(copy_out, loop)
    if vector > 1:
        _, lanes = sch.split(sch.get_loops(copy_out)[-1], [None, vector])
        sch.vectorize(lanes)


def widest_vector(widest: int, *rows: int) -> int:
    """The widest vector, `widest` elements (a power of two) at most, that rows of these
    lengths are made of whole, so that every row starts on a vector boundary: 16-byte accesses
    on aligned shapes, narrower ones, down to single elements, on ragged ones."""
    vector = widest
    while any(row % vector for row in rows):
        vector //= 2
    return vector


def operand_vector(wl: Workload, widest: int) -> int:
    """The widest vector, `widest` elements at most, that the rows of A (K long) and of B (N
    long in nn, K in nt) are both made of: what their global loads can take."""
    return widest_vector(widest, wl.dims["K"], wl.dims["N" if wl.layout == "nn" else "K"])


def bind_threads(sch: tvm.s_tir.Schedule, loop, threads: tuple[int, int]) -> None:
    """Deal the iterations of `loop` out over the block's (threadIdx.y, threadIdx.x) =
    `threads`, the rest of them in a serial loop outside."""
    _, ty, tx = sch.split(loop, [None, *threads])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def require_sm(name: str, minimum: int, feature: str) -> None:
    """Refuse a schedule whose `feature` needs compute capability `minimum` (90: sm_90) or
    later on an older target."""
    arch = tvm.target.Target.current().attrs.get("arch", "")
    if compute_capability(arch) < minimum:
        raise ScheduleNotApplicable(f"{name} uses {feature}, which needs sm_{minimum} or later, "
                                    f"not {arch or 'a target without an arch'}")


def require_grid_y(name: str, axis: str, extent: int) -> None:
    """Refuse a schedule that would put more than 65535 blocks on blockIdx.y."""
    if extent > MAX_GRID_YZ:
        raise ScheduleNotApplicable(
            f"{name} binds {axis}={extent} to blockIdx.y, which CUDA limits to {MAX_GRID_YZ}"
        )


def cooperative_fetch(sch: tvm.s_tir.Schedule, block, operand: int, at, threads: tuple[int, int],
                      vector: int = 1, scope: str = "shared", pad_to: int = 0):
    """Stage operand `operand` of `block` in shared memory at loop `at`, loaded by all threads:
    the tile is flattened, cut into `vector`-element vectors and the vectors are dealt out over
    (threadIdx.y, threadIdx.x), so a tile smaller than the threads leaves some threads with
    no vector at all rather than a partial one (which could not be loaded as one vector).
    With pad_to (the elements of 16 bytes), each row is padded so that the next one starts 16
    bytes further round the 32 four-byte banks: the 16-byte vectors that readers take from
    consecutive rows never share a bank, whatever width `vector` the tile was loaded in.
    Returns the copy block."""
    tile = sch.cache_read(block, operand, scope)
    sch.compute_at(tile, at, preserve_unit_loops=True)
    vectors, lanes = sch.split(sch.fuse(*sch.get_loops(tile)[-2:]), [None, vector])
    bind_threads(sch, vectors, threads)
    if vector > 1:
        sch.vectorize(lanes)
    if pad_to:  # row stride = pad_to (mod 4 * pad_to) elements, i.e. 16 (mod 64) bytes
        sch.storage_align(tile, 0, axis=-2, factor=4 * pad_to, offset=pad_to)
    return tile


SINGLE_BARRIER = "explorer.single_barrier"  # a loop annotation, read by tuning/lowering.py
WAIT_FOR_WGMMA = "explorer.wait_for_wgmma"  # a loop annotation, read by tuning/lowering.py
# A PrimFunc attribute: the function is a TIRx kernel written whole (v8), which tuning/build.py
# lowers with TVM's "tirx" pipeline instead of the project's s_tir one.
TIRX_KERNEL = "explorer.tirx_kernel"


def software_pipeline(sch: tvm.s_tir.Schedule, loop, stages: int, computes: int = 1,
                      async_loads: bool = False, loads_last: bool = False,
                      single_barrier: bool = False) -> None:
    """Pipeline `loop`, whose body is two loads (A's, then B's) followed by `computes`
    statements: the loads of iteration i + stages - 1 run during iteration i's computes, into
    `stages` buffers (stages=1: no pipeline). With async_loads they become cp.async (TVM's
    async stage); with loads_last they come after the computes in the loop body. With
    single_barrier (async loads first), each iteration waits for its tile and syncs once before
    it issues the next loads, as CUTLASS's multistage loop does (see tuning/lowering.py)."""
    if stages < 2:
        return
    if async_loads:
        require_sm(f"a {stages}-stage pipeline", 80, "cp.async")
    sch.annotate(loop, "software_pipeline_stage", [0, 0] + [stages - 1] * computes)
    order = [computes, computes + 1, *range(computes)] if loads_last else list(range(2 + computes))
    sch.annotate(loop, "software_pipeline_order", order)
    if async_loads:
        sch.annotate(loop, "software_pipeline_async_stages", [0])
    if single_barrier:
        sch.annotate(loop, SINGLE_BARRIER, True)


def transposed_fetch(sch: tvm.s_tir.Schedule, block, operand: int, at, threads: tuple[int, int]):
    """Stage float32 operand `operand` (rows x K) of `block` in shared memory at loop `at`,
    transposed ([k, row]), so that a thread reads several rows of one K step as one 16-byte
    vector. Elements are dealt out one by one (4-byte cp.async when pipelined): a warp takes
    8 consecutive K, one 32-byte sector, of each of 4 rows. Each K row of the tile is padded to
    a stride of 4 (mod 32) elements, so those 32 stores hit 32 different banks.
    Returns the copy block."""
    tile = sch.cache_read(block, operand, "shared.dyn")
    sch.compute_at(tile, at, preserve_unit_loops=True)
    rows, k = sch.get_loops(tile)[-2:]
    rows, warp_rows = sch.split(rows, [None, 4])
    k, warp_k = sch.split(k, [None, 8])
    sch.reorder(rows, k, warp_rows, warp_k)
    bind_threads(sch, sch.fuse(rows, k, warp_rows, warp_k), threads)
    sch.transform_layout(tile, ("write", 0), lambda row, k: (k, row))
    sch.storage_align(tile, 0, axis=-2, factor=32, offset=4)
    return tile


def pad_to_tiles(sch: tvm.s_tir.Schedule, wl: Workload, tile: tuple[int, int, int]) -> bool:
    """Where M, N or K is not whole tiles (`tile`: M x N x K), multiply matrices padded to whole
    tiles with zeroes (pad_einsum): the multiply (tensor-core intrinsics, register tiles) then
    always works on whole tiles, with no predicate of its own. The padding costs no memory:
    `inline_padding` folds it into the loads (zero-filled past the edges) and the store
    (predicated), and a cast of the output reads the padded accumulators directly. Returns
    whether it padded."""
    if all(wl.dims[axis] % size == 0 for axis, size in zip("MNK", tile)):
        return False
    if wl.block_scaled:
        raise ScheduleNotApplicable(
            f"padding to whole {'x'.join(map(str, tile))} tiles (pad_einsum) takes a product of "
            f"A and B alone, not block-scaled fp8's, which also reads the scales: "
            f"{'x'.join(map(str, wl.shape))} is not whole tiles")
    sch.pad_einsum(sch.get_sblock(wl.reduction_block), list(tile))
    copy_out = padding_block(sch, f"{wl.reduction_block}_pad")  # none where only K was padded
    if wl.has_cast and copy_out is not None:  # the cast reads the padded accumulators in C
        sch.compute_inline(copy_out)
    return True


def inline_padding(sch: tvm.s_tir.Schedule, wl: Workload, keep_store: bool = False) -> None:
    """After pad_to_tiles, once the shared-memory copies and the accumulator's store exist: the
    padded operands are read straight from A and B by those copies (a zero past their edges:
    a zero-filling cp.async where the vector is whole), and the store writes C where it is
    inside C only; with keep_store, pad_einsum's copy out of the padded C stays a block of its
    own (`<output>_pad`)."""
    for operand in ("A", "B"):
        pad = padding_block(sch, f"{operand}_pad")  # none for an operand of whole tiles
        if pad is not None:
            sch.compute_inline(pad)
    copy_out = padding_block(sch, f"{wl.output}_pad")  # none where only K was padded
    if copy_out is not None and not keep_store and not wl.has_cast:
        sch.reverse_compute_inline(copy_out)


def padding_block(sch: tvm.s_tir.Schedule, name: str):
    """The block that pad_einsum named `name` (`A_pad`, `B_pad`: padded copies of the inputs;
    `<output>_pad`: the copy of the padded result into the output), or None where it made none."""
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(sch.get_sblock("root"))}
    return blocks.get(name)
