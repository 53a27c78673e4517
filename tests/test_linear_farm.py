"""linear/farm.py: a model's (layer, bucket) pairs tuned on a farm's servers, each server's
entry (manifest and kernel.so) written into the head's cache as it lands and loaded from there.

CPU tier: farms on loopback whose servers tune with a stand-in for the GPU
(tests/linear_farm_stand_in.py: real llvm libraries, a GPU named by $STAND_IN_GPU), with faults
injected: a server killed or stopped mid-pair, the head killed mid-way, the farm gone, a pair a
server cannot tune, a server of another GPU. GPU tier: two servers on GPU 0 running the
portfolio itself. Every farm and head started here is stopped in `finally`, under a time limit."""

import contextlib
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tvm

import cli
import linear
import linear_farm_stand_in as stand_in
from farm_stop import stop_farm
from line_reader import Lines
from linear import farm as linear_farm
from linear.buckets import buckets_from_edges
from linear.cache import LIBRARY, MANIFEST, Cache
from linear.candidates import LayerShape, candidates
from schedules.errors import UsageError
from tuning import candidates as tuning_candidates, farm as farms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
READY_S = 120  # the farm's servers import TVM, torch and the project, and register
HEAD_S = 120  # the most a head here may take
SECONDS = "2"  # each pair a stand-in server tunes takes this long: long enough to kill it
LAYERS = [LayerShape(64, 32, "bfloat16"), LayerShape(48, 32, "bfloat16")]
FAILING = LayerShape(24, 32, "bfloat16")  # the stand-in servers fail its pairs
BUCKETS = buckets_from_edges((1, 2, 17))  # M = 1 chooses torch's (no library), the others build
MAX_TOKENS = 64


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick, released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stand_in_env(**env) -> dict:
    """This environment with tests/ on PYTHONPATH (the stand-in's module) and `env` added."""
    path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **env}


@contextlib.contextmanager
def started_farm(log, argv: list[str], servers: int, env: dict | None = None):
    """The farm `argv` starts (its entry point and its servers' flags) on loopback under key
    'farm', its servers' lines to `log`: yields (tracker address, farm process) once it says all
    `servers` have registered; stopped after (SIGTERM: it stops its servers), then killed."""
    port = free_port()
    with open(log, "w") as err:
        proc = subprocess.Popen([*argv, "--key", "farm", "--host", "127.0.0.1", "--port",
                                 str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)
    try:
        ready = Lines(proc.stdout).next(READY_S) or ""
        assert f"{servers} under key 'farm'" in ready, (ready, log.read_text()[-2000:])
        yield f"127.0.0.1:{port}", proc
    finally:
        stop_farm(proc, log)


def stand_in_farm(log, servers: int = 2, **env):
    """A farm whose servers tune with the stand-in, each pair taking SECONDS."""
    return started_farm(log, [sys.executable, "-m", stand_in.ENTRY, "--servers", str(servers)],
                        servers, _stand_in_env(**{stand_in.SECONDS: SECONDS, **env}))


def tune(address: str, cache: Cache, said: list, layers=LAYERS, **options) -> dict:
    """linear.farm.prepare of `layers` on the farm at `address`, tuning with the stand-in here
    too; every line it says appended to `said`."""
    return linear_farm.prepare(layers, BUCKETS, MAX_TOKENS, address, "farm", cache, said.append,
                               said.append, tuner=stand_in.StandIn(), **options)


def _served(log, since: int = 0) -> list[tuple[str, str]]:
    """(server, pair) of each pair the farm's servers began to tune, past `since` characters of
    their log."""
    found = []
    for line in log.read_text()[since:].splitlines():
        name, _, said = line.partition("] tuning ")
        if said:
            found.append((name.lstrip("["), said))
    return found


def _server_pid(log, name: str) -> int:
    serving = [line for line in log.read_text().splitlines()
               if line.startswith(f"[{name}] serving on port ")]
    return int(serving[-1].rsplit("pid ", 1)[1])


def _wait_for(predicate, what: str, seconds: float = HEAD_S):
    """predicate()'s first true value, asked every 50 ms for up to `seconds`."""
    deadline = time.time() + seconds
    while not (found := predicate()):
        assert time.time() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.05)
    return found


