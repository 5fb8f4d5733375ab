"""``docs/writing-a-pass.md`` is executable: its ``python`` blocks run in order in one namespace
(their asserts are the guide's claims), and its command lines marked ``# exits N`` run through
the CLI and exit N. A change to the API the guide documents fails here."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuvil.passes.base import PASS_REGISTRY

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "writing-a-pass.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
EXITS = re.compile(r"#\s*exits\s+(\d+)\s*$")
LABEL = re.compile(r"^  ([%@]\S+)", re.M)


def blocks(lang: str) -> list[tuple[int, str]]:
    """The guide's fenced blocks in ``lang``, each with the line its code starts on."""
    text = GUIDE.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == lang]


@pytest.fixture
def registry() -> Iterator[None]:
    """Passes the guide registers are removed afterwards, so the guide can run again in this process."""
    before = set(PASS_REGISTRY)
    yield
    for name in set(PASS_REGISTRY) - before:
        del PASS_REGISTRY[name]


def test_the_guides_python_blocks_run_and_their_claims_hold(tmp_path, monkeypatch, registry):
    monkeypatch.chdir(tmp_path)
    code = blocks("python")
    assert len(code) >= 8
    ns: dict[str, object] = {"__name__": "writing_a_pass"}
    for line, source in code:
        # blank lines first, so tracebacks name the guide's own line numbers
        exec(compile("\n" * (line - 1) + source, str(GUIDE), "exec"), ns)
    # the outcomes the text states, in case a block's own asserts are edited away
    from verify import Counterexample, Proved, Refuted

    assert isinstance(ns["ce"], Counterexample) and ns["ce"].function_inputs is not None
    assert ns["report"].count("refuted") == 1 and isinstance(ns["report"].obligations[0].verdict, Refuted)
    proved = ns["check_pass"](ns["TransposeBeforeSoftmax"](), ns["model"])
    assert proved.obligations and all(isinstance(o.verdict, Proved) for o in proved.obligations)
    assert {"transpose-before-softmax", "max-zero-to-relu"} <= set(PASS_REGISTRY)


def test_the_guides_marked_command_lines_exit_as_stated(capsys, monkeypatch):
    from cuvil import cli
    from cuvil.passes import manager

    monkeypatch.chdir(ROOT)
    # --pass-time-limit sets a process-wide limit: keep it to this test
    monkeypatch.setattr(manager, "_PLUGIN_TIME_LIMIT", list(manager._PLUGIN_TIME_LIMIT))
    commands = [line for _, block in blocks("sh") for line in block.splitlines() if EXITS.search(line)]
    assert commands, "the guide shows a runnable command line"
    for line in commands:
        expected = int(EXITS.search(line).group(1))  # type: ignore[union-attr]
        argv = shlex.split(line, comments=True)
        assert argv[0] == "cuvil"
        code = cli.main(argv[1:])
        out, _ = capsys.readouterr()
        assert code == expected, (line, out)
        if code == 1:
            assert "counterexample" in out and "REFUTED" in out
            shown = [text for _, text in blocks("text") if text.startswith("REFUTED")]
            labels = {m.group(1) for text in shown for m in LABEL.finditer(text)}
            assert labels and all(label in out for label in labels), (sorted(labels), out)
