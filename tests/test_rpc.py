"""Searches through an RPC tracker, on loopback: a tracker that is down or a key no server
registered is refused in seconds with one line (no hang, no retries, no traceback), and a
remote failure keeps the remote reason, not TVM's wrapper line. The farm (scripts/rpc-farm.sh):
a search measures on all its servers; a candidate that crashes or hangs costs itself only; a
server that dies is restarted; a farm that goes away ends the search in one line (CPU servers,
and in the GPU tier two servers on GPU 0 with a kernel that traps and one that never ends).
Every tracker, server and farm is started here and stopped in `finally`; every command runs
under a time limit."""

import contextlib
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import tvm
from farm_stop import stop_farm

from schedules.errors import FarmGone, UsageError
from schedules.workloads import Workload
from tuning import candidates
from tuning import farm as farms
from tuning.candidates import Outcome, Status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_LIMIT_S = 90  # a command still running after this is killed and the test fails
REFUSED_WITHIN_S = 20  # what a refusal may take, Python's and TVM's imports included
LLVM = tvm.target.Target("llvm")


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick, released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(args, cwd):
    """runner.py in its own process group, killed whole if it runs past CLI_LIMIT_S;
    returns (exit status, stdout, stderr, seconds)."""
    start = time.time()
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "runner.py"), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CLI_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"runner.py {' '.join(args)} still running after {CLI_LIMIT_S} s; "
                    f"stderr ends: {err[-1000:]}")
    return proc.returncode, out, err, time.time() - start


def assert_refused_in_one_line(status, out, err, seconds, *words):
    assert status == 2, (status, err[-2000:])
    assert seconds < REFUSED_WITHIN_S, f"took {seconds:.1f} s"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert "Traceback" not in out + err and "retry" not in out + err
    for word in words:
        assert word in lines[0], lines[0]


@contextlib.contextmanager
def tracker_with_a_server(key: str):
    """A tracker on loopback with one of TVM's servers registered under `key`; yields (the
    tracker's host:port, the server) once the server shows in its summary."""
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    port = free_port()
    tracker = Tracker("127.0.0.1", port=port, port_end=port + 100, silent=True)
    server = None
    try:
        server_port = free_port()
        server = Server(host="127.0.0.1", port=server_port, port_end=server_port + 100,
                        key=key, silent=True, tracker_addr=("127.0.0.1", tracker.port))
        deadline = time.time() + 30
        while _free_under(tracker.port, key) < 1:
            assert time.time() < deadline, "the server did not register with the tracker"
            time.sleep(0.2)
        yield f"127.0.0.1:{tracker.port}", server
    finally:
        if server is not None:
            server.terminate()
        tracker.terminate()


@pytest.fixture
def tracker_with_other_key():
    """A tracker with one server registered under the key 'other': its host:port."""
    with tracker_with_a_server("other") as (address, _):
        yield address


def _free_under(port: int, key: str) -> int:
    from tvm import rpc

    session = rpc.connect_tracker("127.0.0.1", port)
    try:
        return session.summary()["queue_info"].get(key, {}).get("free", 0)
    finally:
        session.close()


# -- the tracker, checked before the search ------------------------------------------------------


def test_check_rpc_refuses_a_tracker_that_is_down_within_seconds():
    port = free_port()
    start = time.time()
    with pytest.raises(UsageError) as refused:
        candidates.check_rpc(f"127.0.0.1:{port}", "gpu")
    assert time.time() - start < 10
    message = str(refused.value)
    assert f"cannot reach the RPC tracker at 127.0.0.1:{port}" in message
    assert "refused" in message and "tvm.exec.rpc_tracker" in message
    assert "\n" not in message


@pytest.mark.slow
def test_check_rpc_counts_free_servers_and_names_the_keys_the_tracker_has(
        tracker_with_other_key):
    assert candidates.check_rpc(tracker_with_other_key, "other") == 1
    start = time.time()
    with pytest.raises(UsageError) as refused:
        candidates.check_rpc(tracker_with_other_key, "nosuchkey")
    assert time.time() - start < 10
    message = str(refused.value)
    assert "no RPC server registered under key 'nosuchkey'" in message
    assert "keys there: other" in message and "\n" not in message
    # asking did not leave a request queued under the key (that would take the next server)
    assert _free_under(int(tracker_with_other_key.rpartition(":")[2]), "other") == 1


@pytest.mark.slow
def test_a_search_under_a_key_no_server_registered_is_refused_in_one_line(
        tmp_path, tracker_with_other_key):
    work_dir = tmp_path / "ms"
    status, out, err, seconds = run_cli(
        ["--tune", "metaschedule", "--target", "llvm", "--shape", "32x32x32", "--trials", "4",
         "--work-dir", str(work_dir), "--rpc-tracker", tracker_with_other_key,
         "--rpc-key", "nosuchkey"], tmp_path)
    assert_refused_in_one_line(status, out, err, seconds, "'nosuchkey'", "other")
    assert not work_dir.exists()


