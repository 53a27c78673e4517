"""Build and run search candidates, for both searches (MetaSchedule and the template tuner).

Both go through MetaSchedule's Builder and Runner interfaces: every candidate is built and run in
a worker process, so a crash or a hang costs that candidate only, and the runs can go to a farm
of GPUs behind TVM's RPC tracker (tuning/farm.py). On a GPU, here or on the farm's hosts,
CheckingRunner checks each candidate against float64 and times it with this project's harness
(measure.evaluate_artifact).

Why not MetaSchedule's LocalBuilder: it starts fresh worker processes for every batch, and its
default build function imports all of TVM's tensor intrinsics (`tvm.s_tir.tensor_intrin`: CUDA,
ROCm, ARM, Hexagon...) inside the timed call. On the GPU machine that import alone takes 36-39 s,
more than the builder's 30 s timeout, so every candidate timed out
(notebook/logs/h100-ms-builder-probe.log). WarmBuilder starts its workers once, imports TVM
before the first candidate (outside the timeout) and builds with `build.build_artifact`, which
needs the intrinsics only for tensor-core candidates (their workers import them at start).

What became of a candidate is an Outcome with a Status, which WarmBuilder and CheckingRunner
take from how their workers ended (completed, timed out, or raised: measure.WrongResult for a
wrong result). TVM's local runner (CPU searches) reports a failure as text only, which
`tvm_run_failure` reads.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import platform
import re
import shutil
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable

import tvm
from tvm.ir.utils import derived_object
from tvm.rpc import base
from tvm.s_tir import meta_schedule as ms
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

import schedules
from schedules import tvmscript_import
from schedules.errors import ScheduleNotApplicable, UsageError
from schedules.registry import ScheduleEntry
from schedules.workloads import Workload

from . import build, measure

BUILD_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 60.0
TRACKER_TIMEOUT_S = 5.0  # check_rpc: the longest a tracker may take to connect and answer


TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin.cuda"

# Every worker's start: Ctrl-C is ignored. A terminal sends it to the whole process group, and
# a worker it ended left its candidate in flight recorded as failed ("Subprocess terminated",
# 1e10 s in MetaSchedule's database), which a resumed search never measures again. The search
# handles Ctrl-C itself (MetaSchedule finishes the batch in flight; the template tuner stops),
# and shut_down ends the workers. A partial of the standard library's, so that a worker of
# TVM's own runner need not import this project to run it.
IGNORE_CTRL_C = functools.partial(signal.signal, signal.SIGINT, signal.SIG_IGN)


def _warm_up(tensor_intrinsics: bool) -> None:
    """A builder worker's start: Ctrl-C ignored (IGNORE_CTRL_C), and the imports its builds
    need, outside the build's timeout (the tensor intrinsics only for tensor-core candidates:
    see build.has_warp_fragments)."""
    IGNORE_CTRL_C()
    import tuning.build  # noqa: F401  lazy: a builder worker's imports, after Ctrl-C is off

    if tensor_intrinsics:
        tvmscript_import.import_module(TENSOR_INTRINSICS)


def _timed_build(job: tuple[tvm.IRModule, tvm.target.Target]) -> tuple[str, float]:
    """build.build_artifact, and the seconds it took in the worker (a batch waits for its
    slowest candidate)."""
    start = time.perf_counter()
    path = build.build_artifact(job)
    return path, time.perf_counter() - start


def _first_build(target: tvm.target.Target) -> None:
    """A builder worker's first build, for a CUDA `target`, before the search's first batch: a
    32x32 GEMV by the naive rung, so that the CUDA compiler's libraries load then (on a GPU
    machine), not in a candidate's build."""
    if target.kind.name == "cuda":
        wl = Workload("gemv", (32, 32), "float32")
        build.build(schedules.get("gemv", "naive").apply(wl, target), target)


