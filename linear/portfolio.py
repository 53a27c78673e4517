"""Choosing each bucket's kernel by measurement: build every candidate (in parallel worker
processes), check each against float64 at the bucket's probe Ms, time the correct ones there,
keep the fastest, and cache it with its binary.

    kernels = prepare([LayerShape(4096, 4096, "bfloat16")], buckets, max_tokens=4096)

A candidate that fails its check at any probe M is never ranked or cached. A bucket's score is
each candidate's mean, over the probe Ms, of its time over the fastest's at that M.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing import get_context
from typing import Callable

import torch
import tvm

from schedules.errors import KernelFailed
from schedules.workloads import FP8_BLOCK
from tuning import loader, measure
from tuning.candidates import build_workers, usable_cpus
from tuning.progress import Progress

from .buckets import Bucket, BucketTable
from .cache import Cache, CorruptEntry, code_version
from .candidates import TORCH, Candidate, LayerShape, build_candidate, candidates, launcher

FLUSH = "read"  # a model's layers find their weights in DRAM: each launch after an L2 flush
PROBE_BUDGET_MS = 60.0  # timing budget of one candidate at one probe M


@dataclass
class BucketKernel:
    """A bucket's chosen kernel: its candidate, `run(x2d, weight) -> y2d`, where it came from
    ("cache" or "measured"), and what every candidate measured (by name: status, times_ms by
    probe M, or the error)."""

    candidate: Candidate
    run: Callable
    source: str
    measured: dict = field(default_factory=dict)
    entry: str | None = None  # the cache entry's directory


@dataclass
class LayerKernels:
    """The kernels of one layer shape: one per bucket, found by `table`."""

    layer: LayerShape
    table: BucketTable
    kernels: list[BucketKernel] = field(default_factory=list)

    def for_rows(self, m: int) -> BucketKernel:
        return self.kernels[self.table.index(m)]


@functools.lru_cache(maxsize=1)
def _code() -> str:
    return code_version()


def cache_key(layer: LayerShape, bucket: Bucket, max_tokens: int, gpu: dict) -> dict:
    """What a bucket's cached choice depends on: the layer, the bucket and the most rows its
    kernel takes, the GPU, TVM and its FFI, and the project's kernel code."""
    return {"layer": layer.label(), "bucket": bucket.label(), "most_rows": bucket.most(max_tokens),
            "gpu": gpu["name"], "compute_capability": gpu["compute_capability"],
            **loader.versions_here(), "code": _code()}


def _arch(gpu: dict) -> str:
    return "sm_" + gpu["compute_capability"].replace(".", "")


def _build_to_file(job: tuple) -> str:
    """Build one candidate into a kernel.so of its own (in a worker process); its path."""
    layer, bucket, candidate, max_tokens, arch = job
    executable = build_candidate(layer, bucket, candidate, max_tokens, arch)
    path = os.path.join(tempfile.mkdtemp(prefix="linear-candidate-"), "kernel.so")
    executable.export_library(path)
    return path


def _load(path: str):
    """The entry function of a built kernel.so."""
    return tvm.runtime.load_module(path)["main"]


@dataclass
class Pending:
    """A (layer, bucket) without a usable cache entry: its candidates and, once built, their
    libraries (or why they failed)."""

    layer: LayerShape
    bucket: Bucket
    key: dict
    candidates: list[Candidate]
    built: dict = field(default_factory=dict)  # candidate -> kernel.so path, or BaseException


def _build_all(pending: list[Pending], max_tokens: int, arch: str,
               say: Callable[[str], None]) -> None:
    """Build every TVM candidate of every pending bucket, in FARM_BUILD_WORKERS processes where
    set (build_workers), else this host's usable CPUs less one, at most 16 and at most one per
    candidate (each process costs a start)."""
    jobs = [(p, c) for p in pending for c in p.candidates if c.built]
    if not jobs:
        return
    started = time.perf_counter()
    workers = build_workers(max(1, min(16, usable_cpus() - 1, len(jobs))))
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool, \
            contextlib.closing(Progress(len(jobs), "building", "candidate")) as progress:
        futures = [(p, c, pool.submit(_build_to_file, (p.layer, p.bucket, c, max_tokens, arch)))
                   for p, c in jobs]
        for done, (p, c, future) in enumerate(futures, 1):
            try:
                p.built[c] = future.result()
            except Exception as e:  # noqa: BLE001  a candidate that fails to build is left out
                p.built[c] = e
            progress.step()
            if not progress.shown and (done % 10 == 0 or done == len(futures)):
                say(f"built {done}/{len(futures)} candidates "
                    f"({time.perf_counter() - started:.0f} s; {progress.pace()})")


