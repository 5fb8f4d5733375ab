"""MobileNetV1-style CNN: a stack of depthwise-separable convolutions with BatchNorm and ReLU6."""

from __future__ import annotations

from typing import Any

from bench.models import ZooModel, image_batch, randomize_batchnorm

# (output channels, stride) of each depthwise-separable block, as in MobileNetV1
_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1), (512, 1),
           (512, 1), (1024, 2), (1024, 1))
_SMALL_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (512, 2))


def _config(small: bool) -> dict[str, Any]:
    if small:
        return {"blocks": _SMALL_BLOCKS, "width": 0.25, "classes": 10, "image": 32}
    return {"blocks": _BLOCKS, "width": 1.0, "classes": 1000, "image": 224}


def build_mobilenet(small: bool) -> Any:
    import torch
    import torch.nn as nn

    def conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU6())

    class MobileNetV1(nn.Module):
        def __init__(self, blocks: tuple[tuple[int, int], ...], width: float, classes: int) -> None:
            super().__init__()
            c = int(32 * width)
            layers = [conv_bn(3, c, 3, 2)]
            for cout, stride in blocks:
                cout = int(cout * width)
                layers.append(conv_bn(c, c, 3, stride, groups=c))  # depthwise
                layers.append(conv_bn(c, cout, 1, 1))  # pointwise
                c = cout
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(c, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.features(x)
            return self.fc(y.mean(dim=(2, 3)))

    cfg = _config(small)
    model = MobileNetV1(cfg["blocks"], cfg["width"], cfg["classes"])
    randomize_batchnorm(model, seed=2)
    return model


def mobilenet_inputs(small: bool, batch: int) -> tuple[Any, ...]:
    return image_batch("mobilenet_v1", _config(small)["image"], batch)


MOBILENET_V1 = ZooModel("mobilenet_v1", "MobileNetV1-style depthwise-separable CNN with ReLU6, 1x3x224x224",
                        build_mobilenet, mobilenet_inputs, ("image",), ("logits",))
