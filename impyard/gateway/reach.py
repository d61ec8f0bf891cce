"""What an imp's envelope may ask for, read off the policy (issue 38; docs/conversation.md).

A small model fills every field of the envelope it is shown, so the box asks only for the acts that can
happen (``box.common.envelope.EnvelopeAsks``). Two of them hang on the policy, which only the host holds;
when it opens a box it tells it, in ``box.init``'s responder settings:

* ``images`` — whether the envelope asks for pictures: the imp's ``[model] images`` (unset: yes on server
  "openai", no on a local server, which makes none) *and* the policy allows the imp's picture request (the
  judge's verdict on the body ``box.images`` sends for one picture, so a rule for another model counts);
* ``post_channels`` — the channels besides the conversation's own and the staff channel(s) that some rule
  lets the imp post to (``channels = ["123…"]`` in a ``discord.send`` allow rule), each checked with the
  judge, at most ``MAX_POST_CHANNELS``. None: the envelope asks no ``channel`` at all.

Both are fixed for the box's life, so the schema it sends stays byte-stable (the prompt cache); a policy
reload reaches the next box. The gateway still judges every act: this only decides what is asked.
"""

from __future__ import annotations

import json
from typing import Any

from box.common.envelope import makes_pictures
from box.protocol.models import MAX_POST_CHANNELS, DiscordSendParams, ImpSpec, ModelRequestParams
from impyard.gateway.judge import OWN_CHANNEL, STAFF_CHANNELS, discord_send_facts, judge, model_request_facts
from impyard.gateway.policy import Policy

IMAGE_PATH = "/images/generations"


def picture_body(spec: ImpSpec) -> dict[str, Any]:
    """The body of one picture the imp would ask for: ``box.images.image_request``'s, n = 1 (the host may not
    import the box's modules; tests hold the two together)."""
    settings = spec.responder
    return {
        "model": settings.image_model,
        "prompt": "a picture",
        "n": 1,
        "size": settings.image_size,
        "quality": settings.image_quality,
        "output_format": "jpeg",
    }


def pictures_allowed(policy: Policy, spec: ImpSpec) -> bool:
    """The policy's verdict on one picture the imp would ask for."""
    body = picture_body(spec)
    params = ModelRequestParams(path=IMAGE_PATH, body=body, purpose="image")  # type: ignore[arg-type]
    return judge(model_request_facts(spec.name, "", params, len(json.dumps(body).encode())), policy).allowed


def post_channels(policy: Policy, spec: ImpSpec, own_channel: str) -> list[str]:
    """The other channels a ``discord.send`` allow rule names for this imp and the judge lets it post to."""
    staff = tuple(c for c in (spec.responder.staff_channel,) if c) + tuple(policy.channels.staff)
    named: list[str] = []
    for rule in policy.rules:
        if rule.method != "discord.send" or rule.action != "allow" or rule.scope not in ("*", spec.name):
            continue
        for entry in rule.channels or ():
            if entry in (OWN_CHANNEL, STAFF_CHANNELS) or entry == own_channel or entry in staff:
                continue
            if entry not in named:
                named.append(entry)
    allowed = []
    for channel in named:
        send = DiscordSendParams(channel_id=channel, content="x", kind="other")
        if judge(discord_send_facts(spec.name, own_channel, send, staff), policy).allowed:
            allowed.append(channel)
    return allowed[:MAX_POST_CHANNELS]


def with_reach(spec: ImpSpec, policy: Policy | None, own_channel: str) -> ImpSpec:
    """``spec`` with what its envelope may ask for (``images``, ``post_channels``) settled against ``policy``.

    Without a policy (a host that has none to hand) pictures follow the ``[model]`` setting alone and no
    other channel is named."""
    responder = spec.responder
    images = makes_pictures(responder)
    channels: list[str] = []
    if policy is not None:
        images = images and pictures_allowed(policy, spec)
        channels = post_channels(policy, spec, own_channel)
    settled = responder.model_copy(update={"images": images, "post_channels": channels})
    return spec.model_copy(update={"responder": settled})
