"""The CLI reference, generated from the click commands themselves so that it cannot drift (issue 17).

``python -m impyard.cli.reference docs/cli.md`` writes it (with no path it prints it). Every command gets
its usage line, its help text (the example included) and a table of its options with their help, range
and default: exactly what its ``--help`` says, rendered as Markdown. ``tests/test_docs.py`` regenerates
it and fails when the checked-in ``docs/cli.md`` differs.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click

REGENERATE = ".venv/bin/python -m impyard.cli.reference docs/cli.md"

PREFACE = f"""\
# The `impyard` command line

<!-- Generated from the click commands by `{REGENERATE}`: do not edit by hand.
     tests/test_docs.py fails when this file is stale. -->

Every command and option of `impyard`, with its example, as its `--help` shows it. Installed as
`impyard` in `.venv/bin/` (`source .venv/bin/activate`, or call `.venv/bin/impyard`); `-h` is short for
`--help` everywhere. Command groups are nouns and their subcommands verbs (`impyard channel mode`).

**Exit codes.** 0 when the command did what it was asked. 1 for a mistake you can fix (an unknown imp, a
broken policy file, a bad setting, a second host on the same `IMPYARD_HOME`): one line,
`Error: <what is wrong and what to do>`. 2 for click's own usage errors (`Usage:` and the problem) and for
a bug in impyard (its traceback, and a line asking you to report it with the version). 130 after Ctrl-C,
which stops a command quietly (`chat`, `serve` and `supervise` treat it as a normal stop).

**Output.** On a terminal, tables fit its width: a value too long for its column is shortened after its
last whole word, with `…`; ids, model names, URLs and other one-word values are never shortened (a table
of many may be wider than the terminal). When stdout is not a terminal (a pipe, a file), a table prints as
tab-separated values with every value in full: a header line, one line per row, backslash, tab, newline
and CR written as `\\\\`, `\\t`, `\\n`, `\\r`, so `impyard task ls | cut -f1` works. `--json` is the same
everywhere (`audit tail --json` writes one object per line). `TTY_COMPATIBLE=1` makes impyard treat stdout
as a terminal. Logs go to stderr (`-v` info, `-vv` debug).
"""

_CODE_SPAN = re.compile(r"(`[^`]*`)")
_PROSE_SPECIALS = re.compile(r"([\\*<>])")
_DOC = re.compile(
    r"\bdocs/([a-z][a-z0-9_-]*\.md)\b"
)  # a help text citing a document: linked (and so checked)


def _escape(text: str) -> str:
    """Prose for Markdown: ``<NAME>`` and ``*`` literal, a cited ``docs/…`` page linked, code spans as they are."""
    parts = _CODE_SPAN.split(text)
    return "".join(
        part if index % 2 else _DOC.sub(r"[docs/\1](\1)", _PROSE_SPECIALS.sub(r"\\\1", part))
        for index, part in enumerate(parts)
    )


def _cell(text: str) -> str:
    """A table cell: one line, pipes escaped (inside code spans too, as GitHub's tables need)."""
    return " ".join(text.split()).replace("|", "\\|")


def help_paragraphs(command: click.Command) -> list[str]:
    """The help text as Markdown blocks: prose paragraphs joined into lines, click's ``\\b`` blocks kept
    line by line with their indented lines (the examples) as a ``sh`` code block."""
    text = inspect.cleandoc(command.help or "").split("\f", 1)[0]
    blocks: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if not lines:
            continue
        if lines[0].strip() != "\b":
            blocks.append(_escape(" ".join(line.strip() for line in lines)))
            continue
        prose: list[str] = []
        code: list[str] = []
        for line in [*lines[1:], ""]:
            if line.startswith((" ", "\t")):
                if prose:
                    blocks.append(_escape(" ".join(prose)))
                    prose = []
                code.append(line)
                continue
            if code:
                blocks.append("```sh\n" + inspect.cleandoc("\n".join(code)) + "\n```")
                code = []
            if line.strip():
                prose.append(line.strip())
        if prose:
            blocks.append(_escape(" ".join(prose)))
    return blocks


def _option_row(param: click.Parameter, ctx: click.Context) -> str:
    assert isinstance(param, click.Option)
    names = ", ".join([*param.opts, *param.secondary_opts])
    if not param.is_flag and not param.count:
        names += f" {param.make_metavar(ctx)}"
    extra = param.get_help_extra(ctx)
    helped = param.help or ""
    notes = [extra["required"]] if extra.get("required") else []
    if extra.get("range"):
        notes.append(f"`{extra['range']}`")
    if param.multiple and "repeatable" not in helped:
        notes.append("repeatable")
    what = " ".join(filter(None, [_escape(helped), f"({'; '.join(notes)})" if notes else ""]))
    default = extra.get("default", "")
    return f"| `{_cell(names)}` | {_cell(what)} | {f'`{_cell(default)}`' if default else ''} |"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _context(command: click.Command, name: str, parent: click.Context | None = None) -> click.Context:
    return click.Context(command, info_name=name, parent=parent, **command.context_settings)


def _walk(command: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    yield command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, _context(sub, name, ctx))


def _section(command: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    out = [f"## `{path}`", ""]
    for block in help_paragraphs(command):
        out += [block, ""]
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    out += ["```text", f"Usage: {usage}", "```", ""]
    if isinstance(command, click.Group):
        out += ["| command | what it does |", "|---|---|"]
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            summary = help_paragraphs(sub)[:1] or [""]
            out.append(f"| [`{name}`](#{slug(f'{path} {name}')}) | {_cell(summary[0])} |")
        out.append("")
    help_option = command.get_help_option(ctx)  # every command has -h/--help: said once, in the preface
    options = [
        p
        for p in command.get_params(ctx)
        if isinstance(p, click.Option) and not p.hidden and p is not help_option
    ]
    if options:
        out += ["| option | what it does | default |", "|---|---|---|"]
        out += [_option_row(option, ctx) for option in options]
        out.append("")
    return out


def render(root: click.Command | None = None, prog_name: str = "impyard") -> str:
    """The whole reference as Markdown (the same text on every machine: nothing depends on the terminal)."""
    if root is None:
        from impyard.cli import cli

        root = cli
    lines = [PREFACE]
    for command, ctx in _walk(root, _context(root, prog_name)):
        lines += _section(command, ctx)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m impyard.cli.reference [PATH]``: write the reference to PATH, or print it."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args:
        Path(args[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
