"""Markdown reports rendered from measurement records, never from a live run.

For every GPU and workload in the records, the latest run that measured it becomes one table,
in the order the run measured it (the ladder, then the baselines): time, speedup over naive
and over the previous rung, throughput, the ratio to cuBLAS measured in the same run, and for
memory-bound ops the share of the copy bandwidth measured in the same run (and of the read
bandwidth, where the run measured it). With a figure prefix, each table also gets its roofline:
the kernels' TFLOP/s under the copy bandwidth and the compute ceiling (cuBLAS on a large square
GEMM) measured in that run.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from typing import Iterator

from tabulate import tabulate

from facts import (FLUSHES, NVFP4_INPUTS, SEARCH_BUDGET_MS, SPEC_PEAK_TFLOPS, check_writable,
                   spec_peaks, spilled_bytes)
from schedules.errors import RecordsError, UsageError
from schedules.workloads import Workload

MEMORY_BOUND = ("gemv", "batched_gemv")
BANDWIDTHS = ("copy", "read")  # the bandwidth ceilings a run may measure: `<what>_gbps`


def workload_key(record: dict) -> tuple:
    return (record["op"], tuple(record["shape"]), record["dtype"], record["out_dtype"],
            record["layout"])


def workload_of(record: dict) -> Workload:
    return Workload(
        record["op"], tuple(record["shape"]), record["dtype"], record["out_dtype"], record["layout"]
    )


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def flush_of(record: dict) -> str:
    """What ran before each timed launch (measure.FLUSHES); records from before --flush say
    flush_l2, and their flush was a read."""
    return record.get("flush") or ("read" if record.get("flush_l2", True) else "none")


def schedule_label(record: dict) -> str:
    """The row's name: the schedule, and for cuBLAS the torch call that was timed (which
    output dtype it writes)."""
    call = (record.get("params") or {}).get("call")
    return f"{record['schedule']} ({call})" if call else record["schedule"]


def registers(record: dict) -> str:
    """The most registers any kernel of the row uses, and the bytes spilled, if any."""
    usage = list((record.get("resources") or {}).values())
    if not usage:
        return "-"
    spilled = sum(spilled_bytes(record["resources"]).values())
    most = str(max(u.get("registers", 0) for u in usage))
    return most + (f" (SPILLS {spilled} B)" if spilled else "")


def _ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def table_rows(run: list[dict]) -> list[dict]:
    """One row per measurement of one workload in one run (rungs, then baselines)."""
    wl = workload_of(run[0])
    memory_bound = wl.op in MEMORY_BOUND
    scale, unit = (1e3, "us") if memory_bound else (1.0, "ms")
    timed = {r["schedule"]: r["timing"]["median_ms"] for r in run if r.get("status") == "ok"}
    naive = timed.get("naive")
    cublas = timed.get("cublas")
    bandwidths = {what: next((r[f"{what}_gbps"] for r in run if r.get(f"{what}_gbps")), None)
                  for what in BANDWIDTHS}
    rows, previous = [], None
    for r in run:
        t = timed.get(r["schedule"])
        is_rung = r.get("kind") == "rung"
        row = {"schedule": schedule_label(r)}
        row[f"time ({unit})"] = _fmt(t and t * scale, ".3f" if unit == "ms" else ".2f")
        if t is not None:
            row["min-max"] = f"{r['timing']['min_ms'] * scale:.3g}-{r['timing']['max_ms'] * scale:.3g}"
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
            peak = (spec_peaks(r["gpu"]) or {}).get("tf32" if r["schedule"] == "cublas-tf32" else wl.dtype)
            row["% of peak"] = _fmt(_ratio(tflops and 100 * tflops, peak), ".1f", "%")
        row["% of cuBLAS"] = _fmt(_ratio(cublas and 100 * cublas, t), ".1f", "%")
        row["regs"] = registers(r)
        row["smem B"] = str((r.get("structure") or {}).get("shared bytes", "-"))
        row["rel. error"] = _fmt(r.get("rel_error"), ".1e")
        row["status"] = r.get("status") if r.get("status") != "ok" else "correct"
        if r.get("status") not in ("ok", None) and r.get("error"):
            row["status"] += f": {r['error'].splitlines()[0][:80]}"
        rows.append(row)
        if is_rung and t is not None:
            previous = t
    return rows


def markdown_table(rows: list[dict]) -> str:
    return tabulate(rows, headers="keys", tablefmt="github", disable_numparse=True)


def latest_runs(records: list[dict]) -> list[list[dict]]:
    """Measurements grouped by (GPU, workload), each group from the latest run that has it."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in records:
        if r.get("kind") not in ("rung", "tuned", "baseline"):
            continue
        group = (r.get("gpu"), *workload_key(r))
        groups.setdefault(group, {}).setdefault(r["run_id"], []).append(r)
    ceilings: dict[str, list[dict]] = {}
    for r in records:
        if r.get("kind") == "ceiling":
            ceilings.setdefault(r["run_id"], []).append(r)
    selected = []
    for runs in groups.values():
        run_id = max(runs, key=lambda rid: runs[rid][0]["date"])
        selected.append(with_ceilings(runs[run_id], ceilings.get(run_id, [])))
    return selected


