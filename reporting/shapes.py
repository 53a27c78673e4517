"""Suite reports, rendered from the records of suite runs (tuning/suite.py), never a live run.

Per suite and GPU, one row per shape from the latest run that measured it: where the shape
comes from (model, layer), the fastest rung that passed its check against float64 and its time,
cuBLAS's time in the same run writing the same output dtype (fp32 GEMM: plain fp32, TF32 off;
never the cublas-tf32 row), and the rung's % of cuBLAS (cuBLAS's time / the rung's x 100);
dlight's % too, as TVM's own schedule. Then the geometric mean of the % per op and dtype, the
ragged shapes next to their aligned neighbours where a suite has them, and a bar chart of the
% per shape.
"""

from __future__ import annotations

import math
import os

from facts import FLUSHES
from facts.record import Record
from reporting.render import (LIMIT_NOTE, fastest, latest_runs, markdown_table,
                              median_ms, named, opening, percent_of_cublas, percent_of_limit,
                              plot_roofline, roofline_section, schedule_label, split_columns,
                              split_notes, time_text, workload_of)
from schedules import suites
from schedules.errors import RecordsError
from schedules.workloads import Workload


def best_rung(run: list[Record]) -> Record | None:
    """The fastest rung of a shape's run that passed its check; None where none did. Failed,
    skipped and unbuilt rungs are never ranked."""
    return fastest(run, ("rung",))


