"""The documents cannot drift from the code (issue 17): the generated CLI reference is current, every
relative link and anchor in the README and docs/ resolves, no file cites a document that is not in the
repository, and every imp.toml key and every environment variable the code reads is documented."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import click
import pytest
from pydantic import BaseModel

from impyard.cli.reference import REGENERATE, render, slug
from impyard.imps.config import (
    BoxConfig,
    DiscordConfig,
    ImpConfig,
    MemoryConfig,
    ModelConfig,
    SessionsConfig,
    TerminalConfig,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\n]|\n(?!\n))*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The Markdown outside code blocks and code spans: where links and headings are real."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (a repeated heading gets -1, -2, …)."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading.replace("`", ""))
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return found


def test_the_cli_reference_is_current() -> None:
    checked_in = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert checked_in == render(), f"docs/cli.md is stale: regenerate it with `{REGENERATE}` and commit it"


def test_the_cli_reference_has_every_command_and_option() -> None:
    """Every command of the tree has its section, and every option of it (but --help) its row."""
    from impyard.cli import cli

    text = render()

    def walk(command: click.Command, path: str) -> None:
        assert f"## `{path}`" in text, f"no section for {path}"
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert f"| `{', '.join(param.opts)}" in text, f"{path}: no row for {param.opts}"
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")

    walk(cli, "impyard")


def test_the_reference_renders_a_command_as_its_help_says() -> None:
    @click.command("greet")
    @click.option("-n", type=click.IntRange(1, 5), default=2, show_default=True, help="How often.")
    @click.option("--to", multiple=True, help="Whom <NAME> (a | b).")
    def greet(n: int, to: tuple[str, ...]) -> None:
        """Say hello; see docs/memory.md.

        \b
        Example:
          impyard greet -n 3 --to pip
        """

    text = render(greet, prog_name="impyard greet")
    assert "Say hello; see [docs/memory.md](memory.md)." in text
    assert "Example:\n\n```sh\nimpyard greet -n 3 --to pip\n```" in text
    assert "Usage: impyard greet [OPTIONS]" in text
    assert "| `-n INTEGER RANGE` | How often. (`1<=x<=5`) | `2` |" in text
    assert "| `--to TEXT` | Whom \\<NAME\\> (a \\| b). (repeatable) |  |" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: — not ours to check
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with the anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)} has broken links:\n  " + "\n  ".join(broken)


# Documents that were never part of this repository: citing them points a reader nowhere.
ELSEWHERE = re.compile(r"\.\./shared|\b(?:design|memory-engine|conventions)\.md\b")


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if listed.returncode == 0:
        return [ROOT / name for name in listed.stdout.splitlines()]
    skip = {".git", ".venv", "__pycache__", "node_modules"}
    return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    citing = []
    for path in _repository_files():
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for number, line in enumerate(text.splitlines(), 1):
            if ELSEWHERE.search(line):
                citing.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not citing, "cite docs/… or a requirement id instead:\n  " + "\n  ".join(citing)


SECTIONS: list[tuple[str, type[BaseModel], str]] = [
    ("", ImpConfig, "configuration.md"),
    ("model", ModelConfig, "configuration.md"),
    ("discord", DiscordConfig, "configuration.md"),
    ("box", BoxConfig, "configuration.md"),
    ("sessions", SessionsConfig, "configuration.md"),
    ("terminal", TerminalConfig, "configuration.md"),
    ("memory", MemoryConfig, "memory.md"),
]
SECTIONS_OF_IMP = {name for name, _, _ in SECTIONS if name}  # the tables, not keys of the top level


@pytest.mark.parametrize(("section", "model", "page"), SECTIONS, ids=[s[0] or "top" for s in SECTIONS])
def test_every_imp_toml_key_has_a_row(section: str, model: type[BaseModel], page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    keys = [key for key in model.model_fields if not (section == "" and key in SECTIONS_OF_IMP)]
    missing = [key for key in keys if not re.search(rf"^\|[^|\n]*`{key}`", text, re.M)]
    assert not missing, f"docs/{page} has no table row for [{section or 'top level'}] {', '.join(missing)}"


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    code = "\n".join(
        p.read_text(encoding="utf-8") for tree in ("impyard", "box") for p in (ROOT / tree).rglob("*.py")
    )
    docs = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
    named = set(re.findall(r"\bIMPYARD_[A-Z_]*[A-Z]\b", code)) - {"IMPYARD_DISCORD_TOKEN_PIP"}  # an example
    missing = sorted(name for name in named if name not in docs)
    assert not missing, f"undocumented environment variables (add them to docs/configuration.md): {missing}"


def test_every_document_the_code_cites_exists() -> None:
    """Help texts, errors and comments cite ``docs/<name>.md``: each must be a file here."""
    cited = set()
    for path in _repository_files():
        if path.suffix in (".py", ".toml", ".sh", ".md") and path.is_file():
            cited |= {
                (name, path)
                for name in re.findall(r"\bdocs/([a-z][a-z0-9_-]*\.md)\b", path.read_text("utf-8"))
            }
    missing = sorted(
        f"docs/{name} (cited in {path.relative_to(ROOT)})"
        for name, path in cited
        if not (DOCS / name).exists()
    )
    assert not missing, f"cited documents that do not exist: {missing}"
