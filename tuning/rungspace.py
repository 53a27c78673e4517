"""Rungs' knob spaces as MetaSchedule design spaces (`--ms-space v8`, or several: `v7,v8`).

A rung's design space is the workload left as it is, with each knob of the rung drawn by
`sample_categorical` over the values its space lists and kept, with the rung's name, as an
annotation of the root block. So a candidate's trace is the knob values as MetaSchedule
decisions: the evolutionary search mutates them (ChangeKnob), TVM's database keeps them, and a
record replayed gives the same knobs back. What a candidate stands for is the rung applied with
those knobs (`Rungs.realize`, cached per setting): postprocessing drops the settings the rung
refuses (RungApplies; by the rung's `refuse` check where it has one, without building), each
setting asked once and counted (Rungs.counts: what the search proposed and what was refused), the
builder builds the rung's module (RungBuilder), and the XGBoost cost model reads the knobs
(KnobFeatures: log2 of sizes, as the template tuner's xgb does, since the annotated workload's
IR is the same for every candidate). The rungs' own choices for the shape are measured first
(OwnChoiceFirst).
"""

from __future__ import annotations

import random
import threading

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

import schedules
from schedules.errors import ScheduleNotApplicable
from schedules.registry import ScheduleEntry
from schedules.workloads import Workload

from . import candidates
from .autotvm import Space

RUNG = "explorer.rung"  # root block annotation: the rung a candidate stands for
KNOB = "explorer.knob."  # + a knob's name: its value (encode)


def encode(value) -> int:
    """A knob value as the integer a decision can hold: a size as it is, a switch as 0 or 1,
    None (the rung chooses) as 0, which no size is."""
    return 0 if value is None else int(value)


def decode(entry: ScheduleEntry, knob: str, code: int):
    kind, optional = entry.knob_types[knob]
    if kind is bool:
        return bool(code)
    return None if optional and code == 0 else int(code)


def spaced(op: str) -> list[str]:
    """The schedules of `op` that declare a knob space."""
    return [e.name for e in schedules.entries(op, templates=True) if e.space]


def sample_knobs(sch: tvm.s_tir.Schedule, entry: ScheduleEntry, wl: Workload,
                 chosen: dict | None = None) -> None:
    """Draw each knob of `entry` uniformly from its space for `wl` (ScheduleEntry.space_for;
    or, with `chosen`, decide it as `chosen` says) and annotate the root block with it."""
    root = sch.get_sblock("root")
    sch.annotate(root, RUNG, entry.name)
    for knob, values in entry.space_for(wl).items():
        decision = None if chosen is None else values.index(chosen[knob])
        drawn = sch.sample_categorical([encode(v) for v in values],
                                       [1 / len(values)] * len(values), decision=decision)
        sch.annotate(root, KNOB + knob, drawn)


def knobs_of(mod: tvm.IRModule) -> tuple[str, dict] | None:
    """(rung name, {knob: code}) that a candidate's root block carries; None for a candidate
    of TVM's own rules."""
    annotations = mod["main"].body.block.annotations
    if RUNG not in annotations:
        return None
    return str(annotations[RUNG]), {key[len(KNOB):]: int(value) for key, value in
                                    annotations.items() if key.startswith(KNOB)}


