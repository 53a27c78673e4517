"""What a measurement record says about how it was taken, read both by tuning/ (which measures
and writes the records) and by reporting/ (which renders them), so that neither package imports
the other for it: the flushes before a timed launch, the search candidates' timing budget, how
nvfp4's inputs are drawn, the cards' datasheet peaks, the spills in a kernel's nvcc counts, the
check that a path the run writes to can be written, and the records' schema (`migrated`).
"""

from __future__ import annotations

import os
import tempfile

from schedules.errors import RecordsError
from schedules.workloads import FP8

# What runs on the GPU before each timed launch (--flush). Both flushes touch a buffer well over
# any L2 so far (~85 us of GPU work on an H100). `read` leaves L2 clean: the kernel pays only
# for its own traffic. `write` is what Triton's and TileLang's do_bench do (zeroing 256 MB): it
# leaves L2 full of dirty lines whose write-back is billed to the kernel under test (~50 MB of
# extra DRAM traffic on an H100; 10-12% on bandwidth-bound GEMVs), so numbers can be set beside
# figures published with do_bench. `none` keeps L2 warm (a GPU sleep instead).
FLUSHES = {
    "read": "an L2 flush (a 256 MB read)",
    "write": "an L2 flush (a 256 MB write, as do_bench's)",
    "none": "a GPU sleep (L2 stays warm)",
}


# The measurement records' schema. 1 (no `schema` field): what ran before each timed launch is
# `flush` (read, write, none) or, in records from before --flush, the bool `flush_l2` (true: a
# read), or neither (a read). 2: `flush` always, and `schema`.
SCHEMA = 2


def migrated(record: dict) -> dict:
    """A measurement record in schema SCHEMA: one of schema 1 gets `flush` from `flush_l2`
    (true or absent: a read), which it loses."""
    if record.get("schema") == SCHEMA:
        return record
    flush = record.get("flush") or ("read" if record.get("flush_l2", True) else "none")
    return {**{k: v for k, v in record.items() if k != "flush_l2"}, "flush": flush,
            "schema": SCHEMA}


SEARCH_BUDGET_MS = 300.0  # timing budget per search candidate; a chosen schedule gets measure.BUDGET_MS

SCALE_EXPONENTS = (-3.0, 1.0)  # nvfp4's random scales: 2^u, u uniform in this range
NVFP4_INPUTS = (f"nvfp4: uniformly random bytes of codes (every code occurs), scales 2^u with u "
                f"uniform in [{SCALE_EXPONENTS[0]:g}, {SCALE_EXPONENTS[1]:g}) rounded to e4m3")

# Dense peak rates at boost clock from NVIDIA's datasheets (TFLOP/s): CUDA-core fp32, tensor-core
# TF32, tensor-core fp16/bf16 and fp8 with fp32 accumulation. Matched by a substring of the GPU
# name.
SPEC_PEAK_TFLOPS = {
    "H100 80GB HBM3": {"float32": 66.9, "tf32": 494.7, "float16": 989.4, "bfloat16": 989.4,
                       FP8: 1978.9},
    "H200": {"float32": 66.9, "tf32": 494.7, "float16": 989.4, "bfloat16": 989.4, FP8: 1978.9},
    "H100 PCIe": {"float32": 51.2, "tf32": 378.0, "float16": 756.5, "bfloat16": 756.5,
                  FP8: 1513.0},
}


def spec_peaks(gpu_name: str) -> dict | None:
    """The datasheet peaks of the card whose name holds one of SPEC_PEAK_TFLOPS's keys; None
    for any other card."""
    return next((p for key, p in SPEC_PEAK_TFLOPS.items() if key in gpu_name), None)


def spilled_bytes(resources: dict | None) -> dict[str, int]:
    """Bytes each kernel of nvcc's resource usage spills to local memory (stores plus loads),
    for the kernels that spill."""
    spilled = {kernel: usage.get("spill_stores", 0) + usage.get("spill_loads", 0)
               for kernel, usage in (resources or {}).items()}
    return {kernel: n for kernel, n in spilled.items() if n}


def check_writable(path: str, what: str, directory: bool = False) -> None:
    """Refuse, before any work, a `path` that a run could not write (a file appended to, or
    with `directory`, a directory written into): one under a file, a directory where a file
    is meant or the other way round, or a place this user or its filesystem will not let be
    written (tried with a temporary file, which is removed, or by opening an existing file
    for appending, which changes nothing)."""
    given, path = path, os.path.abspath(path)
    if os.path.exists(path) and os.path.isdir(path) != directory:
        raise RecordsError(f"{what} {given} is {'not ' if directory else ''}a directory")
    probe = path if os.path.exists(path) and not directory else None
    parent = path if directory and os.path.isdir(path) else os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise RecordsError(f"cannot write {what} {given}: {parent} is a file, not a directory")
    try:
        if probe:
            open(probe, "a").close()
        else:
            tempfile.TemporaryFile(dir=parent).close()
    except OSError as e:
        raise RecordsError(f"cannot write {what} {given}: {e.strerror or e}") from e
