"""Running a suite (schedules/suites.py): every shape through the suite's rungs and baselines.

Building dominates (seconds per kernel, a hundred and more kernels per suite), so every (shape,
schedule) pair is built first, in parallel worker processes; a schedule that refuses a shape
becomes `skipped` and a build that fails, crashes or times out `build_failed`, with the reason,
never a crash of the run (but a schedule the user named that refuses every shape ends it in one
line before anything is measured). On a GPU, each built kernel is then loaded, checked against
float64 and timed one at a time in this process (as tuning/explore.py does), then the shape's
baselines; once per suite run, the copy-bandwidth ceiling. All records of a suite run share one
bench.Run, carry the suite's name and the shape's model and layer, and are appended to the results
file as they are measured, so an interrupted suite keeps what it measured. Without a GPU the run
stops after the builds, with one line per shape.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import tvm
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

import facts
from facts.record import Record
from reporting import shapes
from schedules.errors import BuildFailed, ScheduleNotApplicable, UsageError
from schedules.suites import Entry, Suite
from schedules.workloads import Workload

from . import bench, build, candidates, explore, measure, records
from .progress import Progress

LOG = logging.getLogger(__name__)  # what a library call reports, where the caller gives no say

# A build's limit in a worker: the first tensor-core build of each worker also imports TVM's
# tensor intrinsics (20-45 s: schedules/tensorcore.py), on top of its own seconds.
BUILD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Job:
    """One (shape, schedule) pair to build, as a worker process gets it."""

    wl: Workload
    schedule: str  # a name as --schedule takes it, knobs included
    arch: str
    export: bool  # whether to export the built module for this machine's GPU to load


@dataclass(frozen=True)
class Prepared:
    """What became of a Job: built (with what can be read off the kernel and, when exported,
    the artifact's path), skipped (the schedule refused the shape) or build_failed."""

    status: str  # "built", "skipped" or "build_failed"
    error: str | None = None
    summary: str = ""  # build.Built.describe()
    structure: dict | None = None
    resources: dict | None = None
    artifact: str | None = None


def build_job(job: Job) -> Prepared:
    """Apply, lower and build one pair (in a worker process): as tuning/explore.py builds a
    rung, a refusal and a failure to build each become their Prepared."""
    entry = explore.resolve(job.wl, job.schedule, explore.SearchResults())
    try:
        built = explore.build_schedule(entry, job.wl, build.cuda_target(job.arch))
    except ScheduleNotApplicable as e:
        return Prepared("skipped", error=str(e))
    except BuildFailed as e:  # the reason is its cause: TVM's or nvcc's failure
        cause = e.__cause__ or e
        return Prepared("build_failed", error=str(cause).strip() or type(cause).__name__)
    return Prepared("built", summary=built.describe(), structure=built.structure,
                    resources=built.resources,
                    artifact=build.exported(built.executable, "suite") if job.export else None)


def _prepared(done) -> Prepared:
    """A worker's answer (a popen pool MapResult) as a Prepared: its own, or build_failed for a
    worker that timed out or died."""
    if done.status == StatusKind.COMPLETE:
        return done.value
    if done.status == StatusKind.TIMEOUT:
        return Prepared("build_failed", error=f"build timed out after {BUILD_TIMEOUT_S:.0f} s")
    return Prepared("build_failed", error=candidates.error_summary(f"build failed: {done.value}"))


def build_all(jobs: list[Job], workers: int) -> Iterator[Prepared]:
    """Build the jobs in `workers` worker processes; yields their Prepared in the jobs' order.
    Closing the iterator (an interrupted run) cancels the builds not started and stops the
    workers."""
    pool = PopenPoolExecutor(max_workers=workers, timeout=BUILD_TIMEOUT_S)
    done = pool.map_with_error_catching(build_job, jobs)
    try:
        for result in done:
            yield _prepared(result)
    finally:
        done.close()  # cancels the jobs still queued
        pool.shutdown()


def shape_line(entry: Entry, names: list[str], prepared: list[Prepared]) -> str:
    """One line per shape after its builds: which schedules built, which refused it and why,
    which failed to build."""
    built = [n for n, p in zip(names, prepared) if p.status == "built"]
    line = f"{entry.workload.label()} [{entry.tags()['model']}: {entry.layer}]: "
    line += f"built {', '.join(built)}" if built else "nothing built"
    for name, p in zip(names, prepared):
        if p.status == "skipped":
            line += f"; {name} refused: {p.error}"
        elif p.status == "build_failed":
            line += f"; {name} failed to build: {p.error.strip().splitlines()[0]}"
    return line


def _gpu_run(flush: str):
    """The bench.Run every record of this suite run belongs to; None without a GPU."""
    if not measure.gpu_present():
        return None
    return bench.Run(flush=flush)


def run_suite(suite: Suite, names: list[str], settings: explore.Settings,
              say: Callable[[str], None] = LOG.info, warn: Callable[[str], None] = LOG.warning,
              workers: int | None = None,
              more: Callable[[Workload], list[str]] | None = None, *,
              asked: tuple[str, ...] = ()) -> list[Record]:
    """Build every (shape, schedule in `names`, then those of `more` for the shape) pair of
    `suite`, then on a GPU check and time them with the baselines, appending each record to
    settings.results as it is measured. Returns the records of this run (none without a GPU).
    A schedule the user asked for (`asked`) that refuses every shape ends the run once the builds
    are done, before anything is measured (`refused_everywhere`)."""
    records.measurements(settings.results, warn,  # a corrupt line is named, never rewritten
                         then="the line is kept as it is and new records are appended")
    run = _gpu_run(settings.flush)
    arch = run.facts["arch"] if run else settings.arch
    if run:
        facts.check_writable(settings.results, "--results")  # before hours of building
        say(f"GPU: {run.facts['gpu']} ({arch}), driver {run.facts['driver']}; run {run.run_id}")
    shape_names = [list(dict.fromkeys(names + (more(entry.workload) if more else [])))
                   for entry in suite.entries]
    jobs = [Job(entry.workload, name, arch, export=run is not None)
            for entry, named in zip(suite.entries, shape_names) for name in named]
    workers = min(workers or candidates.usable_cpus(), len(jobs))
    say(f"suite {suite.name}: {len(suite.entries)} shapes x {len(names)} schedules "
        f"({', '.join(names)}){' and more per shape' if more else ''}: building {len(jobs)} "
        f"kernels for {arch} in {workers} worker processes")
    prepared: list[list[Prepared]] = []
    started = time.monotonic()
    progress = Progress(len(suite.entries), f"suite {suite.name}", "shape", bar=False)
    try:
        with contextlib.closing(build_all(jobs, workers)) as built:
            for entry, named in zip(suite.entries, shape_names):
                prepared.append([next(built) for _ in named])
                say(progress.counted(shape_line(entry, named, prepared[-1])))
                _warn_spills(entry.workload, named, prepared[-1], warn)
        count = sum(p.status == "built" for shape in prepared for p in shape)
        say(f"built {count} of {len(jobs)} kernels in {time.monotonic() - started:.0f} s")
        refused_everywhere(suite, asked, shape_names, prepared)
        if run is None:
            say(f"no GPU here: built suite {suite.name} for {arch} (CUDA source only); "
                "skipped the correctness check and timing")
            return []
        return _measure(run, suite, shape_names, prepared, settings.results, say)
    finally:
        for p in (p for shape in prepared for p in shape if p.artifact):
            shutil.rmtree(os.path.dirname(p.artifact), ignore_errors=True)


def refused_everywhere(suite: Suite, asked: tuple[str, ...], shape_names: list[list[str]],
                       prepared: list[list[Prepared]]) -> None:
    """A UsageError naming the first of `asked` that refused every shape of `suite` (its
    builds `prepared`, shape by shape as `shape_names` names them), with its first refusal: as
    a run of one shape refuses a schedule it cannot build before it measures anything."""
    for name in asked:
        outcomes = [p for names, shape in zip(shape_names, prepared)
                    for other, p in zip(names, shape) if other == name]
        if outcomes and all(p.status == "skipped" for p in outcomes):
            raise UsageError(f"--schedule {name} refused every shape of suite {suite.name}, so "
                             f"nothing was measured; the first: {outcomes[0].error}")


def _warn_spills(wl: Workload, names: list[str], prepared: list[Prepared],
                 warn: Callable[[str], None]) -> None:
    """A warning per kernel of `wl` that spills registers, as tuning/explore.py gives one."""
    for name, p in zip(names, prepared):
        for kernel, spilled in facts.spilled_bytes(p.resources).items():
            warn(f"warning: {name}'s {kernel} spills {spilled} bytes of registers to local memory "
                 f"on {wl.label()}")


def _measure_one(run, wl: Workload, name: str, prepared: Prepared, tags: dict) -> Record:
    """The record of one pair: skipped or build_failed as built, else checked and timed (a
    module that does not load is failed)."""

    entry = explore.resolve(wl, name, explore.SearchResults())
    if prepared.status != "built":
        return run.record(wl, entry.name, entry.kind, entry.defaults, status=prepared.status,
                          error=prepared.error, **tags)
    try:
        executable = tvm.runtime.load_module(prepared.artifact)
    except Exception as e:  # noqa: BLE001  TVM's failure to load or link, whatever its type
        return run.record(wl, entry.name, entry.kind, entry.defaults, status="failed",
                          error=f"cannot load the built module: {explore.first_line(e)}", **tags)
    return bench.measure_tvm(run, wl, entry.name, entry.kind, entry.defaults, executable,
                             structure=prepared.structure, resources=prepared.resources, **tags)


def _measure(run, suite: Suite, shape_names: list[list[str]], prepared: list[list[Prepared]],
             results: str, say: Callable[[str], None]) -> list[Record]:
    """On the GPU, shape by shape: each built kernel (of the shape's `shape_names`) checked and
    timed, then the baselines; then the copy ceiling. Every record is appended to `results` as
    soon as it is measured."""

    measured = []
    progress = Progress(len(suite.entries), f"suite {suite.name}", "shape", bar=False)

    def keep(record: Record) -> Record:
        records.append(results, record)
        measured.append(record)
        return record

    for entry, names, built in zip(suite.entries, shape_names, prepared):
        tags = {"suite": suite.name, **entry.tags()}
        shape = [keep(_measure_one(run, entry.workload, name, p, tags))
                 for name, p in zip(names, built)]
        shape += [keep(replace(baseline, **tags))
                  for baseline in bench.measure_baselines(run, entry.workload)]
        say(progress.counted(shapes.summary_line(shape)))
    ceiling = keep(replace(bench.measure_copy(run), suite=suite.name))
    say(f"\nsuite {suite.name} on {run.facts['gpu']}; {measure.timing_method(run.flush)}; "
        f"copy bandwidth {ceiling.copy_gbps:.0f} GB/s")
    say(shapes.suite_tables(measured))
    say(f"records appended to {results}")
    return measured
