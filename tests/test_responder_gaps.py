"""The responder's last gaps (issue 16), through the box protocol and stage by stage.

* ENV-02 / ENV-04 in a one-to-one server channel: only a direct message (a DM, or one that addresses the
  imp: a mention, a reply to it) is a forced response; elsewhere ``answer_needed = false`` stays silent, and
  the framing tells the model what a silent answer means.
* Seed 003 leftovers: version metadata in the prompt package; image history markers in PostSend (a
  picture-only reply is never remembered as an empty message); the image-generation scope as a thin wrapper
  around the machine; ``Payload`` carries what one ``discord.send`` carries, and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from box.common.envelope import Envelope
from box.context import PromptPackage, context_suffix, split_context, turn_context
from box.images import ImageRequest, MadePicture, ScopeClosed, image_scope
from box.machine import Stage, TurnContext, TurnInput, TurnMachine
from box.protocol.models import (
    Author,
    DeliverParams,
    DiscordSendParams,
    Framing,
    HistoryEntry,
    ModelRequestResult,
    Participant,
    SendFile,
    SessionInfo,
)
from box.render import Payload
from impyard.backends import BoxSpec
from testing.fake_openai import TINY_PNG_B64
from testing.inprocess import InProcessBackend
from tests.scripted import NOW, ScriptedHost, chat_result, deliver_params, envelope, init_params

pytestmark = pytest.mark.anyio

# The framing notes, written out (ENV-02, ENV-04): what each framing asks, and what a silent answer means.
SILENT = "A silent answer (answer_needed false) posts nothing; the message stays in the conversation."
ONE_TO_ONE = (
    'You are talking with one person here. When their message needs no reply (a "brb", an "ok", a '
    f"goodbye), set answer_needed to false. {SILENT}"
)
ONE_TO_ONE_ADDRESSED = "You are talking with one person here. You were addressed directly in this message: your answer is posted."
DM = "This is a direct message: the person expects an answer, and your answer is posted."
JUDGE = (
    "Several people are talking here. Reply only when you are addressed or have something genuinely useful to "
    f"add; otherwise set answer_needed to false. Staying silent is fine. {SILENT}"
)
TASK = (
    "This is a scheduled task, not a chat message. Set answer_needed to true only when your answer should be "
    "posted to the channel."
)


def spec(tmp_path: Path) -> BoxSpec:
    return BoxSpec(imp="pip", channel_id="c1", state_dir=tmp_path / "state")


async def run_turns(tmp_path: Path, host: ScriptedHost, *deliveries: Any, **settings: Any) -> list[Any]:
    settings = {"kind": "guild", "channel_name": "general", "retry_backoff_s": 0, **settings}
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        await running.init(init_params(**settings), timeout=30)
        return [await running.deliver(params, timeout=30) for params in deliveries]


def one_to_one(
    content: str, message_id: str = "m1", *, addressed: bool = False, **fields: Any
) -> DeliverParams:
    """A message in a server channel where only ann talks with pip: respond framing, reason one_to_one."""
    params = deliver_params(content, message_id, reason="one_to_one", **fields)
    return params.model_copy(
        update={"message": params.message.model_copy(update={"mentions_imp": addressed})}
    )


def context_of(host: ScriptedHost, n: int = 0) -> str:
    """The turn's ``## Context``, which opens the current message after the history (issue 33)."""
    return turn_context(host.model_requests[n].body["messages"])


def stored(host: ScriptedHost) -> list[tuple[str, str, str]]:
    """The box's own lines, as the host keeps them (issue 22)."""
    return [(r.id, r.role, r.content) for r in host.history.lines("pip")]


# ------------------------------------------------------------------ ENV-02 / ENV-04 in one-to-one server channels


