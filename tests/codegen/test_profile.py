"""Per-step profiling (``compile(..., profile=True)``): the same results as an unprofiled build, one counter
per step of the run that grows with the work of that step, runs counted, reset, and clear errors where a
library has no profile."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil import cli
from cuvil.codegen.manifest import ManifestError
from cuvil.codegen.profile import check_profile_target
from cuvil.codegen.target import Target
from cuvil.compiler import compile
from cuvil.errors import CodegenError, InputError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.runtime.loader import load
from cuvil.runtime.profile import render_profile
from tests.cross_targets import c_toolchain, run_c_program

BIG, SMALL = 384, 4


def _two_products(rng: np.random.Generator):
    """Two independent products, one ~10^5 times the other's work: ``x @ Wbig`` and ``t @ Wsmall``."""
    b = Builder()
    x = b.param("x", DType.f32, [BIG, BIG])
    t = b.param("t", DType.f32, [1, SMALL])
    big = b.matmul(x, b.const(rng.standard_normal((BIG, BIG)).astype(np.float32)))
    small = b.matmul(t, b.const(rng.standard_normal((SMALL, SMALL)).astype(np.float32)))
    return b.module(b.function("pair", [x, t], [big, small], ["big", "small"]))


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    rng = np.random.default_rng(5)
    m = _two_products(rng)
    root = tmp_path_factory.mktemp("profile")
    profiled = compile(m, output_dir=root / "on", profile=True, threads=1)
    plain = compile(m, output_dir=root / "off", threads=1)
    inputs = [rng.standard_normal((BIG, BIG)).astype(np.float32), rng.standard_normal((1, SMALL)).astype(np.float32)]
    return profiled, plain, inputs, root


def test_profiled_library_computes_the_same_bits(builds):
    profiled, plain, inputs, _ = builds
    for got, want in zip(profiled(*inputs), plain(*inputs), strict=True):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_each_step_is_timed_and_runs_are_counted(builds):
    profiled, _, inputs, _ = builds
    profiled.profile(reset=True)
    for _ in range(7):
        profiled(*inputs)
    p = profiled.profile()
    assert p.runs == 7
    steps = profiled.manifest["profile"]["steps"]
    assert len(p.steps) == len(steps) == len(profiled.manifest["kernels"])
    by_type = {s.type: s for s in p.steps if s.op == "matmul" or s.kernel.startswith("gemm")}
    big = next(s for t, s in by_type.items() if f"[{BIG}, {BIG}]" in t)
    small = next(s for t, s in by_type.items() if f"[1, {SMALL}]" in t)
    # 2 * 384^3 flops against 2 * 4^2: the big product's step must hold the time, not its neighbour's
    assert big.total_ns > 20 * small.total_ns > 0
    assert big.total_ns / 7 > 1e5 * 0.2  # at least 20 us a run: 113 MFLOP is never faster than ~5 TFLOP/s
    assert abs(p.total_ns - sum(s.total_ns for s in p.steps)) == 0
    text = render_profile(p)
    assert "7 run(s)" in text and big.kernel in text


def test_reset_zeroes_the_counters(builds):
    profiled, _, inputs, _ = builds
    profiled(*inputs)
    before = profiled.profile(reset=True)
    assert before.runs >= 1 and before.total_ns > 0
    after = profiled.profile()
    assert after.runs == 0 and after.total_ns == 0
    profiled(*inputs)
    assert profiled.profile().runs == 1


def test_an_unprofiled_library_says_how_to_get_one(builds):
    _, plain, inputs, _ = builds
    plain(*inputs)
    with pytest.raises(InputError, match="without per-step profiling") as e:
        plain.profile()
    assert "profile=True" in (e.value.hint or "")
    assert "profile" not in plain.manifest
    lib = plain.library_path.read_bytes()
    assert b"cuvil_pair_profile" not in lib


def test_header_declares_the_reader_only_when_profiled(builds):
    _, _, _, root = builds
    assert "int64_t cuvil_pair_profile(int64_t* ns, int64_t capacity, int32_t reset);" in \
        (root / "on" / "cuvil_pair.h").read_text()
    assert "_profile" not in (root / "off" / "cuvil_pair.h").read_text()


PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuvil_pair.h"