def with_ceilings(run: list[dict], ceilings: list[dict]) -> list[dict]:
    """A run's measurements, each with the ceilings measured in that same run: the copy and read
    bandwidths (`copy_gbps`, `read_gbps`) and the compute ceiling in the run's input dtype
    (`compute_ceiling`, its record); a ceiling the run did not measure is left out, never
    filled in."""
    extra = {}
    for key in (f"{what}_gbps" for what in BANDWIDTHS):
        gbps = next((c[key] for c in ceilings if c.get(key)), None)
        if gbps:
            extra[key] = gbps
    compute = next((c for c in ceilings if c.get("compute_tflops")
                    and c.get("dtype") == run[0]["dtype"]), None)
    if compute:
        extra["compute_ceiling"] = compute
    return [{**m, **extra} for m in run]


TVM_RULES = "TVM's rules"
CHECKPOINTS = (1, 4, 8, 16, 24, 32, 36, 48, 64, 96, 128, 144, 192, 256, 384, 512)


def latest_searches(records: list[dict]) -> dict[tuple, list[dict]]:
    """Search summaries by (GPU, workload): the latest of each (schedule, tuner, rules, seed)."""
    chosen: dict[tuple, dict] = {}
    for r in records:
        if r.get("kind") != "search":
            continue
        key = (r.get("gpu"), *workload_key(r), r["schedule"], r.get("tuner"), r.get("rules"),
               r.get("seed") or 0, r.get("shared_kb"))
        if key not in chosen or r["date"] >= chosen[key]["date"]:
            chosen[key] = r
    by_workload: dict[tuple, list[dict]] = {}
    for key, r in chosen.items():
        by_workload.setdefault(key[:6], []).append(r)
    return by_workload


def _search_name(r: dict) -> str:
    seed = f", seed {r['seed']}" if r.get("seed") else ""
    if r["search"] == "metaschedule":  # searches before --ms-space had TVM's rules only
        limit = f", {r['shared_kb']} KB shared" if r.get("shared_kb") else ""
        return f"{r['schedule']} ({r.get('rules', TVM_RULES)}{seed}{limit})"
    return f"{r['schedule']} ({r['tuner']}{seed})"


def median_ms(record: dict | None) -> float | None:
    """The median time of a record that passed its check and was timed; None otherwise."""
    if record and record.get("status") == "ok" and record.get("timing"):
        return record["timing"]["median_ms"]
    return None


def timed_correct(run: list[dict]) -> list[dict]:
    """The measurements of a run that passed their check and were timed: the only ones ranked
    or drawn."""
    return [r for r in run if median_ms(r) is not None]


def _references(run: list[dict] | None) -> dict[str, float]:
    """cuBLAS and the fastest manual rung of a run, by label: the lines a tuning curve is read
    against."""
    if not run:
        return {}
    timed = timed_correct(run)
    found = {"cuBLAS": r["timing"]["median_ms"] for r in timed if r["schedule"] == "cublas"}
    rungs = [r for r in timed if r.get("kind") == "rung"]
    if rungs:
        fastest = min(rungs, key=lambda r: r["timing"]["median_ms"])
        found[f"best manual rung ({fastest['schedule']})"] = fastest["timing"]["median_ms"]
    return found


def _retimed_as(r: dict) -> tuple:
    """What ties a search to its re-timed row: a template's row is the best of all its
    searches; MetaSchedule's, the best of its work dir."""
    return r["schedule"], r["params"].get("work_dir")