@pytest.mark.parametrize("search", [
    ["--tune", "metaschedule", "--target", "llvm", "--shape", "32x32x32", "--work-dir", "ms"],
    ["--tune", "autotvm:seed_template", "--tuner", "random", "--records", "at.jsonl"],
], ids=["metaschedule", "autotvm"])
def test_a_search_through_a_tracker_that_is_down_is_refused_in_one_line(tmp_path, search):
    port = free_port()
    status, out, err, seconds = run_cli(
        [*search, "--trials", "4", "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", "gpu"],
        tmp_path)
    assert_refused_in_one_line(status, out, err, seconds,
                               f"cannot reach the RPC tracker at 127.0.0.1:{port}")
    assert os.listdir(tmp_path) == []  # no work dir, no records file


# -- a candidate that fails on the remote host -----------------------------------------------------

# Remote errors as TVM's RPC hands them back, here in result.error_msg of TVM's RPCRunner, captured
# on loopback (tracker and server on 127.0.0.1, TVM 0.27): a CUDA candidate run by a server
# without CUDA; an llvm candidate whose artifact is not a tar; an llvm candidate called with
# arguments of the wrong shape.
RPC_NO_CUDA = (
    'RPCRunner: An exception occurred\nTraceback (most recent call last):\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/exec/popen_worker.py", line 106, in main\n    result = fn(*args, **kwargs)\n             ^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/s_tir/meta_schedule/runner/rpc_runner.py", line 393, in _worker_func\n    rt_mod: Module = f_upload_module(session, local_path, remote_path)\n                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/s_tir/meta_schedule/runner/rpc_runner.py", line 452, in default_upload_module\n    rt_mod: Module = session.load_module(remote_path)\n                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/rpc/client.py", line 180, in load_module\n    return _ffi_api.LoadRemoteModule(self._sess, path)\n           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File "python/tvm_ffi/cython/function.pxi", line 1038, in tvm_ffi.core.Function.__call__\n  File "/project/src/runtime/rpc/rpc_endpoint.cc", line 478, in void tvm::runtime::RPCEndpoint::EventHandler::HandleReturn(tvm::runtime::RPCCode, tvm::runtime::RPCSession::FEncodeReturn)\ntvm.error.RPCError: RPCError: Error caught from RPC call:\nLibrary binary was created using {cuda} but a loader of that name is not registered. Make sure to have runtime that registers ffi.Module.load_from_bytes.cuda\n'  # noqa: E501
)
RPC_NOT_A_TAR = (
    'RPCRunner: An exception occurred\nTraceback (most recent call last):\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/exec/popen_worker.py", line 106, in main\n    result = fn(*args, **kwargs)\n             ^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/s_tir/meta_schedule/runner/rpc_runner.py", line 393, in _worker_func\n    rt_mod: Module = f_upload_module(session, local_path, remote_path)\n                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/s_tir/meta_schedule/runner/rpc_runner.py", line 452, in default_upload_module\n    rt_mod: Module = session.load_module(remote_path)\n                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/rpc/client.py", line 180, in load_module\n    return _ffi_api.LoadRemoteModule(self._sess, path)\n           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File "python/tvm_ffi/cython/function.pxi", line 1038, in tvm_ffi.core.Function.__call__\n  File "/project/src/runtime/rpc/rpc_endpoint.cc", line 478, in void tvm::runtime::RPCEndpoint::EventHandler::HandleReturn(tvm::runtime::RPCCode, tvm::runtime::RPCSession::FEncodeReturn)\ntvm.error.RPCError: RPCError: Error caught from RPC call:\nTar error:\ntar: This does not look like a tar archive\ntar: Exiting with failure status due to previous errors\n\n'  # noqa: E501
)
RPC_WRONG_SHAPE = (
    'RPCRunner: An exception occurred\nTraceback (most recent call last):\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/exec/popen_worker.py", line 106, in main\n    result = fn(*args, **kwargs)\n             ^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/s_tir/meta_schedule/runner/rpc_runner.py", line 404, in _worker_func\n    costs: list[float] = f_run_evaluator(\n                         ^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/s_tir/meta_schedule/runner/rpc_runner.py", line 516, in default_run_evaluator\n    return run_evaluator_common(rt_mod, device, evaluator_config, repeated_args)\n           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/s_tir/meta_schedule/runner/utils.py", line 121, in run_evaluator_common\n    profile_result = evaluator(*args)\n                     ^^^^^^^^^^^^^^^^\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tvm/runtime/module.py", line 414, in evaluator\n    blob = feval(*args)\n           ^^^^^^^^^^^^\n  File "python/tvm_ffi/cython/function.pxi", line 1038, in tvm_ffi.core.Function.__call__\n  File "/project/src/runtime/rpc/rpc_endpoint.cc", line 478, in void tvm::runtime::RPCEndpoint::EventHandler::HandleReturn(tvm::runtime::RPCCode, tvm::runtime::RPCSession::FEncodeReturn)\ntvm.error.RPCError: RPCError: Error caught from RPC call:\nInvalid A.shape[0] on argument #0 when calling:\n  `main(A: Tensor([4], float32), B: Tensor([4], float32))`,\n  expected 4\n'  # noqa: E501
)


