"""What clock and power a GEMM kernel runs at when it runs back to back: ncu locks the SM clock
(1.3 GHz here), where two kernels can take the same cycles and still differ in the harness,
whose clocks boost until the GPU reaches its power limit. For each kernel in turn (a rung with
knobs, or cuBLAS), several times over: launches back to back for a few seconds while
nvidia-smi samples the SM clock and the board's power; prints the median of each, with the
mean time per launch.

    python3 scripts/clock_probe.py --shape 4096x4096x4096 --dtype bfloat16 --layout nt \\
        --out-dtype float32 --schedules v8 cublas
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

import torch

from profile_launch import gemm_of, gemm_parser, launcher
from schedules import ExplorerError

SAMPLE_MS = 50


def sampled(run, seconds: float) -> tuple[float, float, float]:
    """(median SM clock in MHz, median power in W, mean ms per launch) over `seconds` of
    back-to-back launches of `run`."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"],
                           stdout=subprocess.PIPE, text=True)
    start, launches = time.perf_counter(), 0
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            run()
        launches += 50
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].splitlines() if "," in line]
    skip = len(rows) // 4  # the first quarter: the clocks settling
    clocks = [float(r[0]) for r in rows[skip:]]
    watts = [float(r[1]) for r in rows[skip:]]
    return statistics.median(clocks), statistics.median(watts), begin.elapsed_time(end) / launches


def main(argv: list[str]) -> int:
    parser = gemm_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", nargs="+", required=True, help="rungs with knobs, or cublas")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        wl = gemm_of(args)
        runs = {name: launcher(wl, name) for name in args.schedules}
    except ExplorerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if shutil.which("nvidia-smi") is None:
        print("error: nvidia-smi is not on PATH: it samples the clock and the power",
              file=sys.stderr)
        return 2
    for round_ in range(args.rounds):
        for name, run in runs.items():
            clock, watts, ms = sampled(run, args.seconds)
            print(f"{wl.label()} | round {round_} | {name}: {clock:.0f} MHz, {watts:.0f} W, "
                  f"{ms * 1e3:.1f} us per launch back to back", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
