"""``--fallback cascade:RUN``: a second, more robust controller that drives while the alarm lasts.

It runs on demand, not all the time: every step it keeps each episode's last few raw frames (and
speeds), which costs no network call; when an episode's fallback engages, it encodes the frames it
missed into that episode's history (at most the history's length less one) and from then on
encodes one frame and predicts once per step, until the fallback hands the car back. Its compute
is therefore the steps under the fallback plus a short replay per engagement
(:func:`nsacdrive.eval.cascade_cost.cascade_share`), against one encoding and one prediction per step when run all the time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from nsacdrive.common.seeds import derive_seed
from nsacdrive.controllers.actions import clip_to_box
from nsacdrive.eval.configs import EpisodeKey
from nsacdrive.eval.driver import ControllerInterface, ControllerPolicy

#: salt of the cascade's random streams, so its draws are not the main controller's
CASCADE_STREAM = 7


class Cascade:
    """The second controller of a lockstep group: one history per episode, filled on engagement."""

    def __init__(self, run: str, keys: Sequence[EpisodeKey], interface: ControllerInterface, samples: int | None = None,
                 device: str = "cpu", raw: bool = False) -> None:
        self.policy = ControllerPolicy(run, samples=samples, device=device, raw=raw)
        own = self.policy.interface
        if (own.observation, own.camera_fov) != (interface.observation, interface.camera_fov):
            raise ValueError(f"fallback cascade:{run}: it sees {own.observation} frames (camera fov {own.camera_fov}), the "
                             f"controller it backs up {interface.observation} (camera fov {interface.camera_fov}): give a run "
                             "trained on the same camera")
        self.policy.reset_episodes(len(keys))
        self.recent = [deque(maxlen=self.policy.history) for _ in keys]  # (frame, speed), newest last
        self.engaged = np.zeros(len(keys), dtype=bool)
        self.generators = [torch.Generator().manual_seed(derive_seed(key.track_seed, key.repeat, CASCADE_STREAM)) for key in keys]

    def see(self, episode: int, frame: np.ndarray, speed: float) -> None:
        """The frame (and speed) episode ``episode`` acts on at this step."""
        self.recent[episode].append((frame, speed))

    def act(self, episodes: Sequence[int]) -> dict[int, np.ndarray]:
        """The cascade's actions (clipped predictive means) for the listed episodes, on their newest frames;
        the others are disengaged, so a later engagement starts from their recent frames again."""
        wanted = np.zeros(len(self.engaged), dtype=bool)
        wanted[list(episodes)] = True
        self.engaged &= wanted
        speeds = self.policy.interface.speed_input
        for episode in np.flatnonzero(wanted & ~self.engaged):  # newly engaged: the frames it missed, oldest first
            self.policy.forget_episode(int(episode))
            for frame, speed in list(self.recent[episode])[:-1]:
                self.policy.observe_episodes([int(episode)], frame[None], np.array([speed], np.float32) if speeds else None)
        self.engaged |= wanted
        if not len(episodes):
            return {}
        frames = np.stack([self.recent[e][-1][0] for e in episodes])
        speed = np.array([self.recent[e][-1][1] for e in episodes], np.float32) if speeds else None
        prediction = self.policy.predict_episodes(list(episodes), frames, speed, [self.generators[e] for e in episodes])
        actions = clip_to_box(prediction.mean).numpy().astype(np.float32)
        return dict(zip(episodes, actions))
