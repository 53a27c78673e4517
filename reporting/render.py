"""Markdown reports rendered from measurement records, never from a live run.

For every GPU and workload in the records, the latest run that measured it becomes one table,
in the order the run measured it (the ladder, then the baselines): time, speedup over naive
and over the previous rung, throughput, the ratio to cuBLAS measured in the same run, and for
memory-bound ops the share of the copy bandwidth measured in the same run (and of the read
bandwidth, where the run measured it). The report leads with the answer: a headline table (per
workload, the fastest correct kernel of ours against cuBLAS and the hardware limit) and the
notes' first paragraph, its conclusion. Detail tables stay within ~120 columns: the long
columns (the torch call a baseline timed, min-max, registers, shared memory, error, status) go
to an appendix and columns with nothing in them are dropped. With a figure prefix, the report
gets one roofline with every workload on it: the kernels' TFLOP/s under the copy bandwidth and
the compute ceilings (cuBLAS on a large square GEMM) measured in the runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import tempfile
from typing import Iterator

from facts import (FLUSHES, NVFP4_INPUTS, SEARCH_BUDGET_MS, SPEC_PEAK_TFLOPS, check_writable,
                   spec_peaks, spilled_bytes)
from facts.record import Record
from schedules.errors import RecordsError, UsageError
from schedules.workloads import Workload

from . import why

MEMORY_BOUND = ("gemv", "batched_gemv")
BANDWIDTHS = ("copy", "read")  # the bandwidth ceilings a run may measure: `<what>_gbps`


def workload_key(record: Record) -> tuple:
    """What groups (and orders) the records of one workload: op, shape, dtypes, layout, and
    "row" for fp8 scaled by rows."""
    return (record.op, tuple(record.shape), record.dtype, record.out_dtype,
            record.layout, record.scales or "")


def workload_of(record: Record) -> Workload:
    return record.workload


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def schedule_label(record: Record) -> str:
    """The row's name: the schedule, and for cuBLAS the torch call that was timed (which
    output dtype it writes)."""
    call = (record.params or {}).get("call")
    return f"{record.schedule} ({call})" if call else record.schedule


def registers(record: Record) -> str:
    """The most registers any kernel of the row uses, and the bytes spilled, if any."""
    usage = list((record.resources or {}).values())
    if not usage:
        return "-"
    spilled = sum(spilled_bytes(record.resources).values())
    most = str(max(u.get("registers", 0) for u in usage))
    return most + (f" (SPILLS {spilled} B)" if spilled else "")


def _ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def table_rows(run: list[Record]) -> list[dict]:
    """One row per measurement of one workload in one run (rungs, then baselines)."""
    wl = workload_of(run[0])
    memory_bound = wl.op in MEMORY_BOUND
    scale, unit = (1e3, "us") if memory_bound else (1.0, "ms")
    timed = {r.schedule: r.timing.median_ms for r in run if r.status == "ok"}
    naive = timed.get("naive")
    cublas = timed.get("cublas")
    bandwidths = {what: next((getattr(r, f"{what}_gbps") for r in run
                              if getattr(r, f"{what}_gbps")), None)
                  for what in BANDWIDTHS}
    rows, previous = [], None
    for r in run:
        t = timed.get(r.schedule)
        is_rung = r.kind == "rung"
        row = {"schedule": r.schedule}
        row[f"time ({unit})"] = _fmt(t and t * scale, ".3f" if unit == "ms" else ".2f")
        if t is not None:
            row["min-max"] = f"{r.timing.min_ms * scale:.3g}-{r.timing.max_ms * scale:.3g}"
        else:
            row["min-max"] = "-"
        row["vs naive"] = _fmt(_ratio(naive, t), ".1f", "x")
        row["vs previous"] = _fmt(_ratio(previous, t) if is_rung else None, ".2f", "x")
        if memory_bound:
            gbps = _ratio(wl.min_bytes / 1e9, t and t * 1e-3)
            row["GB/s"] = _fmt(gbps, ".0f")
            for what, ceiling in bandwidths.items():
                if what == "copy" or ceiling:  # the copy's column always, "-" where not measured
                    row[f"% of {what} BW"] = _fmt(_ratio(gbps and 100 * gbps, ceiling), ".1f", "%")
        else:
            tflops = _ratio(wl.flops / 1e12, t and t * 1e-3)
            row["TFLOP/s"] = _fmt(tflops, ".2f")
            peak = (spec_peaks(r.gpu) or {}).get("tf32" if r.schedule == "cublas-tf32"
                                                 else wl.dtype)
            row["% of peak"] = _fmt(_ratio(tflops and 100 * tflops, peak), ".1f", "%")
        row["% of cuBLAS"] = _fmt(_ratio(cublas and 100 * cublas, t), ".1f", "%")
        row["regs"] = registers(r)
        row["smem B"] = str((r.structure or {}).get("shared bytes", "-"))
        row["rel. error"] = _fmt(r.rel_error, ".1e")
        row["call"] = (r.params or {}).get("call") or "-"
        row["status"] = r.status if r.status != "ok" else "correct"
        if r.status not in ("ok", None) and r.error:
            row["status"] += f": {r.error.splitlines()[0][:80]}"
        rows.append(row)
        if is_rung and t is not None:
            previous = t
    return rows


def markdown_table(rows: list[dict]) -> str:
    """A GitHub markdown table of `rows` (dicts, their keys the header), each column as wide as
    its widest cell: tabulate's github format pads every column by two more, twenty characters
    of a ten-column table."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    cells = [keys] + [[str(row.get(key, "")) for key in keys] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(keys))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) if keys else ""


