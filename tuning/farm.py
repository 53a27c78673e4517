"""A farm of GPUs for searches: one RPC server per GPU behind TVM's RPC tracker, each building
and measuring what it is sent, and the runner that sends a search's candidates to all of them.
Its entry point is tvm_explorer/farm.py (`main` here, with the remote functions of the packages
above this one: a model's linear layers, linear/farm.py, which uses FarmClient as FarmRunner does).

    scripts/rpc-farm.sh --key h200                          # this host: a tracker, a server per GPU
    scripts/rpc-farm.sh --key h200 --tracker host1:9190     # another host: its servers join host1's
    python runner.py --tune metaschedule --rpc-tracker host1:9190 --rpc-key h200 ...

The engine is TVM's RPC: its tracker hands out free servers, its sessions carry a chunk of
candidates (their modules as TVM's JSON, or a template search's configurations, which the server
applies) and their Outcomes back. Each host builds what it measures, on its own cores shared
among its servers, so adding a host adds building as well as measuring; a search's own host only
proposes candidates (FarmBuilder writes their modules).

Why not TVM's own `tvm.exec.rpc_server` (tried on the two-H200 host, issue 25): it serves each
session in a forked process, in which every candidate failed with cudaErrorInitializationError;
with `--no-fork`, a candidate whose kernel faulted ended the session's process with a non-zero
status, which TVM's listen loop raises out of: the server stayed registered with the tracker,
served no more, and the search waited on it until killed.

A farm server (`serve`) serves sessions in its own process, which never touches the GPU: it
builds each candidate in worker processes (candidates.WarmBuilder) and measures it with the
runner a search on that host would use (candidates.local_runner): on CUDA, a worker process
that checks the candidate against float64 and times it with this project's harness, replaced
after a crash or a timeout. So a candidate that fails to build, faults or hangs costs that
candidate only, and records from the farm are checked like local ones. The farm (`main`)
restarts a server process that exits all the same (ending the workers it left), and a search's
FarmRunner sends the chunk a lost server held to the next free one (FarmClient). It ends the
search with FarmGone, rather than waiting, when the tracker or every server under the key has
gone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import tvm
from tvm import rpc
from tvm.ir.utils import derived_object
from tvm.rpc import base, server
from tvm.rpc.tracker import Tracker
from tvm.s_tir import meta_schedule as ms

import schedules
from schedules.errors import ExplorerError, FarmGone, UsageError
from schedules.workloads import Workload

from . import autotvm, candidates
from .candidates import Outcome, Status

BUILD_AND_EVALUATE = "explorer.farm.build_and_evaluate"  # the servers' remote function
TRACKER_PORT = 9190
GONE_AFTER_S = 30.0  # no server under the key this long: the farm has gone (a restart: seconds)
POLL_S = 1.0  # how often a candidate waiting for a server asks whether any is left
CONNECT_TRIES = 3  # a server the tracker handed out may go away before the chunk reaches it
LOST_TRIES = 3  # servers that may lose one chunk before its candidates count as failed
SESSIONS = 2  # chunks a server holds at once: it builds the next while the last finishes
SETUP_S = 120.0  # a server's start of a new search: its workers, TVM's tensor intrinsics
# the farm waits this long for its servers to register, then says how many did
READY_WITHIN_S = 120.0


# -- a server: builds and measures the candidates sent to it -------------------------------------

_searching: dict = {}  # this server's search: "asked" (its settings), builder, runner, target...
_started: dict = {}  # workers started before the first search (_start_workers), until it takes them
_new_search = threading.Lock()  # its sessions, at a new search's first chunks
_sessions = threading.BoundedSemaphore(SESSIONS)  # the sessions this server serves at once


def _build_and_evaluate(request: str) -> str:
    """The servers' remote function: a chunk of one search's candidates (`request`, JSON of the
    search's workload, target, device, flush and run timeout, and the candidates' modules as
    TVM's JSON or a template's name and configurations to apply), built in this server's build
    workers (its share of the host's cores) and measured by local_runner on this host as they
    are built. Returns each candidate's Outcome, in order, with the device that measured them
    (candidates.measuring_device), as JSON."""
    started = time.monotonic()
    asked = json.loads(request)
    modules, configs = asked.pop("modules", None), asked.pop("configs", None)
    with _new_search:
        if _searching.get("asked") != asked:  # a new search: its workers replace the last's
            _start_search(asked)
    count = len(modules if configs is None else configs)
    say_here(f"building and measuring {count} candidate{'s' * (count > 1)}")
    outcomes = candidates.measure_modules(
        [tvm.ir.load_json(m) for m in modules] if configs is None else _applied(configs),
        _searching["target"], _searching["builder"], _searching["runner"])
    for outcome in outcomes:
        time_ms = f" {outcome.time_ms:.4f} ms" if outcome.time_ms is not None else ""
        say_here(f"{outcome.status}{time_ms}{f': {outcome.error}' if outcome.error else ''}")
    say_here(f"chunk done in {time.monotonic() - started:.1f} s; builds: "
         f"{_build_times(_searching['builder'].seconds)}")
    return json.dumps({"outcomes": [dataclasses.asdict(o) for o in outcomes],
                       "device": _searching["device"]})


def _applied(configs: list[dict]) -> list:
    """A template search's configurations, each applied here (autotvm.apply_config): its
    module, or the Outcome of its refusal or schedule error."""
    entry = schedules.get(_searching["workload"].op, _searching["asked"]["schedule"])
    return [autotvm.as_candidate(autotvm.apply_config(entry, _searching["workload"],
                                                      _searching["target"], config))
            for config in configs]


def _server_builder() -> candidates.WarmBuilder:
    """A WarmBuilder on this server's share of the host's cores (FARM_BUILD_WORKERS, which the
    farm sets), else on every core this process may use."""
    return candidates.WarmBuilder(candidates.build_workers(candidates.usable_cpus()))


def _start_workers() -> None:
    """This server's build workers (and, on a GPU, its measuring worker and standby) started
    before it registers with the tracker, for its first search to take (_start_search): started
    at a search's first chunk, by every server of a host at once, they held back that search's
    first batches."""
    builder = _server_builder()
    builder.spawn()
    _started.update(builder=builder, runner_workers=candidates.CheckingRunner.started_workers()
                    if os.environ.get("CUDA_VISIBLE_DEVICES") else None)


def _start_search(asked: dict) -> None:
    """A new search's build workers and runner (the last search's shut down): a WarmBuilder
    on this server's share of the cores, handing each built candidate to the runner; those
    _start_workers started, where the search is the first (and its runs take the default
    timeout, theirs)."""
    candidates.shut_down(_searching.get("builder"), _searching.get("runner"))
    wl = Workload(**{**asked["workload"], "shape": tuple(asked["workload"]["shape"])})
    target = tvm.ir.load_json(asked["target"])
    workers = _started.pop("runner_workers", None)
    if workers and (asked["device"] != "cuda" or asked["timeout_s"] != candidates.RUN_TIMEOUT_S):
        for pool in workers:  # not this search's: a CPU target's, or another timeout's
            pool.shutdown()
        workers = None
    runner = candidates.local_runner(asked["device"], wl, asked["flush"], asked["timeout_s"],
                                     workers)
    builder = _started.pop("builder", None) or _server_builder()
    builder.on_built = candidates.built_candidates_to(runner)
    builder.start(target)
    _searching.update(asked=asked, builder=builder, runner=runner, target=target, workload=wl,
                      device=candidates.measuring_device(runner))


def _build_times(seconds: list[float]) -> str:
    """A chunk's builds, as its log line says them: the slowest (which the chunk waits for)
    and the mean."""
    if not seconds:
        return "none"
    return f"slowest {max(seconds):.1f} s, mean {sum(seconds) / len(seconds):.1f} s"


def _serve_in_process(sock, addr, opts, load_library) -> None:
    """Serve one session in a thread of this process (in place of TVM's `_serving`, which forks
    a process per session and stops the server for good when that process fails), once fewer
    than SESSIONS are served: TVM's listen loop then registers the server again, so the tracker
    can hand it the next chunk while it still builds this one. A session only calls
    _build_and_evaluate, whose workers keep kernels out of this process; its runner measures
    one candidate at a time, whichever session sent it."""
    _sessions.acquire()
    threading.Thread(target=_serve_session, args=(sock, addr, load_library),
                     daemon=True).start()


def _serve_session(sock, addr, load_library) -> None:
    """One session, to its end (a client that went away mid-session ends only its own)."""
    work = server.utils.tempdir()
    try:
        server._server_env(load_library, work)
        server._ffi_api.ServerLoop(sock.detach())  # which closes the connection
    except Exception as e:  # noqa: BLE001  a client that went away: serve the others
        say_here(f"session from {addr[0]} ended: {candidates.error_summary(str(e))}")
    finally:
        work.remove()
        _sessions.release()


def serve(tracker: str, key: str, host: str, functions: dict[str, Callable] | None = None
          ) -> None:
    """Register with the tracker under `key` and serve sessions for ever: their remote
    function is BUILD_AND_EVALUATE, or one of `functions` (by name) that the farm's entry
    point (tvm_explorer/farm.py) adds for the packages above this one."""
    tracker_host, tracker_port = candidates.parse_tracker(tracker)
    for name, function in {BUILD_AND_EVALUATE: _build_and_evaluate, **(functions or {})}.items():
        tvm.register_global_func(name, function, override=True)
    server._serving = _serve_in_process
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    _start_workers()
    say_here(f"serving on port {port}, pid {os.getpid()}")
    server._listen_loop(sock, port, key, (tracker_host, tracker_port), None, None)


def say_here(line: str) -> None:
    """One line of this server's log, written whole (its sessions' threads say at once), with
    the server's name (FARM_SERVER)."""
    sys.stderr.write(f"[{os.environ.get('FARM_SERVER', 'server')}] {line}\n")
    sys.stderr.flush()


