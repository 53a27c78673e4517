"""Block-scaled fp8 (issue 52 item 3), as DeepSeek-V3 and DeepGEMM define it: A (M x K, e4m3)
with a float32 scale per row per 128 K, B (N x K) with one per 128 x 128 block, each 128-K
block's partial product times its two scales. CPU tier: the workload, its TE definition and
records; v8's refusals; the kernel applies the scales as it promotes each K block's sums and
not after the sum, and compiles for sm_90a. GPU tier (`-m gpu`): v8 against float64 on
aligned and ragged shapes, and the baselines (cuBLAS's block-scaled _scaled_mm, dequantize
then bfloat16 GEMM)."""

import re
import shutil

import pytest
import tvm
from tvm.tirx import stmt as S

import kernel_facts as kf
import schedules
from schedules import ScheduleNotApplicable, Workload
from schedules.errors import UsageError, WorkloadError
from schedules.workloads import FP8
from tuning import build, lowering, measure

needs_nvcc = pytest.mark.skipif(not shutil.which("nvcc"),
                                reason="nvcc is not on PATH: the generated CUDA is not compiled")


def block(shape, out_dtype=None) -> Workload:
    """A block-scaled fp8 GEMM of `shape` (M, N, K)."""
    return Workload("gemm", shape, FP8, out_dtype, "nt", "block")


# -- the workload ------------------------------------------------------------------------------

def test_block_scales_are_a_row_of_a_per_128_k_and_a_128_square_of_b():
    """A_scale is M x ceil(K/128), B_scale ceil(N/128) x ceil(K/128): the last, shorter block
    of a ragged K or N has a scale of its own."""
    wl = block((300, 520, 1000))
    assert wl.block_scaled and not wl.rowwise and wl.scale_blocks == (5, 8)
    assert wl.buffer_shapes() == {"A": (300, 1000), "B": (520, 1000), "A_scale": (300, 8),
                                  "B_scale": (5, 8), "C": (300, 520)}
    assert wl.label() == "gemm 300x520x1000 float8_e4m3fn->bfloat16 nt block-scaled"
    assert wl.min_bytes == 300 * 1000 + 520 * 1000 + (300 * 8 + 5 * 8) * 4 + 2 * 300 * 520
    assert block((64, 256, 256)).buffer_shapes()["B_scale"] == (2, 2)
    with pytest.raises(WorkloadError, match="scales are for float8_e4m3fn GEMMs"):
        Workload("gemm", (64, 32, 48), "bfloat16", scales="block")


def test_records_name_block_scales_and_read_them_back():
    """Records say "scales": "block"; Workload.from_record gives the same workload back, and a
    block-scaled record matches neither the per-tensor nor the rowwise workload."""
    wl = block((300, 520, 1000), "float32")
    fields = wl.record_fields()
    assert fields["scales"] == "block" and Workload.from_record(fields) == wl
    for other in (Workload("gemm", (300, 520, 1000), FP8, "float32"),
                  Workload("gemm", (300, 520, 1000), FP8, "float32", scales="row")):
        assert not all(fields.get(k) == v for k, v in other.record_key().items())


def test_the_te_definition_scales_each_product_by_its_blocks_and_nothing_after():
    """The reduction reads A_scale[i, k / 128] and B_scale[j / 128, k / 128] with each product;
    the epilogue only casts."""
    text = block((300, 520, 1000)).prim_func().script()
    assert "A_scale[v_i, v_k // 128] * B_scale[v_j // 128, v_k // 128]" in text
    assert 'C[v_i0, v_i1] = T.Cast("bfloat16", C_acc[v_i0, v_i1])' in text


@pytest.mark.parametrize("shape", [(3, 256, 384), (5, 300, 1000), (2, 100, 60)],
                         ids=lambda s: "x".join(map(str, s)))
