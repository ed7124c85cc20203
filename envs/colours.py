"""Colour schemes for CarRacing: named presets that recolour a track without changing it.

A scheme fixes the three colours the stock renderer uses (road, background, grass patches).
Presets are resolved per episode from the preset name and the track seed, so the same
(preset, seed) pair always gives the same colours and, through the track-preserving recipe in
:mod:`nsacdrive.envs.car_racing`, the same track as the default env.

Preset grammar (see :func:`list_presets`):

``default``
    Stock colours: road (102,102,102), background (102,204,102), grass (102,230,102).
``shift-K`` (K = 1..5)
    Graded shift along one severity axis: background and grass hues rotated by +30°·K in HSV
    (green → spring green → cyan → azure → blue → violet), road brightness scaled by (1 − 0.08·K).
    Saturation and value of the green areas are kept, so only hue and road contrast move.
``random``
    gymnasium's ``domain_randomize`` distribution (road and background U(0,210)³, grass =
    background + 20 in one random channel), drawn from a generator seeded by the track seed.
``random-N``
    The same distribution from a generator seeded by N alone: one fixed scheme on every track.
``color-v0``
    The published CarRacingExtension Color-v0 protocol: U(−0.2, 0.2) noise (in [0,1] RGB units)
    added per channel to the lane (road) colour and to the grass colour (background and grass
    patches share the grass noise so the patches keep their contrast), clipped to [0,1],
    drawn from a generator seeded by the track seed.
"""

from __future__ import annotations

import colorsys
import re
from dataclasses import dataclass

import numpy as np

RGB = tuple[float, float, float]

_RANDOM_SALT = 0x5EED_C010  # separates colour streams from any other use of a track seed
_COLOR_V0_SALT = 0xC010_0000
MAX_SHIFT_SEVERITY = 5


@dataclass(frozen=True)
class ColourScheme:
    """The three colours (RGB, 0–255) that the CarRacing renderer paints."""

    road: RGB
    background: RGB
    grass: RGB
    name: str = "custom"

    def __post_init__(self) -> None:
        for field_name in ("road", "background", "grass"):
            value = np.asarray(getattr(self, field_name), dtype=np.float64)
            if value.shape != (3,) or not np.all(np.isfinite(value)):
                raise ValueError(f"ColourScheme.{field_name} must be 3 finite RGB values, got {value!r}")
            if np.any(value < 0) or np.any(value > 255):
                raise ValueError(f"ColourScheme.{field_name} must lie in [0, 255], got {value.tolist()}")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form used in episode sidecars."""
        return {
            "name": self.name,
            "road": [float(c) for c in self.road],
            "background": [float(c) for c in self.background],
            "grass": [float(c) for c in self.grass],
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> "ColourScheme":
        return cls(
            road=tuple(data["road"]),  # type: ignore[arg-type]
            background=tuple(data["background"]),  # type: ignore[arg-type]
            grass=tuple(data["grass"]),  # type: ignore[arg-type]
            name=str(data.get("name", "custom")),
        )


DEFAULT_SCHEME = ColourScheme(
    road=(102.0, 102.0, 102.0),
    background=(102.0, 204.0, 102.0),
    grass=(102.0, 230.0, 102.0),
    name="default",
)


def list_presets() -> list[str]:
    """Every preset name accepted by :func:`resolve_colour_scheme` (``random-N`` for any N)."""
    shifts = [f"shift-{k}" for k in range(1, MAX_SHIFT_SEVERITY + 1)]
    return ["default", *shifts, "random", "random-N", "color-v0"]


def rotate_hue(rgb: RGB, degrees: float) -> RGB:
    """``rgb`` (0–255) with its HSV hue rotated by ``degrees``; saturation and value kept."""
    h, s, v = colorsys.rgb_to_hsv(*(c / 255.0 for c in rgb))
    r, g, b = colorsys.hsv_to_rgb((h + degrees / 360.0) % 1.0, s, v)
    return (r * 255.0, g * 255.0, b * 255.0)


def _shift_scheme(severity: int) -> ColourScheme:
    road_scale = 1.0 - 0.08 * severity
    return ColourScheme(
        road=tuple(c * road_scale for c in DEFAULT_SCHEME.road),  # type: ignore[arg-type]
        background=rotate_hue(DEFAULT_SCHEME.background, 30.0 * severity),
        grass=rotate_hue(DEFAULT_SCHEME.grass, 30.0 * severity),
        name=f"shift-{severity}",
    )


def _domain_randomized_scheme(rng: np.random.Generator, name: str) -> ColourScheme:
    """Same distribution as gymnasium's ``CarRacing._reinit_colors``."""
    road = rng.uniform(0, 210, size=3)
    background = rng.uniform(0, 210, size=3)
    grass = background.copy()
    grass[rng.integers(3)] += 20
    return ColourScheme(tuple(road), tuple(background), tuple(grass), name=name)  # type: ignore[arg-type]


def _color_v0_scheme(rng: np.random.Generator) -> ColourScheme:
    base = DEFAULT_SCHEME
    road_noise = rng.uniform(-0.2, 0.2, size=3)
    grass_noise = rng.uniform(-0.2, 0.2, size=3)

    def perturb(rgb: RGB, noise: np.ndarray) -> RGB:
        return tuple(np.clip(np.asarray(rgb) / 255.0 + noise, 0.0, 1.0) * 255.0)  # type: ignore[return-value]

    return ColourScheme(
        road=perturb(base.road, road_noise),
        background=perturb(base.background, grass_noise),
        grass=perturb(base.grass, grass_noise),
        name="color-v0",
    )


def validate_preset(preset: str) -> str:
    """Return ``preset`` if it is a valid preset name, else raise a ValueError listing the valid ones."""
    resolve_colour_scheme(preset, track_seed=0)
    return preset


def resolve_colour_scheme(preset: str, track_seed: int) -> ColourScheme:
    """The colour scheme of ``preset`` for the track of ``track_seed`` (deterministic)."""
    if preset == "default":
        return DEFAULT_SCHEME
    shift = re.fullmatch(r"shift-(\d+)", preset)
    if shift and 1 <= int(shift.group(1)) <= MAX_SHIFT_SEVERITY:
        return _shift_scheme(int(shift.group(1)))
    if preset == "random":
        rng = np.random.default_rng([_RANDOM_SALT, int(track_seed)])
        return _domain_randomized_scheme(rng, name="random")
    fixed_random = re.fullmatch(r"random-(\d+)", preset)
    if fixed_random:
        rng = np.random.default_rng([_RANDOM_SALT, int(fixed_random.group(1)), 1])
        return _domain_randomized_scheme(rng, name=preset)
    if preset == "color-v0":
        return _color_v0_scheme(np.random.default_rng([_COLOR_V0_SALT, int(track_seed)]))
    raise ValueError(
        f"unknown colour preset {preset!r}; expected one of {', '.join(list_presets())} "
        f"(shift severities 1..{MAX_SHIFT_SEVERITY}, N a non-negative integer)"
    )
