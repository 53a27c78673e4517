#!/usr/bin/env python3
"""On the GPU machine: every split-K candidate of MetaSchedule's first batch, for several
random states, built and checked against float64 in a process of its own, so that a kernel that
faults (and ends its process's CUDA context) names itself instead of failing the next launch.

    python3 scripts/split_k_batch_check.py --states 3 --out split-k-check

Prints one line per distinct candidate (ok, or its exit status and last line of output), and
writes each failing one's scheduled module (bad-<hash>.py) and output (bad-<hash>.log)
into --out.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm  # noqa: E402

from schedules import Workload  # noqa: E402
from tests.test_tuning import split_k_candidates  # noqa: E402
from tuning import build, measure  # noqa: E402

WORKLOAD = Workload("gemm", (256, 128, 512))  # the GPU tier's split-K case


def check(path: str) -> int:
    """Build the module saved at `path` and check it on five inputs, four calls each (a race
    shows as a wrong call); exit 0 if every call is within the workload's tolerance."""
    executable = build.build(tvm.ir.load_json(open(path).read()), build.cuda_target("sm_90"))
    worst = 0.0
    for seed in range(1, 6):
        inputs = measure.random_inputs(WORKLOAD, seed)
        run = measure.tvm_runner(executable, WORKLOAD, inputs, measure.poisoned_output(WORKLOAD))
        for _ in range(4):
            worst = max(worst, measure.relative_error(run(), measure.reference(WORKLOAD, inputs)))
    print(f"worst relative error {worst:.3g} (tolerance {measure.tolerance(WORKLOAD):g})")
    return 0 if worst <= measure.tolerance(WORKLOAD) else 1


def run_one(path: str) -> subprocess.CompletedProcess:
    """check(path) in a process of its own, launches synchronous so a fault names its kernel."""
    try:
        return subprocess.run([sys.executable, __file__, "--check", path], capture_output=True,
                              text=True, env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}, timeout=120)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", "timed out after 120 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=3, help="random states, 1 to N")
    parser.add_argument("--out", default="split-k-check")
    parser.add_argument("--check", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check:
        return check(args.check)
    os.makedirs(args.out, exist_ok=True)
    target, candidates = build.cuda_target("sm_90"), {}
    for state in range(1, args.states + 1):
        for mod in split_k_candidates(WORKLOAD, target, state):
            candidates.setdefault(hashlib.sha1(mod.script().encode()).hexdigest()[:10], (state, mod))
    print(f"{len(candidates)} distinct split-K candidates", flush=True)
    paths = {}
    for key, (_, mod) in candidates.items():
        paths[key] = os.path.join(args.out, f"cand-{key}.json")
        with open(paths[key], "w") as f:
            f.write(tvm.ir.save_json(mod))
    results = dict(zip(paths, ThreadPoolExecutor(8).map(run_one, paths.values())))
    bad = 0
    for key, (state, mod) in candidates.items():
        proc, text = results[key], results[key].stdout + results[key].stderr
        last = (text.strip().splitlines() or [""])[-1][:300]
        print(f"{key} state {state}: {'ok' if proc.returncode == 0 else f'rc {proc.returncode}'}: {last}")
        os.remove(paths[key])
        if proc.returncode:
            bad += 1
            with open(os.path.join(args.out, f"bad-{key}.py"), "w") as f:
                f.write(mod.script())
            with open(os.path.join(args.out, f"bad-{key}.log"), "w") as f:
                f.write(text)
    print(f"{bad} of {len(candidates)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
