"""The public Python API: what a notebook imports, one name per stage of the pipeline.

    import tvm_explorer as tx

    wl = tx.Workload("gemm", (256, 256, 256))           # op, shape, dtype, out_dtype, layout
    v2, v3 = tx.build(wl, "v2"), tx.build(wl, "v3")     # any --schedule name, knobs allowed
    print(tx.ir_diff(v2, v3, "v2", "v3"))               # the lowered IR's unified diff
    print(v3.source)                                    # the CUDA; v3.lowered, v3.structure
    print(tx.lower(wl, "v5k:k_slices=4"))               # the lowered IR alone, as text
    best = tx.search(wl, "metaschedule", trials=8, work_dir="ms", target="llvm")
    kernel = tx.compile_kernel(wl, "v3")                # a torch operator: kernel(A, B)
    print(tx.cuda_source(kernel))
    tx.linear.replace_linears(model); tx.linear.prepare(model)   # a model's linear layers

Library calls print nothing: what they report goes to the `logging` loggers of the project's
packages (`tuning`, `linear`, `schedules`, `tvm_explorer`), silent until a program configures
logging (`logging.basicConfig(level=logging.INFO)` shows the progress lines the command prints).
Every refusal is an ExplorerError (a UsageError, WorkloadError, ScheduleNotApplicable, ...) whose
message says what to change.
"""

from __future__ import annotations

import logging

import linear
from schedules import PRESETS, Workload
from schedules.errors import (BuildFailed, ExplorerError, KernelFailed, ScheduleNotApplicable,
                              SearchFailed, UsageError, WorkloadError)
from tuning import build as _build
from tuning import search as _search
from tuning.build import Built
from tuning.explore import SearchResults, build_schedule, resolve
from tuning.export import compile as _compile
from tuning.loader import Kernel

LOG = logging.getLogger("tvm_explorer")
LOG.addHandler(logging.NullHandler())  # a library's rule: silent (even its warnings) until the
# program configures logging, where Python's last-resort handler would print them to stderr

__all__ = ["PRESETS", "BuildFailed", "Built", "ExplorerError", "Kernel", "KernelFailed",
           "ScheduleNotApplicable", "SearchFailed", "SearchResults", "UsageError", "Workload",
           "WorkloadError", "build", "compile_kernel", "cuda_source", "ir_diff", "linear",
           "lower", "search"]


def build(workload: Workload, schedule: str = "v3", arch: str = "sm_90",
          found: SearchResults | None = None) -> Built:
    """`schedule` (any name `--schedule` takes: a rung with knobs, `best`, `metaschedule`,
    `autotvm:<template>`, the last two reading `found`) applied to `workload`, lowered and
    compiled for `arch`: the Built's `source` is the CUDA, `lowered` the IRModule, `structure`
    the launch shape, shared memory, barriers and loop depth. A schedule that cannot handle the
    workload raises ScheduleNotApplicable with the reason."""
    target = _build.cuda_target(_build.arch_of(arch))
    return build_schedule(resolve(workload, schedule, found or SearchResults(), LOG.warning),
                          workload, target)


def lower(workload: Workload, schedule: str = "v3", arch: str = "sm_90",
          found: SearchResults | None = None) -> str:
    """The TVMScript of `schedule` on `workload` lowered for `arch`, without compiling it."""
    target = _build.cuda_target(_build.arch_of(arch))
    applied = resolve(workload, schedule, found or SearchResults(), LOG.warning)
    return _build.ir_text(_build.lower(applied.apply(workload, target), target))


def ir_diff(old: Built, new: Built, old_name: str = "old", new_name: str = "new") -> str:
    """The unified diff of two builds' lowered IR, common-subexpression names made stable
    (so that renumbering alone shows no change): what `tvm-explorer diff` prints first."""
    old_text, new_text = (_build.stable_cse_names(_build.ir_text(b.lowered)) for b in (old, new))
    return _build.unified_diff(old_text, new_text, f"{old_name} (lowered)",
                               f"{new_name} (lowered)")


def compile_kernel(workload: Workload, schedule: str = "best", *, check: bool = True,
                   found: SearchResults | None = None, arch: str = "sm_90") -> Kernel:
    """tuning.export.compile (named so as not to shadow the builtin): `schedule`'s kernel for
    `workload` as a torch operator, built for the GPU here (else for `arch`), checked against
    float64 before its first launch unless `check` is False; the line saying what `best` chose
    is logged, not printed."""
    return _compile(workload, schedule, check=check, found=found, arch=arch, warn=LOG.warning)


def cuda_source(kernel: Kernel) -> str:
    """The CUDA source of a kernel that compile_kernel returned (or load.py loaded)."""
    return _build.cuda_source(kernel.module)


def search(workload: Workload, method: str = "metaschedule", trials: int = 64, **settings
           ) -> dict:
    """Search `workload`'s schedules: `method` is 'metaschedule' (give `work_dir`; `target`
    'llvm' searches on this CPU, `space` the design space) or 'autotvm:<template>' (give
    `records`; `tuner` grid, random or xgb; 'autotvm:v8:promote_k=none' holds those knobs); a
    `seed` given makes the proposals reproducible. The other settings are
    tuning.search.Request's. Returns the search's summary record (its `schedule` is the name
    build() takes with the same work_dir or records). Progress goes to the `tuning` loggers."""
    request = _search.Request(method, trials, reproducible="seed" in settings, **settings)
    return _search.run(workload, request, LOG.info, LOG.warning)
