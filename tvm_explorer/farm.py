"""The farm's entry point, which scripts/rpc-farm.sh runs: `python -m tvm_explorer.farm --key
KEY [--tracker HOST:PORT] [--gpus 0,1 | --servers N] ...` (tuning/farm.py: a tracker and a
server per GPU, kept up). Each server serves a search's candidates (tuning.farm) and a model's
linear layers (linear/farm.py: one (layer, bucket) tuned by the portfolio on the server's GPU).
It sits above both packages because `linear` sits above `tuning`: tuning's farm cannot import
linear's remote function, so this module hands it over."""

from __future__ import annotations

import sys

from linear import farm as linear_farm
from tuning import farm

ENTRY = "tvm_explorer.farm"  # this module, as each server is started again (python -m)


def remote_functions() -> dict:
    """The servers' remote functions besides tuning's own: linear's, by name (its worker
    process started now, before the server registers)."""
    return {linear_farm.TUNE: linear_farm.PairServer()}


def main(argv: list[str] | None = None) -> int:
    """The farm's command line (tuning.farm.main); its exit status."""
    return farm.main(argv, ENTRY, remote_functions)


if __name__ == "__main__":
    sys.exit(main())
