"""imp.toml's ``[memory]`` (issue 23): it mirrors the box's ``MemorySettings`` key by key, takes its defaults and
bounds from there, reaches the box in ``box.init``, refuses bad values with file, line and key, and is on for
every imp an operator creates (``impyard imp add``, ``impyard chat``'s first imp).

On by default, and how: the commands that create an imp for an operator write ``enabled = true`` into its new
imp.toml; the box's default (and so a file without the key, or an imp made by code through ``ImpStore.add``)
stays off, so that no test or tool starts making memory calls it did not ask for.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

import impyard.imps.config
from box.protocol.models import ImpSpec, MemorySettings
from impyard.cli import cli
from impyard.cli.chat import pick_imp
from impyard.imps.config import ImpConfigError, MemoryConfig, new_imp_settings
from impyard.imps.render import toml_value
from impyard.imps.store import ImpStore
from impyard.imps.validate import parse_config

# Written out on purpose: a changed default must change this table, the template and docs/memory.md's table too.
DEFAULTS: dict[str, Any] = {
    "enabled": False,  # the box's default: a file without the key is off (new imps are written with true)
    "embedder": "gateway",
    "embedding_model": "text-embedding-3-small",
    "dimensions": 256,
    "models": {},
    "valence_bias": 0.0,
    "intensity_amplification": 1.0,
    "avoidance_weight": 2.0,
    "introspection": True,
    "timezone": "UTC",
    "call_log_bytes": 2_000_000,
}

# A value other than the default for every key: each must reach the box as written.
CHOSEN: dict[str, Any] = {
    "enabled": True,
    "embedder": "hashing",
    "embedding_model": "text-embedding-3-large",
    "dimensions": 512,
    "models": {"appraisal": "gpt-4.1-nano", "summary": "gpt-4o-mini", "reply": "gpt-4.1"},
    "valence_bias": -0.5,
    "intensity_amplification": 1.5,
    "avoidance_weight": 3.0,
    "introspection": False,
    "timezone": "Europe/Oslo",
    "call_log_bytes": 0,
}

# (key, lowest, highest): the box's bounds, written out; imp.toml takes them from the box.
BOUNDS = [
    ("dimensions", 8, 4096),
    ("valence_bias", -3.0, 3.0),
    ("intensity_amplification", 0.0, 10.0),
    ("avoidance_weight", 1.0, 10.0),
    ("call_log_bytes", 0, 100_000_000),
]


def config_of(memory_toml: str) -> Any:
    return parse_config(f'name = "pip"\n\n[memory]\n{memory_toml}\n', "imps/pip/imp.toml")


def test_memory_section_mirrors_the_box_settings_key_by_key() -> None:
    assert list(MemoryConfig.model_fields) == list(MemorySettings.model_fields) == list(DEFAULTS)


@pytest.mark.parametrize(("key", "expected"), list(DEFAULTS.items()))
def test_a_fresh_imp_toml_documents_and_sends_the_box_default(key: str, expected: Any) -> None:
    store = ImpStore()
    config = store.add("pip")
    text = store.config_path("pip").read_text()
    memory_part = text.split("\n[memory]\n", 1)[1].split("\n[", 1)[0]
    assert f"# {key} = {toml_value(expected)}\n" in memory_part  # the commented-out default is the real one
    assert f"# {MemoryConfig.model_fields[key].description}\n" in memory_part  # and every key is explained
    wire = ImpSpec.model_validate_json(store.imp_spec(config).model_dump_json())
    assert getattr(wire.memory, key) == expected
    assert getattr(ImpSpec.model_validate({"name": "pip"}).memory, key) == expected


def _fresh_imp_config(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "impyard._imp_config_memory_copy", impyard.imps.config.__file__
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", list(DEFAULTS))
def test_each_memory_default_is_the_box_s_own(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    marker = f"changed by {uuid.uuid4()}"
    info = MemorySettings.model_fields[key]
    if info.default_factory is not None:
        monkeypatch.setattr(info, "default_factory", lambda: marker)
    else:
        monkeypatch.setattr(info, "default", marker)
    copy = _fresh_imp_config(monkeypatch)
    assert copy.MemoryConfig.model_fields[key].get_default(call_default_factory=True) == marker


@pytest.mark.parametrize(("key", "low", "high"), BOUNDS)
def test_imp_toml_refuses_exactly_what_the_box_refuses(key: str, low: float, high: float) -> None:
    step = 1 if isinstance(low, int) else 0.5
    for value in (low, high):
        assert getattr(config_of(f"{key} = {toml_value(value)}").memory, key) == value
        MemorySettings.model_validate({key: value})
    for value in (low - step, high + step):
        with pytest.raises(ImpConfigError, match=f"line|key 'memory.{key}'"):
            config_of(f"{key} = {toml_value(value)}")
        with pytest.raises(ValueError):
            MemorySettings.model_validate({key: value})


def test_every_key_reaches_the_box_as_written() -> None:
    body = "\n".join(f"{key} = {toml_value(value)}" for key, value in CHOSEN.items())
    config = config_of(body)
    sent = ImpSpec.model_validate_json(config.imp_spec().model_dump_json()).memory
    assert sent.model_dump() == CHOSEN


def test_models_round_trip_through_a_new_imp_toml() -> None:
    store = ImpStore()
    chosen = {
        "models": {"appraisal": "gpt-4.1-nano", "filter": "gpt-4o-mini"},
        "timezone": "America/New_York",
    }
    config = store.add("pip", memory=chosen)
    text = store.config_path("pip").read_text()
    assert 'models = { appraisal = "gpt-4.1-nano", filter = "gpt-4o-mini" }\n' in text
    assert store.get("pip") == config and tomllib.loads(text)["memory"] == chosen


@pytest.mark.parametrize(
    ("toml", "line", "key", "says"),
    [
        pytest.param('enabled = "yes"', 4, "memory.enabled", "must be true or false", id="enabled-as-text"),
        pytest.param('embedder = "hash"', 4, "memory.embedder", 'one of "local", "gateway", "hashing"', id="embedder"),
        pytest.param("dimensions = 3", 4, "memory.dimensions", "from 8 to 4096 (got 3)", id="dimensions-low"),
        pytest.param("dimensions = 2.5", 4, "memory.dimensions", "a whole number", id="dimensions-float"),
        pytest.param("valence_bias = nan", 4, "memory.valence_bias", "from -3 to 3", id="bias-nan"),
        pytest.param("avoidance_weight = 0.5", 4, "memory.avoidance_weight", "from 1 to 10", id="avoidance"),
        pytest.param("intensity_amplification = inf", 4, "memory.intensity_amplification", "from 0 to 10",
                     id="amplification-inf"),
        pytest.param("call_log_bytes = -1", 4, "memory.call_log_bytes", "from 0 to 100000000", id="log-size"),
        pytest.param('timezone = "Mars/Base"', 4, "memory.timezone", "is not a time zone", id="timezone"),
        pytest.param('timezone = "../../etc/passwd"', 4, "memory.timezone", "is not a time zone", id="zone-path"),
        pytest.param('models = { apraisal = "x" }', 4, "memory.models", "did you mean 'appraisal'", id="purpose-typo"),
        pytest.param('models = { embedding = "x" }', 4, "memory.models", "is embedding_model", id="embedding-route"),
        pytest.param('models = { reply = "" }', 4, "memory.models.reply", "1 to 128 characters", id="empty-model"),
        pytest.param("models = 3", 4, "memory.models", "a table of purpose", id="models-not-a-table"),
        pytest.param('embedding_model = ""', 4, "memory.embedding_model", "a model name", id="empty-embedding"),
        pytest.param("enable = true", 4, "memory.enable", "did you mean 'enabled'", id="unknown-key"),
    ],
)  # fmt: skip
def test_a_bad_memory_value_names_file_line_and_key(toml: str, line: int, key: str, says: str) -> None:
    with pytest.raises(ImpConfigError) as caught:
        config_of(toml)
    message = str(caught.value)
    assert message.startswith(f"imps/pip/imp.toml:{line}: key '{key}': "), message
    assert says in message and "\n" not in message


# ------------------------------------------------------------------ on by default for the imps operators create


def test_new_imp_settings_turn_memory_on_unless_told_otherwise() -> None:
    assert new_imp_settings() == {"memory": {"enabled": True, "embedder": "local"}}  # issue 33: on the host
    assert new_imp_settings({"model": {"model": "gpt-4.1"}}) == {
        "model": {"model": "gpt-4.1"},
        "memory": {"enabled": True, "embedder": "local"},
    }
    off = new_imp_settings({"memory": {"enabled": False, "embedder": "hashing"}})
    assert off == {"memory": {"enabled": False, "embedder": "hashing"}}


def test_impyard_imp_add_creates_an_imp_that_remembers(impyard_home: Path) -> None:
    result = CliRunner().invoke(cli, ["imp", "add", "pip", "--model", "gpt-4.1"])
    assert result.exit_code == 0, result.output
    store = ImpStore()
    text = store.config_path("pip").read_text()
    memory_part = text.split("\n[memory]\n", 1)[1].split("\n[", 1)[0]
    assert "\nenabled = true\n" in f"\n{memory_part}"  # written, not a commented-out default
    config = store.get("pip")
    assert config.memory.enabled and store.imp_spec(config).memory.enabled
    # ...and the operator turns it off by writing false.
    store.config_path("pip").write_text(text.replace("\nenabled = true\n", "\nenabled = false\n"))
    assert not store.imp_spec(store.get("pip")).memory.enabled


def test_impyard_chat_s_first_imp_remembers(impyard_home: Path) -> None:
    store = ImpStore()
    assert pick_imp(store, None) == "pip"
    assert store.imp_spec(store.get("pip")).memory.enabled


def test_an_imp_made_by_code_keeps_the_box_default_off() -> None:
    # ImpStore.add is the API tests and tools build imps with: no memory calls they did not ask for.
    config = ImpStore().add("pip")
    assert not config.memory.enabled and not config.imp_spec().memory.enabled
