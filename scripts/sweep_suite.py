#!/usr/bin/env python3
"""On the GPU machine: several settings of a rung over a suite's shapes, the way the suite
runs one rung (every pair built first in parallel workers, then each kernel checked against
float64 and timed beside cuBLAS, records appended as they are measured), to see which setting
each shape wants before a heuristic is changed.

    python3 scripts/sweep_suite.py --suite wide-bf16 --tokens 300 700 \\
        --schedules v8 v8:block_m=128,block_n=192,split_k=1 --results sweep.jsonl

--portfolio adds, shape by shape, the settings `best` weighs for it (tuning/explore.py's
`portfolio`). --tokens keeps the suite's shapes of those M only; --rows instead moves each of
the suite's distinct layers (N x K) to each of those M, and --layout gives every shape that
layout: shapes beside the suite's own, to check a rule on what it was not read off. The records
carry each setting's knobs (params); reporting them per setting is the analysis's business, not
this script's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from schedules import ExplorerError, suites  # noqa: E402
from schedules.errors import UsageError  # noqa: E402
from tuning import explore, measure  # noqa: E402
from tuning.suite import run_suite  # noqa: E402


def at_rows(suite: suites.Suite, rows: list[int], layout: str | None) -> suites.Suite:
    """`suite` with each of its distinct layers (N x K, the first entry of each) at each M of
    `rows`, in `layout` where one is given."""
    layers = {}
    for entry in suite.entries:
        layers.setdefault(entry.workload.shape[1:], entry)
    entries = []
    for m in rows:
        for (n, k), entry in layers.items():
            workload = dataclasses.replace(entry.workload, shape=(m, n, k),
                                           layout=layout or entry.workload.layout)
            entries.append(dataclasses.replace(entry, workload=workload,
                                               origin=f"{entry.origin}; moved to M = {m}"))
    return dataclasses.replace(suite, entries=tuple(entries))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", required=True, choices=sorted(suites.SUITES))
    rows = parser.add_mutually_exclusive_group()
    rows.add_argument("--tokens", type=int, nargs="*", help="the M of the shapes to keep")
    rows.add_argument("--rows", type=int, nargs="+",
                      help="each of the suite's layers (N x K) at each of these M instead")
    parser.add_argument("--layout", choices=["nn", "nt"], help="every shape in this layout")
    parser.add_argument("--schedules", nargs="+", required=True,
                        help="schedule names with knobs, as the runner's --schedule takes them")
    parser.add_argument("--portfolio", action="store_true",
                        help="also each shape's portfolio (the settings `best` weighs for it)")
    parser.add_argument("--results", default="sweep.jsonl")
    args = parser.parse_args()
    suite = suites.get(args.suite)
    if args.tokens:
        kept = tuple(e for e in suite.entries if e.workload.dims["M"] in args.tokens)
        if not kept:
            raise UsageError(f"suite {suite.name} has no shape at M = "
                             f"{', '.join(map(str, args.tokens))}")
        suite = dataclasses.replace(suite, entries=kept)
    if args.rows or args.layout:
        if any(m <= 0 for m in args.rows or ()):
            raise UsageError("--rows takes positive M")
        suite = at_rows(suite, args.rows or sorted({e.workload.dims["M"] for e in suite.entries}),
                        args.layout)
    for name in args.schedules:  # a bad name or knob refused here, not in the build workers
        explore.resolve(suite.entries[0].workload, name, explore.SearchResults())
    if not measure.gpu_present():
        print("sweep_suite.py times kernels: it needs a CUDA GPU, and there is none here")
        return 1
    run_suite(suite, args.schedules, explore.Settings(results=args.results), say=print,
              warn=print, more=explore.portfolio if args.portfolio else None)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ExplorerError as e:  # a bad schedule name or knob, or no such shapes: one line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_status)
