"""AutoTVM's way of working, on TensorIR (TVM 0.27 no longer ships AutoTVM).

A template is a registered schedule that declares a knob space (`@schedule(..., space=...)`);
a configuration is one value per knob, passed to the schedule as its keyword arguments. A tuner
proposes the next batch of configurations from what has been measured so far:
  grid    the space in order;
  random  a seeded random order;
  xgb     AutoTVM's XGBTuner in small: after a random warm-up, an XGBoost model of knob features
          -> log speed, trained on every measured configuration (failures count as slow), ranks
          all unmeasured configurations and the batch is its best, with a few random ones.
Each configuration a tuner proposes is first put to the template's refusal check (its `refuse`
where it declares one, else applying it): a refused one is passed over, costs no trial and is
not recorded, and the tuner proposes the next instead; a search counts, and its summary says,
how many it proposed, how many were refused and how many were measured.
Each measured configuration becomes one JSON line of the records file the moment it is measured,
so an interrupted search loses nothing measured and the next run resumes. A search is one
(workload, template, device, tuner, seed): grid, random and xgb keep separate histories on the
same space, so their curves can be compared; the best of a records file is the best of them all.
A search ends with its summary record (the best configuration and the tuning curve), for the
report.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import math
import random
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Callable

import numpy as np
import tvm

import schedules
from schedules.errors import RecordsError, ScheduleNotApplicable, SearchFailed, UsageError
from schedules.registry import ScheduleEntry, TunedSchedule, with_knob_text
from schedules.workloads import Workload

from . import candidates, measure
from . import records as store
from .candidates import Counts, Outcome, Status
from .progress import Progress


BATCH = 16  # configurations built in parallel, then run one after another


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


@dataclass(frozen=True)
class Space:
    """The cartesian product of a template's knob values, in declaration order."""

    knobs: dict

    @classmethod
    def of(cls, entry: ScheduleEntry, wl: Workload, held: dict | None = None) -> "Space":
        """`entry`'s space as a search of `wl` draws from it (less the values `wl` never
        takes, the `held` knobs at their one value: ScheduleEntry.space_for)."""
        if not entry.space:
            raise UsageError(f"{entry.op}/{entry.name} declares no knob space to search")
        return cls(entry.space_for(wl, held))

    def configs(self) -> list[dict]:
        return [dict(zip(self.knobs, values)) for values in itertools.product(*self.knobs.values())]

    def __len__(self) -> int:
        return math.prod(len(values) for values in self.knobs.values())

    def features(self, config: dict) -> list[float]:
        """Numbers a model can split on: log2 of sizes, 0/1 for switches, 0 for None."""
        return [_feature(config[k]) for k in self.knobs]

    def feature_matrix(self, configs: list[dict]) -> np.ndarray:
        """Each configuration's features() as a row, worked out a knob at a time from its few
        values: the xgb tuner scores every unmeasured configuration each batch (v8's space
        holds 2,488,320)."""
        columns = []
        for knob, values in self.knobs.items():
            table = {value: _feature(value) for value in values}
            columns.append(np.fromiter((table[v] if (v := c[knob]) in table else _feature(v)
                                        for c in configs), float, len(configs)))
        return np.stack(columns, axis=1)


def _feature(value) -> float:
    if isinstance(value, bool) or value is None:
        return float(bool(value))
    return math.log2(value) if value > 0 else float(value)


History = dict  # config_key -> Outcome


def best(history: History) -> tuple[dict, float] | None:
    """The fastest correct configuration and its time (ms), or None."""
    timed = [(json.loads(k), o.time_ms) for k, o in history.items() if o.status == Status.OK]
    return min(timed, key=lambda item: item[1]) if timed else None


def _unmeasured(configs: list[dict], history: History, pending=frozenset()) -> list[dict]:
    """The configurations neither measured (in `history`) nor `pending` (keys of those known
    otherwise: in flight, or measured but not yet shown to the tuner)."""
    return _without(configs, history.keys() | pending)


def _without(configs: list[dict], keys) -> list[dict]:
    """`configs` (a space's, each with its knobs in the space's order) but those whose
    config_key is in `keys`, in order, compared by their values in that order: writing every
    configuration of a large space (v8's: 2,488,320) as its key, batch after batch, held a farm's
    search back more than measuring did."""
    if not keys or not configs:
        return list(configs)
    order = tuple(configs[0])
    known = {tuple(config[knob] for knob in order) for config in map(json.loads, keys)
             if config.keys() == set(order)}  # a key with other knobs matches none of them
    return [c for c in configs if tuple(c.values()) not in known]


