"""The line a key path sits on in TOML text, shared by the imp config's and the policy files' errors."""

from __future__ import annotations

import tomllib

import pytest

from impyard.toml_errors import line_of, syntax_error_line

RULES = """\
[[rules]]
name = "first"
action = "allow"

[[rules]]
name = "second"
[rules.match]
imp = "pip"

[[rules]]
name = "third"
"""

LOCATED = [
    pytest.param("[model]\nmax_tokens = 5\n", ("model", "max_tokens"), 2, id="key-in-a-table"),
    pytest.param("[a]\nx = 1\n[b]\nx = 2\n", ("b", "x"), 4, id="same-key-in-another-table"),
    pytest.param(
        "[model]  # the model\nx = 1\n", ("model", "max_tokens"), 1, id="absent-key-falls-back-to-header"
    ),
    pytest.param('name = "pip"\n\nsessions.idle_s = -1\n', ("sessions", "idle_s"), 3, id="dotted-key"),
    pytest.param("\"a b\" . 'c' = 1\n", ("a b", "c"), 1, id="dotted-key-quoted-parts"),
    pytest.param("[a.b]\n\nc = 1\n", ("a", "b", "c"), 3, id="key-under-dotted-header"),
    pytest.param(RULES, ("rules", 1, "name"), 6, id="key-in-second-rules-entry"),
    pytest.param(RULES, ("rules", 2, "name"), 11, id="key-in-third-rules-entry"),
    pytest.param(RULES, ("rules", 2, "action"), 10, id="absent-key-in-entry-falls-back-to-its-header"),
    pytest.param(RULES, ("rules", 1, "match", "imp"), 8, id="sub-table-of-an-entry"),
    pytest.param(RULES, ("rules", 0, "match"), 1, id="sub-table-absent-from-this-entry"),
    pytest.param("a = 1\n", ("b",), None, id="missing-key"),
    pytest.param("[a]\nx = 1\n", ("b", "x"), None, id="missing-table"),
    pytest.param("", ("name",), None, id="empty-text"),
    pytest.param("# a = 1\na = 2\n", ("a",), 2, id="commented-out-key"),
    pytest.param(
        "\nmodel = { max_tokens = 5, temperature = 2 }\n", ("model", "temperature"), 2, id="inline-table"
    ),
    pytest.param(
        'x = 1\nrules = [{ name = "a" }, { name = "b" }]\n',
        ("rules", 1, "name"),
        2,
        id="inline-tables-in-array",
    ),
    pytest.param('owners = ["1", "x"]\n', ("owners", 1), 1, id="array-item"),
    pytest.param(
        'name = "pip"\n[model]\nshort_path = [\n  ["[x]", "]"],\n  ["^a$", ".*"]\n]\nmax_tokens = "many"\n',
        ("model", "max_tokens"),
        7,
        id="after-multi-line-array-with-brackets-in-strings",
    ),
]


@pytest.mark.parametrize(("text", "path", "line"), LOCATED)
def test_line_of_a_key_path(text: str, path: tuple[str | int, ...], line: int | None) -> None:
    tomllib.loads(text)  # the locator only ever reads text that parsed
    assert line_of(text, path) == line


@pytest.mark.parametrize(
    ("text", "line"),
    [
        pytest.param("a = 1\nb = \n", 2, id="names-the-line"),
        pytest.param("a = [1,", None, id="end-of-document-has-no-line"),
    ],
)
def test_syntax_error_line(text: str, line: int | None) -> None:
    with pytest.raises(tomllib.TOMLDecodeError) as caught:
        tomllib.loads(text)
    assert syntax_error_line(caught.value) == line