def search_section(searches: list[dict], run: list[dict] | None, figure: str | None) -> list[str]:
    """Markdown for the searches of one workload: a summary, the tuning curves as a table of
    best-so-far times at checkpoints, and the plot."""
    lines = []
    refs = _references(run)
    tuned = {_retimed_as(r): r for r in run or [] if r.get("kind") == "tuned"}
    cublas = refs.get("cuBLAS")
    summary = []
    for r in searches:
        best = min((t for _, t in r["curve"] if t is not None), default=None)
        final = tuned.get(_retimed_as(r))
        final_ms = final["timing"]["median_ms"] if final and final.get("timing") else None
        summary.append({
            "search": _search_name(r),
            "trials": str(r["trials"]),
            "space": str(r.get("space") or "-"),
            "trials/min": _fmt(r.get("trials_per_min"), ".1f"),
            "best in search (ms)": _fmt(best, ".4f"),
            "best, re-timed with cuBLAS (ms)": _fmt(final_ms, ".4f"),
            "% of cuBLAS": _fmt(_ratio(cublas and 100 * cublas, final_ms), ".1f", "%"),
        })
    lines += [markdown_table(summary), ""]
    longest = max(len(r["curve"]) for r in searches)
    marks = [n for n in CHECKPOINTS if n < longest] + [longest]
    rows = []
    for n in marks:
        row = {"trials": str(n)}
        for r in searches:
            row[_search_name(r)] = _fmt(r["curve"][n - 1][1] if len(r["curve"]) >= n else None,
                                        ".4f")
        rows.append(row)
    for label, ms in refs.items():
        rows.append({"trials": label, **{_search_name(r): f"{ms:.4f}" for r in searches}})
    lines += ["Best time so far (ms) after each number of trials; the last rows are the "
              "references from the same report.", "", markdown_table(rows), ""]
    if figure:
        lines += [f"![tuning curves]({figure})", ""]
    return lines


def plot_curves(searches: list[dict], run: list[dict] | None, title: str, path: str) -> None:
    """Best-so-far time against trials for each search, with cuBLAS and the best manual rung."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in searches:
        points = [(n, t) for n, t in r["curve"] if t is not None]
        if points:
            ax.step(*zip(*points), where="post", label=_search_name(r))
    for (label, ms), style in zip(_references(run).items(), ("--", ":")):
        ax.axhline(ms, linestyle=style, color="gray", label=label)
    ax.set_xlabel("trials")
    ax.set_ylabel("best time so far (ms)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compute_label(ceiling: dict) -> str:
    """What a compute ceiling is: cuBLAS's rate on a large square GEMM in this run."""
    return f"cuBLAS {ceiling['params']['size']}^3 {ceiling['dtype']}, this run"


MARKERS = {"rung": ("o", "tab:blue", "rungs"), "tuned": ("^", "tab:green", "searched"),
           "baseline": ("s", "tab:red", "baselines")}


def plot_roofline(run: list[dict], title: str, path: str) -> list[tuple[str, float]]:
    """One workload's roofline: the TFLOP/s of each correct kernel of the run at the workload's
    arithmetic intensity (FLOP per byte of its minimum traffic), under the ceilings measured in
    the same run, the copy bandwidth and, where measured, the compute ceiling, which meet at the
    ridge point. Labels are spread upwards so close points stay readable: rungs on the right,
    searched kernels and baselines on the left. Returns the points drawn, (label, TFLOP/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wl = workload_of(run[0])
    intensity = wl.flops / wl.min_bytes
    points = [(schedule_label(r), r["kind"], wl.flops / (r["timing"]["median_ms"] * 1e9))
              for r in timed_correct(run)]
    bandwidth = run[0].get("copy_gbps")  # TFLOP/s at x FLOP/byte: bandwidth * x / 1000
    compute = run[0].get("compute_ceiling")
    peak = compute and compute["compute_tflops"]
    ridge = peak and bandwidth and 1e3 * peak / bandwidth
    x_lo, x_hi = min(intensity, ridge or intensity) / 30, max(intensity, ridge or intensity) * 30
    roof = peak or (bandwidth and bandwidth * intensity / 1e3)  # the top that must show
    heights = [p[2] for p in points] + ([roof] if roof else [])
    y_lo, y_hi = min(heights, default=1.0) / 5, max(heights, default=1.0) * 5
    fig, ax = plt.subplots(figsize=(8, 7))
    if bandwidth:
        x_top = ridge or x_hi
        ax.plot([x_lo, x_top], [bandwidth * x_lo / 1e3, bandwidth * x_top / 1e3], color="black",
                label=f"copy bandwidth, this run: {bandwidth:.0f} GB/s")
    if peak:
        ax.plot([ridge or x_lo, x_hi], [peak, peak], color="black", linestyle="--",
                label=f"{compute_label(compute)}: {peak:.0f} TFLOP/s")
    if ridge:
        ax.plot([ridge], [peak], "kD", label=f"ridge: {ridge:.0f} FLOP/byte")
    if not peak:
        ax.text(0.02, 0.98, "compute ceiling not measured in this run", transform=ax.transAxes,
                va="top", fontsize=8, color="dimgray")
    ax.axvline(intensity, color="gray", linestyle=":", linewidth=0.8,
               label=f"{wl.label()}: {intensity:.1f} FLOP/byte")
    for kind, (marker, color, name) in MARKERS.items():
        ys = [tflops for _, k, tflops in points if k == kind]
        if ys:
            ax.scatter([intensity] * len(ys), ys, marker=marker, color=color, zorder=3, label=name)
    gap = math.log10(y_hi / y_lo) / 40  # one line of label text, in decades
    for right in (True, False):
        placed = -math.inf
        for label, _, tflops in sorted((p for p in points if (p[1] == "rung") == right),
                                       key=lambda p: p[2]):
            placed = max(math.log10(tflops), placed + gap)
            ax.annotate(label, (intensity, tflops), xytext=(intensity * (1.8 if right else 1 / 1.8),
                        10 ** placed), fontsize=7, va="center", ha="left" if right else "right",
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
                        arrowprops={"arrowstyle": "-", "color": "0.7", "linewidth": 0.5,
                                    "relpos": (0, 0.5) if right else (1, 0.5)})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the workload's minimum traffic)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [(label, tflops) for label, _, tflops in points]


def ceilings_text(first: dict) -> str:
    """The ceilings measured in the run of `first` (a measurement with_ceilings gave them), as
    the run's header names them, each after "; "."""
    parts = [f"device {what} bandwidth in the same run: {first[f'{what}_gbps']:.0f} GB/s"
             for what in BANDWIDTHS if first.get(f"{what}_gbps")]
    if first.get("compute_ceiling"):
        ceiling = first["compute_ceiling"]
        parts.append(f"compute ceiling, {compute_label(ceiling)}: "
                     f"{ceiling['compute_tflops']:.0f} TFLOP/s")
    return "".join(f"; {part}" for part in parts)


