"""Every registered schedule, on default and ragged workloads: it builds (its CUDA compiles with
the local nvcc where there is one) or refuses with a reason. Then the IR features that prove
each rung's idea."""

import dataclasses
import re
import shutil

import pytest
import tvm
import tvm_ffi
from tvm.tirx import stmt as S

import kernel_facts as kf
import schedules
from schedules import ScheduleNotApplicable, Workload
from schedules.workloads import DTYPE_BYTES, FP8
from tuning import build, lowering

ONLY_K_RAGGED_CAST = Workload("gemm", (64, 64, 100), "bfloat16", "bfloat16", "nt")  # no padded C
FP8_GEMMS = [Workload("gemm", (256, 384, 512), FP8),  # whole tiles, bfloat16 C
             Workload("gemm", (1000, 136, 208), FP8, "float32"),  # ragged M and N
             Workload("gemm", (17, 250, 100), FP8, "float16"),  # 100-byte rows: staged for TMA
             Workload("gemm", (300, 520, 1000), FP8, layout="nt", scales="row")]  # rowwise
WORKLOADS = {
    "gemm": [
        Workload("gemm", (1024, 512, 2048)),
        Workload("gemm", (1023, 511, 2047)),  # ragged against every tile
        Workload("gemm", (100, 60, 72), "float16", "float16", "nt"),
        Workload("gemm", (64, 48, 40), "bfloat16"),
        Workload("gemm", (256, 256, 256), "float16"),  # whole tensor-core tiles
        Workload("gemm", (128, 128, 128), "bfloat16", layout="nt"),  # the nt-bf16 tutorial's case
        Workload("gemm", (257, 129, 65)),  # odd K and N: no row is whole 16-byte vectors
        Workload("gemm", (257, 129, 65), "bfloat16", layout="nt"),
        Workload("gemm", (1, 1, 1), "float16"),  # less than one of any tile or vector
        Workload("gemm", (1000, 136, 200), "bfloat16", layout="nt"),  # ragged M, whole vectors
        Workload("gemm", (17, 250, 66), "float16"),  # 4-byte rows of A and B
        ONLY_K_RAGGED_CAST,
        *FP8_GEMMS,
    ],
    "gemv": [
        Workload("gemv", (1024, 1024), "float16"),
        Workload("gemv", (1001, 1000), "float16"),  # ragged rows and K steps
        Workload("gemv", (1001, 1001), "float16"),  # K not a multiple of the vector
        Workload("gemv", (512, 1024), "float32"),
        # rows of K that are not whole 16-byte vectors, and fewer rows or K than one step's threads
        Workload("gemv", (1, 1), "float16"),
        Workload("gemv", (3, 7), "bfloat16"),
        Workload("gemv", (1001, 4097), "float16"),  # odd K: single elements
        Workload("gemv", (100, 4092), "float16"),  # K = 4 (mod 8): 8-byte vectors
        Workload("gemv", (257, 13), "bfloat16"),
        Workload("gemv", (31, 1001), "float32"),
        Workload("gemv", (33, 1002), "float32"),  # K = 2 (mod 4): 8-byte vectors
    ],
    "batched_gemv": [
        Workload("batched_gemv", (4, 7168, 2048), "float16"),
        Workload("batched_gemv", (3, 1001, 1000), "float16"),
        Workload("batched_gemv", (3, 5, 4095), "float16"),
        Workload("batched_gemv", (2, 33, 1002), "bfloat16"),  # K = 2 (mod 8): 4-byte vectors
    ],
}
NVFP4 = [Workload("gemv", (1024, 2048), "nvfp4"),
         Workload("gemv", (33, 1008), "nvfp4"),  # K an odd number of 16s: 8-byte rows of codes
         Workload("batched_gemv", (4, 7168, 2048), "nvfp4"),
         Workload("batched_gemv", (3, 1001, 48), "nvfp4")]  # odd L and N, K of three blocks
for nvfp4_workload in NVFP4:
    WORKLOADS[nvfp4_workload.op].append(nvfp4_workload)
NOT_NVFP4 = "{name} takes nvfp4 inputs, not {dtype}"
ODD = ("gemm 257x129x65 float32 nn", "gemm 257x129x65 bfloat16->float32 nt",
       "gemm 257x129x66 float16->float32 nt")  # the last one: the GPU tier's
FP32_ONLY = "v5t copies A element by element with cp.async, which moves 4 bytes at least"


def skinny_refusal(wl: Workload) -> str:
    """What skinny says of the tiers' shared GEMMs, none of which it takes: more than 16 rows
    of A, or B stored K x N."""
    if wl.dims["M"] > 16:
        return f"skinny takes at most 16 rows of A (each thread keeps a sum for each), not M = {wl.dims['M']}"
    return f"skinny reads B's rows of K as a GEMV does: layout nt, not {wl.layout}"


# What each rung declines, pinned per (rung, workload) on this file's and the GPU tier's
# workloads, with the reason it must give: every pair not named here must build.
REFUSED = {
    **{(rung, f"gemm {shape} float32 nn"): f"{rung} multiplies float16 or bfloat16 on tensor cores"
       for rung in ("v6", "v7") for shape in ("1024x512x2048", "1023x511x2047", "257x129x65")},
    **{("v8", f"gemm {shape} float32 nn"): f"v8 multiplies float16, bfloat16 or {FP8} on tensor cores"
       for shape in ("1024x512x2048", "1023x511x2047", "257x129x65")},
    **{(rung, wl.label()): f"{rung} multiplies float16 or bfloat16 on tensor cores, not {FP8}"
       for rung in ("v6", "v7") for wl in FP8_GEMMS},
    **{("v5t", wl.label()): FP32_ONLY for wl in (*FP8_GEMMS, ONLY_K_RAGGED_CAST)},
    **{(rung, ONLY_K_RAGGED_CAST.label()): f"{rung} writes the float32 accumulators" for rung in ("v6", "v7")},
    **{("v5t", label): FP32_ONLY for label in ODD[1:]},
    **{(name, wl.label()): NOT_NVFP4.format(name=name, dtype=wl.dtype)
       for name in ("staged", "pipelined", "bitdecode", "dp4a") for op in ("gemv", "batched_gemv")
       for wl in WORKLOADS[op] if not wl.is_nvfp4},
    **{("rowalign", wl.label()): "rowalign takes float32 or float16 or bfloat16 inputs, not nvfp4"
       for wl in NVFP4},
    **{(rung, f"gemm {shape} float16 nt"): f"{rung} writes the float32 accumulators"
       for rung in ("v6", "v7") for shape in ("100x60x72", "200x136x264")},
    **{("v5t", label): FP32_ONLY for label in (
        "gemm 100x60x72 float16 nt", "gemm 1x1x1 float16->float32 nn",
        "gemm 1000x136x200 bfloat16->float32 nt", "gemm 17x250x66 float16->float32 nn",
        "gemm 256x256x100 float16->float32 nn",
        "gemm 64x48x40 bfloat16->float32 nn",
        "gemm 256x256x256 float16->float32 nn", "gemm 128x128x128 bfloat16->float32 nt",
        "gemm 200x136x264 float16 nt", "gemm 200x136x264 bfloat16->float32 nt",
        "gemm 256x384x512 float16->float32 nn", "gemm 384x256x256 bfloat16->float32 nn",
        "gemm 256x256x768 float16->float32 nt")},
    **{("skinny", wl.label()): skinny_refusal(wl) for wl in WORKLOADS["gemm"]},
}
needs_nvcc = pytest.mark.skipif(not shutil.which("nvcc"),
                                reason="nvcc is not on PATH: the generated CUDA is not compiled")
RUNGS = [(e.name, wl) for op, wls in WORKLOADS.items() for e in schedules.entries(op)
         if not e.baseline for wl in wls]


