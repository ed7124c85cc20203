"""The track raster behind the fast renderer: lazily built chunks, repaints, falling back to polygons."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.envs.box2d.car_racing import CarRacing
from hypothesis import given
from hypothesis import strategies as st

from nsacdrive.envs import make_car_racing, track_raster
from nsacdrive.envs.fast_render import OUTPUT_FOOTPRINT, FastStateRenderer, _Camera
from nsacdrive.envs.track_raster import TrackRaster, box_kernel, pattern_pixels


def raster_of(env, density: float = 6.0) -> TrackRaster:
    renderer = FastStateRenderer(raster_density=density)
    base = env.unwrapped
    colours = [tuple(int(c) for c in base.bg_color)] + [tuple(int(c) for c in base.grass_color)] * (len(renderer._static) - 1)
    return TrackRaster(base.road_poly, base.tile_colours, renderer._static, colours, density, OUTPUT_FOOTPRINT)


@pytest.fixture(scope="module")
def env():
    env = make_car_racing(render_observations=False, renderer="fast", max_episode_steps=200)
    env.reset(seed=4)
    yield env
    env.close()


@given(width=st.floats(1.0, 9.0))
def test_box_kernel_is_normalised_symmetric_and_as_wide_as_asked(width):
    kernel = box_kernel(width).astype(np.float64)
    assert kernel.sum() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(kernel, kernel[::-1], atol=1e-7)
    assert len(kernel) % 2 == 1
    taps = np.arange(len(kernel)) - len(kernel) // 2
    # a box of width w has variance w²/12 for a continuous box; the tapped one stays close to it
    assert abs(float((kernel * taps**2).sum()) - width**2 / 12) < 0.35


def test_density_must_tile_the_grass_pattern():
    assert pattern_pixels(6.0) == 200 and pattern_pixels(4.5) == 150
    with pytest.raises(ValueError, match="whole number of pixels"):
        pattern_pixels(5.0)
    with pytest.raises(ValueError, match="raster_density|whole number"):
        FastStateRenderer(raster_density=4.0)


def test_lazy_chunks_equal_one_window_drawn_from_scratch(env):
    """Chunks built one view at a time, the grass ones copied from the periodic pattern, give the
    same pixels as drawing the whole region in one window."""
    raster = raster_of(env)
    rows, cols = raster._built.shape
    middle_rows, middle_cols = range(rows // 2 - 3, rows // 2 + 3), range(cols // 2 - 3, cols // 2 + 3)
    for row in middle_rows:  # built in pieces, as a moving view would
        raster._build(range(row, row + 1), middle_cols)
    assert raster._built[middle_rows.start:middle_rows.stop, middle_cols.start:middle_cols.stop].all()
    assert not raster._drawn_by_chunk.all() and raster._drawn_by_chunk.any()  # both kinds of chunk occur
    c = raster.chunk
    top, bottom, left, right = middle_rows.start * c, middle_rows.stop * c, middle_cols.start * c, middle_cols.stop * c
    whole = raster._draw(top, bottom, left, right)
    np.testing.assert_array_equal(raster.image[top:bottom, left:right], whole)


def test_a_repainted_tile_updates_the_raster_within_one_level(env):
    raster = raster_of(env)
    base = env.unwrapped
    tile = next(i for i, colour in enumerate(base.tile_colours) if np.any(colour != base.road_color))
    row0, row1, col0, col1 = raster._road_boxes[raster._tile_rows[tile]]
    c = raster.chunk
    raster._build(range(row0 // c - 1, row1 // c + 2), range(col0 // c - 1, col1 // c + 2))
    before = raster.image.copy()
    original = base.tile_colours[tile].copy()
    try:
        base.tile_colours[tile] = base.road_color  # what the stock contact listener does
        assert raster.refresh() == 1
        assert raster.refresh() == 0  # seen once
        redrawn = raster._draw(row0 - c, row1 + c, col0 - c, col1 + c)
        updated = raster.image[row0 - c:row1 + c, col0 - c:col1 + c].astype(int)
        assert np.abs(updated - redrawn.astype(int)).max() <= 1
        assert np.abs(updated - before[row0 - c:row1 + c, col0 - c:col1 + c].astype(int)).max() >= 2  # it did change
    finally:
        base.tile_colours[tile] = original


def test_env_tiles_share_one_colour_array():
    env = make_car_racing(render_observations=False, max_episode_steps=200)
    env.reset(seed=2)
    base = env.unwrapped
    assert base.tile_colours.shape == (len(base.road), 3)
    tile_rows = [colour for _, colour in base.road_poly if isinstance(colour, np.ndarray)]
    for tile, row, view in zip(base.road, base.tile_colours, tile_rows, strict=True):
        assert tile.color is view and np.shares_memory(view, base.tile_colours)
        np.testing.assert_array_equal(row, tile.color)
    for _ in range(60):  # the car drives over tiles: the stock listener repaints them in place
        env.step(np.array([0.0, 0.5, 0.0], dtype=np.float32))
    assert np.all(base.tile_colours[:3] == base.road_color)
    env.close()


def frames_against_stock(env, actions) -> list[float]:
    maes = []
    for action in actions:
        env.step(action)
        fast, stock = env.unwrapped.render_observation(), CarRacing._render(env.unwrapped, "state_pixels")
        maes.append(float(np.abs(fast.astype(float) - stock.astype(float)).mean()))
    return maes


def test_a_second_episode_reuses_the_raster_memory_and_still_matches_stock(monkeypatch):
    monkeypatch.setattr(track_raster, "_SPARE", [])  # this test's own pool
    env = make_car_racing(render_observations=False, renderer="fast", max_episode_steps=200)
    actions = [np.array([0.1 * np.sin(t / 9), 0.4, 0.0], dtype=np.float32) for t in range(90)]
    renderer = env.unwrapped._fast_renderer
    env.reset(seed=8)
    first = frames_against_stock(env, actions)
    buffer = renderer._raster.buffer
    env.reset(seed=9)
    second = frames_against_stock(env, actions)
    assert renderer._raster.road_poly is env.unwrapped.road_poly  # a new track's raster ...
    assert renderer._raster.buffer is buffer or renderer._raster.buffer.size > buffer.size  # ... in the old memory
    assert max(first[50:] + second[50:]) <= 2.0 and np.mean(second[50:]) <= 1.0
    env.close()


def episode_frames(seed: int, actions) -> tuple[list[np.ndarray], np.ndarray]:
    """The fast renderer's frames of one episode in a new env, and the memory its raster used."""
    env = make_car_racing(renderer="fast", max_episode_steps=200)
    env.reset(seed=seed)
    frames = [env.step(action)[0] for action in actions]
    buffer = env.unwrapped._fast_renderer._raster.buffer
    env.close()
    return frames, buffer