def test_the_reference_sums_each_k_blocks_product_times_its_scales(shape):
    """measure.reference (float64, on the dequantized operands) is DeepGEMM's definition:
    the sum over K blocks of each block's A @ B^T times A_scale[m, kb] * B_scale[n / 128, kb],
    the last blocks of a ragged K or N shorter; the bfloat16 dequantization agrees to its
    rounding (both of block_dequantize's ways: broadcast blocks, or scales spread out)."""
    torch = pytest.importorskip("torch")
    wl = block(shape)
    M, N, K = shape
    gen = torch.Generator().manual_seed(0)
    shapes = wl.buffer_shapes()
    a, b = (torch.randn(shapes[n], generator=gen).to(torch.float8_e4m3fn) for n in "AB")
    sa, sb = (torch.rand(shapes[n], generator=gen) + 0.5 for n in ("A_scale", "B_scale"))
    expected = torch.zeros(M, N, dtype=torch.float64)
    for kb in range(-(-K // 128)):
        part = slice(kb * 128, (kb + 1) * 128)
        product = a[:, part].double() @ b[:, part].double().T
        expected += product * sa[:, kb, None].double() \
            * sb[:, kb].double().repeat_interleave(128)[None, :N]
    reference = measure.reference(wl, [a, b, sa, sb])
    assert torch.allclose(reference, expected, rtol=1e-12, atol=1e-9)
    dense = measure.operands(wl, [a, b, sa, sb], torch.bfloat16)
    assert measure.relative_error(dense[0] @ dense[1].T, reference) < 1e-2


def test_cublas_block_scales_are_refused_where_k_is_not_whole_groups_of_4_blocks():
    """torch 2.11's _scaled_mm answered K = 640 (5 blocks) wrongly on an H200, and refused the
    scales padded to 8 blocks: the baseline says so in one line instead."""
    torch = pytest.importorskip("torch")
    with pytest.raises(UsageError, match="whole multiples of 512 .4 K blocks., not K=640"):
        measure.cublas_block_scales(640, torch.ones(4, 5), torch.ones(1, 5))
    a, b = measure.cublas_block_scales(1024, torch.ones(4, 8), torch.ones(2, 8))
    assert a.shape == (4, 8) and a.stride() == (1, 4) and b.shape == (8, 2) and b.stride() == (1, 8)


@pytest.mark.parametrize("m", [3, 4])
def test_cublas_block_scaled_baseline_pads_a_to_whole_4_rows_once_outside_its_timed_call(
        m, scaled_mm_calls):
    """cuBLAS's block form refused M = 1, 2, 3, 15, 17, 65 on an H200: A and its scales are
    padded with zero rows to whole 4s, once when the baseline is made, so that each timed call
    is _scaled_mm alone (seen here by a stand-in: its block form runs on CUDA only), its
    padding rows cut off."""
    torch = pytest.importorskip("torch")
    wl = Workload("gemm", (m, 256, 1024), FP8, "bfloat16", "nt", "block")
    a, b = (torch.randn(rows, 1024).to(torch.float8_e4m3fn) for rows in (m, 256))
    run = measure.cublas_runner(wl, [a, b, torch.rand(m, 8), torch.rand(2, 8)])
    first, second = run(), run()
    assert first.shape == second.shape == (m, 256)
    (padded, scale_a, _), again = scaled_mm_calls[0], scaled_mm_calls[1][0]
    assert again is padded and padded.shape == (4, 1024) and scale_a.shape == (4, 8)
    assert torch.equal(padded[:m].view(torch.uint8), a.view(torch.uint8))
    assert not padded[m:].view(torch.uint8).any()


# -- v8 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("promote_k, why", [
    (None, "promote_k=none"), (256, "promote_k=256")])
def test_v8_takes_block_scales_only_promoted_every_128_k(promote_k, why, target):
    """The scales multiply each K block's sums as they are promoted: promote_k must be 128."""
    message = (f"v8 multiplies each 128-element K block's sums by its block scales as it "
               f"promotes them into float32: block scales need promote_k=128 and layout nt, "
               f"not {why}, layout nt")
    with pytest.raises(ScheduleNotApplicable, match=re.escape(message)):
        schedules.get("gemm", "v8").apply(block((256, 512, 1024)), target, promote_k=promote_k)


def test_v8_defaults_to_promote_k_128_on_block_scales():
    assert schedules.get("gemm", "v8").defaults_for(block((4096, 7168, 4096)))["promote_k"] == 128


def test_padding_rungs_refuse_block_scales_on_ragged_shapes(target):
    """v4's family pads ragged shapes with pad_einsum, which takes a product of A and B only."""
    with pytest.raises(ScheduleNotApplicable, match="pad_einsum.*not block-scaled fp8's"):
        schedules.get("gemm", "v4").apply(block((300, 520, 1000)), target)


