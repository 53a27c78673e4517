#!/usr/bin/env python3
"""The command line: parse, call the pipeline's stages, print.

    python runner.py --schedule v3              # lower, print IR, build, check, time, record
    python runner.py --schedule all --no-ir     # the whole ladder plus baselines
    python runner.py --diff v2 v3               # what changed between two rungs
    python runner.py --diff v5 v5:split_k=4     # ... or between two settings of a rung's knobs
    python runner.py --report reports/x.md      # markdown from the results file
    python runner.py --list                     # schedules per op
    python runner.py --tune metaschedule --trials 256 --work-dir ms-gemm   # MetaSchedule search
    python runner.py --tune autotvm:seed_template --tuner xgb --records at.jsonl   # knob search
    python runner.py --schedule metaschedule --work-dir ms-gemm   # the best found, like a rung
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime, timezone

from schedules.errors import ExplorerError, SearchFailed, UsageError

DEFAULT_RESULTS = os.path.join("reports", "results.jsonl")
OLDEST_ARCH = 75  # the oldest GPU that CUDA 13's nvcc builds for (sm_75, Turing)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="runner.py",
        description="Lower, build, check and time TVM schedules against cuBLAS and the GPU's limits.",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--schedule", default="v3",
                      help="schedule name, with knobs as v5:split_k=4,thread_n=8, or 'all' (default: v3)")
    what.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two schedules' IR")
    what.add_argument("--report", metavar="PATH", help="render a markdown report from --results")
    what.add_argument("--list", action="store_true", help="list the schedules of every op")
    what.add_argument("--tune", metavar="SEARCH",
                      help="search: 'metaschedule' or 'autotvm:<template>' (a schedule with a space)")
    p.add_argument("--op", help="gemm, gemv or batched_gemv (default: gemm, or the preset's)")
    p.add_argument("--shape", help="e.g. 1024x512x2048 (MxNxK for gemm, NxK for gemv, LxNxK)")
    p.add_argument("--preset", help="a named workload from the seeds (see --list)")
    p.add_argument("--dtype", help="input dtype: float32, float16 or bfloat16")
    p.add_argument("--out-dtype", help="output dtype (gemm default float32, gemv the input's)")
    p.add_argument("--layout", help="gemm: nn (B is KxN) or nt (B is NxK)")
    p.add_argument("--no-ir", action="store_true", help="do not print the lowered IR")
    p.add_argument("--show-cuda", action="store_true", help="print the generated CUDA source")
    p.add_argument("--arch", default="sm_90", help="CUDA arch when no GPU is present (sm_90)")
    p.add_argument("--flush", choices=("read", "write", "none"), default="read",
                   help="before each timed launch: flush L2 by reading 256 MB (default), by "
                   "writing it (as Triton's and TileLang's do_bench do: dirty lines, 10-12%% "
                   "slower bandwidth-bound rows), or not at all (none: L2 stays warm)")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"JSONL results (default {DEFAULT_RESULTS})")
    p.add_argument("--trials", type=int, default=64, help="new trials to measure (default 64)")
    p.add_argument("--work-dir", help="MetaSchedule work dir (database, progress, best schedule)")
    p.add_argument("--ms-space", help="MetaSchedule's design space: 'tvm' (TVM's rules) or "
                   "'split-k' (those plus splitting K across blocks; the default on CUDA)")
    p.add_argument("--records", help="template-search records (JSONL), read to resume or apply")
    p.add_argument("--tuner", help="template tuner: grid, random or xgb (default xgb)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random and xgb tuners and of MetaSchedule's search")
    p.add_argument("--target", default="cuda", help="cuda, or llvm (MetaSchedule on the CPU)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on the tracker's hosts")
    p.add_argument("--rpc-key", help="device key the hosts registered with the tracker")
    p.add_argument("--device", help="without a GPU here: whose template-search records to apply "
                   "(a GPU name as the records say it; default: the records' only one)")
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


def template_device(args) -> str | None:
    """Whose template-search records apply here: this machine's GPU, the RPC key's hosts, or
    (no GPU here) --device, else None for the records' only device."""
    from tuning import measure

    here = (f"rpc:{args.rpc_key}" if args.rpc_tracker else
            measure.device_facts()["gpu"] if measure.gpu_present() else None)
    if here and args.device and args.device != here:
        raise UsageError(f"--device {args.device}: records measured elsewhere are not applied "
                         f"here; this run's are {here}'s")
    return here or args.device


