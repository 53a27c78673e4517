"""A model's linear layers tuned on a farm of GPUs (tuning/farm.py): each (layer, bucket) that
the cache lacks goes to a free server, which runs the portfolio for it on its own GPU and sends
back the cache entry it made (the manifest and kernel.so); the head writes each into its own
cache as it lands, then loads every kernel from there (portfolio.prepare).

    scripts/rpc-farm.sh --key h100                      # on each GPU host (tvm_explorer/farm.py)
    linear.prepare(model, rpc_tracker="host1:9190", rpc_key="h100")
    tvm-explorer linear --shape 4096x4096 --shape 11008x4096 --rpc-tracker host1:9190 --rpc-key h100

The farm's own machinery (tuning.farm.FarmClient) hands each pair to a free server, at most
SESSIONS per server at once. A server lost or hung with a pair costs that pair only: it goes to
the next free server, one line says so, and after LOST_TRIES servers it is tuned here, as are
those no server could tune (a server whose worker hangs on a pair kills it and says so, within
1/SESSIONS of the head's wait) and those left when the farm has gone. A pair is in the cache as soon
as it lands, so a head killed mid-way resumes from the cache, tuning nothing again. An entry
made on a server is keyed by the server's GPU and versions (its manifest's key): where they are
not the head's, the head does not use it, and portfolio.prepare says so in one line and tunes
that pair here.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Callable

from schedules.errors import FarmGone, UsageError
from tuning.candidates import BUILD_TIMEOUT_S, RUN_TIMEOUT_S, error_summary
from tuning.farm import (LOST_TRIES, SESSIONS, SETUP_S, FarmClient, ServersLost, Unreached,
                         say_here)

from . import portfolio
from .buckets import Bucket
from .cache import LIBRARY, MANIFEST, Cache
from .candidates import LayerShape, candidates

TUNE = "explorer.linear.tune"  # the servers' remote function (PairServer)


class _Left(Exception):
    """A pair the farm did not tune, left to this machine, with the line that says why (none
    where client.call has said it)."""


def _request(layer: LayerShape, bucket: Bucket, max_tokens: int, lost_after: float) -> str:
    """A (layer, bucket) as a server is asked to tune it, JSON, with how long the head waits
    for the answer (`lost_after`, which bounds the server's wait on its worker)."""
    return json.dumps({"layer": dataclasses.asdict(layer), "bucket": [bucket.first, bucket.last],
                       "max_tokens": max_tokens, "lost_after": lost_after})


def _asked(request: dict) -> tuple[LayerShape, Bucket, int]:
    """The (layer, bucket, max_tokens) of a request (_request)."""
    return (LayerShape(**request["layer"]), Bucket(*request["bucket"]), request["max_tokens"])


def _label(layer: LayerShape, bucket: Bucket) -> str:
    return f"{layer.label()} {bucket.label()}"


# -- a server: one (layer, bucket) tuned on its GPU ----------------------------------------------


def _ready() -> None:
    """Nothing: a worker that has run it has imported torch, TVM and the project."""


def _started_worker() -> tuple[ProcessPoolExecutor, Future]:
    """A worker process for PairServer, started now (not at the first pair, which would wait
    for its imports), and the future of its being ready (_ready run)."""
    worker = ProcessPoolExecutor(1, mp_context=get_context("spawn"))
    return worker, worker.submit(_ready)


class _Hung(Exception):
    """A worker that gave no answer in time, with the line that says so."""


def _answer(future: Future, bound_s: float, what: str):
    """`future`'s result within `bound_s`; _Hung, saying that the worker gave no answer `what`
    in that time, where it has none by then (a TimeoutError of the worker's own is raised)."""
    try:
        return future.result(timeout=bound_s)
    except TimeoutError:
        if future.done():
            raise
        raise _Hung(f"its worker gave no answer {what} in {bound_s:.0f} s; the worker is "
                    "killed") from None


def _ended(worker: ProcessPoolExecutor) -> None:
    """`worker` ended now, busy or not: its process killed (shutdown alone leaves a busy one
    running, a hung kernel for ever), then the pool shut without waiting."""
    for process in list((worker._processes or {}).values()):
        process.kill()
    worker.shutdown(wait=False, cancel_futures=True)


def _tune_pair(tuner: portfolio.Tuner, request: dict) -> dict:
    """In PairServer's worker: the pair of `request` tuned by portfolio.prepare into a cache of
    its own, which is removed after; the entry it made, as a reply holds it (its manifest, with
    the key it was made under, and its kernel.so in base64, or None where torch's is chosen)."""
    layer, bucket, max_tokens = _asked(request)
    with tempfile.TemporaryDirectory(prefix="linear-farm-") as root:
        found = portfolio.prepare([layer], (bucket,), max_tokens, Cache(root), say_here,
                                  say_here, tuner)
        directory = found[layer].kernels[0].entry
        with open(os.path.join(directory, MANIFEST)) as f:
            manifest = json.load(f)
        library = None
        if manifest["built"]:
            with open(os.path.join(directory, LIBRARY), "rb") as f:
                library = base64.b64encode(f.read()).decode()
    return {"manifest": manifest, "library": library}


class PairServer:
    """The servers' remote function TUNE (tvm_explorer/farm.py registers it): a (layer, bucket)
    tuned by portfolio.prepare with `tuner` in this server's worker process, so that a kernel
    that faults takes the worker, not the server, and one pair at a time, so that each pair's
    timings have this GPU to themselves (a second session waits for the first). The worker,
    once started, has a 1/SESSIONS share of the head's wait for the pair (a pair may wait on
    the lock for one other's share): a worker that fails or has not answered by then is
    killed and replaced, and the reply, due before the head gives up on this server, is the
    error (the head then tunes the pair itself, as any a server could not tune). Replies with
    JSON: the entry made (_tune_pair) or the error, with the server's name and the seconds it
    took."""

    def __init__(self, tuner: portfolio.Tuner | None = None):
        self.tuner = tuner or portfolio.Tuner()
        self.lock = threading.Lock()
        self.worker, self.ready = _started_worker()

    def __call__(self, request: str) -> str:
        asked = json.loads(request)
        label = _label(*_asked(asked)[:2])
        say_here(f"tuning {label}")
        with self.lock:
            started = time.monotonic()
            reply = self._tuned(asked, asked["lost_after"] / SESSIONS)
        seconds = time.monotonic() - started
        say_here(f"{label}: {reply.get('error') or reply['manifest']['choice']} in {seconds:.1f} s")
        server = f"{os.environ.get('FARM_SERVER', 'a server')} on {socket.gethostname()}"
        return json.dumps({**reply, "server": server, "seconds": seconds})

    def _tuned(self, asked: dict, bound_s: float) -> dict:
        """The worker's reply to `asked` within `bound_s` of its being ready (its start is the
        server's setup, which the head's wait allows SETUP_S for apart); else the error, the
        worker ended (_ended) and a new one started."""
        try:
            _answer(self.ready, SETUP_S, "to start")
            tuning = self.worker.submit(_tune_pair, self.tuner, asked)
            return _answer(tuning, bound_s, "to the pair")
        except _Hung as e:
            error = str(e)
        except Exception as e:  # noqa: BLE001  the pair's failure, or its worker's end
            error = error_summary(f"{type(e).__name__}: {e}")
        _ended(self.worker)
        self.worker, self.ready = _started_worker()
        return {"error": error}


# -- the head: the pairs the cache lacks sent to the farm, then loaded from the cache ------------


def _write(cache: Cache, reply: dict):
    """A server's entry written into `cache` under the key it was made with (the server's GPU
    and versions)."""
    manifest = dict(reply["manifest"])
    key = manifest.pop("key")
    manifest.pop("built")
    library = None if reply["library"] is None else base64.b64decode(reply["library"])

    def write_library(path: str) -> None:
        with open(path, "wb") as f:
            f.write(library)

    return cache.write(key, manifest, write_library if library is not None else None)


def _lost_after(layer: LayerShape, bucket: Bucket, max_tokens: int) -> float:
    """How long the head waits on a server for a pair before it counts the server as hung:
    SETUP_S, then SESSIONS shares of the pair's candidates' build and run timeouts, summed (a
    share for the pair and one for each other pair its server may tune first). PairServer gives
    its worker 1/SESSIONS of it."""
    return SETUP_S + SESSIONS * len(candidates(layer, bucket, max_tokens)) * (
        BUILD_TIMEOUT_S + RUN_TIMEOUT_S)


def _on_a_server(client: FarmClient, layer: LayerShape, bucket: Bucket, max_tokens: int,
                 cache: Cache, lost_after_s: float | None) -> str:
    """The pair tuned on the first free server and written into `cache`; the line that says
    so. _Left where the farm did not tune it: LOST_TRIES servers lost it (client.call said so),
    none could be reached, or the server could not tune it."""
    label = _label(layer, bucket)
    lost_after = lost_after_s or _lost_after(layer, bucket, max_tokens)
    try:
        answer = client.call(TUNE, _request(layer, bucket, max_tokens, lost_after),
                             lost_after, label, ("it goes to the next free server",
                                                 f"{LOST_TRIES} servers lost it: it is tuned here"))
    except ServersLost:
        raise _Left() from None
    except Unreached as e:
        raise _Left(f"farm: no server reached for {label} ({e}); it is tuned here") from None
    reply = json.loads(answer)
    if "error" in reply:
        raise _Left(f"farm: {reply['server']} could not tune {label} ({reply['error']}); it is "
                    "tuned here")
    _write(cache, reply)
    return (f"{label}: {reply['manifest']['choice']}, tuned on {reply['server']} in "
            f"{reply['seconds']:.0f} s")


def _tune_on_farm(client: FarmClient, pairs: list[tuple[LayerShape, Bucket]], max_tokens: int,
                  cache: Cache, say: Callable[[str], None], warn: Callable[[str], None],
                  lost_after_s: float | None) -> None:
    """Each of `pairs` tuned on the farm, SESSIONS per server at once, and written into `cache`
    as it lands; one line for each (to `warn` for those left to this machine, and one for all
    those left when the farm has gone). On Ctrl-C no pair is sent again, and those in flight
    are awaited as they land, one line saying so; a second Ctrl-C abandons them
    (client.abandon: their servers' work is lost) rather than wait the minutes one may take."""
    gone, futures, reported = 0, [], set()
    pool = ThreadPoolExecutor(client.servers * SESSIONS)
    try:
        for layer, bucket in pairs:
            futures.append(pool.submit(_on_a_server, client, layer, bucket, max_tokens, cache,
                                       lost_after_s))
        for done in as_completed(futures):
            reported.add(done)
            gone += _report(done, say, warn)
    except KeyboardInterrupt:
        try:
            pool.shutdown(wait=False, cancel_futures=True)
            _await_in_flight([f for f in futures if f not in reported and not f.cancelled()],
                             say, warn)
        finally:  # a second Ctrl-C, wherever it comes
            client.abandon()
        raise
    finally:  # a refusal or Ctrl-C: no pair is sent again
        pool.shutdown(wait=True, cancel_futures=True)
    if gone:
        warn(f"farm: {client.stopped_by}; the {gone} (layer, bucket) pair{'s' * (gone > 1)} it "
             f"had not tuned {'are' if gone > 1 else 'is'} tuned here")


def _report(done: Future, say: Callable[[str], None], warn: Callable[[str], None]) -> bool:
    """Say how a pair's request ended (to `warn` where it is left to this machine); True where
    the farm had gone before it was tuned, which the caller says once for all such pairs."""
    try:
        say(done.result())
    except _Left as e:
        if e.args:
            warn(e.args[0])
    except FarmGone:
        return True
    return False


def _await_in_flight(flying: list[Future], say: Callable[[str], None],
                     warn: Callable[[str], None]) -> None:
    """After Ctrl-C: the pairs `flying` are written into the cache as their servers answer,
    which one line says first, and each said as it lands (_report)."""
    waiting = sum(not f.done() for f in flying)
    if waiting:
        warn(f"interrupted: no pair is sent again; the {waiting} in flight are written into the "
             "cache as their servers answer (Ctrl-C again to abandon them)")
    for done in as_completed(flying):
        _report(done, say, warn)


def refuse_empty(tracker: str, key: str) -> None:
    """A farm named with an empty (or blank) tracker or key refused (UsageError), so that it is
    not taken for no farm, which would quietly tune everything here."""
    if not tracker.strip() or not key.strip():
        raise UsageError(f"a farm is named by its tracker's host:port and its servers' key, "
                         f"neither empty; not tracker {tracker!r} and key {key!r}")


def _missing(cache: Cache, key: dict) -> bool:
    """Whether `cache` has no entry for `key` (a corrupt one is portfolio.prepare's to name,
    remove and tune again)."""
    return not os.path.isdir(cache.directory(key))


def prepare(layers: list[LayerShape], buckets: tuple[Bucket, ...], max_tokens: int,
            tracker: str, key: str, cache: Cache | None = None,
            say: Callable[[str], None] = print, warn: Callable[[str], None] = print, *,
            tuner: portfolio.Tuner | None = None, lost_after_s: float | None = None) -> dict:
    """portfolio.prepare with the farm under `key` at `tracker` (host:port): the (layer,
    bucket) pairs the cache lacks are tuned on its servers first (`lost_after_s`: how long one
    may take before its server counts as hung; by default its candidates' builds and runs at
    their timeouts), then portfolio.prepare (with `tuner`) loads every pair from the cache and
    tunes here what the farm did not. An empty tracker or key, a tracker that cannot be
    reached, or one with no server under `key`, is refused (UsageError) before anything is
    tuned."""
    refuse_empty(tracker, key)
    cache, tuner = cache or Cache(), tuner or portfolio.Tuner()
    client = FarmClient(tracker, key, say=warn)
    gpu = tuner.gpu()
    pairs = [(layer, bucket) for layer in dict.fromkeys(layers) for bucket in buckets
             if _missing(cache, portfolio.cache_key(layer, bucket, max_tokens, gpu))]
    if pairs:
        say(f"tuning {len(pairs)} (layer, bucket) pair{'s' * (len(pairs) > 1)} on the farm at "
            f"{tracker} ({client.servers} server{'s' * (client.servers > 1)} under key "
            f"'{key}'); cache: {cache.root}")
        _tune_on_farm(client, pairs, max_tokens, cache, say, warn, lost_after_s)
    return portfolio.prepare(layers, buckets, max_tokens, cache, say, warn, tuner)