def test_registry_lists_the_ladders_in_order():
    assert schedules.names("gemm")[:12] == ["naive", "v1", "v2", "v3", "v4", "v5", "v5p", "v5k", "v5t",
                                            "v6", "v7", "v8"]
    assert schedules.names("gemv")[:6] == [
        "naive", "splitk", "splitk_vec", "allreduce", "multirow", "blockreduce"]
    assert schedules.names("batched_gemv") == ["launches"] + schedules.names("gemv")
    for op in WORKLOADS:
        assert schedules.names(op)[-1] == "dlight" and schedules.get(op, "dlight").baseline


def test_unknown_schedule_names_the_valid_ones():
    with pytest.raises(schedules.UnknownSchedule, match="unknown schedule 'v9' for gemm; valid: naive, v1"):
        schedules.get("gemm", "v9")


def test_every_rung_documents_itself_and_its_knobs():
    for op in WORKLOADS:
        for entry in schedules.entries(op):
            assert entry.summary, f"{op}/{entry.name} has no docstring"
    assert schedules.get("gemm", "v3").defaults == {"tile_x": 16, "tile_y": 16, "tile_k": 8}


def test_unknown_parameter_is_refused(target):
    with pytest.raises(schedules.UsageError, match="v3 has no knob 'tile_q'"):
        schedules.get("gemm", "v3").apply(Workload("gemm", (64, 64, 64)), target, tile_q=3)


@pytest.mark.parametrize("name, wl", RUNGS, ids=[f"{wl.op}-{n}-{wl.label().split()[1]}-{wl.dtype}" for n, wl in RUNGS])
def test_rung_builds_or_refuses_with_its_pinned_reason(name, wl, compiled):
    reason = REFUSED.get((name, wl.label()))
    if reason:
        with pytest.raises(ScheduleNotApplicable, match=re.escape(reason)):
            compiled(name, wl)
        return
    _, source, summary = compiled(name, wl)
    sliced = schedules.get(wl.op, name).defaults_for(wl).get("k_slices", 1) > 1
    assert "__global__" in source and summary.kernels == (2 if sliced else 1)  # + the sum


BUILT = [(name, wl) for name, wl in RUNGS if (name, wl.label()) not in REFUSED]


@needs_nvcc
@pytest.mark.parametrize("name, wl", BUILT, ids=[f"{wl.op}-{n}-{wl.label().split()[1]}-{wl.dtype}" for n, wl in BUILT])
def test_nvcc_accepts_every_rungs_cuda(name, wl, compiled, nvcc_resources):
    _, source, _ = compiled(name, wl)
    assert nvcc_resources(source, "sm_90")


# The shapes each rung is built for: there, no register spills and no stack frame.
INTENDED = [(name, wl) for name in ("naive", "v1", "v2", "v3", "v4", "v5", "v5p", "v5k", "v5t")
            for wl in (WORKLOADS["gemm"][0], Workload("gemm", (4096, 4096, 4096)))]
INTENDED += [(name, Workload("gemm", (4096, 4096, 4096), dt, layout=lay)) for name in ("v6", "v7", "v8")
             for dt in ("float16", "bfloat16") for lay in ("nn", "nt")]
INTENDED += [("v8", Workload("gemm", (4096, 4096, 4096), FP8))]
INTENDED += [("skinny", Workload("gemm", shape, dt, dt, "nt")) for shape, dt in (
    ((7, 5120, 5120), "bfloat16"), ((16, 4096, 4096), "float16"), ((16, 128256, 2048), "bfloat16"),
    ((16, 4096, 4096), "float32"))]
INTENDED += [(e.name, wl) for op in ("gemv", "batched_gemv") for e in schedules.entries(op)
             if not e.baseline for wl in (WORKLOADS[op][0], NVFP4[0 if op == "gemv" else 2])
             if (e.name, wl.label()) not in REFUSED
             and not (e.name == "multirow" and wl.is_nvfp4)]  # 4 rows of 32 codes: a stack array


@needs_nvcc
@pytest.mark.parametrize("name, wl", INTENDED, ids=[f"{n}-{wl.label().replace(' ', '-')}" for n, wl in INTENDED])
def test_no_spills_on_the_shapes_a_rung_is_built_for(name, wl, compiled, nvcc_resources):
    _, source, _ = compiled(name, wl)
    for kernel, usage in nvcc_resources(source, "sm_90").items():
        assert usage.get("spill_stores", 0) == 0 and usage.get("stack_bytes", 0) == 0, (kernel, usage)
        assert not usage["wgmma_serialized"], (kernel, usage)


@pytest.mark.parametrize("wl", [WORKLOADS["gemm"][0], WORKLOADS["gemv"][0]], ids=["gemm", "gemv"])
def test_dlight_baseline_builds(wl, compiled, nvcc_resources):
    _, source, _ = compiled("dlight", wl)
    if shutil.which("nvcc"):
        assert nvcc_resources(source, "sm_90")


# -- the GEMM seed ladder: the seed's launch dimensions, shared tiles and K split --------------

SEED = Workload("gemm", (1024, 512, 2048))


def test_naive_is_one_thread_per_block(compiled):
    ir, source, s = compiled("naive", SEED)
    assert (s.grid, s.block) == ({"blockIdx.y": 1024, "blockIdx.x": 512}, {})
    assert s.shared_bytes == 0 and s.syncthreads == 0
    assert "for k in range(2048)" in ir


def test_v1_tiles_rows_onto_32_threads(compiled):
    _, _, s = compiled("v1", SEED)
    assert s.grid == {"blockIdx.x": 32, "blockIdx.y": 512} and s.block == {"threadIdx.x": 32}


def test_v2_uses_a_32x32_thread_tile(compiled):
    _, _, s = compiled("v2", SEED)
    assert s.grid == {"blockIdx.x": 32, "blockIdx.y": 16}
    assert s.block == {"threadIdx.x": 32, "threadIdx.y": 32} and s.shared_bytes == 0


def test_v3_stages_seed_sized_tiles_in_shared_memory(compiled):
    ir, source, s = compiled("v3", SEED)
    assert s.grid == {"blockIdx.x": 64, "blockIdx.y": 32}
    assert s.block == {"threadIdx.x": 16, "threadIdx.y": 16}
    assert "A_shared = T.alloc_shared((128,))" in ir and "B_shared = T.alloc_shared((128,))" in ir
    assert s.shared_bytes == 2 * 128 * 4
    assert "for k_0 in range(256)" in ir and "for k_1 in range(8)" in ir  # K split by 8
    assert s.syncthreads == 2 and s.loop_depth == 2
    assert "if threadIdx_y < 8:" in ir and "if threadIdx_x < 8:" in ir  # the seed's nparts loads


def test_ragged_gemm_is_predicated(compiled):
    ir, _, _ = compiled("v3", WORKLOADS["gemm"][1])
    assert "< 1023" in ir and "< 511" in ir and "< 2047" in ir


def test_cast_output_keeps_the_accumulator_in_a_register(compiled):
    ir, source, _ = compiled("v3", WORKLOADS["gemm"][2])
    assert "C_acc_local = T.alloc_local((1,))" in ir and "(half)" in source


# -- the GEMV ladder: each rung's idea in its IR and CUDA ---------------------------------------

GEMV = Workload("gemv", (1024, 1024), "float16")


def test_gemv_naive_is_one_thread_per_row(compiled):
    ir, source, s = compiled("naive", GEMV)
    assert s.block == {"threadIdx.x": 128} and s.grid == {"blockIdx.x": 8}
    assert "for k in range(1024)" in ir and s.shared_bytes == 0


def test_splitk_reduces_partials_through_shared_memory(compiled):
    ir, source, s = compiled("splitk", GEMV)
    assert s.block == {"threadIdx.x": 2, "threadIdx.y": 32}
    assert "red_buf0" in source and "__shared__" in source and s.syncthreads > 0
    assert "uint4" not in source and "__shfl" not in source


