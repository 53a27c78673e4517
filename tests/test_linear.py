"""linear/: buckets, candidates, the disk cache, the module's tracing and state_dict (CPU tier);
numerics at every bucket's edges and the measured choice (GPU tier)."""

import json
import multiprocessing
import os
import re
import threading

import pytest
import torch

import linear
import linear_farm_stand_in as stand_in
import schedules
from linear import cache as cache_module
from linear import portfolio
from linear.buckets import Bucket, BucketTable, buckets_from_edges
from linear.cache import Cache, CorruptEntry
from linear.candidates import (TORCH, V8, Candidate, LayerShape, build_candidate,
                               candidates, launcher)
from schedules.errors import UsageError
from schedules.v8.geometry import MOST_SPLIT_OVERLAP
from tuning.explore import portfolio as best_portfolio
from tuning.loader import BadInput


def test_buckets_cover_every_m_once_and_the_table_finds_each():
    buckets = buckets_from_edges((1, 2, 17, 65))
    table = BucketTable(buckets)
    for m in range(1, 300):
        bucket = buckets[table.index(m)]
        assert bucket.first <= m and (bucket.last is None or m <= bucket.last)
    assert buckets[-1].last is None


@pytest.mark.parametrize("edges", [(), (2, 3), (1, 5, 5), (1, 9, 4)])
def test_bucket_edges_must_start_at_1_and_increase(edges):
    with pytest.raises(UsageError):
        buckets_from_edges(edges)


