"""Pixel-level perturbations, separate from colour schemes (which recolour the scene itself)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class PixelJitterConfig:
    """Per-episode photometric jitter plus per-step sensor noise, all in 0–255 units.

    brightness: additive offset drawn once per episode from U(−b, b).
    contrast:   multiplicative contrast around the frame mean, U(1−c, 1+c) per episode.
    channel_gain: per-channel gain U(1−g, 1+g) per episode (white-balance shift).
    noise_std:  i.i.d. Gaussian pixel noise drawn every step.
    """

    brightness: float = 20.0
    contrast: float = 0.2
    channel_gain: float = 0.1
    noise_std: float = 4.0

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "channel_gain", "noise_std"):
            if getattr(self, name) < 0:
                raise ValueError(f"PixelJitterConfig.{name} must be >= 0, got {getattr(self, name)}")


def jitter_frame(frame: np.ndarray, rng: np.random.Generator, config: PixelJitterConfig,
                 episode_params: tuple[float, float, np.ndarray]) -> np.ndarray:
    """Apply episode-level jitter and fresh pixel noise to a uint8 frame (H, W, 3)."""
    offset, contrast, gain = episode_params
    pixels = frame.astype(np.float32)
    pixels = (pixels - pixels.mean()) * contrast + pixels.mean() + offset
    pixels *= gain
    if config.noise_std > 0:
        pixels += rng.normal(0.0, config.noise_std, size=pixels.shape).astype(np.float32)
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


class PixelJitter(gym.ObservationWrapper):
    """Seeded pixel jitter on observations; the seed of ``reset`` fixes the whole episode's jitter."""

    def __init__(self, env: gym.Env, config: PixelJitterConfig = PixelJitterConfig(), salt: int = 0) -> None:
        super().__init__(env)
        self.config = config
        self.salt = int(salt)
        self._rng = np.random.default_rng([self.salt])
        self._episode_params = self._draw_episode_params()

    def _draw_episode_params(self) -> tuple[float, float, np.ndarray]:
        c = self.config
        return (
            float(self._rng.uniform(-c.brightness, c.brightness)),
            float(self._rng.uniform(1 - c.contrast, 1 + c.contrast)),
            self._rng.uniform(1 - c.channel_gain, 1 + c.channel_gain, size=3).astype(np.float32),
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._rng = np.random.default_rng([self.salt, int(seed)])
        self._episode_params = self._draw_episode_params()
        return super().reset(seed=seed, options=options)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return jitter_frame(observation, self._rng, self.config, self._episode_params)
