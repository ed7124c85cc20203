"""The heads a model config may name, importable without torch (the CLI offers them in ``--model``);
:data:`nsacdrive.controllers.registry.MODEL_BUILDERS` builds each one."""

MODEL_NAMES = ("nsac", "gmle", "nac", "levy", "mcdropout", "ensemble", "evidential", "sdenet")