@pytest.mark.parametrize("buckets, message", [
    ((Bucket(1, 1), Bucket(3, None)), "not M=1, M=3-"),  # M = 2 would run M = 1's kernel
    ((Bucket(1, 4), Bucket(3, None)), "not M=1-4, M=3-"),
    ((Bucket(1, 4), Bucket(5, 9)), "the last open"),
    ((Bucket(1, 4), Bucket(5, 3), Bucket(4, None)), "not M=1-4, M=5-3, M=4-"),
    ((), "Buckets covering every M from 1"),
    ("1,2,17", "Buckets covering every M from 1"),
    ((2, 3), "bucket edges start at 1"),
])
def test_a_layer_refuses_buckets_that_leave_an_m_to_the_wrong_kernel(buckets, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        linear.Linear(64, 64, buckets=buckets)


def test_a_layer_takes_its_buckets_first_ms_as_edges():
    assert linear.Linear(64, 64, buckets=[1, 2, 17]).buckets == buckets_from_edges((1, 2, 17))
    assert linear.Linear(64, 64).buckets == buckets_from_edges()


def test_probes_are_a_buckets_edges_and_a_middle_where_they_are_far_apart():
    assert Bucket(1, 1).probes(4096) == (1,)
    assert Bucket(2, 16).probes(4096) == (2, 6, 16)
    assert Bucket(17, 64).probes(4096) == (17, 33, 64)
    assert Bucket(65, 128).probes(4096) == (65, 128)
    assert Bucket(1025, None).probes(4096) == (1025, 2049, 4096)


def test_candidates_always_include_torch_gemv_rungs_at_one_row_and_v8_elsewhere():
    layer = LayerShape(2048, 2048, "bfloat16")
    one = [c.rung for c in candidates(layer, Bucket(1, 1), 4096)]
    assert one[0] == TORCH
    assert {"blockreduce", "allreduce", "rowalign", "multirow", "v8"} <= set(one)
    many = candidates(layer, Bucket(65, 256), 4096)
    assert {c.rung for c in many} == {TORCH, "v8"}
    assert any(dict(c.knobs)["split_k"] > 1 for c in many if c.rung == "v8")
    tiles = {(dict(c.knobs)["block_m"], dict(c.knobs)["block_n"]) for c in many if c.rung == "v8"}
    assert {(64, 256), (128, 192)} <= tiles  # the medium-M tiles, past 64 rows only
    assert (64, 64) in tiles  # ... and the tile filling the SMs at 256 rows: 128 of 64x64
    few = candidates(layer, Bucket(17, 64), 4096)
    assert all(dict(c.knobs)["block_m"] == 64 for c in few if c.rung == "v8")


@pytest.mark.parametrize("bucket", [Bucket(2, 16), Bucket(257, 1024), Bucket(1025, None)])
def test_v8_candidates_split_k_only_in_a_last_wave_whose_workspace_holds_any_m(bucket):
    """A split of every tile would size its workspace by one M; split_tail's holds a wave's."""
    for c in candidates(LayerShape(4096, 4096, "bfloat16"), bucket, 4096):
        knobs = dict(c.knobs)
        assert c.rung == TORCH or knobs["split_k"] == 1 or knobs["split_tail"]


def test_the_linear_commands_help_states_the_layers_own_defaults():
    """`tvm-explorer linear --help` writes the default buckets and max_tokens as literals (the
    command line's start does not import torch, which linear's modules do): they must be the
    ones Linear takes."""
    from cli import FLAGS
    from linear.buckets import DEFAULT_EDGES
    from linear.module import DEFAULT_MAX_TOKENS
    assert f"default {','.join(map(str, DEFAULT_EDGES))};" in FLAGS["--edges"]["help"]
    assert f"(default {DEFAULT_MAX_TOKENS})" in FLAGS["--max-tokens"]["help"]


def test_v8_is_a_candidate_where_tma_cannot_load_the_rows_it_stages():
    ragged = candidates(LayerShape(4096, 4095, "bfloat16"), Bucket(65, 256), 4096)
    assert [c.rung for c in ragged][0] == TORCH and "v8" in [c.rung for c in ragged]


@pytest.mark.parametrize("layer", [LayerShape(2048, 2048, "bfloat16", bias=True),
                                   LayerShape(2048, 2048, "float8_e4m3fn", scales="row")],
                         ids=lambda layer: layer.label())
def test_a_bucket_of_one_m_weighs_skinny_and_v8s_own_choice_for_that_m(layer):
    """One M of a few rows: skinny, and v8's heuristic choice for that M (swapped, the split
    of every tile it gives, overlapped fp8 promotions), where a bucket of several Ms takes no
    skinny and only unswapped v8, K split in a last wave, its promotions overlapped in runs of
    at most MOST_SPLIT_OVERLAP K blocks."""
    one = candidates(layer, Bucket(16, 16), 4096)
    chosen = dict(schedules.get("gemm", "v8").defaults_for(layer.gemm(16)))
    assert [c.rung for c in one][:2] == [TORCH, "skinny"]
    assert dict(one[2].knobs) == chosen and chosen["swap_ab"] and chosen["split_k"] > 1
    assert all(dict(c.knobs).get("promote_overlap") for c in one[3:]) == layer.is_fp8
    several = candidates(layer, Bucket(9, 16), 4096)
    assert "skinny" not in {c.rung for c in several}
    several_v8 = [dict(c.knobs) for c in several if c.rung == "v8"]
    assert not any(knobs["swap_ab"] for knobs in several_v8)
    runs = {knobs["promote_overlap"] for knobs in several_v8}
    assert (runs == {MOST_SPLIT_OVERLAP}) if layer.is_fp8 else (runs == {None})
    block_scaled = LayerShape(2048, 2048, "float8_e4m3fn", scales="block")
    assert "skinny" not in {c.rung for c in candidates(block_scaled, Bucket(16, 16), 4096)}


def test_a_bucket_of_one_m_weighs_what_best_weighs_and_any_m_the_one_consumer_tile():
    """A bucket of 300 rows weighs each v8 setting of `best`'s portfolio for that M (among them
    the split cut, swapped with K split, and the one-consumer tile with pingpong); a bucket of
    several Ms the one-consumer tile (pingpong, 64 rows) where it takes one round at its most
    rows, never swapped; a fast_accum layer's keep their sums in wgmma's accumulator."""
    layer = LayerShape(2304, 9216, "bfloat16")
    one = [dict(c.knobs) for c in candidates(layer, Bucket(300, 300), 4096) if c.rung == V8]
    entry = schedules.get("gemm", V8)
    weighed = [entry.with_knobs(name.partition(":")[2], layer.gemm(300)).defaults
               for name in best_portfolio(layer.gemm(300)) if name.startswith("v8:")]
    assert weighed and all(dict(knobs) in one for knobs in weighed)
    assert any(k["swap_ab"] and k["split_k"] > 1 for k in one) and any(k["pingpong"] for k in one)
    several = [dict(c.knobs) for c in candidates(layer, Bucket(65, 256), 4096) if c.rung == V8]
    assert [(k["block_m"], k["split_k"]) for k in several if k["pingpong"]] == [(64, 1)]
    assert not any(k["swap_ab"] for k in several)
    fast = LayerShape(4096, 4096, "float8_e4m3fn", fast_accum=True)
    assert all(dict(c.knobs)["promote_k"] is None
               for c in candidates(fast, Bucket(300, 300), 4096) if c.rung == V8)


def _kernel_signature(layer: LayerShape, bucket: Bucket) -> str:
    """The CUDA signature of the bucket's first v8 candidate, as build_candidate builds it."""
    v8 = next(c for c in candidates(layer, bucket, 4096) if c.rung == "v8")
    source = build_candidate(layer, bucket, v8, 4096, "sm_90").mod.imports[0].inspect_source()
    return source.split("__global__")[-1].split("{")[0]


def test_v8_for_a_bucket_takes_m_at_each_call_and_for_one_m_is_built_for_it(target):
    """The kernel's grid and A's rows are symbolic: one build serves every M of the bucket; a
    bucket of one M gets v8 built for that number (no size among its arguments)."""
    layer = LayerShape(1024, 2048, "bfloat16")
    assert "int " in _kernel_signature(layer, Bucket(17, 64))  # M (or expressions of it)
    assert "int " not in _kernel_signature(layer, Bucket(17, 17))


def _key(**changes):
    key = {"layer": "64x32 bfloat16", "bucket": "M=2-16", "most_rows": 16, "gpu": "H100",
           "compute_capability": "9.0", "tvm": "0.27", "tvm_ffi": "0.1.14", "code": "abc"}
    return {**key, **changes}


def test_cache_writes_reads_and_keeps_the_library(tmp_path):
    cache = Cache(str(tmp_path))
    assert cache.read(_key()) is None
    entry = cache.write(_key(), {"choice": "v8:x", "rung": "v8", "knobs": {"block_m": 64}},
                        lambda path: open(path, "wb").write(b"library"))
    again = cache.read(_key())
    assert again.manifest["choice"] == "v8:x" and open(again.library, "rb").read() == b"library"
    assert entry.directory == again.directory
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".entry-")]


