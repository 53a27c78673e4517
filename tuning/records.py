"""Append-only JSONL store of measurements: one JSON object per line, never rewritten.

A record is keyed by workload (op, shape, dtype, out_dtype, layout), schedule and params,
device (GPU name) and TVM version, and carries the run it belongs to (run_id) and its date.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from schedules.errors import RecordsError


@dataclass
class Loaded:
    records: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path:line: what is wrong"


def load(path: str) -> Loaded:
    """Every well-formed record of `path`; each corrupt line is named in `problems` and left
    in the file as it is."""
    loaded = Loaded()
    if not os.path.exists(path):
        return loaded
    if not os.path.isfile(path):
        raise RecordsError(f"{path} is not a file")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise RecordsError(f"cannot read {path}: {e.strerror}") from e
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            loaded.problems.append(f"{path}:{number}: not valid JSON ({e.msg})")
            continue
        if not isinstance(record, dict) or any(k not in record for k in ("op", "schedule")):
            loaded.problems.append(f"{path}:{number}: not a measurement record")
            continue
        loaded.records.append(record)
    return loaded


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
