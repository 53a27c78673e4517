"""Schedules by op and name: `@schedule("gemm", "v3")` registers, `get("gemm", "v3")` finds.

A schedule is a function `(sch: tvm.s_tir.Schedule, wl: Workload, **params) -> None` that edits
`sch` in place. Its keyword parameters (with defaults) are its tunable knobs. A schedule that
cannot handle a workload raises ScheduleNotApplicable with the reason.
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


_REGISTRY: dict[str, dict[str, ScheduleEntry]] = {op: {} for op in OPS}


def schedule(op: str, name: str, baseline: bool = False):
    """Register the decorated function as schedule `name` of `op` (rungs in ladder order)."""

    def register(fn):
        if name in _REGISTRY[op]:
            raise ValueError(f"schedule {op}/{name} registered twice")
        _REGISTRY[op][name] = ScheduleEntry(op, name, fn, baseline)
        return fn

    return register


def entries(op: str) -> list[ScheduleEntry]:
    """The ladder of `op` in registration order, then its baselines."""
    found = list(_REGISTRY[op].values())
    return [e for e in found if not e.baseline] + [e for e in found if e.baseline]


def names(op: str) -> list[str]:
    return [e.name for e in entries(op)]


def get(op: str, name: str) -> ScheduleEntry:
    if op not in _REGISTRY:
        raise UnknownSchedule(f"unknown op '{op}'; valid ops: {', '.join(OPS)}")
    if name not in _REGISTRY[op]:
        raise UnknownSchedule(
            f"unknown schedule '{name}' for {op}; valid: {', '.join(names(op))}"
        )
    return _REGISTRY[op][name]
