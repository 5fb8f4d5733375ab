"""Steps whose kernels come out the same share one function; kernels that differ in anything (a packed weight,
a constant in their code, an embedded table) keep their own, and sharing changes no output bit."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from cuvil.codegen import llvm_module
from cuvil.codegen.artifact import build_library
from cuvil.codegen.kernel_sharing import share_identical_kernels
from cuvil.codegen.llvm_module import lower_function
from cuvil.codegen.loops import loop_hints
from cuvil.codegen.scalar import Builder as LLVMBuilder
from cuvil.codegen.target import init_llvm
from cuvil.interp import run_reference
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.runtime.loader import CompiledModel


def _repeated_layers() -> Module:
    """Two layer norms and two softmaxes at one shape (each norm with its own weights, read through its
    operands), two matmuls by constant weights of one shape but different values with the same epilogue (the
    weights packed at compile time, each call passing its own), and products by two different scalars (written
    into the kernels' code)."""
    rng = np.random.default_rng(7)
    b = Builder()
    x = b.param("x", DType.f32, [6, 48])

    def const(*shape: int) -> object:
        return b.const(rng.standard_normal(shape).astype(np.float32))

    h = b.layer_norm(x, const(48), const(48))
    h = b.layer_norm(b.softmax(h, axis=-1), const(48), const(48))
    shift = b.scalar(1.5, DType.f32)
    y = b.softmax(b.add(b.matmul(h, const(48, 40)), shift), axis=-1)
    z = b.softmax(b.add(b.matmul(h, const(48, 40)), shift), axis=-1)
    return b.module(b.function("main", [x], [y, z, b.mul(x, b.scalar(3.0, DType.f32)),
                                              b.mul(x, b.scalar(-4.0, DType.f32))], ["y", "z", "x3", "x4"]))


def _repeated_blocks() -> Module:
    """Two 3x3 convolutions of one shape with different weights, each followed by a relu, then two depthwise
    ones: every convolution keeps its weights in its code (packed at compile time)."""
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.param("x", DType.f32, [1, 8, 12, 12])

    def conv(h: object, *shape: int, groups: int = 1) -> object:
        w = b.const(rng.standard_normal(shape).astype(np.float32) / 8)
        return b.relu(b.conv(h, w, pads=[1, 1, 1, 1], groups=groups))

    h = conv(conv(x, 8, 8, 3, 3), 8, 8, 3, 3)
    y = conv(conv(h, 8, 1, 3, 3, groups=8), 8, 1, 3, 3, groups=8)
    return b.module(b.function("main", [x], [h, y], ["h", "y"]))


def _kernel_entries(mod: ir.Module, op: str) -> list[str]:
    return sorted(n for n in mod.globals if re.fullmatch(rf"k\d+\.{op}", n))


def test_repeated_kernels_are_emitted_once_and_different_ones_apart() -> None:
    """(Whether each call passes its own weights is the next test's: the outputs.)"""
    module = _repeated_layers()
    mod = lower_function(module.main, module.constants).module
    ops = [v.op for v in module.main.values() if not v.is_const and v.op != "param"]
    assert ops.count("layer_norm") == 2 and ops.count("matmul") == 2
    assert len(_kernel_entries(mod, "layer_norm")) == 1
    # the same code, each call passing its own packed weights (kept, though no kernel's code reads them)
    assert len(_kernel_entries(mod, "matmul")) == 1
    assert len([n for n in mod.globals if re.fullmatch(r"k\d+\.matmul\.packed_b", n)]) == 2
    assert len(_kernel_entries(mod, "mul")) == 2  # different scalars written into the code


def test_convolutions_that_keep_their_weights_in_their_code_stay_apart() -> None:
    module = _repeated_blocks()
    mod = lower_function(module.main, module.constants).module
    assert len(_kernel_entries(mod, "conv")) == 4
    assert len(_kernel_entries(mod, "relu")) == 1


@pytest.mark.parametrize("model", [_repeated_layers, _repeated_blocks])
def test_sharing_changes_no_output_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       model: Callable[[], Module]) -> None:
    module = model()
    p = module.main.params[0]
    x = np.random.default_rng(3).standard_normal(p.type.shape).astype(np.float32)
    shared = CompiledModel(build_library(module.main, module.constants, tmp_path / "shared", name="s").library_path)
    monkeypatch.setattr(llvm_module, "share_identical_kernels", lambda mod, kernels: 0)
    apart = CompiledModel(build_library(module.main, module.constants, tmp_path / "apart", name="a").library_path)
    got, want = shared.run({"x": x}), apart.run({"x": x})
    ref = run_reference(module, {"x": x})
    for g, w, r in zip(got, want, ref, strict=True):
        assert g.tobytes() == w.tobytes()
        np.testing.assert_allclose(g, np.asarray(r), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got[0], got[1])


