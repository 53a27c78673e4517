"""One run on the GPU: each measurement of a workload becomes a record of the same run.

Records of one run share run_id, date, GPU facts and timing method, so a report can put them
side by side as ratios.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone

import tvm

from facts import SCHEMA
from facts.record import Record
from schedules.workloads import Workload

from . import measure


@dataclass
class Run:
    """Identity and environment shared by every record of one run."""

    flush: str = "read"  # what runs before each timed launch: facts.FLUSHES
    facts: dict = field(default_factory=measure.device_facts)
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def run_id(self) -> str:
        return f"{self.started:%Y%m%dT%H%M%SZ}-{os.getpid()}"

    def record(self, wl: Workload | None, schedule: str, kind: str, params: dict,
               **fields) -> Record:
        """A record of this run: `schedule` (of `kind`, with `params`) on `wl` (None: a
        ceiling, which names its own op), where and when it ran, and `fields`, each a field of
        Record: a name the type lacks, or one given twice, is a TypeError here, not a new key
        in the records file."""
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        workload = wl.record_fields() if wl is not None else {}
        return Record(run_id=self.run_id, date=when, schedule=schedule, kind=kind, params=params,
                      gpu=self.facts["gpu"], driver=self.facts["driver"], arch=self.facts["arch"],
                      tvm=tvm.__version__, flush=self.flush, schema=SCHEMA, **workload, **fields)


def _guarded(measure_fn):
    """A kernel that crashes becomes a failed measurement, not a crashed run."""
    try:
        return measure_fn()
    except Exception as e:  # noqa: BLE001  (any failure of a candidate is recorded)
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        return {"status": "failed", "error": detail}


def _checked_and_timed(run: Run, wl: Workload, runner_of, tolerance: float, seed: int) -> dict:
    """The fields of a measurement record of the launch `runner_of(inputs)` makes on random
    inputs: checked against float64 and, if correct, timed; a crash becomes a failure."""

    def go():
        inputs = measure.random_inputs(wl, seed)
        return measure.check_and_time(wl, runner_of(inputs), inputs, tolerance, run.flush)

    return _guarded(go)


def measure_tvm(run: Run, wl: Workload, schedule: str, kind: str, params: dict, executable,
                seed: int = 0, **extra) -> Record:
    """Check a built TVM kernel against float64 and, if correct, time it."""
    runner_of = lambda inputs: measure.tvm_runner(  # noqa: E731
        executable, wl, inputs, measure.poisoned_output(wl))
    return run.record(wl, schedule, kind, params, **extra,
                      **_checked_and_timed(run, wl, runner_of, measure.tolerance(wl), seed))


def measure_cublas(run: Run, wl: Workload, tf32: bool = False, fast_accum: bool = False,
                   seed: int = 0) -> Record:
    """torch (cuBLAS) on the same inputs and harness, writing the workload's output dtype (its
    params name the call); TF32 and fp8's fast accumulation are rows of their own. nvfp4: on B
    and x dequantized before timing."""
    runner_of = lambda inputs: measure.cublas_runner(wl, inputs, tf32, fast_accum)  # noqa: E731
    name = "cublas-tf32" if tf32 else "cublas-fast-accum" if fast_accum else "cublas"
    params = {"tf32": tf32, "call": measure.cublas_call(wl, fast_accum)}
    return run.record(wl, name, "baseline", params,
                      **_checked_and_timed(run, wl, runner_of, measure.tolerance(wl, tf32), seed))


def measure_dequantizing(run: Run, wl: Workload, seed: int = 0) -> Record:
    """nvfp4 or block-scaled fp8 as a user without a fused kernel runs it: B and x dequantized
    to float16, then torch's mv / bmm (`torch-dequant-mv`, `torch-dequant-bmm`), or A and B
    times their block scales in bfloat16, then torch's mm (`torch-dequant-mm`), both steps in
    the timed call."""
    runner_of = lambda inputs: measure.dequantizing_runner(wl, inputs)  # noqa: E731
    return run.record(wl, f"torch-dequant-{measure.TORCH_CALLS[wl.op]}", "baseline",
                      {"call": measure.dequantizing_call(wl)},
                      **_checked_and_timed(run, wl, runner_of, measure.tolerance(wl), seed))


def measure_triton(run: Run, wl: Workload, seed: int = 0) -> Record | None:
    """The TileLang seed's Triton GEMV on the same inputs and harness; None without triton."""
    try:
        from . import triton_gemv  # lazy: triton is installed on GPU machines only
    except ImportError:
        return None

    runner_of = lambda inputs: triton_gemv.runner(  # noqa: E731
        wl, inputs, measure.poisoned_output(wl))
    return run.record(wl, "triton", "baseline", {},
                      **_checked_and_timed(run, wl, runner_of, measure.tolerance(wl), seed))