def test_cache_names_a_corrupt_or_partial_entry(tmp_path):
    cache = Cache(str(tmp_path))
    cache.write(_key(), {"choice": "v8:x", "rung": "v8", "knobs": {}},
                lambda path: open(path, "wb").write(b"library"))
    os.remove(os.path.join(cache.directory(_key()), cache_module.LIBRARY))
    with pytest.raises(CorruptEntry, match="kernel.so is missing"):
        cache.read(_key())
    with open(os.path.join(cache.directory(_key()), cache_module.MANIFEST), "w") as f:
        f.write("{not json")
    with pytest.raises(CorruptEntry, match="is not JSON"):
        cache.read(_key())


def test_cache_says_why_an_entry_of_another_version_is_not_used(tmp_path):
    cache = Cache(str(tmp_path))
    cache.write(_key(tvm="0.26"), {"choice": "torch", "rung": "torch", "knobs": {}}, None)
    assert cache.read(_key()) is None
    assert "tvm 0.26 (here 0.27)" in cache.stale_reason(_key())
    assert cache.stale_reason(_key(layer="8x8 bfloat16")) is None


def _write_entry(root: str, number: int) -> str:
    cache = Cache(root)
    entry = cache.write(_key(), {"choice": f"writer {number}", "rung": "torch", "knobs": {}},
                        None)
    return entry.manifest["choice"]


