import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
    """Under xdist (`-n auto`), the tests go to the workers two at a time as each frees up
    (--maxschedchunk 2) rather than in chunks of a quarter of a worker's share: the slow tests,
    first in the order, are then spread over the workers, not all sent to the first one, and no
    worker is left with a queue of its own while another idles. Kept where it is given."""
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "maxschedchunk",
                                                           0) is None:
        config.option.maxschedchunk = 2


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first, so that under xdist (`-n auto`, which hands out the
    tests in this order) none of them starts last and ends the run alone; the order is
    otherwise kept. Without a CUDA GPU, the gpu tier is skipped with the reason (as TVM's
    requires_cuda), so a bare `pytest` on a CPU machine runs the CPU tier and says what it
    left out."""
    from tuning import measure

    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
    if measure.gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def run_tmp(tmp_path_factory):
    """A folder this run's xdist workers share (each worker's temporary folders lie inside the
    run's, which is this), for what tests on different workers make once and reuse: a linear
    layer's kernel cache, whose locks let one worker measure a layer while the others wait."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def target():
    from tuning.build import cuda_target

    return cuda_target("sm_90")


@pytest.fixture(scope="session")
def _builds():
    """build(op, name, wl) -> (lowered IRModule, lowered IR text, CUDA source, KernelSummary),
    cached for the session."""
    from schedules import get
    from tuning import build

    cache = {}
    target = build.cuda_target("sm_90")

    def build_one(name, wl, **params):
        key = (name, wl, tuple(sorted(params.items())))
        if key not in cache:
            mod = get(wl.op, name).apply(wl, target, **params)
            lowered = build.lower(mod, target)
            source = build.cuda_source(build.build(mod, target))
            cache[key] = (lowered, build.ir_text(lowered), source,
                          build.summarize(lowered, source))
        return cache[key]

    return build_one


@pytest.fixture(scope="session")
def compiled(_builds):
    """compiled(op, name, wl) -> (lowered IR text, CUDA source, KernelSummary), cached."""
    return lambda name, wl, **params: _builds(name, wl, **params)[1:]


@pytest.fixture(scope="session")
def lowered(_builds):
    """lowered(name, wl, **knobs) -> the lowered IRModule of the rung (tests/kernel_facts.py
    reads it), from the same builds as `compiled`."""
    return lambda name, wl, **params: _builds(name, wl, **params)[0]


@pytest.fixture(scope="session")
def nvcc_resources():
    """nvcc_resources(source, arch) -> build.nvcc_resources's answer, cached for the session by
    (source, arch): several tests compile the same rung's CUDA (every rung's nvcc check and the
    intended shapes' spill check share 43 sources), ~1.5 s of nvcc each. A rejection raises
    each time (it is not cached)."""
    from tuning import build

    cache = {}

    def resources(source, arch):
        if (source, arch) not in cache:
            cache[source, arch] = build.nvcc_resources(source, arch)
        return cache[source, arch]

    return resources


@pytest.fixture(scope="session")
def tensor_intrinsics():
    """TVM's tensor intrinsics, imported as the product imports them (schedules.tvmscript_import,
    ~3 s), for a test that makes a MetaSchedule TuneContext itself: TuneContext imports them
    plainly (~30 s) where they are not yet."""
    from schedules import tvmscript_import

    return tvmscript_import.import_module("tvm.s_tir.tensor_intrin")


@pytest.fixture
def scaled_mm_calls(monkeypatch):
    """torch._scaled_mm replaced by a stand-in writing zeros (its block form runs on CUDA only);
    the list of the (a, scale_a, scale_b) it was called with."""
    torch = pytest.importorskip("torch")
    calls = []

    def stand_in(a, b_t, scale_a, scale_b, out_dtype=None, out=None):
        calls.append((a, scale_a, scale_b))
        zeros = torch.zeros(a.shape[0], b_t.shape[1], dtype=out_dtype)
        return zeros if out is None else out.copy_(zeros)

    monkeypatch.setattr(torch, "_scaled_mm", stand_in)
    return calls
