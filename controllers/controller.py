"""A controller = per-frame image encoder + uncertainty head, from preprocessed frames to actions."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from controllers.heads import UncertaintyHead
from controllers.nsac import UncertainPrediction
from controllers.objectives import check_targets, frozen_batchnorm_statistics


def head_times(timestamps: torch.Tensor) -> torch.Tensor:
    """Dataset timestamps (seconds, 0 at the newest frame) → head times t = 1 + timestamp."""
    return 1.0 + timestamps


class Controller(nn.Module):
    """frames [B, T, 3, 84, 96] + timestamps [B, T] → (steer, gas, brake) with uncertainty."""

    def __init__(self, encoder: nn.Module, head: UncertaintyHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def training_loss(self, frames: torch.Tensor, timestamps: torch.Tensor, target: torch.Tensor,
                      perturb: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Loss terms; ``perturb`` makes the perturbed frames for heads that need them."""
        if target.dim() != 2:
            check_targets(torch.empty(target.shape[0], 3), target)
        tokens = self.encoder(frames)
        times = head_times(timestamps)
        perturbed = None
        if self.head.uses_perturbed_inputs:
            if perturb is None:
                raise ValueError(f"{type(self.head).__name__} needs a perturbation function for training")
            with frozen_batchnorm_statistics(self.encoder):
                perturbed = self.encoder(perturb(frames))
        return self.head.training_loss(tokens, times, target, perturbed)

    @torch.no_grad()
    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """Tokens [B, T, D]; frames are encoded independently, so tokens can be cached per frame."""
        return self.encoder(frames)

    @torch.no_grad()
    def predict_tokens(self, tokens: torch.Tensor, timestamps: torch.Tensor, samples: int = 20) -> UncertainPrediction:
        """Prediction from tokens made by :meth:`encode` (closed loop reuses the older frames' tokens)."""
        return self.head.predict(tokens, head_times(timestamps), samples)

    @torch.no_grad()
    def predict(self, frames: torch.Tensor, timestamps: torch.Tensor, samples: int = 20) -> UncertainPrediction:
        """Mean, aleatoric and epistemic variance per action; the encoder runs once."""
        return self.predict_tokens(self.encode(frames), timestamps, samples)
