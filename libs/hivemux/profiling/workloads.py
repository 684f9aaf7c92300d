"""A small catalog of real model families in torch, for the workload profiler's dry runs.

MuxFlow's profiler "performs a few dry runs of the workload" (preprint §6) of each offline job
when it is submitted. Offline jobs here name a model family (`WorkloadSpec.model`); the
profiler builds a real torch model of that family and trains it on synthetic data:

- ``conv``: a convolutional image classifier (ResNet-style blocks: conv-BN-ReLU with a
  residual add), for resnet50, vgg16, densenet201, inceptionv3;
- ``transformer``: a transformer encoder classifier over token sequences, for bert;
- ``recommendation``: a DLRM-style model, embedding tables for sparse features, a bottom MLP
  for dense ones, dot-product interactions and a top MLP, for recommendation-mlp.

`size` scales width (and the embedding tables) so the same family runs on a CPU in tests and
at full size on a GPU; each catalog name fixes depth and width at ``size = 1``.

Worked example: ``build_workload("resnet50", size=0.25, batch=8)`` gives a conv model of
about 0.2 M parameters and a batch of 8 images of 3 x 32 x 32 with 10 classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FamilySpec:
    family: str  # conv | transformer | recommendation
    depth: int
    width: int


CATALOG: dict[str, FamilySpec] = {
    "resnet50": FamilySpec("conv", depth=4, width=64),
    "vgg16": FamilySpec("conv", depth=5, width=96),
    "densenet201": FamilySpec("conv", depth=6, width=48),
    "inceptionv3": FamilySpec("conv", depth=4, width=80),
    "bert": FamilySpec("transformer", depth=4, width=256),
    "recommendation-mlp": FamilySpec("recommendation", depth=3, width=256),
}


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def _conv(depth: int, width: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    for i in range(depth):
        layers.append(_Residual(width))
        if i % 2 == 1:
            layers.append(nn.MaxPool2d(2))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10)]
    return nn.Sequential(*layers)


class _Transformer(nn.Module):
    VOCAB, SEQ = 1000, 64

    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class _Recommendation(nn.Module):
    TABLES, DENSE = 8, 13

    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.rows = 50 * width
        dim = max(8, width // 8)
        self.tables = nn.ModuleList(nn.EmbeddingBag(self.rows, dim, mode="sum") for _ in range(self.TABLES))
        self.bottom = nn.Sequential(nn.Linear(self.DENSE, width), nn.ReLU(), nn.Linear(width, dim), nn.ReLU())
        pairs = (self.TABLES + 1) * self.TABLES // 2
        top: list[nn.Module] = [nn.Linear(dim + pairs, width), nn.ReLU()]
        for _ in range(depth - 1):
            top += [nn.Linear(width, width), nn.ReLU()]
        self.top = nn.Sequential(*top, nn.Linear(width, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        features = torch.stack([x] + [t(sparse[:, i, :]) for i, t in enumerate(self.tables)], dim=1)
        interactions = features @ features.transpose(1, 2)
        i, j = torch.triu_indices(features.shape[1], features.shape[1], offset=1)
        return self.top(torch.cat([x, interactions[:, i, j]], dim=1)).squeeze(1)


@dataclass
class Workload:
    """A model, its optimizer and one training step on a fixed synthetic batch."""

    name: str
    family: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[], float]


def build_workload(name: str, *, size: float, batch: int, device: str = "cpu", seed: int = 0) -> Workload:
    spec = CATALOG.get(name)
    if spec is None:
        raise ValueError(f"no torch workload for model {name!r}; known: {', '.join(sorted(CATALOG))}")
    if not (0 < size <= 4) or batch < 1:
        raise ValueError(f"need 0 < size <= 4 and batch >= 1, got size={size}, batch={batch}")
    width = max(8, int(spec.width * size) // 8 * 8)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    inputs: tuple[torch.Tensor, ...]
    if spec.family == "conv":
        model: nn.Module = _conv(spec.depth, width)
        inputs = (torch.randn(batch, 3, 32, 32, generator=generator),)
        target = torch.randint(0, 10, (batch,), generator=generator)
        loss_fn: nn.Module = nn.CrossEntropyLoss()
        optimizer_cls: type[torch.optim.Optimizer] = torch.optim.SGD
    elif spec.family == "transformer":
        model = _Transformer(spec.depth, width)
        inputs = (torch.randint(0, _Transformer.VOCAB, (batch, _Transformer.SEQ), generator=generator),)
        target = torch.randint(0, 2, (batch,), generator=generator)
        loss_fn = nn.CrossEntropyLoss()
        optimizer_cls = torch.optim.Adam
    else:
        model = _Recommendation(spec.depth, width)
        rows = model.rows  # type: ignore[assignment]
        inputs = (
            torch.randn(batch, _Recommendation.DENSE, generator=generator),
            torch.randint(0, int(rows), (batch, _Recommendation.TABLES, 4), generator=generator),
        )
        target = torch.rand(batch, generator=generator)
        loss_fn = nn.BCEWithLogitsLoss()
        optimizer_cls = torch.optim.Adagrad
    model = model.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    target = target.to(device)
    optimizer = optimizer_cls(model.parameters(), lr=0.01)  # type: ignore[call-arg]

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return Workload(name, spec.family, model, optimizer, step)
