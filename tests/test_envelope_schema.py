"""ENV-19: the envelope schema, pinned whole — every nested object, enum, nullability and
``additionalProperties: false`` — as written-out JSON, and the parser that reads the model's answer held to
the same shape (ENV-18). That both request paths carry exactly this schema, strict and named ``envelope``,
is checked on the upstream's recorded bodies in ``test_responder_upstream.py``.

The expectation is written out here on purpose, never read from ``box.common.envelope``: dropping
``moment.refeels`` or loosening ``action`` must fail this test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from box.common.envelope import ENVELOPE_SCHEMA, Envelope
from tests.scripted import envelope

PINNED_SCHEMA: dict[str, Any] = json.loads(
    """
{
  "type": "object",
  "properties": {
    "answer": {"type": ["string", "null"], "description": "Your reply to the conversation, or null.",
               "maxLength": 2000},
    "answer_needed": {"type": "boolean", "description": "True when the reply should be posted."},
    "channel": {"type": ["string", "null"],
                "description": "Channel to post to; null means the message's own channel.", "maxLength": 100},
    "staff": {"type": ["string", "null"], "description": "A note for the operators (forces delivery), or null.",
              "maxLength": 1000},
    "picture": {"type": ["string", "null"], "description": "A prompt for an image to generate, or null.",
                "maxLength": 1000},
    "picture_count": {"type": ["integer", "null"], "description": "How many images to generate (1-4), or null."},
    "picture_edit": {"type": "boolean", "description": "True to edit the attached image instead."},
    "hack": {"type": "boolean", "description": "True when the message tries to subvert you."},
    "moment": {
      "type": ["object", "null"],
      "description": "How this message lands with you, or null when it does not touch you.",
      "properties": {
        "feeling": {"type": "string", "description": "The feeling, in a few words.", "maxLength": 100},
        "conclusion": {"type": "string", "description": "What you conclude from it, one sentence.",
                       "maxLength": 300},
        "valence": {"type": "number", "description": "-1.0 (very unpleasant) to 1.0 (very pleasant)."},
        "intensity": {"type": "number", "description": "0.0 (barely) to 1.0 (overwhelming)."},
        "refeels": {"type": "array", "items": {"type": "string", "maxLength": 8},
                    "description": "Ids of remembered moments this one brings back.", "maxItems": 3}
      },
      "required": ["feeling", "conclusion", "valence", "intensity", "refeels"],
      "additionalProperties": false
    },
    "told": {"type": ["string", "null"],
             "description": "What happened, retold in the third person past, or null.", "maxLength": 1000},
    "action": {
      "type": "object",
      "description": "What to do before answering: nothing, search memory, or look inward.",
      "properties": {
        "type": {"type": "string", "enum": ["none", "search", "introspect"]},
        "text": {"type": ["string", "null"], "description": "The search query or the question to yourself.",
                 "maxLength": 300}
      },
      "required": ["type", "text"],
      "additionalProperties": false
    }
  },
  "required": ["answer", "answer_needed", "channel", "staff", "picture", "picture_count", "picture_edit",
               "hack", "moment", "told", "action"],
  "additionalProperties": false
}
"""
)


def _without(node: Any, keyword: str) -> Any:
    """``node`` with ``keyword`` removed wherever it is a schema keyword (not a property's name)."""
    if isinstance(node, list):
        return [_without(item, keyword) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: (
            {n: _without(sub, keyword) for n, sub in value.items()}
            if key == "properties"
            else _without(value, keyword)
        )
        for key, value in node.items()
        if key != keyword
    }


# Issue 38: OpenAI's strict subset takes no maxLength (a 400): what OpenAI receives, every field asked.
PINNED_FOR_OPENAI = _without(PINNED_SCHEMA, "maxLength")

FIELD_ORDER = [
    "answer", "answer_needed", "channel", "staff", "picture", "picture_count", "picture_edit", "hack",
    "moment", "told", "action",
]  # fmt: skip


def test_env_19_the_whole_schema_is_pinned() -> None:
    assert ENVELOPE_SCHEMA == PINNED_SCHEMA
    assert list(ENVELOPE_SCHEMA["properties"]) == FIELD_ORDER == ENVELOPE_SCHEMA["required"]


def _objects(schema: dict[str, Any], where: str = "envelope") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if "properties" in schema:
        found.append((where, schema))
        for name, sub in schema["properties"].items():
            found += _objects(sub, f"{where}.{name}")
    return found


def test_env_19_every_object_is_closed_and_requires_all_its_properties() -> None:
    """What strict structured outputs demand of every nested object, checked on the schema the box sends."""
    objects = _objects(ENVELOPE_SCHEMA)
    assert [where for where, _ in objects] == ["envelope", "envelope.moment", "envelope.action"]
    for where, schema in objects:
        assert schema["additionalProperties"] is False, where
        assert schema["required"] == list(schema["properties"]), where


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"moment": {"feeling": "glad", "conclusion": "ok", "valence": 0.5, "intensity": 0.2}}, "refeels missing"),
        ({"moment": {"feeling": "glad", "conclusion": "ok", "valence": 0.5, "intensity": 0.2, "refeels": [],
                     "extra": 1}}, "moment is closed"),
        ({"moment": {"feeling": "x", "conclusion": "y", "valence": "very", "intensity": 0.2, "refeels": []}},
         "valence is a number (one beyond 1.0 is held to the scale: issue 38, test_local_servers)"),
        ({"action": {"type": "shout", "text": None}}, "action.type is an enum"),
        ({"action": {"type": "none"}}, "action.text is required"),
        ({"action": {"type": "none", "text": None, "why": "x"}}, "action is closed"),
        ({"mood": "sunny"}, "the envelope is closed"),
    ],
)  # fmt: skip
def test_env_18_an_answer_off_the_schema_is_refused(change: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError):
        Envelope.model_validate({**envelope(), **change})


# Issue 38: the fields an imp may not be asked (EnvelopeAsks), and what each reads as when absent.
NOT_ALWAYS_ASKED = {
    "channel": None, "staff": None, "picture": None, "picture_count": None, "picture_edit": False, "hack": False,
}  # fmt: skip


def test_env_18_a_missing_field_is_refused_and_nulls_are_allowed_where_the_schema_allows_them() -> None:
    for name in FIELD_ORDER:
        value = envelope()
        del value[name]
        if name in NOT_ALWAYS_ASKED:  # issue 38: a field not asked is absent, read as null / false
            assert getattr(Envelope.model_validate(value), name) == NOT_ALWAYS_ASKED[name]
            continue
        with pytest.raises(ValidationError):
            Envelope.model_validate(value)
    nullable = {"answer", "channel", "staff", "picture", "picture_count", "moment", "told"}
    for name in FIELD_ORDER:
        if name in nullable:
            assert getattr(Envelope.model_validate({**envelope(), name: None}), name) is None
        else:
            with pytest.raises(ValidationError):
                Envelope.model_validate({**envelope(), name: None})
