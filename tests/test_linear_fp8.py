"""linear/ with fp8 e4m3 layers and their scales, per tensor, per row (torch._scaled_mm's
two forms) and per block (DeepSeek-V3's): the layer shape and its cache key, the portfolio's
candidates, v8 for any M with each form, the module's constructor, state_dict, tracing and
refusals (CPU tier); numerics at every bucket's edges against float64, the cache, and
torch.compile (GPU tier)."""

import importlib.util
import os
import re
import subprocess
import sys
import types

import pytest
import torch
import tvm

import linear
import schedules
from linear.buckets import Bucket, BucketTable, buckets_from_edges
from linear.cache import Cache
from linear.candidates import SKINNY, TORCH, V8, Candidate, LayerShape, build_candidate, \
    candidates, launcher
from linear.portfolio import BucketKernel, LayerKernels, _check, cache_key, dequantized
from schedules import v8
from schedules.errors import ScheduleNotApplicable, WorkloadError
from schedules.v8.geometry import MOST_SPLIT_OVERLAP
from tuning import build, measure
from tuning.loader import BadInput

FP8 = torch.float8_e4m3fn
MEASURING_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts",
                                "linear_fp8.py")
SCALES = ("tensor", "row", "block")
GPU = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}


def _weights(n=32, k=64, scales="tensor", bias=True, device="cpu"):
    """An fp8 weight (n x k), its scale in the form `scales` says, and a bfloat16 bias."""
    weight = torch.randn(n, k, device=device).to(FP8)
    scale = torch.rand(LayerShape(n, k, "float8_e4m3fn", scales).weight_scale_shape(),
                       device=device) + 0.5
    return weight, scale, (torch.randn(n, device=device, dtype=torch.bfloat16) if bias else None)


# -- the layer shape, its cache key and candidates -----------------------------------------------

def test_an_fp8_layer_shape_names_its_scales_and_output_and_16_bit_ones_are_unchanged():
    tensor = LayerShape(1024, 2048, "float8_e4m3fn")
    row = LayerShape(1024, 2048, "float8_e4m3fn", "row")
    assert (tensor.scales, tensor.out_dtype) == ("tensor", "bfloat16")
    assert tensor.label() == "1024x2048 float8_e4m3fn scales=tensor out=bfloat16"
    assert row.label() == "1024x2048 float8_e4m3fn scales=row out=bfloat16"
    assert row.gemm(7).rowwise and row.gemm(7).dims["M"] == 7
    block = LayerShape(1000, 2048, "float8_e4m3fn", "block")
    assert block.label() == "1000x2048 float8_e4m3fn scales=block out=bfloat16"
    assert block.gemm(7).block_scaled
    assert (block.x_scale_shape((2, 7)), block.weight_scale_shape()) == ((2, 7, 16), (8, 16))
    assert (row.x_scale_shape((7,)), row.weight_scale_shape()) == ((7, 1), (1024, 1))
    assert (tensor.x_scale_shape((7,)), tensor.weight_scale_shape()) == ((), ())
    assert LayerShape(1024, 2048, "bfloat16").label() == "1024x2048 bfloat16"


def test_cache_keys_of_the_scale_forms_differ():
    bucket = Bucket(2, 16)
    keys = [cache_key(LayerShape(1024, 2048, "float8_e4m3fn", scales), bucket, 4096, GPU)
            for scales in SCALES]
    assert [f"scales={scales}" in key["layer"] for key, scales in zip(keys, SCALES)] == \
        [True] * len(SCALES)
    assert len({Cache("/nowhere").directory(key) for key in keys}) == len(SCALES)


def test_fast_accumulation_is_a_layer_of_its_own():
    fast = LayerShape(1024, 2048, "float8_e4m3fn", "row", fast_accum=True)
    assert fast.label() == "1024x2048 float8_e4m3fn scales=row out=bfloat16 fast_accum"
    precise = LayerShape(1024, 2048, "float8_e4m3fn", "row")
    assert cache_key(fast, Bucket(1, 1), 4096, GPU) != cache_key(precise, Bucket(1, 1), 4096, GPU)


@pytest.mark.parametrize("dtype, scales, out_dtype, fast, message", [
    ("bfloat16", "row", None, False, "scales are for float8_e4m3fn"),
    ("float8_e4m3fn", "block", None, True, "block scales .* no fast_accum"),
    ("float8_e4m3fn", "column", None, False, "'column'"),
    ("bfloat16", None, "float32", False, "writes bfloat16"),
    ("bfloat16", None, None, True, "fast_accum is for float8_e4m3fn layers"),
])
def test_a_layer_shape_the_gemm_does_not_take_is_refused(dtype, scales, out_dtype, fast, message):
    with pytest.raises(WorkloadError, match=message):
        LayerShape(64, 32, dtype, scales, out_dtype, fast)


PAIRED_LAYER = (2048, 6144, (1, 4097), 8448)  # n, k, bucket edges, max tokens


def test_a_block_scaled_layers_largest_bucket_weighs_v8_in_pairs_beside_alone():
    """2048 x 6144 up to 8448 rows: at the last bucket's most rows v8's default pairs its
    128x128 tiles along N (1056 tiles, 48 K blocks: `paired_tiles`), and the bucket measures
    that beside the same tiles alone; the first bucket's 4096 rows (512 tiles) are not paired."""
    n, k, edges, most = PAIRED_LAYER
    layer = LayerShape(n, k, "float8_e4m3fn", "block")
    first, last = (candidates(layer, bucket, most) for bucket in buckets_from_edges(edges))
    clusters = [[dict(c.knobs)["cluster_n"] for c in found if c.rung == V8]
                for found in (first, last)]
    assert 2 not in clusters[0] and clusters[1].count(2) == 1 and 1 in clusters[1]


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("bucket", buckets_from_edges())
def test_every_fp8_bucket_has_scaled_mm_and_precise_v8_for_any_m(scales, bucket):
    """No GEMV rung takes fp8, so M = 1 too is torch's, v8's and (but with block scales)
    skinny's; v8 promotes its sums into float32 (promote_k), the precision of _scaled_mm's
    default that the torch candidate runs."""
    found = candidates(LayerShape(4096, 4096, "float8_e4m3fn", scales), bucket, 4096)
    skinny = {"skinny"} if bucket.last == 1 and scales != "block" else set()
    assert found[0] == Candidate(TORCH) and {c.rung for c in found} == {TORCH, V8} | skinny
    assert all(dict(c.knobs)["promote_k"] for c in found if c.rung == V8)


