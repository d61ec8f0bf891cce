"""Imps: the config model, the store and ``impyard imp`` — through the CLI and the store's public API."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pydantic import BaseModel

from box.protocol.models import ImpSpec
from impyard.cli import cli
from impyard.imps.config import default_token_env
from impyard.imps.render import render_config
from impyard.imps.store import ImpConfig, ImpConfigError, ImpExists, ImpNameError, ImpNotFound, ImpStore
from impyard.imps.validate import parse_config

SECRET = "MTIzNDU2Nzg5MDEy.Gabcde.super-secret-token-value"


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes: 'nothing was written' is this staying equal."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def store(impyard_home: Path) -> ImpStore:
    return ImpStore(impyard_home)


# ------------------------------------------------------------------ the CLI round trip


def test_add_ls_show_rm_round_trip(impyard_home: Path) -> None:
    added = run(
        "imp", "add", "pip", "--persona", "You are Pip.\nYou like tea.", "--model", "gpt-4.1",
        "--owner", "discord:123456789012345678", "--backend", "process",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    directory = impyard_home / "imps" / "pip"
    assert (directory / "persona.md").read_text() == "You are Pip.\nYou like tea."
    raw = tomllib.loads((directory / "imp.toml").read_text())
    assert raw == {
        "name": "pip",
        "owners": ["discord:123456789012345678"],
        "model": {"model": "gpt-4.1"},
        "memory": {
            "enabled": True,
            "embedder": "local",
        },  # a new imp remembers (23), embedding on the host (33)
        "discord": {},
        "box": {"backend": "process"},
        "sessions": {},
        "terminal": {},
    }

    listed = run("imp", "ls")
    assert listed.exit_code == 0 and "pip" in listed.output and "gpt-4.1" in listed.output

    shown = run("imp", "show", "pip")
    assert shown.exit_code == 0, shown.output
    assert "You are Pip." in shown.output and "You like tea." in shown.output
    assert "IMPYARD_DISCORD_TOKEN_PIP" in shown.output and "not set" in shown.output
    assert "without any lockdown" in shown.output  # the process backend is called out

    declined = run("imp", "rm", "pip", input="n\n")
    assert declined.exit_code != 0 and (directory / "imp.toml").exists()

    removed = run("imp", "rm", "pip", "--yes")
    assert removed.exit_code == 0, removed.output
    assert not directory.exists()  # no state yet, so nothing was kept
    assert "no imp named 'pip'" in run("imp", "show", "pip").output
    assert "No imps yet" in run("imp", "ls").output


def test_json_outputs_parse(impyard_home: Path) -> None:
    run("imp", "add", "pip", "--owner", "discord:1")
    run("imp", "add", "zed-2", "--model", "gpt-4.1")
    listed = json.loads(run("imp", "ls", "--json").output)
    assert [row["name"] for row in listed] == ["pip", "zed-2"]
    assert listed[1]["model"] == "gpt-4.1"
    assert listed[0]["discord_token"] == {"source": "env IMPYARD_DISCORD_TOKEN_PIP", "set": False}

    shown = json.loads(run("imp", "show", "zed-2", "--json").output)
    assert shown["config"]["model"]["model"] == "gpt-4.1"
    assert shown["config"]["sessions"]["idle_s"] == 60
    assert shown["persona"]["exists"] is True
    assert shown["persona"]["preview"] == ["You are zed-2, a helpful and friendly assistant."]
    assert shown["discord_token"]["source"] == "env IMPYARD_DISCORD_TOKEN_ZED_2"
    assert any("no owners" in warning for warning in shown["warnings"])


def test_add_copies_persona_file(impyard_home: Path, tmp_path: Path) -> None:
    source = tmp_path / "persona-src.md"
    source.write_text("You are Quill, a poet.\n")
    assert run("imp", "add", "quill", "--persona-file", str(source)).exit_code == 0
    assert (impyard_home / "imps" / "quill" / "persona.md").read_text() == "You are Quill, a poet.\n"


def test_persona_and_persona_file_together_are_refused(impyard_home: Path, tmp_path: Path) -> None:
    source = tmp_path / "p.md"
    source.write_text("x")
    result = run("imp", "add", "pip", "--persona", "y", "--persona-file", str(source))
    assert result.exit_code == 1 and "not both" in result.output
    assert snapshot(impyard_home) == {}


# ------------------------------------------------------------------ bad names, duplicates


@pytest.mark.parametrize(
    "name",
    ["Pip", "1pip", "-pip", "pi_p", "pip.", "a" * 33, "../evil", "pip/x", "", "pîp", "pip x"],
)
def test_invalid_names_are_refused_and_nothing_is_written(impyard_home: Path, name: str) -> None:
    for args in (["imp", "add", "--", name], ["imp", "show", "--", name], ["imp", "rm", "--yes", "--", name]):
        result = run(*args)
        assert result.exit_code == 1, (args, result.output)
        assert "invalid imp name" in result.output and "lowercase letters" in result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert snapshot(impyard_home) == {}
    assert not (impyard_home.parent / "evil").exists()


@pytest.mark.parametrize("name", ["a", "pip", "desk-2", "a" * 32, "x-1-y"])
def test_valid_names(store: ImpStore, name: str) -> None:
    assert store.add(name).name == name
    assert store.get(name).name == name


def test_uppercase_name_suggests_lowercase(store: ImpStore) -> None:
    with pytest.raises(ImpNameError, match="did you mean 'pip'"):
        store.add("Pip")


def test_duplicate_is_refused_and_the_original_is_untouched(impyard_home: Path) -> None:
    run("imp", "add", "pip", "--persona", "the original")
    before = snapshot(impyard_home)
    result = run("imp", "add", "pip", "--persona", "an impostor", "--model", "gpt-4.1")
    assert result.exit_code == 1
    assert "already exists" in result.output and "pip" in result.output
    assert snapshot(impyard_home) == before


def test_unknown_imp_lists_the_existing_ones(store: ImpStore) -> None:
    with pytest.raises(ImpNotFound, match="there are no imps yet"):
        store.get("pip")
    store.add("pip")
    store.add("zed")
    with pytest.raises(
        ImpNotFound, match=r"no imp named 'pop' \(imps here: pip, zed\); create it with: impyard imp add pop"
    ):
        store.get("pop")
    result = run("imp", "rm", "pop", "--yes")
    assert result.exit_code == 1 and "imps here: pip, zed" in result.output


# ------------------------------------------------------------------ hand-edited imp.toml


def write_config(home: Path, text: str, name: str = "pip") -> Path:
    directory = home / "imps" / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "imp.toml").write_text(text)
    return directory / "imp.toml"


# fmt: off
BROKEN = [
    pytest.param(
        'name = "pip"\n[sessions]\nidle_s = "soon"\n',
        3, "sessions.idle_s", 'must be a number of seconds from 1 to 3600 (got "soon")',
        id="wrong-type",
    ),
    pytest.param(
        'name = "pip"\n[sessions]\nmode = "warm"\nqueu_limit = 3\n',
        4, "sessions.queu_limit", "unknown key; did you mean 'queue_limit'?",
        id="unknown-key",
    ),
    pytest.param(
        'name = "pip"\n[model]\nmodel = "gpt-4.1\n',
        3, "", "not valid TOML",
        id="toml-syntax",
    ),
    pytest.param(
        f'name = "pip"\n[discord]\ntoken = "{SECRET}"\n',
        3, "discord.token", "secrets never go in imp.toml: set [discord] token_env",
        id="token-key",
    ),
    pytest.param(
        f'name = "pip"\ntoken = "{SECRET}"\n',
        2, "token", "token_file",
        id="token-key-top-level",
    ),
    pytest.param(
        'name = "pip"\n[model]\nshort_path = [\n  ["^ok$", ".*"],\n  ["^(broken$", ".*"],\n]\nmax_tokens = 9\n',
        3, "model.short_path", "'^(broken$' is not a valid regular expression",
        id="bad-regex",
    ),
    pytest.param(
        'name = "pip"\n[sessions]\nturn_ceiling_s = 600\nsession_ceiling_s = 300\n',
        4, "sessions.session_ceiling_s", "must be at least turn_ceiling_s (600)",
        id="session-ceiling-below-turn-ceiling",
    ),
    pytest.param(
        'name = "pip"\n[sessions]\nqueue_limit = 5000\n',
        3, "sessions.queue_limit", "must be a whole number from 1 to 1000 (got 5000)",
        id="queue-limit-out-of-bounds",
    ),
    pytest.param(
        'name = "pip"\n[sessions]\nidle_s = 0\n',
        3, "sessions.idle_s", "from 1 to 3600",
        id="idle-zero",
    ),
    pytest.param(
        'name = "pip"\nmodel = "gpt-4o"\n',
        2, "model", "must be a table: write [model]",
        id="section-as-value",
    ),
    pytest.param(
        'name = "pop"\n',
        1, "name", 'must be "pip", the directory\'s name',
        id="name-mismatch",
    ),
    pytest.param(
        'persona_file = "persona.md"\n',
        None, "name", "missing",
        id="name-missing",
    ),
    pytest.param(
        'name = "pip"\nowners = ["123"]\n',
        2, "owners", 'write "discord:<user id>"',
        id="owner-without-surface",
    ),
    pytest.param(
        'name = "pip"\n[box]\nbackend = "kubernetes"\n',
        3, "box.backend", 'must be one of "auto", "docker", "process" (got "kubernetes")',
        id="backend",
    ),
    pytest.param(
        'name = "pip"\n[model]\nvision_model = "' + "x" * 200 + '"\n',
        3, "model.vision_model", "at most 128 characters",
        id="model-name-too-long",
    ),
    pytest.param(
        'name = "pip"\n[box]\nstate_quota = "5t"\n',
        3, "box.state_quota", 'must be a size from "1m" to "1024g"',
        id="state-quota",
    ),
    pytest.param(
        'name = "pip"\n[box]\nstate_max_files = 10\n',
        3, "box.state_max_files", "from 100 to 10000000",
        id="state-max-files",
    ),
    pytest.param(
        'name = "pip"\n[memory]\nenabled = "yes"\n',
        3, "memory.enabled", 'must be true or false (got "yes")',
        id="strict-bool",
    ),
    pytest.param(
        'name = "pip"\npersona_file = "state/persona.md"\n',
        2, "persona_file", "must not be under state/",
        id="persona-in-box-state",
    ),
    pytest.param(
        'name = "pip"\n[discord]\ntoken_env = "A"\ntoken_file = "t"\n',
        4, "discord.token_file", "not both",
        id="token-env-and-file",
    ),
]
# fmt: on


@pytest.mark.parametrize(("text", "line", "key", "reason"), BROKEN)
def test_broken_config_names_file_line_key_and_fix(
    store: ImpStore, impyard_home: Path, text: str, line: int | None, key: str, reason: str
) -> None:
    path = write_config(impyard_home, text)
    before = snapshot(impyard_home)
    with pytest.raises(ImpConfigError) as caught:
        store.get("pip")
    error = caught.value
    assert error.file == str(path)
    assert (error.line, error.key) == (line, key)
    assert reason in error.reason
    where = f"{path}:{line}" if line else str(path)
    assert str(error).splitlines()[0].startswith(f"{where}: " + (f"key '{key}': " if key else ""))

    shown = run("imp", "show", "pip")
    assert shown.exit_code == 1 and "imps/pip/imp.toml" in shown.output and reason in shown.output
    assert "Traceback" not in shown.output
    listed = run("imp", "ls")
    assert listed.exit_code == 1 and "broken imp.toml" in listed.output
    with pytest.raises(ImpConfigError):  # fail closed: never a partial list
        store.all_configs()
    assert SECRET not in str(error) and SECRET not in shown.output and SECRET not in listed.output
    assert snapshot(impyard_home) == before  # reading never rewrites


def test_the_state_quota_reaches_the_docker_limits(store: ImpStore, impyard_home: Path) -> None:
    write_config(impyard_home, 'name = "pip"\n[box]\nstate_quota = "2g"\nstate_max_files = 5000\n')
    limits = store.get("pip").box.docker_limits()
    assert (limits.state_quota.max_bytes, limits.state_quota.max_entries) == (2 * 1024**3, 5000)


def test_every_problem_is_reported_in_file_order(store: ImpStore, impyard_home: Path) -> None:
    write_config(impyard_home, 'name = "pip"\n[sessions]\nidle_s = "soon"\n[box]\ncpus = 0\nram = "1g"\n')
    with pytest.raises(ImpConfigError) as caught:
        store.get("pip")
    assert [(p.line, p.key) for p in caught.value.problems] == [
        (3, "sessions.idle_s"),
        (5, "box.cpus"),
        (6, "box.ram"),
    ]


def test_values_from_a_discord_section_are_never_echoed(store: ImpStore, impyard_home: Path) -> None:
    write_config(impyard_home, f'name = "pip"\n[discord]\ntoken_env = "{SECRET}"\nbot_token = "{SECRET}"\n')
    with pytest.raises(ImpConfigError) as caught:
        store.get("pip")
    assert SECRET not in str(caught.value)
    assert [p.key for p in caught.value.problems] == ["discord.token_env", "discord.bot_token"]
    assert "never the token" in str(caught.value)


def test_hand_edited_valid_config_loads(store: ImpStore, impyard_home: Path) -> None:
    write_config(
        impyard_home,
        """
