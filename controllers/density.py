"""Feature-density score on a controller's encoder tokens: how unlike its training frames an input is.

An uncertainty head only knows the inputs it was trained on; a frame far from all of them can
still get a confident prediction (NSAC's epistemic variance is ~1e-9 on fog). DDU (Mukhoti et
al. 2023) reads the distance from the training data off the features instead: fit a Gaussian
to the encoder's features of the training split and score each input by its density. A
regression controller has no classes, so there is one Gaussian N(μ, Σ + jitter·I).

The score is the squared Mahalanobis distance divided by the feature dimension F,
d²(x)/F = ‖L⁻¹(x − μ)‖² / F with Σ + jitter·I = L Lᵀ. It is −log density up to a constant (so it
ranks inputs exactly as DDU's density does), its mean over the fitted features is
tr((Σ + jitter·I)⁻¹Σ)/F = 1 − O(jitter), and it is unchanged when the features are shifted,
rotated or scaled as a whole (the jitter is relative to their mean variance); any other
invertible linear map changes it only through the jitter.

Features (:meth:`Controller.density_features`), by the density's ``source``:

* ``tokens`` (the default): the newest frame's tokens, averaged over its K tokens per frame (speed
  embedding included) — the frame the action is taken on. Training taught the encoder to ignore
  what does not matter for the action (the grass's colour, mild noise), so this density flags
  the shifts that reach the head and stays quiet on harmless ones.
* ``tokens+conv``: the same tokens followed by the mean and root mean square over the map of
  every channel of every convolution's output (before its activation) — the low-level image
  statistics the tokens have learnt to discard. It flags every input shift, harmless or not
  (a textured background, which the tokens barely see, included): an input-shift detector.

A deep ensemble concatenates its members' features. ``nsacdrive calibrate`` fits it on the run's training
tracks and writes ``RUN/density.safetensors``; :func:`nsacdrive.controllers.run.load_run` attaches it, and every
prediction then carries ``density`` [B].
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from nsacdrive.common.atomic import atomic_write_bytes
from nsacdrive.controllers.checkpoint import safetensors_bytes
from nsacdrive.controllers.model_names import DENSITY_SOURCES

DENSITY_FILE = "density.safetensors"
METHOD = "gaussian-mahalanobis"
#: The smallest jitter, relative to the mean feature variance; ×10 until Σ + jitter·I factorises. Never 0:
#: a numerically singular Σ (ReLU features, copies) can factorise with pivots of rounding size,
#: which would blow rounding noise up into the score.
RELATIVE_JITTER = 1e-6
_MAX_JITTER_TRIES = 12


def check_density_source(source: str) -> None:
    """ValueError unless ``source`` is one of :data:`DENSITY_SOURCES`."""
    if source not in DENSITY_SOURCES:
        raise ValueError(f"density source must be one of {', '.join(DENSITY_SOURCES)}, got {source!r}")


class DensityError(ValueError):
    """A density file that cannot be used, with the file and the field in the message."""


@dataclass(frozen=True)
class FeatureDensity:
    """A Gaussian over a controller's features: mean [F] and whitening W = L⁻¹ [F, F]."""

    mean: torch.Tensor
    whitening: torch.Tensor
    jitter: float  # absolute jitter added to Σ's diagonal
    train_seeds: tuple[int, ...]
    samples: int
    data_fingerprint: str
    source: str = "tokens"

    def __post_init__(self) -> None:
        check_density_source(self.source)

    @property
    def features(self) -> int:
        return int(self.mean.shape[0])

    def score(self, features: torch.Tensor) -> torch.Tensor:
        """d²(x)/F per row of ``features`` [B, F] → [B] (≈ 1 on training frames, larger = less familiar)."""
        if features.dim() != 2 or features.shape[1] != self.features:
            raise ValueError(f"density features must be [B, {self.features}], got {tuple(features.shape)}")
        mean, whitening = self.mean.to(features.device), self.whitening.to(features.device)
        centred = features.to(mean.dtype) - mean
        return (centred @ whitening.T).square().mean(1).to(features.dtype)

    def to_bytes(self) -> bytes:
        metadata = {"method": METHOD, "jitter": repr(self.jitter), "train_seeds": json.dumps(list(self.train_seeds)),
                    "samples": str(self.samples), "data_fingerprint": self.data_fingerprint, "source": self.source}
        return safetensors_bytes({"mean": self.mean.contiguous(), "whitening": self.whitening.contiguous()}, metadata)


