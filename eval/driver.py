"""Drive CarRacing with a trained controller: the closed-loop twin of the training data path.

The agent keeps the last (T−1)·stride + 1 raw frames, picks the T frames ``stride`` steps apart
exactly as :class:`nsacdrive.data_collection.dataset.SequenceDataset` does, runs them through the same
:func:`envs.preprocess_observation` and the same timestamps
(:func:`nsacdrive.data_collection.dataset.sequence_timestamps`), so the network sees in closed loop what
it saw in training (the published pipeline fed 4 frames as channels of one step instead).
Before (T−1)·stride steps have passed, the missing older frames repeat the first frame.

Encoders embed every frame on its own, so the agent encodes only the newest frame each step
and reuses the cached tokens of the older ones (T× less encoder work; identical predictions,
tested against re-encoding the whole sequence). :class:`ControllerPolicy` does this for B
episodes in lockstep, one network call per step for all of them (batched closed-loop
evaluation); :class:`ControllerAgent` is its one-episode :class:`nsacdrive.agents.base.Agent`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nsacdrive.controllers.actions import clip_to_box
from nsacdrive.controllers.prediction import UncertainPrediction
from nsacdrive.controllers.run import load_run
from nsacdrive.data_collection.dataset import sequence_offsets, sequence_timestamps
from nsacdrive.envs.observation_kinds import preprocess_for
from nsacdrive.envs.state import PrivilegedState


def history_indices(newest: int, offsets: np.ndarray) -> list[int]:
    """Positions in a frame history of the T frames the network sees when frame ``newest`` is the
    latest, oldest first (start of episode: the first frame repeated)."""
    return [max(newest + int(offset), 0) for offset in offsets]


@dataclass(frozen=True)
class ControllerInterface:
    """What a driving loop needs to know of a controller besides its predictions."""

    model: str  # the head's name (nsac, gmle, …)
    observation: str  # the observation kind it reads (nsacdrive.envs.observation_kinds), which picks the env
    speed_input: bool  # whether it reads the measured speed
    frames: int  # frames per prediction (the width of a prediction's attention summary)
    camera_fov: float | None = None  # udacity: the front camera it was trained with (degrees)


class ControllerPolicy:
    """A trained controller driving B episodes in lockstep: one encoder and one head call per step.

    Each episode keeps a ring buffer of its last (T−1)·stride + 1 frame tokens; a step encodes
    the newest frame of every listed episode in one batch and gathers each one's T history tokens.
    With ``generators`` (one per listed episode) every episode draws from its own random stream
    (:meth:`nsacdrive.controllers.heads.UncertaintyHead.predict_episodes`).
    """

    def __init__(self, run_dir: str | Path, samples: int | None = None, device: str = "cpu", raw: bool = False) -> None:
        """``samples``: draws per prediction; None uses the model's own ``predict_samples``; ``raw``:
        ignore the run's ``calibration.json``."""
        self.run_dir = Path(run_dir)
        self.model, self.train_config = load_run(self.run_dir, device, raw=raw)
        self.samples = samples if samples is not None else self.train_config.model.predict_samples
        self.device = torch.device(device)
        length, stride = self.train_config.sequence_length, self.train_config.frame_stride
        self.offsets = sequence_offsets(length, stride)
        self.timestamps = torch.from_numpy(sequence_timestamps(length, stride))[None].to(self.device)
        self.history = -int(self.offsets[0]) + 1
        #: set by a lockstep driver: which episodes are still running (None: all), for hooks that record per episode
        self.live: np.ndarray | None = None
        self.reset_episodes(1)

    @property
    def interface(self) -> ControllerInterface:
        model = self.train_config.model
        return ControllerInterface(model.model, model.observation, bool(self.model.speed_input), len(self.offsets), model.camera_fov)

    def reset_episodes(self, episodes: int) -> None:
        """Forget every history and make room for ``episodes`` fresh ones."""
        self.seen = np.zeros(episodes, dtype=np.int64)  # frames seen per episode
        self.ring: torch.Tensor | None = None  # [episodes, history, (M,) P, D] tokens, allocated on first use

    def observe_episodes(self, episodes: Sequence[int], observations: np.ndarray, speeds: np.ndarray | None = None) -> torch.Tensor:
        """Encode each listed episode's newest raw frame (and measured speed) into its history; returns the
        rows' T history tokens in order, [n, T·P, D] (ensembles: [M, n, T·P, D])."""
        rows = np.asarray(episodes, dtype=np.int64)
        newest = torch.from_numpy(preprocess_for(self.train_config.model.observation)(np.asarray(observations)))[:, None].to(self.device)
        speed = None if speeds is None else torch.as_tensor(np.asarray(speeds), dtype=torch.float32, device=self.device)[:, None]
        tokens = self.model.encode(newest, speed)  # [n, P, D]: P tokens of the one new frame (ensembles: [M, n, P, D])
        ensemble = tokens.dim() == 4
        if ensemble:
            tokens = tokens.movedim(0, 1)  # [n, M, P, D]
        if self.ring is None:
            self.ring = torch.zeros(len(self.seen), self.history, *tokens.shape[1:], device=self.device)
        slot = torch.from_numpy(self.seen[rows] % self.history)
        index = torch.from_numpy(rows)
        self.ring[index, slot] = tokens
        self.seen[rows] += 1
        positions = np.maximum(self.seen[rows, None] - 1 + self.offsets[None, :], 0) % self.history  # [n, T]
        history = self.ring[index[:, None], torch.from_numpy(positions)]  # [n, T, (M,) P, D]
        if ensemble:
            history = history.movedim(2, 0)  # [M, n, T, P, D]
        return history.flatten(-3, -2)  # frames' tokens in order, as the encoder lays out a sequence

    def forget_episode(self, episode: int) -> None:
        """Start episode ``episode``'s history afresh: its next frame is its first."""
        self.seen[episode] = 0

    def predict_episodes(self, episodes: Sequence[int], observations: np.ndarray, speeds: np.ndarray | None = None,
                         generators: Sequence[torch.Generator] | None = None) -> UncertainPrediction:
        """Predictions [len(episodes)] from each listed episode's newest raw frame (and measured speed)."""
        history = self.observe_episodes(episodes, observations, speeds)
        times = self.timestamps.expand(len(episodes), -1)
        prediction = self.model.predict_tokens(history, times, samples=self.samples, generators=generators)
        return prediction if self.device.type == "cpu" else prediction.to("cpu")  # driving loops read numpy


