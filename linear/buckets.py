"""Buckets of M: the ranges of rows (tokens) that one kernel of a linear layer serves.

A model's linear layers see every M: decode brings 1 to a few dozen rows, prefill hundreds to
thousands. Each bucket gets one kernel built for M as a size given at each call, chosen by
measurement at a few representative Ms of the bucket (`Bucket.probes`).
"""

from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass

from schedules.errors import UsageError


@dataclass(frozen=True)
class Bucket:
    """The rows first..last (inclusive) of a layer's input; last is None for the open bucket
    that takes every M from first on."""

    first: int
    last: int | None

    @property
    def one_m(self) -> bool:
        """Whether the bucket holds one M: its kernels are then built for that number."""
        return self.first == self.last

    def label(self) -> str:
        return f"M={self.first}" if self.one_m else \
            f"M={self.first}-{self.last if self.last is not None else ''}"

    def most(self, max_tokens: int) -> int:
        """The most rows a call of this bucket brings (the open bucket: max_tokens)."""
        return self.last if self.last is not None else max(self.first, max_tokens)

    def probes(self, max_tokens: int) -> tuple[int, ...]:
        """The Ms a portfolio times a kernel at: the bucket's first and last M and, where they
        are far apart, one between them (their geometric mean)."""
        first, last = self.first, self.most(max_tokens)
        middle = round(math.sqrt(first * last))
        return tuple(sorted({first, last} | ({middle} if last >= 3 * first else set())))


# Decode batches (1; 2-16; 17-64), then prefill in factors of four.
DEFAULT_EDGES = (1, 2, 17, 65, 257, 1025)


def buckets_from_edges(edges: tuple[int, ...] = DEFAULT_EDGES) -> tuple[Bucket, ...]:
    """Buckets starting at each of `edges` (increasing, from 1), the last one open."""
    if not edges or edges[0] != 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise UsageError(f"bucket edges start at 1 and increase, not {list(edges)}")
    lasts = [b - 1 for b in edges[1:]] + [None]
    return tuple(Bucket(first, last) for first, last in zip(edges, lasts))


def buckets_from_text(text: str) -> tuple[Bucket, ...]:
    """Buckets from their edges written as a command line takes them: '1,2,17,65'."""
    try:
        edges = tuple(int(edge) for edge in text.split(","))
    except ValueError:
        raise UsageError(f"--edges takes the buckets' first Ms as whole numbers separated by "
                         f"commas (e.g. 1,2,17,65), not '{text}'") from None
    return buckets_from_edges(edges)


def token_count(max_tokens, said_as: str = "max_tokens") -> int:
    """max_tokens, the most rows a call brings (it sizes the open bucket), checked: a whole
    number of rows, at least 1, else refused in one line naming it as the caller's user does
    (`said_as`: the keyword, or the command line's flag)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) \
            or max_tokens < 1:
        raise UsageError(f"{said_as} is a whole number of rows, at least 1, not {max_tokens!r}")
    return int(max_tokens)


def layer_buckets(buckets) -> tuple[Bucket, ...]:
    """A layer's buckets as `Linear(buckets=...)` takes them: None (the default's), Buckets
    that cover every M from 1 (each starting where the one before ends, the last open), or
    their first Ms (edges, as buckets_from_edges takes them). Anything else is refused in one
    line: a hole or an overlap would send some M to a kernel built for other rows."""
    if buckets is None:
        return buckets_from_edges()
    items = tuple(buckets) if isinstance(buckets, (tuple, list)) else ()
    if items and all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in items):
        return buckets_from_edges(tuple(int(b) for b in items))
    if not items or not all(isinstance(b, Bucket) for b in items):
        raise UsageError(f"buckets are Buckets covering every M from 1 (e.g. "
                         f"buckets_from_edges((1, 2, 17))) or their first Ms, not {buckets!r}")
    starts = [1] + [b.last + 1 if b.last is not None else None for b in items[:-1]]
    if items[-1].last is not None or any(
            b.first != start or b.last is not None and b.last < b.first
            for b, start in zip(items, starts)):
        raise UsageError("buckets cover every M from 1, each starting where the one before "
                         "ends and the last open (last=None), not "
                         + ", ".join(b.label() for b in items))
    return items


class BucketTable:
    """Which bucket serves M, in one lookup: a list by M up to the last bounded bucket, then the
    open bucket."""

    def __init__(self, buckets: tuple[Bucket, ...]):
        self.buckets = buckets
        self._firsts = [b.first for b in buckets]

    def index(self, m: int) -> int:
        """The position in `buckets` of the bucket that takes `m` rows (m >= 1)."""
        return bisect.bisect_right(self._firsts, m) - 1
