"""The project's lowering passes (tuning/lowering.py), each on a small kernel written as it comes
out of TVM's default pipeline, against the kernel it must become: TVM's own style of pass test.
Then what tuning/build.py reads off the IR: the pass configuration and the kernel summary."""

import pytest
import tvm
from tvm.script import tirx as T

from schedules import Workload
from schedules.common import SINGLE_BARRIER, WAIT_FOR_WGMMA
from tuning import build, lowering


def _apply(transform, func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` after the pass `transform`."""
    return transform(tvm.IRModule({"main": func}))["main"]


def _pipelined(annotations: dict):
    """The main loop of a 2-stage cp.async pipeline (its prologue and epilogue left out),
    annotated with `annotations`, as TVM 0.27 lowers one with its loads first: sync, loads of
    the next tile, commit; a binding that TVM's CSE put between the two scopes; wait for this
    tile (one group in flight), sync, compute."""

    @T.prim_func(private=True)
    def func(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32"),
             C: T.Buffer((1,), "float32")):
        A_shared = T.alloc_shared((32,))
        B_shared = T.alloc_shared((32,))
        tx = T.launch_thread("threadIdx.x", 16)
        for k in T.serial(3, annotations=annotations):
            with T.attr({"async_commit_queue_scope": 0}):
                T.tvm_storage_sync("shared")
                A_shared[(k + 1) % 2 * 16 + tx] = A[k * 16 + tx + 16]
                B_shared[(k + 1) % 2 * 16 + tx] = B[k * 16 + tx + 16]
            tile: T.let[T.int32] = k % 2 * 16
            with T.attr({"async_wait_queue_scope": 0, "async_wait_inflight_count": 1}):
                T.tvm_storage_sync("shared")
                C[0] = C[0] + A_shared[tile + tx] * B_shared[tile + tx]

    return func


def test_single_barrier_waits_then_syncs_once_before_the_loads():
    @T.prim_func(private=True)
    def expected(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32"),
                 C: T.Buffer((1,), "float32")):
        A_shared = T.alloc_shared((32,))
        B_shared = T.alloc_shared((32,))
        tx = T.launch_thread("threadIdx.x", 16)
        for k in range(3):
            with T.attr({"async_wait_queue_scope": 0, "async_wait_inflight_count": 0}):
                T.tvm_storage_sync("shared")
            with T.attr({"async_commit_queue_scope": 0}):
                A_shared[(k + 1) % 2 * 16 + tx] = A[k * 16 + tx + 16]
                B_shared[(k + 1) % 2 * 16 + tx] = B[k * 16 + tx + 16]
            tile: T.let[T.int32] = k % 2 * 16
            C[0] = C[0] + A_shared[tile + tx] * B_shared[tile + tx]

    after = _apply(lowering.rewrite_single_barrier, _pipelined({SINGLE_BARRIER: True}))
    tvm.ir.assert_structural_equal(after, expected)


def test_single_barrier_keeps_bindings_ahead_of_the_commit_and_a_single_load():
    """A binding that CSE put before the commit scope (it serves the loads' predicate and the
    compute, as in v5k's K slices) stays first; a commit scope left with one load holds it as
    it is."""

    @T.prim_func(private=True)
    def before(A: T.Buffer((64,), "float32"), C: T.Buffer((1,), "float32")):
        A_shared = T.alloc_shared((32,))
        tx = T.launch_thread("threadIdx.x", 16)
        for k in T.serial(3, annotations={SINGLE_BARRIER: True}):
            step: T.let[T.int32] = k * 16
            with T.attr({"async_commit_queue_scope": 0}):
                T.tvm_storage_sync("shared")
                if step < 32:
                    A_shared[(k + 1) % 2 * 16 + tx] = A[step + tx + 16]
            with T.attr({"async_wait_queue_scope": 0, "async_wait_inflight_count": 1}):
                T.tvm_storage_sync("shared")
                C[0] = C[0] + A_shared[k % 2 * 16 + tx] * T.Cast("float32", step)

    @T.prim_func(private=True)
    def expected(A: T.Buffer((64,), "float32"), C: T.Buffer((1,), "float32")):
        A_shared = T.alloc_shared((32,))
        tx = T.launch_thread("threadIdx.x", 16)
        for k in range(3):
            step: T.let[T.int32] = k * 16
            with T.attr({"async_wait_queue_scope": 0, "async_wait_inflight_count": 0}):
                T.tvm_storage_sync("shared")
            with T.attr({"async_commit_queue_scope": 0}):
                if step < 32:
                    A_shared[(k + 1) % 2 * 16 + tx] = A[step + tx + 16]
            C[0] = C[0] + A_shared[k % 2 * 16 + tx] * T.Cast("float32", step)

    after = _apply(lowering.rewrite_single_barrier, before)
    tvm.ir.assert_structural_equal(after, expected)


def test_single_barrier_leaves_a_loop_that_did_not_ask_for_it_as_it_is():
    before = _pipelined({"pragma_unroll_explicit": False})
    after = _apply(lowering.rewrite_single_barrier, before)
    tvm.ir.assert_structural_equal(after, before)


def test_single_barrier_refuses_an_annotated_loop_that_is_not_a_pipeline():
    @T.prim_func(private=True)
    def before(A: T.Buffer((64,), "float32"), C: T.Buffer((1,), "float32")):
        for k in T.serial(64, annotations={SINGLE_BARRIER: True}):
            T.tvm_storage_sync("shared")
            C[0] = C[0] + A[k]

    with pytest.raises(RuntimeError, match="loop k is not a cp.async pipeline with its loads first"):
        _apply(lowering.rewrite_single_barrier, before)


def _kernel(launch_tags: list[str], control: str):
    """A kernel with these launch tags that calls griddepcontrol `control` before its store."""

    @T.prim_func(private=True)
    def func(C: T.Buffer((32,), "float32")):
        T.func_attr({"tirx.kernel_launch_params": launch_tags})
        tx = T.launch_thread("threadIdx.x", 32)
        if tx < 16:
            T.ptx.griddepcontrol(control, "")
        C[tx] = T.float32(0)

    return func


THREADS = ["blockIdx.x", "threadIdx.x"]


def _store(annotations: dict):
    """A store of accumulators that wgmma wrote, its loop annotated with `annotations`."""

    @T.prim_func(private=True)
    def func(C: T.Buffer((64,), "float32")):
        acc = T.alloc_local((2,))
        tx = T.launch_thread("threadIdx.x", 32)
        for t in T.serial(2, annotations=annotations):
            C[t * 32 + tx] = acc[t]

    return func


def test_a_store_that_asked_for_it_waits_for_every_wgmma_first():
    @T.prim_func(private=True)
    def expected(C: T.Buffer((64,), "float32")):
        acc = T.alloc_local((2,))
        tx = T.launch_thread("threadIdx.x", 32)
        T.ptx.wgmma.wait_group.sync.aligned(0)
        for t in range(2):
            C[t * 32 + tx] = acc[t]

    after = _apply(lowering.wait_for_wgmma, _store({WAIT_FOR_WGMMA: True}))
    tvm.ir.assert_structural_equal(after, expected)
    unasked = _store({})
    assert _apply(lowering.wait_for_wgmma, unasked).same_as(unasked)


@pytest.mark.parametrize("tags, expected", [
    (THREADS, [*THREADS, lowering.PDL_TAG]),
    ([*THREADS, lowering.DYNAMIC_SHARED_TAG],  # which TVM wants last
     [*THREADS, lowering.PDL_TAG, lowering.DYNAMIC_SHARED_TAG]),
], ids=["appended", "before-dynamic-shared-memory"])
def test_a_kernel_that_waits_is_launched_early(tags, expected):
    after = _apply(lowering.launch_waiting_kernels_early, _kernel(tags, "wait"))
    tvm.ir.assert_structural_equal(after, _kernel(expected, "wait"))


@pytest.mark.parametrize("tags, control", [
    (THREADS, "launch_dependents"),  # it lets the next kernel start, but waits for nothing
    ([*THREADS, lowering.PDL_TAG], "wait"),  # already launched early
], ids=["no-wait", "already-tagged"])
def test_launch_tags_stay_as_they_are(tags, control):
    before = _kernel(tags, control)
    tvm.ir.assert_structural_equal(_apply(lowering.launch_waiting_kernels_early, before), before)


# -- guarded copies that zero-fill in one instruction ----------------------------------------------


def test_guarded_narrow_copies_zero_fill_in_one_instruction(compiled):
    # v5t copies A element by element, and B too where N is ragged: 4-byte copies, guarded.
    _, source, _ = compiled("v5t", Workload("gemm", (257, 129, 65)))
    assert "cp_async_zero_fill_4_4_4(" in source
    assert "@!p st.shared" not in source and "legacy_pred" not in source


def test_guarded_16_byte_copies_keep_tvms_pair(compiled):
    # v5p copies 16-byte vectors where K and N are whole vectors; A's are guarded on ragged M.
    _, source, _ = compiled("v5p", Workload("gemm", (300, 260, 200)))
    assert "ptx_cp_async_legacy_pred_cg_16" in source and "cp_async_zero_fill" not in source


# -- what tuning/build.py reads off the IR: the pass configuration and the kernel summary -------


def _staged(scope: str, loop_annotations: dict) -> tvm.IRModule:
    """A scheduled module that stages A in a `scope` buffer, in a loop annotated so."""

    @T.prim_func(s_tir=True, private=True)
    def func(A: T.Buffer((64,), "float32"), C: T.Buffer((64,), "float32")):
        A_staged = T.sblock_alloc_buffer((64,), scope=scope)
        for i in T.serial(64, annotations=loop_annotations):
            with T.sblock("stage"):
                vi = T.axis.remap("S", [i])
                A_staged[vi] = A[vi]
            with T.sblock("copy"):
                vi = T.axis.remap("S", [i])
                C[vi] = A_staged[vi]

    return tvm.IRModule({"main": func})


ASYNC = {"software_pipeline_async_stages": [0]}


@pytest.mark.parametrize("scope, annotations, skips_storage_rewrite", [
    ("shared.dyn", ASYNC, True),  # v5p's cp.async pipeline on CUDA cores
    ("warp", ASYNC, False),  # v6's: LowerWarpMemory needs StorageRewrite
    ("shared.dyn", {"software_pipeline_stage": [0, 1]}, False),  # no async stage
], ids=["async", "async-warp-fragments", "sync"])
def test_storage_rewrite_is_skipped_only_for_async_pipelines_without_warp_fragments(
        scope, annotations, skips_storage_rewrite):
    mod = _staged(scope, annotations)
    assert build.has_warp_fragments(mod) == (scope == "warp")
    config = build.pass_config(mod)
    assert config["tirx.use_async_copy"]
    assert config.get("tirx.disable_storage_rewrite", False) == skips_storage_rewrite


def test_summary_reads_launches_and_loop_nests_off_the_ir():
    @T.prim_func(private=True)
    def kernel(C: T.Buffer((256,), "float32")):
        bx = T.launch_thread("blockIdx.x", 4)
        tx = T.launch_thread("threadIdx.x", 16)
        for k in range(8):
            for i, j in T.grid(2, 2):  # one line of TVMScript, two loops
                C[bx * 64 + tx * 4 + i * 2 + j] = C[bx * 64 + tx * 4 + i * 2 + j] + T.float32(k)
        for i in range(4):
            C[bx * 64 + tx * 4 + i] = T.float32(0)

    summary = build.summarize(tvm.IRModule({"main": kernel}), "__syncthreads();")
    assert (summary.grid, summary.block) == ({"blockIdx.x": 4}, {"threadIdx.x": 16})
    assert summary.loop_depth == 3 and summary.syncthreads == 1 and summary.kernels == 1


# -- the target's limits: the GPU's own, with or without it here ----------------------------------

KB = 1024


@pytest.mark.parametrize("arch, shared", [("sm_90", 227 * KB), ("sm_90a", 227 * KB),
                                          ("sm_80", 163 * KB), ("sm_89", 99 * KB),
                                          ("sm_75", 64 * KB), ("sm_99", 48 * KB)])
def test_the_target_has_the_shared_memory_a_block_of_its_gpu_can_opt_into(arch, shared):
    """The opt-in limit, not TVM's tags' portable 48 KB (an arch the table does not know keeps
    the portable 48 KB); 64K registers and 1024 threads on every one."""
    target = build.cuda_target(arch)
    assert target.attrs["max_shared_memory_per_block"] == shared
    assert target.attrs["registers_per_block"] == 64 * KB
    assert target.attrs["max_threads_per_block"] == 1024


def test_arch_names_a_gpu_by_sm_number_or_by_tvm_tag():
    from schedules.errors import UsageError

    assert build.arch_of("sm_86") == "sm_86"
    assert build.arch_of("nvidia/nvidia-h100") == "sm_90"
    assert build.arch_of("nvidia/geforce-rtx-4090") == "sm_89"
    for name in ("hopper", "llvm", "sm90"):
        with pytest.raises(UsageError, match=f"malformed --arch '{name}'"):
            build.arch_of(name)


def _v3_with_shared(kilobytes: int):
    """v3 on a 1024^3 float32 GEMM with 32x32 tiles and K steps as long as make its two shared
    tiles `kilobytes` KB together."""
    import schedules
    from schedules.workloads import Workload

    tile_k = kilobytes * KB // (2 * 32 * 4)
    return schedules.get("gemm", "v3").apply(Workload("gemm", (1024, 1024, 1024)),
                                             build.cuda_target("sm_90"), tile_x=32, tile_y=32,
                                             tile_k=tile_k)


def test_metaschedule_keeps_a_candidate_over_48_kb_that_the_gpu_can_run(tensor_intrinsics):
    """VerifyGPUCode, the postprocessor that drops candidates over the target's limits, keeps a
    64 KB one on the project's H100 target and drops it on TVM's nvidia-h100 tag (48 KB)."""
    from tvm.s_tir import meta_schedule as ms

    mod = _v3_with_shared(64)

    def kept(target) -> bool:
        verify = ms.postproc.VerifyGPUCode()
        verify._initialize_with_tune_context(ms.TuneContext(mod=mod, target=target))
        return verify.apply(tvm.s_tir.Schedule(mod))

    assert kept(build.cuda_target("sm_90"))
    assert not kept(tvm.target.Target("nvidia/nvidia-h100"))


@pytest.mark.parametrize("kilobytes, dynamic", [(32, False), (48, False), (64, True)])
def test_static_shared_tiles_over_48_kb_go_to_dynamic_shared_memory(kilobytes, dynamic):
    """CUDA allows static shared arrays 48 KB per block: past that, the build moves them into
    one dynamic buffer (which TVM's runtime opts into at launch); up to it, they stay static."""
    source = build.cuda_source(build.build(_v3_with_shared(kilobytes), build.cuda_target("sm_90")))
    assert ("extern __shared__" in source) == dynamic
    assert ("__shared__ alignas(64) float A_shared" in source) == (not dynamic)
    build.nvcc_resources(source, "sm_90")  # nvcc accepts it (where there is one)
