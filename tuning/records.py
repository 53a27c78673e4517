"""JSON-lines files: one JSON value per line, appended, never rewritten.

Measurement records (--results) carry their schema's version (facts.SCHEMA) and are read in the
current one (facts.migrated). They are keyed by workload (op, shape, dtype, out_dtype, layout,
and fp8's scales where they go by rows), schedule and params, device (GPU name) and TVM version,
and carry the run they belong to (run_id) and its date. The searches keep theirs the same way: a
template search's trials (tuning/autotvm.py) and MetaSchedule's progress.jsonl
(tuning/metaschedule.py), whose database files are JSON lines too. A line that cannot be read is
named by path and line number, and left in the file as it is. A measurement record is also
checked field by field (`measurement_problem`) before a report or `best` reads it, so one bad
field costs that record only."""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

from facts import FLUSHES, SCHEMA, migrated
from facts.record import Record
from schedules.errors import ExplorerError, RecordsError
from schedules.workloads import Workload

MEASUREMENT = ("op", "schedule")  # the fields that every measurement record has

NUMBER = (int, float)
# The fields of every measurement record (bench.Run.record), with their JSON types.
REQUIRED = {"kind": str, "schedule": str, "status": str, "run_id": str, "date": str, "gpu": str,
            "driver": str, "tvm": str, "op": str}
# The fields that some records have, with their JSON types where they are not null.
OPTIONAL = {"params": dict, "timing": dict, "resources": dict, "structure": dict,
            "rel_error": NUMBER, "tolerance": NUMBER, "error": str, "flush": str,
            "flush_l2": bool, "suite": str, "model": str, "layer": str, "aligned": list,
            "arch": str, "dtype": str, "copy_gbps": NUMBER, "read_gbps": NUMBER,
            "compute_tflops": NUMBER, "curve": list, "trials": int, "search": str, "tuner": str,
            "seed": int, "rules": str, "space": int, "shared_kb": int, "trials_per_min": NUMBER,
            "schema": int}
TIMES = ("median_ms", "min_ms", "max_ms")  # a timing's times: positive, finite
TIMING_NAMES = {*TIMES, "samples", "method"}  # every name a timing may have (facts.record.Timing)
WORKLOAD_KINDS = ("rung", "tuned", "baseline", "search")  # records of one workload
WORKLOAD = {"shape": list, "dtype": str, "out_dtype": str, "layout": str}  # as recorded
CEILING_OPS = ("copy", "read", "compute")  # what a ceiling record measured
WARNED_LINES = 5  # a file's lines that fail their checks named one by one; the rest counted


@dataclass
class Loaded:
    records: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path:line: what is wrong"
    path: str = ""


def lines(path: str) -> Iterator[tuple[str, object, str | None]]:
    """For each non-empty line of `path` (gzipped where its name ends in .gz, as the notebook
    keeps large records; none when there is no such file): where it is ("path:line"), its JSON
    value and None; or, for a line that is not JSON, where it is, None and what is wrong."""
    if not os.path.exists(path):
        return
    if not os.path.isfile(path):
        raise RecordsError(f"{path} is not a file")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read().splitlines()
    except (OSError, EOFError) as e:
        raise RecordsError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from e
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            yield f"{path}:{number}", None, f"not valid JSON ({e.msg})"
            continue
        yield f"{path}:{number}", value, None


def type_problem(record: dict, name: str, kind, optional: bool) -> str | None:
    """What is wrong with field `name` of `record` for its JSON type `kind` (a bool is not a
    number); None where it is right, or absent or null and `optional`."""
    value = record.get(name)
    if value is None:
        return None if optional else f"no '{name}' field"
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        return f"{name} {json.dumps(value)[:40]} is not {' or '.join(k.__name__ for k in kinds)}"
    return None


def is_time(value) -> bool:
    """Whether a record's `value` is a time: a positive, finite number (not a bool; a JSON
    integer of any size too, which math.isfinite would overflow on)."""
    return isinstance(value, NUMBER) and not isinstance(value, bool) and 0 < value < math.inf


def _timing_problem(timing: dict) -> str | None:
    """What is wrong with a record's timing: its times must be positive, finite numbers."""
    for name in TIMES:
        value = timing.get(name)
        if not is_time(value):
            return f"timing {name} {json.dumps(value)[:40]} is not a positive time"
    return None


