"""Tensor-core GEMM. v6: warp tiles multiplied by `mma.sync.m16n8k16`, fed by `ldmatrix` from
shared memory, through TVM's intrinsics in `tvm.s_tir.tensor_intrin.cuda`. v7: Hopper's
`wgmma.mma_async`, through an intrinsic of its own built on TVM's `T.ptx` instructions.

TVM 0.27 registers those intrinsics for float16 only (its generators refuse other dtypes).
`ldmatrix` moves 16-bit words whatever they hold, and `mma.m16n8k16` also takes bfloat16
operands, so the bfloat16 intrinsics here are the float16 ones with float16 replaced by bfloat16
throughout their IR, by a structural map: the buffers, the pointers, the mma calls' operand type
names, and the calls' own dtypes. The ldmatrix call's dtype is the one that matters: TVM's CUDA
codegen reads it to choose `ldmatrix.trans`, and a call without it (int8, the default) gets the
scalar fallback loop, a 2 KB stack frame.

`tvm.s_tir.tensor_intrin.cuda` registers all of TVM's CUDA intrinsics when imported, which
took 20-40 seconds (3-5 s through tvmscript_import), so it is imported only when v6 is applied.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm.ir import Call, PrimType, StringImm
from tvm.s_tir import Schedule, TensorIntrin
from tvm.script import tirx as T

from .common import (REGISTERS_PER_BLOCK, WAIT_FOR_WGMMA, bind_threads, cooperative_fetch,
                     inline_padding, operand_vector, pad_to_tiles, padding_block, require_grid_y,
                     require_sm, shared_bytes_per_block, software_pipeline)
from . import heuristics
from .errors import ScheduleNotApplicable
from .registry import schedule
from .tvmscript_import import import_module
from .workloads import DTYPE_BYTES, Workload

MMA = 16  # every tensor-core tile here is 16 x 16 (x 16 along K)
SHORT = {"float16": "f16", "bfloat16": "bf16"}
MMA_TYPE_NAMES = {"float16": "fp16", "bfloat16": "bf16"}  # ptx_legacy.mma's operand types


def _with_operand_dtype(fp16_func: tvm.tirx.PrimFunc, dtype: str) -> tvm.tirx.PrimFunc:
    """A float16 intrinsic function of TVM's with `dtype` operands: float16 becomes dtype in its
    buffers and pointers, in its calls' own dtypes (ldmatrix's, which the codegen reads) and in
    its mma calls' operand type names."""
    fp16, new = PrimType("float16"), PrimType(dtype)

    def retyped(call: Call) -> Call:
        """The call with its own dtype mapped too (the PrimType callback does not reach it)."""
        if call.ty == fp16:
            return Call(call.op, call.args, call.attrs, call.ty_args, call.span, ret_ty=new)
        return call

    def renamed(name: StringImm) -> StringImm:
        """mma's operand type name for dtype in place of float16's."""
        return StringImm(MMA_TYPE_NAMES[dtype]) if name.value == MMA_TYPE_NAMES["float16"] else name

    return tvm_ffi.structural_map(fp16_func, [(PrimType, lambda ty: new if ty == fp16 else ty),
                                              (Call, retyped), (StringImm, renamed)])


def _intrinsic_for(fp16_name: str, dtype: str) -> str:
    """Register (once) the `dtype` version of a float16 TVM intrinsic; return its name (for
    float16, TVM's own)."""
    name = fp16_name.replace(SHORT["float16"], SHORT[dtype])
    if TensorIntrin.get(name, allow_missing=True) is None:
        fp16 = TensorIntrin.get(fp16_name)
        TensorIntrin.register(name, _with_operand_dtype(fp16.desc, dtype),
                              _with_operand_dtype(fp16.impl, dtype))
    return name


def _tvm_intrinsics():
    """TVM's CUDA intrinsics module, imported (its float16 intrinsics registered) the first
    time, through tvmscript_import: ~6x faster than a plain import."""
    return import_module("tvm.s_tir.tensor_intrin.cuda")


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
    for key in ("load_a", "load_b", "compute"):
        names[key] = _intrinsic_for(names[key], dtype)
    return names


