"""Issue 36, "one source of truth for imps": every home on one database runs every imp with the same settings. The
database keeps each imp's files with a revision; a home's files are a working copy, brought up to date by every
``impyard imp`` command and every host start, and a running host picks a new revision up for its next boxes."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result

from box.protocol.models import Author, Message
from impyard.cli import cli
from impyard.clock import FixedClock
from impyard.conversation.pipeline import Inbound
from impyard.gateway.surfaces import RecordingSurface
from impyard.imps.shared import SharedImps
from impyard.imps.store import ImpStore
from impyard.runtime import open_runtime
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI
from testing.inprocess import InProcessBackend


@pytest.fixture
def shared_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """One SQLite database for two homes (as two hosts share one PostgreSQL)."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("IMPYARD_DATABASE_URL", url)
    open_database().close()
    return url


def on(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"IMPYARD_HOME": str(home)})


def homes(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "home-a", tmp_path / "home-b"


def test_an_imp_added_on_one_home_is_the_same_on_the_other(shared_db: str, tmp_path: Path) -> None:
    a, b = homes(tmp_path)
    added = on(a, "imp", "add", "pip", "--model", "gpt-4.1", "--persona", "You are Pip from home A.")
    assert added.exit_code == 0, added.output
    assert "revision 1 in the database" in added.output
    shown = on(b, "imp", "show", "pip")
    assert shown.exit_code == 0, shown.output
    assert "imp pip: updated to revision 1 from the database" in shown.output and "gpt-4.1" in shown.output
    assert (b / "imps/pip/imp.toml").read_text() == (a / "imps/pip/imp.toml").read_text()
    assert (b / "imps/pip/persona.md").read_text() == "You are Pip from home A."

    changed = on(b, "imp", "set", "pip", "model.model=gpt-4o")  # made on B …
    assert changed.exit_code == 0 and "as revision 2" in changed.output, changed.output
    assert "gpt-4o" in on(a, "imp", "show", "pip").output  # … A runs it
    assert 'model = "gpt-4o"' in (a / "imps/pip/imp.toml").read_text()


def test_a_hand_edit_is_published_and_a_crossed_edit_refused(shared_db: str, tmp_path: Path) -> None:
    a, b = homes(tmp_path)
    assert on(a, "imp", "add", "pip").exit_code == 0
    assert on(b, "imp", "ls").exit_code == 0
    (a / "imps/pip/persona.md").write_text("You are Pip, edited by hand on A.")
    assert on(a, "imp", "ls").exit_code == 0  # any imp command sends the home's change up
    assert SharedImps(open_database()).get("pip").revision == 2  # type: ignore[union-attr]
    on(b, "imp", "ls")
    assert (b / "imps/pip/persona.md").read_text() == "You are Pip, edited by hand on A."

    # Both change pip: B through the CLI (published), A by hand (not yet): A's next command refuses, writes nothing.
    assert on(b, "imp", "set", "pip", "sessions.idle_s=90").exit_code == 0
    toml_a = (a / "imps/pip/imp.toml").read_text() + "\n# A's own note\n"
    (a / "imps/pip/imp.toml").write_text(toml_a)
    refused = on(a, "imp", "show", "pip")
    assert refused.exit_code != 0
    line = refused.output.strip().splitlines()[-1]
    assert (
        "changed here since revision 2 and in the database since" in line and "impyard imp apply -f" in line
    )
    assert (a / "imps/pip/imp.toml").read_text() == toml_a  # nothing written over A's edit
    settled = on(a, "imp", "apply", "-f", str(a / "imps/pip/imp.toml"))  # A's wins, as the message says
    assert settled.exit_code == 0 and "revision 4" in settled.output, settled.output
    on(b, "imp", "ls")
    assert (b / "imps/pip/imp.toml").read_text() == toml_a


def test_apply_makes_a_file_from_version_control_the_settings(shared_db: str, tmp_path: Path) -> None:
    a, b = homes(tmp_path)
    kept = tmp_path / "git" / "bo.imp.toml"
    kept.parent.mkdir()
    kept.write_text('name = "bo"\n\n[model]\nmodel = "gpt-4.1"\n')
    applied = on(a, "imp", "apply", "-f", str(kept))
    assert applied.exit_code == 0 and "revision 1" in applied.output, applied.output
    assert "gpt-4.1" in on(b, "imp", "show", "bo").output
    again = on(a, "imp", "apply", "-f", str(kept))
    assert again.exit_code == 0 and "nothing to change" in again.output
    kept.write_text('name = "bo"\n\n[model]\ntemperature = 9\n')
    bad = on(a, "imp", "apply", "-f", str(kept))
    assert bad.exit_code != 0 and "nothing was written" in bad.output
    assert SharedImps(open_database()).get("bo").revision == 1  # type: ignore[union-attr]


def test_an_imp_removed_on_one_home_goes_from_the_other_keeping_its_state(
    shared_db: str, tmp_path: Path
) -> None:
    a, b = homes(tmp_path)
    assert on(a, "imp", "add", "pip").exit_code == 0
    on(b, "imp", "ls")
    (b / "imps/pip/state").mkdir()
    (b / "imps/pip/state/kept.txt").write_text("a box's scratch")
    assert on(a, "imp", "rm", "pip", "--yes").exit_code == 0
    listed = on(b, "imp", "ls")
    assert "imp pip: removed here, as it was removed from the database" in listed.output
    assert not (b / "imps/pip/imp.toml").exists() and (b / "imps/pip/state/kept.txt").exists()
    assert SharedImps(open_database()).get("pip") is None


def test_a_home_without_a_database_is_not_given_one_by_a_refused_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "fresh"
    refused = on(home, "imp", "show", "nobody")
    assert refused.exit_code != 0
    assert not (home / "impyard.db").exists()


@pytest.mark.anyio
@pytest.mark.fake_model(env=True, answer="Hello!")
async def test_a_running_host_uses_a_new_revision_for_its_next_boxes(
    shared_db: str,
    tmp_path: Path,
    fake: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = homes(tmp_path)
    monkeypatch.setenv("IMPYARD_HOME", str(b))
    monkeypatch.setenv("IMPYARD_IMP_SYNC_S", "1")
    ImpStore(a).add("pip", "You are Pip, the first persona.", memory={"enabled": False})
    assert on(a, "imp", "ls").exit_code == 0  # published from A
    clock = FixedClock()
    caplog.set_level(logging.INFO, logger="impyard.runtime")
    async with open_runtime(
        ["pip"], RecordingSurface(), clock=clock, backends={"pip": InProcessBackend()}, surfaces=("discord",),
        pump_period_s=None,
    ) as rt:  # fmt: skip
        assert (
            b / "imps/pip/persona.md"
        ).read_text() == "You are Pip, the first persona."  # fetched at start
        await say(rt, clock, "c1", "m1")
        (a / "imps/pip/persona.md").write_text("You are Pip, the second persona.")
        assert (
            await anyio.to_thread.run_sync(lambda: on(a, "imp", "set", "pip", "model.temperature=0.3"))
        ).exit_code == 0
        with anyio.fail_after(30):
            while rt.conversations.configs["pip"].model.temperature != 0.3:
                await anyio.sleep(0.05)
        await say(rt, clock, "c2", "m2")  # a new channel: a new box, with the new revision
    replies = [r.body for r in fake.requests_for("/chat/completions") if r.purpose == "reply"]
    first, second = replies[0], replies[-1]
    assert "the first persona" in json.dumps(first["messages"][0])
    assert "the second persona" in json.dumps(second["messages"][0]) and second.get("temperature") == 0.3
    assert "imp pip: revision 3 applied: its next boxes use it" in caplog.text


async def say(rt: object, clock: FixedClock, channel: str, message_id: str) -> None:
    message = Message(
        id=message_id, author=Author(id="ann", name="ann"), content="hello", created_at=clock.now()
    )
    inbound = Inbound(
        surface="discord", channel_id=channel, channel_kind="dm", message=message, channel_name="dm"
    )
    assert await rt.conversations.receive("pip", inbound) in ("started", "queued")  # type: ignore[attr-defined]
    with anyio.fail_after(30):
        await rt.conversations.wait_finished(message.id)  # type: ignore[attr-defined]
    clock.advance(timedelta(minutes=1))


def test_each_host_says_which_revision_of_each_imp_it_runs(impyard_home: Path) -> None:
    from datetime import timedelta

    from impyard.clock import SystemClock
    from impyard.storage.leases import HostCard, LeaseStore
    from impyard.storage.liveness import Holder

    card = HostCard("serve", "/srv/yard", imp_revisions=lambda: {"pip": 3, "bo": 1})
    assert card.detail()["imps"] == {"bo": 1, "pip": 3}
    db = open_database()
    try:
        far = Holder("far-away", "boot", 4242, "1")
        LeaseStore(db, FixedClock(SystemClock().now()), me=far).acquire(
            "host:far-away/4242", card.detail(), timedelta(hours=1)
        )
    finally:
        db.close()
    shown = CliRunner().invoke(cli, ["hosts"])
    assert "bo@1, pip@3" in shown.output, shown.output
    (listed,) = json.loads(CliRunner().invoke(cli, ["hosts", "--json"]).output)["hosts"]
    assert listed["imps"] == {"bo": 1, "pip": 3}


def test_two_homes_publishing_the_same_new_imp_at_once_agree(shared_db: str, tmp_path: Path) -> None:
    """Two hosts of fresh homes start together with the same pip: the second's publish finds the first's row (it
    read the database just before): it judges again against that row instead of refusing to start."""
    from impyard.imps.shared import Published, read_mark, settings_files, sync_home

    a, b = homes(tmp_path)
    for home in (a, b):
        ImpStore(home).add("pip", "You are Pip.")
    db = open_database()
    try:
        SharedImps(db).publish("pip", settings_files(a / "imps/pip"), base=None)  # home A got there first

        class ReadJustBefore(SharedImps):
            def all(self) -> dict[str, Published]:
                return {}

        report = sync_home(ImpStore(b), ReadJustBefore(db))
    finally:
        db.close()
    mark = read_mark(b / "imps/pip")
    assert mark is not None and mark.revision == 1 and report.published == []
