#!/usr/bin/env python3
"""A sweep's settings side by side, from the records scripts/sweep_suite.py wrote (never a live
run): per setting, its geometric mean of % of cuBLAS at each M and over every shape, its lowest,
the shapes under the no-cliffs floor and those it was fastest on; then the best of the settings
per shape (with --without, also the best of those whose names lack a text: what the others add
to a portfolio). Markdown, on stdout.

    python3 scripts/sweep_summary.py sweep.jsonl [more.jsonl.gz ...] [--tokens 300 700] \
        [--suite wide-bf16] [--without pingpong=true]

(--suite keeps one suite's shapes where a sweep ran several into one file, whose settings
would otherwise share rows across dtypes.)

(gzipped records, as the notebook keeps them, are read as they are.)
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from facts.record import Record  # noqa: E402
from reporting.render import latest_runs, markdown_table, workload_of  # noqa: E402
from reporting.shapes import sweep_rows  # noqa: E402
from schedules import ExplorerError  # noqa: E402
from schedules.errors import UsageError  # noqa: E402
from tuning import records  # noqa: E402


def summary(paths: list[str], tokens: list[int] | None, suite: str | None = None,
            without: str | None = None) -> str:
    """The markdown table of the sweeps in `paths` (the shapes at `tokens` rows only, and of
    `suite` only, where given; with `without`, a last row: the best of the settings whose
    names lack that text); the lines that are not measurement records are skipped, said on
    stderr as records.warn_of says them."""
    warn = lambda line: print(line, file=sys.stderr)  # noqa: E731
    found = [Record.from_json(r) for path in paths for r in records.measurements(path, warn)]
    runs = [run for run in latest_runs(found)
            if (not tokens or workload_of(run[0]).dims["M"] in tokens)
            and (not suite or run[0].suite == suite)]
    if not runs:
        raise UsageError(f"{', '.join(paths)} holds no measured shape"
                         + (f" at M = {', '.join(map(str, tokens))}" if tokens else "")
                         + (f" of suite {suite}" if suite else ""))
    return markdown_table(sweep_rows(runs, without))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="records files of sweeps")
    parser.add_argument("--tokens", type=int, nargs="+", help="the M of the shapes to keep")
    parser.add_argument("--suite", help="the suite whose shapes to keep")
    parser.add_argument("--without", metavar="TEXT",
                        help="add the best of the settings whose names lack TEXT (what the "
                             "others add to a portfolio)")
    args = parser.parse_args()
    for path in args.results:
        if not os.path.isfile(path):
            raise UsageError(f"{path} is not a file")
    print(summary(args.results, args.tokens, args.suite, args.without))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ExplorerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_status)
