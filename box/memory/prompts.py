"""The memory's prompt templates: named blocks in ``box/memory/prompts/*.txt`` (mechanism 54).

File format (UTF-8):

* A block starts with a header line ``[name]`` or ``[name@model]``; its text runs to the next
  header or the end of the file. Blank lines around a block's text are dropped; everything else
  is kept exactly, indentation and blank lines inside included.
* ``name`` is lowercase letters, digits, ``_`` and ``.``, starting with a letter (``reply.system``);
  ``model`` is any model name without spaces or ``]`` (``gpt-4.1-mini``, ``openai/gpt-4o``).
* Text before a file's first header is a comment for the reader and is ignored.
* A line that should start with a literal ``[`` and look like a header is written ``\\[…``.
* ``{placeholder}`` (a Python identifier in braces) is filled by ``render``; every other brace is
  literal, so JSON examples need no escaping. ``{{placeholder}}`` renders as ``{placeholder}``.
* Block names are one namespace across all files; a name (or name@model) defined twice is an error.

Mechanism 54: ``block(name, model)`` returns ``name@model`` when a block exists for the model the
call is routed to (``MemoryModel.model_for(purpose)``), else ``name``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PROMPTS_DIR = Path(__file__).parent / "prompts"

_HEADER = re.compile(r"^\[(?P<name>[a-z][a-z0-9_.]*)(?:@(?P<model>[^\]\s]+))?\]\s*$")
_PLACEHOLDER = re.compile(r"\{\{(?P<escaped>[A-Za-z_][A-Za-z0-9_]*)\}\}|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")


class PromptError(LookupError):
    """A template that cannot be loaded or rendered: an unknown block, a missing value, a clash."""


@dataclass(frozen=True)
class Prompts:
    """The loaded blocks, keyed ``name`` or ``name@model``."""

    blocks: dict[str, str]

    @classmethod
    def load(cls, directory: Path = PROMPTS_DIR) -> Prompts:
        """Every ``*.txt`` file of ``directory`` (sorted by name); a missing directory loads nothing."""
        blocks: dict[str, str] = {}
        origin: dict[str, str] = {}
        files = sorted(directory.glob("*.txt")) if directory.is_dir() else []
        for path in files:
            for key, text in _parse(path.read_text(encoding="utf-8")):
                if key in blocks:
                    raise PromptError(
                        f"prompt block [{key}] is defined twice: in {origin[key]} and {path.name}"
                    )
                blocks[key] = text
                origin[key] = path.name
        return cls(blocks)

    def names(self) -> list[str]:
        """Every block key, ``name@model`` variants included, sorted."""
        return sorted(self.blocks)

    def block(self, name: str, model: str | None = None) -> str:
        """Mechanism 54: the ``name@model`` block when there is one, else ``name``."""
        if model is not None and f"{name}@{model}" in self.blocks:
            return self.blocks[f"{name}@{model}"]
        try:
            return self.blocks[name]
        except KeyError:
            raise PromptError(
                f"no prompt block [{name}] (known: {', '.join(self.names()) or 'none'})"
            ) from None

    def render(self, name: str, model: str | None = None, **values: object) -> str:
        """The block for ``model`` with its ``{placeholders}`` filled, in one pass.

        A value's own text is never scanned for placeholders (a person's words may hold braces).
        A placeholder without a value raises ``PromptError``; values the block does not use are
        ignored, so one set of values can serve a system and a user block.
        """
        template = self.block(name, model)
        missing = sorted(
            {m["name"] for m in _PLACEHOLDER.finditer(template) if m["name"] and m["name"] not in values}
        )
        if missing:
            raise PromptError(f"prompt block [{name}] needs a value for: {', '.join(missing)}")

        def fill(match: re.Match[str]) -> str:
            if match["escaped"]:
                return "{" + match["escaped"] + "}"
            return str(values[match["name"]])

        return _PLACEHOLDER.sub(fill, template)


@cache
def packaged_prompts() -> Prompts:
    """The image's own blocks (``PROMPTS_DIR``), read once per box: every memory engine of the box shares them,
    and a spare reads them before its claim (issue 37, ``box.warmup``)."""
    return Prompts.load()


def _parse(text: str) -> list[tuple[str, str]]:
    blocks: list[tuple[str, str]] = []
    key: str | None = None
    lines: list[str] = []

    def close() -> None:
        if key is not None:
            blocks.append((key, "\n".join(lines).strip("\n")))

    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            close()
            key = header["name"] + (f"@{header['model']}" if header["model"] else "")
            lines = []
        elif key is not None:
            lines.append(line[1:] if line.startswith("\\[") else line)
    close()
    return blocks