def workload_problem(record: dict) -> str | None:
    """What is wrong with the workload a record names (op, shape, dtype, out_dtype, layout,
    each written out, as bench.Run.record writes them), in the words the command line refuses
    such a workload with."""
    if not isinstance(record.get("shape"), list):
        return f"shape {json.dumps(record.get('shape'))[:40]} is not a list of dimensions"
    for name, kind in WORKLOAD.items():
        if problem := type_problem(record, name, kind, optional=False):
            return problem
    if problem := type_problem(record, "scales", str, optional=True):  # fp8 by rows only
        return problem
    try:
        wl = Workload.from_record(record)
    except ExplorerError as e:
        return str(e)
    for name in ("out_dtype", "layout"):  # an empty one would have been filled in
        if getattr(wl, name) != record[name]:
            return f"{name} '{record[name]}' is not {wl.op}'s {getattr(wl, name)}"
    return None


def _kind_problem(record: dict) -> str | None:
    """What is wrong with the fields that a record of its kind carries: a ceiling's op, a
    workload's, a search's curve, the timing of a measurement that passed (a ceiling's rate is
    read, not its timing)."""
    kind = record["kind"]
    if kind not in WORKLOAD_KINDS + ("ceiling",):
        return f"kind '{kind}' is none of {', '.join(WORKLOAD_KINDS)}, ceiling"
    if record.get("schema") not in (None, 1, SCHEMA):  # schema 1's records name none
        return f"schema {record['schema']} is not one this version reads (1 or {SCHEMA})"
    if record.get("flush") is None and record.get("schema") == SCHEMA:
        return f"a schema {SCHEMA} record without its flush (what ran before each launch)"
    if record.get("flush") is not None and record["flush"] not in FLUSHES:
        return f"flush '{record['flush']}' is none of {', '.join(FLUSHES)}"
    if kind == "ceiling":
        if record["op"] not in CEILING_OPS:
            return f"a ceiling of op '{record['op']}', none of {', '.join(CEILING_OPS)}"
        if record.get("compute_tflops") and not isinstance(
                (record.get("params") or {}).get("size"), int):
            return "a compute ceiling without the size of its GEMM (params size)"
        return None
    if problem := workload_problem(record):
        return problem
    if kind in ("tuned", "search") and not isinstance(record.get("params"), dict):
        return f"a {kind} record without its params (where it came from)"
    if kind == "search":
        curve = record.get("curve")
        if not curve or not _is_curve(curve):
            return "a search without its curve of [trial, time] points"
        if not isinstance(record.get("search"), str) or not isinstance(record.get("trials"), int) \
                or record["search"] != "metaschedule" and not isinstance(record.get("tuner"), str):
            return "a search without its search, trials and (a template's) tuner"
        return None
    if record["status"] == "ok":
        if not isinstance(record.get("timing"), dict):
            return "status ok without a timing"
        return _timing_problem(record["timing"])
    return None


def _resources_problem(resources: dict | None) -> str | None:
    """What is wrong with a record's resources: per kernel, nvcc's counts (numbers) by name,
    and whether ptxas serialized its wgmmas (true or false, build.nvcc_resources)."""
    for kernel, usage in (resources or {}).items():
        if not isinstance(usage, dict) or not all(
                isinstance(value, bool) if name == "wgmma_serialized"
                else isinstance(value, NUMBER) and not isinstance(value, bool)
                for name, value in usage.items()):
            return f"resources of kernel '{kernel[:40]}' {json.dumps(usage)[:40]} are not counts"
    return None


def _typed_fields_problem(record: dict) -> str | None:
    """What is wrong with the fields that facts.record.Record reads into types of its own, on
    a record of any kind: a timing with a Timing's names (its three times at least), a curve
    of [trial, time] points, a compute ceiling that is itself a sound record."""
    timing = record.get("timing")
    if isinstance(timing, dict) and not set(TIMES) <= set(timing) <= TIMING_NAMES:
        return (f"timing {json.dumps(timing)[:40]} does not have a timing's names "
                f"({', '.join(TIMES)}; samples, method)")
    curve = record.get("curve")
    if curve is not None and not _is_curve(curve):
        return f"curve {json.dumps(curve)[:40]} is not a list of [trial, time] points"
    ceiling = record.get("compute_ceiling")
    if ceiling is not None:
        problem = measurement_problem(ceiling)
        return f"compute_ceiling: {problem}" if problem else None
    return None


