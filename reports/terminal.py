"""The terminal summary (rich): counts, the sections, and the results that are not proved."""

from __future__ import annotations

from typing import Any

from reports.model import Report

STYLES = {"pass": "green", "fail": "bold red", "open": "yellow"}


def render_terminal(report: Report, console: Any = None, *, limit: int = 20, show_passed: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    s = report.summary
    subject = report.subject.get("model") or report.subject.get("name") or ""
    console.print(f"[bold]cuvil {report.command}[/bold] {subject}")
    console.print(f"  [green]{s['pass']} proved[/green]  [bold red]{s['fail']} failed[/bold red]  "
                  f"[yellow]{s['open']} open[/yellow]  ({s['total']} results)")
    for name, section in report.sections.items():
        if isinstance(section, dict):
            items = ", ".join(f"{k}={_fmt(v)}" for k, v in section.items() if not isinstance(v, (dict, list)))
            console.print(f"  {name}: {items}")
    rows = [r for r in report.results if show_passed or r.kind != "pass"]
    if not rows:
        return
    t = Table(title=None if show_passed else "not proved", show_lines=False)
    for col in ("kind", "check", "location", "op", "message"):
        t.add_column(col, overflow="fold")
    for r in rows[:limit]:
        t.add_row(f"[{STYLES[r.kind]}]{r.kind}[/]", r.rule, r.location.label, r.location.op or "", r.message)
    console.print(t)
    if len(rows) > limit:
        console.print(f"  ... and {len(rows) - limit} more (see the JSON/HTML report)")


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
