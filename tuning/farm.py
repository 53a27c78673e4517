"""A farm of GPUs for searches: one RPC server per GPU behind TVM's RPC tracker, and the runner
that measures a search's candidates on all of them at once.

    scripts/rpc-farm.sh --key h200                          # this host: a tracker, a server per GPU
    scripts/rpc-farm.sh --key h200 --tracker host1:9190     # another host: its servers join host1's
    python runner.py --tune metaschedule --rpc-tracker host1:9190 --rpc-key h200 ...

Why not TVM's own `tvm.exec.rpc_server` (tried on the two-H200 host, issue 25): it serves each
session in a forked process, in which every candidate failed with cudaErrorInitializationError;
with `--no-fork`, a candidate whose kernel faulted ended the session's process with a non-zero
status, which TVM's listen loop raises out of: the server stayed registered with the tracker,
served no more, and the search waited on it until killed.

A farm server (`serve`) serves sessions in its own process, which never touches the GPU, and
measures each candidate with the runner a search on that host would use
(candidates.local_runner): on CUDA, a worker process that checks the candidate against float64
and times it with this project's harness, replaced after a crash or a timeout. So a faulting or
hanging kernel costs its candidate only, and records from the farm are checked like local ones.
The farm (`main`) restarts a server process that exits all the same. A search's FarmRunner
measures on every server under its key at once and ends the search with FarmGone, rather than
waiting, when the tracker or every server under the key has gone.
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
import time
from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm import rpc
from tvm.ir.utils import derived_object
from tvm.rpc import base, server
from tvm.rpc.tracker import Tracker
from tvm.s_tir import meta_schedule as ms

from schedules.errors import ExplorerError, FarmGone, UsageError
from schedules.workloads import Workload

from . import candidates
from .candidates import Outcome, Status

EVALUATE = "explorer.farm.evaluate"  # the servers' remote function (see _evaluate)
TRACKER_PORT = 9190
GONE_AFTER_S = 30.0  # no server under the key for this long: the farm has gone (a restart takes seconds)
POLL_S = 1.0  # how often a candidate waiting for a server asks whether any is left
CONNECT_TRIES = 3  # a server the tracker handed out may go away before the candidate reaches it
READY_WITHIN_S = 120.0  # the farm waits this long for its servers to register, then says how many did


# -- a server: measures the candidates sent to it ------------------------------------------------

_measuring: dict = {}  # the server's runner: {"asked": what it measures, "runner": the runner}


def _evaluate(artifact: bytearray, request: str) -> str:
    """The servers' remote function: one candidate (its artifact's bytes; `request`, JSON of its
    device, workload, flush, run timeout and arguments), measured by local_runner on this
    host. Returns the candidate's Outcome as JSON, with the device that measured it
    (candidates.measuring_device)."""
    asked = json.loads(request)
    args_info = asked.pop("args_info")
    if _measuring.get("asked") != asked:  # a new search: its runner replaces the last one's
        candidates.shut_down(_measuring.get("runner"))
        wl = Workload(**{**asked["workload"], "shape": tuple(asked["workload"]["shape"])})
        runner = candidates.local_runner(asked["device"], wl, asked["flush"], asked["timeout_s"])
        _measuring.update(asked=asked, runner=runner, device=candidates.measuring_device(runner))
    with tempfile.TemporaryDirectory(prefix="farm-") as work:
        path = os.path.join(work, "candidate.tar")
        with open(path, "wb") as f:
            f.write(bytes(artifact))
        runner_input = ms.runner.RunnerInput(path, asked["device"],
                                             [ms.arg_info.ArgInfo.from_json(a) for a in args_info])
        outcome = candidates.outcomes_of(_measuring["runner"], [runner_input])[0]
    time_ms = f" {outcome.time_ms:.4f} ms" if outcome.time_ms is not None else ""
    _say(f"{outcome.status}{time_ms}{f': {outcome.error}' if outcome.error else ''}")
    return json.dumps({**dataclasses.asdict(outcome), "device": _measuring["device"]})


def _serve_in_process(sock, addr, opts, load_library) -> None:
    """Serve one session in this process (in place of TVM's `_serving`, which forks a process
    per session and stops the server for good when that process fails). The session only
    uploads bytes and calls _evaluate, whose runner keeps kernels out of this process."""
    work = server.utils.tempdir()
    try:
        server._server_env(load_library, work)
        server._ffi_api.ServerLoop(sock.detach())  # which closes the connection
    except Exception as e:  # a client that went away mid-session: serve the next one
        _say(f"session from {addr[0]} ended: {candidates.error_summary(str(e))}")
    finally:
        work.remove()


def serve(tracker: str, key: str, host: str) -> None:
    """Register with the tracker under `key` and serve sessions, one at a time, for ever."""
    tracker_host, tracker_port = candidates.parse_tracker(tracker)
    tvm.register_global_func(EVALUATE, _evaluate, override=True)
    server._serving = _serve_in_process
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    _say(f"serving on port {port}, pid {os.getpid()}")
    server._listen_loop(sock, port, key, (tracker_host, tracker_port), None, None)


def _say(line: str) -> None:
    print(f"[{os.environ.get('FARM_SERVER', 'server')}] {line}", file=sys.stderr, flush=True)


# -- a search's side: candidates measured on every server at once ---------------------------------


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


@derived_object
class FarmRunner(ms.runner.PyRunner):
    """Measures candidates on the servers registered with a tracker under a key, a thread per
    server: each candidate asks the tracker for a free server, sends it the artifact, and gets
    its Outcome back. While it waits, it asks every POLL_S whether any server is left; after
    `gone_after_s` with none (or with no tracker), it raises FarmGone, and so does every
    candidate after it. What ended the search is kept as `stopped_by`: MetaSchedule hands an
    error raised in a runner back as another one.
    `servers_device` is the GPU (or CPU) the servers measure on, as their replies name it: one
    search's times are all from one kind, so a server that names another one ends the search."""

    def __init__(self, tracker: str, key: str, wl: Workload, flush: str = "read",
                 timeout_sec: float = candidates.RUN_TIMEOUT_S,
                 gone_after_s: float = GONE_AFTER_S):
        super().__init__()
        self.tracker, self.key, self.gone_after_s = tracker, key, gone_after_s
        self.request = {"workload": dataclasses.asdict(wl), "flush": flush,
                        "timeout_s": timeout_sec}
        self.stopped_by: ExplorerError | None = None
        self.servers_device: dict | None = None
        self.pool = ThreadPoolExecutor(max_workers=candidates.check_rpc(tracker, key))

    def run(self, runner_inputs):
        """MetaSchedule's interface: a future per candidate, all of them measured at once."""
        return [_FarmFuture(self.pool.submit(self.measure, i)) for i in runner_inputs]

    def outcomes(self, runner_inputs) -> list[Outcome]:
        """Each candidate's Outcome (candidates.outcomes_of)."""
        return [future.result() for future in
                [self.pool.submit(self.measure, i) for i in runner_inputs]]

    def measure(self, runner_input) -> Outcome:
        """One candidate, measured on the first free server: a server that goes away before the
        candidate reaches it is passed over; one that goes away while measuring it costs it
        (run_failed)."""
        with open(runner_input.artifact_path, "rb") as f:
            artifact = bytearray(f.read())
        request = json.dumps({**self.request, "device": runner_input.device_type,
                              "args_info": [a.as_json() for a in runner_input.args_info]},
                             default=int)
        for attempt in range(CONNECT_TRIES):
            try:
                session = self._session()
                break
            except (OSError, RuntimeError) as e:  # the server went before we reached it
                if attempt == CONNECT_TRIES - 1:
                    return Outcome(Status.RUN_FAILED, error=candidates.error_summary(
                        f"no RPC server reached in {CONNECT_TRIES} tries: {e}"))
        try:
            evaluate = session.get_function(EVALUATE)
        except Exception:
            self._stop(UsageError(f"the RPC servers under key '{self.key}' are not this "
                                  "project's farm servers: start them with scripts/rpc-farm.sh"))
        try:
            reply = json.loads(evaluate(artifact, request))
        except Exception as e:
            return Outcome(Status.RUN_FAILED, error=candidates.error_summary(
                f"the RPC server went away while measuring: {e}"))
        self.measured_on(reply["device"])
        return Outcome(Status(reply["status"]), reply["time_ms"], reply["error"])

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

    def _session(self):
        """A session with a free server, once the tracker hands one out."""
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
        url, server_port, match_key = value
        return rpc.connect(url, server_port, match_key)

    def _none_since(self, since: float | None) -> float | None:
        """While waiting for a server: since when none has been under the key (None: one is);
        FarmGone once that has lasted gone_after_s, or when the tracker is gone."""
        if self.stopped_by:
            raise self.stopped_by
        try:
            servers = candidates.servers_now(self.tracker, self.key)
        except UsageError as e:
            self._farm_gone(str(e))
        if servers:
            return None
        since = since or time.monotonic()
        if time.monotonic() - since >= self.gone_after_s:
            self._farm_gone(f"no RPC server under key '{self.key}' with the tracker at "
                            f"{self.tracker} for {self.gone_after_s:g} s")
        return since

    def _farm_gone(self, why: str):
        self._stop(FarmGone(f"the search's RPC farm has gone ({why}); the batches measured "
                            "before this one are kept: start the farm again and run the same "
                            "command to resume"))

    def _stop(self, error: ExplorerError):
        self.stopped_by = error
        raise error