APPENDIX_COLUMNS = ("call", "min-max", "regs", "smem B", "rel. error", "status")


def without_empty_columns(rows: list[dict], keep: tuple[str, ...] = ()) -> list[dict]:
    """`rows` without the columns where every cell is '-' (vs naive where a run has no naive
    rung, say), which only widen a table; the columns in `keep` stay whatever they hold."""
    empty = {key for key in (rows[0] if rows else {})
             if key not in keep and all(row[key] == "-" for row in rows)}
    return [{k: v for k, v in row.items() if k not in empty} for row in rows]


def split_columns(rows: list[dict], moved: tuple[str, ...], keys: tuple[str, ...]
                  ) -> tuple[list[dict], list[dict]]:
    """A wide table as two: the rows without the `moved` columns (the detail a reader scans),
    and the rows' `keys` (what names a row) with the moved columns (for the appendix); empty
    columns dropped from both."""
    detail = [{k: v for k, v in row.items() if k not in moved} for row in rows]
    appendix = [{k: v for k, v in row.items() if k in keys or k in moved} for row in rows]
    return without_empty_columns(detail, keys), without_empty_columns(appendix, keys)


def latest_runs(records: list[Record]) -> list[list[Record]]:
    """Measurements grouped by (GPU, workload), each group from the latest run that has it."""
    groups: dict[tuple, dict[str, list[Record]]] = {}
    for r in records:
        if r.kind not in ("rung", "tuned", "baseline"):
            continue
        group = (r.gpu, *workload_key(r))
        groups.setdefault(group, {}).setdefault(r.run_id, []).append(r)
    ceilings: dict[str, list[Record]] = {}
    for r in records:
        if r.kind == "ceiling":
            ceilings.setdefault(r.run_id, []).append(r)
    selected = []
    for runs in groups.values():
        run_id = max(runs, key=lambda rid: runs[rid][0].date)
        selected.append(with_ceilings(runs[run_id], ceilings.get(run_id, [])))
    return selected


def with_ceilings(run: list[Record], ceilings: list[Record]) -> list[Record]:
    """A run's measurements, each with the ceilings measured in that same run: the copy and read
    bandwidths (`copy_gbps`, `read_gbps`) and the compute ceiling in the run's input dtype
    (`compute_ceiling`, its record); a ceiling the run did not measure is left out, never
    filled in."""
    extra = {}
    for key in (f"{what}_gbps" for what in BANDWIDTHS):
        gbps = next((getattr(c, key) for c in ceilings if getattr(c, key)), None)
        if gbps:
            extra[key] = gbps
    compute = next((c for c in ceilings if c.compute_tflops
                    and c.dtype == run[0].dtype), None)
    if compute:
        extra["compute_ceiling"] = compute
    return [dataclasses.replace(m, **extra) for m in run]