@pytest.mark.parametrize("message, summary", [
    (RPC_NO_CUDA, "RPCError: Library binary was created using {cuda} but a loader of that name "
                  "is not registered. Make sure to have runtime that registers "
                  "ffi.Module.load_from_bytes.cuda"),
    (RPC_NOT_A_TAR, "RPCError: Tar error: tar: This does not look like a tar archive; "
                    "tar: Exiting with failure status due to previous errors"),
    (RPC_WRONG_SHAPE, "RPCError: Invalid A.shape[0] on argument #0 when calling: "
                      "`main(A: Tensor([4], float32), B: Tensor([4], float32))`, expected 4"),
], ids=["no-cuda-loader", "not-a-tar", "wrong-shape"])
def test_a_remote_failure_keeps_the_remote_reason(message, summary):
    assert candidates.error_summary(message) == summary
    outcome = candidates.tvm_run_failure(message)
    assert outcome.status is Status.RUN_FAILED and outcome.error == summary


def test_a_cuda_error_is_summed_up_by_what_it_says_not_by_torchs_hints():
    message = ("run failed: CUDA error: misaligned address\nSearch for `cudaErrorMisalignedAddress' "
               "in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
               "information.\nCUDA kernel errors might be asynchronously reported at some other API "
               "call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
               "CUDA_LAUNCH_BLOCKING=1\n")
    assert candidates.error_summary(message) == "run failed: CUDA error: misaligned address"