BUILD_WORKERS_VARIABLE = "FARM_BUILD_WORKERS"  # a farm server's share of its host (build_workers)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, which taskset and containers narrow,
    rather than the host's count (os.cpu_count), so that builds are not oversubscribed."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def build_workers(default: int) -> int:
    """How many processes build candidates: FARM_BUILD_WORKERS where set (a farm server's share
    of its host), else `default`. Read when building, not at import, so that a bad value is
    refused in one line (UsageError), not a traceback."""
    value = os.environ.get(BUILD_WORKERS_VARIABLE, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{BUILD_WORKERS_VARIABLE} is a count of build processes (at least 1), "
                         f"not {value!r}")
    return int(value)


@derived_object
class WarmBuilder(ms.builder.PyBuilder):
    """Builds candidates in parallel worker processes that stay up for the whole search. The
    workers start at `start` (while the search chooses its first batch) or at the first batch;
    the first batch with tensor-core candidates restarts them with the tensor intrinsics
    imported. A search without such candidates never pays for that import, though
    MetaSchedule's CUDA rules import it in this process. `on_built`, where given, is handed
    each candidate's artifact as soon as it is built, in the order the builds end (a
    CheckingRunner's measure_soon: measuring overlaps the batch's slower builds)."""

    def __init__(self, max_workers: int | None = None, timeout_sec: float = BUILD_TIMEOUT_S,
                 on_built: Callable[[str], None] | None = None):
        super().__init__()
        self.timeout_sec = timeout_sec
        self.max_workers = max_workers or usable_cpus()
        self.on_built = on_built
        self.pool = None
        self.tensor_intrinsics = False  # whether the workers have imported them
        self.starting = threading.Lock()  # the workers (re)started by one caller at a time
        self.seconds: list[float] = []  # each built candidate's build time, the last batch

    def start(self, target: tvm.target.Target) -> None:
        """Start every worker now, each with a first build for `target` (_first_build), and
        return at once: the workers get ready while the search chooses its first batch."""
        self._spawn(_first_build, target)

    def spawn(self) -> None:
        """Start every worker now, before any target is known (a farm server, before it takes
        a search), and return at once: each imports what builds need meanwhile."""
        self._spawn(int)

    def _spawn(self, job: Callable, *args) -> None:
        """`job` once per worker, so that every worker starts (each job waits seconds for its
        worker to start, so each gets a thread and a worker)."""
        pool = self._pool(tensor_intrinsics=False)
        for _ in range(self.max_workers):
            pool.submit(job, *args)

    def _pool(self, tensor_intrinsics: bool) -> PopenPoolExecutor:
        """The workers, started (again, with the tensor intrinsics) where they are not yet."""
        if self.pool is None or tensor_intrinsics and not self.tensor_intrinsics:
            if self.pool is not None:
                self.pool.shutdown()
            self.tensor_intrinsics = tensor_intrinsics
            self.pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec,
                                          initializer=_warm_up, initargs=(tensor_intrinsics,))
        return self.pool

    def build(self, build_inputs):
        """MetaSchedule's interface: each candidate's artifact, or why it has none."""
        return [ms.builder.BuilderResult(None, built.error) if isinstance(built, Outcome)
                else ms.builder.BuilderResult(built, None)
                for built in self.artifacts(build_inputs)]

    def artifacts(self, build_inputs) -> list[str | Outcome]:
        """Build each candidate in the workers: its artifact's path, or the Outcome of a build
        that timed out or failed."""
        with self.starting:  # a farm server's two sessions may ask at once
            pool = self._pool(any(build.has_warp_fragments(b.mod) for b in build_inputs))
        futures = {pool.submit(_timed_build, (b.mod, b.target)): n
                   for n, b in enumerate(build_inputs)}
        results: list[str | Outcome | None] = [None] * len(build_inputs)
        seconds: list[float] = []
        for future in concurrent.futures.as_completed(futures):
            built = results[futures[future]] = self._artifact(future, seconds)
            if isinstance(built, str) and self.on_built:
                self.on_built(built)
        self.seconds = seconds
        return results

    def _artifact(self, future: concurrent.futures.Future, seconds: list[float]) -> str | Outcome:
        """A finished build's artifact path (its build time added to `seconds`), or why it
        has none."""
        try:
            path, took = future.result()
        except TimeoutError:
            return Outcome(Status.TIMEOUT, error=f"build timed out after {self.timeout_sec:.0f} s")
        except Exception as e:  # noqa: BLE001  whatever the build raised, in the worker
            return Outcome(Status.BUILD_FAILED, error=error_summary(f"build failed: {e}"))
        seconds.append(took)
        return path


