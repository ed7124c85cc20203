"""A pygame window that shows a camera frame scaled up, with a readout strip below it.

For driving by hand from the front camera (``nsacdrive drive --env udacity-style``): CarRacing's
own ``human`` window shows the top-down view, so the front-camera env has no window of its own.
The frame is scaled by an integer factor with nearest-neighbour sampling (window pixel (y, x)
is frame pixel (y // scale, x // scale)); the strip shows a line of text and the steer, gas and
brake bars of the action being executed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pygame

FPS = 50  # CarRacing's frame rate: ``show`` waits so the game runs in real time
READOUT_HEIGHT = 36
BACKGROUND = (24, 24, 24)
TEXT = (235, 235, 235)
TRACK = (70, 70, 70)
STEER = (240, 200, 60)
GAS = (70, 200, 90)
BRAKE = (220, 60, 60)
LABEL_WIDTH = 52
BAR_WIDTH = 100
BAR_HEIGHT = 12
SLOT_WIDTH = LABEL_WIDTH + BAR_WIDTH + 16


@dataclass(frozen=True)
class Readout:
    """What the strip below the frame shows.

    :param text: a short line, e.g. the speed and the step
    :param steer: executed steer in [−1, 1] (> 0 right): a marker on a centred bar
    :param gas: executed gas in [0, 1]: a green bar
    :param brake: executed brake in [0, 1]: a red bar
    """

    text: str = ""
    steer: float = 0.0
    gas: float = 0.0
    brake: float = 0.0


class CameraWindow:
    """Opens a window of ``scale`` × the frame size plus the readout strip; ``show`` draws one frame.

    :param frame_shape: (height, width, 3) of the frames to show
    :param scale: integer magnification (3: a 320×160 frame fills 960×480)
    :param fps: frames per second ``show`` keeps to (0: as fast as possible)
    """

    def __init__(self, frame_shape: tuple[int, ...], scale: int = 3, fps: int = FPS) -> None:
        if scale < 1:
            raise ValueError(f"window scale must be an integer >= 1, got {scale}")
        height, width = frame_shape[:2]
        self.frame_size = (width * scale, height * scale)
        pygame.display.init()
        pygame.font.init()
        self.surface = pygame.display.set_mode((self.frame_size[0], self.frame_size[1] + READOUT_HEIGHT))
        self.font = pygame.font.Font(None, 24)
        self.clock = pygame.time.Clock()
        self.fps = fps

    def show(self, frame: np.ndarray, readout: Readout, caption: str) -> None:
        """Draw ``frame`` (uint8 H×W×3) scaled, the readout and the window ``caption``; then wait for the next tick."""
        image = pygame.surfarray.make_surface(np.ascontiguousarray(frame.swapaxes(0, 1)))
        self.surface.blit(pygame.transform.scale(image, self.frame_size), (0, 0))
        self._draw_readout(readout)
        pygame.display.set_caption(caption)
        pygame.display.flip()
        if self.fps > 0:
            self.clock.tick(self.fps)

    def _draw_readout(self, readout: Readout) -> None:
        width, top = self.frame_size
        pygame.draw.rect(self.surface, BACKGROUND, (0, top, width, READOUT_HEIGHT))
        self.surface.blit(self.font.render(readout.text, True, TEXT), (10, top + 10))
        bar_top = top + (READOUT_HEIGHT - BAR_HEIGHT) // 2
        for slot, name in enumerate(("steer", "gas", "brake")):
            left = width - (3 - slot) * SLOT_WIDTH
            self.surface.blit(self.font.render(name, True, TEXT), (left, top + 10))
            bar = pygame.Rect(left + LABEL_WIDTH, bar_top, BAR_WIDTH, BAR_HEIGHT)
            pygame.draw.rect(self.surface, TRACK, bar)
            if name == "steer":  # a marker: left end −1, middle 0, right end +1
                marker = bar.left + round((np.clip(readout.steer, -1.0, 1.0) + 1.0) / 2.0 * (BAR_WIDTH - 6))
                pygame.draw.rect(self.surface, STEER, (marker, bar_top - 3, 6, BAR_HEIGHT + 6))
            else:
                value, colour = (readout.gas, GAS) if name == "gas" else (readout.brake, BRAKE)
                pygame.draw.rect(self.surface, colour, (bar.left, bar_top, round(np.clip(value, 0.0, 1.0) * BAR_WIDTH), BAR_HEIGHT))

    def close(self) -> None:
        pygame.display.quit()
