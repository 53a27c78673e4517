"""v8's knobs as one frozen value, which the refusals check and the plan is built from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """v8's knobs, as the rung's signature names them."""

    block_m: int
    block_n: int
    stages: int
    group_m: int
    split_k: int
    split_tail: bool
    tma_store: bool
    cluster_m: int
    cluster_n: int
    pingpong: bool
    promote_k: int | None = None  # fp8: K elements between promotions of wgmma's sums
    promote_overlap: int | None = None  # fp8: runs of K blocks, each promoted under the next's
    promote_halves: bool = False  # fp8: a run's promotions by halves of the columns, not blocks
    swap_ab: bool = False  # C^T = B A^T: B's rows (nt) on the tile's rows, A's on its columns
