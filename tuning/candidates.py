"""Build and run search candidates, for both searches (MetaSchedule and the template tuner).

Both go through MetaSchedule's Builder and Runner interfaces: every candidate is built and run in
a worker process, so a crash or a hang costs that candidate only, and the runs can go to a farm
of GPU hosts through TVM's RPC tracker. On a local GPU, CheckingRunner checks each candidate
against float64 and times it with this project's harness (measure.evaluate_artifact); over RPC,
TVM's own time_evaluator times it on the remote host.

Why not MetaSchedule's LocalBuilder: it starts fresh worker processes for every batch, and its
default build function imports all of TVM's tensor intrinsics (`tvm.s_tir.tensor_intrin`: CUDA,
ROCm, ARM, Hexagon...) inside the timed call. On the GPU machine that import alone takes 36-39 s,
more than the builder's 30 s timeout, so every candidate timed out
(reports/logs/h100-ms-builder-probe.log). WarmBuilder starts its workers once, imports TVM
before the first candidate (outside the timeout) and builds with `build.build_artifact`, which
needs the intrinsics only for tensor-core candidates (their workers import them at start).
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
from dataclasses import dataclass

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from schedules.workloads import Workload

from . import build, measure

BUILD_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 60.0


class UsageError(ValueError):
    """Bad search settings (an RPC tracker address that does not parse)."""


TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin.cuda"


def _warm_up(tensor_intrinsics: bool) -> None:
    """A builder worker's start: the imports its builds need, outside the build's timeout
    (the tensor intrinsics only for tensor-core candidates: see build.has_warp_fragments)."""
    import tuning.build  # noqa: F401  (imports tvm)

    if tensor_intrinsics:
        importlib.import_module(TENSOR_INTRINSICS)


@derived_object
class WarmBuilder(ms.builder.PyBuilder):
    """Builds candidates in parallel worker processes that stay up for the whole search. The
    workers start at the first batch; the first batch with tensor-core candidates restarts
    them with the tensor intrinsics imported. A search without such candidates never pays
    for that import, though MetaSchedule's CUDA rules import it in this process."""

    def __init__(self, max_workers: int | None = None, timeout_sec: float = BUILD_TIMEOUT_S):
        super().__init__()
        self.timeout_sec = timeout_sec
        self.max_workers = max_workers or os.cpu_count()
        self.pool = None
        self.tensor_intrinsics = False  # whether the workers have imported them

    def build(self, build_inputs):
        needed = any(build.has_warp_fragments(b.mod.script()) for b in build_inputs)
        if self.pool is None or needed and not self.tensor_intrinsics:
            if self.pool is not None:
                self.pool.shutdown()
            self.tensor_intrinsics = needed
            self.pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec,
                                          initializer=_warm_up, initargs=(needed,))
        jobs = [(b.mod, b.target) for b in build_inputs]
        results = []
        for done in self.pool.map_with_error_catching(build.build_artifact, jobs):
            if done.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(done.value, None))
            elif done.status == StatusKind.TIMEOUT:
                results.append(ms.builder.BuilderResult(
                    None, f"build timed out after {self.timeout_sec:.0f} s"))
            else:
                results.append(ms.builder.BuilderResult(None, f"build failed: {done.value}"))
        return results


def _warm_up_runner() -> None:
    """A runner worker's start: torch, tvm and a CUDA context, outside the run's timeout."""
    from tuning import measure as harness

    harness.gpu_present()
    import tvm  # noqa: F401  (the import every run needs)


