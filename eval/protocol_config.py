"""The safety protocol's settings, importable without torch: which shift families are development
and which test, the four disjoint track sets, and how the failure predictor is fitted (the command
line reads its defaults from here; :mod:`nsacdrive.eval.safety_protocol` does the work).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

from nsacdrive.envs.colours import validate_preset
from nsacdrive.envs.corruptions import CORRUPTIONS, SEVERITIES
from nsacdrive.eval.configs import MonitorConfig

#: the families the suite's monitors were first built and tuned on: every choice is made on these
DEVELOPMENT_FAMILIES = ("gaussian-noise", "shot-noise", "impulse-noise", "defocus-blur", "motion-blur", "fog", "rain", "snow",
                        "jpeg", "pixelate", "lens-dirt", "camera-tilt", "background-texture")
#: families kept out of every choice: physical causes added after the monitors were built, and random colours
TEST_FAMILIES = ("low-light", "glare", "occluder", "water-drops", "camera-shift", "camera-zoom", "random")


def check_family(name: str) -> str:
    """``name`` if it is a corruption family or a colour preset other than ``default``, else ValueError."""
    if name in CORRUPTIONS:
        return name
    try:
        if name != "default" and validate_preset(name):
            return name
    except ValueError:
        pass
    raise ValueError(f"shift family {name!r}: expected a corruption family ({', '.join(CORRUPTIONS)}) "
                     "or a colour preset other than default (random, color-v0, shift-N)")


@dataclass(frozen=True)
class PredictorConfig:
    """How the failure predictor is fitted."""

    horizon_s: float = 3.0  # steps this close before an onset are positives
    l2: float = 1e-3  # ridge penalty on the standardised weights (the log-loss is a weighted mean)
    max_negatives: int = 100_000  # nominal steps kept (every k-th, deterministically) to bound the fit's memory

    def __post_init__(self) -> None:
        if not self.horizon_s > 0 or not self.l2 >= 0 or self.max_negatives < 1:
            raise ValueError("predictor config: horizon_s must be > 0, l2 >= 0 and max_negatives >= 1, got "
                             f"{self.horizon_s}, {self.l2}, {self.max_negatives}")


@dataclass(frozen=True)
class ProtocolConfig:
    """Which families are development and test, how they are driven, and how the monitors are fitted."""

    development: tuple[str, ...] = DEVELOPMENT_FAMILIES
    test: tuple[str, ...] = TEST_FAMILIES
    severities: tuple[int, ...] = (3, 5)  # of every corruption family
    selection_window_s: int = 1
    monitor: MonitorConfig = field(default_factory=lambda: MonitorConfig(threshold="conformal"))
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    hold_candidates_s: tuple[float, ...] = (0.1, 0.2, 0.5, 1.0, 2.0, 3.0)  # the fallbacks' hand-back holds to choose from
    nominal_fallback_budget: float = 0.02  # the longest hold whose fallback covers at most this share of nominal steps

    def __post_init__(self) -> None:
        object.__setattr__(self, "development", tuple(check_family(f) for f in self.development))
        object.__setattr__(self, "test", tuple(check_family(f) for f in self.test))
        object.__setattr__(self, "severities", tuple(self.severities))
        if both := sorted(set(self.development) & set(self.test)):
            raise ValueError(f"protocol config: families both development and test: {', '.join(both)}")
        if not self.development or not self.test:
            raise ValueError("protocol config: give at least one development and one test family")
        if not self.severities or not set(self.severities) <= set(SEVERITIES):
            raise ValueError(f"protocol config severities: expected some of {SEVERITIES}, got {self.severities}")
        object.__setattr__(self, "hold_candidates_s", tuple(self.hold_candidates_s))
        if not self.hold_candidates_s or not all(h > 0 for h in self.hold_candidates_s) or not 0 < self.nominal_fallback_budget <= 1:
            raise ValueError("protocol config: hold_candidates_s must be positive seconds and nominal_fallback_budget in (0, 1], got "
                             f"{self.hold_candidates_s} and {self.nominal_fallback_budget}")
        if self.selection_window_s not in self.monitor.windows_s:
            raise ValueError(f"protocol config selection_window_s {self.selection_window_s} is not one of the monitor's "
                             f"windows {self.monitor.windows_s}")

    @property
    def families(self) -> tuple[str, ...]:
        return (*self.development, *self.test)

    def corruptions(self) -> list[str]:
        """Every corruption condition the families drive (``FAMILY-SEVERITY``)."""
        return [f"{f}-{s}" for f in self.families if f in CORRUPTIONS for s in self.severities]

    def colour_presets(self) -> list[str]:
        return [f for f in self.families if f not in CORRUPTIONS]


@dataclass(frozen=True)
class ProtocolTracks:
    """The four disjoint track sets of the protocol (seed lists)."""

    train: tuple[int, ...]  # tracks the controller trained on: the predictor and the selection
    fit: tuple[int, ...]  # held-out tracks whose clean laps set the thresholds
    check: tuple[int, ...]  # held-out tracks whose clean laps check the false-alarm rate
    test: tuple[int, ...]  # held-out tracks that are judged

    def __post_init__(self) -> None:
        sets = asdict(self)
        for name, seeds in sets.items():
            if not seeds:
                raise ValueError(f"protocol tracks {name}: give at least one track seed")
        for (a, first), (b, second) in itertools.combinations(sets.items(), 2):
            if shared := sorted(set(first) & set(second)):
                raise ValueError(f"protocol tracks {a} and {b} share seeds {shared[:5]}: the sets must be disjoint")