async def test_env_02_a_brb_in_a_one_to_one_server_channel_stays_silent(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("ok, see you", answer_needed=False))])
    [result] = await run_turns(tmp_path, host, one_to_one("brb"))
    assert result.outcome == "silent" and host.sent == []
    assert host.stages == ["context", "tools", "decision", "post"]  # not direct: the model's answer decides
    assert context_of(host).endswith(f"\n\n{ONE_TO_ONE}")  # the model is told what a silent answer means
    assert stored(host) == [("m1", "user", "brb")]  # heard, not answered


async def test_env_01_a_one_to_one_answer_the_model_wants_posted_goes_out(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("It is nine.", answer_needed=True))])
    [result] = await run_turns(tmp_path, host, one_to_one("what time is it?"))
    assert result.outcome == "sent" and host.sent[0].content == "It is nine."  # type: ignore[attr-defined]
    assert host.stages == ["context", "tools", "decision", "render", "send", "post"]


async def test_env_04_an_addressed_message_in_a_one_to_one_channel_is_always_answered(tmp_path: Path) -> None:
    """A mention of pip, a mention of its role, or a reply to one of its messages (the host sets
    ``mentions_imp`` for all three) makes the message direct: the answer goes out whatever answer_needed says."""
    host = ScriptedHost(answers=[chat_result(envelope("on my way", answer_needed=False))])
    [result] = await run_turns(tmp_path, host, one_to_one("@pip brb, keep my seat", addressed=True))
    assert result.outcome == "sent" and host.sent[0].content == "on my way"  # type: ignore[attr-defined]
    assert host.stages == ["context", "tools", "render", "send", "post"]  # a forced response: no decision
    assert context_of(host).endswith(f"\n\n{ONE_TO_ONE_ADDRESSED}")


async def test_env_03_a_staff_note_still_forces_delivery_in_a_one_to_one_channel(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[chat_result(envelope("Someone will look.", answer_needed=False, staff="ann reports spam"))]
    )
    [result] = await run_turns(
        tmp_path, host, one_to_one("there is spam in #general"), staff_channel="staff-1"
    )
    assert result.outcome == "sent"
    assert [(s.channel_id, s.kind) for s in host.sent] == [("c1", "reply"), ("staff-1", "staff")]  # type: ignore[attr-defined]


async def test_env_04_a_dm_is_answered_and_told_so(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("here", answer_needed=False))])
    [result] = await run_turns(tmp_path, host, deliver_params("brb"), kind="dm")
    assert result.outcome == "sent" and host.stages == ["context", "tools", "render", "send", "post"]
    assert context_of(host).endswith(f"\n\n{DM}")


SESSION = SessionInfo(id="s1", channel_id="c1", channel_kind="guild", channel_name="general")


@pytest.mark.parametrize(
    ("mode", "reason", "addressed", "note"),
    [
        ("respond", "one_to_one", False, ONE_TO_ONE),
        ("respond", "one_to_one", True, ONE_TO_ONE_ADDRESSED),
        ("respond", "dm", False, DM),
        ("judge", "group", False, f"{JUDGE}\nPeople here: ann, bob"),
        ("judge", "group", True, f"{JUDGE}\nPeople here: ann, bob\nYou were addressed directly in this message: "
                                 "your answer is posted."),
        ("judge", "mention", False, f"{JUDGE}\nPeople here: ann, bob\nYou were addressed directly in this "
                                    "message: your answer is posted."),
        ("judge", "task", False, TASK),
    ],
)  # fmt: skip
def test_env_02_the_framing_note_says_what_a_silent_answer_means(
    mode: str, reason: str, addressed: bool, note: str
) -> None:
    people = [Participant(id="u1", name="ann"), Participant(id="u2", name="bob")] if mode == "judge" else []
    framing = Framing(mode=mode, reason=reason, participants=people)  # type: ignore[arg-type]
    suffix = context_suffix(NOW, SESSION, framing, news=None, memory=None, addressed=addressed)
    assert suffix.split("\n\n", 1)[1] == note


# ------------------------------------------------------------------ seed 003: version metadata


