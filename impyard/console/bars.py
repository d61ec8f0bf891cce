"""A stacked bar chart as plain SVG geometry (no JavaScript, no chart library): the template draws what this lays out.

``stacked_bars`` takes one column per x label, each a list of (segment name, value), and returns the bars with their
segments' rectangles, one ``title`` each (the text a screen reader and a hover read), the x labels it has room for
and the top of the y scale. A column whose values are all 0 gets no bar. Pure: a table of inputs tests it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

PLOT_WIDTH = 640.0  # the drawing's units; the SVG scales to its box (viewBox)
PLOT_HEIGHT = 160.0
LEFT = 64.0  # room for the y scale's labels
TOP = 12.0
BOTTOM = 28.0  # room for the x labels
BAR_SHARE = 0.7  # of a column's slot; the rest is the gap
MIN_LABEL_SPACING = 40.0  # x labels closer than this are thinned to every n-th


@dataclass(frozen=True)
class Segment:
    name: str
    value: int
    y: float
    height: float


@dataclass(frozen=True)
class Bar:
    label: str
    x: float
    width: float
    total: int
    title: str
    segments: tuple[Segment, ...]  # bottom first


@dataclass(frozen=True)
class XLabel:
    text: str
    x: float  # the column's centre


@dataclass(frozen=True)
class Chart:
    width: float
    height: float
    left: float
    top: float
    baseline: float
    scale_top: int  # the value the plot's top stands for (0: nothing to show)
    bars: tuple[Bar, ...]
    labels: tuple[XLabel, ...]


def stacked_bars(
    columns: Sequence[tuple[str, Sequence[tuple[str, int]]]],
    *,
    describe: Callable[[str, int, Sequence[tuple[str, int]]], str],
) -> Chart:
    """Lay out ``columns`` (x label, [(segment, value ≥ 0)]) as stacked bars on one shared scale;
    ``describe(label, total, parts)`` writes each bar's title."""
    count = max(1, len(columns))
    slot = PLOT_WIDTH / count
    bar_width = max(1.0, slot * BAR_SHARE)
    baseline = TOP + PLOT_HEIGHT
    scale_top = max((sum(max(0, v) for _, v in parts) for _, parts in columns), default=0)
    bars: list[Bar] = []
    for index, (label, parts) in enumerate(columns):
        shown = [(name, value) for name, value in parts if value > 0]
        total = sum(value for _, value in shown)
        if total <= 0:
            continue
        x = LEFT + index * slot + (slot - bar_width) / 2
        segments: list[Segment] = []
        below = 0
        for name, value in shown:
            bottom = baseline - PLOT_HEIGHT * below / scale_top
            below += value
            top = baseline - PLOT_HEIGHT * below / scale_top
            segments.append(Segment(name, value, round(top, 2), round(bottom - top, 2)))
        bars.append(
            Bar(
                label, round(x, 2), round(bar_width, 2), total, describe(label, total, shown), tuple(segments)
            )
        )
    every = max(1, int(-(-MIN_LABEL_SPACING // slot)))  # ceil: thin the labels to fit
    labels = tuple(
        XLabel(label, round(LEFT + index * slot + slot / 2, 2))
        for index, (label, _) in enumerate(columns)
        if (len(columns) - 1 - index) % every == 0  # the last column (today) always keeps its label
    )
    return Chart(
        width=LEFT + PLOT_WIDTH + 8, height=baseline + BOTTOM, left=LEFT, top=TOP, baseline=baseline,
        scale_top=scale_top, bars=tuple(bars), labels=labels,
    )  # fmt: skip