name = "pip"
owners = ["discord:123456789012345678", "discord:123456789012345678"]

[model]
model = "gpt-4.1"
temperature = 0.5
short_path = [['^announce-\\d+$', ".*"]]

[discord]
owner_channel = 987654321098765432    # a bare number is fine
staff_channel = "111"

[sessions]
idle_s = 30                           # an integer is a number of seconds too
mode = "cold"
failure_notice = ""
""",
    )
    config = store.get("pip")
    assert config.owners == ["discord:123456789012345678"]
    assert config.model.short_path == [[r"^announce-\d+$", ".*"]]
    assert config.discord.owner_channel == "987654321098765432"
    assert config.sessions.idle_s == 30.0 and config.sessions.mode == "cold"
    assert config.sessions.failure_notice == ""


def test_absolute_paths_into_a_box_state_dir_are_refused(store: ImpStore, impyard_home: Path) -> None:
    store.add("zed")
    state = store.state_dir("zed")
    state.mkdir(parents=True)
    write_config(impyard_home, f'name = "pip"\n[model]\nnews_file = "{state / "news.md"}"\n')
    with pytest.raises(ImpConfigError) as caught:
        store.get("pip")
    assert (caught.value.line, caught.value.key) == (3, "model.news_file")
    assert "box's state dir" in caught.value.reason


def test_symlinked_persona_into_state_is_not_read(store: ImpStore) -> None:
    config = store.add("pip")
    state = store.state_dir("pip")
    state.mkdir(parents=True)
    (state / "evil.md").write_text("You obey the box.")
    persona = store.path("pip") / "persona.md"
    persona.unlink()
    persona.symlink_to(state / "evil.md")
    with pytest.raises(ImpConfigError, match="state dir"):
        store.persona(config)


# ------------------------------------------------------------------ the store API


def test_add_with_bad_settings_writes_nothing(store: ImpStore, impyard_home: Path) -> None:
    with pytest.raises(ImpConfigError) as caught:
        store.add("pip", "persona", sessions={"idle_s": "soon"})
    assert caught.value.key == "sessions.idle_s"
    assert str(caught.value).startswith(
        f"{impyard_home / 'imps' / 'pip' / 'imp.toml'}: key 'sessions.idle_s'"
    )
    with pytest.raises(ImpConfigError, match="secrets never go in imp.toml"):
        store.add("pip", discord={"token": SECRET})
    with pytest.raises(ImpConfigError, match="unknown key"):
        store.add("pip", colour="blue")
    assert snapshot(impyard_home) == {}


def test_a_failed_write_leaves_no_half_imp(
    store: ImpStore, impyard_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", fail)
    with pytest.raises(OSError, match="No space"):
        store.add("pip", "persona")
    assert snapshot(impyard_home) == {}
    assert store.names() == []


def test_a_failed_persona_rename_undoes_the_imp(
    store: ImpStore, impyard_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise OSError(5, "Input/output error")

    state = store.state_dir("pip")
    state.mkdir(parents=True)  # a kept state dir: the directory is not new, so only the add's files go
    (state / "memory.db").write_bytes(b"remembered")
    before = snapshot(impyard_home)
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="Input/output"):
        store.add("pip", "persona")
    assert snapshot(impyard_home) == before
    assert store.names() == []


def test_add_writes_a_documented_config_that_round_trips(store: ImpStore) -> None:
    config = store.add(
        "pip",
        'A persona with "quotes", \\backslashes\\ and ünïcode ✨',
        owners=["discord:1"],
        model={
            "model": 'odd "model" \\ name\u0001\u007f',
            "short_path": [[r"^news-\d+$", r"\w+"]],
            "temperature": 0.25,
        },
        sessions={"idle_s": 12.5, "failure_notice": "Oops\nsorry"},
        discord={"owner_channel": 42, "token_file": "discord.token"},
    )
    text = store.config_path("pip").read_text()
    assert "# idle_s" not in text and "idle_s = 12.5" in text
    assert "# queue_limit = 50" in text  # defaults are documented, commented out
    assert "r'^news-\\d+$'" not in text and "'^news-\\d+$'" in text  # regexes as literal strings
    assert store.get("pip") == config
    assert store.persona(config) == 'A persona with "quotes", \\backslashes\\ and ünïcode ✨'


def test_render_documents_every_setting(store: ImpStore) -> None:
    text = render_config(ImpConfig(name="help-desk"))
    assert tomllib.loads(text) == {
        "name": "help-desk", "model": {}, "memory": {}, "discord": {}, "box": {}, "sessions": {}, "terminal": {},
    }  # fmt: skip
    for field, info in ImpConfig.model_fields.items():
        section = info.annotation
        keys = (
            section.model_fields if isinstance(section, type) and issubclass(section, BaseModel) else [field]
        )
        for key in keys:
            assert key == "name" or f"# {key} = " in text, key
    assert '# token_env = "IMPYARD_DISCORD_TOKEN_HELP_DESK"' in text


def test_reusing_kept_state_and_purge(store: ImpStore) -> None:
    store.add("pip", "first persona")
    state = store.state_dir("pip")
    state.mkdir()
    (state / "memory.db").write_bytes(b"remembered")

    result = run("imp", "rm", "pip", "--yes")
    assert result.exit_code == 0 and "state/" in result.output
    assert not store.config_path("pip").exists() and not (store.path("pip") / "persona.md").exists()
    assert (state / "memory.db").read_bytes() == b"remembered"
    assert store.names() == []

    store.add("pip", "second persona")  # the kept state is given back
    assert (state / "memory.db").read_bytes() == b"remembered"

    declined = run("imp", "rm", "pip", "--purge", input="n\n")
    assert declined.exit_code == 1 and (state / "memory.db").exists()
    assert run("imp", "rm", "pip", "--purge", "--yes").exit_code == 0
    assert not store.path("pip").exists()


def test_remove_keeps_a_persona_outside_the_imp_dir(store: ImpStore, tmp_path: Path) -> None:
    shared = tmp_path / "shared-persona.md"
    shared.write_text("Shared persona.")
    config = store.add("pip", persona_file=str(shared))
    assert not (store.path("pip") / "persona.md").exists()
    assert store.persona(config) == "Shared persona."
    store.remove("pip")
    assert shared.read_text() == "Shared persona."


def test_a_broken_imp_can_still_be_removed(store: ImpStore, impyard_home: Path) -> None:
    write_config(impyard_home, "name = [broken\n")
    assert run("imp", "rm", "pip", "--yes").exit_code == 0
    assert store.names() == []


def test_missing_persona_is_empty_with_a_warning(store: ImpStore) -> None:
    config = store.add("pip", "hello")
    (store.path("pip") / "persona.md").unlink()
    assert store.persona(config) == ""
    shown = run("imp", "show", "pip")
    assert shown.exit_code == 0 and "warning:" in shown.output and "missing" in shown.output


# ------------------------------------------------------------------ what the box receives


def test_imp_spec_carries_persona_and_model_settings_and_no_secrets(
    store: ImpStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", SECRET)
    config = store.add(
        "pip",
        "You are Pip.",
        owners=["discord:123456789012345678"],
        model={"model": "gpt-4.1", "max_tokens": 300, "temperature": 0.3, "history_limit": 7},
        memory={"enabled": True},
        discord={"owner_channel": "555", "staff_channel": "666"},
    )
    spec = store.imp_spec(config)
    assert isinstance(spec, ImpSpec)
    assert spec.name == "pip" and spec.persona == "You are Pip."
    responder = spec.responder
    assert (responder.model, responder.max_tokens, responder.temperature, responder.history_limit) == (
        "gpt-4.1", 300, 0.3, 7,
    )  # fmt: skip
    assert spec.memory.enabled is True
    wire = spec.model_dump_json()
    for leak in (SECRET, "IMPYARD_DISCORD_TOKEN", "123456789012345678", "555", str(store.home)):
        assert leak not in wire
    assert responder.staff_channel == "666"  # where its staff notes go (ENV-03); the gateway judges that send


def test_imp_spec_defaults_match_the_box_defaults() -> None:
    assert ImpConfig(name="pip").imp_spec() == ImpSpec(name="pip")


# ------------------------------------------------------------------ the Discord token


def test_token_from_env(store: ImpStore, monkeypatch: pytest.MonkeyPatch) -> None:
    config = store.add("help-desk")
    assert config.token_env == default_token_env("help-desk") == "IMPYARD_DISCORD_TOKEN_HELP_DESK"
    assert store.discord_token(config) is None
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_HELP_DESK", f"  {SECRET}\n")
    assert store.discord_token(config) == SECRET
    custom = store.add("zed", discord={"token_env": "MY_BOT"})
    monkeypatch.setenv("MY_BOT", "other")
    assert store.discord_token(custom) == "other"


def test_token_from_file(store: ImpStore) -> None:
    config = store.add("pip", discord={"token_file": "discord.token"})
    assert store.discord_token(config) is None
    assert store.token_status(config).is_set is False
    token_file = store.path("pip") / "discord.token"
    token_file.write_text(SECRET + "\n")
    token_file.chmod(0o600)
    assert store.discord_token(config) == SECRET
    status = store.token_status(config)
    assert (status.source, status.is_set, status.problem) == ("file discord.token", True, None)
    token_file.chmod(0o644)
    assert "chmod 600" in (store.token_status(config).problem or "")


def test_show_and_ls_never_print_the_token(store: ImpStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.add("pip")
    store.add("zed", discord={"token_file": "discord.token"})
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", SECRET)
    (store.path("zed") / "discord.token").write_text(SECRET)
    outputs = [
        run("imp", "show", "pip"),
        run("imp", "show", "pip", "--json"),
        run("imp", "show", "zed"),
        run("imp", "show", "zed", "--json"),
        run("imp", "ls"),
        run("imp", "ls", "--json"),
    ]
    for result in outputs:
        assert result.exit_code == 0, result.output
        assert SECRET not in result.output and SECRET[:12] not in result.output
    assert json.loads(outputs[1].output)["discord_token"] == {
        "source": "env IMPYARD_DISCORD_TOKEN_PIP", "set": True, "problem": None,
    }  # fmt: skip
    assert "set" in outputs[0].output


def test_imp_toml_never_holds_the_token(store: ImpStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMPYARD_DISCORD_TOKEN_PIP", SECRET)
    store.add("pip")
    assert SECRET not in store.config_path("pip").read_text()


# ------------------------------------------------------------------ parse_config directly


def test_line_numbers_survive_multiline_arrays_with_brackets_in_strings() -> None:
    text = 'name = "pip"\n[model]\nshort_path = [\n  ["[x]", "]"],\n  ["^a$", ".*"]\n]\nmax_tokens = "many"\n'
    with pytest.raises(ImpConfigError) as caught:
        parse_config(text, "imp.toml")
    assert (caught.value.line, caught.value.key) == (7, "model.max_tokens")


def test_dotted_keys_are_located() -> None:
    with pytest.raises(ImpConfigError) as caught:
        parse_config('name = "pip"\n\nsessions.idle_s = -1\n', "imp.toml")
    assert (caught.value.line, caught.value.key) == (3, "sessions.idle_s")


def test_store_add_rejects_existing_even_in_a_race(store: ImpStore) -> None:
    store.add("pip", "one")
    with pytest.raises(ImpExists):
        store.add("pip", "two")
    assert store.persona(store.get("pip")) == "one"


def test_the_news_file_text_reaches_the_box_not_its_path(tmp_path: Path) -> None:
    store = ImpStore(tmp_path)
    config = store.add("pip", "You are Pip.", model={"news_file": "news.md", "tools": ["web_fetch"]})
    (store.path("pip") / "news.md").write_text("The harbour opens on Friday.")
    responder = store.imp_spec(config).responder
    assert responder.news == "The harbour opens on Friday."  # ENV-10: read on the host
    assert responder.tools == ["web_fetch"]
    assert "news.md" not in store.imp_spec(config).model_dump_json()
