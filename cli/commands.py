"""The subcommands' handlers: each reads the parsed command line (cli.parse: one namespace
whatever the mode), calls the pipeline's stages and prints. Each imports what its mode needs,
so `--help` and a refused flag never import TVM or torch."""

from __future__ import annotations

import json
import logging
import os
import sys

from .base import DEFAULT_SCHEDULE, Refused

OLDEST_ARCH = 75  # the oldest GPU that CUDA 13's nvcc builds for (sm_75, Turing)
LOG = logging.getLogger("cli")


def workload(args):
    from schedules import PRESETS, Workload, parse_shape
    from schedules.workloads import DEFAULT_DTYPES, DEFAULT_SHAPES

    if args.preset:
        if args.preset not in PRESETS:
            raise Refused(f"unknown preset '{args.preset}'; valid: {', '.join(PRESETS)}")
        preset = PRESETS[args.preset]
        if args.op and args.op != preset.op:
            raise Refused(f"preset {args.preset} is a {preset.op} workload, not {args.op}")
        if args.shape:
            raise Refused("give either --preset or --shape, not both")
        return Workload(preset.op, preset.shape, args.dtype or preset.dtype, args.out_dtype,
                        args.layout, args.scales)
    op = args.op or "gemm"
    shape = parse_shape(args.shape, op) if args.shape else DEFAULT_SHAPES.get(op, ())
    return Workload(op, shape, args.dtype or DEFAULT_DTYPES.get(op), args.out_dtype, args.layout,
                    args.scales)


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
    """A line of progress or of results: on stdout at once (cli.logging_for)."""
    LOG.info(line)


def warn(line: str) -> None:
    """A warning, on stderr."""
    LOG.warning(line)


def search_results(args):
    """Where --work-dir, --records and (for `best`) --results say what searches and runs found,
    and whose records apply here: this GPU's, the RPC key's hosts' or (no GPU here) --device's."""
    from schedules.errors import RecordsError
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

    from tvm_explorer import ir_diff

    (old, new), (a, b) = args.diff, [built(name) for name in args.diff]
    print(ir_diff(a, b, old, new))
    if args.show_cuda:
        print(build.unified_diff(a.source, b.source, f"{old}.cu", f"{new}.cu"))
    from tabulate import tabulate

    rows = [[k, v, b.structure[k]] for k, v in a.structure.items()]
    print(f"Structure of {wl.label()}, {target.attrs['arch']}:")
    print(tabulate(rows, headers=["", old, new], tablefmt="github"))


def report(args) -> None:
    """--report: markdown from --results; a suite report (reporting/shapes.py) where the records
    are those of suite runs, the counters report (reporting/explained.py) where they are
    counters (tuning.explain record), else the exploration report (reporting/render.py),
    whose ladder tables read --counters. Written through
    a staging directory (render.staged), so where it cannot be written is refused before any
    work and a failure leaves nothing behind; records that fail their checks are named and
    skipped."""
    from reporting import explained, render, shapes
    from schedules.errors import RecordsError
    from tuning import records

    if os.path.isdir(args.report):
        raise Refused(f"--report {args.report} is a directory; name the markdown file to write")
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
        of_counters = all(r.get("status") == "counted" for r in measured)
        renderer = shapes.render if of_suites else explained.render if of_counters \
            else render.render
        if of_suites and len(of_suites) < len(measured):
            warn(f"warning: {len(measured) - len(of_suites)} records of {args.results} are not "
                 "from suite runs; this suite report leaves them out (render them from a "
                 "results file of their own)")
            measured = of_suites
        title = args.title or os.path.splitext(os.path.basename(args.report))[0]
        why = {} if of_suites or of_counters else {"counters": read_counters(args.counters)}
        text = renderer(measured, title=title, notes=notes,
                        figure_prefix=os.path.splitext(staged)[0], **why)
        with open(staged, "w") as f:
            f.write(text + "\n")
    print(f"wrote {args.report}")


def read_counters(path: str | None) -> list[dict]:
    """--counters: the counters records of `path`, or of tuning.explain's default file where
    no path is given and it exists (none where it does not); lines that fail their checks are
    skipped (records.warn_of says them), and a named file that is missing is refused in one
    line."""
    from tuning import explain, records

    if path is None:
        if not os.path.exists(explain.COUNTERS):
            return []
        path = explain.COUNTERS
    if not os.path.isfile(path):
        raise Refused(f"--counters {path}: no such file")
    loaded = records.load(path, check=explain.counters_problem)
    records.warn_of(loaded, warn, then="skipped")
    return loaded.records


