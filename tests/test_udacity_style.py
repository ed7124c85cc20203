"""The front-camera simulator: envs/front_camera.py, envs/udacity_style.py and its recordings
(data_collection/udacity_layout.py through the recorder and the CLI)."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import cv2
import gymnasium as gym
import numpy as np
import pytest
from data_fixtures import normalize
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

import nsacdrive.envs as envs
from nsacdrive.agents.expert import PurePursuitExpert
from nsacdrive.agents.rollout import drive
from nsacdrive.cli import app
from nsacdrive.data_collection.dataset import SequenceDataset
from nsacdrive.data_collection.episode import load_episode_arrays
from nsacdrive.data_collection.errors import DatasetError
from nsacdrive.data_collection.recorder import CollectConfig, collect
from nsacdrive.data_collection.udacity_import import read_driving_log
from nsacdrive.data_collection.udacity_layout import EPISODES_DIR, IMG_DIR, MPH_PER_UNIT_PER_SECOND
from nsacdrive.envs.colours import DEFAULT_SCHEME, resolve_colour_scheme
from nsacdrive.envs.front_camera import SKY_TOP, CameraConfig, FrontCamera, FrontCameraPalette, _clip_near
from nsacdrive.envs.geometry import TRACK_HALF_WIDTH
from nsacdrive.envs.state import privileged_state, shifted_sideways
from nsacdrive.envs.udacity_observation import UDACITY_RAW_FRAME_SHAPE
from nsacdrive.envs.udacity_style import ENV_ID, SideCameraLog, UdacityStyleCarRacing, make_udacity_style

SEED = 3
STEPS = 30
EPISODE = f"expert_default_seed{SEED:06d}_udacity-style"


def _road_mask(frame: np.ndarray, scheme=DEFAULT_SCHEME) -> np.ndarray:
    """Pixels painted in (about) the scheme's road colour."""
    road = np.array(scheme.road)
    return np.abs(frame.astype(np.float64) - road).max(axis=-1) <= 8


def _road_centroid(frame: np.ndarray, rows: slice) -> float:
    mask = _road_mask(frame[rows])
    return float(np.nonzero(mask)[1].mean())


@pytest.fixture(scope="module")
def reset_frames():
    """(env, observation, info) right after reset on track SEED with side cameras."""
    env = make_udacity_style(side_cameras=True, max_episode_steps=STEPS)
    observation, info = env.reset(seed=SEED)
    return env, observation, info


# --------------------------------------------------------------------------- the env


