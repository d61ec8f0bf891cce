"""People forget themselves out of an imp's memory on Discord (issue 23): ``/forget-me`` and deleted messages.

The real discord.py client against the loopback fake Discord (tests/discord_yard.py). ``/forget-me`` is any
member's, for themselves only: an ephemeral question with a button only the asker may press, then everything
by or about them goes, in every scope, and the answer (ephemeral) gives the counts. A message deleted on
Discord leaves the host's history and the imp's memory: its episodes, and a record left without one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from box.common.embedding import hashing_vector
from box.protocol.memory import EncodeParams, NewEpisode, NewRecord
from box.protocol.models import Author, Message
from impyard.discord.commands import forgotten_text
from impyard.memory.act import memory_service_of
from impyard.memory.forgetting import Forgotten
from impyard.memory.scopes import SessionScopes
from impyard.memory.store import MemoryStore
from testing.fake_discord import CallbackType, FakeInteraction, FakeUser, InteractionResponse
from testing.fake_openai import FakeOpenAI
from tests.discord_yard import (
    ALICE,
    CAROL,
    DAVE,
    DM,
    GENERAL,
    GUILD,
    Yard,
    serving,
    until,
)

pytestmark = pytest.mark.anyio

GUILD_SCOPE = f"guild:{GUILD}"


def memory_of(yard: Yard) -> MemoryStore:
    return yard.rt.host.memory  # the host's own store: the one /forget-me and deletes act on


def keep(
    store: MemoryStore,
    *,
    author: Any,
    conclusion: str,
    said: str,
    message_id: str,
    scope: str = GUILD_SCOPE,
    channel: int = GENERAL,
    join: str | None = None,
) -> str:
    """One moment as pip's box keeps it (memory.encode)."""
    scoped = store.scoped("pip", SessionScopes(scope, (scope,)), str(channel))
    record = None if join else NewRecord(
        author=author.username, author_id=str(author.id), feeling="warm", conclusion=conclusion, valence=0.4,
        intensity=0.5, vector=hashing_vector(conclusion),
    )  # fmt: skip
    episode = NewEpisode(
        author=author.username, author_id=str(author.id), message_id=message_id, as_happened=said
    )
    record_id, _ = scoped.encode(EncodeParams(record=record, join=join, episode=episode))
    return record_id


async def responses_to(yard: Yard, interaction: FakeInteraction) -> list[InteractionResponse]:
    """Once the bot has done two things with the interaction: acknowledged it, then answered."""
    await yard.fake.wait_for(lambda: len(yard.fake.interaction_responses(interaction)) >= 2)
    return yard.fake.interaction_responses(interaction)


async def answer_to(yard: Yard, interaction: FakeInteraction) -> Any:
    responses = await responses_to(yard, interaction)
    first, answer = responses[0], responses[-1]
    assert first.kind == "callback" and first.deferred and first.after_s < 3
    return answer


async def clicked(yard: Yard, message_id: int, custom_id: str, user: Any) -> Any:
    """A click on the question: acknowledged at once (deferred update), then what the bot did after."""
    click = yard.fake.click_button(message_id, custom_id, user=user)
    responses = await responses_to(yard, click)
    first = responses[0]
    assert first.type == CallbackType.DEFERRED_UPDATE_MESSAGE and first.after_s < 3
    return responses[-1]


def buttons(yard: Yard, message_id: int) -> list[str]:
    return [b["custom_id"] for row in yard.fake.message(message_id).components for b in row["components"]]


