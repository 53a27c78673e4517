"""What an installed copy holds: the command, the public package, the committed records that
`best` reads (package data), and the test tools only in the `test` extra."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from schedules import Workload
from tuning import explore
from tuning.explore import SearchResults, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The project's wheel, built from a copy of the tree (so that nothing lands in it), with
    the setuptools installed here (no build isolation: no download)."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools installed")
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "runner.py", "README.md"):
        shutil.copy(os.path.join(ROOT, name), tree)
    # the packages, and reports/ for the one output the wheel ships (reports/tuning's records)
    for package in ("tvm_explorer", "cli", "schedules", "tuning", "reporting", "linear", "facts",
                    "reports"):
        shutil.copytree(os.path.join(ROOT, package), tree / package,
                        ignore=shutil.ignore_patterns("__pycache__", "ms-*", "*.png"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(tree)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_ships_the_records_best_reads_the_command_and_the_api(wheel):
    names = set(wheel.namelist())
    assert {"reports/tuning/autotvm-h100.jsonl", "cli/__init__.py", "tvm_explorer/__init__.py",
            "runner.py", "facts/__init__.py", "reporting/render.py"} <= names
    assert [n for n in names if n.startswith("reports/")] == ["reports/tuning/autotvm-h100.jsonl"]
    with open(explore.COMMITTED_RECORDS, "rb") as f:
        assert wheel.read("reports/tuning/autotvm-h100.jsonl") == f.read()
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "tvm-explorer = cli:main" in wheel.read(entry_points).decode()


def test_pytest_is_a_test_tool_not_a_dependency(wheel):
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in wheel.read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist: ")]
    testing = [line for line in requires if line.split()[1].startswith("pytest")]
    assert len(testing) == 2 and all('extra == "test"' in line for line in testing)
    assert any(line.startswith("Requires-Dist: tqdm") for line in requires)


def test_best_says_plainly_where_an_install_has_no_committed_records(monkeypatch, tmp_path):
    monkeypatch.setattr(explore, "COMMITTED_RECORDS", str(tmp_path / "autotvm-h100.jsonl"))
    monkeypatch.setattr(explore.measure, "gpu_present", lambda: False)
    said = []
    resolve(Workload("gemm", (1024, 512, 2048)), "best", SearchResults(), said.append)
    assert len(said) == 1 and said[0].startswith("best: v5k (no GPU here, and no records of this workload")
    assert "in no committed tuning records (this install has no " in said[0]