def _warm_up_runner() -> None:
    """A runner worker's start: Ctrl-C ignored (IGNORE_CTRL_C), then torch, tvm and a CUDA
    context, outside the run's timeout."""
    IGNORE_CTRL_C()
    from tuning import measure as harness  # lazy: a runner worker's, after Ctrl-C is off

    harness.gpu_present()
    import tvm  # noqa: F401  lazy: the import every run needs, in the runner worker


def _runner_worker(timeout_sec: float) -> PopenPoolExecutor:
    """A CheckingRunner's worker process, started now (its imports and CUDA context take
    seconds, run while other work goes on)."""
    pool = PopenPoolExecutor(max_workers=1, timeout=timeout_sec, initializer=_warm_up_runner)
    pool.submit(int)  # any task starts the worker
    return pool


@derived_object
class _CheckedFuture(ms.runner.PyRunnerFuture):
    """One candidate of a CheckingRunner, checked and timed the first time it is asked about:
    its time in seconds, or why it has none."""

    def __init__(self, runner: "CheckingRunner", runner_input):
        super().__init__()
        self.runner, self.input, self.outcome = runner, runner_input, None

    def done(self) -> bool:
        self.result()
        return True

    def result(self):
        if self.outcome is None:
            self.outcome = self.runner.outcomes([self.input])[0]
        return runner_result(self.outcome)


@derived_object
class CheckingRunner(ms.runner.PyRunner):
    """Runs candidates one at a time in a worker process on this machine's GPU: each is checked
    against float64, then timed by this project's harness. A kernel that crashes can leave the
    CUDA context unusable for every later launch in that process (TVM's LocalRunner then fails
    all the rest of the search: the first 128-trial H100 run lost every candidate), so
    after any failure other than a wrong result the worker is replaced: by a standby that has
    started meanwhile (its imports take 7-9 s on the H100 host, which every failure cost).
    Each candidate is told the best time so far (measure.evaluate_artifact: a much slower one
    gets a short timing). Candidates are measured one at a time, in the order they reach the
    measuring thread: from `measure_soon` as each is built (a WarmBuilder's on_built), or when
    asked for."""

    def __init__(self, wl: Workload, flush: str = "read", timeout_sec: float = RUN_TIMEOUT_S,
                 workers: tuple[PopenPoolExecutor, PopenPoolExecutor] | None = None):
        super().__init__()
        self.evaluate = functools.partial(measure.evaluate_artifact, wl, flush)
        self.timeout_sec = timeout_sec
        self.best_ms: float | None = None
        # its worker and the standby: those given (started_workers), else started now
        self.pool, self.standby = workers or (self._new_pool(), self._new_pool())
        self.measurer = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.soon: dict[str, concurrent.futures.Future] = {}  # artifact: its measurement

    def _new_pool(self) -> PopenPoolExecutor:
        """A worker, started now (its warm-up runs while others measure)."""
        return _runner_worker(self.timeout_sec)

    @staticmethod
    def started_workers() -> tuple[PopenPoolExecutor, PopenPoolExecutor]:
        """A worker and its standby, started now for a CheckingRunner made later (`workers`),
        with the default run timeout: a farm server starts them before it takes a search."""
        return _runner_worker(RUN_TIMEOUT_S), _runner_worker(RUN_TIMEOUT_S)

    def device(self) -> dict:
        """The GPU the worker measures on: its name, driver and arch (asked of the worker, so
        that this process never opens the GPU)."""
        facts = self.pool.submit(measure.device_facts).result()
        return {key: facts[key] for key in ("gpu", "driver", "arch")}

    def run(self, runner_inputs):
        """MetaSchedule's interface: a future per candidate, measured when MetaSchedule first
        asks about it (it asks in turn), so that each result lands as it is measured."""
        return [_CheckedFuture(self, i) for i in runner_inputs]

    def measure_soon(self, artifact_path: str) -> None:
        """Queue a built candidate for measuring now, while the rest of its batch builds; its
        Outcome waits for `outcomes` to ask for it."""
        self.soon[artifact_path] = self.measurer.submit(self._measure, artifact_path)

    def outcomes(self, runner_inputs) -> list[Outcome]:
        """Each built candidate's (a MetaSchedule RunnerInput's) Outcome: measured already
        (measure_soon), or measured now."""
        return [(self.soon.pop(i.artifact_path, None)
                 or self.measurer.submit(self._measure, i.artifact_path)).result()
                for i in runner_inputs]

    def _measure(self, artifact_path: str) -> Outcome:
        """Check and time one built candidate in the worker; after a failure other than a wrong
        result, the worker is replaced (it may hold a broken CUDA context)."""
        evaluate = functools.partial(self.evaluate, best_ms=self.best_ms)
        outcome = self._outcome(next(iter(self.pool.map_with_error_catching(
            evaluate, [artifact_path]))))
        if outcome.status is Status.OK:
            self.best_ms = min(self.best_ms or outcome.time_ms, outcome.time_ms)
        elif outcome.status is not Status.WRONG:
            self.pool.shutdown()
            self.pool, self.standby = self.standby, self._new_pool()
        return outcome

    def _outcome(self, done) -> Outcome:
        """A run's Outcome, from how its worker ended: completed (the time), timed out, raised
        measure.WrongResult (wrong), or raised anything else (run_failed)."""
        if done.status == StatusKind.COMPLETE:
            return Outcome(Status.OK, mean_ms([done.value]))
        if done.status == StatusKind.TIMEOUT:
            return Outcome(Status.TIMEOUT, error=f"run timed out after {self.timeout_sec:.0f} s")
        if isinstance(done.value, measure.WrongResult):
            return Outcome(Status.WRONG, error=error_summary(str(done.value)))
        return Outcome(Status.RUN_FAILED, error=error_summary(f"run failed: {done.value}"))