async def test_seed_003_the_prompt_package_names_the_imps_model_and_impyards_version(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("hi"))])
    async with InProcessBackend().open(spec(tmp_path), host) as running:
        init = init_params(kind="guild", channel_name="general", model="gpt-5.1", vision_model="gpt-4.1")
        await running.init(init.model_copy(update={"impyard_version": "9.8.7"}), timeout=30)
        await running.deliver(deliver_params("which model are you?"), timeout=30)
    context = context_of(host).split("## Context\n", 1)[1].splitlines()
    assert context[:4] == [
        "Date: 2026-12-02 (Wednesday)", "Time: 10:00 UTC", "Channel: #general",
        "Running as: model gpt-5.1 on impyard 9.8.7",  # the configured model, not the attempt's
    ]  # fmt: skip


async def test_seed_003_without_the_hosts_version_the_box_names_its_own(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("hi"))])
    await run_turns(tmp_path, host, deliver_params("hi"), model="gpt-5.1")
    [line] = [line for line in context_of(host).splitlines() if line.startswith("Running as:")]
    assert re.fullmatch(r"Running as: model gpt-5\.1 on impyard \d+\.\d+\.\d+", line)


# ------------------------------------------------------------------ seed 003: image history markers


def _picture(status: int = 200) -> ModelRequestResult:
    return ModelRequestResult(status=status, body={"data": [{"b64_json": TINY_PNG_B64}]})


async def test_seed_003_a_picture_only_reply_is_stored_with_its_marker_not_empty(tmp_path: Path) -> None:
    host = ScriptedHost(
        answers=[
            chat_result(envelope(None, picture="an owl at dusk")),
            _picture(),
            chat_result(envelope("hoot")),
        ]
    )
    later = NOW + timedelta(minutes=1)
    # What the host's history holds for pip's picture post: no text (Discord shows the file alone).
    posted = HistoryEntry(
        id="out-1",
        author=Author(id="pip-id", name="pip", bot=True),
        content="",
        created_at=NOW,
        from_imp=True,
    )
    draw = deliver_params("draw an owl", "m1")
    thanks = deliver_params("thanks!", "m2", now=later, recent=[draw_entry(draw), posted])
    results = await run_turns(tmp_path, host, draw, thanks)
    assert [r.outcome for r in results] == ["sent", "sent"]
    assert [f.filename for f in host.sent[0].files] == ["picture-1.jpeg"]  # type: ignore[attr-defined]
    assert stored(host)[:2] == [
        ("m1", "user", "draw an owl"),
        ("out-1", "assistant", "[picture: an owl at dusk]"),
    ]
    conversation = host.model_requests[2].body["messages"][1:]  # the next turn's prompt, after the system
    assert conversation[:-1] == [
        {"role": "user", "content": "ann: draw an owl"},
        {"role": "assistant", "content": "[picture: an owl at dusk]"},  # not an empty assistant message
    ]
    assert split_context(conversation[-1]["content"])[1] == "ann: thanks!"


def draw_entry(params: DeliverParams) -> HistoryEntry:
    message = params.message
    return HistoryEntry(
        id=message.id, author=message.author, content=message.content, created_at=message.created_at
    )


async def test_seed_003_text_and_several_pictures_are_stored_with_one_marker(tmp_path: Path) -> None:
    three = ModelRequestResult(status=200, body={"data": [{"b64_json": TINY_PNG_B64}] * 3})
    host = ScriptedHost(
        answers=[
            chat_result(envelope("Three owls!", picture="three owls on a branch", picture_count=3)),
            three,
        ]
    )
    await run_turns(tmp_path, host, deliver_params("draw owls"))
    assert stored(host)[-1] == ("out-1", "assistant", "Three owls!\n[3 pictures: three owls on a branch]")
    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert journal[-1]["pictures"] == "[3 pictures: three owls on a branch]"  # what the turn's scope made


