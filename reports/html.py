"""A self-contained HTML page: inline CSS, inline SVG charts of per-result metrics (margins; for a
probe, the input scale each site is proved safe up to), no scripts and no network, so it opens from
disk and can be filed as is."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from reports.model import Report, metric_number
from reports.render_json import _write

COLORS = {"pass": "#2e7d32", "fail": "#c62828", "open": "#e0a800"}
CHART_METRIC = "margin"
"""Results carrying this metric (allowed range / bound, > 1 inside) are charted, in report order."""


@dataclass(frozen=True)
class ChartSpec:
    """A chart of one metric per result (log10 bars against 1), with an optional second metric drawn as a
    tick on each bar."""

    metric: str
    title: str
    caption: str
    marker: str | None = None


CHARTS = (
    ChartSpec(CHART_METRIC, "Margins per result",
              "log10 of (allowed range / proved bound) per result, in program order: bars above the axis have "
              "room; bars at or below it reach their limit. Hover a bar for its location."),
    ChartSpec("safe_scale", "Boundary per site",
              "log10 of the largest scale of the declared input box at which each site is proved safe, in program "
              "order (above the axis: safe beyond the box); a black tick marks the smallest scale at which an "
              "overflow was confirmed there. Hover a bar for its location.", marker="witness_scale"),
)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    color: str
    title: str
    label: str
    tick: float | None = None


def chart(report: Report, metric: str = CHART_METRIC, width: int = 960, height: int = 300,
          lo: float = -3.0, hi: float = 6.0, marker: str | None = None) -> dict[str, Any] | None:
    """Bars of log10(metric) per result: above the axis a result has room, below it is over its limit
    (``marker``: a metric drawn as a tick across the bar)."""
    rows = [(r, metric_number(r.metrics.get(metric))) for r in report.results]
    rows = [(r, v) for r, v in rows if v is not None]
    if not rows:
        return None
    left, right, top, bottom = 56, 12, 16, 96
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / len(rows)

    def y_of(v: float) -> float:
        return top + (hi - v) / (hi - lo) * plot_h

    zero = y_of(0.0)
    bars = []
    every = max(1, math.ceil(len(rows) / 40))
    def level(v: float) -> float:
        return lo if v <= 0 else max(lo, min(hi, math.log10(v)))

    for k, (r, v) in enumerate(rows):
        y0, y1 = sorted((zero, y_of(level(v))))
        label = r.location.value or r.id
        mark = metric_number(r.metrics.get(marker)) if marker else None
        title = f"{r.location.label} [{r.location.op or ''}] {r.kind}: {metric} = {v:.3g}"
        if mark is not None:
            title += f", {marker} = {mark:.3g}"
        bars.append(Bar(left + k * step + step * 0.1, y0, max(step * 0.8, 0.5), max(y1 - y0, 1.0),
                        COLORS[r.kind], title, label if k % every == 0 else "",
                        None if mark is None else y_of(level(mark))))
    ticks = [(y_of(t), f"1e{t:+d}" if t else "1") for t in range(int(lo), int(hi) + 1)]
    return {"width": width, "height": height, "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h,
            "zero": zero, "bars": bars, "ticks": ticks, "step": step, "bottom": height - bottom}


TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f6; }
.kv td:first-child { font-weight: 600; background: #fafafa; }
.badge { display: inline-block; padding: 3px 10px; border-radius: 10px; color: #fff; font-weight: 600;
         margin-right: 8px; font-size: 13px; }
.pass { background: #2e7d32; } .fail { background: #c62828; } .open { background: #e0a800; color: #222; }
.kind { font-weight: 700; text-transform: uppercase; font-size: 11px; }
.kind.pass { color: #2e7d32; background: none; } .kind.fail { color: #c62828; background: none; }
.kind.open { color: #a07800; background: none; }
code { font-size: 12px; }
.muted { color: #666; font-size: 12px; }
svg text { font-size: 10px; fill: #333; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<div class="muted">{{ report.tool.get("name", "cuvil") }} {{ report.tool.get("version", "") }} &middot;
 report schema {{ report.schema_version }} &middot; {{ report.created }}</div>
<p>
 <span class="badge pass">{{ summary["pass"] }} proved</span>
 <span class="badge fail">{{ summary["fail"] }} failed</span>
 <span class="badge open">{{ summary["open"] }} open</span>
 <span class="muted">{{ summary["total"] }} results</span>
</p>
<h2>Subject</h2>
<table class="kv">
{% for k, v in report.subject.items() %}<tr><td>{{ k }}</td><td><code>{{ v }}</code></td></tr>
{% endfor %}</table>
{% if settings %}<h2>Settings</h2>
<table class="kv">
{% for k, v in settings %}<tr><td>{{ k }}</td><td><code>{{ v }}</code></td></tr>
{% endfor %}</table>{% endif %}
{% for name, rows in sections %}<h2>{{ name|capitalize }}</h2>
<table class="kv">
{% for k, v in rows %}<tr><td>{{ k }}</td><td>{{ v }}</td></tr>
{% endfor %}</table>
{% endfor %}
{% for spec, chart in charts %}<h2>{{ spec.title }}</h2>
<p class="muted">{{ spec.caption }}</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{{ chart.width }}" height="{{ chart.height }}"
     viewBox="0 0 {{ chart.width }} {{ chart.height }}" role="img" aria-label="{{ spec.title }}"
     id="{{ spec.metric }}">
<rect x="{{ chart.left }}" y="{{ chart.top }}" width="{{ chart.plot_w }}" height="{{ chart.plot_h }}"
      fill="#fcfcfd" stroke="#ccc"/>
{% for y, t in chart.ticks %}<line x1="{{ chart.left - 4 }}" x2="{{ chart.left + chart.plot_w }}"
 y1="{{ '%.1f'|format(y) }}" y2="{{ '%.1f'|format(y) }}" stroke="#eee"/>
<text x="{{ chart.left - 6 }}" y="{{ '%.1f'|format(y + 3) }}" text-anchor="end">{{ t }}</text>
{% endfor %}<line x1="{{ chart.left }}" x2="{{ chart.left + chart.plot_w }}" y1="{{ '%.1f'|format(chart.zero) }}"
 y2="{{ '%.1f'|format(chart.zero) }}" stroke="#333" stroke-width="1.5"/>
{% for b in chart.bars %}<rect class="bar" x="{{ '%.2f'|format(b.x) }}" y="{{ '%.2f'|format(b.y) }}"
 width="{{ '%.2f'|format(b.width) }}" height="{{ '%.2f'|format(b.height) }}" fill="{{ b.color }}">
<title>{{ b.title }}</title></rect>
{% if b.tick is not none %}<line x1="{{ '%.2f'|format(b.x) }}" x2="{{ '%.2f'|format(b.x + b.width) }}"
 y1="{{ '%.2f'|format(b.tick) }}" y2="{{ '%.2f'|format(b.tick) }}" stroke="#000" stroke-width="2"/>{% endif %}
{% if b.label %}<text transform="translate({{ '%.1f'|format(b.x + b.width / 2) }},{{ chart.bottom + 6 }}) rotate(60)">
{{- b.label }}</text>{% endif %}
{% endfor %}</svg>
{% endfor %}
<h2>Results</h2>
<table>
<tr><th>#</th><th>kind</th><th>check</th><th>location</th><th>message</th><th>metrics</th><th>evidence</th></tr>
{% for r in report.results %}<tr>
<td>{{ r.id }}</td><td><span class="kind {{ r.kind }}">{{ r.kind }}</span></td><td>{{ r.rule }}</td>
<td>{{ r.location.label }}{% if r.location.op %} <span class="muted">[{{ r.location.op }}]</span>{% endif %}
{% if r.location.component %}<br><span class="muted">{{ r.location.component }}</span>{% endif %}</td>
<td>{{ r.message }}</td>
<td class="muted">{% for k, v in r.metrics.items() %}{{ k }}={{ fmt(v) }}{% if not loop.last %}, {% endif %}
{%- endfor %}</td>
<td>{% for e in r.evidence %}{{ e.description }}{% for n, p in e.files.items() %}<br><code>{{ p }}</code>
{%- endfor %}{% endfor %}</td>
</tr>
{% endfor %}</table>
{% if report.rules %}<h2>Checks</h2>
<table>{% for rule in report.rules %}<tr><td><code>{{ rule.id }}</code></td><td>{{ rule.description }}</td></tr>
{% endfor %}</table>{% endif %}
{% if report.timings %}<p class="muted">time: {% for k, v in report.timings.items() %}{{ k }} {{ '%.2f'|format(v) }} s
{%- if not loop.last %}, {% endif %}{% endfor %}</p>{% endif %}
</body>
</html>
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _rows(d: Any) -> list[tuple[str, str]]:
    if not isinstance(d, dict):
        return [("value", _fmt(d))]
    return [(str(k), _fmt(v)) for k, v in d.items() if not isinstance(v, (dict, list))]


def to_html(report: Report, title: str | None = None) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    tpl = env.from_string(TEMPLATE)
    name = title or f"Cuvil {report.command} report: {report.subject.get('model', '')}"
    settings = [(k, _fmt(v)) for k, v in report.settings.items() if not isinstance(v, (dict, list))]
    settings += [(k, ", ".join(f"{a}={_fmt(b)}" for a, b in v.items())) for k, v in report.settings.items()
                 if isinstance(v, dict)]
    sections = [(k, _rows(v)) for k, v in report.sections.items()]
    return tpl.render(report=report, title=name, summary=report.summary, settings=settings, sections=sections,
                      charts=charts(report), fmt=_fmt)


def charts(report: Report) -> list[tuple[ChartSpec, dict[str, Any]]]:
    """The charts the report has data for."""
    out = []
    for spec in CHARTS:
        c = chart(report, spec.metric, marker=spec.marker)
        if c is not None:
            out.append((spec, c))
    return out


def write_html(report: Report, path: str | os.PathLike, title: str | None = None) -> Path:
    return _write(Path(path), to_html(report, title))

