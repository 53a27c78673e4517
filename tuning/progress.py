"""Progress of a long loop (a search's trials, a portfolio's builds): a tqdm bar on a terminal,
and the rate over a moving window, which the loops' own lines print where there is no bar.

The rate is that of the last WINDOW steps, from the arrival before them (or the start): where a
batch of candidates lands at once after a long build, it says so (8 trials in 38 s: 12.6 a
minute), where a rate since the start climbed from 1.9 to 60.8 in that instant. Steps that land
together (within TOGETHER_S) are one arrival, all counted: a batch of 16 landing 22 s after the
last is 16 in 22 s, not 8 in the microseconds between its own steps. The ETA is the steps left
at that rate.
"""

from __future__ import annotations

import collections
import sys
import time

from tqdm import tqdm

WINDOW = 8  # steps the rate is taken over (at least: whole arrivals)
TOGETHER_S = 0.1  # steps this close to the one before landed together: one arrival


class Progress:
    """`total` steps of `unit`: step() after each. On a terminal (stderr a TTY; unless `bar`
    is False) a bar shows the count, the caller's postfix (best so far), the windowed rate and
    the ETA; elsewhere (logs, pipes, tests) `shown` is False and the caller prints its own
    lines, with rate() or pace()."""

    def __init__(self, total: int, desc: str, unit: str = "trial", bar: bool = True,
                 clock=time.monotonic):
        self.total, self.unit, self.clock = total, unit, clock
        self.done = 0
        # (time, steps) of the last arrivals, from the start's (its steps: 0)
        self.arrivals = collections.deque([(clock(), 0)], maxlen=WINDOW + 1)
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                        disable=not (bar and sys.stderr.isatty()), dynamic_ncols=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                   "[{elapsed}] {postfix}")

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn (else the caller's lines carry the progress)."""
        return not self.bar.disable

    def step(self, postfix: str = "") -> None:
        """One step done; `postfix` (e.g. the best so far) leads the bar's right side."""
        self.done += 1
        now = self.clock()
        last, steps = self.arrivals[-1]
        if steps and now - last <= TOGETHER_S:
            self.arrivals[-1] = (now, steps + 1)
        else:
            self.arrivals.append((now, 1))
        self.bar.set_postfix_str("; ".join(filter(None, (postfix, self.pace()))), refresh=False)
        self.bar.update(1)

    def rate(self) -> float:
        """Steps per minute over the last arrivals that hold WINDOW steps, from the arrival
        before them (0 before the first step)."""
        steps, since = 0, len(self.arrivals) - 1
        while since > 0 and steps < WINDOW:
            steps += self.arrivals[since][1]
            since -= 1
        span = self.arrivals[-1][0] - self.arrivals[since][0]
        return 60 * steps / span if span > 0 else 0.0

    def pace(self) -> str:
        """The rate and, where steps are left, the ETA at that rate: '12.6 trials/min, ETA
        1 min 5 s'."""
        rate = self.rate()
        text = f"{rate:.1f} {self.unit}s/min"
        left = self.total - self.done
        if rate > 0 and left > 0:
            text += f", ETA {duration(60 * left / rate)}"
        return text

    def counted(self, line: str) -> str:
        """One step done, said as `line` led by the count and followed by the pace:
        '[3/48] line (12.0 shapes/min, ETA 3 min 45 s)'."""
        self.step()
        return f"[{self.done}/{self.total}] {line} ({self.pace()})"

    def close(self) -> None:
        self.bar.close()


def duration(seconds: float) -> str:
    """'42 s', '3 min 5 s', '2 h 7 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
