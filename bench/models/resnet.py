"""ResNet-18-style CNN: 7x7 stem, max pool, four stages of basic blocks (conv-bn-relu), global pool, fc."""

from __future__ import annotations

from typing import Any

from bench.models import ZooModel, image_batch, randomize_batchnorm


def _config(small: bool) -> dict[str, Any]:
    if small:
        return {"widths": (8, 16, 24, 32), "blocks": (1, 1, 1, 1), "classes": 10, "image": 32}
    return {"widths": (64, 128, 256, 512), "blocks": (2, 2, 2, 2), "classes": 1000, "image": 224}


def build_resnet(small: bool) -> Any:
    import torch
    import torch.nn as nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            skip = x if self.down is None else self.down(x)
            return self.relu(y + skip)

    class ResNet(nn.Module):
        def __init__(self, widths: tuple[int, ...], blocks: tuple[int, ...], classes: int) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers = []
            cin = widths[0]
            for k, (w, n) in enumerate(zip(widths, blocks, strict=True)):
                for j in range(n):
                    layers.append(BasicBlock(cin, w, 2 if (j == 0 and k > 0) else 1))
                    cin = w
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.layers(self.stem(x))
            return self.fc(torch.flatten(self.pool(y), 1))

    cfg = _config(small)
    model = ResNet(cfg["widths"], cfg["blocks"], cfg["classes"])
    randomize_batchnorm(model, seed=1)
    return model


def resnet_inputs(small: bool, batch: int) -> tuple[Any, ...]:
    return image_batch("resnet18", _config(small)["image"], batch)


RESNET18 = ZooModel("resnet18", "ResNet-18-style CNN, 1x3x224x224", build_resnet, resnet_inputs, ("image",),
                    ("logits",))