def _is_curve(curve) -> bool:
    """Whether `curve` is a list of [trial, time] points (time a number, or null)."""
    return isinstance(curve, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[1], (*NUMBER, type(None)))
        for p in curve)


def measurement_problem(record) -> str | None:
    """What is wrong with a measurement record (as bench.Run.record writes them), field by
    field, in one phrase; None for a record that the reports and `best` can read."""
    if not isinstance(record, dict):
        return "not a measurement record"
    for fields, optional in ((REQUIRED, False), (OPTIONAL, True)):
        for name, kind in fields.items():
            if problem := type_problem(record, name, kind, optional):
                return problem
    return _resources_problem(record.get("resources")) or _kind_problem(record) \
        or _typed_fields_problem(record)


def load(path: str, required: tuple[str, ...] = MEASUREMENT,
         kind: str = "measurement record",
         check: Callable[[object], str | None] | None = None) -> Loaded:
    """Every record of `path`: each line that is a JSON object with the `required` fields
    (and, given `check`, in which it finds no problem). Any other line is named in `problems`
    (as not JSON, not a `kind`, or what `check` says) and left as it is."""
    loaded = Loaded(path=path)
    for where, value, problem in lines(path):
        if problem is None and not (isinstance(value, dict) and all(k in value for k in required)):
            problem = f"not a {kind}"
        if problem is None and check:
            problem = check(value)
        if problem:
            loaded.problems.append(f"{where}: {problem}")
        else:
            loaded.records.append(value)
    return loaded


def load_and_warn(path: str, warn: Callable[[str], None],
                  then: str = "the line is kept as it is, and skipped",
                  check: Callable[[object], str | None] | None = None,
                  kind: str = "measurement record") -> list[dict]:
    """The records of `path` (see `load`, with `check` and `kind`); the lines that are not
    one go to `warn` as `warn_of` words them (the first named, the rest counted), each warning
    ending with what is done about them (`then`)."""
    loaded = load(path, kind=kind, check=check)
    warn_of(loaded, warn, then)
    return loaded.records


def warn_of(loaded: Loaded, warn: Callable[[str], None],
            then: str = "the line is kept as it is, and skipped") -> None:
    """The problems of `loaded`, each as a warning that ends with what is done about it
    (`then`); where there are more than WARNED_LINES + 1, the first WARNED_LINES so and one
    warning that counts the rest: a file of another kind of record would otherwise name every
    one of its lines."""
    named = loaded.problems if len(loaded.problems) <= WARNED_LINES + 1 else \
        loaded.problems[:WARNED_LINES]
    for problem in named:
        warn(f"warning: {problem}; {then}")
    if len(named) < len(loaded.problems):
        warn(f"warning: {len(loaded.problems) - len(named)} more lines of {loaded.path} fail "
             f"their checks too (each: {then})")


def measurements(path: str, warn: Callable[[str], None],
                 then: str = "the line is kept as it is, and skipped") -> list[dict]:
    """The measurement records of `path` that pass `measurement_problem`, in the current
    schema (`migrated`); the other lines go to `warn` (see load_and_warn)."""
    return [migrated(r) for r in load_and_warn(path, warn, then, check=measurement_problem)]


def append(path: str, record: Record | dict) -> None:
    """Add one record as one line: a measurement Record as facts.record writes it (its
    json_line), any other line (a search's trial, its progress) as its JSON object. If the
    file's last line lacks its newline (a write cut short), the new record starts on a line of
    its own so the damage stays on that one line. A gzipped file (.gz) is read, never appended
    to: a plain line would leave it unreadable."""
    if path.endswith(".gz"):
        raise RecordsError(f"{path} is gzipped: records are appended as plain JSON lines to a "
                           f"file whose name does not end in .gz")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    line = record.json_line() if isinstance(record, Record) else json.dumps(record, sort_keys=True)
    needs_newline = False
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            needs_newline = f.read(1) != b"\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if needs_newline else "") + line + "\n")
        f.flush()
        os.fsync(f.fileno())