def test_a_remote_reason_is_one_line_of_at_most_300_characters():
    remote_traceback = (
        "Traceback (most recent call last):\n"
        '  File "/remote/tvm/runtime/module.py", line 1, in load\n'
        "    raise ValueError(reason)\n"
        "    ^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "ValueError: " + "x" * 400 + "\n")
    wrapped = RPC_NO_CUDA.split("Library binary")[0] + remote_traceback
    summary = candidates.error_summary(wrapped)
    assert summary.startswith("RPCError: ValueError: xxx") and "\n" not in summary
    assert len(summary) <= 300


@pytest.mark.parametrize("message, error", [
    ("RPCRunner: Timeout, killed after 60 seconds", "RPCRunner: Timeout, killed after 60 seconds"),
    ("LocalRunner: Timeout, killed after 60 seconds\n",
     "LocalRunner: Timeout, killed after 60 seconds"),
], ids=["rpc-runner", "local-runner"])
def test_tvm_runners_timeouts_are_read_from_their_text(message, error):
    assert candidates.tvm_run_failure(message) == candidates.Outcome(Status.TIMEOUT, error=error)


# -- the farm (tuning/farm.py) on loopback, CPU servers --------------------------------------------

# the farm says it is ready once its servers registered or its own wait ran out: wait past that
FARM_READY_S = farms.READY_WITHIN_S + 30


@contextlib.contextmanager
def started_farm(log, *servers):
    """`scripts/rpc-farm.sh --key farm <servers...>` on loopback, its servers' lines to `log`:
    yields (tracker address, farm process) once it says it is ready; killed whole after."""
    port = free_port()
    with open(log, "w") as err:
        proc = subprocess.Popen(
            ["bash", os.path.join(ROOT, "scripts", "rpc-farm.sh"), "--key", "farm", *servers,
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    try:
        ready = _line_within(proc, "farm ready", FARM_READY_S)
        assert "2 under key 'farm'" in ready, ready
        yield f"127.0.0.1:{port}", proc
    finally:
        stop_farm(proc, log)


@pytest.fixture
def farm(tmp_path):
    """A farm of two CPU servers: (tracker address, farm process, its servers' log)."""
    log = tmp_path / "farm.log"
    with started_farm(log, "--servers", "2") as (address, proc):
        yield address, proc, log


def _line_within(proc, words: str, seconds: float) -> str:
    """The first line of proc's stdout holding `words`, read within `seconds`."""
    import selectors

    deadline = time.time() + seconds
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.time() < deadline:
            if sel.select(timeout=deadline - time.time()):
                line = proc.stdout.readline()
                if words in line:
                    return line
                assert line, f"ended without saying '{words}'"
    pytest.fail(f"no '{words}' within {seconds} s")


def _shipped(mod, target):
    """A candidate as a farm search sends it: its module file (farm.FarmBuilder)."""
    from tvm.s_tir import meta_schedule as ms

    (path,) = farms.FarmBuilder().artifacts([ms.builder.BuilderInput(mod, target)])
    return candidates.runner_input(mod, path, target)


def _llvm_candidate(kind: str):
    """An llvm candidate that adds one to a 4-vector: as it should ('good'), or ending the
    process that runs it ('crash', libc's abort) or never ending ('hang')."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def good(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            B[i] = A[i] + T.float32(1)

    @T.prim_func
    def crash(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        T.evaluate(T.call_extern("void", "abort"))
        for i in range(4):
            B[i] = A[i]

    @T.prim_func
    def hang(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        while B[0] >= T.float32(-1):
            B[0] = T.abs(B[0]) + A[0] * A[0]

    func = {"good": good, "crash": crash, "hang": hang}[kind].with_attr("global_symbol", "main")
    return _shipped(tvm.IRModule({"main": func}), LLVM)


def _last_outcomes(log) -> dict:
    """Each farm server's last logged outcome ('ok', 'run_failed', 'timeout'...)."""
    last = {}
    for line in log.read_text().splitlines():
        name, _, said = line.partition("] ")
        if name.startswith("[") and said and not said.startswith(("serving", "building", "chunk")):
            last[name[1:]] = said.split(":")[0].split()[0]
    return last


def _bad_then_good(runner, bad: list, good, log, servers: list[str]):
    """The Outcomes of the `bad` candidates, measured on the farm one after another (a fault is
    not handled beside another server's running hang), then of the last `good` ones measured
    after them until each of `servers` has measured one (its last logged outcome is ok)."""
    try:
        failed = [runner.outcomes([candidate])[0] for candidate in bad]
        for _ in range(5):
            after = runner.outcomes([good, good])
            if _last_outcomes(log) == {server: "ok" for server in servers}:
                break
    finally:
        candidates.shut_down(runner)
    return failed, after


@pytest.mark.slow
def test_a_farm_server_outlives_a_crashing_and_a_hanging_candidate(farm):
    address, _, log = farm
    runner = farms.FarmRunner(address, "farm", Workload("gemm", (32, 32, 32)), LLVM,
                              timeout_sec=5)
    (crash, hang), after = _bad_then_good(
        runner, [_llvm_candidate("crash"), _llvm_candidate("hang")], _llvm_candidate("good"),
        log, ["cpu0", "cpu1"])
    assert crash.status is Status.RUN_FAILED and crash.error, crash
    assert hang == Outcome(Status.TIMEOUT, error="LocalRunner: Timeout, killed after 5 seconds")
    assert all(o.status is Status.OK and o.time_ms > 0 for o in after), after
    assert _last_outcomes(log) == {"cpu0": "ok", "cpu1": "ok"}, log.read_text()[-2000:]
    assert "restarting" not in log.read_text()  # only the servers' workers were replaced
    assert candidates.check_rpc(address, "farm") == 2


def _cuda_candidate(kind: str, wl: Workload, target):
    """A CUDA candidate for the GEMM `wl`: v2's kernel ('good'), or one with its
    arguments that faults (`__trap()`: the CUDA context is lost) or never ends ('hang')."""
    import tvm
    from tvm.script import tirx as T

    import schedules

    m, n, k = wl.shape

    @T.prim_func
    def fault(A: T.Buffer((m, k), "float32"), B: T.Buffer((k, n), "float32"),
              C: T.Buffer((m, n), "float32")):
        for i in T.thread_binding(32, "threadIdx.x"):
            T.evaluate(T.call_extern("void", "__trap"))
            C[0, i] = A[0, i] + B[0, i]

    @T.prim_func
    def hang(A: T.Buffer((m, k), "float32"), B: T.Buffer((k, n), "float32"),
             C: T.Buffer((m, n), "float32")):
        for i in T.thread_binding(32, "threadIdx.x"):
            C[0, i] = A[0, i] + B[0, i]
            while T.bool(True):
                T.evaluate(T.call_extern("void", "__nanosleep", T.uint32(1000)))

    if kind == "good":
        mod = schedules.get("gemm", "v2").apply(wl, target)
    else:
        mod = tvm.IRModule({"main": {"fault": fault, "hang": hang}[kind].with_attr(
            "global_symbol", "main")})
    return _shipped(mod, target)


@pytest.mark.gpu
@pytest.mark.alone  # under 8 parallel tests its faulting kernel outlived the run timeout
def test_a_gpu_farm_server_outlives_a_faulting_and_a_hanging_kernel(tmp_path):
    """Two servers on this process's GPU: a kernel that traps and one that never ends each
    cost their candidate only; both servers then check and time good kernels. The run timeout
    leaves the driver 30 s to report the trap: it takes seconds, more on a busy host."""
    from tuning import build, measure

    wl = Workload("gemm", (256, 128, 512))
    target = build.cuda_target(measure.device_facts()["arch"])
    log, gpu = tmp_path / "farm.log", farms.gpus_here()[0]
    with started_farm(log, "--gpus", f"{gpu},{gpu}") as (address, _):
        runner = farms.FarmRunner(address, "farm", wl, target, timeout_sec=30)
        (fault, hang), after = _bad_then_good(
            runner, [_cuda_candidate("fault", wl, target), _cuda_candidate("hang", wl, target)],
            _cuda_candidate("good", wl, target), log, [f"gpu{gpu}.0", f"gpu{gpu}.1"])
        assert candidates.check_rpc(address, "farm") == 2
    assert fault.status is Status.RUN_FAILED and fault.error, fault
    assert hang == Outcome(Status.TIMEOUT, error="run timed out after 30 s")
    assert all(o.status is Status.OK and o.time_ms > 0 for o in after), after
    assert _last_outcomes(log) == {f"gpu{gpu}.0": "ok", f"gpu{gpu}.1": "ok"}, \
        log.read_text()[-2000:]
    assert "restarting" not in log.read_text()


@pytest.mark.gpu
@pytest.mark.alone  # two servers importing TVM, building and timing beside 7 building tests
def test_a_template_search_through_a_gpu_farm_measures_every_trial_on_its_servers(tmp_path):
    """v8's template search through two servers on this process's GPU: the servers apply,
    build, check and time each configuration, and every trial lands in the records, correct."""
    from tuning import records

    log, gpu = tmp_path / "farm.log", farms.gpus_here()[0]
    with started_farm(log, "--gpus", f"{gpu},{gpu}") as (address, _):
        status, out, err, _ = run_cli(
            ["--tune", "autotvm:v8", "--shape", "256x256x512", "--dtype", "float16", "--tuner",
             "random", "--trials", "6", "--records", "at.jsonl", "--no-ir",
             "--rpc-tracker", address, "--rpc-key", "farm"], tmp_path)
    assert status == 0 and "Traceback" not in out + err, err[-2000:]
    trials = [r for r in records.load(str(tmp_path / "at.jsonl")).records if "trial" in r]
    assert len(trials) == 6 and {r["status"] for r in trials} == {"ok"}, trials
    served = [line for line in log.read_text().splitlines() if " ok " in line]
    assert len(served) >= 6, log.read_text()[-2000:]


@pytest.mark.slow
def test_a_farm_restarts_a_server_that_dies(farm):
    address, _, log = farm
    pid = int(log.read_text().split("[cpu0] serving on port ")[1].split("pid ")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + FARM_READY_S
    while "farm: server cpu0 exited with status -9; restarting it" not in log.read_text():
        assert time.time() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)
    while candidates.check_rpc(address, "farm") < 2:  # it registered again
        assert time.time() < deadline
        time.sleep(0.5)


@pytest.mark.slow
def test_a_search_on_the_farm_uses_every_server_and_stops_in_one_line_when_it_goes(
        farm, tmp_path):
    address, proc, log = farm
    search = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "runner.py"), "--tune", "metaschedule", "--target",
         "llvm", "--shape", "32x32x32", "--trials", "96", "--work-dir", str(tmp_path / "ms"),
         "--rpc-tracker", address, "--rpc-key", "farm"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _line_within(search, "  trials 64 new", CLI_LIMIT_S)  # a batch of 32 per server
        os.killpg(proc.pid, signal.SIGKILL)  # the farm and its tracker, mid-batch
        out, err = search.communicate(timeout=CLI_LIMIT_S)
    finally:
        if search.poll() is None:
            os.killpg(search.pid, signal.SIGKILL)
    served = [line[:6] for line in log.read_text().splitlines() if " ok " in line]
    assert served.count("[cpu0]") >= 2 and served.count("[cpu1]") >= 2, served
    assert search.returncode == 1, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out + err, err[-2000:]
    # killed mid-search, the tracker's port refuses the next connection, or (caught while it
    # closes) accepts it and resets it: either way the farm has gone, said at its address
    gone = ("error: the search's RPC farm has gone (cannot reach the RPC tracker at "
            f"{address}", f"error: the search's RPC farm has gone ({address} does not answer")
    assert lines[0].startswith(gone), lines[0]


@pytest.mark.slow
def test_a_search_on_the_farm_records_its_summary_under_the_servers_device(farm, tmp_path):
    """A search measured by the farm ends with its summary in --results, under the device the
    servers named (here this machine's CPU), as a search on this GPU does."""
    from tuning import records

    address, _, _ = farm
    status, out, err, _ = run_cli(
        ["--tune", "metaschedule", "--target", "llvm", "--shape", "32x32x32", "--trials", "4",
         "--work-dir", "ms", "--results", "results.jsonl", "--rpc-tracker", address,
         "--rpc-key", "farm"], tmp_path)
    assert status == 0 and "Traceback" not in out + err, err[-2000:]
    (recorded,) = records.load(str(tmp_path / "results.jsonl")).records
    assert recorded["kind"] == "search" and recorded["schedule"] == "metaschedule"
    assert recorded["trials"] == 4 and recorded["op"] == "gemm"
    assert {k: recorded[k] for k in ("gpu", "driver", "arch")} == candidates.this_cpu()
    assert "search summary recorded in results.jsonl (measured on CPU (" in out


@pytest.mark.slow
def test_a_farm_server_starts_its_build_workers_before_its_first_search(farm):
    """Each server starts its build workers before it registers, so that a search's first
    chunk does not wait for them: once the farm is ready, and before any chunk, each server
    has its worker processes."""
    _, _, log = farm
    deadline = time.time() + REFUSED_WITHIN_S
    for name in ("cpu0", "cpu1"):
        pid = _server_pid(log, name)
        while not _children(pid):
            assert time.time() < deadline, f"{name} (pid {pid}) started no worker"
            time.sleep(0.1)
    assert "building and measuring" not in log.read_text()


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    children = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.split("/")[2]))
    return children


