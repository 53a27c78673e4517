"""CPU tier for the searches: the template tuners on timings recorded on the H100 (resume,
failures, interruption, xgb against random), the knob spaces, MetaSchedule end to end on an LLVM
target (locally and through an RPC tracker on loopback), the committed search records applied
like rungs, and every bad input."""

import json
import os
import random
import re
import statistics
import subprocess
import sys
import types

import pytest

import runner
import schedules
import tuning.search
from schedules import RecordsError, ScheduleNotApplicable, SearchFailed, UsageError, Workload
from tuning import autotvm, candidates, measure, metaschedule, records
from tuning.candidates import Outcome, Status
from tuning.progress import Progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDED = os.path.join(ROOT, "reports", "tuning", "autotvm-h100.jsonl")
MS_GEMM = os.path.join(ROOT, "reports", "tuning", "ms-gemm-seed-split-k")
SEED_GEMM = Workload("gemm", (1024, 512, 2048))


def recorded_grid(template: str) -> dict:
    """config key -> Outcome, from the exhaustive grid search measured on the H100."""
    grid = {}
    for r in records.load(RECORDED).records:
        if r["schedule"] == template and r["tuner"] == "grid":
            grid[autotvm.config_key(r["config"])] = Outcome(
                Status(r["status"]), r["time_ms"], r["error"])
    return grid


def replay(grid: dict):
    return lambda configs: [grid[autotvm.config_key(c)] for c in configs]


def replay_dying_in_the_third_batch(grid: dict):
    """replay(grid), whose third call raises KeyboardInterrupt (a search's head killed)."""
    calls = []

    def measure(configs):
        calls.append(configs)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return replay(grid)(configs)

    return measure


def search(tuner: str, seed: int, grid: dict, trials: int, space, history=None, record=None,
           in_flight: int = 1):
    """Run a tuner on recorded timings (`in_flight` batches at once); returns (history,
    outcomes in measured order)."""
    history = {} if history is None else history
    order = []

    def on_measured(config, outcome):
        order.append(outcome)
        if record:
            record(config, outcome)

    autotvm.tune(space, autotvm.TUNERS[tuner](seed), replay(grid), history, trials, 16,
                 on_measured, in_flight=in_flight)
    return history, order


SEED_SPACE = autotvm.Space.of(schedules.get("gemm", "seed_template"), SEED_GEMM)


def test_the_seed_template_space_is_the_blogs():
    assert len(SEED_SPACE) == 3 * 3 * 2 * 2 * 2 * 2 == len(SEED_SPACE.configs())
    assert SEED_SPACE.knobs["tile_x"] == [8, 16, 32] and SEED_SPACE.knobs["tile_k"] == [8, 16]
    assert SEED_SPACE.features({**SEED_SPACE.configs()[0], "tile_x": 32, "vectorize": True})[:4] == [
        5.0, 3.0, 3.0, 1.0]
    # templates are searched, never run by "all" with their defaults
    assert "seed_template" not in schedules.names("gemm")
    assert "seed_template" in schedules.names("gemm", templates=True)


@pytest.mark.slow
def test_every_declared_space_names_real_knobs_and_builds_its_first_config(compiled):
    for op in ("gemm", "gemv"):
        for entry in schedules.entries(op, templates=True):
            if not entry.space:
                continue
            assert set(entry.space) <= set(entry.defaults)
            wl = SEED_GEMM if op == "gemm" and entry.name != "v6" else (
                Workload("gemm", (256, 256, 256), "float16") if op == "gemm"
                else Workload("gemv", (1024, 1024), "float16"))
            config = autotvm.Space.of(entry, wl).configs()[0]
            try:
                compiled(entry.name, wl, **config)
            except ScheduleNotApplicable as e:
                assert str(e)


def test_seed_template_switches_show_in_the_ir(compiled, target):
    plain, _, plain_summary = compiled("seed_template", SEED_GEMM, shared_tiles=False)
    assert plain_summary.shared_bytes == 0 and "alloc_local" not in plain
    staged, source, summary = compiled("seed_template", SEED_GEMM, local_accumulator=True,
                                       vectorize=True)
    assert summary.shared_bytes > 0 and "C_local = T.alloc_local((1,))" in staged
    assert "*(float4*)(A_shared_ptr" in source and "*(float4*)(B_shared_ptr" in source
    with pytest.raises(ScheduleNotApplicable, match="shared-memory loads"):
        schedules.get("gemm", "seed_template").apply(
            SEED_GEMM, target, vectorize=True, shared_tiles=False)


def test_grid_measures_the_whole_space_in_order_then_stops():
    grid = recorded_grid("seed_template")
    history, order = search("grid", 0, grid, 1000, SEED_SPACE)
    assert len(order) == len(SEED_SPACE) == len(history)
    assert [json.loads(k) for k in history] == SEED_SPACE.configs()
    # failures are recorded and never ranked
    assert any(o.status == "invalid" for o in order)
    assert autotvm.best(history)[1] == min(o.time_ms for o in order if o.status == "ok")


def test_a_search_resumes_from_its_records_and_measures_nothing_twice(tmp_path):
    grid = recorded_grid("seed_template")
    path = str(tmp_path / "at.jsonl")
    key = autotvm.search_key(SEED_GEMM, "seed_template", "H100", "xgb")

    def record(config, outcome):
        records.append(path, autotvm.trial_record(key, config, outcome, 0))

    search("xgb", 3, grid, 20, SEED_SPACE, record=record)
    resumed = autotvm.history_of(records.load(path).records, key)
    assert len(resumed) == 20
    _, order = search("xgb", 3, grid, 12, SEED_SPACE, history=resumed, record=record)
    measured = [autotvm.config_key(r["config"]) for r in records.load(path).records]
    assert len(order) == 12 and len(measured) == len(set(measured)) == 32
    # another tuner on the same space is another search; a different key sees none of these
    assert autotvm.history_of(records.load(path).records, {**key, "tuner": "random"}) == {}


def test_records_from_before_a_knob_joined_the_space_count_with_its_default(tmp_path):
    path = str(tmp_path / "at.jsonl")
    key = autotvm.search_key(SEED_GEMM, "v5k", "H100", "xgb")
    space = autotvm.Space.of(schedules.get("gemm", "v5k"), SEED_GEMM)
    old = {k: v for k, v in schedules.get("gemm", "v5k").defaults.items()
           if k in space.knobs and k != "atomic_sum"}  # a trial's config: the space's knobs
    records.append(path, autotvm.trial_record(key, old, Outcome(Status.OK, 0.06), 1))
    history = autotvm.history_of(records.load(path).records, key, {"atomic_sum": False})
    assert list(history) == [autotvm.config_key({**old, "atomic_sum": False})]
    left = autotvm.GridTuner().propose(space, space.configs(), history, len(space))
    assert len(left) == len(space) - 1 and {**old, "atomic_sum": False} not in left


def test_an_interrupted_search_keeps_every_measured_record(tmp_path):
    grid = recorded_grid("seed_template")
    path = str(tmp_path / "at.jsonl")
    key = autotvm.search_key(SEED_GEMM, "seed_template", "H100", "random")
    with pytest.raises(KeyboardInterrupt):
        autotvm.tune(SEED_SPACE, autotvm.RandomTuner(0), replay_dying_in_the_third_batch(grid),
                     {}, 100, 16,
                     lambda c, o: records.append(path, autotvm.trial_record(key, c, o, 0)))
    assert len(autotvm.history_of(records.load(path).records, key)) == 32


def test_failed_candidates_are_recorded_and_the_search_goes_on():
    outcomes = [Outcome(Status.BUILD_FAILED, error="nvcc said no"),
                Outcome(Status.TIMEOUT, error="run timed out after 60 s"),
                Outcome(Status.OK, 2.0), Outcome(Status.RUN_FAILED, error="crash"),
                Outcome(Status.OK, 1.5)]
    measured = iter(outcomes * 40)
    history, order = {}, []
    autotvm.tune(SEED_SPACE, autotvm.XGBTuner(0), lambda cs: [next(measured) for _ in cs],
                 history, 30, 16, lambda c, o: order.append(o))
    assert len(order) == 30 and {o.status for o in order} >= {
        Status.BUILD_FAILED, Status.TIMEOUT, Status.OK}
    assert autotvm.best(history)[1] == 1.5