def require_tensor_core_gemm(name: str, wl: Workload, tile: tuple[int, int, int], sm: int,
                             feature: str) -> None:
    """Refuse, in the words of rung `name`, what both tensor-core rungs cannot take: a target
    older than sm_`sm` (which `feature` needs), inputs other than float16 or bfloat16, an output
    other than the float32 accumulators, or more rows of block tiles (`tile`: M x N x K) than
    blockIdx.y reaches. Any M, N and K: see pad_to_tiles."""
    require_sm(name, sm, feature)
    if wl.dtype not in SHORT:
        raise ScheduleNotApplicable(f"{name} multiplies float16 or bfloat16 on tensor cores, not {wl.dtype}")
    if wl.has_cast:
        raise ScheduleNotApplicable(f"{name} writes the float32 accumulators; use --out-dtype float32")
    require_grid_y(name, "M/block_m", -(-wl.dims["M"] // tile[0]))


def _store_through_shared(sch: Schedule, copy_out, accumulator, at, threads: tuple[int, int]):
    """After pad_to_tiles padded M or N, for a store intrinsic that only writes whole 16x16
    tiles: the accumulators go to a block tile in shared memory, and all threads copy the part
    of it that lies inside C out to C (`copy_out`, pad_einsum's copy) under loop `at`."""
    sch.set_scope(accumulator, 0, "shared.dyn")
    sch.reverse_compute_at(copy_out, at, preserve_unit_loops=True)
    bind_threads(sch, sch.fuse(*sch.get_loops(copy_out)[-2:]), threads)


def _warp_layout(i, j):
    """A 16x16 tile as the 32 lanes x 8 registers that ldmatrix and mma use."""
    lanes_and_registers = _tvm_intrinsics().shared_16x16_to_ldmatrix_32x8_layout
    return (i // MMA, j // MMA, *lanes_and_registers(i % MMA, j % MMA))


def warp_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v6: the tile rule over the space's warp tiles (warp_tiles_m x warp_tiles_n tiles of
    16x16 per warp), the warps as they are."""

    def tile(tiles_m: int, tiles_n: int) -> tuple[int, int]:
        return knobs["warps_m"] * tiles_m * MMA, knobs["warps_n"] * tiles_n * MMA

    options = [tile(m, n) for m in space["warp_tiles_m"] for n in space["warp_tiles_n"]
               if m <= knobs["warp_tiles_m"] and n <= knobs["warp_tiles_n"]]
    default = tile(knobs["warp_tiles_m"], knobs["warp_tiles_n"])
    block_m, block_n = heuristics.fit_tile(wl, sms, default, options)
    return {"warp_tiles_m": block_m // (knobs["warps_m"] * MMA),
            "warp_tiles_n": block_n // (knobs["warps_n"] * MMA)}


@schedule("gemm", "v6", space={"warps_m": [1, 2, 4], "warps_n": [1, 2, 4],
                               "warp_tiles_m": [1, 2, 4], "warp_tiles_n": [1, 2, 4],
                               "chunk_k": [2, 4], "stages": [2, 3, 4]},
          heuristic=warp_tiles)
def v6(sch: Schedule, wl: Workload, *, warps_m: int = 2, warps_n: int = 2, warp_tiles_m: int = 4,
       warp_tiles_n: int = 4, chunk_k: int = 4, stages: int = 3, overlap_ldmatrix: bool = True) -> None:
    """Tensor cores: each warp owns warp_tiles_m x warp_tiles_n tiles of 16x16 and multiplies
    them with mma.sync (fp16/bf16 in, fp32 accumulators in registers), its operands loaded from
    shared memory by ldmatrix. A `stages`-deep cp.async pipeline (v5's, deeper) feeds shared
    memory, and the next 16-wide K slice is loaded by ldmatrix while this one is multiplied.
    Any M, N, K: ragged ones are padded to whole tiles inside the kernel (pad_to_tiles), and C
    then leaves through shared memory.

    IR: ptx_ldmatrix and ptx_mma calls (mma.sync.aligned.m16n8k16 in the CUDA), `warp` scope
    fragments, a block tile of (warps_m*warp_tiles_m*16) x (warps_n*warp_tiles_n*16)."""
    # Step 0. What the tensor-core path can take.
    block_m, block_n = warps_m * warp_tiles_m * MMA, warps_n * warp_tiles_n * MMA
    require_tensor_core_gemm("v6", wl, (block_m, block_n, chunk_k * MMA), 80,
                             "mma.sync m16n8k16 and cp.async")
    b_transposed = wl.layout == "nt"
    names = intrinsics(wl.dtype, b_transposed)
    warps, lanes = warps_m * warps_n, 32
    vector = operand_vector(wl, ATOM_ROWS)  # 16 bytes, or what ragged rows of A and B allow
    padded = pad_to_tiles(sch, wl, (block_m, block_n, chunk_k * MMA))

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
        cooperative_fetch(sch, outer, operand, ko, (warps, lanes), vector, "shared.dyn",
                          pad_to=ATOM_ROWS)  # rows 16-byte aligned for ldmatrix, whatever `vector`
    # Step 4. Warp fragments: ldmatrix from shared memory at each K chunk; accumulators in
    # registers for the whole K loop, stored to C at the end.
    fragments = [sch.cache_read(outer, operand, "warp") for operand in (0, 1)]
    for fragment in fragments:
        sch.compute_at(fragment, k_chunk)
    accumulator = sch.cache_write(outer, 0, "warp")
    sch.reverse_compute_at(accumulator, warp)
    init = sch.decompose_reduction(outer, ko)
    # Step 5. Lay each fragment out as mma wants it, then swap loops for intrinsics.
    loops = _fragment_tiles(sch, fragments, accumulator)
    sch.tensorize(loops["load_a"], names["load_a"])
    sch.tensorize(loops["load_b"], names["load_b"])
    sch.tensorize(sch.get_loops(inner)[-3], names["compute"])
    sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], names["init"])
    if padded:
        inline_padding(sch, wl, keep_store=True)
    copy_out = padding_block(sch, f"{wl.output}_pad")
    if copy_out is not None:  # whole tiles go to shared memory; C takes what is inside it
        _store_through_shared(sch, copy_out, accumulator, bx, (warps, lanes))
        sch.tensorize(loops["store"], _tvm_intrinsics().MMA_store_16x16_f32_shared_dyn_INTRIN_SIMPLE)
    else:
        sch.tensorize(loops["store"], names["store"])
    # Step 6. Pipelines: shared-memory tiles for K chunk ko + stages - 1 load (cp.async) while
    # chunk ko is multiplied; within a chunk, ldmatrix of slice k + 1 overlaps mma of slice k.
    # The inner pipeline is injected first and leaves three statements (prologue, steady state,
    # epilogue) in place of one in ko's body, all of them in ko's compute stage.
    inner_pipelined = overlap_ldmatrix and chunk_k > 1
    if inner_pipelined:
        software_pipeline(sch, k_chunk, 2)
    software_pipeline(sch, ko, stages, 3 if inner_pipelined else 1, async_loads=True)


def _fragment_tiles(sch: Schedule, fragments: list, accumulator) -> dict:
    """v6's warp fragments (A's and B's loads, the accumulators' store) cut into 16x16 tiles
    and laid out as mma.sync wants them (_warp_layout); the loop each tile's intrinsic replaces,
    by name: load_a, load_b, store."""
    loops = {}
    for name, block in (("load_a", fragments[0]), ("load_b", fragments[1]), ("store", accumulator)):
        rows, cols = sch.get_loops(block)[-2:]
        rows_o, rows_i = sch.split(rows, [None, MMA])
        cols_o, cols_i = sch.split(cols, [None, MMA])
        sch.reorder(rows_o, cols_o, rows_i, cols_i)
        loops[name] = rows_i
    for block, buffer in ((fragments[0], ("write", 0)), (fragments[1], ("write", 0)),
                          (accumulator, ("read", 0))):
        sch.transform_layout(block, buffer, _warp_layout)
    return loops


# -- v7: Hopper's warpgroup MMA (wgmma) --------------------------------------------------------
# wgmma reads A and B from shared memory through 64-bit descriptors. The layout here is its
# 128-byte swizzle: an operand's tile is cut into atoms of 8 rows of 128 bytes (64 elements along
# the contiguous axis), 1024 contiguous bytes each, and the 16-byte chunk j of row r is stored at
# chunk j ^ r. The 8 rows wgmma reads together then fall in 8 different groups of banks, and
# the hardware applies the same XOR to the address bits when it reads. For an operand stored
# K-contiguous (A; B in the nt layout) a row is one M or N index over 64 K; for B in the nn
# layout a row is one K index over 64 columns, and wgmma is told to transpose it (its trans-b
# bit). Without the swizzle (the plain core-matrix layout), v7 ran at 24% of cuBLAS instead of
# 67% (reports/notes/h100-gemm-ladder.md).
SWIZZLE_ROW = 64  # 16-bit elements in a 128-byte swizzled row
ATOM_ROWS = 8  # rows in an atom; also the 16-byte chunks in a row, and the elements in a chunk
ATOM_ELEMENTS = ATOM_ROWS * SWIZZLE_ROW  # 1024 bytes
WARPGROUP = 4  # warps that issue one wgmma together
HOPPER_SHARED_BYTES = shared_bytes_per_block("sm_90")
# wgmma.mma_async's operands after the two descriptors (PTX ISA 9.7.17.5.2), in this order:
ACCUMULATE = True  # scale-d: D = A * B + D (false: D = A * B); the accumulators start at zero
UNNEGATED = 1  # imm-scale-a, imm-scale-b: 1 takes A (B) as it is, -1 negates it
K_MAJOR, MN_MAJOR = 0, 1  # imm-trans-a/b: 0 reads a K-contiguous operand, 1 transposes an MN-contiguous one


def _swizzled_index(rows, cols, k_contiguous: bool):
    """Where element (rows, cols) of a 16-bit shared tile lives in 128-byte-swizzled atoms;
    `cols` is the contiguous axis, and is K when k_contiguous (an atom: 8 M or N x 64 K), M or
    N otherwise (an atom: 8 K x 64 M or N). [MN atom][K atom][row][chunk ^ row][element]."""
    row = rows % ATOM_ROWS
    chunk = (cols % SWIZZLE_ROW // ATOM_ROWS ^ row) % ATOM_ROWS  # "% 8" bounds it for TVM
    mn_atom, k_atom = ((rows // ATOM_ROWS, cols // SWIZZLE_ROW) if k_contiguous
                       else (cols // SWIZZLE_ROW, rows // ATOM_ROWS))
    return (mn_atom, k_atom, row, chunk, cols % ATOM_ROWS)


def _swizzled_fetch(sch: Schedule, block, operand: int, at, threads: tuple[int, int],
                    k_contiguous: bool, vector: int = ATOM_ROWS):
    """Stage 16-bit operand `operand` of `block` in shared memory at loop `at` in swizzled atoms,
    loaded by all threads as 16-byte vectors, 8 consecutive threads per 128-byte row: each
    warp reads whole 128-byte rows and writes whole swizzled rows (no bank conflicts). Rows
    of the operand that do not start on 16-byte boundaries (ragged K, or N in nn) are loaded in
    narrower `vector`s. Returns the copy block."""
    tile = sch.cache_read(block, operand, "shared.dyn")
    sch.compute_at(tile, at)
    vectors, lanes = sch.split(sch.fuse(*sch.get_loops(tile)[-2:]), [None, vector])
    bind_threads(sch, vectors, threads)
    sch.vectorize(lanes)
    sch.transform_layout(tile, ("write", 0), lambda r, c: _swizzled_index(r, c, k_contiguous),
                         assume_injective_transform=True)  # the xor is a permutation
    return tile


def _descriptor(pointer, leading_bytes: int, stride_bytes: int):
    """wgmma's shared-memory matrix descriptor of a 128-byte-swizzled tile that starts at
    `pointer`: its start address, leading and stride byte offsets (in 16-byte units) and the
    swizzle mode (1 in bits 62-63: 128 bytes). The XOR comes from address bits 7-9, so atoms
    must start 1024-byte aligned: every tile here is whole atoms, and dynamic shared memory
    starts 1024-byte aligned on Hopper (v7 is correct on the H100)."""
    address = T.cuda.cvta_generic_to_shared(pointer)
    fields = (leading_bytes // 16) << 16 | (stride_bytes // 16) << 32 | 1 << 62
    return T.bitwise_or(T.Cast("uint64", T.bitwise_and(T.shift_right(address, 4), 0x3FFF)),
                        T.uint64(fields))


def _descriptor_offsets(k_contiguous: bool, k: int) -> tuple[int, int]:
    """The leading and stride byte offsets of a descriptor of a swizzled tile k deep. An atom is
    1024 bytes; the atoms of one MN position along K are contiguous. K-contiguous: stride =
    between 8-row atoms (k/64 atoms apart); leading unused within a 128-byte row. MN-contiguous:
    leading = between 64-wide MN atoms (k/8 atoms apart), stride = between 8-deep K atoms."""
    atom_bytes = 2 * ATOM_ELEMENTS
    if k_contiguous:
        return 16, k // SWIZZLE_ROW * atom_bytes
    return k // ATOM_ROWS * atom_bytes, atom_bytes


def _k_offset(kk, k_contiguous: bool):
    """Elements from the start of a swizzled tile to K index kk of its first M or N index, where
    a wgmma k16 step starts: row 0 of an atom, which the XOR leaves in place (the hardware
    applies the XOR to the other rows' addresses itself)."""
    if k_contiguous:
        return kk // SWIZZLE_ROW * ATOM_ELEMENTS + kk % SWIZZLE_ROW
    return kk // ATOM_ROWS * ATOM_ELEMENTS


def wgmma_intrinsic(dtype: str, n: int, k: int, b_k_contiguous: bool, stages: int) -> str:
    """Register (once) and name the intrinsic for one warp's 16 rows of a warpgroup's
    C[64, n] += A[64, k] * B[k, n], A and B in swizzled atoms in shared memory, C as each lane's
    registers of the fragment layout of TVM's mma intrinsics (which is wgmma's). Its body:
    wait for this chunk's cp.async group (stages - 2 younger ones may still be loading), make
    the threads' shared-memory writes visible to wgmma's reads (a proxy fence and a barrier),
    issue k/16 wgmma.m64n{n}k16 from descriptors as one group, and wait for the previous
    chunk's group only: this one keeps the tensor cores busy while the threads load the next.

    The cp.async wait is here because TVM's pipeline, with the loads after the multiply in the
    loop body, does not wait for this chunk in its steady state: it emits wait_group 4 with 4
    stages, when only 3 groups are in flight. Its prologue and epilogue waits are right."""
    name = f"v7_wgmma_{SHORT[dtype]}_n{n}_k{k}_{'nt' if b_k_contiguous else 'nn'}_s{stages}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    atoms = (ATOM_ROWS, ATOM_ROWS, ATOM_ROWS)  # row, chunk, element
    k_atoms = k // SWIZZLE_ROW  # of a K-contiguous operand
    a_shape = (MMA // ATOM_ROWS, k_atoms, *atoms)
    b_shape = (n // ATOM_ROWS, k_atoms, *atoms) if b_k_contiguous else (n // SWIZZLE_ROW, k // ATOM_ROWS, *atoms)
    c_shape = (n // MMA, 8)
    wgmma = getattr(T.ptx.wgmma.mma_async.sync.aligned, f"m64n{n}k16").f32
    wgmma = getattr(getattr(wgmma, SHORT[dtype]), SHORT[dtype])
    group_elements = WARPGROUP * MMA * k  # one warpgroup's 64 rows of A
    a_offsets, b_offsets = _descriptor_offsets(True, k), _descriptor_offsets(b_k_contiguous, k)

    def b_index(vk, vj):
        return _swizzled_index(vj, vk, True) if b_k_contiguous else _swizzled_index(vk, vj, False)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, a_shape, dtype, offset_factor=1, scope="shared.dyn")
        B = T.match_buffer(b, b_shape, dtype, offset_factor=1, scope="shared.dyn")
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:c_shape[0], 0:8], A[0:a_shape[0], 0:k_atoms, 0:8, 0:8, 0:8],
                    B[0:b_shape[0], 0:b_shape[1], 0:8, 0:8, 0:8])
            T.writes(C[0:c_shape[0], 0:8])
            for i, j, kk in T.grid(MMA, n, k):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, kk])
                    _, tile, register = T.meta_var(_register_of(vi, vj))
                    a0, a1, a2, a3, a4 = T.meta_var(_swizzled_index(vi, vk, True))
                    b0, b1, b2, b3, b4 = T.meta_var(b_index(vk, vj))
                    C[tile, register] = C[tile, register] + T.Cast(
                        "float32", A[a0, a1, a2, a3, a4]) * T.Cast("float32", B[b0, b1, b2, b3, b4])

    def issue(C, A, B, step):
        group_start = A.elem_offset - A.elem_offset % group_elements
        a_pointer = A.access_ptr("r", offset=group_start - A.elem_offset + _k_offset(step * MMA, True))
        b_pointer = B.access_ptr("r", offset=_k_offset(step * MMA, b_k_contiguous))
        accumulators = [C[t, r] for t in range(c_shape[0]) for r in range(8)]  # wgmma's order
        return wgmma(*accumulators, _descriptor(a_pointer, *a_offsets), _descriptor(b_pointer, *b_offsets),
                     T.bool(ACCUMULATE), UNNEGATED, UNNEGATED, K_MAJOR,
                     K_MAJOR if b_k_contiguous else MN_MAJOR)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, a_shape, dtype, offset_factor=1, scope="shared.dyn")
        B = T.match_buffer(b, b_shape, dtype, offset_factor=1, scope="shared.dyn")
        C = T.match_buffer(c, c_shape, "float32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:c_shape[0], 0:8], A[0:a_shape[0], 0:k_atoms, 0:8, 0:8, 0:8],
                    B[0:b_shape[0], 0:b_shape[1], 0:8, 0:8, 0:8])
            T.writes(C[0:c_shape[0], 0:8])
            # one statement (the step loop), so that it is one stage of the cp.async pipeline
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for step in T.unroll(k // MMA):
                    if step == 0:
                        T.evaluate(T.ptx.cp.async_.wait_group(stages - 2))
                        T.evaluate(T.ptx.fence.proxy.async_.shared__cta())
                        T.tvm_storage_sync("shared")
                        T.evaluate(T.ptx.wgmma.fence.sync.aligned())
                    T.evaluate(issue(C, A, B, step))
                    if step == k // MMA - 1:
                        T.evaluate(T.ptx.wgmma.commit_group.sync.aligned())
                        T.evaluate(T.ptx.wgmma.wait_group.sync.aligned(1))

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
    touches only its own registers. Returns the outermost loop left (over 16x16 tiles) and the
    innermost (a lane's pair of adjacent columns)."""
    rows, cols = sch.get_loops(block)[-2:]
    row_half, row = sch.split(rows, [2, MMA // 2])
    tile, col_half, col_pair, col = sch.split(cols, [None, 2, 4, 2])
    sch.reorder(row, col_pair, tile, col_half, row_half, col)
    sch.bind(sch.fuse(row, col_pair), "threadIdx.x")
    return tile, col


def wgmma_tiles(wl: Workload, sms: int, knobs: dict, space: dict) -> dict:
    """v7: block_m 64 where M <= 64 (decode batches: one wgmma's M is 64, a taller tile would be
    padding); block_n 128 where 256-column tiles cannot give every SM one (each where the space
    holds that value); stages 4 unless four stages of shared tiles would not fit a Hopper block
    (then 3); blocks along M where B outgrows L2 (b_outgrows_l2)."""
    wgmma_m = WARPGROUP * MMA
    short = wl.dims["M"] <= wgmma_m and wgmma_m in space["block_m"]
    block_m = wgmma_m if short else knobs["block_m"]
    few = heuristics.tile_count(wl, block_m, knobs["block_n"]) < sms and 128 in space["block_n"]
    block_n = 128 if few else knobs["block_n"]
    stage_bytes = (block_m + block_n) * knobs["chunk_k"] * DTYPE_BYTES[wl.dtype]
    return {"block_m": block_m, "block_n": block_n,
            "stages": 4 if 4 * stage_bytes <= HOPPER_SHARED_BYTES else 3,
            "m_tiles_first": b_outgrows_l2(wl)}


def b_outgrows_l2(wl: Workload) -> bool:
    """Whether B is larger than L2 and A is smaller than B: then blocks launched along M
    (v7's m_tiles_first) read each B tile from DRAM once and re-read A from L2, where blocks
    along N would stream all of B again for every row of tiles (4096x28672x4096 bf16: 2.8 ms
    against cuBLAS's 1.3 ms, with 32 passes over a 235 MB B)."""
    a_bytes, b_bytes = (wl.dims[axis] * wl.dims["K"] * DTYPE_BYTES[wl.dtype] for axis in "MN")
    return b_bytes > heuristics.H100_L2_BYTES and a_bytes < b_bytes


@schedule("gemm", "v7", space={"block_m": [64, 128, 256], "block_n": [64, 128, 256],
                               "chunk_k": [64, 128], "stages": [3, 4],
                               "m_tiles_first": [False, True]},
          heuristic=wgmma_tiles)
def v7(sch: Schedule, wl: Workload, block_m: int = 128, block_n: int = 256, chunk_k: int = 64,
       stages: int = 4, m_tiles_first: bool = False) -> None:
    """Hopper's warpgroup MMA: v6's block tile, but each group of 4 warps multiplies 64 rows of
    it by the whole block_n columns with wgmma.mma_async (m64n{block_n}k16), reading A and B
    straight from shared memory, no ldmatrix and no operand registers. Shared tiles are laid
    out in wgmma's 128-byte-swizzled atoms (8 rows of 128 bytes, 16-byte chunks XOR the row)
    and filled by v6's cp.async pipeline, K in chunks of chunk_k (whole swizzled rows). A
    chunk's wgmmas are issued back to back as one group and left running while the threads
    load the next chunk; each chunk waits for the previous one's group, and the store for the
    last. Any M, N, K: ragged ones are padded to whole tiles inside the kernel (pad_to_tiles).
    Blocks are launched along N (blockIdx.x), or with m_tiles_first along M: then consecutive
    blocks share one tile of B, which is read from DRAM once while A, when it fits in L2, is
    re-read from there (for a B much larger than L2 and a smaller A). sm_90a only.

    IR: shared tiles [MN atom, K atom, 8, 8, 8] indexed with a bitwise xor; per warp, 16 x
    block_n accumulators in `local` scope, indexed by tile and register (v6's fragment layout);
    T.ptx.wgmma calls with descriptors from cvta_generic_to_shared."""
    require_tensor_core_gemm("v7", wl, (block_m, block_n, chunk_k), 90, "wgmma (built for sm_90a)")
    if block_m % (WARPGROUP * MMA):
        raise ScheduleNotApplicable(f"v7 gives each warpgroup 64 rows: block_m={block_m} is not a multiple of 64")
    if block_n % SWIZZLE_ROW or block_n > 256 or chunk_k % SWIZZLE_ROW:
        raise ScheduleNotApplicable(f"v7 needs block_n (at most 256) and chunk_k in whole 64-element swizzled "
                                    f"rows: block_n={block_n}, chunk_k={chunk_k}")
    if block_m * block_n >= REGISTERS_PER_BLOCK:
        raise ScheduleNotApplicable(f"v7's {block_m}x{block_n} fp32 accumulators alone would fill a block's "
                                    f"{REGISTERS_PER_BLOCK} registers")
    if stages < 3:
        raise ScheduleNotApplicable(f"v7 needs stages >= 3 (a chunk multiplied, one in flight, one loading), "
                                    f"not {stages}")
    shared_bytes = stages * (block_m + block_n) * chunk_k * 2
    if shared_bytes > HOPPER_SHARED_BYTES:
        raise ScheduleNotApplicable(f"v7 with these tiles needs {shared_bytes} bytes of shared memory; "
                                    f"a Hopper block has at most {HOPPER_SHARED_BYTES}")
    warps = block_m // MMA
    padded = pad_to_tiles(sch, wl, (block_m, block_n, chunk_k))
    # Step 1. Blocks of block_m x block_n; a warp per 16 rows, all block_n columns; K in chunks.
    C = sch.get_sblock(wl.reduction_block)
    i, j, k = sch.get_loops(C)
    by, warp, rows = sch.split(i, [None, warps, MMA])
    bx, cols = sch.split(j, [None, block_n])
    ko, k_chunk = sch.split(k, [None, chunk_k])
    sch.reorder(by, bx, warp, ko, rows, cols, k_chunk)
    if m_tiles_first:
        require_grid_y("v7", "N/block_n", -(-wl.dims["N"] // block_n))
    sch.bind(by, "blockIdx.x" if m_tiles_first else "blockIdx.y")
    sch.bind(bx, "blockIdx.y" if m_tiles_first else "blockIdx.x")
    sch.bind(warp, "threadIdx.y")
    # Step 2. A and B tiles in shared memory, in swizzled atoms, by all threads: 16-byte
    # vectors, or the widest that ragged rows are made of.
    vector = operand_vector(wl, ATOM_ROWS)
    for operand, k_contiguous in ((0, True), (1, wl.layout == "nt")):
        _swizzled_fetch(sch, C, operand, ko, (warps, 32), k_contiguous, vector)
    # Step 3. Accumulators in registers for the whole K loop, where wgmma leaves them: each
    # lane holds 8 of every 16x16 tile (v6's fragment layout), so a thread's local buffer is
    # indexed by tile and register only; the loop that zeroes it runs by lane, and so does the
    # store, pairs of columns at a time, once every wgmma has finished (WAIT_FOR_WGMMA).
    accumulator = sch.cache_write(C, 0, "local")
    sch.reverse_compute_at(accumulator, warp)
    init = sch.decompose_reduction(C, ko)
    sch.transform_layout(accumulator, ("read", 0), _register_of)
    if padded:
        inline_padding(sch, wl)
    _bind_fragment_lanes(sch, init)
    tiles, pair = _bind_fragment_lanes(sch, accumulator)
    sch.vectorize(pair)  # element by element where the pair may cross C's edge
    sch.annotate(tiles, WAIT_FOR_WGMMA, True)
    # Step 4. The multiply: one warp's rows of the wgmma over a whole K chunk.
    sch.tensorize(rows, wgmma_intrinsic(wl.dtype, block_n, chunk_k, wl.layout == "nt", stages))
    # Step 5. cp.async pipeline: chunk ko + stages - 1 loads while chunk ko is multiplied. The
    # loads come after the multiply in the loop body: they refill the buffer of chunk ko - 1,
    # whose wgmmas the wait at the end of chunk ko's has seen finish.
    software_pipeline(sch, ko, stages, async_loads=True, loads_last=True)