@pytest.mark.parametrize("options", [{"side_cameras": True}, {"render_observations": False}], ids=["cameras", "render-free"])
def test_env_checker_passes_without_warnings(options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(make_udacity_style(**options).unwrapped)
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []


def test_registered_id_spaces_and_horizon_match_car_racing():
    env = gym.make(ENV_ID, disable_env_checker=True)  # registered by `import envs`
    stock = envs.make_car_racing()
    assert isinstance(env.unwrapped, UdacityStyleCarRacing) and envs.make_udacity_style is make_udacity_style
    assert env.observation_space.shape == UDACITY_RAW_FRAME_SHAPE == (160, 320, 3)
    assert env.observation_space.dtype == np.uint8
    assert env.action_space == stock.action_space
    assert env.spec.max_episode_steps == stock.spec.max_episode_steps == 1000
    assert make_udacity_style(max_episode_steps=7).spec.max_episode_steps == 7
    with pytest.raises(ValueError, match="max_episode_steps must be positive, got 0"):
        make_udacity_style(max_episode_steps=0)


def test_reset_and_step_give_frames_and_side_frames_only_when_asked(reset_frames):
    _, observation, info = reset_frames
    assert observation.shape == (160, 320, 3) and observation.dtype == np.uint8
    for name in ("left", "right"):
        side = info[f"{name}_observation"]
        assert side.shape == observation.shape and side.dtype == np.uint8
        assert not np.array_equal(side, observation)
    plain = make_udacity_style()
    _, plain_info = plain.reset(seed=SEED)
    step_info = plain.step(np.array([0.0, 0.5, 0.0], dtype=np.float32))[4]
    assert "left_observation" not in plain_info and "left_observation" not in step_info


def test_same_seed_same_frames_and_tracks_and_rewards_as_car_racing():
    actions = [np.array([0.3 * np.sin(k / 5), 0.6, 0.0], dtype=np.float32) for k in range(25)]

    def run(make):
        env = make()
        frames, rewards = [env.reset(seed=SEED)[0]], []
        for action in actions:
            observation, reward, _, _, info = env.step(action)
            frames.append(observation)
            rewards.append(reward)
            frames += [info[k] for k in ("left_observation", "right_observation") if k in info]
        return env, frames, rewards

    env_a, frames_a, rewards_a = run(lambda: make_udacity_style(side_cameras=True))
    _, frames_b, rewards_b = run(lambda: make_udacity_style(side_cameras=True))
    car_racing, _, rewards_c = run(lambda: envs.make_car_racing(render_observations=False))
    assert len(frames_a) == 1 + 3 * len(actions) and all(np.array_equal(a, b) for a, b in zip(frames_a, frames_b))
    assert rewards_a == rewards_b == rewards_c  # same physics and reward as CarRacing
    assert env_a.unwrapped.track == car_racing.unwrapped.track
    other = make_udacity_style().reset(seed=SEED + 1)[0]
    assert not np.array_equal(other, frames_a[0])


def test_render_free_mode_gives_zeros_but_draws_on_demand(reset_frames):
    _, observation, _ = reset_frames
    env = make_udacity_style(render_observations=False)
    blank, _ = env.reset(seed=SEED)
    assert not blank.any()
    np.testing.assert_array_equal(env.unwrapped.render_observation(), observation)
    with pytest.raises(ValueError, match="side_cameras=True needs render_observations=True"):
        make_udacity_style(render_observations=False, side_cameras=True)
    with pytest.raises(ValueError, match="camera must be one of center, left, right"):
        env.unwrapped.render_camera("roof")


# --------------------------------------------------------------------------- what the camera sees


def test_camera_sees_sky_on_top_and_road_in_the_lower_centre(reset_frames):
    _, frame, _ = reset_frames
    config = CameraConfig()
    horizon = int(config.horizon_row)
    sky = frame[:horizon - 2].astype(int)
    assert np.all(sky[..., 2] > sky[..., 0] + 40)  # blue above the horizon everywhere
    lower = _road_mask(frame[-40:])
    assert lower[:, 100:220].mean() > 0.9  # the road fills the lower centre (dashes aside)
    assert _road_mask(frame[:horizon]).sum() == 0  # and nothing above the horizon
    ground = frame[horizon + 8 :].astype(int)
    greenish = (ground[..., 1] > ground[..., 0] + 60) & (ground[..., 1] > ground[..., 2] + 60)
    assert greenish[:, :60].mean() > 0.3 or greenish[:, -60:].mean() > 0.3  # grass beside the road


def test_side_cameras_see_the_road_shifted(reset_frames):
    _, centre, info = reset_frames
    rows = slice(75, 110)
    left, right = info["left_observation"], info["right_observation"]
    x_left, x_centre, x_right = (_road_centroid(f, rows) for f in (left, centre, right))
    assert x_left > x_centre + 5 and x_right < x_centre - 5  # left camera: road to the right


def test_camera_follows_the_heading():
    env = make_udacity_style(render_observations=False)
    env.reset(seed=SEED)
    base = env.unwrapped
    straight = _road_centroid(base.render_observation(), slice(70, 100))
    base.car.hull.angle += 0.3  # turned left (counter-clockwise): the road moves right in the image
    turned = _road_centroid(base.render_observation(), slice(70, 100))
    assert turned > straight + 20


def test_camera_redraws_a_new_track_whose_list_reuses_a_freed_ones_address():
    """The camera caches a track's quads; a new track's ``road_poly`` list may be allocated where the
    old, freed one lay (CPython reuses list objects), so the cache must not key on ``id()``."""
    env = make_udacity_style(render_observations=False)
    env.reset(seed=SEED)
    base = env.unwrapped
    base.render_observation()  # quads of track SEED cached
    other = make_udacity_style(render_observations=False)
    other.reset(seed=SEED + 1)
    base.road, base.track = other.unwrapped.road, other.unwrapped.track
    base.road_poly = None  # the old list's last reference unless the camera keeps one
    base.road_poly = list(other.unwrapped.road_poly)  # takes the freed list's place (CPython's list free list)
    np.testing.assert_array_equal(base.render_observation(), FrontCamera(base.camera.config).render(base, 0.0))


def test_near_plane_clipping_keeps_the_part_in_front():
    square = np.array([[0.0, -2.0], [4.0, -2.0], [4.0, 2.0], [0.0, 2.0]])
    clipped = _clip_near(square, 1.0)
    assert clipped.shape == (4, 2) and clipped[:, 1].min() == pytest.approx(1.0)
    assert cv2.contourArea(clipped.astype(np.float32)) == pytest.approx(4.0)
    assert len(_clip_near(square, 3.0)) == 0


# --------------------------------------------------------------------------- colours


def test_palette_follows_the_scheme():
    default = FrontCameraPalette.from_scheme(DEFAULT_SCHEME)
    assert default.sky_top == pytest.approx(SKY_TOP) and default.road_shades[0] == DEFAULT_SCHEME.road
    assert default.road_shades[2] == pytest.approx(tuple(c + 5.1 for c in DEFAULT_SCHEME.road))
    shifted = FrontCameraPalette.from_scheme(resolve_colour_scheme("shift-3", 0))
    assert shifted.field == resolve_colour_scheme("shift-3", 0).background
    assert np.abs(np.subtract(shifted.sky_top, default.sky_top)).max() > 30  # hue turned by 90°
    assert shifted.kerb_white == default.kerb_white == (255.0, 255.0, 255.0)


@pytest.mark.parametrize("preset", ["shift-3", "random", "color-v0"])
def test_colour_presets_recolour_the_frame_but_keep_the_view(reset_frames, preset):
    _, default, _ = reset_frames
    env = make_udacity_style(colour_preset=preset)
    frame, _ = env.reset(seed=SEED)
    scheme = env.unwrapped.colour_scheme
    assert scheme == resolve_colour_scheme(preset, SEED)
    assert np.abs(frame.astype(int) - default).mean() > 3  # color-v0 is the mildest (±0.2 of the range)
    np.testing.assert_array_equal(_road_mask(frame, scheme)[-40:], _road_mask(default)[-40:])


# --------------------------------------------------------------------------- driving


def test_expert_drives_on_road_with_positive_reward():
    env = make_udacity_style(max_episode_steps=200)
    steps = list(drive(env, PurePursuitExpert(), seed=SEED))
    assert len(steps) == 200
    assert sum(s.reward for s in steps) > 0
    assert max(abs(s.next_state.lateral_error) for s in steps) < TRACK_HALF_WIDTH
    assert privileged_state(env).pose.forward_speed > 10


def test_side_camera_log_lines_up_with_observations():
    env = SideCameraLog(make_udacity_style(side_cameras=True, max_episode_steps=5))
    steps = list(drive(env, PurePursuitExpert(), seed=SEED))
    assert [len(env.frames[k]) for k in ("left", "right")] == [len(steps) + 1] * 2
    np.testing.assert_array_equal(env.frames["right"][-1], env.unwrapped.render_camera("right"))
    with pytest.raises(ValueError, match="side_cameras=True"):
        SideCameraLog(make_udacity_style())


# --------------------------------------------------------------------------- recordings


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """The same episode recorded in both layouts: (episodes folder, udacity folder)."""
    root = tmp_path_factory.mktemp("udacity-style")
    for layout in ("episodes", "udacity"):
        summary = collect(CollectConfig(agent="expert", seeds=[SEED], max_steps=STEPS, env="udacity-style", layout=layout), root / layout, progress=False)
        assert (summary.written, summary.steps) == (1, STEPS)
    return root / "episodes", root / "udacity"


def test_episode_layout_round_trips_all_three_cameras(recordings, reset_frames):
    _, observation, info = reset_frames
    sidecar, arrays = load_episode_arrays(recordings[0] / f"{EPISODE}.json")
    assert (sidecar["frame_kind"], sidecar["env_id"], sidecar["renderer"]) == ("udacity", ENV_ID, "front-camera")
    assert sidecar["cameras"] == ["center", "left", "right"] and sidecar["n_steps"] == STEPS
    for name, first in (("observations", observation), ("left_observations", info["left_observation"]),
                        ("right_observations", info["right_observation"])):
        assert arrays[name].shape == (STEPS + 1, 160, 320, 3) and arrays[name].dtype == np.uint8
        np.testing.assert_array_equal(arrays[name][0], first)  # lossless and deterministic


def test_udacity_layout_is_a_simulator_style_log(recordings):
    episodes, folder = recordings
    _, arrays = load_episode_arrays(episodes / f"{EPISODE}.json")
    lines = (folder / "driving_log.csv").read_text().splitlines()
    rows = list(csv.reader(lines))
    assert len(rows) == STEPS and all(len(row) == 7 for row in rows)
    assert rows[0][0].endswith(".jpg")  # no header: the first row is data (all numbers parse below)
    for row in rows:
        for camera, path in zip(("center", "left", "right"), row[:3]):
            assert Path(path).is_absolute() and Path(path).is_file()
            assert Path(path).parent == (folder / IMG_DIR).resolve() and Path(path).name.startswith(f"{camera}_")
    values = np.array([[float(v) for v in row[3:]] for row in rows])
    np.testing.assert_allclose(values[:, :3], arrays["expert_actions"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values[:, 3], np.abs(arrays["speed"][:STEPS]) * MPH_PER_UNIT_PER_SECOND, rtol=1e-5)
    for t in (0, STEPS - 1):  # the JPEGs are the recorded frames (lossy, but close)
        for camera, name in (("center", "observations"), ("right", "right_observations")):
            image = cv2.imread(rows[t][("center", "left", "right").index(camera)])[..., ::-1]
            assert image.shape == (160, 320, 3)
            assert np.abs(image.astype(int) - arrays[name][t]).mean() < 3
    parsed, header = read_driving_log(folder)  # the Udacity importer reads it as a self-recorded log
    assert header is False and len(parsed) == STEPS
    assert sorted(p.name for p in (folder / EPISODES_DIR).iterdir()) == [f"{EPISODE}.csv", f"{EPISODE}.json"]


def test_udacity_layout_resumes_and_is_deterministic(recordings, tmp_path):
    _, folder = recordings
    images = sorted((folder / IMG_DIR).iterdir())
    before = {p: p.stat().st_mtime_ns for p in images}
    with pytest.raises(FileExistsError, match="--resume"):
        collect(CollectConfig(agent="expert", seeds=[SEED], max_steps=STEPS, env="udacity-style", layout="udacity"), folder, progress=False)
    summary = collect(CollectConfig(agent="expert", seeds=[SEED], max_steps=STEPS, env="udacity-style", layout="udacity"), folder, resume=True, progress=False)
    assert (summary.written, summary.skipped) == (0, 1)
    assert {p: p.stat().st_mtime_ns for p in images} == before
    again = tmp_path / "again"
    collect(CollectConfig(agent="expert", seeds=[SEED], max_steps=STEPS, env="udacity-style", layout="udacity"), again, progress=False)
    assert [p.name for p in sorted((again / IMG_DIR).iterdir())] == [p.name for p in images]
    assert all((again / IMG_DIR / p.name).read_bytes() == p.read_bytes() for p in images[:: len(images) // 5])
    relocated = (again / "driving_log.csv").read_text().replace(str(again.resolve()), str(folder.resolve()))
    assert relocated == (folder / "driving_log.csv").read_text()


def test_a_state_shifted_sideways_moves_across_the_road_and_keeps_the_rest(reset_frames):
    env = reset_frames[0]
    state = privileged_state(env)  # right after reset: on the centreline, along the track
    for offset in (-2.0, 0.5, 2.0):
        moved = shifted_sideways(state, offset)
        assert np.hypot(*(moved.pose.position - state.pose.position)) == pytest.approx(abs(offset), abs=1e-9)
        assert moved.lateral_error - state.lateral_error == pytest.approx(offset, abs=0.01)  # + = right of the centreline
        assert (moved.pose.angle, moved.pose.forward_speed) == (state.pose.angle, state.pose.forward_speed)
        assert moved.heading_error == pytest.approx(state.heading_error, abs=1e-9)  # same segment direction


def _side_labels(folder: Path, episode: str) -> tuple[dict, dict[str, np.ndarray]]:
    sidecar, arrays = load_episode_arrays(folder / f"{episode}.json", include_observations=False)
    return sidecar, {name: arrays[f"{name}_actions"] for name in ("expert", "left_expert", "right_expert")}


def test_the_expert_labels_each_side_camera_as_a_recovery(recordings, tmp_path):
    sidecar, labels = _side_labels(recordings[0], EPISODE)
    assert sidecar["side_offset"] == 1.0
    steer = {name: actions[:, 0] for name, actions in labels.items()}
    free = np.abs(steer["expert"]) < 0.8  # not clipped at the steering limit
    assert free.sum() > STEPS // 2
    # from the left camera's position the road lies to the right: steer further right (+), and left from the right camera
    assert (steer["left_expert"][free] > steer["expert"][free]).all() and (steer["right_expert"][free] < steer["expert"][free]).all()
    collect(CollectConfig(agent="expert", seeds=[SEED], max_steps=STEPS, env="udacity-style", side_offset=2.0), tmp_path, progress=False)
    wide_sidecar, wide = _side_labels(tmp_path, f"{EPISODE}-side2")
    assert wide_sidecar["side_offset"] == 2.0
    np.testing.assert_array_equal(wide["expert"], labels["expert"])  # the same drive, cameras further out
    gap, wide_gap = (lab["left_expert"][:, 0] - lab["right_expert"][:, 0] for lab in (labels, wide))
    assert (wide_gap[free] > gap[free]).all()


def test_a_wider_camera_records_the_same_drive_and_only_its_datasets_read_it(recordings, tmp_path):
    """The field of view is a setting of the recording: named in the episode id and sidecar, and a
    dataset (so a controller) reads only frames of the camera it names."""
    collect(CollectConfig(agent="expert", seeds=[SEED], max_steps=STEPS, env="udacity-style", camera_fov=90.0), tmp_path, progress=False)
    wide_sidecar, wide = load_episode_arrays(tmp_path / f"{EPISODE}-fov90.json")
    sidecar, arrays = load_episode_arrays(recordings[0] / f"{EPISODE}.json")
    assert (sidecar["camera_fov"], wide_sidecar["camera_fov"]) == (65.0, 90.0)
    np.testing.assert_array_equal(wide["actions"], arrays["actions"])  # the expert drives from the state, not the frames
    assert not np.array_equal(wide["observations"], arrays["observations"])
    with pytest.raises(DatasetError, match=r"recorded with a 65° front camera, but this dataset reads 90° frames; set the model config's 'camera_fov'"):
        SequenceDataset(recordings[0], observation="udacity", camera_fov=90.0)
    assert len(SequenceDataset(tmp_path, observation="udacity", camera_fov=90.0)) == len(SequenceDataset(recordings[0], observation="udacity"))


def test_training_samples_from_a_side_camera_carry_its_own_labels(recordings):
    def left_camera(cameras, actions, rng, *, camera_actions):
        return cameras["left"], camera_actions["left"]

    dataset = SequenceDataset(recordings[0], [SEED], sequence_length=3, observation="udacity", augment=left_camera)
    _, labels = _side_labels(recordings[0], EPISODE)
    for item in (0, len(dataset) - 1):
        sample = dataset[item]
        step = int(sample["step"])
        np.testing.assert_array_equal(sample["action"].numpy(), labels["left_expert"][step])
        np.testing.assert_array_equal(sample["action_sequence"].numpy(), labels["left_expert"][step - 2:step + 1])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"side_offset": 2.0}, "side_offset applies to env 'udacity-style'"),
        ({"env": "udacity-style", "side_offset": 0.0}, "side_offset"),
        ({"camera_fov": 90.0}, "camera_fov applies to env 'udacity-style'"),
        ({"env": "udacity-style", "camera_fov": 5.0}, r"camera_fov must be in \[10.0, 150.0\], got 5.0"),
        ({"env": "udacity-style", "layout": "udacity", "camera_fov": 90.0}, "camera_fov needs layout 'episodes'"),
        ({"layout": "udacity"}, "layout 'udacity' needs env 'udacity-style'"),
        ({"env": "udacity-style", "renderer": "stock"}, "draws its own front camera"),
        ({"env": "carla"}, "env: expected one of carracing, udacity-style"),
        ({"env": "udacity-style", "layout": "zip"}, "layout: expected one of episodes, udacity"),
    ],
)
def test_collect_rejects_bad_env_and_layout(tmp_path, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        collect(CollectConfig(agent="expert", seeds=[0], max_steps=5, **kwargs), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_collects_the_udacity_layout(tmp_path):
    out = tmp_path / "sim"
    result = CliRunner().invoke(app, ["collect", "--env", "udacity-style", "--layout", "udacity", "--seeds", "0",
                                      "--max-steps", "5", "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 1 episodes (5 steps" in normalize(result.output)
    assert len((out / "driving_log.csv").read_text().splitlines()) == 5
    assert len(list((out / IMG_DIR).glob("*.jpg"))) == 15
    bad = CliRunner().invoke(app, ["collect", "--layout", "udacity", "--seeds", "0", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--layout udacity needs --env udacity-style" in normalize(bad.output)
