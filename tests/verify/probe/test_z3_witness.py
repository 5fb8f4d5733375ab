"""z3 witnesses for small cones: a ReLU whose overflow region is a thin corner of the box (dead,
so zero gradient, everywhere else) is confirmed by z3 only; a z3 "unsat" leaves a site open;
cones reading exp are left to the gradient search; ``--no-z3-witness`` turns the stage off."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cuvil.cli import main
from cuvil.interp import evaluate_values
from cuvil.ir import Builder, DType
from cuvil.ir.module import Module
from cuvil.ir.printer import export_ir
from verify.probe.probe import OPEN, OVERFLOW, ProbeOptions, probe, save_witnesses
from verify.probe.program import overflow_threshold

N = 16
SLAB = N - 0.5  # relu(s.x - SLAB) is alive only where s.x > N - 0.5: a corner of [-1, 1]^N


def _slab_model(square: bool = False, seed: int = 0) -> tuple[Module, np.ndarray]:
    """``y = relu(x @ S - 15.5) * 4096 * 64`` with S a random sign matrix: ``y`` reaches 131072 at the
    corner ``x = S[:, j]`` and is 0 on all but a 2^-16 sliver of the box. With ``square`` the hidden
    value is squared first (a product of two variables: nonlinear real arithmetic)."""
    rng = np.random.default_rng(seed)
    signs = np.sign(rng.standard_normal((N, 4))).astype(np.float32)
    b = Builder()
    x = b.param("x", DType.f32, [1, N])
    h = b.relu(b.add(b.matmul(x, b.const(signs)), b.const(np.full(4, -SLAB, np.float32))))
    if square:
        h = b.mul(h, h)
        y = b.mul(b.mul(h, b.const(np.float32(512))), b.const(np.float32(1024)))
    else:
        y = b.mul(b.mul(h, b.const(np.float32(4096))), b.const(np.float32(64)))
    return b.module(b.function("main", [x], [y])), signs


def _numpy_slab(x: np.ndarray, signs: np.ndarray, square: bool = False) -> np.ndarray:
    """The model's output in float64 (real arithmetic up to double rounding): the oracle."""
    h = np.maximum(x.astype(np.float64) @ signs.astype(np.float64) - SLAB, 0.0)
    return (h * h * 512 * 1024) if square else h * 4096 * 64


