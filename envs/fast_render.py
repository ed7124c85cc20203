"""A fast renderer for CarRacing's 96×96 state observation that reproduces the stock frame.

Stock CarRacing draws every polygon with pure-Python pygame calls on a 1000×800 canvas, flips
it, draws the HUD, and smooth-scales the whole canvas to 96×96 (~12 ms a frame). This renderer
makes the same frame in three independent parts:

* the scene (rows 0..83): after the zoom-in, one bilinear warp out of the track's blurred
  world raster (:mod:`nsacdrive.envs.track_raster`); during the zoom-in, the field, grass and
  road polygons filled anti-aliased on a supersampled canvas and area-averaged down;
* the car, filled on a small supersampled patch (the camera holds it at one screen point),
  area-averaged and laid over the scene by its coverage;
* the HUD band (rows 84..95, which nothing else reaches): bars and score on a supersampled strip.

Last, pygame's smoothscale rounding (:func:`smoothscale_lut`) is applied to the whole frame.
Fidelity against the stock renderer is measured in ``bench/`` and pinned by tests.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pygame
from gymnasium.envs.box2d import car_dynamics
from gymnasium.envs.box2d.car_racing import GRASS_DIM, PLAYFIELD, SCALE, STATE_H, STATE_W, WINDOW_H, WINDOW_W, ZOOM

from nsacdrive.envs.track_raster import _ONE, _SHIFT, TrackRaster, keep_buffer, pattern_pixels

_HUD_S = WINDOW_W / 40.0
_HUD_H = WINDOW_H / 40.0
HUD_ROW = round(STATE_H * (WINDOW_H - 5 * _HUD_H) / WINDOW_H)  # 84: the HUD's black band covers rows 84..95
CAR_REACH = 3.2  # world units from the hull's centre that hold every car polygon (hull ≤ 2.9, wheels ≤ 2.6)
OUTPUT_FOOTPRINT = math.sqrt((WINDOW_W / STATE_W) * (WINDOW_H / STATE_H)) / (ZOOM * SCALE)  # ≈ 0.575 world units


def grass_patches() -> np.ndarray:
    """The stock renderer's 400 grass squares (world units), shape (400, 4, 2)."""
    corners = np.array([(1, 0), (0, 0), (0, 1), (1, 1)], dtype=np.float64) * GRASS_DIM
    origins = np.array([(GRASS_DIM * x, GRASS_DIM * y) for x in range(-20, 20, 2) for y in range(-20, 20, 2)])
    return origins[:, None, :] + corners[None]


_SMOOTHSCALE_LUT: np.ndarray | None = None


