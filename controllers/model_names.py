"""The heads a model config may name, importable without torch (the CLI offers them in ``--model``);
:data:`nsacdrive.controllers.registry.MODEL_BUILDERS` builds each one. Other names the CLI offers
from the controllers live here for the same reason."""

MODEL_NAMES = ("nsac", "gmle", "nac", "levy", "mcdropout", "ensemble", "evidential", "sdenet")
#: Names added in this process by :func:`nsacdrive.controllers.registry.register_model`: valid in a
#: model config, but not offered by the CLI, which reads :data:`MODEL_NAMES` when it is imported.
REGISTERED_MODEL_NAMES: list[str] = []


def model_names() -> tuple[str, ...]:
    """Every name a model config may hold: the built-in heads, then the ones registered since."""
    return (*MODEL_NAMES, *REGISTERED_MODEL_NAMES)

#: The features a run's feature density may be over (:mod:`nsacdrive.controllers.density`; ``nsacdrive calibrate --density-source``).
DENSITY_SOURCES = ("tokens", "tokens+conv")

#: The precisions a training may run its encoders in (:mod:`nsacdrive.controllers.precision`; ``nsacdrive train --precision``).
PRECISION_NAMES = ("float32", "bfloat16")
