"""The import layering (issue 50 item 2): import-linter's contracts in pyproject.toml, kept, and
covering every package the project ships, so that a new package or a new import loop fails
here, in the CPU tier, rather than in review."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_every_import_contract_is_kept():
    """lint-imports (the test extra's import-linter, next to this Python) over the tree: it
    exits 0 only where every contract is kept."""
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_contracts_cover_every_top_level_package_the_wheel_ships():
    """A package outside root_packages would escape every contract, and the top-level layers
    must name each root package once."""
    project = _pyproject()
    shipped = {p for p in project["tool"]["setuptools"]["packages"] if "." not in p}
    linter = project["tool"]["importlinter"]
    assert set(linter["root_packages"]) == shipped
    (top,) = [c for c in linter["contracts"] if c["type"] == "layers" and "containers" not in c]
    assert sorted(top["layers"]) == sorted(shipped)