def _both_serving(address: str) -> None:
    """Wait until both of the farm's servers are registered (one a test killed is restarted
    by the farm, in tens of seconds)."""
    _wait_for(lambda: tuning_candidates.servers_now(address, "farm") >= 2, "two servers",
              READY_S)


def _first_to_tune(log, since: int) -> str:
    """The server that begins to tune a pair first, past `since` characters of the log."""
    return _wait_for(lambda: next((server for server, _ in _served(log, since)), None),
                     "pair on a server")


def _sources(found: dict, layers=LAYERS) -> list[str]:
    return [k.source for layer in layers for k in found[layer].kernels]


def _adds_one(library: str) -> bool:
    """Whether the library's `main` (the stand-in's kernel) adds one to four floats."""
    a = tvm.runtime.tensor(np.arange(4, dtype="float32"))
    b = tvm.runtime.tensor(np.zeros(4, dtype="float32"))
    tvm.runtime.load_module(library)["main"](a, b)
    return bool((b.numpy() == np.arange(4) + 1).all())


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """Two stand-in servers that fail FAILING's pairs, each having tuned a pair already (its
    worker process started): (tracker address, farm process, its servers' log)."""
    log = tmp_path_factory.mktemp("linear-farm") / "farm.log"
    with stand_in_farm(log, **{stand_in.FAILS: FAILING.label()}) as (address, proc):
        for attempt in range(3):
            tune(address, Cache(str(log.parent / f"warm-{attempt}")), [])
            if {server for server, _ in _served(log)} == {"cpu0", "cpu1"}:
                break
        yield address, proc, log


# -- the transfer, without a farm -----------------------------------------------------------------


def test_a_servers_entry_is_written_here_under_the_key_it_was_made_with(tmp_path):
    """What a server sends back (its cache entry, the library in base64) is written here under
    the key in its manifest, and the library that made the trip loads and runs."""
    request = json.loads(linear_farm._request(LAYERS[0], BUCKETS[1], MAX_TOKENS, 60.0))
    reply = linear_farm._tune_pair(stand_in.StandIn(), request)
    entry = linear_farm._write(Cache(str(tmp_path)), reply)
    assert entry.manifest == reply["manifest"] and entry.manifest["choice"] == stand_in.RUNG
    assert entry.manifest["key"]["gpu"] == "Stand-in GPU"
    assert _adds_one(os.path.join(entry.directory, LIBRARY))