class Rungs:
    """The rungs of one search's space, applied to its workload for its target: each knob
    setting once (the postprocessor asks first, the builder then takes the module)."""

    def __init__(self, names: list[str], wl: Workload, target: tvm.target.Target):
        """The rungs `names` of the workload's op (each with a knob space: metaschedule.
        space_for checks). Refuses, with the rung's reason, a rung that does not take `wl` with
        its own knobs (another dtype, or rows TMA cannot load): no setting of its space would."""
        entries_ = [schedules.get(wl.op, name) for name in names]
        self.entries = {e.name: e for e in entries_}
        self.wl, self.target = wl, target
        self.applied: dict = {}  # (rung, codes) -> its module, or the refusal
        self.taken: dict = {}  # (rung, codes) -> whether the rung takes them: each setting asked
        # MetaSchedule postprocesses in several threads; a rung is applied by one at a time
        # (v7 registers its wgmma intrinsic if it is not yet: two threads both found it not),
        # and a setting is put to the refusal check by one (which may apply it: reentrant)
        self.lock = threading.RLock()
        for entry in entries_:
            candidates.refuse_unless_taken(entry, wl, target, f"design space {entry.name}")

    def apply(self, name: str, codes: dict):
        """The rung's module with the knobs `codes` stand for, or the ScheduleNotApplicable
        that says why it refuses them."""
        key = (name, tuple(sorted(codes.items())))
        with self.lock:
            if key not in self.applied:
                try:
                    self.applied[key] = self.entries[name].apply(self.wl, self.target,
                                                                 **self._decoded(name, codes))
                except ScheduleNotApplicable as refused:
                    self.applied[key] = refused
            return self.applied[key]

    def takes(self, name: str, codes: dict) -> bool:
        """Whether the rung takes the knobs `codes` stand for (candidates.refusal: by its
        `refuse` check where it has one, since a search's population asks hundreds of settings
        a batch, else by applying it), asked once per setting and counted (`counts`)."""
        key = (name, tuple(sorted(codes.items())))
        with self.lock:  # two threads drawing one setting: the second finds the first's answer
            if key not in self.taken:
                refused = candidates.refusal(self.entries[name], self.wl,
                                             self._decoded(name, codes),
                                             lambda _: self.apply(name, codes))
                self.taken[key] = refused is None
            return self.taken[key]

    def counts(self, measured: int) -> candidates.Counts:
        """The settings the search proposed (asked `takes` about), those refused, and the
        `measured` it says it measured."""
        return candidates.Counts(len(self.taken), list(self.taken.values()).count(False), measured)

    def _decoded(self, name: str, codes: dict) -> dict:
        entry = self.entries[name]
        return {k: decode(entry, k, code) for k, code in codes.items()}

    def realize(self, mod: tvm.IRModule) -> tvm.IRModule:
        """What a candidate stands for: its rung with its knobs applied to the workload."""
        applied = self.apply(*knobs_of(mod))
        if isinstance(applied, ScheduleNotApplicable):
            raise applied
        return applied

    def design_space(self) -> ms.space_generator.ScheduleFn:
        """One design space per rung, with RungApplies and ChangeKnob as its only
        postprocessor and mutator (TVM's rules would schedule the workload themselves)."""

        def spaces(sch: tvm.s_tir.Schedule) -> list[tvm.s_tir.Schedule]:
            drawn = []
            for entry in self.entries.values():
                copy = sch.copy()
                sample_knobs(copy, entry, self.wl)
                drawn.append(copy)
            return drawn

        return ms.space_generator.ScheduleFn(spaces, sch_rules=[], postprocs=[RungApplies(self)],
                                             mutator_probs={ChangeKnob(): 1.0})

    def own_choices(self, mod: tvm.IRModule) -> list[ms.MeasureCandidate]:
        """Each rung's own choice for the workload `mod` (its knobs as its shape heuristic
        picks them) as a candidate, where the rung's space holds it and the rung takes it."""
        chosen = []
        for entry in self.entries.values():
            own = entry.own_choice(self.wl)
            if own is None:
                continue
            sch = tvm.s_tir.Schedule(mod)
            sample_knobs(sch, entry, self.wl, own)
            if self.takes(*knobs_of(sch.mod)):
                args = ms.arg_info.ArgInfo.from_entry_func(sch.mod)
                chosen.append(ms.MeasureCandidate(sch, args))
        return chosen

    def cost_model(self, warmup: int) -> ms.cost_model.XGBModel:
        """MetaSchedule's XGBoost model on knob features, trained from the first `warmup`
        measured candidates on (random picks before that)."""
        return ms.cost_model.XGBModel(extractor=KnobFeatures(list(self.entries.values())),
                                      num_warmup_samples=warmup)


def realize(mod: tvm.IRModule, wl: Workload, target: tvm.target.Target) -> tvm.IRModule:
    """A scheduled module out of MetaSchedule's database as it runs: a rung space's candidate
    realized, one of TVM's rules as it is."""
    found = knobs_of(mod)
    if found is None:
        return mod
    return Rungs([found[0]], wl, target).realize(mod)


@derived_object
class RungApplies(ms.postproc.PyPostproc):
    """Keep a candidate only if its rung applies with its knobs (a rung refuses, for example,
    tiles whose shared memory is over the GPU's limit)."""

    def __init__(self, rungs: Rungs):
        super().__init__()
        self.rungs = rungs

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch: tvm.s_tir.Schedule) -> bool:
        found = knobs_of(sch.mod)
        return found is not None and self.rungs.takes(*found)

    def clone(self):
        return RungApplies(self.rungs)