def test_splitk_vec_loads_16_bytes_at_a_time(compiled):
    _, source, _ = compiled("splitk_vec", GEMV)
    assert "*(uint4*)(B_local_ptr + 0) = *(uint4*)(B_ptr" in source
    assert "*(uint4*)(x_local_ptr + 0) = *(uint4*)(x_ptr" in source


def test_allreduce_uses_warp_shuffles_and_no_shared_memory(compiled):
    ir, source, s = compiled("allreduce", GEMV)
    assert "tvm_warp_shuffle_down" in ir and "__shfl_down_sync" in source
    assert s.shared_bytes == 0 and s.syncthreads == 0 and "uint4" in source


def test_multirow_reuses_each_x_vector_for_several_rows(compiled):
    _, source, _ = compiled("multirow", GEMV)
    assert "float y_acc_rf_local_ptr[4]" in source  # 4 row accumulators per thread
    assert source.count("*(uint4*)(x_ptr") == 1 and "half B_local_ptr[32]" in source
    assert "__shfl_down_sync" in source


def test_blockreduce_reduces_across_warps_through_a_little_shared_memory(compiled):
    _, source, s = compiled("blockreduce", GEMV)
    assert s.block == {"threadIdx.x": 128, "threadIdx.y": 1} and s.grid == {"blockIdx.x": 1024}
    assert "__shfl_down_sync" in source and "red_buf_staging_ptr[4]" in source  # 4 warps
    assert s.syncthreads >= 1 and s.shared_bytes <= 64


def test_batched_gemv_is_one_launch_over_all_batches(compiled):
    for name in ("naive", "allreduce", "multirow"):
        _, _, s = compiled(name, WORKLOADS["batched_gemv"][0])
        assert s.kernels == 1 and s.grid["blockIdx.y"] == 4


SKINNY_WORKLOADS = [
    Workload("gemm", (7, 5120, 5120), "bfloat16", "bfloat16", "nt"),  # a decode batch's layer
    Workload("gemm", (16, 129, 65), "bfloat16", layout="nt"),  # odd K: single elements
    Workload("gemm", (3, 333, 1002), "float32", layout="nt"),  # K = 2 (mod 4): 8-byte vectors
    Workload("gemm", (1, 1, 1), "float16", "float16", "nt"),
    Workload("gemm", (5, 1000, 2048), FP8, "bfloat16", "nt", "row"),  # scaled in its epilogue
]


@pytest.mark.parametrize("wl", SKINNY_WORKLOADS, ids=lambda wl: wl.label())
def test_skinny_builds_on_few_rows_of_any_shape(wl, compiled, nvcc_resources):
    _, source, s = compiled("skinny", wl)
    assert s.kernels == 1 and "__shfl_down_sync" in source
    assert s.shared_bytes < 1024  # no tiles of A or W: at most the partials of a row's warps
    if shutil.which("nvcc"):
        assert nvcc_resources(source, "sm_90")


def test_skinny_reads_w_once_for_every_row_of_a(compiled):
    """7 rows of A by 2 of W a thread (its heuristic at N = 5120): 14 sums; each step one
    16-byte vector of each row of A and of W, in loops over the rows; a warp per 2 rows of W."""
    _, source, s = compiled("skinny", SKINNY_WORKLOADS[0])
    assert "float C_acc_rf_local_ptr[14]" in source
    assert "nv_bfloat16 A_local_ptr[56]" in source and "nv_bfloat16 B_local_ptr[16]" in source
    assert source.count("*(uint4*)(A_ptr") == 1 and source.count("*(uint4*)(B_ptr") == 1
    assert s.block == {"threadIdx.x": 32, "threadIdx.y": 4} and s.grid == {"blockIdx.x": 640}


VECTOR_RUNGS = ("splitk_vec", "allreduce", "multirow", "blockreduce")


def _b_loads(source: str) -> list[tuple[str, str]]:
    """Each load of B in a CUDA source, what it reads (the right-hand side of its assignment)
    with the line before it: (line before, load)."""
    lines = [line.strip() for line in source.splitlines()]
    return [(lines[i - 1], line.split(" = ", 1)[1]) for i, line in enumerate(lines)
            if re.search(r" = .*\bB_ptr\b", line)]


@pytest.mark.parametrize("rung", VECTOR_RUNGS)
@pytest.mark.parametrize("k, load, width", [
    (4096, "*(uint4*)(B_ptr + ", 8), (4094, "*(half2*)(B_ptr + ", 2), (4095, "B_ptr[", 1)],
    ids=["K4096-uint4", "K4094-half2", "K4095-half"])
def test_vector_rungs_load_ragged_k_in_the_widest_vectors_it_is_made_of(rung, k, load, width, compiled):
    """Rows of K=4096 halves are whole 16-byte vectors, of K=4094 whole pairs, of K=4095 only
    whole halves: a thread's 8 halves of a step are then 4 or 8 loads, in each of which the K
    threads' vectors lie side by side (the loads a thread makes in one step are the threads'
    vectors apart), and the loads of the last, ragged step are predicated on K."""
    _, source, _ = compiled(rung, Workload("gemv", (4096, k), "float16"))
    threads = schedules.get("gemv", rung).defaults["reduce_threads"]
    k_thread = "((int)threadIdx.y)" if rung == "splitk_vec" else "((int)threadIdx.x)"
    lane = f"({k_thread} * {width})" if width > 1 else k_thread
    loads = _b_loads(source)
    assert loads and all(line.startswith(load) for _, line in loads)
    assert all(re.search(rf"\+ {re.escape(lane)}\)*[\];]", line) for _, line in loads)
    if k == 4096:
        assert all("k_1" not in line and not before.startswith("if") for before, line in loads)
    else:
        assert all(f"(k_1 * {threads * width})) + {lane}" in line for _, line in loads)
        assert all(re.fullmatch(rf"if \(.*\) < {k // width}\) {{", before) for before, _ in loads)


@pytest.mark.parametrize("rung", VECTOR_RUNGS)
def test_vector_rungs_take_tile_k_in_whole_16_byte_vectors_whatever_k(rung, compiled, target):
    with pytest.raises(ScheduleNotApplicable, match="tile_k=12 is not whole 16-byte vectors of float16"):
        schedules.get("gemv", rung).apply(Workload("gemv", (64, 4095), "float16"), target, tile_k=12)
    _, source, _ = compiled(rung, Workload("gemv", (64, 4095), "float16"), tile_k=16)
    assert "for (int k_1 = 0; k_1 < 16; ++k_1)" in source  # 16 single halves a step


# The vector rungs on aligned K, with their default knobs: the structural hashes of their
# scheduled modules, as they were when K had to be whole 16-byte vectors.
ALIGNED = [Workload("gemv", (1024, 1024), "float16"), Workload("gemv", (7168, 16384), "float16"),
           Workload("batched_gemv", (4, 7168, 2048), "float16"),
           Workload("batched_gemv", (8, 4096, 7168), "float16"), Workload("gemv", (512, 1024), "float32")]
ALIGNED_HASHES = {
    "splitk_vec": (12792762440816363435, 3687476221869049991, 4537135289016968145,
                   6868119624222019236, 16601576696322885117),
    "allreduce": (18348152605386326813, 14012937058270918274, 7476366836223652924,
                  4831258250033738916, 15004889675920021257),
    "multirow": (2142366572397042817, 13827223855945827247, 8188666909371386013,
                 8095709877033485737, 2470803660941147112),
    "blockreduce": (7750549989164795843, 3155037860499576029, 3440640897121783909,
                    14103026180388062834, 15800769240586442982),
}


@pytest.mark.parametrize("rung", VECTOR_RUNGS)
def test_vector_rungs_schedule_aligned_k_as_they_did_before_ragged_k(rung, target):
    hashes = tuple(tvm_ffi.structural_hash(schedules.get(wl.op, rung).apply(wl, target))
                   for wl in ALIGNED)
    assert hashes == ALIGNED_HASHES[rung], (
        f"{rung} schedules aligned K differently now; if that is intended, pin {hashes}")