@derived_object
class CheckingRunner(ms.runner.PyRunner):
    """Runs candidates one at a time in a worker process on this machine's GPU: each is checked
    against float64, then timed by this project's harness. A kernel that crashes can leave the
    CUDA context unusable for every later launch in that process (TVM's LocalRunner then fails
    all the rest of the search: the first 128-trial H100 run lost every candidate), so
    after any failure other than a wrong result the worker is replaced."""

    def __init__(self, wl: Workload, flush_l2: bool = True, timeout_sec: float = RUN_TIMEOUT_S):
        super().__init__()
        self.evaluate = functools.partial(measure.evaluate_artifact, wl, flush_l2)
        self.timeout_sec = timeout_sec
        self.pool = self._new_pool()

    def _new_pool(self) -> PopenPoolExecutor:
        return PopenPoolExecutor(max_workers=1, timeout=self.timeout_sec,
                                 initializer=_warm_up_runner)

    def run(self, runner_inputs):
        futures = []
        for runner_input in runner_inputs:
            done = next(iter(self.pool.map_with_error_catching(
                self.evaluate, [runner_input.artifact_path])))
            if done.status == StatusKind.COMPLETE:
                futures.append(LocalRunnerFuture(res=[done.value]))
                continue
            if done.status == StatusKind.TIMEOUT:
                error = f"run timed out after {self.timeout_sec:.0f} s"
            else:
                error = f"run failed: {done.value}"
            if "wrong result" not in error:  # the worker may hold a broken CUDA context
                self.pool.shutdown()
                self.pool = self._new_pool()
            futures.append(LocalRunnerFuture(error_message=error))
        return futures


def parse_tracker(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"malformed --rpc-tracker '{address}': expected host:port")
    return host, int(port)


def make_runner(target: tvm.target.Target, wl: Workload, flush_l2: bool = True,
                rpc_tracker: str | None = None, rpc_key: str | None = None) -> ms.runner.Runner:
    """Over RPC: TVM's runner on the tracker's hosts. On this machine's GPU: a worker process
    that checks and times each candidate with this project's harness. Otherwise (a CPU target):
    TVM's local runner."""
    if rpc_tracker:
        if not rpc_key:
            raise UsageError("--rpc-tracker needs --rpc-key (the key the GPU hosts registered)")
        host, port = parse_tracker(rpc_tracker)
        config = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=rpc_key,
                                     session_timeout_sec=int(RUN_TIMEOUT_S))
        return ms.runner.RPCRunner(rpc_config=config, max_workers=1)
    if target.kind.name == "cuda":
        return CheckingRunner(wl, flush_l2)
    return ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S)


def shut_down(*workers) -> None:
    """Stop the worker processes of builders and runners now, from this thread (left to the
    garbage collector after a Ctrl-C, TVM's pools fail to stop from their own threads)."""
    for worker in workers:
        pool = getattr(worker, "pool", None)
        if pool is not None:
            pool.shutdown()


@dataclass(frozen=True)
class Outcome:
    """What became of one candidate."""

    status: str  # ok, invalid, build_failed, run_failed, wrong, timeout
    time_ms: float | None = None
    error: str | None = None


def mean_ms(run_secs) -> float:
    """A runner's times for one candidate (seconds, as TVM FloatImms or floats), in ms."""
    seconds = [float(s) for s in run_secs]
    return 1e3 * sum(seconds) / len(seconds)


def error_summary(message: str) -> str:
    """The line of a worker's traceback that says what went wrong."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or lines or ["failed"])[-1][:300]


def _failure(kind: str, message: str) -> Outcome:
    detail = error_summary(message)
    if "timed out" in message or "Timeout" in message:
        kind = "timeout"
    elif "wrong result" in message:
        kind = "wrong"
    return Outcome(kind, error=detail)


def measure_modules(mods: list, target: tvm.target.Target, builder, runner) -> list[Outcome]:
    """Build and run each scheduled module (an Outcome in its place stays as it is)."""
    outcomes: list[Outcome | None] = [m if isinstance(m, Outcome) else None for m in mods]
    pending = [i for i, m in enumerate(mods) if not isinstance(m, Outcome)]
    built = builder.build([ms.builder.BuilderInput(mods[i], target) for i in pending])
    to_run = []
    for i, result in zip(pending, built):
        if result.error_msg:
            outcomes[i] = _failure("build_failed", result.error_msg)
        else:
            to_run.append((i, result.artifact_path))
    inputs = [
        ms.runner.RunnerInput(path, target.kind.name,
                              ms.arg_info.ArgInfo.from_prim_func(mods[i]["main"]))
        for i, path in to_run
    ]
    for (i, path), future in zip(to_run, runner.run(inputs)):
        result = future.result()
        if result.error_msg:
            outcomes[i] = _failure("run_failed", result.error_msg)
        else:
            outcomes[i] = Outcome("ok", mean_ms(result.run_secs))
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return outcomes
