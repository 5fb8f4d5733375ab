"""The architecture as a test: every import (lazy ones inside functions included) goes down the
layers or stays within one, and no two packages import each other, directly or through others.

    base      errors, log, budget, arrays, version; the report renderers
    ir        the IR, the op catalogue and its rules, the rule kit, specialization
    readers   frontends, interpreter, passes, code generation, runtime
    verifier  verify (proofs, certificates, the overflow prober)
    top       compile orchestration, the ONNX backend, the CLI, the public facade
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cuvil", "verify", "reports", "lora", "failsafe")

LAYERS: dict[str, int] = {
    "cuvil.errors": 0, "cuvil.log": 0, "cuvil.budget": 0, "cuvil.arrays": 0, "cuvil.version": 0, "reports": 0,
    "cuvil.ir": 1,
    "cuvil.frontend": 2, "cuvil.interp": 2, "cuvil.passes": 2, "cuvil.codegen": 2, "cuvil.runtime": 2,
    "verify": 3,
    "cuvil.compiler": 4, "cuvil.onnx_backend": 4, "cuvil.torch_backend": 4, "cuvil.cli": 4, "cuvil": 4,
    "cuvil.__main__": 4, "lora": 4,
    "failsafe": 4,
}


def unit(module: str) -> str:
    """The package-level unit a module belongs to (``cuvil.ir.ops.nn`` -> ``cuvil.ir``)."""
    parts = module.split(".")
    if parts[0] != "cuvil":
        return parts[0]
    return "cuvil" if len(parts) == 1 else f"cuvil.{parts[1]}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of the project's packages."""
    edges = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            source = module_name(path)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                edges += [(source, n) for n in names if n.split(".")[0] in PACKAGES]
    return edges


def test_every_package_has_a_layer():
    units = {unit(a) for a, _ in imports()} | {unit(b) for _, b in imports()}
    assert units <= set(LAYERS), sorted(units - set(LAYERS))


def test_no_import_goes_up_a_layer():
    upward = sorted({f"{a} -> {b}" for a, b in imports() if LAYERS[unit(b)] > LAYERS[unit(a)]})
    assert not upward, upward


def test_no_two_packages_depend_on_each_other():
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in imports():
        if unit(a) != unit(b):
            graph[unit(a)].add(unit(b))

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(graph[node])
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in list(graph) for b in graph[a] if reaches(b, a)})
    assert not cycles, cycles
