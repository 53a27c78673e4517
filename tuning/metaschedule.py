"""MetaSchedule (TVM's own search, XGBoost cost model) over a persistent work dir.

The work dir holds TVM's JSON database (database_workload.json, database_tuning_record.json),
which the next run with the same dir loads and extends: `trials` counts new trials only. Next to
it this module keeps progress.jsonl (one line per measured candidate: its time or failure and
the elapsed time, for the tuning curve and the trials per minute), best_trace.txt (the best
schedule's trace, as the Python that replays it) and best_module.txt (the scheduled module as
TVMScript). A search returns its summary record, for the report's tables and tuning curves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import types
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Callable

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Instruction, Trace

from schedules import tvmscript_import
from schedules.errors import RecordsError, SearchFailed, UsageError
from schedules.registry import TunedSchedule
from schedules.workloads import Workload

from . import records, rungspace
from .async_copy import RefuseBrokenAsyncCopies
from .candidates import Counts, error_summary, mean_ms
from .progress import Progress

DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
PROGRESS = "progress.jsonl"
PROGRESS_FIELDS = ("session", "trial", "elapsed_s")  # what every line of PROGRESS has
BEST_TRACE = "best_trace.txt"  # the best schedule's trace, as the Python that replays it
BEST_MODULE = "best_module.txt"  # the best scheduled module, as TVMScript
TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin"  # MetaSchedule's TuneContext imports it all
BATCH = 32  # candidates per search iteration: Ctrl-C waits for it, a kill loses at most it
# The evolutionary search's population over rung spaces (TVM's default: 512). Spaces of 24 to
# 2304 settings need fewer, and each new setting is the rung applied once (v8: 0.09 s): the
# first batch of v7 + v8 on 4096^3 took 88 s of applying with 512, 23 s with 128.
RUNG_POPULATION = 128
# --ms-space: the rules the design space is made of
SPACES = {"tvm": "TVM's rules", "split-k": "TVM's rules + split K"}  # name: as reports say it


@derived_object
class SplitK(ms.schedule_rule.PyScheduleRule):
    """Split a block's one reduction loop across thread blocks, as cuBLAS does on short-and-wide
    GEMMs; TVM's CUDA rules never do (its AddRFactor rule is for CPUs).

    Besides the block as it is, the rule yields, for each slice count, the block with its
    reduction cut into that many slices by rfactor: a partial-sum block whose slice axis is one
    more spatial axis, tiled by TVM's own CUDA multi-level tiling (`tiling`), and the original
    block, which now sums the slices and is bound by the rules after this one.

    A partial-sum tile is valid only when the slice axis goes whole to the grid (a tile spanning
    slices stages A and B tiles a slice wide in shared memory). So each slice count has its own
    design spaces, and in each the tiling's sampled tile of the slice axis is replaced by a fixed
    one, every slice on its own thread blocks: the search can neither sample nor mutate it into
    an invalid tile. On the seed GEMM, split candidates made 1-3 of the first 64 with one
    sampled count, 7-18 with a space per count, 49-55 with the fixed tile (three seeds each).
    """

    SLICES = (2, 4, 8)
    MIN_SLICE = 64  # reduction steps a slice keeps, so its K loop still has tiles to pipeline

    def __init__(self, tiling, mod=None):
        self.tiling = tiling
        self.mod = mod  # the workload, to replay a design space's edited trace on

    def _initialize_with_tune_context(self, context) -> None:
        self.tiling._initialize_with_tune_context(context)
        self.mod = context.mod

    def apply(self, sch, block):
        iters = sch.get(block).iter_vars
        loops = sch.get_loops(block)
        reduce = [n for n, iv in enumerate(iters) if iv.iter_type == tvm.tirx.IterVar.CommReduce]
        if reduce != [len(iters) - 1] or len(loops) != len(iters):
            return [sch]  # not one innermost reduction over an untouched loop nest
        extent = int(iters[-1].dom.extent)
        counts = [n for n in self.SLICES if extent % n == 0 and extent // n >= self.MIN_SLICE]
        return [sch, *(tiled for n in counts for tiled in self._split(sch, block, loops[-1], n))]

    def _split(self, sch, block, loop, count: int):
        split = sch.copy()
        outer, _ = split.split(loop, [count, None])
        partial = split.rfactor(outer, factor_axis=0)
        *spatial, outer, _ = split.get_loops(partial)
        split.reorder(outer, *spatial)  # loops in the block's own axis order: a trivial binding
        return [self._slices_on_grid(tiled, count) for tiled in self.tiling.apply(split, partial)]

    def _slices_on_grid(self, sch, count: int):
        """`sch` replayed with the tiling's sampled tile of the slice axis (the first one
        sampled after the rfactor) replaced by the fixed tile [count, 1, 1, ...]."""
        insts = list(sch.trace.insts)
        rfactor = next(n for n, inst in enumerate(insts) if inst.kind.name == "RFactor")
        n = next(n for n in range(rfactor, len(insts)) if insts[n].kind.name == "SamplePerfectTile")
        sample, split = insts[n], insts[n + 1]
        assert split.kind.name == "Split" and split.inputs[0].same_as(sample.inputs[0])
        fixed = [count, *[1] * (len(sample.outputs) - 1)]
        insts[n:n + 2] = [Instruction(split.kind, [split.inputs[0], *fixed], split.attrs,
                                      split.outputs)]
        decisions = {inst: d for inst, d in sch.trace.decisions.items() if not inst.same_as(sample)}
        replayed = tvm.s_tir.Schedule(self.mod)
        Trace(insts, decisions).apply_to_schedule(replayed, remove_postproc=False)
        return replayed

    def clone(self):
        return SplitK(self.tiling.clone(), self.mod)


def space_for(space: str | None, target_kind: str, wl: Workload) -> str:
    """The design space to search `wl` in on a `target_kind` target: `space` (a key of SPACES,
    or rungs with knob spaces, comma-separated: see tuning/rungspace.py), or by default
    split-k on CUDA and TVM's rules elsewhere. split-k and rungs are refused off CUDA (and a
    rung that cannot take `wl`, when the search builds its space: rungspace.Rungs)."""
    space = space or ("split-k" if target_kind == "cuda" else "tvm")
    if space not in SPACES:
        rungs = rungspace.spaced(wl.op)
        if not set(space.split(",")) <= set(rungs):
            raise UsageError(f"unknown design space '{space}'; valid: {', '.join(SPACES)}, or "
                             f"{wl.op} rungs with knob spaces, comma-separated: "
                             f"{', '.join(rungs)}")
        if target_kind != "cuda":
            raise UsageError(f"design space {space} is made of CUDA rungs; search it on a GPU")
        return space
    if space == "split-k" and target_kind != "cuda":
        raise UsageError("design space split-k is for CUDA targets; TVM's CPU rules split "
                         "reductions already (AddRFactor)")
    return space


def uses_tensor_cores(wl: Workload, target: tvm.target.Target) -> bool:
    """Whether a search of `wl` on `target` offers tensor-core tiles: 16-bit inputs on CUDA."""
    return target.kind.name == "cuda" and wl.dtype in ("float16", "bfloat16")


def design_space(mod: tvm.IRModule, target: tvm.target.Target, space: str, tensor_cores: bool):
    """The space generator for --ms-space: TVM's rules for the target, or (CUDA only) those
    with SplitK in front, its partial sums tiled by TVM's CUDA-core multi-level tiling. With
    `tensor_cores`, TVM's tensor-core rule set ("cuda-tensorcore": wmma tiles, where the
    intrinsics match, next to its CUDA-core tiling) with its tensorizing postprocessors. On
    CUDA, the postprocessors end with RefuseBrokenAsyncCopies (copies TVM lowers wrongly)."""
    if target.kind.name != "cuda":
        return "post-order-apply"
    preset = "cuda-tensorcore" if tensor_cores else "cuda"
    rules = list(ms.schedule_rule.ScheduleRule.create(preset))
    if space == "split-k":
        tiling = next(r for r in rules if type(r) is ms.schedule_rule.MultiLevelTiling)
        rules = [SplitK(tiling), *rules]
    postprocs = [*ms.postproc.Postproc.create(preset), RefuseBrokenAsyncCopies()]
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs,
                                             mutator_probs=preset)


def check_work_dir(work_dir: str, must_exist: bool) -> None:
    """Refuse a work dir that is not a directory, or whose database has a line that TVM cannot
    read back (not JSON, or JSON that is not a workload or tuning record): the line is named
    by path and number, and nothing is rewritten."""
    if not os.path.exists(work_dir):
        if must_exist:
            raise RecordsError(f"work dir {work_dir} does not exist: tune into it first "
                               "(--tune metaschedule --work-dir ...)")
        return
    if not os.path.isdir(work_dir):
        raise RecordsError(f"work dir {work_dir} is not a directory")
    workloads = []
    for where, entry, problem in records.lines(os.path.join(work_dir, DATABASE_FILES[0])):
        workloads.append(_read_line(where, problem, "workload",
                                    lambda: ms.database.Workload.from_json(entry)))
    for where, entry, problem in records.lines(os.path.join(work_dir, DATABASE_FILES[1])):
        def record():
            index, record_json = entry
            if not isinstance(index, int) or not 0 <= index < len(workloads):
                raise ValueError(f"workload {index} is not in {DATABASE_FILES[0]}")
            return ms.database.TuningRecord.from_json(record_json, workloads[index])
        _read_line(where, problem, "tuning record", record)


def _read_line(where: str, problem: str | None, what: str, read: Callable):
    """What read() makes of the database line at `where` (path:line). A line with a `problem`
    (records.lines: not JSON), or one that read() fails on (not a MetaSchedule `what`), is
    refused as that line's fault."""
    if problem:
        raise RecordsError(f"{where}: {problem}; the database is left as it is (a last line "
                           "cut short by a killed run can be deleted to resume)")
    try:
        return read()
    except Exception as e:  # noqa: BLE001  TVM's parsers raise many kinds of error
        raise RecordsError(f"{where}: not a MetaSchedule {what} ({_last_line(e)[:200]}); the "
                           "database is left as it is") from e


