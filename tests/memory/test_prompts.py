"""The prompt template loader (box/memory/prompts.py), on temporary template directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from box.memory.prompts import PROMPTS_DIR, PromptError, Prompts


def write(directory: Path, name: str, text: str) -> None:
    (directory / name).write_text(text, encoding="utf-8")


@pytest.fixture
def prompts(tmp_path: Path) -> Prompts:
    write(
        tmp_path,
        "arrival.txt",
        "Notes for whoever edits this file; not part of any block.\n"
        '[arrival.system]\n\nYou meet {person}.\n  Answer as JSON like {"greeting": "..."}.\n\n'
        "[arrival.system@gpt-5.4-mini]\nYou meet {person}. Write in English.\n"
        "[arrival.user]\n{words}\n\\[arrival.system] is shown literally\nliteral {{person}} here\n",
    )
    write(tmp_path, "summary.txt", "[summary.system]\nSummarise.\n")
    write(tmp_path, "ignored.md", "[summary.system]\nnot a template file\n")
    return Prompts.load(tmp_path)


def test_m54_blocks_load_from_every_txt_file(prompts: Prompts) -> None:
    assert prompts.names() == [
        "arrival.system",
        "arrival.system@gpt-5.4-mini",
        "arrival.user",
        "summary.system",
    ]


def test_m54_block_text_keeps_inner_lines_and_drops_surrounding_blank_lines(prompts: Prompts) -> None:
    assert prompts.block("arrival.system") == 'You meet {person}.\n  Answer as JSON like {"greeting": "..."}.'


def test_m54_model_block_replaces_the_plain_one_for_that_model(prompts: Prompts) -> None:
    assert prompts.block("arrival.system", "gpt-5.4-mini") == "You meet {person}. Write in English."
    assert prompts.block("arrival.system", "gpt-4.1-mini").startswith("You meet {person}.\n")
    assert prompts.block("arrival.system", None).startswith("You meet {person}.\n")
    assert prompts.block("summary.system", "gpt-5.4-mini") == "Summarise."  # no variant: the plain block


def test_m54_render_fills_placeholders_and_leaves_json_braces(prompts: Prompts) -> None:
    assert prompts.render("arrival.system", "gpt-4.1-mini", person="Anna") == (
        'You meet Anna.\n  Answer as JSON like {"greeting": "..."}.'
    )
    assert (
        prompts.render("arrival.system", "gpt-5.4-mini", person="Anna") == "You meet Anna. Write in English."
    )


def test_m54_escapes_render_literally(prompts: Prompts) -> None:
    assert prompts.render("arrival.user", words="hi") == (
        "hi\n[arrival.system] is shown literally\nliteral {person} here"
    )


def test_m54_values_are_not_rendered_again(prompts: Prompts) -> None:
    # A person's words may hold braces: they are text, never placeholders.
    assert prompts.render("arrival.user", words="{person} {{person}}").startswith("{person} {{person}}\n")


def test_m54_extra_values_are_ignored(prompts: Prompts) -> None:
    assert prompts.render("summary.system", person="unused") == "Summarise."


def test_m54_a_missing_value_is_a_clear_error(prompts: Prompts) -> None:
    with pytest.raises(PromptError, match=r"\[arrival.system\] needs a value for: person"):
        prompts.render("arrival.system", "gpt-4.1-mini")


def test_m54_an_unknown_block_is_a_clear_error(prompts: Prompts) -> None:
    with pytest.raises(PromptError, match=r"no prompt block \[reply.system\]"):
        prompts.render("reply.system", "gpt-4.1-mini")
    with pytest.raises(PromptError):
        prompts.block("arrival")


def test_m54_a_block_defined_twice_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "[x]\none\n")
    write(tmp_path, "b.txt", "[x]\ntwo\n")
    with pytest.raises(PromptError, match=r"\[x\] is defined twice: in a.txt and b.txt"):
        Prompts.load(tmp_path)


def test_m54_same_name_for_another_model_is_not_a_clash(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "[x]\none\n[x@m1]\ntwo\n[x@openai/m2:latest]\nthree\n")
    loaded = Prompts.load(tmp_path)
    assert [loaded.block("x", m) for m in (None, "m1", "openai/m2:latest", "m3")] == [
        "one",
        "two",
        "three",
        "one",
    ]


def test_m54_lines_that_are_not_headers_stay_text(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "[x]\n[1] a state entry\n[Upper] not a header\n [x] indented\n")
    assert Prompts.load(tmp_path).block("x") == "[1] a state entry\n[Upper] not a header\n [x] indented"


def test_m54_a_missing_directory_loads_nothing(tmp_path: Path) -> None:
    assert Prompts.load(tmp_path / "absent").names() == []


def test_m54_the_package_templates_load() -> None:
    # Whatever templates the package ships must parse (no clashes, valid headers).
    assert isinstance(Prompts.load(PROMPTS_DIR), Prompts)
