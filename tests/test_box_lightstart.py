"""Issue 37, a lighter box start: ``box.init`` is answered before the turn's modules load and before any schema
it does not validate is built — and a model built late refuses exactly what it refused when built at import.

No timing here (speed is the benchmark's, ``bench/cold_warm.py``): the lightness is held by what a fresh
``python -m box`` has loaded and built when it has answered ``box.init``, so a heavy import moved back to the top
of ``box/program.py`` turns this red.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from box.protocol import BOX_METHODS, HOST_METHODS
from impyard.backends.process import BOX_SOURCE_ROOT, box_environment
from tests.scripted import deliver_params, init_params

# Loaded only by the first request that needs them (a turn, a task, a channel event), never for box.init.
HEAVY_MODULES = (
    "box.responder",
    "box.machine",
    "box.memory",
    "box.memory.engine",
    "box.common.envelope",  # builds the envelope's JSON schema at import
    "box.tool_loop",
    "box.tools",
    "box.model",
    "box.images",
    "box.probe",  # only `impyard box check` asks for it
    "sqlite3",
    "ctypes",
)
# Models box.init never touches: built (if ever) by the request that first uses them.
UNTOUCHED_MODELS = ("DeliverParams", "TaskRunParams", "MailboxEventParams", "ModelRequestParams", "LogParams")

# Runs the real ``python -m box`` (as the process backend does, isolated with -I) on the frames fed to its stdin;
# when stdin ends and the box has exited, writes what it had loaded and built to the file named in argv.
_RUN_AND_REPORT = """
import json, runpy, sys
root, report = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
try:
    runpy.run_module("box", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
from box.protocol import models
built = {name: getattr(models, name).__pydantic_complete__ for name in %r}
built["BoxInitParams"] = models.BoxInitParams.__pydantic_complete__
with open(report, "w") as out:
    json.dump({"modules": sorted(sys.modules), "built": built}, out)
"""


def frame(n: int, method: str, params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode() + b"\n"


def run_box(tmp_path: Path, stdin: bytes) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """A fresh box fed ``stdin`` to its end: its answers by id (a refusal is written at once, an answer when its
    request is done: their order is not the requests'), and what it had loaded and built."""
    report = tmp_path / "report.json"
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-I", "-c", _RUN_AND_REPORT % (UNTOUCHED_MODELS,), BOX_SOURCE_ROOT, str(report)],
        input=stdin, capture_output=True, env=box_environment(state), cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    answers = {item["id"]: item for item in frames if "method" not in item}  # not its own calls to the host
    return answers, json.loads(report.read_text())


def init_frame(n: int = 1, changes: dict[str, Any] | None = None) -> bytes:
    params = init_params().model_dump(mode="json")
    for dotted, value in (changes or {}).items():
        *path, last = dotted.split(".")
        target = params
        for key in path:
            target = target[key]
        target[last] = value
    return frame(n, "box.init", params)


def test_box_init_is_answered_before_the_turns_modules_load(tmp_path: Path) -> None:
    frames, seen = run_box(tmp_path, init_frame())
    assert frames == {1: {"jsonrpc": "2.0", "id": 1, "result": {"protocol": 1, "box": "0.1.0"}}}
    loaded = set(seen["modules"])
    assert "box.protocol.models" in loaded and "box.program" in loaded  # the report is of a box that ran
    assert sorted(loaded & set(HEAVY_MODULES)) == []
    assert seen["built"] == {**{name: False for name in UNTOUCHED_MODELS}, "BoxInitParams": True}
    # no installed package's metadata read, nor even its reader loaded, in a search for pydantic plugins
    assert "importlib.metadata" not in loaded


def test_the_first_turn_loads_what_it_needs_and_is_served_as_before(tmp_path: Path) -> None:
    """The same box, a delivery after box.init: the responder loads then, and the turn runs (here it fails on
    the model call, which nobody answers once stdin has ended: the point is that it ran the machine)."""
    deliver = frame(2, "mailbox.deliver", deliver_params().model_dump(mode="json"))
    frames, seen = run_box(tmp_path, init_frame() + deliver)
    assert frames[1]["result"] == {"protocol": 1, "box": "0.1.0"}
    assert frames[2]["result"]["outcome"] == "failed"  # its history.load went unanswered: stdin had ended
    loaded = set(seen["modules"])
    assert {"box.responder", "box.machine", "box.common.envelope"} <= loaded
    assert seen["built"]["DeliverParams"] is True
    assert (
        "box.probe" not in loaded and "box.memory.engine" not in loaded
    )  # memory off, no probe: never loaded


@pytest.mark.parametrize(
    ("first", "where"),
    [
        (init_frame(changes={"imp.name": "p" * 257}), "imp.name"),  # Name: at most 256 characters
        (init_frame(changes={"imp.responder.max_tokens": "lots"}), "imp.responder.max_tokens"),  # wrong type
        (
            init_frame(changes={"imp.responder.max_tokens": 128_001}),
            "imp.responder.max_tokens",
        ),  # over its bound
        (init_frame(changes={"session.channel_id": "c" * 129}), "session.channel_id"),  # Id: at most 128
        (init_frame(changes={"protocol": 2}), "protocol"),
        (
            init_frame(changes={"imp.memory.embedder": "mine"}),
            "imp.memory.embedder",
        ),  # not one of the choices
    ],
)
def test_a_model_built_on_first_use_refuses_what_it_always_refused(
    tmp_path: Path, first: bytes, where: str
) -> None:
    """The very first frame after start is the one that builds BoxInitParams: it is refused with the same
    -32602 and the same field as a model built at import; the box goes on and a good box.init then works."""
    frames, _ = run_box(tmp_path, first + init_frame(2))
    refused, answered = frames[1], frames[2]
    assert refused["error"]["code"] == -32602
    assert refused["error"]["message"] == "invalid params for box.init"
    assert [item["loc"] for item in refused["error"]["data"]] == [where]
    assert answered == {"jsonrpc": "2.0", "id": 2, "result": {"protocol": 1, "box": "0.1.0"}}


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"message": {"content": 7}}, "message.content"),  # wrong type
        ({"message": {"id": "m" * 129}}, "message.id"),  # oversize Id
        ({"presence": [{}] * 51}, "presence"),  # more entries than the bound
    ],
)
def test_the_first_delivery_after_start_is_held_to_the_same_bounds(
    tmp_path: Path, change: dict[str, Any], where: str
) -> None:
    params = deliver_params().model_dump(mode="json")
    for key, value in change.items():
        params[key] = {**params[key], **value} if isinstance(value, dict) else value
    frames, seen = run_box(tmp_path, init_frame() + frame(2, "mailbox.deliver", params))
    refused = frames[2]
    assert refused["error"]["code"] == -32602
    assert where in [item["loc"] for item in refused["error"]["data"]]
    assert "box.responder" not in seen["modules"]  # refused before any handler: nothing loaded for it


