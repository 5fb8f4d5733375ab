"""cuvil.compile(..., fp16=True, ranges=...) and `cuvil compile --enable-fp16 --range ...`: float16
exactly where the prober proves it safe for the declared box, the rest float32, the decision per op
in the manifest, and `--gate` refusing a build with an unproved op."""

from __future__ import annotations

import collections
import functools
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import cuvil
from bench.models import ZOO, ZOO_SMALL
from cuvil import cli
from cuvil.errors import InputError
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.printer import export_ir
from tests.oracles import rule_reference
from verify.probe.fp16_policy import HALF_SEMANTICS, Fp16Unproved, fp16_module, fp16_safe_ops, plan_fp16

# relative to the output's largest magnitude, FP16 build against the FP32 interpreter
FP16_REL_TOL = 2e-2


pytestmark = pytest.mark.usefixtures("private_cache")


@functools.cache
def _zoo_module(name: str, small: bool) -> Module:
    return cuvil.import_model((ZOO_SMALL if small else ZOO)[name].to_onnx())


def _box(module: Module) -> dict[str, tuple[float, float]]:
    """[-1, 1] for float inputs; token ids: every row of the embedding table they index."""
    out: dict[str, tuple[float, float]] = {}
    for p in module.main.params:
        if p.dtype.is_float:
            out[p.name] = (-1.0, 1.0)
            continue
        tables = [v.operands[0] for v in module.main.ops() if v.op in ("gather", "embedding") and v.operands[1] is p]
        assert tables, f"no table indexed by {p.name}"
        out[p.name] = (0.0, float(int(tables[0].type.shape[0]) - 1))
    return out


def _draw(module: Module, box: dict[str, tuple[float, float]], rng: np.random.Generator) -> list[np.ndarray]:
    xs = []
    for p in module.main.params:
        lo, hi = box[p.name]
        shape = tuple(int(d) for d in p.shape)
        xs.append(rng.uniform(lo, hi, shape).astype(p.dtype.np) if p.dtype.is_float
                  else rng.integers(int(lo), int(hi) + 1, shape).astype(p.dtype.np))
    return xs


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30))


def _check_zoo_fp16_build(name: str, small: bool, n_inputs: int, n_compared: int) -> dict[str, float]:
    module = _zoo_module(name, small)
    box = _box(module)
    model = cuvil.compile(module, fp16=True, ranges=box, cache=False)
    assert model.manifest is not None
    entry = model.manifest["precision"]
    f32_ops = [v for v in module.main.ops() if v.dtype is DType.f32]
    # one decision per float32 op of the model, each with its reason
    assert entry["fp16_ops"] + entry["fp32_ops"] == len(f32_ops)
    assert len(entry["kept_fp32"]) == entry["fp32_ops"]
    assert all(k["reason"] and k["op"] and k["value"].startswith("%") for k in entry["kept_fp32"])
    assert entry["ranges"] == {k: [lo, hi] for k, (lo, hi) in box.items()}
    # the manifest says what the half-precision reductions and contractions compute
    kinds = collections.Counter(v.op for v in f32_ops)
    kinds.subtract(k["op"] for k in entry["kept_fp32"])
    assert set(entry["semantics"]) == {op for op, n in kinds.items() if n > 0} & set(HALF_SEMANTICS)
    if entry["fp16_ops"]:
        with tempfile.TemporaryDirectory() as d:
            compiled = cuvil.import_model(model.export_ir(Path(d) / "optimized.cir"))
        inner = [u for v in compiled.main.ops() if v.op == "fused" for u in v.attr("body").ops()]
        assert any(v.dtype is DType.f16 for v in [*compiled.main.ops(), *inner])  # fused bodies hold some
    rng = np.random.default_rng(7)
    bad = 0
    worst = 0.0
    for k in range(n_inputs):
        xs = _draw(module, box, rng)
        outs = model.run(xs)
        bad += sum(int(np.count_nonzero(~np.isfinite(o))) for o in outs if o.dtype.kind == "f")
        if k < n_compared:
            for o, r in zip(outs, run_reference(module, xs), strict=True):
                if r.dtype.kind == "f":
                    worst = max(worst, _rel_err(o, r))
    assert bad == 0
    assert worst <= FP16_REL_TOL
    return {"rel_err": worst}


@pytest.mark.parametrize("name", ["mlp", "mlp_b64", "mobilenet_v1", "mlp_int8"])
def test_small_zoo_fp16_build_is_finite_in_the_box_and_close_to_fp32(name: str) -> None:
    _check_zoo_fp16_build(name, True, 1000, 5)


# the reduced ResNet and BERT take 20-40 s each (the policy's bound rounds, then 1,000 runs)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "bert"])
def test_small_zoo_fp16_build_of_deeper_models(name: str) -> None:
    _check_zoo_fp16_build(name, True, 1000, 5)


# full-size models: the policy takes up to ~2 minutes (BERT), then 1,000 library runs: float16 convs use the
# generic lowering (~1 s per run for ResNet-18 / MobileNet at 224x224 on this host), so ~20 min per CNN
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "mlp_b64", "resnet18", "mobilenet_v1", "bert", "mlp_int8"])
def test_full_zoo_fp16_build_is_finite_on_1000_inputs_in_the_box(name: str) -> None:
    _check_zoo_fp16_build(name, False, 1000, 3)


