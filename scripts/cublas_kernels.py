"""Which kernels cuBLAS runs for the ladder's GEMMs (names, launches, mean time), as the
runner's baseline calls them, read with torch's profiler. The names say the instruction family
(nvjet_sm90: Hopper wgmma; simt or ffma: CUDA cores), the tile, and whether K is split
(splitKreduce_kernel).
    python3 scripts/cublas_kernels.py 1024x512x2048:float32 4096x4096x4096:float16
"""

from __future__ import annotations

import sys
import warnings

import torch

from schedules import Workload
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


def main(argv: list[str]) -> int:
    for spec in argv:
        shape, _, dtype = spec.partition(":")
        wl = Workload("gemm", parse_shape(shape, "gemm"), dtype or "float32")
        print(wl.label())
        for name, launches, us in kernels(wl):
            print(f"  {launches} x {us:8.1f} us  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
