"""TrackGeometry on hand-built tracks with known answers, plus hypothesis properties.

Conventions under test (envs/geometry.py): lateral error > 0 right of travel, heading error > 0
when the hull points left of travel (hull forward vector is (-sin a, cos a)), curvature > 0 for
left (counter-clockwise) turns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from track_fixtures import densified_rectangle

from nsacdrive.envs.geometry import TRACK_HALF_WIDTH, TrackGeometry, wrap_angle

# --------------------------------------------------------------------------- tracks


def circle(radius: float, n: int = 720, centre=(0.0, 0.0), ccw: bool = True) -> TrackGeometry:
    theta = np.linspace(0.0, 2 * np.pi, n, endpoint=False)
    if not ccw:
        theta = -theta
    points = np.stack([centre[0] + radius * np.cos(theta), centre[1] + radius * np.sin(theta)], axis=1)
    return TrackGeometry(points)


def polygon_arc_length(radius: float, n: int) -> float:
    return n * 2 * radius * math.sin(math.pi / n)


# A long thin loop travelled counter-clockwise: +x along y=0, up at x=100, -x along y=10, down at x=0.
RECTANGLE = TrackGeometry(np.array([[0.0, 0.0], [100.0, 0.0], [100.0, 10.0], [0.0, 10.0]]))


def hull_angle_for(direction_angle: float) -> float:
    """Hull angle (env convention, forward = (-sin a, cos a)) that points along a math-convention direction."""
    return direction_angle - np.pi / 2


# --------------------------------------------------------------------------- construction


def test_constructor_rejects_bad_shapes_and_zero_length_segments():
    with pytest.raises(ValueError, match="shape"):
        TrackGeometry(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        TrackGeometry(np.zeros((5, 3)))
    with pytest.raises(ValueError, match="zero-length"):
        TrackGeometry(np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    # closing segment (last -> first) counts too
    with pytest.raises(ValueError, match="zero-length"):
        TrackGeometry(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))


def test_from_env_track_uses_x_y_columns_and_checks_shape():
    track = [(0.1, 0.2, 0.0, 0.0), (0.3, 0.4, 100.0, 0.0), (0.5, 0.6, 100.0, 10.0), (0.7, 0.8, 0.0, 10.0)]
    geometry = TrackGeometry.from_env_track(track)
    np.testing.assert_array_equal(geometry.points, RECTANGLE.points)
    assert geometry.length == 220.0
    with pytest.raises(ValueError, match="alpha, beta, x, y"):
        TrackGeometry.from_env_track([(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)])


def test_rectangle_basic_quantities():
    assert RECTANGLE.length == 220.0
    np.testing.assert_allclose(RECTANGLE.segment_length, [100, 10, 100, 10])
    np.testing.assert_allclose(RECTANGLE.vertex_arc, [0, 100, 110, 210])
    assert RECTANGLE.total_turn == pytest.approx(2 * np.pi)
    assert RECTANGLE.half_width == pytest.approx(40 / 6)
    reversed_rect = TrackGeometry(RECTANGLE.points[::-1])
    assert reversed_rect.total_turn == pytest.approx(-2 * np.pi)


# --------------------------------------------------------------------------- hand-built projection


@pytest.mark.parametrize(
    "point, lateral, progress, segment",
    [
        ((50.0, -3.0), 3.0, 50.0, 0),  # below the +x straight: right of travel
        ((50.0, 2.0), -2.0, 50.0, 0),  # inside the loop: left of travel
        ((103.0, 5.0), 3.0, 105.0, 1),  # right of the +y side
        ((30.0, 12.0), 2.0, 180.0, 2),  # above the -x straight: right of travel
        ((30.0, 9.0), -1.0, 180.0, 2),
        ((-4.0, 5.0), 4.0, 215.0, 3),  # left of the -y side (x<0) is right of travel
        ((0.0, 0.0), 0.0, 0.0, 0),
    ],
)
def test_rectangle_projection_known_answers(point, lateral, progress, segment):
    projection = RECTANGLE.project(np.array(point))
    assert projection.lateral_error == pytest.approx(lateral, abs=1e-12)
    assert projection.progress == pytest.approx(progress, abs=1e-12)
    assert projection.progress_fraction == pytest.approx(progress / 220.0, abs=1e-12)
    assert int(projection.segment_index) == segment
    assert projection.closest_point.shape == (2,)
    assert projection.lateral_error.shape == ()


def test_projection_is_point_to_segment_not_nearest_vertex():
    # (37.3, -1) is far from every vertex; the foot of the perpendicular is (37.3, 0)
    projection = RECTANGLE.project(np.array([37.3, -1.0]))
    np.testing.assert_allclose(projection.closest_point, [37.3, 0.0])
    assert projection.progress == pytest.approx(37.3)


def test_off_road_uses_half_width():
    points = np.array([[50.0, -3.0], [50.0, -(TRACK_HALF_WIDTH + 0.1)], [50.0, TRACK_HALF_WIDTH - 0.1]])
    np.testing.assert_array_equal(RECTANGLE.project(points).off_road, [False, True, False])
    narrow = TrackGeometry(RECTANGLE.points, half_width=2.0)
    np.testing.assert_array_equal(narrow.project(points).off_road, [True, True, True])


def test_projection_is_vectorised_over_leading_axes():
    rng = np.random.default_rng(0)
    queries = rng.uniform(-20, 120, size=(4, 5, 2))
    projection = RECTANGLE.project(queries)
    assert projection.closest_point.shape == (4, 5, 2)
    for field in ("segment_index", "lateral_error", "progress", "progress_fraction", "off_road"):
        assert getattr(projection, field).shape == (4, 5)
    one_by_one = [RECTANGLE.project(q).lateral_error for q in queries.reshape(-1, 2)]
    np.testing.assert_allclose(projection.lateral_error.reshape(-1), one_by_one)


def test_circle_known_answers():
    radius, n = 50.0, 360
    geometry = circle(radius, n)
    assert geometry.length == pytest.approx(polygon_arc_length(radius, n), rel=1e-12)
    assert geometry.length == pytest.approx(2 * np.pi * radius, rel=1e-4)
    assert geometry.total_turn == pytest.approx(2 * np.pi)
    # a point 55 from the centre, in the direction of the midpoint of segment 90 (angle 90.5°):
    # the foot is the segment midpoint at radius R*cos(pi/n); outside a CCW loop is right of travel
    direction = np.deg2rad(90.5)
    point = 55.0 * np.array([np.cos(direction), np.sin(direction)])
    apothem = radius * np.cos(np.pi / n)
    projection = geometry.project(point)
    assert int(projection.segment_index) == 90
    assert projection.lateral_error == pytest.approx(55.0 - apothem, abs=1e-9)
    assert projection.progress == pytest.approx(90.5 * geometry.length / n, rel=1e-9)
    np.testing.assert_allclose(projection.closest_point, apothem * np.array([np.cos(direction), np.sin(direction)]), atol=1e-9)
    # clockwise: the same point is left of travel, and 3/4 of a lap away from vertex 0
    cw = circle(radius, n, ccw=False)
    assert cw.total_turn == pytest.approx(-2 * np.pi)
    cw_projection = cw.project(point)
    assert cw_projection.lateral_error == pytest.approx(-(55.0 - apothem), abs=1e-9)
    assert cw_projection.progress == pytest.approx((360 - 90.5) * cw.length / n, rel=1e-9)
    # inside the loop the signs flip
    assert geometry.project(0.5 * point).lateral_error == pytest.approx(27.5 - apothem, abs=1e-9)
    assert cw.project(0.5 * point).lateral_error == pytest.approx(apothem - 27.5, abs=1e-9)


def test_lateral_error_in_outer_corner_wedge_is_normal_component_not_distance():
    # Directly outside a vertex the closest point is the vertex itself; the lateral error is the
    # offset's component along a segment normal, so slightly shorter than the distance.
    geometry = circle(50.0, 360)
    projection = geometry.project(np.array([0.0, 55.0]))
    np.testing.assert_allclose(projection.closest_point, [0.0, 50.0], atol=1e-9)
    assert projection.lateral_error == pytest.approx(5.0 * np.cos(np.pi / 360), abs=1e-9)


# --------------------------------------------------------------------------- heading


def test_travel_angle_matches_env_convention():
    # forward vector of beta is (-sin beta, cos beta) and must equal each segment's direction
    for index in range(4):
        beta = RECTANGLE.travel_angle(index)
        np.testing.assert_allclose([-np.sin(beta), np.cos(beta)], RECTANGLE.segment_unit[index], atol=1e-12)
    np.testing.assert_allclose(RECTANGLE.travel_angle(np.arange(4)), [-np.pi / 2, 0.0, np.pi / 2, -np.pi], atol=1e-12)


@pytest.mark.parametrize(
    "segment, hull_angle, expected",
    [
        (0, -np.pi / 2, 0.0),  # aligned with +x
        (0, -np.pi / 2 + 0.3, 0.3),  # nose rotated CCW: points left of travel
        (0, -np.pi / 2 - 0.3, -0.3),
        (0, 3 * np.pi / 2, 0.0),  # same direction, unwrapped hull angle
        (0, -np.pi / 2 + 4 * np.pi + 0.1, 0.1),
        (2, np.pi / 2 - 0.2, -0.2),  # travelling -x, nose turned towards +y = right of travel
        (2, -np.pi / 2, -np.pi),  # pointing backwards wraps to -pi
    ],
)
def test_heading_error_sign_and_wrap(segment, hull_angle, expected):
    assert float(RECTANGLE.heading_error(hull_angle, segment)) == pytest.approx(expected, abs=1e-12)


def test_heading_error_positive_means_nose_left_of_travel():
    # On the +x straight, a nose pointing left (+y component) has positive heading error.
    hull_angle = hull_angle_for(np.deg2rad(20))
    forward = np.array([-np.sin(hull_angle), np.cos(hull_angle)])
    assert forward[1] > 0
    assert RECTANGLE.heading_error(hull_angle, 0) == pytest.approx(np.deg2rad(20))


# --------------------------------------------------------------------------- along the track


@pytest.mark.parametrize(
    "arc, point",
    [
        (0.0, (0.0, 0.0)),
        (50.0, (50.0, 0.0)),
        (105.0, (100.0, 5.0)),
        (180.0, (30.0, 10.0)),
        (215.0, (0.0, 5.0)),
        (220.0, (0.0, 0.0)),  # periodic
        (-10.0, (0.0, 10.0)),
        (440.0 + 50.0, (50.0, 0.0)),
    ],
)
def test_point_at_known_points(arc, point):
    np.testing.assert_allclose(RECTANGLE.point_at(arc), point, atol=1e-12)


def test_point_at_is_vectorised():
    arcs = np.array([[0.0, 50.0, 105.0], [180.0, 215.0, -10.0]])
    points = RECTANGLE.point_at(arcs)
    assert points.shape == (2, 3, 2)
    np.testing.assert_allclose(points[1, 1], [0.0, 5.0])


def test_unwrapped_heading_grows_by_total_turn_per_lap():
    np.testing.assert_allclose(RECTANGLE.unwrapped_heading([10.0, 105.0, 150.0, 215.0]), [0, np.pi / 2, np.pi, 1.5 * np.pi])
    assert RECTANGLE.unwrapped_heading(220.0 + 10.0) == pytest.approx(2 * np.pi)
    assert RECTANGLE.unwrapped_heading(-5.0) == pytest.approx(1.5 * np.pi - 2 * np.pi)


def test_curvature_straight_is_zero_and_corner_is_quarter_turn_over_window():
    loop = densified_rectangle(200.0, 20.0)
    window = 10.0
    # windows [10,20], [25,35], [55,65] and [175,185] lie on the first straight
    curvature = loop.curvature_ahead(np.array(10.0), np.array([5.0, 20.0, 50.0, 170.0]), window=window)
    assert curvature.shape == (4,)
    np.testing.assert_allclose(curvature, 0.0, atol=1e-12)
    # [195, 205] contains the left-hand corner at arc 200: a quarter turn spread over the window
    assert loop.curvature_ahead(np.array(190.0), np.array([10.0]), window=window)[0] == pytest.approx(np.pi / 2 / window)
    # the corner at the lap seam (arc 440 == 0) is seen from both sides
    assert loop.mean_curvature(435.0, 445.0) == pytest.approx(np.pi / 2 / 10.0)
    assert loop.mean_curvature(-5.0, 5.0) == pytest.approx(np.pi / 2 / 10.0)
    # driven the other way round, the same corners turn right
    reverse = TrackGeometry(loop.points[::-1])
    assert reverse.mean_curvature(reverse.length - 5.0, reverse.length + 5.0) == pytest.approx(-np.pi / 2 / 10.0)


def test_mean_curvature_broadcasts_its_ends_and_each_value_is_the_heading_change_over_distance():
    loop = densified_rectangle(200.0, 20.0)
    ends = np.array([[185.0, 205.0], [215.0, 230.0]])
    curvature = loop.mean_curvature(180.0, ends)  # a scalar start against a (2, 2) array of ends
    assert curvature.shape == (2, 2)
    for index in np.ndindex(ends.shape):
        change = loop.unwrapped_heading(ends[index]) - loop.unwrapped_heading(180.0)
        assert curvature[index] == pytest.approx(change / (ends[index] - 180.0), rel=1e-12)


def test_curvature_ahead_shape():
    geometry = circle(40.0)
    curvature = geometry.curvature_ahead(np.array([0.0, 10.0, 100.0]), np.array([5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 80.0]))
    assert curvature.shape == (3, 7)
    assert curvature.dtype == np.float64


# --------------------------------------------------------------------------- hypothesis properties

finite = dict(allow_nan=False, allow_infinity=False)


@st.composite
def star_polygons(draw, max_vertices: int = 25) -> np.ndarray:
    """Random simple (star-shaped) closed polygons, CCW or CW, anywhere in the plane."""
    n = draw(st.integers(3, max_vertices))
    angles = np.sort(np.array(draw(st.lists(st.floats(0.0, 2 * np.pi, exclude_max=True, **finite),
                                            min_size=n, max_size=n, unique=True))))
    assume(np.all(np.diff(angles) > 1e-3) and (angles[0] + 2 * np.pi - angles[-1]) > 1e-3)
    radii = np.array(draw(st.lists(st.floats(5.0, 200.0, **finite), min_size=n, max_size=n)))
    centre = np.array(draw(st.tuples(st.floats(-1e3, 1e3, **finite), st.floats(-1e3, 1e3, **finite))))
    points = centre + np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    if draw(st.booleans()):
        points = points[::-1].copy()
    return points


def query_points(spread: float = 300.0):
    return st.tuples(st.floats(-spread, spread, **finite), st.floats(-spread, spread, **finite)).map(np.array)


@given(
    radius=st.floats(5.0, 200.0, **finite),
    distance_ratio=st.floats(0.2, 3.0, **finite),
    theta=st.floats(0.0, 2 * np.pi, **finite),
    ccw=st.booleans(),
    centre=st.tuples(st.floats(-1e3, 1e3, **finite), st.floats(-1e3, 1e3, **finite)),
)
def test_circle_lateral_error_is_radial_offset_with_travel_sign(radius, distance_ratio, theta, ccw, centre):
    n = 720
    geometry = circle(radius, n, centre=centre, ccw=ccw)
    d = distance_ratio * radius
    point = np.array(centre) + d * np.array([np.cos(theta), np.sin(theta)])
    lateral = float(geometry.project(point).lateral_error)
    # The inscribed polygon lies between radius*cos(pi/n) and radius from the centre, and outside a
    # vertex the lateral error is the offset's component along one adjacent segment's normal, which
    # is within 2pi/n of the offset (its cone spans both normals): a factor >= cos(2pi/n) of it.
    tolerance = (radius + d) * (1 - np.cos(2 * np.pi / n)) + 1e-9 * (radius + np.abs(centre).max())
    expected = (d - radius) if ccw else (radius - d)  # outside a CCW loop is right of travel
    assert lateral == pytest.approx(expected, abs=tolerance)
    if abs(d - radius) > 2 * tolerance:
        assert np.sign(lateral) == np.sign(expected)


@given(polygon=star_polygons(), point=query_points())
def test_projection_progress_range_and_point_at_returns_closest_point(polygon, point):
    geometry = TrackGeometry(polygon)
    projection = geometry.project(point)
    progress = float(projection.progress)
    assert 0.0 <= progress < geometry.length
    assert 0.0 <= float(projection.progress_fraction) < 1.0
    assert float(projection.progress_fraction) == pytest.approx(progress / geometry.length)
    scale = 1e-9 * (1.0 + np.abs(polygon).max() + np.abs(point).max())
    np.testing.assert_allclose(geometry.point_at(progress), projection.closest_point, atol=scale * 10)
    # it is the closest point of the polyline (checked against a dense sampling of the polyline)
    distance = np.hypot(*(point - projection.closest_point))
    samples = geometry.point_at(np.linspace(0.0, geometry.length, 4001))
    assert distance <= np.hypot(*(samples - point).T).min() + scale * 10
    # and the lateral error is a signed component of the offset, never longer than it
    assert abs(float(projection.lateral_error)) <= distance + scale * 10
    assert bool(projection.off_road) == (abs(float(projection.lateral_error)) > geometry.half_width)


@given(
    polygon=star_polygons(),
    point=query_points(),
    shift=st.tuples(st.floats(-1e4, 1e4, **finite), st.floats(-1e4, 1e4, **finite)).map(np.array),
)
def test_projection_invariant_under_translation(polygon, point, shift):
    a = TrackGeometry(polygon).project(point)
    geometry_b = TrackGeometry(polygon + shift)
    b = geometry_b.project(point + shift)
    tolerance = 1e-7 * (1.0 + np.abs(polygon).max() + np.abs(point).max() + np.abs(shift).max())
    distance = np.hypot(*(point - a.closest_point))
    assert np.hypot(*(point + shift - b.closest_point)) == pytest.approx(distance, abs=tolerance)
    if int(a.segment_index) == int(b.segment_index):
        np.testing.assert_allclose(b.closest_point - shift, a.closest_point, atol=tolerance)
        assert float(b.lateral_error) == pytest.approx(float(a.lateral_error), abs=tolerance)
        gap = abs(float(b.progress) - float(a.progress))
        assert min(gap, geometry_b.length - gap) <= tolerance  # progress is periodic: the lap seam L ≡ 0
    elif np.allclose(b.closest_point - shift, a.closest_point, atol=tolerance):
        # Rounding broke a tie between two segments that share their closest vertex. The answers
        # may then differ only by the projection onto the two segments' normals.
        i, j = int(a.segment_index), int(b.segment_index)
        turn = abs(float(wrap_angle(geometry_b.segment_angle[i] - geometry_b.segment_angle[j])))
        bound = distance * 2 * np.sin(turn / 2) + tolerance
        assert abs(float(b.lateral_error) - float(a.lateral_error)) <= bound
        gap = abs(float(b.progress) - float(a.progress)) % geometry_b.length
        assert min(gap, geometry_b.length - gap) <= tolerance
    # else: the point is equidistant from two separate parts of the track (checked above)


@given(
    radius=st.floats(10.0, 300.0, **finite),
    start=st.floats(-2000.0, 2000.0, **finite),
    window=st.floats(5.0, 60.0, **finite),
    ccw=st.booleans(),
)
def test_circle_curvature_is_plus_or_minus_inverse_radius(radius, start, window, ccw):
    n = 720
    geometry = circle(radius, n, ccw=ccw)
    curvature = float(geometry.mean_curvature(start, start + window))
    # heading changes by 2pi/n at each vertex, so a window can be off by one vertex
    tolerance = (2 * np.pi / n) / window * 1.001 + 1e-4 / radius
    expected = 1 / radius if ccw else -1 / radius
    assert curvature == pytest.approx(expected, abs=tolerance)
    assert np.sign(curvature) == np.sign(expected)
    ahead = geometry.curvature_ahead(np.array(start), np.array([0.0, 20.0]), window=window)
    np.testing.assert_allclose(ahead, expected, atol=tolerance)


@given(arc=st.floats(-1e5, 1e5, **finite), laps=st.integers(-5, 5))
def test_point_at_is_periodic(arc, laps):
    geometry = densified_rectangle(200.0, 20.0, step=5.0)
    tolerance = max(1e-9 * (abs(arc) + abs(laps) * geometry.length), 1e-9)
    np.testing.assert_allclose(geometry.point_at(arc + laps * geometry.length), geometry.point_at(arc), atol=tolerance)


@given(vertex=st.integers(-2000, 2000), laps=st.integers(-5, 5))
def test_unwrapped_heading_adds_total_turn_per_lap(vertex, laps):
    geometry = densified_rectangle(200.0, 20.0, step=5.0)  # 88 segments of length 5, perimeter 440
    arc = 5.0 * vertex + 2.5  # mid-segment, exactly representable: no vertex rounding ambiguity
    shifted = float(geometry.unwrapped_heading(arc + laps * geometry.length))
    assert shifted == pytest.approx(float(geometry.unwrapped_heading(arc)) + laps * 2 * np.pi, abs=1e-9)
    # and mid-segment headings are multiples of a quarter turn on this loop
    assert float(geometry.unwrapped_heading(arc)) / (np.pi / 2) == pytest.approx(round(float(geometry.unwrapped_heading(arc)) / (np.pi / 2)), abs=1e-9)


@given(angle=st.floats(-1e6, 1e6, **finite))
def test_wrap_angle_range_and_equivalence(angle):
    wrapped = float(wrap_angle(angle))
    assert -np.pi <= wrapped < np.pi
    assert np.cos(wrapped) == pytest.approx(np.cos(angle), abs=1e-6)
    assert np.sin(wrapped) == pytest.approx(np.sin(angle), abs=1e-6)
    assert float(wrap_angle(wrapped)) == pytest.approx(wrapped, abs=1e-12)


def test_wrap_angle_boundaries_and_vectorisation():
    assert float(wrap_angle(np.pi)) == pytest.approx(-np.pi)
    assert float(wrap_angle(-np.pi)) == pytest.approx(-np.pi)
    np.testing.assert_allclose(wrap_angle(np.array([0.0, 1.5 * np.pi, -1.5 * np.pi, 5 * np.pi])),
                               [0.0, -0.5 * np.pi, 0.5 * np.pi, -np.pi])


# --------------------------------------------------------------------------- lap seam


def test_progress_fraction_is_below_one_at_lap_seam():
    """Vertex 0 reached via the end of the last segment reports progress 0, not the lap length."""
    square = TrackGeometry(np.array([[0.0, 0.0], [10.0, 0.0], [10.0, 10.0], [0.0, 10.0]]))
    projection = square.project(np.array([-0.3, -0.1]))  # closest point: vertex 0
    np.testing.assert_allclose(projection.closest_point, [0.0, 0.0], atol=1e-12)
    assert float(projection.progress) < square.length
    assert float(projection.progress_fraction) < 1.0