def test_a_template_search_records_each_trial_and_returns_its_summary(tmp_path):
    grid = recorded_grid("seed_template")
    path = str(tmp_path / "at.jsonl")
    entry = schedules.get("gemm", "seed_template")
    said = []
    summary = autotvm.search(entry, SEED_GEMM, replay(grid), path=path, device="H100",
                             tuner="grid", seed=0, trials=20, say=said.append, warn=said.append)
    trials = records.load(path).records
    own = {k: v for k, v in entry.defaults_for(SEED_GEMM).items() if k in SEED_SPACE.knobs}
    order = [own] + [c for c in SEED_SPACE.configs() if c != own][:19]  # the rung's own first
    assert own != SEED_SPACE.configs()[0]
    assert [t["trial"] for t in trials] == list(range(1, 21))
    assert [t["config"] for t in trials] == order
    assert [t["status"] for t in trials] == [grid[autotvm.config_key(c)].status.value
                                             for c in order]
    fastest = min((t for t in trials if t["status"] == "ok"), key=lambda t: t["time_ms"])
    curve, rate = summary.pop("curve"), summary.pop("trials_per_min")
    assert summary == {"schedule": "autotvm:seed_template", "search": "autotvm", "tuner": "grid",
                       "seed": 0, "params": fastest["config"], "trials": 20, "space": 144,
                       "candidates": {"proposed": 20, "refused": 0, "measured": 20}}
    assert len(curve) == 20 and curve[-1] == (20, fastest["time_ms"]) and rate > 0
    assert said[0] == (f"grid search of seed_template (144 configurations) on "
                       f"{SEED_GEMM.label()}: 0 measured before, in {path}")
    assert said[-1].startswith(f"best: {fastest['time_ms']:.4f} ms with {fastest['config']}")
    # a search in which nothing ran correctly fails with the most common reason
    with pytest.raises(SearchFailed, match=re.escape(
            "no configuration ran correctly in 4 measured (this run: 4 proposed, 0 refused, 4 "
            "measured); most often: misaligned address")):
        autotvm.search(entry, SEED_GEMM,
                       lambda configs: [Outcome(Status.RUN_FAILED, error="misaligned address")
                                        for _ in configs],
                       path=str(tmp_path / "failing.jsonl"), device="H100", tuner="random",
                       seed=0, trials=4, say=said.append, warn=said.append)


# The shape: an xgb search of v8 spent 26 of its 48 trials on settings v8 refuses.
MEDIUM_M = Workload("gemm", (333, 8192, 8192), "bfloat16", "float32", "nt")


@pytest.mark.slow
@pytest.mark.parametrize("tuner", list(autotvm.TUNERS))
def test_a_template_search_measures_no_setting_its_rung_refuses_and_counts_them(
        tuner, tmp_path, target):
    """Every configuration a tuner proposes is put to v8's refusal check once; a refused one
    costs no trial and is never measured, and the summary and its last line count what was
    proposed, refused and measured."""
    v8 = schedules.get("gemm", "v8")
    configurations = autotvm.Configurations(v8, MEDIUM_M, target, builder=None, runner=None)
    asked, measured, said = {}, [], []

    def refusal(config):
        key = autotvm.config_key(config)
        assert key not in asked, "asked twice"
        asked[key] = configurations.refusal(config)
        return asked[key]

    def measure(configs):
        measured.extend(configs)
        return [Outcome(Status.OK, c["block_n"] / c["stages"]) for c in configs]

    summary = autotvm.search(v8, MEDIUM_M, measure, refusal=refusal,
                             path=str(tmp_path / "at.jsonl"), device="H100", tuner=tuner,
                             seed=0, trials=40, say=said.append, warn=said.append)
    for config in measured:  # raises if v8 refuses a measured setting
        v8.refuse(MEDIUM_M, **v8.defaults_for(MEDIUM_M, config))
    refused = sum(why is not None for why in asked.values())
    assert refused and all(why.startswith("v8") for why in asked.values() if why)
    assert len(measured) == 40 and all(asked[autotvm.config_key(c)] is None for c in measured)
    assert summary["candidates"] == {"proposed": len(asked), "refused": refused, "measured": 40}
    assert f"this run: {len(asked)} proposed, {refused} refused, 40 measured" in said[-1]
    assert len(records.load(str(tmp_path / "at.jsonl")).records) == 40  # refusals: no trial


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn"])
def test_a_space_narrowed_for_a_workload_leaves_out_refused_values_and_other_precisions(
        dtype):
    """v8's space for a 16-bit GEMM in nn drops fp8's promotions, swap_ab and the widths that
    are not whole 64-column boxes (promote_k's 3 values, promote_overlap's 5, promote_halves'
    2 and swap_ab's 2 down to one each, the 9 widths to 4, so that a search proposes, and
    checks, that much less); every dropped value is one v8 refuses with any other knobs. An
    fp8 GEMM (nt) keeps the whole space but fast accumulation (promote_k none): a search keeps
    v8's default precision, promoted sums."""
    v8 = schedules.get("gemm", "v8")
    wl = Workload("gemm", (4096, 4096, 4096), dtype, layout="nt" if "float8" in dtype else "nn")
    narrowed = autotvm.Space.of(v8, wl)
    if "float8" in dtype:
        assert narrowed.knobs == {**v8.space, "promote_k": [128, 256]}
        assert v8.own_choice(wl)["promote_k"] == 128  # the default is in the space searched
        return
    assert len(narrowed) * 3 * 5 * 2 * 2 * 9 == len(autotvm.Space(v8.space)) * 4
    why = {"promote_k": "promote_k must be none",
           "promote_overlap": "promote_overlap must be none",
           "promote_halves": "promote_halves=false",
           "swap_ab": "it needs layout nt, not nn",
           "block_n": "a multiple of 64 columns (B in 64-column boxes)"}
    rng, checked = random.Random(0), 0
    while checked < 20:  # settings v8 takes, each with a dropped value in place of one knob's
        config = {knob: rng.choice(values) for knob, values in narrowed.knobs.items()}
        try:
            v8.refuse(wl, **v8.defaults_for(wl, config))
        except ScheduleNotApplicable:
            continue
        knob = rng.choice(sorted(why))
        dropped = rng.choice([v for v in v8.space[knob] if v not in narrowed.knobs[knob]])
        with pytest.raises(ScheduleNotApplicable, match=re.escape(why[knob])):
            v8.refuse(wl, **v8.defaults_for(wl, {**config, knob: dropped}))
        checked += 1


@pytest.mark.parametrize("shape, beyond", [((300, 5120, 5120), [224, 152]),
                                           ((300, 28672, 5120), []),
                                           ((700, 2048, 2048), []), ((4096, 4096, 4096), []),
                                           ((48, 5120, 5120), [])])
def test_a_search_of_v8_draws_the_width_of_bests_filling_tile_beyond_its_space(shape, beyond):
    """Past 64 rows a search of v8 draws, beside its space's widths, the widths of the tiles
    `best` weighs: the one that fills the SMs best (300x5120x5120: 130 of 64x224) and, up to
    512 rows, the swapped one of the tokens' widest cut (300 tokens: 152 wide, 40 x 2 tiles;
    not at 300x28672x5120, whose 224 x 2 such tiles fill the SMs unsplit). Nothing more where
    the space holds the filling tile's width (700x2048x2048: 64x192), where it would take more
    than two rounds (4096^3), or at 64 rows or fewer (48)."""
    v8 = schedules.get("gemm", "v8")
    wl = Workload("gemm", shape, "bfloat16", "bfloat16", "nt")
    assert autotvm.Space.of(v8, wl).knobs["block_n"] == v8.space["block_n"] + beyond


def test_a_search_holding_knobs_draws_only_them_and_keeps_records_of_its_own(tmp_path):
    """`autotvm:v8:promote_k=none` on fp8: fast accumulation, which v8's own space leaves out
    (a search keeps promoted sums unasked), searched by name. It measures first what
    `--schedule v8:promote_k=none` runs; its records name it, so that `autotvm:v8` (and so
    `best`) never applies its fast kernels, and `autotvm:v8:promote_k=none` does."""
    v8, path = schedules.get("gemm", "v8"), str(tmp_path / "at.jsonl")
    wl = Workload("gemm", (4096, 4096, 4096), "float8_e4m3fn", layout="nt")
    entry, held = autotvm.named_template("gemm", "v8:promote_k=none")
    assert (entry, held) == (v8, {"promote_k": None})
    measured = []

    def measure(configs):
        measured.extend(configs)
        return [Outcome(Status.OK, c["block_n"] / c["stages"]) for c in configs]

    summary = autotvm.search(v8, wl, measure, path=path, device="H100", tuner="random", seed=0,
                             trials=6, say=lambda line: None, held=held)
    assert summary["schedule"] == "autotvm:v8:promote_k=none"
    assert summary["space"] * 3 == len(autotvm.Space(v8.space))  # one of promote_k's 3 values
    assert measured[0] == v8.own_choice(wl, held) and measured[0]["promote_k"] is None
    assert all(c["promote_k"] is None for c in measured)
    found = records.load(path).records
    assert {r["schedule"] for r in found} == {"v8:promote_k=none"}
    tuned = autotvm.tuned_entry(v8, wl, found, path, "H100", held)
    assert tuned.name == "autotvm:v8:promote_k=none" and tuned.params["promote_k"] is None
    with pytest.raises(RecordsError, match="no correct measured configuration of v8 for"):
        autotvm.tuned_entry(v8, wl, found, path, "H100")