TVM_RULES = "TVM's rules"
CHECKPOINTS = (1, 4, 8, 16, 24, 32, 36, 48, 64, 96, 128, 144, 192, 256, 384, 512)


def latest_searches(records: list[Record]) -> dict[tuple, list[Record]]:
    """Search summaries by (GPU, workload): the latest of each (schedule, tuner, rules, seed)."""
    chosen: dict[tuple, Record] = {}
    for r in records:
        if r.kind != "search":
            continue
        key = (r.gpu, *workload_key(r), r.schedule, r.tuner, r.rules,
               r.seed or 0, r.shared_kb)
        if key not in chosen or r.date >= chosen[key].date:
            chosen[key] = r
    by_workload: dict[tuple, list[Record]] = {}
    for r in chosen.values():
        by_workload.setdefault((r.gpu, *workload_key(r)), []).append(r)
    return by_workload


def _search_name(r: Record) -> str:
    seed = f", seed {r.seed}" if r.seed else ""
    if r.search == "metaschedule":  # searches before --ms-space had TVM's rules only
        limit = f", {r.shared_kb} KB shared" if r.shared_kb else ""
        return f"{r.schedule} ({r.rules or TVM_RULES}{seed}{limit})"
    return f"{r.schedule} ({r.tuner}{seed})"


def median_ms(record: Record | None) -> float | None:
    """The median time of a record that passed its check and was timed; None otherwise."""
    return record.median_ms if record else None


def timed_correct(run: list[Record]) -> list[Record]:
    """The measurements of a run that passed their check and were timed: the only ones ranked
    or drawn."""
    return [r for r in run if median_ms(r) is not None]


def fastest(run: list[Record], kinds: tuple[str, ...] = ("rung", "tuned")) -> Record | None:
    """The fastest record of `kinds` in a run that passed its check and was timed (by default
    ours: rungs and searched kernels, never a baseline); None where none did. Failed, skipped
    and unbuilt kernels are never ranked."""
    return min((r for r in timed_correct(run) if r.kind in kinds), key=median_ms,
               default=None)


def named(run: list[Record], schedule: str) -> Record | None:
    """The record of `schedule` in a run (cuBLAS is `cublas`: same output dtype, TF32 off;
    `cublas-tf32` is another row)."""
    return next((r for r in run if r.schedule == schedule), None)


def percent_of_cublas(run: list[Record], record: Record | None) -> float | None:
    """cuBLAS's time / the record's time x 100, both from this run; None unless both are
    correct and timed."""
    mine, cublas = median_ms(record), median_ms(named(run, "cublas"))
    return 100 * cublas / mine if mine and cublas else None


def time_text(record: Record | None, wl: Workload) -> str:
    """A record's median time with its unit, us for memory-bound ops and ms otherwise; '-'
    where it was not timed."""
    ms = median_ms(record)
    if ms is None:
        return "-"
    return f"{ms * 1e3:.2f} us" if wl.op in MEMORY_BOUND else f"{ms:.4f} ms"


def hardware_limit(record: Record) -> tuple[float, str] | None:
    """The TFLOP/s the roofline allows the record's workload, and which bound that is: the
    lower of the datasheet's dense peak for its input dtype ('peak') and the copy bandwidth
    measured in its run times its arithmetic intensity ('copy BW'), so a decode-sized GEMM
    is held to the bandwidth and a GEMV always is; None where neither is known."""
    wl = workload_of(record)
    bounds = []
    peak = (spec_peaks(record.gpu) or {}).get(wl.dtype)
    if peak:
        bounds.append((peak, "peak"))
    if record.copy_gbps:
        bounds.append((record.copy_gbps * wl.flops / wl.min_bytes / 1e3, "copy BW"))
    return min(bounds, default=None)


def percent_of_limit(record: Record | None) -> tuple[float, str] | None:
    """A timed record's share of its hardware limit (hardware_limit) and the bound's name;
    None where it was not timed or no limit is known."""
    limit = record and median_ms(record) and hardware_limit(record)
    if not limit:
        return None
    tflops = workload_of(record).flops / (median_ms(record) * 1e9)
    return 100 * tflops / limit[0], limit[1]