def resolve(args, wl, name: str):
    """A schedule by name: a registered one, with knobs set as 'v5:split_k=4,thread_n=8',
    'metaschedule' (the best in --work-dir) or 'autotvm:<template>' (the template with the best
    configuration in --records)."""
    import schedules

    if name == "metaschedule":
        if not args.work_dir:
            raise UsageError("--schedule metaschedule needs --work-dir (where a search ran)")
        from tuning import metaschedule

        return metaschedule.tuned_entry(wl, args.work_dir)
    if name.startswith("autotvm:"):
        if not args.records:
            raise UsageError(f"--schedule {name} needs --records (where a template search ran)")
        from tuning import autotvm

        return autotvm.tuned_entry(schedules.get(wl.op, name[len("autotvm:"):]), wl,
                                   load_records(args.records), args.records, template_device(args))
    base, _, knobs = name.partition(":")
    entry = schedules.get(wl.op, base)
    return entry.with_knobs(knobs) if knobs else entry


def load_records(path: str) -> list[dict]:
    """Every record of a JSONL file; a corrupt line is named (path:line) and left as it is."""
    from tuning import records

    loaded = records.load(path)
    for problem in loaded.problems:
        print(f"warning: {problem}; the line is kept as it is, and skipped", file=sys.stderr)
    return loaded.records


def selection(args, wl) -> list:
    """--schedule: one name, or 'all': the ladder and baselines, plus the best of the searches
    in --work-dir and --records for this workload on this device."""
    import schedules
    from tuning import autotvm

    if args.schedule != "all":
        return [resolve(args, wl, args.schedule)]
    chosen = schedules.entries(wl.op)
    if args.work_dir:
        chosen.append(resolve(args, wl, "metaschedule"))
    if args.records:
        measured = load_records(args.records)
        device = template_device(args)
        for entry in schedules.entries(wl.op, templates=True):
            if entry.space and (autotvm.measured_on(measured, wl, entry.name) if device is None
                                else autotvm.best_record(measured, wl, entry.name, device)):
                chosen.append(autotvm.tuned_entry(entry, wl, measured, args.records, device))
    return chosen