def _scale(layer: LayerShape, rows: int, gen, weight: bool):
    """An fp8 operand's float32 scale as the layer takes it (x's of `rows` rows, or the
    weight's): one element per tensor, one per row, or one per block, uniform in
    measure.FP8_SCALE_RANGE."""
    low, high = measure.FP8_SCALE_RANGE
    shape = layer.weight_scale_shape() if weight else layer.x_scale_shape((rows,))
    return torch.rand(shape, generator=gen, device="cuda") * (high - low) + low


def _operand(layer: LayerShape, rows: int, gen, weight: bool = False) -> tuple:
    """An operand of `rows` x in_features (x's, or the `weight`), standard-normal in the layer's
    dtype, and (fp8) its scale: (x,) or (x, x_scale), and so for the weight."""
    values = torch.randn((rows, layer.in_features), generator=gen, device="cuda").to(
        measure.torch_dtype(layer.dtype))
    return (values, _scale(layer, rows, gen, weight)) if layer.is_fp8 else (values,)


def dequantized(layer: LayerShape, values, scale=None, weight: bool = False):
    """An operand's values (x's rows, or the `weight`) in float64, times its scale where it has
    one (block scales: each block's; a weight's blocks are 128 rows high, x's one)."""
    if scale is None:
        return values.double()
    if layer.block_scaled:
        return measure.block_dequantize(values, scale, FP8_BLOCK if weight else 1, torch.float64)
    return values.double() * scale.double()


class _Probe:
    """A layer's operands at one probe M on the GPU, with their float64 answer: `args` are what
    a candidate's run takes (x, then the weight; fp8: each with its scale; then the layer's
    bias, where it has one, standard-normal in its output dtype)."""

    def __init__(self, layer: LayerShape, m: int, weight: tuple):
        gen = torch.Generator(device="cuda").manual_seed(m)
        self.m, self.layer = m, layer
        x = _operand(layer, m, gen)
        bias = (torch.randn(layer.out_features, generator=gen, device="cuda").to(
            measure.torch_dtype(layer.out_dtype)),) if layer.bias else ()
        self.args = (*x, *weight, *bias)
        self.reference = dequantized(layer, *x) @ dequantized(layer, *weight, weight=True).T \
            + (bias[0].double() if bias else 0)

    def error(self, run: Callable) -> float:
        """The relative error of run(*args) against float64, its output first poisoned: the
        output's memory is filled with NaN and freed just before the run allocates it."""
        poison = torch.full((self.m, self.layer.out_features), float("nan"), device="cuda",
                            dtype=measure.torch_dtype(self.layer.out_dtype))
        del poison
        out = run(*self.args)
        torch.cuda.synchronize()
        return measure.relative_error(out, self.reference)


def _check(run: Callable, probes: list[_Probe], tolerance: float) -> tuple[dict, str | None]:
    """The relative error of `run` at each probe M, and why it is not correct (an error over
    `tolerance`, or what it raised: a call torch's own rules refuse) in words, None where it
    is."""
    try:
        errors = {probe.m: probe.error(run) for probe in probes}
    except Exception as e:  # noqa: BLE001  a candidate that cannot run this layer is left out
        return {}, f"raised {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    wrong = {m: e for m, e in errors.items() if not e <= tolerance}
    return errors, ("relative error " + ", ".join(f"{e:.3g} at M={m}" for m, e in wrong.items())
                    if wrong else None)


