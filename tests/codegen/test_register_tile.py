"""The GEMM micro-kernel keeps its register tile in registers.

A tile of 24 accumulators and its B vectors fill 28 of AVX-512's 32 registers; a loop body that lets LLVM
load the next step's operands early (an unrolled one) spills accumulators to the stack on every step, and
the product loses a fifth of its rate with no test of values noticing. This reads the machine code LLVM
emits for each tile shape and operand kind, for fixed CPUs (not the host's, so it reads the same on every
machine), and finds no vector register going to or from the stack.
"""

from __future__ import annotations

import re

import pytest
from llvmlite import ir

from cuvil.codegen.kernels.gemm import bf16_pairs, micro_function
from cuvil.codegen.link import optimize, target_machine
from cuvil.codegen.target import Target, compiling_for

AVX2 = "+avx,+avx2,+fma,+f16c"
AVX512 = AVX2 + ",+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512vnni,+avx512bf16"
TARGETS = [pytest.param(cpu, features, lanes, tile, id=f"{cpu}-{tile[0]}x{tile[1]}")
           for cpus, features, lanes, tiles in ((("znver4", "znver5", "sapphirerapids", "skylake-avx512"), AVX512, 16,
                                                 ((6, 4), (8, 3))),
                                                (("haswell", "znver3", "alderlake"), AVX2, 8, ((6, 2), (4, 3))))
           for cpu in cpus for tile in tiles]
"""The ISAs' register tiles (:data:`cuvil.codegen.kernels.gemm.ISAS`) on CPUs whose scheduling models differ."""
OPERANDS = (("packed", "packed"), ("rows", "packed"), ("rowtable", "packed"), ("rows", "direct"),
            ("rowtable", "direct"), ("packed", "packed16"))
STACK_VECTOR = re.compile(r"(zmm|ymm)\d+.*\(%rsp\)|\(%rsp\).*(zmm|ymm)\d+")


def micro_assembly(target: Target, a_kind: str, b_kind: str, mr: int, nv: int, paired: bool = False,
                   lanes: int = 16) -> str:
    """The x86 assembly of one micro-kernel compiled at -O3 for ``target``."""
    with compiling_for(target):
        mod = ir.Module("tile")
        if paired:
            with bf16_pairs():
                fn = micro_function(mod, a_kind, b_kind, mr, nv, lanes, nv * lanes, None, ahead_every=2)
        else:
            fn = micro_function(mod, a_kind, b_kind, mr, nv, lanes, nv * lanes, None, ahead_every=2)
        fn.linkage = ""  # kept: nothing calls it here
        tm = target_machine(target, 3)
        return tm.emit_assembly(optimize(mod, tm, 3))


@pytest.mark.parametrize("cpu, features, lanes, tile", TARGETS)
@pytest.mark.parametrize("operands", OPERANDS, ids=lambda o: "-".join(o))
def test_no_accumulator_goes_to_the_stack(cpu: str, features: str, lanes: int, tile: tuple[int, int],
                                          operands: tuple[str, str]) -> None:
    asm = micro_assembly(Target("x86_64-unknown-linux-gnu", cpu, features), *operands, *tile, lanes=lanes)
    assert "vfmadd" in asm  # the tile's multiply-adds are there
    spills = [line.strip() for line in asm.splitlines() if STACK_VECTOR.search(line)]
    assert not spills, f"{cpu} {tile} {operands}: vector registers spilled: {spills[:4]}"


@pytest.mark.parametrize("cpu", ("znver5", "sapphirerapids"))
def test_the_paired_tile_stays_in_registers(cpu: str) -> None:
    asm = micro_assembly(Target("x86_64-unknown-linux-gnu", cpu, AVX512), "packed", "packed", 6, 4, paired=True)
    assert "vdpbf16ps" in asm
    assert not [line for line in asm.splitlines() if STACK_VECTOR.search(line)]

