"""Schedules by op and name: `@schedule("gemm", "v3")` registers, `get("gemm", "v3")` finds.

A schedule is a function `(sch: tvm.s_tir.Schedule, wl: Workload, **params) -> None` that edits
`sch` in place. Its keyword parameters (with defaults and annotations) are its tunable knobs:
`bool` switches, and `int` sizes and counts, which are at least 1 (`int | None`: None lets the
schedule choose). `space`, declared with it, lists the values the template tuner
(tuning/autotvm.py) tries for each, and `heuristic` (schedules/heuristics.py) picks knobs for
each workload's shape: what the schedule runs with where the user sets none. A schedule that
cannot handle a workload (or a knob setting) raises ScheduleNotApplicable with the reason.
A schedule whose loads need the workload indexed another way, or a kernel written whole from its
knobs, brings its own `compute(wl, **knobs)`: a PrimFunc that computes what the workload's does,
with the same buffers, which the schedule function then edits (or only checks).
"""

from __future__ import annotations

import functools
import inspect
import re
import types
from dataclasses import dataclass
from typing import Callable

import tvm

from . import heuristics
from .errors import ExplorerError, ScheduleNotApplicable, UnknownSchedule, UsageError
from .workloads import OPS, Workload


@dataclass(frozen=True)
class ScheduleEntry:
    op: str
    name: str
    fn: Callable
    baseline: bool = False  # a reference to compare with (dlight), not a rung of the ladder
    template: bool = False  # only a search space: tuned, never run with its defaults by "all"
    space: dict | None = None  # knob -> the values a template search tries
    heuristic: Callable | None = None  # (wl, sms, knobs, space) -> the knobs it picks for wl
    compute: Callable | None = None  # (wl, **knobs) -> the PrimFunc it schedules (wl.prim_func())
    dtypes: tuple | None = None  # the input dtypes it takes (None: any)
    # (wl, **knobs) -> None, raising ScheduleNotApplicable: what `compute` refuses, without
    # building it (for a compute that builds a whole kernel), so a search drops those cheaply
    refuse: Callable | None = None
    # (counter, +1 or -1): the hardware counter (facts.counters' METRICS) that the docstring says
    # this rung moves against the rung before it, and which way; a test holds the recorded
    # counters to it (tests/test_counters.py)
    brings: tuple[str, int] | None = None
    # (wl) -> {knob: values}: of its space, the only values of those knobs that a search of a
    # workload draws (space_for): those it can take whatever the other knobs are (v8's fp8
    # promotions: none on 16-bit inputs), at the precision the rung runs it with (v8 on fp8:
    # promoted sums, not fast accumulation)
    narrow: Callable | None = None
    # (wl, defaults) -> {knob: values}: values beyond its space that a search of a workload
    # draws too (space_for): v8's width of the tile that fills the SMs best, where the space
    # lacks it
    widen: Callable | None = None

    def takes(self, wl: Workload) -> bool:
        """Whether this schedule is made for the workload's input dtype."""
        return self.dtypes is None or wl.dtype in self.dtypes

    @property
    def kind(self) -> str:
        return "baseline" if self.baseline else "template" if self.template else "rung"

    @property
    def summary(self) -> str:
        """First paragraph of the schedule's docstring, on one line: what this rung adds."""
        return " ".join((inspect.getdoc(self.fn) or "").split("\n\n")[0].split())

    @property
    def defaults(self) -> dict:
        """The tunable parameters and their default values (the signature's), a dict of the
        caller's own."""
        return dict(self._signature_defaults)

    @functools.cached_property
    def _signature_defaults(self) -> dict:
        """The signature's knobs and defaults, read once: a search's refusal check asks for
        them for every configuration it proposes (thousands a batch)."""
        params = list(inspect.signature(self.fn).parameters.values())[2:]
        return {p.name: p.default for p in params}

    def defaults_for(self, wl: Workload, chosen: dict | None = None) -> dict:
        """Every knob as this schedule runs `wl` with it: the user's `chosen` ones, then those
        its heuristic picks for the shape (on the H100's SMs; see schedules/heuristics.py),
        then the signature's defaults."""
        chosen = chosen or {}
        knobs = {**self.defaults, **chosen}
        if self.heuristic and not heuristics.measured(wl):
            space = {**self.space, **{k: [v] for k, v in chosen.items() if k in self.space}}
            picked = self.heuristic(wl, heuristics.H100_SMS, knobs, space)
            knobs.update({k: v for k, v in picked.items() if k not in chosen})
        return knobs

    def space_for(self, wl: Workload, held: dict | None = None) -> dict:
        """Its space as a search of `wl` draws from it: each knob's values, less those `narrow`
        leaves out for `wl` (v8 on 16-bit inputs in nn: its space's 2,488,320 settings are 36,864),
        then those `widen` adds for it; each knob of `held` (knobs the user holds, e.g.
        `autotvm:v8:promote_k=none`, checked by parse_knobs) at its one value, which the user's
        naming lets past `narrow`."""
        wider = self.widen(wl, self.defaults) if self.widen else {}
        space = {}
        for knob, values in self.space.items():
            drawn = [v for v in values if self.draws(wl, {knob: v})]
            space[knob] = drawn + [v for v in wider.get(knob, []) if v not in drawn]
        return {**space, **{knob: [value] for knob, value in (held or {}).items()}}

    def draws(self, wl: Workload, params: dict) -> bool:
        """Whether a search of `wl` would draw each of params' values: none is one that
        `narrow` leaves out for `wl` (v8 on fp8: fast accumulation)."""
        allowed = self.narrow(wl) if self.narrow else {}
        return all(knob not in allowed or value in allowed[knob] for knob, value in params.items())

    def own_choice(self, wl: Workload, held: dict | None = None) -> dict | None:
        """The knobs of its space as it runs `wl` with the `held` ones set (defaults_for: its
        heuristic picks the others), or None where its space does not hold one of them: what a
        search of the space measures first."""
        space = self.space_for(wl, held)
        own = {knob: value for knob, value in self.defaults_for(wl, held).items()
               if knob in space}
        return own if all(own[knob] in values for knob, values in space.items()) else None

    @property
    def knob_types(self) -> dict[str, tuple[type, bool]]:
        """Each knob's declared type, and whether it may be None: (int, False), (int, True)
        for `int | None`, (bool, False)."""
        params = list(inspect.signature(self.fn, eval_str=True).parameters.values())[2:]
        found = {}
        for p in params:
            kinds = set(p.annotation.__args__) if isinstance(p.annotation, types.UnionType) \
                else {p.annotation}
            found[p.name] = ((kinds - {type(None)}).pop(), type(None) in kinds)
        return found

    def check_knobs(self, params: dict) -> None:
        """Refuse unknown knobs and values of the wrong type or range, naming the knob."""
        knob_types = self.knob_types
        for knob, value in params.items():
            if knob not in knob_types:
                known = ", ".join(knob_types) or "none"
                raise UsageError(f"{self.name} has no knob '{knob}'; its knobs: {known}")
            kind, optional = knob_types[knob]
            if value is None and optional:
                continue
            if kind is bool and not isinstance(value, bool):
                raise UsageError(f"knob {knob} of {self.name} is true or false, not {value!r}")
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)
                                or value < 1):
                raise UsageError(f"knob {knob} of {self.name} is a size or count of at least 1"
                                 f"{' (or none)' if optional else ''}, not {value!r}")

    def parse_knobs(self, text: str) -> dict:
        """'k_slices=4,thread_n=8' -> {'k_slices': 4, 'thread_n': 8}, each value read as its
        knob's declared type ('true'/'false', an integer, or 'none'), then checked. No knobs
        ('v5k:') and a knob named twice ('k_slices=8,k_slices=2') are refused: they would
        otherwise run the rung's own knobs or silently take the last value; so is a knob
        without a name ('v8:,,')."""
        name = f"{self.name}:{text}"
        if not text:
            raise UsageError(f"{name} names no knobs after its ':' (e.g. {name}k=v; --list "
                             "shows each schedule's knobs)")
        named = [item.partition("=")[0] for item in text.split(",")]
        if "" in named:
            raise UsageError(f"{name} names a knob without a name (knobs are k=v, separated by "
                             "commas)")
        twice = sorted({knob for knob in named if named.count(knob) > 1})
        if twice:
            raise UsageError(f"{name} sets {', '.join(twice)} more than once")
        knob_types = self.knob_types
        chosen = {}
        for item in text.split(","):
            knob, _, value = item.partition("=")
            kind, optional = knob_types.get(knob, (str, False))
            if optional and value == "none":
                chosen[knob] = None
            elif kind is bool and value in ("true", "false"):
                chosen[knob] = value == "true"
            elif kind is int and re.fullmatch(r"-?\d+", value):
                chosen[knob] = int(value)
            else:
                chosen[knob] = value  # check_knobs names what it should have been
        self.check_knobs(chosen)
        return chosen

    def values_that_apply(self, wl: Workload, target: tvm.target.Target, chosen: dict,
                          knob: str) -> list:
        """The values of `knob` (its space's, else true/false or powers of two up to 256) with
        which this schedule applies to `wl`, the other knobs as `chosen`."""
        kind, _ = self.knob_types[knob]
        tried = (self.space or {}).get(knob) or ([False, True] if kind is bool
                                                 else [2 ** n for n in range(9)])
        working = []
        for value in tried:
            try:
                self.apply(wl, target, **{**chosen, knob: value})
            except ScheduleNotApplicable:
                continue
            working.append(value)
        return working

    def with_knobs(self, text: str, wl: Workload) -> "TunedSchedule":
        """This schedule with the knobs of 'k=v,k=v' set, run like a rung under the name
        '<name>:<text>'; the knobs it runs `wl` with are its params."""
        chosen = self.parse_knobs(text)
        return TunedSchedule(self.op, f"{self.name}:{text}", self.defaults_for(wl, chosen),
                             lambda w, target: self.apply(w, target, **chosen), self.kind,
                             knobs=(self, chosen))

    def for_workload(self, wl: Workload) -> "TunedSchedule":
        """This schedule under its own name, with the knobs it runs `wl` with as its params."""
        return TunedSchedule(self.op, self.name, self.defaults_for(wl),
                             lambda w, target: self.apply(w, target), self.kind)

    def apply(self, wl: Workload, target: tvm.target.Target, **params) -> tvm.IRModule:
        """Schedule the workload's PrimFunc for `target` and return the scheduled module; the
        knobs not in `params` as `defaults_for(wl)` has them."""
        if wl.op != self.op:
            raise ScheduleNotApplicable(f"{self.name} is a {self.op} schedule, not {wl.op}")
        if not self.takes(wl):
            raise ScheduleNotApplicable(f"{self.name} takes {' or '.join(self.dtypes)} inputs, "
                                        f"not {wl.dtype}")
        self.check_knobs(params)
        knobs = self.defaults_for(wl, params)
        func = self.compute(wl, **knobs) if self.compute else wl.prim_func()
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        own = self.defaults_for(wl)
        changed = {k: v for k, v in params.items() if v != own[k]}
        with target:
            try:
                self.fn(sch, wl, **knobs)
            except ExplorerError:
                raise
            except Exception as e:  # noqa: BLE001  TVM refusing a primitive for these knobs
                if not changed:
                    raise  # with its own knobs, a failure is the schedule's bug: not hidden
                settings = ", ".join(f"{k}={v}" for k, v in changed.items())
                raise ScheduleNotApplicable(f"{self.name} cannot be scheduled with {settings}: "
                                            f"{_reason(e)}") from None
        return sch.mod


