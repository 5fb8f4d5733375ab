"""Incident models: every real failure class is confirmed with a witness that an independent numpy
computation in the reduced precision also fails on; every safe twin is proved safe; no site
the probe proves safe fails on 10,000 sampled and adversarial inputs."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from incidents import INCIDENTS, TWINS, Incident
from sampling import sampled_violations

from verify.probe.probe import EXIT_OVERFLOW, EXIT_SAFE, OVERFLOW, SAFE, ProbeOptions, ProbeReport, probe

BY_NAME = {i.name: i for i in INCIDENTS + TWINS}


@functools.cache
def probed(name: str) -> ProbeReport:
    inc = BY_NAME[name]
    return probe(inc.build(1), inc.ranges, ProbeOptions(precision=inc.precision, boundary=False))


@pytest.mark.parametrize("name", [i.name for i in INCIDENTS])
def test_incident_overflow_is_confirmed_with_a_witness(name: str, tmp_path: Path) -> None:
    inc = BY_NAME[name]
    rep = probed(name)
    assert rep.exit_code == EXIT_OVERFLOW
    failed = [s for s in rep.sites if s.verdict == OVERFLOW]
    assert failed and all(s.witness is not None for s in failed)
    from verify.probe.probe import save_witnesses

    files = save_witnesses(rep, tmp_path)
    lo, hi = inc.ranges["x"]
    for k in {s.witness for s in failed}:
        assert k is not None
        x = np.load(files[k]["x"])
        assert x.shape == tuple(int(d) for d in rep.program.function.params[0].shape)
        assert x.dtype == np.float32 and np.all((x >= lo) & (x <= hi))
        assert inc.fails is not None and inc.fails(x), "the witness does not fail in the numpy reference"


@pytest.mark.parametrize("name", [i.name for i in TWINS])
def test_safe_twin_is_proved_safe(name: str) -> None:
    rep = probed(name)
    assert rep.exit_code == EXIT_SAFE
    assert rep.sites and all(s.verdict == SAFE for s in rep.sites)


def test_incidents_and_twins_differ_only_in_scale() -> None:
    """The twins are the same programs (same ops), so a safe verdict is about the numbers."""
    for inc, twin in zip(INCIDENTS, TWINS, strict=True):
        a = [v.op for v in inc.build(1).main.values()]
        b = [v.op for v in twin.build(1).main.values()]
        assert a == b, inc.name


def test_twin_oracles_agree_that_twins_do_not_fail() -> None:
    """The numpy references see no failure on the twins' box corners (so the twins are really safe)."""
    rng = np.random.default_rng(3)
    oracles = {"t5_ffn_safe": lambda x: INCIDENTS[0].fails(x, 0.1 * 65504.0),  # type: ignore[misc]
               "layer_norm_safe": lambda x: INCIDENTS[2].fails(x, 8.0),  # type: ignore[misc]
               "naive_softmax_safe": lambda x: INCIDENTS[3].fails(x, 4.0),  # type: ignore[misc]
               "int8_saturation_safe": lambda x: INCIDENTS[4].fails(x, 1.0)}  # type: ignore[misc]
    for name, fails in oracles.items():
        shape = tuple(int(d) for d in BY_NAME[name].build(1).main.params[0].shape)
        xs = np.where(rng.random((200, *shape[1:])) < 0.5, -1.0, 1.0).astype(np.float32)
        assert not fails(xs), name


# about 20 s for all ten models: 10,000 rows each, plus a search pushing every proved site
@pytest.mark.parametrize("name", [i.name for i in INCIDENTS + TWINS])
def test_no_proved_site_fails_on_10000_adversarial_samples(name: str) -> None:
    inc: Incident = BY_NAME[name]
    rep = probed(name)
    assert sampled_violations(inc, rep, n=10_000) == []
