"""The single-instance lock per IMPYARD_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from impyard.storage.instance import AlreadyRunning, InstanceLock


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from impyard.storage.instance import InstanceLock\n"
         "from pathlib import Path\nwith InstanceLock(Path(sys.argv[1]), 'chat'):\n print('held', flush=True); time.sleep(30)",
         str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(AlreadyRunning) as caught:
            with InstanceLock(tmp_path, "chat"):
                pytest.fail("two holders")
        assert caught.value.holder == str(holder.pid)
        assert f"pid {holder.pid}" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    # A holder that died (even by SIGKILL) leaves nothing that blocks the next one.
    with InstanceLock(tmp_path, "chat"):
        assert (tmp_path / "supervisor.lock").read_text().startswith(str(os.getpid()))
