#!/usr/bin/env python3
"""On the GPU machine: a rung's knob settings against each other and cuBLAS, in one process,
in interleaved rounds (cuBLAS, then each setting, round after round), so that the clocks and
the GPU's heat are shared: the project's harness (each kernel checked against float64, then
timed with the L2 flushed before each launch), records appended to a JSONL like the runner's.

    python3 scripts/ab_knobs.py --shape 4096x4096x4096 --dtype bfloat16 --layout nt \\
        --schedules v8 v8:block_m=256,block_n=192 --rounds 3 --results ab.jsonl

Prints, per round, each setting's median and its % of that round's cuBLAS, then per setting
the median of its rounds' ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from schedules import ExplorerError, Workload, parse_shape  # noqa: E402
from tuning import bench, build, measure, records  # noqa: E402
from tuning.explore import SearchResults, build_schedule, resolve  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="gemm")
    parser.add_argument("--shape", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layout", default="nt")
    parser.add_argument("--out-dtype", default=None)
    parser.add_argument("--scales", default=None, help="fp8: tensor, row or block, as the runner's")
    parser.add_argument("--schedules", nargs="+", required=True,
                        help="schedule names with knobs, as the runner's --schedule takes them")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default="ab.jsonl")
    args = parser.parse_args()
    wl = Workload(args.op, parse_shape(args.shape, args.op), args.dtype, args.out_dtype, args.layout,
                  args.scales)
    if not measure.gpu_present():
        print("ab_knobs.py times kernels: it needs a CUDA GPU, and there is none here")
        return 1
    run = bench.Run()
    target = build.cuda_target(run.facts["arch"])
    built = {}
    for name in args.schedules:
        entry = resolve(wl, name, SearchResults(), warn=print)
        built[name] = (entry, build_schedule(entry, wl, target))
        print(f"{wl.label()}: {name}: built {entry.name} {entry.defaults}", flush=True)
    ratios = {name: [] for name in built}
    for round_ in range(args.rounds):
        cublas = bench.measure_cublas(run, wl)
        records.append(args.results, cublas)
        if cublas.status != "ok":
            print(f"cuBLAS failed: {cublas.error}")
            return 1
        base = cublas.timing.median_ms
        line = [f"round {round_}: cuBLAS {base:.4f} ms"]
        for name, (entry, done) in built.items():
            record = bench.measure_tvm(run, wl, entry.name, entry.kind, entry.defaults,
                                       done.executable)
            records.append(args.results, record)
            if record.status != "ok":
                line.append(f"{name} FAILED ({record.error})")
                continue
            ms = record.timing.median_ms
            ratios[name].append(base / ms)
            line.append(f"{name} {ms:.4f} ms ({100 * base / ms:.1f}%)")
        print(f"{wl.label()} | " + " | ".join(line), flush=True)
    for name, values in ratios.items():
        if values:
            print(f"{wl.label()} | {name}: median {100 * statistics.median(values):.1f}% of cuBLAS "
                  f"over {len(values)} rounds ({', '.join(f'{100 * v:.1f}' for v in values)})")
    return 0 if all(len(v) == args.rounds for v in ratios.values()) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ExplorerError as e:  # a bad shape, dtype or knob: one line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
