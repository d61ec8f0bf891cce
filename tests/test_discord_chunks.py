"""Chunking replies to Discord's 2000 characters."""

from __future__ import annotations

import pytest

from impyard.discord.chunks import DISCORD_MESSAGE_LIMIT, chunk_message


def test_exactly_the_limit_is_one_message_and_one_more_is_two() -> None:
    assert chunk_message("a" * 2000) == ["a" * 2000]
    chunks = chunk_message("a" * 2001)
    assert len(chunks) == 2 and "".join(chunks) == "a" * 2001


def test_cuts_prefer_paragraphs_then_lines_then_sentences() -> None:
    paragraph = ("word " * 150).strip()  # ~750 characters
    text = "\n\n".join([paragraph] * 4)
    chunks = chunk_message(text)
    assert all(len(chunk) <= DISCORD_MESSAGE_LIMIT for chunk in chunks)
    assert all(chunk.endswith("word") for chunk in chunks)  # whole paragraphs, no half words
    sentences = " ".join(["This is a sentence that ends here."] * 120)
    assert all(chunk.rstrip().endswith(".") for chunk in chunk_message(sentences)[:-1])


def test_no_text_is_lost_or_reordered() -> None:
    text = "".join(f"line {n}: {'x' * (n % 97)}\n" for n in range(400))
    assert "\n".join(chunk_message(text)).replace("\n", "") == text.replace("\n", "")


def test_code_fences_are_closed_and_reopened_with_their_language() -> None:
    code = "\n".join(f"print({n})" for n in range(600))
    text = "Here is the script:\n\n```python\n" + code + "\n```\nThat's all."
    chunks = chunk_message(text)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk) <= DISCORD_MESSAGE_LIMIT
        assert chunk.count("```") % 2 == 0, chunk[:80]  # every chunk renders its fence on its own
    assert all(chunk.startswith("```python\n") for chunk in chunks[1:])
    assert chunks[-1].endswith("That's all.")


def test_a_long_unbroken_run_is_cut_hard() -> None:
    chunks = chunk_message("x" * 4500)
    assert [len(c) for c in chunks] == [1996, 1996, 508]


@pytest.mark.parametrize("text", ["", "short"])
def test_short_or_empty(text: str) -> None:
    assert chunk_message(text) == ([text] if text else [])
