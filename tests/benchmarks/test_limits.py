"""``python -m bench.limits``: its measuring loops compute what they claim to, a model's work is read from
its graph as any engine would have to do it, and the floor is the larger of the two limits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.limits import CHAINS, Machine, Work, _Jit, main, measure_machine, model_work, roofline
from bench.models import ZOO_SMALL, ZooModel


@pytest.fixture(scope="module")
def jit() -> _Jit:
    from cuvil.codegen.kernels.gemm import host_isa

    return _Jit(host_isa().lanes)


def test_the_fma_loop_runs_every_chain_for_every_step(jit: _Jit) -> None:
    for steps in (1, 3, 17):
        want = 0.0
        for k in range(CHAINS):
            acc = 0.01 * k
            for _ in range(steps):
                acc = acc * 0.999 + 1e-3
            want += jit.lanes * acc
        assert jit.fma(steps) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("nvec, reps, start", [(8, 1, 0), (64, 3, 1), (4096, 2, 3)])
def test_the_read_loop_reads_every_vector_of_every_pass(jit: _Jit, nvec: int, reps: int, start: int) -> None:
    buf = np.arange(nvec * jit.lanes + start, dtype=np.float32) % 7  # small integers: float32 sums are exact
    got = jit.read(buf.ctypes.data + 4 * start, nvec, reps)  # from any float, aligned or not
    assert got == float(buf[start:].sum(dtype=np.float64)) * reps


def test_a_small_measurement_has_every_limit() -> None:
    m = measure_machine(1, 2, fma_steps=100_000, working_sets_kib=(64, 4096), read_bytes=8 << 20)
    assert m.fma_gflops > 0 and math.isfinite(m.fma_gflops)
    assert set(m.read_gbs) == {64, 4096} and all(v > 0 for v in m.read_gbs.values())


@pytest.mark.parametrize("name", ["mlp", "mlp_b64", "resnet18", "mobilenet_v1"])
def test_a_models_work_is_what_its_layers_do(name: str) -> None:
    zm = ZOO_SMALL[name]
    work = model_work(zm.to_onnx())
    assert work.flops == pytest.approx(_torch_flops(zm), rel=1e-9)
    module = zm.build()
    weights = sum(t.numel() * 4 for t in (*module.parameters(), *module.buffers()) if t.is_floating_point())
    assert weights * 0.5 <= work.weight_bytes <= weights  # batch norms' four vectors may fold into two


def _torch_flops(zm: ZooModel) -> float:
    """Two flops per multiply-add of the torch module's convolutions and linear layers, counted as it runs."""
    import torch

    module = zm.build()
    flops = [0.0]

    def count(mod: torch.nn.Module, _inputs: tuple, out: torch.Tensor) -> None:
        if isinstance(mod, torch.nn.Conv2d):
            flops[0] += 2.0 * out.numel() * (mod.in_channels // mod.groups) * math.prod(mod.kernel_size)
        elif isinstance(mod, torch.nn.Linear):
            flops[0] += 2.0 * out.numel() * mod.in_features

    for mod in module.modules():
        mod.register_forward_hook(count)
    with torch.no_grad():
        module(*zm.example_inputs())
    return flops[0]


def test_the_floor_is_the_larger_limit_and_names_it() -> None:
    machine = Machine(1, 16, 100.0, {256: 200.0, 8192: 100.0, 262144: 40.0})
    compute = roofline("c", machine, {"cuvil": 1.0}, Work(50e6, 100_000))  # 0.5 ms of FMAs, 0.5 us of reads
    assert compute.bound == "FMA" and compute.floor_ms == pytest.approx(0.5)
    band = roofline("b", machine, {}, Work(1e6, 4_000_000))  # 0.01 ms of FMAs, 4 MB from the 8 MiB set
    assert band.bound == "bandwidth" and band.floor_ms == pytest.approx(0.04)
    assert machine.bandwidth(1 << 40) == 40.0  # beyond every working set: the largest one's


def test_the_command_reports_the_limits_and_a_model(tmp_path, capsys) -> None:
    out = tmp_path / "limits.json"
    assert main(["--models", "mlp", "--small", "--repeat", "3", "--quick", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    row = data["rows"][0]
    assert row["model"] == "mlp" and row["floor_ms"] > 0 and set(row["times_ms"]) == {"cuvil", "ort"}
    assert data["machine"]["fma_gflops"] > 0
    assert "FMA rate" in capsys.readouterr().out
