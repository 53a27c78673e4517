"""What to compute (workloads) and how to schedule it (the registered ladders)."""

# importing registers the schedules, each ladder in this order
from . import dlight, gemm, tensorcore, v8, gemv, nvfp4  # noqa: F401
from .errors import (ExplorerError, RecordsError, ScheduleNotApplicable, SearchFailed,
                     UnknownSchedule, UsageError, WorkloadError)
from .registry import entries, get, names, schedule
from .workloads import PRESETS, Workload, parse_shape

__all__ = [
    "ExplorerError",
    "PRESETS",
    "RecordsError",
    "SearchFailed",
    "UsageError",
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
