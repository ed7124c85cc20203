"""A forward-facing pinhole camera over CarRacing's ground, drawn with numpy and OpenCV.

What it draws: CarRacing's own scene — the background field, the grass patches, the road tiles
in CarRacing's three shades and the red-white kerbs of hard corners, all taken from the env's
``road_poly`` — plus the paint CarRacing lacks (solid edge lines and a dashed centre line along
the track), under a sky gradient, like the Udacity simulator's 320×160 camera frames.

How: the camera sits ``mount_height`` above the ground, ``mount_forward`` ahead of the hull
centre and optionally offset sideways (Udacity's left/right cameras), looking along the hull's
heading, pitched down by ``pitch``. Every scene polygon lies on the ground plane, so nothing
occludes anything: layers are painted in a fixed order (patches, road, kerbs, lines) over a
precomputed sky/field background instead of depth-sorting. Per frame all ~1,500 ground quads
are moved into the camera frame in one numpy batch; quads behind the near plane or outside the
view are dropped, the few that cross the near plane are clipped (Sutherland–Hodgman), and each
layer is filled with one ``cv2.fillPoly`` call per colour group on a supersampled canvas that
is area-averaged down (anti-aliasing). ``fillPoly`` fills by the even-odd rule, so overlapping
quads of one call would cancel: each layer is split into three interleaved groups (index mod 3),
whose quads never overlap (neighbouring strips could, on the inside of the tightest bends); the
grass patches, which never touch, are one group. Quads are stored group by group, so each
group's visible quads are one slice of the frame's projected vertices.

Colours follow the env's :class:`nsacdrive.envs.colours.ColourScheme` (see :class:`FrontCameraPalette`).
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass

import cv2
import numpy as np

from nsacdrive.common.config_checks import Range
from nsacdrive.envs.colours import DEFAULT_SCHEME, RGB, ColourScheme, rotate_hue
from nsacdrive.envs.fast_render import grass_patches
from nsacdrive.envs.geometry import TRACK_HALF_WIDTH

_SHIFT = 4  # OpenCV sub-pixel bits: coordinates in 1/16 pixel
_ONE = 1 << _SHIFT
_GROUPS = 3  # interleaved groups per layer, see the module docstring

#: Painted lines (world units): edge lines just inside both road edges, a dashed centre line.
LINE_WIDTH = 0.35
EDGE_LINE_INSET = 0.35
DASH_EVERY = 3  # one dashed segment in three (~3.5 units of paint, ~7 of gap)

#: Default sky, hue-rotated with the scheme's field colour (see FrontCameraPalette).
SKY_TOP: RGB = (66.0, 120.0, 196.0)
SKY_HORIZON: RGB = (178.0, 206.0, 232.0)
KERB_RED: RGB = (255.0, 0.0, 0.0)
WHITE: RGB = (255.0, 255.0, 255.0)


#: the horizontal fields of view (degrees) a camera may have
HORIZONTAL_FOV = Range(10.0, 150.0)


@dataclass(frozen=True)
class CameraConfig:
    """Pinhole camera geometry (world units ≈ metres: the CarRacing hull is 5 long, 2.4 wide)."""

    width: int = 320
    height: int = 160
    horizontal_fov: float = 65.0  # degrees
    mount_height: float = 2.0  # above the ground
    mount_forward: float = 1.0  # ahead of the hull centre, along the heading
    pitch: float = 4.0  # degrees below the horizontal
    side_offset: float = 1.0  # lateral offset of the left/right cameras
    near: float = 1.0  # near plane distance (ground nearer than ~4.5 units is below the frame anyway)
    far: float = 350.0  # quads wholly beyond this depth are skipped (they lie on the horizon)
    supersample: int = 2  # canvas scale before area-averaging down (1 = no anti-aliasing)
    haze_rows: int = 6  # rows below the horizon blended towards the sky colour (distance haze)

    def __post_init__(self) -> None:
        if self.width < 8 or self.height < 8:
            raise ValueError(f"camera frame must be at least 8×8, got {self.width}×{self.height}")
        if not HORIZONTAL_FOV.contains(self.horizontal_fov):
            raise ValueError(f"horizontal_fov must lie {HORIZONTAL_FOV} degrees, got {self.horizontal_fov}")
        if self.mount_height <= 0 or self.near <= 0 or self.far <= self.near:
            raise ValueError("need mount_height > 0 and 0 < near < far")
        if not 0.0 <= self.pitch < 60.0:
            raise ValueError(f"pitch must lie in [0, 60) degrees, got {self.pitch}")
        if self.supersample < 1 or self.supersample & (self.supersample - 1):
            raise ValueError(f"supersample must be a power of two (1, 2, 4), got {self.supersample}")
        if self.haze_rows < 0:
            raise ValueError(f"haze_rows must be >= 0, got {self.haze_rows}")

    @property
    def shape(self) -> tuple[int, int, int]:
        """Frame shape (H, W, 3)."""
        return (self.height, self.width, 3)

    @property
    def focal(self) -> float:
        """Focal length in output pixels."""
        return (self.width / 2) / math.tan(math.radians(self.horizontal_fov) / 2)

    @property
    def horizon_row(self) -> float:
        """Image row (pixel-centre coordinates) where the ground meets the sky."""
        return (self.height - 1) / 2 - self.focal * math.tan(math.radians(self.pitch))


def _hue(rgb: RGB) -> float:
    return colorsys.rgb_to_hsv(*(c / 255.0 for c in rgb))[0] * 360.0


@dataclass(frozen=True)
class FrontCameraPalette:
    """Every colour the camera paints, derived from a CarRacing :class:`ColourScheme`.

    Road, field and grass patches are the scheme's colours (road in CarRacing's three tile
    shades, +0, +2.55, +5.1). The scheme says nothing about the sky and kerbs, so they follow its
    field: the default sky gradient and the kerbs' red are hue-rotated by the angle between the
    scheme's background hue and the default background hue (0 for ``default``; 30°·K for
    ``shift-K``). White paint (kerbs, lines) stays white, as CarRacing's white kerbs do.
    """

    road_shades: tuple[RGB, RGB, RGB]
    field: RGB
    grass: RGB
    kerb_red: RGB
    kerb_white: RGB
    line: RGB
    sky_top: RGB
    sky_horizon: RGB

    @classmethod
    def from_scheme(cls, scheme: ColourScheme) -> "FrontCameraPalette":
        turn = _hue(scheme.background) - _hue(DEFAULT_SCHEME.background)
        shades = tuple(tuple(min(c + 0.01 * k * 255, 255.0) for c in scheme.road) for k in range(3))
        return cls(
            road_shades=shades,  # type: ignore[arg-type]
            field=scheme.background,
            grass=scheme.grass,
            kerb_red=rotate_hue(KERB_RED, turn),
            kerb_white=WHITE,
            line=WHITE,
            sky_top=rotate_hue(SKY_TOP, turn),
            sky_horizon=rotate_hue(SKY_HORIZON, turn),
        )


def _cv_colour(rgb: RGB) -> tuple[int, int, int]:
    return tuple(int(round(c)) for c in rgb)  # type: ignore[return-value]


def track_strip(track: np.ndarray, inner: float, outer: float) -> np.ndarray:
    """Quads (N, 4, 2) between consecutive track points, ``inner``..``outer`` units right of the centreline.

    ``track`` is ``env.track`` as an (N, 4) array of (alpha, beta, x, y); the right-hand normal at
    a point is (cos beta, sin beta) (docs/driving.md#carracing-facts). Quad i joins point i to point i+1 (closed).
    """
    centre = track[:, 2:4]
    normal = np.stack([np.cos(track[:, 1]), np.sin(track[:, 1])], axis=1)
    a, b = centre + inner * normal, centre + outer * normal
    return np.stack([a, b, np.roll(b, -1, axis=0), np.roll(a, -1, axis=0)], axis=1)


def _clip_near(quad: np.ndarray, y_near: float) -> np.ndarray:
    """Sutherland–Hodgman: the part of a ground polygon (camera-aligned X, Y) with Y >= y_near.
    Plain floats: numpy operations on single points cost more than the arithmetic."""
    points = quad.tolist()
    out = []
    for k, (px, py) in enumerate(points):
        qx, qy = points[(k + 1) % len(points)]
        p_in, q_in = py >= y_near, qy >= y_near
        if p_in:
            out.append((px, py))
        if p_in != q_in:
            t = (y_near - py) / (qy - py)
            out.append((px + t * (qx - px), py + t * (qy - py)))
    return np.array(out, dtype=np.float64).reshape(-1, 2)


@dataclass(frozen=True)
class _Paint:
    """What a colour scheme makes of the frame: the background and one colour per quad group."""

    background: np.ndarray  # supersampled sky/field canvas
    colours: dict[str, tuple[int, int, int]]  # palette colour of each group name
    haze_colour: np.ndarray  # float32 (3,)


class FrontCamera:
    """Draws front-camera frames for a reset :class:`nsacdrive.envs.car_racing.NsacCarRacing` (unwrapped)."""

    def __init__(self, config: CameraConfig = CameraConfig()) -> None:
        self.config = config
        c = config
        s = c.supersample
        self._canvas_size = (c.width * s, c.height * s)
        self._focal = c.focal * s
        self._cx = (c.width * s - 1) / 2
        self._cy = (c.height * s - 1) / 2
        pitch = math.radians(c.pitch)
        self._cos, self._sin = math.cos(pitch), math.sin(pitch)
        # depth = Y·cos + h·sin >= near  ⇔  Y >= y_near (Y: ground distance ahead of the camera)
        self._y_near = (c.near - c.mount_height * self._sin) / self._cos
        self._y_far = (c.far - c.mount_height * self._sin) / self._cos
        # ground nearer than y_bottom lies below the frame's bottom edge
        below = math.atan((c.height * s - 1 - self._cy + 0.5) / self._focal) + pitch
        self._y_bottom = c.mount_height / math.tan(below) - 1e-6 if below < math.pi / 2 else -math.inf
        self._tan_side = (c.width * s / 2 + 1) / self._focal  # |X| / depth beyond this: off the frame's sides
        first_haze_row = max(int(math.floor(c.horizon_row)) + 1, 0)
        haze_rows = np.arange(first_haze_row, min(first_haze_row + c.haze_rows, c.height))
        self._haze = slice(first_haze_row, first_haze_row + len(haze_rows))  # a slice: a view, not a fancy-index copy
        alpha = 0.55 * (1 - (haze_rows - c.horizon_row) / (c.haze_rows + 1))
        self._haze_alpha = np.clip(alpha, 0.0, 1.0)[:, None, None].astype(np.float32)
        self._track_poly: list | None = None  # the env's road_poly the cached quads were built from
        self._group_names: list[str] = []  # fill groups in paint order (palette colour names), set by _sync_track
        self._paint: dict[ColourScheme, _Paint] = {}

    # ------------------------------------------------------------------ scene
    def _sync_track(self, env) -> None:
        """Cache the ground quads of the current track by layer (rebuilt when the env resets)."""
        if env.road_poly is self._track_poly:  # identity, not id(): a freed list's id can come back
            return
        tile_colours = {id(tile.color) for tile in env.road}  # the rest of road_poly are kerbs
        tiles = np.array([poly for poly, colour in env.road_poly if id(colour) in tile_colours], dtype=np.float64)
        kerbs = [(poly, tuple(colour)) for poly, colour in env.road_poly if id(colour) not in tile_colours]
        white = np.array([poly for poly, colour in kerbs if colour == (255, 255, 255)], dtype=np.float64)
        red = np.array([poly for poly, colour in kerbs if colour != (255, 255, 255)], dtype=np.float64)
        track = np.asarray(env.track, dtype=np.float64)
        edge = TRACK_HALF_WIDTH - EDGE_LINE_INSET
        lines = np.concatenate([track_strip(track, edge - LINE_WIDTH, edge), track_strip(track, -edge, -edge + LINE_WIDTH)])
        dashes = track_strip(track, -LINE_WIDTH / 2, LINE_WIDTH / 2)[::DASH_EVERY]
        # (quads, palette colour) in paint order; road tiles keep CarRacing's i % 3 shades
        layers = [(grass_patches(), "grass")] + [(tiles[k::3], f"road{k}") for k in range(3)]
        layers += [(red.reshape(-1, 4, 2), "kerb_red"), (white.reshape(-1, 4, 2), "kerb_white"), (lines, "line"), (dashes, "line")]
        quads, names, sizes = [], [], []
        for polys, colour in layers:
            count = 1 if colour == "grass" else _GROUPS  # grass patches lie GRASS_DIM apart: none overlap or touch
            for g in range(count):
                part = polys[g::count]
                if len(part):
                    quads.append(part)
                    names.append(colour)
                    sizes.append(len(part))
        self._quads = np.concatenate(quads)
        self._centres = self._quads.mean(axis=1)
        self._radii = np.linalg.norm(self._quads - self._centres[:, None], axis=2).max(axis=1)
        # quads are stored group by group in paint order: group g is quads[bounds[g]:bounds[g + 1]]
        self._group_names = names
        self._group_bounds = np.concatenate([[0], np.cumsum(sizes)])
        self._track_poly = env.road_poly

    def _paint_of(self, scheme: ColourScheme) -> _Paint:
        """Background and group colours of ``scheme`` (cached; groups name palette colours)."""
        if scheme not in self._paint:
            palette = FrontCameraPalette.from_scheme(scheme)
            named = {"grass": palette.grass, "kerb_red": palette.kerb_red, "kerb_white": palette.kerb_white,
                     "line": palette.line, **{f"road{k}": shade for k, shade in enumerate(palette.road_shades)}}
            width, height = self._canvas_size
            horizon = self._cy - self._focal * self._sin / self._cos
            rows = np.arange(height, dtype=np.float64)[:, None]
            t = np.clip(rows / max(horizon, 1.0), 0.0, 1.0) ** 0.7  # 0 at the top, 1 at the horizon
            sky = (1 - t) * np.array(palette.sky_top) + t * np.array(palette.sky_horizon)
            column = np.where(rows < horizon, sky, np.array(palette.field))
            background = np.repeat(np.rint(column)[:, None, :], width, axis=1).astype(np.uint8)
            self._paint[scheme] = _Paint(background, {name: _cv_colour(rgb) for name, rgb in named.items()},
                                         np.array(palette.sky_horizon, dtype=np.float32))
        return self._paint[scheme]

    # ------------------------------------------------------------------ frame
    def render(self, env, lateral_offset: float = 0.0) -> np.ndarray:
        """The (H, W, 3) uint8 RGB frame seen from the car of ``env``, ``lateral_offset`` units to the right."""
        c = self.config
        self._sync_track(env)
        paint = self._paint_of(env.colour_scheme)
        canvas = paint.background.copy()
        hull = env.car.hull
        angle = float(hull.angle)
        forward = np.array([-math.sin(angle), math.cos(angle)])
        right = np.array([math.cos(angle), math.sin(angle)])
        position = np.array(hull.position, dtype=np.float64) + c.mount_forward * forward + lateral_offset * right
        # coarse cull on bounding circles, then per vertex: below the frame, beyond `far`, to the side
        centre = self._centres - position
        centre_x, centre_y = centre @ right, centre @ forward
        reach = (centre_y + self._radii) * self._cos + c.mount_height * self._sin  # largest depth of a quad
        candidates = np.flatnonzero((centre_y + self._radii >= self._y_bottom) & (centre_y - self._radii <= self._y_far)
                                    & (np.abs(centre_x) - self._radii <= reach * self._tan_side))
        rel = self._quads[candidates] - position
        ground_x, ground_y = rel @ right, rel @ forward  # (n, 4): right of and ahead of the camera
        depth = ground_y * self._cos + c.mount_height * self._sin
        side = depth.max(axis=1, keepdims=True) * self._tan_side
        keep = (ground_y.max(axis=1) >= self._y_bottom) & (ground_x <= side).any(axis=1) & (ground_x >= -side).any(axis=1)
        whole = keep & (ground_y.min(axis=1) >= self._y_near)
        u, v = self._project(ground_x[whole], ground_y[whole], depth[whole])
        pixels = np.round(np.stack([u, v], axis=-1) * _ONE).astype(np.int32)  # whole quads, group by group
        # candidates are sorted, so each group's whole quads are one slice of `pixels`: no per-group indexing
        bounds = np.searchsorted(candidates[whole], self._group_bounds).tolist()
        clipped: dict[int, list[np.ndarray]] = {}  # group → its quads that cross the near plane, clipped
        for k in np.flatnonzero(keep & ~whole).tolist():
            polygon = self._clip_to_canvas(ground_x[k], ground_y[k])
            if polygon is not None:
                group = int(np.searchsorted(self._group_bounds, candidates[k], side="right")) - 1
                clipped.setdefault(group, []).append(polygon)
        for group, name in enumerate(self._group_names):
            colour = paint.colours[name]
            if bounds[group + 1] > bounds[group]:
                cv2.fillPoly(canvas, pixels[bounds[group]:bounds[group + 1]], colour, cv2.LINE_8, _SHIFT)
            if group in clipped:
                cv2.fillPoly(canvas, clipped[group], colour, cv2.LINE_8, _SHIFT)
        frame = canvas
        for level in range(c.supersample.bit_length() - 2, -1, -1):
            # an exact 2× bilinear shrink averages 2×2 blocks: repeated, a box (area) filter
            frame = cv2.resize(frame, (c.width << level, c.height << level), interpolation=cv2.INTER_LINEAR)
        band = frame[self._haze]
        if len(band):
            blend = band.astype(np.float32)
            band[:] = np.rint(blend + self._haze_alpha * (paint.haze_colour - blend))
        return frame

    def _project(self, ground_x: np.ndarray, ground_y: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Canvas coordinates (pixel centres) of ground points given in the camera's ground frame."""
        up = ground_y * self._sin - self.config.mount_height * self._cos
        return self._cx + self._focal * ground_x / depth, self._cy - self._focal * up / depth

    def _clip_to_canvas(self, ground_x: np.ndarray, ground_y: np.ndarray) -> np.ndarray | None:
        """Fixed-point canvas polygon of a quad that crosses the near plane, clipped to it."""
        polygon = _clip_near(np.stack([ground_x, ground_y], axis=1), self._y_near)
        if len(polygon) < 3:
            return None
        depth = polygon[:, 1] * self._cos + self.config.mount_height * self._sin
        u, v = self._project(polygon[:, 0], polygon[:, 1], depth)
        return np.round(np.stack([u, v], axis=1) * _ONE).astype(np.int32)
