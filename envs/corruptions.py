"""A held-out corruption suite for camera frames, in the style of ImageNet-C (Hendrycks & Dietterich 2019).

Every corruption works on raw uint8 RGB frames of either observation kind (CarRacing's 96×96,
the front camera's 160×320), before the preprocessing, and is named ``FAMILY-SEVERITY`` with
severity 1 (mild) … 5 (severe), e.g. ``fog-3``. None of the families is part of a training
augmentation: the colour augmentation (hue, saturation, contrast, brightness, channel gain,
road/field recolouring) and the Udacity augmentation (side cameras, flips, shifts, shadows,
brightness) are left out on purpose, so the suite measures shift the controller never saw.
``gaussian-noise`` resembles NSAC's perturbed-input proxy (noise on the preprocessed frame, used
by its regulariser, not as training data); read it as the one family that the objective has
looked at.

Randomness comes only from ``np.random.default_rng([seed, step, family index])``: the same
(seed, step) gives the same corrupted frame on every run, so closed-loop episodes stay paired
across models. Textures and streaks are generated, nothing is downloaded.

:func:`register_corruption` adds a family to the suite (``all`` and ``all-SEVERITY`` then include it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

SEVERITIES = (1, 2, 3, 4, 5)
NO_CORRUPTION = "none"  # the uncorrupted frames, where a list of corruptions is asked for
Frame = np.ndarray  # (H, W, 3) uint8 RGB
#: ``apply(frame, parameter, rng)``: the corrupted copy of a frame, drawing randomness only from ``rng``
CorruptionFunction = Callable[[Frame, float, np.random.Generator], Frame]


@dataclass(frozen=True)
class Corruption:
    """One family: ``apply(frame, severity, rng)`` and its parameter per severity (for listings)."""

    name: str
    description: str
    parameters: tuple[float, ...]  # the family's main parameter at severities 1 … 5
    unit: str
    apply: CorruptionFunction
    per_episode: bool = False  # its randomness is drawn once per episode (a sticker on the lens stays put), not per step


def _clip(image: np.ndarray) -> Frame:
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def _gaussian_noise(frame: Frame, sigma: float, rng: np.random.Generator) -> Frame:
    return _clip(frame + rng.normal(0.0, sigma * 255, frame.shape))


def _shot_noise(frame: Frame, photons: float, rng: np.random.Generator) -> Frame:
    return _clip(rng.poisson(frame / 255.0 * photons) / photons * 255)


def _impulse_noise(frame: Frame, amount: float, rng: np.random.Generator) -> Frame:
    out = frame.copy()
    hit = rng.random(frame.shape[:2]) < amount
    salt = rng.random(frame.shape[:2]) < 0.5
    out[hit & salt], out[hit & ~salt] = 255, 0
    return out


def _scaled(frame: Frame, size_at_96: float) -> float:
    """A size given for a 96-pixel-high frame, scaled to this frame's height (front camera: 160)."""
    return size_at_96 * frame.shape[0] / 96


def _defocus_blur(frame: Frame, radius: float, rng: np.random.Generator) -> Frame:
    r = max(_scaled(frame, radius), 0.5)
    size = 2 * int(np.ceil(r)) + 1
    y, x = np.mgrid[:size, :size] - size // 2
    disk = (x ** 2 + y ** 2 <= r ** 2).astype(np.float32)
    return _clip(cv2.filter2D(frame.astype(np.float32), -1, disk / disk.sum(), borderType=cv2.BORDER_REFLECT))


