"""The box loads no pydantic plugin, and does not even look for one (issue 37: a light start).

pydantic looks for plugins when it builds its first validator: it imports ``importlib.metadata`` (with ``email``,
``zipfile``, ``csv`` … some thirty modules) and reads the entry points of every installed package. None of them is
the box's, and under gVisor each of those file opens traps (about 90 ms of a runsc box's start, before
``box.init`` could be answered). ``PYDANTIC_DISABLE_PLUGINS`` turns the search off; a stand-in for pydantic's
loader module spares the import as well. The stand-in answers ``get_plugins`` with none, as the real loader does
under that setting, and hands any other name to the real module, so a pydantic that asks its loader for
something new still gets it.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Iterable
from typing import Any

LOADER = "pydantic.plugin._loader"
SETTING = {"PYDANTIC_DISABLE_PLUGINS": "__all__"}  # pydantic's own switch: no plugin is loaded


def _no_plugins() -> Iterable[Any]:
    return ()


def _real(name: str) -> Any:
    """Any other name: from the real loader, which then takes the stand-in's place."""
    if name.startswith("__"):
        raise AttributeError(name)
    sys.modules.pop(LOADER, None)
    return getattr(importlib.import_module(LOADER), name)


def refuse_pydantic_plugins() -> None:
    """Before the first model is built: no plugin search, no metadata read. Only ``python -m box`` calls it."""
    os.environ.update(SETTING)
    if LOADER in sys.modules:  # a validator was built already: the search, if any, is done
        return
    stand_in = types.ModuleType(
        LOADER, "pydantic's plugin loader, for a box that loads no plugin (box.no_plugins)"
    )
    stand_in.get_plugins = _no_plugins  # type: ignore[attr-defined]
    stand_in.__getattr__ = _real  # type: ignore[method-assign]
    sys.modules[LOADER] = stand_in