def _loads_not_proven_in_bounds(kernel, names: tuple[str, ...], vector: int = 1,
                                batches: int = 1) -> list:
    """The loads of the buffers `names` in a lowered kernel that the analyzer cannot prove in
    bounds, given the launch extents, loop ranges, bound values and if-guards around them (the
    statements' and the `if_then_else` expressions'), and, for a kernel launched once per batch
    by a host loop, its integer argument (the batch) below `batches`. With `vector`, the bound
    of each buffer is rounded up to whole vectors of that many elements: a load may read the
    rest of the aligned vector that holds a buffer's last element (which cannot fault), never
    past it."""
    analyzer = tvm.sym.Analyzer()
    unproven = []
    for param in kernel.params:
        if str(param.ty) == "int32":
            analyzer.bind(param, tvm.ir.Range.from_min_extent(0, batches))

    def in_bounds(load) -> bool:
        (index,) = load.indices
        first, last = index, index
        if isinstance(index, tvm.tirx.Ramp):
            first, last = index.base, index.base + index.stride * (index.lanes - 1)
        bound = -(-load.source.shape[0] // vector) * vector
        return all(analyzer.can_prove(fact, tvm.sym.ProofStrength.SYMBOLIC_BOUND)
                   for fact in (first >= 0, last < bound))

    def check_loads(node):
        """The loads of `node` outside any if_then_else, then those in each one's branches
        under its condition."""
        guarded = lowering.find(node, tvm.ir.Call, outermost=True)
        guarded = [call for call in guarded if call.op.name == "prim.if_then_else"]
        inside = [load for call in guarded for load in lowering.find(call, tvm.ir.TensorLoad)]
        unproven.extend(load for load in lowering.find(node, tvm.ir.TensorLoad)
                        if load.source.name in names and not in_bounds(load)
                        and not any(load.same_as(guarded_load) for guarded_load in inside))
        for call in guarded:
            condition, then_value, else_value = call.args
            check_loads(condition)
            with analyzer.constraint_scope(condition):
                check_loads(then_value)
            with analyzer.constraint_scope(tvm.tirx.Not(condition)):
                check_loads(else_value)

    def visit(stmt):
        if isinstance(stmt, S.SeqStmt):
            for inner in stmt.seq:
                visit(inner)
        elif isinstance(stmt, S.IfThenElse):
            with analyzer.constraint_scope(stmt.condition):
                visit(stmt.then_case)
            if stmt.else_case is not None:
                with analyzer.constraint_scope(tvm.tirx.Not(stmt.condition)):
                    visit(stmt.else_case)
        elif isinstance(stmt, S.Bind):
            analyzer.bind(stmt.var, stmt.value)
        elif isinstance(stmt, S.For):
            analyzer.bind(stmt.loop_var, tvm.ir.Range.from_min_extent(stmt.min, stmt.extent))
            visit(stmt.body)
        elif isinstance(stmt, S.AttrStmt) and stmt.attr_key == "thread_extent":
            analyzer.bind(stmt.node.var, tvm.ir.Range.from_min_extent(0, stmt.value))
            visit(stmt.body)
        elif hasattr(stmt, "body"):
            visit(stmt.body)
        else:
            check_loads(stmt)

    visit(kernel.body)
    return unproven


GEMVS = [(name, wl) for name, wl in BUILT if wl.op != "gemm"]


@pytest.mark.parametrize("name, wl", GEMVS, ids=[f"{n}-{wl.label().replace(' ', '-')}" for n, wl in GEMVS])
def test_gemv_loads_of_b_and_x_stay_in_bounds(name, wl, target):
    """rowalign reads B as B_flat in aligned 16-byte vectors: up to the end of the one that holds
    B's last element."""
    lowered = build.lower(schedules.get(wl.op, name).apply(wl, target), target)
    for _, kernel in lowered.functions_items():
        assert not _loads_not_proven_in_bounds(kernel, ("B", "x"), batches=wl.dims.get("L", 1))
        if name in ("bitdecode", "dp4a"):  # words and scales, read through aliases of B and x
            assert not _loads_not_proven_in_bounds(kernel, ("B_words", "x_words", "B_scales",
                                                            "x_scales"))
        if name == "rowalign":
            assert not _loads_not_proven_in_bounds(kernel, ("B_flat",), 16 // DTYPE_BYTES[wl.dtype])


def test_in_bounds_check_flags_loads_without_their_guards(target):
    """The check above can fail: strip a ragged kernel's guards and its loads are flagged."""
    wl = Workload("gemv", (257, 13), "bfloat16")
    lowered = build.lower(schedules.get("gemv", "multirow").apply(wl, target), target)
    for _, kernel in lowered.functions_items():
        assert not _loads_not_proven_in_bounds(kernel, ("B", "x"))
        body = tvm_ffi.structural_map(kernel.body, (S.IfThenElse, lambda stmt: stmt.then_case))
        unproven = _loads_not_proven_in_bounds(kernel.with_body(body), ("B", "x"))
        assert {load.source.name for load in unproven} == {"B", "x"}


def test_in_bounds_check_flags_loads_whose_if_then_else_guard_is_gone(target):
    """... and strip the if_then_else guards of v4's padded tiles: A's and B's loads are
    flagged; rowalign's vectors of B_flat are proven within whole vectors, and flagged against
    B's last element (the last vector's tail)."""
    lowered = build.lower(schedules.get("gemm", "v4").apply(Workload("gemm", (257, 129, 65)), target),
                          target)
    for _, kernel in lowered.functions_items():
        assert not _loads_not_proven_in_bounds(kernel, ("A", "B"))
        unguarded = tvm_ffi.structural_map(kernel.body, (tvm.ir.Call, lambda call: call.args[1]
                                           if call.op.name == "prim.if_then_else" else call))
        unproven = _loads_not_proven_in_bounds(kernel.with_body(unguarded), ("A", "B"))
        assert {load.source.name for load in unproven} == {"A", "B"}
    wl = Workload("gemv", (257, 13), "bfloat16")
    lowered = build.lower(schedules.get("gemv", "rowalign").apply(wl, target), target)
    for _, kernel in lowered.functions_items():
        assert not _loads_not_proven_in_bounds(kernel, ("B_flat",), 8)
        assert _loads_not_proven_in_bounds(kernel, ("B_flat",), 1)


ROWALIGN_HELPER_CHECK = r"""
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <cuda_runtime.h>
HELPERS
// Every window of x against the bytes it should hold, x's first and last vectors next to pages
// that cannot be read (a load outside them faults); every mask of rowalign_keep.
int main() {
  const int page = getpagesize();
  unsigned char* pages = (unsigned char*)mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE,
                                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  unsigned char* data = pages + page;
  mprotect(pages, page, PROT_NONE);
  mprotect(pages + 2 * page, page, PROT_NONE);
  int wrong = 0, checked = 0;
  for (int size = 2; size <= 4; size += 2)  // 2-byte and 4-byte elements
    for (int a = 0; a < 16; a += size)
      for (int b = 0; b < 16; b += size) {
        int from = a, to = page - b;  // x: bytes [from, to) of data; 0xff around it
        for (int i = 0; i < page; ++i) data[i] = i >= from && i < to ? (unsigned char)(7 * i + 1) : 0xff;
        for (int pos = from - 32; pos <= to + 16; pos += size, ++checked) {
          uint4 window = rowalign_x_window<uint4>(data, from, to, pos);
          unsigned char got[16], want[16];
          memcpy(got, &window, 16);
          for (int j = 0; j < 16; ++j) want[j] = pos + j >= from && pos + j < to ? data[pos + j] : 0;
          wrong += memcmp(got, want, 16) != 0;
        }
      }
  for (int from = -20; from <= 36; from += 2)
    for (int to = from; to <= 52; to += 2, ++checked) {
      uint4 value = make_uint4(0x04030201u, 0x08070605u, 0x0c0b0a09u, 0x100f0e0du);
      uint4 kept = rowalign_keep(value, from, to);
      unsigned char got[16], all[16];
      memcpy(got, &kept, 16);
      memcpy(all, &value, 16);
      for (int j = 0; j < 16; ++j) wrong += got[j] != (j >= from && j < to ? all[j] : 0);
    }
  printf("%d checked, %d wrong\n", checked, wrong);
  return wrong != 0;
}
"""


@needs_nvcc
def test_rowalign_helpers_give_the_right_bytes_and_read_only_inside_x(tmp_path):
    """rowalign's CUDA helpers, compiled for the host by nvcc: every 16-byte window of x at every
    position around it (2- and 4-byte elements, x starting and ending anywhere in a vector)
    holds x's bytes and zeros outside, with no read past x's vectors (guard pages); every
    mask keeps exactly a row's bytes. A planted bug in the window is caught."""
    import subprocess

    from schedules.gemv import ROW_ALIGNED

    def run(helpers: str) -> subprocess.CompletedProcess:
        source = tmp_path / "check.cu"
        source.write_text(ROWALIGN_HELPER_CHECK.replace("HELPERS", helpers))
        subprocess.run(["nvcc", "-o", str(tmp_path / "check"), str(source)], check=True,
                       capture_output=True)
        return subprocess.run([str(tmp_path / "check")], capture_output=True, text=True)

    result = run(ROW_ALIGNED)
    assert result.returncode == 0 and result.stdout.endswith(" 0 wrong\n"), result.stdout
    planted = ROW_ALIGNED.replace("int first = shift / 4,", "int first = shift / 4 % 3,")
    assert run(planted).returncode == 1


def test_rowalign_is_blockreduce_on_k_of_whole_vectors(target):
    """Where every row starts on a 16-byte boundary, rowalign is the workload's own definition
    scheduled as blockreduce: no helpers, nothing to pay for the ragged case."""
    for wl in (Workload("batched_gemv", (2, 64, 4096), "bfloat16"), Workload("gemv", (9, 12), "float32")):
        tvm.ir.assert_structural_equal(schedules.get(wl.op, "rowalign").apply(wl, target),
                                       schedules.get(wl.op, "blockreduce").apply(wl, target))


@pytest.mark.parametrize("k", [4095, 4094, 5])
def test_rowalign_loads_b_and_x_in_aligned_16_byte_vectors_on_any_k(k, compiled):
    """On a ragged K every load of B is one uint4 at a whole vector index, clamped to B's last
    vector where a row's walk can pass it, its neighbours' bytes masked; x comes through the
    window helper: no element-wise loads of either (blockreduce loads single halves)."""
    _, source, _ = compiled("rowalign", Workload("gemv", (4096, k), "float16"))
    kernel = source.split("main_kernel(")[-1].split("{", 1)[1]
    loads = [line.strip() for line in kernel.splitlines() if "B_flat_ptr" in line]
    assert loads and all(re.fullmatch(
        rf"\*\(uint4\*\)\(vectors_local_ptr \+ 0\) = rowalign_keep\(\*\(uint4\*\)"
        rf"\(B_flat_ptr \+ \(min\(.*, {(4096 * k - 1) // 8}\) \* 8\)\), .*\);", load)
        for load in loads), loads
    assert "= rowalign_x_window<uint4>(x_ptr, 0, " in kernel and "x_ptr[" not in kernel


# -- past the seed: v4, v5, v5p, v5k, v5t, v6 -------------------------------------------------------------


def test_v4_has_coalesced_threads_and_a_register_tile(compiled, lowered):
    _, _, s = compiled("v4", SEED)
    kernel = kf.kernel(lowered("v4", SEED))
    assert kf.buffers(kernel)["C_local"] == ("local", (16,), "float32")  # 4x4 outputs per thread
    assert s.block == {"threadIdx.y": 16, "threadIdx.x": 16} and s.grid == {"blockIdx.y": 16, "blockIdx.x": 8}
    # threadIdx.x runs along N: a warp writes consecutive columns of C, 4 per thread, from the
    # register tile.
    (store,) = kf.stores_to(kernel, "C")
    assert store.value.source.name == "C_local"
    assert kf.stride(kernel, store.indices[0], "threadIdx.x") == 4
    assert kf.stride(kernel, store.indices[0], "ax1") == 1
    assert s.shared_bytes == 2 * 64 * 16 * 4


def test_v5_loads_vectors_into_padded_rows_without_a_pipeline(compiled, lowered):
    _, _, s = compiled("v5", SEED)  # 64x64 block tile, 8x4 per thread, K tiles of 32
    kernel = kf.kernel(lowered("v5", SEED))
    assert kf.buffers(kernel)["A_shared.dyn_local"] == ("local", (32,), "float32")  # 8 rows x 4 k
    # global->shared and shared->registers in 16-byte vectors
    for buffer in ("A_shared.dyn", "B_shared.dyn", "A_shared.dyn_local", "B_shared.dyn_local"):
        stores = kf.stores_to(kernel, buffer)
        assert stores and {kf.lanes(st) for st in stores} == {4}, buffer
    assert {st.value.source.name for st in kf.stores_to(kernel, "A_shared.dyn")} == {"A"}
    assert not kf.copies(kernel) and s.syncthreads == 2  # synchronous loads, v4's two barriers
    # A's 32-float rows padded to 36 (the next row starts 4 banks on), B's 64 to 68: one stage
    assert s.shared_bytes == (64 * 36 + 32 * 68) * 4


def test_v5_unrolls_a_tiles_k_steps_and_writes_c_in_vectors(lowered):
    kernel = kf.kernel(lowered("v5", SEED))  # K tiles of 32 = 8 steps of 4
    # The step loop is gone: 8 fragment loads of A's 8 rows, each a 16-byte vector.
    fragments = kf.stores_to(kernel, "A_shared.dyn_local")
    assert len(fragments) == 8 and {kf.lanes(st) for st in fragments} == {4}
    assert not kf.loop(kernel, "k_1")
    stores = kf.stores_to(kernel, "C")
    assert stores and {kf.lanes(st) for st in stores} == {4}  # no scalar stores into C


@pytest.mark.parametrize("rung, layout, thread_stride", [
    ("v5p", "nt", 36), ("v5p", "nn", 4), ("v5t", "nt", 4), ("v5t", "nn", 4)])
def test_b_fragments_are_16_byte_vectors_along_bs_shared_rows(rung, layout, thread_stride,
                                                               lowered):
    """B's shared rows run along N in nn and along K in nt: a thread reads its B fragments as
    16-byte vectors along them. In nt its columns lie one row of threads apart, so the 8 threads
    of a 16-byte load phase start a padded row (36 floats, 4 banks) apart and share no bank; in
    nn, each vector holds 4 of its columns, the next thread's 4 columns on. v5t stores B's tile
    transposed in nt (4 bytes a copy, as A's), so it reads B as in nn."""
    wl = Workload("gemm", (4096, 3072, 768), "float32", layout=layout)
    kernel = kf.kernel(lowered(rung, wl))
    fragments = kf.stores_to(kernel, "B_shared.dyn_local")
    assert fragments and {kf.lanes(st) for st in fragments} == {4}
    strides = {kf.stride(kernel, kf.first_lane(st.value.indices[0]), "threadIdx.x")
               for st in fragments}
    assert strides == {thread_stride}, strides
    b_copies = {int(c.args[4]) for c in kf.calls(kernel, "s_tir.cp_async_raw")
                if kf.pointers(c)[0] == "B_shared.dyn"}
    assert b_copies == ({4} if (rung, layout) == ("v5t", "nt") else {16}), b_copies


def test_v5p_pipelines_the_k_tiles_with_cp_async(compiled, lowered):
    _, _, s = compiled("v5p", SEED)  # v5's tiles, two stages
    kernel = kf.kernel(lowered("v5p", SEED))
    # A's and B's tiles by 16-byte cp.async (cg), waited for before they are read
    assert kf.copies(kernel) and set(kf.copies(kernel)) == {(16, False)}
    assert {p[0] for p in map(kf.pointers, kf.calls(kernel, "s_tir.cp_async_raw"))} == {
        "A_shared.dyn", "B_shared.dyn"}
    assert kf.attrs(kernel, "async_wait_inflight_count")
    # the first tile loads before the K loop, which then runs one tile short: the next tile
    # loads while this one is multiplied
    assert [int(f.extent) for f in kf.loop(kernel, "k_0")] == [2048 // 32 - 1]
    assert s.shared_bytes == 2 * (64 * 36 + 32 * 68) * 4  # two stages of padded A and B tiles
    # The last tile is multiplied after the loop (the pipeline's epilogue): 8 more fragment loads
    assert len(kf.stores_to(kernel, "A_shared.dyn_local")) == 2 * 8


def test_v5k_sums_float32_partials_in_a_second_kernel(compiled, lowered):
    _, _, s = compiled("v5k", SEED)  # 4 K slices
    assert s.kernels == 2 and s.grid == {"blockIdx.x": 8, "blockIdx.y": 16, "blockIdx.z": 4}
    kernels = kf.kernels(lowered("v5k", SEED))
    main, sum_kernel = kernels["main_kernel"], kernels["main_kernel_1"]
    # 4 slices x 1024 x 512 float32 partials, written by the first kernel, read by the second
    assert kf.declared(main)["C.rf"] == kf.declared(sum_kernel)["C.rf"] == (4 * 1024 * 512,)
    assert "C.rf_ptr" in kf.params_of(main) and kf.params_of(sum_kernel) == ["C_ptr", "C.rf_ptr"]
    # The second kernel: 4 outputs per thread, the 4 slices' partials read as 16-byte vectors
    # and summed in registers, C written as one 16-byte vector.
    partials = kf.loads_from(sum_kernel, "C.rf")
    assert partials and {str(load.ty) for load in partials} == {"float32x4"}
    assert [f.extent for f in kf.loop(sum_kernel, "k_0")] == [4]
    stores = kf.stores_to(sum_kernel, "C")
    assert stores and {kf.lanes(st) for st in stores} == {4}


@pytest.mark.parametrize("k, slices, slice_k", [(2048, 3, 704), (72, 4, 32), (264, 4, 96)])
def test_v5k_slices_are_whole_k_tiles_the_last_ones_shorter(k, slices, slice_k, compiled, lowered):
    """K need not be whole slices: each slice is whole K tiles of 32 and the last ones are cut
    short by K (slices of 704 K, the third ending at 2048; at K=72, the fourth slice is empty)."""
    wl = Workload("gemm", (256, 128, k))
    _, _, s = compiled("v5k", wl, k_slices=slices)
    assert s.kernels == 2 and s.grid["blockIdx.z"] == slices
    main = kf.kernels(lowered("v5k", wl, k_slices=slices))["main_kernel"]
    # a slice starts slice_k columns on in A's rows, slice_k rows of 128 on in B
    assert {slice_k, slice_k * 128} <= kf.multipliers(main, "blockIdx.z")


@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_v5k_atomic_sum_adds_partials_into_a_zeroed_c_without_a_partial_buffer(compiled, lowered,
                                                                              layout):
    """In nt too, where B's fragments run along K: a thread's columns stay 4 adjacent ones,
    which one vector atomic adds."""
    wl = dataclasses.replace(SEED, layout=layout)
    _, source, s = compiled("v5k", wl, atomic_sum=True)
    assert s.kernels == 2 and s.grid == {"blockIdx.x": 8, "blockIdx.y": 16, "blockIdx.z": 4}
    kernels = kf.kernels(lowered("v5k", wl, atomic_sum=True))
    zero, adds = kernels["main_kernel"], kernels["main_kernel_1"]
    # partials in registers: no partial buffer anywhere
    assert not [b for k in (zero, adds) for b in kf.declared(k) if b.startswith("C.rf")]
    assert kf.params_of(zero) == ["C_ptr"] and kf.params_of(adds) == ["A_ptr", "B_ptr", "C_ptr"]
    zeroes = kf.stores_to(zero, "C")
    assert zeroes and {kf.lanes(st) for st in zeroes} == {4}
    assert all(isinstance(st.value, tvm.tirx.Broadcast) and float(st.value.value) == 0 for st in zeroes)
    # 8 x 4 outputs per thread: one add of 4 consecutive floats per row, from the registers
    (rows,) = [f for f in kf.loop(adds, "ax0") if kf.calls(f, "ptx.red_vec_f32")]
    assert rows.extent == 8
    (add,) = kf.calls(rows, "ptx.red_vec_f32")
    assert {"global", "add", "v4", "f32"} <= set(kf.words(add)) and kf.pointers(add)[0] == "C"
    values = [a for a in add.args if isinstance(a, tvm.ir.TensorLoad)]
    assert [v.source.name for v in values] == ["C.rf_local"] * 4
    assert [kf.distance(values[0].indices[0], v.indices[0]) for v in values] == [0, 1, 2, 3]
    build.nvcc_resources(source, "sm_90")  # nvcc accepts the inline PTX


def _launch_tags(kernel) -> list[str]:
    """The launch tags (`tirx.kernel_launch_params`) of one lowered kernel."""
    return [str(tag) for tag in kernel.attrs["tirx.kernel_launch_params"]]


def test_overlap_zeroing_launches_the_adding_kernel_early_and_waits_before_its_adds(lowered):
    kernels = kf.kernels(lowered("v5k", SEED, atomic_sum=True))  # overlap: the default
    zero, adds = kernels["main_kernel"], kernels["main_kernel_1"]
    plain = kf.kernels(lowered("v5k", SEED, atomic_sum=True, overlap_zeroing=False))
    # The zeroing releases the main kernel before its stores; the main kernel's K loop does not
    # wait, and each add waits for the zeroing kernel to be done first.
    release = kf.at(zero, kf.called("ptx.griddepcontrol", "launch_dependents"))
    zeroes = kf.at(zero, lambda node: isinstance(node, S.BufferStore) and node.buffer.name == "C")
    assert len(release) == 1 and zeroes and release[0] < min(zeroes)
    (rows,) = [f for f in kf.loop(adds, "ax0") if kf.calls(f, "ptx.red_vec_f32")]
    assert kf.among(kf.calls(adds, "ptx.griddepcontrol"), kf.calls(rows, "ptx.griddepcontrol"))
    waits = kf.at(rows, kf.called("ptx.griddepcontrol", "wait"))
    assert len(waits) == 1 and waits[0] < min(kf.at(rows, kf.called("ptx.red_vec_f32")))
    # Only the kernel that waits is launched with programmatic dependent launch, and the tag
    # goes before the dynamic shared memory's, which TVM wants last.
    assert _launch_tags(adds)[-2:] == ["tirx.use_programtic_dependent_launch",
                                       "tirx.use_dyn_shared_memory"]
    assert "tirx.use_programtic_dependent_launch" not in _launch_tags(zero)
    for kernel in plain.values():
        assert not kf.calls(kernel, "ptx.griddepcontrol")
        assert "tirx.use_programtic_dependent_launch" not in _launch_tags(kernel)
    assert kf.calls(plain["main_kernel_1"], "ptx.red_vec_f32")


@pytest.mark.parametrize("wl, knobs, reason", [
    (SEED, {"k_slices": 1}, "atomic_sum adds the K slices' partials; set k_slices > 1"),
    (Workload("gemm", (1000, 512, 2048)), {}, "atomic adds take whole tiles: M=1000"),
    (Workload("gemm", (1024, 512, 2048), "float16", "float16"), {},
     "needs a float32 output, not float16"),
])
def test_v5k_atomic_sum_refusals(wl, knobs, reason, target):
    with pytest.raises(ScheduleNotApplicable, match=reason):
        schedules.get("gemm", "v5k").apply(wl, target, atomic_sum=True, **knobs)
    with pytest.raises(ScheduleNotApplicable, match="needs sm_90 or later, not sm_80"):
        schedules.get("gemm", "v5k").apply(SEED, build.cuda_target("sm_80"), atomic_sum=True)


def _k_tile_head(kernel) -> list[str]:
    """What the pipelined K loop does before a tile's first fragment load: barriers, cp.async
    waits (with the groups they leave in flight), global->shared copies and commits (a commit
    scope's group is committed after what it holds)."""
    (loop,) = kf.loop(kernel, "k_0")
    nodes = lowering.find(loop.body, (tvm.ir.Call, S.AttrStmt, S.BufferStore))
    commits = {}
    for at, node in enumerate(nodes):
        if isinstance(node, S.AttrStmt) and node.attr_key == "async_commit_queue_scope":
            end = at + 1 + len(lowering.find(node.body, (tvm.ir.Call, S.AttrStmt, S.BufferStore)))
            commits[end] = commits.get(end, 0) + 1
    events = []
    for at, node in enumerate(nodes):
        events += ["commit_group"] * commits.get(at, 0)
        if isinstance(node, S.BufferStore) and node.buffer.name.endswith("_local"):
            break  # the first fragment load
        if isinstance(node, S.AttrStmt) and node.attr_key == "async_wait_inflight_count":
            events.append(f"wait_group_{int(node.value)}")
        elif isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op):
            if kf.name(node) == "tvm_storage_sync":
                events.append("__syncthreads")
            elif kf.name(node) == "s_tir.cp_async_raw" and events[-1:] != ["cp_async"]:
                events.append("cp_async")
    return events


@pytest.mark.parametrize("name, stages", [("v5p", 2), ("v5p", 3), ("v5t", 2)])
def test_pipelined_k_loop_syncs_once_per_tile_after_its_wait(compiled, lowered, name, stages):
    _, _, single_s = compiled(name, SEED, stages=stages)  # single_barrier: the default
    _, _, double_s = compiled(name, SEED, stages=stages, single_barrier=False)
    single = kf.kernel(lowered(name, SEED, stages=stages))
    double = kf.kernel(lowered(name, SEED, stages=stages, single_barrier=False))
    # TVM's order: sync (the loads overwrite the tile before last), loads, commit, wait for this
    # tile, sync. One barrier per tile: wait (one group fewer in flight: this tile's loads are
    # not committed yet), sync, loads, commit.
    assert _k_tile_head(double) == ["__syncthreads", "cp_async", "commit_group",
                                    f"wait_group_{stages - 1}", "__syncthreads"]
    assert _k_tile_head(single) == [f"wait_group_{stages - 2}", "__syncthreads",
                                    "cp_async", "commit_group"]
    assert single_s.syncthreads == double_s.syncthreads - 1


def test_single_barrier_refuses_a_loop_that_is_not_an_async_pipeline(target):
    from tvm.s_tir import Schedule

    from schedules.common import SINGLE_BARRIER

    sch = Schedule(schedules.get("gemm", "v5").apply(SEED, target))
    k_tiles = next(loop for loop in sch.get_loops(sch.get_sblock("C_update"))
                   if sch.get(loop).loop_var.name == "k_0")
    sch.annotate(k_tiles, SINGLE_BARRIER, True)
    with pytest.raises(RuntimeError, match="loop k_0 is not a cp.async pipeline with its loads first"):
        build.lower(sch.mod, target)


@pytest.mark.parametrize("shape, lanes", [((257, 130, 66), 2), ((257, 129, 65), 1)])
def test_v5p_loads_ragged_rows_in_the_widest_vectors_they_are_made_of(shape, lanes, compiled, lowered):
    _, _, aligned_summary = compiled("v5p", SEED)
    ragged_wl = Workload("gemm", shape)
    _, _, summary = compiled("v5p", ragged_wl, block_m=64, block_n=64)
    aligned = kf.kernel(lowered("v5p", SEED))
    ragged = kf.kernel(lowered("v5p", ragged_wl, block_m=64, block_n=64))
    # rows of K=66 and N=130 are whole pairs, of K=65 only whole elements; shared rows stay padded
    # for the fragments' 16-byte reads, so the shared tiles are those of the aligned shape
    assert set(kf.copies(aligned)) == {(16, False)}
    # (padded to whole tiles: a ragged copy is predicated)
    assert kf.copies(ragged) and set(kf.copies(ragged)) == {(4 * lanes, True)}
    assert summary.shared_bytes == aligned_summary.shared_bytes


def test_v5t_transposes_a_in_shared_memory_and_double_buffers_fragments(compiled, lowered):
    _, _, s = compiled("v5t", SEED)  # 128x256 block tile, 8x16 per thread, K tiles of 32
    kernel = kf.kernel(lowered("v5t", SEED))
    assert s.block == {"threadIdx.y": 16, "threadIdx.x": 16} and s.grid == {"blockIdx.y": 8, "blockIdx.x": 2}
    assert kf.buffers(kernel)["C_local"] == ("local", (128,), "float32")
    # A's tile is [k, m] with rows of 128 + 4 floats, filled 4 bytes at a time; B's as in v5.
    assert s.shared_bytes == 2 * (32 * 132 + 32 * 260) * 4
    sizes = {}
    for copy in kf.calls(kernel, "s_tir.cp_async_raw"):
        sizes.setdefault(kf.pointers(copy)[0], set()).add(int(copy.args[4]))
    assert sizes == {"A_shared.dyn": {4}, "B_shared.dyn": {16}}
    # A thread's 8 rows of one K step are two 16-byte vectors of a [k, m] row; the next K
    # step's (132 floats on) go to the fragment's second buffer while this one's are used.
    buffers = kf.buffers(kernel)
    assert buffers["A_shared.dyn_local"][:2] == ("local", (16,))
    assert buffers["B_shared.dyn_local"][:2] == ("local", (32,))
    reads = [(int(st.indices[0].base), kf.first_lane(st.value.indices[0]))
             for st in kf.stores_to(kernel, "A_shared.dyn_local")]
    assert {kf.lanes(st) for st in kf.stores_to(kernel, "A_shared.dyn_local")} == {4}
    this_step = [at for slot, at in reads if slot == 0]
    next_step = [at for slot, at in reads if slot == 4]
    assert this_step and len(this_step) == len(next_step)
    assert {kf.distance(a, b) for a, b in zip(this_step, next_step)} == {132}


def test_v5t_refuses_16_bit_inputs(target):
    with pytest.raises(ScheduleNotApplicable, match="float32 only, not float16"):
        schedules.get("gemm", "v5t").apply(Workload("gemm", (256, 256, 256), "float16"), target)


@pytest.mark.parametrize("dtype, layout", [("float16", "nn"), ("float16", "nt"), ("bfloat16", "nn"), ("bfloat16", "nt")])
def test_v6_runs_on_tensor_cores(dtype, layout, compiled, lowered):
    wl = Workload("gemm", (256, 256, 256), dtype, layout=layout)
    _, source, s = compiled("v6", wl)
    kernel = kf.kernel(lowered("v6", wl))
    short = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    mmas = kf.calls(kernel, "ptx_legacy.mma")
    assert mmas and {kf.words(c) for c in mmas} == {("m16n8k16", "row", "col", short, short, "fp32")}
    # operands come from shared memory as x4 ldmatrix fragments; B is K x N in nn: ldmatrix
    # transposes it on the way in (its first argument); in nt it is already K-major, like A.
    loads = kf.calls(kernel, "ptx_legacy.ldmatrix")
    transposed = {kf.pointers(c)[0].split("_")[0]: bool(kf.ints(c)[0]) for c in loads}
    assert {kf.ints(c)[1] for c in loads} == {4} and {kf.words(c) for c in loads} == {(".b16",)}
    assert transposed == {"A": False, "B": layout == "nn"}
    # global->shared by cp.async, 16 bytes a copy; the accumulators stay in the warps' registers
    assert kf.copies(kernel) and set(kf.copies(kernel)) == {(16, False)}
    assert kf.buffers(kernel)["C_warp"][0] == "warp"
    assert s.block == {"threadIdx.y": 4, "threadIdx.x": 32}
    if shutil.which("nvcc"):
        usage = build.nvcc_resources(source, "sm_90")["main_kernel"]
        assert usage["stack_bytes"] == 0 and usage["spill_stores"] == 0


@pytest.mark.parametrize("wl, reason", [
    (Workload("gemm", (256, 256, 256)), "float16 or bfloat16"),
    (Workload("gemm", (256, 256, 256), "float16", "float16"), "--out-dtype float32"),
])
def test_v6_refuses_what_tensor_cores_cannot_take(wl, reason, target):
    with pytest.raises(ScheduleNotApplicable, match=reason):
        schedules.get("gemm", "v6").apply(wl, target)


def _reaches(expr, kind, binds: dict) -> bool:
    """Whether `expr`, or the value bound to a variable it reads (and so on), holds a `kind`."""
    if lowering.find(expr, kind):
        return True
    return any(_reaches(binds[v.name], kind, binds) for v in lowering.find(expr, tvm.ir.Var)
               if v.name in binds)


@pytest.mark.parametrize("dtype, layout", [("float16", "nn"), ("bfloat16", "nt")])
def test_v7_multiplies_with_wgmma_from_shared_memory(dtype, layout, compiled, lowered):
    wl = Workload("gemm", (256, 256, 256), dtype, layout=layout)
    _, source, s = compiled("v7", wl, block_n=256)
    kernel = kf.kernel(lowered("v7", wl, block_n=256))
    short = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    mmas = kf.calls(kernel, f"ptx.wgmma_{short}_ss")
    assert mmas and {kf.words(c)[:7] for c in mmas} == {
        ("mma_async", "sync", "aligned", "m64n256k16", "f32", short, short)}
    # B is K x N in nn: wgmma transposes it (the last immediate); in nt it is already K-major.
    assert {kf.ints(c)[-1] for c in mmas} == {1 if layout == "nn" else 0}
    # both operands come from shared memory by descriptor, each asking for the 128-byte
    # swizzle (bits 62-63), and the copies store with the same xor
    descriptors = [[a for a in c.args if isinstance(a, tvm.tirx.BitwiseOr)] for c in mmas]
    assert {len(d) for d in descriptors} == {2}  # A's and B's
    assert all(int(d.b) >> 62 == 1 for pair in descriptors for d in pair)
    binds = {b.var.name: b.value for b in lowering.find(kernel, S.Bind)}
    copies = kf.calls(kernel, "s_tir.cp_async_raw")
    assert copies and all(_reaches(c, tvm.tirx.BitwiseXor, binds) for c in copies)
    # shared memory written by cp.async is fenced for wgmma's reads; a chunk's wgmmas stay in
    # flight while the next chunk loads (wait for all but one), the store waits for all
    assert kf.count(kernel, "ptx.fence_proxy", "async", "shared::cta")
    assert {kf.ints(c)[0] for c in kf.calls(kernel, "ptx.wgmma_wait_group")} == {0, 1}
    assert not [c for c in kf.calls(kernel) if "ldmatrix" in kf.name(c)]  # no operand fragments
    assert kf.buffers(kernel)["C_local"] == ("local", (128,), "float32")  # in registers
    assert s.block == {"threadIdx.y": 8, "threadIdx.x": 32}  # two warpgroups
    if shutil.which("nvcc"):
        usage = build.nvcc_resources(source, "sm_90")["main_kernel"]
        assert usage["stack_bytes"] == 0 and usage["spill_stores"] == 0  # 128 accumulators in registers


@pytest.mark.parametrize("knobs, reason", [
    ({"block_m": 32}, "block_m=32 is not a multiple of 64"),
    ({"block_n": 32}, "whole 64-element swizzled rows: block_n=32"),
    ({"chunk_k": 32}, "whole 64-element swizzled rows: block_n=256, chunk_k=32"),
    ({"stages": 2}, "stages >= 3"),
    ({"block_m": 256, "stages": 3}, "256x256 fp32 accumulators alone would fill"),
    ({"block_n": 128, "chunk_k": 128}, "needs 262144 bytes of shared memory"),
])
def test_v7_refuses_tiles_wgmma_cannot_take(knobs, reason, target):
    with pytest.raises(ScheduleNotApplicable, match=reason):
        schedules.get("gemm", "v7").apply(Workload("gemm", (512, 512, 512), "float16"), target,
                                          **{"block_n": 256, "stages": 4, **knobs})


@pytest.mark.parametrize("rung", ["v6", "v7"])
def test_tensor_core_rungs_pad_ragged_shapes_inside_the_kernel(rung, lowered):
    """M, N and K not whole tiles: the loads zero-fill past A's and B's edges (16-byte cp.async
    with a predicate where the rows are whole vectors) and the store stops at C's edges."""
    kernel = kf.kernel(lowered(rung, Workload("gemm", (1000, 136, 200), "bfloat16", layout="nt")))
    # every copy predicated, 16 bytes (the codegen zero-fills where the predicate is off)
    assert kf.copies(kernel) and set(kf.copies(kernel)) == {(16, True)}
    # the padded product, in registers or staged in shared memory, and every store into C
    # under an if (inside C)
    assert any(v.startswith("C_pad") for v in kf.variables(kernel))
    stores = kf.stores_to(kernel, "C")
    assert stores and kf.among(stores, kf.inside_ifs(kernel, S.BufferStore))
    # rows that are not whole 16-byte vectors (K = 65): narrower loads, not cp.async's 16 bytes
    odd = kf.kernel(lowered(rung, Workload("gemm", (257, 129, 65), "bfloat16", layout="nt")))
    assert (16, True) not in kf.copies(odd) and (16, False) not in kf.copies(odd)
    # whole tiles: no padding at all
    whole = kf.kernel(lowered(rung, Workload("gemm", (256, 256, 256), "float16")))
    assert not [v for v in kf.variables(whole) if "_pad" in v]
    assert kf.copies(whole) and not [c for c in kf.copies(whole) if c[1]]
    assert not kf.inside_ifs(whole, S.BufferStore)


def test_v7_stores_c_after_waiting_for_every_wgmma(lowered):
    kernel = kf.kernel(lowered("v7", Workload("gemm", (256, 256, 256), "float16")))
    last_commit = kf.at(kernel, kf.called("ptx.wgmma_commit_group"))[-1]
    wait_all = [i for i in kf.at(kernel, kf.called("ptx.wgmma_wait_group"))
                if kf.ints(kf.events(kernel)[i]) == (0,) and i > last_commit]
    stores = kf.at(kernel, lambda n: isinstance(n, S.BufferStore) and n.buffer.name == "C")
    assert wait_all and stores and wait_all[0] < stores[0]  # the wait comes before the first store


def test_v7_m_tiles_first_launches_blocks_along_m(compiled):
    wl = Workload("gemm", (1024, 512, 256), "bfloat16", layout="nt")
    assert compiled("v7", wl, block_n=256)[2].grid == {"blockIdx.y": 8, "blockIdx.x": 2}
    assert compiled("v7", wl, block_n=256, m_tiles_first=True)[2].grid == {"blockIdx.x": 8,
                                                                            "blockIdx.y": 2}
