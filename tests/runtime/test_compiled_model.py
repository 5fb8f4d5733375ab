"""CompiledModel as a drop-in callable: numpy and torch in and out, the optimized IR, stage logs."""

from __future__ import annotations

import logging
import platform
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_models import scaled_softmax, softmax_module

import cuvil
from cuvil.arrays import as_array, to_torch
from cuvil.compiler import compile
from cuvil.errors import CodegenError, CuvilError, InputError
from cuvil.interp import run_reference
from cuvil.ir.parser import load_ir
from cuvil.runtime import load

torch = pytest.importorskip("torch")


def test_numpy_in_numpy_out(rng):
    model = compile(softmax_module())
    x = rng.standard_normal((4, 8)).astype(np.float32)
    got = model(x)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, scaled_softmax(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model(x=x), got, rtol=0, atol=0)
    np.testing.assert_allclose(model.run({"x": x})[0], got, rtol=0, atol=0)
    strided = np.asfortranarray(x)  # not C-contiguous: copied on the way in
    np.testing.assert_allclose(model(strided), got, rtol=0, atol=0)


def test_torch_in_torch_out(rng):
    model = compile(softmax_module())
    x = torch.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))
    got = model(x)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and tuple(got.shape) == (4, 8)
    np.testing.assert_allclose(got.numpy(), scaled_softmax(x.numpy()), rtol=1e-5, atol=1e-7)
    # non-contiguous and autograd-tracked inputs work too
    xt = torch.from_numpy(rng.standard_normal((8, 4)).astype(np.float32)).t().requires_grad_(True)
    assert not xt.is_contiguous()
    np.testing.assert_allclose(model(xt).numpy(), scaled_softmax(xt.detach().contiguous().numpy()),
                               rtol=1e-5, atol=1e-7)
    (out,) = model.run([x])
    assert isinstance(out, torch.Tensor)


def test_contiguous_torch_input_is_not_copied():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a = as_array(t)
    assert a.ctypes.data == t.data_ptr()
    b = as_array(torch.arange(6, dtype=torch.bfloat16))
    assert b.dtype.name == "bfloat16"
    np.testing.assert_array_equal(b.astype(np.float32), np.arange(6, dtype=np.float32))


def test_outputs_share_memory_with_the_torch_tensors(rng):

    a = rng.standard_normal((2, 3)).astype(np.float32)
    t = to_torch(a)
    assert t.data_ptr() == a.ctypes.data
    import ml_dtypes

    h = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    th = to_torch(h)
    assert th.dtype == torch.bfloat16 and th.float().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_export_ir_writes_the_optimized_module(tmp_path, rng):
    m = softmax_module()
    model = compile(m)
    path = model.export_ir(tmp_path / "opt.cir")
    optimized = load_ir(path)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(run_reference(optimized, [x])[0], scaled_softmax(x), rtol=1e-5, atol=1e-7)
    # a cache hit has no module in memory: the IR is recomputed on demand
    hit = compile(softmax_module())
    assert hit.cache_info["cache"] == "hit"
    assert hit.export_ir(tmp_path / "again.cir").read_text() == path.read_text()


def test_export_ir_of_a_dynamic_model(tmp_path, rng):
    model = compile(softmax_module("N"))
    model(rng.standard_normal((3, 8)).astype(np.float32))
    text = model.export_ir(tmp_path / "n3.cir").read_text()
    assert "f32[3, 8]" in text
    text = model.export_ir(tmp_path / "n6.cir", dims={"N": 6}).read_text()
    assert "f32[6, 8]" in text


def test_export_ir_needs_a_compiled_model(tmp_path):
    model = compile(softmax_module(), output_dir=tmp_path / "lib")
    loaded = load(model.library_path)
    with pytest.raises(CuvilError, match="IR is not available"):
        loaded.export_ir(tmp_path / "x.cir")


def test_debug_log_shows_each_stage_with_timings(tmp_path, caplog):
    from cuvil.ir.printer import export_ir

    path = export_ir(softmax_module(), tmp_path / "m.cir")
    with caplog.at_level(logging.DEBUG, logger="cuvil"):
        compile(path)
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        compile(path)
        second = [r.getMessage() for r in caplog.records]
    for stage in ("import", "optimize", "codegen", "load"):
        assert any(m.startswith(stage) and "done in" in m for m in first), (stage, first)
    for step in ("lower", "llvm-optimize", "emit", "link"):
        assert any(f"codegen {step}:" in m for m in first), (step, first)
    assert any(m.startswith("cache miss") for m in first)
    assert any(m.startswith("cache hit") for m in second)


def test_set_log_level_turns_on_stage_logs(capsys):
    logger = logging.getLogger("cuvil")
    level, handlers = logger.level, list(logger.handlers)
    try:
        cuvil.set_log_level("DEBUG")
        compile(softmax_module())
        err = capsys.readouterr().err
        assert "cuvil DEBUG optimize" in err and "cuvil DEBUG cache miss" in err
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers


def test_bad_options_are_errors():
    for unknown in ("riscv64-linux-gnu", "aarch64-apple-darwin", "wasm32-unknown-emscripten"):
        with pytest.raises(CodegenError, match="is not supported") as e:
            compile(softmax_module(), target=unknown)
        assert "aarch64-linux-gnu" in (e.value.hint or "")
    with pytest.raises(CodegenError, match="opt_level"):
        compile(softmax_module(), opt_level=4)
    with pytest.raises(CodegenError, match="threads"):
        compile(softmax_module(), threads=0)
    with pytest.raises(CodegenError, match="backend"):
        compile(softmax_module(), backend="tvm")
    if platform.machine() == "x86_64" and sys.platform == "linux":
        for host in ("host", "x86-64", "x86_64-linux-gnu", "x86_64-unknown-linux-gnu"):
            assert compile(softmax_module(), target=host).cache_info["cache"] in ("hit", "miss")


