"""Human driving: key state from pygame events, and a scripted headless recording round trip."""

from __future__ import annotations

import json
import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import numpy as np  # noqa: E402
import pygame  # noqa: E402
import pytest  # noqa: E402
from data_fixtures import normalize  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from nsacdrive.agents.human import HumanAgent, KeyboardState  # noqa: E402
from nsacdrive.cli import app  # noqa: E402
from nsacdrive.data_collection.episode import load_episode_arrays  # noqa: E402
from nsacdrive.data_collection.human import HumanDriveConfig, record_human  # noqa: E402
from nsacdrive.data_collection.udacity_layout import EPISODES_DIR, IMG_DIR, LOG_NAME  # noqa: E402
from nsacdrive.envs.camera_window import BRAKE, GAS, READOUT_HEIGHT, STEER, CameraWindow, Readout  # noqa: E402
from nsacdrive.envs.front_camera import CameraConfig  # noqa: E402
from nsacdrive.envs.udacity_style import make_udacity_style  # noqa: E402


@pytest.fixture
def display():
    pygame.display.init()
    pygame.event.clear()
    yield
    pygame.display.quit()


def key(kind: int, k: int) -> pygame.event.Event:
    return pygame.event.Event(kind, key=k)


def test_keyboard_state_tracks_keydown_and_keyup() -> None:
    keys = KeyboardState()
    assert keys.action().tolist() == [0.0, 0.0, 0.0]
    keys.update([key(pygame.KEYDOWN, pygame.K_LEFT), key(pygame.KEYDOWN, pygame.K_UP)])
    np.testing.assert_allclose(keys.action(), [-1.0, 1.0, 0.0])
    keys.update([key(pygame.KEYUP, pygame.K_LEFT), key(pygame.KEYDOWN, pygame.K_RIGHT),
                 key(pygame.KEYUP, pygame.K_UP), key(pygame.KEYDOWN, pygame.K_DOWN)])
    np.testing.assert_allclose(keys.action(), [1.0, 0.0, 0.8])
    keys.update([pygame.event.Event(pygame.JOYAXISMOTION, axis=0, value=-0.5, joy=0, instance_id=0)])
    np.testing.assert_allclose(keys.action()[0], 1.0)  # a held key overrides the gamepad
    keys.update([key(pygame.KEYUP, pygame.K_RIGHT)])
    np.testing.assert_allclose(keys.action()[0], -0.5)
    keys.update([pygame.event.Event(pygame.JOYAXISMOTION, axis=0, value=0.05, joy=0, instance_id=0)])
    assert keys.action()[0] == 0.0  # dead zone


def test_human_agent_reads_posted_events(display) -> None:
    agent = HumanAgent(joystick=False)
    assert agent.source == "human" and agent.needs_pixels
    pygame.event.post(key(pygame.KEYDOWN, pygame.K_UP))
    pygame.event.post(key(pygame.KEYDOWN, pygame.K_RIGHT))
    np.testing.assert_allclose(agent.act(None, None), [1.0, 1.0, 0.0])
    np.testing.assert_allclose(agent.act(None, None), [1.0, 1.0, 0.0])  # still held
    pygame.event.post(key(pygame.KEYUP, pygame.K_UP))
    pygame.event.post(key(pygame.KEYDOWN, pygame.K_r))
    np.testing.assert_allclose(agent.act(None, None), [1.0, 0.0, 0.0])
    assert agent.restart_requested and not agent.quit_requested
    agent.reset()
    assert not agent.restart_requested
    pygame.event.post(pygame.event.Event(pygame.QUIT))
    agent.act(None, None)
    assert agent.quit_requested
    json.dumps(agent.config())


