"""Golden TVMScript of the GEMM seed rungs (naive, v1, v2, v3): on a small fixed workload with
their default knobs, each scheduled module must be structurally equal to the one committed in
tests/golden/. A schedule (or TVM) that changes what a rung produces fails here, with a message
that says how to regenerate the files once the change is intended."""

import os
from pathlib import Path

import pytest
import tvm

import schedules
from schedules import Workload

GOLDEN = Path(__file__).parent / "golden"
WORKLOAD = Workload("gemm", (64, 64, 64))
REGENERATE = "UPDATE_GOLDEN=1 python3 -m pytest tests/test_golden.py"


@pytest.mark.parametrize("name", ["naive", "v1", "v2", "v3"])
def test_seed_rung_schedules_to_its_golden_module(name, target):
    scheduled = schedules.get("gemm", name).apply(WORKLOAD, target)
    path = GOLDEN / f"gemm-{name}.tvmscript"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(f"# {name} on {WORKLOAD.label()}, default knobs. Regenerate: {REGENERATE}\n"
                        + scheduled.script() + "\n")
    how = f"to take the rung as it schedules now, run `{REGENERATE}` and review the diff"
    assert path.exists(), f"{path} is missing: {how}"
    try:
        tvm.ir.assert_structural_equal(scheduled, tvm.script.from_source(path.read_text()))
    except ValueError as mismatch:
        pytest.fail(f"{name} on {WORKLOAD.label()} no longer schedules to {path}; {how}.\n"
                    f"{mismatch}")
