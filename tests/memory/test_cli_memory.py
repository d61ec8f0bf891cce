"""``impyard memory show|search|remember|forget`` through the CLI (issue 23, "Operator verbs", "Bad input").

``search`` and ``remember`` embed their text the way the imp's boxes do: through the gateway (judged, metered,
audited — shown here against the fake OpenAI) or, with ``embedder = "hashing"``, locally with no call at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner, Result

from box.common.embedding import hashing_vector
from box.protocol.memory import EncodeParams, NewEpisode, NewRecord
from box.protocol.models import Author, Message
from impyard.cli import cli
from impyard.clock import SystemClock
from impyard.conversation.history import History
from impyard.imps.store import ImpStore
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from impyard.storage.db import open_database
from testing.fake_openai import FakeOpenAI

CAROL_ID, DAVE_ID = "2003", "2004"
GUILD = "guild:1000"


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def ok(*args: str, env: dict[str, str] | None = None) -> Any:
    result = run(*args, "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def refused(*args: str, env: dict[str, str] | None = None) -> str:
    """A user error: exit 1 and one line that starts with Error:."""
    result = run(*args, env=env)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def hashing_imp(name: str = "pip") -> None:
    ImpStore().add(name, memory={"enabled": True, "embedder": "hashing"})


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    db = open_database()
    yield MemoryStore(db, SystemClock().now)
    db.close()


def lived(
    store: MemoryStore,
    *,
    author: str,
    author_id: str,
    conclusion: str,
    said: str,
    message_id: str,
    scope: str = GUILD,
    channel: str = "1001",
    join: str | None = None,
) -> str:
    """A moment as a box keeps it (memory.encode): a record (or a join) and its episode."""
    scoped = store.scoped("pip", SessionScopes(scope, (scope,)), channel)
    record = None if join else NewRecord(
        author=author, author_id=author_id, feeling="glad", conclusion=conclusion, valence=0.5, intensity=0.6,
        vector=hashing_vector(conclusion),
    )  # fmt: skip
    episode = NewEpisode(author=author, author_id=author_id, message_id=message_id, as_happened=said,
                         vector=hashing_vector(said))  # fmt: skip
    record_id, _ = scoped.encode(EncodeParams(record=record, join=join, episode=episode))
    return record_id


def said_in_history(name: str, author_id: str, message_id: str) -> None:
    db = open_database()
    History(db, SystemClock()).record(
        "1001", Message(id=message_id, author=Author(id=author_id, name=name), content="hi",
                        created_at=datetime.now(UTC)),
    )  # fmt: skip
    db.close()


def count(store: MemoryStore) -> int:
    return store.count("pip")


# ------------------------------------------------------------------ show, remember, search, forget (hashing)


def test_m115_remember_gives_a_memory_that_show_and_search_find() -> None:
    hashing_imp()
    given = ok("memory", "remember", "pip", "A storm sank my first boat.", "--valence", "-0.7",
               "--intensity", "0.8", "--age", "720h")  # fmt: skip
    other = ok("memory", "remember", "pip", "Carol taught me to bake bread.", "--valence", "0.6",
               "--intensity", "0.5", "--scope", GUILD)  # fmt: skip
    assert given["scope"] == "terminal" and given["age_hours"] == 720 and given["dims"] == 64
    shown = ok("memory", "show", "pip")
    assert [r["id"] for r in shown] == [other["record"], given["record"]]  # most recently felt first
    old = shown[1]
    assert (old["author"], old["origin"], old["scope"], old["valence"], old["intensity"]) == (
        "Self", "given", "terminal", -0.7, 0.8)  # fmt: skip
    assert old["felt"] == pytest.approx(0.2407, abs=0.002)  # fades from its past date (mechanism 7)
    assert old["episodes"][0]["as_happened"] == "A storm sank my first boat."
    found = ok("memory", "search", "pip", "the storm and the boat")
    assert found[0]["id"] == given["record"] and found[0]["score"] > 0
    in_guild = ok("memory", "search", "pip", "the storm and the boat", "--scope", GUILD)
    assert [r["id"] for r in in_guild] == [other["record"]]  # the terminal's memory stays out
    assert [r["id"] for r in ok("memory", "show", "pip", "--scope", GUILD)] == [other["record"]]
    assert [r["id"] for r in ok("memory", "show", "pip", "--person", "Carol")] == [other["record"]]
    table = run("memory", "show", "pip")
    assert table.exit_code == 0 and "A storm sank my first boat." in table.output and "given" in table.output


def test_hashing_embedder_makes_no_model_call() -> None:
    hashing_imp()
    with FakeOpenAI() as fake:
        env = {"OPENAI_API_KEY": fake.api_key or "", "OPENAI_BASE_URL": fake.base_url}
        ok("memory", "remember", "pip", "I like tea.", "--valence", "0.3", "--intensity", "0.4", env=env)
        ok("memory", "search", "pip", "tea", env=env)
        assert fake.requests == []


def test_forget_takes_everything_by_or_about_a_person_in_every_scope(store: MemoryStore) -> None:
    hashing_imp()
    said_in_history("carol", CAROL_ID, "m0")
    by_carol = lived(store, author="carol", author_id=CAROL_ID, conclusion="We planned a picnic.",
                     said="carol said: shall we picnic?", message_id="m1")  # fmt: skip
    lived(store, author="carol", author_id=CAROL_ID, conclusion="She trusts me with a secret.",
          said="carol said: don't tell", message_id="m2", scope=f"dm:{CAROL_ID}", channel="1100")  # fmt: skip
    about_carol = lived(store, author="dave", author_id=DAVE_ID, conclusion="Dave thinks carol is late again.",
                        said="dave said: carol is late", message_id="m3")  # fmt: skip
    shared = lived(store, author="dave", author_id=DAVE_ID, conclusion="We talk about the weather.",
                   said="dave said: rain again", message_id="m4")  # fmt: skip
    lived(store, author="carol", author_id=CAROL_ID, conclusion="", said="carol said: sun tomorrow",
          message_id="m5", join=shared)  # fmt: skip
    given = ok(
        "memory", "remember", "pip", "I once met a carol singer.", "--valence", "0.2", "--intensity", "0.3"
    )
    kept = lived(store, author="dave", author_id=DAVE_ID, conclusion="Dave likes jazz.",
                 said="dave said: jazz!", message_id="m6")  # fmt: skip

    # By id: the names it wrote under come from the host's history.
    counts = ok("memory", "forget", "pip", "--person", CAROL_ID, "--yes")
    assert counts["names"] == ["carol"] and counts["ids"] == [CAROL_ID]
    # 4 records (hers, her DM, the one naming her, the given one naming her) with their episodes, and hers in shared
    assert (counts["records"], counts["episodes"]) == (4, 5)
    left = {r["id"]: r for r in ok("memory", "show", "pip", "-n", "100")}
    assert set(left) == {shared, kept}
    assert by_carol not in left and about_carol not in left and given["record"] not in left
    assert [e["author"] for e in left[shared]["episodes"]] == ["dave"]  # her moment in a shared record went
    again = ok("memory", "forget", "pip", "--person", "carol", "-y")
    assert (again["records"], again["episodes"]) == (0, 0)


def test_forget_by_id_finds_the_names_it_spoke_under_in_history(store: MemoryStore) -> None:
    hashing_imp()
    said_in_history(
        "Caz", CAROL_ID, "m0"
    )  # she never wrote a memory herself; the host's history knows her name
    about = lived(store, author="dave", author_id=DAVE_ID, conclusion="Dave misses Caz.", said="dave: miss Caz",
                  message_id="m1")  # fmt: skip
    counts = ok("memory", "forget", "pip", "--person", CAROL_ID, "-y")
    assert (
        counts["names"] == ["Caz"]
        and counts["records"] == 1
        and about not in [r["id"] for r in ok("memory", "show", "pip")]
    )


def test_forget_by_name_finds_the_ids_that_wrote_under_it(store: MemoryStore) -> None:
    hashing_imp()
    lived(store, author="Carol B", author_id=CAROL_ID, conclusion="A quiet talk.", said="Carol B said: hi",
          message_id="m1")  # fmt: skip
    lived(
        store,
        author="dave",
        author_id=DAVE_ID,
        conclusion="Another talk.",
        said="dave said: hi",
        message_id="m2",
    )
    counts = ok("memory", "forget", "pip", "--person", "Carol B", "-y")
    assert counts["ids"] == [CAROL_ID] and counts["records"] == 1 and count(store) == 1


def test_forget_a_common_word_takes_what_was_written_under_it_and_says_what_it_kept(
    store: MemoryStore,
) -> None:
    hashing_imp()
    said_in_history("Al", "2010", "m0")
    theirs = lived(store, author="Al", author_id="2010", conclusion="Boats again.", said="Al: boats",
                   message_id="m1")  # fmt: skip
    about_someone_else = lived(store, author="dave", author_id=DAVE_ID, conclusion="Al Green sings.",
                               said="dave: Al Green", message_id="m2")  # fmt: skip
    counts = ok("memory", "forget", "pip", "--person", "2010", "-y")
    assert (counts["records"], counts["by_id"], counts["by_name"]) == (1, 2, 0)
    assert counts["author_only"] == ["Al"] and counts["mentions_of"] == []
    left = [r["id"] for r in ok("memory", "show", "pip")]
    assert left == [about_someone_else] and theirs not in left
    lived(store, author="Al", author_id="2010", conclusion="More boats.", said="Al: more", message_id="m3")
    text = run("memory", "forget", "pip", "--person", "2010", "-y").output
    assert "(2 found by id, 0 by name); records that only mention 'Al' are kept" in " ".join(text.split())


def test_forget_asks_first_and_a_no_changes_nothing(store: MemoryStore) -> None:
    hashing_imp()
    lived(
        store,
        author="carol",
        author_id=CAROL_ID,
        conclusion="Hello.",
        said="carol said: hello",
        message_id="m1",
    )
    result = CliRunner().invoke(cli, ["memory", "forget", "pip", "--person", "carol"], input="n\n")
    assert result.exit_code == 1 and "cannot be undone" in result.output and count(store) == 1


# ------------------------------------------------------------------ through the gateway


@pytest.fixture
def model(fake_model: FakeOpenAI) -> tuple[FakeOpenAI, dict[str, str]]:
    return fake_model, {"OPENAI_API_KEY": fake_model.api_key or "", "OPENAI_BASE_URL": fake_model.base_url}


def audit_rows() -> list[dict[str, Any]]:
    result = run("audit", "tail", "--imp", "pip", "-n", "50", "--json")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line.strip()]


def test_search_and_remember_embed_through_the_gateway_metered_and_audited(
    model: tuple[FakeOpenAI, dict[str, str]],
) -> None:
    fake, env = model
    ImpStore().add("pip", memory={"enabled": True})  # the default embedder: the gateway
    given = ok("memory", "remember", "pip", "The lighthouse keeper waved.", "--valence", "0.5",
               "--intensity", "0.6", env=env)  # fmt: skip
    ok("memory", "remember", "pip", "Bread burns fast.", "--valence", "-0.2", "--intensity", "0.3", env=env)
    found = ok("memory", "search", "pip", "The lighthouse keeper waved.", env=env)
    calls = fake.requests_for("/embeddings")
    assert len(calls) == 3
    for call in calls:
        assert call.purpose == "embedding"  # the host's purpose header, as the fake read it
        assert (call.body["model"], call.body["dimensions"]) == ("text-embedding-3-small", 256)
    assert given["dims"] == 256 and found[0]["id"] == given["record"]
    # cosine 1 (the same text) × (0.75 + 0.25 × felt 0.6): issue 32's weight of fading in a recall score
    assert found[0]["score"] == pytest.approx(0.9, abs=0.005)
    rows = [r for r in audit_rows() if r["method"] == "model.request"]
    assert len(rows) == 3
    for row in rows:
        assert (row["purpose"], row["verdict"], row["rule"], row["channel_id"]) == (
            "embedding", "allowed", "model-embeddings", "operator:cli")  # fmt: skip
        assert row["cost_micros"] > 0  # metered: charged to pip's budget
    budget = ok("budget", "show")
    spent = sum(r["cost_micros"] for r in rows) / 1_000_000
    assert [b["daily_spent_usd"] for b in budget if b["scope"] == "pip"] == [pytest.approx(spent)], budget


def test_a_spent_budget_refuses_the_embedding_and_nothing_is_remembered(
    model: tuple[FakeOpenAI, dict[str, str]],
    store: MemoryStore,
) -> None:
    fake, env = model
    ImpStore().add("pip", memory={"enabled": True})
    assert run("budget", "set", "pip", "--daily", "0").exit_code == 0
    line = refused("memory", "remember", "pip", "A thing.", "--valence", "0", "--intensity", "0.5", env=env)
    assert "could not be embedded" in line and "budget" in line and "nothing was changed" in line
    assert "budget" in refused("memory", "search", "pip", "a thing", env=env)
    assert fake.requests == [] and count(store) == 0
    assert [r["verdict"] for r in audit_rows()] == ["budget_exhausted", "budget_exhausted"]


def test_without_a_model_key_the_gateway_embedder_says_what_to_do(store: MemoryStore) -> None:
    ImpStore().add("pip", memory={"enabled": True})
    line = refused("memory", "remember", "pip", "A thing.", "--valence", "0", "--intensity", "0.5")
    assert "OPENAI_API_KEY" in line and 'embedder = "hashing"' in line and count(store) == 0


# ------------------------------------------------------------------ bad input: one line, nothing lost


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(("show", "nobody"), "no imp named 'nobody'", id="unknown-imp-show"),
        pytest.param(("forget", "nobody", "--person", "carol", "-y"), "no imp named 'nobody'", id="unknown-imp-forget"),
        pytest.param(("remember", "pip", "x", "--valence", "2", "--intensity", "0.5"),
                     "--valence must be a number from -1 to 1 (got 2)", id="valence-over"),
        pytest.param(("remember", "pip", "x", "--valence", "nan", "--intensity", "0.5"),
                     "--valence must be a number from -1 to 1", id="valence-nan"),
        pytest.param(("remember", "pip", "x", "--valence", "0", "--intensity", "-0.1"),
                     "--intensity must be a number from 0 to 1", id="intensity-under"),
        pytest.param(("remember", "pip", "x", "--valence", "0", "--intensity", "1", "--age", "a while"),
                     "--age 'a while' is not a duration", id="bad-duration"),
        pytest.param(("remember", "pip", "x", "--valence", "0", "--intensity", "1", "--age", "-5h"),
                     "is not a duration", id="negative-duration"),
        pytest.param(("remember", "pip", "x", "--valence", "0", "--intensity", "1", "--age", "1000000d"),
                     "more than a hundred years", id="age-too-old"),
        pytest.param(("remember", "pip", "   ", "--valence", "0", "--intensity", "1"),
                     "the event must be 1 to 2000 characters", id="empty-event"),
        pytest.param(("remember", "pip", "x" * 2001, "--valence", "0", "--intensity", "1"),
                     "the event must be 1 to 2000 characters", id="long-event"),
        pytest.param(("remember", "pip", "x", "--valence", "0", "--intensity", "1", "--scope", "guild:%"),
                     "is not a memory scope", id="bad-scope"),
        pytest.param(("show", "pip", "--scope", "everything"), "is not a memory scope", id="bad-show-scope"),
        pytest.param(("forget", "pip", "--person", "", "-y"), "--person must be a name or a Discord id", id="empty"),
        pytest.param(("forget", "pip", "--person", "x" * 65, "-y"), "1 to 64 printable", id="long-person"),
        pytest.param(("search", "pip", "  "), "give the text to search for", id="empty-search"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_changes_nothing(
    store: MemoryStore, args: tuple[str, ...], says: str
) -> None:
    hashing_imp()
    lived(
        store,
        author="carol",
        author_id=CAROL_ID,
        conclusion="Hello.",
        said="carol said: hello",
        message_id="m1",
    )
    assert says in refused("memory", *args)
    assert count(store) == 1


@pytest.mark.parametrize(
    "person",
    ["%", "_", ".*", "carol|dave", "(", "\\", "'; DROP TABLE memory_records; --", '" OR 1=1 --', "c%l"],
)
def test_a_person_with_regex_or_sql_characters_is_taken_literally(store: MemoryStore, person: str) -> None:
    hashing_imp()
    lived(
        store,
        author="carol",
        author_id=CAROL_ID,
        conclusion="Hello carol.",
        said="carol said: hi",
        message_id="m1",
    )
    lived(
        store,
        author="dave",
        author_id=DAVE_ID,
        conclusion="Dave waves.",
        said="dave said: yo",
        message_id="m2",
    )
    assert ok("memory", "show", "pip", "--person", person) == []
    counts = ok("memory", "forget", "pip", "--person", person, "-y")
    assert (counts["records"], counts["episodes"], counts["conversations"]) == (0, 0, 0)
    assert count(store) == 2 and len(ok("memory", "show", "pip")) == 2


def test_imp_rm_purge_forgets_everything_the_imp_remembers_and_only_that(store: MemoryStore) -> None:
    """What an imp remembers is in the host's database: ``imp rm --purge`` takes it too; a plain ``rm`` keeps it."""
    hashing_imp()
    hashing_imp("zed")
    lived(
        store,
        author="Carol",
        author_id="c1",
        conclusion="Carol bakes",
        said="Carol said: I bake",
        message_id="m1",
    )
    ok("memory", "remember", "pip", "A storm sank my first boat.", "--valence", "-0.7", "--intensity", "0.8")
    ok("memory", "remember", "zed", "I grew up in a lighthouse.", "--valence", "0.2", "--intensity", "0.5")
    kept = run("imp", "rm", "pip", "--yes")
    assert kept.exit_code == 0 and count(store) == 2
    hashing_imp()  # back again, with its memory
    purged = run("imp", "rm", "pip", "--purge", "--yes")
    assert purged.exit_code == 0, purged.output
    assert "Forgot its memory: 2 memories, 2 moments, 0 conversations, 0 learned rules." in purged.output
    assert count(store) == 0
    assert store.count("zed") == 1  # another imp's memory is untouched