def test_scripted_session_records_a_human_episode(tmp_path) -> None:
    """Episode 1: restarted after 5 steps (discarded). Episode 2: 30 steps of gas + left, written.
    Then Escape during episode 3 quits without writing it."""
    calls = {"n": 0}

    def events():
        calls["n"] += 1
        n = calls["n"]  # reset() does not call act, so call n is step n over the whole session
        out = list(pygame.event.get())  # keep the window's own queue drained
        if n == 1:
            out.append(key(pygame.KEYDOWN, pygame.K_UP))
        elif n == 5:
            out.append(key(pygame.KEYDOWN, pygame.K_r))
        elif n == 6:
            out.append(key(pygame.KEYDOWN, pygame.K_LEFT))
        elif n == 21:
            out.append(key(pygame.KEYUP, pygame.K_LEFT))
        elif n == 38:
            out.append(key(pygame.KEYDOWN, pygame.K_ESCAPE))
        return out

    session = record_human(tmp_path, HumanDriveConfig(seed=3, max_steps=30), events=events)
    assert session.quit and session.restarts == 1 and len(session.written) == 1
    sidecar_path = tmp_path / f"{session.written[0]}.json"
    sidecar = json.loads(sidecar_path.read_text())
    assert sidecar["source"] == "human" and sidecar["track_seed"] == 3 and sidecar["n_steps"] == 30
    _, arrays = load_episode_arrays(sidecar_path)
    expected = np.array([[-1.0 if step < 15 else 0.0, 1.0, 0.0] for step in range(30)], dtype=np.float32)
    np.testing.assert_allclose(arrays["actions"], expected)
    np.testing.assert_allclose(arrays["expert_actions"], expected)
    assert arrays["observations"].shape == (31, 96, 96, 3) and arrays["observations"].any()
    assert (tmp_path / "manifest.json").exists()


# --------------------------------------------------------------------------- driving from the front camera


def screen() -> np.ndarray:
    """The window's pixels as an (H, W, 3) array."""
    return pygame.surfarray.array3d(pygame.display.get_surface()).swapaxes(0, 1).copy()


def scaled(frame: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)


def test_camera_window_shows_the_frame_scaled_up_above_the_readout(display) -> None:
    frame = np.random.default_rng(0).integers(0, 256, (160, 320, 3), dtype=np.uint8)
    window = CameraWindow(frame.shape, scale=2, fps=0)
    window.show(frame, Readout("42 mph", steer=-1.0, gas=1.0, brake=0.0), "caption")
    pixels = screen()
    assert pixels.shape == (320 + READOUT_HEIGHT, 640, 3)
    np.testing.assert_array_equal(pixels[:320], scaled(frame, 2))
    assert pygame.display.get_caption()[0] == "caption"
    strip = pixels[320:]
    steer_left = np.flatnonzero((strip == STEER).all(axis=-1).any(axis=0))
    full_gas = (strip == GAS).all(axis=-1).sum()
    window.show(frame, Readout("42 mph", steer=1.0, gas=0.5, brake=0.5), "caption")
    strip = screen()[320:]
    steer_right = np.flatnonzero((strip == STEER).all(axis=-1).any(axis=0))
    assert steer_left.size and steer_right.size and steer_right.min() > steer_left.max()  # the marker moved right
    assert (strip == GAS).all(axis=-1).sum() == pytest.approx(full_gas / 2, rel=0.1)
    assert (strip == BRAKE).all(axis=-1).sum() == pytest.approx(full_gas / 2, rel=0.1)
    window.close()