def test_knobs_held_by_a_search_are_read_as_a_schedules_knobs_are():
    v5k = schedules.get("gemm", "v5k")
    assert autotvm.named_template("gemm", "v5k:single_barrier=true,k_slices=4") == \
        (v5k, {"single_barrier": True, "k_slices": 4})  # a knob outside the space is held too
    assert autotvm.Space.of(v5k, SEED_GEMM, {"single_barrier": True}).knobs["single_barrier"] \
        == [True]
    assert autotvm.template_name(v5k, {"atomic_sum": False, "k_slices": 4}) == \
        "v5k:k_slices=4,atomic_sum=false"  # one name for one search, in the knobs' order
    for text, refused in (("v5k:", "names no knobs"), ("v5k:k_slices=2,k_slices=4", "more than once"),
                          ("v5k:bogus=1", "bogus"), ("v5k:k_slices=0", "at least 1")):
        with pytest.raises(UsageError, match=refused):
            autotvm.named_template("gemm", text)


def test_a_template_search_of_a_rung_that_refuses_the_workload_is_refused_at_once(target):
    with pytest.raises(UsageError, match=re.escape(
            "autotvm:v8: v8 multiplies float16, bfloat16 or float8_e4m3fn on tensor cores, "
            "not float32")):
        autotvm.Configurations(schedules.get("gemm", "v8"), SEED_GEMM, target, None, None)


def test_a_template_without_a_refusal_check_is_applied_once_for_check_and_build(
        target, monkeypatch):
    """seed_template refuses by applying: the module its check applied is the one built."""
    entry = schedules.get("gemm", "seed_template")
    configurations = autotvm.Configurations(entry, SEED_GEMM, target, None, None)
    grid = recorded_grid("seed_template")
    refused = next(c for c in SEED_SPACE.configs()
                   if grid[autotvm.config_key(c)].status == "invalid")
    taken = entry.own_choice(SEED_GEMM)
    assert configurations.refusal(refused) and configurations.refusal(taken) is None
    built = []
    monkeypatch.setattr(candidates, "measure_modules",
                        lambda mods, *_: built.extend(mods) or [Outcome(Status.OK, 1.0)])
    kept = configurations.applied[autotvm.config_key(taken)]
    assert configurations.measure([taken]) == [Outcome(Status.OK, 1.0)]
    assert built == [kept] and configurations.applied == {}


def test_whose_template_records_apply(monkeypatch):
    monkeypatch.setattr(measure, "gpu_present", lambda: False)
    assert autotvm.records_device(None, None, None) is None  # the records' only device
    assert autotvm.records_device(None, None, "NVIDIA H200") == "NVIDIA H200"
    assert autotvm.records_device("host:9190", "h100", None) == "rpc:h100"
    with pytest.raises(UsageError, match="records measured on NVIDIA H200 are not applied here; "
                                         "this run's are rpc:h100's"):
        autotvm.records_device("host:9190", "h100", "NVIDIA H200")


def test_every_committed_trial_has_one_of_the_statuses():
    statuses = {r["status"] for r in records.load(RECORDED).records}
    assert {Status(s) for s in statuses} >= {Status.OK, Status.INVALID, Status.RUN_FAILED}
    assert {str(s) for s in Status} == {"ok", "invalid", "build_failed", "run_failed", "wrong",
                                        "timeout"}