def diff(args, wl) -> None:
    """--diff OLD NEW: the lowered IR's unified diff (common-subexpression names made stable)
    and a table of the structural facts of both."""
    from tuning import build
    from tuning.explore import build_schedule

    target = build.cuda_target(args.arch)
    (old, new), (a, b) = args.diff, [build_schedule(resolve(args, wl, name), wl, target)
                                     for name in args.diff]
    print(build.unified_diff(*(build.stable_cse_names(build.ir_text(x.lowered)) for x in (a, b)),
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

    if os.path.isdir(args.report):
        raise UsageError(f"--report {args.report} is a directory; name the markdown file to write")
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
    text = render(loaded.records, title=title, notes=notes,
                  figure_prefix=os.path.splitext(args.report)[0])
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(args.report, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.report}")


def run_schedules(args, wl, chosen: list, extra_records: list | None = None,
                  explicit: bool = False) -> None:
    """The exploration run (tuning/explore.py) with the command line's settings."""
    from tuning.explore import Settings, explore

    settings = Settings(results=args.results, arch=args.arch, flush=args.flush,
                        show_ir=not args.no_ir, show_cuda=args.show_cuda, explicit=explicit)
    explore(wl, chosen, settings, warn=lambda line: print(line, file=sys.stderr),
            extra_records=extra_records)


def search_target(args):
    """The target a search measures on: this machine's GPU, the RPC tracker's hosts, or (with
    --target llvm, MetaSchedule only) this CPU."""
    from tuning import build, measure

    if args.target == "llvm":
        if args.tune != "metaschedule":
            raise UsageError("--target llvm is for MetaSchedule searches (--tune metaschedule)")
        import tvm

        return tvm.target.Target({"kind": "llvm", "num-cores": os.cpu_count() or 1})
    if args.target != "cuda":
        raise UsageError(f"unknown --target '{args.target}'; valid: cuda, llvm")
    if args.rpc_tracker:
        return build.cuda_target(args.arch)
    if not measure.gpu_present():
        raise UsageError("no GPU here: a CUDA search needs this machine's GPU, or "
                         "--rpc-tracker HOST:PORT --rpc-key KEY for remote ones")
    return build.cuda_target(measure.device_facts()["arch"])


def tune(args, wl) -> None:
    """--tune: search, print the best, then (on a local GPU) run the best like a rung, next to
    the baselines, and record the search's curve for the report."""
    import schedules
    from tuning import autotvm, candidates, metaschedule

    if args.trials <= 0:
        raise UsageError(f"--trials must be positive, not {args.trials}")
    if args.tune == "metaschedule":
        if not args.work_dir:
            raise UsageError("--tune metaschedule needs --work-dir (its database; reused to resume)")
        metaschedule.check_work_dir(args.work_dir, must_exist=False)
        if args.ms_space not in (None, *metaschedule.SPACES):
            raise UsageError(f"unknown --ms-space '{args.ms_space}'; valid: "
                             f"{', '.join(metaschedule.SPACES)}")
        if args.ms_space == "split-k" and args.target != "cuda":
            raise UsageError("--ms-space split-k is for CUDA targets; TVM's CPU rules split "
                             "reductions already (AddRFactor)")
        if args.tuner:
            raise UsageError("--tuner picks a template search's tuner (--tune autotvm:<template>);"
                             " MetaSchedule has its own evolutionary search")
    elif args.tune.startswith("autotvm:"):
        if args.ms_space:
            raise UsageError("--ms-space is MetaSchedule's design space (--tune metaschedule); a "
                             "template search's space is the template's knobs")
        args.tuner = args.tuner or "xgb"
        if args.tuner not in autotvm.TUNERS:
            raise UsageError(f"unknown --tuner '{args.tuner}'; valid: {', '.join(autotvm.TUNERS)}")
        if not args.records:
            raise UsageError(f"--tune {args.tune} needs --records (a JSONL file; reused to resume)")
        entry = schedules.get(wl.op, args.tune[len("autotvm:"):])
        autotvm.Space.of(entry)  # a schedule without a space is refused before any work
    else:
        raise UsageError(f"unknown search '{args.tune}'; valid: metaschedule, autotvm:<template>")
    target = search_target(args)
    local_gpu = target.kind.name == "cuda" and not args.rpc_tracker
    runner = candidates.make_runner(target, wl, args.flush, args.rpc_tracker, args.rpc_key)
    builder = candidates.WarmBuilder()
    try:
        if args.tune == "metaschedule":
            summary = tune_metaschedule(args, wl, target, builder, runner)
        else:
            summary = tune_template(args, wl, entry, target, builder, runner)
    finally:
        candidates.shut_down(builder, runner)
    if local_gpu:
        print(f"checking and timing the best ({summary['schedule']}) with the baselines, in one run:")
        run_schedules(args, wl, [resolve(args, wl, summary["schedule"])],
                      [{**summary, "kind": "search", "status": "ok"}], explicit=True)


def tune_metaschedule(args, wl, target, builder, runner) -> dict:
    """MetaSchedule into --work-dir; returns the search's summary record. A search with no
    correct candidate at all fails, with the most common reason."""
    from tuning import metaschedule

    space = args.ms_space or ("split-k" if target.kind.name == "cuda" else "tvm")
    found = metaschedule.tune(wl, target, args.work_dir, args.trials, space, builder, runner,
                              seed=args.seed)
    if found["best_ms"] is None:
        raise SearchFailed(f"no candidate ran correctly in {found['new_trials']} trials; "
                           f"most often: {found['most_common_error'] or 'nothing was measured'}")
    print(f"best: {found['best_ms']:.4f} ms after {found['trials']} trials; "
          f"{found['trials_per_min']:.1f} trials/min this run")
    print("# best schedule's trace:\n" + found["trace"])
    print(f"saved best_trace.py and best_module.py in {args.work_dir}")
    return {"schedule": "metaschedule", "search": "metaschedule", "tuner": "evolutionary",
            "params": {"work_dir": args.work_dir}, "rules": metaschedule.SPACES[space],
            "seed": args.seed,
            "trials": found["trials"],
            "trials_per_min": metaschedule.trials_per_minute(args.work_dir),
            "curve": metaschedule.curve(args.work_dir)}


def tune_template(args, wl, entry, target, builder, runner) -> dict:
    """A template search, each measured configuration appended to --records as it comes;
    returns the search's summary record. A search with no correct configuration fails, with
    the most common reason."""
    from collections import Counter

    from tuning import autotvm
    from tuning import records as store

    space = autotvm.Space.of(entry)
    key = autotvm.search_key(wl, entry.name, template_device(args), args.tuner, args.seed)
    history = autotvm.history_of(load_records(args.records), key,
                                 {knob: entry.defaults[knob] for knob in space.knobs})
    print(f"{args.tuner} search of {entry.name} ({len(space)} configurations) on {wl.label()}:"
          f" {len(history)} measured before, in {args.records}")
    start, trial = time.time(), [len(history)]

    def on_measured(config, outcome):
        trial[0] += 1
        store.append(args.records, autotvm.trial_record(
            key, config, outcome, trial[0],
            date=datetime.now(timezone.utc).isoformat(timespec="seconds")))
        result = f"{outcome.time_ms:.4f} ms" if outcome.status == "ok" else outcome.status
        so_far = autotvm.best(history)
        print(f"  [{trial[0]}] {config}: {result}; best so far "
              f"{f'{so_far[1]:.4f} ms' if so_far else 'none'}; {time.time() - start:.0f} s",
              flush=True)

    new = autotvm.tune(space, autotvm.TUNERS[args.tuner](args.seed),
                       autotvm.measure_with(entry, wl, target, builder, runner), history,
                       args.trials, autotvm.BATCH, on_measured)
    if new < args.trials:
        print(f"the space is exhausted: {new} new configurations measured")
    found = autotvm.best(history)
    if found is None:
        reasons = Counter(o.error or o.status for o in history.values())
        raise SearchFailed(f"no configuration ran correctly in {len(history)} measured; most "
                           f"often: {reasons.most_common(1)[0][0] if reasons else 'none ran'}")
    rate = 60 * new / (time.time() - start)
    print(f"best: {found[1]:.4f} ms with {found[0]} ({len(history)} measured; "
          f"{rate:.1f} trials/min this run)")
    return {"schedule": f"autotvm:{entry.name}", "search": "autotvm", "tuner": args.tuner,
            "seed": args.seed, "params": found[0], "trials": len(history), "space": len(space),
            "trials_per_min": rate, "curve": autotvm.curve(load_records(args.records), key)}


def check_arch(arch: str) -> None:
    found = re.fullmatch(r"sm_(\d+)[af]?", arch)
    if not found:
        raise UsageError(f"malformed --arch '{arch}': expected sm_<major><minor>, e.g. sm_90")
    if int(found.group(1)) < OLDEST_ARCH:
        raise UsageError(f"--arch {arch} is older than any GPU that CUDA 13 builds for "
                         f"(sm_{OLDEST_ARCH} and later)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_arch(args.arch)
        if args.list:
            list_schedules()
        elif args.report:
            report(args)
        else:
            wl = workload(args)
            if args.diff:
                diff(args, wl)
            elif args.tune:
                tune(args, wl)
            else:
                run_schedules(args, wl, selection(args, wl), explicit=args.schedule != "all")
    except ExplorerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        kept = args.work_dir or args.records or args.results
        print(f"\ninterrupted: everything measured so far is kept in {kept}; "
              "run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