def test_export_ir_of_a_pinned_model(tmp_path):
    model = compile(softmax_module("N"), output_dir=tmp_path / "lib", input_shapes=[(5, 8)])
    assert "f32[5, 8]" in model.export_ir(tmp_path / "n5.cir").read_text()


@pytest.mark.parametrize("kind", ["meta", "sparse", "complex", "ragged"])
def test_tensors_without_usable_data_are_input_errors(kind):
    """The interpreter and a compiled model refuse alike, with a coded error naming the input."""
    m = softmax_module()
    shape = tuple(m.main.params[0].type.shape)
    value = {"meta": lambda: torch.empty(shape, device="meta"),
             "sparse": lambda: torch.zeros(shape).to_sparse(),
             "complex": lambda: torch.zeros(shape, dtype=torch.complex64),
             "ragged": lambda: [[1.0, 2.0], [3.0]]}[kind]()
    name = m.main.params[0].name
    for run in (lambda: compile(m)(value), lambda: run_reference(m, [value])):
        with pytest.raises(InputError) as e:
            run()
        assert e.value.location == name


def test_every_kind_of_input_buffer_reaches_the_library(rng):
    """Read-only, strided, sliced and freshly allocated inputs, each as the library expects it: the data
    pointer comes from the buffer protocol or numpy's own view, never a stale table entry."""
    model = compile(softmax_module(), cache=False)
    base = rng.standard_normal((4, 8)).astype(np.float32)
    frozen = np.frombuffer(base.tobytes(), dtype=np.float32).reshape(4, 8)  # read-only, contiguous
    assert not frozen.flags.writeable
    wide = np.repeat(base, 2, axis=1)[:, ::2]  # not contiguous
    for x in (base, frozen, wide, base.copy(order="F"), np.ascontiguousarray(base[::-1])[::-1]):
        np.testing.assert_allclose(model(x), run_reference(softmax_module(), [np.ascontiguousarray(x)])[0],
                                   rtol=1e-6, atol=1e-7)


def test_the_fast_path_takes_only_calls_the_checked_path_would_pass_unchanged(rng):
    """A static library's per-call fast path (:meth:`NativeLibrary.fast_run`) runs writable, C-contiguous numpy
    arrays of exactly the inputs' dtypes and shapes, with the checked path's bits; it declines everything else
    (which the checked path then converts or refuses, with its errors), and a closed library."""
    model = compile(softmax_module(), cache=False)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    lib = model.library_for([x])
    lib.check([x])
    want = lib.run([x])[0]
    got = lib.fast_run((x,))
    assert got is not None and len(got) == 1
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(model(x), want)
    np.testing.assert_array_equal(model.run([x])[0], want)
    frozen = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(4, 8)
    declined = {"float64": x.astype(np.float64), "shape": x[:3].copy(), "fortran": np.asfortranarray(x),
                "read-only": frozen, "byte-swapped": x.astype(">f4"), "subclass": x.view(np.ma.MaskedArray),
                "torch": torch.from_numpy(x.copy()), "list": x.tolist()}
    for why, value in declined.items():
        assert lib.fast_run((value,)) is None, why
    assert lib.fast_run(()) is None and lib.fast_run((x, x)) is None
    for value in (frozen, declined["fortran"]):  # converted by the checked path
        np.testing.assert_array_equal(np.asarray(model(value)), want)
    for why in ("float64", "byte-swapped", "shape"):
        with pytest.raises(InputError, match="shape" if why == "shape" else "dtype"):
            model(declined[why])
    model.close()
    assert lib.fast_run((x,)) is None
    with pytest.raises(InputError):
        model(x)


def test_a_library_checks_the_count_of_its_inputs_itself(rng):
    """The per-call path sets one descriptor per input and output without re-counting them: the library's own
    check refuses a wrong count, so no descriptor can keep a pointer from an earlier call."""
    model = compile(softmax_module(), cache=False)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    lib = model.library_for([x])
    lib.check([x])
    for arrays in ([], [x, x]):
        with pytest.raises(InputError, match="takes 1 inputs"):
            lib.check(arrays)


def test_threads_sharing_a_library_each_get_their_own_result(rng):
    import threading

    model = compile(softmax_module(), cache=False)
    inputs = [rng.standard_normal((4, 8)).astype(np.float32) * (k + 1) for k in range(8)]
    want = [model(x) for x in inputs]
    bad: list[int] = []

    def worker(k: int) -> None:
        for _ in range(300):
            if not np.array_equal(model(inputs[k]), want[k]):
                bad.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_an_uncached_library_without_an_output_folder_leaves_no_folder_behind(rng):
    """Its temporary folder lives exactly as long as the library: a process compiling many models with the
    cache off must not fill the disk."""
    import gc

    model = compile(softmax_module(), cache=False)
    folder = model.library_path.parent
    assert folder.is_dir() and model.library_path.is_file()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(model(x), scaled_softmax(x), rtol=1e-5, atol=1e-7)
    del model
    gc.collect()
    assert not folder.exists()


def test_a_failed_uncached_build_removes_its_folder(monkeypatch):
    import tempfile

    from cuvil.compiler.job import CompileJob

    made: list[str] = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    def failing(self, env, out_dir, cache_key):
        (out_dir / "partial.o").write_bytes(b"\0")
        raise CodegenError("seeded failure", location="@main")

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    monkeypatch.setattr(CompileJob, "_build", failing)
    with pytest.raises(CodegenError, match="seeded failure"):
        compile(softmax_module(), cache=False)
    assert made and not any(Path(p).exists() for p in made)
