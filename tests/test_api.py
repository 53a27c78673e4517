"""The public API (tvm_explorer): a newcomer's notebook in a few lines, with the package's names
only, printing nothing it did not ask for."""

import logging
import os
import subprocess
import sys

import pytest

import tvm_explorer as tx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NOTEBOOK = '''
import tvm_explorer as tx
wl = tx.Workload("gemm", (32, 32, 32))
v2, v3 = tx.build(wl, "v2"), tx.build(wl, "v3")
diff = tx.ir_diff(v2, v3, "v2", "v3")
found = tx.search(wl, "metaschedule", trials=2, work_dir=WORK_DIR, target="llvm")
kernel = tx.compile_kernel(wl, "best", check=False)
print("DIFF", "+++ v3 (lowered)" in diff and "shared" in diff)
print("CUDA", "__global__" in v3.source and "__global__" in tx.cuda_source(kernel))
print("SEARCH", found["status"], found["trials"])
'''


@pytest.mark.slow
def test_a_notebook_uses_the_public_package_only_and_prints_what_it_asks_for(tmp_path):
    """A fresh process (so nothing configured logging before): its whole output, at the file
    descriptors, is the notebook's own three lines."""
    code = NOTEBOOK.replace("WORK_DIR", repr(str(tmp_path / "ms")))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["DIFF True", "CUDA True", "SEARCH ok 2"]
    assert done.stderr == ""


def test_what_a_library_call_reports_goes_to_logging(caplog):
    """`best` says which schedule it picked and why: a log record, not a print."""
    with caplog.at_level(logging.INFO, logger="tvm_explorer"):
        built = tx.build(tx.Workload("gemv", (256, 256), "float16"), "best")
    assert "__global__" in built.source
    assert "T.prim_func" in tx.lower(tx.Workload("gemm", (64, 64, 64)), "v3")
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("best: ")]