# -- a search's side: candidates built and measured on every server at once -----------------------


@derived_object
class FarmBuilder(ms.builder.PyBuilder):
    """A farm search's builder, which builds nothing here: each candidate's module is written
    as TVM's JSON, the 'artifact' a FarmRunner sends to a server, which builds it on its own
    host's cores and measures it there. So a farm's builds grow with its hosts; built on the
    search's host, they kept a second GPU from speeding a search up."""

    pool = None  # no workers of its own (candidates.shut_down)

    def start(self, target: tvm.target.Target) -> None:
        """Nothing to start here: each server starts its build workers at its first chunk."""

    def build(self, build_inputs):
        """MetaSchedule's interface: each candidate's module file as its artifact."""
        return [ms.builder.BuilderResult(path, None) for path in self.artifacts(build_inputs)]

    def artifacts(self, build_inputs) -> list[str]:
        """Each candidate's module as TVM's JSON, in a fresh directory of its own (which
        candidates.measure_modules removes once the candidate has run)."""
        paths = []
        for b in build_inputs:
            path = os.path.join(tempfile.mkdtemp(prefix="farm-candidate-"), "module.json")
            with open(path, "w") as f:
                f.write(tvm.ir.save_json(b.mod))
            paths.append(path)
        return paths


@derived_object
class _FarmFuture(ms.runner.PyRunnerFuture):
    """One candidate measured on the farm, as MetaSchedule asks for it."""

    def __init__(self, future):
        super().__init__()
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def result(self):
        return candidates.runner_result(self.future.result())


