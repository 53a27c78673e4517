"""JSON-lines files: one JSON value per line, appended, never rewritten.

Measurement records (--results) are keyed by workload (op, shape, dtype, out_dtype, layout),
schedule and params, device (GPU name) and TVM version, and carry the run they belong to
(run_id) and its date. The searches keep theirs the same way: a template search's trials
(tuning/autotvm.py) and MetaSchedule's progress.jsonl (tuning/metaschedule.py), whose database
files are JSON lines too. A line that cannot be read is named by path and line number, and
left in the file as it is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

from schedules.errors import RecordsError

MEASUREMENT = ("op", "schedule")  # the fields that every measurement record has


@dataclass
class Loaded:
    records: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path:line: what is wrong"


def lines(path: str) -> Iterator[tuple[str, object, str | None]]:
    """For each non-empty line of `path` (none when there is no such file): where it is
    ("path:line"), its JSON value and None; or, for a line that is not JSON, where it is, None
    and what is wrong with it."""
    if not os.path.exists(path):
        return
    if not os.path.isfile(path):
        raise RecordsError(f"{path} is not a file")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().splitlines()
    except OSError as e:
        raise RecordsError(f"cannot read {path}: {e.strerror}") from e
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            yield f"{path}:{number}", None, f"not valid JSON ({e.msg})"
            continue
        yield f"{path}:{number}", value, None


def load(path: str, required: tuple[str, ...] = MEASUREMENT,
         kind: str = "measurement record") -> Loaded:
    """Every record of `path`: each line that is a JSON object with the `required` fields. Any
    other line is named in `problems` (as not JSON, or not a `kind`) and left as it is."""
    loaded = Loaded()
    for where, value, problem in lines(path):
        if problem is None and not (isinstance(value, dict) and all(k in value for k in required)):
            problem = f"not a {kind}"
        if problem:
            loaded.problems.append(f"{where}: {problem}")
        else:
            loaded.records.append(value)
    return loaded


def load_and_warn(path: str, warn: Callable[[str], None],
                  then: str = "the line is kept as it is, and skipped") -> list[dict]:
    """The measurement records of `path` (see `load`); each line that is not one is passed to
    `warn` as a warning that names it and ends with what is done about it (`then`)."""
    loaded = load(path)
    for problem in loaded.problems:
        warn(f"warning: {problem}; {then}")
    return loaded.records


def append(path: str, record: dict) -> None:
    """Add one record as one line. If the file's last line lacks its newline (a write cut
    short), the new record starts on a line of its own so the damage stays on that one line."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    line = json.dumps(record, sort_keys=True)
    needs_newline = False
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            needs_newline = f.read(1) != b"\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if needs_newline else "") + line + "\n")
        f.flush()
        os.fsync(f.fileno())
