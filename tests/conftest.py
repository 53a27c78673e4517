import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def target():
    from tuning.build import cuda_target

    return cuda_target("sm_90")


@pytest.fixture(scope="session")
def compiled():
    """compiled(op, name, wl) -> (lowered IR text, CUDA source, KernelSummary), cached."""
    from schedules import get
    from tuning import build

    cache = {}
    target = build.cuda_target("sm_90")

    def compile_one(name, wl, **params):
        key = (name, wl, tuple(sorted(params.items())))
        if key not in cache:
            mod = get(wl.op, name).apply(wl, target, **params)
            lowered = build.lower(mod, target)
            source = build.cuda_source(build.build(mod, target))
            cache[key] = (build.ir_text(lowered), source, build.summarize(lowered, source))
        return cache[key]

    return compile_one
