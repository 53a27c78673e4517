"""What a counters record's numbers are and how two of them compare, read by tuning.explain
(which profiles kernels with Nsight Compute and records the counters) and by reporting (whose
ladder tables say why each rung is faster): the fixed set of counters (METRICS), what each one
stands for (its role), the level under which a change of it is noise (its floor), and the
change between two schedules' counters that says most (`main_change`).

Roles: a rung's speed shows in the `speed` counters (time, and the SM's and DRAM's throughput,
which a faster kernel raises whatever made it faster); the `cause` counters say what the
hardware did differently (instructions issued, bytes moved, occupancy, the pipes' use, bank
conflicts), so the main change is looked for among them; `launch` counters are what the build
fixed (registers, shared memory), shown beside the others but no change of activity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPEED, CAUSE, LAUNCH = "speed", "cause", "launch"

# Floors, by kind: a count under its floor on both sides of a change is noise, and a count under
# it counts as the floor (so that 0 -> 0.1% is no change, and 0 -> a real count is a finite one).
BYTES_FLOOR = 0.10  # bytes: this share of the workload's least traffic (Workload.min_bytes);
# a C that L2 holds, written back after the kernel or not, moves DRAM bytes by less
POINTS_FLOOR = 10.0  # percentages (occupancy, hit rate, a pipe's use): points
CYCLES_FLOOR = 0.05  # bank conflicts: this share of the SMs' cycles (each conflict costs one)


@dataclass(frozen=True)
class Metric:
    """One counter: its key in a record, the ncu metric it is read from, its unit, how the
    values of a call's several kernels combine ('sum', 'max', or 'weighted': by duration), what
    a change of it says, its role (SPEED, CAUSE, LAUNCH) and its floor's kind (None, 'bytes',
    'points' or 'cycles')."""

    key: str
    ncu: str
    unit: str
    combine: str
    meaning: str
    role: str = CAUSE
    floor: str | None = None


# The fixed set; tensor_pipe is the busiest of the tensor pipes ncu names on this GPU (mma.sync
# runs on hmma's, wgmma on gmma's), read through a regex so that the set works on both.
TENSOR_PIPES = r"regex:sm__pipe_tensor_op_.*_cycles_active\.avg\.pct_of_peak_sustained_active"
METRICS = (
    Metric("duration_ns", "gpu__time_duration.sum", "ns", "sum", "time on the GPU", SPEED),
    Metric("sm_pct", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "weighted",
           "SM throughput, % of peak", SPEED, "points"),
    Metric("dram_pct", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "weighted",
           "DRAM throughput, % of peak", SPEED, "points"),
    Metric("sm_cycles", "sm__cycles_elapsed.sum", "", "sum", "cycles, summed over the SMs",
           SPEED),
    Metric("inst_executed", "smsp__inst_executed.sum", "", "sum", "warp instructions executed"),
    Metric("global_load_requests", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "", "sum",
           "global load requests (a warp's load instruction each)"),
    Metric("l2_bytes", "lts__t_bytes.sum", "B", "sum", "bytes through L2 (every client)",
           floor="bytes"),
    Metric("dram_read_bytes", "dram__bytes_read.sum", "B", "sum", "bytes read from DRAM",
           floor="bytes"),
    Metric("dram_write_bytes", "dram__bytes_write.sum", "B", "sum", "bytes written to DRAM",
           floor="bytes"),
    Metric("l2_hit_pct", "lts__t_sector_hit_rate.pct", "%", "weighted", "L2 hit rate",
           floor="points"),
    Metric("tensor_pipe_pct", TENSOR_PIPES, "%", "weighted",
           "tensor pipe busy, % of active cycles", floor="points"),
    Metric("fma_pipe_pct", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "%",
           "weighted", "FMA pipe busy, % of active cycles", floor="points"),
    Metric("occupancy_pct", "sm__warps_active.avg.pct_of_peak_sustained_active", "%",
           "weighted", "achieved occupancy", floor="points"),
    Metric("registers", "launch__registers_per_thread", "", "max", "registers per thread",
           LAUNCH),
    Metric("static_shared_bytes", "launch__shared_mem_per_block_static", "B", "max",
           "static shared memory per block", LAUNCH),
    Metric("dynamic_shared_bytes", "launch__shared_mem_per_block_dynamic", "B", "max",
           "dynamic shared memory per block", LAUNCH),
    Metric("bank_conflicts_ld", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "",
           "sum", "shared-memory bank conflicts on loads", floor="cycles"),
    Metric("bank_conflicts_st", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "",
           "sum", "shared-memory bank conflicts on stores", floor="cycles"),
)
BY_KEY = {m.key: m for m in METRICS}

LARGE = 0.10  # a relative change this large (or a count from or to zero) gets a sentence


LONG = 1e7  # counts from here on are written to 3 significant digits (4.1e+09)


def fmt_count(value: float) -> str:
    """A count as an integer where it is one and shorter than LONG, else to 3 significant
    digits."""
    return f"{int(value)}" if float(value).is_integer() and abs(value) < LONG \
        else f"{value:.3g}"


@dataclass(frozen=True)
class Change:
    """A count that differs between the old and the new schedule; `floor` is the level under
    which the count is noise (0: none)."""

    name: str
    old: float
    new: float
    floor: float = 0.0

    @property
    def relative(self) -> float:
        """new/old - 1 of the floored counts; infinite where a count appears from nothing."""
        old, new = max(self.old, self.floor), max(self.new, self.floor)
        if old == 0:
            return math.inf if new else 0.0
        return new / old - 1

    @property
    def size(self) -> float:
        """How large the change is, either way: |log(new/old)| of the floored counts (a
        halving and a doubling are alike); infinite from or to nothing."""
        old, new = max(self.old, self.floor), max(self.new, self.floor)
        return math.inf if not old or not new else abs(math.log(new / old))

    @property
    def direction(self) -> int:
        return 1 if self.new > self.old else -1

    def words(self) -> str:
        """'dram_read_bytes 4194304 -> 262144 (-94%)'."""
        change = "new" if math.isinf(self.relative) else f"{self.relative:+.0%}"
        return f"{self.name} {fmt_count(self.old)} -> {fmt_count(self.new)} ({change})"


def floors(counters: dict, min_bytes: int) -> dict[str, float]:
    """Each floored metric's floor for a call whose counters are `counters` (its sm_cycles for
    the bank conflicts') on a workload that moves at least `min_bytes`."""
    levels = {"bytes": BYTES_FLOOR * min_bytes, "points": POINTS_FLOOR,
              "cycles": CYCLES_FLOOR * (counters.get("sm_cycles") or 0)}
    return {m.key: levels[m.floor] for m in METRICS if m.floor}