def parse_tracker(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"malformed --rpc-tracker '{address}': expected host:port")
    return host, int(port)


def tracker_socket(host: str, port: int, timeout_s: float) -> socket.socket:
    """A connection to the tracker at host:port that has answered as one, over a socket of our
    own: TVM's TrackerSession retries a refused connection for 60 s, logging each retry, and
    waits without limit for an answer. A UsageError, within about `timeout_s`, if it cannot be
    reached or does not answer as a tracker."""
    where = f"the RPC tracker at {host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror as e:
        raise UsageError(f"cannot reach {where}: unknown host '{host}' ({e.strerror}); "
                         "check --rpc-tracker") from None
    except ConnectionRefusedError:
        raise UsageError(f"cannot reach {where}: connection refused; is `python -m "
                         f"tvm.exec.rpc_tracker --port {port}` running on {host}?") from None
    except TimeoutError:
        raise UsageError(f"cannot reach {where}: no answer to connect within {timeout_s:g} s; "
                         "is the host up and the port open to this machine?") from None
    except OSError as e:
        raise UsageError(f"cannot reach {where}: {e.strerror or e}; check --rpc-tracker "
                         "and that `python -m tvm.exec.rpc_tracker` runs there") from None
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        magic = struct.unpack("<i", base.recvall(sock, 4))[0]
        if magic == base.RPC_TRACKER_MAGIC:
            return sock
        reason = f"it answered with magic {magic:#x}"
    except TimeoutError:
        reason = f"no answer within {timeout_s:g} s"
    except (OSError, struct.error) as e:
        reason = str(e) or type(e).__name__
    sock.close()
    raise _not_a_tracker(host, port, reason)


def _not_a_tracker(host: str, port: int, reason: str) -> UsageError:
    return UsageError(f"{host}:{port} does not answer as an RPC tracker ({reason}); check "
                      "--rpc-tracker (the tracker's port, not an RPC server's)")