def _block_operands(k, m=3, n=256):
    """A block-scaled layer of n x k and its operands at m rows, scales in 0.5-1.5, a bias."""
    layer = LayerShape(n, k, "float8_e4m3fn", "block")
    torch.manual_seed(0)
    return layer, (torch.randn(m, k).to(FP8), torch.rand(layer.x_scale_shape((m,))) + 0.5,
                   torch.randn(n, k).to(FP8), torch.rand(layer.weight_scale_shape()) + 0.5,
                   torch.randn(n, dtype=torch.bfloat16))


@pytest.mark.parametrize("k", [4096, 1000])
@pytest.mark.parametrize("into", [False, True])
def test_a_block_scaled_layers_torch_call_is_cublas_where_it_takes_k_else_dequantizes(
        k, into, scaled_mm_calls):
    """cuBLAS's block scales take K in whole groups of 512 (measure.cublas_block_scales): there
    the stock layer is torch._scaled_mm, its scales laid out column-major and x's 3 rows padded
    to 4 (seen through a stand-in); a layer of another K dequantizes x and W to bfloat16, then
    calls F.linear, whose answer is checked against float64. Given `out` (inductor's buffer),
    both write into it."""
    layer, (x, x_scale, weight, weight_scale, bias) = _block_operands(k)
    out = torch.full((3, 256), float("nan"), dtype=torch.bfloat16) if into else None
    y = launcher(Candidate(TORCH), layer, None)(x, x_scale, weight, weight_scale, bias, out=out)
    exact = dequantized(layer, x, x_scale) @ dequantized(layer, weight, weight_scale, True).T \
        + bias.double()
    assert y.dtype == torch.bfloat16 and y.shape == (3, 256) and (y is out) == into
    if k % 512:
        assert not scaled_mm_calls and float((y.double() - exact).norm() / exact.norm()) < 1e-2
    else:
        a, a_scale, b_scale = scaled_mm_calls[0]
        assert torch.equal(a[:3].view(torch.uint8), x.view(torch.uint8)) and a.shape == (4, k)
        assert not a[3].view(torch.uint8).any()
        assert (a_scale.shape, a_scale.stride()) == ((4, 32), (1, 4))
        assert (b_scale.shape, b_scale.stride()) == ((32, 2), (1, 32))
        assert torch.equal(y, bias.expand(3, 256))  # the bias added after the stand-in's zeros


def test_a_block_scaled_call_of_whole_4_rows_is_one_scaled_mm_into_out(scaled_mm_calls):
    """At 4 rows nothing is padded: _scaled_mm writes into `out` itself."""
    layer, (x, x_scale, weight, weight_scale, _) = _block_operands(4096, m=4)
    out = torch.full((4, 256), float("nan"), dtype=torch.bfloat16)
    y = launcher(Candidate(TORCH), layer, None)(x, x_scale, weight, weight_scale, None, out=out)
    assert y is out and not y.isnan().any() and scaled_mm_calls[0][0] is x


@pytest.mark.parametrize("bucket", [Bucket(1, 1), Bucket(65, 256), Bucket(1025, None)])
def test_a_fast_accum_layer_runs_fast_scaled_mm_and_v8_without_promotion(bucket):
    layer = LayerShape(4096, 4096, "float8_e4m3fn", "row", fast_accum=True)
    found = candidates(layer, bucket, 4096)
    assert [c.rung for c in found].count(V8) >= 1
    assert all(dict(c.knobs)["promote_k"] is None for c in found if c.rung == V8)
    assert launcher(Candidate(TORCH), layer, None).keywords["use_fast_accum"] is True


@pytest.mark.parametrize("bucket", [Bucket(2, 16), Bucket(65, 256), Bucket(1025, None)])
def test_a_precise_layers_v8_for_any_m_overlaps_its_promotions_in_short_runs(bucket):
    """v8 for any M keeps its tile walk's counts in registers: a precise fp8 layer's v8
    candidates promote every 128 K, overlapped where the heuristic says in runs of at most
    MOST_SPLIT_OVERLAP K blocks (split tiles too), and past 64 rows one more (`halves_tile`,
    whole) overlaps them by halves of its columns, in the heuristic's runs (two sets of
    accumulators: longer runs fit); asked for longer runs not by halves, v8 for any M refuses
    them in one line."""
    layer = LayerShape(4096, 4096, "float8_e4m3fn", "row")
    found = [dict(c.knobs) for c in candidates(layer, bucket, 4096) if c.rung == V8]
    halved = [k for k in found if k["promote_halves"]]
    assert all(k["promote_k"] == 128 and (k["promote_overlap"] or 0) <= MOST_SPLIT_OVERLAP
               for k in found if not k["promote_halves"])
    assert any(k["split_k"] > 1 and k["promote_overlap"] for k in found)
    assert len(halved) == (1 if bucket.most(4096) > v8.MEDIUM_ROWS else 0)
    assert all(k["split_k"] == 1 and k["promote_overlap"] for k in halved)
    heuristic = schedules.get("gemm", V8).defaults_for
    assert all(k["promote_overlap"] == heuristic(layer.gemm(bucket.most(4096)), {
        knob: value for knob, value in k.items() if knob != "promote_overlap"})["promote_overlap"]
        for k in halved)
    longer = {**found[0], "block_m": 128, "block_n": 128, "stages": 6, "split_k": 1,
              "split_tail": False, "promote_halves": False,
              "promote_overlap": 2 * MOST_SPLIT_OVERLAP}
    with pytest.raises(ScheduleNotApplicable,
                       match=re.escape(f"runs of more than {MOST_SPLIT_OVERLAP} K blocks spill")):
        v8.v8_kernel_any_m(layer.gemm(4096), **longer)


