"""Schedules by op and name: `@schedule("gemm", "v3")` registers, `get("gemm", "v3")` finds.

A schedule is a function `(sch: tvm.s_tir.Schedule, wl: Workload, **params) -> None` that edits
`sch` in place. Its keyword parameters (with defaults) are its tunable knobs, and `space`, declared
with it, lists the values the template tuner (tuning/autotvm.py) tries for each. A schedule that
cannot handle a workload (or a knob setting) raises ScheduleNotApplicable with the reason.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import tvm

from .workloads import OPS, Workload


class ScheduleNotApplicable(Exception):
    """This schedule does not handle this workload; the message says why."""


class UnknownSchedule(KeyError):
    def __str__(self):
        return self.args[0]


@dataclass(frozen=True)
class ScheduleEntry:
    op: str
    name: str
    fn: Callable
    baseline: bool = False  # a reference to compare with (dlight), not a rung of the ladder
    template: bool = False  # only a search space: tuned, never run with its defaults by "all"
    space: dict | None = None  # knob -> the values a template search tries

    @property
    def kind(self) -> str:
        return "baseline" if self.baseline else "template" if self.template else "rung"

    @property
    def summary(self) -> str:
        """First paragraph of the schedule's docstring, on one line: what this rung adds."""
        return " ".join((inspect.getdoc(self.fn) or "").split("\n\n")[0].split())

    @property
    def defaults(self) -> dict:
        """The tunable parameters and their default values."""
        params = list(inspect.signature(self.fn).parameters.values())[2:]
        return {p.name: p.default for p in params}

    def apply(self, wl: Workload, target: tvm.target.Target, **params) -> tvm.IRModule:
        """Schedule the workload's PrimFunc for `target` and return the scheduled module."""
        if wl.op != self.op:
            raise ScheduleNotApplicable(f"{self.name} is a {self.op} schedule, not {wl.op}")
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(f"{self.name} has no parameter(s) {', '.join(sorted(unknown))}")
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": wl.prim_func()}))
        with target:
            self.fn(sch, wl, **{**self.defaults, **params})
        return sch.mod


@dataclass(frozen=True)
class TunedSchedule:
    """A schedule rebuilt by `make(wl, target)` and run like a rung: the best a search found
    (from its records; `params` say where it came from: the configuration, the work dir), or
    a rung with knobs set on the command line (`params`: all its settings)."""

    op: str
    name: str
    params: dict
    make: Callable[[Workload, tvm.target.Target], tvm.IRModule]
    kind: str = "tuned"

    @property
    def defaults(self) -> dict:
        return self.params

    def apply(self, wl: Workload, target: tvm.target.Target) -> tvm.IRModule:
        with target:
            return self.make(wl, target)


_REGISTRY: dict[str, dict[str, ScheduleEntry]] = {op: {} for op in OPS}


def schedule(op: str, name: str, baseline: bool = False, template: bool = False,
             space: dict | None = None):
    """Register the decorated function as schedule `name` of `op` (rungs in ladder order), with
    the knob space a template search explores."""

    def register(fn):
        if name in _REGISTRY[op]:
            raise ValueError(f"schedule {op}/{name} registered twice")
        entry = ScheduleEntry(op, name, fn, baseline, template, space)
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