def test_a_new_env_takes_a_closed_envs_raster_memory_and_draws_the_same_frames(monkeypatch):
    monkeypatch.setattr(track_raster, "_SPARE", [])  # this test's own pool
    actions = [np.array([0.1 * np.sin(t / 9), 0.4, 0.0], dtype=np.float32) for t in range(80)]
    fresh, fresh_memory = episode_frames(7, actions)  # new memory; closing keeps it
    assert track_raster._SPARE == [fresh_memory]
    episode_frames(3, actions)  # another track written over that memory, kept again
    again, reused = episode_frames(7, actions)  # the stale memory of track 3
    assert reused is fresh_memory
    for a, b in zip(fresh, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_pool_keeps_the_largest_buffers_and_hands_out_the_smallest_that_fits(monkeypatch):
    monkeypatch.setattr(track_raster, "_SPARE", [])
    monkeypatch.setattr(track_raster, "SPARE_LIMIT", 2)
    small, middle, large = (np.empty(size, dtype=np.uint8) for size in (10, 20, 30))
    for buffer in (middle, small, large):
        track_raster.keep_buffer(buffer)
    assert [b.size for b in track_raster._SPARE] == [20, 30]  # the smallest went
    assert track_raster.take_buffer(15) is middle
    assert track_raster.take_buffer(31).size == 31 and track_raster._SPARE == [large]  # none fits: new memory


def test_the_view_off_the_raster_falls_back_to_polygons_and_matches_stock():
    """Driving straight into the grass until the view leaves the raster's box (road + camera reach)."""
    env = make_car_racing(render_observations=False, renderer="fast", max_episode_steps=1000)
    env.reset(seed=1)
    base = env.unwrapped
    renderer = base._fast_renderer
    fell_back = None
    for t in range(900):
        base.car.hull.angularVelocity = 0.0
        env.step(np.array([0.0, 1.0, 0.0], dtype=np.float32))
        if t > 60:
            base.render_observation()
            camera = _Camera(base, *renderer._scale)
            if renderer._raster.sample(camera.world_from_output(renderer.supersample), (84, 96)) is None:
                fell_back = t
                break
        if abs(base.car.hull.position[0]) > 320 or abs(base.car.hull.position[1]) > 320:
            break
    if fell_back is None:
        pytest.skip("the car never left the raster's box on this track")
    fast, stock = base.render_observation(), CarRacing._render(base, "state_pixels")
    assert np.abs(fast.astype(float) - stock.astype(float)).mean() <= 1.0
    env.close()
