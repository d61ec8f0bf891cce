"""``impyard doctor`` (issue 17): finds what stops a chat from working, says the fix, exits 1 when anything does.

The rules are tables over plain values; the CLI runs against the loopback fake OpenAI through the real gateway
(one metered, audited call), the real policy loader and the gateway's own dry run. Docker is observed through
``docker_facts``, replaced here so that the tests do not depend on this machine's engine.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from impyard.cli import cli
from impyard.cli.doctor_rules import (
    FREE_FAIL_BYTES,
    FREE_WARN_BYTES,
    DockerFacts,
    Finding,
    ModelUse,
    Refusal,
    docker_findings,
    exit_code,
    imp_finding,
    model_uses,
    state_finding,
)
from impyard.clock import SystemClock
from impyard.gateway.audit import AuditLog
from impyard.imps.config import new_imp_settings
from impyard.imps.store import ImpStore
from impyard.imps.validate import validate_config
from impyard.storage.db import open_database
from testing.fake_openai import LOCAL_SERVER_EMBEDDING_MODEL, FakeOpenAI, error

BUILT = DockerFacts(reachable=True, version="27.0", expected_image="impyard-box:abc", image_present=True)


@pytest.fixture(autouse=True)
def docker(monkeypatch: pytest.MonkeyPatch) -> list[DockerFacts]:
    """What the Docker engine answers; a test puts other facts in the list."""
    facts = [BUILT]
    monkeypatch.setattr("impyard.cli.doctor.docker_facts", lambda: facts[0])
    return facts


@pytest.fixture
def dead_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def env(fake: FakeOpenAI, **more: str) -> dict[str, str]:
    return {"OPENAI_API_KEY": fake.api_key or "", "OPENAI_BASE_URL": fake.base_url, **more}


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[Result, dict[str, dict[str, Any]]]:
    result = CliRunner(env=env).invoke(cli, ["doctor", "--json", *args])
    rows = {row["item"]: row for row in json.loads(result.stdout)}
    return result, rows


def add_pip(**settings: Any) -> None:
    ImpStore().add("pip", **new_imp_settings(settings))


def failed(rows: dict[str, dict[str, Any]]) -> list[str]:
    return [item for item, row in rows.items() if row["status"] == "fail"]


# --- the CLI ---------------------------------------------------------------------------------------------


def test_a_working_setup_passes_with_one_metered_audited_call(fake: FakeOpenAI) -> None:
    add_pip()
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 0, result.output
    assert failed(rows) == [] and rows["Model endpoint"]["status"] == "ok"
    assert (
        f"gpt-5.1 at {fake.base_url} (server openai: max_completion_tokens, json_schema strict) answered a reply "
        "envelope in " in rows["Model endpoint"]["detail"]
    )
    assert "turn ceiling 120 s, each attempt 35 s (from server openai)" in rows["Model endpoint"]["detail"]
    assert (
        "reply gpt-5.1" in rows["Imp pip"]["detail"]
        and "embedding local/all-MiniLM-L6-v2" in rows["Imp pip"]["detail"]  # a new imp embeds on the host
    )
    assert rows["Embedder pip"]["status"] == "ok"  # issue 33: the local model loads and embeds, no call made
    assert rows["Embedder pip"]["detail"].startswith(
        "local/all-MiniLM-L6-v2 on this host: 384 dimensions, ready in"
    )
    (call,) = fake.requests
    assert call.endpoint == "/chat/completions" and call.body["response_format"]["type"] == "json_schema"
    # Issue 38: the imp's own reply call: its output cap, the envelope schema, strict as its server takes it.
    assert call.headers["x-impyard-purpose"] == "reply" and call.body["max_completion_tokens"] == 1024
    assert call.body["response_format"]["json_schema"]["name"] == "envelope"
    assert call.body["response_format"]["json_schema"]["strict"] is True
    db = open_database()
    (row,) = AuditLog(db, SystemClock()).tail(10)
    db.close()
    assert (row.imp, row.channel_id, row.purpose, row.verdict) == ("pip", "operator:cli", "reply", "allowed")
    spent = json.loads(CliRunner().invoke(cli, ["budget", "show", "--json"]).output)
    assert [r["daily_spent_usd"] > 0 for r in spent if r["scope"] == "pip"] == [True]


def test_people_get_a_table_and_one_error_line(fake: FakeOpenAI) -> None:
    add_pip(model={"model": "gpt-x"})
    result = CliRunner(env=env(fake)).invoke(cli, ["doctor", "--no-model-call"])
    assert result.exit_code == 1
    assert "FAIL\tImp pip\treply with gpt-x: denied by default-deny" in result.stdout
    assert result.stderr.strip().splitlines() == [
        "Error: 1 problem(s) stop a chat from working: Imp pip; see the fixes above"
    ]


def test_people_in_a_terminal_get_every_fix_in_full(fake: FakeOpenAI) -> None:
    add_pip(memory={"models": {"summary": "gpt-x"}})
    terminal = env(fake, TTY_COMPATIBLE="1", COLUMNS="60", NO_COLOR="1")
    result = CliRunner(env=terminal).invoke(cli, ["doctor", "--no-model-call"])
    words = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", result.stdout).split())
    assert result.exit_code == 1 and "FAIL Imp pip summary with gpt-x: denied by default-deny" in words
    assert "or choose an allowed model: impyard imp set pip memory.models.summary=MODEL" in words
    assert "…" not in words.replace("OPENAI_API_KEY=sk-…", "").replace("IMPYARD_DISCORD_TOKEN_PIP=…", "")


def test_no_model_call_sends_nothing(fake: FakeOpenAI) -> None:
    add_pip()
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 0 and fake.requests == []
    assert rows["Model endpoint"]["status"] == "warn"


@pytest.mark.parametrize(
    ("settings", "purpose", "model", "fix"),
    [
        ({"model": {"model": "gpt-x"}}, "reply", "gpt-x", "impyard imp set pip model.model=MODEL"),
        ({"model": {"vision_model": "gpt-x"}}, "reply", "gpt-x", "impyard imp set pip model.vision_model=MODEL"),
        ({"memory": {"models": {"summary": "gpt-x"}}}, "summary", "gpt-x", "imp set pip memory.models.summary=MODEL"),
        ({"memory": {"models": {"appraisal": "gpt-x"}}}, "appraisal", "gpt-x", "memory.models.appraisal=MODEL"),
        ({"memory": {"embedder": "gateway", "embedding_model": "text-embedding-ada-002"}}, "embedding",
         "text-embedding-ada-002",
         "impyard imp set pip memory.embedding_model=MODEL"),
    ],
)  # fmt: skip
def test_every_model_an_imp_uses_must_be_allowed_for_its_purpose(
    fake: FakeOpenAI, settings: dict[str, Any], purpose: str, model: str, fix: str
) -> None:
    add_pip(**settings)
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 1 and failed(rows) == ["Imp pip"], rows
    row = rows["Imp pip"]
    assert (
        row["detail"].startswith(f"{purpose} with {model}: denied by")
        and f"purpose '{purpose}'" in row["detail"]
    )
    assert fix in row["fix"]


def test_memory_calls_are_checked_only_with_memory_on(fake: FakeOpenAI) -> None:
    add_pip(
        memory={"enabled": False, "models": {"summary": "gpt-x"}, "embedding_model": "text-embedding-ada-002"}
    )
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 0 and rows["Imp pip"]["detail"] == "allowed and priced: reply gpt-5.1"


def test_a_memory_imp_on_the_hashing_embedder_makes_no_embedding_call(fake: FakeOpenAI) -> None:
    add_pip(memory={"embedder": "hashing", "embedding_model": "text-embedding-ada-002"})
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 0 and "embedding" not in rows["Imp pip"]["detail"]


PRICELESS = """
[[rules]]
name = "model-text"
method = "model.request"
action = "allow"
paths = ["/chat/completions"]
purposes = { reply = ["gpt-x"] }
"""


def test_a_model_without_a_price_is_named_with_the_table_to_add(fake: FakeOpenAI, impyard_home: Path) -> None:
    (impyard_home / "policies").mkdir(parents=True)
    (impyard_home / "policies" / "mine.toml").write_text(PRICELESS)
    add_pip(model={"model": "gpt-x"}, memory={"enabled": False})
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 1 and set(failed(rows)) == {"Imp pip", "Model endpoint"}
    assert "reply with gpt-x: denied by prices" in rows["Imp pip"]["detail"]
    assert '[prices."gpt-x"]' in rows["Imp pip"]["fix"] and fake.requests == []  # refused before any call


def test_a_spent_budget_stops_the_imp_and_the_call(fake: FakeOpenAI) -> None:
    add_pip()
    assert CliRunner().invoke(cli, ["budget", "set", "pip", "--daily", "0"]).exit_code == 0
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 1 and set(failed(rows)) == {"Imp pip", "Model endpoint"}
    assert (
        "budget exhausted" in rows["Imp pip"]["detail"] and "impyard budget set pip" in rows["Imp pip"]["fix"]
    )
    assert "budget exhausted" in rows["Model endpoint"]["detail"] and fake.requests == []


def test_a_broken_policy_is_named_as_the_gateway_names_it(fake: FakeOpenAI, impyard_home: Path) -> None:
    (impyard_home / "policies").mkdir(parents=True)
    (impyard_home / "policies" / "mine.toml").write_text(
        '[[rules]]\nname = "x"\nmethod = "model.request"\naction = "maybe"\n'
    )
    add_pip()
    from impyard.gateway.policy import PolicyError, load_policy

    with pytest.raises(PolicyError) as gateway_error:
        load_policy()
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 1 and rows["Policy"]["status"] == "fail"
    assert rows["Policy"]["detail"].startswith(str(gateway_error.value.problems[0]))
    assert "mine.toml:4" in rows["Policy"]["detail"] and "impyard policy check" in rows["Policy"]["fix"]
    assert rows["Imp pip"]["status"] == "warn" and fake.requests == []


def test_a_broken_imp_toml_is_named_with_imp_edit(fake: FakeOpenAI) -> None:
    add_pip()
    file = ImpStore().config_path("pip")
    file.write_text(file.read_text().replace("[sessions]", "[sessions]\nidle_s = -1", 1))
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 1 and "key 'sessions.idle_s'" in rows["Imp pip"]["detail"]
    assert rows["Imp pip"]["fix"] == "impyard imp edit pip"


@pytest.mark.parametrize(
    ("answer", "detail", "fix"),
    [
        (
            error(401, "Incorrect API key provided."),
            "HTTP 401: Incorrect API key provided.",
            "check OPENAI_API_KEY",
        ),
        (
            error(404, "The model does not exist"),
            "HTTP 404: The model does not exist",
            "imp set pip model.model=",
        ),
        (error(429, "quota"), "HTTP 429", "out of quota"),
        ("plain words, not JSON", "but the answer is not JSON: plain words", "structured output"),
    ],
)
def test_the_endpoint_row_says_what_the_server_answered(
    fake: FakeOpenAI, answer: Any, detail: str, fix: str
) -> None:
    add_pip()
    fake.script(answer)
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 1 and failed(rows) == ["Model endpoint"], rows
    assert detail in rows["Model endpoint"]["detail"] and fix in rows["Model endpoint"]["fix"]


def test_an_unreachable_endpoint_and_a_missing_key(fake: FakeOpenAI, dead_port: int) -> None:
    add_pip()
    result, rows = doctor(
        env={"OPENAI_API_KEY": "sk-x", "OPENAI_BASE_URL": f"http://127.0.0.1:{dead_port}/v1"}
    )
    assert result.exit_code == 1 and "cannot connect to the model API" in rows["Model endpoint"]["detail"]
    result, rows = doctor(env={"OPENAI_BASE_URL": fake.base_url})
    assert result.exit_code == 1 and rows["Model endpoint"]["detail"].startswith("OPENAI_API_KEY not set")
    assert "export OPENAI_API_KEY" in rows["Model endpoint"]["fix"]


@pytest.mark.parametrize(
    ("facts", "backend", "engine", "image", "code"),
    [
        (BUILT, "auto", "ok", "ok", 0),
        (
            DockerFacts(True, "27", None, "impyard-box:new", False, ("impyard-box:old",)),
            "auto",
            "ok",
            "fail",
            1,
        ),
        (DockerFacts(False, engine_problem="not reachable"), "auto", "warn", "warn", 0),
        (DockerFacts(False, engine_problem="not reachable"), "docker", "fail", "warn", 1),
        (
            DockerFacts(True, "27", "cannot apply --memory-swap", "impyard-box:abc", True),
            "auto",
            "fail",
            "ok",
            1,
        ),
    ],
)
def test_docker_and_the_box_image_through_the_cli(
    fake: FakeOpenAI,
    docker: list[DockerFacts],
    facts: DockerFacts,
    backend: str,
    engine: str,
    image: str,
    code: int,
) -> None:
    docker[0] = facts
    add_pip(box={"backend": backend})
    result, rows = doctor("--no-model-call", env=env(fake))
    assert (rows["Docker engine"]["status"], rows["Box image"]["status"], result.exit_code) == (
        engine,
        image,
        code,
    )
    if image == "fail":
        assert "impyard-box:new is not built" in rows["Box image"]["detail"] and rows["Box image"][
            "fix"
        ].startswith("impyard box build")


def test_little_free_space_fails(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    add_pip()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 5, 5 * 1024**2))
    result, rows = doctor("--no-model-call", env=env(fake))
    assert (
        result.exit_code == 1
        and rows["State dir"]["status"] == "fail"
        and "5 MiB free" in rows["State dir"]["detail"]
    )


def test_an_unset_discord_token_is_only_a_warning(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    add_pip()
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 0 and rows["Discord token (pip)"]["status"] == "warn"
    assert "export IMPYARD_DISCORD_TOKEN_PIP" in rows["Discord token (pip)"]["fix"]
    ImpStore().remove("pip")
    add_pip(discord={"token_file": "token.txt"})  # a configured file that is not there stops Discord
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 1 and rows["Discord token (pip)"]["status"] == "fail"


def test_no_imps_yet_is_a_warning_and_no_call(fake: FakeOpenAI) -> None:
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 0 and rows["Imps"]["status"] == "warn" and fake.requests == []


# --- the rules -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("problem", "free", "status"),
    [
        ("Permission denied", None, "fail"),
        (None, FREE_FAIL_BYTES - 1, "fail"),
        (None, FREE_WARN_BYTES - 1, "warn"),
        (None, FREE_WARN_BYTES, "ok"),
        (None, None, "ok"),
    ],
)
def test_state_dir_rule(problem: str | None, free: int | None, status: str) -> None:
    assert state_finding("/home", problem, free).status == status


@pytest.mark.parametrize(
    ("facts", "backends", "statuses"),
    [
        (BUILT, set(), ["ok", "ok"]),
        (DockerFacts(False), set(), ["warn", "warn"]),  # no imps yet: a new imp is on auto
        (DockerFacts(False), {"process"}, ["ok", "ok"]),
        (DockerFacts(False), {"auto", "docker"}, ["fail", "warn"]),
        (DockerFacts(True, "27", None, "impyard-box:x", False), {"auto"}, ["ok", "fail"]),
        (DockerFacts(True, "27", None, "impyard-box:x", False), {"process"}, ["ok", "ok"]),
    ],
)
def test_docker_rule(facts: DockerFacts, backends: set[str], statuses: list[str]) -> None:
    assert [finding.status for finding in docker_findings(facts, backends)] == statuses


def test_imp_rule_and_exit_code() -> None:
    use = ModelUse("summary", "/chat/completions", "gpt-x", "memory.models.summary", {})
    refused = imp_finding("pip", [use], [Refusal(use, "denied", "model-text", "no")], "auto", "/p")
    assert refused.status == "fail" and "memory.models.summary=MODEL" in refused.fix
    assert imp_finding("pip", [use], [], "process", "/p").status == "warn"
    assert exit_code([Finding("a", "ok", ""), Finding("b", "warn", "")]) == 0
    assert exit_code([Finding("a", "ok", ""), Finding("b", "fail", "")]) == 1


def test_model_uses_follow_the_box() -> None:
    config = validate_config(
        {"name": "pip", "model": {"model": "a", "retry_model": "b", "use_responses_api": True},
         "memory": {"enabled": True, "models": {"filter": "c", "reply": "d"}}}, "imp.toml",
    )  # fmt: skip
    uses = {(use.purpose, use.path, use.model) for use in model_uses(config)}
    # issue 38: every memory call, as the README's rule lists them; the arrival goes where [memory] models
    # sends the reply's own calls (box/memory/calls.py model_for)
    assert uses == {
        ("reply", "/responses", "a"), ("reply", "/responses", "b"), ("arrival", "/chat/completions", "d"),
        ("appraisal", "/chat/completions", "gpt-4.1-mini"),  # issue 33: the per-turn judgements' default on OpenAI
        ("filter", "/chat/completions", "c"), ("summary", "/chat/completions", "gpt-4.1-mini"),
        ("introspection", "/chat/completions", "a"), ("selection", "/chat/completions", "gpt-4.1-mini"),
        ("learning", "/chat/completions", "a"), ("classification", "/chat/completions", "gpt-4.1-mini"),
        ("sleep", "/chat/completions", "a"),
        ("embedding", "/embeddings", "text-embedding-3-small"),
    }  # fmt: skip
    config = validate_config({"name": "pip", "memory": {"enabled": True, "introspection": False}}, "imp.toml")
    assert "introspection" not in {
        use.purpose for use in model_uses(config)
    }  # mechanism 52 off: no such call


@pytest.mark.parametrize(
    ("url", "status", "shown"),
    [
        ("", "ok", "impyard.db (schema version"),
        ("mysql://root:sekrit@db/impyard", "fail", "has the scheme 'mysql'"),
        ("postgresql://imp:sekrit@127.0.0.1:1/impyard", "fail", "database 'impyard' on 127.0.0.1:1"),
    ],
)
def test_the_database_row_names_where_the_store_is_never_the_password(
    url: str, status: str, shown: str
) -> None:
    """Issue 21: IMPYARD_DATABASE_URL in doctor — a bad or unreachable URL fails the row in one line, without
    the password."""
    _, rows = doctor("--no-model-call", env={"IMPYARD_DATABASE_URL": url})
    row = rows["Database"]
    assert row["status"] == status and shown in row["detail"], row
    assert "sekrit" not in json.dumps(rows)


# --- issue 33: an embedding model that ignores `dimensions` --------------------------------------------------

LOCAL_SERVER_POLICY = """
[[rules]]
name = "embeddings-server"
method = "model.request"
action = "allow"
paths = ["/embeddings"]
purposes = { embedding = ["all-minilm"] }