def read_notes(path: str | None) -> str | None:
    """--notes: the markdown text of `path` (None without one); a file that cannot be read,
    or is not UTF-8 text, is refused in one line."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise Refused(f"cannot read --notes {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise Refused(f"cannot read --notes {path}: not UTF-8 text (byte {e.start})") from e


def run_schedules(args, wl, chosen: list, extra_records: list | None = None,
                  explicit: bool = False) -> None:
    """The exploration run (tuning/explore.py) with the command line's settings."""
    from tuning.explore import Settings, explore

    settings = Settings(results=args.results, arch=args.arch, flush=args.flush,
                        show_ir=not args.no_ir, show_cuda=args.show_cuda, explicit=explicit)
    explore(wl, chosen, settings, say, warn, extra_records=extra_records)


def suite_request(args):
    """The suite and the schedules to run on each of its shapes (--schedule keeps one rung and
    the baselines); a knob that the rung lacks is refused here, before anything is built or
    written."""
    from schedules import suites
    from tuning.explore import SearchResults, resolve

    suite = suites.get(args.suite)
    names = suite.schedule_names(args.schedule)
    for name in names:
        resolve(suite.entries[0].workload, name, SearchResults(), warn)  # knobs checked
    return suite, names


def suite_run(args, suite, names: list[str]) -> None:
    """--suite: build every shape's schedules, then on a GPU check, time and record them; the
    schedule --schedule names (a rung, or a baseline, as a run of one shape takes it), where it
    refuses every shape, is refused before any is measured."""
    from tuning.explore import Settings
    from tuning.suite import run_suite

    asked = (args.schedule,) if args.schedule in names else ()
    run_suite(suite, names, Settings(results=args.results, arch=args.arch, flush=args.flush),
              say, warn, asked=asked)


def search_request(args, found):
    """--tune and the flags that go with it, as a search request; a flag the search needs and
    lacks, or one that belongs to the other kind of search, is refused here."""
    from tuning.search import Request

    if args.tune == "metaschedule":
        if not args.work_dir:
            raise Refused("--tune metaschedule needs --work-dir (its database; reused to resume)")
        if args.tuner:
            raise Refused("--tuner picks a template search's tuner (--tune autotvm:<template>);"
                             " MetaSchedule has its own evolutionary search")
    elif args.tune.startswith("autotvm:"):
        if args.ms_space:
            raise Refused("--ms-space is MetaSchedule's design space (--tune metaschedule); a "
                             "template search's space is the template's knobs")
        if not args.records:
            raise Refused(f"--tune {args.tune} needs --records (a JSONL file; reused to resume)")
        if args.target == "llvm":
            raise Refused("--target llvm is for MetaSchedule searches (--tune metaschedule)")
    if args.rpc_tracker and not args.rpc_key:
        raise Refused("--rpc-tracker needs --rpc-key (the key the GPU hosts registered)")
    check_search_outputs(args)
    return Request(args.tune, args.trials, work_dir=found.work_dir, space=args.ms_space,
                   records=found.records, device=found.device, tuner=args.tuner,
                   seed=args.seed or 0, reproducible=args.seed is not None, target=args.target,
                   arch=args.arch, flush=args.flush, rpc_tracker=args.rpc_tracker,
                   rpc_key=args.rpc_key)


def check_search_outputs(args) -> None:
    """Refuse, before a search starts, a work dir, records file or results file that it could
    not write: found only at its end, that would lose the search's summary."""
    from facts import check_writable

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


def check_export(args) -> None:
    """An export writes one schedule's kernel: `all` is refused before a thing is built."""
    if args.schedule == "all":
        raise Refused("--export writes one kernel: name its schedule (a rung, best, "
                      "metaschedule or autotvm:<template>), not all")


def export(args, wl, found) -> None:
    """--export DIR: the kernel of --schedule, built (on a GPU: checked and timed), written to
    DIR."""
    from tuning.explore import Settings
    from tuning.export import export as export_kernel

    check_export(args)
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
        raise Refused(f"--arch {name} is older than any GPU that CUDA 13 builds for "
                         f"(sm_{OLDEST_ARCH} and later)")
    if capability not in SHARED_BYTES_PER_BLOCK:
        known = ", ".join(f"sm_{cc}" for cc in sorted(SHARED_BYTES_PER_BLOCK))
        raise Refused(f"unknown --arch {name}: no GPU of that arch is known here; known: "
                         f"{known}")
    return arch




