#!/usr/bin/env python3
"""On the GPU machine: v8 (schedules/v8/) and v7 through the project's own harness
(runner.py: correctness against float64, timing against cuBLAS as the runner prints it) on the
workloads of issue 22, one runner call per (workload, schedule), results into one JSONL; fp8
workloads run v8 only (v7 takes 16-bit inputs).

    python3 scripts/v8-check.py                 # every workload below, v8 then v7
    python3 scripts/v8-check.py --only 4096     # the workloads whose label contains 4096
    python3 scripts/v8-check.py --only float8   # the fp8 ones
    python3 scripts/v8-check.py --schedules v8  # v8 alone
    OUT=/some/dir python3 scripts/v8-check.py   # results and log there (default ./gpu-out)

Each call runs under a time limit (a wrong mbarrier phase hangs rather than failing); a line
per call says which it was. The runner's own output, cuBLAS rows included, goes to the log and
the results to $OUT/v8.jsonl (`python3 runner.py --report $OUT/v8.jsonl` renders them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (shape, dtype, layout, out_dtype): aligned, 16-bit C, large, ragged, decode-sized M
WORKLOADS = [
    ("4096x4096x4096", "float16", "nn", "float32"),
    ("4096x4096x4096", "float16", "nt", "float32"),
    ("4096x4096x4096", "bfloat16", "nt", "float32"),
    ("4096x4096x4096", "float16", "nt", "float16"),  # the prototype's wrong case, fixed
    ("4096x4096x4096", "bfloat16", "nn", "bfloat16"),
    ("8192x8192x8192", "float16", "nt", "float16"),
    ("8192x8192x8192", "float16", "nn", "float32"),
    ("8192x8192x8192", "bfloat16", "nt", "float32"),
    ("4000x4000x4000", "bfloat16", "nn", "float32"),  # ragged against the 128x256 tiles
    ("1000x4096x4096", "bfloat16", "nt", "float32"),
    ("128x4096x4096", "bfloat16", "nt", "float32"),
    ("16x6144x4096", "bfloat16", "nt", "float32"),
    ("100x304x40", "float16", "nn", "float16"),
    # fp8 e4m3, scaled per tensor, 16-bit C: against torch._scaled_mm (v7 takes 16-bit only)
    ("4096x4096x4096", "float8_e4m3fn", "nt", "bfloat16"),
    ("8192x8192x8192", "float8_e4m3fn", "nt", "bfloat16"),
    ("4096x4096x4096", "float8_e4m3fn", "nt", "float16"),
    ("1000x4096x4096", "float8_e4m3fn", "nt", "bfloat16"),
    ("128x4096x4096", "float8_e4m3fn", "nt", "bfloat16"),
    ("16x6144x4096", "float8_e4m3fn", "nt", "bfloat16"),
]
SCHEDULES = {"float8_e4m3fn": ("v8",)}  # by input dtype; any other: DEFAULT_SCHEDULES
DEFAULT_SCHEDULES = ("v8", "v7")
LIMIT_S = 600


def label(shape, dtype, layout, out_dtype) -> str:
    return f"{shape} {dtype}->{out_dtype} {layout}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run the workloads whose label contains this")
    parser.add_argument("--schedules", nargs="+", default=None,
                        help="run these schedules on every workload (default: v8, and v7 on "
                             "16-bit inputs)")
    args = parser.parse_args()
    out = os.environ.get("OUT", "gpu-out")
    os.makedirs(out, exist_ok=True)
    results, log_path = os.path.join(out, "v8.jsonl"), os.path.join(out, "v8-check.log")
    failed = 0
    with open(log_path, "a") as log:
        for workload in WORKLOADS:
            if args.only not in label(*workload):
                continue
            shape, dtype, layout, out_dtype = workload
            for name in args.schedules or SCHEDULES.get(dtype, DEFAULT_SCHEDULES):
                command = [sys.executable, "runner.py", "--shape", shape, "--dtype", dtype,
                           "--layout", layout, "--out-dtype", out_dtype, "--schedule", name,
                           "--no-ir", "--results", results]
                log.write(f"\n$ {' '.join(command)}\n")
                log.flush()
                try:
                    done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                          timeout=LIMIT_S)
                    status = "ok" if done.returncode == 0 else f"exit status {done.returncode}"
                except subprocess.TimeoutExpired:
                    status = f"TIMED OUT after {LIMIT_S} s (a hang: mbarrier phases?)"
                failed += status != "ok"
                print(f"{name:3} {label(*workload):40} {status}", flush=True)
    print(f"log: {log_path}; results: {results} (python3 runner.py --report {results})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
