"""Per-frame image encoders: preprocessed RGB frames [B, T, 3, 84, 96] → tokens [B, T, F].

``FrameEncoder`` (default) is a small CNN whose last convolution keeps a 7×8 map (≥ 6×6, so
Grad-CAM has spatial resolution) before it is flattened into one token per frame. GroupNorm
instead of BatchNorm: statistics never depend on the batch, so perturbed passes and batch-1
control behave exactly like training. ``ReferenceEncoder`` is the published CarRacing CNN
(nsac.md §8.1: 5×5/3 → pool → 3×3/2 → pool → 2×2/1 → pool → BatchNorm → 64 features; its
last map is 1×1, so Grad-CAM is meaningless on it) for parity studies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from envs.observation import PREPROCESSED_FRAME_SHAPE


@dataclass(frozen=True)
class EncoderConfig:
    kind: str = "cnn"  # "cnn" | "reference"
    token_dim: int = 64
    channels: tuple[int, int, int] = (32, 64, 64)

    def __post_init__(self) -> None:
        if self.kind not in ("cnn", "reference"):
            raise ValueError(f"encoder kind must be 'cnn' or 'reference', got {self.kind!r}")
        if self.token_dim < 1:
            raise ValueError(f"token_dim must be >= 1, got {self.token_dim}")


def check_frames(frames: torch.Tensor) -> None:
    if frames.dim() != 5 or tuple(frames.shape[2:]) != PREPROCESSED_FRAME_SHAPE:
        raise ValueError(
            f"frames must have shape [B, T, {', '.join(map(str, PREPROCESSED_FRAME_SHAPE))}] "
            f"(envs.preprocess_observation output), got {tuple(frames.shape)}"
        )


class PerFrameEncoder(nn.Module):
    """Shared shape handling: ``features`` and ``to_token`` applied to every frame independently."""

    features: nn.Sequential
    to_token: nn.Module
    LAST_CONV_INDEX: int

    @property
    def last_conv(self) -> nn.Conv2d:
        """The last convolution: the Grad-CAM layer."""
        return self.features[self.LAST_CONV_INDEX]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        check_frames(frames)
        batch, length = frames.shape[:2]
        return self.to_token(self.features(frames.flatten(0, 1))).view(batch, length, -1)


class FrameEncoder(PerFrameEncoder):
    """3 convolutions (8×8/4, 4×4/2, 3×3/1) → 7×8 map (``last_conv``, for Grad-CAM) → token."""

    LAST_CONV_INDEX = 6

    def __init__(self, config: EncoderConfig = EncoderConfig()) -> None:
        super().__init__()
        c1, c2, c3 = config.channels
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 8, stride=4), nn.GroupNorm(8, c1), nn.ReLU(),
            nn.Conv2d(c1, c2, 4, stride=2), nn.GroupNorm(8, c2), nn.ReLU(),
            nn.Conv2d(c2, c3, 3, stride=1), nn.ReLU(),
        )
        with torch.no_grad():
            shape = self.features(torch.zeros(1, *PREPROCESSED_FRAME_SHAPE)).shape
        self.map_shape = tuple(shape[2:])
        self.to_token = nn.Sequential(nn.Flatten(), nn.Linear(shape[1] * shape[2] * shape[3], config.token_dim), nn.ReLU())


class ReferenceEncoder(PerFrameEncoder):
    """The published CarRacing CNN (TimeDistributed over frames), adapted to RGB 84×96 input.

    Its last convolution's map is 2×2 (pooled to 1×1): too coarse for Grad-CAM.
    """

    LAST_CONV_INDEX = 6

    def __init__(self, config: EncoderConfig = EncoderConfig(kind="reference")) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 5, stride=3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 48, 3, stride=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(48, 64, 2, stride=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.BatchNorm2d(64), nn.Flatten(),
        )
        with torch.no_grad():
            width = self.features.eval()(torch.zeros(1, *PREPROCESSED_FRAME_SHAPE)).shape[1]
        self.features.train()
        self.to_token = nn.Identity() if width == config.token_dim else nn.Linear(width, config.token_dim)


def make_encoder(config: EncoderConfig) -> nn.Module:
    return FrameEncoder(config) if config.kind == "cnn" else ReferenceEncoder(config)
