#!/usr/bin/env python3
"""The command line: parse, call the pipeline's stages, print.

    python runner.py --schedule v3              # lower, print IR, build, check, time, record
    python runner.py --schedule all --no-ir     # the whole ladder plus baselines
    python runner.py --diff v2 v3               # what changed between two rungs
    python runner.py --diff v5k v5k:k_slices=8  # ... or between two settings of a rung's knobs
    python runner.py --report reports/x.md      # markdown from the results file
    python runner.py --list                     # schedules per op
    python runner.py --tune metaschedule --trials 256 --work-dir ms-gemm   # MetaSchedule search
    python runner.py --tune autotvm:seed_template --tuner xgb --records at.jsonl   # knob search
    python runner.py --schedule metaschedule --work-dir ms-gemm   # the best found, like a rung
    python runner.py --suite llm-bf16            # real models' shapes: rungs, dlight, cuBLAS
"""

from __future__ import annotations

import argparse
import os
import sys

from schedules.errors import ExplorerError, RecordsError, UsageError

DEFAULT_RESULTS = os.path.join("reports", "results.jsonl")
DEFAULT_SCHEDULE = "v3"
OLDEST_ARCH = 75  # the oldest GPU that CUDA 13's nvcc builds for (sm_75, Turing)


SEED_LIMIT = 2 ** 32  # numpy's and TVM's random engines take seeds in [0, 2^32)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as UsageError: one line and exit 2 like every other
    refusal, not the usage dump and SystemExit that argparse prints by default."""

    def error(self, message: str):
        raise UsageError(f"{message} (runner.py --help lists the flags)")


def seed(text: str) -> int:
    """--seed: an integer the search's random engines take, in [0, 2^32)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, not '{text}'") from None
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"expected 0 to {SEED_LIMIT - 1}, not {value}")
    return value


