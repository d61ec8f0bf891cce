"""What a spare box loads while it waits for its claim (issue 37, docs/protocol.md ``box.ready``).

A box started for a message answers ``box.init`` before its turn's modules load (a light start: the person is
waiting). A spare is started before anyone waits: its pool asks ``box.ready`` and the box answers once it has
loaded everything a first turn would otherwise load in front of the person — the responder, the turn machine, the
model client, the memory engine and its prompts, and every protocol model the turns exchange — so a claimed
spare's first turn runs as a warm box's would. Nothing of any conversation is read or kept: modules, schemas and
the packaged prompt files, the same in every box of this image.
"""

from __future__ import annotations

import importlib
import logging

from pydantic import BaseModel

from box.protocol.base import FromBox, FromHost

log = logging.getLogger("box")

# What the first turn or task of a box loads, in the order a turn would (box/program.py's deferred imports).
# ``box.probe`` is left out: only ``impyard box check`` asks for it.
TURN_MODULES = (
    "box.responder",
    "box.memory",
    "box.memory.engine",
    "box.memory.store_client",
    "box.memory.night",  # the imp's day (reflect, sleep): a spare may be claimed by a task
)


def load_for_turns() -> int:
    """Import :data:`TURN_MODULES`, build every protocol model not built yet (each is built on first use:
    ``box.protocol.base``'s ``defer_build``) and read the memory's prompts. Returns how many models it built."""
    for name in TURN_MODULES:
        importlib.import_module(name)
    built = 0
    for model in _protocol_models():
        if not model.__pydantic_complete__:
            model.model_rebuild()
            built += 1
    from box.memory.prompts import packaged_prompts

    packaged_prompts()
    log.debug("loaded for turns: %d protocol models built", built)
    return built


def _protocol_models() -> list[type[BaseModel]]:
    """Every model of the protocol, those the method tables name and every other one (a field's model, a
    result part): each subclass of the two bases, once, bases first."""
    seen: list[type[BaseModel]] = []
    stack: list[type[BaseModel]] = [FromHost, FromBox]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.append(model)
        stack.extend(model.__subclasses__())
    return seen
