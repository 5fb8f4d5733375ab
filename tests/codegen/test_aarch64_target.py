"""Libraries cross-compiled for 64-bit ARM (``target="aarch64-linux-gnu"``), run under qemu-aarch64.

The same rules and kernel schedules are lowered for ARMv8-A + NEON (4-lane vectors, 32 registers);
every library is compared with the interpreter: the whole op catalogue and the small zoo here,
the full zoo and the catalogue at -O0/-O3 with the slow suite. Integer programs must agree with
the host's library bit for bit.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from codegen_catalogue import batches, catalogue_results, run_batch

import cuvil
from cuvil.compiler import compile, resolve_target
from cuvil.errors import CodegenError
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.runtime import load
from cuvil.runtime.emulated import EmulatedLibrary
from tests.cross_targets import AARCH64, needs_aarch64

pytestmark = needs_aarch64

EM_AARCH64 = 183  # ELF e_machine


def _elf_machine(path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", "not an ELF file"
    return struct.unpack_from("<H", head, 18)[0]


def _mlp(hidden: int = 96) -> tuple[cuvil.ir.module.Module, np.ndarray]:
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.param("x", DType.f32, [64, 128])
    w1 = b.const(rng.standard_normal((128, hidden)).astype(np.float32) / 8)
    w2 = b.const(rng.standard_normal((hidden, 10)).astype(np.float32) / 8)
    y = b.softmax(b.matmul(b.relu(b.matmul(x, w1)), w2), axis=-1)
    return b.module(b.function("mlp", [x], [y], ["y"])), rng.standard_normal((64, 128)).astype(np.float32)


def test_target_names_resolve_to_armv8_with_neon():
    for name in ("aarch64-linux-gnu", "aarch64-unknown-linux-gnu", "arm64", "aarch64"):
        t = resolve_target(name)
        assert (t.arch, t.triple, t.has("neon")) == ("aarch64", "aarch64-unknown-linux-gnu", True)


def test_library_is_an_arm64_elf_with_neon_kernels_and_matches_the_interpreter(tmp_path):
    m, xv = _mlp()
    model = compile(m, target=AARCH64, output_dir=tmp_path)
    assert _elf_machine(model.library_path) == EM_AARCH64
    man = model.manifest
    assert man["target"]["triple"] == "aarch64-unknown-linux-gnu"
    tuned = [k for k in man["kernels"] if k != "rule"]
    assert tuned and all(".neon." in k or "rows" in k for k in tuned), man["kernels"]
    assert isinstance(model._last, EmulatedLibrary)
    np.testing.assert_allclose(model(xv), run_reference(m, [xv])[0], rtol=1e-5, atol=1e-6)
    # loaded again from disk (manifest beside it): the same emulated run, with the hash checked
    again = load(model.library_path)
    np.testing.assert_array_equal(again(xv), model(xv))


def test_inputs_are_checked_before_the_emulator_runs(tmp_path):
    m, xv = _mlp()
    model = compile(m, target=AARCH64, output_dir=tmp_path)
    with pytest.raises(cuvil.errors.InputError, match="shape"):
        model(xv[:3])
    with pytest.raises(cuvil.errors.InputError, match="dtype"):
        model(xv.astype(np.float64))


def test_thread_pool_runs_under_the_target():
    """A GEMM large enough for the pool, at 1 and 2 threads: the same result (each thread sums whole rows)."""
    rng = np.random.default_rng(5)
    b = Builder()
    x = b.param("x", DType.f32, [256, 256])
    w = b.const(rng.standard_normal((256, 256)).astype(np.float32))
    m = b.module(b.function("big", [x], [b.matmul(x, w)], ["y"]))
    xv = rng.standard_normal((256, 256)).astype(np.float32)
    one = compile(m, target=AARCH64, threads=1, cache=False)(xv)
    two = compile(m, target=AARCH64, threads=2, cache=False)(xv)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, run_reference(m, [xv])[0], rtol=1e-4, atol=1e-4)


def test_shape_class_library_runs_at_several_sizes():
    rng = np.random.default_rng(7)
    b = Builder()
    x = b.param("x", DType.f32, ["N", 12])
    w = b.const(rng.standard_normal((12, 5)).astype(np.float32))
    m = b.module(b.function("seq", [x], [b.tanh(b.matmul(x, w))], ["y"]))
    model = compile(m, target=AARCH64, shape_class=True, dim_max={"N": 33}, cache=False)
    for n in (1, 9, 33):
        xv = rng.standard_normal((n, 12)).astype(np.float32)
        np.testing.assert_allclose(model(xv), run_reference(m, [xv])[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(cuvil.errors.ConstraintError):
        model(rng.standard_normal((34, 12)).astype(np.float32))


def test_integer_program_agrees_with_the_host_library_bit_for_bit():
    """Wrapping int32 products and sums, shifts and integer division: no tolerance between targets."""
    rng = np.random.default_rng(9)
    b = Builder()
    x = b.param("x", DType.i32, [16, 40])
    w = b.const(rng.integers(-2**20, 2**20, (40, 24)).astype(np.int32))
    y = b.matmul(x, w)
    z = b.op("div", y, b.const(np.array(7, np.int32)))
    m = b.module(b.function("ints", [x], [y, z], ["y", "z"]))
    xv = rng.integers(-2**20, 2**20, (16, 40)).astype(np.int32)
    arm = compile(m, target=AARCH64, cache=False).run([xv])
    host = compile(m, cache=False).run([xv])
    for a, h, want in zip(arm, host, run_reference(m, [xv]), strict=True):
        np.testing.assert_array_equal(a, h)
        np.testing.assert_array_equal(a, want)


def test_cache_keeps_one_artifact_per_target(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    m, xv = _mlp(32)
    arm = compile(m, target=AARCH64)
    host = compile(m)
    assert arm.cache_info["key"] != host.cache_info["key"]
    assert compile(m, target="arm64").cache_info["cache"] == "hit"
    np.testing.assert_allclose(arm(xv), host(xv), rtol=1e-5, atol=1e-6)


def test_missing_cross_linker_or_emulator_is_a_clear_error(monkeypatch, tmp_path):
    m, _ = _mlp(16)
    monkeypatch.setenv("CUVIL_CC_AARCH64", "no-such-aarch64-gcc")
    with pytest.raises(CodegenError, match="no C compiler 'no-such-aarch64-gcc'") as e:
        compile(m, target=AARCH64, cache=False)
    assert "gcc-aarch64-linux-gnu" in (e.value.hint or "")
    monkeypatch.delenv("CUVIL_CC_AARCH64")
    monkeypatch.setenv("CUVIL_QEMU_AARCH64", "no-such-qemu")
    model = compile(m, target=AARCH64, output_dir=tmp_path)  # cross-compiling needs no emulator
    assert _elf_machine(load(model.library_path).library_path) == EM_AARCH64
    with pytest.raises(CodegenError, match="no no-such-qemu") as e:
        model(np.zeros((64, 128), np.float32))
    assert "qemu-user" in (e.value.hint or "")


def test_cli_compiles_for_aarch64_and_runs_the_library(tmp_path, capsys):
    from cuvil.cli import main
    from cuvil.ir.printer import export_ir

    m, xv = _mlp(24)
    src = export_ir(m, tmp_path / "mlp.cir")
    lib = tmp_path / "libmlp.so"
    assert main(["compile", str(src), "-o", str(lib), "--target", "aarch64-linux-gnu", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "aarch64-unknown-linux-gnu" in out and _elf_machine(lib) == EM_AARCH64
    np.save(tmp_path / "x.npy", xv)
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]) == 0
    got = np.load(next((tmp_path / "out").glob("*.npy")))
    np.testing.assert_allclose(got, run_reference(m, [xv])[0], rtol=1e-5, atol=1e-6)


# -- the catalogue ------------------------------------------------------------------------------

BATCHES = batches()


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_catalogue_batch_on_aarch64(batch):
    results = run_batch(BATCHES[batch], f"a64_{batch}", opt_level=2, target=AARCH64)
    bad = {name: r.errors or ["no example could be compared"] for name, r in results.items() if not r.ok}
    assert not bad, "\n".join(f"{name}: {e}" for name, errs in bad.items() for e in errs)


@pytest.mark.slow
@pytest.mark.parametrize("opt_level", [0, 3])
def test_catalogue_on_aarch64_at_other_opt_levels(opt_level):
    res = catalogue_results(opt_level, AARCH64)
    bad = {name: r.errors for name, r in res.items() if not r.ok}
    assert not bad, bad


# -- the zoo ----------------------------------------------------------------------------------


def _zoo_on_aarch64(name: str, small: bool) -> None:
    """The zoo model through ONNX, compiled at the defaults (O3, INT8 where the model is QDQ) for aarch64:
    float models agree with the interpreter on the optimized program; integer-lowered (QDQ) models give
    exactly the host library's outputs."""
    from bench.models import ZOO, ZOO_SMALL
    from tests.oracles import assert_agrees

    zm = (ZOO_SMALL if small else ZOO)[name]
    proto = zm.to_onnx()
    inputs = zm.example_inputs_numpy()
    arm = compile(proto, target=AARCH64, cache=False)
    got = arm.run(inputs)
    if zm.has_torch_reference:
        optimized = arm._ir(None) if arm._ir is not None else cuvil.import_model(proto)
        assert_agrees(got, run_reference(optimized, inputs))
    else:
        host = compile(proto, cache=False).run(inputs)
        for a, h in zip(got, host, strict=True):
            np.testing.assert_array_equal(a, h)


def _zoo_names() -> list[str]:
    from bench.models import ZOO_SMALL

    return sorted(ZOO_SMALL)


@pytest.mark.parametrize("name", _zoo_names())
def test_small_zoo_model_on_aarch64(name):
    _zoo_on_aarch64(name, small=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", _zoo_names())
def test_full_zoo_model_on_aarch64(name):
    _zoo_on_aarch64(name, small=False)