def limit_text(record: Record | None) -> str:
    """percent_of_limit as a cell: '71.2% of peak', '88.0% of copy BW', or '-'."""
    found = percent_of_limit(record)
    return f"{found[0]:.1f}% of {found[1]}" if found else "-"


def headline_row(run: list[Record]) -> dict:
    """A workload's line in the headline table: our fastest correct kernel, its time, its %
    of cuBLAS in the same run and its % of the hardware limit."""
    wl, best = workload_of(run[0]), fastest(run)
    return {"workload": wl.label(), "best": schedule_label(best) if best else "none correct",
            "time": time_text(best, wl),
            "% of cuBLAS": _fmt(percent_of_cublas(run, best), ".1f", "%"),
            "% of limit": limit_text(best)}


LIMIT_NOTE = ("% of limit: of the roofline's bound at the workload's arithmetic intensity, the "
              "lower of the datasheet's dense peak for the input dtype and the copy bandwidth "
              "measured in the same run times the intensity.")


def split_notes(notes: str | None) -> tuple[str | None, str | None]:
    """The notes as (conclusion, the rest): their first paragraph leads the report as its
    conclusion, unless it is a heading (notes that open with a section have none); the rest
    goes under Notes."""
    if not notes or not notes.strip():
        return None, None
    first, _, rest = notes.strip().partition("\n\n")
    if first.startswith("#"):
        return None, notes.strip()
    return first, rest.strip() or None


def opening(title: str, headline: list[dict], note: str, conclusion: str | None) -> list[str]:
    """The report's first lines, the answer before the method: the title, the headline table
    and what its columns are, and the conclusion."""
    lines = [f"# {title}", ""]
    if headline:
        lines += [markdown_table(headline), "", note, ""]
    if conclusion:
        lines += [conclusion, ""]
    return lines


def _references(run: list[Record] | None) -> dict[str, float]:
    """cuBLAS and the fastest manual rung of a run, by label: the lines a tuning curve is read
    against."""
    if not run:
        return {}
    timed = timed_correct(run)
    found = {"cuBLAS": r.timing.median_ms for r in timed if r.schedule == "cublas"}
    rungs = [r for r in timed if r.kind == "rung"]
    if rungs:
        fastest = min(rungs, key=lambda r: r.timing.median_ms)
        found[f"best manual rung ({fastest.schedule})"] = fastest.timing.median_ms
    return found


def _retimed_as(r: Record) -> tuple:
    """What ties a search to its re-timed row: a template's row is the best of all its
    searches; MetaSchedule's, the best of its work dir."""
    return r.schedule, r.params.get("work_dir")


def search_section(searches: list[Record], run: list[Record] | None,
                   figure: str | None) -> list[str]:
    """Markdown for the searches of one workload: a summary, the tuning curves as a table of
    best-so-far times at checkpoints, and the plot. The curves' table names each search by a
    short key (S1, S2, ...), which the summary gives: full names as column headers made it
    hundreds of characters wide."""
    lines = []
    refs = _references(run)
    tuned = {_retimed_as(r): r for r in run or [] if r.kind == "tuned"}
    cublas = refs.get("cuBLAS")
    summary = []
    keys = {id(r): f"S{n}" for n, r in enumerate(searches, start=1)}
    for r in searches:
        best = min((t for _, t in r.curve if t is not None), default=None)
        final = tuned.get(_retimed_as(r))
        final_ms = final.timing.median_ms if final and final.timing else None
        summary.append({
            "search": _search_name(r),
            "trials": f"{r.trials}/{r.space}" if r.space else str(r.trials),
            "per min": _fmt(r.trials_per_min, ".1f"),
            "best": _fmt(best, ".4f"),
            "re-timed": _fmt(final_ms, ".4f"),
            "% of cuBLAS": _fmt(_ratio(cublas and 100 * cublas, final_ms), ".1f", "%"),
            "key": keys[id(r)],
        })
    lines += ["trials: run / in the space, where it is finite; per min: trials a minute; best "
              "(ms): the fastest candidate; re-timed (ms): that kernel timed in full next to "
              "cuBLAS; key: its column below.", "", markdown_table(summary), ""]
    longest = max(len(r.curve) for r in searches)
    marks = [n for n in CHECKPOINTS if n < longest] + [longest]
    rows = []
    for n in marks:
        row = {"trials": str(n)}
        for r in searches:
            row[keys[id(r)]] = _fmt(r.curve[n - 1][1] if len(r.curve) >= n else None,
                                    ".4f")
        rows.append(row)
    for label, ms in refs.items():
        rows.append({"trials": label, **{keys[id(r)]: f"{ms:.4f}" for r in searches}})
    lines += ["Best time so far (ms) after each number of trials; the last rows are the "
              "references from the same report.", "", markdown_table(rows), ""]
    if figure:
        lines += [f"![tuning curves]({figure})", ""]
    return lines


