"""A stand-in for the GPU in the linear farm's CPU tests (tests/test_linear_farm.py): a Tuner
whose GPU is named by $STAND_IN_GPU and whose tuning, after sleeping $STAND_IN_SECONDS (a pair
in flight long enough to kill or stop its server), builds a real library for each pending
bucket on the llvm target (a kernel that adds one to four floats) or, for the bucket of M = 1,
chooses torch's (no library); a layer named by $STAND_IN_FAILS (its label) fails, as a pair
whose candidates all fail would, and one named by $STAND_IN_HANGS never returns (a hung kernel).

Run as a module, it is a farm's entry point whose servers tune with it (tuning.farm.main):
`python -m linear_farm_stand_in --key farm --servers 2 ...`, with tests/ on PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import tvm
from tvm.script import tirx as T

from linear import farm as linear_farm
from linear.candidates import TORCH, Candidate
from linear.portfolio import BucketKernel, Tuner
from schedules.errors import KernelFailed
from tuning import farm

ENTRY = "linear_farm_stand_in"
GPU, SECONDS, FAILS = "STAND_IN_GPU", "STAND_IN_SECONDS", "STAND_IN_FAILS"
HANGS = "STAND_IN_HANGS"
RUNG = "stand-in"


@T.prim_func
def add_one(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
    for i in range(4):
        B[i] = A[i] + T.float32(1)


def write_library(path: str) -> None:
    """A real library, built for llvm: add_one, as `main`."""
    mod = tvm.IRModule({"main": add_one.with_attr("global_symbol", "main")})
    tvm.compile(mod, target="llvm").export_library(path)


class StandIn(Tuner):
    """The portfolio's Tuner with the GPU stood in for (see the module's docstring)."""

    def gpu(self) -> dict:
        return {"name": os.environ.get(GPU, "Stand-in GPU"), "compute_capability": "0.0"}

    def tune(self, pending, max_tokens, gpu, cache, say) -> list[BucketKernel]:
        if any(p.layer.label() == os.environ.get(HANGS) for p in pending):
            threading.Event().wait()
        time.sleep(float(os.environ.get(SECONDS, "0")))
        return [self._tuned(p, cache) for p in pending]

    @staticmethod
    def _tuned(p, cache) -> BucketKernel:
        if p.layer.label() == os.environ.get(FAILS):
            raise KernelFailed(f"no candidate ran correctly: {RUNG} fails {p.layer.label()}")
        candidate = Candidate(TORCH if p.bucket.last == 1 else RUNG)
        measured = {candidate.name: {"status": "ok", "times_ms": {"1": 0.001}}}
        manifest = {"choice": candidate.name, "rung": candidate.rung, "knobs": {},
                    "measured": measured}
        entry = cache.write(p.key, manifest, write_library if candidate.built else None)
        return BucketKernel(candidate, None, "measured", measured, entry.directory)


def remote_functions() -> dict:
    """The stand-in farm's servers' remote function: linear's, tuning with StandIn."""
    return {linear_farm.TUNE: linear_farm.PairServer(StandIn())}


if __name__ == "__main__":
    sys.exit(farm.main(None, ENTRY, remote_functions))