def test_concurrent_writers_leave_one_whole_entry(tmp_path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        chosen = pool.starmap(_write_entry, [(str(tmp_path), n) for n in range(8)])
    entry = Cache(str(tmp_path)).read(_key())
    assert entry is not None and set(chosen) == {entry.manifest["choice"]}
    assert os.listdir(tmp_path) == [os.path.basename(entry.directory)]


def test_a_second_process_needing_an_entry_being_measured_waits_for_it(tmp_path):
    """flock's locks belong to an open file, so a thread here stands in for the second process."""
    cache, said, events = Cache(str(tmp_path)), [], []

    def second():
        with cache.locked([_key()], said.append):
            events.append("second holds it")

    with cache.locked([_key(bucket="M=1"), _key()], said.append):
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and events == []
        events.append("first done")
    waiter.join(10)
    assert events == ["first done", "second holds it"]
    assert len(said) == 1 and "waiting for another process measuring" in said[0]
    assert os.listdir(tmp_path) == [cache_module.LOCKS]  # no entry, nothing else beside them


def test_a_cache_that_cannot_be_written_is_refused_before_anything_is_measured(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"cache .*file/cache cannot be written"):
        with Cache(str(tmp_path / "file" / "cache")).locked([_key()], print):
            pass


class _CountingStandIn(stand_in.StandIn):
    """The stand-in tuner, counting the buckets it is asked to measure."""

    def __init__(self):
        self.tuned = []

    def tune(self, pending, max_tokens, gpu, cache, say):
        self.tuned += [p.bucket.label() for p in pending]
        return super().tune(pending, max_tokens, gpu, cache, say)


def test_two_preparers_of_one_layer_measure_each_bucket_once(tmp_path, monkeypatch):
    """Two preparers at once (threads here; ranks of one model, test workers): the one that
    takes the entries' locks measures them, the other waits and loads them from the cache."""
    monkeypatch.setenv(stand_in.SECONDS, "0.5")
    tuner, cache, found = _CountingStandIn(), Cache(str(tmp_path)), []
    layer, buckets = LayerShape(64, 32, "bfloat16"), buckets_from_edges((1, 2))

    def prepare():
        found.append(portfolio.prepare([layer], buckets, 16, cache, say=lambda line: None,
                                       warn=print, tuner=tuner))

    threads = [threading.Thread(target=prepare) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(tuner.tuned) == sorted(b.label() for b in buckets)
    sources = [[k.source for k in kernels[layer].kernels] for kernels in found]
    assert sorted(sources) == [["cache", "cache"], ["measured", "measured"]]


def test_export_copies_entries_into_a_cache_of_their_own(tmp_path):
    cache = Cache(str(tmp_path / "cache"))
    kept = cache.write(_key(), {"choice": "v8:x", "rung": "v8", "knobs": {}},
                       lambda path: open(path, "wb").write(b"library"))
    cache.write(_key(bucket="M=1"), {"choice": "torch", "rung": "torch", "knobs": {}}, None)
    target = str(tmp_path / "export")
    assert cache_module.export_entries([kept.directory, kept.directory], target) == 1
    exported = Cache(target)
    assert open(exported.read(_key()).library, "rb").read() == b"library"
    assert exported.read(_key(bucket="M=1")) is None
    with pytest.raises(UsageError, match="exists and is not empty"):
        cache_module.export_entries([kept.directory], target)


def test_export_of_a_model_without_kernels_is_refused(tmp_path):
    model = _small_model()
    linear.replace_linears(model)
    with pytest.raises(BadInput, match="call linear.prepare"):
        linear.export(model, str(tmp_path / "export"))
    assert not os.path.exists(tmp_path / "export")


def test_code_version_follows_the_kernel_code():
    assert cache_module.code_version() == cache_module.code_version()
    assert len(cache_module.code_version()) == 16


def test_the_portfolio_ranks_only_correct_candidates_by_their_mean_ratio_to_the_fastest():
    from linear.portfolio import _choose
    from schedules.errors import KernelFailed

    results = {"torch": {"status": "ok", "times_ms": {1: 1.0, 64: 4.0}},
               "v8:a": {"status": "ok", "times_ms": {1: 0.9, 64: 3.2}},  # ratios 1 and 1.07
               "v8:b": {"status": "ok", "times_ms": {1: 1.2, 64: 3.0}},  # ratios 1.33 and 1
               "wrong": {"status": "failed", "error": "relative error 1 at M=1"}}
    assert _choose(results) == "v8:a"
    with pytest.raises(KernelFailed, match="no candidate ran correctly: wrong: relative error"):
        _choose({"wrong": results["wrong"]})


def test_builds_start_no_more_processes_than_candidates(monkeypatch):
    """Each build process costs a start and an import: a bucket of two kernels to build gets
    two, however many CPUs there are; the candidates are built all the same."""
    from concurrent.futures import Future

    from linear.candidates import Candidate

    started = []

    class InProcess:  # ProcessPoolExecutor's part that _build_all uses, run here
        def __init__(self, workers, mp_context):
            started.append(workers)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, job):
            future = Future()
            future.set_result(f"built {job[2].name}")
            return future

    monkeypatch.setattr(portfolio, "ProcessPoolExecutor", InProcess)
    monkeypatch.setattr(portfolio, "usable_cpus", lambda: 64)
    two = [Candidate("v8", (("block_n", 128),)), Candidate("v8", (("block_n", 256),))]
    pending = portfolio.Pending(LayerShape(256, 512, "bfloat16"), Bucket(2, 16), {}, [Candidate(TORCH), *two])
    portfolio._build_all([pending], 64, "sm_90", lambda _: None)
    assert started == [2]
    assert pending.built == {c: f"built {c.name}" for c in two}


def _small_model():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32, dtype=torch.bfloat16), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8, bias=False, dtype=torch.bfloat16))
    return model


def test_replace_linears_shares_the_weights_and_keeps_the_state_dict():
    model = _small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert linear.replace_linears(model) == 2
    assert isinstance(model[0], linear.Linear) and isinstance(model[2], linear.Linear)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    fresh = _small_model()
    linear.replace_linears(fresh)
    fresh.load_state_dict(after)
    assert all(torch.equal(fresh.state_dict()[k], before[k]) for k in before)


@pytest.mark.parametrize("m", [0, 1, 5, 300])
def test_compiled_model_traces_every_m_with_fake_kernels(m):
    """torch.compile holds the layer as one operator whose fake gives (..., N) for any M."""
    model = _small_model().to("meta")
    linear.replace_linears(model)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        out = compiled(torch.empty((2, m, 64), device="meta", dtype=torch.bfloat16))
    assert out.shape == (2, m, 8) and out.dtype == torch.bfloat16


def _prepared_layer(edges=(1,), rungs=(TORCH,), device=None):
    """A Linear whose buckets (from `edges`) 'run' torch's F.linear, named as `rungs` say (no
    GPU needed to test the checks and the tracing)."""
    from linear.candidates import Candidate, launcher
    from linear.portfolio import BucketKernel, LayerKernels

    layer = linear.Linear(64, 32, dtype=torch.bfloat16, buckets=buckets_from_edges(edges),
                          device=device)
    kernels = LayerKernels(layer.shape, BucketTable(layer.buckets))
    kernels.kernels = [BucketKernel(Candidate(rung), launcher(Candidate(TORCH), layer.shape, None),
                                    "test") for rung in rungs]
    layer.kernels = kernels
    return layer