def roofline_section(first: dict, figure: str) -> list[str]:
    """Markdown under a workload's table: its roofline, and what the run did not measure."""
    lines = [f"![roofline of {workload_of(first).label()}]({figure})", ""]
    missing = [name for name, key in (("the copy bandwidth", "copy_gbps"),
                                      ("the compute ceiling", "compute_ceiling"))
               if not first.get(key)]
    if missing:
        lines += [f"*Not measured in this run, so not drawn: {' and '.join(missing)}.*", ""]
    return lines


def render(records: list[dict], title: str = "Performance report", notes: str | None = None,
           figure_prefix: str | None = None) -> str:
    """The whole markdown report; `notes` (markdown written by a person) go last, under Notes.
    Searches get a section per workload; with `figure_prefix` their curves are also plotted to
    `<figure_prefix>-<n>.png`, and each workload's roofline to `<figure_prefix>-roofline-<n>.png`
    under its table, linked from the report by file name."""
    runs = latest_runs(records)
    searches = latest_searches(records)
    if not runs and not searches:
        raise RecordsError("no measurements to report (run on a GPU first)")
    lines = [f"# {title}", ""]
    if figure_prefix:  # the figures are written before the report, maybe into a new folder
        os.makedirs(os.path.dirname(os.path.abspath(figure_prefix)), exist_ok=True)
    facts = sorted({(r[0]["gpu"], r[0]["driver"], r[0]["tvm"]) for r in runs}
                   | {(r["gpu"], r["driver"], r["tvm"]) for rs in searches.values() for r in rs})
    for gpu, driver, tvm in facts:
        lines.append(f"- GPU: **{gpu}**, driver {driver}; TVM {tvm}")
    methods = sorted({m["timing"]["method"] for run in runs for m in run if m.get("timing")})
    for method in methods:
        lines.append(f"- Timing: {method}")
    if any(r[0]["op"] == "gemm" for r in runs):
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
    for n, run in enumerate(runs, start=1):
        first = run[0]
        wl = workload_of(first)
        lines.append(f"## {wl.label()}")
        lines.append("")
        where = f"Measured {first['date'][:19].replace('T', ' ')} UTC, run `{first['run_id']}`"
        where += f"; before each timed launch: {FLUSHES[flush_of(first)]}"
        lines.append(where + ceilings_text(first) + ".")
        lines.append("")
        lines.append(markdown_table(table_rows(run)))
        lines.append("")
        if figure_prefix:
            figure = f"{figure_prefix}-roofline-{n}.png"
            plot_roofline(run, f"{wl.label()} on {first['gpu']}\nrun {first['run_id']}", figure)
            lines += roofline_section(first, os.path.basename(figure))
    run_of = {(r[0].get("gpu"), *workload_key(r[0])): r for r in runs}
    for n, (key, found) in enumerate(sorted(searches.items(), key=str), start=1):
        wl = workload_of(found[0])
        lines += [f"## Searches: {wl.label()}", ""]
        figure = None
        if figure_prefix:
            figure = f"{figure_prefix}-{n}.png"
            plot_curves(found, run_of.get(key), f"{wl.label()} on {key[0]}", figure)
        lines += search_section(found, run_of.get(key), figure and os.path.basename(figure))
    if notes:
        lines += ["## Notes", "", notes.strip(), ""]
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
