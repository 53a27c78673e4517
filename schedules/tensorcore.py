"""Tensor-core GEMM. v6: warp tiles multiplied by `mma.sync.m16n8k16`, fed by `ldmatrix` from
shared memory, through TVM's intrinsics in `tvm.s_tir.tensor_intrin.cuda`. v7: Hopper's
`wgmma.mma_async`, through an intrinsic of its own built on TVM's `T.ptx` instructions.

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
from tvm.script import tirx as T

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


# -- v7: Hopper's warpgroup MMA (wgmma) --------------------------------------------------------
# wgmma reads A and B from shared memory through 64-bit descriptors, in "core matrices" of 8 rows
# of 16 bytes (8 elements along the contiguous axis), 128 contiguous bytes each. The layout here
# is the one without a swizzle: a tile is [MN/8][K/8][8 rows][8 elements], so the descriptor's
# leading byte offset (between core matrices along K) is 128 bytes and its stride byte offset
# (between core matrices along M or N) is K/8 * 128 bytes. For an operand stored K-contiguous
# (A; B in the nt layout) a core matrix's rows run along M or N; for B in the nn layout they run
# along K, and wgmma is told to transpose it (its trans-b bit).
CORE = 8  # a core matrix is 8 x 8 16-bit elements
WARPGROUP = 4  # warps that issue one wgmma together


def _core_matrix_index(rows, cols, k_contiguous: bool):
    """Where element (rows, cols) of a 16-bit shared tile lives in core-matrix order; `cols` is
    the contiguous axis, and is K when k_contiguous, M or N otherwise."""
    mn, k = (rows, cols) if k_contiguous else (cols, rows)
    return (mn // CORE, k // CORE, rows % CORE, cols % CORE)


def _core_matrix_fetch(sch: Schedule, block, operand: int, at, threads: tuple[int, int],
                       k_contiguous: bool):
    """Stage 16-bit operand `operand` of `block` in shared memory at loop `at` in core-matrix
    order, loaded by all threads as 16-byte vectors: a warp takes 4 consecutive vectors of each
    of 8 rows, so it reads 64 contiguous bytes per row and writes 4 whole core matrices (no
    bank conflicts). Returns the copy block."""
    tile = sch.cache_read(block, operand, "shared.dyn")
    sch.compute_at(tile, at)
    rows, cols = sch.get_loops(tile)[-2:]
    rows, row = sch.split(rows, [None, CORE])
    cols, col_vectors, lanes = sch.split(cols, [None, 4, CORE])
    sch.reorder(rows, cols, col_vectors, row, lanes)
    _, ty, tx = sch.split(sch.fuse(rows, cols, col_vectors, row), [None, *threads])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(lanes)
    sch.transform_layout(tile, ("write", 0), lambda r, c: _core_matrix_index(r, c, k_contiguous))
    return tile


def _descriptor(pointer, k: int):
    """wgmma's shared-memory matrix descriptor of a core-matrix tile K elements deep that starts
    at `pointer`: start address, leading byte offset 128, stride byte offset K/8 * 128, no
    swizzle; every field counts 16-byte units."""
    address = T.cuda.cvta_generic_to_shared(pointer)
    fields = (128 // 16) << 16 | (k // CORE * 128 // 16) << 32
    return T.bitwise_or(T.Cast("uint64", T.bitwise_and(T.shift_right(address, 4), 0x3FFF)),
                        T.uint64(fields))


def wgmma_intrinsic(dtype: str, n: int, k: int, b_k_contiguous: bool) -> str:
    """Register (once) and name the intrinsic for one warp's 16 rows of a warpgroup's
    C[64, n] += A[64, k] * B[k, n], A and B in core-matrix order in shared memory, C as each
    lane's registers of the fragment layout of TVM's mma intrinsics (which is wgmma's).
    Its body: make the threads' shared-memory writes visible to wgmma's reads (a proxy fence
    and a barrier), then k/16 wgmma.m64n{n}k16 from descriptors, committed and waited for."""
    name = f"v7_wgmma_{SHORT[dtype]}_n{n}_k{k}_{'nt' if b_k_contiguous else 'nn'}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    a_shape, b_shape, c_shape = (2, k // CORE, CORE, CORE), (n // CORE, k // CORE, CORE, CORE), (n // MMA, 8)
    wgmma = getattr(T.ptx.wgmma.mma_async.sync.aligned, f"m64n{n}k16").f32
    wgmma = getattr(getattr(wgmma, SHORT[dtype]), SHORT[dtype])
    group_elements = WARPGROUP * MMA * k  # one warpgroup's 64 rows of A
    steps = k // MMA

    def b_index(vk, vj):
        return _core_matrix_index(vj, vk, True) if b_k_contiguous else _core_matrix_index(vk, vj, False)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, a_shape, dtype, offset_factor=1, scope="shared.dyn")
        B = T.match_buffer(b, b_shape, dtype, offset_factor=1, scope="shared.dyn")
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:c_shape[0], 0:8], A[0:2, 0:a_shape[1], 0:CORE, 0:CORE],
                    B[0:b_shape[0], 0:b_shape[1], 0:CORE, 0:CORE])
            T.writes(C[0:c_shape[0], 0:8])
            for i, j, kk in T.grid(MMA, n, k):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, kk])
                    _, tile, register = T.meta_var(_register_of(vi, vj))
                    a0, a1, a2, a3 = T.meta_var(_core_matrix_index(vi, vk, True))
                    b0, b1, b2, b3 = T.meta_var(b_index(vk, vj))
                    C[tile, register] = C[tile, register] + T.Cast(
                        "float32", A[a0, a1, a2, a3]) * T.Cast("float32", B[b0, b1, b2, b3])

    def issue(C, A, B, step):
        group_start = A.elem_offset - A.elem_offset % group_elements
        a_desc = _descriptor(A.access_ptr("r", offset=group_start - A.elem_offset + step * 2 * CORE * CORE), k)
        b_desc = _descriptor(B.access_ptr("r", offset=step * 2 * CORE * CORE), k)
        accumulators = [C[t, r] for t in range(c_shape[0]) for r in range(8)]  # wgmma's order
        return wgmma(*accumulators, a_desc, b_desc, T.bool(True), 1, 1, 0, 0 if b_k_contiguous else 1)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, a_shape, dtype, offset_factor=1, scope="shared.dyn")
        B = T.match_buffer(b, b_shape, dtype, offset_factor=1, scope="shared.dyn")
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:c_shape[0], 0:8], A[0:2, 0:a_shape[1], 0:CORE, 0:CORE],
                    B[0:b_shape[0], 0:b_shape[1], 0:CORE, 0:CORE])
            T.writes(C[0:c_shape[0], 0:8])
            # one statement (the step loop), so that it is one stage of the cp.async pipeline
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for step in T.unroll(steps):
                    if step == 0:
                        T.evaluate(T.ptx.fence.proxy.async_.shared__cta())
                        T.tvm_storage_sync("shared")
                        T.evaluate(T.ptx.wgmma.fence.sync.aligned())
                    T.evaluate(issue(C, A, B, step))
                    if step == steps - 1:
                        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())
                        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))

    TensorIntrin.register(name, desc, impl)
    return name


def _register_of(i, j):
    """The accumulator register that holds C[i, j] in the lane that holds it (v6's fragment
    layout without the lane): 16x16 tile, then one of 8 registers."""
    tile_i, tile_j, _, register = _warp_layout(i, j)
    return tile_i, tile_j, register


def _bind_fragment_lanes(sch: Schedule, block):
    """Loop over a warp's 16 x n accumulators by the lane that holds each (threadIdx.x =
    4 * (row % 8) + (col % 8) // 2, as in mma's and wgmma's fragments), so that each thread
    touches only its own registers. Returns the innermost loop: 2 adjacent columns."""
    rows, cols = sch.get_loops(block)[-2:]
    row_half, row = sch.split(rows, [2, CORE])
    tile, col_half, col_pair, col = sch.split(cols, [None, 2, 4, 2])
    sch.reorder(row, col_pair, tile, col_half, row_half, col)
    sch.bind(sch.fuse(row, col_pair), "threadIdx.x")
    return col


@schedule("gemm", "v7", space={"block_m": [64, 128, 256], "block_n": [64, 128, 256],
                               "chunk_k": [32, 64], "stages": [2, 3, 4]})
def v7(sch: Schedule, wl: Workload, block_m: int = 128, block_n: int = 256, chunk_k: int = 64,
       stages: int = 4) -> None:
    """Hopper's warpgroup MMA: v6's block tile, but each group of 4 warps multiplies 64 rows of
    it by the whole block_n columns with wgmma.mma_async (m64n{block_n}k16), reading A and B
    straight from shared memory, no ldmatrix and no operand registers. Shared tiles are laid
    out in wgmma's core matrices (8 rows of 16 bytes) and filled by v6's cp.async pipeline; each
    K chunk's wgmmas are issued back to back and waited for once. sm_90a only.

    IR: shared tiles [MN/8, K/8, 8, 8]; per warp, 16 x block_n accumulators in `warp` scope
    (v6's fragment layout); T.ptx.wgmma calls with descriptors from cvta_generic_to_shared."""
    if wl.dtype not in SHORT:
        raise ScheduleNotApplicable(f"v7 multiplies float16 or bfloat16 on tensor cores, not {wl.dtype}")
    if wl.has_cast:
        raise ScheduleNotApplicable("v7 writes the float32 accumulators; use --out-dtype float32")
    for axis, extent, tile in (("M", wl.dims["M"], block_m), ("N", wl.dims["N"], block_n),
                               ("K", wl.dims["K"], chunk_k)):
        if extent % tile:
            raise ScheduleNotApplicable(f"v7 needs {axis}={extent} to be a multiple of its tile {tile}")
    if block_m % (WARPGROUP * MMA):
        raise ScheduleNotApplicable(f"v7 gives each warpgroup 64 rows: block_m={block_m} is not a multiple of 64")
    require_grid_y("v7", "M/block_m", wl.dims["M"] // block_m)
    warps = block_m // MMA
    # Step 1. Blocks of block_m x block_n; a warp per 16 rows, all block_n columns; K in chunks.
    C = sch.get_sblock(wl.reduction_block)
    i, j, k = sch.get_loops(C)
    by, warp, rows = sch.split(i, [None, warps, MMA])
    bx, cols = sch.split(j, [None, block_n])
    ko, k_chunk = sch.split(k, [None, chunk_k])
    sch.reorder(by, bx, warp, ko, rows, cols, k_chunk)
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(warp, "threadIdx.y")
    # Step 2. A and B tiles in shared memory, in core matrices, by all threads.
    for operand, k_contiguous in ((0, True), (1, wl.layout == "nt")):
        _core_matrix_fetch(sch, C, operand, ko, (warps, 32), k_contiguous)
    # Step 3. Accumulators in registers for the whole K loop, where wgmma leaves them: each
    # lane holds 8 of every 16x16 tile (v6's fragment layout), so a thread's local buffer is
    # indexed by tile and register only, and the loops that zero and store it run by lane.
    accumulator = sch.cache_write(C, 0, "local")
    sch.reverse_compute_at(accumulator, warp)
    init = sch.decompose_reduction(C, ko)
    sch.transform_layout(accumulator, ("read", 0), _register_of)
    _bind_fragment_lanes(sch, init)
    sch.vectorize(_bind_fragment_lanes(sch, accumulator))  # 2 adjacent columns per store
    # Step 4. The multiply: one warp's rows of the wgmma over a whole K chunk.
    sch.tensorize(rows, wgmma_intrinsic(wl.dtype, block_n, chunk_k, wl.layout == "nt"))
    # Step 5. cp.async pipeline: chunk ko + stages - 1 loads while chunk ko is multiplied.
    if stages > 1:
        sch.annotate(ko, "software_pipeline_stage", [0, 0, stages - 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
        sch.annotate(ko, "software_pipeline_async_stages", [0])