@pytest.mark.slow
def test_a_farm_server_applies_a_template_searchs_configurations(farm):
    """A template search's batch goes to the servers as configurations, which each server
    applies itself (the search's host only proposes them): here, on CPU servers, one v5k
    refuses for this target (invalid, with v5k's reason) and one it applies but cannot build
    for a CPU (build_failed), each in a chunk of its own."""
    from tuning import farm as farms

    address, _, log = farm
    runner = farms.FarmRunner(address, "farm", Workload("gemm", (32, 32, 32)), LLVM)
    try:
        refused, unbuildable = runner.measure_configs("v5k", [{"stages": 2}, {"stages": 1}])
    finally:
        candidates.shut_down(runner)
    assert refused.status is Status.INVALID and "cp.async" in refused.error, refused
    assert unbuildable.status is Status.BUILD_FAILED, unbuildable
    chunks = [line for line in log.read_text().splitlines() if "building and measuring" in line]
    assert [line[7:] for line in chunks] == ["building and measuring 1 candidate"] * 2, chunks


@pytest.mark.slow
def test_a_farm_server_builds_its_next_chunk_while_it_finishes_the_last(farm):
    """Two batches in flight (a template search's on a farm): four chunks on two servers, each
    server holding two at once (farm.SESSIONS), and every candidate measured."""
    from tuning import farm as farms

    address, _, log = farm
    runner = farms.FarmRunner(address, "farm", Workload("gemm", (32, 32, 32)), LLVM)
    try:
        batches = [runner.run([_llvm_candidate("good") for _ in range(6)]) for _ in range(2)]
        results = [future.result() for batch in batches for future in batch]
    finally:
        candidates.shut_down(runner)
    assert len(results) == 12 and not [r.error_msg for r in results if r.error_msg], results
    most_at_once = {}
    for line in log.read_text().splitlines():
        name, _, said = line.partition("] ")
        held = most_at_once.setdefault(name, [0, 0])  # now, most
        if said.startswith("building and measuring"):
            held[0] += 1
            held[1] = max(held)
        elif said.startswith("chunk done"):
            held[0] -= 1
    assert [most for _, most in most_at_once.values() if most] == [2, 2], log.read_text()[-2000:]


