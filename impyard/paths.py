"""Where impyard keeps its state: ``IMPYARD_HOME`` (default: a platformdirs data dir)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import platformdirs

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def home() -> Path:
    configured = os.environ.get("IMPYARD_HOME")
    return (
        Path(configured).expanduser().resolve() if configured else Path(platformdirs.user_data_dir("impyard"))
    )


def home_id(path: Path | None = None) -> str:
    """A short stable id for this IMPYARD_HOME; labels its boxes so two supervisors never reap each other's."""
    return hashlib.sha256(str(path or home()).encode()).hexdigest()[:12]


def safe_name(text: str, limit: int = 40) -> str:
    """A name fit for paths and container names, derived from an imp or channel id."""
    cleaned = _SAFE.sub("-", text).strip("-.") or "x"
    return cleaned[:limit]


STATE_ROOT_ENV = "IMPYARD_STATE_ROOT"


def state_root(home_dir: Path | None = None) -> Path:
    """Where every box's ``/state`` lies: ``IMPYARD_STATE_ROOT`` when set, else ``IMPYARD_HOME/imps`` (issue 21).

    Only placed here; ``impyard.backends.stateroot`` refuses a relative value and fences boxes inside it."""
    configured = os.environ.get(STATE_ROOT_ENV, "").strip()
    return Path(configured).expanduser() if configured else (home_dir or home()) / "imps"


def imp_state_dir(imp: str, base: Path | None = None) -> Path:
    """The imp's state directory: where each of its boxes has its own ``/state`` (``box_dir_name``)."""
    return (base or home()) / "imps" / safe_name(imp) / "state"


def box_dir_name(key: str) -> str:
    """A directory name for one box's ``/state``, unique per ``key`` (a channel id, a task id): readable, and
    never the same for two keys that clean to the same text (``discord:1`` and ``discord-1``)."""
    return f"{safe_name(key, 48)}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