def smoothscale_lut() -> np.ndarray:
    """What pygame's ``smoothscale`` 1000×800 → 96×96 makes of each flat 8-bit level.

    Its two fixed-point passes truncate, so flat regions come out ~2 levels darker (102 → 100).
    Measured once per process on a 16×16 grid of flat blocks (one per level), reading only
    output pixels whose source footprint lies inside one block.
    """
    global _SMOOTHSCALE_LUT
    if _SMOOTHSCALE_LUT is None:
        levels = np.arange(256, dtype=np.uint8).reshape(16, 16)
        block_w, block_h = WINDOW_W / 16, WINDOW_H / 16
        cols = (np.arange(WINDOW_W) // block_w).astype(int)
        rows = (np.arange(WINDOW_H) // block_h).astype(int)
        source = np.repeat(levels[rows][:, cols][..., None], 3, axis=2)  # (800, 1000, 3)
        surface = pygame.surfarray.make_surface(source.transpose(1, 0, 2))
        scaled = pygame.surfarray.array3d(pygame.transform.smoothscale(surface, (STATE_W, STATE_H))).transpose(1, 0, 2)
        centre = (np.arange(16) * (STATE_W / 16) + STATE_W / 32).astype(int)  # 6 px blocks: centre pixels are interior
        _SMOOTHSCALE_LUT = scaled[centre][:, centre, 0].reshape(256).astype(np.uint8)
    return _SMOOTHSCALE_LUT


_LEVEL_DROP: int | None = None


def apply_level_table(frame: np.ndarray) -> np.ndarray:
    """:func:`smoothscale_lut` applied to a uint8 frame in place. On the pygame measured so far
    the table is a saturating subtraction of a constant: one saturating cv2 call, ~5× faster
    than a table look-up on 96×96×3. Any other table is looked up."""
    global _LEVEL_DROP
    if _LEVEL_DROP is None:
        table = smoothscale_lut().astype(int)
        drop = 255 - int(table[-1])
        _LEVEL_DROP = drop if np.array_equal(table, np.maximum(np.arange(256) - drop, 0)) else -1
    if _LEVEL_DROP < 0:
        return cv2.LUT(frame, smoothscale_lut(), dst=frame)
    return cv2.subtract(frame, (_LEVEL_DROP,) * 3 + (0,), dst=frame)


def _wheel_stripe(phase: float) -> tuple[float, float] | None:
    """The stock wheel's white stripe (y extents as cosines), or None when it is hidden."""
    a1, a2 = phase, phase + 1.2
    s1, s2, c1, c2 = math.sin(a1), math.sin(a2), math.cos(a1), math.cos(a2)
    if s1 > 0 and s2 > 0:
        return None
    if s1 > 0:
        c1 = math.copysign(1.0, c1)
    if s2 > 0:
        c2 = math.copysign(1.0, c2)
    return c1, c2


def _pad(vertices: np.ndarray, count: int) -> np.ndarray:
    """Repeat the last vertex so convex polygons of different sizes stack into one array."""
    return np.concatenate([vertices, np.repeat(vertices[-1:], count - len(vertices), axis=0)])


def _fixed(polys: np.ndarray) -> np.ndarray:
    """Canvas coordinates as OpenCV's fixed-point integers."""
    return np.round(polys * _ONE).astype(np.int32)


_FONT: pygame.font.Font | None = None


def _score_font() -> pygame.font.Font:
    """The stock HUD's font, made once per process and again after ``pygame.quit()`` (an env's
    ``close``) invalidated it."""
    global _FONT
    if _FONT is not None and pygame.font.get_init():
        try:
            _FONT.size("0")  # raises when the font module was quit and started again since
            return _FONT
        except pygame.error:
            pass
    pygame.font.init()
    _FONT = pygame.font.Font(pygame.font.get_default_font(), 42)
    return _FONT

_HUD_CACHE: dict = {}  # area-averaged HUD regions, shared by every renderer of the process
_HUD_CACHE_SIZE = 20_000  # ~10 MB at most
# The HUD band's column regions (output pixels): the score left of the first bar, the speed bar
# (x 125..150 on the 1000-wide screen), the four wheel bars (175..275), the steering bar (500 ± 100:
# the joint stops at ±0.4 rad) and the gyro bar (from 750; cut at 604 where the steering region ends).
_HUD_COLS = {"score": slice(0, 12), "speed": slice(12, 15), "wheels": slice(15, 27), "steering": slice(38, 58), "gyro": slice(58, 96)}


class _Camera:
    """The stock camera on the supersampled canvas: ``canvas = M @ world + offset`` (transform + flip),
    kept as plain floats (numpy calls on 2×2 arrays cost more than the arithmetic)."""

    def __init__(self, env, scale_x: float, scale_y: float) -> None:
        hull = env.car.hull
        angle = -hull.angle
        zoom = 0.1 * SCALE * max(1 - env.t, 0) + ZOOM * SCALE * min(env.t, 1)
        x, y = hull.position
        c, s = math.cos(angle), math.sin(angle)
        translation_x = WINDOW_W / 2 - zoom * (x * c - y * s)
        translation_y = WINDOW_H / 4 - zoom * (x * s + y * c)
        self.zoom = zoom
        self.m = (c * zoom * scale_x, -s * zoom * scale_x, -s * zoom * scale_y, -c * zoom * scale_y)
        self.offset = (translation_x * scale_x, (WINDOW_H - translation_y) * scale_y)

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(M, offset) as arrays."""
        m00, m01, m10, m11 = self.m
        return np.array([[m00, m01], [m10, m11]]), np.array(self.offset)

    def world_from_output(self, supersample: int) -> tuple[float, ...]:
        """The affine (a, b, c, d, e, f) from output pixel (col, row) to world (a·col + b·row + c,
        d·col + e·row + f); output pixel i is canvas pixel block [s·i, s·i + s), centred at s·i + (s − 1)/2."""
        m00, m01, m10, m11 = self.m
        det = m00 * m11 - m01 * m10
        i00, i01, i10, i11 = m11 / det, -m01 / det, -m10 / det, m00 / det
        centre = (supersample - 1) / 2
        dx, dy = centre - self.offset[0], centre - self.offset[1]
        return (i00 * supersample, i01 * supersample, i00 * dx + i01 * dy,
                i10 * supersample, i11 * supersample, i10 * dx + i11 * dy)

    def body_affine(self, angle: float, x: float, y: float, origin: tuple[float, float]) -> tuple[float, ...]:
        """Row-vector affine (3×2, flattened) from a body's local frame to canvas minus ``origin``."""
        m00, m01, m10, m11 = self.m
        c, s = math.cos(angle), math.sin(angle)
        return (m00 * c + m01 * s, m10 * c + m11 * s,
                -m00 * s + m01 * c, -m10 * s + m11 * c,
                m00 * x + m01 * y + self.offset[0] - origin[0], m10 * x + m11 * y + self.offset[1] - origin[1])


class FastStateRenderer:
    """Draws ``state_pixels`` frames for a :class:`nsacdrive.envs.car_racing.NsacCarRacing`."""

    MAX_VERTICES = 8  # the largest convex fixture (the hull's middle part)

    def __init__(self, supersample: int = 4, raster_density: float = 6.0, footprint: float = OUTPUT_FOOTPRINT) -> None:
        """:param supersample: canvas pixels per output pixel for polygons drawn directly (the
            zoom-in, the car, the HUD); a power of two.
        :param raster_density: pixels per world unit of the track raster cut after the zoom-in
            (a whole number of pixels per grass period: 3, 6, 9, ...); 0 draws every frame
            polygon by polygon.
        :param footprint: side in world units of the box the raster is blurred with (one output pixel).
        """
        if supersample < 1 or supersample & (supersample - 1):
            raise ValueError(f"supersample must be a power of two (1, 2, 4, 8), got {supersample}")
        if raster_density:
            pattern_pixels(raster_density)  # raises on a density the grass pattern cannot tile
        self.supersample = supersample
        self.raster_density = float(raster_density)
        self.footprint = float(footprint)
        self.width = STATE_W * supersample
        self.height = STATE_H * supersample
        self._scale = (self.width / WINDOW_W, self.height / WINDOW_H)
        self._halvings = supersample.bit_length() - 1
        field = np.array([[(PLAYFIELD, PLAYFIELD), (PLAYFIELD, -PLAYFIELD), (-PLAYFIELD, -PLAYFIELD), (-PLAYFIELD, PLAYFIELD)]])
        self._static = np.concatenate([field, grass_patches()])  # background field, then grass patches
        self._raster: TrackRaster | None = None
        self._track_poly: list | None = None
        self._car = None  # the env's car the cached bodies belong to
        # The camera holds the hull at (W/2, 3H/4) of the screen: the car patch never moves.
        reach = CAR_REACH * ZOOM * SCALE
        self._car_cols = slice(math.floor((WINDOW_W / 2 - reach) * STATE_W / WINDOW_W),
                               math.ceil((WINDOW_W / 2 + reach) * STATE_W / WINDOW_W))
        self._car_rows = slice(math.floor((WINDOW_H * 3 / 4 - reach) * STATE_H / WINDOW_H),
                               min(math.ceil((WINDOW_H * 3 / 4 + reach) * STATE_H / WINDOW_H), HUD_ROW))
        self._car_origin = (self._car_cols.start * supersample, self._car_rows.start * supersample)

    def release(self) -> None:
        """Hand the raster's memory to the process's pool (the env is closing, or its track is gone):
        the next raster drawn in this process reuses it; a later reset draws a new raster."""
        if self._raster is not None:
            keep_buffer(self._raster.buffer)
            self._raster = None

    # ------------------------------------------------------------------ frame
    def render(self, env) -> np.ndarray:
        """The 96×96×3 uint8 state frame of ``env`` (an unwrapped NsacCarRacing after reset)."""
        camera = _Camera(env, *self._scale)
        scene = self._scene_from_raster(env, camera) if env.t >= 1 and self.raster_density else None
        frame = np.zeros((STATE_H, STATE_W, 3), dtype=np.uint8)  # HUD columns between the bar regions stay black
        frame[:HUD_ROW] = self._scene_from_polygons(env, camera) if scene is None else scene
        self._draw_car(frame, env.car, camera)
        self._draw_hud(frame, env)
        return apply_level_table(frame)

    def _shrink(self, canvas: np.ndarray) -> np.ndarray:
        """Area-average a supersampled canvas down to output pixels."""
        for _ in range(self._halvings):
            # An exact 2× bilinear shrink averages 2×2 blocks: repeated, a box (area) filter,
            # ~4× faster than one INTER_AREA resize (differences: ≤ 1 level of rounding).
            canvas = cv2.resize(canvas, (canvas.shape[1] // 2, canvas.shape[0] // 2), interpolation=cv2.INTER_LINEAR)
        return canvas

    # ------------------------------------------------------------------ scene
    def _scene_from_raster(self, env, camera: _Camera) -> np.ndarray | None:
        """Rows 0..83 before the level table, cut from the track's raster; None when the view
        leaves the raster."""
        if self._raster is None or self._raster.road_poly is not env.road_poly:  # a new reset
            self.release()  # the old track's memory, for this raster or a later one
            bg, grass = (tuple(int(c) for c in colour) for colour in (env.bg_color, env.grass_color))
            self._raster = TrackRaster(env.road_poly, env.tile_colours, self._static, [bg] + [grass] * (len(self._static) - 1),
                                       self.raster_density, self.footprint)
        self._raster.refresh()
        return self._raster.sample(camera.world_from_output(self.supersample), (HUD_ROW, STATE_W))

    def _sync_track(self, env) -> None:
        """Cache the static polygons of the current track (rebuilt when the env resets)."""
        if env.road_poly is not self._track_poly:  # identity, not id(): a freed list's id can come back
            road = np.array([poly for poly, _ in env.road_poly], dtype=np.float64).reshape(-1, 4, 2)
            self._scene = np.concatenate([self._static, road])
            self._scene_centres = self._scene.mean(axis=1)
            self._scene_radii = np.linalg.norm(self._scene - self._scene_centres[:, None], axis=2).max(axis=1)
            # Tile colours are rows of env.tile_colours, repainted in place on contact: keep references.
            self._road_colours = [colour for _, colour in env.road_poly]
            self._track_poly = env.road_poly

    def _scene_from_polygons(self, env, camera: _Camera) -> np.ndarray:
        """Rows 0..83 before the level table, polygon by polygon on the supersampled canvas (the zoom-in)."""
        self._sync_track(env)
        canvas = np.zeros((HUD_ROW * self.supersample, self.width, 3), dtype=np.uint8)
        matrix, offset = camera.matrix()
        # Cull on bounding circles first: only polygons near the canvas get their vertices moved.
        centres = self._scene_centres @ matrix.T + offset
        margin = self._scene_radii * (camera.zoom * max(self._scale)) + 1
        visible = np.flatnonzero(
            (centres[:, 0] >= -margin) & (centres[:, 0] <= canvas.shape[1] + margin)
            & (centres[:, 1] >= -margin) & (centres[:, 1] <= canvas.shape[0] + margin)
        )
        n_static = len(self._static)
        colours = [tuple(int(c) for c in env.bg_color)] if len(visible) and visible[0] == 0 else []
        colours += [tuple(int(c) for c in env.grass_color)] * int(np.count_nonzero((visible > 0) & (visible < n_static)))
        road = visible[visible >= n_static] - n_static
        if len(road):
            colours += [tuple(c) for c in np.array([self._road_colours[i] for i in road]).astype(int).tolist()]
        for poly, colour in zip(_fixed(self._scene[visible] @ matrix.T + offset), colours, strict=True):
            cv2.fillConvexPoly(canvas, poly, colour, cv2.LINE_AA, _SHIFT)
        return self._shrink(canvas)

    # ------------------------------------------------------------------ car
    def _sync_car(self, car) -> None:
        """Cache the car's bodies (wheels first, the hull last: the stock drawing order), the wheels'
        local corners and the hull's local polygons (padded to MAX_VERTICES)."""
        if car is not self._car:  # identity, not id(): a new car can take a freed one's address
            self._car_bodies = list(car.drawlist)
            *wheels, hull = self._car_bodies
            self._wheel_corners = [[tuple(v) for v in wheel.fixtures[0].shape.vertices] for wheel in wheels]
            self._wheel_colour = tuple(int(c * 255) for c in wheels[0].color)
            self._hull_local = np.stack([_pad(np.array(f.shape.vertices, dtype=np.float64), self.MAX_VERTICES) for f in hull.fixtures])
            self._hull_colour = tuple(int(c * 255) for c in hull.color)
            self._hull_zoom: float | None = None
            self._car = car

    def _hull_layer(self, camera: _Camera, hull) -> tuple[np.ndarray, np.ndarray]:
        """The hull's colour and footprint on the supersampled car patch. The camera holds the hull
        still at a given zoom (its rotation cancels the hull's), so after the zoom-in it is drawn
        once and reused."""
        if camera.zoom != self._hull_zoom:
            x, y = hull.position
            affine = np.array(camera.body_affine(hull.angle, x, y, self._car_origin)).reshape(3, 2)
            rows, cols = self._car_rows.stop - self._car_rows.start, self._car_cols.stop - self._car_cols.start
            mask = np.zeros((rows * self.supersample, cols * self.supersample), dtype=np.uint8)
            for poly in _fixed(self._hull_local @ affine[:2] + affine[2]):
                cv2.fillConvexPoly(mask, poly, 1, cv2.LINE_8, _SHIFT)
            colour = np.empty((*mask.shape, 3), dtype=np.uint8)
            colour[:] = self._hull_colour
            self._hull, self._hull_zoom = (colour, mask), camera.zoom
        return self._hull

    def _draw_car(self, frame: np.ndarray, car, camera: _Camera) -> None:
        """Wheels, their white stripes, then the hull, filled like ``pygame.draw.polygon`` (no
        anti-aliasing) on the supersampled scene under the car and area-averaged back: coverage-weighted
        compositing. On this hot path every numpy/OpenCV call costs more than the arithmetic around
        it, so corners are computed as plain fixed-point numbers and each colour is one call."""
        self._sync_car(car)
        *wheels, hull = self._car_bodies
        half_width, radius = car_dynamics.WHEEL_W * car_dynamics.SIZE, car_dynamics.WHEEL_R * car_dynamics.SIZE
        wheel_corners, stripe_corners = [], []
        for wheel, corners in zip(wheels, self._wheel_corners, strict=True):
            x, y = wheel.position
            a, b, c, d, e, f = (value * _ONE for value in camera.body_affine(wheel.angle, x, y, self._car_origin))
            wheel_corners += [(round(u * a + v * c + e), round(u * b + v * d + f)) for u, v in corners]
            ends = _wheel_stripe(wheel.phase)
            if ends is not None:
                y1, y2 = radius * ends[0], radius * ends[1]
                stripe_corners += [(round(u * a + v * c + e), round(u * b + v * d + f))
                                   for u, v in ((-half_width, y1), (half_width, y1), (half_width, y2), (-half_width, y2))]
        quads = np.array(wheel_corners + stripe_corners, dtype=np.int32).reshape(-1, 4, 2)
        hull_colour, hull_mask = self._hull_layer(camera, hull)
        view = frame[self._car_rows, self._car_cols]
        patch = cv2.resize(view, None, fx=self.supersample, fy=self.supersample, interpolation=cv2.INTER_NEAREST)
        cv2.fillPoly(patch, quads[:len(wheels)], self._wheel_colour, cv2.LINE_8, _SHIFT)
        if stripe_corners:
            cv2.fillPoly(patch, quads[len(wheels):], car_dynamics.WHEEL_WHITE, cv2.LINE_8, _SHIFT)
        cv2.copyTo(hull_colour, hull_mask, patch)
        view[:] = self._shrink(patch)

    # ------------------------------------------------------------------ HUD
    def _draw_hud(self, frame: np.ndarray, env) -> None:
        """Rows 84..95 before the level table: the black band, the stock indicator bars and the score,
        as five column regions (score, speed, the four wheels, steering, gyro), each area-averaged
        once per distinct look and cached for the whole process."""
        car = env.car
        vx, vy = car.hull.linearVelocity
        speed = math.sqrt(vx * vx + vy * vy)
        omegas = [wheel.omega for wheel in car.wheels]
        steering, yaw_rate = car.wheels[0].joint.angle, car.hull.angularVelocity
        band = frame[HUD_ROW:]
        band[:, _HUD_COLS["score"]] = self._cached(("score", f"{env.reward:04.0f}"), self._score_region)
        band[:, _HUD_COLS["speed"]] = self._cached(("speed", ((5, self._bar_top(0.02 * speed, speed), (255, 255, 255)),)),
                                                   self._vertical_bars_region)
        wheels = tuple((place, self._bar_top(0.01 * omega, omega), colour) for place, omega, colour
                       in zip((7, 8, 9, 10), omegas, ((0, 0, 255),) * 2 + ((51, 0, 255),) * 2, strict=True))
        band[:, _HUD_COLS["wheels"]] = self._cached(("wheels", wheels), self._vertical_bars_region)
        band[:, _HUD_COLS["steering"]] = self._cached(("steering", 20, self._bar_end(20, -10.0 * steering, steering), (0, 255, 0)),
                                                      self._horizontal_bar_region)
        band[:, _HUD_COLS["gyro"]] = self._cached(("gyro", 30, self._bar_end(30, -0.8 * yaw_rate, yaw_rate), (255, 0, 0)),
                                                  self._horizontal_bar_region)

    def _bar_top(self, length: float, value: float) -> int | None:
        """A vertical bar's top edge in strip rows (its bottom is fixed at H − h), None when hidden."""
        if abs(value) <= 1e-4:
            return None
        return round((WINDOW_H - _HUD_H * (1 + length)) * self._scale[1]) - HUD_ROW * self.supersample

    def _bar_end(self, place: int, length: float, value: float) -> int | None:
        """A horizontal bar's free end in strip columns (it starts at place·s), None when hidden."""
        return None if abs(value) <= 1e-4 else round((place + length) * _HUD_S * self._scale[0])

    def _cached(self, look: tuple, draw) -> np.ndarray:
        """The output pixels of one HUD region, drawn by ``draw(*look)`` once per look and supersample."""
        key = (*look, self.supersample)
        region = _HUD_CACHE.get(key)
        if region is None:
            region = draw(*look)
            if len(_HUD_CACHE) >= _HUD_CACHE_SIZE:
                _HUD_CACHE.clear()  # a spinning car can show many looks; a cold cache only costs time
            _HUD_CACHE[key] = region
        return region

    def _strip(self, region: str) -> np.ndarray:
        """A black supersampled HUD strip for the output columns of ``region``."""
        cols = _HUD_COLS[region]
        return np.zeros(((STATE_H - HUD_ROW) * self.supersample, (cols.stop - cols.start) * self.supersample, 3), dtype=np.uint8)

    def _shrink_strip(self, strip: np.ndarray) -> np.ndarray:
        return cv2.resize(strip, (strip.shape[1] // self.supersample, STATE_H - HUD_ROW), interpolation=cv2.INTER_AREA)

    def _score_region(self, region: str, text: str) -> np.ndarray:
        strip, s, (sx, sy) = self._strip(region), self.supersample, self._scale
        pixels, (x, y) = self._score_bitmap(text)
        c0, r0 = round(x * sx), round(y * sy) - HUD_ROW * s
        c1, r1 = round((x + pixels.shape[1]) * sx), round((y + pixels.shape[0]) * sy) - HUD_ROW * s
        strip[r0:r1, c0:c1] = cv2.resize(pixels, (c1 - c0, r1 - r0), interpolation=cv2.INTER_AREA)
        return self._shrink_strip(strip)

    def _vertical_bars_region(self, region: str, bars: tuple) -> np.ndarray:
        strip, s, (sx, sy) = self._strip(region), self.supersample, self._scale
        bottom, left = round((WINDOW_H - _HUD_H) * sy) - HUD_ROW * s, _HUD_COLS[region].start * s
        for place, top, colour in bars:
            if top is not None:
                r0, r1 = sorted((max(top, 0), bottom))
                strip[r0:r1, round(place * _HUD_S * sx) - left:round((place + 1) * _HUD_S * sx) - left] = colour
        return self._shrink_strip(strip)

    def _horizontal_bar_region(self, region: str, place: int, end: int | None, colour: tuple[int, int, int]) -> np.ndarray:
        strip, s, (sx, sy) = self._strip(region), self.supersample, self._scale
        if end is not None:
            left = _HUD_COLS[region].start * s
            r0, r1 = (round((WINDOW_H - k * _HUD_H) * sy) - HUD_ROW * s for k in (4, 2))
            c0, c1 = sorted((round(place * _HUD_S * sx) - left, end - left))
            strip[r0:r1, max(c0, 0):max(c1, 0)] = colour
        return self._shrink_strip(strip)

    def _score_bitmap(self, text: str) -> tuple[np.ndarray, tuple[int, int]]:
        """The stock score text (white on black), and its top-left corner on the 1000×800 canvas."""
        surface = _score_font().render(text, True, (255, 255, 255), (0, 0, 0))
        rect = surface.get_rect()
        rect.center = (60, int(WINDOW_H - WINDOW_H * 2.5 / 40.0))
        pixels = np.frombuffer(pygame.image.tobytes(surface, "RGB"), dtype=np.uint8)  # 6× faster than surfarray
        pixels = pixels.reshape(surface.get_height(), surface.get_width(), 3)
        return pixels, (rect.left, rect.top)