def _start_the_search_on_both_servers(address, log):
    """Each server's first chunk of a search starts its build and run workers (processes that
    import TVM: on a loaded two-core machine the chunk took 11-13 s, past a 10 s lost_after_s,
    and the healthy server counted as hung too, which left the chunks no server): a chunk of
    the same search (same workload, target and settings) on each, with the default bound,
    beforehand."""
    from tuning import farm as farms

    warm = farms.FarmRunner(address, "farm", Workload("gemm", (32, 32, 32)), LLVM)
    try:
        for _ in range(5):
            warm.outcomes([_llvm_candidate("good"), _llvm_candidate("good")])
            if {"cpu0", "cpu1"} <= set(_last_outcomes(log)):
                break
    finally:
        candidates.shut_down(warm)


@pytest.mark.slow
def test_a_server_that_hangs_with_a_chunk_loses_it_to_another(farm):
    """A server stopped (SIGSTOP: its host hung, not gone) while it holds chunks (up to
    SESSIONS): after lost_after_s without an answer, each goes to the other server, a line says
    so for each, the stopped one is handed no chunk again, and every candidate is measured."""
    from tuning import farm as farms

    address, _, log = farm
    _start_the_search_on_both_servers(address, log)
    started = log.read_text().count("[cpu0] building and measuring")
    said = []
    runner = farms.FarmRunner(address, "farm", Workload("gemm", (32, 32, 32)), LLVM,
                              say=said.append, lost_after_s=10)
    stopped = None
    try:
        futures = runner.run([_llvm_candidate("good") for _ in range(6)])
        deadline = time.time() + CLI_LIMIT_S
        while log.read_text().count("[cpu0] building and measuring") == started:
            assert time.time() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        stopped = _server_pid(log, "cpu0")
        os.kill(stopped, signal.SIGSTOP)
        results = [future.result() for future in futures]
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        candidates.shut_down(runner)
    assert len(results) == 6 and not [r.error_msg for r in results if r.error_msg], results
    assert 1 <= len(said) <= farms.SESSIONS, said
    for lost in said:
        assert "no answer from 127.0.0.1:" in lost and "in 10 s" in lost, lost
        assert lost.endswith("they go to the next free server"), lost
    assert len(runner.hung) == 1


