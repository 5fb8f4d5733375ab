"""Compiling the op catalogue's examples and comparing them with the interpreter.

Examples are batched: every example of one op family becomes one result of a single
function, so a family costs one LLVM compile and one link. When a batch fails, its ops
are compiled one by one so each failure is attributed to its op.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass, field

import numpy as np

from cuvil.compiler import compile
from cuvil.errors import RuntimeEvalError
from cuvil.interp import evaluate_op
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.module import Module
from cuvil.ir.opdef import OpDef, all_ops
from cuvil.ir.types import TensorType

TOLERANCE = {DType.f64: 1e-12, DType.f32: 1e-5, DType.f16: 2e-3, DType.bf16: 2e-2}


@dataclass
class Case:
    op: OpDef
    index: int
    arrays: list[np.ndarray]
    attrs: dict
    expected: np.ndarray | None = None
    skip: str | None = None  # why the interpreter has no answer to compare with


@dataclass
class OpResult:
    op: str
    cases: int = 0
    compared: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and self.compared > 0


def cases_of(op: OpDef) -> list[Case]:
    if op.examples is None:
        return []
    out = []
    for k, (arrays, attrs) in enumerate(op.examples(np.random.default_rng(0))):
        case = Case(op, k, [np.asarray(a) for a in arrays], dict(attrs))
        full = op.check_attrs(attrs)
        out_type = op.infer([TensorType(DType.from_numpy(a.dtype), a.shape) for a in case.arrays], full)
        try:
            case.expected = evaluate_op(op, case.arrays, full, out_type)
        except RuntimeEvalError as e:
            case.skip = str(e)
        out.append(case)
    return out


def compare(case: Case, got: np.ndarray) -> str | None:
    """None when ``got`` matches the interpreter; else what differs."""
    want = case.expected
    assert want is not None
    tag = f"{case.op.name} example {case.index} {case.attrs}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{tag}: got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
    dt = DType.from_numpy(want.dtype)
    try:
        if dt.is_float:
            tol = TOLERANCE[dt]
            w = want.astype(np.float64)
            finite = w[np.isfinite(w)]
            scale = float(np.abs(finite).max()) if finite.size else 0.0
            # elementwise results are compared element by element; ops that sum (reductions,
            # contractions, norms) may cancel, so their error is measured against the output's scale
            atol = 0.0 if case.op.family == "elementwise" else tol * 0.1 * scale
            np.testing.assert_allclose(got.astype(np.float64), w, rtol=tol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(got, want)
    except AssertionError as e:
        return f"{tag}: {e}"
    return None


OpCall = tuple[str, list[np.ndarray], dict]
"""An op by name, its operand arrays and its attributes."""


def ops_module(ops: list[OpCall], name: str) -> tuple[Module, list[np.ndarray]]:
    """One function whose results are the ops, each over parameters of its own, and the inputs in order."""
    b = Builder()
    params, inputs, results = [], [], []
    for c, (op, arrays, attrs) in enumerate(ops):
        ps = [b.param(f"c{c}_{i}", DType.from_numpy(a.dtype), a.shape) for i, a in enumerate(arrays)]
        params += ps
        inputs += arrays
        results.append(b.op(op, *ps, **attrs))
    fn = b.function(name, params, results, [f"r{c}" for c in range(len(ops))])
    return b.module(fn), inputs


def _compile_and_run(cases: list[Case], name: str, opt_level: int, target: str | None) -> list[np.ndarray]:
    module, inputs = ops_module([(case.op.name, case.arrays, case.attrs) for case in cases], name)
    with tempfile.TemporaryDirectory(prefix="cuvil-cat-") as tmp:
        model = compile(module, output_dir=tmp, opt_level=opt_level, target=target)
        return model.run(inputs)


def run_batch(ops: list[OpDef], name: str, opt_level: int = 2, target: str | None = None) -> dict[str, OpResult]:
    """The ops' examples compiled as one library for ``target`` (default: the host) and compared with the
    interpreter; a failing batch is retried op by op."""
    results = {op.name: OpResult(op.name) for op in ops}
    cases: list[Case] = []
    for op in ops:
        try:
            found = cases_of(op)
        except Exception as e:  # an example the op itself rejects
            results[op.name].errors.append(f"{op.name}: examples could not be built: {e}")
            continue
        results[op.name].cases = len(found)
        cases += [c for c in found if c.skip is None]
    if not cases:
        return results
    try:
        outs = _compile_and_run(cases, name, opt_level, target)
    except Exception as e:  # CuvilError or a bug: either way, attribute it to an op
        if len(ops) == 1:
            results[ops[0].name].errors.append(f"{ops[0].name}: {type(e).__name__}: {e}")
            return results
        merged: dict[str, OpResult] = {}
        for op in ops:
            if not results[op.name].errors:
                merged.update(run_batch([op], f"{name}_{op.name}", opt_level, target))
            else:
                merged[op.name] = results[op.name]
        return merged
    for case, got in zip(cases, outs, strict=True):
        r = results[case.op.name]
        problem = compare(case, got)
        if problem:
            r.errors.append(problem)
        else:
            r.compared += 1
    return results


def batches(max_cases: int = 40) -> dict[str, list[OpDef]]:
    """The catalogue in compile batches: ops of one family, about ``max_cases`` examples each."""
    families: dict[str, list[OpDef]] = {}
    for op in all_ops():
        families.setdefault(op.family, []).append(op)
    out: dict[str, list[OpDef]] = {}
    for fam, ops in families.items():
        current: list[OpDef] = []
        count = 0
        for op in ops:
            n = len(op.examples(np.random.default_rng(0))) if op.examples is not None else 0
            if current and count + n > max_cases:
                out[f"{fam}_{len([k for k in out if k.startswith(fam + '_')])}"] = current
                current, count = [], 0
            current.append(op)
            count += n
        if current:
            out[f"{fam}_{len([k for k in out if k.startswith(fam + '_')])}"] = current
    return out


@functools.cache
def catalogue_results(opt_level: int = 2, target: str | None = None) -> dict[str, OpResult]:
    """Every op of the catalogue, compiled batch by batch at ``opt_level`` for ``target``."""
    out: dict[str, OpResult] = {}
    for name, ops in batches().items():
        out.update(run_batch(ops, f"catalogue_{name}", opt_level, target))
    return out


if __name__ == "__main__":
    import sys
    import time

    t0 = time.perf_counter()
    res = catalogue_results(int(sys.argv[1]) if len(sys.argv) > 1 else 2, sys.argv[2] if len(sys.argv) > 2 else None)
    ok = [r for r in res.values() if r.ok]
    print(f"{len(ok)}/{len(res)} ops compiled and match the interpreter in {time.perf_counter() - t0:.1f}s")
    for r in res.values():
        if not r.ok:
            print(f"FAIL {r.op}: {'; '.join(e[:300] for e in r.errors) or 'no case compared'}")
