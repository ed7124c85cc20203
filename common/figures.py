"""Stand-alone matplotlib figures, written atomically: what every layer that draws a figure uses.

Figures are built on :class:`matplotlib.figure.Figure` with the Agg canvas (no pyplot global
state, safe in workers and tests).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from nsacdrive.common.atomic import atomic_path

DPI = 110


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A stand-alone figure on the Agg canvas (never registered with pyplot)."""
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG atomically (a reader never sees half a file); returns ``path``."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return path