def _search_on_the_farm(address: str, work_dir, trials: int) -> subprocess.Popen:
    """A MetaSchedule search of the 32^3 GEMM on this CPU, on the farm at `address`."""
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "runner.py"), "--tune", "metaschedule", "--target",
         "llvm", "--shape", "32x32x32", "--trials", str(trials), "--seed", "3",
         "--work-dir", str(work_dir), "--rpc-tracker", address, "--rpc-key", "farm"],
        cwd=os.path.dirname(work_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def _measured_traces(work_dir) -> list[str]:
    """The trace of every candidate in a MetaSchedule work dir's database, a failed one too."""
    with open(os.path.join(work_dir, "database_tuning_record.json")) as f:
        return [json.dumps(json.loads(line)[1][0]) for line in f if line.strip()]


def _server_pid(log, name: str) -> int:
    """The process of the farm server `name`, as its last 'serving' line says."""
    serving = [line for line in log.read_text().splitlines()
               if line.startswith(f"[{name}] serving on port ")]
    return int(serving[-1].rsplit("pid ", 1)[1])


@pytest.mark.slow
def test_a_server_killed_with_a_chunk_costs_nothing_its_chunk_goes_to_another(farm, tmp_path):
    """A server killed while it builds and measures its chunks (it holds up to SESSIONS at once):
    each goes to the next free server, a line says so for each, and the search ends with every
    trial measured and none failed."""
    address, _, log = farm
    search = _search_on_the_farm(address, tmp_path / "ms", 64)
    try:
        deadline = time.time() + CLI_LIMIT_S
        while "[cpu0] building and measuring" not in log.read_text():
            assert time.time() < deadline and search.poll() is None, log.read_text()[-2000:]
            time.sleep(0.05)
        os.kill(_server_pid(log, "cpu0"), signal.SIGKILL)
        out, err = search.communicate(timeout=CLI_LIMIT_S)
    finally:
        if search.poll() is None:
            os.killpg(search.pid, signal.SIGKILL)
    assert search.returncode == 0 and "Traceback" not in out + err, err[-2000:]
    from tuning import farm as farms

    lost = [line for line in out.splitlines() if line.startswith("farm: a server went away")]
    assert 1 <= len(lost) <= farms.SESSIONS, out[-2000:]
    assert all(line.endswith("they go to the next free server") for line in lost), out[-2000:]
    traces = _measured_traces(tmp_path / "ms")
    assert len(traces) == len(set(traces)) == 64
    assert "; this run: 64 proposed, 0 refused, 64 measured" in out
    batches = re.findall(r"\((\d+) of this batch failed\)", out)
    assert batches and set(batches) == {"0"}, out[-2000:]  # a batch of 32 per server


@pytest.mark.slow
def test_a_search_whose_head_is_killed_resumes_and_measures_nothing_twice(farm, tmp_path):
    """The search's own process killed mid-search: the batch it had recorded is kept, and the
    same command resumes and measures only new candidates."""
    address, _, _ = farm
    work_dir = tmp_path / "ms"
    search = _search_on_the_farm(address, work_dir, 96)
    try:
        _line_within(search, "  trials 64 new", CLI_LIMIT_S)  # its first batch recorded
        os.killpg(search.pid, signal.SIGKILL)
        search.wait()
    finally:
        if search.poll() is None:
            os.killpg(search.pid, signal.SIGKILL)
    kept = _measured_traces(work_dir)
    assert 64 <= len(kept) < 96
    status, out, err, _ = run_cli(
        ["--tune", "metaschedule", "--target", "llvm", "--shape", "32x32x32", "--trials",
         str(96 - len(kept)), "--seed", "3", "--work-dir", str(work_dir), "--rpc-tracker",
         address, "--rpc-key", "farm"], tmp_path)
    assert status == 0 and "Traceback" not in out + err, err[-2000:]
    traces = _measured_traces(work_dir)
    assert traces[:len(kept)] == kept and len(traces) == len(set(traces)) == 96


def test_a_farm_runner_ends_a_search_whose_servers_measure_on_two_kinds_of_gpu():
    """The first device a server names is the search's; another kind ends the search in one
    line (its times and records would mix two kinds of GPU)."""
    from tuning import farm as farms

    with tracker_with_a_server("gpu") as (address, _):
        runner = farms.FarmRunner(address, "gpu", Workload("gemm", (32, 32, 32)), LLVM)
        h100 = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "arch": "sm_90"}
        runner.measured_on(h100)
        runner.measured_on({**h100, "driver": "581"})  # the same kind of GPU
        with pytest.raises(UsageError, match=r"measure on different devices \(NVIDIA H100 80GB "
                                             r"HBM3 and NVIDIA H200\): one search's times"):
            runner.measured_on({"gpu": "NVIDIA H200", "driver": "580", "arch": "sm_90"})
        assert isinstance(runner.stopped_by, UsageError) and runner.servers_device == h100