def refuse_empty(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A flag given an empty value (--shape "") is refused, not taken as absent (which would
    silently run the default)."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if any(isinstance(v, str) and not v.strip()
               for v in (value if isinstance(value, list) else [value])):
            parser.error(f"argument {'/'.join(action.option_strings)}: empty value")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(
        prog="runner.py",
        description="Lower, build, check and time TVM schedules against cuBLAS and the GPU's limits.",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--schedule",
                      help="schedule name, with knobs as v5k:k_slices=4,thread_n=8 (a rung's "
                      "other knobs as its shape heuristic picks them), 'best' (the fastest that "
                      "the records of this GPU know for the workload, else a rule's rung), or "
                      f"'all' (default: {DEFAULT_SCHEDULE}); with --suite, the one rung to run "
                      "beside the baselines (default: all of the suite's)")
    what.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two schedules' IR")
    what.add_argument("--explain", nargs=2, metavar=("OLD", "NEW"), help="why two schedules "
                      "differ: IR diff, instruction mix, counters (tuning/explain.py)")
    what.add_argument("--report", metavar="PATH", help="render a markdown report from --results")
    what.add_argument("--list", action="store_true",
                      help="list the schedules of every op, the presets and the suites")
    what.add_argument("--tune", metavar="SEARCH",
                      help="search: 'metaschedule' or 'autotvm:<template>' (a schedule with a space)")
    p.add_argument("--suite", metavar="NAME",
                   help="run a named list of real models' shapes (see --list) through the suite's "
                   "rungs and baselines; with --list, show its shapes")
    p.add_argument("--op", help="gemm, gemv or batched_gemv (default: gemm, or the preset's)")
    p.add_argument("--shape", help="e.g. 1024x512x2048 (MxNxK for gemm, NxK for gemv, LxNxK)")
    p.add_argument("--preset", help="a named workload from the seeds (see --list)")
    p.add_argument("--dtype", help="input dtype: float32, float16 or bfloat16; gemm also "
                   "float8_e4m3fn (layout nt, a float32 scale per tensor, bfloat16 output by "
                   "default); gemv and batched_gemv also nvfp4 (4-bit e2m1 codes, an e4m3 scale "
                   "per 16 elements; float16 output by default)")
    p.add_argument("--out-dtype", help="output dtype (gemm default float32, fp8 gemm bfloat16, "
                   "gemv the input's)")
    p.add_argument("--layout", help="gemm: nn (B is KxN) or nt (B is NxK)")
    p.add_argument("--no-ir", action="store_true", help="do not print the lowered IR")
    p.add_argument("--show-cuda", action="store_true", help="print the generated CUDA source")
    p.add_argument("--arch", default="sm_90",
                   help="the GPU to build for when none is here: its arch (sm_90) or its TVM "
                        "tag (nvidia/nvidia-h100); its real limits (shared memory) come with it")
    p.add_argument("--flush", choices=("read", "write", "none"), default="read",
                   help="before each timed launch: flush L2 by reading 256 MB (default), by "
                   "writing it (as Triton's and TileLang's do_bench do: dirty lines, 10-12%% "
                   "slower bandwidth-bound rows), or not at all (none: L2 stays warm)")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"JSONL results (default {DEFAULT_RESULTS})")
    p.add_argument("--trials", type=int, default=64, help="new trials to measure (default 64)")
    p.add_argument("--work-dir", help="MetaSchedule work dir (database, progress, best schedule)")
    p.add_argument("--ms-space", help="MetaSchedule's design space: 'tvm' (TVM's rules), "
                   "'split-k' (those plus splitting K across blocks; the default on CUDA), or "
                   "rungs' knob spaces (e.g. v5k or v7,v8; their own choices measured first)")
    p.add_argument("--records", help="template-search records (JSONL), read to resume or apply")
    p.add_argument("--tuner", help="template tuner: grid, random or xgb (default xgb)")
    p.add_argument("--seed", type=seed, default=0,
                   help="seed of the random and xgb tuners and of MetaSchedule's search")
    p.add_argument("--target", default="cuda", help="cuda, or llvm (MetaSchedule on the CPU)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on the tracker's hosts")
    p.add_argument("--rpc-key", help="device key the hosts registered with the tracker")
    p.add_argument("--device", help="without a GPU here: whose template-search records to apply "
                   "(a GPU name as the records say it; default: the records' only one)")
    p.add_argument("--export", metavar="DIR",
                   help="write the schedule's kernel into DIR (new or empty): its CUDA source, "
                   "the shared library TVM's runtime loads, a loader (load.py: torch and TVM "
                   "only) and kernel.json (workload, schedule, knobs, GPU, TVM, measured time)")
    p.add_argument("--title", help="report title (default: from the report's file name)")
    p.add_argument("--notes", metavar="FILE", help="markdown appended to the report as its notes")
    args = p.parse_args(argv)
    refuse_empty(p, args)
    return args


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
        for entry in schedules.entries(op, templates=True):
            tag = f" ({entry.kind})" if entry.kind != "rung" else ""
            params = ", ".join(f"{k}={v}" for k, v in entry.defaults.items())
            print(f"  {entry.name:14s}{entry.summary}{tag}" + (f"  [{params}]" if params else ""))
            if entry.space:
                from tuning.autotvm import Space

                knobs = "; ".join(f"{k} {v}" for k, v in entry.space.items())
                print(f"  {'':14s}space ({len(Space(entry.space))}): {knobs}")
    print("presets:")
    for name, wl in schedules.PRESETS.items():
        print(f"  {name:18s}{wl.label()}")
    list_suites()


def list_suites() -> None:
    """The suites of real shapes, one line each."""
    from schedules import suites

    print("suites (--suite NAME runs one; --suite NAME --list shows its shapes):")
    for suite in suites.SUITES.values():
        print(f"  {suite.name:14s}{suite.summary}; {len(suite.entries)} shapes; "
              f"{', '.join(suite.schedule_names())} and cuBLAS")


def list_suite(suite, names: list[str]) -> None:
    """--suite NAME --list: what the suite runs, and each shape with where it comes from."""
    from tabulate import tabulate

    print(f"suite {suite.name}: {suite.summary}")
    print(f"schedules: {', '.join(names)}; baselines measured with them: cuBLAS (the workload's "
          "output dtype), and TF32 for float32 GEMMs, fast accumulation for fp8 ones, the seed's "
          "Triton kernel for GEMVs")
    if suite.left_out:
        print(f"not run: {suite.left_out}")
    rows = [[e.workload.label(), e.tags()["model"], e.layer, e.origin] for e in suite.entries]
    print(tabulate(rows, headers=["shape", "model", "layer", "origin"], tablefmt="plain"))


