"""Run ONNX's node conformance cases through ``cuvil.onnx_backend`` and print the tally.

    python -m bench.onnx_conformance [-k SUBSTRING] [--failures] [--json FILE]

The last line is ``N passed, N failed, N skipped`` so the figure can be tracked.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from dataclasses import dataclass

import numpy as np

from onnx.backend.test.loader import load_model_tests

from cuvil.errors import CuvilError
from cuvil.onnx_backend import CuvilBackend


@dataclass
class Outcome:
    name: str
    status: str  # passed | failed | skipped
    reason: str = ""
    seconds: float = 0.0


def run_case(case) -> Outcome:  # noqa: ANN001 - onnx's TestCase namedtuple
    start = time.perf_counter()
    model = case.model
    sets = [(list(ins), list(outs)) for ins, outs in case.data_sets]
    try:
        rep = CuvilBackend.prepare(model)
        for ins, expected in sets:
            got = rep.run(ins)
            if len(got) != len(expected):
                return Outcome(case.name, "failed", f"output count {len(got)} != {len(expected)}",
                               time.perf_counter() - start)
            for k, (g, e) in enumerate(zip(got, expected, strict=True)):
                msg = _compare(np.asarray(g), e, case.rtol, case.atol)
                if msg:
                    return Outcome(case.name, "failed", f"output {k}: {msg}", time.perf_counter() - start)
    except CuvilError as e:
        return Outcome(case.name, "failed", f"{e.code}: {e.message}", time.perf_counter() - start)
    except Exception as e:  # a crash is a bug: report it as such
        return Outcome(case.name, "failed", f"CRASH {type(e).__name__}: {e}", time.perf_counter() - start)
    return Outcome(case.name, "passed", "", time.perf_counter() - start)


def _compare(got: np.ndarray, exp: np.ndarray, rtol: float, atol: float) -> str:
    if got.shape != exp.shape:
        return f"shape {got.shape} != {exp.shape}"
    if exp.dtype == object or got.dtype == object:
        return "object dtype"
    if got.dtype != exp.dtype:
        return f"dtype {got.dtype} != {exp.dtype}"
    if exp.dtype.kind in "biu":
        return "" if np.array_equal(got, exp) else "values differ"
    g, e = got.astype(np.float64), exp.astype(np.float64)
    if not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
        return f"values differ (max abs err {np.nanmax(np.abs(g - e)):.3g})"
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="only cases whose name contains this substring")
    ap.add_argument("--failures", action="store_true", help="list every failing case with its reason")
    ap.add_argument("--json", help="write per-case outcomes to this file")
    args = ap.parse_args(argv)
    cases = [c for c in load_model_tests(kind="node") if args.k in c.name]
    outcomes = []
    for c in cases:
        outcomes.append(run_case(c))
    tally = collections.Counter(o.status for o in outcomes)
    if args.failures:
        for o in outcomes:
            if o.status != "passed":
                print(f"{o.status.upper():7} {o.name}: {o.reason}")
    reasons = collections.Counter(_reason_key(o.reason) for o in outcomes if o.status == "failed")
    print("top failure reasons:")
    for r, n in reasons.most_common(15):
        print(f"  {n:4d}  {r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([o.__dict__ for o in outcomes], f, indent=1)
    print(f"{tally['passed']} passed, {tally['failed']} failed, {tally['skipped']} skipped")
    return 0


def _reason_key(reason: str) -> str:
    m = re.match(r"(CUVIL-[A-Z-]+): (ONNX op \S+ is not supported)", reason)
    if m:
        return f"{m.group(1)}: {m.group(2)}"
    return re.sub(r"\d+", "N", reason)[:100]


if __name__ == "__main__":
    sys.exit(main())
