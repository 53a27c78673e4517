#!/usr/bin/env python3
"""The command line: parse, call the pipeline's stages, print.

    python runner.py --schedule v3              # lower, print IR, build, check, time, record
    python runner.py --schedule all --no-ir     # the whole ladder plus baselines
    python runner.py --diff v2 v3               # what changed between two rungs
    python runner.py --report reports/x.md      # markdown from the results file
    python runner.py --list                     # schedules per op
"""

from __future__ import annotations

import argparse
import os
import re
import sys

DEFAULT_RESULTS = os.path.join("reports", "results.jsonl")


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="runner.py",
        description="Lower, build, check and time TVM schedules against cuBLAS and the GPU's limits.",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--schedule", default="v3", help="schedule name, or 'all' (default: v3)")
    what.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two schedules' IR")
    what.add_argument("--report", metavar="PATH", help="render a markdown report from --results")
    what.add_argument("--list", action="store_true", help="list the schedules of every op")
    p.add_argument("--op", help="gemm, gemv or batched_gemv (default: gemm, or the preset's)")
    p.add_argument("--shape", help="e.g. 1024x512x2048 (MxNxK for gemm, NxK for gemv, LxNxK)")
    p.add_argument("--preset", help="a named workload from the seeds (see --list)")
    p.add_argument("--dtype", help="input dtype: float32, float16 or bfloat16")
    p.add_argument("--out-dtype", help="output dtype (gemm default float32, gemv the input's)")
    p.add_argument("--layout", help="gemm: nn (B is KxN) or nt (B is NxK)")
    p.add_argument("--no-ir", action="store_true", help="do not print the lowered IR")
    p.add_argument("--show-cuda", action="store_true", help="print the generated CUDA source")
    p.add_argument("--arch", default="sm_90", help="CUDA arch when no GPU is present (sm_90)")
    p.add_argument("--warm-l2", action="store_true", help="do not flush L2 between timed launches")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"JSONL results (default {DEFAULT_RESULTS})")
    p.add_argument("--title", help="report title (default: from the report's file name)")
    p.add_argument("--notes", metavar="FILE", help="markdown appended to the report as its notes")
    return p.parse_args(argv)


def workload(args):
    from schedules import PRESETS, Workload, parse_shape
    from schedules.workloads import DEFAULT_DTYPES, DEFAULT_SHAPES

    if args.preset:
        if args.preset not in PRESETS:
            raise UsageError(f"unknown preset '{args.preset}'; valid: {', '.join(PRESETS)}")
        preset = PRESETS[args.preset]
        if args.op and args.op != preset.op:
            raise UsageError(f"preset {args.preset} is a {preset.op} workload, not {args.op}")
        if args.shape:
            raise UsageError("give either --preset or --shape, not both")
        return Workload(preset.op, preset.shape, args.dtype or preset.dtype, args.out_dtype,
                        args.layout)
    op = args.op or "gemm"
    shape = parse_shape(args.shape, op) if args.shape else DEFAULT_SHAPES.get(op, ())
    return Workload(op, shape, args.dtype or DEFAULT_DTYPES.get(op), args.out_dtype, args.layout)


def list_schedules() -> None:
    import schedules

    for op in schedules.workloads.OPS:
        print(f"{op}:")
        for entry in schedules.entries(op):
            tag = " (baseline)" if entry.baseline else ""
            params = ", ".join(f"{k}={v}" for k, v in entry.defaults.items())
            print(f"  {entry.name:12s}{entry.summary}{tag}" + (f"  [{params}]" if params else ""))
    print("presets:")
    for name, wl in schedules.PRESETS.items():
        print(f"  {name:18s}{wl.label()}")


def diff(args, wl) -> None:
    from schedules import get
    from tuning import build

    target = build.cuda_target(args.arch)
    old, new = args.diff
    a, b = (build.lower_and_build(get(wl.op, name).apply(wl, target), target) for name in args.diff)
    print(build.unified_diff(build.ir_text(a.lowered), build.ir_text(b.lowered),
                             f"{old} (lowered)", f"{new} (lowered)"))
    if args.show_cuda:
        print(build.unified_diff(a.source, b.source, f"{old}.cu", f"{new}.cu"))
    from tabulate import tabulate

    rows = [[k, v, b.structure[k]] for k, v in a.structure.items()]
    print(f"Structure of {wl.label()}, {target.attrs['arch']}:")
    print(tabulate(rows, headers=["", old, new], tablefmt="github"))


