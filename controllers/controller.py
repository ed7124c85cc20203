"""A controller = per-frame image encoder + uncertainty head, from preprocessed frames to actions.

Optionally (``speed_input``) each frame's token also carries the car's measured forward speed
at that frame — the speedometer a real car has and CarRacing's HUD shows (the HUD is cropped
from the frames, see :func:`envs.preprocess_observation`). Without it the pedals must be
inferred from frame-to-frame motion alone, and closed-loop speed control is where behaviour
cloning fails (docs/engineering-notes.md, *Closed-loop results*): speed is what the conditional imitation
learning line of work (Codevilla et al. 2018) feeds beside the camera for the same reason.

Encoders may emit several tokens per frame (``TOKENS_PER_FRAME`` K, frame-major: the NVIDIA
encoder's 18 image columns). The heads see every token with its frame's time and speed
(repeated K times), and an attention map per token is summed back to one weight per frame, so
callers keep passing timestamps and speeds [B, T] and reading attention [B, T].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from nsacdrive.controllers.calibration import Calibration, calibrated
from nsacdrive.controllers.density import ConvStatistics, FeatureDensity, check_density_source
from nsacdrive.controllers.heads import UncertaintyHead
from nsacdrive.controllers.objectives import check_targets, frozen_batchnorm_statistics
from nsacdrive.controllers.prediction import UncertainPrediction
from nsacdrive.controllers.robust_augment import Anchor, consistency_loss


def head_times(timestamps: torch.Tensor) -> torch.Tensor:
    """Dataset timestamps (seconds, 0 at the newest frame) → head times t = 1 + timestamp."""
    return 1.0 + timestamps


#: Speeds are divided by this (world units/s) before their embedding: CarRacing speeds are 0–~140.
SPEED_SCALE = 100.0


class Controller(nn.Module):
    """frames [B, T, C, H, W] (the encoder's ``FRAME_SHAPE``) + timestamps [B, T] (+ speeds [B, T]) →
    (steer, gas, brake) with uncertainty."""

    def __init__(self, encoder: nn.Module, head: UncertaintyHead, token_dim: int | None = None, speed_input: bool = False) -> None:
        super().__init__()
        if speed_input and token_dim is None:
            raise ValueError("speed_input needs the encoder's token_dim")
        self.encoder = encoder
        self.head = head
        self.calibration: Calibration | None = None  # set by load_run from RUN/calibration.json; applied to every prediction
        #: scores every prediction; set by nsacdrive.controllers.density.attach_density (load_run: RUN/density.safetensors)
        self.density: FeatureDensity | None = None
        #: set for a "tokens+conv" density: :meth:`encode` then appends each frame's convolution statistics to its tokens
        self.conv_statistics: ConvStatistics | None = None
        self.tokens_per_frame = int(getattr(encoder, "TOKENS_PER_FRAME", 1))  # encoders that declare none emit one
        self.speed_embedding = nn.Linear(1, token_dim) if speed_input else None

    @property
    def speed_input(self) -> bool:
        return self.speed_embedding is not None

    def tokens(self, frames: torch.Tensor, speed: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens [B, T·K, D] (K per frame; with gradients): each frame encoded on its own, plus its speed embedding."""
        tokens = self.encoder(frames)
        if self.speed_embedding is None:
            return tokens
        frames_shape = (tokens.shape[0], tokens.shape[1] // self.tokens_per_frame)
        if speed is None or tuple(speed.shape) != frames_shape:
            got = None if speed is None else tuple(speed.shape)
            raise ValueError(f"this controller reads the measured speed: pass speed of shape {frames_shape} (one per frame), got {got}")
        return tokens + self.speed_embedding((self._per_token(speed).to(tokens) / SPEED_SCALE)[..., None])

    def _per_token(self, per_frame: torch.Tensor) -> torch.Tensor:
        """[B, T] → [B, T·K]: each frame's value for each of its K tokens."""
        return per_frame if self.tokens_per_frame == 1 else per_frame.repeat_interleave(self.tokens_per_frame, dim=1)

    @property
    def density_source(self) -> str:
        """What :meth:`encode` emits: "tokens", or "tokens+conv" (tokens and convolution statistics)."""
        return "tokens" if self.conv_statistics is None else "tokens+conv"

    def use_density_source(self, source: str) -> None:
        """Make :meth:`encode` emit what a density over ``source`` reads (``DENSITY_SOURCES``)."""
        check_density_source(source)
        self.conv_statistics = ConvStatistics(self.encoder) if source == "tokens+conv" else None

    def density_features(self, encoded: torch.Tensor) -> torch.Tensor:
        """:meth:`encode`'s output [B, T·K, D (+ P)] → the newest frame's K rows averaged, [B, D (+ P)]
        (:mod:`nsacdrive.controllers.density`)."""
        return encoded[:, -self.tokens_per_frame:].mean(1)

    def token_times(self, timestamps: torch.Tensor) -> torch.Tensor:
        """Head times [B, T·K] of the tokens from the frames' timestamps [B, T] (:func:`head_times`)."""
        return self._per_token(head_times(timestamps))

    def training_loss(self, frames: torch.Tensor, timestamps: torch.Tensor, target: torch.Tensor,
                      perturb: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      speed: torch.Tensor | None = None, anchor: Anchor | None = None) -> dict[str, torch.Tensor]:
        """Loss terms; ``perturb`` makes the perturbed twins of the batch's first sequences for heads that
        need them (all of them, or fewer: :func:`nsacdrive.controllers.ood_proxies.make_perturbation`; speeds stay);
        ``anchor``, the clean views of augmented ``frames``, adds their token ``consistency`` (weighted into ``total``)."""
        if target.dim() != 2:
            check_targets(torch.empty(target.shape[0], 3), target)
        tokens = self.tokens(frames, speed)
        times = self.token_times(timestamps)
        perturbed = None
        if self.head.uses_perturbed_inputs:
            if perturb is None:
                raise ValueError(f"{type(self.head).__name__} needs a perturbation function for training")
            with frozen_batchnorm_statistics(self.encoder):
                twins = perturb(frames)
                perturbed = self.tokens(twins, None if speed is None else speed[:twins.shape[0]])
        terms = self.head.training_loss(tokens, times, target, perturbed)
        if anchor is None:
            return terms
        with torch.no_grad(), frozen_batchnorm_statistics(self.encoder):
            clean = self.tokens(anchor.frames, speed)
        consistency = consistency_loss(tokens, clean, anchor.keep)
        return {**terms, "total": terms["total"] + anchor.weight * consistency, "consistency": consistency.detach()}

    @torch.no_grad()
    def encode(self, frames: torch.Tensor, speed: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens [B, T·K, D]; frames are encoded independently, so tokens can be cached per frame.

        With ``density_source`` "tokens+conv" each token carries its frame's P convolution
        statistics after its D channels, [B, T·K, D + P] (:class:`nsacdrive.controllers.density.ConvStatistics`);
        :meth:`predict_tokens` hands the head the first D."""
        statistics = self.conv_statistics
        if statistics is None:
            return self.tokens(frames, speed)
        with statistics:
            tokens = self.tokens(frames, speed)
        per_frame = statistics.values().unflatten(0, frames.shape[:2]).to(tokens)  # [B, T, P]
        return torch.cat([tokens, self._per_token(per_frame)], -1)

    def _head_tokens(self, encoded: torch.Tensor) -> torch.Tensor:
        """The tokens of :meth:`encode`'s output, without the statistics it may carry."""
        if self.conv_statistics is None:
            return encoded
        return encoded[..., :encoded.shape[-1] - self.conv_statistics.width]

    @torch.no_grad()
    def predict_tokens(self, tokens: torch.Tensor, timestamps: torch.Tensor, samples: int = 20,
                       generators: Sequence[torch.Generator] | None = None) -> UncertainPrediction:
        """Prediction from tokens made by :meth:`encode` (closed loop reuses the older frames' tokens).

        ``generators``: one per batch row when the rows are independent episodes
        (:meth:`nsacdrive.controllers.heads.UncertaintyHead.predict_episodes`); None draws from the global RNG."""
        times = self.token_times(timestamps)
        head_tokens = self._head_tokens(tokens)
        if generators is None:
            prediction = self.head.predict(head_tokens, times, samples)
        else:
            prediction = self.head.predict_episodes(head_tokens, times, samples, generators)
        if prediction.attention is not None and self.tokens_per_frame > 1:  # per token → per frame
            prediction.attention = prediction.attention.unflatten(1, (-1, self.tokens_per_frame)).sum(-1)
        if self.density is not None:
            prediction.density = self.density.score(self.density_features(tokens))
        return calibrated(self.calibration, prediction)

    @torch.no_grad()
    def predict(self, frames: torch.Tensor, timestamps: torch.Tensor, samples: int = 20,
                speed: torch.Tensor | None = None) -> UncertainPrediction:
        """Mean, aleatoric and epistemic variance per action; the encoder runs once."""
        return self.predict_tokens(self.encode(frames, speed), timestamps, samples)