_STAND_IN = """
import json, sys
from box.no_plugins import refuse_pydantic_plugins
refuse_pydantic_plugins()
from pydantic import BaseModel, Field
class Probe(BaseModel):
    n: int = Field(le=3)
first = {"valid": Probe.model_validate({"n": 2}).n, "metadata": "importlib.metadata" in sys.modules}
try:
    Probe.model_validate({"n": 4})
except Exception as exc:
    first["refused"] = type(exc).__name__
from pydantic.plugin._loader import get_plugins, PYDANTIC_ENTRY_POINT_GROUP  # a name the stand-in lacks
first["plugins"] = list(get_plugins())
first["group"] = PYDANTIC_ENTRY_POINT_GROUP
first["real_now"] = sys.modules["pydantic.plugin._loader"].__file__ is not None
print(json.dumps(first))
"""


def test_the_plugin_loaders_stand_in_finds_none_and_hands_other_names_to_the_real_one(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {BOX_SOURCE_ROOT!r})\n{_STAND_IN}"],
        capture_output=True, cwd=tmp_path, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout) == {
        "valid": 2, "metadata": False, "refused": "ValidationError", "plugins": [], "group": "pydantic",
        "real_now": True,
    }  # fmt: skip


def test_every_protocol_model_builds() -> None:
    """A deferred model that cannot build would fail only when first used: every one is built here, forced."""
    models: set[type[BaseModel]] = set()
    for spec in [*BOX_METHODS.values(), *HOST_METHODS.values()]:
        models.add(spec.params)
        if spec.result is not None:
            models.add(spec.result)
    for model in sorted(models, key=lambda m: m.__qualname__):
        assert model.model_rebuild(force=True) is not False, model.__qualname__
        assert model.__pydantic_complete__, model.__qualname__