int main(int argc, char** argv) {
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) return 91;
    __typeof__(&cuvil_pair_create) create = (__typeof__(&cuvil_pair_create))dlsym(h, "cuvil_pair_create");
    __typeof__(&cuvil_pair_run) run = (__typeof__(&cuvil_pair_run))dlsym(h, "cuvil_pair_run");
    __typeof__(&cuvil_pair_profile) profile = (__typeof__(&cuvil_pair_profile))dlsym(h, "cuvil_pair_profile");
    if (!create || !run || !profile) return 92;
    void* ctx = create();
    float* x = calloc(384 * 384, sizeof(float));
    float t[4] = {1, 2, 3, 4};
    float* big = malloc(384 * 384 * sizeof(float));
    float small[4];
    void* ins[2] = {x, t};
    void* outs[2] = {big, small};
    for (int r = 0; r < 3; r++) if (run(ctx, ins, outs) != 0) return 93;
    int64_t ns[CUVIL_PAIR_NUM_STEPS + 4];
    for (int k = 0; k < CUVIL_PAIR_NUM_STEPS + 4; k++) ns[k] = -1;
    int64_t runs = profile(ns, CUVIL_PAIR_NUM_STEPS, 1);
    int64_t total = 0, negative = 0;
    for (int k = 0; k < CUVIL_PAIR_NUM_STEPS; k++) { total += ns[k]; negative += ns[k] < 0; }
    int64_t untouched = ns[CUVIL_PAIR_NUM_STEPS];
    int64_t again = profile(NULL, 0, 0);
    printf("%lld %lld %lld %lld %lld\n", (long long)runs, (long long)(total > 0), (long long)negative,
           (long long)untouched, (long long)again);
    return 0;
}
"""


def test_a_c_program_reads_the_profile_through_the_header(builds, tmp_path):
    cc, run_prefix = c_toolchain(None)
    if cc is None:
        pytest.skip("no C compiler on this machine")
    profiled, _, _, root = builds
    exe = tmp_path / "reader"
    out = run_c_program(cc, run_prefix, PROGRAM, root / "on", exe, profiled.library_path)
    runs, positive, negative, untouched, again = map(int, out.split())
    # its own process: three runs; the capacity bounds the copy; the reset leaves nothing counted
    assert (runs, positive, negative, untouched, again) == (3, 1, 0, -1, 0)


def test_profiling_refuses_a_target_without_the_clock():
    with pytest.raises(CodegenError, match="64-bit Linux"):
        check_profile_target(Target("wasm32-unknown-wasi", "generic", ""))
    check_profile_target(Target("x86_64-unknown-linux-gnu", "generic", ""))


@pytest.fixture
def onnx_model(tmp_path):
    w = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5.0) / 7.0
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    return path


def test_cli_compiles_a_profiled_library_and_prints_its_profile(capsys, onnx_model, tmp_path):
    lib = tmp_path / "libmlp.so"
    assert cli.main(["compile", str(onnx_model), "-o", str(lib), "--profile", "--no-cache"]) == 0
    capsys.readouterr()
    assert cli.main(["run", str(lib), "-i", f"x={tmp_path / 'x.npy'}", "--profile", "5"]) == 0
    out = capsys.readouterr().out
    assert "5 run(s)" in out and "ms/run" in out and "a call from Python" in out


def test_cli_profile_of_an_unprofiled_library_is_an_input_error(capsys, onnx_model, tmp_path):
    lib = tmp_path / "libplain.so"
    assert cli.main(["compile", str(onnx_model), "-o", str(lib), "--no-cache"]) == 0
    capsys.readouterr()
    code = cli.main(["run", str(lib), "-i", f"x={tmp_path / 'x.npy'}", "--profile", "2"])
    err = capsys.readouterr().err
    assert code != 0 and "without per-step profiling" in err and "--profile" in err
    assert cli.main(["run", str(lib), "-i", f"x={tmp_path / 'x.npy'}", "--profile", "0"]) != 0


def test_a_manifest_promising_a_profile_the_library_lacks_is_refused(builds, tmp_path):
    _, plain, inputs, root = builds
    shutil.copy(plain.library_path, tmp_path / plain.library_path.name)
    shutil.copy(root / "on" / "cuvil_pair.json", tmp_path / "cuvil_pair.json")
    mixed = load(tmp_path / plain.library_path.name, verify_hash=False)
    mixed(*inputs)
    with pytest.raises(ManifestError, match="does not export the profile reader"):
        mixed.profile()
