"""Stopping a farm a test started (scripts/rpc-farm.sh in a session of its own)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess


def stop_farm(proc: subprocess.Popen, log=None) -> None:
    """A farm stopped as Ctrl-C stops it, its servers too, then its process group killed; then
    every server its log (`log`, where given) names still serving, with the processes it
    started. Its servers run in sessions of their own, so killing the farm's group alone (or a
    test killing the farm outright) leaves them serving: registered again with a later farm's
    tracker on the same port, they would take that farm's work and write to this farm's log."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pid in _server_pids(log.read_text() if log is not None else ""):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _server_pids(said: str) -> list[int]:
    """The pids of the servers a farm's log says serve, those still running a farm server."""
    pids = [int(pid) for pid in re.findall(r"\] serving on port \d+, pid (\d+)", said)]
    return [pid for pid in pids if b"--serve" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    """The command line of process `pid` (empty where it has gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