def _parts(chunk: Future, count: int) -> list[Future]:
    """A future per candidate of a chunk's future (which gives their Outcomes in order)."""
    parts = [Future() for _ in range(count)]

    def settle(done: Future) -> None:
        error = done.exception()
        for n, part in enumerate(parts):
            if error is None:
                part.set_result(done.result()[n])
            else:
                part.set_exception(error)

    chunk.add_done_callback(settle)
    return parts


class Unreached(Exception):
    """No server could be reached for a request (CONNECT_TRIES tries), with the reason."""


class ServersLost(Exception):
    """LOST_TRIES servers went away (or hung) with one request; the last one's reason."""


class Abandoned(Exception):
    """The caller abandoned a request before its server answered (FarmClient.abandon)."""


class FarmClient:
    """The servers registered with a tracker under a key, as a caller sees them: each request
    (`call`, on a thread of the caller's) goes to the first free server the tracker hands out.
    A server that goes away with it, or gives no answer within the caller's bound (a host that
    hangs rather than dies), costs that try only: one line to `say`, and the request goes to
    the next free server, up to LOST_TRIES times; a server that hung is handed nothing again.
    While a request waits for a server, it asks every POLL_S whether any is left; after
    `gone_after_s` with none (or with no tracker), it raises FarmGone, and so does every request
    after it; what ended the caller's work is kept as `stopped_by`. A search's chunks
    (FarmRunner) and a model's linear layers (linear/farm.py) share it."""

    gone = "the RPC farm has gone ({why})"  # FarmGone's message

    def __init__(self, tracker: str, key: str, *, gone_after_s: float = GONE_AFTER_S,
                 say: Callable[[str], None] | None = None):
        self.tracker, self.key, self.gone_after_s = tracker, key, gone_after_s
        self.hung: set[str] = set()  # servers (host:port) that gave a request no answer
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stopped_by: ExplorerError | None = None
        self.abandoning = threading.Event()  # set by abandon: every waiting call raises
        self.servers = candidates.check_rpc(tracker, key)

    def abandon(self) -> None:
        """Stop waiting for the servers: every call waiting for one, or for its answer, raises
        Abandoned within POLL_S (a second Ctrl-C: the servers' work on them is lost)."""
        self.abandoning.set()

    def call(self, function: str, request: str, lost_after: float, held: str,
             then: tuple[str, str]) -> str:
        """The reply of the remote `function` to `request` from the first free server. Each
        server lost with it says so in a line naming what it `held` and what becomes of it:
        then[0] (it goes to the next free server), or after the last of LOST_TRIES then[1],
        and ServersLost. Unreached where no server could be reached; FarmGone where the farm
        has gone; UsageError where its servers are not this project's; Abandoned where the
        caller abandoned it (abandon)."""
        why = ""
        for attempt in range(1, LOST_TRIES + 1):
            try:
                return self._answer(function, request, lost_after)
            except (ExplorerError, Unreached, Abandoned):  # farm gone or not ours; none; abandoned
                raise
            except Exception as e:  # noqa: BLE001  the server (or its host) went away or hung
                why = candidates.error_summary(str(e))
                self.say(f"farm: a server went away with {held} ({why}); "
                         f"{then[attempt == LOST_TRIES]}")
        raise ServersLost(why)

    def _answer(self, function: str, request: str, lost_after: float) -> str:
        """The first free server's reply to `request`, asked in a thread of its own: a server
        that gives no answer within `lost_after` seconds of being handed it raises
        TimeoutError, and is never handed a request again (its thread is left to wait)."""
        done, box = threading.Event(), {"chosen": threading.Event()}

        def ask() -> None:
            try:
                box["answer"] = self._remote_function(box, function)(request)
            except BaseException as e:  # noqa: BLE001  the caller's to raise
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=ask, daemon=True).start()
        while not (box["chosen"].wait(POLL_S) or done.is_set()):
            self._still_waited_for()  # no free server yet (_none_since ends a farm gone)
        answer_by = time.monotonic() + lost_after
        while not done.wait(max(0.0, min(POLL_S, answer_by - time.monotonic()))):
            self._still_waited_for()
            if time.monotonic() >= answer_by:
                self.hung.add(box.get("server"))
                raise TimeoutError(f"no answer from {box.get('server', 'a server')} in "
                                   f"{lost_after:.0f} s")
        if "error" in box:
            raise box["error"]
        return box["answer"]

    def _still_waited_for(self) -> None:
        """Abandoned, where the caller has abandoned its requests (abandon)."""
        if self.abandoning.is_set():
            raise Abandoned("the caller abandoned the request before its server answered")

    def _remote_function(self, box: dict, function: str):
        """The remote `function` of the first free server; Unreached where none could be
        reached in CONNECT_TRIES tries."""
        for attempt in range(CONNECT_TRIES):
            try:
                session = self._session(box)
                break
            except (OSError, RuntimeError) as e:  # the server went before we reached it
                if attempt == CONNECT_TRIES - 1:
                    raise Unreached(candidates.error_summary(
                        f"no RPC server reached in {CONNECT_TRIES} tries: {e}")) from None
        try:
            return session.get_function(function)
        except Exception:  # noqa: BLE001  TVM's own server, or an older farm's
            self._stop(UsageError(f"the RPC servers under key '{self.key}' are not this "
                                  "project's farm servers: start them with scripts/rpc-farm.sh"))

    def _session(self, box: dict):
        """A session with a free server, once the tracker hands out one that has not hung
        (its address kept in `box`)."""
        while True:
            url, server_port, match_key = self._free_server()
            if f"{url}:{server_port}" not in self.hung:
                box["server"] = f"{url}:{server_port}"
                box["chosen"].set()
                return rpc.connect(url, server_port, match_key)
            time.sleep(POLL_S)  # a hung server handed out again: ask again, not at once

    def _free_server(self) -> tuple:
        """(address, port, match key) of the next server the tracker hands out."""
        host, port = candidates.parse_tracker(self.tracker)
        try:
            sock = candidates.tracker_socket(host, port, candidates.TRACKER_TIMEOUT_S)
        except UsageError as e:
            self._farm_gone(str(e))
        with sock:
            base.sendjson(sock, [base.TrackerCode.REQUEST, self.key, "", 1])
            none_since = None
            while not select.select([sock], [], [], POLL_S)[0]:
                none_since = self._none_since(none_since)
            code, value = base.recvjson(sock)
        if code != base.TrackerCode.SUCCESS:
            raise RuntimeError(f"the tracker answered a request with code {code}")
        return tuple(value)

    def _none_since(self, since: float | None) -> float | None:
        """While waiting for a server: since when none has been under the key but those that
        hung (None: one that has not is); FarmGone once that has lasted gone_after_s, or when
        the tracker is gone. A hung server stays registered, busy with the request it never
        answered: counted, it would keep the caller waiting for ever."""
        if self.stopped_by:
            raise self.stopped_by
        try:
            servers = candidates.servers_now(self.tracker, self.key)
        except UsageError as e:
            self._farm_gone(str(e))
        if servers > len(self.hung):
            return None
        since = since or time.monotonic()
        if time.monotonic() - since >= self.gone_after_s:
            hung = f" but {servers} that gave a request no answer" if servers else ""
            self._farm_gone(f"no RPC server under key '{self.key}' with the tracker at "
                            f"{self.tracker}{hung} for {self.gone_after_s:g} s")
        return since

    def _farm_gone(self, why: str):
        self._stop(FarmGone(self.gone.format(why=why)))

    def _stop(self, error: ExplorerError):
        self.stopped_by = error
        raise error