def _last_line(error: Exception) -> str:
    """The last line of TVM's message (where its parsers say what is wrong), or the error's type."""
    return (str(error).strip().splitlines() or [type(error).__name__])[-1]


def open_database(work_dir: str) -> ms.database.JSONDatabase:
    try:
        return ms.database.JSONDatabase(work_dir=work_dir)
    except Exception as e:  # noqa: BLE001  TVM's own complaint about a malformed record
        raise RecordsError(f"cannot load the MetaSchedule database in {work_dir}: "
                           f"{_last_line(e)}") from e


def read_progress(work_dir: str) -> list[dict]:
    """Every line of the work dir's progress.jsonl. A line cut short by a kill is skipped
    without a word: that candidate is in the database anyway."""
    path = os.path.join(work_dir, PROGRESS)
    return records.load(path, PROGRESS_FIELDS, "progress line").records


def _progress_callback(work_dir: str, session: str, say: Callable[[str], None], builder):
    """A measure callback: each candidate becomes a line of progress.jsonl; each batch, a line
    of output (trials, best so far, elapsed, and where the batch went: _BatchClock, which reads
    `builder`'s build times)."""
    path = os.path.join(work_dir, PROGRESS)
    previous = read_progress(work_dir)
    timed = [p["time_ms"] for p in previous if p.get("time_ms") is not None]
    state = {"trials": len(previous), "new": 0, "best": min(timed, default=None),
             "start": time.time(), "errors": Counter(), "clock": _BatchClock(builder)}

    @derived_object
    class Progress(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler, task_id, candidates, builder_results, runner_results):
            failed = 0
            for built, ran in zip(builder_results, runner_results):
                error = built.error_msg or ran.error_msg
                time_ms = None
                if error:
                    failed += 1
                else:
                    time_ms = mean_ms(ran.run_secs)
                    if state["best"] is None or time_ms < state["best"]:
                        state["best"] = time_ms
                state["trials"] += 1
                state["new"] += 1
                last = error_summary(error) if error else None
                if last:
                    state["errors"][last] += 1
                records.append(path, {"session": session, "trial": state["trials"],
                                      "time_ms": time_ms, "error": last,
                                      "elapsed_s": round(time.time() - state["start"], 2)})
            best = f"{state['best']:.4f} ms" if state["best"] is not None else "none yet"
            say(f"  trials {state['new']} new, {state['trials']} in all ({failed} of this batch "
                f"failed); best so far {best}; {time.time() - state['start']:.0f} s "
                f"({state['clock'].batch_done()})")
            if state.get("stop"):
                raise KeyboardInterrupt

    return Progress(), state


