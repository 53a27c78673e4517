"""A search, from its settings to its summary record.

MetaSchedule (tuning/metaschedule.py) or a template search (tuning/autotvm.py), measured on this
machine's GPU, on an RPC tracker's hosts, or (MetaSchedule only) on this CPU. Settings that
cannot work are refused before anything is measured or written. The summary record is each
search's own (see theirs) with `kind: search`: what a report draws the search's table and
tuning curve from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import tvm

from schedules.errors import UsageError
from schedules.workloads import Workload

from . import autotvm, build, candidates, measure, metaschedule
from .farm import FarmBuilder, FarmRunner

LOG = logging.getLogger(__name__)  # what a library call reports, where the caller gives no say

TARGETS = ("cuda", "llvm")  # llvm: MetaSchedule on this CPU


@dataclass(frozen=True)
class Request:
    """What to search, where its state is kept, and where it is measured."""

    search: str  # "metaschedule" or "autotvm:<template>"
    trials: int  # new trials to measure
    work_dir: str | None = None  # MetaSchedule's database, reused to resume
    space: str | None = None  # MetaSchedule's design space (metaschedule.space_for)
    records: str | None = None  # a template search's records, reused to resume
    device: str | None = None  # whose records those are (autotvm.records_device)
    tuner: str | None = None  # a template search's (autotvm.TUNERS); None: the default
    seed: int = 0
    reproducible: bool = False  # the same seed proposes the same candidates (one search thread)
    target: str = "cuda"  # one of TARGETS
    arch: str = "sm_90"  # what RPC hosts' candidates are built for
    flush: str = "read"  # what runs before each timed launch on this machine's GPU
    rpc_tracker: str | None = None  # host:port of the tracker whose hosts measure
    rpc_key: str | None = None  # the key those hosts registered under

    @property
    def on_local_gpu(self) -> bool:
        """Whether the candidates run on this machine's GPU (checked, then timed here)."""
        return self.target == "cuda" and not self.rpc_tracker


def run(wl: Workload, request: Request, say: Callable[[str], None] = LOG.info,
        warn: Callable[[str], None] = LOG.warning) -> dict:
    """Search `wl` as `request` says, progress to `say` and corrupt records lines to `warn`;
    returns the search's summary record, and (in `device`, see candidates.measuring_device)
    what measured its candidates where that is not this machine's GPU: the RPC servers' device
    or this CPU."""
    search = _checked(wl, request, say, warn)
    target = _target(request)
    runner = _runner(target, wl, request, say)
    builder = (FarmBuilder() if request.rpc_tracker else
               candidates.WarmBuilder(_build_workers(request),
                                      on_built=candidates.built_candidates_to(runner)))
    builder.start(target)
    try:
        found = search(target, builder, runner)
    except Exception:
        if isinstance(runner, FarmRunner) and runner.stopped_by:  # what ended it, not TVM's
            raise runner.stopped_by from None                     # wrapping of it
        raise
    finally:
        candidates.shut_down(builder, runner)
    summary = {**found, "kind": "search", "status": "ok"}
    if not request.on_local_gpu:
        summary["device"] = (runner.servers_device if request.rpc_tracker
                             else candidates.measuring_device(runner))
    return summary


def _build_workers(request: Request) -> int:
    """How many processes build a search's candidates here: the CPUs it may use, but no more
    than a batch or its trials, which is the most that ever build at once (each process costs
    a start and a first build before the search's first batch)."""
    batch = metaschedule.BATCH if request.search == "metaschedule" else autotvm.BATCH
    return min(candidates.usable_cpus(), batch, request.trials)


def _runner(target: tvm.target.Target, wl: Workload, request: Request,
            say: Callable[[str], None]):
    """What measures the candidates. Over RPC (a tracker's host:port, and the key its servers
    registered under): the farm's servers (tuning/farm.py), which build them and measure them
    as local_runner does, there; a lost server's candidates said to `say`. Here:
    candidates.local_runner."""
    if request.rpc_tracker:
        return FarmRunner(request.rpc_tracker, request.rpc_key, wl, target, flush=request.flush,
                          say=say)
    return candidates.local_runner(candidates.device_of(target), wl, request.flush)


def _checked(wl: Workload, request: Request, say, warn) -> Callable[..., dict]:
    """The search that `request` names, its settings checked, as a function of the target,
    builder and runner it measures with."""
    if request.trials <= 0:
        raise UsageError(f"trials must be positive, not {request.trials}")
    if request.target not in TARGETS:
        raise UsageError(f"unknown target '{request.target}'; valid: {', '.join(TARGETS)}")
    if request.search == "metaschedule":
        metaschedule.check_work_dir(request.work_dir, must_exist=False)
        space = metaschedule.space_for(request.space, request.target, wl)

        def metaschedule_search(target, builder, runner):
            return metaschedule.search(wl, target, request.work_dir, request.trials, space,
                                       builder, runner, seed=request.seed, say=say,
                                       reproducible=request.reproducible,
                                       batch=metaschedule.BATCH * _servers(runner))

        return metaschedule_search
    if request.search.startswith("autotvm:"):
        tuner = request.tuner or autotvm.DEFAULT_TUNER
        if tuner not in autotvm.TUNERS:
            raise UsageError(f"unknown tuner '{tuner}'; valid: {', '.join(autotvm.TUNERS)}")
        entry, held = autotvm.named_template(wl.op, request.search[len("autotvm:"):])
        autotvm.Space.of(entry, wl, held)  # a schedule without a space (or the knobs held
        # outside it) is refused before any work

        def template_search(target, builder, runner):
            configurations = autotvm.Configurations(entry, wl, target, builder, runner)
            return autotvm.search(
                entry, wl, _template_measure(configurations, runner),
                refusal=configurations.refusal,
                path=request.records, device=request.device, tuner=tuner,
                seed=request.seed, trials=request.trials, batch=autotvm.BATCH * _servers(runner),
                in_flight=_in_flight(runner), say=say, warn=warn, held=held)

        return template_search
    raise UsageError(f"unknown search '{request.search}'; valid: metaschedule, "
                     "autotvm:<template>")


def _template_measure(configurations: autotvm.Configurations, runner):
    """How a template search measures a batch of configurations: applied, built and measured on
    a farm's servers (this host only proposes them), else applied here and measured by the
    runner."""
    if not isinstance(runner, FarmRunner):
        return configurations.measure

    def measure_on_the_farm(configs: list[dict]) -> list:
        configurations.forget(configs)
        return runner.measure_configs(configurations.entry.name, configs)

    return measure_on_the_farm


def _servers(runner) -> int:
    """How many servers measure a search's candidates: a farm's (each gets a batch of its own,
    which it builds on its host's cores while it measures), else one."""
    return runner.servers if isinstance(runner, FarmRunner) else 1


def _in_flight(runner) -> int:
    """How many batches a template search keeps in flight: a farm's sessions per server (each
    server builds the next while it measures the last), else one."""
    return runner.sessions if isinstance(runner, FarmRunner) else 1


def _target(request: Request) -> tvm.target.Target:
    """Where the candidates are measured: this CPU (llvm), the RPC tracker's hosts (built for
    request.arch), or this machine's GPU."""
    if request.target == "llvm":
        return tvm.target.Target({"kind": "llvm", "num-cores": candidates.usable_cpus()})
    if request.rpc_tracker:
        return build.cuda_target(request.arch)
    if not measure.gpu_present():
        raise UsageError("no GPU here: a CUDA search needs this machine's GPU, or remote ones "
                         "through an RPC tracker")
    return build.cuda_target(measure.device_facts()["arch"])
