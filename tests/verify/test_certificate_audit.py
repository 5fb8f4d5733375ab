"""Certificates an auditor re-checks without trusting Cuvil: every query re-proved by z3 and by cvc5,
the hashes re-derived from the model and the library, and any edit, transplant or tampered byte
caught."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cuvil.codegen.artifact import manifest_digest, read_provenance
from cuvil.compiler import compile as cuvil_compile
from cuvil.ir import Builder, DType
from cuvil.runtime.loader import read_manifest
from verify import check_pipeline, make_gate
from verify.artifact import artifact_problems
from verify.audit import check_certificate, run_query
from verify.certificate import certificate_digest


def _conv_bn(seed: int = 0, channels: int = 3):
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.param("x", DType.f32, [1, 2, 6, 6])
    w = b.const(rng.standard_normal((channels, 2, 3, 3)).astype(np.float32))
    c = lambda: b.const(rng.uniform(0.5, 1.5, channels).astype(np.float32))
    y = b.batch_norm(b.conv(x, w, pads=[1, 1, 1, 1]), c(), c(), c(), c())
    return b.module(b.function("main", [x], [b.relu(b.matmul(b.reshape(y, shape=[1, 36 * channels]),
                                                                b.const(np.ones((36 * channels, 4), np.float32))))]))


@pytest.fixture(scope="module")
def certificate() -> dict:
    return check_pipeline(_conv_bn(), "O3").certificate()


def _proved_queries(cert: dict) -> list[str]:
    out = [o["query"]["smt2"] for a in cert["applications"] for o in a["obligations"] if o["verdict"] == "proved"]
    return out + [q["smt2"] for a in cert["applications"] for q in a["lemmas"]]


@pytest.mark.parametrize("solver", ["z3", "cvc5"])
def test_every_query_is_re_proved_by_a_stock_solver(certificate: dict, solver: str) -> None:
    assert certificate["summary"]["proved"] >= 2
    audit = check_certificate(certificate, solver=solver, model=_conv_bn())
    assert audit.ok, audit.problems
    assert audit.queries == audit.unsat == len(_proved_queries(certificate)) > 0


def test_queries_are_the_proofs_not_decorations(certificate: dict) -> None:
    """A query with its inequality dropped is satisfiable: the text carries the claim."""
    query = next(q for q in _proved_queries(certificate) if "distinct" in q or "(not (=" in q)
    assert run_query(query, "z3") == "unsat"
    lines = query.rstrip().splitlines()
    last_assert = max(k for k, line in enumerate(lines) if line.startswith("(assert"))
    weakened = "\n".join(lines[:last_assert]) + "\n(check-sat)\n"
    assert run_query(weakened, "z3") == "sat"
    assert run_query(weakened, "cvc5") == "sat"


def test_the_certificate_states_axioms_tiers_and_hashes(certificate: dict) -> None:
    assert "fast-math" not in certificate["tiers"]
    assert set(certificate["tiers"]) == {"exact", "real", "bounded"}
    for app in certificate["applications"]:
        assert len(app["before_hash"]) == len(app["after_hash"]) == 64
        assert app["before_hash"] != app["after_hash"]
    assert certificate["digest"] == certificate_digest(certificate)


def test_axioms_a_proof_used_are_listed_proved_and_re_checked() -> None:
    from verify import check_rewrite

    def model(swap: bool):
        b = Builder()
        x, y = b.param("x", DType.f32, [4]), b.param("y", DType.f32, [4])
        s = b.add(y, x) if swap else b.add(x, y)
        return b.module(b.function("main", [x, y], [b.mul(s, b.const(np.ones(4, np.float32)))]))

    cert = check_rewrite(model(False), model(True)).certificate()
    assert cert["summary"]["proved"] == 1
    assert cert["axioms"]["add-commutative"]["status"] == "proved"
    assert "f64" in cert["axioms"]["add-commutative"]["how"]
    assert check_certificate(cert).ok
    forged = copy.deepcopy(cert)
    forged["axioms"]["add-commutative"]["status"] = "assumed"
    from verify.certificate import seal

    audit = check_certificate(seal(forged))
    assert not audit.ok and any("axiom add-commutative" in p for p in audit.problems)


def _edits(cert: dict) -> dict[str, dict]:
    out = {}
    edited = copy.deepcopy(cert)
    ob = next(o for a in edited["applications"] for o in a["obligations"] if o["verdict"] == "proved")
    ob["query"]["smt2"] = ob["query"]["smt2"].replace("(check-sat)", "(assert false)\n(check-sat)")
    out["a query"] = edited
    edited = copy.deepcopy(cert)
    edited["applications"][0]["after_hash"] = "0" * 64
    out["an application hash"] = edited
    edited = copy.deepcopy(cert)
    edited["model_hash"] = "1" + edited["model_hash"][1:]
    out["the model hash"] = edited
    edited = copy.deepcopy(cert)
    edited["summary"]["refuted"] = 0 if edited["summary"]["refuted"] else 1
    out["the summary"] = edited
    edited = copy.deepcopy(cert)
    edited["tiers"]["real"] = "bit-identical"
    out["a tier statement"] = edited
    return out


@pytest.mark.parametrize("what", ["a query", "an application hash", "the model hash", "the summary",
                                  "a tier statement"])
def test_any_edit_fails_the_check(certificate: dict, what: str) -> None:
    audit = check_certificate(_edits(certificate)[what], model=_conv_bn())
    assert not audit.ok
    assert any("digest" in p for p in audit.problems)


def test_a_certificate_of_another_model_fails_against_this_model(certificate: dict) -> None:
    other = _conv_bn(seed=1)
    audit = check_certificate(certificate, model=other)
    assert not audit.ok and any("model_hash" in p for p in audit.problems)


def test_a_resealed_edit_fails_where_hashes_are_re_derived(certificate: dict) -> None:
    """An editor who recomputes the digest still cannot make the hashes of a re-run pipeline match."""
    from verify.certificate import seal

    edited = _edits(certificate)["an application hash"]
    seal(edited)
    audit = check_certificate(edited, model=_conv_bn())
    assert not audit.ok and any("re-run" in p for p in audit.problems)


# --------------------------------------------------------------------------------------
# the certificate embedded in a compiled library


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> tuple[Path, Path]:
    out = []
    for seed in (0, 1):
        d = tmp_path_factory.mktemp(f"lib{seed}")
        model = cuvil_compile(_conv_bn(seed=seed, channels=3 + seed), output_dir=d, cache=False,
                              gate=make_gate("strict"), name=f"m{seed}")
        out.append(model.library_path)
    return out[0], out[1]


def test_a_gated_library_embeds_and_passes_its_certificate(libraries) -> None:
    lib, _ = libraries
    manifest = read_manifest(lib)
    cert = manifest["verification"]
    assert read_provenance(lib) == {"certificate": cert["digest"], "function": manifest["function_hash"],
                                    "manifest": manifest_digest(manifest)}
    assert artifact_problems(lib, manifest) == []
    audit = check_certificate(cert, library=lib, manifest=manifest)
    assert audit.ok, audit.problems


def test_a_transplanted_certificate_fails(libraries, tmp_path) -> None:
    a, b = libraries
    man_a, man_b = read_manifest(a), read_manifest(b)
    forged = dict(man_b, verification=man_a["verification"], function_hash=man_a["function_hash"],
                  pipeline=man_a["pipeline"])
    problems = artifact_problems(b, forged)
    assert any("another library" in p for p in problems)
    assert any("compiled from function" in p for p in problems)
    assert any("manifest's fields were edited" in p for p in problems)


def test_tampered_library_or_manifest_fails(libraries, tmp_path) -> None:
    lib, _ = libraries
    manifest = read_manifest(lib)
    copy_lib = tmp_path / lib.name
    shutil.copy(lib, copy_lib)
    data = bytearray(copy_lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy_lib.write_bytes(bytes(data))
    assert any("library hash" in p for p in artifact_problems(copy_lib, manifest))
    edited = json.loads(json.dumps(manifest))
    edited["verification"]["summary"]["unknown"] = 7
    assert any("digest" in p for p in artifact_problems(lib, edited))