def geomean(values: list[float]) -> float | None:
    """The geometric mean of positive values; None of none."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _percent(value: float | None) -> str:
    """A percentage cell; '-' where there is none."""
    return "-" if value is None else f"{value:.1f}%"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    """A ratio cell, as 1.50x; '-' unless both are there."""
    return f"{numerator / denominator:.2f}x" if numerator and denominator else "-"


def _shape(wl: Workload) -> str:
    """The dimensions and layout, as 16x6144x4096 nt."""
    return f"{'x'.join(map(str, wl.shape))} {wl.layout}"


def shape_row(run: list[Record]) -> dict:
    """A shape's row: where it comes from, its best correct rung against cuBLAS, dlight's
    share, and which rungs are not ranked and why."""
    first, wl = run[0], workload_of(run[0])
    best = best_rung(run)
    rungs = [r for r in run if r.kind == "rung"]
    return {
        "model": first.model or "-",
        "layer": first.layer or "-",
        "shape": _shape(wl),
        "dtype": wl.dtypes,
        "best rung": best.schedule if best else "none correct",
        "time": time_text(best, wl),
        "cuBLAS": time_text(named(run, "cublas"), wl),
        "% of cuBLAS": _percent(percent_of_cublas(run, best)),
        "dlight %": _percent(percent_of_cublas(run, named(run, "dlight"))),
        "rungs correct": f"{sum(median_ms(r) is not None for r in rungs)}/{len(rungs)}",
        "not ranked": ", ".join(f"{r.schedule} ({r.status})" for r in rungs
                                if median_ms(r) is None) or "-",
    }


def geomean_rows(runs: list[list[Record]]) -> list[dict]:
    """Per op and dtype: the geometric mean of the best rung's (and dlight's) % of cuBLAS over
    the shapes where both were correct, and how many shapes that is."""
    groups: dict[tuple[str, str], list[list[Record]]] = {}
    for run in runs:
        wl = workload_of(run[0])
        groups.setdefault((wl.op, wl.dtypes), []).append(run)
    rows = []
    for (op, dtypes), group in groups.items():
        best = [p for p in (percent_of_cublas(run, best_rung(run)) for run in group) if p]
        dlight = [p for p in (percent_of_cublas(run, named(run, "dlight")) for run in group) if p]
        rows.append({"op": op, "dtype": dtypes, "shapes": str(len(group)),
                     "best: in mean": str(len(best)),
                     "best: geomean": _percent(geomean(best)),
                     "dlight: in mean": str(len(dlight)),
                     "dlight: geomean": _percent(geomean(dlight))})
    return rows


def ragged_rows(runs: list[list[Record]]) -> list[dict]:
    """Each ragged shape (its records name an aligned neighbour) next to that neighbour of the
    same dtypes: the best rungs and cuBLAS, as the ragged shape's time over the aligned one's."""
    by_shape = {(tuple(r[0].shape), r[0].dtype, r[0].out_dtype): r for r in runs}
    rows = []
    for run in runs:
        first = run[0]
        if not first.aligned:
            continue
        wl = workload_of(first)
        aligned = by_shape.get((tuple(first.aligned), wl.dtype, wl.out_dtype))
        best = best_rung(run)
        best_aligned, cublas_aligned = ((best_rung(aligned), named(aligned, "cublas"))
                                        if aligned else (None, None))
        rows.append({
            "model": first.model or "-", "layer": first.layer or "-",
            "dtype": wl.dtypes, "ragged": _shape(wl),
            "best rung": best.schedule if best else "none correct", "time": time_text(best, wl),
            "aligned": "x".join(map(str, first.aligned)),
            "best (aligned)": (best_aligned.schedule if best_aligned else
                                    "none correct" if aligned else "not measured"),
            "time (aligned)": time_text(best_aligned, wl),
            "ratio": _ratio(median_ms(best), median_ms(best_aligned)),
            "cuBLAS ratio": _ratio(median_ms(named(run, "cublas")), median_ms(cublas_aligned)),
        })
    return rows


def sections(records: list[Record]) -> dict[tuple[str, str], list[list[Record]]]:
    """The records of suite runs by (suite, GPU): per shape, the records of the latest run that
    measured it (render.latest_runs), in the order they were measured."""
    found: dict[tuple[str, str], list[list[Record]]] = {}
    for name in dict.fromkeys(r.suite for r in records if r.suite):
        for run in latest_runs([r for r in records if r.suite == name]):
            found.setdefault((name, run[0].gpu), []).append(run)
    return found


SHAPE_APPENDIX = ("model", "cuBLAS", "rungs correct", "not ranked")
RAGGED_APPENDIX = ("model", "best (aligned)", "time (aligned)")


def tables(runs: list[list[Record]]) -> tuple[list[str], list[str]]:
    """Markdown of one suite's shapes: the per-shape table, the geometric means and, where the
    suite has ragged shapes, those next to their aligned neighbours; and, for the appendix,
    their long columns (models, cuBLAS's time, the rungs not ranked)."""
    shapes, shapes_extra = split_columns([shape_row(run) for run in runs], SHAPE_APPENDIX,
                                         ("shape", "dtype"))
    lines = [markdown_table(shapes), "",
             "Geometric mean of % of cuBLAS, over the shapes where the schedule and cuBLAS "
             "both ran correctly (in mean: how many):", "", markdown_table(geomean_rows(runs)),
             ""]
    appendix = [markdown_table(shapes_extra), ""]
    ragged = ragged_rows(runs)
    if ragged:
        ragged, ragged_extra = split_columns(ragged, RAGGED_APPENDIX, ("ragged", "dtype"))
        lines += ["Ragged shapes next to their aligned neighbours (ratio: time of the ragged "
                  "shape's best rung / time of the aligned one's, cuBLAS's likewise; above "
                  "1.00x the ragged shape is slower):", "", markdown_table(ragged), ""]
        appendix += [markdown_table(ragged_extra), ""]
    return lines, appendix


def suite_tables(records: list[Record]) -> str:
    """The tables of every suite in `records`, their long columns after them, without the
    report around them (what a suite run prints at its end)."""
    return "\n".join(line for runs in sections(records).values()
                     for part in tables(runs) for line in part)


def headline_row(name: str, runs: list[list[Record]]) -> dict:
    """A suite's line in the headline table: how many shapes, the (at most three) rungs that
    were fastest most often, and the geometric means of the best rung's % of cuBLAS and % of
    the hardware limit (render.percent_of_limit) over the shapes that have them, with the
    lowest % of cuBLAS."""
    best = [best_rung(run) for run in runs]
    counts: dict[str, int] = {}
    for r in best:
        if r:
            counts[r.schedule] = counts.get(r.schedule, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:3]
    cublas = [p for p in (percent_of_cublas(run, r) for run, r in zip(runs, best)) if p]
    limits = [found[0] for found in map(percent_of_limit, best) if found]
    return {"suite": name, "shapes": str(len(runs)),
            "best rung (shapes)": ", ".join(f"{s} ({n})" for s, n in ranked) or "none correct",
            "% of cuBLAS": _percent(geomean(cublas)),
            "lowest": _percent(min(cublas, default=None)),
            "% of limit": _percent(geomean(limits))}


FLOOR_PERCENT = 85.0  # the no-cliffs issue's floor: no shape under this % of cuBLAS


def sweep_rows(runs: list[list[Record]], without: str | None = None) -> list[dict]:
    """A sweep's settings side by side (scripts/sweep_summary.py): per setting (a rung's name
    with its knobs) the geometric mean of its % of cuBLAS at each M and over every shape
    (where it and cuBLAS both ran correctly), its lowest, how many shapes fall under
    FLOOR_PERCENT and on how many it was the fastest; last, the best of the settings on each
    shape, what a rule choosing among them could at most reach, and where `without` is given,
    the best of those whose names lack that text (what a portfolio gains by the others)."""
    percents: dict[str, dict[int, float]] = {}  # setting: {shape's index: %}
    for i, run in enumerate(runs):
        for r in run:
            if r.kind == "rung" and (found := percent_of_cublas(run, r)):
                percents.setdefault(r.schedule, {})[i] = found

    def best_of(names) -> dict[int, float]:
        return {i: max(percents[n][i] for n in names if i in percents[n])
                for i in {i for n in names for i in percents[n]}}

    best = best_of(list(percents))
    bests = [("best of these", best)]
    if without is not None:
        kept = [name for name in percents if without not in name]
        bests.append((f"best without {without}", best_of(kept)))
    rows_of = {i: workload_of(run[0]).dims["M"] for i, run in enumerate(runs)}
    rows = []
    for name, by_shape in [*percents.items(), *bests]:
        values = list(by_shape.values())
        row = {"setting": name}
        for m in sorted(set(rows_of.values())):
            row[f"M = {m}"] = _percent(geomean([p for i, p in by_shape.items() if rows_of[i] == m]))
        row.update({"all": _percent(geomean(values)), "lowest": _percent(min(values, default=None)),
                    f"under {FLOOR_PERCENT:g}%": str(sum(p < FLOOR_PERCENT for p in values)),
                    "fastest on": "-" if any(by_shape is b for _, b in bests) else
                    str(sum(p == best[i] for i, p in by_shape.items())),
                    "shapes": str(len(values))})
        rows.append(row)
    return rows


def summary_line(run: list[Record]) -> str:
    """One line for a shape just measured: its best correct rung against cuBLAS."""
    wl = workload_of(run[0])
    row = shape_row(run)
    return (f"{wl.label()}: best rung {row['best rung']} {row['time']}, cuBLAS {row['cuBLAS']}: "
            f"{row['% of cuBLAS']} of cuBLAS; not ranked: {row['not ranked']}")


def _bar_label(run: list[Record]) -> str:
    """A bar's name: the (first) model, the layer and the shape."""
    first = run[0]
    model = (first.model or "-").split(",")[0]
    return " ".join(p for p in (model if model != "-" else "", first.layer or "",
                                _shape(workload_of(first))) if p)


MOST_BARS = 48  # a suite with more shapes is drawn by M: one point per shape, not one bar


def plot_suite(runs: list[list[Record]], title: str, path: str) -> None:
    """The best correct rung's % of cuBLAS per shape, coloured by dtype, with the 100% line:
    a bar per shape, or, for suites of more than MOST_BARS shapes, a point per shape at its M
    with each M's geometric mean (`_draw_by_m`); a shape without a correct rung says so."""
    import matplotlib  # loaded only where a figure is drawn; its Agg backend before pyplot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wide = len(runs) > MOST_BARS
    fig, ax = plt.subplots(figsize=(10, 6) if wide else (max(8.0, 0.32 * len(runs) + 2), 6))
    handles = (_draw_by_m if wide else _draw_bars)(ax, runs)
    handles.append(ax.axhline(100, color="black", linestyle="--", linewidth=0.8, label="cuBLAS"))
    ax.set_ylabel("best correct rung, % of cuBLAS")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=handles, fontsize=8, loc="upper left", ncol=len(handles))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _draw_bars(ax, runs: list[list[Record]]) -> list:
    """One bar per shape, named on the x axis; returns the dtypes' legend handles."""
    from matplotlib.patches import Patch  # as plot_suite loads matplotlib: only to draw

    colours: dict[str, str] = {}
    highest = 100.0
    for x, run in enumerate(runs):
        dtypes = workload_of(run[0]).dtypes
        colour = colours.setdefault(dtypes, f"C{len(colours)}")
        percent = percent_of_cublas(run, best_rung(run))
        if percent is None:
            ax.text(x, 2, "no correct rung", rotation=90, ha="center", va="bottom", fontsize=7)
        else:
            ax.bar(x, percent, color=colour)
            highest = max(highest, percent)
    ax.set_xlim(-0.6, len(runs) - 0.4)  # room for the shapes without a bar, too
    ax.set_ylim(0, highest * 1.2)  # headroom for the legend
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([_bar_label(run) for run in runs], rotation=90, fontsize=7)
    return [Patch(color=c, label=d) for d, c in colours.items()]