class _BatchClock:
    """Where a batch's time went: choosing its candidates (MetaSchedule's search and cost
    model), building them, measuring what is left to measure after the last build (the rest
    is measured while the slower ones build: CheckingRunner.measure_soon), and MetaSchedule's
    own callbacks after the last result (the database, the cost model's update). With
    `builder` (a WarmBuilder), also the slowest candidate's build: a batch waits for it."""

    def __init__(self, builder=None):
        self.since = time.time()  # the end of the last batch (or the search's start)
        self.build_start = self.build_end = self.landed = None
        self.builder = builder

    def batch_done(self) -> str:
        now = time.time()
        build_start, build_end = self.build_start or now, self.build_end or now
        landed = max(self.landed or build_end, build_end)
        phases = {"choosing": build_start - self.since, "building": build_end - build_start,
                  "measuring": landed - build_end, "updating": now - landed}
        self.since, self.build_start, self.build_end, self.landed = now, None, None, None
        text = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items())
        slowest = max(getattr(self.builder, "seconds", None) or [0.0])
        return text + (f"; slowest build {slowest:.0f} s" if slowest >= 1 else "")


@derived_object
class TimedBuilder(ms.builder.PyBuilder):
    """`builder`, the time its batches take kept on `clock` (_BatchClock)."""

    def __init__(self, builder, clock: _BatchClock):
        super().__init__()
        self.builder, self.clock = builder, clock

    def build(self, build_inputs):
        self.clock.build_start = time.time()
        try:
            return self.builder.build(build_inputs)
        finally:
            self.clock.build_end = time.time()