def with_knob_text(name: str, knobs) -> str:
    """`name` with (knob, value) pairs, in their order, as parse_knobs reads them back
    ('v8:promote_k=none,split_k=2'); the bare name where there are none."""
    settings = ",".join(f"{knob}={str(value).lower()}" for knob, value in knobs)
    return f"{name}:{settings}" if settings else name


def _reason(error: Exception) -> str:
    """What a failed schedule primitive said, in one line (TVM's ScheduleError puts it after
    'Error message:')."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    after = [n for n, line in enumerate(lines) if line.startswith("Error message:")]
    if after:
        return lines[after[0]].removeprefix("Error message:").strip()[:200]
    return (lines[:1] or [type(error).__name__])[0][:200]


@dataclass(frozen=True)
class TunedSchedule:
    """A schedule rebuilt by `make(wl, target)` and run like a rung: the best a search found
    (from its records; `params` say where it came from: the configuration, the work dir), or
    a rung for one workload, with or without knobs set on the command line (`params`: all the
    knobs it runs that workload with)."""

    op: str
    name: str
    params: dict
    make: Callable[[Workload, tvm.target.Target], tvm.IRModule]
    kind: str = "tuned"
    knobs: tuple | None = None  # (entry, chosen) for a rung with knobs set by the user

    @property
    def defaults(self) -> dict:
        return self.params

    def apply(self, wl: Workload, target: tvm.target.Target) -> tvm.IRModule:
        with target:
            return self.make(wl, target)


_REGISTRY: dict[str, dict[str, ScheduleEntry]] = {op: {} for op in OPS}


def schedule(op: str, name: str, *, baseline: bool = False, template: bool = False,
             space: dict | None = None, heuristic: Callable | None = None,
             compute: Callable | None = None, dtypes: tuple | None = None,
             refuse: Callable | None = None, brings: tuple[str, int] | None = None,
             narrow: Callable | None = None, widen: Callable | None = None):
    """Register the decorated function as schedule `name` of `op` (rungs in ladder order), with
    the knob space a template search explores, the heuristic that picks knobs per shape, where
    it schedules another definition of the workload, the function that builds it, and where it
    is made for some input dtypes only, those; where that function refuses knobs cheaply
    before it builds, the check alone (`refuse`); the counter its docstring says it moves
    (`brings`); the knob values a workload never takes, which searches skip (`narrow`), and
    those beyond the space that a search of a workload draws too (`widen`)."""

    def register(fn):
        if name in _REGISTRY[op]:
            raise ValueError(f"schedule {op}/{name} registered twice")
        entry = ScheduleEntry(op, name, fn, baseline, template, space, heuristic, compute, dtypes,
                              refuse, brings, narrow, widen)
        unknown = set(space or {}) - set(entry.defaults)
        if unknown:
            raise ValueError(f"space of {op}/{name} names no parameter(s) {sorted(unknown)}")
        _REGISTRY[op][name] = entry
        return fn

    return register


def entries(op: str, templates: bool = False) -> list[ScheduleEntry]:
    """The ladder of `op` in registration order, then its baselines (and, if asked, the
    schedules that are only search templates)."""
    found = [e for e in _REGISTRY[op].values() if templates or not e.template]
    return [e for e in found if not e.baseline] + [e for e in found if e.baseline]


def names(op: str, templates: bool = False) -> list[str]:
    return [e.name for e in entries(op, templates)]


def get(op: str, name: str) -> ScheduleEntry:
    if op not in _REGISTRY:
        raise UnknownSchedule(f"unknown op '{op}'; valid ops: {', '.join(OPS)}")
    if name not in _REGISTRY[op]:
        raise UnknownSchedule(
            f"unknown schedule '{name}' for {op}; valid: {', '.join(names(op, templates=True))}"
        )
    return _REGISTRY[op][name]
