"""CarRacing-v3 with explicit colour schemes, track geometry and an optional render-free mode.

Track-preserving colour recipe (docs/driving.md#track-preserving-colours): gymnasium draws random colours
from the same generator as the track, so ``domain_randomize=True`` changes the track of a seed.
This env is constructed with ``domain_randomize=True`` so the stock code accepts our colours,
sets road/background/grass itself and resets with ``options={"randomize": False}``: the track of
seed ``s`` is exactly the default env's track of seed ``s``, only the paint differs.

Renderers for the 96×96 state frame: ``"stock"`` is gymnasium's pure-Python pygame drawing
on a 1000×800 canvas; ``"fast"`` (:mod:`nsacdrive.envs.fast_render`) draws the same scene with numpy and
OpenCV on a small supersampled canvas, an order of magnitude faster at a mean pixel
difference well under 1/255 (``make bench``). ``human`` and ``rgb_array`` renders always use the
stock code.

Render-free mode (``render_observations=False``) skips state-frame drawing on ``step``
altogether (physics speed). Observations are then an all-zero frame;
:meth:`NsacCarRacing.render_observation` draws the real frame on demand.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.box2d.car_racing import CarRacing

from nsacdrive.envs.colours import DEFAULT_SCHEME, ColourScheme, resolve_colour_scheme, validate_preset
from nsacdrive.envs.fast_render import FastStateRenderer
from nsacdrive.envs.geometry import TrackGeometry

ENV_ID = "nsacdrive/CarRacing-v3"
MAX_EPISODE_STEPS = 1000
FPS = 50
INTRO_STEPS = 50  # zoom-in animation at the start of every episode (docs/driving.md#carracing-facts)
RENDERERS = ("stock", "fast")


class NsacCarRacing(CarRacing):
    """Stock CarRacing-v3 physics and rendering, with per-episode colour schemes and geometry.

    Every episode has a known integer ``track_seed`` (drawn from a seeded stream when
    ``reset`` gets no seed), so any episode can be regenerated exactly.
    """

    def __init__(
        self,
        render_mode: str | None = None,
        colour_preset: str = "default",
        render_observations: bool = True,
        renderer: str = "stock",
        lap_complete_percent: float = 0.95,
        continuous: bool = True,
    ) -> None:
        if renderer not in RENDERERS:
            raise ValueError(f"renderer must be one of {RENDERERS}, got {renderer!r}")
        super().__init__(
            render_mode=render_mode,
            lap_complete_percent=lap_complete_percent,
            domain_randomize=True,  # lets us set colours ourselves; see module docstring
            continuous=continuous,
        )
        self.colour_preset = validate_preset(colour_preset)
        self.render_observations = bool(render_observations)
        self.renderer = renderer
        self._fast_renderer = FastStateRenderer() if renderer == "fast" else None
        self.colour_scheme: ColourScheme = DEFAULT_SCHEME
        self.track_seed: int | None = None
        self.geometry: TrackGeometry | None = None
        self._seed_stream: np.random.Generator | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset onto the track of ``seed`` painted with the preset's scheme.

        ``options`` may hold ``colour_preset`` (overrides the constructor's for this episode)
        or ``colour_scheme`` (an explicit :class:`ColourScheme`).
        """
        options = dict(options or {})
        if seed is None:
            if self._seed_stream is None:
                self._seed_stream = np.random.default_rng()
            seed = int(self._seed_stream.integers(0, 2**31 - 1))
        else:
            self._seed_stream = np.random.default_rng(seed)
            self._seed_stream.integers(0, 2**31 - 1)  # next unseeded reset gets a fresh track
        scheme = options.pop("colour_scheme", None)
        if scheme is None:
            scheme = resolve_colour_scheme(options.pop("colour_preset", self.colour_preset), seed)
        if not isinstance(scheme, ColourScheme):
            raise TypeError(f"options['colour_scheme'] must be a ColourScheme, got {type(scheme).__name__}")
        self.colour_scheme = scheme
        self.track_seed = int(seed)
        self.road_color = np.array(scheme.road, dtype=np.float64)
        self.bg_color = np.array(scheme.background, dtype=np.float64)
        self.grass_color = np.array(scheme.grass, dtype=np.float64)
        options["randomize"] = False
        observation, info = super().reset(seed=int(seed), options=options)
        self._share_tile_colours()
        self.geometry = TrackGeometry.from_env_track(self.track)
        info = dict(info)
        info.update(track_seed=self.track_seed, colour_scheme=scheme.to_dict(), n_tiles=len(self.track))
        return observation, info

    def close(self) -> None:
        if self._fast_renderer is not None:
            self._fast_renderer.release()
        super().close()

    def _share_tile_colours(self) -> None:
        """Make every road tile's colour a row of one array, ``tile_colours`` (n_tiles, 3).

        The stock contact listener repaints a touched tile in place (``tile.color[:] = road_color``);
        with the rows shared, a renderer sees every repaint with one array comparison instead of
        reading hundreds of tile objects each frame. Values and drawing order are unchanged.
        """
        self.tile_colours = np.array([tile.color for tile in self.road], dtype=np.float64).reshape(-1, 3)
        views = list(self.tile_colours)  # one view object per row, shared by tile and road_poly
        rows = {id(tile.color): row for tile, row in zip(self.road, views, strict=True)}
        for tile, row in zip(self.road, views, strict=True):
            tile.color = row
        self.road_poly = [(vertices, rows.get(id(colour), colour)) for vertices, colour in self.road_poly]

    def _render(self, mode: str):
        if mode == "state_pixels":
            return self.render_observation() if self.render_observations else self.blank_frame()
        return super()._render(mode)

    def blank_frame(self) -> np.ndarray:
        """A zero frame of the observation's shape, new on every call: users keep observations, and a
        shared buffer changed by one would change them all (gymnasium's checker refuses it too)."""
        return np.zeros(self.observation_space.shape, dtype=np.uint8)

    def render_observation(self) -> np.ndarray:
        """Draw the 96×96 state frame of the current state (with the configured renderer),
        even in render-free mode.

        Called after ``step`` it differs from that step's observation only in the HUD score
        digits when their integer part changes: ``step`` draws its frame before subtracting the
        step's 0.1 from the score (HUD rows are cropped by the preprocessing anyway).
        """
        if self._fast_renderer is not None:
            if "t" not in self.__dict__:
                return self.blank_frame()  # like stock: nothing to draw before the first reset
            return self._fast_renderer.render(self)
        return super()._render("state_pixels")


