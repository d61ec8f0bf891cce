"""``impyard memory forget IMP --record ID`` (issue 34: the console's Forget on a record is this command), and the
counts ``forget --person`` asks about before it forgets."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from impyard.cli import cli
from impyard.memory.store import MemoryStore
from tests.memory.test_cli_memory import CAROL_ID, DAVE_ID, GUILD, hashing_imp, lived, ok, refused, run
from tests.memory.test_cli_memory import store as store  # noqa: F401 - the fixture


def test_forget_a_record_by_its_id_or_the_start_of_it(store: MemoryStore) -> None:  # noqa: F811
    hashing_imp()
    picnic = lived(store, author="carol", author_id=CAROL_ID, conclusion="We planned a picnic.",
                   said="carol said: picnic?", message_id="m1")  # fmt: skip
    lived(store, author="dave", author_id=DAVE_ID, conclusion="", said="dave said: count me in",
          message_id="m2", join=picnic)  # fmt: skip
    jazz = lived(store, author="dave", author_id=DAVE_ID, conclusion="Dave likes jazz.", said="dave: jazz",
                 message_id="m3")  # fmt: skip
    gone = ok("memory", "forget", "pip", "--record", picnic[:12], "-y")
    assert gone == {"imp": "pip", "record": picnic, "scope": GUILD, "records": 1, "episodes": 2}
    assert [r["id"] for r in ok("memory", "show", "pip")] == [jazz]
    said = run("memory", "forget", "pip", "--record", jazz, "-y").output
    assert said.strip() == f"pip forgot record {jazz} in {GUILD}: 1 record, 1 episode."
    assert ok("memory", "show", "pip") == []


def test_forget_a_record_asks_first_and_a_no_keeps_it(store: MemoryStore) -> None:  # noqa: F811
    hashing_imp()
    picnic = lived(store, author="carol", author_id=CAROL_ID, conclusion="We planned a picnic.",
                   said="carol said: picnic?", message_id="m1")  # fmt: skip
    result = CliRunner().invoke(cli, ["memory", "forget", "pip", "--record", picnic], input="n\n")
    assert (
        result.exit_code == 1
        and f"Forget pip's record {picnic} in {GUILD} ('We planned a picnic.')" in result.output
    )
    assert [r["id"] for r in ok("memory", "show", "pip")] == [picnic]


def test_forget_a_person_asks_with_the_counts_it_will_take(store: MemoryStore) -> None:  # noqa: F811
    hashing_imp()
    lived(
        store,
        author="carol",
        author_id=CAROL_ID,
        conclusion="Hello.",
        said="carol said: hello",
        message_id="m1",
    )
    lived(store, author="dave", author_id=DAVE_ID, conclusion="carol is kind.", said="dave: carol is kind",
          message_id="m2")  # fmt: skip
    result = CliRunner().invoke(cli, ["memory", "forget", "pip", "--person", CAROL_ID], input="n\n")
    assert "in every scope (2 memories, 2 moments, 0 conversations)?" in " ".join(result.output.split())
    assert len(ok("memory", "show", "pip")) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("forget", "pip", "-y"), "give --person NAME_OR_ID or --record ID", id="neither"),
        pytest.param(("forget", "pip", "--person", "carol", "--record", "0123456789ab", "-y"),
                     "give --person NAME_OR_ID or --record ID", id="both"),
        pytest.param(("forget", "pip", "--record", "0123", "-y"), "--record must be a record's id, 8 to 32", id="short"),
        pytest.param(("forget", "pip", "--record", "zzzzzzzzzzzz", "-y"), "hexadecimal", id="not-hex"),
        pytest.param(("forget", "pip", "--record", "0123456789ab", "-y"), "pip has no record 0123456789ab", id="none"),
    ],
)  # fmt: skip
def test_bad_record_input_is_one_line_and_changes_nothing(
    store: MemoryStore,  # noqa: F811
    args: tuple[str, ...],
    message: str,
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
    assert message in refused("memory", *args)
    assert len(ok("memory", "show", "pip")) == 1
