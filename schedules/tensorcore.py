"""Tensor-core GEMM (the v6 rung): warp tiles multiplied by `mma.sync.m16n8k16`, fed by
`ldmatrix` from shared memory, through TVM's intrinsics in `tvm.s_tir.tensor_intrin.cuda`.

TVM 0.27 registers those intrinsics for float16 only. `ldmatrix` moves 16-bit words whatever
they hold, and `mma.m16n8k16` also takes bfloat16 operands, so the bfloat16 intrinsics here are
the float16 ones with their dtypes renamed. One detail does not survive printing: the ldmatrix
call's own dtype, which TVM's CUDA codegen reads to choose `ldmatrix.trans` (a reparsed call
comes back int8 and gets the scalar fallback loop, a 2 KB stack frame), so it is written back.

`tvm.s_tir.tensor_intrin.cuda` registers all of TVM's CUDA intrinsics when imported, which
takes about 20 seconds, so it is imported only when v6 is applied.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule, TensorIntrin

from .common import cooperative_fetch, require_grid_y
from .registry import ScheduleNotApplicable, schedule
from .workloads import Workload

MMA = 16  # every tensor-core tile here is 16 x 16 (x 16 along K)
SHORT = {"float16": "f16", "bfloat16": "bf16"}


def _renamed_to_bf16(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """A float16 intrinsic function with bfloat16 operands (and ldmatrix's dtype written back)."""
    text = func.script().replace('"float16"', '"bfloat16"').replace('"fp16"', '"bf16"')
    lines = [line[: line.rindex(")")] + ', dtype="bfloat16")' if "T.ptx_legacy.ldmatrix(" in line
             else line for line in text.splitlines()]
    return tvm.script.from_source("\n".join(lines))


def _bf16_twin(fp16_name: str) -> str:
    """Register (once) the bfloat16 version of a float16 TVM intrinsic; return its name."""
    name = fp16_name.replace("f16", "bf16")
    if TensorIntrin.get(name, allow_missing=True) is None:
        fp16 = TensorIntrin.get(fp16_name)
        TensorIntrin.register(name, _renamed_to_bf16(fp16.desc), _renamed_to_bf16(fp16.impl))
    return name


def _tvm_intrinsics():
    from tvm.s_tir.tensor_intrin import cuda  # registers the float16 intrinsics (slow)

    return cuda


def intrinsics(dtype: str, b_transposed: bool) -> dict[str, str]:
    """Names of the ldmatrix / mma / fill / store intrinsics for fp32 accumulation."""
    intrin = _tvm_intrinsics()
    trans = "_trans" if b_transposed else ""
    names = {
        "load_a": "mma_ldmatrix_f16_a_dyn",
        "load_b": f"mma_ldmatrix_f16_b{trans}_dyn",
        "compute": "mma_f16f16f32" + ("_trans_b" if b_transposed else ""),
        "init": intrin.MMA_fill_16x16_f32_INTRIN,
        "store": intrin.MMA_store_16x16_f32_global_INTRIN,
    }
    if dtype == "bfloat16":
        for key in ("load_a", "load_b", "compute"):
            names[key] = _bf16_twin(names[key])
    return names


def _warp_layout(i, j):
    """A 16x16 tile as the 32 lanes x 8 registers that ldmatrix and mma use."""
    lanes_and_registers = _tvm_intrinsics().shared_16x16_to_ldmatrix_32x8_layout
    return (i // MMA, j // MMA, *lanes_and_registers(i % MMA, j % MMA))


@schedule("gemm", "v6", space={"warps_m": [1, 2, 4], "warps_n": [1, 2, 4],
                               "warp_tiles_m": [1, 2, 4], "warp_tiles_n": [1, 2, 4],
                               "chunk_k": [2, 4], "stages": [2, 3, 4]})
def v6(sch: Schedule, wl: Workload, warps_m: int = 2, warps_n: int = 2, warp_tiles_m: int = 4,
       warp_tiles_n: int = 4, chunk_k: int = 4, stages: int = 3, overlap_ldmatrix: bool = True) -> None:
    """Tensor cores: each warp owns warp_tiles_m x warp_tiles_n tiles of 16x16 and multiplies
    them with mma.sync (fp16/bf16 in, fp32 accumulators in registers), its operands loaded from
    shared memory by ldmatrix. A `stages`-deep cp.async pipeline (v5's, deeper) feeds shared
    memory, and the next 16-wide K slice is loaded by ldmatrix while this one is multiplied.

    IR: ptx_ldmatrix and ptx_mma calls (mma.sync.aligned.m16n8k16 in the CUDA), `warp` scope
    fragments, a block tile of (warps_m*warp_tiles_m*16) x (warps_n*warp_tiles_n*16)."""
    # Step 0. What the tensor-core path can take.
    if wl.dtype not in SHORT:
        raise ScheduleNotApplicable(f"v6 multiplies float16 or bfloat16 on tensor cores, not {wl.dtype}")
    if wl.has_cast:
        raise ScheduleNotApplicable("v6 writes the float32 accumulators; use --out-dtype float32")
    block_m, block_n = warps_m * warp_tiles_m * MMA, warps_n * warp_tiles_n * MMA
    for axis, extent, tile in (("M", wl.dims["M"], block_m), ("N", wl.dims["N"], block_n),
                               ("K", wl.dims["K"], chunk_k * MMA)):
        if extent % tile:
            raise ScheduleNotApplicable(f"v6 needs {axis}={extent} to be a multiple of its tile {tile}")
    require_grid_y("v6", "M/block_m", wl.dims["M"] // block_m)
    b_transposed = wl.layout == "nt"
    names = intrinsics(wl.dtype, b_transposed)
    warps, lanes, vector = warps_m * warps_n, 32, 8

    # Step 1. Cut the problem into 16x16x16 tensor-core tiles; the inner tile becomes one block.
    inner = sch.get_sblock(wl.reduction_block)
    i, j, k = sch.get_loops(inner)
    i, i_tc = sch.split(i, [None, MMA])
    j, j_tc = sch.split(j, [None, MMA])
    k, k_tc = sch.split(k, [None, MMA])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    outer = sch.blockize(i_tc)
    # Step 2. Thread blocks, warps, and the tiles each warp owns; K in chunks of chunk_k tiles.
    by, warp_i, tile_i = sch.split(i, [None, warps_m, warp_tiles_m])
    bx, warp_j, tile_j = sch.split(j, [None, warps_n, warp_tiles_n])
    ko, k_chunk = sch.split(k, [None, chunk_k])
    sch.reorder(by, bx, warp_i, warp_j, ko, k_chunk, tile_i, tile_j)
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    warp = sch.fuse(warp_i, warp_j)
    sch.bind(warp, "threadIdx.y")
    # Step 3. A and B tiles in shared memory: 16-byte vectors from all warps, padded rows (v5's).
    for operand in (0, 1):
        cooperative_fetch(sch, outer, operand, ko, (warps, lanes), vector, "shared.dyn", pad_rows=True)
    # Step 4. Warp fragments: ldmatrix from shared memory at each K chunk; accumulators in
    # registers for the whole K loop, stored to C at the end.
    fragments = [sch.cache_read(outer, operand, "warp") for operand in (0, 1)]
    for fragment in fragments:
        sch.compute_at(fragment, k_chunk)
    accumulator = sch.cache_write(outer, 0, "warp")
    sch.reverse_compute_at(accumulator, warp)
    init = sch.decompose_reduction(outer, ko)
    # Step 5. Lay each fragment out as mma wants it, then swap loops for intrinsics.
    loops = {}
    for name, block, shape in (("load_a", fragments[0], (MMA, MMA)), ("load_b", fragments[1], (MMA, MMA)),
                               ("store", accumulator, (MMA, MMA))):
        rows, cols = sch.get_loops(block)[-2:]
        rows_o, rows_i = sch.split(rows, [None, shape[0]])
        cols_o, cols_i = sch.split(cols, [None, shape[1]])
        sch.reorder(rows_o, cols_o, rows_i, cols_i)
        loops[name] = rows_i
    for block, buffer in ((fragments[0], ("write", 0)), (fragments[1], ("write", 0)),
                          (accumulator, ("read", 0))):
        sch.transform_layout(block, buffer, _warp_layout)
    sch.tensorize(loops["load_a"], names["load_a"])
    sch.tensorize(loops["load_b"], names["load_b"])
    sch.tensorize(sch.get_loops(inner)[-3], names["compute"])
    sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], names["init"])
    sch.tensorize(loops["store"], names["store"])
    # Step 6. Pipelines: shared-memory tiles for K chunk ko + stages - 1 load (cp.async) while
    # chunk ko is multiplied; within a chunk, ldmatrix of slice k + 1 overlaps mma of slice k.
    # The inner pipeline is injected first and leaves three statements (prologue, steady state,
    # epilogue) in place of one in ko's body, all of them in ko's compute stage.
    inner_pipelined = overlap_ldmatrix and chunk_k > 1
    if inner_pipelined:
        sch.annotate(k_chunk, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k_chunk, "software_pipeline_order", [0, 1, 2])
    if stages > 1:
        computes = 3 if inner_pipelined else 1
        sch.annotate(ko, "software_pipeline_stage", [0, 0] + [stages - 1] * computes)
        sch.annotate(ko, "software_pipeline_order", list(range(2 + computes)))
        sch.annotate(ko, "software_pipeline_async_stages", [0])
