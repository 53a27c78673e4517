"""Launch one GEMM kernel a few times on random inputs, and nothing else that ncu would take for
it: a rung (with knobs, as `--schedule v8:block_n=128`) or the cuBLAS call the runner times.
The runner measures ceilings and baselines around a kernel, so an ncu filter on a name can catch
the wrong launch; here the only GEMM launches are the ones asked for. Under ncu, skip the first
(cold) launches with --launch-skip:

    ncu --kernel-name regex:'main_kernel|nvjet|xmma' --launch-skip 2 --launch-count 1 \\
        --set detailed python3 scripts/profile_launch.py --shape 4096x4096x4096 \\
        --dtype float16 --layout nn --schedule v8
"""

from __future__ import annotations

import argparse
import sys

import torch

from schedules import ExplorerError, UsageError, Workload
from schedules.workloads import parse_shape
from tuning import build, explore, measure

BASELINES = {"cublas": False, "cublas-fast": True}  # name -> fp8's fast accumulation


def launcher(wl: Workload, schedule: str):
    """A no-argument launch of `schedule` (a rung, 'rung:knob=value,...' or 'best', as
    explore.resolve reads --schedule, or one of BASELINES: torch's call, for fp8 with or
    without fast accumulation) on random inputs for `wl`, built for this GPU."""
    made = None if schedule in BASELINES else explore.resolve(wl, schedule, explore.SearchResults())
    if not measure.gpu_present():
        raise UsageError("no GPU here: this script launches kernels for ncu to profile")
    inputs = measure.random_inputs(wl, 0)
    if made is None:
        return measure.cublas_runner(wl, inputs, fast_accum=BASELINES[schedule])
    target = build.cuda_target(measure.device_facts()["arch"])
    executable = build.build(made.apply(wl, target), target)
    return measure.tvm_runner(executable, wl, inputs, measure.poisoned_output(wl))


def gemm_parser(description: str) -> argparse.ArgumentParser:
    """A parser of the GEMM's options (--shape, --dtype, --out-dtype, --layout, fp8's
    --scales); `gemm_of` makes the workload of what it parsed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shape", required=True, help="MxNxK")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--out-dtype")
    parser.add_argument("--layout")
    parser.add_argument("--scales", choices=["tensor", "row", "block"])
    return parser


def gemm_of(args: argparse.Namespace) -> Workload:
    """The GEMM of gemm_parser's options (an ExplorerError where they name none)."""
    return Workload("gemm", parse_shape(args.shape, "gemm"), args.dtype, args.out_dtype,
                    args.layout, args.scales)


def main(argv: list[str]) -> int:
    parser = gemm_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--schedule", required=True,
                        help=f"a rung, rung:knobs, or one of {', '.join(BASELINES)}")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        wl = gemm_of(args)
        run = launcher(wl, args.schedule)
    except ExplorerError as e:  # a bad shape, dtype, schedule or knob: one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    for _ in range(args.calls):
        run()
    torch.cuda.synchronize()
    print(f"{args.schedule}: {args.calls} launches of {wl.label()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
