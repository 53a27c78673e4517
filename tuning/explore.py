"""The exploration run: schedules x one workload -> lowered IR, CUDA, measurements, records.

Schedules are chosen by name (`selection`): the registered ones, with knobs set, and the best
of the searches (`metaschedule`, `autotvm:<template>`). Each chosen schedule is applied, lowered
and built; on a GPU it is then checked against float64 and timed, and every outcome (timed,
failed, skipped) becomes a record of the same run, followed by the baselines and the
copy-bandwidth ceiling of that run. Without a GPU the run stops after the build. Output goes
through `say`, so the command line decides where it is printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import schedules
from schedules.errors import (BuildFailed, ExplorerError, KernelFailed, ScheduleNotApplicable,
                              UsageError)
from schedules.workloads import Workload

from . import build, measure, records


@dataclass(frozen=True)
class Settings:
    results: str  # the JSONL file every measurement is appended to
    arch: str = "sm_90"  # what to build for when there is no GPU here
    flush: str = "read"  # what runs before each timed launch (measure.FLUSHES)
    show_ir: bool = True
    show_cuda: bool = False
    explicit: bool = False  # one schedule the user named: a refusal or failure is an error


@dataclass(frozen=True)
class SearchResults:
    """Where searches left what they found, for schedules to be chosen from."""

    work_dir: str | None = None  # a MetaSchedule work dir: `metaschedule`
    records: str | None = None  # a template search's records: `autotvm:<template>`
    device: str | None = None  # whose records apply (autotvm.records_device); None: the only one


def resolve(wl: Workload, name: str, found: SearchResults, warn: Callable[[str], None] = print):
    """A schedule by name: a registered one, with knobs set as 'v5k:k_slices=4,thread_n=8',
    'metaschedule' (the best in the work dir) or 'autotvm:<template>' (the template with the
    best configuration in the records); a corrupt records line goes to `warn`."""
    if name == "metaschedule":
        if not found.work_dir:
            raise UsageError("metaschedule needs the work dir of a MetaSchedule search")
        from . import metaschedule

        return metaschedule.tuned_entry(wl, found.work_dir)
    if name.startswith("autotvm:"):
        if not found.records:
            raise UsageError(f"{name} needs the records of a template search")
        from . import autotvm

        return autotvm.tuned_entry(schedules.get(wl.op, name[len("autotvm:"):]), wl,
                                   records.load_and_warn(found.records, warn), found.records,
                                   found.device)
    base, _, knobs = name.partition(":")
    entry = schedules.get(wl.op, base)
    return entry.with_knobs(knobs) if knobs else entry


def selection(wl: Workload, name: str, found: SearchResults,
              warn: Callable[[str], None] = print) -> list:
    """The schedules `name` stands for: one (see `resolve`), or for 'all' the ladder and
    baselines, plus the best of each search in `found` for `wl` on its device."""
    from . import autotvm

    if name != "all":
        return [resolve(wl, name, found, warn)]
    chosen = schedules.entries(wl.op)
    if found.work_dir:
        chosen.append(resolve(wl, "metaschedule", found, warn))
    if found.records:
        measured = records.load_and_warn(found.records, warn)
        for entry in schedules.entries(wl.op, templates=True):
            if entry.space and (autotvm.measured_on(measured, wl, entry.name)
                                if found.device is None else
                                autotvm.best_record(measured, wl, entry.name, found.device)):
                chosen.append(autotvm.tuned_entry(entry, wl, measured, found.records,
                                                  found.device))
    return chosen


def refusal(schedule, wl: Workload, target, error: ScheduleNotApplicable) -> ScheduleNotApplicable:
    """The refusal of a schedule the user named, with the values of each knob they set that
    would apply to this workload (the other knobs as they set them)."""
    if not getattr(schedule, "knobs", None):
        return error
    entry, chosen = schedule.knobs
    message = f"{schedule.name}: {error}"
    for knob in chosen:
        working = entry.values_that_apply(wl, target, chosen, knob)
        values = ", ".join(str(v).lower() for v in working) or "none of those tried"
        message += f"; {knob} values that apply here: {values}"
    return ScheduleNotApplicable(message)


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def build_schedule(schedule, wl: Workload, target) -> build.Built:
    """Apply `schedule` to `wl` and build it. TVM's or nvcc's failure to lower, compile or
    assemble becomes a BuildFailed naming the schedule (the failure itself is its cause); a
    refusal or any other ExplorerError passes as it is."""
    try:
        return build.lower_and_build(schedule.apply(wl, target), target)
    except ExplorerError as e:
        if not isinstance(e, BuildFailed):
            raise
        failure = e
    except Exception as e:  # noqa: BLE001  TVM's own failure, whatever its type
        failure = e
    raise BuildFailed(f"{schedule.name} failed to build: {first_line(failure)}") from failure


def explore(wl: Workload, chosen: list, settings: Settings, say: Callable[[str], None] = print,
            warn: Callable[[str], None] = print, extra_records: list[dict] | None = None
            ) -> list[dict]:
    """Lower, print, build, check, time and record each chosen schedule, then the baselines;
    warnings (a corrupt records line, a kernel that spills) go to `warn`. Returns the records
    of this run (none without a GPU)."""
    from reports.render import markdown_table, table_rows

    # read first: a corrupt line is named, never rewritten
    records.load_and_warn(settings.results, warn,
                          then="the line is kept as it is and new records are appended")
    run = None
    if measure.gpu_present():
        from . import bench

        run = bench.Run(flush=settings.flush)
        arch = run.facts["arch"]
        say(f"GPU: {run.facts['gpu']} ({arch}), driver {run.facts['driver']}; run {run.run_id}")
    else:
        arch = settings.arch
    target = build.cuda_target(arch)
    measured = []

    def keep(record):
        records.append(settings.results, record)
        measured.append(record)

    for entry in chosen:
        try:
            built = build_schedule(entry, wl, target)
        except ScheduleNotApplicable as e:
            if settings.explicit:
                raise refusal(entry, wl, target, e) from None
            say(f"{entry.name}: skipped: {e}")
            if run:
                keep(run.record(wl, entry.name, entry.kind, entry.defaults, status="skipped",
                                error=str(e)))
            continue
        except BuildFailed as e:  # a schedule or build bug stops this rung only
            if run:
                keep(run.record(wl, entry.name, entry.kind, entry.defaults,
                                status="build_failed", error=str(e.__cause__)))
            if settings.explicit:
                raise
            say(f"{entry.name}: build failed: {first_line(e.__cause__)}")
            continue
        if settings.show_ir:
            say(f"# ---- {entry.name}: lowered for {arch} ({wl.label()}) ----")
            say(build.ir_text(built.lowered))
        if settings.show_cuda:
            say(f"// ---- {entry.name}: CUDA ----")
            say(built.source)
        say(f"{entry.name}: built: {built.describe()}")
        for kernel, spilled in built.spills.items():
            warn(f"warning: {entry.name}'s {kernel} spills {spilled} bytes of registers to local "
                "memory")
        if run:
            keep(bench.measure_tvm(run, wl, entry.name, entry.kind, entry.defaults,
                                   built.executable, structure=built.structure,
                                   resources=built.resources))
    if not run:
        say(f"no GPU here: built {wl.label()} for {arch} (CUDA source only); "
            "skipped the correctness check and timing")
        return []
    for extra in extra_records or []:
        records.append(settings.results, run.record(wl, **extra))
    for baseline in bench.measure_baselines(run, wl):
        keep(baseline)
    ceiling = bench.measure_copy(run)
    records.append(settings.results, ceiling)
    rows = table_rows([{**m, "copy_gbps": ceiling["copy_gbps"]} for m in measured])
    say(f"\n{wl.label()} on {run.facts['gpu']}; {measure.timing_method(run.flush)}; "
        f"copy bandwidth {ceiling['copy_gbps']:.0f} GB/s")
    say(markdown_table(rows))
    say(f"records appended to {settings.results}")
    failed = [m for m in measured if m["kind"] != "baseline" and m["status"] != "ok"]
    if settings.explicit and failed:
        raise KernelFailed(f"{failed[0]['schedule']}: {failed[0].get('error') or 'failed'}")
    return measured
