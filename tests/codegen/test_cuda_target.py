"""PTX for NVIDIA GPUs (``target="cuda"``): every op of the catalogue and every zoo model lowers to a
module that NVIDIA's ``ptxas`` assembles for sm_75 and sm_90, with a launch plan the host follows.

No GPU is needed here: the module is only assembled. Running it needs a GPU and its driver
(``bench/device_check.sh`` does, where one is available); without one the first call fails with a
clear error, and compiling still works.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from codegen_catalogue import batches, cases_of

from cuvil.codegen.gpu.ptx import BLOCK, SM_TARGETS, check_ptx, lower_to_ptx, ptxas_path
from cuvil.compiler import compile, resolve_target
from cuvil.errors import CodegenError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.runtime import load

needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="no ptxas (the CUDA toolkit) to assemble the PTX with")
STRUCTURED = {"loop", "cond"}  # not compiled for CUDA yet: refused with a CodegenError (tested below)


def _batch_module(ops):
    b = Builder()
    params, results = [], []
    for op in ops:
        for case in (c for c in cases_of(op) if c.skip is None):
            ps = [b.param(f"p{len(params) + i}", DType.from_numpy(a.dtype), a.shape) for i, a in enumerate(case.arrays)]
            params += ps
            results.append(b.op(op.name, *ps, **case.attrs))
    return b.module(b.function("batch", params, results, [f"r{k}" for k in range(len(results))]))


BATCHES = {k: [op for op in v if op.name not in STRUCTURED] for k, v in batches().items()}


@needs_ptxas
@pytest.mark.parametrize("batch", sorted(k for k, v in BATCHES.items() if v))
def test_catalogue_batch_assembles_for_every_architecture(batch):
    m = _batch_module(BATCHES[batch])
    program = lower_to_ptx(m.main, m.constants)
    assert len(program.launches) == len(m.main.results)
    for sm in SM_TARGETS:
        check_ptx(program.ptx, sm)


def test_loops_and_conds_are_refused_with_a_clear_error():
    from cuvil.ir.opdef import all_ops

    for op in (o for o in all_ops() if o.name in STRUCTURED):
        m = _batch_module([op])
        with pytest.raises(CodegenError, match="not compiled for CUDA yet"):
            lower_to_ptx(m.main, m.constants)


def _mlp():
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.param("x", DType.f32, [8, 32])
    w = b.const(rng.standard_normal((32, 16)).astype(np.float32))
    y = b.softmax(b.matmul(b.relu(x), w), axis=-1)
    return b.module(b.function("mlp", [x], [y, x], ["y", "same"]))


@needs_ptxas
def test_compile_writes_ptx_constants_and_a_launch_plan(tmp_path):
    m = _mlp()
    model = compile(m, target="cuda", output_dir=tmp_path)
    man = model.manifest
    assert model.library_path.suffix == ".ptx" and man["target"] == resolve_target("cuda").to_json()
    assert man["cuda"]["ptxas"] == {sm: "ptxas ok" for sm in SM_TARGETS}
    text = model.library_path.read_text()
    for launch in man["cuda"]["launches"]:
        assert f".entry {launch['kernel']}(" in text
        assert launch["block"] == BLOCK
    # every output element gets a thread
    out = man["outputs"][0]
    numel = int(np.prod(out["shape"]))
    last = man["cuda"]["launches"][-1]
    assert last["buffers"][0] == ["output", 0] and last["grid"] * BLOCK >= numel
    assert man["cuda"]["copies"] == [[["input", 0], 1]]  # the input returned as is is copied
    assert (tmp_path / man["cuda"]["constants"]).is_file()
    assert type(load(model.library_path)._last).__name__ == "CudaLibrary"


@needs_ptxas
def test_running_without_a_gpu_is_a_clear_error_and_tampering_is_refused(tmp_path):
    m = _mlp()
    model = compile(m, target="cuda", output_dir=tmp_path)
    try:
        from cuda.bindings import driver

        has_gpu = driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS
    except Exception:
        has_gpu = False
    if not has_gpu:
        with pytest.raises(CodegenError, match=r"cuda-bindings|NVIDIA"):
            model(np.zeros((8, 32), np.float32))
    consts = tmp_path / model.manifest["cuda"]["constants"]
    consts.write_bytes(consts.read_bytes()[:-1] + b"\x00")
    with pytest.raises(CodegenError, match="does not match the hash"):
        load(model.library_path)


@needs_ptxas
def test_cli_compiles_for_cuda(tmp_path, capsys):
    from cuvil.cli import main
    from cuvil.ir.printer import export_ir

    src = export_ir(_mlp(), tmp_path / "mlp.cir")
    out = tmp_path / "out" / "libmlp.ptx"
    assert main(["compile", str(src), "-o", str(out), "--target", "cuda", "--no-cache"]) == 0
    assert "nvptx64-nvidia-cuda" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "mlp.json").read_text())
    assert manifest["library"] == "libmlp.ptx"
    assert (tmp_path / "out" / manifest["cuda"]["constants"]).is_file()
    assert type(load(out)._last).__name__ == "CudaLibrary"  # integrity and provenance check out


def _zoo_ptx(name: str, small: bool) -> None:
    from bench.models import ZOO, ZOO_SMALL
    from cuvil.frontend.dispatch import import_model
    from cuvil.passes import run_pipeline

    zm = (ZOO_SMALL if small else ZOO)[name]
    optimized = run_pipeline(import_model(zm.to_onnx()), "O3").module
    program = lower_to_ptx(optimized.main, optimized.constants)
    for sm in SM_TARGETS:
        check_ptx(program.ptx, sm)


def _zoo_names() -> list[str]:
    from bench.models import ZOO_SMALL

    return sorted(ZOO_SMALL)


@needs_ptxas
@pytest.mark.parametrize("name", _zoo_names())
def test_small_zoo_model_assembles(name):
    _zoo_ptx(name, small=True)


@pytest.mark.slow
@needs_ptxas
@pytest.mark.parametrize("name", _zoo_names())
def test_full_zoo_model_assembles(name):
    _zoo_ptx(name, small=False)


@needs_ptxas
def test_cuda_graph_is_an_option_of_cuda_libraries_only(tmp_path):
    from cuvil.errors import InputError

    m = _mlp()
    cuda = compile(m, target="cuda", output_dir=tmp_path / "cuda")
    assert load(cuda.library_path, cuda_graph=True)._last.graph is True
    assert load(cuda.library_path)._last.graph is False
    native = compile(m, output_dir=tmp_path / "native")
    with pytest.raises(InputError, match="cuda_graph applies to a library compiled for CUDA"):
        load(native.library_path, cuda_graph=True)