def changes(old: dict, new: dict, floor: dict[str, float] | None = None) -> list[Change]:
    """The numeric counts in both `old` and `new` that differ (beyond `floor`'s levels, where
    given), largest first (`Change.size`); the instruction total left out, its classes say
    where it moved."""
    floor = floor or {}
    both = [Change(k, old[k], new[k], floor.get(k, 0.0)) for k in old
            if k in new and k != "total"
            and isinstance(old[k], (int, float)) and isinstance(new[k], (int, float))
            and not isinstance(old[k], bool) and old[k] != new[k]]
    return sorted((c for c in both if c.relative),
                  key=lambda c: (-c.size, -abs(c.new - c.old)))


def counter_changes(old: dict, new: dict, min_bytes: int) -> list[Change]:
    """The changes of METRICS between two calls' counters, floored (the larger of the two
    calls' floors), largest first."""
    low = [floors(c, min_bytes) for c in (old, new)]
    metrics = {m.key for m in METRICS}
    return changes({k: v for k, v in old.items() if k in metrics and v is not None},
                   {k: v for k, v in new.items() if k in metrics and v is not None},
                   {k: max(low[0][k], low[1][k]) for k in low[0]})


def main_change(old: dict, new: dict, min_bytes: int) -> Change | None:
    """The largest change among the CAUSE counters from `old` to `new` (`counter_changes`), or
    None where none changed by LARGE: what the hardware did differently."""
    return main_of(counter_changes(old, new, min_bytes))


def main_of(changes: list[Change]) -> Change | None:
    """The first of `changes` (largest first, as counter_changes sorts them) that is a CAUSE
    counter's and changed by LARGE; None where none did."""
    return next((c for c in changes
                 if BY_KEY[c.name].role == CAUSE and abs(c.relative) >= LARGE), None)