@pytest.mark.parametrize("rungs, m, operator", [
    ((TORCH, TORCH), 1, False),  # every bucket torch's: F.linear at any M
    (("rowalign", TORCH), 5, False),  # M fixed at tracing, its bucket torch's
    (("rowalign", TORCH), 1, True),  # M's bucket a TVM kernel: the operator
])
def test_compiled_layer_is_f_linear_where_the_traced_rows_bucket_runs_torch(rungs, m, operator):
    layer = _prepared_layer((1, 2), rungs, device="meta")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    with torch.no_grad():
        torch.compile(layer, backend=backend, fullgraph=True, dynamic=False)(
            torch.empty((m, 64), device="meta", dtype=torch.bfloat16))
    assert ("tvm_explorer.linear" in graphs[0]) == operator


BAD_XS = [  # (x, made on a device, and what the refusal of it says), for either tier
    (lambda device: torch.zeros(3, 65, device=device, dtype=torch.bfloat16), "has 65 features"),
    (lambda device: torch.zeros(3, 64, device=device, dtype=torch.float16),
     "is torch.float16, not the weight's"),
    (lambda device: torch.zeros(3, 64, dtype=torch.bfloat16), "is on cpu, not on a CUDA GPU"),
    (lambda device: torch.tensor(1.0, device=device, dtype=torch.bfloat16),
     "is a 0-d tensor: it takes a tensor"),
    (lambda device: [1.0] * 64, r"is not a torch.Tensor \(list\): it takes a tensor whose last "
                                "dimension is the 64 input features"),
]


@pytest.mark.parametrize("make_x, message", BAD_XS)
def test_bad_inputs_are_refused_in_one_line_naming_x(make_x, message):
    with pytest.raises(BadInput, match=message) as refused:
        _prepared_layer()(make_x("cpu"))
    assert "\n" not in str(refused.value) and "input x" in str(refused.value)


@pytest.mark.parametrize("max_tokens", [0, -3, 2.5, True, "64"])
def test_a_layer_refuses_max_tokens_that_is_not_a_count_of_rows(max_tokens):
    with pytest.raises(UsageError, match="max_tokens is a whole number of rows, at least 1"):
        linear.Linear(64, 64, max_tokens=max_tokens)


@pytest.mark.parametrize("make, says", [
    (lambda: linear.Linear(4, 4, dtype="float16"), "Linear's dtype is a torch.dtype"),
    (lambda: linear.Linear(4, 4, out_dtype="bf16"), "Linear's out_dtype is a torch.dtype"),
    (lambda: linear.Linear(4, 4, bias="x"), "Linear's bias is True or False"),
    (lambda: linear.Linear(4, 4, device="nope"), "Linear's device 'nope' is not one torch knows"),
    (lambda: linear.Linear.from_linear(torch.nn.Conv1d(2, 2, 1)),
     "Linear.from_linear takes a torch.nn.Linear, not Conv1d"),
    (lambda: linear.replace_linears(None), "linear.replace_linears takes a torch.nn.Module"),
    (lambda: linear.prepare("model"), "linear.prepare takes a torch.nn.Module"),
    (lambda: linear.export(None, "x"), "linear.export takes a torch.nn.Module"),
])
def test_what_is_not_a_dtype_device_or_module_is_refused_in_one_line(make, says):
    """Each ended in torch's own error or an AttributeError."""
    with pytest.raises(UsageError, match=re.escape(says)):
        make()


def test_a_0_d_x_as_traced_is_left_to_the_calls_check_not_an_error_in_tracing():
    """torch.compile asks _needs_checks of x as traced: a 0-d x made it an IndexError."""
    layer = linear.Linear(64, 32)
    assert layer._needs_checks(torch.tensor(1.0, dtype=torch.bfloat16), None)


def test_a_layer_on_a_cuda_device_torch_does_not_see_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="device cuda is a CUDA GPU, and torch sees none here"):
        linear.Linear(4, 4, device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match="device cuda:7 is past the 1 CUDA GPUs torch sees"):
        linear.Linear(4, 4, device="cuda:7")


def test_a_call_that_needs_a_gradient_is_refused():
    x = torch.zeros(3, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="is for inference"):
        _prepared_layer()(x)


