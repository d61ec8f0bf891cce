"""The Budget page's stacked bars (``impyard.console.bars``): pure geometry, checked as a table of written-out values."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from impyard.console.bars import BOTTOM, LEFT, PLOT_HEIGHT, PLOT_WIDTH, TOP, stacked_bars


def describe(label: str, total: int, parts: Sequence[tuple[str, int]]) -> str:
    return f"{label}={total}:" + ",".join(f"{name}{value}" for name, value in parts)


def test_bars_share_one_scale_stack_bottom_up_and_skip_empty_columns() -> None:
    chart = stacked_bars(
        [
            ("d1", [("a", 30), ("b", 10)]),
            ("d2", [("a", 0), ("b", 0)]),
            ("d3", [("a", 0), ("b", 80)]),
            ("d4", []),
        ],
        describe=describe,
    )
    baseline = TOP + PLOT_HEIGHT
    assert (chart.scale_top, chart.baseline, chart.height) == (80, baseline, baseline + BOTTOM)
    assert [bar.label for bar in chart.bars] == ["d1", "d3"]  # a column of zeros (or nothing) has no bar
    d1, d3 = chart.bars
    assert d1.title == "d1=40:a30,b10" and d3.title == "d3=80:b80"  # zero parts are left out
    slot = PLOT_WIDTH / 4
    assert d1.x == pytest.approx(LEFT + slot * 0.15) and d1.width == pytest.approx(slot * 0.7)
    assert d3.x == pytest.approx(LEFT + 2 * slot + slot * 0.15)
    a, b = d1.segments
    assert (a.name, a.y, a.height) == ("a", baseline - 60, 60)  # 30/80 of 160 units, from the baseline up
    assert (b.name, b.y, b.height) == ("b", baseline - 80, 20)  # on top of a
    [only] = d3.segments
    assert (only.y, only.height) == (TOP, PLOT_HEIGHT)  # the tallest fills the plot


@pytest.mark.parametrize(
    ("columns", "labelled"),
    [
        (14, list(range(14))),  # a fortnight: every day has room for its label
        (30, list(range(1, 30, 2))),  # thinned to every other day, ending with the last
        (92, list(range(1, 92, 6))),  # 640 / 92 units a day: every 6th is 40 apart
    ],
)
def test_labels_are_thinned_to_fit_and_the_last_day_keeps_its_own(columns: int, labelled: list[int]) -> None:
    chart = stacked_bars([(f"d{i}", [("a", 1)]) for i in range(columns)], describe=describe)
    assert [label.text for label in chart.labels] == [f"d{i}" for i in labelled]
    assert len(chart.bars) == columns


def test_nothing_spent_draws_no_bar() -> None:
    chart = stacked_bars([("d1", [("a", 0)])], describe=describe)
    assert chart.bars == () and chart.scale_top == 0