@derived_object
class _ReportedFuture(ms.runner.PyRunnerFuture):
    """A runner future that hands its result to `report` once, when MetaSchedule collects it."""

    def __init__(self, future, report: Callable):
        super().__init__()
        self.future, self.report, self.reported = future, report, False

    def done(self) -> bool:
        done = self.future.done()
        if done:
            self.result()
        return done

    def result(self):
        result = self.future.result()
        if not self.reported:
            self.reported = True
            self.report(result)
        return result


@derived_object
class ReportingRunner(ms.runner.PyRunner):
    """`runner`, each candidate's result reported as it lands: TVM's measure callbacks see a
    batch only when all of it is measured."""

    def __init__(self, runner, report: Callable):
        super().__init__()
        self.runner, self.report = runner, report

    def run(self, runner_inputs):
        return [_ReportedFuture(future, self.report) for future in self.runner.run(runner_inputs)]


def _candidate_reporter(state: dict, progress: Progress, say: Callable[[str], None]
                        ) -> Callable:
    """Each measured candidate advances the search's bar (progress: best so far, the rate
    over its last trials, ETA); where no bar is drawn, a line: how far the run is, its time or
    why it has none, the best so far and that rate."""
    state["landed"] = 0

    def report(result) -> None:
        state["landed"] += 1
        state["clock"].landed = time.time()
        if result.error_msg:
            outcome = error_summary(result.error_msg)
        else:
            time_ms = mean_ms(result.run_secs)
            state["best"] = time_ms if state["best"] is None else min(state["best"], time_ms)
            outcome = f"{time_ms:.4f} ms"
        best = f"{state['best']:.4f} ms" if state["best"] is not None else "none yet"
        progress.step(f"best {best}")
        if not progress.shown:
            say(f"  [{state['landed']}/{progress.total}] {outcome}; best so far {best}; "
                f"{progress.rate():.1f} trials/min")

    return report


