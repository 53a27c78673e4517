"""The project's errors: one base class, caught once by the command line.

Each says what is wrong in words a user can act on; the command line prints it as one line and
exits with status 2 (bad input) or 1 (a run that could not produce what was asked for).
"""


class ExplorerError(Exception):
    """Anything the project refuses or cannot do, with the reason as its message."""

    exit_status = 2


class UsageError(ExplorerError):
    """Settings that do not fit together (flags, knobs, addresses)."""


class WorkloadError(ExplorerError):
    """A workload that cannot exist: bad op, shape, dtype or layout."""


class ScheduleError(ExplorerError):
    """A schedule that is unknown, or that cannot handle this workload or knob setting."""


class UnknownSchedule(ScheduleError):
    """No schedule (or op) of that name."""


class ScheduleNotApplicable(ScheduleError):
    """This schedule does not handle this workload (or knob setting); the message says why."""


class RecordsError(ExplorerError):
    """A records file, database or work dir that cannot be used as asked."""


class SearchFailed(ExplorerError):
    """A search that ran but measured no correct candidate."""

    exit_status = 1


class BuildFailed(ExplorerError):
    """A schedule that applied but whose module did not lower, compile or assemble."""

    exit_status = 1


class KernelFailed(ExplorerError):
    """A kernel that built but failed its check against float64 (or crashed) on the GPU."""

    exit_status = 1


class FarmGone(ExplorerError):
    """A search's RPC farm that went away mid-search: its tracker, or every server under its
    key. What was measured before is kept."""

    exit_status = 1