@pytest.mark.parametrize("shape, knobs, clamps", [
    # ragged M, N, K: split K (the heuristic's), 128 columns; promotions that wait (the
    # overlapped runs' loads: the next test)
    ((300, 520, 1000), {"promote_overlap": None}, {299, 4}),
    ((1000, 1000, 1008), {"block_n": 144, "split_k": 3, "tma_store": True}, {999, 7}),
    ((256, 384, 1000), {"pingpong": True, "block_m": 64, "block_n": 128}, {2}),  # K staged
])
def test_v8_reads_the_scales_per_k_block_in_the_loop_not_after_it(shape, knobs, clamps, lowered):
    """Every load of a scale lies in the K loop (over kt), into the scale registers (factors),
    which the promotion multiplies into the float32 sums; none after the loop (the epilogue
    multiplies by no scale). The indices are clamped at A's last row (where M is ragged) and
    B's last block of rows (`clamps`)."""
    kernel = kf.kernel(lowered("v8", block(shape), **knobs))
    in_loops = [load for f in lowering.find(kernel, S.For) if f.loop_var.name.startswith("kt")
                for name in ("A_scale", "B_scale") for load in kf.loads_from(f.body, name)]
    loads = kf.loads_from(kernel, "A_scale") + kf.loads_from(kernel, "B_scale")
    assert loads and all(any(load.same_as(l) for l in in_loops) for load in loads)
    assert {s.buffer.name for s in lowering.find(kernel, S.BufferStore)
            if kf.loads_from(s, "A_scale") or kf.loads_from(s, "B_scale")} == {"factors"}
    assert [s for s in kf.stores_to(kernel, "sums") if kf.variables(s.value) >= {"factors"}]
    assert clamps <= {int(m.b) for m in lowering.find(kernel, tvm.tirx.Min)
                      if isinstance(m.b, tvm.tirx.IntImm)}


def test_v8_overlapped_runs_read_each_blocks_scales_into_its_sets_registers(lowered):
    """promote_overlap=4 (the default's runs of 8 where K is whole; K = 4096: 8 runs): each
    block loads its scales into the registers of its set of accumulators (two sets of
    factors), all of them in the loop over the runs, and each promotion multiplies by its own
    set's: a run's 4 blocks load 4 x (2 rows + B's blocks) scales and promote 4 x 64 sums."""
    kernel = kf.kernel(lowered("v8", block((1000, 1024, 4096)), block_n=128, split_k=1,
                               promote_overlap=4))
    per_set = 2 + 2  # a thread's 2 rows of A, and the 2 blocks of B its 64 columns may touch
    assert kf.buffers(kernel)["factors"] == ("local", (2 * per_set,), "float32")
    (runs,) = [f for f in kf.loop(kernel, "kr") if kf.calls(f, "ptx.wgmma_fp8_ss")]
    loads = kf.loads_from(kernel, "A_scale") + kf.loads_from(kernel, "B_scale")
    in_runs = kf.loads_from(runs, "A_scale") + kf.loads_from(runs, "B_scale")
    assert len(loads) == len(in_runs) == 4 * per_set
    assert len([s for s in kf.stores_to(runs, "sums") if kf.variables(s.value) >= {"factors"}]) \
        == 4 * 64


@needs_nvcc
@pytest.mark.parametrize("shape, knobs", [
    ((4096, 7168, 4096), {}),
    ((300, 520, 1000), {}),
    ((1000, 1000, 1008), {"block_n": 144, "split_k": 3, "tma_store": True}),
    ((16, 7168, 2048), {}),  # a decode batch
    ((256, 384, 1000), {"pingpong": True, "block_m": 64, "block_n": 128}),
    ((4096, 24576, 1536), {}),  # 12 and 8 K blocks: the overlapped runs the heuristic picks
    ((4096, 4096, 1024), {}),  # (registered_run), where runs of 8 spilled
    ((4096, 7168, 16384), {}),  # in clusters of 2 along N (paired_tiles)
])
def test_v8_block_scaled_cuda_compiles_without_spills(shape, knobs, compiled):
    """nvcc takes the block-scaled kernel for sm_90a; its scale registers spill nothing."""
    _, source, _ = compiled("v8", block(shape), **knobs)
    for kernel, usage in build.nvcc_resources(source, "sm_90").items():
        assert usage["spill_stores"] == usage["spill_loads"] == 0, kernel


