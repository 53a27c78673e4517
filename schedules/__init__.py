"""What to compute (workloads) and how to schedule it (the registered ladders)."""

from . import dlight, gemm, gemv, tensorcore  # noqa: F401  (importing registers the schedules)
from .registry import ScheduleNotApplicable, UnknownSchedule, entries, get, names, schedule
from .workloads import PRESETS, Workload, WorkloadError, parse_shape

__all__ = [
    "PRESETS",
    "ScheduleNotApplicable",
    "UnknownSchedule",
    "Workload",
    "WorkloadError",
    "entries",
    "get",
    "names",
    "parse_shape",
    "schedule",
]