def _traced_check(layer, *args, grad: bool = False):
    """The check flag the compiled layer passes its operator (tvm_explorer.linear or
    linear_fp8), traced on `args` with dynamo's caches emptied first."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.set_grad_enabled(grad):
        torch.compile(layer, backend=backend, fullgraph=True, dynamic=False)(*args)
    (node,) = [n for gm in graphs for n in gm.graph.nodes
               if str(n.target).startswith("tvm_explorer.linear")]
    return node.args[-1]


@pytest.mark.parametrize("x, grad, check", [
    (torch.zeros(3, 64, dtype=torch.bfloat16, device="meta"), False, False),
    (torch.zeros(3, 64, dtype=torch.bfloat16, device="meta", requires_grad=True), False, False),
    (torch.zeros(3, 64, dtype=torch.bfloat16, device="meta", requires_grad=True), True, True),
    (torch.zeros(3, 65, dtype=torch.bfloat16, device="meta"), False, True),
    (torch.zeros(3, 64, dtype=torch.float16, device="meta"), False, True),
    (torch.zeros(64, 3, dtype=torch.bfloat16, device="meta").T, False, True),
    (torch.zeros(3, 64, dtype=torch.bfloat16), False, True),  # not on the weight's device
])
def test_a_compiled_layer_checks_x_at_each_call_only_where_it_traced_one_eager_refuses(
        x, grad, check):
    """Where x as traced is good, the graph's guards keep it so and the operator runs M's
    kernel unchecked (check=False); else it checks at each call, refusing in the eager line."""
    assert _traced_check(_prepared_layer((1,), ("rowalign",), device="meta"), x,
                         grad=grad) is check


def test_the_operator_runs_the_rows_kernel_unchecked_only_where_told():
    """check=False (a good x at tracing) goes straight to M's bucket's run, x of any leading
    shape as rows; check=True refuses as the eager call does (here: x is not on the GPU)."""
    from linear.candidates import Candidate
    from linear.module import _linear_cuda
    from linear.portfolio import BucketKernel, LayerKernels

    rows = []
    layer = linear.Linear(64, 32, buckets=buckets_from_edges((1, 2)), device="meta")
    layer.kernels = LayerKernels(layer.shape, BucketTable(layer.buckets), [
        BucketKernel(Candidate("rowalign"), lambda x, w, b, out=None: rows.append(("M=1", x.shape)),
                     ""),
        BucketKernel(Candidate("v8"),
                     lambda x, w, b, out=None: rows.append(("M=2-", x.shape)) or x[:, :32],
                     "")])
    x = torch.zeros(2, 3, 64, dtype=torch.bfloat16)
    assert _linear_cuda(x, layer.weight, None, layer._key, False).shape == (2, 3, 32)
    assert rows == [("M=2-", (6, 64))]
    with pytest.raises(BadInput, match="input x is on cpu"):
        _linear_cuda(x, layer.weight, None, layer._key)


@pytest.mark.parametrize("dtype, scales", [("bfloat16", None), ("float8_e4m3fn", "row")])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rung", [V8, "skinny"])
def test_a_gemm_launcher_hands_v8_the_bias_and_adds_skinnys_after(dtype, scales, bias, rung):
    """A layer with a bias has v8 kernels built with one (a parameter before y, added in the
    epilogue): the launcher passes it and adds nothing after; skinny's kernel takes none, so
    the launcher adds it to y after; a layer without passes and adds none."""
    layer = LayerShape(32, 64, dtype, scales, bias=bias)
    calls = []
    run = launcher(Candidate(rung), layer, lambda *args: calls.append(args))
    x, w, b = torch.ones(4, 64), torch.ones(32, 64), torch.full((32,), 7.0)
    out = torch.zeros(4, 32, dtype=getattr(torch, layer.out_dtype))
    operands = (x, w) if scales is None else (x, torch.ones(4, 1), w, torch.ones(32, 1))
    y = run(*operands, b if bias else None, out=out)
    (args,) = calls
    fused = bias and rung == V8
    assert args[-1] is out and y is out
    assert (args[-2] is b) == fused and len(args) == len(operands) + 1 + fused
    assert (out == 7).all() if bias and not fused else not out.any()


# -- GPU tier ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_cache(run_tmp):
    """One cache for the run's workers: a layer that several tests prepare is measured once."""
    return Cache(str(run_tmp / "linear-cache"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_is_right_at_every_buckets_edges(dtype, gpu_cache):
    """First M, last M and one past each bucket, bias included, against float64."""
    torch.manual_seed(0)
    stock = torch.nn.Linear(1024, 768, device="cuda", dtype=dtype)
    layer = linear.Linear.from_linear(stock, buckets=buckets_from_edges((1, 2, 17, 65)),
                                      max_tokens=256)
    linear.prepare(layer, cache=gpu_cache, say=print)
    for m in (1, 2, 3, 16, 17, 18, 64, 65, 66, 255, 256, 300):
        x = torch.randn(m, 1024, device="cuda", dtype=dtype)
        with torch.no_grad():
            y = layer(x)
        ref = x.double() @ stock.weight.double().T + stock.bias.double()
        err = float((y.double() - ref).norm() / ref.norm())
        assert y.shape == (m, 768) and y.dtype == dtype and err < 1e-2, (m, err)


@pytest.mark.gpu
def test_every_candidate_of_a_bucket_of_one_m_passes_its_probe(gpu_cache):
    """Buckets of one M weigh skinny and v8 built for that M (swapped by its heuristic at few
    rows, the bias by C's column, added after skinny's kernel); every candidate passes its
    float64 check, bias included, and the layer is right at each M."""
    torch.manual_seed(0)
    stock = torch.nn.Linear(1024, 768, device="cuda", dtype=torch.bfloat16)
    layer = linear.Linear.from_linear(stock, buckets=buckets_from_edges((1, 2, 3, 16, 17)),
                                      max_tokens=64)
    linear.prepare(layer, cache=gpu_cache, say=print)
    for m in (2, 16):
        measured = layer.kernels.kernels[layer.kernels.table.index(m)].measured
        assert any(name.startswith("skinny") for name in measured)
        assert any(name.startswith("v8") and "swap_ab=true" in name for name in measured)
        assert {r["status"] for r in measured.values()} == {"ok"}, measured
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y = layer(x)
        ref = x.double() @ stock.weight.double().T + stock.bias.double()
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.gpu
def test_a_compiled_layer_calls_its_kernels_into_inductors_buffers(gpu_cache):
    """Compiled by inductor for any M, the layer calls M's kernel into a buffer inductor
    allocates (linear/inductor.py), wherever a bucket runs one of ours, and gives the eager
    call's output at every bucket."""
    from torch._inductor.utils import run_and_get_code  # lazy: seconds to import

    torch.manual_seed(0)
    stock = torch.nn.Linear(1024, 768, device="cuda", dtype=torch.bfloat16)
    layer = linear.Linear.from_linear(stock, buckets=buckets_from_edges((1, 2, 17, 65)),
                                      max_tokens=256)
    linear.prepare(layer, cache=gpu_cache, say=print)
    torch._dynamo.reset()
    compiled, codes = torch.compile(layer, dynamic=True), []
    for m in (1, 2, 20, 300):
        x = torch.randn(1, m, 1024, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            y, code = run_and_get_code(compiled, x)  # a cached graph would give no code
            torch.testing.assert_close(y, layer(x))
        codes += code
    ours = any(k.candidate.rung != TORCH for k in layer.kernels.kernels)
    assert ("extern_kernels.tvm_explorer_linear(" in "".join(codes)) == ours, \
        linear.inductor.unavailable


def _v8_statuses(layer, cache) -> dict:
    """Prepare the layer: each of its v8 candidates' status ("ok" where it passed its float64
    check at its bucket's probe Ms), by (bucket, name)."""
    linear.prepare(layer, cache=cache, say=print)
    return {(bucket, name): result["status"] for bucket, k in enumerate(layer.kernels.kernels)
            for name, result in k.measured.items() if name.startswith("v8")}


@pytest.mark.gpu
def test_v8_for_any_m_on_rows_tma_cannot_load_passes_every_probe(gpu_cache):
    """1023 input features (2046-byte rows, staged by v8): every v8 candidate of every bucket
    passes its float64 check at the bucket's probe Ms."""
    stock = torch.nn.Linear(1023, 768, device="cuda", dtype=torch.bfloat16)
    layer = linear.Linear.from_linear(stock, buckets=buckets_from_edges((1, 2, 17, 65)),
                                      max_tokens=256)
    statuses = _v8_statuses(layer, gpu_cache)
    assert statuses and set(statuses.values()) == {"ok"}, statuses


@pytest.mark.gpu
def test_pingpong_and_split_cut_candidates_pass_every_probe(gpu_cache):
    """The one-consumer tile with pingpong for any M (whose rows a call gives) and for one M,
    and for one M its swapped form and the split cut (swapped, K split), bias included: every
    v8 candidate of every bucket passes its float64 check at the bucket's probes, and the
    layer is right at each bucket's edges."""
    torch.manual_seed(0)
    stock = torch.nn.Linear(2048, 2304, device="cuda", dtype=torch.bfloat16)
    layer = linear.Linear.from_linear(stock, buckets=buckets_from_edges((1, 65, 300, 301)),
                                      max_tokens=512)
    statuses = _v8_statuses(layer, gpu_cache)
    assert {bucket for bucket, name in statuses if "pingpong=true" in name} == {1, 2, 3}
    swapped = [name for bucket, name in statuses if bucket == 2 and "swap_ab=true" in name]
    assert any("split_k=1," not in name for name in swapped)
    assert any("pingpong=true" in name for name in swapped)
    assert set(statuses.values()) == {"ok"}, statuses
    for m in (64, 65, 200, 299, 300, 301, 512):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y = layer(x)
        ref = x.double() @ stock.weight.double().T + stock.bias.double()
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2, m


@pytest.mark.gpu
@pytest.mark.parametrize("make_x, message", BAD_XS + [
    (lambda device: torch.zeros(64, 3, device=device, dtype=torch.bfloat16).T,
     "not contiguous ones")])
def test_bad_inputs_to_a_prepared_layer_on_the_gpu_are_refused_in_one_line(make_x, message,
                                                                            gpu_cache):
    """The CPU tier's refusals of x (stand-in kernels there), on a layer with its kernels."""
    layer = linear.Linear.from_linear(torch.nn.Linear(64, 32, device="cuda", dtype=torch.bfloat16),
                                      buckets=buckets_from_edges((1,)), max_tokens=16)
    linear.prepare(layer, cache=gpu_cache, say=print)
    with pytest.raises(BadInput, match=message) as refused:
        layer(make_x("cuda"))
    assert "\n" not in str(refused.value) and "input x" in str(refused.value)


@pytest.mark.gpu
def test_a_layer_on_a_gpu_past_those_torch_sees_is_refused():
    count = torch.cuda.device_count()
    with pytest.raises(UsageError, match=f"device cuda:{count} is past the {count} CUDA GPUs"):
        linear.Linear(4, 4, device=f"cuda:{count}")


@pytest.mark.gpu
def test_a_second_prepare_loads_every_bucket_from_the_cache(gpu_cache):
    stock = torch.nn.Linear(1024, 768, device="cuda", dtype=torch.bfloat16)
    options = dict(buckets=buckets_from_edges((1, 2, 17, 65)), max_tokens=256)
    first = linear.Linear.from_linear(stock, **options)
    linear.prepare(first, cache=gpu_cache, say=print)
    second = linear.Linear.from_linear(stock, **options)
    kernels = linear.prepare(second, cache=gpu_cache, say=print)
    assert {k.source for k in kernels[second.shape].kernels} == {"cache"}
    assert [k.candidate for k in kernels[second.shape].kernels] == \
        [k.candidate for k in first.kernels.kernels]


@pytest.mark.gpu
def test_an_exported_portfolio_loads_in_place_of_the_cache(gpu_cache, tmp_path):
    stock = torch.nn.Linear(1024, 768, device="cuda", dtype=torch.bfloat16)
    options = dict(buckets=buckets_from_edges((1, 2, 17, 65)), max_tokens=256)
    first = linear.Linear.from_linear(stock, **options)
    linear.prepare(first, cache=gpu_cache, say=print)
    assert linear.export(first, str(tmp_path / "export")) == len(first.buckets)
    second = linear.Linear.from_linear(stock, **options)
    kernels = linear.prepare(second, cache=Cache(str(tmp_path / "export")), say=print)
    assert {k.source for k in kernels[second.shape].kernels} == {"cache"}


@pytest.mark.gpu
def test_a_corrupt_cached_library_is_named_removed_and_measured_again(gpu_cache, tmp_path):
    cache = Cache(str(tmp_path))
    stock = torch.nn.Linear(512, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    options = dict(buckets=buckets_from_edges((1, 2)), max_tokens=64)
    linear.prepare(linear.Linear.from_linear(stock, **options), cache=cache, say=print)
    for name in os.listdir(tmp_path):
        library = os.path.join(tmp_path, name, cache_module.LIBRARY)
        if os.path.exists(library):
            with open(library, "wb") as f:
                f.write(b"not a library")
    warned = []
    layer = linear.Linear.from_linear(stock, **options)
    linear.prepare(layer, cache=cache, say=print, warn=warned.append)
    assert all(json.load(open(os.path.join(tmp_path, n, cache_module.MANIFEST)))
               for n in os.listdir(tmp_path) if not n.startswith("."))
    x = torch.randn(5, 512, device="cuda", dtype=torch.bfloat16)
    assert torch.allclose(layer(x).float(), (x @ stock.weight.T).float(), rtol=2e-2, atol=2e-2)
    built = [k for k in layer.kernels.kernels if k.candidate.built]
    assert len(warned) == len(built)


def test_a_layer_with_a_bias_is_tuned_apart_from_one_without():
    """A layer's candidates are timed adding the bias as they will run (its kernels built with
    one), so a layer with one has a shape (and so cache entries) of its own, and nn.Linear's
    bias carries over."""
    plain, biased = LayerShape(1024, 2048, "bfloat16"), LayerShape(1024, 2048, "bfloat16",
                                                                    bias=True)
    assert plain.label() == "1024x2048 bfloat16" and biased.label() == "1024x2048 bfloat16 bias"
    with torch.device("meta"):
        stock = [torch.nn.Linear(2048, 1024, bias=b, dtype=torch.bfloat16) for b in (False, True)]
    assert [linear.Linear.from_linear(s).shape for s in stock] == [plain, biased]
