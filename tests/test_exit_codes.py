"""Every command that can reach a verdict gives an internal error, a usage error, a refutation and
an undecided check four different exit codes (70, 2, 1, 3): a script reading the code never
mistakes a bug in Cuvil for a refutation. Each case is a real ``cuvil`` process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import incidents
import numpy as np
import pytest
from unprovable_passes import doubling_model
from wrong_passes import relu6_model

from cuvil.ir.printer import export_ir

ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {"internal": 70, "usage": 2, "refuted": 1, "undecided": 3}

# A fault planted in a function the command calls: what a bug in Cuvil looks like from outside.
FAULTS = {
    "model": "import cuvil.cli.common as m; m.import_model_file = boom",
    "compiler": "import cuvil.compiler as m; m.compile = boom",
    "native": "import cuvil.runtime.loader as m; m.NativeLibrary.run = boom",
}
SCRIPT = """import sys
def boom(*a, **k):
    raise RuntimeError("planted fault")
{fault}
from cuvil.cli import main
sys.exit(main(sys.argv[1:]))
"""


def cuvil(folder: Path, *argv: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "verify")]),
               CUVIL_CACHE_DIR=str(folder / "cache"))
    code = SCRIPT.format(fault=FAULTS[fault] if fault else "")
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("models")
    out = {}
    for name, module in (("relu6", relu6_model()), ("double", doubling_model()),
                         ("t5", incidents.t5_ffn(1)), ("open", incidents.open_layer_norm())):
        export_ir(module, d / f"{name}.cir")
        out[name] = str(d / f"{name}.cir")
    return out


WRONG = ["--passes", "wrong-relu6", "--pass-plugin", "wrong_passes:Relu6AsRelu"]
UNPROVABLE = ["--passes", "double-as-sum-plugin", "--pass-plugin", "unprovable_passes:DoubleAsSum"]
PROBE = ["--range", "x=-1:1", "--time-limit", "120", "-q", "--no-boundary"]  # a bound, not a target


def _verify(models, folder, situation):
    return {"internal": lambda: cuvil(folder, "verify", models["relu6"], fault="model"),
            "usage": lambda: cuvil(folder, "verify", models["relu6"], "--timeout", "nan"),
            "refuted": lambda: cuvil(folder, "verify", models["relu6"], "-j", "1", "-q", *WRONG),
            "undecided": lambda: cuvil(folder, "verify", models["double"], "-j", "1", "-q", *UNPROVABLE)}[situation]()


def _probe(models, folder, situation):
    return {"internal": lambda: cuvil(folder, "probe", models["t5"], *PROBE, fault="model"),
            "usage": lambda: cuvil(folder, "probe", models["t5"], *PROBE, "--range", "x=0:1"),
            "refuted": lambda: cuvil(folder, "probe", models["t5"], *PROBE),
            "undecided": lambda: cuvil(folder, "probe", models["open"], *PROBE)}[situation]()


def _compile(models, folder, situation):
    def gate(model: str, *extra: str):
        return cuvil(folder, "compile", model, "--gate", "--no-cache", "-o", str(folder / "out" / "lib.so"), *extra)

    return {"internal": lambda: cuvil(folder, "compile", models["relu6"], "--gate", fault="compiler"),
            "usage": lambda: gate(models["relu6"], "--opt-level", "O9"),
            "refuted": lambda: gate(models["relu6"], *WRONG),
            "undecided": lambda: gate(models["double"], *UNPROVABLE)}[situation]()


def _run(models, folder, situation):
    """``run --require-proof``: a library compiled with --verify (which never stops) keeps its
    refuted or unproved application; running it is refused with that verdict's code."""
    def build(model: str, *extra: str) -> str:
        lib = folder / "out" / f"lib{Path(model).stem}.so"
        done = cuvil(folder, "compile", model, "--verify", "--no-cache", "-o", str(lib), *extra)
        assert done.returncode == 0, done.stderr
        return str(lib)

    x = folder / "x.npy"
    np.save(x, np.ones((3, 4) if situation != "undecided" else (3, 5), np.float32))
    if situation == "internal":
        return cuvil(folder, "run", build(models["relu6"]), "-i", f"x={x}", fault="native")
    if situation == "usage":
        return cuvil(folder, "run", build(models["relu6"]), "-i", f"y={x}")
    lib = build(models["relu6"], *WRONG) if situation == "refuted" else build(models["double"], *UNPROVABLE)
    return cuvil(folder, "run", lib, "-i", f"x={x}", "--require-proof")


COMMANDS = {"verify": _verify, "probe": _probe, "compile --gate": _compile, "run": _run}


@pytest.mark.parametrize("situation", list(EXPECTED))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_outcome_has_its_own_exit_code(command, situation, models, tmp_path):
    (tmp_path / "out").mkdir()
    done = COMMANDS[command](models, tmp_path, situation)
    assert done.returncode == EXPECTED[situation], f"{command} {situation}: {done.returncode}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    if situation == "internal":
        assert "internal error[CUVIL-INTERNAL]: RuntimeError: planted fault" in done.stderr
    if situation == "usage":
        assert done.stderr.startswith("error[CUVIL-"), done.stderr


def test_the_four_codes_are_distinct():
    assert len(set(EXPECTED.values())) == len(EXPECTED)