# -- the GPU tier ------------------------------------------------------------------------------

BLOCK_CASES = [  # (the pingpong case: K staged into rows TMA can load, one short block)
    (block((256, 512, 1024)), {}),  # whole blocks
    (block((4096, 7168, 1024)), {}),  # DeepGEMM's N, many tiles per CTA
    (block((300, 520, 1000), "float32"), {}),  # ragged M, N, K: the last blocks shorter
    (block((1000, 1000, 1008), "float16"), {"block_n": 144, "split_k": 3, "tma_store": True}),
    (block((1100, 4608, 1024)), {"block_n": 192, "split_k": 3, "split_tail": True}),
    (block((16, 7168, 2048)), {}),  # a decode batch: one row of 64x64 tiles (ONE_ROW_WIDTH)
    (block((48, 2048, 2048)), {}),  # ... split K
    (block((40, 1000, 1000), "float32"), {"block_n": 64}),  # half a block of B's scales a tile
    (block((256, 384, 100), "float32"), {"pingpong": True, "block_m": 64, "block_n": 128}),
    (block((129, 200, 4096), "float32"), {"block_m": 64}),
    # promote_overlap: runs of 4 blocks and the blocks after them, ragged edges, split K
    (block((300, 520, 1000), "float32"), {"block_n": 128, "promote_overlap": 4}),
    (block((1100, 4608, 1024)), {"block_n": 128, "split_k": 3, "split_tail": True,
                                 "promote_overlap": 2}),
    # clusters of 2 along N on many tiles of a long K (`paired_tiles`): 32 columns of tiles,
    # and 11 (the pair of the last column has no tile of its own) on ragged M and N
    (block((4352, 4096, 6144)), {}),
    (block((12200, 1400, 6144), "float32"), {}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("wl, knobs", BLOCK_CASES,
                         ids=[f"{wl.label().split()[1]}-{wl.out_dtype}-"
                              f"{','.join(f'{k}={v}' for k, v in kn.items()) or 'defaults'}"
                              for wl, kn in BLOCK_CASES])
def test_v8_block_scaled_matches_float64(wl, knobs, target):
    """v8 with block scales against the float64 reference (A and B times their blocks'
    scales), twice into the same output: within fp8's tolerance, and with a float32 C within
    BLOCK_TOLERANCE, which scales applied to the wrong block or after the sum exceed."""
    inputs = measure.random_inputs(wl, 7)
    mod = schedules.get("gemm", "v8").apply(wl, target, **knobs)
    run = measure.tvm_runner(build.build(mod, target), wl, inputs, measure.poisoned_output(wl))
    tolerance = BLOCK_TOLERANCE if wl.out_dtype == "float32" else measure.tolerance(wl)
    for _ in range(2):
        out = run()
        err = measure.relative_error(out, measure.reference(wl, inputs))
        assert err <= tolerance, f"relative error {err:.3g} > {tolerance:g}"


BLOCK_TOLERANCE = 1e-3  # promoted every 128 K, a float32 C: well under it on the H100


@pytest.mark.gpu
@pytest.mark.parametrize("wl", [block((256, 512, 1024)), block((300, 520, 1000), "float32")],
                         ids=lambda wl: wl.label())
def test_dequantizing_baseline_is_correct(wl):
    """dequantize A and B to bfloat16 with their block scales, then torch.mm: fp8's
    tolerance."""
    inputs = measure.random_inputs(wl, 4)
    result = measure.check(wl, measure.dequantizing_runner(wl, inputs), inputs,
                           measure.tolerance(wl))
    assert result["status"] == "ok", result


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(256, 512, 1024), (17, 512, 1024), (1, 256, 2048)])
def test_scaled_mm_takes_block_scales_on_whole_blocks(shape):
    """cuBLAS's DeepSeek recipe through torch._scaled_mm, on whole 128 blocks of N and K; A's
    rows padded to whole 4s where M is not (cuBLAS refuses it unpadded)."""
    wl = block(shape)
    inputs = measure.random_inputs(wl, 4)
    result = measure.check(wl, measure.cublas_runner(wl, inputs), inputs, measure.tolerance(wl))
    assert result["status"] == "ok", result
