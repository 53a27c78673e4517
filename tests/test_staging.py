"""tuning/staging.py's `staged`, the write-then-rename that the kernel export, the linear cache's
entries and their export share: a directory lands whole or not at all."""

from __future__ import annotations

import os
import stat

import pytest

from tuning.staging import staged


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_files_land_whole_with_the_mode_asked(tmp_path):
    target = tmp_path / "new" / "out"  # its parent is made
    with staged(str(target), ".x-", mode=0o755) as staging:
        assert os.path.dirname(staging) == str(tmp_path / "new") and not target.exists()
        (tmp_path / "new" / os.path.basename(staging) / "a").write_text("a")
    assert (target / "a").read_text() == "a" and _mode(target) == 0o755
    assert os.listdir(tmp_path / "new") == ["out"]


def test_without_a_mode_the_directory_stays_private(tmp_path):
    with staged(str(tmp_path / "out"), ".x-"):
        pass
    assert _mode(tmp_path / "out") == 0o700


def _another_process_lands_first(target):
    target.mkdir()
    (target / "theirs").write_text("theirs")


def test_the_first_rename_wins_and_the_late_copy_is_dropped(tmp_path):
    target = tmp_path / "entry"
    with staged(str(target), ".x-", first_wins=True) as staging:
        open(os.path.join(staging, "mine"), "w").close()
        _another_process_lands_first(target)
    assert os.listdir(tmp_path) == ["entry"] and os.listdir(target) == ["theirs"]


@pytest.mark.parametrize("refused", [None, lambda e: ValueError(f"refused: {e.strerror}")])
def test_a_full_directory_is_never_replaced(tmp_path, refused):
    target = tmp_path / "out"
    with pytest.raises(ValueError if refused else OSError):
        with staged(str(target), ".x-", refused=refused) as staging:
            open(os.path.join(staging, "mine"), "w").close()
            _another_process_lands_first(target)
    assert os.listdir(tmp_path) == ["out"] and os.listdir(target) == ["theirs"]


def test_an_empty_directory_is_replaced(tmp_path):
    (tmp_path / "out").mkdir()
    with staged(str(tmp_path / "out"), ".x-") as staging:
        open(os.path.join(staging, "mine"), "w").close()
    assert os.listdir(tmp_path / "out") == ["mine"]


def test_a_failure_in_the_block_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with staged(str(tmp_path / "out"), ".x-", first_wins=True):
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_a_staging_directory_that_cannot_be_made_is_refused(tmp_path):
    (tmp_path / "f").write_text("a file")
    with pytest.raises(ValueError, match="refused"):
        with staged(str(tmp_path / "f" / "out"), ".x-", refused=lambda e: ValueError("refused")):
            pytest.fail("the block must not run")
