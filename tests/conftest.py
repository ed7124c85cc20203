"""Shared test setup: headless pygame, hypothesis profiles."""

from __future__ import annotations

import os

# pygame must never open a window or an audio device in tests; set before anything imports it.
os.environ["SDL_VIDEODRIVER"] = "dummy"
os.environ["SDL_AUDIODRIVER"] = "dummy"

from hypothesis import HealthCheck, settings

# Geometry properties are pure numpy and fast; no deadline so a slow CI core cannot flake them.
# Derandomised: the suite draws the same examples on every run (a CI result is reproducible);
# HYPOTHESIS_PROFILE=thorough searches randomly and long, for local hunting.
settings.register_profile(
    "nsacdrive",
    deadline=None,
    max_examples=60,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", parent=settings.get_profile("nsacdrive"), max_examples=2000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "nsacdrive"))


def pytest_configure(config):
    # Box2D's SWIG bindings warn on import under Python 3.11+; not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:builtin type .* has no __module__ attribute:DeprecationWarning")