def test_v8_for_any_m_by_halves_with_block_scales_refuses_a_split_last_wave_alone():
    """The one form of v8 for any M by halves on split tiles that did not finish on a GPU:
    block scales with split_tail; K split on every tile builds, as split_tail does rowwise."""
    wl = LayerShape(4608, 3584, "float8_e4m3fn", "block").gemm(2048)
    with pytest.raises(ScheduleNotApplicable,
                       match=r"split_k=1\), not in a last wave alone .*split_tail=True"):
        v8.v8_kernel_any_m(wl, open_ended=True, **_split_halves_knobs(wl, split_tail=True))
    assert v8.v8_kernel_any_m(wl, **_split_halves_knobs(wl, split_tail=False)) is not None
    row = LayerShape(4608, 3584, "float8_e4m3fn", "row").gemm(2048)
    assert v8.v8_kernel_any_m(row, open_ended=True, **_split_halves_knobs(row, split_tail=True))


def test_the_open_buckets_split_kernel_holds_a_last_wave_of_any_m():
    """The last bucket takes any M, past max_tokens too: its K split (split_tail) keeps the
    partials of a last wave of any M's tiles (131 of them on 132 SMs); a closed bucket's, of
    its most rows' tiles. 1000 x 1000 at max_tokens 64: 8 tiles of 64x128, where M = 65 splits
    16 (the GPU tier's illegal memory access at M = 65, 1 run in 13)."""
    from schedules.v8.knobs import Knobs
    from schedules.v8.plan import Plan

    layer = LayerShape(1000, 1000, "float8_e4m3fn", "row")
    knobs = {"block_m": 64, "block_n": 128, "split_k": 8, "split_tail": True, "stages": 6,
             "group_m": 8, "tma_store": False, "cluster_m": 1, "cluster_n": 1, "pingpong": False,
             "promote_k": 128, "promote_overlap": None}
    wl = layer.gemm(64)
    closed = Plan.build(wl, Knobs(**knobs), 132, most_m=64)
    open_ended = Plan.build(wl, Knobs(**knobs), 132, most_m=64, open_ended=True)
    assert (closed.most_tiles, open_ended.most_tiles) == (8, 131)
    assert v8.any_m_partial_bytes(wl, 64, 128, 8, True, open_ended=True) == 131 * 8 * 64 * 128 * 4
    with pytest.raises(ScheduleNotApplicable, match="splits K only with split_tail"):
        Plan.build(wl, Knobs(**{**knobs, "split_tail": False}), 132, most_m=64, open_ended=True)
    last = Bucket(17, None)
    split = [c for c in candidates(layer, last, 64) if dict(c.knobs).get("split_k", 1) > 1]
    assert split and all(dict(c.knobs)["split_tail"] for c in split)
    source = build_candidate(layer, last, split[0], 64, "sm_90").mod.imports[0].inspect_source()
    split_knobs = dict(split[0].knobs)
    assert f"[{131 * split_knobs['split_k'] * split_knobs['block_m'] * split_knobs['block_n'] // 4}]" \
        in source, "the partials: 131 tiles x slices of float4s"


@pytest.mark.parametrize("scales", SCALES)
def test_v8_for_an_fp8_bucket_takes_m_and_the_scales_form_at_each_call(scales):
    """One build serves every M: A's rows, and (rowwise) A_scale's length, are the size M."""
    layer = LayerShape(1024, 2048, "float8_e4m3fn", scales)
    chosen = next(c for c in candidates(layer, Bucket(17, 64), 4096) if c.rung == V8)
    script = v8.v8_kernel_any_m(layer.gemm(64), **dict(chosen.knobs)).script()
    a_scale = {"row": 'A_scale: T.Buffer((M,), "float32")',
               "block": 'A_scale: T.Buffer((M, 16), "float32")'}.get(
                   scales, 'A_scale: T.Buffer((1,), "float32")')
    assert 'A: T.Buffer(("M", 2048), "float8_e4m3fn"' in script and a_scale in script
    source = build_candidate(layer, Bucket(17, 64), chosen, 4096, "sm_90").mod.imports[0] \
        .inspect_source()
    assert "int " in source.split("__global__")[-1].split("{")[0]


@pytest.mark.parametrize("scales", SCALES)
def test_v8_runs_get_flat_scales_and_a_bfloat16_output(scales):
    """The module hands runs x_scale as (M, 1), (M, K blocks) or one element and weight_scale
    as (N, 1), (N blocks, K blocks) or one element; v8's kernel takes them flat, (M,) and (N,)
    or (1,) each, and block scales as they are."""
    calls = []
    layer = LayerShape(32, 300, "float8_e4m3fn", scales)
    run = launcher(Candidate(V8), layer, lambda *args: calls.append(args))
    weight, weight_scale, bias = _weights(k=300, scales=scales)
    x_scale = torch.ones(layer.x_scale_shape((5,)))
    out = run(torch.zeros(5, 300).to(FP8), x_scale, weight, weight_scale, bias)
    x, w, a_scale, b_scale, c = calls[0]
    assert (a_scale.shape, b_scale.shape) == {"row": ((5,), (32,)), "block": ((5, 3), (1, 3)),
                                              "tensor": ((1,), (1,))}[scales]
    assert c.shape == (5, 32) and c.dtype == torch.bfloat16 and out is c


