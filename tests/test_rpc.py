"""Searches through an RPC tracker when something is wrong with it, on loopback, CPU only: a
tracker that is down or a key no server registered is refused in seconds with one line (no
hang, no retries, no traceback), and a candidate that fails on the remote host keeps the
remote reason, not TVM's wrapper line (a timeout, which TVM reports as text only, is read as
one). Every tracker and server is started here and stopped
in `finally`; every command runs under a time limit."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from schedules.errors import UsageError
from tuning import candidates
from tuning.candidates import Status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_LIMIT_S = 90  # a command still running after this is killed and the test fails
REFUSED_WITHIN_S = 20  # what a refusal may take, Python's and TVM's imports included


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


@pytest.fixture
def tracker_with_other_key():
    """A tracker on loopback with one server registered under the key 'other'; yields the
    tracker's host:port once the server shows in its summary."""
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    port = free_port()
    tracker = Tracker("127.0.0.1", port=port, port_end=port + 100, silent=True)
    server = None
    try:
        server_port = free_port()
        server = Server(host="127.0.0.1", port=server_port, port_end=server_port + 100,
                        key="other", silent=True, tracker_addr=("127.0.0.1", tracker.port))
        address = f"127.0.0.1:{tracker.port}"
        deadline = time.time() + 30
        while _free_under(tracker.port, "other") < 1:
            assert time.time() < deadline, "the server did not register with the tracker"
            time.sleep(0.2)
        yield address
    finally:
        if server is not None:
            server.terminate()
        tracker.terminate()


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

# result.error_msg of TVM's RPCRunner, captured on loopback (tracker and server on 127.0.0.1, TVM
# 0.27): a CUDA candidate run by a server without CUDA; an llvm candidate whose artifact is not a
# tar; an llvm candidate called with arguments of the wrong shape.
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
    (RPC_WRONG_SHAPE.split("tvm.error.RPCError")[0]
     + "RuntimeError: Session timeout when running run_evaluator\n",
     "RuntimeError: Session timeout when running run_evaluator"),
], ids=["rpc-runner", "local-runner", "rpc-session"])
def test_tvm_runners_timeouts_are_read_from_their_text(message, error):
    assert candidates.tvm_run_failure(message) == candidates.Outcome(Status.TIMEOUT, error=error)