def _setting(candidate: ms.MeasureCandidate) -> tuple:
    rung, codes = knobs_of(candidate.sch.mod)
    return rung, tuple(sorted(codes.items()))


@derived_object
class OwnChoiceFirst(ms.search_strategy.PySearchStrategy):
    """MetaSchedule's search (`search`) after a first batch of the candidates `first` (the
    rungs' own choices: Rungs.own_choices), which count among the trials and are not measured
    again: as the template tuner does, so that a search's best is never slower than the rungs
    without one."""

    def __init__(self, search, first: list[ms.MeasureCandidate]):
        super().__init__()
        self.search, self.first = search, first
        self.settings = {_setting(c) for c in first}
        self.pending = []

    def _initialize_with_tune_context(self, context) -> None:
        self.search._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:
        self.pending = self.first[:max_trials]
        self.search.pre_tuning(max_trials - len(self.pending), num_trials_per_iter,
                               design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.search.post_tuning()

    def generate_measure_candidates(self):
        if self.pending:
            return self.pending
        batch = self.search.generate_measure_candidates()
        return None if batch is None else [c for c in batch if _setting(c) not in self.settings]

    def notify_runner_results(self, measure_candidates, results) -> None:
        """The search hears of its own candidates only: it counts its trials by their
        results, so a candidate of `first` that it drew again is drawn anew."""
        if self.pending:
            self.pending = []
        else:
            self.search.notify_runner_results(measure_candidates, results)

    def clone(self):
        return OwnChoiceFirst(self.search.clone(), self.first)


@derived_object
class ChangeKnob(ms.mutator.PyMutator):
    """Move one knob, picked at random, to another of its values (MetaSchedule's own mutators
    change tile sizes, unroll depths and thread bindings; a sampled knob is none of those)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.random = random.Random(seed)

    def _initialize_with_tune_context(self, context) -> None:
        self.random.seed(int(context.rand_state))

    def apply(self, trace, _):
        knobs = [inst for inst in trace.insts
                 if inst.kind.name == "SampleCategorical" and len(inst.attrs[0]) > 1]
        if not knobs:
            return None
        inst = self.random.choice(knobs)
        now = int(trace.decisions[inst])
        moved = self.random.choice([n for n in range(len(inst.attrs[0])) if n != now])
        return trace.with_decision(inst, moved, remove_postproc=True)

    def clone(self):
        return ChangeKnob(self.random.randrange(2 ** 31))


@derived_object
class KnobFeatures(ms.feature_extractor.PyFeatureExtractor):
    """A candidate's features: which rung it is (one column per rung) and its knobs as the
    template tuner's xgb sees them (autotvm.Space.features), in the columns of its rung."""

    def __init__(self, entries_: list[ScheduleEntry]):
        super().__init__()
        self.entries = entries_
        self.columns = len(entries_) + sum(len(e.space) for e in entries_)

    def extract_from(self, context, candidates):
        return [tvm.runtime.tensor(self._row(c.sch.mod)) for c in candidates]

    def _row(self, mod: tvm.IRModule) -> np.ndarray:
        row = np.zeros((1, self.columns), dtype="float32")
        name, codes = knobs_of(mod)
        at = len(self.entries)
        for n, entry in enumerate(self.entries):
            if entry.name == name:
                row[0, n] = 1
                config = {k: decode(entry, k, codes[k]) for k in entry.space}
                row[0, at:at + len(entry.space)] = Space(entry.space).features(config)
            at += len(entry.space)
        return row


@derived_object
class RungBuilder(ms.builder.PyBuilder):
    """`builder` building what each candidate stands for (its rung applied: Rungs.apply)."""

    def __init__(self, builder, rungs: Rungs):
        super().__init__()
        self.builder, self.rungs = builder, rungs

    def build(self, build_inputs):
        """Each candidate built, or failed with the rung's reason where it refuses knobs that
        its `refuse` check let through."""
        applied = [self.rungs.apply(*knobs_of(b.mod)) for b in build_inputs]
        built = iter(self.builder.build([
            ms.builder.BuilderInput(mod, b.target, b.params)
            for mod, b in zip(applied, build_inputs)
            if not isinstance(mod, ScheduleNotApplicable)]))
        return [ms.builder.BuilderResult(None, f"ScheduleNotApplicable: {mod}")
                if isinstance(mod, ScheduleNotApplicable) else next(built) for mod in applied]