async def test_forget_me_is_registered_for_everyone(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        synced = await yard.host.clients["pip"].tree.sync()
        command = yard.fake.command("forget-me")
    assert "forget-me" in [c.name for c in synced]
    assert command["default_member_permissions"] is None  # any member may run it (for themselves)
    assert not command.get("options")  # it takes no one else's name: only the asker is ever forgotten


async def test_forget_me_asks_then_forgets_everything_by_or_about_the_asker(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        await yard.host.clients["pip"].tree.sync()
        store = memory_of(yard)
        hers = keep(
            store, author=CAROL, conclusion="We planned a picnic.", said="carol: picnic?", message_id="1"
        )
        secret = keep(store, author=CAROL, conclusion="She told me a secret.", said="carol: shh", message_id="2",
                      scope=f"dm:{CAROL.id}", channel=DM)  # fmt: skip
        about = keep(store, author=DAVE, conclusion="Dave says carol is always late.", said="dave: late",
                     message_id="3")  # fmt: skip
        shared = keep(store, author=DAVE, conclusion="We talk about rain.", said="dave: rain", message_id="4")
        keep(store, author=CAROL, conclusion="", said="carol: more rain", message_id="5", join=shared)
        kept = keep(store, author=ALICE, conclusion="Alice likes jazz.", said="alice: jazz", message_id="6")

        question = await answer_to(
            yard, yard.fake.invoke_command("forget-me", user=CAROL, channel_id=GENERAL)
        )
        ids = buttons(yard, question.message_id)
        confirm, cancel = f"impyard:forget-me:{CAROL.id}:confirm", f"impyard:forget-me:{CAROL.id}:cancel"
        # Someone else pressing her button (a forged click: the question is only hers to see) forgets nobody.
        forged = await clicked(yard, question.message_id, confirm, DAVE)
        after_forged = store.count("pip")
        done = await clicked(yard, question.message_id, confirm, CAROL)
        answered = yard.fake.message(question.message_id)
        left = {view.id: view for view in store.show("pip", limit=100)}

    assert question.ephemeral and "Forget you?" in question.content and ids == [confirm, cancel]
    assert forged.ephemeral and "run /forget-me yourself" in forged.content and after_forged == 5
    assert done.kind == "edit_original"
    assert answered.content == (
        "Done: pip forgot you — 3 memories, 4 moments and 0 conversations (5 found by your account, 1 by your name)."
    )
    assert answered.components == [] and answered.ephemeral
    assert set(left) == {shared, kept} and not {hers, secret, about} & set(left)
    assert [e.author for e in left[shared].episodes] == ["dave"]


@pytest.mark.parametrize(
    ("forgotten", "text"),
    [
        (Forgotten(), "Done: pip remembered nothing by or about you, so there was nothing to forget."),
        (
            Forgotten(records=1, episodes=1, conversations=1, by_id=2),
            "Done: pip forgot you — 1 memory, 1 moment and 1 conversation (2 found by your account, 0 by your name).",
        ),
        (
            Forgotten(
                records=2, episodes=3, by_id=4, by_name=1, mentions_of=("carol",), author_only=("Al", "I")
            ),
            "Done: pip forgot you — 2 memories, 3 moments and 0 conversations (4 found by your account, 1 by your "
            "name). Memories that only mention “Al”, “I” were kept: too short or too common a word to tell from "
            "others' memories (what you wrote under it went).",
        ),
    ],
)
def test_the_answer_says_how_memories_were_found_and_which_names_were_too_common(
    forgotten: Forgotten, text: str
) -> None:
    assert forgotten_text("pip", forgotten) == text


async def test_forget_me_takes_what_a_user_wrote_under_a_common_name_but_not_every_mention_of_it(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    the = FakeUser(2_010, "the")  # a display name that is a common word
    async with serving(monkeypatch, model) as yard:
        await yard.host.clients["pip"].tree.sync()
        store = memory_of(yard)
        theirs = keep(store, author=the, conclusion="We spoke of boats.", said="the: boats", message_id="1")
        unrelated = keep(store, author=DAVE, conclusion="Dave says the rain is back.", said="dave: the rain",
                         message_id="2")  # fmt: skip
        question = await answer_to(yard, yard.fake.invoke_command("forget-me", user=the, channel_id=GENERAL))
        done = await clicked(yard, question.message_id, f"impyard:forget-me:{the.id}:confirm", the)
        left = {view.id for view in store.show("pip", limit=100)}
    assert left == {unrelated} and theirs not in left
    assert "Memories that only mention “the” were kept" in done.content


async def test_commands_and_deletes_act_on_the_hosts_own_stores(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    """No adapter builds stores on the gateway's database (issue 12): the host hands its own."""
    async with serving(monkeypatch, model) as yard:
        commands = yard.host.clients["pip"].host
        assert commands is not None
        service = memory_service_of(yard.rt.gateway)
        assert service is not None
        assert commands.memory is yard.rt.host.memory is service.store
        assert commands.history is yard.rt.host.history and commands.channels is yard.rt.host.channels


async def test_forget_me_cancelled_forgets_nothing(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        await yard.host.clients["pip"].tree.sync()
        store = memory_of(yard)
        keep(store, author=CAROL, conclusion="We planned a picnic.", said="carol: picnic?", message_id="1")
        question = await answer_to(yard, yard.fake.invoke_command("forget-me", user=CAROL, channel_id=DM))
        await clicked(yard, question.message_id, f"impyard:forget-me:{CAROL.id}:cancel", CAROL)
        answered = yard.fake.message(question.message_id)
        left = store.count("pip")
    assert answered.content == "Cancelled: nothing was forgotten." and answered.components == [] and left == 1


async def test_a_question_from_before_a_restart_still_works(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        keep(
            memory_of(yard),
            author=CAROL,
            conclusion="We planned a picnic.",
            said="carol: picnic?",
            message_id="1",
        )
        confirm = f"impyard:forget-me:{CAROL.id}:confirm"
        # The bot posted this question in an earlier run: no view of it is held in this process.
        button = {"type": 2, "style": 4, "label": "Forget me", "custom_id": confirm}
        old = yard.fake.post_message(
            GENERAL,
            yard.fake.bot_user,
            "Forget you?",
            extra={"components": [{"type": 1, "components": [button]}]},
        )
        await clicked(yard, old.id, confirm, CAROL)
        left = memory_of(yard).count("pip")
    assert left == 0


async def test_forget_me_with_nothing_remembered_says_so(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        await yard.host.clients["pip"].tree.sync()
        keep(
            memory_of(yard), author=ALICE, conclusion="Alice likes jazz.", said="alice: jazz", message_id="6"
        )
        question = await answer_to(
            yard, yard.fake.invoke_command("forget-me", user=CAROL, channel_id=GENERAL)
        )
        await clicked(yard, question.message_id, f"impyard:forget-me:{CAROL.id}:confirm", CAROL)
        answered = yard.fake.message(question.message_id)
        left = memory_of(yard).count("pip")
    assert "remembered nothing by or about you" in answered.content and left == 1


async def test_a_deleted_message_leaves_history_and_memory(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        yard.rt.channels.set_mode(str(GENERAL), "mention")  # kept as context, no turn
        gone = yard.fake.post_message(GENERAL, CAROL, "my address is 12 Elm Street")
        stays = yard.fake.post_message(GENERAL, CAROL, "nice weather")
        await yard.stored(GENERAL, gone.id)
        await yard.stored(GENERAL, stays.id)
        store = memory_of(yard)
        alone = keep(store, author=CAROL, conclusion="Carol lives on Elm Street.", said="carol: 12 Elm Street",
                     message_id=str(gone.id))  # fmt: skip
        joined = keep(store, author=CAROL, conclusion="Carol chats about the weather.", said="carol: nice weather",
                      message_id=str(stays.id))  # fmt: skip
        keep(
            store,
            author=CAROL,
            conclusion="",
            said="carol: 12 Elm Street",
            message_id=str(gone.id),
            join=joined,
        )
        elsewhere = keep(store, author=CAROL, conclusion="Same id, other channel.", said="carol: other",
                         message_id=str(gone.id), channel=DM, scope=f"dm:{CAROL.id}")  # fmt: skip

        yard.fake.delete_message(gone.id)  # she deletes it on Discord: MESSAGE_DELETE
        await until(lambda: yard.rt.history.get(str(GENERAL), str(gone.id)) is None)
        await until(lambda: store.count("pip") == 2)
        left = {view.id: view for view in store.show("pip", limit=100)}
        kept_message = yard.rt.history.get(str(GENERAL), str(stays.id))
    assert set(left) == {joined, elsewhere} and alone not in left
    assert [e.message_id for e in left[joined].episodes] == [str(stays.id)]  # only its deleted moment went
    assert kept_message is not None and kept_message.content == "nice weather"


async def test_a_bulk_delete_leaves_history_and_memory(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        yard.rt.channels.set_mode(str(GENERAL), "mention")
        posted = [yard.fake.post_message(GENERAL, CAROL, f"message {n}") for n in range(3)]
        for message in posted:
            await yard.stored(GENERAL, message.id)
        store = memory_of(yard)
        for message in posted:
            keep(store, author=CAROL, conclusion=f"Moment {message.id}.", said=message.content,
                 message_id=str(message.id))  # fmt: skip
        purged = [str(m.id) for m in posted[:2]]
        yard.fake.dispatch(
            "MESSAGE_DELETE_BULK", {"ids": purged, "channel_id": str(GENERAL), "guild_id": str(GUILD)}
        )
        await until(lambda: store.count("pip") == 1)
        history = [yard.rt.history.get(str(GENERAL), str(m.id)) for m in posted]
    assert history[0] is None and history[1] is None and history[2] is not None


async def test_history_forget_removes_one_message_only(
    monkeypatch: pytest.MonkeyPatch, model: FakeOpenAI
) -> None:
    async with serving(monkeypatch, model) as yard:
        history = yard.rt.history
        for n in ("1", "2"):
            history.record(
                "77", Message(id=n, author=Author(id="9", name="x"), content=n, created_at=datetime.now(UTC))
            )
        removed, again = history.forget("77", "1"), history.forget("77", "1")
        left = [entry.id for entry in history.recent("77")]
    assert (removed, again, left) == (1, 0, ["2"])
