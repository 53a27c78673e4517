"""The exploration run: schedules x one workload -> lowered IR, CUDA, measurements, records.

Schedules are chosen by name (`selection`): the registered ones, with knobs set (the rest as
their shape heuristics pick them), the best of the searches (`metaschedule`,
`autotvm:<template>`), and `best`, the fastest known for the workload. Each chosen schedule
is applied, lowered and built; on a GPU it is then checked against float64 and timed, and
every outcome (timed, failed, skipped) becomes a record of the same run, followed by the
baselines and the copy-bandwidth ceiling of that run. Without a GPU the run stops after the
build. Output goes through `say`, so the command line decides where it is printed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Callable

import tvm

import facts
from facts.record import Record
import schedules
from reporting.render import ceilings_text, markdown_table, table_rows, with_ceilings
from schedules import heuristics
from schedules.errors import (BuildFailed, ExplorerError, KernelFailed, RecordsError,
                              ScheduleNotApplicable, UnknownSchedule, UsageError)
from schedules.gemm import V5T_NARROW, v5t_square, v5t_square_tiles_fill
from schedules.gemv import VECTOR_BYTES, vector_width
from schedules.registry import TunedSchedule, with_knob_text
from schedules.v8 import (halves_tile, split_cut_tile, swapped_one_consumer_tile, wave_tile,
                          workload_k_blocks)
from schedules.v8 import one_consumer_tile as v8_one_consumer_tile
from schedules.v8.heuristic import (MEDIUM_ROWS, MEDIUM_TILES, SHORT_K_TILE, SHORT_WIDE_TILE,
                                    SWAP_MOST_TOKENS, SWAP_WEIGHED_ROWS, decode_batch)
from schedules.workloads import DTYPE_BYTES, Workload

from . import autotvm, bench, build, measure, metaschedule, records

# The template searches' records committed with the reports: what `best` reads without --records.
COMMITTED_RECORDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "reports", "tuning", "autotvm-h100.jsonl")
# best's portfolio weighs v8 swapped beside v8's default up to SWAP_WEIGHED_ROWS rows of A
SWAPPED_V8 = "v8:swap_ab=true"
# ... and v8's narrow 64-row tiles past the rows the default swaps: 64 and 128 wide, K split as
# the rule splits it, up to MEDIUM_ROWS rows of A (the rule picks one of them, or 160); 128 wide
# and whole past them, up to SWAP_WEIGHED_ROWS (on the H100 at 48 and 300 rows, each the fastest
# on 6-12 of wide-bf16's and wide-fp8's 32 shapes: reports/notes/h100-shapes.md, "Narrow tiles
# at few rows"); each the most rows they are weighed at, and their knobs
NARROW_TILES = ((MEDIUM_ROWS, ({"block_n": 64}, {"block_n": 128})),
                (SWAP_WEIGHED_ROWS, ({"block_m": 64, "block_n": 128, "split_k": 1},)))
# ... and, up to MEDIUM_ROWS rows, v8 swapped on 64x16 tiles, whole, in a ring that holds all
# of K's blocks at once, where K has at most that many blocks and the tiles fit one wave (on the
# H100 at 24 and 48 rows: 98.7-102.0% of cuBLAS on 896x896 and 1152x896 bf16, where the rest
# made 68-80%, and 91.5-91.8% on 2048x2048 fp8 against 78-84%; reports/notes/h100-shapes.md)
WHOLE_K_V8 = {"swap_ab": True, "block_m": 64, "block_n": 16, "split_k": 1, "stages": 16}
# The rule's GEMV: blockreduce keeps rows whose K leaves at most this much more of its loads idle
# in the last step than allreduce's (on the H100: 2.6% more, blockreduce still 0.8% faster; 12.5%
# more, allreduce 0-9% faster; reports/notes/h100-shapes.md, "best's rule on GEMVs").
STEP_IDLE_TIE = 1 / 16
# The rule's float32 GEMM: v5t in nn from this K (on the H100 it was the fastest rung at 4095^3
# and 4096^3, and 1.68x v5's time at 128x50257x768; in nt v5p beat it on every 4096-row shape;
# reports/notes/h100-shapes.md, "best's rule on float32").
V5T_LEAST_K = 2048


@dataclass(frozen=True)
class Settings:
    results: str  # the JSONL file every measurement is appended to
    arch: str = "sm_90"  # what to build for when there is no GPU here
    flush: str = "read"  # what runs before each timed launch (facts.FLUSHES)
    show_ir: bool = True
    show_cuda: bool = False
    explicit: bool = False  # one schedule the user named: a refusal or failure is an error


@dataclass(frozen=True)
class SearchResults:
    """Where searches left what they found, for schedules to be chosen from."""

    work_dir: str | None = None  # a MetaSchedule work dir: `metaschedule`
    records: str | None = None  # a template search's records: `autotvm:<template>`
    device: str | None = None  # whose records apply (autotvm.records_device); None: the only one
    results: str | None = None  # a run results file (--results): its timed schedules, for `best`


def resolve(wl: Workload, name: str, found: SearchResults, warn: Callable[[str], None] = print):
    """A schedule by name: a registered one, with knobs set as 'v5k:k_slices=4,thread_n=8' (the
    others as its heuristic picks them for `wl`), 'metaschedule' (the best in the work dir),
    'autotvm:<template>' (the template with the best configuration in the records) or 'best'
    (see `best`). A corrupt records line, the line that says why `best` chose what it did, and
    the hint that the records hold tuned configurations of a rung named alone go to `warn`."""
    if name == "best":
        return best(wl, found, warn)
    if name == "metaschedule":
        if not found.work_dir:
            raise UsageError("metaschedule needs the work dir of a MetaSchedule search")
        return metaschedule.tuned_entry(wl, found.work_dir)
    if name.startswith("autotvm:"):
        if not found.records:
            raise UsageError(f"{name} needs the records of a template search")
        entry, held = autotvm.named_template(wl.op, name[len("autotvm:"):])
        return autotvm.tuned_entry(entry, wl, autotvm.trial_records(found.records, warn),
                                   found.records, found.device, held)
    base, colon, knobs = name.partition(":")
    entry = schedules.get(wl.op, base)
    if colon:
        return entry.with_knobs(knobs, wl)
    if found.records and entry.space and _tuned(autotvm.trial_records(found.records, warn),
                                                wl, entry, found.device):
        warn(f"hint: {found.records} holds tuned configurations of {entry.name} for "
             f"{wl.label()}: --schedule autotvm:{entry.name} runs the best of them ({entry.name} "
             "alone runs its shape heuristic's knobs)")
    return entry.for_workload(wl)


def _tuned(measured: list[dict], wl: Workload, entry, device: str | None) -> bool:
    """Whether template-search records hold a correct configuration of `entry` for `wl` with
    this TVM: measured on `device`, or with none named, on any device."""
    return bool(autotvm.measured_on(measured, wl, entry.name) if device is None
                else autotvm.best_record(measured, wl, entry.name, device))


def best(wl: Workload, found: SearchResults, warn: Callable[[str], None] = print):
    """`best`: the fastest known schedule for `wl` on this GPU with this TVM. Known from the
    template searches' records (found.records, else COMMITTED_RECORDS: each template's fastest
    correct configuration) and the run results (found.results: the correct timed schedules,
    baselines left out, see `_timed_runs`), the GPU as `_this_gpu` says; where they hold none,
    on a GPU, the fastest correct of the `portfolio`'s rungs, measured here (`_measured_best`);
    without one (or where the portfolio is one rung), the rung that `rule` picks, with the
    knobs of its heuristic. Says which it picked and why, on one line, through `warn`."""
    path = found.records or COMMITTED_RECORDS
    searched = autotvm.trial_records(path, warn)
    runs = _timed_runs(wl, records.measurements(found.results, warn) if found.results else [])
    gpu = _this_gpu(wl, found.device, searched, runs)
    sources = " and ".join(filter(None, (found.records or _committed(path), found.results)))
    here = [r for r in runs if r["gpu"] == gpu]
    trials = [(entry, _correct_trials(searched, wl, entry.name, gpu))
              for entry in _searched(wl.op)]
    timed = [(r["timing"]["median_ms"], _rebuilt(wl, r)) for r in here]
    timed += [(min(t["time_ms"] for t in tried),
               autotvm.tuned_entry(entry, wl, searched, path, gpu))
              for entry, tried in trials if tried]
    if not timed:
        name, why = rule(wl)
        gpu_here, weighed = measure.gpu_present(), portfolio(wl)
        if gpu_here and len(weighed) > 1:
            return _measured_best(wl, weighed, found, warn)
        where = "" if gpu_here else "no GPU here, and "
        warn(f"best: {name} ({where}no records of this workload on {gpu or 'any GPU'} with TVM "
             f"{tvm.__version__} in {sources}; rule: {why})")
        return schedules.get(wl.op, name).for_workload(wl)
    ms, chosen = min(timed, key=lambda item: item[0])
    count = len(here) + sum(len(tried) for _, tried in trials)
    warn(f"best: {chosen.name} (fastest correct of {count} records measured on {gpu}, TVM "
         f"{tvm.__version__}, in {sources}: {ms:.3f} ms)")
    return chosen


def portfolio(wl: Workload) -> list[str]:
    """The rungs a measured `best` weighs for `wl` where no records know it: those that were
    the fastest on some shape of the committed suites (reports/h100-shapes.md,
    reports/h100-gemv.md, reports/h100-nvfp4-gemv.md) for its kind of op: v8 on 16-bit and
    fp8 GEMMs; v5t, v5k, v5p and v5 on float32, with v5t's `other_register_tile`. A GEMM of
    a few rows that skinny takes (M <= 16, nt) weighs skinny beside them: W read once for
    every row, where tensor-core tiles leave most of their rows empty. Past the rows v8 swaps
    by default, up to SWAP_WEIGHED_ROWS, it weighs v8 swapped (SWAPPED_V8, and on 16-bit inputs
    past MEDIUM_ROWS `split_cut`) beside v8 where v8 takes the swap: there it won on some shapes
    and lost on others (reports/notes/h100-shapes.md), and v8's `narrow_tiles` and
    `whole_k_tile`; past MEDIUM_ROWS, v8's `medium_tiles`, `filling_tile`,
    `one_consumer_tile`, `halved_tile`, `replaced_rows` and `other_pairing`.
    Where one rung is left (v8 elsewhere), nothing is measured."""
    if wl.is_nvfp4:
        names = ["dp4a", "bitdecode"]
    elif wl.op == "gemm":
        names = ["v8"] if wl.dtype != "float32" else ["v5t", "v5k", "v5p", "v5"]
        names += other_register_tile(wl)
        names += ["skinny"] if _takes(wl, "skinny") else []
        names += [SWAPPED_V8] + split_cut(wl) if swap_weighed(wl) else []
        names += narrow_tiles(wl) + whole_k_tile(wl) + medium_tiles(wl) + filling_tile(wl) \
            + one_consumer_tile(wl) + halved_tile(wl) + replaced_rows(wl) + other_pairing(wl) \
            if wl.dtype != "float32" else []
    else:
        names = ["rowalign", "blockreduce", "multirow", "allreduce"]
    return [name for name in dict.fromkeys(names)
            if schedules.get(wl.op, name.partition(":")[0]).takes(wl)]


def _takes(wl: Workload, name: str, knobs: dict | None = None) -> bool:
    """Whether rung `name` takes `wl` with `knobs` set (its heuristic picks the rest), by its own
    refusal check, nothing built (skinny: at most SKINNY_ROWS rows of A, nt; its dtypes are
    `portfolio`'s check); a rung without such a check takes it."""
    entry = schedules.get(wl.op, name)
    if entry.refuse is None:
        return True
    try:
        entry.refuse(wl, **entry.defaults_for(wl, knobs))
    except ScheduleNotApplicable:
        return False
    return True


def swap_weighed(wl: Workload) -> bool:
    """Whether `best` weighs SWAPPED_V8 for the GEMM: more rows of A than v8 swaps unasked, at
    most SWAP_WEIGHED_ROWS, and v8 takes the swap (nt, 16-bit or fp8 inputs, no block scales)."""
    return SWAP_MOST_TOKENS < wl.dims["M"] <= SWAP_WEIGHED_ROWS \
        and _takes(wl, "v8", {"swap_ab": True})


def split_cut(wl: Workload) -> list[str]:
    """v8 swapped on `split_cut_tile`'s tile where the rule splits its K to fill the SMs, which
    `best` weighs beside SWAPPED_V8 (`swap_weighed`): each consumer runs the widest wgmma the
    tokens allow, where the swapped default takes narrower tiles that fill the SMs whole; not
    where that is SWAPPED_V8's own choice (`other_settings`)."""
    tile = split_cut_tile(wl, heuristics.H100_SMS)
    if not tile:
        return []
    knobs = {"swap_ab": True, "block_m": tile[0], "block_n": tile[1]}
    rung = schedules.get(wl.op, "v8")
    chosen = rung.defaults_for(wl, knobs)
    split = chosen["split_k"] > 1 and chosen != rung.defaults_for(wl, {"swap_ab": True})
    return other_settings(wl, [knobs] if split else [])


def medium_tiles(wl: Workload) -> list[str]:
    """The settings of v8 that `best` weighs beside its default past MEDIUM_ROWS rows of A:
    each of MEDIUM_TILES unsplit (`other_settings`)."""
    if wl.dims["M"] <= MEDIUM_ROWS:
        return []
    return other_settings(wl, [{"block_m": block_m, "block_n": block_n, "split_k": 1}
                               for block_m, block_n in MEDIUM_TILES])


def filling_tile(wl: Workload) -> list[str]:
    """v8's `wave_tile` unsplit, which `best` weighs beside its default past MEDIUM_ROWS rows of
    A: the tile, not only of the space's widths, that fills the SMs best (`other_settings`)."""
    tile = wave_tile(wl, heuristics.H100_SMS, schedules.get(wl.op, "v8").defaults)
    return other_settings(wl, [{"block_m": tile[0], "block_n": tile[1], "split_k": 1}]
                          if tile else [])


def one_consumer_tile(wl: Workload) -> list[str]:
    """v8's `one_consumer_tile` unsplit with pingpong, which `best` weighs past MEDIUM_ROWS rows
    of A, and where `swap_weighed`, its swapped form (`swapped_one_consumer_tile`): one
    consumer multiplies each CTA's tile at its whole width; each form won on some shapes and
    lost on others (reports/notes/h100-shapes.md) (`other_settings`)."""
    sms, unsplit_pingpong = heuristics.H100_SMS, {"split_k": 1, "pingpong": True}
    tile = v8_one_consumer_tile(wl, sms, schedules.get(wl.op, "v8").defaults)
    swapped = swapped_one_consumer_tile(wl, sms) if swap_weighed(wl) else None
    settings = [{"block_m": tile[0], "block_n": tile[1], **unsplit_pingpong}] if tile else []
    settings += [{"swap_ab": True, "block_m": swapped[0], "block_n": swapped[1],
                  **unsplit_pingpong}] if swapped else []
    return other_settings(wl, settings)


def halved_tile(wl: Workload) -> list[str]:
    """fp8: v8's `halves_tile` unsplit with its promotions by halves of the columns
    (promote_halves), which `best` weighs past MEDIUM_ROWS rows of A (`other_settings`)."""
    tile = halves_tile(wl, heuristics.H100_SMS, schedules.get(wl.op, "v8").defaults)
    return other_settings(wl, [{"block_m": tile[0], "block_n": tile[1], "split_k": 1,
                                "promote_halves": True}] if tile else [])


def replaced_rows(wl: Workload) -> list[str]:
    """fp8: v8 on 128-row tiles, which `best` weighs past MEDIUM_ROWS rows of A where v8's
    default takes 64-row tiles in their place (heuristic.short_wide_tile, short_k_tile): the
    128-row ones they replaced ran faster on a few such shapes (`other_settings`)."""
    if not wl.is_fp8 or wl.dims["M"] <= MEDIUM_ROWS or not _takes(wl, "v8"):
        return []
    default = schedules.get(wl.op, "v8").defaults_for(wl)
    short = (default["block_m"], default["block_n"]) in (SHORT_WIDE_TILE, SHORT_K_TILE) \
        and not decode_batch(wl, heuristics.H100_SMS)  # (decode batches take 64 rows anyway)
    return other_settings(wl, [{"block_m": 128}] if short else [])


def other_pairing(wl: Workload) -> list[str]:
    """Block-scaled fp8: v8's tiles in clusters of 2 along N where its default leaves them
    alone, or alone where it pairs them (heuristic.paired_tiles), which `best` weighs past
    MEDIUM_ROWS rows of A: pairs won on some shapes the rule leaves alone and lost on others
    (`other_settings`)."""
    if not wl.block_scaled or wl.dims["M"] <= MEDIUM_ROWS or not _takes(wl, "v8"):
        return []
    paired = schedules.get(wl.op, "v8").defaults_for(wl)["cluster_n"] == 2
    return other_settings(wl, [{"cluster_n": 1 if paired else 2}])


def narrow_tiles(wl: Workload) -> list[str]:
    """The settings of v8 that `best` weighs beside its default past the rows v8 swaps unasked:
    the first of NARROW_TILES whose most rows of A take wl's (`other_settings`)."""
    rows = wl.dims["M"]
    weighed = [settings for most, settings in NARROW_TILES if SWAP_MOST_TOKENS < rows <= most]
    return other_settings(wl, list(weighed[0]) if weighed else [])


def whole_k_tile(wl: Workload) -> list[str]:
    """WHOLE_K_V8, which `best` weighs beside v8's default past the rows v8 swaps unasked, up to
    MEDIUM_ROWS: where its ring holds all of K's blocks (no K block waits for a stage to empty)
    and its tiles, B's rows by the tokens, fit one wave (`other_settings`)."""
    tiles = heuristics.tile_count(wl, WHOLE_K_V8["block_n"], WHOLE_K_V8["block_m"])  # swapped
    fits = SWAP_MOST_TOKENS < wl.dims["M"] <= MEDIUM_ROWS and tiles <= heuristics.H100_SMS \
        and workload_k_blocks(wl) <= WHOLE_K_V8["stages"]
    return other_settings(wl, [WHOLE_K_V8] if fits else [])


def other_register_tile(wl: Workload) -> list[str]:
    """float32: v5t's narrow tiles where its heuristic picks the square ones, or the square
    where it picks the narrow (gemm.v5t_tiles), which `best` weighs where C has a square tile
    for every SM: the rule's last-wave share misjudged some shapes. In nn, also v5t's
    signature tiles where they fill the SMs (its default there before), which those replaced
    unmeasured on large aligned shapes (90.6% of cuBLAS at 4096^3 on the H100,
    reports/notes/h100-shapes.md) (`other_settings`)."""
    sms = heuristics.H100_SMS
    if wl.dtype != "float32" or not v5t_square_tiles_fill(wl, sms):
        return []
    settings = [v5t_square(wl), V5T_NARROW]
    signature = schedules.get(wl.op, "v5t").defaults
    signature_tiles = heuristics.tile_count(wl, signature["block_m"], signature["block_n"])
    if wl.layout == "nn" and signature_tiles >= sms:
        settings.append({knob: signature[knob] for knob in V5T_NARROW})
    return other_settings(wl, settings, rung="v5t")


def other_settings(wl: Workload, settings: list[dict], rung: str = "v8") -> list[str]:
    """The names ('v8:block_n=64') of those of the rung's `settings` (knobs named, the rest the
    heuristic's) that it takes for wl and that are not its default's own choice."""
    entry = schedules.get(wl.op, rung)
    default = entry.defaults_for(wl)
    return [with_knob_text(rung, knobs.items()) for knobs in settings
            if _takes(wl, rung, knobs) and entry.defaults_for(wl, knobs) != default]


def _portfolio_schedule(wl: Workload, name: str) -> TunedSchedule:
    """A portfolio entry run like a rung: a rung by its name, or with knobs ('v8:swap_ab=true')
    as a record's schedule is rebuilt (`_rebuilt`): a failure to build it is the kernel's, not
    a refusal of knobs the user set (best's user set none)."""
    base, _, text = name.partition(":")
    entry = schedules.get(wl.op, base)
    if not text:
        return entry.for_workload(wl)
    return dataclasses.replace(entry.with_knobs(text, wl), knobs=None)


def _measured_best(wl: Workload, names: list[str], found: SearchResults,
                   warn: Callable[[str], None]):
    """`best` on a GPU where no records know `wl`: each rung of `names` (its `portfolio`)
    checked against float64 and timed here (as a run of them, recorded in found.results, where
    `best` finds them the next time; without a results file, in a scratch one), the fastest
    correct chosen."""
    with tempfile.TemporaryDirectory(prefix="best-") as scratch:
        path = found.results or os.path.join(scratch, "results.jsonl")
        chosen = [_portfolio_schedule(wl, name) for name in names]
        runs = explore(wl, chosen, Settings(results=path, show_ir=False), say=lambda _: None,
                       warn=warn)
    timed = [r for r in runs if r.kind != "baseline" and r.median_ms is not None]
    if not timed:
        raise KernelFailed(f"best: none of {', '.join(names)} ran correctly on {wl.label()}")
    fastest = min(timed, key=lambda r: r.median_ms)
    kept = f"recorded in {found.results}" if found.results else "not kept: no --results"
    warn(f"best: {fastest.schedule} (measured here, no records knowing this workload: the "
         f"fastest correct of {', '.join(r.schedule for r in timed)}, "
         f"{fastest.median_ms:.3f} ms; {kept})")
    return next(schedule for schedule in chosen if schedule.name == fastest.schedule)


def _committed(path: str) -> str:
    """How `best` names the committed records: their path, or, where this install has none
    (a copy without the package data), that it has none."""
    if os.path.isfile(path):
        return os.path.relpath(path)
    return f"no committed tuning records (this install has no {os.path.relpath(path)})"


def _searched(op: str) -> list:
    """The schedules of `op` that a template search can tune: those that declare a space."""
    return [entry for entry in schedules.entries(op, templates=True) if entry.space]


def _correct_trials(searched: list[dict], wl: Workload, template: str, gpu: str | None) -> list:
    """The correct, timed configurations of `template` for `wl` measured on `gpu` with this
    TVM, by any tuner."""
    key = {k: v for k, v in autotvm.search_key(wl, template, gpu, "").items()
           if k not in ("tuner", "seed")}
    return [r for r in searched if autotvm.matches(r, key) and r.get("status") == "ok"
            and isinstance(r.get("time_ms"), (int, float))]


def _timed_runs(wl: Workload, results: list[dict]) -> list[dict]:
    """The run records of `wl` with this TVM that `best` weighs: correct, timed after the
    default read flush (the searches' too; warm or write-flushed times are not comparable),
    not a baseline, of a schedule `_rebuilt` can rebuild."""
    same = {**wl.record_key(), "tvm": tvm.__version__, "status": "ok"}
    return [r for r in results if all(r.get(k) == v for k, v in same.items())
            and r.get("kind") != "baseline" and r["flush"] == "read"
            and isinstance((r.get("timing") or {}).get("median_ms"), (int, float))
            and _rebuilt(wl, r) is not None]


def _rebuilt(wl: Workload, record: dict) -> TunedSchedule | None:
    """The schedule a run record measured, rebuilt from its name and params: a registered
    rung or template ('v5k', 'v5k:k_slices=8', 'autotvm:v5k') whose recorded knobs are all
    still its knobs, each at a value a search of `wl` draws where the rung narrows it (v8 on
    fp8: promoted sums; `best` does not trade precision for speed unasked, as a search does
    not); None for any other (a MetaSchedule best needs its work dir)."""
    name = record["schedule"]
    try:
        entry = schedules.get(wl.op, name.removeprefix("autotvm:").partition(":")[0])
    except UnknownSchedule:
        return None
    params = record.get("params") or {}
    if not set(params) <= set(entry.knob_types) or not entry.draws(wl, params):
        return None
    return TunedSchedule(wl.op, name, params, lambda w, target: entry.apply(w, target, **params),
                         record["kind"])


def _this_gpu(wl: Workload, asked: str | None, searched: list[dict], runs: list[dict]
              ) -> str | None:
    """The GPU whose records `best` weighs: the one here, or the one asked for (--device);
    else the only one that the records measured `wl` on with this TVM (None where they
    measured it on none). Several, and none named, is refused."""
    here = autotvm.records_device(None, None, asked)
    if here:
        return here
    gpus = {r["gpu"] for r in runs}.union(
        *(autotvm.measured_on(searched, wl, entry.name) for entry in _searched(wl.op)))
    if len(gpus) > 1:
        raise RecordsError(f"records of {wl.label()} were measured on {', '.join(sorted(gpus))}:"
                           " say whose best to run (--device)")
    return gpus.pop() if gpus else None


def rule(wl: Workload) -> tuple[str, str]:
    """The rung `best` runs where no records say, and the rule in words: a 16-bit or fp8 GEMM ->
    v8 (the best rung on 30 of the 32 llm-bf16 shapes and at 4096^3 and 8192^3,
    reports/h100-shapes.md and reports/h100-v8.md; rows TMA cannot load, as with K = 4095, it
    stages into padded rows first, reports/notes/h100-shapes.md); a float32 GEMM -> v5t, v5k or
    v5p (`_float32_rule`); a GEMV whose rows are not whole 16-byte
    vectors -> rowalign (the fastest rung on all eight such llm-gemv shapes,
    reports/h100-shapes.md), one whose rows are shorter than a 16-byte vector per lane of a warp
    -> multirow (whose heuristic fits its K threads to K), else blockreduce (the fastest at
    1024x1024 too, where its K threads get one vector each; multirow was slower at 1000x1000)
    unless its last step of K leaves STEP_IDLE_TIE more of its loads idle than allreduce's
    (`idle_share`) -> allreduce; an nvfp4 GEMV -> dp4a (faster than bitdecode on the batched
    seed's three shapes, reports/h100-nvfp4-gemv.md)."""
    if wl.is_nvfp4:
        return "dp4a", (f"{wl.op} on nvfp4 -> dp4a (the rung that looks codes up as int8s with "
                        "prmt and sums their products with dp4a)")
    if wl.op == "gemm" and wl.dtype != "float32":
        return "v8", f"{'fp8' if wl.is_fp8 else '16-bit'} GEMM -> v8 (TMA and wgmma)"
    if wl.op == "gemm":
        return _float32_rule(wl)
    row_bytes = wl.dims["K"] * DTYPE_BYTES[wl.dtype]
    if row_bytes % VECTOR_BYTES:
        return "rowalign", (f"{wl.op} whose rows of {row_bytes} bytes are not whole 16-byte "
                            "vectors -> rowalign (16-byte loads from each row's vector boundary)")
    warp_bytes = heuristics.WARP * VECTOR_BYTES
    if row_bytes < warp_bytes:
        return "multirow", (f"{wl.op} whose rows of {row_bytes} bytes are shorter than a 16-byte "
                            f"vector per lane of a warp ({warp_bytes}) -> multirow (K threads "
                            "fitted to K)")
    idle = {rung: idle_share(wl, rung) for rung in ("blockreduce", "allreduce")}
    if idle["blockreduce"] > idle["allreduce"] + STEP_IDLE_TIE:
        return "allreduce", (f"{wl.op} whose K = {wl.dims['K']} leaves {idle['blockreduce']:.1%} "
                             f"of blockreduce's loads idle in its last step, "
                             f"{idle['allreduce']:.1%} of allreduce's -> allreduce")
    return "blockreduce", (f"{wl.op} whose rows are whole 16-byte vectors, {warp_bytes} bytes or "
                           "more -> blockreduce")


def _float32_rule(wl: Workload) -> tuple[str, str]:
    """The rule's float32 GEMM, by v5t's default tiles: v5t in nn where they fill the SMs and K
    is V5T_LEAST_K or more; v5k (split K) where they fill less than half the SMs; else v5p
    (the pipelined kernel)."""
    v5t = schedules.get("gemm", "v5t").defaults
    tiles, sms = heuristics.tile_count(wl, v5t["block_m"], v5t["block_n"]), heuristics.H100_SMS
    if tiles >= sms and wl.layout == "nn" and wl.dims["K"] >= V5T_LEAST_K:
        return "v5t", (f"float32 GEMM in nn whose {tiles} v5t tiles fill the {sms} SMs, "
                       f"K = {wl.dims['K']} -> v5t")
    if tiles < sms / 2:
        return "v5k", (f"float32 GEMM whose {tiles} v5t tiles cannot fill half the {sms} SMs "
                       "-> v5k (split K)")
    return "v5p", (f"float32 GEMM whose {tiles} v5t tiles fill half the {sms} SMs or more"
                   f"{'' if wl.layout == 'nn' else ', in nt'} -> v5p (cp.async pipeline)")


def idle_share(wl: Workload, rung: str) -> float:
    """The share of a GEMV rung's loads along K that its last step leaves idle: each step its
    reduce_threads threads load a 16-byte vector each, and K need not fill the last step."""
    step = schedules.get(wl.op, rung).defaults["reduce_threads"] * vector_width(wl)
    padded = -(-wl.dims["K"] // step) * step
    return (padded - wl.dims["K"]) / padded


def selection(wl: Workload, name: str, found: SearchResults,
              warn: Callable[[str], None] = print) -> list:
    """The schedules `name` stands for: one (see `resolve`), or for 'all' the ladder and
    baselines with the knobs they run `wl` with, plus the best of each search in `found` for
    `wl` on its device."""
    if name != "all":
        return [resolve(wl, name, found, warn)]
    chosen = [entry.for_workload(wl) for entry in schedules.entries(wl.op)]
    if found.work_dir:
        chosen.append(resolve(wl, "metaschedule", found, warn))
    if found.records:
        measured = autotvm.trial_records(found.records, warn)
        for entry in _searched(wl.op):
            if _tuned(measured, wl, entry, found.device):
                chosen.append(autotvm.tuned_entry(entry, wl, measured, found.records,
                                                  found.device))
    return chosen


def refusal(schedule, wl: Workload, target, error: ScheduleNotApplicable) -> ScheduleNotApplicable:
    """The refusal of a schedule the user named, in plain words (plain), with the values of
    each knob they set that would apply to this workload (the other knobs as they set them)."""
    if not getattr(schedule, "knobs", None):
        return ScheduleNotApplicable(plain(str(error)))
    entry, chosen = schedule.knobs
    message = f"{schedule.name}: {plain(str(error))}"
    for knob in chosen:
        working = _values_that_launch(entry, wl, target, chosen, knob)
        values = ", ".join(str(v).lower() for v in working) or "none of those tried"
        message += f"; {knob} values that apply here: {values}"
    return ScheduleNotApplicable(message)


def _values_that_launch(entry, wl: Workload, target, chosen: dict, knob: str) -> list:
    """The values of `knob` with which `entry` applies to `wl` (values_that_apply, the other
    knobs as `chosen`) and lowers to kernels within the target's launch limits."""
    def launches(value) -> bool:
        try:
            lowered = build.lower(entry.apply(wl, target, **{**chosen, knob: value}), target)
        except Exception:  # noqa: BLE001  TVM failing to lower this value: it does not apply
            return False
        return build.launch_refusal(lowered, target) is None

    return [value for value in entry.values_that_apply(wl, target, chosen, knob)
            if launches(value)]


# TVM's internal checks, as its C++ states them ("Check failed: (cond) is false: what"), and
# the one a knob too large for int32 indices trips, in words a user acts on.
TVM_CHECK = re.compile(r"(InternalError: )?Check failed: .*? is false:\s*")
INT32_LITERAL = re.compile(r"Literal value (-?\d+) exceeds range of int32")


def plain(message: str) -> str:
    """A message of TVM's with its internal check's condition left out, and an index past
    int32 said as such."""
    message = TVM_CHECK.sub("", message)
    return INT32_LITERAL.sub(r"a size of \1 is past what TVM's int32 indices reach", message)


def first_line(error: Exception) -> str:
    """An error's first line, in plain words (plain); its type's name where it says nothing."""
    return plain((str(error).strip().splitlines() or [type(error).__name__])[0])


def build_schedule(schedule, wl: Workload, target) -> build.Built:
    """Apply `schedule` to `wl` and build it. A kernel over the target's launch limits is
    refused naming the rung; where the user set knobs, TVM's failure to lower or compile is a
    refusal of those knobs (as ScheduleEntry.apply treats a failed primitive); else it, or
    nvcc's, becomes a BuildFailed naming the schedule (the failure itself is its cause). Any
    other refusal or ExplorerError passes as it is."""
    rung = schedule.knobs[0].name if getattr(schedule, "knobs", None) else schedule.name
    try:
        return build.lower_and_build(schedule.apply(wl, target), target)
    except build.Unlaunchable as e:
        raise ScheduleNotApplicable(f"{rung}'s {e}") from None
    except ExplorerError as e:
        if not isinstance(e, BuildFailed):
            raise
        failure = e
    except Exception as e:  # noqa: BLE001  TVM's own failure, whatever its type
        if getattr(schedule, "knobs", None):
            settings = ", ".join(f"{k}={v}" for k, v in schedule.knobs[1].items())
            raise ScheduleNotApplicable(f"{rung} cannot be built with {settings}: "
                                        f"{first_line(e)}") from None
        failure = e
    raise BuildFailed(f"{schedule.name} failed to build: {first_line(failure)}") from failure


def explore(wl: Workload, chosen: list, settings: Settings, say: Callable[[str], None] = print,
            warn: Callable[[str], None] = print, extra_records: list[dict] | None = None
            ) -> list[Record]:
    """Lower, print, build, check, time and record each chosen schedule, then the baselines;
    warnings (a corrupt records line, a kernel that spills) go to `warn`. Returns the records
    of this run (none without a GPU)."""
    # read first: a corrupt line is named, never rewritten
    records.measurements(settings.results, warn,
                         then="the line is kept as it is and new records are appended")
    run = None
    if measure.gpu_present():
        measure.require_memory(wl)  # before anything is built, allocated or written
        facts.check_writable(settings.results, "--results")
        run = bench.Run(flush=settings.flush)
        arch = run.facts["arch"]
        say(f"GPU: {run.facts['gpu']} ({arch}), driver {run.facts['driver']}; run {run.run_id}")
    else:
        arch = settings.arch
    target = build.cuda_target(arch)
    measured = []

    def keep(record):
        records.append(settings.results, record)
        measured.append(record)

    for entry in chosen:
        try:
            built = build_schedule(entry, wl, target)
        except ScheduleNotApplicable as e:
            if settings.explicit:
                raise refusal(entry, wl, target, e) from None
            say(f"{entry.name}: skipped: {e}")
            if run:
                keep(run.record(wl, entry.name, entry.kind, entry.defaults, status="skipped",
                                error=str(e)))
            continue
        except BuildFailed as e:  # a schedule or build bug stops this rung only
            if run:
                keep(run.record(wl, entry.name, entry.kind, entry.defaults,
                                status="build_failed", error=str(e.__cause__)))
            if settings.explicit:
                raise
            say(f"{entry.name}: build failed: {first_line(e.__cause__)}")
            continue
        if settings.show_ir:
            say(f"# ---- {entry.name}: lowered for {arch} ({wl.label()}) ----")
            say(build.ir_text(built.lowered))
        if settings.show_cuda:
            say(f"// ---- {entry.name}: CUDA ----")
            say(built.source)
        say(f"{entry.name}: built: {built.describe()}")
        for kernel, spilled in built.spills.items():
            warn(f"warning: {entry.name}'s {kernel} spills {spilled} bytes of registers to local "
                "memory")
        if run:
            keep(bench.measure_tvm(run, wl, entry.name, entry.kind, entry.defaults,
                                   built.executable, structure=built.structure,
                                   resources=built.resources))
    if not run:
        say(f"no GPU here: built {wl.label()} for {arch} (CUDA source only); "
            "skipped the correctness check and timing")
        return []
    for extra in extra_records or []:
        records.append(settings.results, run.record(wl, **extra))
    for baseline in bench.measure_baselines(run, wl):
        keep(baseline)
    ceilings = bench.measure_ceilings(run, wl)  # copy; read for GEMVs; compute, but not nvfp4's
    for ceiling in ceilings:
        records.append(settings.results, ceiling)
    read_against = with_ceilings(measured, ceilings)
    say(f"\n{wl.label()} on {run.facts['gpu']}; {measure.timing_method(run.flush)}"
        f"{ceilings_text(read_against[0])}")
    say(markdown_table(table_rows(read_against)))
    say(f"records appended to {settings.results}")
    failed = [m for m in measured if m.kind != "baseline" and m.status != "ok"]
    if settings.explicit and failed:
        raise KernelFailed(f"{failed[0].schedule}: {failed[0].error or 'failed'}")
    return measured
