"""A directory written whole or not at all: its files go into a fresh directory beside it, which
is renamed into place once they are all there, so that no reader ever sees a torn directory and
a failure leaves nothing behind. tuning/export.py writes a kernel's export this way, and
linear/cache.py its cache entries and their export.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def staged(target: str, prefix: str, *, mode: int | None = None, first_wins: bool = False,
           refused: Callable[[OSError], BaseException] | None = None) -> Iterator[str]:
    """Yield a fresh directory beside `target` (named `prefix`..., its parent made where
    missing) to write into; when the block ends, give it `mode` (mkdtemp makes it 0o700) and
    rename it to `target`, which replaces an empty directory and never a full one. Where the
    rename fails because `target` has become a directory meanwhile and `first_wins` is set,
    that one is kept and this copy dropped (two processes filling a cache: the first rename
    wins). An OSError making the staging directory or renaming it is raised as `refused(error)`
    where given. On any failure the staging directory is removed and the error raised."""
    parent = os.path.dirname(os.path.abspath(target))
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=prefix, dir=parent)
    except OSError as e:
        if refused is None:
            raise
        raise refused(e) from None
    try:
        yield staging
        if mode is not None:
            os.chmod(staging, mode)
        try:
            os.rename(staging, target)
        except OSError as e:
            if first_wins and os.path.isdir(target):
                shutil.rmtree(staging, ignore_errors=True)  # another process was first
            elif refused is None:
                raise
            else:
                raise refused(e) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
