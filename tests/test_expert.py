"""PurePursuitExpert: sign conventions on hand-built states, purity, and closed-loop driving.

Signs (verified end to end in test_env.py::test_steering_right_moves_car_right_of_centreline...):
action steer > 0 turns right; lateral error > 0 is right of the centreline; heading error > 0 is
the nose pointing left of travel. So a car right of centre, or pointing right, must get steer < 0.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from track_fixtures import densified_rectangle

from nsacdrive.agents import PurePursuitConfig, PurePursuitExpert
from nsacdrive.agents.base import Agent
from nsacdrive.agents.registry import make_agent
from nsacdrive.envs import make_car_racing, privileged_state
from nsacdrive.envs.geometry import TrackGeometry
from nsacdrive.envs.state import CarPose, PrivilegedState

# --------------------------------------------------------------------------- synthetic states


def circle(radius: float, n: int = 720) -> TrackGeometry:
    theta = np.linspace(0.0, 2 * np.pi, n, endpoint=False)
    return TrackGeometry(radius * np.stack([np.cos(theta), np.sin(theta)], axis=1))


LOOP = densified_rectangle(400.0, 40.0)


def make_state(geometry: TrackGeometry, x: float, y: float, direction: float, speed: float = 0.0, **pose) -> PrivilegedState:
    """A privileged state for a car at (x, y) whose nose points along math angle ``direction``.

    Pose fields not given (steering angle, wheel slips, ...) are zero, so this keeps working when
    CarPose grows fields.
    """
    hull_angle = float(np.arctan2(np.sin(direction - np.pi / 2), np.cos(direction - np.pi / 2)))
    values = {f.name: 0.0 for f in dataclasses.fields(CarPose)}
    values.update(x=float(x), y=float(y), angle=hull_angle, forward_speed=float(speed), **pose)
    car = CarPose(**values)
    projection = geometry.project(car.position)
    return PrivilegedState(
        pose=car,
        projection=projection,
        heading_error=float(geometry.heading_error(car.angle, projection.segment_index)),
        geometry=geometry,
    )


BLANK = np.zeros((96, 96, 3), dtype=np.uint8)


def steer_of(state: PrivilegedState, expert: PurePursuitExpert | None = None) -> float:
    return float((expert or PurePursuitExpert()).act(BLANK, state)[0])


def test_synthetic_state_has_intended_errors():
    state = make_state(LOOP, 100.0, -2.0, direction=0.2, speed=10.0)
    assert state.lateral_error == pytest.approx(2.0)  # below the +x straight = right of travel
    assert state.heading_error == pytest.approx(0.2)  # nose rotated CCW = left of travel
    assert state.progress == pytest.approx(100.0)


def test_centred_and_aligned_car_goes_straight():
    assert steer_of(make_state(LOOP, 100.0, 0.0, direction=0.0, speed=30.0)) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("offset", [0.5, 2.0, 5.0])
@pytest.mark.parametrize("speed", [0.0, 40.0])
def test_car_right_of_centre_steers_left_and_left_of_centre_steers_right(offset, speed):
    right_of_centre = make_state(LOOP, 100.0, -offset, direction=0.0, speed=speed)
    left_of_centre = make_state(LOOP, 100.0, offset, direction=0.0, speed=speed)
    assert right_of_centre.lateral_error > 0 > left_of_centre.lateral_error
    steer_right_case = steer_of(right_of_centre)
    assert steer_right_case < 0
    assert steer_of(left_of_centre) == pytest.approx(-steer_right_case, abs=1e-6)  # mirror symmetry


@pytest.mark.parametrize("heading", [0.1, 0.5, 1.2])
def test_car_pointing_left_steers_right_and_vice_versa(heading):
    nose_left = make_state(LOOP, 100.0, 0.0, direction=heading, speed=20.0)
    nose_right = make_state(LOOP, 100.0, 0.0, direction=-heading, speed=20.0)
    assert nose_left.heading_error > 0 > nose_right.heading_error
    assert steer_of(nose_left) > 0
    assert steer_of(nose_right) == pytest.approx(-steer_of(nose_left), abs=1e-6)


def test_steering_grows_with_offset_until_saturation():
    steers = [steer_of(make_state(LOOP, 100.0, -d, direction=0.0, speed=20.0)) for d in (0.5, 1.0, 2.0, 4.0, 30.0)]
    assert all(a > b for a, b in zip(steers, steers[1:4])), steers
    assert steers[-1] == -1.0  # clipped to the action space


def test_steers_into_a_left_hand_curve_when_on_centreline():
    # on a CCW circle, a car on the centreline pointing along the tangent must turn left
    radius = 40.0
    state = make_state(circle(radius), radius, 0.0, direction=np.pi / 2, speed=20.0)
    assert abs(state.lateral_error) < 0.01 and abs(state.heading_error) < 0.01
    assert steer_of(state) < 0


def test_target_speed_is_max_speed_on_a_long_straight():
    config = PurePursuitConfig(max_speed=90.0, plan_horizon=150.0, curvature_window=8.0)
    expert = PurePursuitExpert(config)
    # from progress 100 the 150-unit horizon (plus window) ends at 258 < 400, the first corner
    assert expert.target_speed(make_state(LOOP, 100.0, 0.0, direction=0.0)) == 90.0


@pytest.mark.parametrize("radius", [20.0, 50.0, 120.0])
def test_target_speed_on_a_circle_is_lateral_accel_limited(radius):
    config = PurePursuitConfig(max_speed=1000.0, lateral_accel=100.0, curvature_window=8.0)
    state = make_state(circle(radius), radius, 0.0, direction=np.pi / 2)
    # constant curvature 1/R: v = sqrt(a_lat * R), up to the polygon's curvature quantisation
    assert PurePursuitExpert(config).target_speed(state) == pytest.approx(np.sqrt(100.0 * radius), rel=0.05)
    capped = PurePursuitConfig(max_speed=10.0, lateral_accel=100.0)
    assert PurePursuitExpert(capped).target_speed(state) == 10.0


def test_target_speed_falls_when_approaching_a_corner():
    expert = PurePursuitExpert(PurePursuitConfig(max_speed=200.0, plan_horizon=150.0))
    speeds = [expert.target_speed(make_state(LOOP, x, 0.0, direction=0.0)) for x in (100.0, 300.0, 340.0, 370.0, 390.0)]
    assert speeds[0] == 200.0
    assert all(a > b for a, b in zip(speeds, speeds[1:])), speeds
    # harder assumed braking allows a later slow-down
    strong_brakes = PurePursuitExpert(PurePursuitConfig(max_speed=200.0, plan_horizon=150.0, brake_accel=200.0))
    assert strong_brakes.target_speed(make_state(LOOP, 340.0, 0.0, direction=0.0)) > speeds[2]


def test_accelerates_from_rest_and_brakes_when_far_too_fast():
    expert = PurePursuitExpert()
    steer, gas, brake = expert.act(BLANK, make_state(LOOP, 100.0, 0.0, direction=0.0, speed=0.0))
    assert gas > 0.5 and brake == 0.0
    # 390: 10 units before a 90-degree corner, at a speed no config can corner at
    steer, gas, brake = expert.act(BLANK, make_state(LOOP, 390.0, 0.0, direction=0.0, speed=400.0))
    assert gas == 0.0 and brake > 0.0


# --------------------------------------------------------------------------- the smooth teacher

SMOOTH = PurePursuitExpert(PurePursuitConfig.smooth())


@pytest.mark.parametrize(
    ("geometry", "x", "y", "direction", "speed", "expected"),
    [
        (LOOP, 100.0, -2.0, 0.2, 30.0, [0.05682080611586571, 0.943179190158844, 0.0]),
        (LOOP, 385.0, 1.0, 0.1, 80.0, [-0.40395259857177734, 0.0, 0.8500000238418579]),
        (circle(40.0), 40.0, -1.5, np.pi / 2 + 0.3, 25.0, [0.22217676043510437, 0.7778232097625732, 0.0]),
        (LOOP, 100.0, -30.0, 0.0, 10.0, [-1.0, 0.0, 0.0]),
    ],
)
def test_default_teacher_acts_exactly_as_before_the_smooth_options(geometry, x, y, direction, speed, expected):
    # values recorded from the teacher before lookahead_per_lateral and soft_steer existed
    action = PurePursuitExpert().act(BLANK, make_state(geometry, x, y, direction, speed))
    np.testing.assert_array_equal(action, np.array(expected, dtype=np.float32))


def test_smooth_teacher_goes_straight_on_the_centreline_and_is_mirror_symmetric():
    assert steer_of(make_state(LOOP, 100.0, 0.0, direction=0.0, speed=30.0), SMOOTH) == pytest.approx(0.0, abs=1e-6)
    for offset, heading in [(2.0, 0.0), (0.0, 0.4), (3.0, 0.3)]:  # right of the line and/or nose right
        right = steer_of(make_state(LOOP, 100.0, -offset, direction=-heading, speed=40.0), SMOOTH)
        left = steer_of(make_state(LOOP, 100.0, offset, direction=heading, speed=40.0), SMOOTH)
        assert right == pytest.approx(-left, abs=1e-6)
        assert right < 0


def sweep_steers(expert: PurePursuitExpert) -> np.ndarray:
    """Steering along a car that slides from 12 units left of the line to 12 right while turning its nose."""
    offsets = np.linspace(-12.0, 12.0, 241)
    headings = np.linspace(0.9, -0.9, 241)
    return np.array([steer_of(make_state(LOOP, 100.0, -y, direction=h, speed=40.0), expert) for y, h in zip(offsets, headings)])


def test_smooth_teacher_never_saturates_and_changes_less_between_neighbouring_states():
    old, smooth = sweep_steers(PurePursuitExpert()), sweep_steers(SMOOTH)
    assert np.abs(old).max() == 1.0 and np.abs(smooth).max() < 0.95
    assert np.all(np.diff(smooth) < 0)  # monotone: from steering right to steering left, no wobble
    assert np.abs(np.diff(smooth)).max() < 0.02
    assert np.abs(np.diff(smooth)).max() < 0.7 * np.abs(np.diff(old)).max()
    assert steer_of(make_state(LOOP, 100.0, -30.0, direction=0.0, speed=10.0), SMOOTH) > -1.0


def test_lookahead_grows_with_lateral_error_so_recoveries_aim_further_ahead():
    far_off = make_state(LOOP, 100.0, -5.0, direction=0.0, speed=20.0)
    near_aim = PurePursuitExpert(dataclasses.replace(PurePursuitConfig.smooth(), lookahead_per_lateral=0.0))
    assert steer_of(far_off, near_aim) < steer_of(far_off, SMOOTH) < 0
    on_line = make_state(LOOP, 100.0, 0.0, direction=0.3, speed=20.0)
    assert steer_of(on_line, near_aim) == steer_of(on_line, SMOOTH)


def test_expert_variant_specs_build_their_teachers_and_unknown_variants_are_named():
    assert make_agent("expert").cfg == PurePursuitConfig()
    assert make_agent("expert:smooth").cfg == PurePursuitConfig.smooth()
    assert make_agent("expert:gentle").cfg == PurePursuitConfig.gentle()
    with pytest.raises(ValueError, match=r"unknown expert variant 'fast'.*expert, expert:smooth, expert:gentle"):
        make_agent("expert:fast")


# --------------------------------------------------------------------------- the gentle-braking teacher


def test_gentle_teacher_brakes_earlier_and_lighter_for_the_same_corner_speed():
    default, gentle = PurePursuitExpert(), PurePursuitExpert(PurePursuitConfig.gentle())
    xs = np.arange(250.0, 400.0, 1.0)  # along LOOP's first straight, towards its corner at x = 400
    states = [make_state(LOOP, x, 0.0, direction=0.0, speed=80.0) for x in xs]
    plan_default = np.array([default.target_speed(s) for s in states])
    plan_gentle = np.array([gentle.target_speed(s) for s in states])
    assert np.all(plan_gentle <= plan_default)
    # the same corner speed: in the corner, neither plan has distance left to brake over
    corner = make_state(LOOP, 399.0, 0.0, direction=0.0, speed=40.0)
    assert gentle.target_speed(corner) == pytest.approx(default.target_speed(corner), rel=1e-6)
    # at 80 units/s the gentle teacher starts braking further from the corner
    brake_default = np.array([default.act(BLANK, s)[2] for s in states])
    brake_gentle = np.array([gentle.act(BLANK, s)[2] for s in states])
    first_brake = lambda brake: xs[np.argmax(brake > 0)]  # noqa: E731
    assert first_brake(brake_gentle) < first_brake(brake_default) - 20.0
    assert np.count_nonzero(brake_gentle) > np.count_nonzero(brake_default)


# --------------------------------------------------------------------------- agent contract and purity


def test_expert_satisfies_agent_protocol():
    expert = PurePursuitExpert()
    assert isinstance(expert, Agent)
    assert expert.agent_id == "pure-pursuit"
    assert expert.source == "expert"
    assert expert.needs_pixels is False
    config = json.loads(json.dumps(expert.config()))
    assert config["agent_id"] == "pure-pursuit"
    for field in dataclasses.fields(PurePursuitConfig):
        assert config[field.name] == getattr(expert.cfg, field.name)


def test_config_validation():
    with pytest.raises(ValueError):
        PurePursuitConfig(steer_gain=0.0)
    with pytest.raises(ValueError):
        PurePursuitConfig(max_speed=-1.0)
    with pytest.raises(ValueError):
        PurePursuitConfig(lateral_accel=0.0)
    with pytest.raises(ValueError, match="curvature_samples"):
        PurePursuitConfig(curvature_samples=0)
    with pytest.raises(ValueError, match="lookahead_per_lateral must be >= 0, got -1"):
        PurePursuitConfig(lookahead_per_lateral=-1.0)


TEACHERS = pytest.mark.parametrize("config", [PurePursuitConfig(), PurePursuitConfig.smooth(), PurePursuitConfig.gentle()],
                                   ids=["default", "smooth", "gentle"])


@TEACHERS
def test_act_is_a_pure_function_of_the_state(config):
    env = make_car_racing(render_observations=False)
    obs, _ = env.reset(seed=0)
    for _ in range(30):
        obs, *_ = env.step(np.array([0.3, 0.6, 0.0], dtype=np.float32))
    state = privileged_state(env)
    vector = state.as_vector().copy()
    expert = PurePursuitExpert(config)
    first = expert.act(obs, state)
    np.testing.assert_array_equal(expert.act(obs, state), first)
    np.testing.assert_array_equal(PurePursuitExpert(config).act(obs, state), first)
    expert.reset()
    np.testing.assert_array_equal(expert.act(obs, state), first)
    noise = np.random.default_rng(0).integers(0, 256, size=(96, 96, 3), dtype=np.uint8)
    np.testing.assert_array_equal(expert.act(noise, state), first)  # pixels are ignored
    np.testing.assert_array_equal(state.as_vector(), vector)  # the state is not modified
    env.close()


# --------------------------------------------------------------------------- closed loop


@TEACHERS
@pytest.mark.parametrize("seed", [0, 1])
def test_expert_drives_200_steps_on_the_road_and_makes_progress(seed, config):
    env = make_car_racing(render_observations=False, max_episode_steps=200)
    expert = PurePursuitExpert(config)
    obs, _ = env.reset(seed=seed)
    expert.reset()
    low, high = env.action_space.low, env.action_space.high
    start = privileged_state(env)
    geometry = start.geometry
    travelled = 0.0
    previous = start.progress
    lateral = []
    for step in range(200):
        state = privileged_state(env)
        lateral.append(state.lateral_error)
        assert abs(state.lateral_error) < geometry.half_width, f"off road at step {step}"
        assert not bool(state.projection.off_road)
        action = expert.act(obs, state)
        assert action.dtype == np.float32 and action.shape == (3,)
        assert np.all(action >= low) and np.all(action <= high), action
        obs, _, terminated, truncated, _ = env.step(action)
        assert not terminated
        # progress made this step, unwrapped across the lap seam
        now = privileged_state(env).progress
        delta = (now - previous + geometry.length / 2) % geometry.length - geometry.length / 2
        assert delta > -0.5, "the expert never drives backwards"
        travelled += delta
        previous = now
    assert truncated  # the 200-step horizon, not a crash, ended the episode
    assert travelled > 150.0
    assert privileged_state(env).pose.forward_speed > 20.0
    assert np.mean(np.abs(lateral)) < 3.0
    env.close()


def perturb(env, seed: int, steps: int = 50):
    """Drive with a random steering wheel held for 10 steps at a time: the car leaves the line."""
    rng = np.random.default_rng(seed)
    obs = None
    for k in range(steps):
        if k % 10 == 0:
            steer = float(rng.uniform(-1, 1))
        obs, *_ = env.step(np.array([steer, 0.4, 0.0], dtype=np.float32))
    return obs


@TEACHERS
@pytest.mark.parametrize("seed", [1, 2, 4])
def test_expert_labels_a_perturbed_state_by_steering_back_and_recovers(seed, config):
    env = make_car_racing(render_observations=False, max_episode_steps=200)
    env.reset(seed=seed)
    obs = perturb(env, seed)
    state = privileged_state(env)
    geometry = state.geometry
    assert abs(state.lateral_error) > 5.0  # really perturbed
    expert = PurePursuitExpert(config)
    steer = float(expert.act(obs, state)[0])
    # right of centre (lateral > 0) => steer left (< 0), and vice versa
    assert np.sign(steer) == -np.sign(state.lateral_error)
    assert abs(steer) > 0.5
    lateral = []
    for _ in range(100):
        state = privileged_state(env)
        lateral.append(state.lateral_error)
        obs, _, terminated, _, _ = env.step(expert.act(obs, state))
        assert not terminated
    lateral = np.abs(np.array(lateral))
    assert lateral.min() < 1.0  # it reaches the centreline
    assert lateral[-30:].max() < geometry.half_width  # and stays on the road
    env.close()