def plot_curves(searches: list[Record], run: list[Record] | None, title: str, path: str) -> None:
    """Best-so-far time against trials for each search, with cuBLAS and the best manual rung."""
    import matplotlib  # loaded only where a figure is drawn; its Agg backend before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for index, r in enumerate(searches):
        points = [(n, t) for n, t in r.curve if t is not None]
        if points:
            colour, style = curve_style(index)
            ax.step(*zip(*points), where="post", color=colour, linestyle=style, linewidth=1.6,
                    label=f"S{index + 1}: {_search_name(r)}")
    for (label, ms), style in zip(_references(run).items(), ("--", ":")):
        ax.axhline(ms, linestyle=style, color="black", linewidth=1.0, label=label)
    ax.set_xlabel("trials")
    ax.set_ylabel("best time so far (ms)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


CURVE_STYLES = ("-", "--", "-.", ":")


def curve_style(n: int) -> tuple[str, str]:
    """The n-th search's colour and line style: nine colours of tab10 (not its gray) and four
    styles, both changing from one curve to the next, so that no two of 36 curves look alike
    and neighbours differ even in grey."""
    colours = [f"C{i}" for i in range(10) if i != 7]
    return colours[n % len(colours)], CURVE_STYLES[n % len(CURVE_STYLES)]


def compute_label(ceiling: Record) -> str:
    """What a compute ceiling is: cuBLAS's rate on a large square GEMM in this run."""
    return f"cuBLAS {ceiling.params['size']}^3 {ceiling.dtype}, this run"


GROUP_MARKERS = "osD^vP*X"


def group_style(n: int) -> tuple[str, str]:
    """The n-th group's colour and marker on the roofline: ten colours and eight markers, both
    changing from one group to the next, so that no two of 40 groups look alike."""
    return f"C{n % 10}", GROUP_MARKERS[n % len(GROUP_MARKERS)]


def spread(xs: list[float], step: float = 1.2, widest: float = 1.6) -> list[float]:
    """The intensities at which to draw runs: runs within 5% of each other (fp16 and bf16 of one
    shape, say) are set side by side, `step` apart on the log axis around their geometric mean
    (closer where that would spread them over more than a factor `widest`, so no point moves
    far from its intensity), so their points are not drawn on one vertical line; the others
    stay where they are."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    clusters: list[list[int]] = []
    for i in order:
        if clusters and xs[i] <= xs[clusters[-1][0]] * 1.05:
            clusters[-1].append(i)
        else:
            clusters.append([i])
    drawn = list(xs)
    for cluster in clusters:
        centre = math.exp(sum(math.log(xs[i]) for i in cluster) / len(cluster))
        apart = min(step, widest ** (1 / max(len(cluster) - 1, 1)))
        for j, i in enumerate(cluster):
            drawn[i] = centre * apart ** (j - (len(cluster) - 1) / 2)
    return drawn


def median(values: list[float]) -> float:
    """The middle value (the mean of the two middle ones)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def roofs(runs: list[list[Record]]) -> tuple[float | None, dict[str, Record]]:
    """The ceilings a report's roofline draws: the copy bandwidth (the median over the runs
    that measured it; they agree within a few percent) and, per input dtype, the compute
    ceiling record of median TFLOP/s among the runs that measured one."""
    bandwidths = [run[0].copy_gbps for run in runs if run[0].copy_gbps]
    computes: dict[str, list[Record]] = {}
    for run in runs:
        if run[0].compute_ceiling:
            computes.setdefault(run[0].dtype, []).append(run[0].compute_ceiling)
    chosen = {dtype: min(found, key=lambda c: abs(c.compute_tflops - median(
        [f.compute_tflops for f in found]))) for dtype, found in computes.items()}
    return (median(bandwidths) if bandwidths else None), chosen


def draw_roofs(ax, runs: list[list[Record]], x_lo: float, x_hi: float) -> None:
    """The copy bandwidth's slope and each dtype's compute ceiling, in black, each line in its
    own style and named in the legend."""
    bandwidth, computes = roofs(runs)
    top = max((c.compute_tflops for c in computes.values()), default=None)
    if bandwidth:
        x_top = 1e3 * top / bandwidth if top else x_hi
        ax.plot([x_lo, x_top], [bandwidth * x_lo / 1e3, bandwidth * x_top / 1e3], color="black",
                label=f"copy bandwidth, measured: {bandwidth:.0f} GB/s")
    for style, (dtype, ceiling) in zip(("--", "-.", ":", (0, (5, 1))), sorted(computes.items())):
        peak = ceiling.compute_tflops
        ax.plot([1e3 * peak / bandwidth if bandwidth else x_lo, x_hi], [peak, peak],
                color="black", linestyle=style, linewidth=1.0,
                label=f"{compute_label(ceiling)}: {peak:.0f} TFLOP/s")


def plot_roofline(runs: list[list[Record]], title: str, path: str,
                  group_of=lambda run: workload_of(run[0]).label()) -> list[tuple]:
    """One roofline for a whole report: every correct kernel of every run at its workload's
    arithmetic intensity (FLOP per byte of its minimum traffic), under the ceilings measured in
    the runs. A run's group (its workload; a suite report passes the suite) sets the colour and
    marker, named in the legend; our fastest kernel is drawn large and filled, cuBLAS large and
    hollow, the other kernels small, so the legend, not labels at the points, says what each
    is. Returns the points drawn, (group, kernel, TFLOP/s)."""
    import matplotlib  # loaded only where a figure is drawn; its Agg backend before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    intensities = [workload_of(run[0]).flops / workload_of(run[0]).min_bytes for run in runs]
    bandwidth, computes = roofs(runs)
    ridges = [1e3 * c.compute_tflops / bandwidth for c in computes.values() if bandwidth]
    x_lo, x_hi = min(intensities + ridges) / 10, max(intensities + ridges) * 10
    groups = list(dict.fromkeys(group_of(run) for run in runs))
    fig, ax = plt.subplots(figsize=(9, 6))
    drawn = []
    for run, x in zip(runs, spread(intensities)):
        group = group_of(run)
        colour, marker = group_style(groups.index(group))
        wl, best, cublas = workload_of(run[0]), fastest(run), named(run, "cublas")
        for r in timed_correct(run):
            tflops = wl.flops / (median_ms(r) * 1e9)
            big = r is best or r is cublas
            ax.scatter([x], [tflops], marker=marker, s=60 if big else 14, zorder=3 if big else 2,
                       facecolors="none" if r is cublas else colour, edgecolors=colour,
                       linewidths=1.5, alpha=1.0 if big else 0.45)
            drawn.append((group, schedule_label(r), tflops))
    draw_roofs(ax, runs, x_lo, x_hi)
    heights = [t for _, _, t in drawn] + [c.compute_tflops for c in computes.values()]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(min(heights, default=1.0) / 3, max(heights, default=1.0) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the workload's minimum traffic)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", color="0.9", linewidth=0.5)
    key = [Line2D([], [], linestyle="", marker="o", color="black", label="fastest of ours"),
           Line2D([], [], linestyle="", marker="o", markerfacecolor="none", color="black",
                  label="cuBLAS"),
           Line2D([], [], linestyle="", marker="o", markersize=4, color="black", alpha=0.45,
                  label="other kernels")]
    named_groups = [Line2D([], [], linestyle="", marker=group_style(n)[1],
                           color=group_style(n)[0], label=group) for n, group in enumerate(groups)]
    handles = ax.get_legend_handles_labels()[0] + key + named_groups
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return drawn


def ceilings_text(first: Record) -> str:
    """The ceilings measured in the run of `first` (a measurement with_ceilings gave them), as
    the run's header names them, each after "; "."""
    parts = [f"device {what} bandwidth in the same run: {getattr(first, f'{what}_gbps'):.0f} "
             "GB/s" for what in BANDWIDTHS if getattr(first, f"{what}_gbps")]
    if first.compute_ceiling:
        ceiling = first.compute_ceiling
        parts.append(f"compute ceiling, {compute_label(ceiling)}: "
                     f"{ceiling.compute_tflops:.0f} TFLOP/s")
    return "".join(f"; {part}" for part in parts)


def roofline_section(runs: list[list[Record]], figure: str) -> list[str]:
    """Markdown for the report's roofline: the figure, how to read it, and the ceilings that no
    run measured (so none is drawn)."""
    lines = [f"![roofline of every workload]({figure})", "",
             "Filled: our fastest correct kernel; hollow: cuBLAS; small: the other correct "
             "kernels. Workloads of nearly equal intensity are set side by side.", ""]
    missing = [] if any(run[0].copy_gbps for run in runs) else ["the copy bandwidth"]
    dtypes = dict.fromkeys(run[0].dtype for run in runs)
    missing += [f"the compute ceiling for {dtype}" for dtype in dtypes
                if not any(run[0].compute_ceiling for run in runs
                           if run[0].dtype == dtype)]
    if missing:
        lines += [f"*Not measured in these runs, so not drawn: {', '.join(missing)}.*", ""]
    return lines


def method_lines(runs: list[list[Record]], searches: dict[tuple, list[Record]]) -> list[str]:
    """The report's methodology: GPUs, driver and TVM, timing, what % of peak is of, how
    searches were timed and how correctness was checked."""
    lines = []
    facts = sorted({(r[0].gpu, r[0].driver, r[0].tvm) for r in runs}
                   | {(r.gpu, r.driver, r.tvm) for rs in searches.values() for r in rs})
    for gpu, driver, tvm in facts:
        lines.append(f"- GPU: **{gpu}**, driver {driver}; TVM {tvm}")
    methods = sorted({m.timing.method for run in runs for m in run if m.timing})
    for method in methods:
        lines.append(f"- Timing: {method}")
    if any(r[0].op == "gemm" for r in runs):
        lines.append(
            "- % of peak: of the datasheet's dense peak for the input dtype (fp32 on CUDA cores, "
            "TF32, fp16/bf16 and fp8 on tensor cores): "
            + "; ".join(f"{gpu} {', '.join(f'{k} {v}' for k, v in p.items())} TFLOP/s"
                        for gpu, p in SPEC_PEAK_TFLOPS.items() if any(gpu in f[0] for f in facts)))
    if searches:
        lines.append(
            "- Searches: every candidate is checked against float64, then timed by the same "
            f"harness with a {SEARCH_BUDGET_MS:.0f} ms budget (fewer samples); the best of each "
            "search is re-timed in full next to cuBLAS")
    lines.append(
        "- Correctness: random normal inputs, output poisoned with NaN, relative Frobenius error "
        "against a float64 reference; a failed kernel is not ranked"
        + (f"; {NVFP4_INPUTS}" if any(workload_of(r[0]).is_nvfp4 for r in runs) else "")
    )
    lines.append("")
    return lines


def run_section(run: list[Record], counters: list[Record]) -> tuple[list[str], list[str]]:
    """One workload's section, where and how its run measured it and its detail table (with a
    "why" column where `counters` explain a step of its ladder, and those steps in words), and
    its part of the appendix: the long columns, by schedule."""
    first = run[0]
    wl = workload_of(first)
    where = f"Measured {first.date[:19].replace('T', ' ')} UTC, run `{first.run_id}`"
    where += f"; before each timed launch: {FLUSHES[first.flush]}"
    rows = table_rows(run)
    explained = why.explained_steps(run, counters)
    if cells := why.why_cells(explained):
        rows = [{**row, "why": cells.get(row["schedule"], "-")} for row in rows]
    detail, extra = split_columns(rows, APPENDIX_COLUMNS, ("schedule",))
    section = [f"## {wl.label()}", "", where + ceilings_text(first) + ".", "",
               markdown_table(detail), "", *why.why_section(first, explained)]
    return section, [f"### {wl.label()}", "", markdown_table(extra), ""]


def render(records: list, title: str = "Performance report", notes: str | None = None,
           figure_prefix: str | None = None, counters: list | None = None) -> str:
    """The whole markdown report. It opens with the headline table and the conclusion (the
    notes' first paragraph); then the method, the roofline, a section per workload and per
    workload's searches; the rest of the notes (written by a person) under Notes; last the
    appendix of long columns. With `figure_prefix`, the roofline of every workload is drawn to
    `<figure_prefix>-roofline.png` and each workload's tuning curves to
    `<figure_prefix>-<n>.png`, linked from the report by file name. With `counters` (records
    of tuning.explain), each ladder table says why each counted rung is faster than the one
    before (reporting/why.py). The records (dicts as read from a file, or Records) are read as
    Records, in the current schema (facts.record)."""
    records = [Record.of(r) for r in records]
    counters = [Record.of(c) for c in counters or []]
    runs = latest_runs(records)
    searches = latest_searches(records)
    if not runs and not searches:
        raise RecordsError("no measurements to report (run on a GPU first)")
    if figure_prefix:  # the figures are written before the report, maybe into a new folder
        os.makedirs(os.path.dirname(os.path.abspath(figure_prefix)), exist_ok=True)
    conclusion, notes = split_notes(notes)
    lines = opening(title, [headline_row(run) for run in runs],
                    "best: our fastest correct kernel, a rung or a searched one. " + LIMIT_NOTE,
                    conclusion)
    lines += method_lines(runs, searches)
    if figure_prefix and runs:
        figure = f"{figure_prefix}-roofline.png"
        gpus = ", ".join(dict.fromkeys(run[0].gpu for run in runs))
        plot_roofline(runs, f"{title}: every workload on {gpus}", figure)
        lines += roofline_section(runs, os.path.basename(figure))
    appendix = []
    for run in runs:
        section, details = run_section(run, counters)
        lines += section
        appendix += details
    run_of = {(r[0].gpu, *workload_key(r[0])): r for r in runs}
    for n, (key, found) in enumerate(sorted(searches.items(), key=str), start=1):
        wl = workload_of(found[0])
        lines += [f"## Searches: {wl.label()}", ""]
        figure = None
        if figure_prefix:
            figure = f"{figure_prefix}-{n}.png"
            plot_curves(found, run_of.get(key), f"{wl.label()} on {key[0]}", figure)
        lines += search_section(found, run_of.get(key), figure and os.path.basename(figure))
    if notes:
        lines += ["## Notes", "", notes, ""]
    if appendix:
        lines += ["## Appendix: calls, spread, registers, shared memory, errors, status",
                  "", *appendix]
    return "\n".join(lines)


@contextlib.contextmanager
def staged(path: str) -> Iterator[str]:
    """Where to write the report `path` and its figures (`<staged path without .md>-*.png`):
    a staging directory beside `path`, made on entry, so that a place that cannot be written
    is refused (UsageError) before any work; on success its files are moved next to `path`,
    on any failure they are removed with it, and with the directories made for it, so a
    failed report leaves nothing behind."""
    check_writable(path, "--report")
    folder = os.path.dirname(os.path.abspath(path))
    made = folder
    while not os.path.exists(os.path.dirname(made)):
        made = os.path.dirname(made)
    made = None if os.path.exists(made) else made  # the topmost directory made here, if any
    try:
        os.makedirs(folder, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".report-", dir=folder)
    except OSError as e:
        raise UsageError(f"cannot write --report {path}: {e.strerror or e}") from e
    try:
        yield os.path.join(staging, os.path.basename(path))
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), os.path.join(folder, name))
    except BaseException:
        shutil.rmtree(made or staging, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