def _load_tensor_intrinsics(say: Callable[[str], None]) -> None:
    """Import TVM's tensor intrinsics, which MetaSchedule's first task imports anyway, saying so:
    parsing them took 24-27 s on this project's two-core machines, once per process (most of
    the silence before a short CPU search's first result); through tvmscript_import, 3-5 s."""
    if TENSOR_INTRINSICS not in sys.modules:
        say("  loading TVM's tensor intrinsics (parsed once per process: 3-5 s on two cores)")
        start = time.time()
        tvmscript_import.import_module(TENSOR_INTRINSICS)
        say(f"  loaded in {time.time() - start:.0f} s; searching")


@contextlib.contextmanager
def _tensor_intrinsics(needed: bool, say: Callable[[str], None]):
    """TVM's tensor intrinsics for the length of a search: imported, saying so, where the space
    tensorizes (`needed`). Otherwise MetaSchedule's TuneContext, which imports them all whatever
    the space, finds an empty stand-in, taken away afterwards: a search over CUDA-core or CPU
    rules starts without their 20-35 s parse."""
    if needed or TENSOR_INTRINSICS in sys.modules:
        _load_tensor_intrinsics(say)
        yield
        return
    sys.modules[TENSOR_INTRINSICS] = types.ModuleType(TENSOR_INTRINSICS)
    try:
        yield
    finally:
        del sys.modules[TENSOR_INTRINSICS]


