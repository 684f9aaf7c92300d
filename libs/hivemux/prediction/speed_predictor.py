"""The speed predictor: one MLP per GPU type (MuxFlow preprint §5 and §6).

Paper: "We can use the profiled separate execution features of online and offline workloads as
input, and employ a DL model to get shared throughput. Specifically, we choose highly related
execution features, e.g., GPU utilization, SM activity, SM occupancy, separate execution time,
and assigned SM percentage, as input. We employ the multi-layer perceptron (MLP) ... we train
multiple MLPs for each GPU type" (§5); "The MLPs of the speed predictor have four layers
with hidden size 64x64 ... trained with momentum SGD" (§6); §7.4 picks 4 layers / 64 for
accuracy and inference time. `P.CalcNormTput(u, v, sm)` of Algorithm 1 is `predict`.

Name mapping: the input row is `FEATURES` (defined once, in `features`: online SM activity x
of the last interval, the offline job's solo SM activity, GPU utilization, SM occupancy and
iteration time, the SM share ``sm`` from dynamic SM allocation); the outputs are the offline job's *normalized throughput*
(the matching weight) and the online workload's *slowdown* (which the matcher bounds).

Network: ``Linear(6, 64) - tanh - Linear(64, 64) - tanh - Linear(64, 64) - tanh - Linear(64, 2)``
(four layers, hidden size 64); the throughput head is a sigmoid (it lies in [0, 1]), the
slowdown head a softplus (>= 0). Inputs are scaled by fixed constants (percent / 100, log of
the iteration time), so a model is its weights alone. Loss: relative squared error of the
throughput (``(p - y) / (y + 0.05)``: MAPE is what we report, and a small weight mispredicted
by 0.05 matters as much as a large one by 10 %) plus squared error of the slowdown in units of
0.05 (a quarter of the 20 % bound). Optimizer: SGD with momentum 0.9 (the paper's choice),
a fixed number of epochs over shuffled mini-batches, seeded: same data and seed, same weights.

How it departs from the paper:
- the online workload's GPU utilization is not an input: the sharing observations the
  executor reports carry the online SM activity but not the online workload's solo GPU
  utilization, and the SM activity is what dynamic SM allocation uses. So a prediction
  depends only on (x, offline profile, share): the matcher relies on that to form classes;
- a fixed epoch budget instead of "until they converge" (bounded training time in a service);
- the held-out error is the MAPE of the normalized throughput on a split kept from training;
  the slowdown's mean absolute error is reported beside it (`FitReport`).

Worked example: `fit(data, seed=0)` on 4 000 simulator pairs of a T4 reaches a held-out MAPE
of a few percent (`benchmarks/predictor.py` prints it); ``model.predict_arrays(rows)`` on a
float32 array of shape (n, 6) returns two arrays of n values.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .features import COLUMN, FEATURES, PairFeatures, SpeedPrediction

HIDDEN = 64
LAYERS = 4
_THROUGHPUT_FLOOR = 0.05  # relative-error denominator floor
_SLOWDOWN_UNIT = 0.05
_CLIP_NORM = 1.0  # momentum SGD on a relative loss takes a few huge steps early without it
_TIME = COLUMN["offline_iteration_time_ms"]  # the one input not in percent


def feature_rows(pairs: Sequence[PairFeatures]) -> np.ndarray:
    """The raw (unscaled) input rows, float32, shape (n, 6), columns as `FEATURES`."""
    return np.array([p.as_row() for p in pairs], dtype=np.float32).reshape(len(pairs), len(FEATURES))


def _scaled(rows: torch.Tensor) -> torch.Tensor:
    """Fixed input scaling: percents to [0, 1], iteration time to log10(ms) / 4."""
    out = rows / 100.0
    out[:, _TIME] = torch.log10(rows[:, _TIME].clamp(min=1e-3)) / 4.0
    return out


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(len(FEATURES), HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.Tanh(),
            nn.Linear(HIDDEN, 2),
        )

    def forward(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.body(_scaled(rows))
        return torch.sigmoid(z[:, 0]), nn.functional.softplus(z[:, 1])


@dataclass(frozen=True)
class Dataset:
    """Training pairs: inputs (n, 6) raw features, targets throughput (n,) and slowdown (n,)."""

    rows: np.ndarray
    throughput: np.ndarray
    slowdown: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.rows)
        if self.rows.shape != (n, len(FEATURES)) or self.throughput.shape != (n,) or self.slowdown.shape != (n,):
            raise ValueError(f"dataset shapes disagree: {self.rows.shape}, {self.throughput.shape}, {self.slowdown.shape}")

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, index: np.ndarray) -> Dataset:
        return Dataset(self.rows[index], self.throughput[index], self.slowdown[index])

    def concat(self, other: Dataset) -> Dataset:
        return Dataset(
            np.concatenate([self.rows, other.rows]).astype(np.float32),
            np.concatenate([self.throughput, other.throughput]).astype(np.float32),
            np.concatenate([self.slowdown, other.slowdown]).astype(np.float32),
        )


@dataclass(frozen=True)
class Errors:
    throughput_mape: float  # mean |p - y| / y over pairs with y >= 0.01
    slowdown_mae: float


@dataclass(frozen=True)
class TrainingSettings:
    epochs: int = 80
    batch_size: int = 128
    learning_rate: float = 0.1
    momentum: float = 0.9
    heldout_fraction: float = 0.2


class MlpSpeedModel:
    """Implements `SpeedModel`: one GPU type's MLP at one version. Inference is batched and
    runs under `torch.inference_mode` in float32."""

    def __init__(self, gpu_type: str, version: int, net: _Net | None = None) -> None:
        self.gpu_type = gpu_type
        self.version = version
        self._net = net if net is not None else _Net()
        self._net.eval()
        # inference path: transposed weights, fused bias add (addmm) and in-place tanh; the
        # same arithmetic as `_Net.forward` with fewer temporaries (benchmarks/predictor.py)
        linear = [m for m in self._net.body if isinstance(m, nn.Linear)]
        self._weights = [m.weight.detach().t().contiguous() for m in linear]
        self._biases = [m.bias.detach().clone() for m in linear]

    def _forward(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = _scaled(rows)
        for w, b in zip(self._weights[:-1], self._biases[:-1], strict=True):
            h = torch.addmm(b, h, w)
            h.tanh_()
        z = torch.addmm(self._biases[-1], h, self._weights[-1])
        return torch.sigmoid(z[:, 0]), nn.functional.softplus(z[:, 1])

    # -- inference ----------------------------------------------------------------------
    def predict_arrays(self, rows: np.ndarray, *, chunk: int = 1 << 14) -> tuple[np.ndarray, np.ndarray]:
        """(throughput, slowdown) for raw feature rows of shape (n, 6), in chunks."""
        data = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))
        n = data.shape[0]
        tput = np.empty(n, dtype=np.float32)
        slow = np.empty(n, dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, n, chunk):
                t, s = self._forward(data[start : start + chunk])
                tput[start : start + chunk] = t.numpy()
                slow[start : start + chunk] = s.numpy()
        return tput, slow

    def predict(self, pairs: Sequence[PairFeatures]) -> list[SpeedPrediction]:
        if not pairs:
            return []
        tput, slow = self.predict_arrays(feature_rows(pairs))
        return [SpeedPrediction(float(t), float(s)) for t, s in zip(tput, slow, strict=True)]

    def errors(self, data: Dataset) -> Errors:
        return errors_of(*self.predict_arrays(data.rows), data)

    # -- weights ------------------------------------------------------------------------
    def weights_b64(self) -> str:
        buffer = io.BytesIO()
        torch.save(self._net.state_dict(), buffer)
        return base64.b64encode(buffer.getvalue()).decode("ascii")

    @classmethod
    def from_weights_b64(cls, gpu_type: str, version: int, weights: str) -> MlpSpeedModel:
        net = _Net()
        state = torch.load(io.BytesIO(base64.b64decode(weights)), weights_only=True)
        net.load_state_dict(state)
        return cls(gpu_type, version, net)


def errors_of(throughput: np.ndarray, slowdown: np.ndarray, data: Dataset) -> Errors:
    y = data.throughput.astype(np.float64)
    keep = y >= 0.01
    mape = float(np.mean(np.abs(throughput[keep] - y[keep]) / y[keep])) if keep.any() else 0.0
    mae = float(np.mean(np.abs(slowdown - data.slowdown))) if len(data) else 0.0
    return Errors(mape, mae)


@dataclass(frozen=True)
class FitReport:
    model: MlpSpeedModel
    heldout: Errors
    trained_on: int  # pairs used for fitting (the held-out split excluded)
    heldout_size: int


def split(data: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """A seeded (train, held-out) split."""
    order = np.random.default_rng(seed).permutation(len(data))
    cut = len(data) - max(1, math.ceil(fraction * len(data))) if len(data) > 1 else len(data)
    return data.take(order[:cut]), data.take(order[cut:])


def fit(
    data: Dataset,
    *,
    gpu_type: str,
    version: int,
    seed: int,
    settings: TrainingSettings = TrainingSettings(),
    heldout: Dataset | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> FitReport:
    """Train a new MLP on ``data`` (minus a held-out split, unless ``heldout`` is given) with
    momentum SGD. Deterministic for the same data, seed and settings. ``should_stop`` is
    asked after every epoch; True aborts with `TrainingAborted` (a service shutting down)."""
    if len(data) < 2:
        raise ValueError(f"need at least 2 training pairs, got {len(data)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # mini-batches of 64x64 layers: more threads only add synchronization
    try:
        return _fit(data, gpu_type=gpu_type, version=version, seed=seed, settings=settings, heldout=heldout, should_stop=should_stop)
    finally:
        torch.set_num_threads(threads)


class TrainingAborted(Exception):
    """Training stopped early on request."""


def _fit(
    data: Dataset,
    *,
    gpu_type: str,
    version: int,
    seed: int,
    settings: TrainingSettings,
    heldout: Dataset | None,
    should_stop: Callable[[], bool] | None,
) -> FitReport:
    train, test = (data, heldout) if heldout is not None else split(data, settings.heldout_fraction, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = _Net()
    x = torch.from_numpy(np.ascontiguousarray(train.rows, dtype=np.float32))
    yt = torch.from_numpy(train.throughput.astype(np.float32))
    ys = torch.from_numpy(train.slowdown.astype(np.float32))
    optimizer = torch.optim.SGD(net.parameters(), lr=settings.learning_rate, momentum=settings.momentum)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=settings.epochs)
    net.train()
    for _ in range(settings.epochs):
        order = torch.randperm(len(train), generator=generator)
        for start in range(0, len(train), settings.batch_size):
            batch = order[start : start + settings.batch_size]
            t, s = net(x[batch])
            relative = (t - yt[batch]) / (yt[batch] + _THROUGHPUT_FLOOR)
            loss = (relative**2).mean() + (((s - ys[batch]) / _SLOWDOWN_UNIT) ** 2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), _CLIP_NORM)
            optimizer.step()
        schedule.step()
        if should_stop is not None and should_stop():
            raise TrainingAborted(f"training of {gpu_type} v{version} aborted")
    model = MlpSpeedModel(gpu_type, version, net)
    return FitReport(model, model.errors(test), len(train), len(test))