# ---------------------------------------------------------------- a spare's box.ready (issue 37)

ALL_MODELS = sorted(
    {
        model.__name__
        for spec in [*BOX_METHODS.values(), *HOST_METHODS.values()]
        for model in (spec.params, spec.result)
        if model is not None and model.__module__ == "box.protocol.models"
    }
)
# What a spare has loaded once it answered box.ready: the turn's code and the memory engine, not the probe.
LOADED_BY_READY = (
    "box.responder",
    "box.machine",
    "box.memory",
    "box.memory.engine",
    "box.memory.night",
    "box.common.envelope",
    "box.tool_loop",
    "box.tools",
    "box.model",
)
_REPORT_ALL = _RUN_AND_REPORT.replace("for name in %r}", "for name in %r}  # every model") % (ALL_MODELS,)


def run_spare(tmp_path: Path, stdin: bytes) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """``run_box``, reporting whether each protocol model of ``box.protocol.models`` was built."""
    report = tmp_path / "report.json"
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-I", "-c", _REPORT_ALL, BOX_SOURCE_ROOT, str(report)],
        input=stdin, capture_output=True, env=box_environment(state), cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    return {item["id"]: item for item in frames if "method" not in item}, json.loads(report.read_text())


def test_box_ready_loads_what_a_first_turn_would_load_in_front_of_the_person(tmp_path: Path) -> None:
    """Issue 37: a spare answers box.ready once the turn's modules are loaded and every protocol model is built,
    so the first turn after its claim loads nothing of the box's own: a claimed spare's first reply is warm."""
    frames, seen = run_spare(tmp_path, frame(1, "box.ready", {}))
    assert frames == {1: {"jsonrpc": "2.0", "id": 1, "result": {}}}
    loaded = set(seen["modules"])
    assert sorted(set(LOADED_BY_READY) - loaded) == []
    assert "box.probe" not in loaded  # only `impyard box check` asks for it
    assert {name for name, built in seen["built"].items() if not built} == set()


def test_a_turn_after_box_ready_loads_nothing_more_of_the_box(tmp_path: Path) -> None:
    deliver = frame(3, "mailbox.deliver", deliver_params().model_dump(mode="json"))
    (tmp_path / "ready").mkdir()
    (tmp_path / "turn").mkdir()
    _, before = run_spare(tmp_path / "ready", frame(1, "box.ready", {}) + init_frame(2))
    frames, after = run_spare(tmp_path / "turn", frame(1, "box.ready", {}) + init_frame(2) + deliver)
    assert frames[3]["result"]["outcome"] == "failed"  # its history.load went unanswered: the turn ran
    own = sorted(m for m in set(after["modules"]) - set(before["modules"]) if m.split(".")[0] == "box")
    assert own == []


def test_box_ready_is_answered_once_and_the_box_then_inits_as_any_box(tmp_path: Path) -> None:
    frames, _ = run_spare(tmp_path, frame(1, "box.ready", {}) + frame(2, "box.ready", {}) + init_frame(3))
    assert frames[1]["result"] == {} and frames[2]["result"] == {}
    assert frames[3]["result"] == {"protocol": 1, "box": "0.1.0"}
