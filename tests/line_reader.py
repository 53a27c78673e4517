"""A process's output read line by line on a thread of its own, for tests that wait for a line
with a time limit. Waiting with select on the pipe and then calling readline misses lines:
readline reads what the pipe holds into its buffer, and a line left there is one select never
reports again (a test then waits out its limit for a line already read)."""

from __future__ import annotations

import queue
import threading
import time
from typing import IO


class Lines:
    """The lines of `stream` as they come."""

    def __init__(self, stream: IO[str]):
        self._queue: queue.Queue[str | None] = queue.Queue()  # None: the stream has ended
        self.ended = False
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def next(self, seconds: float) -> str | None:
        """The next line (without its newline; "" for a blank one), or None where none came
        within `seconds` or the stream has ended (`ended`)."""
        try:
            line = self._queue.get(timeout=seconds)
        except queue.Empty:
            return None
        if line is None:
            self.ended = True
            return None
        return line.rstrip("\n")

    def until(self, words: str, seconds: float) -> list[str]:
        """The lines read until one holding `words`, that one last, within `seconds`; an
        AssertionError naming the last of them where it did not come (or the stream ended)."""
        deadline, said = time.monotonic() + seconds, []
        while not said or words not in said[-1]:
            line = self.next(max(0.0, deadline - time.monotonic()))
            assert line is not None, (f"no line holding {words!r} within {seconds} s"
                                      f"{' (the stream ended)' if self.ended else ''}; "
                                      f"said: {said[-5:]}")
            said.append(line)
        return said
