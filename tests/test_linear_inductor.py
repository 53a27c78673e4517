"""The layer compiled by inductor (linear/inductor.py): M's kernel called into inductor's buffer
where the traced call is unchecked, the operator kept where it must check x. On the CPU: the
operators get a CPU implementation here, and the buckets run torch's calls, recording each run."""

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import linear
from linear import inductor
from linear.buckets import BucketTable, buckets_from_edges
from linear.candidates import TORCH, Candidate, launcher, scaled_linear
from linear.module import _LAYERS
from linear.portfolio import BucketKernel, LayerKernels

FP8 = torch.float8_e4m3fn


@pytest.fixture
def on_cpu():
    """The operators on CPU tensors, as their CUDA implementations run on the GPU but that x is
    not checked: each call's check flag is recorded in the list yielded. Dynamo's and
    inductor's caches are emptied around each test (a cached graph would skip the lowering)."""
    checks = []
    library = torch.library.Library("tvm_explorer", "IMPL")
    library.impl("linear", lambda x, w, b, layer, check=True: checks.append(check)
                 or _LAYERS[layer].call(x, w, b, False), "CPU")
    library.impl("linear_fp8", lambda x, xs, w, ws, b, layer, check=True: checks.append(check)
                 or _LAYERS[layer].call_fp8(x, xs, w, ws, b, False), "CPU")
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():
        yield checks
    torch._dynamo.reset()
    library._destroy()


def _kernels(layer, runs: list) -> None:
    """Give the layer buckets M = 1 and 2- that each run torch's call as a TVM kernel would be
    run, appending (bucket, whether into a given buffer) to `runs`."""
    torch_run = launcher(Candidate(TORCH), layer.shape, None)

    def bucket(index):
        def run(*args, out=None):
            runs.append((index, out is not None))
            return torch_run(*args, out=out)
        return BucketKernel(Candidate("v8"), run, "test")

    kernels = LayerKernels(layer.shape, BucketTable(layer.buckets))
    kernels.kernels = [bucket(0), bucket(1)]
    layer.kernels = kernels


def _layer(bias: bool, runs: list):
    torch.manual_seed(0)
    layer = linear.Linear(64, 32, bias=bias, dtype=torch.float32,
                          buckets=buckets_from_edges((1, 2)))
    torch.nn.init.normal_(layer.weight)
    if bias:
        torch.nn.init.normal_(layer.bias)
    _kernels(layer, runs)
    return layer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 64), (1, 64)])
def test_inductor_runs_the_rows_kernel_into_its_own_buffer(bias, shape, on_cpu):
    runs = []
    layer = _layer(bias, runs)
    x = torch.randn(shape)
    out, (code,) = run_and_get_code(torch.compile(layer), x)
    assert "extern_kernels.tvm_explorer_linear(" in code, inductor.unavailable
    assert "torch.ops.tvm_explorer" not in code and on_cpu == []
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    rows = x.numel() // 64
    assert runs == [(0 if rows == 1 else 1, True)]


def test_inductor_picks_each_calls_bucket_where_m_is_dynamic(on_cpu):
    runs = []
    layer = _layer(True, runs)
    compiled = torch.compile(layer, dynamic=True)
    for m in (7, 1, 40):
        x = torch.randn(1, m, 64)
        torch.testing.assert_close(compiled(x), F.linear(x, layer.weight, layer.bias))
    assert runs == [(1, True), (0, True), (1, True)] and on_cpu == []


def test_the_operator_stays_where_the_traced_call_checks_x(on_cpu):
    """A non-contiguous x, as traced, is one the eager call refuses: the compiled call keeps the
    operator, whose call checks x in the eager line (here the stand-in records check=True)."""
    runs = []
    layer = _layer(False, runs)
    x = torch.randn(64, 5).T
    out, (code,) = run_and_get_code(torch.compile(layer), x)
    assert "torch.ops.tvm_explorer.linear.default(" in code and "extern_kernels.tvm" not in code
    assert on_cpu == [True] and runs == [(1, False)]
    torch.testing.assert_close(out, F.linear(x, layer.weight))


@pytest.mark.parametrize("scales", ["tensor", "row"])
def test_inductor_runs_an_fp8_layers_kernel_into_its_own_buffer(scales, on_cpu):
    runs = []
    torch.manual_seed(0)
    weight = torch.randn(32, 64).to(FP8)
    scale = torch.rand(32, 1) + 0.5 if scales == "row" else torch.tensor(0.75)
    layer = linear.Linear.from_float8(weight, scale, torch.randn(32).bfloat16(),
                                      buckets=buckets_from_edges((1, 2)))
    _kernels(layer, runs)
    x = torch.randn(2, 3, 64).to(FP8)
    x_scale = torch.rand(2, 3, 1) + 0.5 if scales == "row" else torch.tensor(1.25)
    out, (code,) = run_and_get_code(torch.compile(layer), x, x_scale)
    assert "extern_kernels.tvm_explorer_linear_fp8(" in code, inductor.unavailable
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 32) and on_cpu == []
    rows_scale = x_scale.view(6, 1) if scales == "row" else x_scale
    expected = scaled_linear(x.view(6, 64), rows_scale, layer.weight, layer.weight_scale,
                             layer.bias)
    torch.testing.assert_close(out, expected.view(2, 3, 32))
    assert runs == [(1, True)]


def test_where_inductor_cannot_take_the_call_the_operator_stays(on_cpu, monkeypatch):
    """An inductor unlike the one this was written for (`unavailable` set): the operator is
    compiled as inductor compiles any operator, and runs unchecked as before."""
    monkeypatch.setattr(inductor, "unavailable", "an inductor unlike this one's")
    runs = []
    layer = _layer(True, runs)
    x = torch.randn(5, 64)
    out, (code,) = run_and_get_code(torch.compile(layer), x)
    assert "torch.ops.tvm_explorer.linear.default(" in code and "extern_kernels.tvm" not in code
    assert on_cpu == [False] and runs == [(1, False)]
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))


@pytest.mark.slow  # inductor compiles its C++ wrapper: 15-20 s
def test_where_inductor_writes_cpp_the_operator_stays(on_cpu):
    """cpp_wrapper (as AOTInductor): the wrapper is C++, which cannot call the layer's Python,
    so the operator stays, called through the dispatcher."""
    runs = []
    layer = _layer(True, runs)
    x = torch.randn(5, 64)
    with torch._inductor.config.patch(cpp_wrapper=True):
        out, codes = run_and_get_code(torch.compile(layer), x)
    assert 'aoti_torch_call_dispatcher("tvm_explorer::linear"' in "".join(codes)
    assert on_cpu == [False] and runs == [(1, False)]
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
