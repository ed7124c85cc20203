"""A human driver: arrow keys (or a gamepad's first axis) mapped to CarRacing actions.

Key state is tracked from KEYDOWN/KEYUP events, so it works with any pygame event source,
including events posted by tests under SDL's dummy video driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pygame

from nsacdrive.envs.state import PrivilegedState

GAS = 1.0
BRAKE = 0.8
JOYSTICK_DEADZONE = 0.1
RESTART_KEYS = (pygame.K_r,)
QUIT_KEYS = (pygame.K_ESCAPE, pygame.K_q)


class KeyboardState:
    """Held arrow keys, the gamepad steer axis and the restart/quit requests, from pygame events."""

    def __init__(self) -> None:
        self.left = self.right = self.up = self.down = False
        self.joystick_steer = 0.0
        self.restart_requested = False
        self.quit_requested = False

    def handle(self, event: pygame.event.Event) -> None:
        if event.type == pygame.QUIT:
            self.quit_requested = True
        elif event.type in (pygame.KEYDOWN, pygame.KEYUP):
            down = event.type == pygame.KEYDOWN
            if event.key == pygame.K_LEFT:
                self.left = down
            elif event.key == pygame.K_RIGHT:
                self.right = down
            elif event.key == pygame.K_UP:
                self.up = down
            elif event.key == pygame.K_DOWN:
                self.down = down
            elif down and event.key in RESTART_KEYS:
                self.restart_requested = True
            elif down and event.key in QUIT_KEYS:
                self.quit_requested = True
        elif event.type == pygame.JOYAXISMOTION and event.axis == 0:
            value = float(event.value)
            self.joystick_steer = 0.0 if abs(value) < JOYSTICK_DEADZONE else float(np.clip(value, -1.0, 1.0))

    def update(self, events: Iterable[pygame.event.Event]) -> None:
        for event in events:
            self.handle(event)

    def action(self) -> np.ndarray:
        """(steer, gas, brake): left −1 / right +1 (keys override the gamepad), up → gas, down → brake."""
        keys_steer = float(self.right) - float(self.left)
        steer = keys_steer if (self.left or self.right) else self.joystick_steer
        return np.array([steer, GAS if self.up else 0.0, BRAKE if self.down else 0.0], dtype=np.float32)


class HumanAgent:
    """Agent driven by the keyboard; ``act`` drains the pygame event queue every step."""

    agent_id = "human-keyboard"
    source = "human"
    needs_pixels = True

    def __init__(self, events: Callable[[], Iterable[pygame.event.Event]] | None = None, joystick: bool = True) -> None:
        self.keys = KeyboardState()
        self._events = events if events is not None else pygame.event.get
        self._joystick_wanted = joystick
        self._joystick: Any = None

    @property
    def restart_requested(self) -> bool:
        return self.keys.restart_requested

    @property
    def quit_requested(self) -> bool:
        return self.keys.quit_requested

    def _open_joystick(self) -> None:
        self._joystick_wanted = False  # try once
        try:
            pygame.joystick.init()
            if pygame.joystick.get_count() > 0:
                self._joystick = pygame.joystick.Joystick(0)
                self._joystick.init()
        except pygame.error:
            self._joystick = None

    def reset(self) -> None:
        """New episode: forget a pending restart (held keys stay held)."""
        self.keys.restart_requested = False

    def poll(self) -> None:
        """Drain pending events into the key state."""
        if self._joystick_wanted:
            self._open_joystick()
        self.keys.update(self._events())

    def act(self, observation: np.ndarray, state: PrivilegedState) -> np.ndarray:
        self.poll()
        return self.keys.action()

    def config(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "gas": GAS, "brake": BRAKE, "joystick_deadzone": JOYSTICK_DEADZONE,
                "joystick": self._joystick.get_name() if self._joystick is not None else None}
