"""Libraries cross-compiled for 64-bit ARM (``aarch64-linux-gnu``, run under qemu-aarch64) and for
WebAssembly (``wasm32-wasi``, run by wasmtime in the process).

The same rules and kernel schedules are lowered for ARMv8-A + NEON and for SIMD128 (4-lane vectors);
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
from tests.cross_targets import AARCH64, WASM32, needs_aarch64, needs_wasm

TARGETS = [pytest.param(AARCH64, id="aarch64", marks=needs_aarch64),
           pytest.param(WASM32, id="wasm32", marks=needs_wasm)]
KERNEL_TAG = {AARCH64: ".neon.", WASM32: ".simd128."}
RUNNER = {AARCH64: "EmulatedLibrary", WASM32: "WasmLibrary"}
EM_AARCH64 = 183  # ELF e_machine


def _is_binary_for(path, target: str) -> bool:
    head = path.read_bytes()[:20]
    if target == WASM32:
        return head[:8] == b"\0asm\x01\0\0\0" and path.suffix == ".wasm"
    return head[:4] == b"\x7fELF" and struct.unpack_from("<H", head, 18)[0] == EM_AARCH64


def _mlp(hidden: int = 96) -> tuple[cuvil.ir.module.Module, np.ndarray]:
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.param("x", DType.f32, [64, 128])
    w1 = b.const(rng.standard_normal((128, hidden)).astype(np.float32) / 8)
    w2 = b.const(rng.standard_normal((hidden, 10)).astype(np.float32) / 8)
    y = b.softmax(b.matmul(b.relu(b.matmul(x, w1)), w2), axis=-1)
    return b.module(b.function("mlp", [x], [y], ["y"])), rng.standard_normal((64, 128)).astype(np.float32)


def test_target_names_resolve():
    for name in ("aarch64-linux-gnu", "aarch64-unknown-linux-gnu", "arm64", "aarch64"):
        t = resolve_target(name)
        assert (t.arch, t.triple, t.has("neon"), t.library_suffix) == ("aarch64", "aarch64-unknown-linux-gnu",
                                                                       True, ".so")
    for name in ("wasm32-wasi", "wasm32", "wasm32-unknown-wasi"):
        t = resolve_target(name)
        assert (t.arch, t.has("simd128"), t.threads, t.pointer_bits, t.library_suffix) == ("wasm32", True, False,
                                                                                          32, ".wasm")


@pytest.mark.parametrize("target", TARGETS)
def test_library_is_for_the_target_uses_its_kernels_and_matches_the_interpreter(tmp_path, target):
    m, xv = _mlp()
    model = compile(m, target=target, output_dir=tmp_path)
    assert _is_binary_for(model.library_path, target)
    man = model.manifest
    assert man["target"] == resolve_target(target).to_json()
    tuned = [k for k in man["kernels"] if k != "rule"]
    assert tuned and all(KERNEL_TAG[target] in k or "rows" in k for k in tuned), man["kernels"]
    assert type(model._last).__name__ == RUNNER[target]
    np.testing.assert_allclose(model(xv), run_reference(m, [xv])[0], rtol=1e-5, atol=1e-6)
    # loaded again from disk (manifest beside it, hash checked): the same outputs
    again = load(model.library_path)
    np.testing.assert_array_equal(again(xv), model(xv))


@pytest.mark.parametrize("target", TARGETS)
def test_inputs_are_checked_before_the_library_runs(tmp_path, target):
    m, xv = _mlp()
    model = compile(m, target=target, output_dir=tmp_path)
    with pytest.raises(cuvil.errors.InputError, match="shape"):
        model(xv[:3])
    with pytest.raises(cuvil.errors.InputError, match="dtype"):
        model(xv.astype(np.float64))


@pytest.mark.parametrize("target", TARGETS)
def test_threads_give_the_same_result(target):
    """A GEMM large enough for the pool, at 1 and 2 threads: the same result (each thread sums whole rows;
    wasm32 has no threads and runs every chunk on the caller)."""
    rng = np.random.default_rng(5)
    b = Builder()
    x = b.param("x", DType.f32, [256, 256])
    w = b.const(rng.standard_normal((256, 256)).astype(np.float32))
    m = b.module(b.function("big", [x], [b.matmul(x, w)], ["y"]))
    xv = rng.standard_normal((256, 256)).astype(np.float32)
    one = compile(m, target=target, threads=1, cache=False)(xv)
    two = compile(m, target=target, threads=2, cache=False)(xv)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, run_reference(m, [xv])[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_shape_class_library_runs_at_several_sizes(target):
    rng = np.random.default_rng(7)
    b = Builder()
    x = b.param("x", DType.f32, ["N", 12])
    w = b.const(rng.standard_normal((12, 5)).astype(np.float32))
    m = b.module(b.function("seq", [x], [b.tanh(b.matmul(x, w))], ["y"]))
    model = compile(m, target=target, shape_class=True, dim_max={"N": 33}, cache=False)
    for n in (1, 9, 33):
        xv = rng.standard_normal((n, 12)).astype(np.float32)
        np.testing.assert_allclose(model(xv), run_reference(m, [xv])[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(cuvil.errors.ConstraintError):
        model(rng.standard_normal((34, 12)).astype(np.float32))


@pytest.mark.parametrize("target", TARGETS)
def test_integer_program_agrees_with_the_host_library_bit_for_bit(target):
    """Wrapping int32 products and sums, integer division, int64 arithmetic (64-bit on wasm32 too):
    no tolerance between targets."""
    rng = np.random.default_rng(9)
    b = Builder()
    x = b.param("x", DType.i32, [16, 40])
    w = b.const(rng.integers(-2**20, 2**20, (40, 24)).astype(np.int32))
    y = b.matmul(x, w)
    z = b.op("div", y, b.const(np.array(7, np.int32)))
    big = b.op("mul", b.op("cast", y, to=DType.i64), b.const(np.array(3_000_000_019, np.int64)))
    m = b.module(b.function("ints", [x], [y, z, big], ["y", "z", "big"]))
    xv = rng.integers(-2**20, 2**20, (16, 40)).astype(np.int32)
    other = compile(m, target=target, cache=False).run([xv])
    host = compile(m, cache=False).run([xv])
    for a, h, want in zip(other, host, run_reference(m, [xv]), strict=True):
        np.testing.assert_array_equal(a, h)
        np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("target", TARGETS)
def test_cache_keeps_one_artifact_per_target(tmp_path, monkeypatch, target):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    m, xv = _mlp(32)
    other = compile(m, target=target)
    host = compile(m)
    assert other.cache_info["key"] != host.cache_info["key"]
    again = compile(m, target=target.split("-")[0])  # "aarch64" / "wasm32" name the same target
    assert again.cache_info["cache"] == "hit"
    np.testing.assert_allclose(again(xv), host(xv), rtol=1e-5, atol=1e-6)


@needs_aarch64
def test_missing_cross_linker_or_emulator_is_a_clear_error(monkeypatch, tmp_path):
    m, _ = _mlp(16)
    monkeypatch.setenv("CUVIL_CC_AARCH64", "no-such-aarch64-gcc")
    with pytest.raises(CodegenError, match="no C compiler 'no-such-aarch64-gcc'") as e:
        compile(m, target=AARCH64, cache=False)
    assert "gcc-aarch64-linux-gnu" in (e.value.hint or "")
    monkeypatch.delenv("CUVIL_CC_AARCH64")
    monkeypatch.setenv("CUVIL_QEMU_AARCH64", "no-such-qemu")
    model = compile(m, target=AARCH64, output_dir=tmp_path)  # cross-compiling needs no emulator
    assert _is_binary_for(load(model.library_path).library_path, AARCH64)
    with pytest.raises(CodegenError, match="no no-such-qemu") as e:
        model(np.zeros((64, 128), np.float32))
    assert "qemu-user" in (e.value.hint or "")


@needs_wasm
def test_missing_wasm_linker_is_a_clear_error(monkeypatch):
    m, _ = _mlp(16)
    monkeypatch.setenv("CUVIL_WASM_LD", "/no/such/wasm-ld")
    with pytest.raises(CodegenError, match="no wasm-ld") as e:
        compile(m, target=WASM32, cache=False)
    assert "lld" in (e.value.hint or "")


@needs_wasm
def test_wasm_module_imports_only_wasi_and_a_corrupted_one_is_refused(tmp_path):
    """The module's imports are WASI's only (the runtime grants it no files, environment or arguments);
    a corrupted module is refused by the hash check before wasmtime sees it."""
    from cuvil.codegen.manifest import IntegrityError

    m, _ = _mlp(16)
    model = compile(m, target=WASM32, output_dir=tmp_path)
    import wasmtime

    module = wasmtime.Module.from_file(wasmtime.Engine(), str(model.library_path))
    assert {imp.module for imp in module.imports} <= {"wasi_snapshot_preview1"}
    exports = {e.name for e in module.exports}
    assert set(model.manifest["symbols"].values()) <= exports and {"memory", "malloc", "free"} <= exports
    data = bytearray(model.library_path.read_bytes())
    data[-3] ^= 0xFF
    model.library_path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        load(model.library_path)


@pytest.mark.parametrize("target", TARGETS)
def test_cli_compiles_for_the_target_and_runs_the_library(tmp_path, capsys, target):
    from cuvil.cli import main
    from cuvil.ir.printer import export_ir

    m, xv = _mlp(24)
    src = export_ir(m, tmp_path / "mlp.cir")
    suffix = resolve_target(target).library_suffix
    lib = tmp_path / f"libmlp{suffix}"
    assert main(["compile", str(src), "-o", str(lib), "--target", target, "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert resolve_target(target).triple in out and _is_binary_for(lib, target)
    assert (tmp_path / "mlp.h").is_file() and (tmp_path / "mlp.json").is_file()
    np.save(tmp_path / "x.npy", xv)
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]) == 0
    got = np.load(next((tmp_path / "out").glob("*.npy")))
    np.testing.assert_allclose(got, run_reference(m, [xv])[0], rtol=1e-5, atol=1e-6)


# -- the catalogue ------------------------------------------------------------------------------

BATCHES = batches()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_catalogue_batch_on_the_target(batch, target):
    results = run_batch(BATCHES[batch], f"x_{batch}", opt_level=2, target=target)
    bad = {name: r.errors or ["no example could be compared"] for name, r in results.items() if not r.ok}
    assert not bad, "\n".join(f"{name}: {e}" for name, errs in bad.items() for e in errs)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("opt_level", [0, 3])
def test_catalogue_on_the_target_at_other_opt_levels(opt_level, target):
    res = catalogue_results(opt_level, target)
    bad = {name: r.errors for name, r in res.items() if not r.ok}
    assert not bad, bad


# -- the zoo ----------------------------------------------------------------------------------


def _zoo_on(target: str, name: str, small: bool) -> None:
    """The zoo model through ONNX, compiled at the defaults (O3, INT8 where the model is QDQ) for the
    target: float models agree with the interpreter on the optimized program; integer-lowered (QDQ)
    models give exactly the host library's outputs."""
    from bench.models import ZOO, ZOO_SMALL
    from tests.oracles import assert_agrees

    zm = (ZOO_SMALL if small else ZOO)[name]
    proto = zm.to_onnx()
    inputs = zm.example_inputs_numpy()
    other = compile(proto, target=target, cache=False)
    got = other.run(inputs)
    if zm.has_torch_reference:
        optimized = other._ir(None) if other._ir is not None else cuvil.import_model(proto)
        assert_agrees(got, run_reference(optimized, inputs))
    else:
        host = compile(proto, cache=False).run(inputs)
        for a, h in zip(got, host, strict=True):
            np.testing.assert_array_equal(a, h)


