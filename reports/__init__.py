"""One report model rendered as JSON, SARIF 2.1.0, HTML and terminal summaries."""

from reports.html import to_html, write_html
from reports.model import KINDS, SCHEMA_VERSION, Evidence, Location, Report, ReportFormatError, Result, Rule
from reports.render_json import read_json, to_json, write_json
from reports.sarif import to_sarif, write_sarif
from reports.terminal import render_terminal

__all__ = ["KINDS", "SCHEMA_VERSION", "Evidence", "Location", "Report", "ReportFormatError", "Result", "Rule",
           "read_json", "render_terminal", "to_html", "to_json", "to_sarif", "write_html", "write_json",
           "write_sarif"]
