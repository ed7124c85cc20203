"""What a monitor's fallback bought: the same episodes driven without and with it, per training seed.

    python -m bench.fallback_summary \
        s0=ev/s0-corrupt,ev/s0-random,ev/s0-nominal:ev/s0-fb-corrupt,ev/s0-fb-random,ev/s0-fb-nominal s1=...

Each ``LABEL=WITHOUT:WITH`` names one seed's evaluations without the fallback and with it
(``nsacdrive eval ... --monitor DIR --fallback expert|slow``), comma-separated on each side. Episodes
are paired by (colour preset, corruption, track seed, repeat). *Nominal* episodes are clean
(default colours, no corruption), the rest *shifted*. Per seed: failures (misbehaviour events,
:mod:`nsacdrive.eval.misbehaviour`, the definition ``nsacdrive monitor`` counts) on the shifted
episodes without → with, the share prevented, laps finished on the shifted episodes, the nominal
lap time with against without (laps finished both ways), and the share of nominal steps under
the fallback (for ``expert``: interventions) and of shifted steps (how much of the shifted
driving the fallback did rather than the controller). Then mean ± std (ddof 0) over the seeds: the
targets are ≥ 80 % prevented, ≤ 5 % lap-time loss and ≤ 2 % interventions on nominal laps.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import spread_cell
from nsacdrive.eval.misbehaviour import misbehaviour_events
from nsacdrive.eval.results import clean_conditions, load_log, load_records

Key = tuple[str, str, int, int]


@dataclass(frozen=True)
class Episode:
    nominal: bool
    failures: int
    lap_finished: bool
    steps: int
    fallback_steps: int


@dataclass(frozen=True)
class SeedEffect:
    label: str
    failures: tuple[int, int]  # shifted episodes, without → with
    laps_shifted: tuple[float, float]
    lap_time_change: float  # nominal laps finished both ways: Σ steps with / Σ steps without − 1
    nominal_fallback_share: float
    shifted_fallback_share: float  # how much of the shifted driving the fallback did
    pairs: int

    @property
    def prevented(self) -> float:
        before, after = self.failures
        return float("nan") if before == 0 else 1.0 - after / before


def episode_key(record: dict[str, Any]) -> Key:
    return record["colour_preset"], record.get("corruption", "none"), int(record["track_seed"]), int(record.get("repeat", 0))


def load_episodes(eval_dirs: Sequence[Path]) -> dict[Key, Episode]:
    """Every finished episode of the evaluations by its key (ValueError on a key driven twice)."""
    out: dict[Key, Episode] = {}
    for eval_dir in eval_dirs:
        for record in load_records(eval_dir):
            if record["failed"]:
                continue
            arrays = load_log(eval_dir, record)
            key = episode_key(record)
            if key in out:
                raise ValueError(f"{eval_dir}: episode {key} appears twice among {', '.join(map(str, eval_dirs))}")
            out[key] = Episode(clean_conditions(record), len(misbehaviour_events(arrays, record["reason"])), bool(record["lap_finished"]),
                               len(arrays["speed"]), int(np.count_nonzero(arrays["fallback"])))
    return out


def seed_effect(label: str, without: dict[Key, Episode], with_fallback: dict[Key, Episode]) -> SeedEffect:
    """The fallback's effect on the episodes both evaluations drove."""
    keys = sorted(set(without) & set(with_fallback))
    if not keys:
        raise ValueError(f"{label}: the two sides share no episode (same tracks, presets and corruptions?)")
    shifted = [k for k in keys if not without[k].nominal]
    nominal = [k for k in keys if without[k].nominal]
    failures = (sum(without[k].failures for k in shifted), sum(with_fallback[k].failures for k in shifted))
    laps = tuple(float(np.mean([side[k].lap_finished for k in shifted])) if shifted else float("nan")
                 for side in (without, with_fallback))
    both = [k for k in nominal if without[k].lap_finished and with_fallback[k].lap_finished]
    change = (sum(with_fallback[k].steps for k in both) / sum(without[k].steps for k in both) - 1.0) if both else float("nan")
    return SeedEffect(label, failures, laps, change, _fallback_share(with_fallback, nominal),  # type: ignore[arg-type]
                      _fallback_share(with_fallback, shifted), len(keys))


def _fallback_share(episodes: dict[Key, Episode], keys: Sequence[Key]) -> float:
    steps = sum(episodes[k].steps for k in keys)
    return sum(episodes[k].fallback_steps for k in keys) / steps if steps else float("nan")


def _mean_std(values: Sequence[float], scale: float = 1.0, digits: int = 0) -> str:
    kept = [v * scale for v in values if np.isfinite(v)]
    return "–" if not kept else spread_cell(float(np.mean(kept)), float(np.std(kept)), len(kept), len(values), digits)


def to_markdown(effects: Sequence[SeedEffect]) -> str:
    lines = ["| seed | failures on shifted episodes (none → fallback) | prevented | laps finished under shift | "
             "nominal lap time | share of nominal steps under the fallback | share of shifted steps under it | paired episodes |",
             "|---|---|---|---|---|---|---|---|"]
    for e in effects:
        lines.append(f"| {e.label} | {e.failures[0]} → {e.failures[1]} | {e.prevented:.0%} | "
                     f"{e.laps_shifted[0]:.0%} → {e.laps_shifted[1]:.0%} | {e.lap_time_change:+.1%} | "
                     f"{e.nominal_fallback_share:.1%} | {e.shifted_fallback_share:.0%} | {e.pairs} |")
    lines.append(f"| mean ± std | | {_mean_std([e.prevented for e in effects], 100)} % | "
                 f"{_mean_std([e.laps_shifted[0] for e in effects], 100)} → {_mean_std([e.laps_shifted[1] for e in effects], 100)} % | "
                 f"{_mean_std([e.lap_time_change for e in effects], 100, 1)} % | "
                 f"{_mean_std([e.nominal_fallback_share for e in effects], 100, 1)} % | "
                 f"{_mean_std([e.shifted_fallback_share for e in effects], 100)} % | |")
    return "\n".join(lines)


def parse_pair(text: str) -> tuple[str, list[Path], list[Path]]:
    label, sep, sides = text.partition("=")
    without, colon, with_fallback = sides.partition(":")
    if not sep or not colon or not label or not without or not with_fallback:
        raise argparse.ArgumentTypeError(f"expected LABEL=DIR,...:DIR,... (without the fallback : with it), got {text!r}")
    return label, [Path(p) for p in without.split(",")], [Path(p) for p in with_fallback.split(",")]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", type=parse_pair, metavar="LABEL=WITHOUT:WITH",
                        help="one seed's evaluations without and with the fallback, comma-separated on each side")
    args = parser.parse_args(argv)
    effects = [seed_effect(label, load_episodes(without), load_episodes(with_fallback)) for label, without, with_fallback in args.pairs]
    print(to_markdown(effects))


if __name__ == "__main__":
    main()