def _measure_bucket(p: Pending, max_tokens: int) -> tuple[dict, dict]:
    """Check and time each candidate of a pending bucket at its probe Ms. Returns, per candidate
    name, {"status", "times_ms" | "error"}, and the runs of the correct ones by name."""
    weight = _operand(p.layer, p.layer.out_features,
                      torch.Generator(device="cuda").manual_seed(0), weight=True)
    probes = [_Probe(p.layer, m, weight) for m in p.bucket.probes(max_tokens)]
    tolerance = measure.tolerance(p.layer.gemm(1))
    results, runs = {}, {}
    for candidate in p.candidates:
        built = p.built.get(candidate)
        if isinstance(built, BaseException):
            results[candidate.name] = {"status": "failed", "error": f"build: {built}"[:300]}
            continue
        run = launcher(candidate, p.layer, _load(built) if built else None)
        errors, wrong = _check(run, probes, tolerance)
        if wrong:
            results[candidate.name] = {"status": "failed", "error": wrong}
            continue
        times = {probe.m: measure.time_kernel(functools.partial(run, *probe.args), FLUSH,
                                              budget_ms=PROBE_BUDGET_MS).median_ms
                 for probe in probes}
        results[candidate.name] = {"status": "ok", "times_ms": times, "errors": errors}
        runs[candidate.name] = run
    return results, runs


def _choose(results: dict) -> str:
    """The correct candidate whose mean time over the fastest, probe by probe, is least."""
    correct = {name: r["times_ms"] for name, r in results.items() if r["status"] == "ok"}
    if not correct:
        raise KernelFailed("no candidate ran correctly: " + "; ".join(
            f"{name}: {r['error']}" for name, r in results.items()))
    probes = next(iter(correct.values())).keys()
    fastest = {m: min(times[m] for times in correct.values()) for m in probes}
    return min(correct, key=lambda name: sum(correct[name][m] / fastest[m] for m in probes))


