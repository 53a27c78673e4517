"""TVM's own default GPU schedule (dlight), registered as a baseline rung of every op."""

from __future__ import annotations

from tvm.s_tir import Schedule, dlight
from tvm.target import Target

from .errors import ScheduleNotApplicable
from .registry import schedule
from .workloads import OPS, Workload

# The rule order of TVM's default GPU pipeline: the first rule that matches schedules the function.
RULES = (
    dlight.gpu.Matmul,
    dlight.gpu.GEMV,
    dlight.gpu.LowBatchGEMV,
    dlight.gpu.Reduction,
    dlight.gpu.GeneralReduction,
    dlight.gpu.Fallback,
)


def dlight_default(sch: Schedule, wl: Workload) -> None:
    """TVM's dlight default GPU rules (Matmul, GEMV, ... Fallback): the first that matches wins.

    The rule schedules a copy of the function; its trace is replayed onto `sch`."""
    target = Target.current(allow_none=False)
    func = sch.mod["main"]
    for rule in RULES:
        scheduled = rule().apply(func, target, False)
        if isinstance(scheduled, list):
            scheduled = scheduled[0] if scheduled else None
        if scheduled is not None:
            scheduled.trace.apply_to_schedule(sch, remove_postproc=False)
            return
    raise ScheduleNotApplicable(f"no dlight rule matched {wl.label()}")


for _op in OPS:
    schedule(_op, "dlight", baseline=True)(dlight_default)