# -- the farm: a tracker and a server per GPU, kept running --------------------------------------


def gpus_here() -> list[str]:
    """This host's GPUs, as nvidia-smi numbers them."""
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
    `count` unpinned ones, each restarted when it exits."""

    def __init__(self, tracker: str, key: str, host: str, gpus: list[str] | None, count: int):
        self.tracker, self.key, self.host = tracker, key, host
        self.names = ([f"gpu{g}" + (f".{gpus[:i].count(g)}" if gpus.count(g) > 1 else "")
                       for i, g in enumerate(gpus)] if gpus else
                      [f"cpu{i}" for i in range(count)])  # gpu0.0, gpu0.1: two on GPU 0
        self.gpus = gpus
        self.procs: list[subprocess.Popen | None] = [None] * len(self.names)

    def start(self, i: int) -> None:
        env = {**os.environ, "FARM_SERVER": self.names[i]}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[i]
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "tuning.farm", "--serve", "--tracker", self.tracker,
             "--key", self.key, "--host", self.host], env=env, start_new_session=True)

    def keep_up(self) -> None:
        """Start every server that is not running (all of them, the first time)."""
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                continue
            if proc is not None:
                print(f"farm: server {self.names[i]} exited with status {proc.returncode}; "
                      "restarting it", file=sys.stderr, flush=True)
            self.start(i)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
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
                       "(default: all)")
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


def run_farm(args: argparse.Namespace) -> None:
    """Start the farm and keep it up until SIGINT or SIGTERM."""
    _checked(args)
    gpus = None if args.servers else (args.gpus.split(",") if args.gpus else gpus_here())
    tracker = None
    if not args.tracker:
        tracker = Tracker(args.host, port=args.port, port_end=args.port + 1, silent=True)
    address = args.tracker or f"{'127.0.0.1' if args.host == '0.0.0.0' else args.host}:{args.port}"
    farm = Farm(address, args.key, args.host, gpus, args.servers or 0)
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


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        if args.serve:
            serve(args.tracker, args.key, args.host)
        else:
            run_farm(args)
    except ExplorerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    return 0


if __name__ == "__main__":
    sys.exit(main())