def fit_density(features: torch.Tensor, train_seeds: tuple[int, ...], data_fingerprint: str, source: str = "tokens") -> FeatureDensity:
    """The Gaussian of ``features`` [N, F] (population covariance, fitted in float64).

    The smallest jitter RELATIVE_JITTER·10^k × mean variance (k ≥ 0) that makes Σ + jitter·I
    positive definite is used (features from ReLU encoders are often rank-deficient)."""
    if features.dim() != 2:
        raise ValueError(f"features must be [N, F], got shape {tuple(features.shape)}")
    n, f = features.shape
    if n <= f:
        raise ValueError(f"a density over {f} features needs more than {f} samples, got {n}")
    x = features.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("features must be finite")
    mean = x.mean(0)
    centred = x - mean
    covariance = centred.T @ centred / n
    base = float(covariance.diagonal().mean().clamp(min=torch.finfo(torch.float64).tiny))
    for k in range(_MAX_JITTER_TRIES):
        jitter = base * RELATIVE_JITTER * 10**k
        factor, info = torch.linalg.cholesky_ex(covariance + jitter * torch.eye(f, dtype=torch.float64))
        if int(info) == 0:
            break
    else:
        raise ValueError(f"the feature covariance is not positive definite even with jitter {jitter:.3g}")
    whitening = torch.linalg.solve_triangular(factor, torch.eye(f, dtype=torch.float64), upper=False)
    return FeatureDensity(mean, whitening, jitter, tuple(train_seeds), n, data_fingerprint, source)


def attach_density(model: torch.nn.Module, density: FeatureDensity | None) -> None:
    """Make ``model`` (a controller or an ensemble) score every prediction with ``density`` (None: none),
    its ``encode`` emitting the features the density reads."""
    model.density = density
    model.use_density_source("tokens" if density is None else density.source)


def write_density(run_dir: str | Path, density: FeatureDensity) -> Path:
    path = Path(run_dir) / DENSITY_FILE
    atomic_write_bytes(path, density.to_bytes())
    return path


def read_density(run_dir: str | Path) -> FeatureDensity | None:
    """The run's feature density, or None when it has none (``nsacdrive calibrate`` fits it)."""
    path = Path(run_dir) / DENSITY_FILE
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except SafetensorError as exc:
        raise DensityError(f"{path}: not a safetensors file ({exc})") from None
    if metadata.get("method") != METHOD:
        raise DensityError(f"{path}: method {metadata.get('method')!r} is not {METHOD!r}")
    mean, whitening = tensors.get("mean"), tensors.get("whitening")
    if mean is None or whitening is None or mean.dim() != 1 or tuple(whitening.shape) != (mean.shape[0], mean.shape[0]):
        raise DensityError(f"{path}: expected tensors mean [F] and whitening [F, F]")
    source = metadata.get("source", "tokens")  # files written before sources existed are over tokens
    if source not in DENSITY_SOURCES:
        raise DensityError(f"{path}: source {source!r} is not one of {', '.join(DENSITY_SOURCES)}")
    try:
        return FeatureDensity(mean, whitening, float(metadata["jitter"]), tuple(json.loads(metadata["train_seeds"])),
                              int(metadata["samples"]), metadata["data_fingerprint"], source)
    except (KeyError, ValueError) as exc:
        raise DensityError(f"{path}: bad or missing metadata field ({exc})") from None


class ConvStatistics:
    """While active, records the per-channel mean and root mean square over the map of every
    ``nn.Conv2d`` output in ``module`` (module order): :meth:`values` [N, P] for the N images of the last forward pass."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.convolutions = [layer for layer in module.modules() if isinstance(layer, torch.nn.Conv2d)]
        if not self.convolutions:
            raise ValueError(f"{type(module).__name__} has no convolutions to take statistics of")
        self._maps: list[torch.Tensor] = []
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        #: P = 2 × the channels of all convolutions
        self.width = 2 * sum(layer.out_channels for layer in self.convolutions)

    def _record(self, _layer: torch.nn.Module, _inputs: object, output: torch.Tensor) -> None:
        # the root mean square, not the standard deviation: as informative beside the mean, free of
        # E[x²] − E[x]²'s cancellation, and 8× cheaper than torch's variance over two dimensions
        self._maps.append(torch.cat([output.mean((2, 3)), output.square().mean((2, 3)).sqrt()], 1))

    def __enter__(self) -> "ConvStatistics":
        self._maps.clear()
        self._hooks = [layer.register_forward_hook(self._record) for layer in self.convolutions]
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def values(self) -> torch.Tensor:
        if len(self._maps) != len(self.convolutions):
            raise RuntimeError(f"expected one output from each of {len(self.convolutions)} convolutions, got {len(self._maps)}")
        return torch.cat(self._maps, 1)