@pytest.mark.parametrize("template", ["seed_template", "multirow"])
def test_xgb_finds_within_5_percent_of_the_grid_best_in_a_quarter_of_the_space(template):
    grid = recorded_grid(template)
    wl = SEED_GEMM if template == "seed_template" else Workload("gemv", (1024, 1024))
    space = autotvm.Space.of(schedules.get(wl.op, template), wl)
    best = min(o.time_ms for o in grid.values() if o.status == "ok")
    for seed in range(10):
        history, _ = search("xgb", seed, grid, len(space) // 4, space)
        assert autotvm.best(history)[1] <= 1.05 * best, f"seed {seed}"


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_random_draw_by_position_draws_what_sampling_the_configurations_did(seed):
    """The random tuner draws positions of the unmeasured configurations and deletes them in
    place: the same configurations, in the same order, as sampling the list itself and
    rebuilding it after each draw, so a search resumed from older records proposes what it
    would have. Here most configurations are refused, as v8's are."""
    import random

    configs = SEED_SPACE.configs()
    refused = set(range(0, len(configs), 5)) | set(range(0, len(configs), 3))
    takes = {id(c): i not in refused for i, c in enumerate(configs)}

    def by_sampling(left, n, rng):
        chosen = []
        while len(chosen) < n and left:
            drawn = rng.sample(left, min(n - len(chosen), len(left)))
            chosen += [c for c in drawn if takes[id(c)]]
            asked = {id(c) for c in drawn}
            left = [c for c in left if id(c) not in asked]
        return chosen

    tuner = autotvm.RandomTuner(seed)
    for known in (0, 16, 40):
        tuner._reseed(known)
        drawn = tuner._draw(configs, 16, lambda c: takes[id(c)])
        assert drawn == by_sampling(configs, 16, random.Random(f"{seed}/{known}"))
        assert len(drawn) == 16


def test_xgb_beats_random_on_the_recorded_seed_space():
    """Over 20 seeds: a better best after a quarter of the space, reached in fewer trials."""
    grid = recorded_grid("seed_template")
    best = min(o.time_ms for o in grid.values() if o.status == "ok")

    def summary(tuner):
        bests, reached = [], []
        for seed in range(20):
            _, order = search(tuner, seed, grid, 36, SEED_SPACE)
            times = [o.time_ms if o.status == "ok" else float("inf") for o in order]
            so_far = [min(times[: i + 1]) for i in range(len(times))]
            bests.append(so_far[-1])
            reached.append(next((i + 1 for i, t in enumerate(so_far) if t <= 1.05 * best), 99))
        return statistics.mean(bests), statistics.mean(reached)

    xgb_best, xgb_reached = summary("xgb")
    random_best, random_reached = summary("random")
    assert xgb_best < random_best and xgb_reached < random_reached


def test_a_search_measures_the_rungs_own_configuration_for_the_shape_first(tmp_path):
    """Records override a rung's shape heuristic, so a search starts from the heuristic's pick
    (v8 on 1000x4608x3584 nn, not the signature's defaults), whatever the tuner would try
    first."""
    entry, wl = schedules.get("gemm", "v8"), Workload("gemm", (1000, 4608, 3584), "bfloat16",
                                                       "float32", "nn")
    path = str(tmp_path / "at.jsonl")
    autotvm.search(entry, wl, lambda configs: [Outcome(Status.OK, 1.0) for _ in configs],
                   path=path, device="H100", tuner="random", seed=0, trials=3,
                   say=lambda _: None, warn=lambda _: None)
    first = records.load(path).records[0]["config"]
    assert first == entry.defaults_for(wl) and first != entry.defaults


def test_curve_is_the_best_so_far_of_one_search():
    recorded = records.load(RECORDED).records
    key = {k: v for k, v in recorded[0].items() if k in autotvm.search_key(SEED_GEMM, "", "", "")}
    points = autotvm.curve(recorded, key)
    assert [n for n, _ in points] == list(range(1, len(points) + 1))
    times = [t for _, t in points if t is not None]
    assert times == sorted(times, reverse=True)


@pytest.mark.slow
def test_the_checking_runner_takes_each_status_from_how_its_worker_ended():
    from tvm.s_tir import meta_schedule as ms

    def evaluate(path: str, best_ms: float | None = None) -> float:
        """measure.evaluate_artifact's stand-in (pickled by value: it is local), ending as the
        path says ("best": 1 ms more than the best it is told of)."""
        import time

        if path == "best":
            return (best_ms + 1) * 1e-3
        if path == "wrong":
            raise measure.WrongResult("relative error 0.5 > 1e-05")
        if path == "crash":
            raise RuntimeError("CUDA error: misaligned address")
        if path == "hang":
            time.sleep(60)
        if path == "slow":
            time.sleep(1)
        return 2e-3

    def inputs(*paths):
        return [ms.runner.RunnerInput(path, "cuda", []) for path in paths]

    # 4 s: over "slow"'s 1 s with room on a loaded machine, well under "hang"'s 60 s (the
    # worker's start, its imports, is outside the timeout)
    runner = candidates.CheckingRunner(SEED_GEMM, timeout_sec=4)
    runner.evaluate = evaluate
    try:
        first_worker, standby = runner.pool, runner.standby
        ok, wrong, told = runner.outcomes(inputs("fast", "wrong", "best"))
        assert runner.pool is first_worker  # a wrong result keeps the worker
        assert told == Outcome(Status.OK, pytest.approx(3.0))  # the best so far, 2 ms
        (crash,) = runner.outcomes(inputs("crash"))
        # replaced (it may hold a broken CUDA context) by the standby, started beforehand
        assert runner.pool is standby and runner.standby not in (first_worker, standby)
        (hang,) = runner.outcomes(inputs("hang"))
        # MetaSchedule's interface: the time in seconds, or why there is none as text
        futures = runner.run(inputs("fast", "wrong", "crash"))
        worker = runner.pool
        timed, failed = futures[0].result(), futures[1].result()
        assert runner.pool is worker  # each candidate is run when asked about, the crash not yet
        assert futures[2].done() and runner.pool is not worker
        # a candidate queued as it is built is measured meanwhile, its Outcome kept until asked
        runner.measure_soon("slow")
        queued = runner.soon["slow"]
        assert not queued.done()  # measure_soon came back at once
        (slow,) = runner.outcomes(inputs("slow"))
        assert queued.done() and "slow" not in runner.soon
    finally:
        candidates.shut_down(runner)
    assert ok == Outcome(Status.OK, pytest.approx(2.0))
    assert wrong == Outcome(Status.WRONG,
                            error="tuning.measure.WrongResult: relative error 0.5 > 1e-05")
    assert crash == Outcome(Status.RUN_FAILED, error="RuntimeError: CUDA error: misaligned address")
    assert hang == Outcome(Status.TIMEOUT, error="run timed out after 4 s")
    assert slow == Outcome(Status.OK, pytest.approx(2.0))
    assert float(timed.run_secs[0]) == pytest.approx(2e-3) and timed.error_msg is None
    assert failed.run_secs is None and failed.error_msg == wrong.error


def test_a_malformed_tracker_address_is_refused():
    with pytest.raises(UsageError, match="host:port"):
        candidates.parse_tracker("nohost")


# -- MetaSchedule on the CPU, locally and over RPC ------------------------------------------------


def _tune_llvm(work_dir, trials=4, *extra):
    return runner.main(["--tune", "metaschedule", "--target", "llvm", "--shape", "32x32x32",
                        "--trials", str(trials), "--work-dir", str(work_dir),
                        "--results", str(work_dir.parent / "results.jsonl"), *extra])


def _database_lines(work_dir) -> int:
    with open(os.path.join(work_dir, "database_tuning_record.json")) as f:
        return sum(1 for line in f if line.strip())


@pytest.mark.parametrize("search, trials, cpus, workers", [
    ("metaschedule", 8, 64, 8), ("metaschedule", 500, 64, metaschedule.BATCH),
    ("autotvm:v8", 500, 64, autotvm.BATCH), ("autotvm:v8", 500, 2, 2), ("autotvm:v8", 1, 16, 1)])
def test_a_local_search_starts_no_more_builders_than_build_at_once(monkeypatch, search, trials,
                                                                   cpus, workers):
    """A search here builds with the CPUs it may use, but no more processes than one batch or
    its trials hold: each one's start and first build come before the first batch."""
    monkeypatch.setattr(candidates, "usable_cpus", lambda: cpus)
    assert tuning.search._build_workers(tuning.search.Request(search, trials)) == workers


@pytest.mark.slow
def test_metaschedule_on_llvm_saves_the_best_and_resumes_with_new_trials_only(tmp_path, capsys):
    work_dir = tmp_path / "ms"
    said = []
    request = tuning.search.Request("metaschedule", 4, work_dir=str(work_dir), target="llvm")
    summary = tuning.search.run(Workload("gemm", (32, 32, 32)), request, say=said.append)
    curve = summary.pop("curve")
    assert summary.pop("device") == candidates.this_cpu()
    assert summary == {"schedule": "metaschedule", "search": "metaschedule",
                       "tuner": "evolutionary", "params": {"work_dir": str(work_dir)},
                       "rules": "TVM's rules", "seed": 0, "trials": 4,
                       "candidates": {"proposed": 4, "refused": 0, "measured": 4},
                       "trials_per_min": metaschedule.trials_per_minute(str(work_dir)),
                       "kind": "search", "status": "ok"}
    assert any(line.startswith("best: ") and "; this run: 4 proposed, 0 refused, 4 measured, "
               in line for line in said)
    assert [n for n, _ in curve] == [1, 2, 3, 4] and curve[-1][1] > 0
    assert said[-1] == f"saved best_trace.txt and best_module.txt in {work_dir}"
    landed = [i for i, line in enumerate(said) if re.match(r"  \[[1-4]/4\] \d+\.\d{4} ms; best so far", line)]
    batch = next(i for i, line in enumerate(said) if line.startswith("  trials 4 new"))
    assert len(landed) == 4 and landed[-1] < batch  # each candidate, then the batch's line
    # a build of a second or more (a loaded machine) adds the slowest build's time to the line
    assert re.search(r"; \d+ s \(choosing \d+ s, building \d+ s, measuring \d+ s, updating \d+ s"
                     r"(; slowest build \d+ s)?\)$", said[batch]), said[batch]
    assert _database_lines(work_dir) == 4
    assert (work_dir / metaschedule.BEST_TRACE).read_text().startswith("b0 = sch.get_sblock")
    assert "T.prim_func" in (work_dir / metaschedule.BEST_MODULE).read_text()
    assert _tune_llvm(work_dir, 4) == 0
    assert _database_lines(work_dir) == 8
    out = capsys.readouterr().out
    assert "(4 there already)" in out and "best:" in out
    # the CLI records the search's summary, under the CPU that measured it
    (recorded,) = records.load(str(tmp_path / "results.jsonl")).records
    assert recorded["kind"] == "search" and recorded["trials"] == 8 and recorded["shape"] == [32, 32, 32]
    assert recorded["gpu"] == candidates.this_cpu()["gpu"] and recorded["arch"] == "llvm"
    assert f"search summary recorded in {tmp_path / 'results.jsonl'} (measured on CPU (" in out
    assert "sch.get_sblock" in out  # the best trace, printed as Python
    assert len(metaschedule.curve(str(work_dir))) == 8 and metaschedule.trials_per_minute(
        str(work_dir)) > 0
    # a work dir tuned for the CPU is not applied to a CUDA build
    assert runner.main(["--shape", "32x32x32", "--schedule", "metaschedule", "--work-dir",
                        str(work_dir), "--no-ir"]) == 2
    assert f"work dir {work_dir} was tuned for llvm, not cuda sm_90a" in capsys.readouterr().err


def test_a_batch_line_says_where_the_batch_went(monkeypatch):
    """Choosing (since the last batch), building, measuring (to the last result) and updating
    (MetaSchedule's callbacks after it); then the clock starts the next batch."""
    now = [100.0]
    monkeypatch.setattr(metaschedule.time, "time", lambda: now[0])
    clock = metaschedule._BatchClock()
    clock.build_start, clock.build_end, clock.landed, now[0] = 102.0, 105.0, 109.0, 110.0
    assert clock.batch_done() == "choosing 2 s, building 3 s, measuring 4 s, updating 1 s"
    assert clock.since == 110.0 and clock.build_start is None and clock.landed is None


def test_a_batch_line_names_its_slowest_build_when_it_took_a_second_or_more(monkeypatch):
    """A batch waits for its slowest candidate's build, so the line says how long that took,
    from the builder's own per-candidate times."""
    now = [100.0]
    monkeypatch.setattr(metaschedule.time, "time", lambda: now[0])
    builder = types.SimpleNamespace(seconds=[0.4, 2.6, 1.2])
    clock = metaschedule._BatchClock(builder)
    clock.build_start, clock.build_end, clock.landed, now[0] = 101.0, 104.0, 105.0, 105.0
    assert clock.batch_done().endswith("building 3 s, measuring 1 s, updating 0 s; slowest build 3 s")
    builder.seconds = [0.2, 0.3]
    assert "slowest" not in clock.batch_done()


class _Landed:
    """A runner future whose candidate is already measured."""

    def __init__(self, secs=None, error=None):
        from tvm.s_tir import meta_schedule as ms

        self.answer = ms.runner.RunnerResult(secs, error)

    def done(self):
        return True

    def result(self):
        return self.answer


def test_each_candidate_is_said_once_as_it_lands_with_the_best_and_the_rate():
    landed = [_Landed([2e-3]), _Landed(error="Traceback:\n  ...\nRuntimeError: boom"), _Landed([1e-3])]

    class Runner:
        def run(self, inputs):
            return landed

    said = []
    state = {"best": None, "start": 0.0, "clock": metaschedule._BatchClock()}
    reporter = metaschedule._candidate_reporter(state, Progress(3, "test"), said.append)
    wrapped = metaschedule.ReportingRunner(Runner(), reporter)
    for future in wrapped.run([]):
        assert future.done()  # MetaSchedule polls, then collects: one line all the same
        future.result()
    assert [line.split("; ")[:2] for line in said] == [
        ["  [1/3] 2.0000 ms", "best so far 2.0000 ms"],
        ["  [2/3] RuntimeError: boom", "best so far 2.0000 ms"],
        ["  [3/3] 1.0000 ms", "best so far 1.0000 ms"]]
    assert all(re.fullmatch(r"\d+\.\d trials/min", line.split("; ")[2]) for line in said)
    assert state["clock"].landed is not None  # the batch's measuring ends at the last one


def test_a_search_that_does_not_tensorize_skips_the_intrinsics(monkeypatch):
    """Without tensor cores, TuneContext's import of the intrinsics finds a stand-in (nothing
    parsed, nothing said), which is gone after the search; with them, they are loaded."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    said, imported = [], []
    monkeypatch.setattr(metaschedule.tvmscript_import.importlib, "import_module", imported.append)
    monkeypatch.delitem(sys.modules, metaschedule.TENSOR_INTRINSICS, raising=False)
    mod = tvm.IRModule({"main": Workload("gemm", (32, 32, 32)).prim_func()})
    with metaschedule._tensor_intrinsics(False, said.append):
        stand_in = sys.modules[metaschedule.TENSOR_INTRINSICS]
        context = ms.TuneContext(mod=mod, target=tvm.target.Target({"kind": "llvm", "num-cores": 2}),
                                 space_generator="post-order-apply", search_strategy="replay-trace")
        assert context.generate_design_space()
        assert sys.modules[metaschedule.TENSOR_INTRINSICS] is stand_in  # TuneContext's import
        assert not hasattr(stand_in, "cuda")  # parsed nothing
    assert metaschedule.TENSOR_INTRINSICS not in sys.modules and not said and not imported
    with metaschedule._tensor_intrinsics(True, said.append):
        assert imported == [metaschedule.TENSOR_INTRINSICS] and len(said) == 2


def test_loading_the_tensor_intrinsics_is_said_once(monkeypatch):
    said, imported = [], []
    monkeypatch.setattr(metaschedule.tvmscript_import.importlib, "import_module", imported.append)
    monkeypatch.delitem(sys.modules, metaschedule.TENSOR_INTRINSICS, raising=False)
    metaschedule._load_tensor_intrinsics(said.append)
    assert imported == [metaschedule.TENSOR_INTRINSICS] and len(said) == 2
    assert said[0].startswith("  loading TVM's tensor intrinsics") and said[1].endswith("; searching")
    monkeypatch.setitem(sys.modules, metaschedule.TENSOR_INTRINSICS, object())
    metaschedule._load_tensor_intrinsics(said.append)
    assert len(said) == 2 and len(imported) == 1


def test_progress_is_read_past_a_line_cut_short_by_a_kill(tmp_path):
    path = str(tmp_path / metaschedule.PROGRESS)
    line = {"session": "s", "trial": 1, "time_ms": 0.5, "error": None, "elapsed_s": 1.0}
    records.append(path, line)
    with open(path, "a") as f:
        f.write('{"session": "s", "tri')
    records.append(path, {**line, "trial": 3, "elapsed_s": 3.0})
    assert [p["trial"] for p in metaschedule.read_progress(str(tmp_path))] == [1, 3]
    assert metaschedule.curve(str(tmp_path)) == [(1, 0.5), (3, 0.5)]
    assert metaschedule.trials_per_minute(str(tmp_path)) == 40.0  # 2 in the session's 3 s


@pytest.mark.slow
def test_ctrl_c_keeps_every_measured_record_and_the_next_run_resumes(tmp_path):
    """Ctrl-C as a terminal sends it, to the whole process group (the search and its build and
    run workers), as the first batch ends: the next batch, in flight, finishes and is kept, none
    of it recorded as failed by a worker the signal ended (3 were, "Subprocess terminated",
    which a resume never measures again), and the counts printed are the database's."""
    import signal
    import threading
    import time

    work_dir = tmp_path / "ms"
    command = [sys.executable, os.path.join(ROOT, "runner.py"), "--tune", "metaschedule",
               "--target", "llvm", "--shape", "32x32x32", "--work-dir", str(work_dir),
               "--results", str(tmp_path / "results.jsonl")]
    search = subprocess.Popen([*command, "--trials", "96"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    out_lines = []
    reader = threading.Thread(target=lambda: out_lines.extend(search.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 300
    while not any(line.startswith("  trials 32 new") for line in out_lines) \
            and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(search.pid, signal.SIGINT)
    search.wait(timeout=300)
    reader.join(timeout=10)
    out, err = "".join(out_lines), search.stderr.read()
    assert search.returncode == 130 and "stopping after this batch" in out
    assert err.strip().splitlines() == [
        f"interrupted: everything measured so far is kept in {work_dir}; "
        "run the same command again to resume"]
    kept = _database_lines(work_dir)
    progress = metaschedule.read_progress(str(work_dir))
    assert not [p["error"] for p in progress if "terminated" in (p["error"] or "")]
    # The batch in flight finished and was kept. (A batch can hold fewer than 32 candidates
    # when the evolutionary search finds fewer new ones, so count what the search reported.)
    reported = int(re.findall(r"trials \d+ new, (\d+) in all", out)[-1])
    landed = int(re.findall(r"^  \[(\d+)/96\]", out, re.M)[-1])
    assert kept == reported == landed == len(progress) > 32
    assert subprocess.run([*command, "--trials", "4"], capture_output=True).returncode == 0
    assert _database_lines(work_dir) == len(metaschedule.read_progress(str(work_dir))) > kept


@pytest.mark.parametrize("worker", ["builder", "cpu runner", "gpu runner"])
def test_the_search_workers_outlive_a_ctrl_c(worker):
    """A terminal's Ctrl-C reaches every process of the group: each worker kind ignores it
    (the search stops itself after the batch in flight), and the next candidate runs in the
    same worker."""
    import signal
    import time

    owner = {"builder": lambda: candidates.WarmBuilder(max_workers=1),
             "cpu runner": lambda: candidates.local_runner("cpu", SEED_GEMM),
             "gpu runner": lambda: candidates.CheckingRunner(SEED_GEMM)}[worker]()
    pool = owner._pool(tensor_intrinsics=False) if worker == "builder" else owner.pool
    try:
        pid = pool.submit(os.getpid).result()
        os.kill(pid, signal.SIGINT)
        time.sleep(0.5)  # the signal lands while the worker waits for its next task
        assert pool.submit(os.getpid).result() == pid
    finally:
        candidates.shut_down(owner)


@pytest.mark.parametrize("line, says", [
    ("{not json", "not valid JSON"),
    ('[0, [["x"], [1.0]]]', "not a MetaSchedule tuning record"),  # JSON, but not a record
    ('[7, []]', "not a MetaSchedule tuning record (workload 7 is not in"),
])
def test_a_corrupt_database_is_named_by_path_and_line_and_left_alone(tmp_path, capsys, line, says):
    import shutil

    work_dir = tmp_path / "ms"
    shutil.copytree(MS_GEMM, work_dir)
    path = work_dir / "database_tuning_record.json"
    with open(path, "a") as f:
        f.write(line + "\n")
    number = _database_lines(work_dir)
    before = path.read_bytes()
    assert runner.main(["--preset", "gemm-seed", "--schedule", "metaschedule", "--work-dir",
                        str(work_dir), "--no-ir"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:{number}: {says}") and err.count("\n") == 1
    assert path.read_bytes() == before


# -- MetaSchedule's split-K rule -------------------------------------------------------------------


def split_k_candidates(wl: Workload, target, rand_state: int = 1) -> list:
    """The split-K candidates of MetaSchedule's first batch over the split-k space, drawn by its
    own evolutionary search (random cost model): what a search would build and measure first.
    The batch differs from run to run (the search samples in several threads)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    mod = tvm.IRModule({"main": wl.prim_func()})
    context = ms.TuneContext(mod=mod, target=target, task_name="main", num_threads=4,
                             space_generator=metaschedule.design_space(mod, target, "split-k", False),
                             search_strategy="evolutionary", rand_state=rand_state)
    context.pre_tuning(max_trials=64, num_trials_per_iter=64,
                       design_spaces=context.generate_design_space(),
                       database=ms.database.MemoryDatabase(), cost_model=ms.CostModel.create("random"))
    return [c.sch.mod for c in context.generate_measure_candidates()
            if any(i.kind.name == "RFactor" for i in c.sch.trace.insts)]


def test_16_bit_searches_offer_tensor_core_tiles_that_build(tensor_intrinsics):
    """A float16 GEMM's space on CUDA has wmma tiles next to the CUDA-core ones and split K; the
    first batch's tensor-core candidates build, through the search's own builder, into CUDA with
    wmma::mma_sync (with StorageRewrite on, 7 of 8 failed in LowerIntrin)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tuning import build

    target = build.cuda_target("sm_90")
    wl, fp32 = Workload("gemm", (256, 256, 256), "float16"), Workload("gemm", (256, 256, 256))
    assert metaschedule.uses_tensor_cores(wl, target) and not metaschedule.uses_tensor_cores(fp32, target)
    assert not metaschedule.uses_tensor_cores(wl, tvm.target.Target("llvm"))
    mod = tvm.IRModule({"main": wl.prim_func()})
    context = ms.TuneContext(mod=mod, target=target, task_name="main", num_threads=2,
                             space_generator=metaschedule.design_space(mod, target, "split-k", True),
                             search_strategy="replay-trace", rand_state=1)
    spaces = context.generate_design_space()
    assert any("rfactor" in str(s.trace) for s in spaces)
    context.pre_tuning(max_trials=8, num_trials_per_iter=8, design_spaces=spaces,
                       database=ms.database.MemoryDatabase(), cost_model=None)
    tensorized = [c.sch.mod for c in context.generate_measure_candidates()
                  if "auto_tensorize" in str(c.sch.trace)]
    assert tensorized and all(build.has_wmma_fragments(m) for m in tensorized)
    builder = candidates.WarmBuilder(max_workers=2)
    try:
        built = builder.artifacts([ms.builder.BuilderInput(m, target) for m in tensorized[:3]])
    finally:
        candidates.shut_down(builder)
    assert all(isinstance(path, str) for path in built), built
    source = build.cuda_source(build.build(tensorized[0], target))
    assert "wmma::mma_sync" in source


@pytest.mark.slow
def test_the_split_k_space_adds_rfactored_gemms_tiled_by_tvms_own_rule(tensor_intrinsics):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tuning import build

    target = build.cuda_target("sm_90")
    mod = tvm.IRModule({"main": SEED_GEMM.prim_func()})

    def spaces(space):
        return ms.TuneContext(mod=mod, target=target, task_name="main",
                              space_generator=metaschedule.design_space(mod, target, space, False)
                              ).generate_design_space()

    tvm_only, with_split = spaces("tvm"), spaces("split-k")
    split = [s for s in with_split if "rfactor" in str(s.trace)]
    assert len(with_split) == 4 * len(tvm_only) and len(split) == 3 * len(tvm_only)  # 2, 4, 8

    def sampled_tiles(sch):
        return sum(inst.kind.name == "SamplePerfectTile" for inst in sch.trace.insts)

    for sch in split:
        partial = sch.get(sch.get_sblock("C_rf"))
        assert partial.annotations["meta_schedule.tiling_structure"] == "SSSRRSRS"
        # M, N and K are sampled as in TVM's own spaces; the slice axis is not, it goes to the grid
        assert sampled_tiles(sch) == sampled_tiles(tvm_only[0]) == 3
    candidates_ = split_k_candidates(SEED_GEMM, target)
    assert len(candidates_) >= 32, "split-K candidates are not most of the first batch of 64"
    built = build.lower_and_build(candidates_[0], target)  # its CUDA compiled by the local nvcc
    assert built.structure["kernels"] == 2  # a kernel for the partial sums, one that adds them


# -- a rung's knob space as a MetaSchedule space, searched on the recorded grid ------------------


def _recorded_metaschedule_search(tmp_path, trials: int, seed: int):
    """MetaSchedule over seed_template's knob space on the seed GEMM, each candidate "built"
    into its realized module's structural hash and "run" as the H100 grid search measured
    that setting. Returns the work dir, the target, the settings measured, in order, and the
    search's summary."""
    import tempfile

    import tvm_ffi
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    from tuning import build

    target = build.cuda_target("sm_90")
    entry, grid = schedules.get("gemm", "seed_template"), recorded_grid("seed_template")
    setting_of = {}  # the structural hash of each setting's module -> its config key
    for config in SEED_SPACE.configs():
        try:
            mod = entry.apply(SEED_GEMM, target, **config)
        except ScheduleNotApplicable:
            continue
        setting_of[str(tvm_ffi.structural_hash(mod))] = autotvm.config_key(config)
    measured = []

    @derived_object
    class Hashing(ms.builder.PyBuilder):
        def build(self, inputs):  # a file per artifact: MetaSchedule deletes its directory
            return [ms.builder.BuilderResult(os.path.join(
                tempfile.mkdtemp(dir=tmp_path), str(tvm_ffi.structural_hash(b.mod))), None)
                for b in inputs]

    @derived_object
    class Landed(ms.runner.PyRunnerFuture):
        def __init__(self, outcome):
            super().__init__()
            ok = outcome.status == "ok"
            self.answer = ms.runner.RunnerResult([outcome.time_ms / 1e3] if ok else None,
                                                 None if ok else "RuntimeError: failed")

        def done(self):
            return True

        def result(self):
            return self.answer

    @derived_object
    class Replaying(ms.runner.PyRunner):
        def run(self, inputs):
            keys = [setting_of[os.path.basename(i.artifact_path)] for i in inputs]
            measured.extend(keys)
            return [Landed(grid[key]) for key in keys]

    work_dir = str(tmp_path / "ms")
    summary = metaschedule.search(SEED_GEMM, target, work_dir, trials, "seed_template",
                                  Hashing(), Replaying(), seed=seed, say=lambda line: None)
    return work_dir, target, measured, summary


def test_a_schedules_own_choice_is_its_spaces_knobs_for_the_shape_or_none():
    """What both searches measure first: the knobs of the space as the schedule runs the
    shape; none where the space does not hold one (multirow's tile_k None: a whole vector)."""
    assert schedules.get("gemm", "seed_template").own_choice(SEED_GEMM) == {
        "tile_x": 16, "tile_y": 16, "tile_k": 8, "vectorize": False, "local_accumulator": False,
        "shared_tiles": True}
    v8, big = schedules.get("gemm", "v8"), Workload("gemm", (8192, 8192, 1024), "float16")
    assert v8.own_choice(big) == v8.defaults_for(big)  # every knob of v8 is in its space
    assert schedules.get("gemv", "multirow").own_choice(
        Workload("gemv", (4096, 4096), "float16")) is None


def _seed_template_own_choice() -> str:
    """The config key of seed_template's knobs as its heuristic picks them for the seed GEMM."""
    own = schedules.get("gemm", "seed_template").defaults_for(SEED_GEMM)
    return autotvm.config_key({knob: value for knob, value in own.items()
                               if knob in SEED_SPACE.knobs})


@pytest.mark.slow
def test_metaschedule_searches_a_rungs_knob_space_and_its_database_gives_the_rung_back(tmp_path):
    """The knobs are MetaSchedule's decisions: its search measures the template's own choice
    for the shape first, comes within 5% of the grid's best (3 seeds, 64 trials of the 108
    settings that apply; in 20 runs it found the best itself), never measures a setting twice
    or one the template refuses (36 of the grid's 144), and its database's best replays to the
    template with the best knobs."""
    import tvm_ffi

    grid = recorded_grid("seed_template")
    best_ms = min(o.time_ms for o in grid.values() if o.status == "ok")
    own = _seed_template_own_choice()
    for seed in range(3):
        work_dir, target, measured, _ = _recorded_metaschedule_search(tmp_path / str(seed), 64,
                                                                      seed)
        assert measured[0] == own, f"seed {seed}"
        assert len(measured) == len(set(measured)) == 64, f"seed {seed}"
        assert all(grid[key].status != "invalid" for key in measured), f"seed {seed}"
        times = [grid[key].time_ms for key in measured if grid[key].status == "ok"]
        assert min(times) <= 1.05 * best_ms, f"seed {seed}"
    best_config = json.loads(min(measured, key=lambda k: grid[k].time_ms or float("inf")))
    replayed = metaschedule.best_module(SEED_GEMM, target, work_dir)
    rung = schedules.get("gemm", "seed_template").apply(SEED_GEMM, target, **best_config)
    assert tvm_ffi.structural_equal(replayed, rung)


def test_a_one_trial_metaschedule_search_of_a_rung_space_measures_the_rungs_own_choice(tmp_path):
    _, _, measured, _ = _recorded_metaschedule_search(tmp_path, 1, 0)
    assert measured == [_seed_template_own_choice()]


def test_a_metaschedule_search_of_a_rung_space_ends_when_the_space_does(tmp_path):
    """200 trials asked of 108 settings that apply: each is measured once, then it stops."""
    _, _, measured, _ = _recorded_metaschedule_search(tmp_path, 200, 0)
    assert len(measured) == len(set(measured)) == 108


def test_a_metaschedule_search_of_a_rung_space_counts_what_it_proposed_refused_and_measured(
        tmp_path, monkeypatch):
    """Each setting its search draws is put to the rung's refusal check once (seed_template's:
    applying it); the summary counts those settings, those refused (none of them measured)
    and those measured."""
    from tuning import rungspace

    real, asked = candidates.refusal, {}

    def recording(entry, wl, knobs, apply):
        key = autotvm.config_key(knobs)
        assert key not in asked, "asked twice"
        refused = real(entry, wl, knobs, apply)
        asked[key] = refused is not None
        return refused

    monkeypatch.setattr(rungspace.candidates, "refusal", recording)
    _, _, measured, summary = _recorded_metaschedule_search(tmp_path, 40, 0)
    refused = sum(asked.values())
    assert len(measured) == 40 and refused and not any(asked[key] for key in measured)
    assert summary["candidates"] == {"proposed": len(asked), "refused": refused, "measured": 40}


def _v8_rungs():
    from tuning import build, rungspace

    return rungspace.Rungs(["v8"], Workload("gemm", (4096, 4096, 4096), "float16"),
                           build.cuda_target("sm_90"))


def _v8_codes(**knobs) -> dict:
    from tuning import rungspace

    v8 = schedules.get("gemm", "v8")
    return {k: rungspace.encode(v) for k, v in {**v8.defaults, **knobs}.items()}


def test_a_search_asks_v8_whether_it_takes_knobs_without_building_it():
    """v8 builds a whole kernel to apply (0.1 s); MetaSchedule's postprocessing asks hundreds
    of settings a batch, so its refusals are checked alone (`refuse`) and nothing is built."""
    rungs = _v8_rungs()
    rungs.applied.clear()
    assert rungs.takes("v8", _v8_codes(block_n=192, stages=4))
    assert not rungs.takes("v8", _v8_codes(block_m=256, block_n=256))  # too many accumulators
    assert not rungs.takes("v8", _v8_codes(split_k=1, split_tail=True))
    assert rungs.applied == {}


def test_a_setting_that_passes_the_check_but_not_the_rung_fails_to_build_alone(tmp_path):
    """Where a rung's `refuse` lets through knobs that the rung then refuses, that candidate
    fails to build with the rung's reason, and the rest of its batch is built."""
    import dataclasses

    import tvm
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    from tuning import rungspace

    rungs = _v8_rungs()
    rungs.entries["v8"] = dataclasses.replace(rungs.entries["v8"], refuse=lambda wl, **k: None)
    built = []

    @derived_object
    class Recording(ms.builder.PyBuilder):
        def build(self, inputs):
            built.extend(inputs)
            return [ms.builder.BuilderResult(str(tmp_path / str(i)), None)
                    for i, _ in enumerate(inputs)]

    def candidate(**knobs):
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": rungs.wl.prim_func()}))
        rungspace.sample_knobs(sch, rungs.entries["v8"], rungs.wl,
                               schedules.get("gemm", "v8").defaults_for(rungs.wl, knobs))
        return ms.builder.BuilderInput(sch.mod, rungs.target)

    good, refused = candidate(block_n=192), candidate(block_m=256, block_n=256)
    assert rungs.takes(*rungspace.knobs_of(refused.mod))  # the check lets it through
    results = rungspace.RungBuilder(Recording(), rungs).build([refused, good])
    assert len(built) == 1 and results[1].error_msg is None
    assert results[0].artifact_path is None
    assert results[0].error_msg.startswith("ScheduleNotApplicable: v8's 256x256 tile gives")


def test_knob_values_and_rung_survive_the_trace():
    from tuning import rungspace

    v8 = schedules.get("gemm", "v8")
    assert [rungspace.decode(v8, "split_tail", rungspace.encode(b)) for b in (False, True)] == \
        [False, True]
    splitk = schedules.get("gemv", "splitk")
    assert rungspace.decode(splitk, "tile_k", rungspace.encode(None)) is None
    assert rungspace.decode(splitk, "tile_k", rungspace.encode(16)) == 16


@pytest.mark.parametrize("space, target, error", [
    ("v3", "cuda", "unknown design space 'v3'; valid: tvm, split-k, or gemm rungs with knob "
                   "spaces, comma-separated: seed_template, v4, v5"),
    ("v7,v9", "cuda", "unknown design space 'v7,v9'"),
    ("v5", "llvm", "design space v5 is made of CUDA rungs; search it on a GPU"),
])
def test_a_rung_space_that_cannot_be_searched_is_refused(space, target, error):
    with pytest.raises(UsageError, match=re.escape(error)):
        metaschedule.space_for(space, target, SEED_GEMM)


def test_a_rung_space_the_workload_cannot_take_is_refused_with_the_rungs_reason():
    from tuning import build, rungspace

    with pytest.raises(UsageError, match=re.escape(
            "design space v8: v8 multiplies float16, bfloat16 or float8_e4m3fn on tensor cores, not float32")):
        rungspace.Rungs(["v8"], SEED_GEMM, build.cuda_target("sm_90"))


# -- the committed searches, applied like rungs (no GPU: built, not timed) ------------------------


def trial(device: str, time_ms: float, tile_x: int, tvm_version: str | None = None) -> dict:
    key = autotvm.search_key(SEED_GEMM, "seed_template", device, "grid")
    if tvm_version:
        key["tvm"] = tvm_version
    return autotvm.trial_record(key, {**SEED_SPACE.configs()[0], "tile_x": tile_x},
                                Outcome(Status.OK, time_ms), 1)


def test_a_template_record_applies_only_on_its_device_and_tvm_version():
    import tvm

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    measured = [trial(h100, 0.5, 8), trial(h200, 0.1, 32), trial(h100, 0.05, 16, "0.26.0")]
    assert autotvm.search_key(SEED_GEMM, "seed_template", h100, "grid")["tvm"] == tvm.__version__
    best = autotvm.best_record(measured, SEED_GEMM, "seed_template", h100)
    assert best["config"]["tile_x"] == 8  # not the H200's faster one, nor the other TVM's
    assert autotvm.best_record(measured, SEED_GEMM, "seed_template", "NVIDIA A100") is None
    # no GPU here and records of two GPUs: which one's best is not guessed
    with pytest.raises(schedules.RecordsError, match="measured on NVIDIA H100 80GB HBM3, NVIDIA H200"):
        autotvm.tuned_entry(schedules.get("gemm", "seed_template"), SEED_GEMM, measured, "r", None)
    chosen = autotvm.tuned_entry(schedules.get("gemm", "seed_template"), SEED_GEMM, measured, "r", h200)
    assert chosen.params["tile_x"] == 32


def test_without_a_gpu_device_picks_whose_records_apply(tmp_path, capsys, monkeypatch):
    from tuning import measure, records as store

    monkeypatch.setattr(measure, "gpu_present", lambda: False)
    path = str(tmp_path / "at.jsonl")
    for record in (trial("NVIDIA H100 80GB HBM3", 0.5, 8), trial("NVIDIA H200", 0.1, 32)):
        store.append(path, record)
    args = ["--preset", "gemm-seed", "--schedule", "autotvm:seed_template", "--records", path,
            "--no-ir"]
    assert runner.main(args) == 2 and "say which device" in capsys.readouterr().err
    assert runner.main([*args, "--device", "NVIDIA H200"]) == 0
    assert "autotvm:seed_template: built: grid (x,y,z) 32x" in capsys.readouterr().out


@pytest.mark.parametrize("field, value, says", [
    ("config", None, "no 'config' field"),  # a KeyError applying it before
    ("config", 4, "config 4 is not dict"),
    ("device", [], "device [] is not str"),  # unhashable in measured_on before
    ("status", "fine", "status 'fine' is none of ok, invalid"),
    ("time_ms", -1.0, "time_ms -1.0 of a passed trial is not a positive time"),  # ranked first
    ("shape", [0, 1, 1], "dimensions must be positive"),
])
def test_a_bad_trial_record_is_named_by_line_and_skipped(tmp_path, capsys, monkeypatch, field,
                                                         value, says):
    """A template search's records file with one bad line among good ones: `autotvm:` applies
    the best good one, and names the bad line (it once applied a trial of a negative time, or
    ended in a traceback)."""
    from tuning import measure, records as store

    monkeypatch.setattr(measure, "gpu_present", lambda: False)
    path = str(tmp_path / "at.jsonl")
    bad = {**trial("NVIDIA H100 80GB HBM3", 0.01, 32), field: value}
    if value is None:
        del bad[field]
    args = ["--preset", "gemm-seed", "--schedule", "autotvm:seed_template", "--records", path,
            "--no-ir"]
    store.append(path, trial("NVIDIA H100 80GB HBM3", 0.5, 8))
    assert runner.main(args) == 0
    good_alone = capsys.readouterr().out
    store.append(path, bad)
    assert runner.main(args) == 0
    out, err = capsys.readouterr()
    assert f"{path}:2: {says}" in err and out == good_alone


def test_a_best_trial_whose_knobs_the_template_does_not_take_is_refused(tmp_path, capsys,
                                                                       monkeypatch):
    from tuning import measure, records as store

    monkeypatch.setattr(measure, "gpu_present", lambda: False)
    path = str(tmp_path / "at.jsonl")
    best = trial("NVIDIA H100 80GB HBM3", 0.5, 8)
    store.append(path, {**best, "config": {**best["config"], "tile_x": "eight"}})
    assert runner.main(["--preset", "gemm-seed", "--schedule", "autotvm:seed_template",
                        "--records", path, "--no-ir"]) == 2
    assert "is not one it takes: knob tile_x of seed_template is a size or count of at least 1, " \
        "not 'eight'" in capsys.readouterr().err


def test_every_committed_trial_record_passes_its_checks():
    from tuning import records as store

    loaded = store.load(RECORDED, check=autotvm.trial_problem)
    assert loaded.records and not loaded.problems


@pytest.mark.slow
def test_the_committed_searches_apply_like_rungs(capsys):
    code = runner.main(["--preset", "gemm-seed", "--schedule", "all", "--no-ir", "--work-dir",
                        MS_GEMM, "--records", RECORDED])
    out = capsys.readouterr().out
    assert code == 0
    assert "metaschedule: built" in out and "autotvm:seed_template: built" in out
    assert runner.main(["--diff", "v3", "autotvm:seed_template", "--records", RECORDED]) == 0


@pytest.mark.parametrize("args, message", [
    (["--tune", "metaschedule", "--trials", "0", "--work-dir", "x"],
     "trials must be positive, not 0"),
    (["--tune", "metaschedule", "--target", "llvm"], "needs --work-dir"),
    (["--schedule", "metaschedule"], "metaschedule needs the work dir of a MetaSchedule search"),
    (["--schedule", "autotvm:seed_template"], "autotvm:seed_template needs the records of a "
                                              "template search"),
    (["--schedule", "metaschedule", "--work-dir", "no/such/dir"], "does not exist"),
    (["--tune", "autotvm:seed_template", "--tuner", "anneal", "--records", "r.jsonl"],
     "unknown tuner 'anneal'; valid: grid, random, xgb"),
    (["--tune", "autotvm:seed_template"], "needs --records"),
    (["--tune", "autotvm:v3", "--records", "r.jsonl"], "declares no knob space"),
    (["--tune", "autotvm:seed_template", "--records", "r.jsonl", "--target", "llvm"],
     "--target llvm is for MetaSchedule"),
    (["--tune", "metaschedule", "--work-dir", "x", "--target", "rocm"],
     "unknown target 'rocm'; valid: cuda, llvm"),
    (["--tune", "anneal"], "unknown search 'anneal'"),
    (["--tune", "metaschedule", "--work-dir", "x", "--rpc-tracker", "nohost", "--rpc-key", "k"],
     "host:port"),
    (["--tune", "metaschedule", "--work-dir", "x", "--rpc-tracker", "h:1"], "needs --rpc-key"),
    (["--tune", "metaschedule", "--work-dir", "x", "--ms-space", "wide"],
     "unknown design space 'wide'; valid: tvm, split-k"),
    (["--tune", "metaschedule", "--work-dir", "x", "--ms-space", "split-k", "--target", "llvm"],
     "split-k is for CUDA targets"),
    (["--schedule", "autotvm:seed_template", "--records", RECORDED, "--shape", "64x64x64"],
     "no correct measured configuration"),
])
def test_bad_search_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "runner.py"), *args],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "x")


def test_the_tuning_report_has_curves_tables_and_plots(tmp_path):
    from reporting.render import render

    loaded = records.load(os.path.join(ROOT, "reports", "h100-tuning.jsonl")).records
    text = render(loaded, "t", figure_prefix=str(tmp_path / "t"))
    assert "## Searches: gemm 1024x512x2048 float32 nn" in text and "![tuning curves](t-1.png)" in text
    assert "| best manual rung (v5k)" in text and "| cuBLAS" in text
    # each MetaSchedule search is named by its rules, seed and shared-memory limit, and
    # re-timed only from its own work dir (the latest run re-timed the search over v5k's knobs)
    seed_searches = text.split("## Searches: gemm 1024x512x2048")[1].split("## ")[0]
    retimed = {cells[1].strip(): cells[5].strip() for cells in
               (line.split("|") for line in seed_searches.splitlines())
               if len(cells) > 7 and cells[1].startswith(" metaschedule")}
    assert retimed["metaschedule (TVM's rules)"] == "-"
    assert retimed["metaschedule (TVM's rules + split K)"] == "-"
    assert retimed["metaschedule (TVM's rules + split K, seed 1)"] == "-"
    assert retimed["metaschedule (TVM's rules + split K, 227 KB shared)"] == "-"
    assert retimed["metaschedule (knob space of v5k, 227 KB shared)"] != "-"
    with open(tmp_path / "t-1.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_builder_builds_tensor_core_candidates():
    """CUDA code generation for a v6 candidate looks up the fragment layouts that TVM's tensor
    intrinsics register, so the builder's workers import them for such candidates (on the
    H100, every v6 candidate of the first search failed to build without them), and only
    for those: the import costs each worker about 40 s on the GPU machine. A candidate that
    fails to build is build_failed, with TVM's reason."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tuning import build

    target = build.cuda_target("sm_90")
    cuda_cores = schedules.get("gemm", "v5").apply(Workload("gemm", (256, 256, 256)), target)
    tensor_cores = schedules.get("gemm", "v6").apply(Workload("gemm", (256, 256, 256), "float16"),
                                                     target)
    handed = []
    builder = candidates.WarmBuilder(max_workers=1, on_built=handed.append)
    builder.start(target)  # the worker starts now, with a first build of its own
    started = builder.pool
    try:
        results = builder.build([ms.builder.BuilderInput(cuda_cores, target)])
        assert builder.pool is started
        assert not builder.tensor_intrinsics
        results += builder.build([ms.builder.BuilderInput(tensor_cores, target)])
        assert builder.tensor_intrinsics
        seconds = builder.seconds  # the last batch's: one built candidate
        for_the_cpu = ms.builder.BuilderInput(cuda_cores, tvm.target.Target("llvm"))
        failed, = builder.artifacts([for_the_cpu])
    finally:
        candidates.shut_down(builder)
    for result in results:
        assert result.error_msg is None and os.path.getsize(result.artifact_path) > 0
    assert handed == [r.artifact_path for r in results]  # each as it was built, not the failed
    # a CUDA schedule built for the CPU: build_failed, with TVM's reason
    assert failed.status is Status.BUILD_FAILED
    assert failed.error.startswith("tvm.error.InternalError: Check failed: (device_id_) is false")
    assert len(seconds) == 1 and 0 < seconds[0] < candidates.BUILD_TIMEOUT_S
    assert builder.seconds == []  # the failed batch built nothing


@pytest.mark.parametrize("in_flight", [1, 2])
@pytest.mark.parametrize("tuner", ["random", "xgb"])
def test_a_search_killed_and_resumed_measures_what_an_undisturbed_one_does(tmp_path, tuner,
                                                                             in_flight):
    """A tuner's proposals depend on its seed and the configurations known only: a search
    whose head dies in its third batch, resumed from its records, measures the same
    configurations as one that ran undisturbed, none twice, and ends at the same best; with
    one batch at a time, and with two in flight (a farm's)."""
    grid = recorded_grid("seed_template")
    undisturbed, _ = search(tuner, 5, grid, 64, SEED_SPACE, in_flight=in_flight)
    path = str(tmp_path / "at.jsonl")
    key = autotvm.search_key(SEED_GEMM, "seed_template", "H100", tuner, 5)

    def record(config, outcome):
        records.append(path, autotvm.trial_record(key, config, outcome, 0))

    with pytest.raises(KeyboardInterrupt):
        autotvm.tune(SEED_SPACE, autotvm.TUNERS[tuner](5), replay_dying_in_the_third_batch(grid),
                     {}, 64, 16, record, in_flight=in_flight)
    resumed = autotvm.history_of(records.load(path).records, key)
    assert 0 < len(resumed) < 64
    search(tuner, 5, grid, 64 - len(resumed), SEED_SPACE, history=resumed, record=record,
           in_flight=in_flight)
    measured = [autotvm.config_key(r["config"]) for r in records.load(path).records]
    assert len(measured) == len(set(measured)) == 64
    assert set(measured) == set(undisturbed)
    assert autotvm.best(resumed) == autotvm.best(undisturbed)
