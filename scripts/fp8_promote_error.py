#!/usr/bin/env python3
"""On the GPU machine: the largest scaled error of fp8 GEMMs at several K, per output dtype,
for torch._scaled_mm's default and fast forms and for named v8 settings (issue 52's measure:
each output's error against float64, divided by sqrt(K) rms(A) rms(B) times the scales).

    python3 scripts/fp8_promote_error.py --ks 1024 4096 16384 --outs float32 bfloat16 \\
        --schedules v8 v8:promote_k=256 v8:promote_k=none

Prints one line per K and output dtype: each form's largest error, and its ratio to the
default's (the issue's bound: 1.2x).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from schedules import Workload  # noqa: E402
from schedules.workloads import FP8  # noqa: E402
from tuning import build, measure  # noqa: E402
from tuning.explore import SearchResults, build_schedule, resolve  # noqa: E402


def worst_errors(wl: Workload, executables: dict, seed: int) -> dict[str, float]:
    """Each form's largest scaled error on wl's random inputs of `seed`: _scaled_mm's two and
    each built executable's (by name)."""
    import torch

    inputs = measure.random_inputs(wl, seed)
    reference = measure.reference(wl, inputs)
    a, b, scale_a, scale_b = inputs[:4]

    def worst(out) -> float:
        return measure.largest_scaled_error(wl, inputs, reference, out)

    def scaled_mm(fast: bool):
        return torch._scaled_mm(a, b.T, scale_a, scale_b, out_dtype=measure.torch_dtype(
            wl.out_dtype), use_fast_accum=fast)

    errors = {f"_scaled_mm {kind}": worst(scaled_mm(fast))
              for kind, fast in (("default", False), ("fast", True))}
    for name, executable in executables.items():
        errors[name] = worst(measure.tvm_runner(executable, wl, inputs,
                                                measure.poisoned_output(wl))())
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--ks", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--outs", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[3])
    parser.add_argument("--schedules", nargs="+", default=["v8", "v8:promote_k=none"])
    args = parser.parse_args()
    if not measure.gpu_present():
        print("fp8_promote_error.py runs kernels: it needs a CUDA GPU, and there is none here")
        return 1
    target = build.cuda_target("sm_90")
    for k in args.ks:
        for out in args.outs:
            wl = Workload("gemm", (args.rows, args.cols, k), FP8, out, "nt")
            executables = {name: build_schedule(resolve(wl, name, SearchResults(), warn=print),
                                                wl, target).executable for name in args.schedules}
            for seed in args.seeds:
                errors = worst_errors(wl, executables, seed)
                base = errors["_scaled_mm default"]
                cells = ", ".join(f"{name} {e:.3e} ({e / base:.2f}x)" for name, e in errors.items())
                print(f"{wl.label()} seed {seed}: {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
