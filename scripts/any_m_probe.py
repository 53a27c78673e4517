"""v8 built for one M against v8 built for any M (v8.v8_kernel_any_m), same knobs, and
torch's F.linear (fp8: _scaled_mm), on the GPU: what taking M at each call costs. Each kernel
is checked against float64 first; then rounds of interleaved timings (L2 flushed before each
launch).

    python scripts/any_m_probe.py 4096x4096x4096 1025x4096x4096 --rounds 3
    python scripts/any_m_probe.py 4096x4608x3584 --dtype float8_e4m3fn \
        --knobs block_n=192,split_k=1,promote_halves=true
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm  # noqa: E402

import schedules  # noqa: E402
from schedules import v8  # noqa: E402
from schedules.workloads import Workload  # noqa: E402
from tuning import build, measure  # noqa: E402


def kernels(wl: Workload, asked: dict) -> dict:
    """name -> run(): v8 for wl's M, v8 for any M (its rows given at the call), with the
    `asked` knobs (the heuristic's for the rest), and torch (F.linear; fp8: _scaled_mm)."""
    knobs = schedules.get("gemm", "v8").defaults_for(
        wl, {"split_tail": False, "swap_ab": False, **asked})
    target = build.cuda_target("sm_90")
    inputs = measure.random_inputs(wl)
    out = measure.poisoned_output(wl)
    found = {}
    for name, make in (("v8 (this M)", v8.v8_kernel), ("v8 (any M)", v8.v8_kernel_any_m)):
        function = build.build(tvm.IRModule({"main": make(wl, **knobs)}), target)["main"]
        found[name] = lambda f=function: (f(*inputs, out), out)[1]
    a, b, *scales = inputs
    found["torch"] = (lambda: torch._scaled_mm(a, b.t(), *scales, out_dtype=out.dtype)) \
        if scales else (lambda: F.linear(a, b))
    return found, inputs, knobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", help="MxNxK, nt with a bfloat16 C")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float8_e4m3fn"],
                        help="the inputs (fp8: a scale per tensor)")
    parser.add_argument("--knobs", default="", help="v8's knobs, as block_n=192,split_k=1")
    args = parser.parse_args()
    asked = schedules.get("gemm", "v8").parse_knobs(args.knobs) if args.knobs else {}
    for shape in args.shapes:
        wl = Workload("gemm", tuple(int(d) for d in shape.split("x")), args.dtype, "bfloat16",
                      "nt")
        runs, inputs, knobs = kernels(wl, asked)
        errors = {name: measure.check(wl, run, inputs, measure.tolerance(wl))["status"]
                  for name, run in runs.items()}
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                if errors[name] == "ok":
                    times[name].append(measure.time_kernel(run, "read", budget_ms=300).median_ms)
        print(f"{wl.label()} {knobs}")
        for name, found in times.items():
            shown = ", ".join(f"{t * 1000:.1f}" for t in found) or errors[name]
            print(f"  {name:12s} us: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