@pytest.mark.parametrize("argv, message", [
    (["--rpc-tracker", "127.0.0.1:1"], "a farm is named by --rpc-tracker HOST:PORT and "
                                       "--rpc-key KEY together"),
    (["--rpc-key", "farm"], "a farm is named by --rpc-tracker HOST:PORT and --rpc-key KEY"),
    (["--rpc-tracker", "127.0.0.1:{port}", "--rpc-key", "farm"],
     "cannot reach the RPC tracker at 127.0.0.1:{port}: connection refused"),
    (["--rpc-tracker", "", "--rpc-key", "farm"], "argument --rpc-tracker: empty value"),
], ids=["no-key", "no-tracker", "tracker-down", "empty-tracker"])
def test_linear_on_a_farm_that_cannot_be_used_is_refused_in_one_line(capsys, argv, message):
    port = str(free_port())
    argv = [a.replace("{port}", port) for a in argv]
    assert cli.main(["linear", "--shape", "64x32", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: " + message.replace("{port}", port)), err
    assert err.count("\n") == 1 and not out


def test_prepare_takes_a_farm_by_its_tracker_and_key_together():
    with pytest.raises(UsageError, match="both rpc_tracker .* and rpc_key"):
        linear.prepare(torch.nn.Sequential(), rpc_tracker="127.0.0.1:1")


@pytest.mark.parametrize("tracker, key", [("", "farm"), ("127.0.0.1:1", " ")])
def test_a_farm_named_by_an_empty_tracker_or_key_is_refused_not_taken_for_none(tracker, key):
    """An empty tracker or key is refused, in prepare and in linear.farm.prepare, before the
    tracker is asked (not taken for no farm, which would tune here)."""
    message = f"neither empty; not tracker {tracker!r} and key {key!r}"
    with pytest.raises(UsageError, match=message):
        linear.prepare(torch.nn.Sequential(), rpc_tracker=tracker, rpc_key=key)
    with pytest.raises(UsageError, match=message):
        linear_farm.prepare(LAYERS, BUCKETS, MAX_TOKENS, tracker, key)


def test_an_interrupted_linear_command_names_the_linear_cache(capsys, monkeypatch, tmp_path):
    """Ctrl-C during `linear`: the line says the tuned pairs are kept in the linear cache (where
    they are), not in the results file, and the status is 130."""
    monkeypatch.setenv("TVM_EXPLORER_CACHE", str(tmp_path))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(linear.portfolio, "prepare", interrupted)
    assert cli.main(["linear", "--shape", "64x32"]) == 130
    assert capsys.readouterr().err == (
        f"\ninterrupted: everything measured so far is kept in the linear cache ({tmp_path}); "
        "run the same command again to resume\n")


@pytest.mark.parametrize("value", ["two", "0", "-1"])
def test_a_bad_count_of_build_workers_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv(tuning_candidates.BUILD_WORKERS_VARIABLE, value)
    with pytest.raises(UsageError, match=f"FARM_BUILD_WORKERS is a count of build processes "
                                         f"\\(at least 1\\), not '{value}'"):
        tuning_candidates.build_workers(5)
    monkeypatch.setenv(tuning_candidates.BUILD_WORKERS_VARIABLE, "3")
    assert tuning_candidates.build_workers(5) == 3


def test_builds_count_the_cpus_this_process_may_use_not_the_hosts(monkeypatch):
    """Under taskset (or a container's cpuset), a farm server's builds take the CPUs left to
    them, or FARM_BUILD_WORKERS where the farm gives it a share."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.delenv(tuning_candidates.BUILD_WORKERS_VARIABLE, raising=False)
    assert tuning_candidates.usable_cpus() == 3
    assert farms._server_builder().max_workers == 3
    monkeypatch.setenv(tuning_candidates.BUILD_WORKERS_VARIABLE, "2")
    assert farms._server_builder().max_workers == 2


def _running(pid: int) -> bool:
    """Whether process `pid` is running (neither gone nor a zombie), read from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow
def test_a_pair_whose_worker_hangs_is_answered_and_its_worker_killed_and_replaced(
        monkeypatch):
    """A server whose worker hangs on a pair (a hung kernel): after 1/SESSIONS of the head's
    wait it answers with the error, its worker's process is killed (not left running), and a
    new worker tunes the next pair."""
    monkeypatch.setenv(stand_in.HANGS, FAILING.label())
    server = linear_farm.PairServer(stand_in.StandIn())
    try:
        server.ready.result(timeout=READY_S)  # its start is not the pair's time
        hung = list(server.worker._processes)
        lost_after = 4.0 * farms.SESSIONS
        reply = json.loads(server(linear_farm._request(FAILING, BUCKETS[1], MAX_TOKENS,
                                                       lost_after)))
        assert reply["error"] == ("its worker gave no answer to the pair in 4 s; the worker is "
                                  "killed")
        assert 4 <= reply["seconds"] < lost_after, reply
        assert len(hung) == 1
        _wait_for(lambda: not _running(hung[0]), "hung worker killed", 10)
        assert list(server.worker._processes) != hung
        again = json.loads(server(linear_farm._request(LAYERS[0], BUCKETS[1], MAX_TOKENS,
                                                       60.0)))
        assert again["manifest"]["choice"] == stand_in.RUNG, again
    finally:
        linear_farm._ended(server.worker)


# -- a farm of stand-in servers -------------------------------------------------------------------


@pytest.mark.slow
def test_each_pair_is_tuned_on_a_server_written_here_and_then_loaded_from_the_cache(
        farm, tmp_path):
    """Every pair goes to a server, both servers tune some, each entry lands in this cache (its
    library loads and runs here), and every kernel is loaded from the cache; a second prepare
    sends nothing. A pair a server cannot tune is tuned here, one line each."""
    address, _, log = farm
    cache, said, start = Cache(str(tmp_path)), [], len(log.read_text())
    found = tune(address, cache, said, [*LAYERS, FAILING])
    served = _served(log, start)
    assert len(served) == 3 * len(BUCKETS) and {s for s, _ in served} == {"cpu0", "cpu1"}
    assert set(_sources(found)) == {"cache"} and set(_sources(found, [FAILING])) == {"measured"}
    assert [k.candidate.name for k in found[LAYERS[0]].kernels] == ["torch", *[stand_in.RUNG] * 2]
    built = [k.entry for k in found[LAYERS[0]].kernels[1:]]
    assert all(_adds_one(os.path.join(entry, LIBRARY)) for entry in built)
    failed = [line for line in said if line.startswith("farm: ")]
    assert len(failed) == len(BUCKETS) and all(
        f"could not tune {FAILING.label()} " in line and line.endswith(
            f"stand-in fails {FAILING.label()}); it is tuned here") for line in failed), said
    again = []
    assert set(_sources(tune(address, cache, again, [*LAYERS, FAILING]), [*LAYERS, FAILING])) \
        == {"cache"}
    assert again == [] and len(_served(log, start)) == len(served)


@pytest.mark.slow
def test_a_server_killed_mid_pair_costs_that_pair_only(farm, tmp_path):
    """A server killed while it tunes: each pair it held goes to the other server, one line
    each, and every pair is tuned on the farm and loaded from the cache. The farm restarts the
    server, and ends the worker processes it left first."""
    address, _, log = farm
    _both_serving(address)
    said, start = [], len(log.read_text())
    with ThreadPoolExecutor(1) as head:
        found = head.submit(tune, address, Cache(str(tmp_path)), said)
        server = _first_to_tune(log, start)
        killed = _server_pid(log, server)
        assert len(_group(killed)) > 1  # the server and its worker process, at least
        os.kill(killed, signal.SIGKILL)
        kernels = found.result(timeout=HEAD_S)
    assert set(_sources(kernels)) == {"cache"}, said
    lost = [line for line in said if line.startswith("farm: a server went away with ")]
    assert 1 <= len(lost) <= farms.SESSIONS, said
    assert all(line.endswith("); it goes to the next free server") for line in lost), lost
    _wait_for(lambda: f"farm: server {server} exited with status -9; restarting it"
              in log.read_text(), "restart", READY_S)
    assert _group(killed) == []


def _group(pgid: int) -> list[int]:
    """The processes of the process group `pgid` (read from /proc)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError):
            with open(stat) as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                    found.append(int(stat.split("/")[2]))
    return found


@pytest.mark.slow
def test_a_server_that_hangs_mid_pair_loses_it_to_another(farm, tmp_path):
    """A server stopped (its host hung) while it tunes: after lost_after_s without an answer,
    each pair it held goes to the other server, one line each, and is tuned there."""
    address, _, log = farm
    _both_serving(address)
    said, start, stopped = [], len(log.read_text()), None
    try:
        with ThreadPoolExecutor(1) as head:
            found = head.submit(tune, address, Cache(str(tmp_path)), said, lost_after_s=30)
            stopped = _server_pid(log, _first_to_tune(log, start))
            os.kill(stopped, signal.SIGSTOP)
            kernels = found.result(timeout=HEAD_S)
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
    assert set(_sources(kernels)) == {"cache"}, said
    lost = [line for line in said if line.startswith("farm: a server went away with ")]
    assert 1 <= len(lost) <= farms.SESSIONS, said
    assert all("(no answer from 127.0.0.1:" in line and " in 30 s); it goes to the next free "
               "server" in line for line in lost), lost


HEAD = """
import sys
from linear.cache import Cache
from test_linear_farm import tune

class Printed(list):
    def append(self, line):
        print(line, flush=True)

tune(sys.argv[1], Cache(sys.argv[2]), Printed())
"""  # a head in a process of its own: `tune` on the farm at argv[1], into the cache at argv[2]


@pytest.mark.slow
def test_a_head_killed_mid_way_resumes_from_the_cache_tuning_nothing_again(farm, tmp_path):
    """The head killed once a pair has landed: the entries in the cache are kept, and the same
    call again sends only the pairs they lack."""
    address, _, log = farm
    cache = Cache(str(tmp_path / "cache"))
    head = subprocess.Popen([sys.executable, "-c", HEAD, address, cache.root], cwd=ROOT,
                            env=_stand_in_env(), stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        Lines(head.stdout).until(" tuned on ", HEAD_S)
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
    kept = {name: os.path.getmtime(os.path.join(cache.root, name, MANIFEST))
            for name in os.listdir(cache.root) if not name.startswith(".")}
    assert 1 <= len(kept) < len(LAYERS) * len(BUCKETS)
    said, start = [], len(log.read_text())
    assert set(_sources(tune(address, cache, said))) == {"cache"}
    left = len(LAYERS) * len(BUCKETS) - len(kept)
    assert said[0].startswith(f"tuning {left} (layer, bucket) pair"), said
    assert len(_served(log, start)) == left
    assert all(os.path.getmtime(os.path.join(cache.root, name, MANIFEST)) == mtime
               for name, mtime in kept.items())


INTERRUPTIBLE_HEAD = HEAD.replace("tune(sys.argv[1], Cache(sys.argv[2]), Printed())", """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where SIGINT came ignored
try:
    tune(sys.argv[1], Cache(sys.argv[2]), Printed())
except KeyboardInterrupt:
    sys.exit(130)
""")  # HEAD, taking Ctrl-C as the command line does


@pytest.mark.slow
def test_ctrl_c_awaits_the_pairs_in_flight_and_a_second_ctrl_c_abandons_them(tmp_path):
    """Two servers hold four pairs, each taking takes_s (a server tunes one at a time). Ctrl-C:
    one line says the four are awaited and no pair is sent again; the first to land is written
    into the cache and said, and no other pair reaches a server. Ctrl-C again, and the head
    ends within seconds (exit 130), before the pairs left would land."""
    takes_s = 8
    log, cache = tmp_path / "farm.log", Cache(str(tmp_path / "cache"))
    with stand_in_farm(log, **{stand_in.SECONDS: str(takes_s)}) as (address, _):
        head = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE_HEAD, address, cache.root],
                                cwd=ROOT, env=_stand_in_env(), stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            lines = Lines(head.stdout)
            _wait_for(lambda: len(_served(log)) == 2 * farms.SESSIONS, "pairs on the servers")
            head.send_signal(signal.SIGINT)
            assert lines.until("interrupted: ", HEAD_S)[-1] == (
                f"interrupted: no pair is sent again; the {2 * farms.SESSIONS} in flight are "
                "written into the cache as their servers answer (Ctrl-C again to abandon them)")
            landed = lines.until(" tuned on ", HEAD_S)[-1]
            in_flight = [pair for _, pair in _served(log)]
            assert any(landed.startswith(f"{pair}: ") for pair in in_flight), (landed, in_flight)
            assert head.poll() is None
            time.sleep(2 * farms.POLL_S)  # time for a pair sent as it landed to reach a server
            assert len(_served(log)) == 2 * farms.SESSIONS  # none was
            abandoned = time.monotonic()
            head.send_signal(signal.SIGINT)
            assert head.wait(timeout=takes_s) == 130
            assert time.monotonic() - abandoned < 3 * farms.POLL_S + 2
        finally:
            if head.poll() is None:
                os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        entries = [n for n in os.listdir(cache.root) if not n.startswith(".")]
        assert 1 <= len(entries) < 2 * farms.SESSIONS


@pytest.mark.slow
def test_a_pair_tuned_on_another_gpu_is_kept_for_it_and_tuned_here(farm, tmp_path, monkeypatch):
    """The servers' GPU is not this one: their entries are written here under their own GPU's
    key, not used here (one line each, saying why), and the pairs are tuned here."""
    address, _, _ = farm
    monkeypatch.setenv(stand_in.GPU, "Head GPU")
    cache, said = Cache(str(tmp_path)), []
    found = tune(address, cache, said)
    assert set(_sources(found)) == {"measured"}
    other = [line for line in said if "its cached kernel was made with gpu Stand-in GPU (here "
             "Head GPU); measuring again for this one" in line]
    assert len(other) == len(LAYERS) * len(BUCKETS), said
    gpus = [json.load(open(os.path.join(cache.root, name, MANIFEST)))["key"]["gpu"]
            for name in os.listdir(cache.root) if not name.startswith(".")]
    assert sorted(gpus) == ["Head GPU"] * 6 + ["Stand-in GPU"] * 6


@pytest.mark.slow
def test_the_pairs_left_when_the_farm_goes_are_tuned_here(tmp_path):
    """The farm stopped once a pair has landed: the pairs in flight and those not yet sent are
    tuned here (one line for all of them), and those that landed are loaded from the cache."""
    log, said = tmp_path / "farm.log", []
    with stand_in_farm(log, servers=1) as (address, proc), ThreadPoolExecutor(1) as head:
        found = head.submit(tune, address, Cache(str(tmp_path / "cache")), said)
        _wait_for(lambda: any(" tuned on " in line for line in said), "pair landed")
        stop_farm(proc)
        kernels = found.result(timeout=HEAD_S)
    sources = _sources(kernels)
    assert sorted(set(sources)) == ["cache", "measured"], (sources, said)
    gone = [line for line in said if line.startswith("farm: the RPC farm has gone (")]
    left = sources.count("measured")
    assert len(gone) == 1 and gone[0].endswith(
        f"; the {left} (layer, bucket) pair{'s' * (left > 1)} it had not tuned "
        f"{'are' if left > 1 else 'is'} tuned here"), said


# -- the GPU tier: the portfolio on two servers of GPU 0 ------------------------------------------


@pytest.mark.gpu
@pytest.mark.alone  # two servers building and timing on this process's GPU beside the head
def test_a_model_tuned_on_two_gpu_servers_runs_their_kernels_right(tmp_path):
    """A small model's layers tuned on two servers of this process's GPU (scripts/rpc-farm.sh
    --gpus N,N): every pair is tuned on a server (both take some), lands in this cache under the
    GPU's key (this machine's) and is loaded from there; each pair measured the candidates
    local tuning measures; the model is right against float64 at each bucket's Ms; and a fresh
    prepare without the farm loads every kernel from the cache."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 256, bias=False), torch.nn.SiLU(),
                                torch.nn.Linear(256, 512)).to("cuda", torch.bfloat16)
    reference = [layer.weight.detach().double() for layer in (model[0], model[2])]
    options = dict(buckets=buckets_from_edges((1, 2)), max_tokens=64)
    linear.replace_linears(model, **options)
    cache, log, said = Cache(str(tmp_path / "cache")), tmp_path / "farm.log", []
    gpu = farms.gpus_here()[0]
    with started_farm(log, ["bash", os.path.join(ROOT, "scripts", "rpc-farm.sh"), "--gpus",
                            f"{gpu},{gpu}"], 2) as (address, _):
        found = linear.prepare(model, cache=cache, say=said.append, warn=said.append,
                               rpc_tracker=address, rpc_key="farm")
    assert {k.source for kernels in found.values() for k in kernels.kernels} == {"cache"}, said
    assert {server for server, _ in _served(log)} == {f"gpu{gpu}.0", f"gpu{gpu}.1"}
    for shape, kernels in found.items():
        assert [set(k.measured) for k in kernels.kernels] == [
            {c.name for c in candidates(shape, bucket, options["max_tokens"])}
            for bucket in options["buckets"]]
    for m in (1, 2, 37, 64):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        hidden = torch.nn.functional.silu(x.double() @ reference[0].T)
        expected = hidden @ reference[1].T + model[2].bias.double()
        with torch.no_grad():
            y = model(x).double()
        assert float((y - expected).norm() / expected.norm()) < 2e-2, m
    fresh = []
    again = linear.prepare(model, cache=cache, say=fresh.append, warn=fresh.append)
    assert {k.source for kernels in again.values() for k in kernels.kernels} == {"cache"}
    assert fresh == []