@derived_object
class FarmRunner(ms.runner.PyRunner, FarmClient):
    """Builds and measures a search's candidates (a FarmBuilder's module files) on a farm's
    servers (FarmClient): each batch is split into SESSIONS chunks per server (one that finishes
    early takes the next chunk, so a batch waits less for its slowest server), and each chunk,
    on a thread of its own, goes to a free server with the modules (or a template's
    configurations: measure_configs) and gets their Outcomes back; a chunk that LOST_TRIES
    servers lost counts as run_failed. What ended the search is kept as `stopped_by`:
    MetaSchedule hands an error raised in a runner back as another one.
    `servers_device` is the GPU (or CPU) the servers measure on, as their replies name it: one
    search's times are all from one kind, so a server that names another one ends the search."""

    sessions = SESSIONS  # batches a search keeps in flight on the farm (autotvm.tune)
    gone = ("the search's RPC farm has gone ({why}); the batches measured before this one are "
            "kept: start the farm again and run the same command to resume")

    def __init__(self, tracker: str, key: str, wl: Workload, target: tvm.target.Target, *,
                 flush: str = "read", timeout_sec: float = candidates.RUN_TIMEOUT_S,
                 gone_after_s: float = GONE_AFTER_S, say: Callable[[str], None] | None = None,
                 lost_after_s: float | None = None):
        FarmClient.__init__(self, tracker, key, gone_after_s=gone_after_s, say=say)
        self.lost_after_s = lost_after_s  # None: lost_after's bound for the chunk
        self.device = candidates.device_of(target)  # where the servers run a template's chunks
        self.request = {"workload": dataclasses.asdict(wl), "target": tvm.ir.save_json(target),
                        "flush": flush, "timeout_s": timeout_sec}
        self.servers_device: dict | None = None
        self.pool = ThreadPoolExecutor(max_workers=self.servers * SESSIONS)

    def run(self, runner_inputs):
        """MetaSchedule's interface: a future per candidate, all of them measured at once."""
        return [_FarmFuture(part) for part in self._submit(list(runner_inputs))]

    def outcomes(self, runner_inputs) -> list[Outcome]:
        """Each candidate's Outcome (candidates.outcomes_of)."""
        return [part.result() for part in self._submit(list(runner_inputs))]

    def measure_configs(self, schedule: str, configs: list[dict]) -> list[Outcome]:
        """A template search's batch: each configuration of `schedule` applied, built and
        measured on the servers (in SESSIONS chunks per server), so that the search's host only
        proposes them: applied here, one after another, they would hold back every server."""
        return [part.result() for part in self._submit(configs, lambda chunk: self.measure_chunk(
            {"device": self.device, "schedule": schedule, "configs": chunk}, len(chunk)))]

    def _submit(self, items: list, measure: Callable | None = None) -> list[Future]:
        """A future per candidate: `items` (runner inputs, or what `measure` takes) split into
        SESSIONS chunks per server, each measured on a thread of its own."""
        size = max(1, -(-len(items) // (self.servers * SESSIONS)))
        parts = []
        for at in range(0, len(items), size):
            chunk = items[at:at + size]
            parts += _parts(self.pool.submit(measure or self.measure, chunk), len(chunk))
        return parts

    def measure(self, runner_inputs: list) -> list[Outcome]:
        """A chunk of built candidates (their module files), measured by measure_chunk."""
        modules = []
        for runner_input in runner_inputs:
            with open(runner_input.artifact_path) as f:
                modules.append(f.read())
        return self.measure_chunk({"device": runner_inputs[0].device_type, "modules": modules},
                                  len(runner_inputs))

    def measure_chunk(self, chunk: dict, count: int) -> list[Outcome]:
        """A chunk of `count` candidates (`chunk`: the device, and their modules or their
        template's configurations), built and measured on the first free server (FarmClient.
        call); where no server could be reached, or LOST_TRIES servers lost it, each of its
        candidates is run_failed."""
        them = f"{count} candidate{'s' * (count > 1)}"
        try:
            answer = self.call(BUILD_AND_EVALUATE, json.dumps({**self.request, **chunk}),
                               self.lost_after(count), them,
                               ("they go to the next free server",
                                f"{LOST_TRIES} servers lost them: they count as run_failed"))
        except Unreached as e:
            return [Outcome(Status.RUN_FAILED, error=str(e))] * count
        except ServersLost as e:
            return [Outcome(Status.RUN_FAILED, error=f"{LOST_TRIES} RPC servers went away while "
                            f"building and measuring it; the last: {e}"[:300])] * count
        reply = json.loads(answer)
        self.measured_on(reply["device"])
        return [Outcome(Status(o["status"]), o["time_ms"], o["error"])
                for o in reply["outcomes"]]

    def lost_after(self, count: int) -> float:
        """How long a chunk of `count` candidates may take before its server counts as lost
        (a host that hangs rather than dies): its setup, then every build and run at its
        timeout, one after another, its other session's chunk too."""
        if self.lost_after_s is not None:
            return self.lost_after_s
        return SETUP_S + SESSIONS * count * (candidates.BUILD_TIMEOUT_S + self.request["timeout_s"])

    def measured_on(self, device: dict) -> None:
        """Note the device a server measured on: the first one is the search's; another kind
        ends the search (UsageError), whose records would mix two kinds of GPU."""
        if self.servers_device is None:
            self.servers_device = device
        elif device["gpu"] != self.servers_device["gpu"]:
            self._stop(UsageError(
                f"the RPC servers under key '{self.key}' measure on different devices "
                f"({self.servers_device['gpu']} and {device['gpu']}): one search's times must "
                "come from one kind of GPU; give each kind its own key"))


# -- the farm: a tracker and a server per GPU, kept running --------------------------------------


def gpus_here() -> list[str]:
    """The GPUs this process may use: those CUDA_VISIBLE_DEVICES names where it is set (a farm
    started under it serves those alone; nvidia-smi lists every GPU whatever it says), else
    every GPU of this host, as nvidia-smi numbers them."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        visible = [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
        if not visible:
            raise UsageError("no GPU is visible here: CUDA_VISIBLE_DEVICES is empty")
        return visible
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        listed = None
    if listed is None or listed.returncode != 0 or not listed.stdout.split():
        raise UsageError("no GPU found here (nvidia-smi lists none); --gpus names them, or "
                         "--servers N starts N servers that pin no GPU (for CPU targets)")
    return listed.stdout.split()


class Farm:
    """The server processes of this host, one per GPU (pinned with CUDA_VISIBLE_DEVICES) or
    `count` unpinned ones, each restarted when it exits; each builds its candidates on its share
    of the host's cores. Each runs `python -m <entry> --serve`: the farm's entry point, which
    registers its remote functions (serve)."""

    def __init__(self, tracker: str, key: str, host: str, gpus: list[str] | None, count: int,
                 entry: str):
        self.tracker, self.key, self.host, self.entry = tracker, key, host, entry
        self.names = ([f"gpu{g}" + (f".{gpus[:i].count(g)}" if gpus.count(g) > 1 else "")
                       for i, g in enumerate(gpus)] if gpus else
                      [f"cpu{i}" for i in range(count)])  # gpu0.0, gpu0.1: two on GPU 0
        self.gpus = gpus
        self.procs: list[subprocess.Popen | None] = [None] * len(self.names)

    def start(self, i: int) -> None:
        env = {**os.environ, "FARM_SERVER": self.names[i],
               candidates.BUILD_WORKERS_VARIABLE:
                   str(max(1, candidates.usable_cpus() // len(self.names)))}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[i]
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", self.entry, "--serve", "--tracker", self.tracker,
             "--key", self.key, "--host", self.host], env=env, start_new_session=True)

    def keep_up(self) -> None:
        """Start every server that is not running (all of them, the first time); one that
        exited has its worker processes ended first (_end_group)."""
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                continue
            if proc is not None:
                print(f"farm: server {self.names[i]} exited with status {proc.returncode}; "
                      "restarting it", file=sys.stderr, flush=True)
                _end_group(proc)
            self.start(i)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                _end_group(proc)


def _end_group(proc: subprocess.Popen) -> None:
    """End a server and every process it started (its session's group): a server killed
    outright leaves its workers behind, waiting for work that never comes (a multiprocessing
    worker holds both ends of its own queue, so it never sees its server go), with the memory,
    on a GPU the device memory, they hold."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the server and all it started have ended
        pass
    proc.wait()


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/rpc-farm.sh", description="Start a tracker (unless --tracker names one "
        "to join) and one RPC server per GPU of this host, each restarted when it exits; "
        "searches measure on them with --rpc-tracker HOST:PORT --rpc-key KEY.")
    p.add_argument("--key", required=True, help="the key the servers register under")
    p.add_argument("--tracker", metavar="HOST:PORT", help="join this tracker instead of "
                   "starting one (the farm's other hosts)")
    p.add_argument("--port", type=int, default=TRACKER_PORT, help="the tracker's port, when "
                   f"this host starts it (default {TRACKER_PORT})")
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on (default: all; "
                   "127.0.0.1 keeps the farm to this host)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--gpus", help="the GPUs to serve, as nvidia-smi numbers them "
                       "(default: all, or those CUDA_VISIBLE_DEVICES names)")
    which.add_argument("--servers", type=int, help="start this many servers that pin no GPU "
                       "(for CPU targets)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # one server
    return p.parse_args(argv)


def _checked(args: argparse.Namespace) -> None:
    if not args.key.strip() or any(c.isspace() for c in args.key):
        raise UsageError(f"--key '{args.key}' must be one word")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a port (1-65535)")
    if args.servers is not None and args.servers <= 0:
        raise UsageError(f"--servers must be positive, not {args.servers}")
    if args.tracker:
        host, port = candidates.parse_tracker(args.tracker)
        candidates.tracker_socket(host, port, candidates.TRACKER_TIMEOUT_S).close()
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # as the tracker will bind
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, args.port))
        except OSError as e:
            raise UsageError(f"cannot start a tracker on {args.host}:{args.port}: "
                             f"{e.strerror or e}; pick another --port, or join the tracker "
                             "there with --tracker HOST:PORT") from None


def _wait_until_registered(tracker: str, key: str, count: int) -> int:
    """How many of the farm's `count` servers have registered, waiting up to READY_WITHIN_S."""
    deadline = time.monotonic() + READY_WITHIN_S
    while True:
        servers = candidates.servers_now(tracker, key)
        if servers >= count or time.monotonic() > deadline:
            return servers
        time.sleep(0.5)


def run_farm(args: argparse.Namespace, entry: str) -> None:
    """Start the farm (its servers run `python -m <entry> --serve`) and keep it up until SIGINT
    or SIGTERM."""
    _checked(args)
    gpus = None if args.servers else (args.gpus.split(",") if args.gpus else gpus_here())
    tracker = None
    if not args.tracker:
        tracker = Tracker(args.host, port=args.port, port_end=args.port + 1, silent=True)
    address = args.tracker or f"{'127.0.0.1' if args.host == '0.0.0.0' else args.host}:{args.port}"
    farm = Farm(address, args.key, args.host, gpus, args.servers or 0, entry)
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(True))
    try:
        farm.keep_up()
        registered = _wait_until_registered(address, args.key, len(farm.names))
        reachable = (address if args.tracker or args.host != "0.0.0.0"
                     else f"{socket.gethostname()}:{args.port}")
        print(f"farm ready: {len(farm.names)} server{'s' * (len(farm.names) > 1)} "
              f"({', '.join(farm.names)}), "
              f"{registered} under key '{args.key}' with the tracker at {address}; search "
              f"with --rpc-tracker {reachable} --rpc-key {args.key}", flush=True)
        while not stopping:
            farm.keep_up()
            time.sleep(0.5)
    finally:
        farm.stop()
        if tracker is not None:
            tracker.terminate()
    print("farm stopped", flush=True)


def main(argv: list[str] | None, entry: str,
         functions: Callable[[], dict[str, Callable]] | None = None) -> int:
    """The farm's command line, run by its entry point `entry` (a module run with `python -m`,
    which each server runs again with --serve): a server serves BUILD_AND_EVALUATE and the
    remote functions `functions()` makes (called in servers only). The exit status."""
    args = _arguments(argv)
    try:
        if args.serve:
            serve(args.tracker, args.key, args.host, functions() if functions else None)
        else:
            run_farm(args, entry)
    except ExplorerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    return 0