def _zoo_names() -> list[str]:
    from bench.models import ZOO_SMALL

    return sorted(ZOO_SMALL)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", _zoo_names())
def test_small_zoo_model_on_the_target(name, target):
    _zoo_on(target, name, small=True)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", _zoo_names())
def test_full_zoo_model_on_the_target(name, target):
    _zoo_on(target, name, small=False)


# -- certificates ---------------------------------------------------------------------------------


def _needs_ptxas():
    from cuvil.codegen.gpu.ptx import ptxas_path

    return pytest.mark.skipif(ptxas_path() is None, reason="no ptxas (the CUDA toolkit)")


@pytest.mark.parametrize("target", [*TARGETS, pytest.param("cuda", id="cuda", marks=_needs_ptxas())])
def test_gated_library_certificate_names_its_target_and_checks_out(tmp_path, capsys, target):
    """compile --gate for the target; the certificate says which target and which tests back its code,
    and cuvil verify --check-certificate accepts the library (its embedded provenance included)."""
    import json

    from bench.demo import EXAMPLE
    from cuvil.cli import main

    lib = tmp_path / f"libtiny{resolve_target(target).library_suffix}"
    shape = ["--shape", "x=1x1x16x16"]
    assert main(["compile", str(EXAMPLE), "--gate", "--no-cache", *shape, "-o", str(lib), "--target", target]) == 0
    cert = json.loads((tmp_path / "tiny.json").read_text())["verification"]
    assert cert["target"]["triple"] == resolve_target(target).triple and cert["target"]["tested_by"] != "none"
    assert main(["verify", str(EXAMPLE), *shape, "--check-certificate", str(lib), "-q"]) == 0
    capsys.readouterr()
