"""The heads a model config may name, importable without torch (the CLI offers them in ``--model``);
:data:`nsacdrive.controllers.registry.MODEL_BUILDERS` builds each one. Other names the CLI offers
from the controllers live here for the same reason."""

MODEL_NAMES = ("nsac", "gmle", "nac", "levy", "mcdropout", "ensemble", "evidential", "sdenet")

#: The features a run's feature density may be over (:mod:`nsacdrive.controllers.density`; ``nsacdrive calibrate --density-source``).
DENSITY_SOURCES = ("tokens", "tokens+conv")

#: The precisions a training may run its encoders in (:mod:`nsacdrive.controllers.precision`; ``nsacdrive train --precision``).
PRECISION_NAMES = ("float32", "bfloat16")