def _ask_tracker(host: str, port: int, timeout_s: float) -> dict:
    """The tracker's summary ({"queue_info": {key: {"free", "pending"}}, "server_info": [...]})."""
    with tracker_socket(host, port, timeout_s) as sock:
        try:
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            code, summary = base.recvjson(sock)
            if code != base.TrackerCode.SUCCESS:
                raise ValueError(f"it answered a summary request with code {code}")
            if not (isinstance(summary, dict) and isinstance(summary.get("queue_info"), dict)
                    and isinstance(summary.get("server_info"), list)):
                raise ValueError("its summary has no queue_info and server_info")
            return summary
        except TimeoutError:
            reason = f"no answer within {timeout_s:g} s"
        except (OSError, ValueError, TypeError, struct.error) as e:
            reason = str(e) or type(e).__name__
    raise _not_a_tracker(host, port, reason)


def _servers_under(summary: dict, key: str) -> int:
    """How many servers a tracker's summary has under `key`: those registered with it, or
    (servers behind a proxy are queued without being listed) free in its queue."""
    listed = sum(str(server.get("key", "")) == f"server:{key}"  # a server's key reads so
                 for server in summary["server_info"])
    return max(listed, int(summary["queue_info"].get(key, {}).get("free", 0)))


def servers_now(tracker: str, key: str, timeout_s: float = TRACKER_TIMEOUT_S) -> int:
    """How many servers the tracker at `tracker` (host:port) has under `key` now; a UsageError
    if it cannot be reached or does not answer as one (as check_rpc)."""
    return _servers_under(_ask_tracker(*parse_tracker(tracker), timeout_s), key)


def check_rpc(tracker: str, key: str, timeout_s: float = TRACKER_TIMEOUT_S) -> int:
    """Ask the tracker at `tracker` (host:port) how many servers it has under `key`.
    A UsageError, within about `timeout_s`, if the tracker cannot be reached or does not
    answer as one, or if no server has registered under the key after `timeout_s` (a search
    would wait for one forever); its message names the keys the tracker has. Servers all
    busy is not an error: a search queues for them. Only asks: queues no request that could
    take a server."""
    host, port = parse_tracker(tracker)
    deadline = time.monotonic() + timeout_s
    while True:
        summary = _ask_tracker(host, port, timeout_s)
        servers = _servers_under(summary, key)
        if servers:
            return servers
        if time.monotonic() + 0.5 > deadline:  # else a server may be registering just now
            break
        time.sleep(0.5)
    registered = {name[len("server:"):] for name in
                  (str(server.get("key", "")) for server in summary["server_info"])
                  if name.startswith("server:")}
    registered |= {name for name, queue in summary["queue_info"].items() if queue.get("free")}
    there = (f"keys there: {', '.join(sorted(registered))}" if registered
             else "no server has registered there")
    raise UsageError(f"no RPC server registered under key '{key}' with the tracker at "
                     f"{host}:{port} ({there}); pass one of its keys to --rpc-key, or start "
                     f"a farm: `scripts/rpc-farm.sh --tracker {host}:{port} --key {key}`")


def device_of(target: tvm.target.Target) -> str:
    """The name of the device a target's kernels run on, as runners take it: cuda, cpu (llvm)."""
    return tvm.runtime.Device._DEVICE_TYPE_TO_NAME[target.get_target_device_type()]


def measuring_device(runner) -> dict:
    """What a runner of local_runner's measures on, as records name it: the GPU its worker
    sees (CheckingRunner.device), or this CPU."""
    return runner.device() if isinstance(runner, CheckingRunner) else this_cpu()


def this_cpu() -> dict:
    """This machine's CPU, named as records name a GPU."""
    return {"gpu": f"CPU ({platform.machine()}, {os.cpu_count()} cores)", "driver": "-",
            "arch": "llvm"}