def test_a_candidate_that_raises_is_a_failed_one_not_a_crash():
    class Probe:
        m = 5

        def error(self, run):
            return run()

    def refused():
        raise RuntimeError("Expected both dimensions of mat2 to be divisible by 16\nmore")

    errors, why = _check(refused, [Probe()], 1e-2)
    assert errors == {} and why == "raised RuntimeError: Expected both dimensions of mat2 to " \
        "be divisible by 16"


# -- the module ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scale, scales", [
    (torch.tensor(0.5), "tensor"), (torch.full((1,), 0.5), "tensor"),
    (torch.rand(32, 1), "row"), (torch.rand(1, 32), "row"), (torch.rand(1, 3), "block")])
def test_from_float8_takes_the_scale_form_the_weight_scale_has(scale, scales):
    weight, _, bias = _weights(k=300)
    layer = linear.Linear.from_float8(weight, scale, bias)
    assert layer.scales == scales and layer.shape.scales == scales
    assert layer.weight_scale.shape == {"row": (32, 1), "block": (1, 3), "tensor": ()}[scales]
    assert layer.weight_scale.data_ptr() == scale.data_ptr()  # shared, not copied
    assert layer.out_dtype == torch.bfloat16 and layer.bias.dtype == torch.bfloat16
    assert "scales=" + scales in repr(layer)


@pytest.mark.parametrize("scales, shape", [("block", (1, 64)), ("row", (64, 1))])
def test_from_float8_takes_the_form_named_where_the_scales_shape_fits_two(scales, shape):
    """A 64 x 8192 weight's scale of shape (1, 64) is one per output feature (torch._scaled_mm's
    1 x N) or one per 128 x 128 block (one block of N, 64 of K): `scales` says which."""
    layer = linear.Linear.from_float8(torch.randn(64, 8192).to(FP8), torch.rand(1, 64),
                                      scales=scales)
    assert layer.scales == scales and layer.weight_scale.shape == shape
    with pytest.raises(BadInput, match="for scales='tensor'"):
        linear.Linear.from_float8(torch.randn(64, 8192).to(FP8), torch.rand(1, 64),
                                  scales="tensor")


@pytest.mark.parametrize("args, message", [
    ((torch.randn(32, 64), torch.tensor(1.0)), "weight is torch.float32 of shape"),
    ((torch.randn(32, 64).to(FP8), torch.rand(31, 1)), r"weight_scale is torch.float32 of shape "
                                                       r"\(31, 1\), not .* or \(1, 1\) \(one "
                                                       "per 128 x 128 block"),
    ((torch.randn(32, 64).to(FP8), torch.tensor(1.0, dtype=torch.bfloat16)),
     "weight_scale is torch.bfloat16"),
    ((torch.randn(32, 64).to(FP8), torch.tensor(1.0), torch.zeros(32)),
     "bias is torch.float32 of shape"),
    ((torch.randn(64, 32).to(FP8).T, torch.tensor(1.0)), r"weight has strides \(1, 32\), not "
                                                         "contiguous ones"),
    ((torch.randn(256, 256).to(FP8), torch.rand(2, 2).T), r"weight_scale has strides \(1, 2\), "
                                                           "not contiguous ones"),
    # 64 x 8192: one block of N, 64 of K; (1, 64) is a row's shape (1 x N) and a block's
    ((torch.randn(64, 8192).to(FP8), torch.rand(1, 64)), "fits scales row and block: name one"),
    ((torch.randn(32, 64).to(FP8), 1.0), r"weight_scale is not a torch.Tensor \(float\)"),
    ((None, torch.tensor(1.0)), r"weight is not a torch.Tensor \(NoneType\)"),
    ((torch.randn(32, 64).to(FP8), torch.tensor(1.0), 0.5), r"bias is not a torch.Tensor"),
])
def test_from_float8_refuses_a_weight_scale_or_bias_it_cannot_take_in_one_line(args, message):
    with pytest.raises(BadInput, match=message) as refused:
        linear.Linear.from_float8(*args)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("scales", SCALES)
def test_an_fp8_state_dict_round_trips_and_holds_weight_scale_and_bias(scales):
    weight, scale, bias = _weights(scales=scales)
    saved = linear.Linear.from_float8(weight, scale, bias).state_dict()
    assert list(saved) == ["weight", "bias", "weight_scale"]
    fresh = linear.Linear(64, 32, dtype=FP8, scales=scales)
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.weight.view(torch.uint8), weight.view(torch.uint8))
    assert torch.equal(fresh.weight_scale, scale) and torch.equal(fresh.bias, bias)
    assert fresh.shape == linear.Linear.from_float8(weight, scale, bias).shape


def test_a_16_bit_state_dict_has_no_weight_scale():
    assert list(linear.Linear(64, 32).state_dict()) == ["weight", "bias"]


def _fp8_layer(scales, rungs=None, device="cpu", **options):
    """An fp8 Linear (64 -> 32, bias); with `rungs`, kernels for buckets 1 and 2- whose
    candidates are so named and whose runs are torch's (no GPU needed for checks and tracing)."""
    weight, scale, bias = _weights(scales=scales, device=device)
    layer = linear.Linear.from_float8(weight, scale, bias, buckets=buckets_from_edges((1, 2)),
                                      **options)
    if rungs:
        kernels = LayerKernels(layer.shape, BucketTable(layer.buckets))
        kernels.kernels = [BucketKernel(Candidate(rung),
                                        launcher(Candidate(TORCH), layer.shape, None), "test")
                           for rung in rungs]
        layer.kernels = kernels
    return layer


