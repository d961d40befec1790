"""The dashboard's pictures: server-rendered SVG charts (pygal) of the figures in webapp/audit/costs.py,
one per name in CHARTS, and the number formats of the tables beside them (FORMATS).

A chart is shown through <img>, so it is a document of its own: pygal's stylesheet is inline, and
no script is written into it (js=[], and `_without_scripts` drops the one pygal writes anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pygal
from pygal.style import Style

from webapp.audit import costs


@dataclass(frozen=True)
class ChartSpec:
    title: str
    part: str  # the part of the figures it needs (costs.PARTS)
    draw: Callable[[costs.Dashboard], object]  # a pygal chart, not yet rendered


CHART_LOOK = {
    "background": "#ffffff",
    "plot_background": "#ffffff",
    "foreground": "#1d2330",
    "foreground_strong": "#1d2330",
    "foreground_subtle": "#5b6475",
    "font_family": "system-ui, sans-serif",
}
CHART_COLORS = ("#2456c9", "#7a5af8", "#f79009", "#0e9384", "#b42318", "#12b76a")
DECISION_COLORS = ("#12b76a", "#b42318", "#f79009")  # approved, rejected, expired

FORMATS = {
    "fmt_usd": lambda amount: f"${amount:,.4f}",
    "fmt_int": lambda number: f"{round(number):,}",
    "fmt_num": lambda number: f"{number:,.0f}" if number == round(number) else f"{number:,.2f}",
    "fmt_pct": lambda share: "—" if share is None else f"{100 * share:.1f} %",
    "fmt_s": lambda seconds: "—" if seconds is None else f"{seconds:,.1f} s",
}


def svg(spec: ChartSpec, board: costs.Dashboard):
    """The chart `spec` of these figures, as an SVG document."""
    drawing = spec.draw(board)
    drawing.title = spec.title
    return drawing.render()


def _new(kind, board: costs.Dashboard | None = None, colors: tuple[str, ...] = CHART_COLORS, **options):
    chart = kind(
        js=[],
        style=Style(colors=colors, **CHART_LOOK),
        width=720,
        height=320,
        legend_at_bottom=True,
        truncate_label=-1,
        print_values=False,
        no_data_text="No data in this range",
        **options,
    )
    chart.add_xml_filter(_without_scripts)
    if board is not None:
        chart.x_labels = [day.strftime("%m-%d") for day in board.days]
        chart.x_label_rotation = 45
        chart.show_minor_x_labels = len(board.days) <= 14
        chart.x_labels_major_every = max(1, len(board.days) // 10)
    return chart


def _without_scripts(root):
    # Even with js=[] pygal writes its settings for pygal.js into a <script>; these charts are images.
    for parent in list(root.iter()):
        for child in list(parent):
            if str(child.tag).rpartition("}")[2] == "script":
                parent.remove(child)
    return root


def _per_day(board: costs.Dashboard, kind, series: dict[str, Callable], source: str, **options):
    chart = _new(kind, board, **options)
    rows = getattr(board, source)
    for label, value in series.items():
        chart.add(label, [value(rows[day]) for day in board.days])
    return chart


def _ranked(rows: dict, value: Callable, label: str, **options):
    chart = _new(pygal.HorizontalBar, show_legend=False, **options)
    chart.x_labels = list(rows)
    chart.add(label, [value(row) for row in rows.values()])
    return chart


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


CHARTS: dict[str, ChartSpec] = {
    "cost": ChartSpec(
        "Cost per day (USD)",
        "usage",
        lambda b: _per_day(b, pygal.Bar, {"USD": lambda u: float(u.cost)}, "usage_by_day", show_legend=False),
    ),
    "tokens": ChartSpec(
        "Tokens per day",
        "usage",
        lambda b: _per_day(
            b,
            pygal.StackedBar,
            {
                "input": lambda u: int(u.input_tokens),
                "output": lambda u: int(u.output_tokens),
                "cache write": lambda u: int(u.cache_write_tokens),
                "cache read": lambda u: int(u.cache_read_tokens),
            },
            "usage_by_day",
        ),
    ),
    "people": ChartSpec(
        "Cost per person (USD)",
        "usage",
        lambda b: _ranked(b.usage_by_person, lambda u: float(u.cost), "USD"),
    ),
    "tools": ChartSpec(
        "Cost per tool (USD)", "usage", lambda b: _ranked(b.usage_by_tool, lambda u: float(u.cost), "USD")
    ),
    "endpoints": ChartSpec(
        "Cost per endpoint (USD)", "usage", lambda b: _ranked(b.usage_by_endpoint, lambda u: float(u.cost), "USD")
    ),
    "approvals": ChartSpec(
        "Decisions per day",
        "approvals",
        lambda b: _per_day(
            b,
            pygal.StackedBar,
            {"approved": lambda a: a.approved, "rejected": lambda a: a.rejected, "expired": lambda a: a.expired},
            "approvals_by_day",
            colors=DECISION_COLORS,
        ),
    ),
    "latency": ChartSpec(
        "Decision latency (seconds)",
        "approvals",
        lambda b: _per_day(
            b,
            pygal.Line,
            {"median": lambda a: _seconds(a.median), "p95": lambda a: _seconds(a.p95)},
            "approvals_by_day",
            allow_interruptions=True,
        ),
    ),
    "errors": ChartSpec(
        "Tool error rate (%)",
        "tools",
        lambda b: _ranked(b.tools, lambda t: round(100 * (t.error_rate or 0), 1), "% failed", range=(0, 100)),
    ),
}