@pytest.mark.slow
def test_a_farm_runner_gives_up_on_a_key_whose_servers_have_all_gone_or_hung():
    """A hung server stays registered, busy with the chunk it never answered: where it is the
    only one under the key, the search ends in one line after gone_after_s, as where none is,
    instead of waiting for ever."""
    from tuning import farm as farms

    with tracker_with_a_server("gpu") as (address, server):
        runner = farms.FarmRunner(address, "gpu", Workload("gemm", (32, 32, 32)), LLVM,
                                  gone_after_s=2)
        assert runner._none_since(None) is None  # a server that has not hung
        runner.hung.add("127.0.0.1:1")  # as _answer marks one that timed out
        since = runner._none_since(None)
        time.sleep(2.1)
        with pytest.raises(FarmGone, match="no RPC server under key 'gpu' .* but 1 that gave "
                                           "a request no answer for 2 s"):
            runner._none_since(since)
        runner = farms.FarmRunner(address, "gpu", Workload("gemm", (32, 32, 32)), LLVM,
                                  gone_after_s=2)
        server.terminate()
        start = time.time()
        with pytest.raises(FarmGone, match="no RPC server under key 'gpu' .* for 2 s"):
            runner.measure([_llvm_candidate("good")])
        assert time.time() - start < 15
        with pytest.raises(FarmGone):  # and every candidate after it, at once
            runner.measure([_llvm_candidate("good")])


@pytest.mark.slow
def test_a_search_refuses_servers_that_are_not_the_farms_in_one_line(
        tracker_with_other_key, tmp_path):
    status, out, err, _ = run_cli(
        ["--tune", "metaschedule", "--target", "llvm", "--shape", "32x32x32", "--trials", "4",
         "--work-dir", "ms", "--rpc-tracker", tracker_with_other_key, "--rpc-key", "other"],
        tmp_path)
    assert status == 2 and "Traceback" not in out + err, err[-2000:]
    assert err.strip().splitlines() == [
        "error: the RPC servers under key 'other' are not this project's farm servers: start "
        "them with scripts/rpc-farm.sh"]


@pytest.mark.parametrize("args, words", [
    (["--key", "two words"], "must be one word"),
    (["--key", "k", "--port", "0"], "is not a port"),
    (["--key", "k", "--servers", "0"], "--servers must be positive"),
    (["--key", "k", "--tracker", "nohost"], "expected host:port"),
], ids=["key", "port", "servers", "tracker"])
def test_the_farm_refuses_bad_settings_in_one_line(args, words, tmp_path):
    start = time.time()
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "rpc-farm.sh"), *args],
                          capture_output=True, text=True, timeout=CLI_LIMIT_S, cwd=tmp_path)
    assert done.returncode == 2 and time.time() - start < REFUSED_WITHIN_S
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], done.stderr


@pytest.mark.parametrize("visible, gpus", [("2,3", ["2", "3"]), (" 1 ", ["1"]),
                                           ("GPU-5f1e", ["GPU-5f1e"]), ("", None)],
                         ids=["two", "spaced", "uuid", "empty"])
def test_a_farm_serves_the_gpus_cuda_visible_devices_names(visible, gpus, monkeypatch):
    """nvidia-smi lists every GPU of the host whatever CUDA_VISIBLE_DEVICES says: a farm
    started under it serves the GPUs it names, and one that names none is refused."""
    from tuning import farm as farms

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if gpus is None:
        with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES is empty"):
            farms.gpus_here()
    else:
        assert farms.gpus_here() == gpus


def test_the_farm_refuses_a_port_in_use_in_one_line(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            ["bash", os.path.join(ROOT, "scripts", "rpc-farm.sh"), "--key", "k", "--servers", "1",
             "--host", "127.0.0.1", "--port", str(port)],
            capture_output=True, text=True, timeout=CLI_LIMIT_S, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: cannot start a tracker on 127.0.0.1:{port}: Address already in use; pick "
        "another --port, or join the tracker there with --tracker HOST:PORT"]