def _options(**kw: object) -> ProbeOptions:
    # generous limit: the first search of a session pays for importing torch
    return ProbeOptions(boundary=False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("square", [False, True])
def test_z3_confirms_a_thin_corner_the_gradient_search_misses(tmp_path: Path, square: bool) -> None:
    module, signs = _slab_model(square)
    ranges = {"x": (-1.0, 1.0)}
    without = probe(module, ranges, _options(z3_witness=False))
    last = without.sites[-1]
    assert last.verdict == OPEN and last.witness is None  # corners, random points and gradient miss it

    rep = probe(module, ranges, _options())
    site = rep.sites[-1]
    assert site.name == last.name and site.verdict == OVERFLOW
    assert site.witness_method == "z3" and site.z3 is not None and site.z3.status == "sat"
    assert site.witness is not None
    assert rep.witnesses[site.witness].method == "z3"

    files = save_witnesses(rep, tmp_path)
    x = np.load(files[site.witness]["x"])
    assert x.shape == (1, N) and x.dtype == np.float32
    assert np.all(x >= -1) and np.all(x <= 1)
    # the oracle: in exact arithmetic the witness is past the FP16 overflow threshold
    assert _numpy_slab(x, signs, square).max() >= overflow_threshold(DType.f16)
    # replay on the reduced-precision program: the site computes inf at FP16
    values = evaluate_values(rep.program.function, rep.program.module.constants, {"x": x})
    out = np.asarray(values[site.value], dtype=np.float64)
    assert site.dtype == "f16" and np.isinf(out).any()


def _difference_of_squares() -> Module:
    """``y = 20000 (x0 + x1)(x0 - x1)``: intervals bound it by 80000 (past FP16's 65504), the real
    maximum is 20000, so nothing can be confirmed and z3 answers unsat."""
    b = Builder()
    x = b.param("x", DType.f32, [1, 2])
    s = b.matmul(x, b.const(np.array([[1.0], [1.0]], np.float32)))
    d = b.matmul(x, b.const(np.array([[1.0], [-1.0]], np.float32)))
    y = b.mul(b.mul(s, d), b.const(np.float32(20000)))
    return b.module(b.function("main", [x], [y]))


def test_z3_unsat_is_not_a_safety_proof() -> None:
    module = _difference_of_squares()
    rep = probe(module, {"x": (-1.0, 1.0)}, _options())
    site = rep.sites[-1]
    assert site.bound_hi > 65504  # the bounds do not prove it
    rng = np.random.default_rng(0)
    xs = rng.uniform(-1, 1, (1000, 2))
    assert np.max(20000 * (xs[:, 0] ** 2 - xs[:, 1] ** 2)) < 65504  # the real maximum (oracle) is 20000
    assert site.z3 is not None and site.z3.status == "unsat"
    assert site.verdict == OPEN and site.witness is None


def test_cones_through_exp_are_left_to_the_gradient_search() -> None:
    """``exp(32 relu(s.x - 15.5))`` overflows only in the thin corner too, but exp has no polynomial
    meaning: z3 is not asked and the site stays open."""
    rng = np.random.default_rng(0)
    signs = np.sign(rng.standard_normal((N, 1))).astype(np.float32)
    b = Builder()
    x = b.param("x", DType.f32, [1, N])
    h = b.relu(b.add(b.matmul(x, b.const(signs)), b.const(np.full(1, -SLAB, np.float32))))
    y = b.exp(b.mul(h, b.const(np.float32(32.0))))
    rep = probe(b.module(b.function("main", [x], [y])), {"x": (-1.0, 1.0)}, _options())
    site = rep.sites[-1]
    assert site.op == "exp" and np.exp(32 * 0.5) > 65504  # reachable at the corner x = signs
    assert site.verdict == OPEN
    assert site.z3 is not None and site.z3.status == "skipped" and "exp" in site.z3.detail


def test_cli_reports_the_method_and_honours_no_z3_witness(tmp_path: Path) -> None:
    module, signs = _slab_model()
    model = tmp_path / "slab.cir"
    export_ir(module, model)
    out = tmp_path / "r.json"
    common = [str(model), "--range", "x=-1:1", "--time-limit", "60", "--no-boundary", "-q"]
    assert main(["probe", *common, "--json", str(out), "--witness-dir", str(tmp_path / "w")]) == 1
    failed = [r for r in json.loads(out.read_text())["results"] if r["kind"] == "fail"]
    assert failed and all(r["metrics"]["witness_method"] == "z3" for r in failed)
    assert "found by z3" in failed[0]["message"]
    x = np.load(failed[0]["evidence"][0]["files"]["x"])
    assert _numpy_slab(x, signs).max() >= overflow_threshold(DType.f16)
    assert main(["probe", *common, "--no-z3-witness"]) == 3


def test_every_query_has_a_resource_limit() -> None:
    """A 16-16-16 ReLU net with large weights: z3 does not settle the site within a small resource
    limit, and the attempt ends as 'unknown' (no witness) after one query."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, [1, 16])
    h = x
    for _ in range(2):
        w = (rng.standard_normal((16, 16)) * 9.0).astype(np.float32)
        h = b.relu(b.add(b.matmul(h, b.const(w)), b.const(rng.standard_normal(16).astype(np.float32))))
    y = b.matmul(h, b.const((rng.standard_normal((16, 1)) * 9.0).astype(np.float32)))
    rep = probe(b.module(b.function("main", [x], [y])), {"x": (-1.0, 1.0)}, _options(z3_rlimit=20_000))
    unknown = [s.z3 for s in rep.sites if s.z3 is not None and s.z3.status == "unknown"]
    assert unknown
    for o in unknown:
        assert o.queries == 1 and "unknown" in o.detail