def _taken(config: dict) -> bool:
    """A tuner's `takes` where nothing is refused."""
    return True


def _first_taken(ordered: list[dict], n: int, takes: Callable[[dict], bool]
                 ) -> tuple[list[dict], list[dict]]:
    """The first `n` configurations of `ordered` that `takes` accepts, and those after the last
    one it was asked about."""
    chosen = []
    for at, config in enumerate(ordered):
        if len(chosen) == n:
            return chosen, ordered[at:]
        if takes(config):
            chosen.append(config)
    return chosen, []


class GridTuner:
    """Every configuration, in the space's order."""

    def __init__(self, seed: int = 0):
        pass

    def propose(self, space: Space, configs: list[dict], history: History, n: int,
                takes: Callable[[dict], bool] = _taken, pending=frozenset()) -> list[dict]:
        """The next `n` configurations neither measured nor `pending` that `takes` accepts
        (tune's refusal check: one it refuses is passed over, and asked about once)."""
        return _first_taken(_unmeasured(configs, history, pending), n, takes)[0]


class RandomTuner:
    """Configurations in a seeded random order. Each batch draws from a stream seeded by the
    seed and how many configurations are known (measured or pending), so what a tuner proposes
    depends on its seed and what it knows only: a search killed between batches and resumed
    from its records proposes what it would have proposed undisturbed."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def propose(self, space: Space, configs: list[dict], history: History, n: int,
                takes: Callable[[dict], bool] = _taken, pending=frozenset()) -> list[dict]:
        self._reseed(len(history) + len(pending))
        return self._draw(_unmeasured(configs, history, pending), n, takes)

    def _reseed(self, known: int) -> None:
        """This batch's random stream: the seed's, at `known` configurations."""
        self.rng = random.Random(f"{self.seed}/{known}")

    def _draw(self, left: list[dict], n: int, takes: Callable[[dict], bool]) -> list[dict]:
        """Up to `n` of `left` at random that `takes` accepts, each asked about once: drawn as
        many at a time as are still wanted, so that where all are taken it is one sample of
        `n` (the same seed, the same order)."""
        chosen: list[dict] = []
        left = list(left)
        while len(chosen) < n and left:
            # positions, not configurations: the same draw as sampling `left` itself, and
            # those asked leave `left` in place (thousands of draws where most are refused)
            drawn = self.rng.sample(range(len(left)), min(n - len(chosen), len(left)))
            chosen += filter(takes, (left[at] for at in drawn))
            for at in sorted(drawn, reverse=True):
                del left[at]
        return chosen


class XGBTuner(RandomTuner):
    """Random until `warmup` configurations are measured; then the model's best, with
    `explore` of each batch still random."""

    def __init__(self, seed: int = 0, warmup: int = 8, explore: float = 0.2):
        super().__init__(seed)
        self.warmup, self.explore = warmup, explore

    def propose(self, space: Space, configs: list[dict], history: History, n: int,
                takes: Callable[[dict], bool] = _taken, pending=frozenset()) -> list[dict]:
        """The model's `n` best that `takes` accepts (trained on `history`; `pending` ones
        never proposed), `explore` of them drawn at random from the rest instead."""
        self._reseed(len(history) + len(pending))
        left = _unmeasured(configs, history, pending)
        speeds = {k: -math.log(o.time_ms) for k, o in history.items() if o.status == Status.OK}
        if len(history) < self.warmup or not speeds:  # the model's first data: a small batch
            return super().propose(space, configs, history,
                                   min(n, max(1, self.warmup - len(history))), takes, pending)
        import xgboost  # lazy: only the xgb tuner needs it, and it is slow to import

        slowest = min(speeds.values()) - 1.0  # failed configurations: worse than any that ran
        keys = list(history)
        features = space.feature_matrix([json.loads(k) for k in keys])
        target = np.array([speeds.get(k, slowest) for k in keys])
        params = {"max_depth": 4, "eta": 0.3, "seed": self.seed, "nthread": 1}
        model = xgboost.train(params, xgboost.DMatrix(features, label=target), num_boost_round=100)
        scores = model.predict(xgboost.DMatrix(space.feature_matrix(left)))
        ranked = [left[i] for i in np.argsort(-scores, kind="stable")]
        chosen, rest = _first_taken(ranked, n - int(n * self.explore), takes)
        return chosen + self._draw(rest, n - len(chosen), takes)


TUNERS = {"grid": GridTuner, "random": RandomTuner, "xgb": XGBTuner}
DEFAULT_TUNER = "xgb"


def tune(space: Space, tuner, measure: Callable[[list[dict]], list[Outcome]], history: History,
         trials: int, batch_size: int, on_measured: Callable[[dict, Outcome], None], *,
         first: tuple[dict, ...] = (),
         refusal: Callable[[dict], str | None] | None = None, in_flight: int = 1) -> Counts:
    """Measure up to `trials` configurations that `history` does not hold yet, `batch_size` at a
    time: those of `first` (in one batch), then in the order `tuner` proposes; `on_measured`
    sees (and records) each as it lands, batch by batch in the order they were proposed. Each
    proposed configuration is first put to `refusal` (the template's check: why it refuses it,
    or None): a refused one is neither measured nor proposed again, and costs no trial.
    `in_flight` batches are measured at once (a farm's: 2, so that a batch's slowest build
    overlaps the next batch), each proposed before the last has landed; the tuner then sees
    the history but its newest (in_flight - 1) batches' worth, so that what it proposes depends
    on how many configurations are known, not on when they landed, and a resumed search
    proposes what an undisturbed one did (propose_now). Returns what was proposed, refused and
    measured: fewer than `trials` measured when the space runs out."""
    counts, refused = Counts(), set()
    flying: dict[str, dict] = {}  # config key -> config: proposed, not yet landed
    landing: deque = deque()  # (batch, its future), in proposed order
    pool = concurrent.futures.ThreadPoolExecutor(in_flight) if in_flight > 1 else None

    def takes(config: dict) -> bool:
        counts.proposed += 1
        if refusal is None or refusal(config) is None:
            return True
        counts.refused += 1
        refused.add(config_key(config))
        return False

    def launch(batch: list[dict]) -> None:
        flying.update((config_key(c), c) for c in batch)
        landing.append((batch, pool.submit(measure, batch) if pool else None))

    def land() -> None:
        batch, future = landing.popleft()
        for config, outcome in zip(batch, future.result() if future else measure(batch)):
            del flying[config_key(config)]
            history[config_key(config)] = outcome
            on_measured(config, outcome)
            counts.measured += 1

    configs = space.configs()
    try:
        own = [c for c in first if config_key(c) not in history and takes(c)][:trials]
        if own:
            launch(own)
        exhausted = False
        while True:
            while (not exhausted and len(landing) < in_flight
                   and counts.measured + len(flying) < trials):
                if refused:  # out of the tuners' sight
                    configs = _without(configs, refused)
                    refused.clear()
                batch = propose_now(tuner, space, configs, history, flying,
                                    min(batch_size, trials - counts.measured - len(flying)),
                                    takes, (in_flight - 1) * batch_size)
                if batch:
                    launch(batch)
                exhausted = not batch
            if not landing:
                return counts
            land()
    finally:
        if pool:
            pool.shutdown(wait=False, cancel_futures=True)


def propose_now(tuner, space: Space, configs: list[dict], history: History, flying: dict,
                n: int, takes: Callable[[dict], bool], lag: int) -> list[dict]:
    """The tuner's next `n` with the configurations known now (measured, or `flying`): it is
    shown the history but the newest `lag` of them, which, with those in flight, it only
    must not propose again. An undisturbed search proposes with `lag` in flight; one resumed
    from its records, with none in flight, is shown the same configurations."""
    known = len(history) + len(flying)
    seen = dict(itertools.islice(history.items(), max(0, known - lag)))
    pending = (history.keys() - seen.keys()) | flying.keys()
    return tuner.propose(space, configs, seen, n, takes, pending)


class Configurations:
    """A template's configurations on one workload for one target: each put to the template's
    refusal check before anything is built (`refusal`), then measured in batches (`measure`)
    through a WarmBuilder and a runner. A template that does not take the workload with its
    own knobs is refused at once (candidates.refuse_unless_taken)."""

    def __init__(self, entry: ScheduleEntry, wl: Workload, target, builder, runner):
        candidates.refuse_unless_taken(entry, wl, target, f"autotvm:{entry.name}")
        self.entry, self.wl, self.target = entry, wl, target
        self.builder, self.runner = builder, runner
        self.applied: dict[str, object] = {}  # config key -> _apply's, until it is measured
        self.applying = threading.RLock()  # one configuration applied at a time (batches in
        # flight measure in threads; a rung's TVMScript and intrinsics are not built for two)

    def refusal(self, config: dict) -> str | None:
        """Why the template refuses `config` here, or None (candidates.refusal: a template
        without a `refuse` check is applied, and the module kept for its build)."""
        refused = candidates.refusal(self.entry, self.wl, config, self._apply)
        if refused is None:
            return None
        self.applied.pop(config_key(config), None)
        return str(refused)

    def measure(self, configs: list[dict]) -> list[Outcome]:
        """Build and run each configuration: one the template refuses after all is invalid,
        one it fails to schedule build_failed (that candidate's failure alone)."""
        applied = [self._apply(config) for config in configs]
        self.forget(configs)
        return candidates.measure_modules([as_candidate(a) for a in applied], self.target,
                                          self.builder, self.runner)

    def forget(self, configs: list[dict]) -> None:
        """Drop the modules kept for `configs` (refusal keeps a template's without a `refuse`
        check): they are being measured, here or by a farm that applies them itself."""
        for config in configs:
            self.applied.pop(config_key(config), None)

    def _apply(self, config: dict):
        """The template applied with `config` (apply_config), kept until it is measured."""
        key = config_key(config)
        with self.applying:
            if key not in self.applied:
                self.applied[key] = apply_config(self.entry, self.wl, self.target, config)
            return self.applied[key]


def apply_config(entry: ScheduleEntry, wl: Workload, target, config: dict):
    """`entry` applied to `wl` with `config`: its module, its refusal (ScheduleNotApplicable),
    or the build_failed Outcome of a schedule error (that candidate's failure alone)."""
    try:
        return entry.apply(wl, target, **config)
    except ScheduleNotApplicable as refused:
        return refused
    except Exception as e:  # noqa: BLE001  a schedule error: this candidate's failure
        return Outcome(Status.BUILD_FAILED, error=f"{type(e).__name__}: {e}"[:500])


def as_candidate(applied):
    """What candidates.measure_modules takes of apply_config's answer: a refusal becomes the
    invalid Outcome it is measured as."""
    if isinstance(applied, ScheduleNotApplicable):
        return Outcome(Status.INVALID, error=str(applied))
    return applied


# -- records ------------------------------------------------------------------------------------


def named_template(op: str, text: str) -> tuple[ScheduleEntry, dict]:
    """'v8' or 'v8:promote_k=none' (what follows `autotvm:`): the template and the knobs a
    search of it holds, read as `--schedule v8:promote_k=none` reads them."""
    base, colon, knobs = text.partition(":")
    entry = schedules.get(op, base)
    return entry, entry.parse_knobs(knobs) if colon else {}


def template_name(entry: ScheduleEntry, held: dict | None = None) -> str:
    """How records and results name a search of `entry` with `held` knobs: 'v8', or
    'v8:promote_k=none' (a search of its own, whose bests `autotvm:v8` alone never applies),
    the knobs in the template's order, however the user ordered them."""
    held = held or {}
    return with_knob_text(entry.name, [(knob, held[knob]) for knob in entry.knob_types
                                       if knob in held])


def search_key(wl: Workload, template: str, device: str, tuner: str, seed: int = 0) -> dict:
    """The fields that name one search in the records file: what was searched, on which
    device, with which TVM (a configuration's time holds for that pair only), by which tuner."""
    return {"search": "autotvm", **wl.record_key(), "schedule": template, "device": device,
            "tvm": tvm.__version__, "tuner": tuner, "seed": seed}


def trial_record(key: dict, config: dict, outcome: Outcome, trial: int, **extra) -> dict:
    """One trial's record: its search's key (less the fields it leaves None), its config and
    outcome."""
    named = {k: v for k, v in key.items() if v is not None}
    return {**named, **extra, "trial": trial, "config": config, "status": outcome.status,
            "time_ms": outcome.time_ms, "error": outcome.error}


# The fields of every trial record (trial_record), with their JSON types.
TRIAL_FIELDS = {"search": str, "schedule": str, "device": str, "tvm": str, "tuner": str,
                "config": dict, "status": str}
STATUSES = tuple(status.value for status in Status)


def trial_problem(record) -> str | None:
    """What is wrong with a template search's trial record (as `trial_record` writes them),
    field by field, in one phrase; None for one a search can resume from and `autotvm:` apply:
    its search's key, a config, a known status and, where it passed, a positive time."""
    if not isinstance(record, dict):
        return "not a trial record"
    for name, kind in TRIAL_FIELDS.items():
        if problem := store.type_problem(record, name, kind, optional=False):
            return problem
    if record["status"] not in STATUSES:
        return f"status '{record['status'][:40]}' is none of {', '.join(STATUSES)}"
    time_ms = record.get("time_ms")
    if record["status"] == Status.OK and not store.is_time(time_ms):
        return f"time_ms {json.dumps(time_ms)[:40]} of a passed trial is not a positive time"
    return store.workload_problem(record)


def trial_records(path: str, warn: Callable[[str], None]) -> list[dict]:
    """The trial records of the template searches' records file `path` that pass
    `trial_problem`; the other lines go to `warn` (records.load_and_warn) and are skipped."""
    return store.load_and_warn(path, warn, check=trial_problem, kind="trial record")


def matches(record: dict, key: dict) -> bool:
    return all(record.get(k, 0 if k == "seed" else None) == v for k, v in key.items())


def history_of(records: list[dict], key: dict, defaults: dict | None = None) -> History:
    """The measured configurations of one search, from its records (the last word wins). A
    record made before a knob joined the space ran with that knob's value in `defaults`."""
    return {config_key({**(defaults or {}), **r["config"]}):
            Outcome(Status(r["status"]), r.get("time_ms"), r.get("error"))
            for r in records if matches(r, key) and isinstance(r.get("config"), dict)}


def measured_on(records: list[dict], wl: Workload, template: str) -> set[str]:
    """The devices with correct measurements of `template` on `wl` with this TVM."""
    key = _any_device(wl, template)
    return {r.get("device") for r in records if matches(r, key) and r.get("status") == Status.OK}


def best_record(records: list[dict], wl: Workload, template: str, device: str) -> dict | None:
    """The fastest correct configuration of `template` on `wl` measured on `device` with this
    TVM, by any tuner."""
    key = {**_any_device(wl, template), "device": device}
    timed = [r for r in records if matches(r, key) and r.get("status") == Status.OK
             and isinstance(r.get("time_ms"), (int, float))]
    return min(timed, key=lambda r: r["time_ms"]) if timed else None


def _any_device(wl: Workload, template: str) -> dict:
    key = search_key(wl, template, "", "")
    del key["device"], key["tuner"], key["seed"]
    return key


def curve(records: list[dict], key: dict) -> list[tuple[int, float | None]]:
    """(trial, best correct time so far in ms) over one search's records, in measured order."""
    points, best_ms = [], None
    for n, r in enumerate((r for r in records if matches(r, key)), start=1):
        if r.get("status") == Status.OK and (best_ms is None or r["time_ms"] < best_ms):
            best_ms = r["time_ms"]
        points.append((n, best_ms))
    return points


def tuned_entry(entry: ScheduleEntry, wl: Workload, records: list[dict], path: str,
                device: str | None, held: dict | None = None):
    """`autotvm:<template>` (with `held` knobs: `autotvm:v8:promote_k=none`): the template
    with the best configuration its search measured for `wl` on `device` with this TVM. With
    no device (no GPU here), the records' one device."""
    name = template_name(entry, held)
    if device is None:
        devices = measured_on(records, wl, name)
        if len(devices) > 1:
            raise RecordsError(f"{path} has {name} measured on {', '.join(sorted(devices))}"
                               f" for {wl.label()}: say which device's best to apply")
        device = devices.pop() if devices else "this device"
    found = best_record(records, wl, name, device)
    if found is None:
        raise RecordsError(f"no correct measured configuration of {name} for "
                           f"{wl.label()} on {device} with TVM {tvm.__version__} in {path}: "
                           f"tune it there first (--tune autotvm:{name})")
    config = found["config"]
    try:
        entry.check_knobs(config)
    except UsageError as e:
        raise RecordsError(f"the best configuration of {name} for {wl.label()} in {path} is "
                           f"not one it takes: {e}") from None
    return TunedSchedule(wl.op, f"autotvm:{name}", config,
                         lambda w, target: entry.apply(w, target, **config))


def records_device(rpc_tracker: str | None, rpc_key: str | None, asked: str | None) -> str | None:
    """Whose template-search records this run measures and applies: the RPC key's hosts
    (`rpc:<key>`) when it measures through a tracker, else this machine's GPU; with neither,
    the device `asked` for, which may be None: the records' only one. Asking for another device
    than the one this run measures on is refused."""
    here = (f"rpc:{rpc_key}" if rpc_tracker else
            measure.device_facts()["gpu"] if measure.gpu_present() else None)
    if here and asked and asked != here:
        raise UsageError(f"records measured on {asked} are not applied here; this run's are "
                         f"{here}'s")
    return here or asked


# -- a search, from its records to its summary ---------------------------------------------------


def search(entry: ScheduleEntry, wl: Workload, measure: Callable[[list[dict]], list[Outcome]], *,
           path: str, device: str, tuner: str, seed: int, trials: int,
           refusal: Callable[[dict], str | None] | None = None, batch: int = BATCH,
           in_flight: int = 1, say: Callable[[str], None] = print,
           warn: Callable[[str], None] = print, held: dict | None = None) -> dict:
    """Search `entry`'s space on `wl` (its `held` knobs at their one value: a search of its
    own, `template_name`) with `tuner`, resuming from the records at `path` of the
    same search on `device`; each measured configuration is appended there as it comes and said,
    and each the template's `refusal` check refuses is passed over (Configurations.refusal).
    Returns the search's summary record, with what this run proposed, refused and measured
    (`candidates`). `batch` configurations are built and measured at a time (a farm's search:
    a batch per server), `in_flight` batches at once (tune). A search with no correct
    configuration fails, with the most common reason.

    The rung's own configuration for `wl` (its defaults as its shape heuristic sets them) is
    measured first where the space holds it: records override that heuristic (`--schedule
    best`, `autotvm:<rung>`), so a search's best must never be slower than the rung without
    records."""
    space, name = Space.of(entry, wl, held), template_name(entry, held)
    key = search_key(wl, name, device, tuner, seed)
    history = history_of(trial_records(path, warn), key,
                         {knob: entry.defaults[knob] for knob in space.knobs})
    say(f"{tuner} search of {name} ({len(space)} configurations) on {wl.label()}:"
        f" {len(history)} measured before, in {path}")
    start, trial = time.time(), [len(history)]
    progress = Progress(min(trials, len(space) - len(history)), f"{tuner} {name}")

    def on_measured(config, outcome):
        """The configuration recorded; the bar advanced, or (no bar) a line said."""
        trial[0] += 1
        store.append(path, trial_record(
            key, config, outcome, trial[0],
            date=datetime.now(timezone.utc).isoformat(timespec="seconds")))
        result = f"{outcome.time_ms:.4f} ms" if outcome.status == Status.OK else outcome.status
        so_far = best(history)
        best_text = f"{so_far[1]:.4f} ms" if so_far else "none"
        progress.step(f"best {best_text}")
        if not progress.shown:
            say(f"  [{trial[0]}] {config}: {result}; best so far {best_text}; "
                f"{time.time() - start:.0f} s, {progress.rate():.1f} trials/min")

    own = entry.own_choice(wl, held)
    with contextlib.closing(progress):
        counts = tune(space, TUNERS[tuner](seed), measure, history, trials, batch, on_measured,
                      first=() if own is None else (own,), refusal=refusal,
                      in_flight=in_flight)
    if counts.measured < trials:
        say(f"the space is exhausted: {counts.measured} new configurations measured")
    found = best(history)
    if found is None:
        reasons = Counter(o.error or o.status for o in history.values())
        raise SearchFailed(f"no configuration ran correctly in {len(history)} measured (this "
                           f"run: {counts}); most often: "
                           f"{reasons.most_common(1)[0][0] if reasons else 'none ran'}")
    rate = 60 * counts.measured / (time.time() - start)
    say(f"best: {found[1]:.4f} ms with {found[0]} ({len(history)} measured; this run: {counts}, "
        f"{rate:.1f} trials/min)")
    return {"schedule": f"autotvm:{name}", "search": "autotvm", "tuner": tuner,
            "seed": seed, "params": found[0], "trials": len(history), "space": len(space),
            "candidates": asdict(counts), "trials_per_min": rate,
            "curve": curve(trial_records(path, lambda said: None), key)}  # warned at the start
