"""Issue 19 #6: settings that defeat each other — a hung model gets its three attempts inside the turn ceiling,
and a typo in imp.toml holds that imp's tasks (blocked, with the reason) until the file is fixed."""

from __future__ import annotations

import anyio
import pytest

from box.attempts import ModelChooser, ModelExhausted, with_attempts
from box.common.attempts import MAX_ATTEMPTS, attempt_timeout_s, backoff_s
from box.protocol.models import ResponderSettings
from impyard.imps.store import ImpConfigError
from impyard.imps.validate import validate_config
from impyard.supervisor.held import blocked_reason
from testing.fake_openai import FakeOpenAI, envelope
from testing.inprocess import InProcessBackend
from tests.test_supervisor import KEY, TRUSTED, yard

pytestmark = [pytest.mark.anyio, pytest.mark.fake_model(key=KEY)]


# --- issue 19 #6b: a typo in imp.toml holds the imp's tasks ----------------------------------------------


def test_the_blocked_reason_names_the_file_line_and_key() -> None:
    from impyard.imps.config import ConfigProblem

    error = ImpConfigError(
        [ConfigProblem("/h/imps/pip/imp.toml", 12, "sessions.turn_ceiling_s", "must be a number"),
         ConfigProblem("/h/imps/pip/imp.toml", 14, "box.cpus", "must be a number")]
    )  # fmt: skip
    assert blocked_reason(error) == (
        "blocked: /h/imps/pip/imp.toml:12: key 'sessions.turn_ceiling_s': must be a number (and 1 more)"
        " — it runs once the file is fixed"
    )


async def test_a_typo_in_imp_toml_holds_the_task_until_the_file_is_fixed(fake: FakeOpenAI) -> None:
    fake.script(envelope(answer="Posted after the fix."), purpose="reply")
    async with yard(fake, InProcessBackend()) as y:
        task = y.add(channel_id=TRUSTED)
        path = y.imps.config_path("pip")
        good = path.read_text()
        path.write_text(good.replace('backend = "process"', 'backend = "procss"'))  # the typo
        await y.supervisor.run(once=True)
        held = y.task(task.id)
        assert (held.state, held.attempts) == ("queued", 0)  # not failed, no try spent
        assert held.outcome is not None and held.outcome.startswith("blocked: ")
        assert f"{path}:" in held.outcome and "box.backend" in held.outcome
        assert held.outcome.endswith("it runs once the file is fixed")
        y.clock.advance(seconds=y.supervisor.settings.blocked_recheck_s + 1)
        await y.supervisor.run(once=True)  # still broken: held again, still no try spent
        assert (y.task(task.id).state, y.task(task.id).attempts) == ("queued", 0)
        path.write_text(good)  # fixed
        y.clock.advance(seconds=y.supervisor.settings.blocked_recheck_s + 1)
        await y.supervisor.run(once=True)
        done = y.task(task.id)
        assert (done.state, done.attempts) == ("done", 1)
        assert [s.content for s in y.surface.sent] == ["Posted after the fix."]


async def test_a_removed_imp_still_fails_its_tasks(fake: FakeOpenAI) -> None:
    async with yard(fake, InProcessBackend()) as y:
        task = y.add(channel_id=TRUSTED)
        y.imps.remove("pip")
        await y.supervisor.run(once=True)
        assert y.task(task.id).state == "failed"  # no file to fix: holding it would hold it forever


# --- issue 19 #6a: a hung model gets ENV-12's three attempts inside the turn ceiling ---------------------


@pytest.mark.parametrize(
    ("ceiling_s", "base_s", "per_attempt_s"),
    [
        (120.0, 1.0, 35.0),  # the defaults: (108 - 1 - 2) / 3, not the whole 120 s for one attempt
        (60.0, 1.0, 17.0),  # (54 - 3) / 3
        (120.0, 0.0, 36.0),  # no backoff: the whole share split three ways
        (5.0, 1.0, 0.5),  # the shortest ceiling (5 s): (4.5 - 3) / 3, still three attempts
    ],
)
def test_the_attempt_timeout_is_derived_from_the_ceiling_and_the_attempt_count(
    ceiling_s: float, base_s: float, per_attempt_s: float
) -> None:
    assert attempt_timeout_s(ceiling_s, base_backoff_s=base_s) == pytest.approx(per_attempt_s)


@pytest.mark.parametrize("ceiling_s", [5.0, 30.0, 120.0, 600.0, 3600.0])
def test_three_attempts_and_their_backoffs_fit_in_the_turn_ceiling(ceiling_s: float) -> None:
    per = attempt_timeout_s(ceiling_s)
    assert MAX_ATTEMPTS * per + backoff_s(1, 1.0) + backoff_s(2, 1.0) <= ceiling_s


def test_the_host_sends_the_derived_attempt_timeout_to_the_box() -> None:
    config = validate_config({"name": "pip", "sessions": {"turn_ceiling_s": 60}}, "imp.toml")
    assert config.imp_spec().responder.attempt_timeout_s == pytest.approx(17.0)
    default = validate_config({"name": "pip"}, "imp.toml").imp_spec().responder
    assert default.attempt_timeout_s is not None and default.attempt_timeout_s < 120.0 / MAX_ATTEMPTS


async def test_a_hung_upstream_gets_three_attempts_not_one() -> None:
    attempts: list[int] = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:  # the backoff, on a fake clock: no real wait
        sleeps.append(seconds)

    async def hung_upstream(n: int) -> None:
        attempts.append(n)
        await anyio.sleep_forever()  # the model never answers

    settings = ResponderSettings(attempt_timeout_s=0.05)
    with anyio.fail_after(60), pytest.raises(ModelExhausted) as caught:  # a guard, not a timing target
        await with_attempts(hung_upstream, sleep=sleep, base_s=1.0, chooser=ModelChooser(settings))
    assert attempts == [1, 2, 3] and sleeps == [1.0, 2.0]
    assert "did not answer within 0.05 s" in str(caught.value)


def test_the_boxs_default_attempt_timeout_is_the_one_derived_for_the_default_ceiling() -> None:
    from impyard.imps.config import SessionsConfig

    assert ResponderSettings().attempt_timeout_s == attempt_timeout_s(SessionsConfig().turn_ceiling_s)