gym.register(id=ENV_ID, entry_point=NsacCarRacing, max_episode_steps=MAX_EPISODE_STEPS)


def make_car_racing(
    colour_preset: str = "default",
    render_observations: bool = True,
    render_mode: str | None = None,
    max_episode_steps: int = MAX_EPISODE_STEPS,
    renderer: str = "stock",
) -> gym.Env:
    """The one factory for CarRacing envs in nsacdrive (TimeLimit and order checks included).

    Args:
        colour_preset: a name from :func:`nsacdrive.envs.colours.list_presets`.
        render_observations: False skips pixel drawing on ``step`` (observations are zeros;
            use ``env.unwrapped.render_observation()`` when a frame is needed).
        render_mode: gymnasium render mode for ``env.render()`` (``human``/``rgb_array``).
        max_episode_steps: truncation horizon (1000 = the standard CarRacing protocol).
        renderer: ``"stock"`` (gymnasium's pygame drawing) or ``"fast"`` (nsacdrive.envs.fast_render).
    """
    return make_registered(ENV_ID, max_episode_steps, colour_preset=colour_preset,
                           render_observations=render_observations, render_mode=render_mode, renderer=renderer)


def make_registered(env_id: str, max_episode_steps: int, **kwargs: Any) -> gym.Env:
    """``gym.make`` of one of our registered envs with a checked horizon (the factories' shared step)."""
    if max_episode_steps <= 0:
        raise ValueError(f"max_episode_steps must be positive, got {max_episode_steps}")
    return gym.make(env_id, max_episode_steps=max_episode_steps, disable_env_checker=True, **kwargs)


def env_track(colour_preset: str, track_seed: int) -> np.ndarray:
    """``env.unwrapped.track`` rows (alpha, beta, x, y) of a seed, regenerated render-free."""
    env = make_car_racing(colour_preset=colour_preset, render_observations=False)
    try:
        env.reset(seed=int(track_seed))
        return np.asarray(env.unwrapped.track, dtype=np.float64)
    finally:
        env.close()
