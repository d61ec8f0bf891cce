"""Buttons that outlive the process (docs/architecture.md): approval cards' Approve / Deny, ``/forget-me``'s question.

Each is a ``DynamicItem`` whose custom id, ``impyard:<kind>:<key>:<action>``, says what it acts on, so a
click on a message posted before a restart still lands (``ImpClient.setup_hook`` registers the classes).
A class declares its ``Faces`` (action → label and style) and its template (:func:`custom_id_template`);
the view it is posted in never times out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import discord

Faces = Mapping[str, tuple[str, discord.ButtonStyle]]  # action -> (label, style), in the order shown


def custom_id_template(kind: str, key: str, faces: Faces) -> re.Pattern[str]:
    """The custom ids of one kind of button: ``key`` (a regex) is what it acts on, one of ``faces`` the action."""
    actions = "|".join(re.escape(action) for action in faces)
    return re.compile(f"impyard:{re.escape(kind)}:(?P<key>{key}):(?P<action>{actions})")


def action_button(kind: str, key: object, action: str, faces: Faces) -> discord.ui.Button[Any]:
    """The button of ``action`` on ``key``, as its class's template reads it back."""
    label, style = faces[action]
    return discord.ui.Button(label=label, style=style, custom_id=f"impyard:{kind}:{key}:{action}")


def persistent_view(buttons: Iterable[discord.ui.Item[Any]]) -> discord.ui.View:
    """The buttons in a view with no timeout: a click is served whenever it comes, through the dynamic item."""
    view = discord.ui.View(timeout=None)
    for button in buttons:
        view.add_item(button)
    return view
