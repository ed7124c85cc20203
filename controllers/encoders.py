"""Per-frame image encoders: preprocessed RGB frames [B, T, 3, 84, 96] → tokens [B, T, F].

``FrameEncoder`` (default) is a small CNN whose last convolution keeps a 7×8 map (≥ 6×6, so
Grad-CAM has spatial resolution) before it is flattened into one token per frame. GroupNorm
instead of BatchNorm: statistics never depend on the batch, so perturbed passes and batch-1
control behave exactly like training. ``ReferenceEncoder`` is the published CarRacing CNN
(docs/nsac.md#published-experiment-settings: 5×5/3 → pool → 3×3/2 → pool → 2×2/1 → pool → BatchNorm → 64 features; its
last map is 1×1, so Grad-CAM is meaningless on it) for parity studies. ``GridEncoder``
(``kind="cnn-grid"``) keeps the same convolutions and emits the map pooled to 3×3 as 9 tokens
per frame, so attention heads choose between places in the picture, not only between frames.

``NvidiaEncoder`` (``kind="nvidia"``) reads Udacity frames [B, T, 3, 66, 200] (YUV,
:mod:`nsacdrive.envs.udacity_observation`): the NVIDIA PilotNet convolutions 24@5×5/2, 36@5×5/2,
48@5×5/2, 64@3×3, 64@3×3 (ELU) give a 64×1×18 map per frame, and each of its 18 COLUMNS is one
token of 64 channels (projected to ``token_dim`` when that differs) — a left-to-right strip of
the road — instead of the published variant's arbitrary memory reshape. Token convention: an
encoder emits ``TOKENS_PER_FRAME`` tokens per frame, frame-major (tokens [B, T·K, F], token
t·K + k = column k of frame t); :class:`nsacdrive.controllers.controller.Controller` repeats each frame's
time and speed for its K tokens and sums attention back per frame. Its 1×18 map is too flat for
Grad-CAM, which refuses it with a clear error.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from nsacdrive.common.config_checks import WIDTH, check_fields
from nsacdrive.envs.observation import PREPROCESSED_FRAME_SHAPE
from nsacdrive.envs.udacity_observation import UDACITY_FRAME_SHAPE

GROUPS = 8  # GroupNorm groups of the "cnn" encoder


#: the numbers EncoderConfig's fields may take
ENCODER_RANGES = {"token_dim": WIDTH, "channels": WIDTH}
#: how an encoder normalises each frame before its convolutions: ``frame`` subtracts the frame's mean
#: and divides by its std over all pixels and channels (global brightness and contrast are gone),
#: ``channel`` does so per colour channel (a colour cast is gone too)
INPUT_NORMS = ("none", "frame", "channel")


@dataclass(frozen=True)
class EncoderConfig:
    """The per-frame encoder: its kind, token width, channels and how it normalises each frame."""

    kind: str = "cnn"  # a key of ENCODERS
    token_dim: int = 64
    channels: tuple[int, int, int] = (32, 64, 64)  # "cnn" and "cnn-grid" only
    input_norm: str = "none"  # one of INPUT_NORMS

    def __post_init__(self) -> None:
        check_fields(self, "encoder", ENCODER_RANGES)
        if self.input_norm not in INPUT_NORMS:
            raise ValueError(f"encoder input_norm must be one of {', '.join(INPUT_NORMS)}, got {self.input_norm!r}")
        if self.kind not in ENCODERS:
            raise ValueError(f"encoder kind must be one of {', '.join(sorted(ENCODERS))}, got {self.kind!r}")
        if ENCODERS[self.kind].GROUP_NORM and any(c % GROUPS for c in self.channels[:2]):
            raise ValueError(f"encoder channels: the first two must be multiples of {GROUPS} (GroupNorm groups), got {self.channels}")

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """The preprocessed frame (C, H, W) this encoder reads."""
        return ENCODERS[self.kind].FRAME_SHAPE

    @property
    def tokens_per_frame(self) -> int:
        return ENCODERS[self.kind].TOKENS_PER_FRAME


def check_frames(frames: torch.Tensor, frame_shape: tuple[int, int, int]) -> None:
    if frames.dim() != 5 or tuple(frames.shape[2:]) != frame_shape:
        raise ValueError(
            f"frames must have shape [B, T, {', '.join(map(str, frame_shape))}] "
            f"(nsacdrive.envs.observation_kinds.preprocess_for output of this encoder's observation kind), got {tuple(frames.shape)}"
        )


class PerFrameEncoder(nn.Module):
    """Shared shape handling: ``features`` and ``to_token`` applied to every frame independently;
    ``FRAME_SHAPE`` is the preprocessed frame it reads, ``TOKENS_PER_FRAME`` the tokens it emits per frame."""

    features: nn.Sequential
    to_token: nn.Module
    LAST_CONV_INDEX: int
    FRAME_SHAPE: tuple[int, int, int] = PREPROCESSED_FRAME_SHAPE
    TOKENS_PER_FRAME: int = 1
    GROUP_NORM: bool = False  # built on frame_convolutions: ``channels`` must suit its GroupNorm groups
    #: feed the convolutions channels-last frames (oneDNN's faster layout for wide 5×5 maps: the
    #: NVIDIA stack trains 1.4× faster on one core; ``bench/training_speed.py`` measures it)
    CHANNELS_LAST: bool = False
    #: the dtype the convolutions and the token projection compute in (None: float32); set for
    #: training only (:mod:`nsacdrive.controllers.precision`) — the tokens leave as float32 either way
    autocast_dtype: torch.dtype | None = None
    input_norm: str = "none"  # set by make_encoder from EncoderConfig.input_norm

    @property
    def last_conv(self) -> nn.Conv2d:
        """The last convolution: the Grad-CAM layer."""
        return self.features[self.LAST_CONV_INDEX]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        check_frames(frames, self.FRAME_SHAPE)
        batch, length = frames.shape[:2]
        images = normalise_input(frames.flatten(0, 1), self.input_norm)
        if self.CHANNELS_LAST:
            images = images.contiguous(memory_format=torch.channels_last)
        with self._precision(images.device.type):
            tokens = self.to_token(self.features(images))
        return tokens.float().reshape(batch, length * self.TOKENS_PER_FRAME, -1)

    def _precision(self, device_type: str) -> AbstractContextManager:
        return nullcontext() if self.autocast_dtype is None else torch.autocast(device_type, dtype=self.autocast_dtype)


def normalise_input(images: torch.Tensor, norm: str, eps: float = 1e-3) -> torch.Tensor:
    """Images [N, C, H, W] standardised as ``norm`` (:data:`INPUT_NORMS`) says; ``none`` returns them as they are.
    ``eps`` keeps a uniform frame (std 0) finite."""
    if norm == "none":
        return images
    dims = (1, 2, 3) if norm == "frame" else (2, 3)
    std, mean = torch.std_mean(images, dim=dims, keepdim=True, correction=0)
    return (images - mean) / (std + eps)


def frame_convolutions(channels: tuple[int, int, int]) -> nn.Sequential:
    """The "cnn" convolutions (8×8/4, 4×4/2, 3×3/1, GroupNorm): an 84×96 frame → a 7×8 map."""
    c1, c2, c3 = channels
    return nn.Sequential(
        nn.Conv2d(3, c1, 8, stride=4), nn.GroupNorm(GROUPS, c1), nn.ReLU(),
        nn.Conv2d(c1, c2, 4, stride=2), nn.GroupNorm(GROUPS, c2), nn.ReLU(),
        nn.Conv2d(c2, c3, 3, stride=1), nn.ReLU(),
    )


class FrameEncoder(PerFrameEncoder):
    """3 convolutions (8×8/4, 4×4/2, 3×3/1) → 7×8 map (``last_conv``, for Grad-CAM) → token."""

    LAST_CONV_INDEX = 6
    GROUP_NORM = True

    def __init__(self, config: EncoderConfig | None = None) -> None:
        super().__init__()
        config = config or EncoderConfig()
        self.features = frame_convolutions(config.channels)
        with torch.no_grad():
            shape = self.features(torch.zeros(1, *PREPROCESSED_FRAME_SHAPE)).shape
        self.to_token = nn.Sequential(nn.Flatten(), nn.Linear(shape[1] * shape[2] * shape[3], config.token_dim), nn.ReLU())


class GridEncoder(PerFrameEncoder):
    """The "cnn" convolutions, their 7×8 map average-pooled to a 3×3 grid: 9 tokens per frame
    (row-major), each a projected cell with a learned position vector.

    With one token per frame an attention head mixes T nearly identical frame tokens, so the
    spread of its output over attention noise is structurally near zero (NSAC's epistemic
    collapse); grid tokens give it places in the picture to choose between."""

    LAST_CONV_INDEX = 6
    GROUP_NORM = True
    GRID = (3, 3)
    TOKENS_PER_FRAME = GRID[0] * GRID[1]

    def __init__(self, config: EncoderConfig | None = None) -> None:
        super().__init__()
        config = config or EncoderConfig(kind="cnn-grid")
        self.features = frame_convolutions(config.channels)
        self.to_token = nn.Sequential(nn.AdaptiveAvgPool2d(self.GRID), MapTokens(), nn.Linear(config.channels[2], config.token_dim),
                                      nn.ReLU(), TokenPositions(self.TOKENS_PER_FRAME, config.token_dim))


class ReferenceEncoder(PerFrameEncoder):
    """The published CarRacing CNN (TimeDistributed over frames), adapted to RGB 84×96 input.

    Its last convolution's map is 2×2 (pooled to 1×1): too coarse for Grad-CAM.
    """

    LAST_CONV_INDEX = 6

    def __init__(self, config: EncoderConfig | None = None) -> None:
        super().__init__()
        config = config or EncoderConfig(kind="reference")
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


class MapTokens(nn.Module):
    """A map [N, C, H, W] → tokens [N, H·W, C]: one token per cell, row-major (a 1×W map: left to right)."""

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        if maps.dim() != 4:
            raise ValueError(f"MapTokens expects maps [N, C, H, W], got {tuple(maps.shape)}")
        return maps.flatten(2).transpose(1, 2)


class TokenPositions(nn.Module):
    """Adds a learned vector per token position to tokens [N, K, D], so a head that pools tokens still
    knows where in the picture each one is (the bend of the road is a matter of left or right)."""

    def __init__(self, positions: int, dim: int) -> None:
        super().__init__()
        self.position = nn.Parameter(0.1 * torch.randn(positions, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens + self.position


class NvidiaEncoder(PerFrameEncoder):
    """NVIDIA PilotNet convolutions on a 3×66×200 Udacity frame → 64×1×18 map → 18 column tokens,
    each with a learned column-position vector added (heads see tokens as a set, in any order)."""

    LAST_CONV_INDEX = 8
    FRAME_SHAPE = UDACITY_FRAME_SHAPE
    TOKENS_PER_FRAME = 18
    CHANNELS = 64
    CHANNELS_LAST = True

    def __init__(self, config: EncoderConfig | None = None) -> None:
        super().__init__()
        config = config or EncoderConfig(kind="nvidia")
        self.features = nn.Sequential(
            nn.Conv2d(3, 24, 5, stride=2), nn.ELU(),
            nn.Conv2d(24, 36, 5, stride=2), nn.ELU(),
            nn.Conv2d(36, 48, 5, stride=2), nn.ELU(),
            nn.Conv2d(48, 64, 3), nn.ELU(),
            nn.Conv2d(64, self.CHANNELS, 3), nn.ELU(),
        )
        with torch.no_grad():
            shape = self.features(torch.zeros(1, *self.FRAME_SHAPE)).shape
        assert tuple(shape[1:]) == (self.CHANNELS, 1, self.TOKENS_PER_FRAME), shape
        projection = nn.Identity() if config.token_dim == self.CHANNELS else nn.Linear(self.CHANNELS, config.token_dim)
        self.to_token = nn.Sequential(MapTokens(), projection, TokenPositions(self.TOKENS_PER_FRAME, config.token_dim))


ENCODERS: dict[str, type[PerFrameEncoder]] = {
    "cnn": FrameEncoder,
    "cnn-grid": GridEncoder,
    "reference": ReferenceEncoder,
    "nvidia": NvidiaEncoder,
}


def make_encoder(config: EncoderConfig) -> nn.Module:
    encoder = ENCODERS[config.kind](config)
    encoder.input_norm = config.input_norm
    return encoder
