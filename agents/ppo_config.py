"""What defines a PPO expert's training (:class:`PPOConfig`, stored as ``config.json``) and its two
recipes: PPO on the privileged state (the shipped one) and rl-baselines3-zoo's from pixels."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from nsacdrive.common.config_checks import AT_LEAST_ONE, NON_NEGATIVE, check_ranges
from nsacdrive.common.devices import check_device_name
from nsacdrive.envs.car_racing import MAX_EPISODE_STEPS
from nsacdrive.envs.state import STATE_FIELD_SETS

OBS_KINDS = ("state", "pixels")
ACTIVATIONS = ("tanh", "relu", "gelu")


#: the numbers PPOConfig's numeric fields may take (``eval_freq`` 0: no evaluation)
PPO_RANGES = {**dict.fromkeys(("timesteps", "n_envs", "eval_episodes", "max_episode_steps", "n_steps", "batch_size", "n_epochs",
                               "frame_stack", "frame_skip"), AT_LEAST_ONE),
              **dict.fromkeys(("eval_freq", "off_road_penalty", "centre_penalty", "missed_tile_penalty", "action_change_penalty",
                                "action_change_warmup", "action_noise"),
                             NON_NEGATIVE)}


@dataclass(frozen=True)
class PPOConfig:
    """Everything that defines a PPO training run; stored as ``config.json`` beside the model."""

    obs: str = "state"
    timesteps: int = 1_000_000
    n_envs: int = 2
    seed: int = 0
    eval_freq: int = 25_000  # env steps between evaluations (0 = no evaluation)
    eval_episodes: int = 5
    max_episode_steps: int = MAX_EPISODE_STEPS
    n_steps: int = 512
    batch_size: int = 128
    n_epochs: int = 10
    gamma: float = 0.99
    gae_lambda: float = 0.95
    learning_rate: float = 3e-4
    linear_lr: bool = False  # decay the learning rate linearly to 0
    ent_coef: float = 0.0
    clip_range: float = 0.2
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    net_arch: list[int] = field(default_factory=lambda: [256, 256])
    log_std_init: float = -1.0
    activation: str = "tanh"  # tanh | relu | gelu
    ortho_init: bool = True
    use_sde: bool = False
    sde_sample_freq: int = -1
    norm_obs: bool = True
    norm_reward: bool = True
    frame_stack: int = 1
    frame_skip: int = 1
    pedal_action: bool = False  # state: one signed pedal axis (PedalAction)
    state_fields: str = "all"  # state: which privileged fields the policy reads (envs.state.STATE_FIELD_SETS)
    off_road_patience: int = 0  # state, training envs only: end after this many decisions off the road (0 = never)
    off_road_penalty: float = 0.0  # ... with this subtracted from the reward
    centre_penalty: float = 0.0  # state, training envs only: minus this × |lateral error| per decision
    missed_tile_penalty: float = 0.0  # state, training envs only: minus this for each tile driven past untouched
    action_change_penalty: float = 0.0  # state, training envs only: minus this × |Δ action| (L1) per decision
    action_change_warmup: int = 0  # decisions over which that penalty ramps linearly from 0 to full (0: full from the start)
    action_noise: float = 0.0  # state, training envs only: std of Gaussian noise on each physics step's steer and pedal
    device: str = "cpu"  # where the policy's updates run: cpu, cuda, cuda:N or auto (CUDA when present)
    progress_bar: bool = True

    def __post_init__(self) -> None:
        if self.obs not in OBS_KINDS:
            raise ValueError(f"obs must be one of {OBS_KINDS}, got {self.obs!r}")
        check_ranges(self, "PPO config", PPO_RANGES)
        check_device_name(self.device, "PPO config device")
        if self.state_fields not in STATE_FIELD_SETS:
            raise ValueError(f"state_fields must be one of {', '.join(STATE_FIELD_SETS)}, got {self.state_fields!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        object.__setattr__(self, "net_arch", [int(n) for n in self.net_arch])  # JSON may give floats

    @classmethod
    def state_recipe(cls, **overrides: Any) -> PPOConfig:
        """PPO on the privileged state: pedal axis, decisions held 2 steps, a long discount, small initial
        exploration, an annealed learning rate and, in training envs only, off-road termination and
        penalties for leaving the centreline, for driving past a tile untouched and for changing
        the action (smooth labels are what a student can imitate), the last ramped in over the
        first 300k decisions (early exploration is not charged for jitter); best/ by laps. The
        policy reads only the camera-visible fields: a teacher whose labels hang on what its
        student cannot see (wheel slip, the road beyond the frame) teaches it to leave the road."""
        recipe: dict[str, Any] = dict(obs="state", timesteps=600_000, frame_skip=2, pedal_action=True, off_road_patience=13,
                                      off_road_penalty=20.0, centre_penalty=0.1, missed_tile_penalty=25.0,
                                      action_change_penalty=3.0, action_change_warmup=300_000, n_steps=1024,
                                      batch_size=256, gamma=0.995, log_std_init=-1.5, linear_lr=True, eval_freq=50_000,
                                      eval_episodes=50, state_fields="camera")
        recipe.update(overrides)
        return cls(**recipe)

    @classmethod
    def pixels_recipe(cls, **overrides: Any) -> PPOConfig:
        """rl-baselines3-zoo's CarRacing-v3 PPO hyperparameters, updates on CUDA when present (hours of CPU)."""
        recipe: dict[str, Any] = dict(
            obs="pixels", timesteps=4_000_000, n_envs=8, n_steps=512, batch_size=128, n_epochs=10,
            gamma=0.99, gae_lambda=0.95, learning_rate=1e-4, linear_lr=True, ent_coef=0.0, clip_range=0.2,
            net_arch=[256], log_std_init=-2.0, activation="gelu", ortho_init=False, use_sde=True,
            sde_sample_freq=4, norm_obs=False, norm_reward=True, frame_stack=2, frame_skip=2, device="auto",
        )
        recipe.update(overrides)
        return cls(**recipe)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PPOConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