def _tune(p: Pending, max_tokens: int, cache: Cache, say: Callable[[str], None]) -> BucketKernel:
    """Measure a pending bucket's candidates, cache the fastest correct one, and return it."""
    results, runs = _measure_bucket(p, max_tokens)
    name = _choose(results)
    chosen = next(c for c in p.candidates if c.name == name)
    manifest = {"choice": name, "rung": chosen.rung, "knobs": dict(chosen.knobs),
                "measured": {n: _jsonable(r) for n, r in results.items()},
                "timing": measure.timing_method(FLUSH),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    library = functools.partial(shutil.copyfile, p.built[chosen]) if chosen.built else None
    entry = cache.write(p.key, manifest, library)
    times = results[name]["times_ms"]
    torch_times = results.get(TORCH, {}).get("times_ms", {})
    say(f"{p.layer.label()} {p.bucket.label()}: {name} "
        + ", ".join(f"M={m} {t * 1000:.1f} us" + (f" (torch {torch_times[m] * 1000:.1f})"
                                                  if m in torch_times else "")
                    for m, t in times.items()))
    return BucketKernel(chosen, runs[name], "measured", manifest["measured"], entry.directory)


def _jsonable(result: dict) -> dict:
    """A candidate's result with its per-M maps keyed by strings (JSON's keys)."""
    return {k: ({str(m): v for m, v in value.items()} if isinstance(value, dict) else value)
            for k, value in result.items()}


def _from_cache(layer: LayerShape, bucket: Bucket, key: dict, cache: Cache,
                warn: Callable[[str], None]) -> BucketKernel | None:
    """The bucket's cached kernel, loaded; None (after one line saying why, where an entry was
    there) where it must be measured again."""
    try:
        entry = cache.read(key)
    except CorruptEntry as e:
        warn(f"{layer.label()} {bucket.label()}: {e}; removed, measuring again")
        cache.remove(key)
        return None
    if entry is None:
        stale = cache.stale_reason(key)
        if stale:
            warn(f"{layer.label()} {bucket.label()}: {stale}; measuring again for this one")
        return None
    manifest = entry.manifest
    candidate = Candidate(manifest["rung"], tuple(sorted(manifest["knobs"].items())))
    try:
        function = _load(entry.library) if entry.library else None
    except Exception as e:  # noqa: BLE001  a library TVM cannot load: corrupt
        warn(f"{layer.label()} {bucket.label()}: cannot load {entry.library} "
             f"({str(e).splitlines()[0][:120]}); removed, measuring again")
        cache.remove(key)
        return None
    return BucketKernel(candidate, launcher(candidate, layer, function), "cache",
                        manifest.get("measured", {}), entry.directory)


class Tuner:
    """How a portfolio tunes the buckets the cache lacks, on this machine: the GPU it measures on
    (which cache keys name) and the measuring. A farm's servers tune with a Tuner of their own,
    on their own GPUs (tvm_explorer/farm.py gives each PairServer this default one); the farm's
    CPU tests stand in for the GPU with a Tuner subclass, on the head and the servers alike."""

    def gpu(self) -> dict:
        """This machine's GPU (loader.gpu_here); KernelFailed without one."""
        gpu = loader.gpu_here()
        if gpu is None:
            raise KernelFailed("linear layers choose their kernels by measuring them on a CUDA "
                               "GPU, and torch sees none here")
        return gpu

    def tune(self, pending: list[Pending], max_tokens: int, gpu: dict, cache: Cache,
             say: Callable[[str], None]) -> list[BucketKernel]:
        """Each pending bucket's kernel, chosen by measurement and cached (all buckets'
        candidates built together first), in the order of `pending`."""
        _build_all(pending, max_tokens, _arch(gpu), say)
        progress = Progress(len(pending), "measuring", "bucket", bar=False)
        try:
            return [_tune(p, max_tokens, cache, lambda line: say(progress.counted(line)))
                    for p in pending]
        finally:
            for p in pending:  # the candidates' own libraries: the chosen ones are cached
                for path in p.built.values():
                    if isinstance(path, str):
                        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _look_up(found: dict[LayerShape, LayerKernels], max_tokens: int, gpu: dict, cache: Cache,
             warn: Callable[[str], None]) -> list[tuple[int, Pending]]:
    """Fill the buckets of `found` from the cache; the (index, Pending) of each it lacks."""
    pending = []
    for layer, kernels in found.items():
        for i, bucket in enumerate(kernels.table.buckets):
            key = cache_key(layer, bucket, max_tokens, gpu)
            kernels.kernels[i] = _from_cache(layer, bucket, key, cache, warn)
            if kernels.kernels[i] is None:
                pending.append((i, Pending(layer, bucket, key,
                                            candidates(layer, bucket, max_tokens))))
    return pending


def _still_pending(found: dict[LayerShape, LayerKernels], pending: list[tuple[int, Pending]],
                   cache: Cache) -> list[tuple[int, Pending]]:
    """Those of `pending` that the cache still lacks; the others (cached by another process
    while this one waited for their locks) loaded into `found`. Nothing is said: the first
    look-up said why each was missing."""
    left = []
    for i, p in pending:
        found[p.layer].kernels[i] = _from_cache(p.layer, p.bucket, p.key, cache, lambda line: None)
        if found[p.layer].kernels[i] is None:
            left.append((i, p))
    return left


def prepare(layers: list[LayerShape], buckets: tuple[Bucket, ...], max_tokens: int,
            cache: Cache | None = None, say: Callable[[str], None] = print,
            warn: Callable[[str], None] = print, tuner: Tuner | None = None
            ) -> dict[LayerShape, LayerKernels]:
    """Every layer's kernels for every bucket: from the cache where it holds them, else chosen
    by measurement now (`tuner`, by default on this GPU) and cached, under the locks of those
    entries (a process that was measuring some of them meanwhile is waited for, and what it
    cached loaded)."""
    cache, tuner = cache or Cache(), tuner or Tuner()
    gpu = tuner.gpu()
    found = {layer: LayerKernels(layer, BucketTable(buckets), [None] * len(buckets))
             for layer in dict.fromkeys(layers)}
    pending = _look_up(found, max_tokens, gpu, cache, warn)
    if not pending:
        return found
    with cache.locked([p.key for _, p in pending], say):
        pending = _still_pending(found, pending, cache)
        if pending:
            say(f"measuring {len(pending)} of {len(found) * len(buckets)} (layer, bucket) "
                f"pairs ({sum(len(p.candidates) for _, p in pending)} candidates); "
                f"cache: {cache.root}")
            tuned = tuner.tune([p for _, p in pending], max_tokens, gpu, cache, say)
            for (i, p), kernel in zip(pending, tuned):
                found[p.layer].kernels[i] = kernel
    return found