def _motion_blur(frame: Frame, length: float, rng: np.random.Generator) -> Frame:
    n = max(int(round(_scaled(frame, length))), 2)
    kernel = np.zeros((n, n), np.float32)
    kernel[n // 2, :] = 1.0
    angle = rng.uniform(-45.0, 45.0)
    kernel = cv2.warpAffine(kernel, cv2.getRotationMatrix2D(((n - 1) / 2, (n - 1) / 2), angle, 1.0), (n, n))
    return _clip(cv2.filter2D(frame.astype(np.float32), -1, kernel / kernel.sum(), borderType=cv2.BORDER_REFLECT))


def _smooth_field(shape: tuple[int, int], rng: np.random.Generator, cells: int = 6) -> np.ndarray:
    """Low-frequency noise in [0, 1] (random cells, bicubically upsampled): fog density, dirt."""
    coarse = rng.random((cells, cells)).astype(np.float32)
    field = cv2.resize(coarse, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC)
    return np.clip(field, 0.0, 1.0)


def _fog(frame: Frame, density: float, rng: np.random.Generator) -> Frame:
    alpha = density * (0.6 + 0.4 * _smooth_field(frame.shape[:2], rng))[..., None]
    return _clip(frame * (1 - alpha) + 215.0 * alpha)


def _rain(frame: Frame, drops: float, rng: np.random.Generator) -> Frame:
    h, w = frame.shape[:2]
    streaks = np.zeros((h, w), np.float32)
    count = int(drops * h * w / 1000)
    length = max(int(_scaled(frame, 6)), 3)
    start = np.stack([rng.integers(0, w, count), rng.integers(-length, h, count)], axis=1)
    end = start + np.array([rng.uniform(-0.3, 0.3) * length, length])
    segments = np.stack([start, end], axis=1).round().astype(np.int32)  # [count, 2, 2]
    cv2.polylines(streaks, list(segments), isClosed=False, color=1.0, thickness=1)
    darkened = frame * (1 - 0.1 * min(drops / 10, 1.0))
    return _clip(darkened * (1 - 0.7 * streaks[..., None]) + 200.0 * 0.7 * streaks[..., None])


def _snow(frame: Frame, flakes: float, rng: np.random.Generator) -> Frame:
    h, w = frame.shape[:2]
    layer = (rng.random((h, w)) < flakes).astype(np.float32)
    layer = cv2.GaussianBlur(layer, (3, 3), 0.8) * 2.5
    whitened = frame * (1 - flakes * 2) + 255 * flakes * 2
    return _clip(whitened * (1 - np.clip(layer, 0, 1)[..., None]) + 250 * np.clip(layer, 0, 1)[..., None])


def _jpeg(frame: Frame, quality: float, rng: np.random.Generator) -> Frame:
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(frame[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError(f"JPEG encoding failed for a frame of shape {frame.shape}")
    return cv2.imdecode(encoded, cv2.IMREAD_COLOR)[..., ::-1].copy()


def _pixelate(frame: Frame, factor: float, rng: np.random.Generator) -> Frame:
    h, w = frame.shape[:2]
    small = cv2.resize(frame, (max(int(w * factor), 1), max(int(h * factor), 1)), interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)


def _lens_dirt(frame: Frame, coverage: float, rng: np.random.Generator) -> Frame:
    """Dark, soft blobs on the lens: the darkest ``coverage`` share of a smooth random field."""
    field = _smooth_field(frame.shape[:2], rng, cells=10)
    threshold = np.quantile(field, coverage)
    mask = cv2.GaussianBlur((field <= threshold).astype(np.float32), (5, 5), 1.5)[..., None]
    return _clip(frame * (1 - 0.85 * mask) + 25.0 * 0.85 * mask)


def _camera_tilt(frame: Frame, degrees: float, rng: np.random.Generator) -> Frame:
    """The camera rolled by ±``degrees`` about the image centre (a knocked mount; borders replicated)."""
    h, w = frame.shape[:2]
    angle = degrees * (1 if rng.random() < 0.5 else -1)
    matrix = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)
    return cv2.warpAffine(frame, matrix, (w, h), borderMode=cv2.BORDER_REPLICATE)


def _low_light(frame: Frame, brightness: float, rng: np.random.Generator) -> Frame:
    """Dusk: the scene at ``brightness`` of its light through a gamma, with the sensor's gain noise
    growing as the light falls (an exposure that cannot keep up)."""
    dark = 255.0 * (frame / 255.0) ** 1.3 * brightness
    return _clip(dark + rng.normal(0.0, 12.0 * (1.0 - brightness), frame.shape))


def _glare(frame: Frame, intensity: float, rng: np.random.Generator) -> Frame:
    """A low sun in the lens: a bright bloom, centred where the sun stands for the whole episode."""
    h, w = frame.shape[:2]
    cy, cx = rng.uniform(0.0, 0.5 * h), rng.uniform(0.0, w)
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    bloom = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * (0.35 * h) ** 2))[..., None]
    return _clip(frame + (255.0 - frame) * intensity * bloom)


