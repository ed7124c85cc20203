"""Progress bars: live tqdm bars on a terminal, a plain line now and then anywhere else.

A bar redrawn into a log file (CI, ``make demo > demo.log``) leaves one entry per redraw; there,
:func:`progress_bar` prints a whole line at most every :data:`LOG_INTERVAL` seconds and one when
the bar closes (if it would have stayed on screen, ``leave=True``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from tqdm import tqdm

#: Seconds between two progress lines in a log.
LOG_INTERVAL = 30.0
LOG_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: standard error, where tqdm draws) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)`` on a terminal; elsewhere the same bar printed as log lines.

    :param iterable: what to iterate over (or None and call ``update``), as for tqdm.
    :param kwargs: tqdm's arguments (``total``, ``desc``, ``unit``, ``initial``, ``leave``, ``disable``,
        ``file``, ...); ``mininterval`` sets the seconds between log lines (default :data:`LOG_INTERVAL`).
    """
    if is_terminal(kwargs.get("file")):
        return tqdm(iterable, **kwargs)
    return LogLines(iterable, **kwargs)


class LogLines(tqdm):
    """A tqdm bar that writes whole lines instead of redrawing: at most one per ``mininterval``
    seconds, none at the start, and a last one on closing when ``leave`` is true."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        interval = kwargs.setdefault("mininterval", LOG_INTERVAL)
        kwargs.setdefault("maxinterval", interval)  # tqdm's monitor thread must not print sooner
        kwargs.setdefault("delay", interval)  # no line at 0 %
        kwargs.setdefault("bar_format", LOG_FORMAT)
        self.last_line = time.time()
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Write the status as a line if ``mininterval`` has passed since the last (``set_postfix``
        and friends ask for a redraw on every call); ignore tqdm clearing or moving the bar."""
        if msg is not None or time.time() - self.last_line < self.mininterval:
            return False
        self.write_line()
        return True

    def write_line(self) -> None:
        self.fp.write(self.format_meter(**self.format_dict) + "\n")
        self.fp.flush()
        self.last_line = time.time()

    def clear(self, nolock: bool = False) -> None:
        """Nothing to erase (``tqdm.write`` clears bars before printing)."""

    def moveto(self, n: int) -> None:
        """No cursor to move (nested bars move it on a terminal)."""

    def close(self) -> None:
        if not self.disable and self.leave:
            self.write_line()
        self.leave = False  # the last line is written; tqdm's own close must not add another
        super().close()
