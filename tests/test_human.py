"""Human driving: key state from pygame events, and a scripted headless recording round trip."""

from __future__ import annotations

import json
import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import numpy as np  # noqa: E402
import pygame  # noqa: E402
import pytest  # noqa: E402
from nsacdrive.agents.human import HumanAgent, KeyboardState  # noqa: E402
from nsacdrive.data_collection.episode import load_episode_arrays  # noqa: E402
from nsacdrive.data_collection.human import record_human  # noqa: E402


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

    session = record_human(tmp_path, seed=3, max_steps=30, events=events)
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