def _draw_by_m(ax, runs: list[list[Record]]) -> list:
    """One point per shape at its M (log scale), and each M's geometric mean joined by a line;
    the shapes without a correct rung counted in the x axis's label. Returns the legend's
    handles."""
    by_dtype: dict[str, list[tuple[int, float]]] = {}
    missing = 0
    for run in runs:
        wl = workload_of(run[0])
        percent = percent_of_cublas(run, best_rung(run))
        if percent is None:
            missing += 1
        else:
            by_dtype.setdefault(wl.dtypes, []).append((wl.dims["M"], percent))
    handles, highest = [], 100.0
    for i, (dtypes, points) in enumerate(by_dtype.items()):
        ms, percents = zip(*points)
        handles.append(ax.scatter(ms, percents, s=14, alpha=0.6, color=f"C{i}", label=dtypes))
        means = sorted((m, geomean([p for pm, p in points if pm == m])) for m in set(ms))
        ax.plot(*zip(*means), color=f"C{i}", linewidth=1.2)
        highest = max(highest, *percents)
    ax.set_xscale("log")
    ax.set_ylim(0, highest * 1.2)
    ax.set_xlabel("M (tokens); the line: each M's geometric mean"
                  + (f"; {missing} shapes without a correct rung" if missing else ""))
    return handles