def _x(m, scales, dtype=FP8, device="cpu", lead=()):
    """x of m rows (after `lead` dimensions) and its scale in the form `scales` says."""
    x = torch.zeros(*lead, m, 64, device=device).to(dtype)
    layer = LayerShape(32, 64, "float8_e4m3fn", scales)
    return x, torch.ones(layer.x_scale_shape((*lead, m)), device=device)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches emptied: every layer's forward is one code object to dynamo, whose
    recompilations across these many tests would pass its limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("m", [0, 1, 5, 300])
def test_a_compiled_fp8_layer_traces_every_m_with_fake_kernels(scales, m, fresh_dynamo):
    layer = _fp8_layer(scales, device="meta")
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        out = compiled(*_x(m, scales, device="meta", lead=(2,)))
    assert out.shape == (2, m, 32) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("rungs, m, operator", [
    ((TORCH, TORCH), 1, False),  # every bucket torch's: _scaled_mm at any M
    ((V8, TORCH), 5, False),  # M fixed at tracing, its bucket torch's
    ((V8, TORCH), 1, True),  # M's bucket a TVM kernel: the operator
])
def test_a_compiled_fp8_layer_is_scaled_mm_where_the_rows_bucket_runs_torch(scales, rungs, m,
                                                                           operator, fresh_dynamo):
    layer = _fp8_layer(scales, rungs, device="meta")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    with torch.no_grad():
        out = torch.compile(layer, backend=backend, fullgraph=True, dynamic=False)(
            *_x(m, scales, device="meta", lead=(1,)))
    assert ("tvm_explorer.linear_fp8" in graphs[0]) == operator
    torch_call = "_C._nn.linear" if scales == "block" else "_scaled_mm"  # block: K 64, dequantized
    assert (torch_call in graphs[0]) != operator
    assert out.shape == (1, m, 32) and out.dtype == torch.bfloat16


