"""Drive CarRacing with a trained controller: the closed-loop twin of the training data path.

The agent keeps the last (T−1)·stride + 1 raw frames, picks the T frames ``stride`` steps apart
exactly as :class:`data_collection.dataset.SequenceDataset` does, runs them through the same
:func:`envs.preprocess_observation` and the same timestamps
(:func:`data_collection.dataset.sequence_timestamps`), so the network sees in closed loop what
it saw in training (the published pipeline fed 4 frames as channels of one step instead).
Before (T−1)·stride steps have passed, the missing older frames repeat the first frame.

Encoders embed every frame on its own, so the agent encodes only the newest frame each step
and reuses the cached tokens of the older ones (T× less encoder work; identical predictions,
tested against re-encoding the whole sequence).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from controllers.actions import clip_to_box
from controllers.nsac import UncertainPrediction
from controllers.training import load_run
from data_collection.dataset import sequence_offsets, sequence_timestamps
from envs.observation import preprocess_observation
from envs.state import PrivilegedState


def history_indices(newest: int, offsets: np.ndarray) -> list[int]:
    """Positions in a frame history of the T frames the network sees when frame ``newest`` is the
    latest, oldest first (start of episode: the first frame repeated)."""
    return [max(newest + int(offset), 0) for offset in offsets]


class ControllerAgent:
    """An :class:`agents.base.Agent` that acts with the predictive mean of a trained controller."""

    source = "controller"
    needs_pixels = True

    def __init__(self, run_dir: str | Path, samples: int | None = None, device: str = "cpu") -> None:
        """``samples``: draws per prediction; None uses the model's own ``predict_samples``."""
        self.run_dir = Path(run_dir)
        self.model, self.train_config = load_run(self.run_dir, device)
        self.samples = samples if samples is not None else self.train_config.model.predict_samples
        self.device = torch.device(device)
        length, stride = self.train_config.sequence_length, self.train_config.frame_stride
        self.offsets = sequence_offsets(length, stride)
        self.timestamps = torch.from_numpy(sequence_timestamps(length, stride))[None].to(self.device)
        self.frames: deque[np.ndarray] = deque(maxlen=-int(self.offsets[0]) + 1)
        self.tokens: deque[torch.Tensor] = deque(maxlen=self.frames.maxlen)
        self.agent_id = f"controller:{self.run_dir.name}"
        self.last_prediction: UncertainPrediction | None = None

    def reset(self) -> None:
        self.frames.clear()
        self.tokens.clear()
        self.last_prediction = None

    def config(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "run_dir": str(self.run_dir), "samples": self.samples,
                "model": self.train_config.model.model}

    def history_indices(self) -> list[int]:
        """Positions in the frame history of the T frames the network sees now (:func:`history_indices`)."""
        return history_indices(len(self.frames) - 1, self.offsets)

    def sequence(self) -> np.ndarray:
        """The T raw frames the network sees now, oldest first."""
        return np.stack([self.frames[i] for i in self.history_indices()])

    def predict(self, observation: np.ndarray, speed: float | None = None) -> UncertainPrediction:
        """Predict from the newest frame (and, for controllers with ``speed_input``, the measured speed)."""
        self.frames.append(np.asarray(observation))
        newest = torch.from_numpy(preprocess_observation(self.frames[-1][None]))[None].to(self.device)
        speeds = None if speed is None else torch.full((1, 1), float(speed), device=self.device)
        self.tokens.append(self.model.encode(newest, speeds))
        tokens = torch.cat([self.tokens[i] for i in self.history_indices()], dim=-2)
        self.last_prediction = self.model.predict_tokens(tokens, self.timestamps, samples=self.samples)
        return self.last_prediction

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        prediction = self.predict(observation, state.pose.forward_speed if self.model.speed_input else None)
        return clip_to_box(prediction.mean[0]).cpu().numpy().astype(np.float32)