def test_front_camera_session_shows_the_camera_and_records_all_three_cameras(tmp_path) -> None:
    """Gas from step 1; the window is read while steps 10 and 25 act (it shows the frames after steps 9
    and 24); the 30-step episode is written and Escape during the next one quits."""
    calls = {"n": 0}
    seen: dict[int, np.ndarray] = {}

    def events():
        calls["n"] += 1
        n = calls["n"]
        out = list(pygame.event.get())
        if n == 1:
            out.append(key(pygame.KEYDOWN, pygame.K_UP))
        elif n in (10, 25):
            seen[n] = screen()
        elif n == 31:
            out.append(key(pygame.KEYDOWN, pygame.K_ESCAPE))
        return out

    config = HumanDriveConfig(seed=3, max_steps=30, env="udacity-style", camera_fov=90.0)
    session = record_human(tmp_path, config, events=events)
    assert session.quit and len(session.written) == 1 and session.written[0].endswith("_udacity-style")
    sidecar, arrays = load_episode_arrays(tmp_path / f"{session.written[0]}.json")
    assert (sidecar["source"], sidecar["frame_kind"], sidecar["renderer"]) == ("human", "udacity", "front-camera")
    wide = make_udacity_style(camera=CameraConfig(horizontal_fov=90.0))
    assert sidecar["camera_fov"] == 90.0
    np.testing.assert_array_equal(arrays["observations"][0], wide.reset(seed=3)[0])  # the player saw the 90° camera
    wide.close()
    assert sidecar["cameras"] == ["center", "left", "right"] and sidecar["n_steps"] == 30
    for name in ("observations", "left_observations", "right_observations"):
        assert arrays[name].shape == (31, 160, 320, 3)
    np.testing.assert_allclose(arrays["actions"][:, 1], 1.0)
    for n, pixels in seen.items():
        assert pixels.shape == (480 + READOUT_HEIGHT, 960, 3)
        np.testing.assert_array_equal(pixels[:480], scaled(arrays["observations"][n - 1], 3))
    assert not np.array_equal(seen[10][:480], seen[25][:480])  # the view moves with the car
    info = CliRunner().invoke(app, ["data", "info", str(tmp_path), "--json"])
    assert info.exit_code == 0, info.output
    assert json.loads(info.output)["episodes"] == 1


def test_drive_command_records_the_udacity_layout_that_the_importer_reads(tmp_path, display) -> None:
    """No key pressed: the car stands for 20 steps, the time limit ends the episode, ``--episodes 1`` ends the session."""
    sim, imported = tmp_path / "sim", tmp_path / "imported"
    result = CliRunner().invoke(app, ["drive", "--env", "udacity-style", "--layout", "udacity", "--record", str(sim),
                                      "--max-steps", "20", "--episodes", "1", "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert f"wrote 1 episodes, 0 restarts → {sim}" in normalize(result.output)
    rows = (sim / LOG_NAME).read_text().splitlines()
    assert len(rows) == 20 and len(list((sim / IMG_DIR).glob("*.jpg"))) == 60
    assert [p.suffix for p in sorted((sim / EPISODES_DIR).iterdir())] == [".csv", ".json"]
    result = CliRunner().invoke(app, ["udacity", "import", str(sim), "--out", str(imported)])
    assert result.exit_code == 0, result.output
    text = normalize(result.output)  # 20 rows are 20 frames: 19 steps
    assert "imported 1 episodes (19 steps" in text and "cameras center,left,right) from 20 log rows" in text
    info = CliRunner().invoke(app, ["data", "info", str(imported), "--json"])
    assert info.exit_code == 0, info.output


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["--layout", "udacity", "--record", "{out}"], "layout 'udacity' needs env 'udacity-style'"),
        (["--env", "udacity-style", "--layout", "udacity"], "--layout: only with --record DIR"),
        (["--layout", "episodes"], "--layout: only with --record DIR"),
        (["--env", "udacity-style", "--slow-motion", "0.5"], "slow_motion must be >= 1, got 0.5"),
        (["--env", "front"], "'front' is not one of 'carracing', 'udacity-style'"),
        (["--camera-fov", "90"], "camera_fov applies to env 'udacity-style'"),
        (["--env", "udacity-style", "--camera-fov", "200"], "camera_fov must be in [10.0, 150.0], got 200"),
        (["--env", "udacity-style", "--layout", "jpeg", "--record", "{out}"], "'jpeg' is not one of 'episodes', 'udacity'"),
    ],
)
def test_drive_rejects_bad_combinations_with_exit_code_2(tmp_path, arguments, fragment) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["drive", *(a.format(out=out) for a in arguments)])
    assert result.exit_code == 2
    assert fragment in normalize(result.output)
    assert not out.exists()
