"""One line of a records file as a type: what the renderers read, in the current schema (SCHEMA).

A records file (JSONL) holds several kinds of line, told apart by `kind`: a timed kernel
("rung", "tuned", "baseline"), the ceilings a run measured ("ceiling": copy and read bandwidth,
compute), a search's summary ("search": its curve of the best time by trial), and counters of
a launch (tuning.explain: status "counted"). They share the workload's fields and where and
when the run took place; the fields only some kinds have are None on the others. A line of an
earlier schema is read in the current one (facts.migrated); fields the type does not name are
kept in `rest`.

The runs write their records through the same type (tuning.bench.Run.record builds a Record, a
field the type does not name refused there with a TypeError) and `json_line`, the inverse of
`from_json`: reading and writing a line live here, in one module.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from schedules.workloads import Workload

from . import migrated


@dataclass(frozen=True)
class Timing:
    """A kernel's timed launches: their median, least and most in ms, how many, and how."""

    median_ms: float
    min_ms: float
    max_ms: float
    samples: int | None = None
    method: str | None = None

    def to_json(self) -> dict:
        """The timing as a line holds it: the fields it has."""
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class Record:
    """A record file's line (see the module's docstring)."""

    # what ran, where and when
    schedule: str | None = None
    date: str | None = None
    status: str | None = None
    tvm: str | None = None
    op: str | None = None
    kind: str | None = None
    run_id: str | None = None
    params: dict = field(default_factory=dict)
    gpu: str | None = None
    driver: str | None = None
    arch: str | None = None
    flush: str | None = None
    schema: int | None = None
    # the workload (ceilings name a dtype alone)
    shape: tuple | None = None
    dtype: str | None = None
    out_dtype: str | None = None
    layout: str | None = None
    scales: str | None = None
    # a timed kernel
    timing: Timing | None = None
    rel_error: float | None = None
    tolerance: float | None = None
    error: str | None = None
    structure: dict | None = None
    resources: dict | None = None
    # a suite's shape: which suite, model and layer it comes from
    suite: str | None = None
    model: str | None = None
    layer: str | None = None
    aligned: Any = None
    # a run's ceilings (on a "ceiling" line, and on each of the run's kernels once
    # reporting.render.with_ceilings has set them: compute_ceiling is that ceiling's line)
    copy_gbps: float | None = None
    read_gbps: float | None = None
    compute_tflops: float | None = None
    compute_ceiling: Record | None = None
    # a search's summary
    search: str | None = None
    tuner: str | None = None
    seed: int | None = None
    rules: str | None = None
    shared_kb: int | None = None
    space: Any = None
    trials: int | None = None
    trials_per_min: float | None = None
    curve: list | None = None
    candidates: dict | None = None  # what it did with its candidates (candidates.Counts)
    # counters of a launch (facts.counters)
    counters: dict | None = None
    # fields of the line that the type does not name
    rest: dict = field(default_factory=dict)

    def __post_init__(self):
        """One form however the record was made, the one a line read gives: its shape a tuple,
        its timing a Timing, a compute ceiling a Record, its curve's points [trial, ms] lists.
        (A writer passes the workload's shape as a list, and a search's curve of tuples.)"""
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))
        if isinstance(self.timing, dict):
            object.__setattr__(self, "timing", Timing(**self.timing))
        if isinstance(self.compute_ceiling, dict):
            object.__setattr__(self, "compute_ceiling", Record.from_json(self.compute_ceiling))
        if self.curve is not None:
            object.__setattr__(self, "curve", [list(point) for point in self.curve])

    @classmethod
    def from_json(cls, line: dict) -> Record:
        """The record of a parsed line, in the current schema."""
        line = migrated(line)
        return cls(**{k: v for k, v in line.items() if k in NAMED},
                   rest={k: v for k, v in line.items() if k not in NAMED})

    def to_json(self) -> dict:
        """The parsed line this record is read from (`from_json`'s inverse): each field that is
        not None, as JSON holds it, and the fields kept in `rest`."""
        named = {name: _as_json(value) for name in NAMED
                 if (value := getattr(self, name)) is not None}
        return {**named, **self.rest}

    def json_line(self) -> str:
        """The record as one line of a records file (tuning.records.append writes it), its
        keys sorted as every line has been written."""
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def of(cls, line: dict | Record) -> Record:
        """`line` as a Record (a Record is taken as it is)."""
        return line if isinstance(line, Record) else cls.from_json(line)

    @property
    def workload(self) -> Workload:
        """The workload the record names, read as Workload.from_record reads a line."""
        return Workload.from_record(vars(self))

    @property
    def median_ms(self) -> float | None:
        """The median time where the kernel passed its check and was timed; None otherwise."""
        return self.timing.median_ms if self.status == "ok" and self.timing else None


def _as_json(value):
    """A field's value as a line holds it: a Timing or a Record (a compute ceiling) as its
    object, a tuple (the shape) as a list."""
    if isinstance(value, (Timing, Record)):
        return value.to_json()
    return list(value) if isinstance(value, tuple) else value


# The fields a line names on the type (the others go to `rest`), in the type's order.
NAMED = tuple(f.name for f in dataclasses.fields(Record) if f.name != "rest")
