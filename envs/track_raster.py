"""The static scene of one CarRacing track, drawn once in world-aligned pixels and cut per frame.

Field, grass patches and road tiles never move, so after the zoom-in the fast renderer cuts each
frame's rotated view out of a raster of ``density`` pixels per world unit with one bilinear warp
instead of filling every polygon again. The raster is drawn anti-aliased in the stock drawing
order and blurred with the footprint of one 96×96 output pixel (the area average that stock
``smoothscale`` performs). It covers the road's bounding box plus the camera's reach, and is
built lazily in square chunks as the view first reaches them: a chunk away from the road and
the field's edge is a copy of the blurred grass pattern (periodic with period ``2·GRASS_DIM``);
a chunk near the road is drawn. A tile the car repaints (``tile.color[:] = road_color`` on
contact) is updated by adding its blurred coverage times the colour change.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
from gymnasium.envs.box2d.car_racing import GRASS_DIM, PLAYFIELD

_SHIFT = 4  # OpenCV sub-pixel bits: coordinates in 1/16 pixel
_ONE = 1 << _SHIFT
GRASS_PERIOD = 2 * GRASS_DIM  # world units: the grass patches repeat every other GRASS_DIM square
VIEW_REACH = 50.0  # world units: no part of the 96×84 view lies farther from the car (≤ 48.2)


#: buffers of finished rasters (a closed env's, a reset env's old track), kept for the next track
#: of this process (the largest SPARE_LIMIT)
_SPARE: list[np.ndarray] = []
SPARE_LIMIT = 32  # one lockstep group of envs


def keep_buffer(buffer: np.ndarray) -> None:
    """Keep a finished raster's memory for a later track: every episode makes a new env, and
    touching a fresh raster's pages for the first time cost ~14 % of the pixel env's step."""
    _SPARE.append(buffer)
    _SPARE.sort(key=lambda spare: spare.size)
    del _SPARE[:-SPARE_LIMIT]


def take_buffer(size: int) -> np.ndarray:
    """The smallest kept buffer of at least ``size`` bytes (its content is stale: a raster
    draws every chunk before reading it), else new memory."""
    for index, spare in enumerate(_SPARE):
        if spare.size >= size:
            return _SPARE.pop(index)
    return np.empty(size, dtype=np.uint8)


def box_kernel(width: float) -> np.ndarray:
    """A 1-D box of fractional ``width`` pixels (the two end taps weighted by the fraction), sum 1."""
    if width < 1:
        raise ValueError(f"box width must be at least one pixel, got {width}")
    whole = int(math.floor(width))
    if whole % 2 == 0:  # an odd number of whole taps keeps the kernel centred
        whole -= 1
    edge = (width - whole) / 2
    taps = np.concatenate([[edge], np.ones(whole), [edge]]) if edge > 0 else np.ones(whole)
    return (taps / taps.sum()).astype(np.float32)


def pattern_pixels(density: float) -> int:
    """The grass period in raster pixels; ``density`` must make it a whole number."""
    period = GRASS_PERIOD * density
    if density <= 0 or abs(period - round(period)) > 1e-9:
        raise ValueError(f"density must make the grass period (2·GRASS_DIM = {GRASS_PERIOD:.4f} world units) "
                         f"a whole number of pixels, e.g. 3, 4.5 or 6 px per unit; got {density}")
    return round(period)


class TrackRaster:
    """World-aligned, footprint-blurred raster of one track's field, grass and road. Its memory is a
    kept buffer of an earlier raster of this process (:func:`take_buffer`: its pages are already
    mapped, and first touches of fresh memory are slow on virtual machines) or new memory.

    :param road_poly: the env's ``road_poly`` list of (vertices, colour) in drawing order.
    :param tile_colours: the env's (n_tiles, 3) array of tile colours, repainted in place on
        contact; its rows are the road_poly colours that are arrays, in order.
    :param scene: background polygons (field, then grass patches) in world units, shape (N, 4, 2).
    :param colours: one colour for each scene polygon.
    :param density: raster pixels per world unit (a whole number of pixels per grass period).
    :param footprint: side in world units of the box the raster is blurred with (one output pixel).
    """

    def __init__(self, road_poly: list, tile_colours: np.ndarray, scene: np.ndarray, colours: list[tuple[int, int, int]],
                 density: float, footprint: float) -> None:
        self.road_poly = road_poly
        self.density = float(density)
        period = pattern_pixels(self.density)
        self.chunk = period // 2
        self._scene_colours = colours
        self._kernel = box_kernel(footprint * self.density)
        self._pad = len(self._kernel) // 2 + 2  # blur reach + anti-aliasing fringe, in pixels
        road = np.array([vertices for vertices, _ in road_poly], dtype=np.float64).reshape(-1, 4, 2)
        # the origin is a multiple of the grass period, so the pattern repeats from pixel (0, 0)
        low = road.reshape(-1, 2).min(axis=0) - VIEW_REACH
        high = road.reshape(-1, 2).max(axis=0) + VIEW_REACH
        self.origin = np.floor(low / GRASS_PERIOD) * GRASS_PERIOD
        self._origin = (float(self.origin[0]), float(self.origin[1]))
        cols, rows = np.ceil((high - self.origin) * self.density / self.chunk).astype(int) + 1
        size = rows * cols * self.chunk**2 * 3
        self.buffer = take_buffer(size)
        self.image = self.buffer[:size].reshape(rows * self.chunk, cols * self.chunk, 3)
        self._built = np.zeros((rows, cols), dtype=bool)
        self._scene_fixed, self._scene_boxes = self._to_pixels(scene)
        self._road_fixed, self._road_boxes = self._to_pixels(road)
        self._tile_rows = np.array([index for index, (_, colour) in enumerate(road_poly) if isinstance(colour, np.ndarray)])
        self._road_colours = [colour for _, colour in road_poly]  # tuples for kerbs, live tile_colours rows
        self.tile_colours = tile_colours
        self._drawn_tile_colours = tile_colours.copy()
        self._drawn_by_chunk = self._chunks_to_draw()
        centre = np.round(-self.origin * self.density).astype(int)  # world (0, 0): deep inside the field
        self._pattern = np.tile(self._draw(centre[1], centre[1] + period, centre[0], centre[0] + period, road=False), (2, 2, 1))

    @property
    def shape(self) -> tuple[int, int]:
        return self.image.shape[:2]

    def _to_pixels(self, polys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Polygons in fixed-point raster pixels, and their bounding boxes (row0, row1, col0, col1) in pixels."""
        pixels = (polys - self.origin) * self.density
        low, high = np.floor(pixels.min(axis=1)), np.ceil(pixels.max(axis=1))
        boxes = np.stack([low[:, 1], high[:, 1], low[:, 0], high[:, 0]], axis=1).astype(int)
        return np.round(pixels * _ONE).astype(np.int32), boxes

    def _chunks_to_draw(self) -> np.ndarray:
        """Chunks that are not a copy of the grass pattern: near a road polygon or the field's edge."""
        reach, c = self._pad + 1, self.chunk
        near = np.zeros_like(self._built)
        for row0, row1, col0, col1 in self._road_boxes:
            near[max(row0 - reach, 0) // c:(row1 + reach) // c + 1, max(col0 - reach, 0) // c:(col1 + reach) // c + 1] = True
        inside = []
        for axis in (1, 0):  # rows follow world y, columns world x
            first = math.ceil(((-PLAYFIELD - self.origin[axis]) * self.density + reach) / c)
            stop = math.floor(((PLAYFIELD - self.origin[axis]) * self.density - reach) / c)
            index = np.arange(near.shape[1 - axis])
            inside.append((index >= first) & (index < stop))
        return near | ~(inside[0][:, None] & inside[1][None, :])

    def _draw(self, row0: int, row1: int, col0: int, col1: int, road: bool = True) -> np.ndarray:
        """Raster rows [row0, row1) × cols [col0, col1) drawn from scratch in the stock order and
        blurred, with a fringe so the blur and the anti-aliasing see the same neighbourhood as
        anywhere else."""
        pad = self._pad
        top, left, bottom, right = row0 - pad, col0 - pad, row1 + pad, col1 + pad
        window = np.zeros((bottom - top, right - left, 3), dtype=np.uint8)
        shift = np.array([left, top], dtype=np.int32) * _ONE
        scene = self._overlapping(self._scene_boxes, top, bottom, left, right)
        for poly, index in zip(self._scene_fixed[scene] - shift, scene.tolist(), strict=True):
            cv2.fillConvexPoly(window, poly, self._scene_colours[index], cv2.LINE_AA, _SHIFT)
        if road:
            polys = self._overlapping(self._road_boxes, top, bottom, left, right)
            colours = self._road_colours
            for poly, index in zip(self._road_fixed[polys] - shift, polys.tolist(), strict=True):
                cv2.fillConvexPoly(window, poly, tuple(int(c) for c in colours[index]), cv2.LINE_AA, _SHIFT)
        blurred = cv2.sepFilter2D(window, -1, self._kernel, self._kernel, borderType=cv2.BORDER_REPLICATE)
        return blurred[pad:-pad, pad:-pad]

    @staticmethod
    def _overlapping(boxes: np.ndarray, top: int, bottom: int, left: int, right: int) -> np.ndarray:
        """Indices of the boxes that reach into rows [top, bottom) × cols [left, right) (one pixel of slack)."""
        return np.flatnonzero((boxes[:, 1] >= top - 1) & (boxes[:, 0] <= bottom)
                              & (boxes[:, 3] >= left - 1) & (boxes[:, 2] <= right))

    def _build(self, rows: range, cols: range) -> None:
        """Make the chunks rows × cols: the ones near the road drawn in one window, the rest copied
        from the grass pattern."""
        c = self.chunk
        wanted = np.zeros_like(self._built)
        wanted[rows.start:rows.stop, cols.start:cols.stop] = True
        wanted &= ~self._built
        drawn = np.argwhere(wanted & self._drawn_by_chunk)
        if len(drawn):
            (row0, col0), (row1, col1) = drawn.min(axis=0) * c, (drawn.max(axis=0) + 1) * c
            self.image[row0:row1, col0:col1] = self._draw(row0, row1, col0, col1)
            self._built[row0 // c:row1 // c, col0 // c:col1 // c] = True
            wanted &= ~self._built
        period = self._pattern.shape[0] // 2
        for row, col in np.argwhere(wanted).tolist():
            r, k = (row * c) % period, (col * c) % period
            self.image[row * c:(row + 1) * c, col * c:(col + 1) * c] = self._pattern[r:r + c, k:k + c]
            self._built[row, col] = True

    def refresh(self) -> int:
        """Apply tile repaints since the last call to the built chunks; how many tiles changed.

        A repaint adds (new − old colour) × the tile's blurred share of each pixel: within one
        level of drawing the region again (rounding)."""
        if self.tile_colours.tobytes() == self._drawn_tile_colours.tobytes():  # ~10× cheaper than array_equal here
            return 0
        changed = np.flatnonzero(np.any(self.tile_colours != self._drawn_tile_colours, axis=1))
        pad, (height, width) = self._pad, self.shape
        for tile in changed.tolist():
            change = self.tile_colours[tile].astype(int) - self._drawn_tile_colours[tile].astype(int)
            self._drawn_tile_colours[tile] = self.tile_colours[tile]
            row0, row1, col0, col1 = self._road_boxes[self._tile_rows[tile]].tolist()
            top, left = max(row0 - pad, 0), max(col0 - pad, 0)
            bottom, right = min(row1 + pad + 1, height), min(col1 + pad + 1, width)
            if bottom <= top or right <= left or not change.any():
                continue
            # the tile's share of each pixel in the painter's order: its own anti-aliased coverage,
            # less what road polygons drawn after it cover
            index, shift = self._tile_rows[tile], np.array([left, top], dtype=np.int32) * _ONE
            mask = np.zeros((bottom - top, right - left), dtype=np.uint8)
            cv2.fillConvexPoly(mask, self._road_fixed[index] - shift, 255, cv2.LINE_AA, _SHIFT)
            later = self._overlapping(self._road_boxes, top, bottom, left, right)
            for poly in self._road_fixed[later[later > index]] - shift:
                cv2.fillConvexPoly(mask, poly, 0, cv2.LINE_AA, _SHIFT)
            coverage = cv2.sepFilter2D(mask, cv2.CV_32F, self._kernel, self._kernel, borderType=cv2.BORDER_CONSTANT)
            # (h, w, 3): one float32 product per channel, merged (4× the speed of cv2.transform's 1 → 3 path)
            delta = cv2.merge([coverage * scale for scale in change.astype(np.float32) / 255])
            region = self.image[top:bottom, left:right]
            cv2.add(region, delta, dst=region, dtype=cv2.CV_8U)  # rounds and saturates
        return len(changed)

    def sample(self, world_from_output: tuple[float, ...], size: tuple[int, int]) -> np.ndarray | None:
        """The (rows, cols, 3) view whose output pixel (col, row) lies at world (a·col + b·row + c,
        d·col + e·row + f) for ``world_from_output`` = (a, b, c, d, e, f); None when part of it
        falls outside the raster. Plain floats: numpy calls on a 2×3 matrix cost more than the arithmetic."""
        rho, (x0, y0) = self.density, self._origin
        a, b, c, d, e, f = (v * rho for v in world_from_output)
        c, f = c - x0 * rho, f - y0 * rho
        rows, cols = size
        # the view's bounding box in raster pixels: four corners of an affine map
        xs = (c, c + a * (cols - 1), c + b * (rows - 1), c + a * (cols - 1) + b * (rows - 1))
        ys = (f, f + d * (cols - 1), f + e * (rows - 1), f + d * (cols - 1) + e * (rows - 1))
        col_low, col_high = math.floor(min(xs)), math.ceil(max(xs)) + 1
        row_low, row_high = math.floor(min(ys)), math.ceil(max(ys)) + 1
        height, width = self.shape
        if min(col_low, row_low) < 0 or col_high >= width or row_high >= height:
            return None
        chunk_rows = range(row_low // self.chunk, row_high // self.chunk + 1)
        chunk_cols = range(col_low // self.chunk, col_high // self.chunk + 1)
        if not self._built[chunk_rows.start:chunk_rows.stop, chunk_cols.start:chunk_cols.stop].all():
            self._build(chunk_rows, chunk_cols)
        affine = np.array([[a, b, c], [d, e, f]])
        return cv2.warpAffine(self.image, affine, (cols, rows), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP)
