"""The PPO expert's envs: what the policy observes and does, and how training envs differ.

- State envs: render-free CarRacing whose observation is the privileged state vector, read once
  per decision (:class:`PrivilegedStateObservation` above :class:`FrameSkip`).
- Pixel envs: rl-baselines3-zoo's 64×64 grey frames with frame skip.
- :class:`PedalAction`: one signed pedal axis instead of gas and brake.
- Training envs only: :class:`OffRoadTermination`, :class:`CentrePenalty`,
  :class:`MissedTilePenalty` and :class:`ActionChangePenalty` shape the reward, and
  :class:`ActionNoise` perturbs the executed action; evaluation envs
  add :class:`LapSuccess` so SB3's evaluations count laps. The score itself is never shaped.
"""

from __future__ import annotations

import cv2
import gymnasium as gym
import numpy as np

from nsacdrive.agents.rollout import apply_action_noise, pedal_to_car_action
from nsacdrive.envs.car_racing import MAX_EPISODE_STEPS, make_car_racing
from nsacdrive.envs.state import STATE_FIELDS, privileged_state, state_columns

PIXEL_SIZE = 64
LATERAL, PROGRESS = STATE_FIELDS.index("lateral_error"), STATE_FIELDS.index("progress_fraction")


class PrivilegedStateObservation(gym.ObservationWrapper):
    """Replace the (render-free, all-zero) frame by the privileged state vector."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(len(STATE_FIELDS),), dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return privileged_state(self.env).as_vector()


class StateFields(gym.ObservationWrapper):
    """Keep only the state fields of a named set (:data:`nsacdrive.envs.state.STATE_FIELD_SETS`). It sits
    above the shaping wrappers, which read the whole vector."""

    def __init__(self, env: gym.Env, field_set: str) -> None:
        super().__init__(env)
        self.columns = state_columns(field_set)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(len(self.columns),), dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.columns]


def pixel_frame(observation: np.ndarray) -> np.ndarray:
    """96×96×3 RGB → 64×64×1 uint8 grey (the zoo's ResizeObservation + GrayscaleObservation)."""
    grey = cv2.cvtColor(np.ascontiguousarray(observation), cv2.COLOR_RGB2GRAY)
    return cv2.resize(grey, (PIXEL_SIZE, PIXEL_SIZE), interpolation=cv2.INTER_AREA)[:, :, None]


class PixelObservation(gym.ObservationWrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, shape=(PIXEL_SIZE, PIXEL_SIZE, 1), dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return pixel_frame(observation)


class FrameSkip(gym.Wrapper):
    """Repeat each action ``skip`` times and sum the rewards (rl_zoo3.wrappers.FrameSkip)."""

    def __init__(self, env: gym.Env, skip: int = 2) -> None:
        super().__init__(env)
        self.skip = skip

    def step(self, action):
        total = 0.0
        for _ in range(self.skip):
            observation, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return observation, total, terminated, truncated, info


class PedalAction(gym.ActionWrapper):
    """Policy actions (steer, pedal) ∈ [−1, 1]² → CarRacing's (steer, gas = max(pedal, 0), brake = max(−pedal, 0))."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def action(self, action: np.ndarray) -> np.ndarray:
        return pedal_to_car_action(action)


class OffRoadTermination(gym.Wrapper):
    """End a training episode after ``patience`` consecutive decisions off the road (|lateral error| >
    half the road width), adding ``penalty`` to that step's reward. Observations are state vectors."""

    def __init__(self, env: gym.Env, patience: int, penalty: float) -> None:
        super().__init__(env)
        self.patience, self.penalty, self.off_road = patience, penalty, 0

    def reset(self, **kwargs):
        self.off_road = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        off = abs(float(observation[LATERAL])) > self.env.unwrapped.geometry.half_width
        self.off_road = self.off_road + 1 if off else 0
        if self.off_road >= self.patience and not (terminated or truncated):
            terminated, reward = True, float(reward) - self.penalty
            info = {**info, "off_road_termination": True}
        return observation, reward, terminated, truncated, info


class CentrePenalty(gym.Wrapper):
    """Subtract ``coef`` × |lateral error| from each decision's reward. CarRacing ends a lap only
    once every tile is touched, so a car that cuts corners misses tiles and drives on to the time
    limit; a teacher off the centreline also teaches its student to be. Training envs only;
    observations are state vectors."""

    def __init__(self, env: gym.Env, coef: float) -> None:
        super().__init__(env)
        self.coef = coef

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, float(reward) - self.coef * abs(float(observation[LATERAL])), terminated, truncated, info


class MissedTilePenalty(gym.Wrapper):
    """Subtract ``penalty`` for each road tile the car has driven past without touching it.
    CarRacing ends a lap only once every tile is touched, so one tile missed by cutting a corner
    costs the lap. Training envs only; observations are state vectors."""

    LAG = 3  # tiles behind the car before an untouched one counts as missed (contact may come late)

    def __init__(self, env: gym.Env, penalty: float) -> None:
        super().__init__(env)
        self.penalty, self.checked = penalty, 1

    def reset(self, **kwargs):
        self.checked = 1  # tiles before this one are judged; the car starts on tile 0
        return self.env.reset(**kwargs)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        road = self.env.unwrapped.road
        here = int(float(observation[PROGRESS]) * len(road))  # tiles are about equally long
        missed = 0
        while 0 < here - self.LAG - self.checked < len(road) // 2:  # never across the start line
            missed += not road[self.checked].road_visited
            self.checked += 1
        return observation, float(reward) - self.penalty * missed, terminated, truncated, info


class ActionNoise(gym.ActionWrapper):
    """Gaussian noise of std ``sigma`` on the steer and signed pedal of every physics step's car
    action, as ``collect --noise`` adds it: a policy trained through it has to recover from what
    it did not intend. Its own random stream, seeded by ``reset(seed=...)``, leaves the tracks
    alone. Training envs only."""

    def __init__(self, env: gym.Env, sigma: float) -> None:
        super().__init__(env)
        self.sigma, self.rng = sigma, np.random.default_rng(0)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng([seed, 1])
        return self.env.reset(seed=seed, options=options)

    def action(self, action: np.ndarray) -> np.ndarray:
        return apply_action_noise(np.asarray(action, dtype=np.float32), self.rng, self.sigma)


class ActionChangePenalty(gym.Wrapper):
    """Subtract ``coef`` × the L1 change of the policy's action from each decision's reward: a
    teacher whose labels jitter is hard to imitate. Training envs only. Training may scale the
    penalty (:meth:`scale_action_change_penalty`, a ramp from 0 while the policy learns to drive)."""

    def __init__(self, env: gym.Env, coef: float) -> None:
        super().__init__(env)
        self.coef = coef
        self.scale = 1.0
        self.previous = None

    def scale_action_change_penalty(self, scale: float) -> None:
        """Charge ``scale`` (clipped to [0, 1]) of the penalty from now on."""
        self.scale = min(max(scale, 0.0), 1.0)

    def reset(self, **kwargs):
        self.previous = None
        return self.env.reset(**kwargs)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        if self.previous is not None:
            reward = float(reward) - self.scale * self.coef * float(np.abs(action - self.previous).sum())
        self.previous = action
        return observation, reward, terminated, truncated, info


class LapSuccess(gym.Wrapper):
    """Mark each finished episode's info with ``is_success`` (the lap was finished), which SB3's
    EvalCallback counts: evaluation envs only."""

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = {**info, "is_success": bool(info.get("lap_finished", False))}
        return observation, reward, terminated, truncated, info


def make_state_env(seed: int | None = None, max_episode_steps: int = MAX_EPISODE_STEPS, frame_skip: int = 1,
                   pedal_action: bool = False, off_road_patience: int = 0, off_road_penalty: float = 0.0,
                   centre_penalty: float = 0.0, missed_tile_penalty: float = 0.0, action_change_penalty: float = 0.0,
                   action_noise: float = 0.0, state_fields: str = "all") -> gym.Env:
    """Render-free CarRacing whose observations are privileged state vectors (options: see :class:`PPOConfig`)."""
    env: gym.Env = make_car_racing(render_observations=False, max_episode_steps=max_episode_steps)
    if action_noise > 0:  # below the frame skip: fresh noise at every physics step, as in collect
        env = ActionNoise(env, action_noise)
    if frame_skip > 1:  # below the observation: the state is computed once per decision, not per physics step
        env = FrameSkip(env, frame_skip)
    env = PrivilegedStateObservation(env)
    if off_road_patience > 0:
        env = OffRoadTermination(env, off_road_patience, off_road_penalty)
    if centre_penalty > 0:
        env = CentrePenalty(env, centre_penalty)
    if missed_tile_penalty > 0:
        env = MissedTilePenalty(env, missed_tile_penalty)
    if action_change_penalty > 0:  # on the policy's own actions, before PedalAction maps them
        env = ActionChangePenalty(env, action_change_penalty)
    if state_fields != "all":
        env = StateFields(env, state_fields)
    if pedal_action:
        env = PedalAction(env)
    if seed is not None:
        env.reset(seed=seed)
    return env


def make_pixel_env(seed: int | None = None, max_episode_steps: int = MAX_EPISODE_STEPS, frame_skip: int = 2) -> gym.Env:
    """The zoo's pixel env (before VecFrameStack): fast renderer, frame skip, 64×64 grey."""
    env = PixelObservation(FrameSkip(make_car_racing(max_episode_steps=max_episode_steps, renderer="fast"), frame_skip))
    if seed is not None:
        env.reset(seed=seed)
    return env
