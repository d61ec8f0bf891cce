"""One source for each responder and memory default (issue 12): the box's, which imp.toml takes.

The box (box/protocol/models.py) must not import impyard, so the defaults live on the box side and
``impyard.imps.config`` reads them from there; these tests pin the values and that provenance.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

import impyard.imps.config
from box.protocol.models import ImpSpec, MemorySettings, ResponderSettings
from impyard.imps.config import MemoryConfig, ModelConfig
from impyard.imps.render import toml_value
from impyard.imps.store import ImpStore

# Written out on purpose: a changed default must change this table (and docs/configuration.md's tables) too.
EXPECTED: dict[tuple[str, str], Any] = {
    ("model", "model"): "gpt-5.1",  # issue 16: takes every SPEC-001 parameter (ENV-21, ENV-22)
    ("model", "server"): "openai",  # issue 16: the model's own profile, by its name
    ("model", "vision_model"): None,
    ("model", "factual_model"): None,
    ("model", "retry_model"): None,
    ("model", "max_tokens"): 1024,
    ("model", "temperature"): None,
    ("model", "reasoning_effort"): "none",
    ("model", "use_responses_api"): False,
    ("model", "responses_tool_rounds"): 4,
    ("model", "tool_rounds"): 3,
    ("model", "tools"): [],
    ("model", "history_limit"): 20,
    ("model", "history_per_channel"): 3,
    ("model", "short_path"): [],
    ("model", "images"): None,  # issue 38: unset = by the server (pictures on openai only)
    (
        "memory",
        "enabled",
    ): False,  # the box's default; `impyard imp add` and `impyard chat` write true (issue 23)
    ("memory", "embedder"): "gateway",
    ("memory", "embedding_model"): "text-embedding-3-small",
    ("memory", "dimensions"): 256,
    ("memory", "models"): {},
    ("memory", "valence_bias"): 0.0,
    ("memory", "intensity_amplification"): 1.0,
    ("memory", "avoidance_weight"): 2.0,
    ("memory", "introspection"): True,
    ("memory", "timezone"): "UTC",
    ("memory", "call_log_bytes"): 2_000_000,
}

# imp.toml's table -> (the host's config model, the box's settings model, ImpSpec's field for it)
SECTIONS: dict[str, tuple[type[BaseModel], type[BaseModel], str]] = {
    "model": (ModelConfig, ResponderSettings, "responder"),
    "memory": (MemoryConfig, MemorySettings, "memory"),
}


def test_the_table_covers_every_key_both_sides_know() -> None:
    for section, (host, box, _) in SECTIONS.items():
        shared = set(host.model_fields) & set(box.model_fields)
        assert shared == {key for (table, key) in EXPECTED if table == section}, section


@pytest.mark.parametrize(
    ("section", "key", "expected"), [(*where, value) for where, value in EXPECTED.items()]
)
def test_a_fresh_imp_toml_gives_the_box_its_own_default(
    impyard_home: Path, section: str, key: str, expected: Any
) -> None:
    store = ImpStore(impyard_home)
    store.add("pip")  # writes a fresh imp.toml: every key a commented-out default
    text = store.config_path("pip").read_text()
    if expected is not None:
        assert f"# {key} = {toml_value(expected)}\n" in text  # the documented default is the real one

    wire = store.imp_spec(store.get("pip")).model_dump_json()  # what box.init carries
    from_host = getattr(ImpSpec.model_validate_json(wire), SECTIONS[section][2])
    box_alone = getattr(
        ImpSpec.model_validate({"name": "pip"}), SECTIONS[section][2]
    )  # the host sent nothing
    assert getattr(from_host, key) == expected
    assert getattr(box_alone, key) == expected


def fresh_imp_config(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A second copy of impyard.imps.config, built now: its defaults are read at class creation."""
    spec = importlib.util.spec_from_file_location("impyard._imp_config_copy", impyard.imps.config.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # pydantic resolves annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("section", "key"), list(EXPECTED))
def test_imp_toml_takes_each_default_from_the_box(
    monkeypatch: pytest.MonkeyPatch, section: str, key: str
) -> None:
    # Equal values cannot tell a copy from the source (and False, None or 3 is the same object anywhere),
    # so change the box's default to a value nobody would write and check imp.toml's default follows it.
    host, box, _ = SECTIONS[section]
    marker = f"the box's {section}.{key} default, changed by {uuid.uuid4()}"
    info = box.model_fields[key]
    if info.default_factory is not None:
        monkeypatch.setattr(info, "default_factory", lambda: marker)
    else:
        monkeypatch.setattr(info, "default", marker)
    copy = fresh_imp_config(monkeypatch)
    assert getattr(copy, host.__name__).model_fields[key].get_default(call_default_factory=True) == marker