def report(args) -> None:
    from reports.render import render
    from tuning import records

    loaded = records.load(args.results)
    for problem in loaded.problems:
        print(f"warning: {problem}; skipped", file=sys.stderr)
    if not loaded.records:
        raise UsageError(f"no measurements in {args.results}: run on a GPU first")
    notes = None
    if args.notes:
        try:
            with open(args.notes) as f:
                notes = f.read()
        except OSError as e:
            raise UsageError(f"cannot read --notes {args.notes}: {e.strerror}") from e
    title = args.title or os.path.splitext(os.path.basename(args.report))[0]
    text = render(loaded.records, title=title, notes=notes)
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(args.report, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.report}")


def run_schedules(args, wl) -> None:
    import schedules
    from tuning import build, measure, records

    loaded = records.load(args.results)  # read first: a corrupt line is reported, never rewritten
    for problem in loaded.problems:
        print(f"warning: {problem}; the line is kept as it is and new records are appended",
              file=sys.stderr)
    selection = schedules.entries(wl.op) if args.schedule == "all" else [
        schedules.get(wl.op, args.schedule)]
    run = None
    if measure.gpu_present():
        from tuning import bench

        run = bench.Run(flush_l2=not args.warm_l2)
        arch = run.facts["arch"]
        print(f"GPU: {run.facts['gpu']} ({arch}), driver {run.facts['driver']}; run {run.run_id}")
    else:
        arch = args.arch
    target = build.cuda_target(arch)
    measured = []

    def keep(record):
        records.append(args.results, record)
        measured.append(record)

    for entry in selection:
        kind = "baseline" if entry.baseline else "rung"
        try:
            built = build.lower_and_build(entry.apply(wl, target), target)
        except schedules.ScheduleNotApplicable as e:
            print(f"{entry.name}: skipped: {e}")
            if run:
                keep(run.record(wl, entry.name, kind, entry.defaults, status="skipped", error=str(e)))
            continue
        except Exception as e:  # noqa: BLE001  a schedule or build bug stops this rung only
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"{entry.name}: build failed: {first_line}")
            if run:
                keep(run.record(wl, entry.name, kind, entry.defaults, status="build_failed",
                                error=str(e)))
            continue
        if not args.no_ir:
            print(f"# ---- {entry.name}: lowered for {arch} ({wl.label()}) ----")
            print(build.ir_text(built.lowered))
        if args.show_cuda:
            print(f"// ---- {entry.name}: CUDA ----")
            print(built.source)
        print(f"{entry.name}: built: {built.describe()}")
        if run:
            keep(bench.measure_tvm(run, wl, entry.name, kind, entry.defaults, built.executable,
                                   structure=built.structure, resources=built.resources))
    if not run:
        print(f"no GPU here: built {wl.label()} for {arch} (CUDA source only); "
              "skipped the correctness check and timing")
        return
    for baseline in bench.measure_baselines(run, wl):
        keep(baseline)
    ceiling = bench.measure_copy(run)
    records.append(args.results, ceiling)
    from reports.render import markdown_table, table_rows

    rows = table_rows([{**m, "copy_gbps": ceiling["copy_gbps"]} for m in measured])
    print(f"\n{wl.label()} on {run.facts['gpu']}; {measure.timing_method(run.flush_l2)}; "
          f"copy bandwidth {ceiling['copy_gbps']:.0f} GB/s")
    print(markdown_table(rows))
    print(f"records appended to {args.results}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if not re.fullmatch(r"sm_\d+[af]?", args.arch):
            raise UsageError(f"malformed --arch '{args.arch}': expected sm_<major><minor>, e.g. sm_90")
        if args.list:
            list_schedules()
        elif args.report:
            report(args)
        else:
            wl = workload(args)
            if args.diff:
                diff(args, wl)
            else:
                run_schedules(args, wl)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # bad input found deeper down: one line, no traceback
        from schedules import ScheduleNotApplicable, UnknownSchedule, WorkloadError
        from tuning.records import RecordsError

        if isinstance(e, (UnknownSchedule, WorkloadError, RecordsError, ScheduleNotApplicable)):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