# --------------------------------------------------------------------------------------
# the compiled FP16 program means what the interpreter's rules say


@pytest.mark.parametrize("opt_level", [0, 3])
def test_compiled_fp16_mlp_matches_the_rules_bit_for_bit(opt_level: int) -> None:
    """Each float16 primitive rounds its result (products inside matmul included), sums accumulate in
    float32 and round once: the library reproduces the rule evaluation exactly."""
    module = _zoo_module("mlp", True)
    box = _box(module)
    program = plan_fp16(module, box).module
    assert any(v.dtype is DType.f16 and v.op == "matmul" for v in program.main.ops())
    lib = cuvil.compile(program, opt_level=opt_level, cache=False)
    rng = np.random.default_rng(3)
    for _ in range(5):
        xs = _draw(module, box, rng)
        got = lib.run(xs)
        want = rule_reference(program, xs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
        # the interpreter's numpy fast path (np.matmul keeps products exact, so it is not bit-equal to the
        # rule in float16) stays within two f16 ulps of the output's magnitude
        for g, f in zip(got, run_reference(program, xs), strict=True):
            assert np.max(np.abs(g - f)) <= 2 * float(np.spacing(np.float16(np.max(np.abs(f)))))


# --------------------------------------------------------------------------------------
# a layer that overflows float16: kept float32, and refused under the gate


def _wide_linear() -> Module:
    """x @ W with |W| ~ 1e3 over x in [-100, 100]: up to ~1e6, far outside float16."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.param("x", DType.f32, (4, 16))
    w = b.const((rng.uniform(-1, 1, (16, 8)) * 1e3).astype(np.float32))
    h = b.relu(b.add(b.matmul(x, w), b.const(rng.uniform(-1, 1, (8,)).astype(np.float32))))
    small = b.const(rng.uniform(-1e-3, 1e-3, (8, 3)).astype(np.float32))
    out = b.tanh(b.matmul(h, small))
    return b.module(b.function("main", [x], [out]))


WIDE = {"x": (-100.0, 100.0)}


def test_overflowing_layer_stays_fp32_and_the_build_is_finite(tmp_path: Path) -> None:
    module = _wide_linear()
    model = cuvil.compile(module, fp16=True, ranges=WIDE, output_dir=tmp_path)
    assert model.manifest is not None
    entry = model.manifest["precision"]
    kept = {k["value"]: k for k in entry["kept_fp32"]}
    assert kept["%0"]["op"] == "matmul" and kept["%0"]["cause"] == "unproved"
    assert "not proved" in kept["%0"]["reason"] and "65504" in kept["%0"]["reason"]
    # the all-float16 program overflows at a corner of the box; the build does not
    corner = np.sign(module.constants[module.main.ops()[0].operands[1].const_hash][:, :1].T).repeat(4, 0) * 100
    corner = corner.astype(np.float32)
    everything = fp16_module(module, set())
    assert not np.all(np.isfinite(run_reference(everything, [corner])[0]))
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-100, 100, (996, 4, 16)), corner[None].repeat(4, 0)]).astype(np.float32)
    for x in xs:
        assert np.all(np.isfinite(model.run([x])[0]))


def test_strict_fp16_refuses_an_unproved_op(tmp_path: Path) -> None:
    with pytest.raises(Fp16Unproved) as info:
        cuvil.compile(_wide_linear(), fp16=True, ranges=WIDE, fp16_strict=True, output_dir=tmp_path / "out")
    assert info.value.code == "CUVIL-FP16-UNPROVED"
    assert "matmul" in info.value.message and "not proved" in info.value.message
    assert not list(tmp_path.rglob("*.so"))
    # a box the prover can handle passes the strict check
    model = cuvil.compile(_wide_linear(), fp16=True, ranges={"x": (-1e-3, 1e-3)}, fp16_strict=True, cache=False)
    assert model.manifest is not None
    assert model.manifest["precision"]["unproved"] == 0 and model.manifest["precision"]["fp16_ops"] > 0
    assert model.manifest["precision"]["strict"] is True


def _cli(argv: Sequence[str | Path]) -> int:
    return int(cli.main([str(a) for a in argv]))


def test_cli_gate_refuses_an_fp16_build_with_an_unproved_site(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = export_ir(_wide_linear(), tmp_path / "wide.cir")
    lib = tmp_path / "out" / "libwide.so"
    code = _cli(["compile", model, "--enable-fp16", "--range", "x=-100:100", "--gate", "-o", lib])
    err = capsys.readouterr().err
    assert code == 3
    assert "CUVIL-FP16-UNPROVED" in err and "matmul" in err
    assert not lib.exists()
    # without --gate, the same command builds with the unproved ops in float32
    assert _cli(["compile", model, "--enable-fp16", "--range", "x=-100:100", "-o", lib]) == 0
    entry = json.loads((tmp_path / "out" / "wide.json").read_text())["precision"]
    assert entry["unproved"] >= 1 and any(k["op"] == "matmul" for k in entry["kept_fp32"])
    assert "kept float32" in capsys.readouterr().out


def test_cli_gate_passes_a_proved_fp16_build(tmp_path: Path) -> None:
    model = export_ir(_wide_linear(), tmp_path / "wide.cir")
    lib = tmp_path / "libwide.so"
    assert _cli(["compile", model, "--enable-fp16", "--range", "x=-0.001:0.001", "--gate", "-o", lib]) == 0
    entry = json.loads((tmp_path / "wide.json").read_text())["precision"]
    assert entry["unproved"] == 0 and entry["fp16_ops"] >= 3


def test_cli_fp16_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = export_ir(_wide_linear(), tmp_path / "wide.cir")
    lib = tmp_path / "libwide.so"
    assert _cli(["compile", model, "--enable-fp16", "-o", lib]) == 2
    err = capsys.readouterr().err
    assert "--range" in err and "hint" in err
    assert _cli(["compile", model, "--range", "x=-1:1", "-o", lib]) == 2
    assert "--enable-fp16" in capsys.readouterr().err
    assert _cli(["compile", model, "--enable-fp16", "--range", "y=-1:1", "-o", lib]) == 2
    assert "not an input" in capsys.readouterr().err
    assert _cli(["compile", model, "--enable-fp16", "--range", "x=1:-1", "-o", lib]) == 2
    assert not lib.exists()


def test_cli_calibrate_takes_the_ranges_from_samples(tmp_path: Path) -> None:
    model = export_ir(_wide_linear(), tmp_path / "wide.cir")
    samples = tmp_path / "calib"
    samples.mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        np.save(samples / f"x_{k}.npy", rng.uniform(-0.5, 0.25, (4, 16)).astype(np.float32))
    lo = min(float(np.load(p).min()) for p in samples.iterdir())
    hi = max(float(np.load(p).max()) for p in samples.iterdir())
    assert _cli(["compile", model, "--enable-fp16", "--calibrate", samples, "-o", tmp_path / "libwide.so"]) == 0
    entry = json.loads((tmp_path / "wide.json").read_text())["precision"]
    assert entry["ranges"]["x"] == pytest.approx([lo, hi])


# --------------------------------------------------------------------------------------
# the API's checks and the cache key


def test_api_needs_ranges_for_fp16_and_fp16_for_ranges() -> None:
    with pytest.raises(InputError, match="range"):
        cuvil.compile(_wide_linear(), fp16=True, cache=False)
    with pytest.raises(InputError, match="FP16"):
        cuvil.compile(_wide_linear(), ranges=WIDE, cache=False)
    with pytest.raises(InputError, match="not an input"):
        cuvil.compile(_wide_linear(), fp16=True, ranges={"x": (-1, 1), "y": (0, 1)}, cache=False)


def test_integer_inputs_need_a_range_too() -> None:
    module = _zoo_module("bert", True)
    with pytest.raises(InputError, match="token ids"):
        plan_fp16(module, {})


def test_cache_key_includes_fp16_and_the_ranges() -> None:
    module = _wide_linear()
    plain = cuvil.compile(module)
    a = cuvil.compile(module, fp16=True, ranges={"x": (-1.0, 1.0)})
    b = cuvil.compile(module, fp16=True, ranges={"x": (-2.0, 1.0)})
    again = cuvil.compile(module, fp16=True, ranges={"x": (-1.0, 1.0)})
    keys = [m.cache_info["key"] for m in (plain, a, b)]
    assert len(set(keys)) == 3
    assert again.cache_info["cache"] == "hit" and again.cache_info["key"] == keys[1]
    assert plain.manifest is not None and again.manifest is not None
    assert "precision" not in plain.manifest and again.manifest["precision"]["ranges"] == {"x": [-1.0, 1.0]}
    strict = cuvil.compile(module, fp16=True, ranges={"x": (-1.0, 1.0)}, fp16_strict=True)
    assert strict.cache_info["key"] != keys[1]


@pytest.mark.parametrize(("limits", "reason"), [({"time_limit": 0.0}, "time limit"), ({"effort": 1e-9}, "work budget")])
def test_a_spent_budget_keeps_every_unproved_op_fp32(limits, reason) -> None:
    module = _wide_linear()
    kept, decisions = fp16_safe_ops(module, {"x": (-1e-3, 1e-3)}, **limits)
    assert kept == {v for v in module.main.ops() if v.dtype is DType.f32}
    assert all(d.precision == "fp32" and reason in d.reason for d in decisions)


def test_symbolic_batch_is_planned_per_specialization() -> None:
    module = cuvil.import_model(ZOO_SMALL["mlp"].to_onnx(dynamic_batch=True))
    model = cuvil.compile(module, fp16=True, ranges={"x": (-1.0, 1.0)}, cache=False)
    x = np.random.default_rng(0).uniform(-1, 1, (3, 64)).astype(np.float32)
    got = model(x)
    assert got.shape == (3, 10) and np.all(np.isfinite(got))
    assert _rel_err(got, run_reference(module, [x])[0]) <= FP16_REL_TOL