def _global(mod: ir.Module, name: str, ty: ir.Type, value: object) -> ir.GlobalVariable:
    g = ir.GlobalVariable(mod, ty, name=name)
    g.initializer = value if isinstance(value, ir.GlobalValue) else ir.Constant(ty, value)
    g.global_constant = True
    return g


def _step(mod: ir.Module, k: int, table: bytes, hint: str | None = None, indirect: bool = False,
          data: bytes | None = None) -> ir.Function:
    """Step ``k``'s kernel: returns the byte of its own table at index 1 (read through a global holding the
    table's address, if ``indirect``) plus a call of its own helper (after a branch carrying a loop hint, given
    one); ``data``: a global of the step's that its code does not read (what a call would pass)."""
    i8, i32 = ir.IntType(8), ir.IntType(32)
    tab = _global(mod, f"k{k}.tab", ir.ArrayType(i8, len(table)), bytearray(table))
    if data is not None:
        _global(mod, f"k{k}.data", ir.ArrayType(i8, len(data)), bytearray(data))
    helper = ir.Function(mod, ir.FunctionType(i32, []), name=f"k{k}.op.p0")
    hb = ir.IRBuilder(helper.append_basic_block())
    hb.ret(ir.Constant(i32, 3))
    fn = ir.Function(mod, ir.FunctionType(i32, []), name=f"k{k}.op")
    b = LLVMBuilder(fn.append_basic_block())
    if hint is not None:
        loop_hints(b, b.branch(body := fn.append_basic_block()), hint)
        b.position_at_end(body)
    at = tab
    if indirect:
        at = b.load(_global(mod, f"k{k}.at", ir.PointerType(), tab), typ=ir.PointerType())
    byte = b.load(b.gep(at, [ir.Constant(i32, 0), ir.Constant(i32, 1)], inbounds=True, source_etype=tab.value_type),
                  typ=i8)
    b.ret(b.add(b.zext(byte, i32), b.call(helper, [])))
    return fn


def test_a_family_is_compared_whole_and_only_its_own_number_is_abstracted() -> None:
    """Steps 1 and 12 (a prefix of each other's numbers) and 11 are the same as step 0; step 3 differs only in
    its table's contents, step 2 in its helper's name pointing at another step's helper; steps 4 and 5 carry the
    same loop hint in loop ids of their own (the same), step 6 another hint; steps 7 and 9 read their tables
    through a global holding its address and are the same, step 8 does so and its table differs; step 10 is
    step 0 with data its code does not read, which it keeps."""
    mod = ir.Module(name="m")
    kernels: list[ir.Function | None] = [_step(mod, k, b"\x00\x05" if k != 3 else b"\x00\x06") for k in range(4)]
    kernels += [_step(mod, 4, b"\x00\x05", "llvm.loop.unroll.disable"),
                _step(mod, 5, b"\x00\x05", "llvm.loop.unroll.disable"),
                _step(mod, 6, b"\x00\x05", "llvm.loop.vectorize.enable=false")]
    kernels += [_step(mod, 7, b"\x00\x05", indirect=True), _step(mod, 8, b"\x00\x07", indirect=True),
                _step(mod, 9, b"\x00\x05", indirect=True), _step(mod, 10, b"\x00\x05", data=b"\x01"),
                _step(mod, 11, b"\x00\x05"), _step(mod, 12, b"\x00\x05")]
    other = mod.globals["k0.op.p0"]
    call = next(i for blk in kernels[2].blocks for i in blk.instructions if isinstance(i, ir.CallInstr))
    call.callee = other  # step 2's code calls step 0's helper: no longer the same text
    assert share_identical_kernels(mod, kernels) == 6
    assert [None if f is None else f.name for f in kernels] == \
        ["k0.op", "k0.op", "k2.op", "k3.op", "k4.op", "k4.op", "k6.op", "k7.op", "k8.op", "k7.op", "k0.op", "k0.op",
         "k0.op"]
    assert not any(n.startswith(("k1.", "k5.", "k9.", "k11.", "k12.")) for n in mod.globals)
    assert {"k2.tab", "k2.op.p0", "k3.tab", "k3.op.p0", "k8.tab", "k8.at", "k10.data"} <= set(mod.globals)
    assert not set(mod.globals) & {"k10.tab", "k10.op", "k10.op.p0"}
    init_llvm()
    llvm.parse_assembly(str(mod)).verify()  # nothing left refers to a removed name