def test_a_compiled_fast_accum_layer_traces_as_fast_scaled_mm(fresh_dynamo):
    layer = _fp8_layer("row", (TORCH, TORCH), device="meta", fast_accum=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    with torch.no_grad():
        torch.compile(layer, backend=backend, fullgraph=True)(*_x(5, "row", device="meta"))
    assert "use_fast_accum = True" in graphs[0]


@pytest.mark.parametrize("scales, x_scale, check", [
    ("tensor", torch.ones((), device="meta"), False),
    ("row", torch.ones(3, 1, device="meta"), False),
    ("row", torch.ones(3, device="meta"), True),  # not one scale per row as a column
    ("row", torch.ones(3, 1, dtype=torch.float16, device="meta"), True),
    ("block", torch.ones(3, 1, device="meta"), False),  # 64 features: one block
    ("block", torch.ones(3, 2, device="meta"), True),
])
def test_a_compiled_fp8_layer_checks_at_each_call_only_where_it_traced_a_bad_x_scale(
        scales, x_scale, check):
    from tests.test_linear import _traced_check

    layer = _fp8_layer(scales, (TORCH, V8), device="meta")  # M = 3: v8, the operator
    x = torch.zeros(3, 64, device="meta").to(FP8)
    assert _traced_check(layer, x, x_scale) is check


@pytest.mark.parametrize("scales, x, x_scale, message", [
    ("tensor", torch.zeros(3, 64, dtype=torch.bfloat16), torch.ones(()),
     "input x is torch.bfloat16, not the weight's torch.float8_e4m3fn"),
    ("tensor", torch.zeros(3, 65).to(FP8), torch.ones(()), "input x has 65 features"),
    ("tensor", torch.zeros(3, 64).to(FP8), None, "x_scale is missing: .* torch.float32 of "
                                                 r"shape \(\) or \(1,\)"),
    ("row", torch.zeros(3, 64).to(FP8), None, r"x_scale is missing: .* shape \(3, 1\)"),
    ("tensor", torch.zeros(3, 64).to(FP8), torch.ones((), dtype=torch.float16),
     "x_scale is torch.float16 of shape"),
    ("tensor", torch.zeros(3, 64).to(FP8), torch.ones(3, 1), r"x_scale is torch.float32 of "
                                                            r"shape \(3, 1\), not .* \(\) or"),
    ("row", torch.zeros(3, 64).to(FP8), torch.ones(3),
     r"x_scale is torch.float32 of shape \(3,\), not torch.float32 of shape \(3, 1\)"),
    ("row", torch.zeros(2, 3, 64).to(FP8), torch.ones(6, 1), r"shape \(6, 1\), not torch.float32 "
                                                            r"of shape \(2, 3, 1\)"),
    ("row", torch.zeros(3, 64).to(FP8), torch.ones(3, 1), "input x is on cpu"),
    ("tensor", torch.zeros(3, 64).to(FP8), 1.0,
     r"x_scale is not a torch.Tensor \(float\): it takes torch.float32"),
    ("block", torch.zeros(3, 64).to(FP8), torch.ones(3), r"x_scale is torch.float32 of shape "
                                                        r"\(3,\), not torch.float32 of shape "
                                                        r"\(3, 1\) \(one scale per row of x per "
                                                        "128 features"),
])
def test_bad_fp8_inputs_are_refused_in_one_line_naming_the_tensor(scales, x, x_scale, message):
    with pytest.raises(BadInput, match=message) as refused:
        _fp8_layer(scales, (TORCH, TORCH))(x, x_scale)
    assert "\n" not in str(refused.value) and str(refused.value).startswith("Linear(64, 32): ")


def test_a_scale_given_to_a_16_bit_layer_is_refused():
    layer = linear.Linear(64, 32)
    with pytest.raises(BadInput, match="x_scale is for float8_e4m3fn layers"):
        layer(torch.zeros(3, 64, dtype=torch.bfloat16), torch.ones(()))


@pytest.mark.parametrize("x_grad", [True, False])
def test_an_fp8_call_that_needs_a_gradient_is_refused_naming_the_tensor(x_grad):
    x, x_scale = _x(3, "row")
    (x if x_grad else x_scale).requires_grad_(True)
    name = "x" if x_grad else "x_scale"
    with pytest.raises(RuntimeError, match=f"is for inference: {name} requires a gradient"):
        _fp8_layer("row", (TORCH, TORCH))(x, x_scale)


@pytest.mark.parametrize("scale, message", [
    (torch.ones(32), r"weight_scale is torch.float32 of shape \(32,\), not torch.float32 of shape "
                     r"\(32, 1\)"),
    (torch.ones(32, 1, device="meta"), "weight_scale is on meta, not on the weight's cpu"),
    (torch.ones(32, 2)[:, :1], r"weight_scale has strides \(2, 1\), not contiguous ones"),
    (torch.full((32, 1), float("nan")), "weight_scale holds NaN or infinite values"),
    (torch.tensor([[1.0]] * 31 + [[float("inf")]]), "weight_scale holds NaN or infinite values")])
def test_prepare_refuses_a_weight_scale_of_another_shape_or_device_or_not_finite(scale, message):
    layer = _fp8_layer("row")
    layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
    with pytest.raises(BadInput, match=message):
        linear.prepare(layer)


@pytest.mark.parametrize("argv, message", [
    (["--shape", "40x"], "malformed shape '40x'"),
    (["--shape", "64x0"], "dimensions must be positive"),
    (["--shape", "64x64", "--edges", "1,2,2"], "bucket edges start at 1 and increase")])
def test_the_fp8_measuring_script_refuses_a_bad_shape_or_edges_in_one_line(argv, message):
    done = subprocess.run([sys.executable, MEASURING_SCRIPT, *argv], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr


def _measuring_script():
    """scripts/linear_fp8.py, imported as a module."""
    spec = importlib.util.spec_from_file_location("linear_fp8_script", MEASURING_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fp8_measuring_script_records_a_baseline_that_cublas_refused_as_raised(monkeypatch):
    """cuBLAS refuses some _scaled_mm forms (rowwise fast accumulation at K = 14336, once on the
    H200): the script records and prints what that baseline raised instead of ending in a
    traceback; our own layer raising still ends the run. On the CPU: torch's forms and the
    timers stand in for the GPU's."""
    script = _measuring_script()
    shape = LayerShape(32, 64, "float8_e4m3fn", "row")
    torch.manual_seed(0)
    ops = {"x": torch.randn(4, 64).to(FP8), "x_scale": torch.rand(4, 1) + 0.5,
           "weight": torch.randn(32, 64).to(FP8), "weight_scale": torch.rand(32, 1) + 0.5,
           "bias": torch.randn(32, dtype=torch.bfloat16)}
    answer = (dequantized(shape, ops["x"], ops["x_scale"])
              @ dequantized(shape, ops["weight"], ops["weight_scale"], True).T
              + ops["bias"].double()).to(torch.bfloat16)

    def torch_form(form):
        def call(*args):
            if form.fast_accum:
                raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling x\nmore")
            return answer
        return call

    class Layer:
        def __init__(self, right=True):
            self.shape, self.right = shape, right

        def __call__(self, x, x_scale):
            if not self.right:
                raise RuntimeError("our kernel failed")
            return answer

    monkeypatch.setattr(script, "torch_layer", torch_form)
    monkeypatch.setattr(script, "loop_us", lambda call: 30.0)
    monkeypatch.setattr(script.measure, "time_kernel",
                        lambda call, mode: types.SimpleNamespace(median_ms=0.02))
    found = script.compare_at(Layer(), ops)
    assert found["scaled_mm_fast"] == {
        "raised": "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling x"}
    assert found["ours"]["kernel_us"] == pytest.approx(20.0) and found["scaled_mm"]["error"] < 1e-2
    row = script.said("32x64", "M=4", 4, "v8", found, "scaled_mm_fast")
    assert "scaled_mm_fast raised CUDA error: CUBLAS_STATUS_NOT_SUPPORTED" in row
    assert "( 1.00x)" in script.said("32x64", "M=4", 4, "v8", found, "scaled_mm")
    with pytest.raises(RuntimeError, match="our kernel failed"):
        script.compare_at(Layer(right=False), ops)


def test_the_measuring_script_says_what_a_layer_refuses_in_one_line(monkeypatch, capsys):
    """Past its arguments' checks (a GPU here), what the layer refuses (a bucket whose rows pass
    int32 indices, max_tokens under 1) ends the script in one line, not a traceback."""
    script = _measuring_script()

    def refuses(shape, max_tokens, buckets):
        raise WorkloadError("A would hold 99 elements, more than int32 indices reach")

    monkeypatch.setattr(script.loader, "gpu_here", lambda: {"name": "stand-in"})
    monkeypatch.setattr(script, "measure_layer", refuses)
    monkeypatch.setattr(sys, "argv", ["linear_fp8.py", "--shape", "64x64", "--scales", "row"])
    assert script.main() == 2
    said = capsys.readouterr().err
    assert said == "linear_fp8: A would hold 99 elements, more than int32 indices reach\n"


# -- GPU tier ------------------------------------------------------------------------------------

EDGES, MAX_TOKENS = (1, 2, 17, 65), 256
EDGE_MS = (1, 2, 3, 16, 17, 18, 64, 65, 66, 255, 256, 300)  # each bucket's first, last, one past


@pytest.fixture(scope="module")
def gpu_cache(run_tmp):
    """One cache for the run's workers: a layer that several tests prepare is measured once."""
    return Cache(str(run_tmp / "linear-fp8-cache"))


def _gpu_layer(scales, cache, bias=True, n=768, k=1024, fast_accum=False):
    torch.manual_seed(0)
    weight, scale, bias = _weights(n, k, scales, bias, device="cuda")
    layer = linear.Linear.from_float8(weight, scale, bias, buckets=buckets_from_edges(EDGES),
                                      max_tokens=MAX_TOKENS, fast_accum=fast_accum)
    linear.prepare(layer, cache=cache, say=print)
    return layer


def _reference(layer, x, x_scale):
    """The layer's answer in float64: x and W dequantized by their scales (each block's, for
    block scales), then the bias."""
    rows = x.view(-1, x.shape[-1])
    scale = x_scale if layer.scales == "tensor" else x_scale.view(rows.shape[0], -1)
    w = dequantized(layer.shape, layer.weight, layer.weight_scale, weight=True)
    y = dequantized(layer.shape, rows, scale) @ w.T
    y = y.view(*x.shape[:-1], w.shape[0])
    return y + layer.bias.double() if layer.bias is not None else y


def _x_scale(layer, rows):
    """A random x_scale for x of leading shape `rows`, in the form the layer takes."""
    return torch.rand(layer.shape.x_scale_shape(rows), device="cuda") + 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("scales, bias, fast_accum", [
    (scales, bias, fast) for scales in SCALES
    for bias, fast in [(True, False), (False, False), (True, True)]
    if not (scales == "block" and fast)])  # block scales take no fast_accum (a CPU test's)
def test_fp8_linear_is_right_at_every_buckets_edges(scales, bias, fast_accum, gpu_cache):
    """First M, last M and one past each bucket against float64, in bfloat16."""
    layer = _gpu_layer(scales, gpu_cache, bias, fast_accum=fast_accum)
    for m in EDGE_MS:
        x = torch.randn(m, 1024, device="cuda").to(FP8)
        x_scale = _x_scale(layer, (m,))
        with torch.no_grad():
            y = layer(x, x_scale)
        ref = _reference(layer, x, x_scale)
        err = float((y.double() - ref).norm() / ref.norm())
        assert y.shape == (m, 768) and y.dtype == torch.bfloat16 and err < 1e-2, (m, err)


@pytest.mark.gpu
@pytest.mark.parametrize("scales", SCALES)
def test_fp8_linear_takes_any_leading_shape_and_an_empty_batch(scales, gpu_cache):
    layer = _gpu_layer(scales, gpu_cache)
    x = torch.randn(2, 9, 1024, device="cuda").to(FP8)
    x_scale = _x_scale(layer, (2, 9)).view(-1) if scales == "tensor" else _x_scale(layer, (2, 9))
    with torch.no_grad():
        y = layer(x, x_scale)
        empty = layer(x[:, :0], x_scale if scales == "tensor" else x_scale[:, :0])
    ref = _reference(layer, x, x_scale)
    assert y.shape == (2, 9, 768) and float((y.double() - ref).norm() / ref.norm()) < 1e-2
    assert empty.shape == (2, 0, 768) and empty.dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("scales", SCALES)
def test_every_fp8_candidate_passes_every_probe(scales, gpu_cache):
    """v8 for any M with each scale form, and _scaled_mm, are correct at every bucket's probe
    Ms (none left out by its float64 check)."""
    layer = _gpu_layer(scales, gpu_cache)
    statuses = {(bucket, name): result["status"]
                for bucket, k in enumerate(layer.kernels.kernels)
                for name, result in k.measured.items()}
    assert any(name.startswith("v8") for _, name in statuses)
    assert set(statuses.values()) == {"ok"}, statuses


def _split_halves_knobs(wl, split_tail):
    """v8's knobs for wl with its tile of 128 rows promoted by halves, K split in two."""
    return schedules.get("gemm", V8).defaults_for(wl, {
        "block_m": 128, "block_n": 192, "split_k": 2, "split_tail": split_tail,
        "promote_halves": True, "swap_ab": False})


@pytest.mark.gpu
@pytest.mark.parametrize("scales, open_ended", [
    (scales, open_ended) for scales in SCALES for open_ended in (False, True)
    if not (scales == "block" and open_ended)])  # refused: a CPU test's
def test_v8_for_any_m_by_halves_on_split_tiles_is_right_at_any_m(scales, open_ended):
    """v8 for any M with its promotions by halves and K split (every tile, or with split_tail
    those of a last wave), built for up to 2048 rows (open_ended: any M past it too), against
    float64 at Ms from one row to past its most."""
    shape = LayerShape(4608, 3584, "float8_e4m3fn", scales)
    knobs = _split_halves_knobs(shape.gemm(2048), split_tail=open_ended)
    func = v8.v8_kernel_any_m(shape.gemm(2048), open_ended=open_ended, **knobs)
    kernel = build.build(tvm.IRModule({"main": func}), build.cuda_target("sm_90"))["main"]
    for m in (1, 65, 300, 1000, 2048) + ((3000,) if open_ended else ()):
        wl = shape.gemm(m)
        inputs, out = measure.random_inputs(wl, seed=m), measure.poisoned_output(wl)
        result = measure.check(wl, lambda: (kernel(*inputs, out), out)[1], inputs,
                               measure.tolerance(wl))
        assert result["status"] == "ok", (m, knobs, result)


@pytest.mark.gpu
def test_fp8_scale_forms_have_cache_entries_of_their_own_and_load_from_them(gpu_cache):
    first = {scales: _gpu_layer(scales, gpu_cache) for scales in SCALES}
    again = {scales: _gpu_layer(scales, gpu_cache) for scales in SCALES}
    entries = {k.entry for layer in first.values() for k in layer.kernels.kernels}
    assert len(entries) == len(SCALES) * len(EDGES) and all(os.path.isdir(e) for e in entries)
    for scales in SCALES:
        assert {k.source for k in again[scales].kernels.kernels} == {"cache"}
        assert [k.candidate for k in again[scales].kernels.kernels] == \
            [k.candidate for k in first[scales].kernels.kernels]


@pytest.mark.gpu
@pytest.mark.parametrize("scales", SCALES)
def test_a_compiled_fp8_layer_matches_the_eager_one(scales, gpu_cache, fresh_dynamo):
    """Compiled by inductor for any M: the eager output at every bucket, M's kernel called into
    inductor's buffer wherever a bucket runs one of ours (linear/inductor.py)."""
    from torch._inductor.utils import run_and_get_code  # lazy: seconds to import

    layer = _gpu_layer(scales, gpu_cache)
    compiled, codes = torch.compile(layer, dynamic=True), []
    for m in (1, 20, 300):
        x = torch.randn(m, 1024, device="cuda").to(FP8)
        x_scale = _x_scale(layer, (m,))
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            (y, code), eager = run_and_get_code(compiled, x, x_scale), layer(x, x_scale)
        codes += code
        assert y.dtype == torch.bfloat16 and float((y - eager).float().norm()
                                                   / eager.float().norm()) < 4e-3, m
    ours = any(k.candidate.rung != TORCH for k in layer.kernels.kernels)
    assert ("extern_kernels.tvm_explorer_linear_fp8(" in "".join(codes)) == ours, \
        linear.inductor.unavailable


@pytest.mark.gpu
def test_an_fp8_scale_on_another_device_or_strided_is_refused(gpu_cache):
    layer = _gpu_layer("row", gpu_cache)
    x = torch.zeros(3, 1024, device="cuda").to(FP8)
    with pytest.raises(BadInput, match="x_scale is on cpu, not on x's cuda:0"):
        layer(x, torch.ones(3, 1))
    with pytest.raises(BadInput, match="x_scale has strides"):
        layer(x, torch.ones(1, 6, device="cuda")[:, ::2].T)


@pytest.mark.gpu
@pytest.mark.parametrize("scales", SCALES)
def test_an_fp8_layer_replays_from_a_cuda_graph_with_new_inputs(scales, gpu_cache):
    """Captured once (kernels prepared before), replayed on new x and x_scale copied into the
    captured tensors: the eager call's answer, at an M of each kind of bucket."""
    layer = _gpu_layer(scales, gpu_cache)
    for m in (1, 40, 300):
        x = torch.randn(m, 1024, device="cuda").to(FP8)
        x_scale = _x_scale(layer, (m,))
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            layer(x, x_scale)
            with torch.cuda.graph(graph):
                y = layer(x, x_scale)
            fresh = torch.randn(m, 1024, device="cuda").to(FP8)
            fresh_scale = torch.rand_like(x_scale) + 0.5
            x.copy_(fresh)
            x_scale.copy_(fresh_scale)
            graph.replay()
            eager = layer(fresh, fresh_scale)
        assert float((y - eager).float().norm() / eager.float().norm()) < 4e-3, m



def _small_layer(n, k, scales, cache):
    """An fp8 layer of n x k with buckets 1, 2-16 and 17- up to 64 rows, prepared."""
    torch.manual_seed(0)
    weight, scale, bias = _weights(n, k, scales, device="cuda")
    layer = linear.Linear.from_float8(weight, scale, bias, buckets=buckets_from_edges((1, 2, 17)),
                                      max_tokens=64)
    linear.prepare(layer, cache=cache, say=print)
    return layer


def _assert_right_at_the_edges(layer):
    """The layer against float64 at each of its buckets' first and last M and one past."""
    for m in (1, 2, 16, 17, 64, 65):
        x = torch.randn(m, layer.in_features, device="cuda").to(FP8)
        x_scale = _x_scale(layer, (m,))
        with torch.no_grad():
            y = layer(x, x_scale)
        ref = _reference(layer, x, x_scale)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2, m


@pytest.mark.gpu
def test_a_ragged_fp8_layer_that_scaled_mm_refuses_runs_v8(gpu_cache):
    """1000 x 1000: _scaled_mm takes no K or N that is not a multiple of 16, so its candidate is
    recorded as failed (what it raised), not a crash; v8, which stages rows TMA cannot load,
    serves every bucket of several Ms (skinny or v8 a bucket of one M), right against float64."""
    layer = _small_layer(1000, 1000, "row", gpu_cache)
    for bucket, kernel in zip(layer.buckets, layer.kernels.kernels):
        assert kernel.candidate.rung in ((V8, SKINNY) if bucket.one_m else (V8,))
        assert kernel.measured[TORCH]["error"].startswith("raised ")
    _assert_right_at_the_edges(layer)


@pytest.mark.gpu
def test_a_block_scaled_layers_v8_in_pairs_passes_every_probe(gpu_cache):
    """v8 for any M with its tiles in clusters of 2 along N (the last bucket's default, see
    PAIRED_LAYER) passes its float64 check at each probe M, as every other candidate does."""
    n, k, edges, most = PAIRED_LAYER
    torch.manual_seed(0)
    weight, scale, bias = _weights(n, k, "block", device="cuda")
    layer = linear.Linear.from_float8(weight, scale, bias, buckets=buckets_from_edges(edges),
                                      max_tokens=most)
    linear.prepare(layer, cache=gpu_cache, say=print)
    statuses = {name: result["status"] for kernel in layer.kernels.kernels
                for name, result in kernel.measured.items()}
    assert any("cluster_n=2" in name for name in statuses)
    assert set(statuses.values()) == {"ok"}, statuses


@pytest.mark.gpu
def test_a_block_scaled_layer_whose_k_cublas_refuses_runs_the_dequantizing_call_or_v8(gpu_cache):
    """K = 1000 (a last, shorter scale block; not whole groups of 512): torch's candidate
    dequantizes x and W, then calls F.linear, and v8 multiplies each K block's sums by its
    scales; both pass their float64 checks, and the layer is right at every bucket's edges."""
    layer = _small_layer(300, 1000, "block", gpu_cache)
    for kernel in layer.kernels.kernels:
        assert kernel.measured[TORCH]["status"] == "ok"
        assert any(name.startswith("v8") and result["status"] == "ok"
                   for name, result in kernel.measured.items())
    _assert_right_at_the_edges(layer)
