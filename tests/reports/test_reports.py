"""The report model and its renderers: JSON round trip against the documented schema, SARIF
against the official 2.1.0 schema, a self-contained HTML page (rendered by headless Chromium
when one is installed) and the terminal summary."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from jsonschema_lite import ValidationError, validate

from reports import (
    Evidence,
    Location,
    Report,
    ReportFormatError,
    Result,
    Rule,
    read_json,
    render_terminal,
    to_html,
    to_json,
    to_sarif,
    write_html,
    write_json,
    write_sarif,
)
from reports.html import COLORS
from tests.browser import HEADLESS, NOT_INSTALLED, chromium

DATA = Path(__file__).parent / "data"
SARIF_SCHEMA = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())
REPORT_SCHEMA = json.loads((Path(__file__).parents[2] / "reports" / "report.schema.json").read_text())


def sample(tmp: Path | None = None) -> Report:
    witness = str(tmp / "w1" / "x.npy") if tmp else "w1/x.npy"
    results = [
        Result("%0", "fp16-overflow", "pass", "proved safe: bound [-1, 1]",
               Location("model.onnx", "MatMul_0 (MatMul)", "%0", "matmul", None, [0, 3]),
               {"bound_lo": -1.0, "bound_hi": 1.0, "margin": 65504.0, "method": "interval"}),
        Result("%1", "fp16-overflow", "fail", "overflow confirmed",
               Location("model.onnx", "MatMul_1 (MatMul)", "%1", "matmul", "sum[64](mul(..))", [0, 1]),
               {"bound_lo": 0.0, "bound_hi": math.inf, "margin": 0.0, "witness_value": math.inf},
               [Evidence("witness", "witness w1", {"x": witness}, {"observed": math.inf})]),
        Result("%2", "int8-saturation", "open", "not proved",
               Location("model.onnx", None, "%2", "clip", "in0[..]", None),
               {"bound_lo": -300.0, "bound_hi": 200.0, "margin": 0.42, "gap": 1.7, "may_nan": False}),
        Result("%3", "fp16-overflow", "pass", "proved safe", Location(None, None, "%3", "relu"), {"margin": 12.5}),
    ]
    rules = [Rule("fp16-overflow", "FP16 overflow", "a float16 value leaves the finite range", "keep it in f32"),
             Rule("int8-saturation", "INT8 saturation", "a requantized value is clamped")]
    return Report("probe", {"model": "model.onnx", "sha256": "ab" * 32, "function": "main"}, results, rules,
                  {"name": "cuvil", "version": "0.1.0"}, {"precision": "fp16", "ranges": {"x": "-1:1"}},
                  {"boundary": {"safe_scale": 0.25, "witness_scale": 0.9, "note": ""}}, {"bounds": 0.1})


def test_json_round_trip_and_schema(tmp_path: Path) -> None:
    rep = sample()
    path = write_json(rep, tmp_path / "r.json")
    data = json.loads(path.read_text())
    validate(data, REPORT_SCHEMA)
    assert data["summary"] == {"pass": 2, "fail": 1, "open": 1, "total": 4}
    assert data["results"][1]["metrics"]["bound_hi"] == "inf"  # JSON has no infinity
    back = read_json(path)
    assert back.to_dict() == rep.to_dict()
    assert [r.kind for r in back.results] == ["pass", "fail", "open", "pass"]


def test_report_schema_rejects_what_it_should() -> None:
    data = json.loads(to_json(sample()))
    data["results"][0]["kind"] = "maybe"
    with pytest.raises(ValidationError):
        validate(data, REPORT_SCHEMA)
    data = json.loads(to_json(sample()))
    del data["results"][0]["location"]
    with pytest.raises(ValidationError):
        validate(data, REPORT_SCHEMA)


def test_reader_refuses_other_major_versions(tmp_path: Path) -> None:
    data = json.loads(to_json(sample()))
    data["schema_version"] = "2.0"
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(ReportFormatError):
        read_json(tmp_path / "r.json")
    data["schema_version"] = "1.7"  # a later minor version only adds optional fields
    (tmp_path / "r.json").write_text(json.dumps(data))
    assert read_json(tmp_path / "r.json").schema_version == "1.7"


def test_result_kind_is_checked() -> None:
    with pytest.raises(ValueError):
        Result("x", "r", "unknown", "m")


def test_sarif_validates_against_the_official_schema(tmp_path: Path) -> None:
    path = write_sarif(sample(tmp_path), tmp_path / "r.sarif")
    sarif = json.loads(path.read_text())
    validate(sarif, SARIF_SCHEMA, "#/definitions/Root")
    run = sarif["runs"][0]
    results = run["results"]
    assert [r["kind"] for r in results] == ["pass", "fail", "open", "pass"]
    assert [r["level"] for r in results] == ["none", "error", "none", "none"]
    assert results[1]["locations"][0]["logicalLocations"][0]["name"] == "MatMul_1 (MatMul)"
    assert results[1]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "model.onnx"
    assert "physicalLocation" not in results[3]["locations"][0]  # no file: logical location only
    assert results[1]["attachments"][0]["artifactLocation"]["uri"].startswith("file://")
    assert run["tool"]["driver"]["rules"][results[2]["ruleIndex"]]["id"] == "int8-saturation"
    assert results[1]["properties"]["bound_hi"] == "inf"


def test_validator_rejects_broken_sarif() -> None:
    """The schema check can fail: a wrong kind, a missing version, a bad level or index are caught."""
    good = to_sarif(sample())
    for mutate in (lambda s: s["runs"][0]["results"][0].update(kind="bogus"),
                   lambda s: s.pop("version"),
                   lambda s: s["runs"][0]["results"][0].update(level="fatal"),
                   lambda s: s["runs"][0]["results"][0].update(ruleIndex=-5)):
        broken = json.loads(json.dumps(good))
        mutate(broken)
        with pytest.raises(ValidationError):
            validate(broken, SARIF_SCHEMA, "#/definitions/Root")


def test_html_is_self_contained_with_an_inline_chart() -> None:
    page = to_html(sample())
    lowered = page.lower()
    for needle in ("<script", "<link", " src=", "url(", "@import", "https://"):
        assert needle not in lowered, needle
    assert page.count('<rect class="bar"') == 4  # one bar per result with a margin
    assert COLORS["fail"] in page and COLORS["pass"] in page and COLORS["open"] in page
    assert "MatMul_1 (MatMul)" in page


def test_html_charts_the_boundary_per_site_with_its_witness_scale() -> None:
    rep = sample()
    assert 'id="safe_scale"' not in to_html(rep)  # no result carries the metric: no chart
    rep.results[0].metrics["safe_scale"] = 1024.0
    rep.results[1].metrics.update({"safe_scale": 0.25, "witness_scale": 0.9})
    page = to_html(rep)
    boundary = page[page.index('id="safe_scale"'):]
    boundary = boundary[:boundary.index("</svg>")]
    assert boundary.count('<rect class="bar"') == 2  # the two sites with a proved scale
    assert boundary.count('stroke-width="2"') == 1  # one witness tick
    assert "witness_scale = 0.9" in boundary and "safe_scale = 1.02e+03" in boundary


def test_html_escapes_model_text() -> None:
    rep = sample()
    rep.results[0].message = "<script>alert(1)</script>"
    page = to_html(rep)
    assert "<script>alert" not in page and "&lt;script&gt;" in page


def _png_pixels(path: Path) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) into pixels."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and interlace == 0 and ctype in (2, 6)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    raw = zlib.decompress(idat)
    bpp = 4 if ctype == 6 else 3
    stride = width * bpp
    rows: list[bytearray] = []
    prev = bytearray(stride)
    k = 0
    for _ in range(height):
        f, line = raw[k], bytearray(raw[k + 1:k + 1 + stride])
        k += 1 + stride
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    pixels = [tuple(r[i:i + 3]) for r in rows for i in range(0, stride, bpp)]
    return width, height, pixels  # type: ignore[return-value]


def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip(f"{NOT_INSTALLED}; the page was not rendered")
    page = write_html(sample(tmp_path), tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    cmd = [browser, *HEADLESS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
           "--window-size=1100,1000", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    assert shot.exists(), proc.stderr.decode(errors="replace")[-2000:]
    _, _, pixels = _png_pixels(shot)
    colors = set(pixels)

    def rgb(h: str) -> tuple[int, int, int]:
        return int(h[1:3], 16), int(h[3:5], 16), int(h[5:7], 16)

    for kind in ("pass", "fail", "open"):  # the bars of the chart are on screen
        assert rgb(COLORS[kind]) in colors, kind


def test_terminal_summary() -> None:
    from rich.console import Console

    console = Console(record=True, width=160)
    render_terminal(sample(), console)
    text = console.export_text()
    assert "2 proved" in text and "1 failed" in text and "1 open" in text
    assert "int8-saturation" in text and "overflow confirmed" in text
    assert "proved safe: bound [-1, 1]" not in text  # passed results are not listed by default
