"""Modes of the evaluation commands, importable without torch (the CLI offers them as choices)."""

#: Where the closed-loop controller runs (``eval/closed_loop.py``).
INFERENCE_MODES = ("auto", "inline", "process")
#: How the Udacity drive server sets the throttle (``eval/serve/udacity_server.py``).
THROTTLE_MODES = ("law", "model")
#: Which of a run's own held-out seed ranges the offline table uses (``eval/offline.py``).
OFFLINE_SPLITS = ("test", "val")
#: Training sequences ``nsacdrive calibrate`` fits the feature density on by default (``eval/calibrate.py``).
DENSITY_SAMPLES = 8192
#: What ``nsacdrive eval --fallback`` does on a monitor alarm (``eval/closed_loop.py``).
FALLBACKS = ("none", "slow", "stop", "cascade", "expert")


def parse_fallback(spec: str) -> tuple[str, str | None]:
    """A fallback as the command line names it: a name of :data:`FALLBACKS`, or ``cascade:RUN`` →
    (``cascade``, RUN); ValueError for anything else."""
    name, _, run = spec.partition(":")
    if name not in FALLBACKS or (name == "cascade") != bool(run):
        raise ValueError(f"expected one of {', '.join(f for f in FALLBACKS if f != 'cascade')} or cascade:RUN, got {spec!r}")
    return name, run or None

#: How ``nsacdrive monitor`` sets each score's alarm threshold (``eval/monitor.py``), and the one to use:
#: at a fixed rate of nominal 1 s windows, the setting of every published monitor result.
MONITOR_THRESHOLDS = ("window-rate", "gamma", "conformal")
DEFAULT_THRESHOLD = "window-rate"
#: The score ``nsacdrive eval --monitor`` alarms on by default: the feature density, the fallback's documented score.
DEFAULT_MONITOR_SCORE = "density"
