"""Writes ``braking.onnx``, the decision network of ``braking.yaml``: a braking controller with three
hidden ReLU layers whose weights are drawn from a fixed seed, scaled down to a small perturbation, and
then given their design:

    decel = clamp(0.5 speed - 0.1 gap + 0.5, 0, 10) - 4 relu(1 - |speed - 15| - 0.2 |gap - 10|)

Away from the dip around (15 m/s, 10 m) it brakes 0.5 m/s^2 more than the spec's invariant needs; the
dip takes braking away there, on purpose, so the network is trusted on most of the state box but not
all of it and the fallback mode acts in the rest. Run with torch installed:

    python failsafe/examples/make_braking_network.py [OUT.onnx]

The ONNX file is committed, so using the example needs no torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SEED = 0
HIDDEN = 8
NOISE = 1e-3
DIP = (15.0, 10.0)  # (speed, gap) where the network brakes less than the invariant needs
DIP_WIDTH = 1.0
DIP_DEPTH = 4.0


def first_layer(dip: tuple[float, float]) -> list[tuple[tuple[float, float], float]]:
    """Weights and bias of the first layer's designed units: the braking need (shifted by the clamp's two
    ends) and four hinges around the dip, ``relu(+-(speed - v))`` and ``relu(+-(gap - d))``."""
    v, d = dip
    return [((0.5, -0.1), 0.5), ((0.5, -0.1), -9.5), ((1.0, 0.0), -v), ((-1.0, 0.0), v),
            ((0.0, 1.0), -d), ((0.0, -1.0), d)]


def braking_network(dip: tuple[float, float] = DIP, width: float = DIP_WIDTH, depth: float = DIP_DEPTH,
                    noise: float = NOISE, seed: int = SEED) -> Any:
    """The torch module: seeded weights times ``noise``, plus the design. Layer 2 forms the clamp's two
    pieces and the dip ``relu(1 - (|dv| + 0.2 |dd|) / width)``, layer 3 passes them on, the output
    combines them."""
    import torch

    torch.manual_seed(seed)
    layers = [torch.nn.Linear(2, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN),
              torch.nn.Linear(HIDDEN, 1)]
    with torch.no_grad():
        for layer in layers:
            layer.weight.mul_(noise)
            layer.bias.mul_(noise)
        for k, (w, b) in enumerate(first_layer(dip)):
            layers[0].weight[k] += torch.tensor(w)
            layers[0].bias[k] += b
        layers[1].weight[0, 0] += 1.0
        layers[1].weight[1, 1] += 1.0
        layers[1].weight[2, 2:4] += -1.0 / width
        layers[1].weight[2, 4:6] += -0.2 / width
        layers[1].bias[2] += 1.0
        for k in range(3):
            layers[2].weight[k, k] += 1.0
        layers[3].weight[0, :3] += torch.tensor([1.0, -1.0, -depth])
    relu = torch.nn.ReLU
    return torch.nn.Sequential(layers[0], relu(), layers[1], relu(), layers[2], relu(), layers[3])


def export(net: Any, path: str | Path) -> None:
    """ONNX with a dynamic batch: input ``state`` [batch, 2] (speed, gap), output ``decel`` [batch, 1]."""
    import torch

    torch.onnx.export(net, (torch.zeros(1, 2),), str(path), dynamo=False, input_names=["state"],
                      output_names=["decel"], dynamic_axes={"state": {0: "batch"}, "decel": {0: "batch"}})


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("braking.onnx")
    export(braking_network(), out)
    print(f"wrote {out}")