def _occluder(frame: Frame, size: float, rng: np.random.Generator) -> Frame:
    """Something stuck on the windscreen in front of the camera (a leaf, a sticker): a dark blob of
    ``size`` × the frame's height, in one place for the whole episode."""
    h, w = frame.shape[:2]
    radius = size * h / 2
    cy, cx = rng.uniform(radius, h - radius), rng.uniform(radius, w - radius)
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    mask = cv2.GaussianBlur(((yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2).astype(np.float32), (5, 5), 1.0)[..., None]
    return _clip(frame * (1 - mask) + 20.0 * mask)


def _water_drops(frame: Frame, drops: float, rng: np.random.Generator) -> Frame:
    """Rain drops on the lens: ``drops`` round patches that blur and brighten what lies behind
    them, where they landed for the whole episode."""
    h, w = frame.shape[:2]
    blurred = cv2.GaussianBlur(frame.astype(np.float32), (0, 0), _scaled(frame, 2.5)) * 1.1 + 10.0
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    mask = np.zeros((h, w), np.float32)
    for _ in range(int(drops)):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), _scaled(frame, rng.uniform(3.0, 8.0))
        mask = np.maximum(mask, ((yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2).astype(np.float32))
    mask = cv2.GaussianBlur(mask, (3, 3), 0.8)[..., None]
    return _clip(frame * (1 - mask) + blurred * mask)


def _camera_shift(frame: Frame, pixels: float, rng: np.random.Generator) -> Frame:
    """A camera mount that slipped: the image moved by ``pixels`` (at 96 high) in a direction fixed
    for the episode (borders replicated)."""
    h, w = frame.shape[:2]
    angle = rng.uniform(0.0, 2 * np.pi)
    shift = _scaled(frame, pixels)
    matrix = np.float32([[1, 0, shift * np.cos(angle)], [0, 1, shift * np.sin(angle)]])
    return cv2.warpAffine(frame, matrix, (w, h), borderMode=cv2.BORDER_REPLICATE)


def _camera_zoom(frame: Frame, scale: float, rng: np.random.Generator) -> Frame:
    """A lens of another focal length: the image magnified by ``scale`` about its centre (the road
    looks nearer and its curves sharper than in training)."""
    h, w = frame.shape[:2]
    matrix = cv2.getRotationMatrix2D((w / 2, h / 2), 0.0, scale)
    return cv2.warpAffine(frame, matrix, (w, h), borderMode=cv2.BORDER_REPLICATE)


def _grass_mask(frame: Frame) -> np.ndarray:
    """Pixels of the stock field and grass colours (green well above red and blue), [H, W] bool."""
    rgb = frame.astype(np.int16)
    return (rgb[..., 1] - np.maximum(rgb[..., 0], rgb[..., 2]) > 60)


def _background_texture(frame: Frame, contrast: float, rng: np.random.Generator) -> Frame:
    """The grass replaced by a generated texture (AttentionNeuron's background swap): random
    stripes and blotches in two random colours; ``contrast`` sets how far apart they are."""
    h, w = frame.shape[:2]
    base, other = rng.uniform(40, 215, 3), rng.uniform(40, 215, 3)
    other = base + (other - base) * contrast / max(np.abs(other - base).max(), 1e-6)  # largest channel gap = contrast
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    period = _scaled(frame, rng.uniform(6, 14))
    theta = rng.uniform(0, np.pi)
    stripes = 0.5 + 0.5 * np.sin((xx * np.cos(theta) + yy * np.sin(theta)) * 2 * np.pi / period)
    pattern = np.clip(0.6 * stripes + 0.4 * _smooth_field((h, w), rng, cells=12), 0, 1)[..., None]
    texture = base * (1 - pattern) + other * pattern
    mask = _grass_mask(frame)[..., None]
    return _clip(np.where(mask, texture, frame))


CORRUPTIONS: dict[str, Corruption] = {c.name: c for c in (
    Corruption("gaussian-noise", "additive Gaussian pixel noise", (0.04, 0.08, 0.12, 0.18, 0.26), "σ (share of 255)", _gaussian_noise),
    Corruption("shot-noise", "Poisson photon noise", (60, 25, 12, 5, 3), "photons at white", _shot_noise),
    Corruption("impulse-noise", "salt-and-pepper pixels", (0.01, 0.03, 0.06, 0.12, 0.2), "share of pixels", _impulse_noise),
    Corruption("defocus-blur", "disk blur (out of focus)", (0.8, 1.3, 2.0, 3.0, 4.0), "radius, px at 96 high", _defocus_blur),
    Corruption("motion-blur", "line blur at a random angle", (3, 5, 8, 12, 16), "length, px at 96 high", _motion_blur),
    Corruption("fog", "patchy haze towards light grey", (0.15, 0.3, 0.45, 0.6, 0.75), "density", _fog),
    Corruption("rain", "slanted light streaks, slightly darker scene", (2, 4, 7, 10, 15), "streaks per 1000 px", _rain),
    Corruption("snow", "flakes and a whitened scene", (0.01, 0.02, 0.04, 0.07, 0.1), "flake density", _snow),
    Corruption("jpeg", "JPEG compression", (30, 18, 10, 6, 3), "quality", _jpeg),
    Corruption("pixelate", "area downsampling, nearest upsampling", (0.6, 0.45, 0.33, 0.25, 0.18), "scale", _pixelate),
    Corruption("lens-dirt", "dark soft blobs on the lens", (0.04, 0.08, 0.14, 0.2, 0.3), "share covered", _lens_dirt),
    Corruption("camera-tilt", "the camera rolled about its axis", (3, 6, 10, 15, 22), "degrees", _camera_tilt),
    Corruption("background-texture", "grass replaced by a generated texture", (20, 40, 60, 80, 100), "texture contrast", _background_texture),
    Corruption("low-light", "dusk: a darker scene with the sensor's gain noise", (0.7, 0.55, 0.4, 0.3, 0.2), "share of the light", _low_light),
    Corruption("glare", "a low sun blooming in the lens (in one place per episode)", (0.2, 0.35, 0.5, 0.65, 0.8), "bloom intensity",
               _glare, per_episode=True),
    Corruption("occluder", "something stuck in front of the camera (in one place per episode)", (0.12, 0.18, 0.25, 0.32, 0.4),
               "diameter (share of height)", _occluder, per_episode=True),
    Corruption("water-drops", "rain drops on the lens that blur what is behind them (per episode)", (3, 6, 10, 15, 22), "drops",
               _water_drops, per_episode=True),
    Corruption("camera-shift", "a camera mount that slipped (per episode)", (2, 4, 6, 9, 12), "pixels at 96 high", _camera_shift,
               per_episode=True),
    Corruption("camera-zoom", "a lens of another focal length", (1.05, 1.1, 1.18, 1.27, 1.4), "magnification", _camera_zoom),
)}
#: the family names in suite order, registered ones included (a live view of :data:`CORRUPTIONS`)
FAMILIES = CORRUPTIONS.keys()
#: the families that ship with nsacdrive: their random streams are keyed by their place in the suite
BUILTIN_FAMILIES = tuple(CORRUPTIONS)


def family_key(name: str) -> int:
    """The number a family's random streams are seeded with: its place among the built-in families,
    or, for a registered one, a hash of its name (so it does not depend on the order of registration)."""
    return BUILTIN_FAMILIES.index(name) if name in BUILTIN_FAMILIES else 1_000 + zlib.crc32(name.encode())


def register_corruption(name: str, fn: CorruptionFunction, levels: Sequence[float], description: str,
                        unit: str = "level", per_episode: bool = False) -> None:
    """Add family ``name`` to the suite: ``fn(frame, levels[severity - 1], rng)`` corrupts a raw
    uint8 frame, drawing randomness only from ``rng`` (seeded from the seed, the step and the
    family's name), so a corrupted frame stays a pure function of (frame, seed, step). With
    ``per_episode`` the rng is seeded without the step: what it draws (where a sticker sits, how
    far a camera mount moved) stays put for the whole episode. ``unit`` names the parameter in
    listings. The registration lives in this process only: workers of an evaluation import the
    modules named by ``--corruption-module`` (:func:`import_corruption_modules`) themselves."""
    if not name or name in (NO_CORRUPTION, "all") or any(c in name for c in ", \t\n"):
        raise ValueError(f"corruption name {name!r}: give a non-empty name free of commas and spaces, other than 'all' and 'none'")
    if name in CORRUPTIONS:
        raise ValueError(f"corruption {name!r} is already registered")
    if len(levels) != len(SEVERITIES):
        raise ValueError(f"corruption {name!r}: give one level per severity {SEVERITIES}, got {len(levels)}")
    CORRUPTIONS[name] = Corruption(name, description, tuple(float(level) for level in levels), unit, fn, per_episode)


def import_corruption_modules(modules: Sequence[str]) -> None:
    """Import each module — a dotted name, or the path of a ``.py`` file — whose import registers
    corruption families with :func:`register_corruption`; each is imported once per process."""
    for module in modules:
        if module.endswith(".py"):
            path = Path(module).resolve()
            name = f"nsacdrive_corruption_plugin_{zlib.crc32(str(path).encode())}"
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise ValueError(f"--corruption-module: {module} is not a Python file")
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[name] = loaded
            spec.loader.exec_module(loaded)
        else:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                raise ValueError(f"--corruption-module: cannot import {module!r} ({exc}); give a module on the Python "
                                 "path or the path of a .py file") from None


@dataclass(frozen=True)
class CorruptionSpec:
    """One ``FAMILY-SEVERITY`` of the suite."""

    family: str
    severity: int

    @property
    def name(self) -> str:
        return f"{self.family}-{self.severity}"

    def __call__(self, frame: Frame, seed: int, step: int) -> Frame:
        """The corrupted copy of one raw uint8 frame; deterministic in (seed, step)."""
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
            raise ValueError(f"corruption {self.name}: expected a uint8 (H, W, 3) frame, got {frame.dtype} {frame.shape}")
        family = CORRUPTIONS[self.family]
        key = family_key(self.family)
        rng = np.random.default_rng([seed, key] if family.per_episode else [seed, step, key])
        return family.apply(frame, family.parameters[self.severity - 1], rng)


def parse_corruptions(text: str, what: str = "--corruptions") -> list[CorruptionSpec]:
    """``all`` (every family at every severity) or comma-separated names: ``FAMILY-SEVERITY``, or
    ``all-SEVERITY`` for every family at that severity (``all-1,all-3,all-5``: three severities)."""
    if text.strip() == "all":
        return [CorruptionSpec(family, severity) for family in FAMILIES for severity in SEVERITIES]
    specs = []
    for item in (part.strip() for part in text.split(",")):
        family, _, severity = item.rpartition("-")
        if (family not in CORRUPTIONS and family != "all") or not severity.isdigit() or int(severity) not in SEVERITIES:
            raise ValueError(f"{what}: {item!r} is not FAMILY-SEVERITY with a family of {', '.join(FAMILIES)} "
                             f"(or all) and a severity 1-5 (or give 'all')")
        families = FAMILIES if family == "all" else (family,)
        specs.extend(CorruptionSpec(name, int(severity)) for name in families)
    if len({s.name for s in specs}) != len(specs):
        raise ValueError(f"{what}: {text!r} names a corruption twice")
    return specs


def describe_families() -> list[str]:
    """One line per family, name first: what it does and its parameter at severities 1-5."""
    return [f"{c.name:<20} {c.description}; {c.unit}: {', '.join(f'{p:g}' for p in c.parameters)}" for c in CORRUPTIONS.values()]