def local_runner(device: str, wl: Workload, flush: str = "read",
                 timeout_sec: float = RUN_TIMEOUT_S, workers: tuple | None = None
                 ) -> ms.runner.Runner:
    """How candidates are measured on this machine: on its GPU (device "cuda"), a worker
    process that checks and times each candidate with this project's harness (`workers`: its
    worker and standby, started beforehand by CheckingRunner.started_workers); otherwise (a
    CPU target), TVM's local runner."""
    if device == "cuda":
        return CheckingRunner(wl, flush, timeout_sec, workers)
    return ms.runner.LocalRunner(timeout_sec=timeout_sec, initializer=IGNORE_CTRL_C)


def built_candidates_to(runner: ms.runner.Runner) -> Callable[[str], None] | None:
    """Where a WarmBuilder hands each candidate as it is built: a CheckingRunner's
    measure_soon (it measures them as they come), else nowhere (TVM's runners measure when
    asked)."""
    return runner.measure_soon if isinstance(runner, CheckingRunner) else None


def shut_down(*workers) -> None:
    """Stop the worker processes of builders and runners now, from this thread (left to the
    garbage collector after a Ctrl-C, TVM's pools fail to stop from their own threads)."""
    for worker in workers:
        measurer = getattr(worker, "measurer", None)  # CheckingRunner's: nothing more queued
        if measurer is not None:
            measurer.shutdown(wait=False, cancel_futures=True)
        for pool in (getattr(worker, "pool", None), getattr(worker, "standby", None)):
            if pool is not None:
                pool.shutdown()


class Status(str, Enum):
    """What became of a candidate, as its record says it (the values are committed data)."""

    OK = "ok"
    INVALID = "invalid"  # the template refused the configuration
    BUILD_FAILED = "build_failed"
    RUN_FAILED = "run_failed"  # crashed, or failed on the remote host
    WRONG = "wrong"  # ran, and failed its check against float64
    TIMEOUT = "timeout"  # its build or its run took too long

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Outcome:
    """What became of one candidate."""

    status: Status
    time_ms: float | None = None
    error: str | None = None


@dataclass
class Counts:
    """What a search did with its candidates in one run: the settings it proposed (each put to
    the rung's refusal check: a template tuner's proposals; over rung spaces, every setting
    MetaSchedule's search drew, most never chosen for measuring; over TVM's rules, which have
    no such check, those it measured), how many of them the check refused (never built nor
    measured), and how many it measured (built and run, a failure included)."""

    proposed: int = 0
    refused: int = 0
    measured: int = 0

    def __str__(self) -> str:
        return f"{self.proposed} proposed, {self.refused} refused, {self.measured} measured"


def refusal(entry: ScheduleEntry, wl: Workload, knobs: dict,
            apply: Callable[[dict], object]) -> ScheduleNotApplicable | None:
    """Why `entry` refuses `knobs` on `wl` (None where it takes them), asked before anything is
    built: by the schedule's own `refuse` check where it declares one (v8 builds a whole kernel
    to apply, 0.1 s, where its check takes 40 us), else by `apply(knobs)`: the caller's, which
    returns the module or the refusal (and may keep the module for the build)."""
    if entry.refuse is None:
        applied = apply(knobs)
        return applied if isinstance(applied, ScheduleNotApplicable) else None
    try:
        entry.refuse(wl, **entry.defaults_for(wl, knobs))
    except ScheduleNotApplicable as refused:
        return refused
    return None


def refuse_unless_taken(entry: ScheduleEntry, wl: Workload, target: tvm.target.Target,
                        search: str) -> None:
    """Refuse `search` of `entry`'s space on `wl` in one line, with the rung's reason, where the
    rung does not take `wl` with its own knobs (another dtype, rows TMA cannot load): no
    setting of its space would, and the search would only propose settings to refuse."""
    try:
        entry.apply(wl, target)
    except ScheduleNotApplicable as refused:
        raise UsageError(f"{search}: {refused}") from None


def runner_result(outcome: Outcome) -> ms.runner.RunnerResult:
    """An Outcome as MetaSchedule takes it: its time in seconds, or why it has none."""
    if outcome.status is Status.OK:
        return ms.runner.RunnerResult([outcome.time_ms * 1e-3], None)
    return ms.runner.RunnerResult(None, outcome.error)


