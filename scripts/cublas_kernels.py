"""Which kernels cuBLAS runs for the ladder's GEMMs (names, launches, mean time), as the
runner's baseline calls them, read with torch's profiler. The names say the instruction family
(nvjet_sm90: Hopper wgmma; simt or ffma: CUDA cores), the tile, and whether K is split
(splitKreduce_kernel).
    python3 scripts/cublas_kernels.py 1024x512x2048:float32 4096x4096x4096:float16:nt:bfloat16
    python3 scripts/cublas_kernels.py --suite wide-bf16 --tokens 300 700
A spec is shape:dtype[:layout[:out_dtype]]; --suite takes a suite's shapes (those of --tokens'
M only, where given) instead.
"""

from __future__ import annotations

import sys
import warnings

import torch

from schedules import Workload, suites
from schedules.workloads import parse_shape
from tuning import measure


def kernels(wl: Workload, calls: int = 5) -> list[tuple[str, int, float]]:
    """(name, launches per call, mean microseconds) of every kernel one cublas call runs."""
    run = measure.cublas_runner(wl, measure.random_inputs(wl, 0))
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    warnings.filterwarnings("ignore", message="Profiler clears events")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    return [(e.key, e.count // calls, e.device_time_total / e.count)
            for e in prof.key_averages() if e.device_time_total > 0]


def workloads(argv: list[str]) -> list[Workload]:
    """The GEMMs that argv names: specs, or --suite NAME [--tokens M ...]."""
    if argv[:1] == ["--suite"]:
        tokens = {int(m) for m in argv[3:]} if argv[2:3] == ["--tokens"] else None
        return [e.workload for e in suites.get(argv[1]).entries
                if tokens is None or e.workload.shape[0] in tokens]
    specs = [(spec.split(":") + [None] * 3)[:4] for spec in argv]
    return [Workload("gemm", parse_shape(shape, "gemm"), dtype or "float32", out_dtype, layout)
            for shape, dtype, layout, out_dtype in specs]


def main(argv: list[str]) -> int:
    for wl in workloads(argv):
        print(wl.label())
        for name, launches, us in kernels(wl):
            print(f"  {launches} x {us:8.1f} us  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