def _where(runs: list[list[Record]]) -> str:
    """When and how a suite's shapes were measured: each run, its flush and copy bandwidth."""
    measured = {}
    for run in runs:
        measured.setdefault(run[0].run_id, run[0])
    said = []
    for run_id, first in measured.items():
        text = (f"run `{run_id}` ({first.date[:19].replace('T', ' ')} UTC; before each timed "
                f"launch: {FLUSHES[first.flush]}")
        if first.copy_gbps:
            text += f"; device copy bandwidth in the same run: {first.copy_gbps:.0f} GB/s"
        said.append(text + ")")
    return "Measured in " + ", ".join(said) + "."


def suite_section(name: str, gpu: str, runs: list[list[Record]], figure: str | None
                  ) -> tuple[list[str], list[str]]:
    """Markdown for one suite on one GPU: what it is, where and how it was measured, which
    schedules ran, the tables and the chart; and its part of the appendix."""
    lines = [f"## Suite `{name}` on {gpu}", ""]
    suite = suites.SUITES.get(name)
    if suite:
        lines += [suite.summary + ".", ""]
    lines += [_where(runs), ""]
    ran = dict.fromkeys(r.schedule for run in runs for r in run if r.kind == "rung")
    baselines = dict.fromkeys(schedule_label(r) for run in runs for r in run
                              if r.schedule in ("dlight", "cublas"))
    lines += [f"Rungs: {', '.join(ran) or 'none'}; baselines: {', '.join(baselines)}."]
    if suite and suite.left_out:
        lines += [f"Not run: {suite.left_out}."]
    lines.append("")
    detail, appendix = tables(runs)
    lines += detail
    if figure:
        lines += [f"![% of cuBLAS per shape, {name}]({figure})", ""]
    return lines, [f"### Suite `{name}` on {gpu}", "", *appendix]


