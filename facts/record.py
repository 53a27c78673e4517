"""One line of a records file as a type: what the renderers read, in the current schema (SCHEMA).

A records file (JSONL) holds several kinds of line, told apart by `kind`: a timed kernel
("rung", "tuned", "baseline"), the ceilings a run measured ("ceiling": copy and read bandwidth,
compute), a search's summary ("search": its curve of the best time by trial), and counters of
a launch (tuning.explain: status "counted"). They share the workload's fields and where and
when the run took place; the fields only some kinds have are None on the others. A line of an
earlier schema is read in the current one (facts.migrated); fields the type does not name are
kept in `rest`.
"""

from __future__ import annotations

import dataclasses
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
    # counters of a launch (facts.counters)
    counters: dict | None = None
    # fields of the line that the type does not name
    rest: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, line: dict) -> Record:
        """The record of a parsed line, in the current schema."""
        line = migrated(line)
        named = {f.name for f in dataclasses.fields(cls)} - {"rest"}
        values = {k: v for k, v in line.items() if k in named}
        if isinstance(values.get("timing"), dict):
            values["timing"] = Timing(**values["timing"])
        if values.get("shape") is not None:
            values["shape"] = tuple(values["shape"])
        return cls(**values, rest={k: v for k, v in line.items() if k not in named})

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
