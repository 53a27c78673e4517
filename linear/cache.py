"""The disk cache of linear layers' measured choices and their built kernels.

One entry per (layer shape, bucket, most rows, GPU, versions): a directory holding
manifest.json (the key, the chosen candidate, what every candidate measured) and, where the
choice is a TVM kernel, kernel.so (the compiled library with its cubin: loading needs no
compiler). An entry is written into a fresh directory beside its place and renamed there, so two
processes filling the cache at once never leave a torn entry: the first rename wins, the other
drops its copy. An entry that cannot be read is named, removed and rebuilt; an entry from
another GPU or version is never used, and one line says why. While a process measures entries,
it holds their locks (files under .locks): another process that needs the same entries (another
rank of the same model, another test worker) waits for them and loads them, rather than
measuring them a second time on a GPU the first is timing on.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Iterator

from schedules.errors import UsageError
from tuning.export import refuse_unusable_directory
from tuning.staging import staged

MANIFEST, LIBRARY, LOCKS = "manifest.json", "kernel.so", ".locks"
DIRECTORY_VARIABLE = "TVM_EXPLORER_CACHE"
SOURCES = ("schedules", "linear", os.path.join("tuning", "build.py"),
           os.path.join("tuning", "lowering.py"))  # the code a cached kernel came from


def default_root() -> str:
    """$TVM_EXPLORER_CACHE, else ~/.cache/tvm-explorer (XDG_CACHE_HOME where set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(DIRECTORY_VARIABLE) or os.path.join(base, "tvm-explorer")


def code_version() -> str:
    """A digest of the project code that builds the kernels: a cache entry made by other code
    (another checkout, an edited rung) is not this code's."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for source in SOURCES:
        path = os.path.join(root, source)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(folder, name) for folder, _, names in os.walk(path)
            for name in names if name.endswith(".py"))
        for file in files:
            digest.update(os.path.relpath(file, root).encode())
            with open(file, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:16]


class CorruptEntry(Exception):
    """A cache entry whose files are missing, unreadable or not what its key says."""


@dataclass(frozen=True)
class Entry:
    """A cache entry as read: its directory and manifest (manifest["choice"] is the chosen
    candidate's name, manifest["rung"] and ["knobs"] rebuild it)."""

    directory: str
    manifest: dict

    @property
    def library(self) -> str | None:
        """kernel.so's path, where the choice is a TVM kernel."""
        return os.path.join(self.directory, LIBRARY) if self.manifest["built"] else None


class Cache:
    """The entries under `root` (created on first write)."""

    def __init__(self, root: str | None = None):
        self.root = root or default_root()

    @staticmethod
    def _slug(key: dict) -> str:
        """The readable part of an entry's directory name: layer and bucket."""
        return f"{key['layer']}-{key['bucket']}".replace(" ", "-")

    def directory(self, key: dict) -> str:
        """Where the entry of `key` lives: its slug and a digest of the whole key."""
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return os.path.join(self.root, f"{self._slug(key)}-{digest}")

    def read(self, key: dict) -> Entry | None:
        """The entry of `key`, None where there is none; CorruptEntry where it cannot be used."""
        directory = self.directory(key)
        if not os.path.isdir(directory):
            return None
        path = os.path.join(directory, MANIFEST)
        try:
            with open(path) as f:
                manifest = json.load(f)
        except OSError as e:
            raise CorruptEntry(f"cannot read {path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise CorruptEntry(f"{path} is not JSON ({e.msg})") from None
        if not isinstance(manifest, dict) or manifest.get("key") != key \
                or not {"choice", "rung", "knobs", "built"} <= set(manifest):
            raise CorruptEntry(f"{path} is not the manifest of this entry")
        entry = Entry(directory, manifest)
        if entry.library and not os.path.isfile(entry.library):
            raise CorruptEntry(f"{entry.library} is missing")
        return entry

    def stale_reason(self, key: dict) -> str | None:
        """Why entries of the same layer and bucket made elsewhere do not serve `key` (another
        GPU, TVM or code version), in words; None where there are none."""
        if not os.path.isdir(self.root):
            return None
        slug = self._slug(key) + "-"
        for name in sorted(os.listdir(self.root)):
            if not name.startswith(slug):
                continue
            try:
                with open(os.path.join(self.root, name, MANIFEST)) as f:
                    other = json.load(f)["key"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            differs = [f"{field} {other.get(field)} (here {value})"
                       for field, value in key.items() if other.get(field) != value]
            if differs:
                return "its cached kernel was made with " + ", ".join(differs)
        return None

    @contextlib.contextmanager
    def locked(self, keys: list[dict], say: Callable[[str], None]) -> Iterator[None]:
        """Hold the lock of each key's entry while the block measures and writes them: flock on
        a file per entry under .locks, taken in sorted order (two processes never wait on each
        other), released when the block ends or the process dies. Says one line where another
        process holds one. A cache whose locks cannot be made is refused (UsageError) before
        anything is measured."""
        folder = os.path.join(self.root, LOCKS)
        names = sorted({os.path.basename(self.directory(key)) for key in keys})
        with contextlib.ExitStack() as held:
            try:
                os.makedirs(folder, exist_ok=True)
                locks = [held.enter_context(open(os.path.join(folder, name), "a"))
                         for name in names]
            except OSError as e:
                raise UsageError(f"the kernel cache {self.root} cannot be written "
                                 f"({e.strerror}): name a writable one (cache=Cache(path) "
                                 f"or ${DIRECTORY_VARIABLE})") from None
            waiting = False
            for name, lock in zip(names, locks):
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not waiting:
                        say(f"waiting for another process measuring {name} (and any others "
                            "it holds); then loading what it cached")
                        waiting = True
                    fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def remove(self, key: dict) -> None:
        shutil.rmtree(self.directory(key), ignore_errors=True)

    def write(self, key: dict, manifest: dict, library: Callable[[str], None] | None) -> Entry:
        """Write the entry of `key`: manifest.json, and kernel.so by `library(path)` where the
        choice is built. Another process's entry that landed first is kept (and returned)."""
        directory = self.directory(key)
        with staged(directory, ".entry-", first_wins=True) as staging:
            if library:
                library(os.path.join(staging, LIBRARY))
            with open(os.path.join(staging, MANIFEST), "w") as f:
                json.dump({**manifest, "key": key, "built": library is not None}, f, indent=2)
                f.write("\n")
        return Entry(directory, self.read(key).manifest)


def export_entries(directories: list[str], target: str) -> int:
    """Copy cache entries (their directories) into `target`, a new or empty directory, which
    then serves as a cache of its own (Cache(target)): written beside it and renamed, so that a
    failed export leaves nothing. Returns how many entries were copied."""
    refuse_unusable_directory(target)
    unique = sorted(set(directories))
    with staged(target, ".linear-export-", mode=0o755) as staging:
        for directory in unique:
            shutil.copytree(directory, os.path.join(staging, os.path.basename(directory)))
    return len(unique)