def render(records: list, title: str = "Suite report", notes: str | None = None,
           figure_prefix: str | None = None) -> str:
    """The whole markdown report of the suite runs in `records`. It opens with a headline line
    per suite and the conclusion (the notes' first paragraph), then the method, the roofline of
    every shape, a section per suite, the rest of the notes (written by a person) and the
    appendix of long columns. With `figure_prefix`, each suite's chart is drawn to
    `<figure_prefix>-<suite>.png` (`-<suite>-<n>.png` for its n-th GPU after the first) and the
    roofline to `<figure_prefix>-roofline.png`, linked by file name. Records of an earlier
    schema are read in the current one (facts.record)."""
    found = sections([Record.of(r) for r in records])
    if not found:
        raise RecordsError("no suite measurements to report (run `runner.py --suite NAME` on a "
                           "GPU)")
    firsts = [run[0] for runs in found.values() for run in runs]
    several = len({gpu for _, gpu in found}) > 1
    headline = [headline_row(f"{name} ({gpu})" if several else name, runs)
                for (name, gpu), runs in found.items()]
    conclusion, notes = split_notes(notes)
    lines = opening(title, headline, "Geometric means over each suite's shapes of the best "
                    "correct rung's %; lowest: its lowest % of cuBLAS. " + LIMIT_NOTE, conclusion)
    for gpu, driver, tvm in sorted({(r.gpu, r.driver, r.tvm) for r in firsts}):
        lines.append(f"- GPU: **{gpu}**, driver {driver}; TVM {tvm}")
    methods = {r.timing.method for runs in found.values() for run in runs for r in run
               if r.timing}
    lines += [f"- Timing: {method}" for method in sorted(methods)]
    lines += [
        "- Correctness: random normal inputs, output poisoned with NaN, relative Frobenius error "
        "against a float64 reference; a rung that failed its check, was skipped or did not "
        "build is never ranked",
        "- % of cuBLAS: cuBLAS's time / the best correct rung's time x 100, both measured in the "
        "same run; cuBLAS writes the workload's output dtype, as the rungs do (float32 GEMMs "
        "against plain float32 cuBLAS, TF32 off)",
        "- Geometric means are over the shapes where both ran correctly; the tables say how many",
        "",
    ]
    if figure_prefix:
        every = [run for runs in found.values() for run in runs]
        figure = f"{figure_prefix}-roofline.png"
        plot_roofline(every, f"{title}: every shape", figure,
                      group_of=lambda run: run[0].suite)
        lines += roofline_section(every, os.path.basename(figure))
    drawn: dict[str, int] = {}  # charts drawn per suite: one per GPU
    appendix = []
    for (name, gpu), runs in found.items():
        figure = None
        if figure_prefix:
            drawn[name] = drawn.get(name, 0) + 1
            figure = f"{figure_prefix}-{name}{'' if drawn[name] == 1 else f'-{drawn[name]}'}.png"
            plot_suite(runs, f"suite {name} on {gpu}: best correct rung, % of cuBLAS", figure)
        section, details = suite_section(name, gpu, runs, figure and os.path.basename(figure))
        lines += section
        appendix += details
    if notes:
        lines += ["## Notes", "", notes, ""]
    lines += ["## Appendix: models, cuBLAS's times, rungs not ranked", "", *appendix]
    return "\n".join(lines)
