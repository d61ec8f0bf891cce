"""The short table: each scenario turns its JSON into rows; here they become a rich table or Markdown."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from rich.table import Table

COLUMNS = ("Figure", "n", "p50 ms", "p95 ms", "p99 ms", "Baseline p50 ms", "Ratio", "Target → got", "Met")


class Row(NamedTuple):
    figure: str
    stats: Mapping[str, Any]  # samples, p50_ms, p95_ms, p99_ms
    baseline_p50_ms: float | None
    ratio: float | None
    target: str
    met: bool | None  # None: no target for this figure

    def cells(self) -> tuple[str, ...]:
        def ms(value: float | None) -> str:
            return "–" if value is None else f"{value:,.1f}"

        stats = self.stats
        return (
            self.figure, str(stats.get("samples") or "–"), ms(stats.get("p50_ms")), ms(stats.get("p95_ms")),
            ms(stats.get("p99_ms")), ms(self.baseline_p50_ms), "–" if self.ratio is None else f"{self.ratio:.2f}×",
            self.target, {True: "yes", False: "NO", None: "–"}[self.met],
        )  # fmt: skip


RowsOf = Callable[[dict[str, Any]], list[Row]]


def rows(scenarios: Mapping[str, dict[str, Any]], rows_of: Mapping[str, RowsOf]) -> list[Row]:
    out: list[Row] = []
    for name, scenario in scenarios.items():
        if scenario["status"] == "ok":
            out += rows_of[name](scenario)
        else:
            out.append(Row(name.replace("_", " "), {}, None, None, scenario["status"], None))
    return out


def rich_table(all_rows: list[Row]) -> Table:
    table = Table(title="impyard benchmark")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("Figure", "Target → got") else "right")
    for row in all_rows:
        table.add_row(*row.cells())
    return table


def markdown(results: Mapping[str, Any], all_rows: list[Row]) -> str:
    env = results["environment"]
    lines = [
        "# Benchmark results",
        "",
        f"Measured {results['started_at'][:10]} on `{env['host']}`: {env['cpu']}, {env['cores']} cores, "
        f"{env['memory_gib']} GiB, {env['os']}, Python {env['python']}, Docker engine {env['docker'] or 'none'}, "
        f"commit {env['commit']}. The run took {results['duration_s']:.0f} s; the 1-minute load average at its "
        f"start was {env['load_1m_at_start']} (other work on the machine shows in the figures).",
        "",
        f"Command: `{results['command']}`",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row.cells()) + " |" for row in all_rows),
    ]
    lines += [
        "",
        *(
            f"Not measured: the {name} backend ({why})."
            for name, why in results["backends"]["skipped"].items()
        ),
    ]
    return "\n".join(lines).rstrip() + "\n"