def measure_baselines(run: Run, wl: Workload) -> list[Record]:
    """The references measured next to every TVM kernel: cuBLAS (and TF32 for fp32 GEMM, fast
    accumulation for fp8 scaled per tensor or by rows), and the seed's Triton GEMV where
    triton is installed; for nvfp4, cuBLAS on the dequantized operands and the
    dequantize-then-multiply a user would run (no Triton, no TF32); for block-scaled fp8,
    cuBLAS's block-scaled _scaled_mm and the dequantize-then-bfloat16-GEMM path."""
    measured = [measure_cublas(run, wl)]
    if wl.op == "gemm" and wl.dtype == "float32":
        measured.append(measure_cublas(run, wl, tf32=True))
    if wl.is_fp8 and not wl.block_scaled:  # (cuBLAS's block scales take no fast accumulation)
        measured.append(measure_cublas(run, wl, fast_accum=True))
    if wl.is_nvfp4 or wl.block_scaled:
        measured.append(measure_dequantizing(run, wl))
    elif wl.op != "gemm":
        measured.append(measure_triton(run, wl))
    return [m for m in measured if m is not None]


def _bandwidth_ceiling(run: Run, what: str, nbytes: int, measured: tuple) -> Record:
    """The record of a bandwidth ceiling of this run, `measured` as (GB/s, Timing) over `nbytes`:
    schedule `device-<what>`, op `<what>`, its GB/s in `<what>_gbps`."""
    gbps, timing = measured
    return run.record(None, f"device-{what}", "ceiling", {"bytes": nbytes}, op=what,
                      status="ok", **{f"{what}_gbps": gbps}, timing=timing)


def measure_copy(run: Run, nbytes: int = 1 << 30) -> Record:
    """The copy-bandwidth ceiling of this run: bytes read plus bytes written."""
    return _bandwidth_ceiling(run, "copy", nbytes,
                              measure.copy_bandwidth_gbps(nbytes, flush=run.flush))


def measure_read(run: Run, nbytes: int = 1 << 30) -> Record:
    """The read-bandwidth ceiling of this run (a sum over a buffer): what a GEMV, which reads
    its weights and writes next to nothing, can reach."""
    return _bandwidth_ceiling(run, "read", nbytes,
                              measure.read_bandwidth_gbps(nbytes, flush=run.flush))


COMPUTE_SIZE = 8192  # M = N = K of the GEMM whose cuBLAS rate is a run's compute ceiling


def measure_compute(run: Run, dtype: str, size: int = COMPUTE_SIZE) -> Record:
    """The compute ceiling of this run for inputs of `dtype`: cuBLAS on a size^3 GEMM, float32
    with TF32 off, 16-bit inputs with the float32 output that the GEMM rungs write; the roofline's
    flat roof. A rate measured here, never the datasheet's peak."""
    wl = Workload("gemm", (size, size, size), dtype, "float32")
    tflops, timing = measure.gemm_tflops(wl, flush=run.flush)
    params = {"size": size, "call": measure.cublas_call(wl)}
    return run.record(None, "device-compute", "ceiling", params, op="compute", dtype=dtype,
                      status="ok", compute_tflops=tflops, timing=timing)


def measure_ceilings(run: Run, wl: Workload) -> list[Record]:
    """The ceilings a run of `wl` is read against: the copy bandwidth; for GEMVs the read
    bandwidth; the compute ceiling in the input dtype. nvfp4 runs get no compute ceiling: no
    cuBLAS GEMM takes nvfp4 (a Workload refuses it), and float16's rate would be another dtype's
    roof; their reports say it was not measured."""
    ceilings = [measure_copy(run)]
    if wl.op != "gemm":
        ceilings.append(measure_read(run))
    if not wl.is_nvfp4:
        ceilings.append(measure_compute(run, wl.dtype))
    return ceilings