def linear_layers(args) -> None:
    """linear: every --shape's kernels for every bucket of M, from the cache or measured now
    (linear.portfolio.prepare; with --rpc-tracker, those the cache lacks on the farm's servers
    first: linear.farm.prepare), one line per (layer, bucket) saying which kernel it runs; with
    --json, one JSON line per layer. Shapes are checked before anything needs the GPU."""
    from linear import LayerShape, buckets_from_edges, buckets_from_text, farm
    from linear.buckets import token_count
    from linear.candidates import LAYER_DTYPES
    from linear.module import DEFAULT_MAX_TOKENS
    from linear.portfolio import prepare
    from schedules import Workload, parse_shape

    if (args.rpc_tracker is None) != (args.rpc_key is None):
        raise Refused("a farm is named by --rpc-tracker HOST:PORT and --rpc-key KEY together "
                      "(the key its servers registered under)")
    if not args.shape:
        raise Refused("linear needs at least one --shape NxK (out_features x in_features)")
    dtype = args.dtype or "bfloat16"
    if dtype not in LAYER_DTYPES:
        raise Refused(f"linear layers run in {' or '.join(LAYER_DTYPES)}, not {dtype}")
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else \
        token_count(args.max_tokens, "--max-tokens")
    layers = [LayerShape(*Workload("gemv", parse_shape(text, "gemv"), dtype).shape, dtype)
              for text in args.shape]
    buckets = buckets_from_text(args.edges) if args.edges else buckets_from_edges()
    found = (farm.prepare(layers, buckets, max_tokens, args.rpc_tracker, args.rpc_key, say=say,
                          warn=warn) if args.rpc_tracker is not None else
             prepare(layers, buckets, max_tokens, say=say, warn=warn))
    for layer, kernels in found.items():
        chosen = {bucket.label(): kernel.candidate.name
                  for bucket, kernel in zip(kernels.table.buckets, kernels.kernels)}
        if args.json:
            print(json.dumps({"layer": layer.label(), "kernels": chosen}), flush=True)
        for bucket, name in chosen.items():
            say(f"{layer.label()} {bucket}: {name}")


def explain(args, wl, found) -> None:
    """explain OLD NEW: why two schedules differ (tuning/explain.py); --show-cuda adds the
    SASS diff."""
    from tuning.explain import explain as explain_pair

    explain_pair(wl, *args.explain, found, args.arch, say, warn, show_sass=args.show_cuda)


def run(args) -> None:
    """run: one workload's schedules (default v3; `all`: the ladder and the baselines)."""
    from tuning.explore import selection

    wl, found = workload(args), search_results(args)
    name = args.schedule or DEFAULT_SCHEDULE
    run_schedules(args, wl, selection(wl, name, found, warn), explicit=name != "all")


def listing(args) -> None:
    """list: the schedules, presets and suites; with --suite, that suite's shapes."""
    if args.suite is None:
        list_schedules()
        return
    list_suite(*suite_request(args))


def suite(args) -> None:
    """suite: build every shape's schedules, then (on a GPU) check, time and record them."""
    suite_run(args, *suite_request(args))


def with_workload(handler):
    """A handler of a mode about one workload, given it and what searches found."""
    def handle(args) -> None:
        handler(args, workload(args), search_results(args))
    handle.__doc__ = handler.__doc__
    return handle


HANDLERS = {"run": run, "list": listing, "diff": with_workload(diff),
            "explain": with_workload(explain),
            "tune": with_workload(tune), "suite": suite, "report": report,
            "export": with_workload(export), "linear": linear_layers}
TAKES_ARCH = ("run", "diff", "explain", "tune", "suite", "export")  # the modes that build


def dispatch(args) -> int:
    """Run the mode `args.mode`; with --json, print the records it appended to --results as
    JSON lines on stdout (its other lines went to stderr). Returns the exit status."""
    given = {k: v for k, v in vars(args).items() if v not in (None, False) and k != "mode"}
    LOG.debug(f"{args.mode}: {given}")  # -v: what the flags (runner.py's flat ones too) became
    if args.mode in TAKES_ARCH:
        args.arch = checked_arch(args.arch)
    start = results_size(args) if args.json and args.mode != "linear" else None
    HANDLERS[args.mode](args)
    if start is not None:
        sys.stdout.write(appended(args.results, start))
        sys.stdout.flush()
    return 0


def appended(path: str, start: int) -> str:
    """What `path` holds past byte `start`: the records this run appended ("" where it wrote
    none, on a machine without a GPU)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def results_size(args) -> int:
    """The size of --results now (0 where it is not there yet): where this run's records will
    start."""
    try:
        return os.path.getsize(args.results)
    except OSError:
        return 0