async def test_seed_003_a_picture_that_was_not_made_leaves_no_marker(tmp_path: Path) -> None:
    host = ScriptedHost(answers=[chat_result(envelope("Here:", picture="an owl")), _picture(status=500)])
    await run_turns(tmp_path, host, deliver_params("draw"))
    assert stored(host)[-1] == ("out-1", "assistant", "Here:\n(I couldn't make the picture this time.)")


# ------------------------------------------------------------------ seed 003: the image-generation scope


class _NoDeps:
    """Collaborators no stage under test may touch (the model client among them)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the stage used {name}")


class _QuietPeer:
    """The peer as rendering uses it: the line size, and the host log (kept here)."""

    max_line_bytes = 1 << 20

    def __init__(self) -> None:
        self.notes: list[Any] = []

    async def notify(self, method: str, params: Any) -> None:
        self.notes.append((method, params))


def _machine() -> TurnMachine:
    deps = _NoDeps()
    deps.init = init_params()  # type: ignore[attr-defined]
    deps.peer = _QuietPeer()  # type: ignore[attr-defined]
    return TurnMachine(deps)  # type: ignore[arg-type]


class ScriptedPictures:
    """A scope double: hands back a picture per request and remembers what it was asked."""

    def __init__(self) -> None:
        self.made: list[MadePicture] = []
        self.requests: list[ImageRequest] = []

    async def make(self, request: ImageRequest) -> list[SendFile]:
        self.requests.append(request)
        self.made.append(MadePicture(request.prompt, request.edit, ("picture-1.jpeg",)))
        return [SendFile(filename="picture-1.jpeg", data_b64=TINY_PNG_B64)]


def _rendering_context(**fields: Any) -> TurnContext:
    params = deliver_params("draw")
    ctx = TurnContext(TurnInput(params.message, params.framing, [], NOW), images=ScriptedPictures())
    ctx.envelope = Envelope.model_validate(envelope(**fields))
    ctx.package = PromptPackage(prefix="p", suffix="s", messages=[])
    ctx.answers = True
    return ctx


async def test_seed_003_rendering_makes_pictures_through_the_turns_scope_not_the_model_client() -> None:
    ctx = _rendering_context(answer="An owl:", picture="an owl")
    assert await _machine().response_rendering(ctx) is Stage.SEND
    assert ctx.reply is not None and [f.filename for f in ctx.reply.files] == ["picture-1.jpeg"]
    assert isinstance(ctx.images, ScriptedPictures)
    assert [(r.path, r.prompt) for r in ctx.images.requests] == [("/images/generations", "an owl")]


async def test_seed_003_a_turn_without_an_image_scope_sends_its_text_alone() -> None:
    ctx = _rendering_context(answer="An owl:", picture="an owl")
    ctx.images = TurnContext(ctx.turn).images  # the default: no scope was opened around the machine
    await _machine().response_rendering(ctx)
    assert ctx.reply is not None and ctx.reply.files == []
    assert ctx.reply.content == "An owl:\n(I couldn't make the picture this time.)"


async def test_seed_003_the_image_scope_closes_with_its_turn() -> None:
    async with image_scope(client=_NoDeps()) as scope:  # type: ignore[arg-type]
        pass
    with pytest.raises(ScopeClosed):
        await scope.make(ImageRequest("/images/generations", {"prompt": "late"}))
    assert scope.made == []


# ------------------------------------------------------------------ seed 003: the payload


def test_seed_003_the_payload_carries_what_one_discord_send_carries_and_nothing_else() -> None:
    assert [f.name for f in dataclasses.fields(Payload)] == [
        "channel_id",
        "content",
        "kind",
        "reply_to",
        "files",
    ]
    picture = SendFile(filename="picture-1.jpeg", data_b64=TINY_PNG_B64)
    payload = Payload("c1", "An owl:", "reply", reply_to="m1", files=[picture])
    assert payload.params() == DiscordSendParams(
        channel_id="c1", content="An owl:", reply_to="m1", files=[picture], kind="reply"
    )