def mean_ms(run_secs) -> float:
    """A runner's times for one candidate (seconds, as TVM FloatImms or floats), in ms."""
    seconds = [float(s) for s in run_secs]
    return 1e3 * sum(seconds) / len(seconds)


RPC_WRAPPER = "Error caught from RPC call:"  # TVM's line before a remote host's own message


def _remote_reason(wrapped: str) -> str:
    """A remote host's error message as one line: the lines after its last traceback frame
    (all of them when it has no traceback), joined."""
    reason: list[str] = []
    in_frame = False
    for line in wrapped.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Traceback (most recent call last)"):
            reason, in_frame = [], False
        elif stripped.startswith('File "') and '", line ' in stripped:
            reason, in_frame = [], True
        elif in_frame and line[:1].isspace():
            continue  # the frame's source line and its ^^^ marks
        else:
            in_frame = False
            reason.append(stripped)
    text = ""
    for line in reason:
        if text:
            text += " " if text.endswith((":", ",", ".", ";", "(", "[")) else "; "
        text += line
    return text


def error_summary(message: str) -> str:
    """One line (at most 300 characters) saying what went wrong: for a remote failure, the
    remote host's message (TVM's RPC wraps it in a local traceback whose last error line is
    only RPC_WRAPPER); otherwise the last line that says what an error was ("...Error: what"),
    else the last that names one."""
    if RPC_WRAPPER in message:
        reason = _remote_reason(message.rpartition(RPC_WRAPPER)[2])
        if reason:
            return f"RPCError: {reason}"[:300]
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    said = [line for line in lines if re.search(r"(Error|error|Exception): ", line)]
    named = [line for line in lines if "Error" in line]  # a line that only names one: a hint
    return (said or named or lines or ["failed"])[-1][:300]


# How TVM's runners say that a run timed out ("LocalRunner: Timeout, killed after 60 seconds").
TVM_TIMEOUTS = ("Timeout, killed after",)


def tvm_run_failure(message: str) -> Outcome:
    """The Outcome of a run that failed in TVM's local runner (CPU searches), which says what
    happened in text only: a timeout where the text is one of TVM_TIMEOUTS, else run_failed;
    its error is the message's summary (error_summary)."""
    timed_out = any(words in message for words in TVM_TIMEOUTS)
    return Outcome(Status.TIMEOUT if timed_out else Status.RUN_FAILED, error=error_summary(message))


def outcomes_of(runner, runner_inputs) -> list[Outcome]:
    """Run each built candidate (a MetaSchedule RunnerInput): the project's runners
    (CheckingRunner, farm.FarmRunner) give Outcomes themselves; TVM's give a time or a
    message, read by tvm_run_failure."""
    if hasattr(runner, "outcomes"):
        return runner.outcomes(runner_inputs)
    results = [future.result() for future in runner.run(runner_inputs)]
    return [tvm_run_failure(r.error_msg) if r.error_msg else Outcome(Status.OK, mean_ms(r.run_secs))
            for r in results]


def runner_input(mod: tvm.IRModule, path: str, target: tvm.target.Target):
    """What a runner needs of one built candidate: its artifact, device and arguments."""
    return ms.runner.RunnerInput(path, device_of(target),
                                 ms.arg_info.ArgInfo.from_prim_func(mod["main"]))


def measure_modules(mods: list, target: tvm.target.Target, builder: WarmBuilder,
                    runner) -> list[Outcome]:
    """Build and run each scheduled module (an Outcome in its place stays as it is)."""
    outcomes: list[Outcome | None] = [m if isinstance(m, Outcome) else None for m in mods]
    pending = [i for i, m in enumerate(mods) if not isinstance(m, Outcome)]
    built = builder.artifacts([ms.builder.BuilderInput(mods[i], target) for i in pending])
    to_run = []
    for i, artifact in zip(pending, built):
        if isinstance(artifact, Outcome):
            outcomes[i] = artifact
        else:
            to_run.append((i, artifact))
    ran = outcomes_of(runner, [runner_input(mods[i], path, target) for i, path in to_run])
    for (i, path), outcome in zip(to_run, ran):
        outcomes[i] = outcome
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return outcomes