def say(line: str) -> None:
    """A line of progress or of results, on stdout at once."""
    print(line, flush=True)


def warn(line: str) -> None:
    """A warning, on stderr."""
    print(line, file=sys.stderr)


def search_results(args):
    """Where --work-dir, --records and (for `best`) --results say what searches and runs found,
    and whose records apply here: this GPU's, the RPC key's hosts' or (no GPU here) --device's."""
    from tuning import autotvm
    from tuning.explore import SearchResults

    if args.records and not args.tune and not os.path.isfile(args.records):
        raise RecordsError(f"--records {args.records} does not exist: give the records of a "
                           "template search (--tune autotvm:<template> --records ... writes them)")
    device = (autotvm.records_device(args.rpc_tracker, args.rpc_key, args.device)
              if args.records or args.schedule == "best" else None)
    return SearchResults(args.work_dir, args.records, device, args.results)


def diff(args, wl, found) -> None:
    """--diff OLD NEW: the lowered IR's unified diff (common-subexpression names made stable)
    and a table of the structural facts of both."""
    from schedules.errors import ScheduleNotApplicable
    from tuning import build
    from tuning.explore import build_schedule, refusal, resolve

    target = build.cuda_target(args.arch)

    def built(name: str) -> build.Built:
        """The schedule `name` built; refused as a schedule named with its knobs is."""
        schedule = resolve(wl, name, found, warn)
        try:
            return build_schedule(schedule, wl, target)
        except ScheduleNotApplicable as e:
            raise refusal(schedule, wl, target, e) from None

    (old, new), (a, b) = args.diff, [built(name) for name in args.diff]
    print(build.unified_diff(*(build.stable_cse_names(build.ir_text(x.lowered)) for x in (a, b)),
                             f"{old} (lowered)", f"{new} (lowered)"))
    if args.show_cuda:
        print(build.unified_diff(a.source, b.source, f"{old}.cu", f"{new}.cu"))
    from tabulate import tabulate

    rows = [[k, v, b.structure[k]] for k, v in a.structure.items()]
    print(f"Structure of {wl.label()}, {target.attrs['arch']}:")
    print(tabulate(rows, headers=["", old, new], tablefmt="github"))


def report(args) -> None:
    """--report: markdown from --results; a suite report (reports/shapes.py) where the records
    are those of suite runs, else the exploration report (reports/render.py). Written through
    a staging directory (render.staged), so where it cannot be written is refused before any
    work and a failure leaves nothing behind; records that fail their checks are named and
    skipped."""
    from reports import render, shapes
    from tuning import records

    if os.path.isdir(args.report):
        raise UsageError(f"--report {args.report} is a directory; name the markdown file to write")
    with render.staged(args.report) as staged:
        notes = read_notes(args.notes)
        loaded = records.load(args.results, check=records.measurement_problem)
        if not loaded.records:
            skipped = (f": {len(loaded.problems)} lines skipped, the first {loaded.problems[0]}"
                       if loaded.problems else ": run on a GPU first")
            raise RecordsError(f"no measurements in {args.results}{skipped}")
        records.warn_of(loaded, warn, then="skipped")
        measured = loaded.records
        of_suites = [r for r in measured if r.get("suite")]
        renderer = shapes.render if of_suites else render.render
        if of_suites and len(of_suites) < len(measured):
            warn(f"warning: {len(measured) - len(of_suites)} records of {args.results} are not "
                 "from suite runs; this suite report leaves them out (render them from a "
                 "results file of their own)")
            measured = of_suites
        title = args.title or os.path.splitext(os.path.basename(args.report))[0]
        text = renderer(measured, title=title, notes=notes,
                        figure_prefix=os.path.splitext(staged)[0])
        with open(staged, "w") as f:
            f.write(text + "\n")
    print(f"wrote {args.report}")


