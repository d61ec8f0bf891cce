"""Issue 19 #1: a home that cannot be written is one line, never a traceback from the instance lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from impyard.storage.instance import HomeNotWritable, InstanceLock


def test_a_home_that_is_not_a_directory_is_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory")  # root ignores permissions; a file where the home should be does not
    with pytest.raises(HomeNotWritable) as caught:
        with InstanceLock(home, "chat"):
            pass
    message = str(caught.value)
    assert message.startswith(f"impyard can't write its home {home}: ") and "\n" not in message
    assert "set IMPYARD_HOME to a writable directory" in message


def test_a_writable_home_is_locked_as_before(tmp_path: Path) -> None:
    with InstanceLock(tmp_path, "chat") as lock:
        assert lock.path.read_text().split()[1] == "chat"