class ControllerAgent(ControllerPolicy):
    """An :class:`nsacdrive.agents.base.Agent` (one episode) that acts with the predictive mean of a trained controller."""

    source = "controller"
    needs_pixels = True

    def __init__(self, run_dir: str | Path, samples: int | None = None, device: str = "cpu", raw: bool = False) -> None:
        """``samples``: draws per prediction; None uses the model's own ``predict_samples``; ``raw``: see :class:`ControllerPolicy`."""
        super().__init__(run_dir, samples, device, raw)
        self.frames: deque[np.ndarray] = deque(maxlen=self.history)
        self.agent_id = f"controller:{self.run_dir.name}"
        self.last_prediction: UncertainPrediction | None = None
        self.generator: torch.Generator | None = None  # None: draws come from torch's global stream

    def seed(self, seed: int) -> None:
        """Draw this agent's samples from a stream of its own (kept across :meth:`reset`), so an episode's
        actions depend on its seed, not on what the process ran before it."""
        self.generator = torch.Generator().manual_seed(seed)

    def reset(self) -> None:
        self.reset_episodes(1)
        self.frames.clear()
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
        speeds = None if speed is None else np.array([speed], dtype=np.float32)
        generators = None if self.generator is None else [self.generator]
        self.last_prediction = self.predict_episodes([0], self.frames[-1][None], speeds, generators)
        return self.last_prediction

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        prediction = self.predict(observation, state.pose.forward_speed if self.model.speed_input else None)
        return clip_to_box(prediction.mean[0]).cpu().numpy().astype(np.float32)