def read_notes(path: str | None) -> str | None:
    """--notes: the markdown text of `path` (None without one); a file that cannot be read,
    or is not UTF-8 text, is refused in one line."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"cannot read --notes {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"cannot read --notes {path}: not UTF-8 text (byte {e.start})") from e


def run_schedules(args, wl, chosen: list, extra_records: list | None = None,
                  explicit: bool = False) -> None:
    """The exploration run (tuning/explore.py) with the command line's settings."""
    from tuning.explore import Settings, explore

    settings = Settings(results=args.results, arch=args.arch, flush=args.flush,
                        show_ir=not args.no_ir, show_cuda=args.show_cuda, explicit=explicit)
    explore(wl, chosen, settings, warn=warn, extra_records=extra_records)


# Flags that pick a workload, a search or another kind of run: a suite brings its own.
NOT_WITH_SUITE = ("shape", "preset", "op", "dtype", "out_dtype", "layout", "diff", "explain", "tune",
                  "report",
                  "work_dir", "records", "tuner", "ms_space", "rpc_tracker", "rpc_key", "device")


def suite_request(args):
    """--suite NAME: the suite and the schedules to run on each of its shapes (--schedule keeps
    one rung and the baselines); a flag of NOT_WITH_SUITE, or a knob that the rung lacks, is
    refused here, before anything is built or written."""
    from schedules import suites
    from tuning.explore import SearchResults, resolve

    suite = suites.get(args.suite)
    given = [f"--{name.replace('_', '-')}" for name in NOT_WITH_SUITE if getattr(args, name)]
    if given:
        raise UsageError(f"--suite runs the suite's own shapes and schedules; it does not take "
                         f"{', '.join(given)}")
    names = suite.schedule_names(args.schedule)
    for name in names:
        resolve(suite.entries[0].workload, name, SearchResults(), warn)  # knobs checked
    return suite, names


def suite_run(args, suite, names: list[str]) -> None:
    """--suite: build every shape's schedules, then on a GPU check, time and record them."""
    from tuning.explore import Settings
    from tuning.suite import run_suite

    run_suite(suite, names, Settings(results=args.results, arch=args.arch, flush=args.flush),
              say, warn)


def search_request(args, found):
    """--tune and the flags that go with it, as a search request; a flag the search needs and
    lacks, or one that belongs to the other kind of search, is refused here."""
    from tuning.search import Request

    if args.tune == "metaschedule":
        if not args.work_dir:
            raise UsageError("--tune metaschedule needs --work-dir (its database; reused to resume)")
        if args.tuner:
            raise UsageError("--tuner picks a template search's tuner (--tune autotvm:<template>);"
                             " MetaSchedule has its own evolutionary search")
    elif args.tune.startswith("autotvm:"):
        if args.ms_space:
            raise UsageError("--ms-space is MetaSchedule's design space (--tune metaschedule); a "
                             "template search's space is the template's knobs")
        if not args.records:
            raise UsageError(f"--tune {args.tune} needs --records (a JSONL file; reused to resume)")
        if args.target == "llvm":
            raise UsageError("--target llvm is for MetaSchedule searches (--tune metaschedule)")
    if args.rpc_tracker and not args.rpc_key:
        raise UsageError("--rpc-tracker needs --rpc-key (the key the GPU hosts registered)")
    check_search_outputs(args)
    return Request(args.tune, args.trials, work_dir=found.work_dir, space=args.ms_space,
                   records=found.records, device=found.device, tuner=args.tuner, seed=args.seed,
                   target=args.target, arch=args.arch, flush=args.flush,
                   rpc_tracker=args.rpc_tracker, rpc_key=args.rpc_key)


def check_search_outputs(args) -> None:
    """Refuse, before a search starts, a work dir, records file or results file that it could
    not write: found only at its end, that would lose the search's summary."""
    from tuning.records import check_writable

    if args.work_dir:
        check_writable(args.work_dir, "--work-dir", directory=True)
    if args.records:
        check_writable(args.records, "--records")
    check_writable(args.results, "--results")


