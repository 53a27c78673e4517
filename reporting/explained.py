"""The counters report: for every GPU and workload in a file of counters records (tuning.explain
record), the rungs in ladder order with what the hardware did (instructions, global loads,
bytes, occupancy, the tensor pipe) and why each is faster or slower than the one before it
(reporting/why.py), whether or not a timing run measured the same knobs. Rendered from records,
as every report is."""

from __future__ import annotations

from facts import FLUSHES
from facts.counters import BY_KEY, fmt_count
from facts.record import Record
from schedules import registry
from schedules.errors import RecordsError

from . import why
from .render import markdown_table, opening, split_notes, workload_key

COLUMNS = ("duration_ns", "inst_executed", "global_load_requests", "l2_bytes",
           "dram_read_bytes", "occupancy_pct", "tensor_pipe_pct")
FLUSH = "read"  # the counters shown: those of a launch after an L2 flush, as timings are
METHOD = ("Nsight Compute (`ncu --cache-control all`: L2 flushed before every replay pass) on "
          "one launch of each schedule after two warm-up launches, its kernels' counters "
          "summed or weighted by duration (facts/counters.py); `python3 -m tuning.explain "
          "record` on the GPU. ncu fixes the clocks at base, so its times are longer than the "
          "timed runs'; the ratios between rungs are what to read.")


def ladders(records: list[Record]) -> list[list[Record]]:
    """Per GPU and workload, the latest flushed record of each rung, in the ladder's order."""
    latest = {}
    for record in sorted(records, key=lambda r: r.date):
        if record.flush == FLUSH:
            latest[(record.gpu, workload_key(record), record.schedule)] = record
    groups = {}
    for (gpu, key, _), record in latest.items():
        groups.setdefault((gpu, key), []).append(record)
    order = {op: registry.names(op) for op in {r.op for r in latest.values()}}
    return [sorted(group, key=lambda r: order[r.op].index(r.schedule)
                   if r.schedule in order[r.op] else len(order[r.op]))
            for group in groups.values()]


def cell(key: str, value) -> str:
    """A counter as a table cell: time in us, percentages to one decimal, counts short."""
    if value is None:
        return "-"
    if key == "duration_ns":
        return f"{value / 1e3:.2f}"
    return f"{value:.1f}" if BY_KEY[key].unit == "%" else fmt_count(value)


def ladder_section(ladder: list[Record]) -> list[str]:
    """One workload's table of counters and why-cells, then its steps in words."""
    first = ladder[0]
    explained = why.explained_steps(ladder, ladder)
    cells = why.why_cells(explained)
    rows = [{"schedule": r.schedule,
             **{("time (us)" if k == "duration_ns" else k): cell(k, r.counters.get(k))
                for k in COLUMNS},
             "why": cells.get(r.schedule, "-")} for r in ladder]
    dates = sorted(r.date[:10] for r in ladder)
    return [f"## {first.workload.label()} on {first.gpu}", "",
            f"Recorded {dates[0]}{' to ' + dates[-1] if dates[-1] != dates[0] else ''}; "
            f"driver {first.driver}, TVM {first.tvm}; before each launch: "
            f"{FLUSHES[FLUSH]}.", "", markdown_table(rows), "",
            *why.why_section(first, explained)]


def render(records: list, title: str = "Counters report", notes: str | None = None,
           figure_prefix: str | None = None) -> str:
    """The whole counters report: the title and the notes' conclusion, how the counters were
    taken, a section per GPU and workload (ladder_section), then the rest of the notes. The
    records are dicts as read from a file, or Records. `figure_prefix` is taken for the other
    renderers' sake; this report draws none."""
    found = ladders([r for r in map(Record.of, records) if r.status == "counted"])
    if not found:
        raise RecordsError("no counters records to report (tuning.explain record on a GPU)")
    conclusion, notes = split_notes(notes)
    lines = opening(title, [], "", conclusion) + [METHOD, ""]
    for ladder in found:
        lines += ladder_section(ladder)
    if notes:
        lines += ["## Notes", "", notes, ""]
    return "\n".join(lines)
