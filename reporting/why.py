"""Why each rung of a ladder table is faster than the one before: the recorded hardware counters
(tuning.explain's records) of a rung set against those of the previous rung, as the table's
"why" column (the main change, facts.counters.main_change) and a section per workload that
says, step by step, what changed and whether it is what the rung's docstring says it brings
(the registry's `brings`)."""

from __future__ import annotations

from dataclasses import dataclass

from facts.counters import BY_KEY, LARGE, SPEED, Change, counter_changes, main_of
from facts.record import Record
from schedules import registry
from schedules.errors import UnknownSchedule

OTHERS = 2  # large changes named after the main one in a step's explanation
SAME = ("gpu", "op", "shape", "dtype", "out_dtype", "layout", "scales", "schedule", "params",
        "flush")  # what a counters record shares with the measurement it explains


def counters_of_run(run: list[Record], counter_records: list[Record]) -> dict[str, dict]:
    """The latest counters recorded for each schedule of `run` with its knobs: same GPU,
    workload, params and flush as the run's record (SAME); by schedule name."""
    latest = {}
    for measured in run:
        same = [c for c in counter_records
                if all(getattr(c, k) == getattr(measured, k) for k in SAME)]
        if same:
            latest[measured.schedule] = max(same, key=lambda c: c.date).counters
    return latest


def short(change: Change) -> str:
    """'inst_executed -97%': a table cell."""
    return f"{change.name} {change.words().rsplit('(', 1)[1].rstrip(')')}"


def steps(run: list[Record], counted: dict[str, dict]) -> list[tuple[str, str]]:
    """(previous rung, rung) for each rung of `run` whose counters, and the previous counted
    rung's, are recorded: the ladder's steps that counters can explain."""
    rungs = [r.schedule for r in run if r.kind == "rung" and r.schedule in counted]
    return list(zip(rungs, rungs[1:]))


@dataclass(frozen=True)
class Step:
    """A step of the ladder that counters explain: the rung before, the rung, their counters'
    changes (largest first) and the main one (None where no cause moved by LARGE)."""

    old: str
    new: str
    changes: list[Change]
    main: Change | None


def explained_steps(run: list[Record], counter_records: list[Record]) -> list[Step]:
    """Each step of `run` (`steps`) with its counters' changes, worked out once for both the
    table's cells and the section's sentences."""
    counted = counters_of_run(run, counter_records)
    min_bytes = run[0].workload.min_bytes
    found = []
    for old, new in steps(run, counted):
        changes = counter_changes(counted[old], counted[new], min_bytes)
        found.append(Step(old, new, changes, main_of(changes)))
    return found


def why_cells(found: list[Step]) -> dict[str, str]:
    """The "why" cell of each rung that has a step: its main change against the previous rung,
    or that no cause counter moved by facts.counters.LARGE."""
    return {step.new: short(step.main) if step.main else "no cause moved 10%" for step in found}


def brings_of(op: str, schedule: str) -> tuple[str, int] | None:
    """The registry's `brings` of the rung (None for one that names none)."""
    try:
        return registry.get(op, schedule).brings
    except UnknownSchedule:
        return None


def step_sentence(op: str, old: str, new: str, changes: list[Change],
                  main: Change | None) -> str:
    """One step of the ladder in words: the main change, set against what the rung's docstring
    says it brings, then the next OTHERS large changes of what the hardware did or the build
    fixed (the speed they bring is the table's)."""
    claimed = brings_of(op, new)
    if main is None:
        said = "no cause counter moved by 10% or more"
    else:
        said = f"{BY_KEY[main.name].meaning}: {main.words()}"
    if claimed:
        agrees = main is not None and (main.name, main.direction) == tuple(claimed)
        said += (", as its docstring says" if agrees else
                 f"; its docstring names {claimed[0]} {'up' if claimed[1] > 0 else 'down'}")
    others = [c for c in changes if c != main and abs(c.relative) >= LARGE
              and BY_KEY[c.name].role != SPEED][:OTHERS]
    if others:
        said += "; also " + ", ".join(c.words() for c in others)
    return f"- **{new}** against {old}: {said}."


def why_section(first: Record, found: list[Step]) -> list[str]:
    """The workload's explanation section (of the run whose first record is `first`): a
    sentence per step (`step_sentence`); nothing where no step is counted."""
    if not found:
        return []
    lines = [f"Why, step by step (Nsight Compute on one launch of each rung, "
             f"{'L2 flushed' if first.flush != 'none' else 'L2 warm'}; the main change is "
             "the largest among instructions, bytes, occupancy, the pipes' use and bank "
             "conflicts, time and throughput being what it brings):", ""]
    for step in found:
        lines.append(step_sentence(first.op, step.old, step.new, step.changes, step.main))
    return lines + [""]