def tune(args, wl, found) -> None:
    """--tune: search, then (on this machine's GPU) check and time the best like a rung, next
    to the baselines, with the search's summary recorded among them for the report; a search
    measured elsewhere (RPC servers, this CPU) records its summary alone, under the device that
    measured it."""
    from tuning import bench, records, search
    from tuning.explore import resolve

    request = search_request(args, found)
    summary = search.run(wl, request, say, warn)
    if request.on_local_gpu:
        say(f"checking and timing the best ({summary['schedule']}) with the baselines, in one run:")
        run_schedules(args, wl, [resolve(wl, summary["schedule"], found, warn)], [summary],
                      explicit=True)
        return
    device = summary.pop("device")
    if device is None:  # every candidate of this session failed before a server replied
        warn(f"warning: the search's summary is not recorded in {args.results}: no RPC server "
             "said what it measures on")
        return
    records.append(args.results, bench.Run(request.flush, device).record(wl, **summary))
    say(f"search summary recorded in {args.results} (measured on {device['gpu']})")


# Flags that ask for another kind of run than --export's: one schedule's kernel, written out.
NOT_WITH_EXPORT = ("suite", "list", "report", "diff", "explain", "tune")


def check_export(args) -> None:
    """--export goes with one schedule (--schedule NAME, not all) and no other kind of run:
    anything else is refused before a thing is built or written."""
    if not args.export:
        return
    given = [f"--{name}" for name in NOT_WITH_EXPORT if getattr(args, name)]
    if given:
        raise UsageError(f"--export writes one schedule's kernel; it does not take "
                         f"{', '.join(given)}")
    if args.schedule == "all":
        raise UsageError("--export writes one kernel: name its schedule (a rung, best, "
                         "metaschedule or autotvm:<template>), not all")


def export(args, wl, found) -> None:
    """--export DIR: the kernel of --schedule, built (on a GPU: checked and timed), written to
    DIR."""
    from tuning.explore import Settings
    from tuning.export import export as export_kernel

    export_kernel(wl, args.schedule or DEFAULT_SCHEDULE, args.export, found,
                  Settings(results=args.results, arch=args.arch, flush=args.flush), say, warn)


def checked_arch(name: str) -> str:
    """The arch that --arch names (an sm_ number or a GPU's TVM tag), refused if older than
    any GPU CUDA 13 builds for, or not a GPU whose per-block limits the target carries
    (common.SHARED_BYTES_PER_BLOCK): nvcc would reject it only after the lowering."""
    from schedules.common import SHARED_BYTES_PER_BLOCK, compute_capability
    from tuning.build import arch_of

    arch = arch_of(name)
    capability = compute_capability(arch)
    if capability < OLDEST_ARCH:
        raise UsageError(f"--arch {name} is older than any GPU that CUDA 13 builds for "
                         f"(sm_{OLDEST_ARCH} and later)")
    if capability not in SHARED_BYTES_PER_BLOCK:
        known = ", ".join(f"sm_{cc}" for cc in sorted(SHARED_BYTES_PER_BLOCK))
        raise UsageError(f"unknown --arch {name}: no GPU of that arch is known here; known: "
                         f"{known}")
    return arch


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        args.arch = checked_arch(args.arch)
        check_export(args)
        if args.suite is not None:
            suite, names = suite_request(args)
            if args.list:
                list_suite(suite, names)
            else:
                suite_run(args, suite, names)
        elif args.list:
            list_schedules()
        elif args.report:
            report(args)
        else:
            from tuning.explore import selection

            wl = workload(args)
            found = search_results(args)
            if args.export:
                export(args, wl, found)
            elif args.diff:
                diff(args, wl, found)
            elif args.explain:
                from tuning.explain import explain

                explain(wl, *args.explain, found, args.arch, say, warn, args.show_cuda)
            elif args.tune:
                tune(args, wl, found)
            else:
                name = args.schedule or DEFAULT_SCHEDULE
                run_schedules(args, wl, selection(wl, name, found, warn), explicit=name != "all")
    except ExplorerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        if args is None:
            return 130
        kept = args.work_dir or args.records or args.results
        print(f"\ninterrupted: everything measured so far is kept in {kept}; "
              "run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