@contextlib.contextmanager
def _interruptible(state: dict, say: Callable[[str], None]):
    """Ctrl-C stops the search after the batch in flight, whose results are kept. (A Python
    exception raised at a random point of TVM's C++ search can crash it, so the first Ctrl-C
    only asks the progress callback to stop; a second one ends the process at once.)"""

    def on_sigint(signum, frame):
        state["stop"] = True
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        say("Ctrl-C: stopping after this batch, whose results are kept (Ctrl-C again: now)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except Exception:
        if state.get("stop"):  # TVM hands the callback's KeyboardInterrupt back as an error
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def seeded_search(seed: int):
    """numpy's global random engine seeded with `seed` for the search, and restored after:
    TVM's XGBoost model scores candidates with np.random until it has warmed up, so the first
    batches' picks (all 8 of an 8-trial search) came out different on every run. Where TVM
    searches on several threads, which random stream a candidate draws from depends on their
    timing too, so a reproducible search takes one (search's `reproducible`: the same seed,
    the same 8 of 8 candidates on llvm, where either cause alone left 0 in common)."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


def search(wl: Workload, target: tvm.target.Target, work_dir: str, trials: int, space: str,
           builder, runner, *, seed: int = 0, say: Callable[[str], None] = print,
           reproducible: bool = False, batch: int = BATCH) -> dict:
    """Run `trials` new MetaSchedule trials on `wl` over the design space `space` (see SPACES)
    into `work_dir`, then say the best and save it (BEST_TRACE, BEST_MODULE); returns the
    search's summary record, with what this run proposed, refused and measured (`candidates`:
    over rung spaces, the settings drawn and those the rungs refused before anything was built;
    TVM's rules have no refusal check). A search with no correct candidate at all fails, with
    the most common reason. `reproducible`: the same seed proposes the same candidates
    (seeded_search). `batch`: the candidates of one iteration (a farm's search: a batch per
    server)."""
    check_work_dir(work_dir, must_exist=False)
    os.makedirs(work_dir, exist_ok=True)
    database = open_database(work_dir)
    # TVM's own log (tables of tasks, cost-model fits) goes to work_dir/logs, not the console.
    # Its logging set-up names the handlers its logger has; one without a name (seen in the
    # GPU test tier, at the third search of one pytest process) fails it: those are dropped.
    tvm_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    tvm_logger.setLevel(logging.WARNING)
    for handler in [h for h in tvm_logger.handlers if h.get_name() is None]:
        tvm_logger.removeHandler(handler)
    session = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    # the builder before it is wrapped: its per-candidate build times (_BatchClock)
    callback, state = _progress_callback(work_dir, session, say, builder)
    mod = tvm.IRModule({"main": wl.prim_func()})
    tensor_cores = uses_tensor_cores(wl, target)
    cost_model, strategy, first, rungs = "xgb", "evolutionary", [], None
    if space in SPACES:
        rules = SPACES[space] + (" + tensor cores" if tensor_cores else "")
    else:
        rungs = rungspace.Rungs(space.split(","), wl, target)
        rules = f"knob space of {space.replace(',', ', ')}"
        builder, cost_model = rungspace.RungBuilder(builder, rungs), rungs.cost_model(batch)
        first = [] if state["trials"] else rungs.own_choices(mod)
        strategy = rungspace.OwnChoiceFirst(
            ms.search_strategy.EvolutionarySearch(population_size=RUNG_POPULATION), first)
    say(f"MetaSchedule ({rules}): {wl.label()} for {target.kind.name} "
        f"{target.attrs.get('arch', '')}, {trials} new trials into {work_dir} "
        f"({state['trials']} there already)")
    if first:
        say("its first batch measures the own choice of "
            + ", ".join(rungspace.knobs_of(c.sch.mod)[0] for c in first))
    progress = Progress(trials, f"MetaSchedule {wl.label()}")
    runner = ReportingRunner(runner, _candidate_reporter(state, progress, say))
    builder = TimedBuilder(builder, state["clock"])
    # the intrinsics before the tensor-core rules and the rungs' tensorizing, which name them
    with _tensor_intrinsics(tensor_cores or space not in SPACES, say), \
            _interruptible(state, say), contextlib.closing(progress), \
            seeded_search(seed):
        state["clock"].since = time.time()
        generator = (design_space(mod, target, space, tensor_cores) if space in SPACES
                     else rungs.design_space())
        ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=batch,
                    builder=builder, runner=runner, database=database, cost_model=cost_model,
                    strategy=strategy,
                    measure_callbacks=[*ms.MeasureCallback.create("default"), callback],
                    space=generator, seed=seed,
                    num_tuning_cores=1 if reproducible else "physical")
    elapsed = time.time() - state["start"]
    counts = rungs.counts(state["new"]) if rungs else Counts(state["new"], 0, state["new"])
    found = save_best(wl, target, work_dir, database)
    if found is None:
        errors = state["errors"].most_common(1)
        raise SearchFailed(f"no candidate ran correctly in {state['new']} trials (this run: "
                           f"{counts}); most often: "
                           f"{errors[0][0] if errors else 'nothing was measured'}")
    best_ms, trace = found
    say(f"best: {best_ms:.4f} ms after {state['trials']} trials; this run: {counts}, "
        f"{60 * state['new'] / elapsed:.1f} trials/min")
    say("# best schedule's trace:\n" + trace)
    say(f"saved {BEST_TRACE} and {BEST_MODULE} in {work_dir}")
    return {"schedule": "metaschedule", "search": "metaschedule", "tuner": "evolutionary",
            "params": {"work_dir": work_dir}, "rules": rules, "seed": seed,
            **shared_limit(target), "trials": state["trials"], "candidates": asdict(counts),
            "trials_per_min": trials_per_minute(work_dir),
            "curve": curve(work_dir)}


def shared_limit(target: tvm.target.Target) -> dict:
    """The shared memory per block that the search's candidates could have, in KB (CUDA): a
    report tells searches under different limits apart by it. Searches from before the
    targets had their GPU's limits recorded none (CUDA ones had 48 KB)."""
    limit = target.attrs.get("max_shared_memory_per_block")
    return {"shared_kb": int(limit) // 1024} if limit is not None else {}


def _describe(target: tvm.target.Target) -> str:
    return " ".join(filter(None, (target.kind.name, target.attrs.get("arch", ""))))


def _machine(target: tvm.target.Target) -> tuple[str, str]:
    """What a tuned schedule is tied to: the target kind and the GPU generation (sm_90 and
    sm_90a, its arch-specific feature set, are one GPU)."""
    return target.kind.name, str(target.attrs.get("arch", "")).rstrip("af")


def _best_schedule(wl: Workload, target, database, work_dir: str) -> tvm.s_tir.Schedule | None:
    """The best schedule of `wl` in the database; refused if it was tuned for another target
    kind or arch (MetaSchedule's query itself looks at the workload only)."""
    mod = tvm.IRModule({"main": wl.prim_func()})
    record = database.query_tuning_record(mod, target, workload_name="main")
    if record is None:
        return None
    tuned_for = record.target
    if _machine(tuned_for) != _machine(target):
        raise RecordsError(f"work dir {work_dir} was tuned for {_describe(tuned_for)}, not "
                           f"{_describe(target)}: tune a work dir of its own for this target")
    if uses_tensor_cores(wl, target):  # its trace may name tensor intrinsics
        tvmscript_import.import_module(TENSOR_INTRINSICS)
    return database.query_schedule(mod, target, workload_name="main")


def save_best(wl: Workload, target, work_dir: str, database) -> tuple[float, str] | None:
    """Write the best schedule's trace (BEST_TRACE) and module (BEST_MODULE) into the work dir;
    returns its time in ms and its trace, or None when no candidate ran correctly."""
    mod = tvm.IRModule({"main": wl.prim_func()})
    record = database.query_tuning_record(mod, target, workload_name="main")
    if record is None:
        return None
    sch = _best_schedule(wl, target, database, work_dir)
    trace = "\n".join(sch.trace.as_python())
    with open(os.path.join(work_dir, BEST_TRACE), "w") as f:
        f.write(trace + "\n")
    with open(os.path.join(work_dir, BEST_MODULE), "w") as f:
        f.write(rungspace.realize(sch.mod, wl, target).script() + "\n")
    return mean_ms(record.run_secs), trace


def best_module(wl: Workload, target: tvm.target.Target, work_dir: str) -> tvm.IRModule:
    """The best schedule of `wl` in the work dir's database, applied to `wl` (a rung space's
    best: the rung with its knobs)."""
    check_work_dir(work_dir, must_exist=True)
    sch = _best_schedule(wl, target, open_database(work_dir), work_dir)
    if sch is None:
        raise RecordsError(f"no MetaSchedule record for {wl.label()} in {work_dir}")
    return rungspace.realize(sch.mod, wl, target)


def trials_per_minute(work_dir: str) -> float | None:
    """Candidates measured per minute of search, over every session of the work dir."""
    sessions: dict[str, float] = {}
    progress = read_progress(work_dir)
    for p in progress:
        sessions[p["session"]] = max(sessions.get(p["session"], 0.0), p["elapsed_s"])
    seconds = sum(sessions.values())
    return 60 * len(progress) / seconds if seconds else None


def curve(work_dir: str) -> list[tuple[int, float | None]]:
    """(trial, best time so far in ms) over every candidate the work dir has measured."""
    points, best_ms = [], None
    for p in read_progress(work_dir):
        if p.get("time_ms") is not None and (best_ms is None or p["time_ms"] < best_ms):
            best_ms = p["time_ms"]
        points.append((p["trial"], best_ms))
    return points


def tuned_entry(wl: Workload, work_dir: str):
    """`metaschedule`: the best schedule in the work dir's database."""
    check_work_dir(work_dir, must_exist=True)
    return TunedSchedule(wl.op, "metaschedule", {"work_dir": work_dir},
                         lambda w, target: best_module(w, target, work_dir))