[prices."all-minilm"]
input = 0
"""


def test_doctor_says_when_the_embedding_model_ignores_dimensions_and_learns_its_length(
    fake: FakeOpenAI, impyard_home: Path
) -> None:
    fake.add_model("all-minilm", LOCAL_SERVER_EMBEDDING_MODEL)
    (impyard_home / "policies").mkdir(parents=True)
    (impyard_home / "policies" / "server.toml").write_text(LOCAL_SERVER_POLICY)
    add_pip(memory={"embedder": "gateway", "embedding_model": "all-minilm"})
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 0, result.output  # a warning: the next box takes the model's vectors
    row = rows["Embedder pip"]
    assert row["status"] == "warn"
    assert row["detail"] == (
        "all-minilm ignores dimensions=256 and answers 384-dimension vectors: learned, pip's next box asks for 384 "
        "(a box started before keeps refusing them: no recall by meaning)"
    )
    assert row["fix"] == "say so in imp.toml: impyard imp set pip memory.dimensions=384"
    [asked] = [r for r in fake.requests if r.endpoint == "/embeddings"]
    assert asked.body["dimensions"] == 256
    assert ImpStore().embedding_lengths("pip") == {"all-minilm": 384}
    # Learned: the next look asks for 384 and gets it; without a call, it says what was learned.
    result, rows = doctor(env=env(fake))
    assert rows["Embedder pip"]["status"] == "ok" and "answers 384-dimension vectors, as asked" in rows[
        "Embedder pip"]["detail"]  # fmt: skip
    result, rows = doctor("--no-model-call", env=env(fake))
    assert rows["Embedder pip"]["status"] == "warn" and "was seen to ignore dimensions" in rows["Embedder pip"][
        "detail"]  # fmt: skip


def test_doctor_fails_an_embedding_length_the_box_cannot_take(fake: FakeOpenAI, impyard_home: Path) -> None:
    fake.add_model("all-minilm", LOCAL_SERVER_EMBEDDING_MODEL.replace(native_dimensions=8192))
    (impyard_home / "policies").mkdir(parents=True)
    (impyard_home / "policies" / "server.toml").write_text(LOCAL_SERVER_POLICY)
    add_pip(memory={"embedder": "gateway", "embedding_model": "all-minilm"})
    result, rows = doctor(env=env(fake))
    assert result.exit_code == 1 and failed(rows) == ["Embedder pip"]
    assert "cannot take (8 to 4096): pip recalls by person and recency only" in rows["Embedder pip"]["detail"]
    assert rows["Embedder pip"]["fix"].endswith("impyard imp set pip memory.embedder=local")


def test_doctor_says_which_memories_another_embedder_made(fake: FakeOpenAI) -> None:
    add_pip(memory={"embedder": "hashing"})
    for event in ("Ann told me about her dog Rex.", "Bob likes sailing."):
        said = CliRunner().invoke(
            cli, ["memory", "remember", "pip", event, "--valence", "0.5", "--intensity", "0.5"]
        )
        assert said.exit_code == 0, said.output
    result, rows = doctor("--no-model-call", env=env(fake))
    assert "Memories pip" not in rows  # made by the embedder it still has
    switched = CliRunner().invoke(cli, ["imp", "set", "pip", "memory.embedder=local"])
    assert switched.exit_code == 0, switched.output
    result, rows = doctor("--no-model-call", env=env(fake))
    assert result.exit_code == 0
    row = rows["Memories pip"]
    assert row["status"] == "warn"
    assert row["detail"] == (
        "2 of pip's memories were embedded by another embedder (2 at 64 dimensions; its local embedder gives 384): "
        "found by person and recency, not by meaning"
    )
    assert row["fix"].endswith("impyard imp set pip memory.embedder=gateway")
